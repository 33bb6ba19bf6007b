//! Observe: what one reconcile of a DatabaseCluster decides from, read once at its start
//! (docs/database-cluster.md, *How a reconcile works*).
//!
//! Everything comes from the caches except the stores' Secrets ([`backup::resolve`], not
//! cached: they hold keys) and the one confirmed read a fence needs — the primary lock read
//! live before a failover decision judged from the cached lock is acted on
//! ([`Observation::confirm_lease`]). After this, no decision reads a cache: [`super::plan`]
//! is a pure function of an `Observation` and the time.

use std::collections::BTreeSet;
use std::sync::Arc;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::{InstanceStatus, ROLE_PRIMARY, primary_lease_name};
use devctl_api::labels;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::{Api, ResourceExt};

use super::backup;
use super::claims::data_claims;
use super::primary::{LeaseObservation, Primary};
use super::resources::{self, Names, lease};
use crate::context::Context;
use crate::error::Result;

/// One reconcile's view of a cluster.
#[derive(Debug, Clone)]
pub struct Observation {
    pub cluster: Arc<DatabaseCluster>,
    pub names: Names,
    /// The StatefulSet before this reconcile's writes.
    pub stateful_set: Option<Arc<StatefulSet>>,
    /// The backup destination and restore source, resolved from their Secrets.
    pub store: backup::Resolved,
    /// The cluster's pods, with their agents' reports in their annotations.
    pub pods: Vec<Arc<Pod>>,
    /// The primary lock as the cache saw it, and how long it has not changed.
    pub lease: Option<(Arc<Lease>, LeaseObservation)>,
    /// During a failover: the pods that showed life since it started, as this operator's
    /// watch saw it ([`super::failover_liveness`]).
    pub live: BTreeSet<String>,
    /// The data volume claims.
    pub claims: Vec<Arc<PersistentVolumeClaim>>,
    /// Whether the API server still has the lock at the cached version; `None` until a
    /// decision asks ([`super::plan::Plan::needs_lease_confirmation`]).
    pub lease_confirmed: Option<bool>,
    /// The backup a major upgrade takes first (`status.majorUpgrade.backup`), as cached.
    pub pre_upgrade_backup: Option<super::major_upgrade::BackupSeen>,
}

/// The backup a major upgrade takes first, as the cache shows it: the one
/// `status.majorUpgrade.backup` names, else (an upgrade about to start) the one of the
/// standard name, `<name>-pre-upgrade-<from>-<to>`.
fn pre_upgrade_backup(
    ctx: &Context,
    observation: &Observation,
) -> Option<super::major_upgrade::BackupSeen> {
    let db = observation.cluster.as_ref();
    let status = db.status.as_ref()?;
    // A new attempt (none under way) looks for the standard name, not a backup an ended one
    // named.
    let under_way = status
        .major_upgrade
        .as_ref()
        .filter(|u| !u.step.is_final())
        .and_then(|u| u.backup.clone());
    let name = match under_way {
        Some(name) => name,
        None => {
            let running = status.current_version.as_deref()?;
            let (from, to) =
                devctl_api::database_cluster::major_upgrade(running, &db.spec.version)?;
            super::major_upgrade::backup_name(&observation.names.name, from, to)
        }
    };
    let store = ctx
        .caches
        .shared_store::<devctl_api::database_backup::DatabaseBackup>()?;
    let backup = store.get(
        &kube::runtime::reflector::ObjectRef::new(&name).within(&observation.names.namespace),
    )?;
    let backup_status = backup.status.as_ref();
    Some(super::major_upgrade::BackupSeen {
        name,
        phase: backup_status.and_then(|s| s.phase),
        message: backup_status.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.status == "False" || c.type_ == "Failed")
                .map(|c| c.message.clone())
        }),
        created: backup.metadata.creation_timestamp.as_ref().map(|t| t.0),
        ours: backup
            .labels()
            .get(super::backup_lifecycle::CLUSTER_UID_LABEL)
            .is_some_and(|uid| Some(uid) == db.metadata.uid.as_ref()),
    })
}

impl Observation {
    /// Reads the cluster's world from the caches (and its stores' Secrets).
    pub async fn observe(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Self> {
        let names = Names::of(&db)?;
        let store = backup::resolve(ctx, &db, &names).await;
        let pods = cluster_pods(ctx, &names);
        let lease = observe_lease(ctx, &names);
        let mut observation = Self {
            stateful_set: ctx
                .caches
                .get::<StatefulSet>(&names.namespace, &names.stateful_set()),
            claims: data_claims(ctx, &names),
            cluster: db,
            names,
            store,
            pods,
            lease,
            live: BTreeSet::new(),
            lease_confirmed: None,
            pre_upgrade_backup: None,
        };
        observation.pre_upgrade_backup = pre_upgrade_backup(ctx, &observation);
        let recorded = observation.recorded_primary();
        let key = observation.cluster_key();
        observation.live = match (&recorded.failed, recorded.epoch) {
            (Some(_), Some(epoch)) => ctx.failover_liveness.live(key, epoch, &observation.pods()),
            _ => {
                ctx.failover_liveness.forget(&key, recorded.epoch);
                BTreeSet::new()
            }
        };
        Ok(observation)
    }

    /// The one confirmed read: whether the API server still has the primary lock at the
    /// version the cache showed. A watch that fell behind (or broke) sees no renewals, and a
    /// failover is too disruptive to start on that.
    pub async fn confirm_lease(&mut self, ctx: &Context) {
        let Some((cached, _)) = &self.lease else {
            self.lease_confirmed = Some(false);
            return;
        };
        let api: Api<Lease> = Api::namespaced(ctx.client.clone(), &self.names.namespace);
        let confirmed = match api.get_opt(&primary_lease_name(&self.names.name)).await {
            Ok(live) => {
                live.and_then(|l| l.metadata.resource_version) == cached.metadata.resource_version
            }
            Err(error) => {
                tracing::warn!(%error, "reading the primary lock failed; the failover waits");
                false
            }
        };
        self.lease_confirmed = Some(confirmed);
    }

    pub fn pods(&self) -> Vec<&Pod> {
        self.pods.iter().map(AsRef::as_ref).collect()
    }

    /// The cluster's key in the failover liveness notes.
    pub fn cluster_key(&self) -> (String, String) {
        (self.names.namespace.clone(), self.names.name.clone())
    }

    pub fn lease_observation(&self) -> Option<&LeaseObservation> {
        self.lease.as_ref().map(|(_, observation)| observation)
    }

    /// The pod named in `status.currentPrimary`, the switchover or failover target and the
    /// failover bookkeeping, as the status says now. Until a primary is recorded: the one
    /// pod whose agent reports it runs as primary (pods a deleted cluster of this name left
    /// running, now adopted), else the first instance.
    pub fn recorded_primary(&self) -> Primary {
        let status = self.cluster.status.as_ref();
        let holder = self.lease_observation().and_then(|o| o.holder.as_deref());
        Primary {
            current: status
                .and_then(|s| s.current_primary.clone())
                .or_else(|| running_primary(&self.pods(), holder))
                .unwrap_or_else(|| format!("{}-0", self.names.stateful_set())),
            target: status.and_then(|s| s.target_primary.clone()),
            failed: status.and_then(|s| s.failed_primary.clone()),
            epoch: status.and_then(|s| s.failover_epoch),
            last_failover_time: status.and_then(|s| s.last_failover_time.clone()),
            failed_targets: status.map(|s| s.failed_targets.clone()).unwrap_or_default(),
            last_switchover_time: status.and_then(|s| s.last_switchover_time.clone()),
            last_failover: status.and_then(|s| s.last_failover.clone()),
        }
    }
}

/// The pod, not being deleted, whose agent reports the primary role: the only one, or the
/// one of them that holds the primary lock (`lock_holder`; a fenced former primary may still
/// show its last report). `None` when the pods do not say.
pub fn running_primary(pods: &[&Pod], lock_holder: Option<&str>) -> Option<String> {
    let primaries: Vec<String> = pods
        .iter()
        .filter(|pod| {
            pod.metadata.deletion_timestamp.is_none()
                && InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())
                    .and_then(|report| report.role)
                    .as_deref()
                    == Some(ROLE_PRIMARY)
        })
        .map(|pod| pod.name_any())
        .collect();
    match primaries.as_slice() {
        [only] => Some(only.clone()),
        _ => lock_holder
            .filter(|holder| primaries.iter().any(|p| p == holder))
            .map(str::to_string),
    }
}

/// The cluster's pods from the cache.
pub(crate) fn cluster_pods(ctx: &Context, names: &Names) -> Vec<Arc<Pod>> {
    let mut pods = ctx.caches.of_instance::<Pod>(&names.namespace, &names.name);
    pods.retain(|pod| {
        pod.labels().get(labels::NAME).map(String::as_str) == Some(resources::APP_NAME)
    });
    pods
}

/// The primary lock as the cache saw it, and when it last changed.
fn observe_lease(ctx: &Context, names: &Names) -> Option<(Arc<Lease>, LeaseObservation)> {
    let name = primary_lease_name(&names.name);
    let lease = ctx.caches.get::<Lease>(&names.namespace, &name)?;
    let observation = LeaseObservation {
        holder: lease::holder(&lease).map(str::to_string),
        ever_held: lease::ever_held(&lease),
        unchanged_for: ctx
            .caches
            .changed_at::<Lease>(&names.namespace, &name)
            .map(|at| at.elapsed())
            .unwrap_or_default(),
    };
    Some((lease, observation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use devctl_api::instance::STATUS_ANNOTATION;

    fn pod(name: &str, role: Option<&str>, deleting: bool) -> Pod {
        let mut pod = serde_json::json!({ "metadata": { "name": name } });
        if let Some(role) = role {
            pod["metadata"]["annotations"] = serde_json::json!({
                STATUS_ANNOTATION: serde_json::json!({ "role": role, "ready": true }).to_string(),
            });
        }
        if deleting {
            pod["metadata"]["deletionTimestamp"] = "2026-12-05T12:00:00Z".into();
        }
        serde_json::from_value(pod).unwrap()
    }

    /// A cluster that adopts the running pods of a deleted one of its name starts from the
    /// primary they run, not from its first instance.
    #[test]
    fn until_one_is_recorded_the_primary_is_the_pod_that_runs_as_primary() {
        let primary_of = |pods: &[Pod]| {
            let pods: Vec<&Pod> = pods.iter().collect();
            running_primary(&pods, None)
        };
        let replica = pod("shop-0", Some("replica"), false);
        let primary = pod("shop-1", Some("primary"), false);
        assert_eq!(
            primary_of(&[replica.clone(), primary.clone()]),
            Some("shop-1".to_string())
        );
        // None reports, two claim it, or the only one is going: no answer from the pods.
        assert_eq!(primary_of(&[pod("shop-0", None, false)]), None);
        assert_eq!(
            primary_of(&[primary.clone(), pod("shop-2", Some("primary"), false)]),
            None
        );
        assert_eq!(
            primary_of(&[replica, pod("shop-1", Some("primary"), true)]),
            None
        );
        // Two say so (a fenced former primary's last report): the lock holder among them.
        let two = [primary.clone(), pod("shop-2", Some("primary"), false)];
        let two: Vec<&Pod> = two.iter().collect();
        assert_eq!(running_primary(&two, Some("shop-2")), Some("shop-2".into()));
        assert_eq!(running_primary(&two, Some("shop-0")), None);
    }
}
