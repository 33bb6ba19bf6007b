//! When a reconcile looks again by itself, decided from the observation and its plan (pure):
//! deadlines no watch event announces.

use std::time::Duration;

use super::observe::Observation;
use super::primary::Primary;
use super::resources;

/// How often a cluster whose backup destination or restore source is misconfigured looks
/// again (what it waits for — a Secret, a DatabaseBackup — is not watched).
pub const CONFIGURATION_RECHECK: Duration = Duration::from_secs(30);

/// Past a deadline, so that the reconcile finds it passed rather than a moment short.
pub const TIMER_MARGIN: Duration = Duration::from_millis(250);

/// The earliest of `timers` (the failover or switchover step's, the schedule's, a major
/// upgrade's), a
/// misconfiguration's recheck, and at once when the primary moved while a scale-down waits
/// for that; with [`TIMER_MARGIN`].
pub fn next_look(
    observation: &Observation,
    primary: &Primary,
    timers: [Option<Duration>; 3],
) -> Option<Duration> {
    let db = observation.cluster.as_ref();
    let store = &observation.store;
    // A backup destination or restore source that cannot be used as configured waits for a
    // Secret or a DatabaseBackup the caches do not hold (they keep only what devctl labels):
    // the cluster looks again every `CONFIGURATION_RECHECK` while that lasts, so fixing the
    // cause clears `Degraded` without waiting for the health requeue.
    let recheck = (store.restore_problem.is_some() || store.destination_problem.is_some())
        .then_some(CONFIGURATION_RECHECK);
    // The primary moved in this reconcile while a scale-down waits for that: the children
    // were rendered from the status before the move, and the status write's echo wakes
    // nobody — look again at once.
    let primary_moved = (resources::stateful_set::scale_down_refused(db).is_some()
        && primary.current != observation.recorded_primary().current)
        .then_some(Duration::ZERO);
    timers
        .into_iter()
        .chain([recheck, primary_moved])
        .flatten()
        .min()
        .map(|timer| timer + TIMER_MARGIN)
}
