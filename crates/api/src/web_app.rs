//! `WebApp` `apps.devctl.io/v1`: a stateless service run as a Deployment behind a Service.

// `printcolumn(...)` repeats `type_ = "string"` by design; clippy reads that as duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

/// A stateless web application managed by the devctl operator: a Deployment of the image
/// and a Service that exposes it on port 80.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "apps.devctl.io",
    version = "v1",
    kind = "WebApp",
    plural = "webapps",
    singular = "webapp",
    namespaced,
    status = "WebAppStatus",
    derive = "PartialEq",
    shortname = "wa",
    category = "all",
    category = "devctl",
    validation = Rule::new("size(self.metadata.name) <= 50").message("metadata.name must be at most 50 characters: the names devctl derives from it (pods, claims, Services) must stay within 63"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter and ending with a letter or digit (no dots)"),
    doc = "A stateless web application managed by the devctl operator.",
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.image"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct WebAppSpec {
    /// Container image, e.g. `myregistry/myapp:v2.1.0`.
    #[schemars(length(min = 1))]
    pub image: String,

    /// Number of pods (at least 1).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1))]
    pub replicas: i32,

    /// Port the application listens on (1-65535); the Service exposes it on port 80.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// Environment variables of the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,

    /// CPU and memory of the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Readiness probe; a TCP check of the port when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<ProbeSpec>,

    /// Liveness probe; a TCP check of the port (after 10 s) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<ProbeSpec>,

    /// User and group the pods run as. Pods always run as non-root (Pod Security Standards
    /// `restricted`): UID and GID 65532 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContextSpec>,
}

fn default_replicas() -> i32 {
    1
}

/// How the application's health is checked.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ProbeType {
    /// A TCP connection to the port.
    #[default]
    Tcp,
    /// An HTTP GET of `path` on the port (2xx/3xx is healthy).
    Http,
}

/// A probe of the application's port.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type != 'http' || self.path.startsWith('/')").message("probe path must start with '/'"))]
pub struct ProbeSpec {
    /// `tcp` (default) or `http`.
    #[serde(default, rename = "type")]
    pub type_: ProbeType,
    /// Path for `http` probes (default `/`).
    #[serde(default = "default_path")]
    pub path: String,
    /// Seconds before the first check.
    #[serde(default)]
    #[schemars(range(min = 0, max = 3600))]
    pub initial_delay_seconds: i32,
    /// Seconds between checks (default 10).
    #[serde(default = "default_period")]
    #[schemars(range(min = 1, max = 3600))]
    pub period_seconds: i32,
    /// Consecutive failures before the probe fails (default 3).
    #[serde(default = "default_failure_threshold")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_threshold: i32,
}

fn default_path() -> String {
    "/".into()
}

fn default_period() -> i32 {
    10
}

fn default_failure_threshold() -> i32 {
    3
}

/// Largest user or group ID Kubernetes accepts in a pod.
const MAX_ID: i64 = i32::MAX as i64;

/// User and group of the pods' processes. Root (0) is refused: the pods must pass Pod
/// Security Standards `restricted`, which requires a non-root user (root's group is refused
/// too, as defence in depth).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecurityContextSpec {
    /// UID the containers run as (1-2147483647; 0 is root and refused), default 65532. The
    /// image's files the application needs must be readable by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_ID))]
    #[x_kube(validation = Rule::new("self >= 1").message("securityContext.runAsUser must be at least 1: 0 is root, and pods must run as non-root (Pod Security Standards restricted)"))]
    pub run_as_user: Option<i64>,

    /// Primary GID of the containers' processes (1-2147483647; 0 is root's group and
    /// refused), default `runAsUser`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_ID))]
    #[x_kube(validation = Rule::new("self >= 1").message("securityContext.runAsGroup must be at least 1: devctl does not run pods in root's group (0)"))]
    pub run_as_group: Option<i64>,
}

/// Observed state, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebAppStatus {
    /// Pods that exist.
    #[serde(default)]
    pub replicas: i32,
    /// Pods whose readiness probe passes.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Pods ready for at least minReadySeconds.
    #[serde(default)]
    pub available_replicas: i32,
    /// Label selector of the pods (scale subresource, HPAs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Available`, `Progressing` and `Ready`, following metav1.Condition conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The CRD, generated from the Rust types.
pub fn crd() -> CustomResourceDefinition {
    crate::with_unobserved_status_default(WebApp::crd())
}

#[cfg(test)]
mod tests {
    #[test]
    fn crd_has_short_name_columns_and_scale() {
        let crd = super::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("webapps.apps.devctl.io"));
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["wa".to_string()][..])
        );
        let version = &crd.spec.versions[0];
        let columns: Vec<_> = version
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["Image", "Replicas", "Ready", "Age"]);
        assert!(version.subresources.as_ref().unwrap().scale.is_some());
    }
}
