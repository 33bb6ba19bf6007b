//! The desired children of a DatabaseCluster: pure functions of the spec and a few observed
//! facts (the existing password, the existing claim size), one file per child.

pub mod agent_rbac;
pub mod config_map;
pub mod lease;
pub mod pod_disruption_budget;
pub mod secret;
pub mod services;
pub mod stateful_set;

use std::collections::BTreeMap;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::labels;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use k8s_openapi::Resource as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

use crate::children::Child;
use crate::error::{Error, Result};

/// Every kind a DatabaseCluster may own (orphans of these kinds are deleted).
pub const KINDS: &[&str] = &[
    ConfigMap::KIND,
    Secret::KIND,
    Service::KIND,
    ServiceAccount::KIND,
    Role::KIND,
    RoleBinding::KIND,
    StatefulSet::KIND,
    PodDisruptionBudget::KIND,
    Lease::KIND,
];

/// Every kind the controller reads from the caches: what it owns (the primary lock
/// included), the volume claims and the pods (whose annotations carry the agents' reports).
pub const READS: &[&str] = &[
    ConfigMap::KIND,
    Secret::KIND,
    Service::KIND,
    ServiceAccount::KIND,
    Role::KIND,
    RoleBinding::KIND,
    StatefulSet::KIND,
    PodDisruptionBudget::KIND,
    Lease::KIND,
    PersistentVolumeClaim::KIND,
    Pod::KIND,
];

/// `app.kubernetes.io/name` of everything a DatabaseCluster owns.
pub const APP_NAME: &str = "databasecluster";

/// What the desired state depends on besides the spec.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// The password in the existing credentials Secret, or a freshly generated one; `None`
    /// when the Secret is as we left it and its password was not read (the Secret child is
    /// then rendered with placeholders, see [`crate::children::Child::placeholder`]).
    pub password: Option<&'a str>,
    /// The same for the replication Secret.
    pub replication_password: Option<&'a str>,
    /// The version to run: `spec.version`, or the running version when a change is refused.
    pub version: &'a str,
    /// The claim template size of the existing StatefulSet (immutable once created).
    pub existing_claim_size: Option<&'a str>,
    /// DNS suffix of the cluster, e.g. `cluster.local`.
    pub cluster_domain: &'a str,
    /// The image whose `/devctl-agent` the init container copies into each database pod.
    pub agent_image: &'a str,
}

impl Inputs<'_> {
    /// A key of everything [`desired`] reads but the passwords, with the hashes of `more`
    /// children rendered alongside: equal keys render children with equal hashes (a
    /// Secret's hash does not depend on its password). [`desired`] reads of the cluster
    /// only its spec, name, namespace, uid and — for the instances to run — its recorded
    /// primary.
    pub fn render_key(&self, db: &DatabaseCluster, more: &[Child]) -> u64 {
        use std::hash::{Hash, Hasher};
        // Every field by name: one added to `Inputs` does not compile here until the key
        // says whether it counts.
        let Self {
            password: _,
            replication_password: _,
            version,
            existing_claim_size,
            cluster_domain,
            agent_image,
        } = self;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        crate::children::slim::fingerprint(&db.spec).hash(&mut hasher);
        (
            db.metadata.name.as_deref(),
            db.metadata.namespace.as_deref(),
            db.metadata.uid.as_deref(),
        )
            .hash(&mut hasher);
        // The claim template takes the existing StatefulSet's size, else the spec's: the
        // size it renders is what counts, not where it came from.
        let claim_size = existing_claim_size.unwrap_or(db.spec.storage.size.as_str());
        (version, claim_size, cluster_domain, agent_image).hash(&mut hasher);
        // The instances to run also follow the status (a scale-down waits for the primary to
        // move off the ordinals it would remove).
        stateful_set::instances(db).hash(&mut hasher);
        for child in more {
            (child.kind, &child.name, &child.hash).hash(&mut hasher);
        }
        hasher.finish()
    }
}

/// Names and shared pieces derived from the DatabaseCluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub name: String,
    pub namespace: String,
}

impl Names {
    pub fn of(db: &DatabaseCluster) -> Result<Self> {
        Ok(Self {
            name: db.name_any(),
            namespace: db
                .namespace()
                .ok_or(Error::MissingField("metadata.namespace"))?,
        })
    }
    pub fn config_map(&self) -> String {
        format!("{}-config", self.name)
    }
    pub fn secret(&self) -> String {
        format!("{}-credentials", self.name)
    }
    /// The replication role's Secret (PostgreSQL).
    pub fn replication_secret(&self) -> String {
        format!("{}-replication", self.name)
    }
    pub fn headless_service(&self) -> String {
        format!("{}-headless", self.name)
    }
    pub fn read_write_service(&self) -> String {
        format!("{}-rw", self.name)
    }
    pub fn read_only_service(&self) -> String {
        format!("{}-ro", self.name)
    }
    pub fn stateful_set(&self) -> String {
        self.name.clone()
    }
    pub fn pod_disruption_budget(&self) -> String {
        self.name.clone()
    }
    /// The agents' ServiceAccount, Role and RoleBinding.
    pub fn agent(&self) -> String {
        format!("{}-agent", self.name)
    }
    /// The labels that say which cluster a child is for (`name` and `instance`).
    pub fn owner_labels(&self) -> BTreeMap<String, String> {
        labels::selector(APP_NAME, &self.name)
    }
    /// Cluster DNS name of one of the services.
    pub fn dns(&self, service: &str, cluster_domain: &str) -> String {
        format!("{service}.{}.svc.{cluster_domain}", self.namespace)
    }
}

/// Pod selector: never changes after creation (the engine is immutable).
/// The name of the engine's port on the pods and the Services (`postgres`, `mysql`).
pub fn port_name(db: &DatabaseCluster) -> &'static str {
    db.spec.engine.as_str()
}

pub fn selector(db: &DatabaseCluster) -> BTreeMap<String, String> {
    labels::selector(APP_NAME, &db.name_any())
}

pub fn labels(db: &DatabaseCluster, component: &str, version: &str) -> BTreeMap<String, String> {
    labels::standard(APP_NAME, &db.name_any(), component, version)
}

/// Object metadata with labels and the controller owner reference.
pub(crate) fn metadata(
    db: &DatabaseCluster,
    names: &Names,
    name: &str,
    component: &str,
    version: &str,
) -> Result<Value> {
    let owner: OwnerReference = db
        .controller_owner_ref(&())
        .ok_or(Error::MissingField("metadata.uid"))?;
    Ok(json!({
        "name": name,
        "namespace": names.namespace,
        "labels": labels(db, component, version),
        "ownerReferences": [owner],
    }))
}

/// Every desired child, in apply order (configuration before the workload that reads it).
pub fn desired(db: &DatabaseCluster, inputs: &Inputs<'_>) -> Result<Vec<Child>> {
    let names = Names::of(db)?;
    let mut children = vec![
        config_map::desired(db, &names, inputs)?,
        secret::desired(db, &names, inputs)?,
    ];
    children.extend(secret::replication_desired(db, &names, inputs)?);
    children.extend(services::desired(db, &names, inputs)?);
    // The agents' rights exist before the pods that use them (the RoleBinding goes with
    // the StatefulSet, one wave after its Role: children::waves).
    children.extend(agent_rbac::desired(db, &names, inputs)?);
    // The primary lock exists before the pods whose agents take it.
    children.extend(lease::desired(db, &names, inputs)?);
    children.push(stateful_set::desired(db, &names, inputs)?);
    children.extend(pod_disruption_budget::desired(db, &names, inputs)?);
    Ok(children)
}

#[cfg(test)]
pub(crate) mod test_support {
    use devctl_api::database_cluster::DatabaseCluster;

    /// The seed's sample: my-postgres, postgres 16.2, 3 replicas, 10Gi.
    pub fn sample() -> DatabaseCluster {
        let db: DatabaseCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "db.devctl.io/v1beta1",
            "kind": "DatabaseCluster",
            "metadata": { "name": "my-postgres", "namespace": "prod", "uid": "1234", "generation": 1 },
            "spec": { "engine": "postgres", "version": "16.2", "replicas": 3, "storage": { "size": "10Gi" } }
        }))
        .unwrap();
        db
    }

    pub fn inputs() -> super::Inputs<'static> {
        super::Inputs {
            password: Some("s3cretpassword"),
            replication_password: Some("r3plicationpassword"),
            version: "16.2",
            existing_claim_size: None,
            cluster_domain: "cluster.local",
            agent_image: "ghcr.io/devctl/devctl-operator:v0.1.0",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    /// The hashes of what `desired` renders: what the render key stands for.
    fn rendered(db: &DatabaseCluster, inputs: &Inputs<'_>) -> Vec<(&'static str, String, String)> {
        desired(db, inputs)
            .unwrap()
            .into_iter()
            .map(|c| (c.kind, c.name, c.hash))
            .collect()
    }

    #[test]
    fn a_mysql_cluster_asking_for_replicas_gets_no_replica_service_or_budget() {
        let mut db = sample();
        db.spec.engine = devctl_api::database_cluster::Engine::Mysql;
        db.spec.version = "8.4".into();
        let kinds_and_names: Vec<(&str, String)> = desired(&db, &inputs())
            .unwrap()
            .into_iter()
            .map(|c| (c.kind, c.name))
            .collect();
        assert!(
            !kinds_and_names
                .iter()
                .any(|(kind, name)| *kind == "PodDisruptionBudget" || name.ends_with("-ro")),
            "one instance runs: {kinds_and_names:?}"
        );
        let postgres: Vec<String> = desired(&sample(), &inputs())
            .unwrap()
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert!(postgres.iter().any(|n| n.ends_with("-ro")), "{postgres:?}");
    }

    #[test]
    fn equal_render_keys_render_equal_children_and_every_input_counts() {
        let db = sample();
        let base = inputs();
        let key = base.render_key(&db, &[]);

        // Other passwords, or none read: the same children (a Secret's hash ignores its
        // password), the same key.
        let unread = Inputs {
            password: None,
            replication_password: None,
            ..base
        };
        assert_eq!(rendered(&db, &unread), rendered(&db, &base));
        assert_eq!(unread.render_key(&db, &[]), key);
        // The existing claim template's size when it is the spec's: the same render.
        let same_size = Inputs {
            existing_claim_size: Some("10Gi"),
            ..base
        };
        assert_eq!(rendered(&db, &same_size), rendered(&db, &base));
        assert_eq!(same_size.render_key(&db, &[]), key);

        // Each input that changes the children changes the key.
        let changed = [
            Inputs {
                version: "16.3",
                ..base
            },
            Inputs {
                existing_claim_size: Some("5Gi"),
                ..base
            },
            Inputs {
                cluster_domain: "example.org",
                ..base
            },
            Inputs {
                agent_image: "ghcr.io/devctl/devctl-operator:v0.2.0",
                ..base
            },
        ];
        for other in &changed {
            assert_ne!(rendered(&db, other), rendered(&db, &base));
            assert_ne!(other.render_key(&db, &[]), key);
        }
        let mut bigger = db.clone();
        bigger.spec.replicas = 5;
        assert_ne!(rendered(&bigger, &base), rendered(&db, &base));
        assert_ne!(base.render_key(&bigger, &[]), key);
        let mut recreated = db.clone();
        recreated.metadata.uid = Some("5678".into());
        assert_ne!(base.render_key(&recreated, &[]), key);
        // Children rendered alongside (the store Secrets) count by their hashes.
        let store = desired(&db, &base).unwrap().remove(0);
        assert_ne!(base.render_key(&db, std::slice::from_ref(&store)), key);
        // Status and bookkeeping do not: a status write is not a reason to render.
        let mut reported = db.clone();
        reported.metadata.resource_version = Some("42".into());
        reported.metadata.generation = Some(7);
        reported.status = Some(Default::default());
        assert_eq!(base.render_key(&reported, &[]), key);
    }

    #[test]
    fn sample_renders_exactly_the_expected_children() {
        let children = desired(&sample(), &inputs()).unwrap();
        let got: Vec<(&str, &str)> = children.iter().map(|c| (c.kind, c.name.as_str())).collect();
        assert_eq!(
            got,
            [
                ("ConfigMap", "my-postgres-config"),
                ("Secret", "my-postgres-credentials"),
                ("Secret", "my-postgres-replication"),
                ("Service", "my-postgres-headless"),
                ("Service", "my-postgres-rw"),
                ("Service", "my-postgres-ro"),
                ("ServiceAccount", "my-postgres-agent"),
                ("Role", "my-postgres-agent"),
                ("RoleBinding", "my-postgres-agent"),
                ("StatefulSet", "my-postgres"),
                ("PodDisruptionBudget", "my-postgres"),
            ]
        );
        for child in &children {
            let meta = &child.body["metadata"];
            assert_eq!(
                meta["ownerReferences"][0]["controller"], true,
                "{}",
                child.name
            );
            assert_eq!(
                meta["labels"]["app.kubernetes.io/managed-by"],
                "devctl-operator"
            );
            assert_eq!(meta["labels"]["app.kubernetes.io/instance"], "my-postgres");
            assert_eq!(meta["labels"]["app.kubernetes.io/version"], "16.2");
        }
    }

    #[test]
    fn high_availability_adds_the_primary_lock_before_the_pods() {
        let mut db = sample();
        db.spec.high_availability = Some(devctl_api::database_cluster::HighAvailabilitySpec {
            enabled: true,
            auto_failover: true,
            failover_timeout: "30s".into(),
        });
        let children = desired(&db, &inputs()).unwrap();
        let at = |kind: &str| children.iter().position(|c| c.kind == kind).unwrap();
        assert_eq!(children[at("Lease")].name, "my-postgres-primary");
        assert!(at("Lease") < at("StatefulSet"));
        assert!(KINDS.contains(&"Lease") && READS.contains(&"Lease"));
    }

    #[test]
    fn a_single_instance_has_no_read_only_service_and_no_pdb() {
        let mut db = sample();
        db.spec.replicas = 1;
        let children = desired(&db, &inputs()).unwrap();
        assert!(!children.iter().any(|c| c.name == "my-postgres-ro"));
        assert!(!children.iter().any(|c| c.kind == "PodDisruptionBudget"));
    }
}
