//! A PostgreSQL major version upgrade (docs/major-upgrade.md): when `spec.version` names a
//! higher major than `status.currentVersion`, one state machine over `status.majorUpgrade`
//! (pure: [`decide`]) takes the cluster through
//!
//! 1. `Pending` until every instance is ready;
//! 2. `BackingUp` (when backups are on): the backup `<name>-pre-upgrade-<from>-<to>`, kept by
//!    every retention rule, completed before anything stops;
//! 3. `Upgrading`: the StatefulSet renders the new version; the primary's pod is replaced
//!    (its agent stops PostgreSQL cleanly), and its init container `major-upgrade` runs
//!    `pg_upgrade` on its volume (`--check` first) and records the result on the pod
//!    ([`MAJOR_UPGRADE_RESULT_ANNOTATION`]); the replicas keep serving reads on the old
//!    major meanwhile — an `OrderedReady` StatefulSet makes no pod of a higher ordinal while
//!    a lower one is not ready, so replicas replaced first could keep the primary from
//!    coming back;
//! 4. `Recloning`: the primary runs the new major; every replica is replaced and its agent,
//!    finding data of an older major, clones the primary again;
//! 5. done once every instance is ready on the new version (`status.currentVersion`):
//!    `status.majorUpgrade` is cleared.
//!
//! A refusal (`pg_upgrade --check`, missing binaries, a failed backup) or a failure of the
//! step goes back to the old version's template — the primary's pod is replaced once more and
//! starts on its old data, which the step never touched (copy mode) — and stays `Refused` or
//! `Failed` until `spec.version` changes. Failover, switchover and the ordinary rollout wait
//! while instances are stopped for the upgrade.

use devctl_api::database_backup::BackupPhase;
use devctl_api::database_cluster::{
    DatabaseCluster, Engine, MajorUpgradeStatus, MajorUpgradeStep, UpgradeMethod, major_upgrade,
};
use devctl_api::instance::{InstanceStatus, MAJOR_UPGRADE_RESULT_ANNOTATION, UpgradeResult};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::instances::serves;
use super::pods;
use crate::reconciler::Announcement;

/// Reason of `Progressing` (and `Ready` false) while a major upgrade is under way.
pub const MAJOR_UPGRADE: &str = "MajorUpgrade";
/// Reasons of `Degraded`/`Stalled` after a refused or failed one.
pub const MAJOR_UPGRADE_REFUSED: &str = "MajorUpgradeRefused";
pub const MAJOR_UPGRADE_FAILED: &str = "MajorUpgradeFailed";

/// How long an upgraded primary may take to serve on the new major before the upgrade counts
/// as failed (the data needs no recovery after `pg_upgrade`: a start takes seconds).
pub const START_DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// The name of the backup taken before upgrading `cluster` from major `from` to `to`.
pub fn backup_name(cluster: &str, from: u32, to: u32) -> String {
    format!("{cluster}-pre-upgrade-{from}-{to}")
}

/// The pre-upgrade backup as the cache shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupSeen {
    pub name: String,
    pub phase: Option<BackupPhase>,
    pub message: Option<String>,
    pub created: Option<Timestamp>,
    /// Labelled with this cluster's uid.
    pub ours: bool,
}

impl BackupSeen {
    /// Made for the attempt that began at `started` (RFC 3339), by this cluster: a backup of
    /// the same name from an earlier attempt (or an earlier cluster) is not this one's.
    fn of_attempt(&self, started: Option<&str>) -> bool {
        let started = started.and_then(|s| s.parse::<Timestamp>().ok());
        self.ours
            && match (self.created, started) {
                // Both the API server's clock and ours, to the second.
                (Some(created), Some(started)) => created.as_second() + 60 >= started.as_second(),
                _ => true,
            }
    }
}

/// What [`decide`] looks at.
pub struct Inputs<'a> {
    pub db: &'a DatabaseCluster,
    pub pods: &'a [&'a Pod],
    pub stateful_set: Option<&'a StatefulSet>,
    /// The current primary (`status.currentPrimary`).
    pub primary: &'a str,
    /// Backups are configured (a destination resolved).
    pub backups_on: bool,
    /// The pre-upgrade backup, when `status.majorUpgrade.backup` names one that exists.
    pub backup: Option<BackupSeen>,
    pub now: Timestamp,
}

/// One reconcile's part of a major upgrade.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    /// `status.majorUpgrade` to record.
    pub record: Option<MajorUpgradeStatus>,
    /// The version the children are rendered for, when the upgrade decides it.
    pub target_version: Option<String>,
    /// `Progressing` reason `MajorUpgrade`: the step, in words.
    pub progress: Option<String>,
    /// `Degraded`/`Stalled`: refused or failed.
    pub problem: Option<(&'static str, String)>,
    /// Pods to replace now (name, uid).
    pub replace: Vec<(String, String)>,
    /// The pre-upgrade backup to create (unless it exists).
    pub create_backup: Option<String>,
    /// Failover, switchover and the ordinary rollout wait.
    pub hold: bool,
    /// A switchover to the first instance before anything stops.
    pub switch_to: Option<String>,
    /// Published with the status write that records the step.
    pub events: Vec<Announcement>,
}

impl Decision {
    /// While an upgrade is under way, what it waits for (a backup, a pod's step) is not
    /// always announced by a watch the cluster has: look again every few seconds.
    pub fn look_again(&self) -> Option<std::time::Duration> {
        self.record
            .as_ref()
            .filter(|u| !u.step.is_final() || self.hold)
            .map(|_| std::time::Duration::from_secs(3))
    }
}

fn announcement(warning: bool, reason: &'static str, note: String) -> Announcement {
    Announcement {
        type_: if warning {
            kube::runtime::events::EventType::Warning
        } else {
            kube::runtime::events::EventType::Normal
        },
        reason,
        action: "MajorUpgrade".into(),
        note,
    }
}

/// Whether the StatefulSet renders `version`'s image and its status describes that spec: its
/// update revision is then the one a pod made for `version` carries.
fn applied(inputs: &Inputs<'_>, version: &str) -> bool {
    let image = super::resources::stateful_set::image(inputs.db, version);
    inputs
        .stateful_set
        .and_then(super::resources::stateful_set::image_of)
        == Some(image.as_str())
        && pods::revision_current(inputs.stateful_set)
}

/// The longest message of a step's result kept (it is the pod's word: untrusted, and it goes
/// into the status, conditions and events).
const RESULT_MESSAGE_LIMIT: usize = 2048;

/// The upgrade step's result on `pod` for the upgrade to `to`: one of the results the step
/// writes, its message bounded; anything else is no result.
fn result_on(pod: &Pod, to: &str) -> Option<UpgradeResult> {
    let raw = pod.annotations().get(MAJOR_UPGRADE_RESULT_ANNOTATION)?;
    let mut result = serde_json::from_str::<UpgradeResult>(raw)
        .ok()
        .filter(|r| r.to == to)
        .filter(|r| {
            matches!(
                r.result.as_str(),
                "Upgraded" | "AlreadyDone" | "Refused" | "Failed"
            )
        })?;
    if let Some((cut, _)) = result.message.char_indices().nth(RESULT_MESSAGE_LIMIT) {
        result.message.truncate(cut);
    }
    Some(result)
}

/// The decision (pure).
pub fn decide(inputs: &Inputs<'_>) -> Decision {
    let db = inputs.db;
    let name = db.name_any();
    let status = db.status.as_ref();
    let running = status.and_then(|s| s.current_version.clone());
    let previous = status.and_then(|s| s.major_upgrade.clone());
    let requested = db.spec.version.clone();
    let Some(running) = running else {
        return Decision::default();
    };
    // With `spec.image` both versions would render the same image (admission refuses it; a
    // cluster admitted without the webhook is refused here, in `plan::version`).
    let wanted = (db.spec.engine == Engine::Postgres && db.spec.image.is_none())
        .then(|| major_upgrade(&running, &requested))
        .flatten();
    match previous {
        // Every instance runs the new version: done.
        Some(p) if !p.step.is_final() && running == p.to => Decision {
            events: vec![announcement(
                false,
                "MajorUpgradeCompleted",
                format!(
                    "upgraded from PostgreSQL {} to {} ({} mode){}",
                    p.from,
                    p.to,
                    p.method.as_str(),
                    p.backup
                        .as_ref()
                        .map(|b| format!("; the backup {b} taken before is kept until deleted"))
                        .unwrap_or_default()
                ),
            )],
            ..Decision::default()
        },
        Some(p) if !p.step.is_final() => step(inputs, p),
        // The way back is finished first, whatever spec.version says now.
        Some(p) if !reverted(inputs, &p) => settled(inputs, p),
        // Refused or failed for this version: not again until spec.version changes.
        Some(p) if p.to == requested && wanted.is_some() => settled(inputs, p),
        _ => match wanted {
            Some((from, to)) => {
                let method = db
                    .spec
                    .upgrade
                    .as_ref()
                    .map(|u| u.method)
                    .unwrap_or_default();
                let begun = MajorUpgradeStatus {
                    from: running.clone(),
                    to: requested.clone(),
                    step: MajorUpgradeStep::Pending,
                    method,
                    primary: None,
                    backup: None,
                    started_at: Some(inputs.now.to_string()),
                    message: None,
                };
                let mut decision = step(inputs, begun);
                decision.events.insert(
                    0,
                    announcement(
                        false,
                        "MajorUpgradeStarted",
                        format!(
                            "upgrading {name} from PostgreSQL {from} ({running}) to {to} ({requested}) in {} mode{}",
                            method.as_str(),
                            if inputs.backups_on {
                                format!(", after the backup {}", backup_name(&name, from, to))
                            } else if method == UpgradeMethod::Link {
                                "; backups are off: with link mode there is no way back once the new major has run".to_string()
                            } else {
                                String::new()
                            }
                        ),
                    ),
                );
                decision
            }
            // Nothing to upgrade (a refused one cleared by a spec back on the running version).
            None => Decision::default(),
        },
    }
}

/// Whether every instance serves, at the StatefulSet's current template, and no switchover
/// or failover is under way.
fn all_ready(inputs: &Inputs<'_>) -> bool {
    let status = inputs.db.status.as_ref();
    if status.is_some_and(|s| s.target_primary.is_some() || s.failed_primary.is_some()) {
        return false;
    }
    let want = super::resources::stateful_set::instances(inputs.db);
    let serving = inputs.pods.iter().filter(|p| serves(p)).count();
    serving as i32 >= want && pods::at_update_revision(inputs.pods, inputs.stateful_set) >= want
}

fn pod<'a>(inputs: &Inputs<'a>, name: &str) -> Option<&'a Pod> {
    inputs.pods.iter().copied().find(|p| p.name_any() == name)
}

/// Whether `pod` was made from the StatefulSet's current template (which describes its
/// spec).
fn current(inputs: &Inputs<'_>, pod: &Pod) -> bool {
    pods::revision_current(inputs.stateful_set)
        && pods::update_revision(inputs.stateful_set).is_some_and(|r| pods::at_revision(pod, r))
}

/// One step of an upgrade under way.
fn step(inputs: &Inputs<'_>, mut p: MajorUpgradeStatus) -> Decision {
    let mut decision = Decision {
        hold: true,
        // Until the primary stops, the old version runs.
        target_version: Some(p.from.clone()),
        ..Decision::default()
    };
    let refused = match p.step {
        MajorUpgradeStep::Pending => pending(inputs, &mut p, &mut decision),
        MajorUpgradeStep::BackingUp => backing_up(inputs, &mut p, &mut decision),
        MajorUpgradeStep::Upgrading => upgrading(inputs, &mut p, &mut decision),
        MajorUpgradeStep::Recloning => {
            recloning(inputs, &mut p, &mut decision);
            None
        }
        MajorUpgradeStep::Refused | MajorUpgradeStep::Failed => return settled(inputs, p),
    };
    if let Some(reason) = refused {
        return refuse(p, reason);
    }
    decision.record = Some(p);
    decision
}

/// Refused before anything of the data changed: back on the old version.
fn refuse(mut p: MajorUpgradeStatus, reason: String) -> Decision {
    p.step = MajorUpgradeStep::Refused;
    p.message = Some(reason.clone());
    Decision {
        hold: true,
        events: vec![announcement(
            true,
            "MajorUpgradeFailed",
            format!("refused: {reason}; still running {}", p.from),
        )],
        problem: Some((MAJOR_UPGRADE_REFUSED, refused_message(&p, &reason))),
        target_version: Some(p.from.clone()),
        record: Some(p),
        ..Decision::default()
    }
}

/// `Pending`: every instance ready, then the backup (or, without backups, the stop); why it
/// is refused, if it is.
fn pending(
    inputs: &Inputs<'_>,
    p: &mut MajorUpgradeStatus,
    decision: &mut Decision,
) -> Option<String> {
    let name = inputs.db.name_any();
    let first = format!("{name}-0");
    let moving = inputs
        .db
        .status
        .as_ref()
        .and_then(|s| s.target_primary.as_deref());
    if inputs.primary != first {
        // The StatefulSet is `OrderedReady`: it makes a deleted pod again only once every
        // lower ordinal is ready, and replicas stop being ready when their primary stops. The
        // primary at ordinal 0 comes back whatever the replicas do. Asked once every instance
        // is ready (a switchover to a replica that is not would be refused, again and again),
        // and not while one is under way.
        p.message = Some(format!(
            "switching the primary over to {first} first (an OrderedReady StatefulSet makes the primary's pod again only once the lower ordinals are ready)"
        ));
        let status = inputs.db.status.as_ref();
        let switched_since_start = status
            .and_then(|s| s.last_switchover_time.as_deref())
            .and_then(|t| t.parse::<Timestamp>().ok())
            .zip(
                p.started_at
                    .as_deref()
                    .and_then(|t| t.parse::<Timestamp>().ok()),
            )
            .is_some_and(|(switched, started)| switched >= started);
        if moving.is_none() && switched_since_start {
            // Tried once and it did not end on the first instance: not again and again.
            return Some(format!(
                "the switchover of the primary to {first} before the upgrade did not complete (see the SwitchoverAborted event); promote {first} (`devctl db promote {name} {first}`), then change spec.version to try again"
            ));
        }
        if moving.is_none() && all_ready(inputs) {
            decision.switch_to = Some(first);
        } else if moving.is_none() {
            p.message = Some(format!(
                "waiting for every instance to be ready, then switching the primary over to {first}"
            ));
        }
        decision.hold = false;
    } else if !all_ready(inputs) {
        p.message = Some("waiting for every instance to be ready".into());
        decision.hold = false;
    } else if inputs.backups_on
        && let Some((from, to)) = major_upgrade(&p.from, &p.to)
    {
        // The standard name, unless an earlier attempt's backup has it (kept until deleted):
        // then this attempt's own, by its time.
        let standard = backup_name(&name, from, to);
        let backup = match &inputs.backup {
            Some(seen) if seen.name == standard => {
                // The attempt's time: the same name however often this is decided.
                let started = p
                    .started_at
                    .as_deref()
                    .and_then(|t| t.parse::<Timestamp>().ok())
                    .unwrap_or(inputs.now);
                format!("{standard}-{}", started.as_second())
            }
            _ => standard,
        };
        p.step = MajorUpgradeStep::BackingUp;
        p.message = Some(format!("taking the backup {backup} before anything stops"));
        p.backup = Some(backup);
        decision.create_backup = p.backup.clone();
        decision.hold = false;
    } else {
        stop_primary(inputs, p, decision);
    }
    None
}

/// On to `Upgrading`: the new version's template, the primary named.
fn stop_primary(inputs: &Inputs<'_>, p: &mut MajorUpgradeStatus, decision: &mut Decision) {
    p.step = MajorUpgradeStep::Upgrading;
    p.primary = Some(inputs.primary.to_string());
    p.message = Some(format!("stopping the primary {}", inputs.primary));
    decision.target_version = Some(p.to.clone());
    decision.hold = true;
}

/// `BackingUp`: the backup completes (then the stop), or fails (refused); why not, if not.
fn backing_up(
    inputs: &Inputs<'_>,
    p: &mut MajorUpgradeStatus,
    decision: &mut Decision,
) -> Option<String> {
    let backup = p.backup.clone().unwrap_or_default();
    decision.hold = false;
    match &inputs.backup {
        Some(seen) if seen.name == backup && !seen.of_attempt(p.started_at.as_deref()) => {
            Some(format!(
                "a DatabaseBackup {backup} from before this upgrade (or of another cluster of this name) exists; nothing was stopped: delete it, then change spec.version to try again"
            ))
        }
        Some(seen) if seen.phase == Some(BackupPhase::Completed) && !all_ready(inputs) => {
            p.message = Some(format!(
                "the backup {backup} completed; waiting for every instance to be ready"
            ));
            None
        }
        Some(seen) if seen.phase == Some(BackupPhase::Completed) => {
            stop_primary(inputs, p, decision);
            p.message = Some(format!(
                "the backup {backup} completed; stopping the primary {}",
                inputs.primary
            ));
            None
        }
        Some(seen) if seen.phase == Some(BackupPhase::Failed) => Some(format!(
            "the backup {backup} taken before the upgrade failed{}; nothing was stopped",
            seen.message
                .as_ref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        )),
        _ => {
            decision.create_backup = Some(backup.clone());
            p.message = Some(format!("taking the backup {backup} before anything stops"));
            None
        }
    }
}

/// `Upgrading`: the primary's pod replaced, then its step's result; a refusal's reason.
fn upgrading(
    inputs: &Inputs<'_>,
    p: &mut MajorUpgradeStatus,
    decision: &mut Decision,
) -> Option<String> {
    decision.target_version = Some(p.to.clone());
    let primary = p
        .primary
        .clone()
        .unwrap_or_else(|| inputs.primary.to_string());
    let Some(pod) = pod(inputs, &primary) else {
        p.message = Some(format!("waiting for the pod {primary} to be made again"));
        return None;
    };
    if pod.metadata.deletion_timestamp.is_some() {
        p.message = Some(format!("stopping the primary {primary}"));
        return None;
    }
    if !current(inputs, pod) {
        if applied(inputs, &p.to) {
            decision
                .replace
                .push((primary.clone(), pod.uid().unwrap_or_default()));
        }
        p.message = Some(format!("stopping the primary {primary}"));
        return None;
    }
    // Its agent reports the new major (the step's own record lost, e.g. it was killed right
    // after the swap and found the data upgraded when it ran again): upgraded.
    let reports_new_major = serves(pod)
        && InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())
            .and_then(|r| r.engine_version)
            .is_some_and(|v| v.split('.').next() == p.to.split('.').next());
    let result = result_on(pod, &p.to).or_else(|| {
        reports_new_major.then(|| UpgradeResult {
            to: p.to.clone(),
            result: "AlreadyDone".into(),
            message: String::new(),
            old_intact: true,
            at: None,
        })
    });
    let Some(result) = result else {
        p.message = Some(format!(
            "running pg_upgrade ({}) on {primary}'s volume",
            p.method.as_str()
        ));
        return None;
    };
    match result.result.as_str() {
        "Upgraded" | "AlreadyDone" if serves(pod) => {
            p.step = MajorUpgradeStep::Recloning;
            p.message = Some(format!(
                "{primary} runs {}; cloning the replicas again",
                p.to
            ));
        }
        "Upgraded" | "AlreadyDone" if past_start_deadline(&result, inputs.now) => {
            // Copy mode: the old data is kept beside the new; the step puts it back.
            let stuck = UpgradeResult {
                result: "Failed".into(),
                message: format!(
                    "PostgreSQL {} did not serve within {} s of the upgrade step (see the pod's log)",
                    p.to,
                    START_DEADLINE.as_secs()
                ),
                old_intact: p.method == UpgradeMethod::Copy,
                ..result
            };
            failed(p, decision, &primary, &stuck);
        }
        "Upgraded" | "AlreadyDone" => {
            p.message = Some(format!(
                "upgraded {primary}'s data; starting it on {}",
                p.to
            ));
        }
        "Refused" => return Some(result.message),
        _ => failed(p, decision, &primary, &result),
    }
    None
}

/// Whether the step's result is older than [`START_DEADLINE`] (on the pod's clock, as it
/// wrote it; a result without a time never is).
fn past_start_deadline(result: &UpgradeResult, now: Timestamp) -> bool {
    result
        .at
        .as_deref()
        .and_then(|at| at.parse::<Timestamp>().ok())
        .is_some_and(|at| {
            now.as_second().saturating_sub(at.as_second()) > START_DEADLINE.as_secs() as i64
        })
}

/// The step failed after it started: the old version again when the old data is whole.
fn failed(
    p: &mut MajorUpgradeStatus,
    decision: &mut Decision,
    primary: &str,
    result: &UpgradeResult,
) {
    p.step = MajorUpgradeStep::Failed;
    let way_back = if result.old_intact {
        format!("the old data directory starts again on {}", p.from)
    } else {
        match &p.backup {
            Some(b) => format!(
                "the old data directory {CANNOT_START_AGAIN} (link mode): restore the backup {b} into a new cluster"
            ),
            None => format!(
                "the old data directory {CANNOT_START_AGAIN} (link mode) and backups are off: the data is in the new major's directory for an administrator"
            ),
        }
    };
    let message = format!("{}; {way_back}", result.message);
    p.message = Some(message.clone());
    decision.events.push(announcement(
        true,
        "MajorUpgradeFailed",
        format!("upgrading {primary} to {}: {message}", p.to),
    ));
    decision.problem = Some((MAJOR_UPGRADE_FAILED, failed_message(p, &message)));
    if result.old_intact {
        decision.target_version = Some(p.from.clone());
    }
}

/// `Recloning`: every replica still on the old template replaced.
fn recloning(inputs: &Inputs<'_>, p: &mut MajorUpgradeStatus, decision: &mut Decision) {
    decision.target_version = Some(p.to.clone());
    let primary = p.primary.clone().unwrap_or_default();
    let ready_to_replace = applied(inputs, &p.to);
    for pod in inputs.pods {
        let pod_name = pod.name_any();
        if ready_to_replace
            && pod_name != primary
            && pod.metadata.deletion_timestamp.is_none()
            && !current(inputs, pod)
        {
            decision
                .replace
                .push((pod_name, pod.uid().unwrap_or_default()));
        }
    }
    // Every replica cloned and serving: the ordinary rollout may take it from here (a
    // template changed meanwhile replaces the primary too), and failover is back.
    decision.hold = inputs
        .pods
        .iter()
        .any(|pod| pod.name_any() != primary && (!current(inputs, pod) || !serves(pod)));
    p.message = Some(format!(
        "{primary} runs {}; cloning the replicas again",
        p.to
    ));
}

/// Whether a refused or failed upgrade's instance runs the old version again (or never
/// stopped; or cannot: link mode).
fn reverted(inputs: &Inputs<'_>, p: &MajorUpgradeStatus) -> bool {
    let Some(primary) = p.primary.as_deref() else {
        return true;
    };
    if failed_for_good(p) {
        return true;
    }
    pod(inputs, primary)
        .is_some_and(|pod| current(inputs, pod) && serves(pod) && applied(inputs, &p.from))
}

/// A link-mode failure that disabled the old data directory: it is not started again.
fn failed_for_good(p: &MajorUpgradeStatus) -> bool {
    p.step == MajorUpgradeStep::Failed
        && p.message
            .as_deref()
            .is_some_and(|m| m.contains(CANNOT_START_AGAIN))
}

/// In the message of a failure whose old data directory must not start again.
const CANNOT_START_AGAIN: &str = "cannot start again";

/// Refused or failed: back on the old version (in copy mode), the upgraded instance's pod
/// replaced once more if it still runs the new version's template.
fn settled(inputs: &Inputs<'_>, p: MajorUpgradeStatus) -> Decision {
    let message = p.message.clone().unwrap_or_default();
    let failed_for_good = failed_for_good(&p);
    let mut decision = Decision {
        problem: Some(if p.step == MajorUpgradeStep::Refused {
            (MAJOR_UPGRADE_REFUSED, refused_message(&p, &message))
        } else {
            (MAJOR_UPGRADE_FAILED, failed_message(&p, &message))
        }),
        target_version: Some(if failed_for_good {
            p.to.clone()
        } else {
            p.from.clone()
        }),
        ..Decision::default()
    };
    if !failed_for_good
        && let Some(primary) = p.primary.as_deref()
        && let Some(pod) = pod(inputs, primary)
    {
        let back = current(inputs, pod);
        decision.hold = !back || !serves(pod);
        if !back && pod.metadata.deletion_timestamp.is_none() && applied(inputs, &p.from) {
            decision
                .replace
                .push((primary.to_string(), pod.uid().unwrap_or_default()));
        }
    }
    decision.record = Some(p);
    decision
}

fn refused_message(p: &MajorUpgradeStatus, reason: &str) -> String {
    format!(
        "spec.version {}: the major upgrade from {} was refused: {reason}; still running {} (change spec.version to try again)",
        p.to, p.from, p.from
    )
}

fn failed_message(p: &MajorUpgradeStatus, reason: &str) -> String {
    format!(
        "spec.version {}: the major upgrade from {} failed: {reason} (change spec.version to try again)",
        p.to, p.from
    )
}

#[cfg(test)]
#[path = "major_upgrade_tests.rs"]
mod tests;
