//! What every reconcile gets: the client, the shared child caches, the event recorder, the
//! per-object backoff and the settings.

use std::sync::Arc;
use std::time::Duration;

use crate::event_recorder::{EventQueue, Recorder, Reporter};
use kube::Client;

use crate::backoff::Backoff;
use crate::children::Caches;
use crate::database_cluster::failover_liveness::FailoverLiveness;
use crate::metrics::Metrics;
use crate::status_writes::StatusWrites;

/// Settings from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// DNS suffix of the cluster, for endpoints in status and the credentials Secret.
    pub cluster_domain: String,
    /// How often a healthy object is looked at again even if nothing changed.
    pub health_requeue: Duration,
    /// Where reconciles are counted and timed.
    pub metrics: Arc<Metrics>,
    /// Most reconciles one controller runs at once (controller-runtime's
    /// `MaxConcurrentReconciles`); one object is never reconciled twice at once.
    pub concurrency: u16,
    /// How long an owner's children must be quiet before their events reconcile it (one
    /// reconcile for a burst: a pod turning ready, its report, then its StatefulSet counting
    /// it); see [`crate::debounce`].
    pub child_event_window: Duration,
    /// The image database pods copy `devctl-agent` from (an init container runs
    /// `/devctl-agent install`); the operator's own image.
    pub agent_image: String,
    /// The default backup destination: a Secret (namespace, name) with `endpoint`, `bucket`,
    /// optional `path`, `region`, `ca.crt`, and `accessKeyId`, `secretAccessKey`
    /// (`--default-backup-secret`; docs/backup.md).
    pub default_backup_secret: Option<(String, String)>,
    /// The reconcile slots of each controller, shared by its instances in every watched
    /// namespace: `concurrency` bounds one controller, however many namespaces it watches.
    pub workers: Workers,
}

/// One semaphore of `concurrency` permits per controller name, shared by every clone.
#[derive(Debug, Clone, Default)]
pub struct Workers(
    Arc<std::sync::Mutex<std::collections::HashMap<&'static str, Arc<tokio::sync::Semaphore>>>>,
);

impl Workers {
    /// Waits for a reconcile slot of `controller` (`limit` slots in all).
    pub async fn slot(
        &self,
        controller: &'static str,
        limit: u16,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let semaphore = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(controller)
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(usize::from(limit.max(1)))))
            .clone();
        // Never closed: an error cannot happen, and would only mean no bound.
        semaphore.acquire_owned().await.ok()
    }
}

/// The default of `--concurrency`, as controller-runtime users expect.
pub const DEFAULT_CONCURRENCY: u16 = 4;

/// The default of `--child-event-window-ms`: at 100 clusters, 300 ms of quiet made 3.6
/// reconciles per cluster where 200 ms made 5.1 (a pod's events come up to ~250 ms apart).
pub const DEFAULT_CHILD_EVENT_WINDOW: Duration = Duration::from_millis(300);

impl Default for Settings {
    fn default() -> Self {
        Self {
            cluster_domain: "cluster.local".into(),
            health_requeue: Duration::from_secs(300),
            metrics: Arc::default(),
            concurrency: DEFAULT_CONCURRENCY,
            child_event_window: DEFAULT_CHILD_EVENT_WINDOW,
            agent_image: crate::names::DEFAULT_IMAGE.into(),
            default_backup_secret: None,
            workers: Workers::default(),
        }
    }
}

/// The name of the operator in events.
pub const CONTROLLER_NAME: &str = "devctl-operator";

pub struct Context {
    pub client: Client,
    pub caches: Caches,
    /// Where reconciles send their events ([`EventQueue`]).
    pub events: EventQueue,
    pub backoff: Backoff,
    /// Status writes whose echo the cache has not shown yet ([`StatusWrites`]).
    pub status_writes: StatusWrites,
    /// What the replicas' reports were when each failover under way started.
    pub failover_liveness: FailoverLiveness,
    pub settings: Settings,
}

impl Context {
    /// `instance` tells replicas apart in events (the pod name in a cluster). Starts the
    /// task that publishes events, so it needs a Tokio runtime.
    pub fn new(client: Client, caches: Caches, settings: Settings, instance: String) -> Self {
        let reporter = Reporter {
            controller: CONTROLLER_NAME.into(),
            instance: Some(instance),
        };
        Self {
            events: EventQueue::start(Recorder::new(client.clone(), reporter)),
            client,
            caches,
            backoff: Backoff::default(),
            status_writes: StatusWrites::default(),
            failover_liveness: FailoverLiveness::default(),
            settings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_controller_in_two_namespaces_shares_its_slots() {
        // Two scopes' copies of the settings, as `Operator::controllers` hands them out.
        let a = Settings::default();
        let b = a.clone();
        let first = a.workers.slot("databasecluster", 1).await;
        let second = b.workers.slot("databasecluster", 1);
        tokio::pin!(second);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut second)
                .await
                .is_err(),
            "the second namespace waits for the one slot"
        );
        assert!(
            b.workers.slot("webapp", 1).await.is_some(),
            "another controller has its own slots"
        );
        drop(first);
        assert!(second.await.is_some());
    }
}
