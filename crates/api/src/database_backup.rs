//! `DatabaseBackup` `db.devctl.io/v1beta1`: one backup of a DatabaseCluster into its object
//! store (docs/backup.md).

// `printcolumn(...)` repeats `type_ = "string"` by design; clippy reads that as duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

/// A backup of a DatabaseCluster, taken by the agent of one of its instances and kept in the
/// cluster's object store. `Completed` means a restore can use it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "db.devctl.io",
    version = "v1beta1",
    kind = "DatabaseBackup",
    plural = "databasebackups",
    singular = "databasebackup",
    namespaced,
    status = "DatabaseBackupStatus",
    derive = "PartialEq",
    shortname = "dbb",
    category = "all",
    category = "devctl",
    doc = "A backup of a DatabaseCluster into its object store.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.cluster.name"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Instance", type_ = "string", json_path = ".status.instance"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".status.size"),
    printcolumn(name = "Started", type_ = "date", json_path = ".status.startedAt"),
    printcolumn(
        name = "Cluster UID",
        type_ = "string",
        json_path = ".status.clusterUID",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("a DatabaseBackup's spec is immutable: create another backup"))]
pub struct DatabaseBackupSpec {
    /// The cluster to back up (in this namespace).
    pub cluster: ClusterRef,
    /// `replica` (the default when a replica streams) or `primary`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<BackupTarget>,
}

/// A DatabaseCluster in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
pub struct ClusterRef {
    #[schemars(length(min = 1))]
    pub name: String,
}

/// Which instance takes the backup.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BackupTarget {
    /// A streaming replica (the primary when none streams).
    Replica,
    /// The primary.
    Primary,
}

/// Where a backup stands. `Completed` and `Failed` are final.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum BackupPhase {
    Pending,
    Running,
    Completed,
    Failed,
}

impl BackupPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            BackupPhase::Pending => "Pending",
            BackupPhase::Running => "Running",
            BackupPhase::Completed => "Completed",
            BackupPhase::Failed => "Failed",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, BackupPhase::Completed | BackupPhase::Failed)
    }
}

/// Observed state, written by the operator from the agent's report.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseBackupStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (True once Completed), following metav1.Condition conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The pod that took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The uid of the DatabaseCluster that made it (also the label `db.devctl.io/cluster-uid`):
    /// a later cluster of the same name never counts it as its own (retention, `keepLast`,
    /// WAL pruning).
    #[serde(
        default,
        rename = "clusterUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_uid: Option<String>,
    /// `<UTC time>-<name>`: the backup's directory in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    /// Where it is: `s3://<bucket>/<key prefix>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_path: Option<String>,
    /// The store endpoint, bucket and cluster prefix (with the system identifier), for a
    /// restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The Secrets the cluster's destination named when the backup ran (none for the
    /// operator's default destination): what a restore uses when its own cluster names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    /// `postgres` or `mysql`, and the engine's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Bytes stored (the base backup or dump).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// PostgreSQL: the WAL range the backup needs, and its LSNs and timeline.
    #[serde(default, rename = "beginLSN", skip_serializing_if = "Option::is_none")]
    pub begin_lsn: Option<String>,
    #[serde(default, rename = "endLSN", skip_serializing_if = "Option::is_none")]
    pub end_lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    #[serde(default, rename = "beginWAL", skip_serializing_if = "Option::is_none")]
    pub begin_wal: Option<String>,
    #[serde(default, rename = "endWAL", skip_serializing_if = "Option::is_none")]
    pub end_wal: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The CRD, generated from the Rust types.
pub fn crd() -> CustomResourceDefinition {
    crate::with_unobserved_status_default(DatabaseBackup::crd())
}
