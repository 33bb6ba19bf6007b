//! Who is primary and what the operator saw of the primary lock: the state and the timing
//! the failover and switchover deciders share (each imports this, neither the other).

use std::time::Duration;

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
    /// When the switchover under way started (`status.lastSwitchoverTime`).
    pub last_switchover_time: Option<String>,
    /// The flight record of the last failover or switchover (`status.lastFailover`).
    pub last_failover: Option<devctl_api::database_cluster::FailoverRecord>,
}

/// What the operator's watch saw of the primary lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseObservation {
    /// `spec.holderIdentity` (none when released).
    pub holder: Option<String>,
    /// Someone took the lock once: a lock nobody ever took (a new cluster, agents without
    /// failover support) never counts as lost.
    pub ever_held: bool,
    /// How long the lock has been unchanged, on the operator's monotonic clock.
    pub unchanged_for: Duration,
}

/// How long a promoting target may hold the lock without renewing it: the agent's
/// `pg_promote(true, 60)` and its margin.
pub const PROMOTION_WAIT: Duration = Duration::from_secs(75);

/// How long a switchover may take before it is aborted: two lock durations with high
/// availability (`failoverTimeout`), a minute without.
pub fn deadline(lock_duration: Option<Duration>) -> Duration {
    lock_duration.map_or(Duration::from_secs(60), |d| d * 2)
}
