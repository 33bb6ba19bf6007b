//! PodDisruptionBudget (maxUnavailable 1), only when there is more than one instance.

use devctl_api::database_cluster::DatabaseCluster;
use serde_json::json;

use super::{Inputs, Names, metadata, selector};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::children::Child;
use crate::error::Result;

pub fn desired(db: &DatabaseCluster, names: &Names, inputs: &Inputs<'_>) -> Result<Option<Child>> {
    if super::stateful_set::instances(db) <= 1 {
        return Ok(None);
    }
    let name = names.pod_disruption_budget();
    Ok(Some(Child::new::<PodDisruptionBudget>(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(db, names, &name, "disruption-budget", inputs.version)?,
        "spec": {
            "maxUnavailable": 1,
            "selector": { "matchLabels": selector(db) },
        }
    }))?))
}
