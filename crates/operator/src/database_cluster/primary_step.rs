//! Decide who is primary after this reconcile: carries a failover ([`failover::plan`]) or,
//! when none is due, a switchover ([`switchover::plan`]) one step — never both in one
//! reconcile (pure).
//!
//! A step the cached lock alone justifies (a failover starting, a target given up on) is
//! acted on only once the lock is confirmed live: until the observation holds that answer
//! the step asks for it ([`PrimaryStep::needs_lease_confirmation`]), and a lock the API
//! server has moved on from changes nothing this time.

use std::time::Duration;

use devctl_api::database_cluster::{FailoverReason, FailoverRecord, HighAvailabilitySpec};
use devctl_api::instance::{FORCE_FAILOVER_ANNOTATION, InstanceStatus, TARGET_PENDING};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::failover;
use super::instances;
use super::observe::Observation;
use super::primary::{Primary, deadline};
use super::reasons;
use super::resources::{self, lease};
use super::switchover;
use crate::reconciler::Announcement;

/// How soon to look again when the cache says the lock expired but the API server has a
/// newer one: the watch is behind and catches up within moments.
pub const LEASE_RECHECK: Duration = Duration::from_secs(1);

/// Who is primary after this reconcile and what else the failover or switchover step
/// decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryStep {
    /// What the status will say.
    pub primary: Primary,
    /// The primary is lost and nothing fails over on its own: why.
    pub primary_lost: Option<String>,
    /// The failover under way elects nobody: why.
    pub failover_stuck: Option<String>,
    /// Events of a step the status records: published once, after its status write.
    pub events: Vec<Announcement>,
    /// The switchover request is answered once the status records the answer.
    pub drop_request_when_recorded: bool,
    /// The request is answered now, whatever the status write: refused (why, for the
    /// `SwitchoverRefused` event) or moot (`None`: it names the primary).
    pub answer_now: Option<Option<String>>,
    /// A failover epoch starts: the pods' reports are noted as its baseline.
    pub epoch_started: Option<i64>,
    /// When to look again although nothing may happen.
    pub timer: Option<Duration>,
    /// The step was judged from the cached lock: decide again once the observation says
    /// whether the API server still has it.
    pub needs_lease_confirmation: bool,
}

impl PrimaryStep {
    pub fn unchanged(primary: Primary) -> Self {
        Self {
            primary,
            primary_lost: None,
            failover_stuck: None,
            events: Vec::new(),
            drop_request_when_recorded: false,
            answer_now: None,
            epoch_started: None,
            timer: None,
            needs_lease_confirmation: false,
        }
    }

    /// A decision the live lock did not confirm: nothing changes; look again shortly.
    fn unconfirmed(primary: Primary) -> Self {
        Self {
            timer: Some(LEASE_RECHECK),
            ..Self::unchanged(primary)
        }
    }
}

/// The primary step of this reconcile.
/// `suspended`: a major upgrade stops instances (nothing fails over); `upgrade_switchover`: the
/// instance a major upgrade moves the primary to first, as if requested.
pub fn decide(
    observation: &Observation,
    now: Timestamp,
    suspended: bool,
    upgrade_switchover: Option<&str>,
) -> PrimaryStep {
    let db = observation.cluster.as_ref();
    let recorded = observation.recorded_primary();
    let pods = observation.pods();
    // A pod being deleted is no candidate and has nothing left to report.
    let live_reports = reports(
        pods.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none()),
    );
    let decider = Decider {
        observation,
        now,
        high_availability: lease::failover_timeout(db).and(db.spec.high_availability.as_ref()),
        // An upgrade's switchover only while the primary serves: never a failover request.
        requested: switchover::requested(db).or(upgrade_switchover.filter(|_| {
            pods.iter()
                .any(|p| p.name_any() == recorded.current && instances::serves(p))
        })),
    };
    let step = failover::plan(&failover::Inputs {
        cluster: &observation.names.name,
        high_availability: decider.high_availability,
        synchronous: db
            .spec
            .replication
            .as_ref()
            .and_then(|r| r.synchronous.as_ref()),
        primary: &recorded,
        lease: observation.lease_observation(),
        reports: &live_reports,
        replicas: resources::stateful_set::instances(db),
        requested: decider.requested,
        primary_ready: pods
            .iter()
            .any(|p| p.name_any() == recorded.current && instances::serves(p)),
        forced: db
            .annotations()
            .get(FORCE_FAILOVER_ANNOTATION)
            .is_some_and(|v| v == "true"),
        since_start: decider.since(recorded.last_failover_time.as_deref()),
        since_switchover: decider.since(recorded.last_switchover_time.as_deref()),
        live: &observation.live,
        suspended,
    });
    decider.carry(step, recorded)
}

/// The agents' reports by pod name.
fn reports<'a>(
    pods: impl Iterator<Item = &'a &'a k8s_openapi::api::core::v1::Pod>,
) -> Vec<(String, Option<InstanceStatus>)> {
    pods.map(|p| {
        (
            p.name_any(),
            InstanceStatus::from_annotations(p.metadata.annotations.as_ref()),
        )
    })
    .collect()
}

/// How soon a failover under way looks again when nothing else wakes it: after a lock
/// duration (`spec.highAvailability.failoverTimeout`).
fn failover_recheck(high_availability: Option<&HighAvailabilitySpec>) -> Option<Duration> {
    high_availability.and_then(|ha| ha.failover_timeout())
}

/// What a failover or switchover step is decided from.
struct Decider<'a> {
    observation: &'a Observation,
    now: Timestamp,
    high_availability: Option<&'a HighAvailabilitySpec>,
    /// The pod a switchover request names.
    requested: Option<&'a str>,
}

impl Decider<'_> {
    /// Time since `time` (a status time) on the wall clock; unknown counts as long ago.
    fn since(&self, time: Option<&str>) -> Duration {
        let Some(started) = time.and_then(|t| t.parse::<Timestamp>().ok()) else {
            return Duration::MAX;
        };
        Duration::try_from(self.now.duration_since(started)).unwrap_or_default()
    }

    /// A time for the status: to the second, as the API server keeps times.
    fn stamp(&self) -> String {
        Timestamp::from_second(self.now.as_second())
            .unwrap_or(self.now)
            .to_string()
    }

    /// A flight-record time: to the millisecond.
    fn stamp_ms(&self) -> String {
        stamp_ms(self.now)
    }

    /// A new flight record: `reason`, away from `failed`, detected now.
    fn record(&self, reason: FailoverReason, failed: &str) -> FailoverRecord {
        FailoverRecord {
            reason,
            failed_primary: failed.to_string(),
            new_primary: None,
            primary_last_seen_at: None,
            detected_at: self.stamp_ms(),
            elected_at: None,
            promoted_at: None,
            service_switched_at: None,
        }
    }

    /// A new flight record of a failover the lock decided: also when its holder was last
    /// seen renewing it (now minus how long the watch has seen it unchanged).
    fn record_lost(&self, reason: FailoverReason, failed: &str) -> FailoverRecord {
        let last_seen = self
            .observation
            .lease_observation()
            .and_then(|lease| k8s_openapi::jiff::SignedDuration::try_from(lease.unchanged_for).ok())
            .and_then(|unchanged| self.now.checked_sub(unchanged).ok());
        FailoverRecord {
            primary_last_seen_at: last_seen.map(stamp_ms),
            ..self.record(reason, failed)
        }
    }

    /// `recorded`'s flight record with `step` applied (a record from before the operator
    /// kept them: begun from the failover's start time).
    fn recorded_with(
        &self,
        recorded: &Primary,
        step: impl FnOnce(&mut FailoverRecord),
    ) -> Option<FailoverRecord> {
        let mut record = recorded
            .last_failover
            .clone()
            .unwrap_or_else(|| FailoverRecord {
                detected_at: recorded
                    .last_failover_time
                    .clone()
                    .unwrap_or_else(|| self.stamp_ms()),
                ..self.record(
                    FailoverReason::PrimaryLost,
                    recorded.failed.as_deref().unwrap_or(&recorded.current),
                )
            });
        step(&mut record);
        Some(record)
    }

    /// Whether a decision may be acted on: one judged from the cached lock only once the API
    /// server confirms the lock; one on a human's request at once. `None`: not read yet.
    fn confirmed(&self, by_lock: bool) -> Option<bool> {
        match &self.observation.lease {
            _ if !by_lock => Some(true),
            Some(_) => self.observation.lease_confirmed,
            None => Some(false),
        }
    }

    /// `step` once confirmed; otherwise nothing changes (asking for the read first).
    fn once_confirmed(&self, by_lock: bool, recorded: Primary, step: PrimaryStep) -> PrimaryStep {
        match self.confirmed(by_lock) {
            Some(true) => step,
            Some(false) => PrimaryStep::unconfirmed(recorded),
            None => PrimaryStep {
                needs_lease_confirmation: true,
                ..PrimaryStep::unconfirmed(recorded)
            },
        }
    }

    fn answered(recorded: Primary, refused: Option<String>) -> PrimaryStep {
        PrimaryStep {
            answer_now: Some(refused),
            ..PrimaryStep::unchanged(recorded)
        }
    }

    /// Carries `step` from the `recorded` status.
    fn carry(&self, step: failover::Step, recorded: Primary) -> PrimaryStep {
        let db = self.observation.cluster.as_ref();
        match step {
            failover::Step::Idle { expires_in } => self.no_failover(recorded, expires_in),
            failover::Step::Lost { message } => PrimaryStep {
                events: degraded_news(db, reasons::PRIMARY_UNAVAILABLE, "PrimaryLost", &message),
                primary_lost: Some(message),
                ..PrimaryStep::unchanged(recorded)
            },
            failover::Step::Refuse(message) => Self::answered(recorded, Some(message)),
            failover::Step::AlreadyPrimary => Self::answered(recorded, None),
            failover::Step::Start {
                failed,
                epoch,
                candidate,
                message,
                by_lock,
            } => {
                let reason = if candidate.is_some() {
                    FailoverReason::Manual
                } else {
                    FailoverReason::PrimaryLost
                };
                self.start(recorded, failed, epoch, message, by_lock, reason)
            }
            failover::Step::Stuck { message } => PrimaryStep {
                events: degraded_news(db, reasons::FAILOVER_STUCK, "FailoverStuck", &message),
                failover_stuck: Some(message),
                ..PrimaryStep::unchanged(recorded)
            },
            failover::Step::Pending { recheck_in } => PrimaryStep {
                timer: recheck_in,
                ..PrimaryStep::unchanged(recorded)
            },
            failover::Step::Elect(target) => self.elect(recorded, target),
            // Nothing announces a target that died before promoting (it never takes the
            // lock): look again after a lock duration ([`failover::Step::Reelect`]).
            failover::Step::Promoting(_) => PrimaryStep {
                timer: failover_recheck(self.high_availability),
                ..PrimaryStep::unchanged(recorded)
            },
            failover::Step::Reelect {
                epoch,
                lost,
                message,
                by_lock,
            } => self.reelect(recorded, epoch, lost, message, by_lock),
            failover::Step::Done { from, to, epoch } => PrimaryStep {
                events: vec![Announcement {
                    type_: EventType::Normal,
                    reason: "Promoted",
                    action: format!("Promote {to}"),
                    note: format!(
                        "Promoted {to} (failover from {from}, epoch {epoch}); {from} rejoins as a standby once it is back"
                    ),
                }],
                drop_request_when_recorded: self.requested.is_some(),
                ..PrimaryStep::unchanged(Primary {
                    last_failover: self.recorded_with(&recorded, |r| {
                        r.new_primary = Some(to.clone());
                        r.promoted_at = Some(self.stamp_ms());
                    }),
                    current: to,
                    target: None,
                    failed: None,
                    failed_targets: Vec::new(),
                    ..recorded
                })
            },
        }
    }

    /// No failover is due: a switchover may be.
    fn no_failover(&self, recorded: Primary, expires_in: Option<Duration>) -> PrimaryStep {
        let clock = switchover::Clock {
            // A switchover an older operator started has no start time: from now.
            since_start: recorded
                .last_switchover_time
                .as_deref()
                .map_or(Duration::ZERO, |t| self.since(Some(t))),
            lock_duration: self.high_availability.and_then(|ha| ha.failover_timeout()),
            lock: self.observation.lease_observation(),
        };
        let all_reports = reports(self.observation.pods().iter());
        let mut step = self.switchover_step(recorded, &all_reports, &clock);
        step.timer = match (step.timer, expires_in) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        step
    }

    /// The primary is lost: a failover starts (once the lock says so, read live).
    fn start(
        &self,
        recorded: Primary,
        failed: String,
        epoch: i64,
        message: String,
        by_lock: bool,
        reason: FailoverReason,
    ) -> PrimaryStep {
        let record = if by_lock {
            self.record_lost(reason, &failed)
        } else {
            self.record(reason, &failed)
        };
        let step = PrimaryStep {
            events: vec![Announcement {
                type_: EventType::Warning,
                reason: "PrimaryLost",
                action: "Failover".into(),
                note: message,
            }],
            // The replicas' liveness counts from now.
            epoch_started: Some(epoch),
            // Every step of a failover looks again by itself: what comes next (an
            // acknowledgement, a promotion) may never be announced by an event, and the
            // echo of this status write wakes nobody.
            timer: failover_recheck(self.high_availability),
            ..PrimaryStep::unchanged(Primary {
                target: Some(TARGET_PENDING.into()),
                failed: Some(failed),
                epoch: Some(epoch),
                last_failover_time: Some(self.stamp()),
                failed_targets: Vec::new(),
                last_failover: Some(record),
                ..recorded.clone()
            })
        };
        self.once_confirmed(by_lock, recorded, step)
    }

    /// The replicas' final positions elect `target`.
    fn elect(&self, recorded: Primary, target: String) -> PrimaryStep {
        let failed = recorded.failed.clone().unwrap_or_default();
        let epoch = recorded.epoch.unwrap_or(0);
        let why = if self.requested == Some(target.as_str()) {
            "as requested".to_string()
        } else {
            "the most advanced of the replicas' final positions".to_string()
        };
        PrimaryStep {
            // A target that never takes the lock (frozen, refused) changes nothing the
            // operator watches: look again after a lock duration, as while promoting.
            timer: failover_recheck(self.high_availability),
            events: vec![Announcement {
                type_: EventType::Normal,
                reason: "FailingOver",
                action: format!("Elect {target}"),
                note: format!(
                    "Failing over from {failed} (epoch {epoch}): {target} promotes, {why}"
                ),
            }],
            ..PrimaryStep::unchanged(Primary {
                last_failover: self.recorded_with(&recorded, |r| {
                    r.new_primary = Some(target.clone());
                    r.elected_at = Some(self.stamp_ms());
                }),
                target: Some(target),
                ..recorded
            })
        }
    }

    /// The elected target was lost before it promoted: elect again, without it.
    fn reelect(
        &self,
        recorded: Primary,
        epoch: i64,
        lost: String,
        message: String,
        by_lock: bool,
    ) -> PrimaryStep {
        let step = PrimaryStep {
            events: vec![Announcement {
                type_: EventType::Warning,
                reason: "FailoverTargetLost",
                action: "Failover".into(),
                note: message,
            }],
            epoch_started: Some(epoch),
            timer: failover_recheck(self.high_availability),
            // A request for the lost target would hold the new election up.
            drop_request_when_recorded: self.requested == Some(lost.as_str()),
            ..PrimaryStep::unchanged(Primary {
                target: Some(TARGET_PENDING.into()),
                epoch: Some(epoch),
                last_failover_time: Some(self.stamp()),
                // Not elected again in this failover.
                failed_targets: recorded
                    .failed_targets
                    .iter()
                    .cloned()
                    .chain((!recorded.failed_targets.contains(&lost)).then(|| lost.clone()))
                    .collect(),
                last_failover: self.recorded_with(&recorded, |r| {
                    r.new_primary = None;
                    r.elected_at = None;
                }),
                ..recorded.clone()
            })
        };
        self.once_confirmed(by_lock, recorded, step)
    }

    /// Carries a switchover one step ([`switchover::plan`]) from the `recorded` status.
    fn switchover_step(
        &self,
        recorded: Primary,
        reports: &[(String, Option<InstanceStatus>)],
        clock: &switchover::Clock<'_>,
    ) -> PrimaryStep {
        let db = self.observation.cluster.as_ref();
        let step = switchover::plan(
            &recorded,
            self.requested,
            reports,
            resources::stateful_set::instances(db),
            clock,
        );
        match step {
            switchover::Step::Idle => PrimaryStep::unchanged(recorded),
            // Look again at the deadline (and then every lock duration: a target holding the
            // lock is given up on only once it stops renewing it).
            switchover::Step::Waiting(_) => PrimaryStep {
                timer: Some(
                    deadline(clock.lock_duration)
                        .checked_sub(clock.since_start)
                        .filter(|left| !left.is_zero())
                        .or(clock.lock_duration)
                        .unwrap_or(LEASE_RECHECK),
                ),
                ..PrimaryStep::unchanged(Primary {
                    last_switchover_time: recorded
                        .last_switchover_time
                        .clone()
                        .or_else(|| Some(self.stamp())),
                    ..recorded
                })
            },
            switchover::Step::Abort {
                target,
                fail_over: false,
                message,
            } => self.abort_back(recorded, target, message, clock.lock.is_some()),
            switchover::Step::Abort {
                target,
                fail_over: true,
                message,
            } => self.abort_into_failover(recorded, target, message),
            switchover::Step::AlreadyPrimary => Self::answered(recorded, None),
            switchover::Step::Refuse(message) => Self::answered(recorded, Some(message)),
            switchover::Step::Start(target) => PrimaryStep {
                events: vec![Announcement {
                    type_: EventType::Normal,
                    reason: "SwitchingOver",
                    action: "Switchover".into(),
                    note: format!(
                        "Switching over from {} to {target}: the primary checkpoints and stops, {target} promotes once it has all of its WAL",
                        recorded.current
                    ),
                }],
                ..PrimaryStep::unchanged(Primary {
                    last_failover: Some(FailoverRecord {
                        new_primary: Some(target.clone()),
                        elected_at: Some(self.stamp_ms()),
                        ..self.record(FailoverReason::Switchover, &recorded.current)
                    }),
                    target: Some(target),
                    last_switchover_time: Some(self.stamp()),
                    ..recorded
                })
            },
            switchover::Step::Done { from, to } => PrimaryStep {
                events: vec![Announcement {
                    type_: EventType::Normal,
                    reason: "Promoted",
                    action: format!("Promote {to}"),
                    note: format!(
                        "Promoted {to} (switchover from {from}); {from} rejoins as a standby"
                    ),
                }],
                drop_request_when_recorded: self.requested.is_some(),
                ..PrimaryStep::unchanged(Primary {
                    last_failover: self.recorded_with(&recorded, |r| {
                        r.new_primary = Some(to.clone());
                        r.promoted_at = Some(self.stamp_ms());
                    }),
                    current: to,
                    target: None,
                    ..recorded
                })
            },
        }
    }

    /// The switchover's target did not promote in time: the old primary serves again. With
    /// a lock, judged from the cached one: confirmed with the API server first (a target that
    /// took it meanwhile may be promoting).
    fn abort_back(
        &self,
        recorded: Primary,
        target: String,
        message: String,
        by_lock: bool,
    ) -> PrimaryStep {
        let step = PrimaryStep {
            events: vec![Announcement {
                type_: EventType::Warning,
                reason: "SwitchoverAborted",
                action: "Switchover".into(),
                note: message,
            }],
            // The request would start the same switchover again (a newer one, naming
            // another pod, stays).
            drop_request_when_recorded: self.requested == Some(target.as_str()),
            ..PrimaryStep::unchanged(Primary {
                target: None,
                ..recorded.clone()
            })
        };
        self.once_confirmed(by_lock, recorded, step)
    }

    /// The switchover's target holds the lock and stopped renewing it: fail over without it
    /// (judged from the cached lock: confirmed with the API server first).
    fn abort_into_failover(
        &self,
        recorded: Primary,
        target: String,
        message: String,
    ) -> PrimaryStep {
        let epoch = recorded.epoch.unwrap_or(0) + 1;
        let step = PrimaryStep {
            events: vec![
                Announcement {
                    type_: EventType::Warning,
                    reason: "SwitchoverAborted",
                    action: "Switchover".into(),
                    note: format!("{message} (epoch {epoch})"),
                },
                Announcement {
                    type_: EventType::Warning,
                    reason: "PrimaryLost",
                    action: "Failover".into(),
                    note: format!(
                        "{target}, the switchover's target, holds the primary lock and stopped renewing it; failing over from {} without {target} (epoch {epoch})",
                        recorded.current
                    ),
                },
            ],
            epoch_started: Some(epoch),
            drop_request_when_recorded: self.requested == Some(target.as_str()),
            ..PrimaryStep::unchanged(Primary {
                target: Some(TARGET_PENDING.into()),
                failed: Some(recorded.current.clone()),
                epoch: Some(epoch),
                last_failover_time: Some(self.stamp()),
                failed_targets: vec![target],
                last_failover: Some(
                    self.record_lost(FailoverReason::PrimaryLost, &recorded.current),
                ),
                ..recorded.clone()
            })
        };
        self.once_confirmed(true, recorded, step)
    }
}

/// A Warning event `event` for a `Degraded` condition with `reason` and `message`, unless the
/// status shows it already: published when the message first appears, not each reconcile.
fn degraded_news(
    db: &devctl_api::database_cluster::DatabaseCluster,
    reason: &str,
    event: &'static str,
    message: &str,
) -> Vec<Announcement> {
    let already = db
        .status
        .as_ref()
        .and_then(|s| devctl_api::conditions::find(&s.conditions, devctl_api::conditions::DEGRADED))
        .is_some_and(|c| c.reason == reason && c.message == message);
    if already {
        return Vec::new();
    }
    vec![Announcement {
        type_: EventType::Warning,
        reason: event,
        action: "Failover".into(),
        note: message.to_string(),
    }]
}

/// `now` as a flight-record time: RFC 3339 to the millisecond, UTC.
pub fn stamp_ms(now: Timestamp) -> String {
    now.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}
