//! devctl's custom resources: their Rust types (from which the CRDs are generated) and the
//! pure logic on them. Nothing here does IO.

pub mod conditions;
pub mod database_backup;
pub mod database_cluster;
pub mod duration;
pub mod gtid;
pub mod instance;
pub mod labels;
pub mod quantity;
pub mod web_app;

/// Group of the database resources.
pub const DB_GROUP: &str = "db.devctl.io";

/// Every CRD devctl installs, generated from the Rust types.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    vec![
        database_cluster::crd(),
        database_backup::crd(),
        web_app::crd(),
    ]
}

/// Gives `status` the default `{observedGeneration: 0}` in every version of `crd`.
///
/// A custom resource without status and conditions is `Current` to kstatus (Flux, kpt,
/// Config Sync) from the moment it is created — before the operator has looked at it. The
/// API server applies schema defaults when it reads an object from etcd, so a new object is
/// served with `observedGeneration: 0`, and kstatus reports it `InProgress` ("generation is
/// 1, but latest observed generation is 0") until the operator's first status write.
pub(crate) fn with_unobserved_status_default(
    mut crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSON;
    for version in &mut crd.spec.versions {
        let status = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("status"));
        if let Some(status) = status {
            status.default = Some(JSON(serde_json::json!({ "observedGeneration": 0 })));
        }
    }
    crd
}

/// Why an object could not be written as YAML.
pub type YamlError = serde_saphyr::SerializeError;

/// A Kubernetes object as a YAML document (for `deploy/` and `devctl operator manifests`).
pub fn to_yaml<T: serde::Serialize>(object: &T) -> Result<String, YamlError> {
    serde_saphyr::to_string(object)
}
