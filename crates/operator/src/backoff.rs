//! Per-object exponential backoff for failed reconciles (kube-runtime has none built in).
//!
//! Bounds: 1 s doubling to 5 min, ±10% jitter. controller-runtime starts at 5 ms and caps at
//! 1000 s; our errors are API errors (a conflict, a denied request, an admission webhook
//! that is down) that a few milliseconds never fix, and a database whose reconcile fails
//! should be retried at least every 5 minutes — the same cadence as the health requeue — so
//! a fixed cause (say, RBAC restored) shows up without human action.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rand::Rng;

pub const INITIAL: Duration = Duration::from_secs(1);
pub const MAX: Duration = Duration::from_secs(300);

/// Failure counts per object key (`namespace/name`).
#[derive(Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
    /// Deadlines a failed reconcile must still meet (a lock's expiry), by object key.
    deadlines: Mutex<HashMap<String, Duration>>,
}

impl Backoff {
    /// Records a failure and returns how long to wait before the next attempt.
    pub fn next_delay(&self, key: &str) -> Duration {
        let failures = {
            let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
            let count = map.entry(key.to_string()).or_insert(0);
            *count = count.saturating_add(1);
            *count
        };
        let base = delay_for(failures);
        let jitter = rand::rng().random_range(0.9..=1.1);
        let deadline = self
            .deadlines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
            .unwrap_or(MAX);
        base.mul_f64(jitter).min(MAX).min(deadline)
    }

    /// The next retry of `key`, should this reconcile fail, comes no later than `within`: a
    /// failing child must not postpone what only time reveals (a primary that stopped
    /// renewing its lock).
    pub fn retry_within(&self, key: &str, within: Duration) {
        self.deadlines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), within);
    }

    /// Forgets the failures of `key` after a successful reconcile.
    pub fn reset(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        self.deadlines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Consecutive failures of `key`.
    pub fn failures(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// The delay after the `failures`-th consecutive failure, without jitter.
pub fn delay_for(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(16);
    INITIAL.saturating_mul(1 << exponent).min(MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_one_second_to_five_minutes() {
        let delays: Vec<u64> = (1..=11).map(|n| delay_for(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(delay_for(u32::MAX), MAX);
    }

    #[test]
    fn success_resets_the_count() {
        let backoff = Backoff::default();
        backoff.next_delay("ns/a");
        backoff.next_delay("ns/a");
        assert_eq!(backoff.failures("ns/a"), 2);
        assert_eq!(backoff.failures("ns/b"), 0);
        backoff.reset("ns/a");
        assert_eq!(backoff.failures("ns/a"), 0);
        let first = backoff.next_delay("ns/a");
        assert!(first >= Duration::from_millis(900) && first <= Duration::from_millis(1100));
    }

    #[test]
    fn a_deadline_caps_the_next_retry_only() {
        let backoff = Backoff::default();
        for _ in 0..10 {
            backoff.next_delay("ns/a");
        }
        backoff.retry_within("ns/a", Duration::from_secs(3));
        assert_eq!(backoff.next_delay("ns/a"), Duration::from_secs(3));
        assert!(backoff.next_delay("ns/a") > Duration::from_secs(200));
    }
}
