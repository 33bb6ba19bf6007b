//! Planned switchover (`devctl db promote NAME POD`), decided from what is observed (pure).
//!
//! A user asks by annotating the cluster ([`SWITCHOVER_ANNOTATION`]). The operator checks the
//! target is a ready, streaming replica and records it in `status.targetPrimary`; the old
//! primary's agent checkpoints and stops (reporting its shutdown checkpoint as `finalLSN`), the
//! target's agent promotes once it has received WAL up to there — so nothing written is
//! lost, even with asynchronous replication — and reports itself primary; the operator then
//! moves `status.currentPrimary`, clears the target and relabels the pods. Agents never write
//! status: each step is the operator's.

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::{InstanceStatus, ROLE_PRIMARY, ROLE_REPLICA, SWITCHOVER_ANNOTATION};

use super::instances::ordinal;

/// Who is primary, and who is becoming it; the failover bookkeeping of the status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Primary {
    pub current: String,
    /// A pod, or [`devctl_api::instance::TARGET_PENDING`] while a failover elects one.
    pub target: Option<String>,
    /// The primary a failover under way replaces.
    pub failed: Option<String>,
    pub epoch: Option<i64>,
    pub last_failover_time: Option<String>,
    /// Targets of the failover under way that did not promote (`status.failedTargets`).
    pub failed_targets: Vec<String>,
}

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

/// Decides the step from the status, the request and the agents' reports (`reports` by pod
/// name); `replicas` is the number of instances the cluster runs.
pub fn plan(
    primary: &Primary,
    requested: Option<&str>,
    reports: &[(String, Option<InstanceStatus>)],
    replicas: i32,
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
            _ => Step::Waiting(target.clone()),
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

    fn idle() -> Primary {
        Primary {
            current: "db-0".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_ready_replica_becomes_the_target() {
        assert_eq!(
            plan(&idle(), Some("db-1"), &reports(), 3),
            Step::Start("db-1".into())
        );
    }

    #[test]
    fn requests_that_cannot_be_carried_out_are_refused_with_the_reason() {
        assert!(
            matches!(plan(&idle(), Some("db-2"), &reports(), 3), Step::Refuse(m) if m.contains("not a ready"))
        );
        assert!(
            matches!(plan(&idle(), Some("db-7"), &reports(), 3), Step::Refuse(m) if m.contains("not an instance"))
        );
        assert!(matches!(
            plan(&idle(), Some("other-1"), &reports(), 3),
            Step::Refuse(_)
        ));
        assert_eq!(
            plan(&idle(), Some("db-0"), &reports(), 3),
            Step::AlreadyPrimary
        );
        assert_eq!(plan(&idle(), None, &reports(), 3), Step::Idle);
    }

    #[test]
    fn done_only_once_the_target_reports_itself_primary() {
        let switching = Primary {
            current: "db-0".into(),
            target: Some("db-1".into()),
            ..Default::default()
        };
        assert_eq!(
            plan(&switching, None, &reports(), 3),
            Step::Waiting("db-1".into())
        );
        let mut promoted = reports();
        promoted[1].1 = report("primary", true);
        assert_eq!(
            plan(&switching, None, &promoted, 3),
            Step::Done {
                from: "db-0".into(),
                to: "db-1".into()
            }
        );
    }
}
