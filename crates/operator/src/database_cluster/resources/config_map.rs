//! `<name>-config`: the engine's configuration files.

use devctl_api::database_cluster::DatabaseCluster;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{Inputs, Names, metadata};
use k8s_openapi::api::core::v1::ConfigMap;

use crate::children::Child;
use crate::engine;
use crate::error::Result;

pub fn desired(db: &DatabaseCluster, names: &Names, inputs: &Inputs<'_>) -> Result<Child> {
    let name = names.config_map();
    Child::new::<ConfigMap>(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(db, names, &name, "config", inputs.version)?,
        "data": engine::render(&db.spec),
    }))
}

/// A hash of the configuration, put on the pod template so a config change rolls the pods.
pub fn hash(db: &DatabaseCluster) -> String {
    let mut hasher = Sha256::new();
    for (file, content) in engine::render(&db.spec) {
        hasher.update(file.as_bytes());
        hasher.update([0]);
        hasher.update(content.as_bytes());
        hasher.update([0]);
    }
    hasher
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}
