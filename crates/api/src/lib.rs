//! devctl's custom resources: their Rust types (from which the CRDs are generated) and the
//! pure logic on them. Nothing here does IO.

pub mod conditions;
pub mod database_cluster;
pub mod labels;
pub mod quantity;
pub mod web_app;

/// Group of the database resources.
pub const DB_GROUP: &str = "db.devctl.io";

/// Every CRD devctl installs, generated from the Rust types.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    vec![database_cluster::crd(), web_app::crd()]
}

/// Why an object could not be written as YAML.
pub type YamlError = serde_saphyr::SerializeError;

/// A Kubernetes object as a YAML document (for `deploy/` and `devctl operator manifests`).
pub fn to_yaml<T: serde::Serialize>(object: &T) -> Result<String, YamlError> {
    serde_saphyr::to_string(object)
}
