//! Leader election over a coordination.k8s.io Lease (kube-lease-manager: server-side apply,
//! so two candidates can never both take the lock).
//!
//! Timings follow controller-runtime: a 15 s lease renewed 5 s before it expires. A replica
//! that loses the lease stops its controllers and exits non-zero, so the Deployment restarts
//! it as a follower — never two active leaders (the split-brain war story). On shutdown the
//! leader releases the lease. kube-lease-manager's followers sleep until the lease they saw
//! would expire, so a successor takes over within one lease duration (≤ 15 s, measured
//! ~13 s) whether the leader shut down cleanly or crashed; controller-runtime's followers
//! retry every 2 s and notice a release sooner.

use std::future::Future;

use kube_lease_manager::LeaseManagerBuilder;

/// Name of the Lease.
pub const LEASE_NAME: &str = "devctl-operator";
/// Seconds a lease is valid without renewal.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// Seconds before expiry at which the holder renews.
pub const RENEW_BEFORE_SECONDS: u64 = 5;

#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    #[error(
        "lost the leader lease {namespace}/{LEASE_NAME}; stopping so that only one replica acts"
    )]
    Lost { namespace: String },
}

/// Waits to become the leader, runs `controllers` (handing them a stop signal) while leading,
/// and returns when `shutdown` resolves (releasing the lease) or with an error when the lease
/// is lost.
pub async fn run_as_leader<F, Fut>(
    client: kube::Client,
    namespace: &str,
    identity: &str,
    metrics: &crate::metrics::Metrics,
    controllers: F,
    shutdown: impl Future<Output = ()>,
) -> Result<(), LeaderElectionError>
where
    F: FnOnce(tokio::sync::watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()>,
{
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(LEASE_DURATION_SECONDS)
        .with_grace(RENEW_BEFORE_SECONDS)
        .with_field_manager(crate::children::FIELD_MANAGER)
        .build()
        .await?;
    let (mut leading, lease_task) = manager.watch().await;
    let mut shutdown = std::pin::pin!(shutdown);

    tracing::info!(lease = %format!("{namespace}/{LEASE_NAME}"), identity, "waiting to become the leader");
    let became_leader = tokio::select! {
        result = leading.wait_for(|is_leader| *is_leader) => result.is_ok(),
        _ = &mut shutdown => false,
    };
    if !became_leader {
        drop(leading);
        let _ = lease_task.await;
        return Ok(());
    }
    tracing::info!(identity, "became the leader; starting controllers");
    metrics.set_leader(LEASE_NAME, true);

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut controllers = std::pin::pin!(controllers(stopped));
    let lost = tokio::select! {
        _ = &mut controllers => false,
        _ = &mut shutdown => false,
        _ = leading.wait_for(|is_leader| !*is_leader) => true,
    };
    let _ = stop.send(true);
    controllers.await;
    metrics.set_leader(LEASE_NAME, false);
    // Closing the channel makes the lease task release the lease and finish.
    drop(leading);
    match lease_task.await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => tracing::warn!(%error, "releasing the leader lease"),
        Err(error) => tracing::warn!(%error, "lease task failed"),
    }
    if lost {
        return Err(LeaderElectionError::Lost {
            namespace: namespace.to_string(),
        });
    }
    tracing::info!("released the leader lease");
    Ok(())
}
