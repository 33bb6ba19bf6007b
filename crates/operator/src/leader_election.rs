//! Leader election over a coordination.k8s.io Lease, fenced.
//!
//! client-go's algorithm, with its timings as flags: a lease of `lease_duration` (15 s),
//! renewed every `retry_period` (2 s); a leader that has not renewed within `renew_deadline`
//! (7 s, below half the lease) stops its controllers and closes the write [`Fence`], so no
//! write leaves the process after that point even if the process was paused. A follower
//! retries every `retry_period` and takes the lease once it has seen no renewal for a whole
//! `lease_duration` by its own monotonic clock (clock skew between nodes does not matter), or
//! at once when the holder released it. Writes to the Lease are merge patches carrying the
//! `resourceVersion` that was read, so two candidates can never both take it.
//!
//! Why the renew deadline must stay below half the lease: the follower counts the lease
//! duration from when *it* saw the last renewal, which is after the leader sent it; the
//! leader stops writing at renewal-sent + renew deadline. With the deadline below half the
//! lease, in-flight requests and the follower's retry period fit in the margin between the two.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::client::Fence;
use crate::metrics::Metrics;

/// Name of the Lease.
pub const LEASE_NAME: &str = "devctl-operator";

/// How long running reconciles may take to finish after the stop signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// The election timings (`--leader-elect-*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(7),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Timings {
    /// Refuses timings that allow two leaders (or never let anyone renew).
    pub fn validate(&self) -> Result<(), String> {
        if self.lease_duration < Duration::from_secs(1) {
            return Err(format!(
                "--leader-elect-lease-duration {:?} must be at least 1s (the Lease counts whole seconds)",
                self.lease_duration
            ));
        }
        if self.renew_deadline * 2 >= self.lease_duration {
            return Err(format!(
                "--leader-elect-renew-deadline {:?} must be below half of --leader-elect-lease-duration {:?}, or a paused leader could still write after another replica took over",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(format!(
                "--leader-elect-retry-period {:?} must be above zero and below --leader-elect-renew-deadline {:?}, or a leader could not renew in time",
                self.retry_period, self.renew_deadline
            ));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    #[error("leader election: {0}")]
    Lease(#[from] kube::Error),
    #[error(
        "lost the leader lease {namespace}/{LEASE_NAME} (not renewed within {renew_deadline:?}); stopped so that only one replica acts"
    )]
    Lost {
        namespace: String,
        renew_deadline: Duration,
    },
}

/// The last version of the Lease this replica saw, and when (monotonic).
#[derive(Debug, Clone)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    seen_at: Instant,
}

/// One candidate for the Lease.
pub struct Elector {
    api: Api<Lease>,
    namespace: String,
    identity: String,
    timings: Timings,
    observed: Option<Observed>,
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl Elector {
    pub fn new(client: kube::Client, namespace: &str, identity: &str, timings: Timings) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            timings,
            observed: None,
        }
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.timings.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// One attempt to take or renew the Lease: `Ok(true)` when this replica holds it now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = now_micro();
        let Some(lease) = self.api.get_opt(LEASE_NAME).await? else {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": { "name": LEASE_NAME, "namespace": self.namespace },
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": self.lease_seconds(),
                    "acquireTime": now, "renewTime": now, "leaseTransitions": 0
                }
            }))
            .map_err(kube::Error::SerdeError)?;
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|o| o.holder != holder || o.renew_time != spec.renew_time);
        if changed {
            self.observed = Some(Observed {
                holder: holder.clone(),
                renew_time: spec.renew_time.clone(),
                seen_at: Instant::now(),
            });
        }
        let ours = holder.as_deref() == Some(self.identity.as_str());
        let expired = self
            .observed
            .as_ref()
            .is_some_and(|o| o.seen_at.elapsed() >= self.timings.lease_duration);
        if holder.is_some() && !ours && !expired {
            return Ok(false);
        }
        let patch = json!({
            "metadata": { "resourceVersion": lease.metadata.resource_version },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds(),
                "acquireTime": if ours { spec.acquire_time.unwrap_or(now.clone()) } else { now.clone() },
                "renewTime": now,
                "leaseTransitions": spec.lease_transitions.unwrap_or(0) + i32::from(!ours),
            }
        });
        match self
            .api
            .patch(LEASE_NAME, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(true),
            // Someone else wrote it since we read it.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Gives the Lease up if this replica still holds it, so a follower takes over at its
    /// next retry instead of after a whole lease duration.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(lease) = self.api.get_opt(LEASE_NAME).await? else {
            return Ok(());
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        if holder != Some(self.identity.as_str()) {
            return Ok(());
        }
        let patch = json!({
            "metadata": { "resourceVersion": lease.metadata.resource_version },
            "spec": { "holderIdentity": null, "leaseDurationSeconds": 1, "renewTime": now_micro() }
        });
        self.api
            .patch(LEASE_NAME, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}

/// Waits to become the leader, runs `controllers` (handing them a stop signal) while leading,
/// and returns when `shutdown` resolves (after the controllers finished, within
/// [`SHUTDOWN_GRACE`], and the lease was released) or with an error when the lease is lost.
/// `fence` is opened only while leadership is confirmed.
#[allow(clippy::too_many_arguments)]
pub async fn run_as_leader<F, Fut>(
    client: kube::Client,
    namespace: &str,
    identity: &str,
    timings: Timings,
    fence: &Fence,
    metrics: &Metrics,
    controllers: F,
    shutdown: impl Future<Output = ()>,
) -> Result<(), LeaderElectionError>
where
    F: FnOnce(tokio::sync::watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut elector = Elector::new(client, namespace, identity, timings);
    let mut shutdown = std::pin::pin!(shutdown);
    fence.close();
    tracing::info!(lease = %format!("{namespace}/{LEASE_NAME}"), identity, "waiting to become the leader");
    let mut last_renewal = loop {
        let sent = Instant::now();
        match elector.try_acquire_or_renew().await {
            Ok(true) => break sent,
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(%error, "leader election: could not read or take the lease")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(jittered(timings.retry_period)) => {}
            _ = &mut shutdown => return Ok(()),
        }
    };
    fence.open_until(last_renewal + timings.renew_deadline);
    metrics.set_leader(LEASE_NAME, true);
    tracing::info!(identity, "became the leader; starting controllers");

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut controllers = std::pin::pin!(controllers(stopped));
    let mut controllers_done = false;
    let lost = loop {
        let deadline = tokio::time::Instant::from_std(last_renewal + timings.renew_deadline);
        tokio::select! {
            _ = &mut controllers => { controllers_done = true; break false; }
            _ = &mut shutdown => break false,
            _ = tokio::time::sleep_until(deadline) => break true,
            _ = tokio::time::sleep(timings.retry_period) => {
                let sent = Instant::now();
                let renewed = tokio::time::timeout_at(deadline, elector.try_acquire_or_renew()).await;
                match renewed {
                    Ok(Ok(true)) => {
                        last_renewal = sent;
                        fence.open_until(sent + timings.renew_deadline);
                    }
                    Ok(Ok(false)) => {
                        tracing::warn!("another replica holds the leader lease");
                        break true;
                    }
                    Ok(Err(error)) => tracing::warn!(%error, "could not renew the leader lease; retrying"),
                    Err(_) => break true,
                }
            }
        }
    };
    if lost {
        // No write leaves the process from here on, whatever the controllers still do.
        fence.close();
        tracing::error!(identity, "lost the leader lease; stopping the controllers");
    } else {
        tracing::info!("stopping the controllers");
    }
    let _ = stop.send(true);
    if !controllers_done
        && tokio::time::timeout(SHUTDOWN_GRACE, &mut controllers)
            .await
            .is_err()
    {
        tracing::warn!(grace = ?SHUTDOWN_GRACE, "reconciles still running after the shutdown grace; leaving them");
    }
    fence.close();
    metrics.set_leader(LEASE_NAME, false);
    if lost {
        return Err(LeaderElectionError::Lost {
            namespace: namespace.to_string(),
            renew_deadline: timings.renew_deadline,
        });
    }
    elector.release().await?;
    tracing::info!("released the leader lease");
    Ok(())
}

/// `period` plus up to 20% jitter, so replicas started together do not retry in lockstep.
fn jittered(period: Duration) -> Duration {
    use rand::Rng;
    let extra = rand::rng().random_range(0.0..0.2);
    period.mul_f64(1.0 + extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_that_allow_two_leaders_are_refused() {
        assert_eq!(Timings::default().validate(), Ok(()));
        let half = Timings {
            renew_deadline: Duration::from_millis(7500),
            ..Timings::default()
        };
        let message = half.validate().unwrap_err();
        assert!(
            message.contains("--leader-elect-renew-deadline") && message.contains("half"),
            "{message}"
        );
        let slow_retry = Timings {
            retry_period: Duration::from_secs(7),
            ..Timings::default()
        };
        assert!(
            slow_retry
                .validate()
                .unwrap_err()
                .contains("--leader-elect-retry-period")
        );
    }
}
