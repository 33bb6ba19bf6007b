//! `<name>-agent`: the ServiceAccount the database pods' agents run as, a Role that names
//! exactly this cluster's objects, and the RoleBinding between them.
//!
//! An agent may read its cluster and its credentials Secret, patch its own instance's pod
//! (the report annotation), take and renew its cluster's primary lock (`update` with the
//! Lease's `resourceVersion` as precondition, so two agents never both win; see
//! docs/failover.md) and record events — nothing else in the namespace. `resourceNames`
//! scopes every rule that Kubernetes lets it scope; the operator holds every right it grants
//! here (RBAC forbids granting more than one has).

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::primary_lease_name;
use serde_json::json;

use super::{Inputs, Names, metadata};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

use crate::children::Child;
use crate::error::Result;

/// The pods an agent may patch: every instance the cluster runs, by name (also those a
/// refused scale-down keeps: their agents report until the primary has moved off them).
fn pod_names(db: &DatabaseCluster, names: &Names) -> Vec<String> {
    (0..super::stateful_set::instances(db).max(1))
        .map(|ordinal| format!("{}-{ordinal}", names.stateful_set()))
        .collect()
}

pub fn desired(db: &DatabaseCluster, names: &Names, inputs: &Inputs<'_>) -> Result<Vec<Child>> {
    let name = names.agent();
    let service_account = Child::new::<ServiceAccount>(json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(db, names, &name, "agent", inputs.version)?,
        // The pods mount a projected, expiring token themselves.
        "automountServiceAccountToken": false,
    }))?;
    let role = Child::new::<Role>(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(db, names, &name, "agent", inputs.version)?,
        "rules": [
            {
                "apiGroups": [devctl_api::DB_GROUP],
                "resources": ["databaseclusters"],
                "resourceNames": [names.name],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": [
                    names.secret(),
                    names.replication_secret(),
                    format!("{}{}", names.name, devctl_api::instance::BACKUP_STORE_SECRET_SUFFIX),
                    format!("{}{}", names.name, devctl_api::instance::RESTORE_STORE_SECRET_SUFFIX),
                ],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "resourceNames": pod_names(db, names),
                "verbs": ["get", "list", "watch", "patch"],
            },
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [primary_lease_name(&names.name)],
                "verbs": ["get", "list", "watch", "update"],
            },
            {
                "apiGroups": ["events.k8s.io"],
                "resources": ["events"],
                "verbs": ["create", "patch"],
            },
        ],
    }))?;
    let binding = Child::new::<RoleBinding>(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(db, names, &name, "agent", inputs.version)?,
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
        "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": names.namespace }],
    }))?;
    Ok(vec![service_account, role, binding])
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn every_rule_but_events_names_the_clusters_own_objects() {
        let db = sample();
        let names = Names::of(&db).unwrap();
        let children = desired(&db, &names, &inputs()).unwrap();
        let role = &children[1].body;
        for rule in role["rules"].as_array().unwrap() {
            if rule["resources"][0] == "events" {
                continue;
            }
            assert!(
                rule["resourceNames"]
                    .as_array()
                    .is_some_and(|n| !n.is_empty()),
                "{rule}"
            );
            for verb in rule["verbs"].as_array().unwrap() {
                assert!(
                    ["get", "list", "watch", "patch", "update"].contains(&verb.as_str().unwrap()),
                    "{rule}"
                );
            }
        }
        assert_eq!(
            role["rules"][2]["resourceNames"],
            json!(["my-postgres-0", "my-postgres-1", "my-postgres-2"])
        );
        // A scale-down refused while the primary is my-postgres-2: it still reports.
        let mut kept = sample();
        kept.spec.replicas = 1;
        kept.status = Some(devctl_api::database_cluster::DatabaseClusterStatus {
            current_primary: Some("my-postgres-2".into()),
            ..Default::default()
        });
        let kept_role = &desired(&kept, &names, &inputs()).unwrap()[1].body;
        assert_eq!(
            kept_role["rules"][2]["resourceNames"],
            role["rules"][2]["resourceNames"]
        );
        assert_eq!(
            role["rules"][3],
            json!({
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": ["my-postgres-primary"],
                "verbs": ["get", "list", "watch", "update"],
            })
        );
        assert_eq!(children[2].body["subjects"][0]["name"], "my-postgres-agent");
    }
}
