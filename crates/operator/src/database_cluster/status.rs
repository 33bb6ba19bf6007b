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
        .version_refused
        .as_ref()
        .map(|m| ("VersionChangeRefused", m))
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
    let complete = complete && switching_to.is_none() && failing_over.is_none();
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

    let storage_size = match observed.volumes_pending {
        None if observed.stateful_set.is_some() || observed.stateful_set_applied => {
            Some(db.spec.storage.size.clone())
        }
        _ => previous.storage_size.clone(),
    };

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
        instances: observed.instances.summaries.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::resources::test_support::sample;
    use super::*;
    use devctl_api::conditions::{RECONCILING, STALLED};
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn sts(ready: i32, replicas: i32, done: bool) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": { "name": "my-postgres", "generation": 1 },
            "spec": {
                "replicas": replicas, "selector": {}, "serviceName": "x",
                "template": { "spec": { "containers": [{ "name": "postgres", "image": "postgres:16.2" }] } }
            },
            "status": {
                "observedGeneration": 1, "replicas": replicas, "readyReplicas": ready,
                "updatedReplicas": replicas,
                "currentRevision": "a", "updateRevision": if done { "a" } else { "b" }
            }
        }))
        .unwrap()
    }

    fn observed<'a>(sts: Option<&'a StatefulSet>) -> Observed<'a> {
        Observed {
            stateful_set: sts,
            target_version: "16.2",
            target_image: "postgres:16.2",
            version_refused: None,
            replication_refused: None,
            scale_down_refused: None,
            volumes_pending: None,
            credentials_regenerated: false,
            stateful_set_applied: false,
            // The pods are the StatefulSet's status says: all at its update revision.
            updated_pods: sts
                .and_then(|s| s.status.as_ref())
                .and_then(|s| s.updated_replicas)
                .unwrap_or(0),
            failure: None,
            cluster_domain: "cluster.local",
            // Every ready pod's agent reports its engine ready.
            primary: Primary {
                current: "my-postgres-0".into(),
                target: None,
                ..Default::default()
            },
            primary_lost: None,
            failover_stuck: None,
            backup_problem: None,
            backup_health: None,
            last_backup: None,
            last_scheduled_backup: None,
            next_scheduled_backup: None,
            instances: Instances {
                ready: sts
                    .and_then(|s| s.status.as_ref())
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0),
                // One per pod the StatefulSet counts, the first `readyReplicas` of them ready.
                summaries: (0..sts
                    .and_then(|s| s.status.as_ref())
                    .map_or(0, |s| s.replicas))
                    .map(|i| devctl_api::database_cluster::InstanceSummary {
                        name: format!("my-postgres-{i}"),
                        ready: i < sts
                            .and_then(|s| s.status.as_ref())
                            .and_then(|s| s.ready_replicas)
                            .unwrap_or(0),
                        ..Default::default()
                    })
                    .collect(),
                ..Instances::default()
            },
        }
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_000).unwrap())
    }

    fn condition<'a>(
        s: &'a DatabaseClusterStatus,
        t: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        conditions::find(&s.conditions, t).unwrap()
    }

    #[test]
    fn backups_and_wal_archiving_have_a_condition_each_while_backups_are_configured() {
        use super::super::backup::Health;
        let mut db = sample();
        let mut seen = observed(None);
        // Never configured: neither condition.
        let status = compute(&db, &seen, &now()).unwrap();
        assert!(conditions::find(&status.conditions, BACKUP_FAILING).is_none());
        assert!(conditions::find(&status.conditions, WAL_ARCHIVING_FAILING).is_none());
        // Both failing at once: both True (Degraded can name only one).
        seen.backup_health = Some(Health {
            backup_failing: Some("the last backup b failed: store down".into()),
            wal_archiving_failing: Some("WAL archiving fails: store down".into()),
            store_took_wal_since_the_failure: false,
        });
        let status = compute(&db, &seen, &now()).unwrap();
        for type_ in [BACKUP_FAILING, WAL_ARCHIVING_FAILING] {
            let c = condition(&status, type_);
            assert_eq!((c.status.as_str(), c.reason.as_str()), (TRUE, type_));
            assert!(c.message.contains("store down"), "{}", c.message);
        }
        // The store is back: both False.
        db.status = Some(status);
        seen.backup_health = Some(Health::default());
        let status = compute(&db, &seen, &now()).unwrap();
        for type_ in [BACKUP_FAILING, WAL_ARCHIVING_FAILING] {
            assert_eq!(condition(&status, type_).status, FALSE);
        }
        // Backups switched off: False, saying so, not a stale True.
        db.status = Some(status);
        seen.backup_health = None;
        let status = compute(&db, &seen, &now()).unwrap();
        assert_eq!(condition(&status, BACKUP_FAILING).reason, "BackupsOff");
        assert_eq!(condition(&status, WAL_ARCHIVING_FAILING).status, FALSE);
    }

    #[test]
    fn a_backup_that_failed_on_a_store_that_was_down_clears_when_the_store_takes_wal_again() {
        use super::super::backup::Health;
        let failure = "the last backup b1 failed: store unreachable";
        let degraded_by_it = |status: &DatabaseClusterStatus| {
            let c = condition(status, DEGRADED);
            c.status == TRUE && c.reason == BACKUP_FAILING
        };
        let mut db = sample();
        let mut seen = observed(None);
        // The store is down: the backup failed and WAL archiving fails.
        seen.backup_health = Some(Health {
            backup_failing: Some(failure.into()),
            wal_archiving_failing: Some("WAL archiving fails: store unreachable".into()),
            store_took_wal_since_the_failure: false,
        });
        seen.backup_problem = Some((BACKUP_FAILING, failure.into()));
        db.status = compute(&db, &seen, &now());
        // It is back and has taken WAL since: cleared, and it stays cleared.
        seen.backup_health = Some(Health {
            backup_failing: Some(failure.into()),
            wal_archiving_failing: None,
            store_took_wal_since_the_failure: true,
        });
        for _ in 0..2 {
            let status = compute(&db, &seen, &now()).unwrap();
            let c = condition(&status, BACKUP_FAILING);
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                (FALSE, STORE_RETURNED)
            );
            assert!(c.message.starts_with(failure), "{}", c.message);
            assert!(!degraded_by_it(&status));
            db.status = Some(status);
        }
        // A backup that failed with the store fine (WAL archiving never failed) stands
        // although WAL keeps flowing.
        let mut db = sample();
        let mut fine = observed(None);
        fine.backup_health = Some(Health {
            backup_failing: Some(failure.into()),
            wal_archiving_failing: None,
            store_took_wal_since_the_failure: false,
        });
        fine.backup_problem = Some((BACKUP_FAILING, failure.into()));
        db.status = compute(&db, &fine, &now());
        fine.backup_health = Some(Health {
            store_took_wal_since_the_failure: true,
            ..fine.backup_health.clone().unwrap()
        });
        let status = compute(&db, &fine, &now()).unwrap();
        assert_eq!(condition(&status, BACKUP_FAILING).status, TRUE);
        assert!(degraded_by_it(&status));
    }

    #[test]
    fn a_stateful_set_applied_in_this_reconcile_counts_as_created() {
        let mut fresh = observed(None);
        fresh.stateful_set_applied = true;
        let status = compute(&sample(), &fresh, &now()).unwrap();
        assert_eq!(status.phase, Some(Phase::Creating));
        assert_eq!(
            condition(&status, PROGRESSING).message,
            format!("0/{} instances ready", sample().spec.replicas)
        );
        assert_eq!(condition(&status, READY).status, FALSE);
    }

    #[test]
    fn conditions_exist_from_the_first_reconcile() {
        let status = compute(&sample(), &observed(None), &now()).unwrap();
        assert_eq!(status.phase, Some(Phase::Pending));
        assert_eq!(condition(&status, READY).status, FALSE);
        assert_eq!(condition(&status, PROGRESSING).status, TRUE);
        assert_eq!(condition(&status, DEGRADED).status, FALSE);
        assert_eq!(status.observed_generation, Some(1));
        assert_eq!(
            status.primary_endpoint.as_deref(),
            Some("my-postgres-rw.prod.svc.cluster.local")
        );
        assert_eq!(
            status.replica_endpoint.as_deref(),
            Some("my-postgres-ro.prod.svc.cluster.local")
        );
    }

    #[test]
    fn ready_when_every_instance_runs_the_target_version() {
        let s = sts(3, 3, true);
        let status = compute(&sample(), &observed(Some(&s)), &now()).unwrap();
        assert_eq!(status.phase, Some(Phase::Running));
        assert_eq!(condition(&status, READY).status, TRUE);
        assert_eq!(condition(&status, PROGRESSING).status, FALSE);
        assert_eq!(status.current_version.as_deref(), Some("16.2"));
    }

    #[test]
    fn ready_once_every_instance_is_even_before_the_stateful_set_counts_them() {
        // The StatefulSet controller has not counted the pods yet (its status says 0 of
        // everything); the pods at its update revision and the instances (pods Ready, agents
        // reporting) are what Ready means, so the cluster does not wait for it.
        let mut s = sts(0, 3, true);
        if let Some(st) = s.status.as_mut() {
            st.replicas = 0;
            st.updated_replicas = Some(0);
        }
        let mut seen = observed(Some(&s));
        seen.updated_pods = 3;
        seen.instances.ready = 3;
        seen.instances.summaries = (0..3)
            .map(|i| devctl_api::database_cluster::InstanceSummary {
                name: format!("my-postgres-{i}"),
                ready: true,
                ..Default::default()
            })
            .collect();
        let status = compute(&sample(), &seen, &now()).unwrap();
        assert_eq!(condition(&status, READY).status, TRUE);
        assert_eq!(status.ready_replicas, 3);
        assert_eq!(status.replicas, 3);
        // A pod still at the old revision: not yet.
        seen.updated_pods = 2;
        let status = compute(&sample(), &seen, &now()).unwrap();
        assert_eq!(condition(&status, READY).status, FALSE);
        // ... and not before the instances are, whatever the StatefulSet counts.
        let s = sts(3, 3, true);
        let mut seen = observed(Some(&s));
        seen.instances.ready = 2;
        let status = compute(&sample(), &seen, &now()).unwrap();
        assert_eq!(condition(&status, READY).status, FALSE);
    }

    #[test]
    fn replicas_counts_the_pods_that_exist_not_the_stateful_sets_count() {
        // The StatefulSet's status still says 0 replicas; two pods are in the cache already.
        let mut s = sts(0, 2, true);
        if let Some(st) = s.status.as_mut() {
            st.replicas = 0;
        }
        let mut seen = observed(Some(&s));
        seen.instances.summaries = ["my-postgres-0", "my-postgres-1"]
            .map(|name| devctl_api::database_cluster::InstanceSummary {
                name: name.into(),
                ..Default::default()
            })
            .into();
        let status = compute(&sample(), &seen, &now()).unwrap();
        assert_eq!(status.replicas, 2);
    }

    #[test]
    fn ready_pods_are_not_enough_the_agents_must_report_their_engines_ready() {
        let s = sts(3, 3, true);
        let mut seen = observed(Some(&s));
        seen.instances = Instances {
            ready: 2,
            summaries: vec![devctl_api::database_cluster::InstanceSummary {
                name: "my-postgres-2".into(),
                message: Some("initdb failed: disk full".into()),
                ..Default::default()
            }],
            credentials_applied: false,
        };
        let status = compute(&sample(), &seen, &now()).unwrap();
        assert_eq!(status.ready_replicas, 2);
        let ready = condition(&status, READY);
        assert_eq!(ready.status, FALSE);
        assert!(
            ready
                .message
                .contains("my-postgres-2: initdb failed: disk full"),
            "{}",
            ready.message
        );
        assert_eq!(status.current_version, None);
    }

    #[test]
    fn a_converged_status_recomputes_to_itself() {
        let s = sts(3, 3, true);
        let mut db = sample();
        db.status = compute(&db, &observed(Some(&s)), &now());
        let later = Time(Timestamp::from_second(5_000).unwrap());
        assert_eq!(
            compute(&db, &observed(Some(&s)), &later),
            db.status,
            "no write in steady state"
        );
    }

    #[test]
    fn a_change_is_in_progress_from_the_write_that_records_it() {
        let s = sts(3, 3, true);
        let mut scaled = sample();
        scaled.status = compute(&scaled, &observed(Some(&s)), &now());
        scaled.spec.replicas = 5;
        scaled.metadata.generation = Some(2);
        let status = compute(&scaled, &observed(Some(&s)), &now()).unwrap();
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(condition(&status, READY).status, FALSE);
        assert_eq!(condition(&status, READY).reason, "Scaling");
        assert_eq!(condition(&status, RECONCILING).status, TRUE);
        assert_eq!(condition(&status, RECONCILING).reason, "Scaling");

        let mut upgraded = sample();
        upgraded.status = compute(&upgraded, &observed(Some(&s)), &now());
        upgraded.spec.version = "16.4".into();
        let mut o = observed(Some(&s));
        o.target_version = "16.4";
        o.target_image = "postgres:16.4";
        let status = compute(&upgraded, &o, &now()).unwrap();
        assert_eq!(condition(&status, READY).reason, "Upgrading");
        assert_eq!(condition(&status, RECONCILING).status, TRUE);
        assert_eq!(status.current_version.as_deref(), Some("16.2"));

        // Another image of the same version (`spec.image`): the pods are replaced, an upgrade.
        let mut reimaged = sample();
        reimaged.status = compute(&reimaged, &observed(Some(&s)), &now());
        let mut o = observed(Some(&s));
        o.target_image = "registry.example/postgres:16.2-patched";
        let status = compute(&reimaged, &o, &now()).unwrap();
        assert_eq!(condition(&status, READY).reason, "Upgrading");
        assert_eq!(condition(&status, RECONCILING).reason, "Upgrading");

        let mut fresh = observed(Some(&s));
        fresh.stateful_set_applied = true;
        let status = compute(&sample(), &fresh, &now()).unwrap();
        assert_eq!(
            condition(&status, READY).status,
            FALSE,
            "the cache predates the apply"
        );
    }

    #[test]
    fn a_refused_version_change_is_stalled_and_not_ready() {
        let s = sts(3, 3, true);
        let mut o = observed(Some(&s));
        o.version_refused = Some("spec.version 16.1: downgrade from 16.2 to 16.1".into());
        let status = compute(&sample(), &o, &now()).unwrap();
        assert_eq!(condition(&status, STALLED).status, TRUE);
        assert!(condition(&status, STALLED).message.contains("spec.version"));
        assert_eq!(condition(&status, RECONCILING).status, FALSE);
        assert_eq!(condition(&status, READY).reason, "VersionChangeRefused");
        assert_eq!(condition(&status, DEGRADED).reason, "VersionChangeRefused");
    }

    #[test]
    fn a_refused_scale_down_is_stalled_with_its_reason() {
        let s = sts(5, 5, true);
        let mut o = observed(Some(&s));
        o.scale_down_refused =
            Some("spec.replicas 3: scaling down would remove the primary my-postgres-4".into());
        let status = compute(&sample(), &o, &now()).unwrap();
        for type_ in [STALLED, DEGRADED] {
            assert_eq!(condition(&status, type_).status, TRUE);
            assert_eq!(condition(&status, type_).reason, SCALE_DOWN_REFUSED);
        }
        assert_eq!(condition(&status, READY).status, FALSE);
    }

    #[test]
    fn a_transient_error_is_reconciling_not_stalled() {
        let mut o = observed(None);
        o.failure = Some(Failure {
            reason: "ApiError",
            message: "apply StatefulSet my-postgres: timeout".into(),
            permanent: false,
        });
        let status = compute(&sample(), &o, &now()).unwrap();
        assert_eq!(condition(&status, STALLED).status, FALSE);
        assert_eq!(condition(&status, RECONCILING).status, TRUE);
        // `Progressing` and `Reconciling` say the same, also on a converged cluster.
        let s = sts(3, 3, true);
        let mut o = observed(Some(&s));
        o.failure = Some(Failure {
            reason: "ApiError",
            message: "apply Service my-postgres-rw: timeout".into(),
            permanent: false,
        });
        let status = compute(&sample(), &o, &now()).unwrap();
        for type_ in [PROGRESSING, RECONCILING] {
            assert_eq!(
                (
                    condition(&status, type_).status.as_str(),
                    condition(&status, type_).reason.as_str()
                ),
                ("True", "ApiError"),
                "{type_}"
            );
        }
    }

    #[test]
    fn errors_become_degraded_and_not_ready() {
        let mut o = observed(None);
        o.failure = Some(Failure {
            reason: "Forbidden",
            message: "apply StatefulSet my-postgres: forbidden".into(),
            permanent: true,
        });
        let status = compute(&sample(), &o, &now()).unwrap();
        assert_eq!(condition(&status, READY).reason, "Forbidden");
        assert_eq!(condition(&status, DEGRADED).status, TRUE);
        assert_eq!(status.phase, Some(Phase::Failed));
        assert_eq!(
            condition(&status, STALLED).status,
            TRUE,
            "a denied child needs a human"
        );
    }

    fn served(s: &StatefulSet) -> DatabaseCluster {
        let mut db = sample();
        db.status = compute(&db, &observed(Some(s)), &now());
        assert_eq!(
            db.status.as_ref().unwrap().current_version.as_deref(),
            Some("16.2")
        );
        db
    }

    #[test]
    fn a_failover_is_progressing_and_recorded_in_the_status() {
        let s = sts(2, 3, true);
        let db = served(&sts(3, 3, true));
        let mut o = observed(Some(&s));
        o.primary = Primary {
            current: "my-postgres-0".into(),
            target: Some(devctl_api::instance::TARGET_PENDING.into()),
            failed: Some("my-postgres-0".into()),
            epoch: Some(2),
            last_failover_time: Some("2025-01-01T00:00:00Z".into()),
            failed_targets: Vec::new(),
            last_switchover_time: None,
        };
        let status = compute(&db, &o, &now()).unwrap();
        let progressing = condition(&status, PROGRESSING);
        assert_eq!(progressing.status, TRUE);
        assert_eq!(progressing.reason, FAILING_OVER);
        assert_eq!(
            progressing.message,
            "failing over from my-postgres-0 (epoch 2): waiting for the replicas' final positions"
        );
        assert_eq!(condition(&status, READY).status, FALSE);
        assert_eq!(status.target_primary.as_deref(), Some("pending"));
        assert_eq!(status.failover_epoch, Some(2));
        assert_eq!(status.failed_primary.as_deref(), Some("my-postgres-0"));
        assert_eq!(
            status.last_failover_time.as_deref(),
            Some("2025-01-01T00:00:00Z")
        );
        // The failed primary is down: fewer instances, not a primary nobody replaces.
        assert_eq!(condition(&status, DEGRADED).reason, INSTANCES_UNAVAILABLE);

        o.primary.target = Some("my-postgres-2".into());
        let status = compute(&db, &o, &now()).unwrap();
        assert_eq!(
            condition(&status, PROGRESSING).message,
            "failing over from my-postgres-0 (epoch 2): promoting my-postgres-2"
        );

        // Done: the new primary, the epoch and time kept, nothing in progress.
        let s = sts(3, 3, true);
        let mut o = observed(Some(&s));
        o.primary = Primary {
            current: "my-postgres-2".into(),
            epoch: Some(2),
            last_failover_time: Some("2025-01-01T00:00:00Z".into()),
            ..Default::default()
        };
        let status = compute(&db, &o, &now()).unwrap();
        assert_eq!(condition(&status, READY).status, TRUE);
        assert_eq!(condition(&status, DEGRADED).status, FALSE);
        assert_eq!(status.current_primary.as_deref(), Some("my-postgres-2"));
        assert_eq!(status.target_primary, None);
        assert_eq!(status.failed_primary, None);
        assert_eq!(status.failover_epoch, Some(2));
    }

    #[test]
    fn a_lost_primary_without_automatic_failover_is_degraded_with_what_to_do() {
        let s = sts(2, 3, true);
        let db = served(&sts(3, 3, true));
        let mut o = observed(Some(&s));
        o.version_refused = Some("spec.version 16.1: downgrade".into());
        o.primary_lost = Some(
            "the primary my-postgres-0 did not renew the lock for 30s; automatic failover is off (spec.highAvailability.autoFailover): promote a replica with `devctl db promote my-postgres POD`".into(),
        );
        let status = compute(&db, &o, &now()).unwrap();
        let degraded = condition(&status, DEGRADED);
        assert_eq!(degraded.status, TRUE);
        assert_eq!(degraded.reason, PRIMARY_UNAVAILABLE);
        assert!(degraded.message.contains("devctl db promote my-postgres"));
        assert_eq!(status.failover_epoch, None, "nothing started");
    }

    #[test]
    fn fewer_ready_instances_than_declared_is_degraded_once_the_cluster_has_served() {
        let s = sts(2, 3, true);
        let mut o = observed(Some(&s));
        o.instances.summaries = vec![
            devctl_api::database_cluster::InstanceSummary {
                name: "my-postgres-0".into(),
                ready: true,
                ..Default::default()
            },
            devctl_api::database_cluster::InstanceSummary {
                name: "my-postgres-1".into(),
                message: Some("the engine does not accept connections yet".into()),
                ..Default::default()
            },
            devctl_api::database_cluster::InstanceSummary {
                name: "my-postgres-2".into(),
                ready: true,
                ..Default::default()
            },
        ];
        // Creating: not degraded yet.
        let status = compute(&sample(), &o, &now()).unwrap();
        assert_eq!(condition(&status, DEGRADED).status, FALSE);
        let status = compute(&served(&sts(3, 3, true)), &o, &now()).unwrap();
        let degraded = condition(&status, DEGRADED);
        assert_eq!(degraded.reason, INSTANCES_UNAVAILABLE);
        assert!(
            degraded
                .message
                .starts_with("2/3 instances ready; my-postgres-1"),
            "{}",
            degraded.message
        );
        // A primary that does not accept connections says more.
        o.instances.summaries[0].ready = false;
        let status = compute(&served(&sts(3, 3, true)), &o, &now()).unwrap();
        let degraded = condition(&status, DEGRADED);
        assert_eq!(degraded.reason, PRIMARY_UNAVAILABLE);
        assert!(
            degraded.message.contains("no automatic failover"),
            "{}",
            degraded.message
        );
        // While pods are replaced by a rollout, it is progress, not degradation.
        let rolling = sts(2, 3, false);
        let mut o = observed(Some(&rolling));
        o.instances.ready = 2;
        let status = compute(&served(&sts(3, 3, true)), &o, &now()).unwrap();
        assert_eq!(condition(&status, DEGRADED).status, FALSE);
    }
}
