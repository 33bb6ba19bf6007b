//! Decide: what one reconcile of a DatabaseCluster writes, and in which order — a pure
//! function of the [`Observation`] and the time, composed of the deciders, one file each
//! (docs/database-cluster.md, *How a reconcile works*):
//!
//! | decision | file |
//! |---|---|
//! | the children (StatefulSet, Services, Secrets, …) | `resources/` |
//! | the version to run | here ([`version`]), `major_upgrade.rs` across majors |
//! | volume growth | `volumes.rs` |
//! | who is primary: failover, switchover | `primary_step.rs` over `failover.rs`, `switchover.rs` |
//! | the rollout: role labels, pod replacements, pod annotations | `pods.rs`, `backup.rs` |
//! | events | `events.rs` |
//! | backups due and expired | `schedule.rs` (carried out by `backup_lifecycle.rs`) |
//! | the status | `status.rs` (from the observation and what the writes did) |
//! | when to look again | `timers.rs` |
//!
//! The executor ([`super::act`]) carries a plan out.

use k8s_openapi::jiff::Timestamp;

use super::backup;
use super::events;
use super::instances;
use super::major_upgrade;
use super::observe::Observation;
use super::pods::{self, PodWrite};
use super::primary_step::{self, PrimaryStep};
use super::resources;
use super::volumes::{self, Growth};
use crate::reconciler::{Announcement, Transition};

/// What to write, in order. Each group has its precondition, which the executor checks:
/// the volumes and the pods only once the children applied; the request dropped after the
/// status only once the status recorded its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// 1. The children are rendered for this version (the running one while a requested
    ///    change is refused).
    pub target_version: String,
    /// Why the requested version is not the target.
    pub version_refused: Option<String>,
    /// 2. Claims grown to `spec.storage.size`.
    pub volumes: Growth,
    /// 3. Published after the children, whatever the status write.
    pub news: Vec<Announcement>,
    /// 4. Who is primary; the request answered now; a failover epoch's baseline.
    pub primary: PrimaryStep,
    /// A failover or switchover step waits on reports: this cluster's events are not
    /// debounced.
    pub hurry: bool,
    /// 5. Role labels, at most one replacement, annotations.
    pub pods: Vec<PodWrite>,
    /// 6. Published with the status write, once.
    pub with_status: Option<Transition>,
    /// A major upgrade's step: its record in the status, the backup it takes first, and
    /// its pod replacements (in `pods`).
    pub upgrade: major_upgrade::Decision,
}

impl Plan {
    /// A decision waits for the lock to be read live: observe that and plan again.
    pub fn needs_lease_confirmation(&self) -> bool {
        self.primary.needs_lease_confirmation
    }
}

/// The plan of one reconcile.
pub fn plan(observation: &Observation, now: Timestamp) -> Plan {
    let db = observation.cluster.as_ref();
    let pods = observation.pods();
    let recorded = observation.recorded_primary();
    let mut upgrade = major_upgrade::decide(&major_upgrade::Inputs {
        db,
        pods: &pods,
        stateful_set: observation.stateful_set.as_deref(),
        primary: &recorded.current,
        backups_on: observation.store.destination.is_some(),
        backup: observation.pre_upgrade_backup.clone(),
        now,
    });
    let (target_version, version_refused) = match upgrade.target_version.clone() {
        Some(version) => (version, None),
        None => version(db),
    };
    let primary =
        primary_step::decide(observation, now, upgrade.hold, upgrade.switch_to.as_deref());
    let replicas = resources::stateful_set::instances(db);
    // Readiness alone: the credentials the instances applied do not hold a rollout up.
    let ready = instances::observe(&pods, replicas, None).ready;
    let mut rollout = pods::plan(
        &pods,
        observation.stateful_set.as_deref(),
        &primary.primary,
        replicas,
        ready,
    );
    if upgrade.hold {
        // The upgrade replaces the pods itself, in its own order.
        rollout.retain(|action| !matches!(action, pods::PodAction::Replace { .. }));
    }
    rollout.extend(
        upgrade
            .replace
            .iter()
            .map(|(pod, uid)| pods::PodAction::Replace {
                primary: *pod == primary.primary.current,
                pod: pod.clone(),
                uid: uid.clone(),
            }),
    );
    let annotations = backup::pod_annotations(&pods, &observation.store, &primary.primary.current);
    let mut with_status = events::with_status(db, &primary, &pods);
    // A step of the upgrade is recorded once (the status write's precondition), its events
    // with it.
    let recorded_upgrade = db.status.as_ref().and_then(|s| s.major_upgrade.as_ref());
    if upgrade.record.as_ref() != recorded_upgrade || !upgrade.events.is_empty() {
        let transition = with_status.get_or_insert_with(|| Transition {
            resource_version: kube::ResourceExt::resource_version(db),
            events: Vec::new(),
        });
        transition.events.append(&mut upgrade.events);
    }
    Plan {
        volumes: volumes::growth(db, observation.claims.iter().map(AsRef::as_ref)),
        news: events::news(
            db,
            observation.stateful_set.as_deref(),
            version_refused.as_deref(),
        ),
        hurry: primary.primary.failed.is_some() || primary.primary.target.is_some(),
        pods: pods::writes(rollout, annotations),
        with_status,
        primary,
        target_version,
        version_refused,
        upgrade,
    }
}

/// The version to run and, when the requested change is refused, why.
pub fn version(db: &devctl_api::database_cluster::DatabaseCluster) -> (String, Option<String>) {
    let requested = &db.spec.version;
    match db
        .status
        .as_ref()
        .and_then(|s| s.current_version.as_deref())
    {
        Some(running)
            if db.spec.image.is_some()
                && devctl_api::database_cluster::major_upgrade(running, requested).is_some() =>
        {
            (
                running.to_string(),
                Some(format!(
                    "spec.version {requested}: a major version upgrade with spec.image set is not supported (remove spec.image); still running {running}"
                )),
            )
        }
        Some(running) => {
            match devctl_api::database_cluster::check_version_change(
                db.spec.engine,
                running,
                requested,
            ) {
                Ok(()) => (requested.clone(), None),
                Err(refused) => (
                    running.to_string(),
                    Some(format!(
                        "spec.version {requested}: {refused}; still running {running}"
                    )),
                ),
            }
        }
        None => (requested.clone(), None),
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
