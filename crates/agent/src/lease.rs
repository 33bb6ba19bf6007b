//! The primary lock: the Lease `<cluster>-primary` (docs/failover.md).
//!
//! Only its holder may run PostgreSQL as the primary. Every write is an `update` with the
//! Lease's `resourceVersion` as precondition, so of two agents racing for it exactly one wins.
//! Time is only ever measured on this process's monotonic clock: how long the record has been
//! seen unchanged (a candidate's patience) and how long ago the last successful renewal was
//! *started* (the holder's renew deadline). No timestamp written by another machine is
//! compared with ours.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::watch_error_is_forbidden;
use crate::error::one_line;

/// The share of the lease duration within which a holder must have renewed, or fence itself.
/// Below half: the holder stops writing well before anyone may take the lock over.
pub fn renew_deadline(duration: Duration) -> Duration {
    duration * 2 / 5
}

/// How often the holder renews: a tenth of the duration (several tries fit in the deadline),
/// at least every 200 ms, at most every 3 s.
pub fn renew_interval(duration: Duration) -> Duration {
    (duration / 10).clamp(Duration::from_millis(200), Duration::from_secs(3))
}

/// The shortest lock duration the API allows (`spec.highAvailability.failoverTimeout` ≥ 5s).
pub const MIN_DURATION: Duration = Duration::from_secs(5);

/// How long a fencing engine gets for its fast shutdown before SIGKILL: a fifth of the
/// duration, at most 3 s. The renew deadline plus this stays well below the duration a
/// candidate waits before it takes the lock over (see the budget test), also at the
/// shortest duration.
pub fn fence_stop_timeout(duration: Duration) -> Duration {
    (duration / 5).min(Duration::from_secs(3))
}

/// The lock's duration as a holder and as a taker go by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockDurations {
    /// What the holder fences on (renew deadline, renew interval, stop timeout).
    pub hold: Duration,
    /// How long a taker must see another's record unchanged before it takes the lock.
    pub take: Duration,
}

/// The durations from this agent's own view of the spec and the Lease's
/// `leaseDurationSeconds` (written by the operator). Agents and the operator learn of a
/// change of `failoverTimeout` at different times, so a holder fences on the shorter of the
/// two and a taker waits for the longer: whichever of them has seen the change, a lowered
/// `failoverTimeout` never makes a taker impatient while the holder still fences on the old,
/// longer one (and a raised one makes the holder fence early, never late).
pub fn lock_durations(own: Duration, lease: Option<&Lease>) -> LockDurations {
    let written = lease
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|secs| u64::try_from(secs).ok())
        .filter(|secs| *secs > 0)
        .map(Duration::from_secs);
    LockDurations {
        hold: written.map_or(own, |w| own.min(w)),
        take: written.map_or(own, |w| own.max(w)),
    }
}

/// Why the lock was not taken or renewed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireError {
    /// A read of the Lease (our last write's record, or a fresh read) names another holder.
    HeldBy { holder: String, message: String },
    /// Anything else: the API server did not answer in time, refused, the record changed.
    Failed(String),
}

impl std::fmt::Display for AcquireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::HeldBy { message, .. } | Self::Failed(message) => f.write_str(message),
        }
    }
}

impl From<AcquireError> for String {
    fn from(e: AcquireError) -> Self {
        e.to_string()
    }
}

/// The time one attempt to take or renew the lock may take, as a whole (every request of
/// it): until the hold lapses when it is held (it must learn in time that it failed), and
/// never more than half the renew deadline.
pub fn attempt_deadline(
    started: Instant,
    lapses_at: Option<Instant>,
    duration: Duration,
) -> Instant {
    let bound = started + renew_deadline(duration) / 2;
    match lapses_at {
        Some(at) => at.min(bound).max(started + Duration::from_millis(100)),
        None => bound,
    }
}

/// Whether `me` may write itself into a Lease held by `holder` whose record this process has
/// seen unchanged for `unchanged_for` (pure: the takeover rule).
pub fn may_take(
    holder: Option<&str>,
    me: &str,
    unchanged_for: Duration,
    duration: Duration,
) -> Result<(), String> {
    match holder.filter(|h| !h.is_empty()) {
        None => Ok(()),
        Some(h) if h == me => Ok(()),
        Some(h) if unchanged_for >= duration => {
            tracing::info!(holder = h, ?unchanged_for, "the primary lock expired");
            Ok(())
        }
        Some(h) => Err(format!(
            "the primary lock is held by {h} (unchanged for {}s of {}s)",
            unchanged_for.as_secs(),
            duration.as_secs()
        )),
    }
}

/// What the Lease watch has seen.
#[derive(Clone, Debug)]
pub struct LeaseView {
    pub listed: bool,
    pub lease: Option<Lease>,
    /// When the record (its `resourceVersion`) last changed, on this process's clock.
    pub changed_at: Instant,
    pub error: Option<(String, bool)>,
}

impl LeaseView {
    pub fn holder(&self) -> Option<&str> {
        self.lease
            .as_ref()?
            .spec
            .as_ref()?
            .holder_identity
            .as_deref()
            .filter(|h| !h.is_empty())
    }
}

/// Watches the one Lease (field selector on its name: the agent's Role names it).
pub fn watch_lease(api: Api<Lease>, name: &str) -> watch::Receiver<LeaseView> {
    let (tx, rx) = watch::channel(LeaseView {
        listed: false,
        lease: None,
        changed_at: Instant::now(),
        error: None,
    });
    let fields = format!("metadata.name={name}");
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default().fields(&fields))
            .default_backoff()
            .boxed();
        let mut buffer = None;
        let set = |view: &mut LeaseView, lease: Option<Lease>| {
            let version =
                |l: &Option<Lease>| l.as_ref().and_then(|l| l.metadata.resource_version.clone());
            if version(&view.lease) != version(&lease) || !view.listed {
                view.changed_at = Instant::now();
            }
            view.listed = true;
            view.lease = lease;
            view.error = None;
        };
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => buffer = None,
                Ok(watcher::Event::InitApply(l)) => buffer = Some(l),
                Ok(watcher::Event::InitDone) => {
                    let lease = buffer.take();
                    tx.send_modify(|v| set(v, lease));
                }
                Ok(watcher::Event::Apply(l)) => tx.send_modify(|v| set(v, Some(l))),
                Ok(watcher::Event::Delete(_)) => tx.send_modify(|v| set(v, None)),
                Err(e) => {
                    let forbidden = watch_error_is_forbidden(&e);
                    let message = one_line(&e.to_string());
                    tracing::warn!("watching the primary lock: {message}");
                    tx.send_modify(|v| v.error = Some((message, forbidden)));
                }
            }
        }
    });
    rx
}

/// This agent's side of the primary lock.
pub struct PrimaryLock {
    api: Api<Lease>,
    name: String,
    me: String,
    pub view: watch::Receiver<LeaseView>,
    /// Start of the last successful write naming this pod.
    last_renewed: Option<Instant>,
    /// The Lease as our last successful write left it (the next write's precondition).
    written: Option<Lease>,
}

impl PrimaryLock {
    pub fn new(api: Api<Lease>, name: &str, me: &str) -> Self {
        let view = watch_lease(api.clone(), name);
        Self {
            api,
            name: name.to_string(),
            me: me.to_string(),
            view,
            last_renewed: None,
            written: None,
        }
    }

    /// Whether this pod holds the lock now: its last renewal started less than the renew
    /// deadline ago.
    pub fn held(&self, duration: Duration) -> bool {
        self.last_renewed
            .is_some_and(|t| t.elapsed() < renew_deadline(duration))
    }

    /// When the hold lapses (for a timer), if held.
    pub fn lapses_at(&self, duration: Duration) -> Option<Instant> {
        self.last_renewed.map(|t| t + renew_deadline(duration))
    }

    /// Forgets a hold (after fencing): the next [`Self::acquire`] must win the lock again.
    pub fn drop_hold(&mut self) {
        self.last_renewed = None;
        self.written = None;
    }

    /// Takes or renews the lock (one write, a second after a conflict), all of it within
    /// [`attempt_deadline`]. `Err` says why not; [`AcquireError::HeldBy`] when a read shows
    /// another holder.
    pub async fn acquire(&mut self, durations: LockDurations) -> Result<(), AcquireError> {
        let duration = durations.hold;
        let started = Instant::now();
        let deadline = attempt_deadline(started, self.lapses_at(duration), duration);
        let timeout = deadline.saturating_duration_since(started);
        let mut fresh = false;
        for _ in 0..2 {
            let current = self
                .current(fresh, deadline, timeout)
                .await
                .map_err(AcquireError::Failed)?;
            let view = self.view.borrow().clone();
            let same_record = view.lease.as_ref().map(|l| &l.metadata.resource_version)
                == Some(&current.metadata.resource_version);
            let unchanged_for = if same_record {
                view.changed_at.elapsed()
            } else {
                Duration::ZERO
            };
            let spec = current.spec.clone().unwrap_or_default();
            let holder = spec.holder_identity.as_deref();
            if let Err(message) = may_take(holder, &self.me, unchanged_for, durations.take) {
                return Err(AcquireError::HeldBy {
                    holder: holder.unwrap_or_default().to_string(),
                    message,
                });
            }
            let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
            let mut next = current.clone();
            let mut next_spec = spec.clone();
            if holder != Some(self.me.as_str()) {
                next_spec.holder_identity = Some(self.me.clone());
                next_spec.acquire_time = Some(now.clone());
                next_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            next_spec.renew_time = Some(now);
            next.spec = Some(next_spec);
            next.metadata.managed_fields = None;
            match tokio::time::timeout_at(
                deadline,
                self.api.replace(&self.name, &PostParams::default(), &next),
            )
            .await
            {
                Ok(Ok(written)) => {
                    if holder != Some(self.me.as_str()) {
                        tracing::info!(previous = ?holder, "took the primary lock");
                    }
                    self.last_renewed = Some(started);
                    self.written = Some(written);
                    return Ok(());
                }
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                    // Someone else wrote it (or our copy is stale): decide again on a fresh read.
                    self.written = None;
                    fresh = true;
                }
                Ok(Err(e)) => {
                    return Err(AcquireError::Failed(format!(
                        "writing the primary lock {}: {}",
                        self.name,
                        one_line(&e.to_string())
                    )));
                }
                Err(_) => {
                    return Err(AcquireError::Failed(format!(
                        "writing the primary lock {}: no answer within {}ms",
                        self.name,
                        timeout.as_millis()
                    )));
                }
            }
        }
        Err(AcquireError::Failed(format!(
            "the primary lock {} changed while this pod tried to take it",
            self.name
        )))
    }

    /// The record to build on: our last write while it is current, else a fresh read.
    async fn current(
        &mut self,
        fresh: bool,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Lease, String> {
        if !fresh && let Some(written) = &self.written {
            return Ok(written.clone());
        }
        match tokio::time::timeout_at(deadline, self.api.get_opt(&self.name)).await {
            Ok(Ok(Some(lease))) => Ok(lease),
            Ok(Ok(None)) => Err(format!(
                "the primary lock {} does not exist (the operator creates it)",
                self.name
            )),
            Ok(Err(e)) => Err(format!(
                "reading the primary lock {}: {}",
                self.name,
                one_line(&e.to_string())
            )),
            Err(_) => Err(format!(
                "reading the primary lock {}: no answer within {}ms",
                self.name,
                timeout.as_millis()
            )),
        }
    }

    /// Clean shutdown: empties the holder when it is this pod (best effort, bounded), so a
    /// restarted primary or a switchover target takes it at once.
    pub async fn release(&mut self) {
        self.last_renewed = None;
        let Ok(Ok(Some(mut lease))) =
            tokio::time::timeout(Duration::from_secs(3), self.api.get_opt(&self.name)).await
        else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.me.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        lease.metadata.managed_fields = None;
        match tokio::time::timeout(
            Duration::from_secs(3),
            self.api.replace(&self.name, &PostParams::default(), &lease),
        )
        .await
        {
            Ok(Ok(_)) => tracing::info!("released the primary lock"),
            Ok(Err(e)) => {
                tracing::warn!("releasing the primary lock: {}", one_line(&e.to_string()))
            }
            Err(_) => tracing::warn!("releasing the primary lock: no answer"),
        }
        self.written = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(10);

    #[test]
    fn a_free_or_own_lock_is_taken_at_once() {
        assert!(may_take(None, "db-1", Duration::ZERO, D).is_ok());
        assert!(may_take(Some(""), "db-1", Duration::ZERO, D).is_ok());
        assert!(may_take(Some("db-1"), "db-1", Duration::ZERO, D).is_ok());
    }

    #[test]
    fn another_holder_is_displaced_only_after_a_full_duration_of_own_observation() {
        let refused = may_take(Some("db-0"), "db-1", D - Duration::from_millis(1), D);
        assert!(refused.unwrap_err().contains("held by db-0"));
        assert!(may_take(Some("db-0"), "db-1", D, D).is_ok());
    }

    #[test]
    fn the_holder_fences_well_before_a_candidate_may_take_over() {
        // Renewals start every interval; several fit in the deadline; the deadline plus the
        // engine's fenced stop (SIGKILL at the latest) stay below the duration a candidate
        // must wait, with at least a second to spare, from the shortest allowed duration up.
        for secs in [MIN_DURATION.as_secs(), 6, 10, 30, 600] {
            let d = Duration::from_secs(secs);
            assert!(renew_deadline(d) < d / 2);
            assert!(renew_interval(d) * 2 < renew_deadline(d));
            let fenced_by = renew_deadline(d) + fence_stop_timeout(d);
            assert!(
                fenced_by + Duration::from_secs(1) < d,
                "duration {d:?}: the holder is stopped only {fenced_by:?} after its last renewal started"
            );
        }
    }

    #[test]
    fn one_attempt_never_outlasts_the_hold_nor_half_the_deadline() {
        let start = Instant::now();
        let d = Duration::from_secs(10);
        // Not held: half the renew deadline (2 s) for the whole attempt.
        assert_eq!(
            attempt_deadline(start, None, d),
            start + Duration::from_secs(2)
        );
        // Held, lapsing in 1 s: the attempt ends then, whatever requests remain.
        let lapse = start + Duration::from_secs(1);
        assert_eq!(attempt_deadline(start, Some(lapse), d), lapse);
        // Lapsing later than the bound: the bound.
        assert_eq!(
            attempt_deadline(start, Some(start + Duration::from_secs(3)), d),
            start + Duration::from_secs(2)
        );
    }

    #[test]
    fn holders_fence_on_the_shorter_and_takers_wait_for_the_longer_duration() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        let lease = |secs| Lease {
            spec: Some(LeaseSpec {
                lease_duration_seconds: Some(secs),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        let (ten, thirty) = (Duration::from_secs(10), Duration::from_secs(30));
        // failoverTimeout lowered from 30 s to 10 s. Whoever has seen what — the holder's
        // spec view still 30 s while the operator wrote 10 s into the Lease, or the other
        // way round — the holder is stopped before the taker may take over.
        for (holder_view, taker_view, written) in [
            (thirty, ten, 10),
            (thirty, ten, 30),
            (ten, thirty, 30),
            (ten, ten, 30),
            (thirty, thirty, 10),
        ] {
            let holder = lock_durations(holder_view, Some(&lease(written))).hold;
            let taker = lock_durations(taker_view, Some(&lease(written))).take;
            assert!(
                renew_deadline(holder) + fence_stop_timeout(holder) < taker,
                "holder sees {holder_view:?}, taker {taker_view:?}, the Lease {written}s: fenced after {holder:?}'s deadline, taken after {taker:?}"
            );
        }
        let alone = lock_durations(ten, None);
        assert_eq!((alone.hold, alone.take), (ten, ten));
        let nonsense = lock_durations(ten, Some(&lease(-1)));
        assert_eq!((nonsense.hold, nonsense.take), (ten, ten));
    }
}
