//! Services: headless (stable pod DNS), read-write (the primary), read-only (the replicas,
//! only when there are any). The operator labels each pod with its role
//! ([`ROLE_LABEL`]) from `status.currentPrimary`; the Services select by that label, so a
//! change of primary moves both Services without touching them.

use devctl_api::database_cluster::DatabaseCluster;
use serde_json::json;

use super::{Inputs, Names, metadata, port_name, selector};
use k8s_openapi::api::core::v1::Service;

use crate::children::Child;
use crate::error::Result;

use devctl_api::instance::{ROLE_LABEL, ROLE_PRIMARY, ROLE_REPLICA};

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
    primary_selector.insert(ROLE_LABEL.into(), ROLE_PRIMARY.into());
    let mut replica_selector = selector(db);
    replica_selector.insert(ROLE_LABEL.into(), ROLE_REPLICA.into());

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
    if super::stateful_set::instances(db) > 1 {
        services.push(service(
            names.read_only_service(),
            "read-only-service",
            json!({ "type": "ClusterIP", "selector": replica_selector, "ports": ports }),
        )?);
    }
    Ok(services)
}
