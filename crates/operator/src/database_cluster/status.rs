//! The status a DatabaseCluster should have, computed from what was observed (pure).

use devctl_api::conditions::{self, DEGRADED, Desired, FALSE, PROGRESSING, READY, TRUE};
use devctl_api::database_cluster::{DatabaseCluster, DatabaseClusterStatus, Phase};
use devctl_api::instance::TARGET_PENDING;
use devctl_api::labels;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::error::Failure;

use super::instances::Instances;
use super::primary::Primary;
use super::resources::{Names, selector};

/// What the reconcile saw and did.
pub struct Observed<'a> {
    pub stateful_set: Option<&'a StatefulSet>,
    /// The version the pods run or are rolling to (the spec's, unless the change was refused).
    pub target_version: &'a str,
    /// The image of `target_version`.
    pub target_image: &'a str,
    /// Why a requested version change was refused.
    pub version_refused: Option<String>,
    /// Why `spec.replicas` is not carried out (MySQL replication).
    pub replication_refused: Option<String>,
    /// Why a scale-down is not carried out (it would remove the primary).
    pub scale_down_refused: Option<String>,
    /// Volumes not yet at the requested size (`resized`/`total`), when a resize is under way.
    pub volumes_pending: Option<(usize, usize)>,
    /// The credentials Secret was recreated with a new password while the data existed.
    pub credentials_regenerated: bool,
    /// The cluster's pods at the StatefulSet's update revision ([`super::pods::at_update_revision`]).
    pub updated_pods: i32,
    /// The StatefulSet was created or updated by this reconcile: its cached status describes
    /// the previous spec.
    pub stateful_set_applied: bool,
    /// Why the reconcile failed.
    pub failure: Option<Failure>,
    pub cluster_domain: &'a str,
    /// The instances as their agents report them.
    pub instances: Instances,
    /// Who is primary after this reconcile, who is becoming it (a switchover or a
    /// failover) and the failover bookkeeping.
    pub primary: Primary,
    /// The primary is lost and nothing fails over on its own (no `autoFailover`, no
    /// replica): why, and what a human can do.
    pub primary_lost: Option<String>,
    /// The failover under way elects nobody: every target it tried failed (why, and what a
    /// human can do).
    pub failover_stuck: Option<String>,
    /// Backups or WAL archiving fail: (`BackupFailing`/`WALArchivingFailing`, why).
    pub backup_problem: Option<(&'static str, String)>,
    /// Each of the two on its own, for their own conditions (`None`: no backups configured).
    pub backup_health: Option<super::backup::Health>,
    /// The newest completed backup the instances report: (stop time, DatabaseBackup name).
    pub last_backup: Option<(String, String)>,
    /// The schedule's last run and next run (RFC 3339).
    pub last_scheduled_backup: Option<String>,
    pub next_scheduled_backup: Option<String>,
    /// `status.majorUpgrade` as this reconcile leaves it.
    pub major_upgrade: Option<devctl_api::database_cluster::MajorUpgradeStatus>,
    /// A major upgrade under way: its step in words.
    pub upgrade_progress: Option<String>,
    /// A major upgrade refused or failed: (`MajorUpgradeRefused`/`MajorUpgradeFailed`, why).
    pub upgrade_problem: Option<(&'static str, String)>,
    /// Synchronous replication is asked for but not in force (MariaDB fell back to
    /// asynchronous).
    pub synchronous_degraded: Option<String>,
}

pub use super::reasons::*;

/// What the phase and the progress message of [`compute`] are decided from.
struct Progress<'a, 'o> {
    observed: &'a Observed<'o>,
    want: i32,
    ready: i32,
    replicas: i32,
    /// `; <pod>: <why>` of the first instance not ready, or empty.
    instance_problem: &'a str,
    previous_ready_reason: Option<&'a str>,
    upgrading: bool,
    /// The declared state is reached and no primary change is under way.
    complete: bool,
    /// The cluster has run its version once (`status.currentVersion`).
    created: bool,
}

impl Progress<'_, '_> {
    /// The phase, and the reason and message of `Progressing` (pure).
    fn decide(&self) -> (Phase, &'static str, String) {
        let Progress {
            observed,
            want,
            ready,
            replicas,
            instance_problem,
            previous_ready_reason,
            upgrading,
            complete,
            created,
        } = *self;
        let switching_to = observed.primary.target.as_deref();
        let failing_over = observed.primary.failed.as_deref();
        if let Some(failed) = failing_over {
            let step = match switching_to {
                Some(target) if target != TARGET_PENDING => format!("promoting {target}"),
                _ => "waiting for the replicas' final positions".to_string(),
            };
            (
                Phase::Running,
                FAILING_OVER,
                format!(
                    "failing over from {failed} (epoch {}): {step}",
                    observed.primary.epoch.unwrap_or(0)
                ),
            )
        } else if let Some(target) = switching_to {
            (
                Phase::Running,
                "SwitchingOver",
                format!(
                    "switching the primary from {} to {target}",
                    observed.primary.current
                ),
            )
        } else if observed.stateful_set.is_none() && !observed.stateful_set_applied {
            // Just applied but not in the cache yet: it exists, and the next status would say
            // so: "Creating" below saves that write.
            (
                Phase::Pending,
                "Creating",
                "creating the StatefulSet".to_string(),
            )
        } else if let Some(step) = &observed.upgrade_progress {
            (
                Phase::Upgrading,
                super::major_upgrade::MAJOR_UPGRADE,
                format!(
                    "major upgrade to {}: {step} ({ready}/{want} ready){instance_problem}",
                    observed
                        .major_upgrade
                        .as_ref()
                        .map_or(observed.target_version, |u| u.to.as_str())
                ),
            )
        } else if upgrading {
            (
                Phase::Upgrading,
                "Upgrading",
                format!(
                    "rolling instances to version {} ({ready}/{want} ready){instance_problem}",
                    observed.target_version
                ),
            )
        } else if complete {
            (
                Phase::Running,
                "Ready",
                format!("{ready}/{want} instances ready"),
            )
        } else if !created {
            (
                Phase::Creating,
                "Creating",
                format!("{ready}/{want} instances ready{instance_problem}"),
            )
        } else if template_rolling(observed)
            || (previous_ready_reason == Some("Upgrading") && replicas == want)
        {
            // The same version with a new pod template (`spec.image`, resources): the pods are
            // replaced one at a time, as in a version upgrade.
            (
                Phase::Upgrading,
                "Upgrading",
                format!(
                    "rolling instances to the new pod template ({}/{want} updated, {ready}/{want} ready){instance_problem}",
                    observed.updated_pods
                ),
            )
        } else {
            (
                Phase::Running,
                "Scaling",
                format!("{ready}/{want} instances ready{instance_problem}"),
            )
        }
    }
}

/// What a client of a primary that does not accept connections waits for (pure).
fn failover_hint(db: &DatabaseCluster) -> String {
    match &db.spec.high_availability {
        Some(ha) if ha.enabled && ha.auto_failover => format!(
            "writes wait until it is back, or until a replica is promoted if it does not renew the primary lock within {}",
            ha.failover_timeout
        ),
        Some(ha) if ha.enabled => {
            "writes wait until it is back (automatic failover is off)".to_string()
        }
        _ => format!(
            "writes wait until it is back (spec.highAvailability is off: no automatic failover), or until a replica is promoted with `devctl db promote {} POD --force` (what the primary had not sent to it is lost)",
            db.name_any()
        ),
    }
}

/// A part of the spec the operator refuses to carry out: (reason, why) (pure).
fn refused<'o>(observed: &'o Observed<'_>) -> Option<(&'static str, &'o String)> {
    observed
        .upgrade_problem
        .as_ref()
        .map(|(reason, m)| (*reason, m))
        .or(observed
            .version_refused
            .as_ref()
            .map(|m| ("VersionChangeRefused", m)))
        .or(observed
            .replication_refused
            .as_ref()
            .map(|m| (REPLICATION_UNSUPPORTED, m)))
        .or(observed
            .scale_down_refused
            .as_ref()
            .map(|m| (SCALE_DOWN_REFUSED, m)))
}

/// `Progressing`: a retried failure, a change under way, or converged (pure).
fn progressing_condition(failure: Option<&Failure>, progressing: Option<(&str, &str)>) -> Desired {
    match (failure, progressing) {
        // Retried: still under way, and `Reconciling` says the same reason.
        (Some(failure), _) if !failure.permanent => {
            Desired::new(PROGRESSING, TRUE, failure.reason, failure.message.clone())
        }
        (Some(failure), _) => {
            Desired::new(PROGRESSING, FALSE, failure.reason, failure.message.clone())
        }
        (None, Some((reason, message))) => {
            Desired::new(PROGRESSING, TRUE, reason, message.to_string())
        }
        (None, None) => Desired::new(
            PROGRESSING,
            FALSE,
            "Converged",
            "every child matches the spec",
        ),
    }
}

/// What `Degraded` is decided from (see [`compute`]).
struct Degraded<'a, 'o> {
    db: &'a DatabaseCluster,
    observed: &'a Observed<'o>,
    previous: &'a DatabaseClusterStatus,
    names: &'a Names,
    ready: i32,
    want: i32,
    replicas: i32,
    upgrading: bool,
    refused: Option<(&'static str, &'a String)>,
    /// The backup failure the store's return cleared ([`failure_the_store_cleared`]).
    store_returned: Option<&'a str>,
    instance_problem: &'a str,
}

impl Degraded<'_, '_> {
    /// `Degraded`, the most pressing problem first (pure).
    fn decide(&self) -> Desired {
        let Degraded {
            db,
            observed,
            previous,
            names,
            ready,
            want,
            replicas,
            upgrading,
            refused,
            store_returned,
            instance_problem,
        } = *self;
        let switching_to = observed.primary.target.as_deref();
        // A primary that was serving and no longer is (not while one is being created, replaced
        // or switched over).
        let primary_unavailable = previous.current_version.is_some()
            && switching_to.is_none()
            // A major upgrade stops the primary on purpose (`Progressing` says so).
            && observed.upgrade_progress.is_none()
            && observed
                .instances
                .summaries
                .iter()
                .any(|i| i.name == observed.primary.current && !i.ready)
            && observed.stateful_set.is_some_and(|s| {
                s.status.as_ref().is_some_and(|st| {
                    st.current_revision.is_some() && st.current_revision == st.update_revision
                })
            });
        // Fewer instances serve than declared, once the cluster has served and all of them
        // exist (not while creating, scaling up or replacing pods, which Progressing says).
        let instances_unavailable = previous.current_version.is_some()
            && ready < want
            && !upgrading
            && observed.stateful_set.is_some_and(|s| {
                s.spec.replicas == Some(want)
                    && replicas >= want
                    && s.status.as_ref().is_some_and(|st| {
                        st.current_revision.is_some() && st.current_revision == st.update_revision
                    })
            });
        // Cleared once every ready instance reports the regenerated Secret applied.
        let regenerated = observed.credentials_regenerated
            || (conditions::find(&previous.conditions, DEGRADED)
                .is_some_and(|c| c.status == TRUE && c.reason == CREDENTIALS_REGENERATED)
                && !observed.instances.credentials_applied);
        // A failure the store's return cleared degrades nothing either.
        let backup_problem = observed.backup_problem.clone().filter(|(reason, message)| {
            !(*reason == BACKUP_FAILING && Some(message.as_str()) == store_returned)
        });
        // A lost primary comes first: no writes until a human acts. Its event is published when
        // this message first appears, so it must not hide behind another reason.
        match (&observed.failure, refused, &observed.primary_lost) {
            _ if observed.failover_stuck.is_some() => Desired::new(
                DEGRADED,
                TRUE,
                FAILOVER_STUCK,
                observed.failover_stuck.clone().unwrap_or_default(),
            ),
            (_, _, Some(lost)) => Desired::new(DEGRADED, TRUE, PRIMARY_UNAVAILABLE, lost.clone()),
            (Some(failure), _, _) => {
                Desired::new(DEGRADED, TRUE, failure.reason, failure.message.clone())
            }
            _ if regenerated => Desired::new(
                DEGRADED,
                TRUE,
                CREDENTIALS_REGENERATED,
                format!(
                    "Secret {} was recreated with a new password; the database keeps the old one until the instances apply it",
                    names.secret()
                ),
            ),
            (None, Some((reason, message)), None) => {
                Desired::new(DEGRADED, TRUE, reason, message.clone())
            }
            (None, None, None) if primary_unavailable => Desired::new(
                DEGRADED,
                TRUE,
                PRIMARY_UNAVAILABLE,
                format!(
                    "the primary {} does not accept connections; {}",
                    observed.primary.current,
                    failover_hint(db)
                ),
            ),
            (None, None, None) if let Some(why) = &observed.synchronous_degraded => Desired::new(
                DEGRADED,
                TRUE,
                SYNCHRONOUS_REPLICATION_DEGRADED,
                why.clone(),
            ),
            (None, None, None) if backup_problem.is_some() && !primary_unavailable => {
                let (reason, message) = backup_problem.clone().unwrap_or_default();
                Desired::new(DEGRADED, TRUE, reason, message)
            }
            (None, None, None) if instances_unavailable => Desired::new(
                DEGRADED,
                TRUE,
                INSTANCES_UNAVAILABLE,
                format!("{ready}/{want} instances ready{instance_problem}"),
            ),
            (None, None, None) => Desired::new(DEGRADED, FALSE, "AsExpected", "no problems found"),
        }
    }
}

/// What keeps the declared state from being reached without a human (pure).
fn stalled<'a>(
    failure: Option<&'a Failure>,
    refused: Option<(&'static str, &'a String)>,
) -> Option<(&'a str, &'a str)> {
    match (failure, refused) {
        (Some(failure), _) if failure.permanent => Some((failure.reason, &failure.message)),
        (Some(_), _) => None,
        (None, Some((reason, message))) => Some((reason, message)),
        (None, None) => None,
    }
}

/// `Ready`: a failure, a refused part of the spec, or the progress (pure).
fn ready_condition(
    failure: Option<&Failure>,
    refused: Option<(&'static str, &String)>,
    complete: bool,
    (progress_reason, progress_message): (&'static str, &String),
) -> Desired {
    match (failure, refused) {
        (Some(failure), _) => Desired::new(READY, FALSE, failure.reason, failure.message.clone()),
        // The declared state will not be reached: not Ready, whatever runs now.
        (None, Some((reason, message))) => Desired::new(READY, FALSE, reason, message.clone()),
        (None, None) if complete => Desired::new(READY, TRUE, "Ready", progress_message.clone()),
        (None, None) => Desired::new(READY, FALSE, progress_reason, progress_message.clone()),
    }
}

/// `status.lastBackup` and `lastBackupName`: the newest completed backup the instances
/// report, never going back to an older one (pure).
fn last_backup(
    observed: &Observed<'_>,
    previous: &DatabaseClusterStatus,
) -> (Option<String>, Option<String>) {
    match (&observed.last_backup, &previous.last_backup) {
        (Some((at, _)), Some(before)) if at <= before => (
            previous.last_backup.clone(),
            previous.last_backup_name.clone(),
        ),
        (Some((at, name)), _) => (Some(at.clone()), Some(name.clone())),
        (None, _) => (
            previous.last_backup.clone(),
            previous.last_backup_name.clone(),
        ),
    }
}

/// What an instance's agent says is wrong, so "not ready" comes with a why: `; <pod>:
/// <message>` of the first instance not ready, or empty (pure).
fn instance_problem(observed: &Observed<'_>) -> String {
    observed
        .instances
        .summaries
        .iter()
        .find(|i| !i.ready && i.message.is_some())
        .map(|i| format!("; {}: {}", i.name, i.message.as_deref().unwrap_or_default()))
        .unwrap_or_default()
}

/// `ResizingVolumes` while claims grow to `spec.storage.size` (pure).
fn volumes_resizing(
    db: &DatabaseCluster,
    observed: &Observed<'_>,
) -> Option<(&'static str, String)> {
    observed.volumes_pending.map(|(done, total)| {
        (
            "ResizingVolumes",
            format!(
                "{done}/{total} volumes expanded to {}",
                db.spec.storage.size
            ),
        )
    })
}

/// The image of the StatefulSet's pod template, as the cache shows it.
fn stateful_set_image<'a>(observed: &Observed<'a>) -> Option<&'a str> {
    super::resources::stateful_set::image_of(observed.stateful_set?)
}

/// A new pod template is being rolled out (`spec.image`, resources): the StatefulSet runs
/// another image than the target, or its controller has not brought every pod to the update
/// revision yet.
fn template_rolling(observed: &Observed<'_>) -> bool {
    let Some(sts) = observed.stateful_set else {
        return false;
    };
    let revisions_differ = sts.status.as_ref().is_some_and(|st| {
        st.update_revision.is_some() && st.current_revision != st.update_revision
    });
    stateful_set_image(observed) != Some(observed.target_image) || revisions_differ
}

/// Whether the StatefulSet runs the declared state: its own spec has the declared replicas
/// and image, and its controller has rolled that out to every pod (created at the update
/// revision, none left over).
fn rollout_complete(observed: &Observed<'_>, replicas: i32) -> bool {
    let Some(sts) = observed.stateful_set else {
        return false;
    };
    let Some(status) = sts.status.as_ref() else {
        return false;
    };
    let spec_matches = sts.spec.replicas == Some(replicas)
        && stateful_set_image(observed) == Some(observed.target_image);
    if observed.stateful_set_applied || !spec_matches {
        return false;
    }
    let generation_seen = status.observed_generation >= sts.metadata.generation;
    let revision_done =
        status.update_revision.is_some() && status.current_revision == status.update_revision;
    // Counted from the pods, not from the StatefulSet's `updatedReplicas`, `replicas` and
    // `readyReplicas`: those follow the pods in its controller's next status update, seconds
    // late under load, and waiting for them cost a status write per new cluster. Whether the
    // instances are ready is `Instances::ready` (pod Ready *and* the agent's report).
    generation_seen
        && revision_done
        && observed.updated_pods >= replicas
        && observed.instances.existing() == replicas
}

/// The failure of the newest backup when the store it failed on is back (pure): the store
/// has taken WAL since, and it was down — `WALArchivingFailing` stood when last looked, or
/// this very failure was already cleared so. A backup that failed for another reason
/// (`pg_basebackup`, an unready instance) with the store fine stands until a newer backup.
fn failure_the_store_cleared<'h>(
    health: Option<&'h super::backup::Health>,
    previous: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<&'h str> {
    let health = health.filter(|h| h.store_took_wal_since_the_failure)?;
    let failure = health.backup_failing.as_deref()?;
    let store_was_down =
        conditions::find(previous, WAL_ARCHIVING_FAILING).is_some_and(|c| c.status == TRUE);
    let cleared_before = conditions::find(previous, BACKUP_FAILING)
        .is_some_and(|c| c.reason == STORE_RETURNED && c.message.starts_with(failure));
    (store_was_down || cleared_before).then_some(failure)
}

/// `BackupFailing` and `WALArchivingFailing`, each `True` with its reason while it fails and
/// `False` once it works again (`StoreReturned` when a backup failed on a store that is back);
/// `False` ("BackupsOff") when backups were configured before and no longer are, and absent
/// on clusters that never had backups.
fn backup_conditions(
    health: Option<&super::backup::Health>,
    store_returned: Option<&str>,
    previous: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Vec<Desired> {
    let shown = |type_: &str| conditions::find(previous, type_).is_some();
    let backup = match store_returned {
        Some(failure) => Some(Desired::new(
            BACKUP_FAILING,
            FALSE,
            STORE_RETURNED,
            format!("{failure}; the store has taken WAL since, a new backup can run"),
        )),
        None => status_of(
            BACKUP_FAILING,
            health.map(|h| &h.backup_failing),
            "backups succeed",
            shown(BACKUP_FAILING),
        ),
    };
    let archiving = status_of(
        WAL_ARCHIVING_FAILING,
        health.map(|h| &h.wal_archiving_failing),
        "WAL reaches the store",
        shown(WAL_ARCHIVING_FAILING),
    );
    backup.into_iter().chain(archiving).collect()
}

/// One of the two: `True` with why, `False` when fine, `BackupsOff` when it was shown before.
fn status_of(
    type_: &'static str,
    failing: Option<&Option<String>>,
    fine: &str,
    shown_before: bool,
) -> Option<Desired> {
    match failing {
        Some(Some(why)) => Some(Desired::new(type_, TRUE, type_, why.clone())),
        Some(None) => Some(Desired::new(type_, FALSE, "AsExpected", fine)),
        None if shown_before => Some(Desired::new(
            type_,
            FALSE,
            "BackupsOff",
            "spec.backup no longer configures backups",
        )),
        None => None,
    }
}

/// `status.storageSize`: the spec's once no volume is still growing.
fn storage_size(
    db: &DatabaseCluster,
    observed: &Observed<'_>,
    previous: &DatabaseClusterStatus,
) -> Option<String> {
    match observed.volumes_pending {
        None if observed.stateful_set.is_some() || observed.stateful_set_applied => {
            Some(db.spec.storage.size.clone())
        }
        _ => previous.storage_size.clone(),
    }
}

pub fn compute(
    db: &DatabaseCluster,
    observed: &Observed<'_>,
    now: &Time,
) -> Option<DatabaseClusterStatus> {
    let names = Names::of(db).ok()?;
    let previous = db.status.clone().unwrap_or_default();
    let want = db.spec.replicas;
    // Ready means the agents say their engines accept connections, not just that pods run.
    let ready = observed.instances.ready;
    // The pods that exist, as the cache shows them: the StatefulSet's own count says the same
    // a moment later, and a status that waited for it would be written twice.
    let replicas = observed.instances.existing();
    let complete = rollout_complete(observed, want) && ready >= want;
    let instance_problem = instance_problem(observed);

    let current_version = if complete {
        Some(observed.target_version.to_string())
    } else {
        previous.current_version.clone()
    };
    let upgrading = previous
        .current_version
        .as_deref()
        .is_some_and(|v| v != observed.target_version)
        && !complete;

    // A change's reason stays until it is done (pods pass through states that would read
    // otherwise, as one is replaced).
    let previous_ready_reason =
        conditions::find(&previous.conditions, READY).map(|c| c.reason.as_str());
    let switching_to = observed.primary.target.as_deref();
    let failing_over = observed.primary.failed.as_deref();
    let complete = complete
        && switching_to.is_none()
        && failing_over.is_none()
        && observed.upgrade_progress.is_none();
    let (phase, progress_reason, progress_message) = Progress {
        observed,
        want,
        ready,
        replicas,
        instance_problem: &instance_problem,
        previous_ready_reason,
        upgrading,
        complete,
        created: current_version.is_some(),
    }
    .decide();
    let phase = if observed.failure.is_some() && current_version.is_none() {
        Phase::Failed
    } else {
        phase
    };

    // A change under way; once the rest is done, volumes still growing.
    let progressing = if !complete {
        Some((progress_reason, progress_message.clone()))
    } else {
        volumes_resizing(db, observed)
    };
    let refused = refused(observed);
    let stalled = stalled(observed.failure.as_ref(), refused);

    let mut desired = Vec::new();
    desired.push(ready_condition(
        observed.failure.as_ref(),
        refused,
        complete,
        (progress_reason, &progress_message),
    ));
    let store_returned =
        failure_the_store_cleared(observed.backup_health.as_ref(), &previous.conditions);
    desired.push(
        Degraded {
            db,
            observed,
            previous: &previous,
            names: &names,
            ready,
            want,
            replicas,
            upgrading,
            refused,
            store_returned,
            instance_problem: &instance_problem,
        }
        .decide(),
    );
    desired.extend(backup_conditions(
        observed.backup_health.as_ref(),
        store_returned,
        &previous.conditions,
    ));
    let in_progress = match &observed.failure {
        // A transient failure is retried: still under way.
        Some(failure) => Some((failure.reason, failure.message.as_str())),
        None => progressing.as_ref().map(|(r, m)| (*r, m.as_str())),
    };
    desired.extend(conditions::kstatus(in_progress, stalled));
    desired.push(progressing_condition(
        observed.failure.as_ref(),
        progressing.as_ref().map(|(r, m)| (*r, m.as_str())),
    ));

    let storage_size = storage_size(db, observed, &previous);

    let (last_backup, last_backup_name) = last_backup(observed, &previous);
    Some(DatabaseClusterStatus {
        phase: Some(phase),
        ready_replicas: ready,
        replicas,
        selector: Some(labels::to_selector_string(&selector(db))),
        observed_generation: db.metadata.generation,
        conditions: conditions::merge(&previous.conditions, &desired, db.metadata.generation, now),
        primary_endpoint: Some(names.dns(&names.read_write_service(), observed.cluster_domain)),
        replica_endpoint: (super::resources::stateful_set::instances(db) > 1)
            .then(|| names.dns(&names.read_only_service(), observed.cluster_domain)),
        connection_secret_name: Some(names.secret()),
        current_version,
        storage_size,
        last_backup,
        last_backup_name,
        last_scheduled_backup: observed.last_scheduled_backup.clone(),
        next_scheduled_backup: observed.next_scheduled_backup.clone(),
        // The first instance at bootstrap; only a switchover or a failover moves it.
        current_primary: Some(observed.primary.current.clone()),
        target_primary: observed.primary.target.clone(),
        failover_epoch: observed.primary.epoch,
        failed_primary: observed.primary.failed.clone(),
        last_failover_time: observed.primary.last_failover_time.clone(),
        failed_targets: observed.primary.failed_targets.clone(),
        last_switchover_time: observed.primary.last_switchover_time.clone(),
        last_failover: observed.primary.last_failover.clone(),
        major_upgrade: observed.major_upgrade.clone(),
        instances: observed.instances.summaries.clone(),
    })
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
