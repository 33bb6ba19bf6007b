//! Failover (docs/failover.md), decided from what is observed (pure).
//!
//! The primary's agent renews the primary lock (the Lease `<cluster>-primary`) while its
//! instance is healthy and fences itself when it cannot. The operator notes on its own
//! monotonic clock when the lock last changed; a lock that was held and has not changed for
//! `failoverTimeout` means the primary is lost — by then it has stopped writing, whatever
//! happened to it. The operator then runs the failover one step per reconcile, keeping every
//! step in the status (`failoverEpoch`, `failedPrimary`, `targetPrimary`), so a restarted
//! operator carries on where the previous one stopped:
//!
//! 1. **Start**: a new epoch, the lost primary as `failedPrimary`, `targetPrimary: pending`.
//!    The replicas stop their WAL receivers and acknowledge the epoch in their reports with
//!    final positions.
//! 2. **Elect**: once enough replicas acknowledged ([`enough_acknowledged`]), the most
//!    advanced one ([`most_advanced`]) becomes `targetPrimary`.
//! 3. **Done**: the target reports itself a ready primary and holds the lock: it becomes
//!    `currentPrimary`.
//!
//! A human can pick the new primary (`devctl db promote`, the switchover request) once the
//! primary is lost; it is the only way without `autoFailover`. Without a lock to wait for
//! (high availability off, or a lock nobody ever took) the human's word is all there is: a
//! request naming a replica while the primary is not ready starts the failover at once
//! ([`manual_failover`]). The old primary's agent fences itself when it sees the failover;
//! the `-rw` Service stops sending clients to it as soon as its role label goes.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::time::Duration;

use devctl_api::database_cluster::{HighAvailabilitySpec, SynchronousSpec};
use devctl_api::instance::{
    InstanceStatus, ROLE_PRIMARY, ROLE_REPLICA, SWITCHOVER_ANNOTATION, TARGET_PENDING,
};

use super::instances::ordinal;
use super::primary::{LeaseObservation, PROMOTION_WAIT, Primary};

/// Everything a failover step depends on.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub cluster: &'a str,
    /// Only when high availability is enabled.
    pub high_availability: Option<&'a HighAvailabilitySpec>,
    pub synchronous: Option<&'a SynchronousSpec>,
    /// The status as recorded.
    pub primary: &'a Primary,
    /// The primary lock, when it exists.
    pub lease: Option<&'a LeaseObservation>,
    /// The agents' reports by pod name, for the pods that are not being deleted.
    pub reports: &'a [(String, Option<InstanceStatus>)],
    /// Instances the cluster runs.
    pub replicas: i32,
    /// The pod named by the switchover request.
    pub requested: Option<&'a str>,
    /// Whether the recorded primary's pod serves (Ready, its agent reporting ready).
    pub primary_ready: bool,
    /// The request allows a failover without a lock ([`FORCE_FAILOVER_ANNOTATION`](devctl_api::instance::FORCE_FAILOVER_ANNOTATION)).
    pub forced: bool,
    /// Time since the failover under way started (`status.lastFailoverTime`).
    pub since_start: Duration,
    /// Time since the last switchover started (`status.lastSwitchoverTime`; long ago when
    /// there was none).
    pub since_switchover: Duration,
    /// During a failover: the pods that showed life since it started (running, their report
    /// changed since, as the operator's watch saw it: [`super::failover_liveness`]).
    pub live: &'a BTreeSet<String>,
    /// Instances are stopped for a major upgrade: nothing fails over, no switchover starts.
    pub suspended: bool,
}

/// What to do about failover in this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing for failover: no high availability, a healthy or never-held lock, or a
    /// switchover under way (which [`super::switchover`] carries). `expires_in`: when the lock
    /// counts as lost unless it changes before.
    Idle { expires_in: Option<Duration> },
    /// The primary is lost and nothing fails over on its own: report it and wait.
    Lost { message: String },
    /// The request cannot be carried out: say why and drop it.
    Refuse(String),
    /// The request names the current primary: drop it.
    AlreadyPrimary,
    /// Begin a failover away from `failed` in `epoch`; `candidate` when a human picked it.
    Start {
        failed: String,
        epoch: i64,
        candidate: Option<String>,
        /// For the `PrimaryLost` event.
        message: String,
        /// The loss was judged from the primary lock, which the operator confirms with the
        /// API server before acting (its watch may lag); `false` for a human's request without
        /// a lock, which needs no confirmation.
        by_lock: bool,
    },
    /// Waiting for the replicas' final positions; `recheck_in` when time alone can make
    /// enough of them (asynchronous replication).
    Pending { recheck_in: Option<Duration> },
    /// Every replica this failover may elect was elected and did not promote, or
    /// [`MAX_FAILED_TARGETS`] did: stop electing and say so, until a human picks one
    /// (`devctl db promote`, which may name a replica tried before).
    Stuck { message: String },
    /// Make this replica `targetPrimary`.
    Elect(String),
    /// The target has not promoted (or not taken the lock) yet.
    Promoting(String),
    /// The target died before promoting (the lock shows it, [`target_lost`]): elect again
    /// in a new epoch, away from the same failed primary. Agents acknowledge each epoch
    /// anew, so a target that does not run cannot be elected again.
    Reelect {
        epoch: i64,
        /// The target given up on.
        lost: String,
        message: String,
        /// As for [`Step::Start`]: judged from the lock, or on a human's request.
        by_lock: bool,
    },
    /// The target runs as the primary and holds the lock: make it `currentPrimary`.
    Done {
        from: String,
        to: String,
        epoch: i64,
    },
}

/// A PostgreSQL LSN (`X/Y`, two hexadecimal halves) as a number.
pub fn parse_lsn(lsn: &str) -> Option<u64> {
    let (high, low) = lsn.trim().split_once('/')?;
    let high = u32::from_str_radix(high, 16).ok()?;
    let low = u32::from_str_radix(low, 16).ok()?;
    Some((u64::from(high) << 32) | u64::from(low))
}

/// How a candidate ranks: highest timeline, then received LSN, then replayed LSN (MariaDB:
/// the GTID position, [`devctl_api::gtid::Position::rank`]), then the lowest ordinal (name).
/// What a report lacks ranks lowest.
type Rank<'a> = (
    Option<i64>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    Reverse<i32>,
    Reverse<&'a str>,
);

fn rank<'a>(name: &'a str, report: &InstanceStatus) -> Rank<'a> {
    let replayed = report.replayed_lsn.as_deref().and_then(parse_lsn);
    // A replica restarted during the failover has no receive position: what it replayed is
    // what it has.
    let received = report
        .received_lsn
        .as_deref()
        .and_then(parse_lsn)
        .max(replayed);
    let gtid = report
        .gtid_position
        .as_deref()
        .and_then(|p| p.parse::<devctl_api::gtid::Position>().ok())
        .map(|p| p.rank());
    (
        report.timeline,
        received,
        replayed,
        gtid,
        Reverse(ordinal(name).unwrap_or(i32::MAX)),
        Reverse(name),
    )
}

/// The most advanced of `candidates` (pod name and final report).
pub fn most_advanced<'a>(candidates: &[(&'a str, &InstanceStatus)]) -> Option<&'a str> {
    candidates
        .iter()
        .max_by(|(a, ra), (b, rb)| rank(a, ra).cmp(&rank(b, rb)))
        .map(|(name, _)| *name)
}

/// How long into a failover every replica with a report counts as live (see
/// [`super::failover_liveness`]): a live agent's report changes within a probe or two of the
/// failover's start, and one that acknowledged at once must not win before the others could.
pub const LIVENESS_GRACE: Duration = Duration::from_secs(3);

/// Whether the election may happen with `acknowledged` of `live` replicas reporting final
/// positions, `since_start` into the failover.
///
/// Synchronous (`ANY k` of `m = replicas − 1` standbys): every acknowledged commit is on `k`
/// standbys, so any `m − k + 1` of them include one that has it — never fewer, however long
/// it takes (a human can still pick a replica). `FIRST k` is treated the same way: which
/// standbys were the first `k` at the moment of the failure is not known. Asynchronous:
/// every live replica (one that showed life since the failover started, whether it has
/// acknowledged yet or not), or once `timeout` (`failoverTimeout`) has passed since the
/// failover started, at least one: a live replica slower than that, or one that dies during the
/// wait, does not hold the failover up for longer.
pub fn enough_acknowledged(
    synchronous: Option<&SynchronousSpec>,
    replicas: i32,
    acknowledged: usize,
    live: usize,
    since_start: Duration,
    timeout: Duration,
) -> bool {
    if acknowledged == 0 {
        return false;
    }
    match synchronous {
        Some(sync) => {
            let standbys = i64::from(replicas) - 1;
            let needed = (standbys - i64::from(sync.number) + 1).max(1);
            i64::try_from(acknowledged).unwrap_or(i64::MAX) >= needed
        }
        None => acknowledged >= live || since_start >= timeout,
    }
}

/// Decides the step (see the module documentation).
pub fn plan(inputs: &Inputs<'_>) -> Step {
    let primary = inputs.primary;
    if let Some(failed) = &primary.failed {
        return carry_on(inputs, failed);
    }
    // A major upgrade stops the primary on purpose; requests wait until it is done.
    if inputs.suspended && primary.target.is_none() {
        return Step::Idle { expires_in: None };
    }
    // A switchover hands the lock over on purpose; it is not a loss.
    if primary.target.is_some() {
        return Step::Idle { expires_in: None };
    }
    let Some(ha) = inputs.high_availability else {
        return manual_failover(inputs).unwrap_or(Step::Idle { expires_in: None });
    };
    // With high availability only a lock that exists and was never taken leaves the
    // decision to a human: one not cached (yet) tells nothing.
    let Some(lease) = inputs.lease else {
        return Step::Idle { expires_in: None };
    };
    if !lease.ever_held {
        return manual_failover(inputs).unwrap_or(Step::Idle { expires_in: None });
    }
    let timeout = ha.failover_timeout().unwrap_or(Duration::from_secs(30));
    // A switchover's old primary releases the lock as it stops; if the switchover is
    // aborted at its deadline, it takes the lock back then. So a released lock counts as
    // lost only from the end of the last switchover's deadline.
    let unchanged_for = match lease.holder {
        None => lease.unchanged_for.min(
            inputs
                .since_switchover
                .saturating_sub(super::primary::deadline(Some(timeout))),
        ),
        Some(_) => lease.unchanged_for,
    };
    if unchanged_for < timeout {
        return Step::Idle {
            expires_in: Some(timeout - unchanged_for),
        };
    }
    let current = &primary.current;
    let what = match &lease.holder {
        Some(_) => format!(
            "primary {current} did not renew the lock for {}",
            ha.failover_timeout
        ),
        None => format!(
            "primary {current} released the lock and nobody took it for {}",
            ha.failover_timeout
        ),
    };
    let epoch = primary.epoch.unwrap_or(0) + 1;
    if let Some(pod) = inputs.requested {
        if pod == current {
            return Step::AlreadyPrimary;
        }
        if !is_instance(inputs, pod) {
            return Step::Refuse(not_an_instance(pod));
        }
        return Step::Start {
            failed: current.clone(),
            epoch,
            candidate: Some(pod.to_string()),
            message: format!("{what}; failing over to {pod} as requested (epoch {epoch})"),
            by_lock: true,
        };
    }
    if !ha.auto_failover {
        return Step::Lost {
            message: format!(
                "the {what}; automatic failover is off (spec.highAvailability.autoFailover): promote a replica with `devctl db promote {} POD`",
                inputs.cluster
            ),
        };
    }
    let has_replica = inputs
        .reports
        .iter()
        .any(|(name, report)| name != current && report.is_some() && is_instance(inputs, name));
    if !has_replica {
        return Step::Lost {
            message: format!(
                "the {what}; there is no replica to fail over to, writes wait until it is back"
            ),
        };
    }
    Step::Start {
        failed: current.clone(),
        epoch,
        candidate: None,
        message: format!("{what}; failing over (epoch {epoch})"),
        by_lock: true,
    }
}

/// A failover a human asked for where no primary lock tells whether the primary is lost
/// (high availability off, or a lock nobody took): the request names a replica while the
/// primary does not serve, and says it accepts a failover ([`FORCE_FAILOVER_ANNOTATION`](devctl_api::instance::FORCE_FAILOVER_ANNOTATION):
/// a primary that is only restarting would lose what it had not sent). `None` leaves the
/// request to the switchover, which hands over from a primary that serves.
///
/// Without the lock nothing proves that the old primary stopped writing; a human who
/// promotes says it has (a dead node, a lost volume). Its agent fences itself as soon as it
/// sees the failover, and the `-rw` Service drops it with its role label. Commits it had
/// not sent to the promoted replica are lost, as with any asynchronous failover.
fn manual_failover(inputs: &Inputs<'_>) -> Option<Step> {
    let pod = inputs.requested?;
    let current = &inputs.primary.current;
    if inputs.primary_ready || pod == current {
        return None;
    }
    if !is_instance(inputs, pod) {
        return Some(Step::Refuse(not_an_instance(pod)));
    }
    if !inputs.forced {
        return Some(Step::Refuse(format!(
            "{SWITCHOVER_ANNOTATION}: the primary {current} is not ready; a switchover needs it to hand over. To fail over to {pod} instead, losing what {current} had not sent to it: `devctl db promote {} {pod} --force`",
            inputs.cluster
        )));
    }
    let is_replica = inputs.reports.iter().any(|(name, r)| {
        name == pod && r.as_ref().and_then(|r| r.role.as_deref()) == Some(ROLE_REPLICA)
    });
    if !is_replica {
        return Some(Step::Refuse(format!(
            "{SWITCHOVER_ANNOTATION}: {pod} does not run as a replica (its agent has not reported one): nothing to promote"
        )));
    }
    let epoch = inputs.primary.epoch.unwrap_or(0) + 1;
    let lock = match inputs.high_availability {
        Some(_) => "its primary lock was never taken",
        None => "spec.highAvailability is off, so no primary lock fences it",
    };
    Some(Step::Start {
        failed: current.clone(),
        epoch,
        candidate: Some(pod.to_string()),
        message: format!(
            "primary {current} is not ready and {lock}; failing over to {pod} as requested (epoch {epoch}): what {current} had not sent to {pod} is lost"
        ),
        by_lock: false,
    })
}

/// Why the elected `target` will not promote, when the primary lock shows it: nobody has
/// renewed the lock for a whole duration although the failover started at least two
/// durations ago (up to one for the election, a full one for the target to take the lock
/// and promote; 75 s more when the target holds it, whose promotion may take that long
/// without a renewal). A target takes the lock before each attempt to promote and renews it
/// once it runs as the primary. So an unchanged lock means the target died (or lost the API
/// server, and then it cannot promote either: it takes the lock first).
/// Only with high availability: without a lock nothing tells a dead target from a slow one.
fn target_lost(inputs: &Inputs<'_>, target: &str, epoch: i64) -> Option<String> {
    let (Some(ha), Some(lease)) = (inputs.high_availability, inputs.lease) else {
        return None;
    };
    let timeout = ha.failover_timeout().unwrap_or(Duration::from_secs(30));
    // A target that took the lock renews it again only once its promotion returned, which
    // may wait for the replay of everything it received (`pg_promote` waits up to 60 s).
    let quiet = match lease.holder.as_deref() {
        Some(holder) if holder == target => timeout + PROMOTION_WAIT,
        _ => timeout,
    };
    (inputs.since_start >= timeout * 2 && lease.unchanged_for >= quiet).then(|| {
        format!(
            "{target}, elected in epoch {epoch}, did not promote and nobody renewed the primary lock for {}: electing again (epoch {})",
            ha.failover_timeout,
            epoch + 1
        )
    })
}

/// After this many targets of one failover did not promote, the operator stops electing: a
/// live replica that cannot take the lock would otherwise be elected again and again.
pub const MAX_FAILED_TARGETS: usize = 3;

/// Without a lock: a new request (with [`FORCE_FAILOVER_ANNOTATION`](devctl_api::instance::FORCE_FAILOVER_ANNOTATION)) naming another
/// replica while the target has not promoted elects again, for that replica — nothing else
/// would tell a dead target from a slow one, and the primary is already fenced.
fn retarget(inputs: &Inputs<'_>, failed: &str, target: &str, epoch: i64) -> Option<String> {
    let pod = inputs.requested?;
    if inputs.high_availability.is_some()
        || !inputs.forced
        || pod == target
        || pod == failed
        || !is_instance(inputs, pod)
    {
        return None;
    }
    Some(format!(
        "{target}, elected in epoch {epoch}, has not promoted; electing {pod} as requested (epoch {})",
        epoch + 1
    ))
}

/// The steps of a failover under way, away from `failed`.
fn carry_on(inputs: &Inputs<'_>, failed: &str) -> Step {
    let primary = inputs.primary;
    let epoch = primary.epoch.unwrap_or(0);
    let report = |pod: &str| {
        inputs
            .reports
            .iter()
            .find(|(name, _)| name == pod)
            .and_then(|(_, r)| r.as_ref())
    };
    match primary.target.as_deref() {
        Some(target) if target != TARGET_PENDING => {
            let promoted =
                report(target).is_some_and(|r| r.ready && r.role.as_deref() == Some(ROLE_PRIMARY));
            // Without high availability no agent tends the lock (a Lease left from when it
            // was on names whoever held it last): the report is all.
            let holds_lock = inputs.high_availability.is_none()
                || inputs
                    .lease
                    .is_none_or(|l| l.holder.as_deref() == Some(target));
            if promoted && holds_lock {
                Step::Done {
                    from: failed.to_string(),
                    to: target.to_string(),
                    epoch,
                }
            } else if !promoted && let Some(message) = target_lost(inputs, target, epoch) {
                Step::Reelect {
                    epoch: epoch + 1,
                    lost: target.to_string(),
                    message,
                    by_lock: true,
                }
            } else if !promoted && let Some(message) = retarget(inputs, failed, target, epoch) {
                Step::Reelect {
                    epoch: epoch + 1,
                    lost: target.to_string(),
                    message,
                    by_lock: false,
                }
            } else {
                Step::Promoting(target.to_string())
            }
        }
        // Pending (or a status without a target, which only a hand edit makes).
        _ => {
            let acknowledged =
                |name: &str| report(name).and_then(|r| r.failover_epoch) == Some(epoch);
            if let Some(pod) = inputs.requested {
                if pod == failed {
                    return Step::Refuse(format!(
                        "{SWITCHOVER_ANNOTATION}: {pod} is the primary being failed over"
                    ));
                }
                if !is_instance(inputs, pod) {
                    return Step::Refuse(not_an_instance(pod));
                }
                // A human's pick needs only its own final position.
                return if acknowledged(pod) {
                    Step::Elect(pod.to_string())
                } else {
                    Step::Pending { recheck_in: None }
                };
            }
            // Targets that did not promote in this failover are not elected again in it.
            let tried = &primary.failed_targets;
            let untried = |name: &str| !tried.iter().any(|t| t == name);
            let candidates = inputs
                .reports
                .iter()
                .filter(|(name, _)| name != failed && is_instance(inputs, name) && untried(name))
                .count();
            if !tried.is_empty() && (tried.len() >= MAX_FAILED_TARGETS || candidates == 0) {
                return Step::Stuck {
                    message: format!(
                        "the failover from {failed} (epoch {epoch}) elects nobody: {} did not take the primary lock and promote, and {}; promote a replica that can take the lock with `devctl db promote {} POD`",
                        tried.join(", "),
                        if candidates == 0 {
                            "no other replica is left"
                        } else {
                            "the operator stops electing after 3"
                        },
                        inputs.cluster
                    ),
                };
            }
            let replicas: Vec<(&str, &InstanceStatus)> = inputs
                .reports
                .iter()
                .filter(|(name, _)| name != failed && is_instance(inputs, name) && untried(name))
                .filter_map(|(name, r)| Some((name.as_str(), r.as_ref()?)))
                .collect();
            let final_positions: Vec<(&str, &InstanceStatus)> = replicas
                .iter()
                .copied()
                .filter(|(_, r)| r.failover_epoch == Some(epoch))
                .collect();
            let live = live_count(inputs, &replicas, epoch);
            let timeout = inputs
                .high_availability
                .and_then(HighAvailabilitySpec::failover_timeout)
                .unwrap_or(Duration::from_secs(30));
            let enough = enough_acknowledged(
                inputs.synchronous,
                inputs.replicas,
                final_positions.len(),
                live,
                inputs.since_start,
                timeout,
            );
            match most_advanced(&final_positions) {
                Some(best) if enough => Step::Elect(best.to_string()),
                // Asynchronous with some positions in: the further timeout elects alone.
                Some(_) if inputs.synchronous.is_none() => Step::Pending {
                    recheck_in: [LIVENESS_GRACE, timeout]
                        .into_iter()
                        .filter_map(|at| at.checked_sub(inputs.since_start))
                        .find(|left| !left.is_zero()),
                },
                _ => Step::Pending { recheck_in: None },
            }
        }
    }
}

/// The live replicas: acknowledged, or showed life since the start (`ready` cannot say it: a
/// replica is ready only while it streams, and nothing streams from a lost primary); within
/// the first [`LIVENESS_GRACE`], every replica with a report — one that acknowledges at once
/// must not be elected before a live one had the time to show life.
fn live_count(inputs: &Inputs<'_>, replicas: &[(&str, &InstanceStatus)], epoch: i64) -> usize {
    let in_grace = inputs.since_start < LIVENESS_GRACE;
    replicas
        .iter()
        .filter(|(name, r)| {
            in_grace || r.failover_epoch == Some(epoch) || inputs.live.contains(*name)
        })
        .count()
}

fn is_instance(inputs: &Inputs<'_>, pod: &str) -> bool {
    ordinal(pod).is_some_and(|o| o < inputs.replicas)
        && inputs.reports.iter().any(|(name, _)| name == pod)
}

fn not_an_instance(pod: &str) -> String {
    format!("{SWITCHOVER_ANNOTATION}: {pod} is not an instance of this cluster")
}

#[cfg(test)]
#[path = "failover_tests.rs"]
mod tests;
