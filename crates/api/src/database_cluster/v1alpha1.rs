//! `DatabaseCluster` `db.devctl.io/v1alpha1`: the first shape of the API, still served (and
//! marked deprecated) so manifests written for it keep working. Objects are stored as
//! `v1beta1`; the operator's conversion webhook translates both ways ([`super::conversion`]).
//!
//! The status is the same in both versions: the operator writes it through `v1beta1` and a
//! `v1alpha1` reader sees all of it. No scale subresource here: `kubectl scale` uses
//! `v1beta1`, whose schema checks the high-availability quorum that `v1alpha1` cannot see.

// `printcolumn(...)` repeats `type_ = "string"` by design; clippy reads that as duplicates.
#![allow(clippy::duplicated_attributes)]

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use super::v1beta1::{DatabaseClusterStatus, Engine, StorageSpec};

/// The deprecation warning kubectl prints on every use of `v1alpha1`.
pub const DEPRECATION_WARNING: &str = "db.devctl.io/v1alpha1 DatabaseCluster is deprecated; use db.devctl.io/v1beta1 (kubectl get databaseclusters.v1beta1.db.devctl.io NAME -o yaml shows an object in the new shape)";

/// A PostgreSQL or MySQL database managed by the devctl operator (deprecated shape).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "db.devctl.io",
    version = "v1alpha1",
    kind = "DatabaseCluster",
    plural = "databaseclusters",
    singular = "databasecluster",
    namespaced,
    status = "DatabaseClusterStatus",
    derive = "PartialEq",
    shortname = "dbc",
    shortname = "db",
    category = "all",
    category = "devctl",
    deprecated = "db.devctl.io/v1alpha1 DatabaseCluster is deprecated; use db.devctl.io/v1beta1 (kubectl get databaseclusters.v1beta1.db.devctl.io NAME -o yaml shows an object in the new shape)",
    validation = Rule::new("size(self.metadata.name) <= 50").message("metadata.name must be at most 50 characters: the names devctl derives from it (pods, claims, Services) must stay within 63"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter and ending with a letter or digit (no dots)"),
    doc = "A PostgreSQL or MySQL database managed by the devctl operator (deprecated: use v1beta1).",
    printcolumn(name = "Engine", type_ = "string", json_path = ".spec.engine"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseClusterSpec {
    /// Database engine: `postgres`, `mariadb` or `mysql`. Cannot be changed after creation.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("engine is immutable: create a new cluster to change engines"))]
    pub engine: Engine,

    /// Number of database instances (1-7).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 7))]
    pub replicas: i32,

    /// Engine version as `major.minor`, e.g. `"16.2"`.
    #[schemars(regex(pattern = r"^\d+\.\d+$"))]
    pub version: String,

    /// Persistent storage for each instance.
    pub storage: StorageSpec,

    /// CPU and memory requests of the database container (v1beta1: `resources.requests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceSpec>,

    /// Daily backups to the operator's default destination (v1beta1: `backup.enabled`).
    #[serde(default)]
    pub backups_enabled: bool,
}

fn default_replicas() -> i32 {
    1
}

/// Requests of the database container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSpec {
    /// CPU request, e.g. `500m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Memory request, e.g. `1Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}
