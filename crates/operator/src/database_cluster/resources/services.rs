//! Services: headless (stable pod DNS), read-write (the primary), read-only (every instance,
//! only when there are replicas).

use devctl_api::database_cluster::DatabaseCluster;
use serde_json::json;

use super::{Inputs, Names, metadata, selector};
use k8s_openapi::api::core::v1::Service;

use crate::children::Child;
use crate::error::Result;

/// Label the StatefulSet controller puts on each pod with the pod's name.
const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";

pub fn port_name(db: &DatabaseCluster) -> &'static str {
    db.spec.engine.as_str()
}

pub fn desired(db: &DatabaseCluster, names: &Names, inputs: &Inputs<'_>) -> Result<Vec<Child>> {
    let ports = json!([{
        "name": port_name(db),
        "port": db.spec.port(),
        "targetPort": port_name(db),
        "protocol": "TCP",
    }]);
    let service = |name: String, component: &str, spec: serde_json::Value| -> Result<Child> {
        Child::new::<Service>(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(db, names, &name, component, inputs.version)?,
            "spec": spec,
        }))
    };
    let mut primary_selector = selector(db);
    // Ordinal 0 is the primary until failover (its own issue) can move it.
    primary_selector.insert(POD_NAME_LABEL.into(), format!("{}-0", names.stateful_set()));

    let mut services = vec![
        service(
            names.headless_service(),
            "headless-service",
            json!({
                "clusterIP": "None",
                "publishNotReadyAddresses": true,
                "selector": selector(db),
                "ports": ports,
            }),
        )?,
        service(
            names.read_write_service(),
            "read-write-service",
            json!({ "type": "ClusterIP", "selector": primary_selector, "ports": ports }),
        )?,
    ];
    if db.spec.replicas > 1 {
        services.push(service(
            names.read_only_service(),
            "read-only-service",
            json!({ "type": "ClusterIP", "selector": selector(db), "ports": ports }),
        )?);
    }
    Ok(services)
}
