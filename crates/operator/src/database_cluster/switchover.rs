//! Planned switchover (`devctl db promote NAME POD`), decided from what is observed (pure).
//!
//! A user asks by annotating the cluster ([`SWITCHOVER_ANNOTATION`]). The operator checks the
//! target is a ready, streaming replica and records it in `status.targetPrimary`; the old
//! primary's agent checkpoints and stops (reporting its shutdown checkpoint as `finalLSN`), the
//! target's agent promotes once it has received WAL up to there — so nothing written is
//! lost, even with asynchronous replication — and reports itself primary; the operator then
//! moves `status.currentPrimary`, clears the target and relabels the pods. Agents never write
//! status: each step is the operator's.

use std::time::Duration;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::{InstanceStatus, ROLE_PRIMARY, ROLE_REPLICA, SWITCHOVER_ANNOTATION};

use super::instances::ordinal;
use super::primary::{LeaseObservation, Primary, deadline};

/// What to do about a switchover in this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing asked, nothing under way.
    Idle,
    /// The request cannot be carried out: say why and drop it.
    Refuse(String),
    /// The request names the current primary: drop it.
    AlreadyPrimary,
    /// Record the target; the agents take it from there.
    Start(String),
    /// The target has not promoted yet.
    Waiting(String),
    /// The deadline passed and the target has not promoted ([`abort`]): give up on it.
    /// `fail_over`: the target took the primary lock (it may have promoted) and stopped
    /// renewing it, so the old primary must not take it back: fail over without the target.
    /// Otherwise the old primary, stopped cleanly at its `finalLSN`, takes the lock back.
    Abort {
        target: String,
        fail_over: bool,
        message: String,
    },
    /// The target reports itself primary: make it `currentPrimary`.
    Done { from: String, to: String },
}

/// The pod a user asked to promote.
pub fn requested(db: &DatabaseCluster) -> Option<&str> {
    db.metadata
        .annotations
        .as_ref()?
        .get(SWITCHOVER_ANNOTATION)
        .map(String::as_str)
}

/// A switchover under way against its deadline.
#[derive(Debug, Clone)]
pub struct Clock<'a> {
    /// Since `status.lastSwitchoverTime` (long ago when unknown).
    pub since_start: Duration,
    /// The primary lock's duration (`failoverTimeout`), with high availability.
    pub lock_duration: Option<Duration>,
    /// The primary lock as the operator's watch saw it, with high availability.
    pub lock: Option<&'a LeaseObservation>,
}

/// Whether a switchover to `target`, not done, is given up on ([`Step::Abort`]).
///
/// A target takes the primary lock before it promotes. So while the lock does not name it,
/// it has not promoted and never will without the lock: the old primary may take the lock
/// back and resume at the `finalLSN` it stopped at, losing nothing. Once the lock names it,
/// it may have promoted and taken writes; then only a lock it stopped renewing for a full
/// duration says it is gone, and the failover (with the target excluded) decides who is next.
/// Without high availability there is no lock: past the deadline the old primary resumes.
fn abort(primary: &Primary, target: &str, clock: &Clock<'_>) -> Option<Step> {
    let deadline = deadline(clock.lock_duration);
    if clock.since_start < deadline {
        return None;
    }
    let old = &primary.current;
    let within = format!("{}s", deadline.as_secs());
    match (clock.lock, clock.lock_duration) {
        // With high availability a lock not in the cache (yet) tells nothing: wait.
        (None, Some(_)) => None,
        (Some(lock), Some(duration)) if lock.holder.as_deref() == Some(target) => {
            // Promoting, it renews only once `pg_promote` returned (as for a failover's
            // target, [`super::primary::PROMOTION_WAIT`]).
            let quiet = duration + super::primary::PROMOTION_WAIT;
            (lock.unchanged_for >= quiet).then(|| Step::Abort {
                target: target.to_string(),
                fail_over: true,
                message: format!(
                    "the switchover to {target} did not complete within {within}, and {target} took the primary lock but has not renewed it for {}s: failing over without it",
                    quiet.as_secs()
                ),
            })
        }
        _ => Some(Step::Abort {
            target: target.to_string(),
            fail_over: false,
            message: format!(
                "the switchover to {target} did not complete within {within} ({target} did not take the primary lock and promote): aborted; {old}, stopped cleanly for it, runs as the primary again"
            ),
        }),
    }
}

/// Decides the step from the status, the request and the agents' reports (`reports` by pod
/// name); `replicas` is the number of instances the cluster runs.
pub fn plan(
    primary: &Primary,
    requested: Option<&str>,
    reports: &[(String, Option<InstanceStatus>)],
    replicas: i32,
    clock: &Clock<'_>,
) -> Step {
    let report = |pod: &str| {
        reports
            .iter()
            .find(|(name, _)| name == pod)
            .and_then(|(_, r)| r.as_ref())
    };
    if let Some(target) = &primary.target {
        return match report(target) {
            Some(r) if r.ready && r.role.as_deref() == Some(ROLE_PRIMARY) => Step::Done {
                from: primary.current.clone(),
                to: target.clone(),
            },
            _ => abort(primary, target, clock).unwrap_or_else(|| Step::Waiting(target.clone())),
        };
    }
    let Some(pod) = requested else {
        return Step::Idle;
    };
    if pod == primary.current {
        return Step::AlreadyPrimary;
    }
    let is_instance =
        ordinal(pod).is_some_and(|o| o < replicas) && reports.iter().any(|(name, _)| name == pod);
    if !is_instance {
        return Step::Refuse(format!(
            "{SWITCHOVER_ANNOTATION}: {pod} is not an instance of this cluster"
        ));
    }
    match report(pod) {
        Some(r) if r.ready && r.role.as_deref() == Some(ROLE_REPLICA) => {}
        _ => {
            return Step::Refuse(format!(
                "{SWITCHOVER_ANNOTATION}: {pod} is not a ready, streaming replica"
            ));
        }
    }
    match report(&primary.current) {
        Some(r) if r.ready && r.role.as_deref() == Some(ROLE_PRIMARY) => {
            Step::Start(pod.to_string())
        }
        _ => Step::Refuse(format!(
            "{SWITCHOVER_ANNOTATION}: the primary {} is not ready; a switchover needs it to hand over",
            primary.current
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(role: &str, ready: bool) -> Option<InstanceStatus> {
        Some(InstanceStatus {
            role: Some(role.into()),
            ready,
            ..Default::default()
        })
    }

    fn reports() -> Vec<(String, Option<InstanceStatus>)> {
        vec![
            ("db-0".into(), report("primary", true)),
            ("db-1".into(), report("replica", true)),
            ("db-2".into(), report("replica", false)),
        ]
    }

    /// A switchover that started just now.
    fn fresh() -> Clock<'static> {
        Clock {
            since_start: Duration::ZERO,
            lock_duration: Some(Duration::from_secs(10)),
            lock: None,
        }
    }

    fn idle() -> Primary {
        Primary {
            current: "db-0".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_ready_replica_becomes_the_target() {
        assert_eq!(
            plan(&idle(), Some("db-1"), &reports(), 3, &fresh()),
            Step::Start("db-1".into())
        );
    }

    #[test]
    fn requests_that_cannot_be_carried_out_are_refused_with_the_reason() {
        assert!(
            matches!(plan(&idle(), Some("db-2"), &reports(), 3, &fresh()), Step::Refuse(m) if m.contains("not a ready"))
        );
        assert!(
            matches!(plan(&idle(), Some("db-7"), &reports(), 3, &fresh()), Step::Refuse(m) if m.contains("not an instance"))
        );
        assert!(matches!(
            plan(&idle(), Some("other-1"), &reports(), 3, &fresh()),
            Step::Refuse(_)
        ));
        assert_eq!(
            plan(&idle(), Some("db-0"), &reports(), 3, &fresh()),
            Step::AlreadyPrimary
        );
        assert_eq!(plan(&idle(), None, &reports(), 3, &fresh()), Step::Idle);
    }

    #[test]
    fn done_only_once_the_target_reports_itself_primary() {
        let switching = Primary {
            current: "db-0".into(),
            target: Some("db-1".into()),
            ..Default::default()
        };
        assert_eq!(
            plan(&switching, None, &reports(), 3, &fresh()),
            Step::Waiting("db-1".into())
        );
        let mut promoted = reports();
        promoted[1].1 = report("primary", true);
        assert_eq!(
            plan(&switching, None, &promoted, 3, &fresh()),
            Step::Done {
                from: "db-0".into(),
                to: "db-1".into()
            }
        );
    }

    #[test]
    fn a_switchover_past_its_deadline_is_aborted_back_to_the_old_primary_or_failed_over() {
        let switching = Primary {
            current: "db-0".into(),
            target: Some("db-1".into()),
            ..Primary::default()
        };
        let lock = |holder: Option<&str>, unchanged: u64| LeaseObservation {
            holder: holder.map(str::to_string),
            ever_held: true,
            unchanged_for: Duration::from_secs(unchanged),
        };
        let at = |since: u64, lock: Option<&LeaseObservation>, ha: bool| {
            let clock = Clock {
                since_start: Duration::from_secs(since),
                lock_duration: ha.then(|| Duration::from_secs(10)),
                lock,
            };
            plan(&switching, None, &reports(), 3, &clock)
        };
        // Two lock durations with high availability; a minute without.
        let released = lock(None, 19);
        assert_eq!(at(19, Some(&released), true), Step::Waiting("db-1".into()));
        assert!(matches!(
            at(20, Some(&released), true),
            Step::Abort { ref target, fail_over: false, ref message }
                if target == "db-1" && message.contains("did not complete within 20s")
                    && message.contains("db-0, stopped cleanly for it, runs as the primary again")
        ));
        assert_eq!(at(59, None, false), Step::Waiting("db-1".into()));
        assert!(matches!(
            at(60, None, false),
            Step::Abort {
                fail_over: false,
                ..
            }
        ));
        // The target took the lock: it may have promoted. Never back to the old primary;
        // once it stopped renewing for a full duration, a failover without it.
        let renewing = lock(Some("db-1"), 2);
        assert_eq!(at(300, Some(&renewing), true), Step::Waiting("db-1".into()));
        // Quiet for a duration, but maybe still in `pg_promote` (75 s more).
        let promoting = lock(Some("db-1"), 84);
        assert_eq!(
            at(300, Some(&promoting), true),
            Step::Waiting("db-1".into())
        );
        // A lock not cached (yet) with high availability tells nothing.
        assert_eq!(at(300, None, true), Step::Waiting("db-1".into()));
        let silent = lock(Some("db-1"), 85);
        assert!(matches!(
            at(300, Some(&silent), true),
            Step::Abort { fail_over: true, ref message, .. } if message.contains("failing over without it")
        ));
        // Done wins over the deadline.
        let mut promoted = reports();
        promoted[1].1 = report("primary", true);
        let clock = Clock {
            since_start: Duration::from_secs(300),
            lock_duration: Some(Duration::from_secs(10)),
            lock: Some(&released),
        };
        assert!(matches!(
            plan(&switching, None, &promoted, 3, &clock),
            Step::Done { .. }
        ));
    }
}
