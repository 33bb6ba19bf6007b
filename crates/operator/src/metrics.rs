//! Prometheus metrics and health endpoints.
//!
//! Metric names follow controller-runtime's, so dashboards and alerts written for Go
//! operators work unchanged: `controller_runtime_reconcile_total{controller,result}`,
//! `controller_runtime_reconcile_errors_total{controller}`,
//! `controller_runtime_reconcile_time_seconds{controller}`,
//! `controller_runtime_active_workers{controller}`,
//! `controller_runtime_max_concurrent_reconciles{controller}` and
//! `leader_election_master_status{name}`; devctl's own: `devctl_reconciles_in_flight{controller}`
//! and its high-water mark `devctl_reconciles_in_flight_max{controller}`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets_range};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestLabels {
    code: String,
    host: String,
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    name: &'static str,
}

/// The operator's metrics registry.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ControllerLabels, Counter>,
    durations: Family<ControllerLabels, Histogram>,
    leader: Family<LeaseLabels, Gauge>,
    in_flight: Family<ControllerLabels, Gauge>,
    in_flight_max: Family<ControllerLabels, Gauge>,
    active_workers: Family<ControllerLabels, Gauge>,
    max_concurrent: Family<ControllerLabels, Gauge>,
    queue_depth: Family<QueueLabels, Gauge>,
    queue_adds: Family<QueueLabels, Counter>,
    queue_retries: Family<QueueLabels, Counter>,
    queue_duration: Family<QueueLabels, Histogram>,
    work_duration: Family<QueueLabels, Histogram>,
    rest_requests: Family<RestLabels, Counter>,
    /// Objects triggered and not yet started, with the time of their first trigger.
    pending:
        std::sync::Mutex<std::collections::HashMap<(&'static str, String), std::time::Instant>>,
    ready: AtomicBool,
}

/// Counts a reconcile as in flight until dropped.
pub struct InFlight<'a> {
    metrics: &'a Metrics,
    controller: &'static str,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let labels = ControllerLabels {
            controller: self.controller,
        };
        self.metrics.in_flight.get_or_create(&labels).dec();
        self.metrics.active_workers.get_or_create(&labels).dec();
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let reconciles = Family::<ResultLabels, Counter>::default();
        let errors = Family::<ControllerLabels, Counter>::default();
        // controller-runtime's buckets span 5 ms to 60 s.
        let durations = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets_range(0.005, 60.0, 16))
        });
        let leader = Family::<LeaseLabels, Gauge>::default();
        let in_flight = Family::<ControllerLabels, Gauge>::default();
        let in_flight_max = Family::<ControllerLabels, Gauge>::default();
        let active_workers = Family::<ControllerLabels, Gauge>::default();
        let max_concurrent = Family::<ControllerLabels, Gauge>::default();
        let buckets = || Histogram::new(exponential_buckets_range(0.001, 60.0, 16));
        let queue_depth = Family::<QueueLabels, Gauge>::default();
        let queue_adds = Family::<QueueLabels, Counter>::default();
        let queue_retries = Family::<QueueLabels, Counter>::default();
        let queue_duration = Family::<QueueLabels, Histogram>::new_with_constructor(buckets);
        let work_duration = Family::<QueueLabels, Histogram>::new_with_constructor(buckets);
        let rest_requests = Family::<RestLabels, Counter>::default();
        registry.register(
            "workqueue_depth",
            "Objects triggered and waiting for a reconcile (kube-runtime's scheduler deduplicates, so an object counts once)",
            queue_depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Reconcile triggers received: primary watch events, child events, requeues",
            queue_adds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Reconciles requeued with backoff after an error",
            queue_retries.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "Time from an object's first trigger to the start of its reconcile",
            queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "Time a reconcile took",
            work_duration.clone(),
        );
        registry.register(
            "rest_client_requests",
            "Requests to the API server by status code, host and method",
            rest_requests.clone(),
        );
        registry.register(
            "devctl_reconciles_in_flight",
            "Reconciles running now",
            in_flight.clone(),
        );
        registry.register(
            "devctl_reconciles_in_flight_max",
            "The most reconciles that ran at once since the operator started",
            in_flight_max.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Reconciles running now (controller-runtime's name)",
            active_workers.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "The most reconciles a controller runs at once (--concurrency)",
            max_concurrent.clone(),
        );
        registry.register(
            "controller_runtime_reconcile",
            "Reconciles per controller and result (success, error, requeue_after)",
            reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that returned an error",
            errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Time per reconcile",
            durations.clone(),
        );
        registry.register(
            "leader_election_master_status",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            durations,
            leader,
            in_flight,
            in_flight_max,
            active_workers,
            max_concurrent,
            queue_depth,
            queue_adds,
            queue_retries,
            queue_duration,
            work_duration,
            rest_requests,
            pending: Default::default(),
            ready: AtomicBool::new(false),
        }
    }
}

impl Metrics {
    /// Records one finished reconcile of `controller`.
    pub fn reconciled(&self, controller: &'static str, success: bool, took: Duration) {
        let result = if success { "success" } else { "error" };
        self.reconciles
            .get_or_create(&ResultLabels { controller, result })
            .inc();
        if !success {
            self.errors
                .get_or_create(&ControllerLabels { controller })
                .inc();
        }
        self.durations
            .get_or_create(&ControllerLabels { controller })
            .observe(took.as_secs_f64());
        self.work_duration
            .get_or_create(&QueueLabels { name: controller })
            .observe(took.as_secs_f64());
    }

    /// A reconcile of `key` was asked for (the scheduler keeps one request per object).
    pub fn queue_add(&self, name: &'static str, key: String) {
        let labels = QueueLabels { name };
        self.queue_adds.get_or_create(&labels).inc();
        if let Ok(mut pending) = self.pending.lock()
            && !pending.contains_key(&(name, key.clone()))
        {
            pending.insert((name, key), std::time::Instant::now());
            self.queue_depth.get_or_create(&labels).inc();
        }
    }

    /// The reconcile of `key` started.
    pub fn queue_start(&self, name: &'static str, key: &str) {
        let labels = QueueLabels { name };
        let since = self
            .pending
            .lock()
            .ok()
            .and_then(|mut p| p.remove(&(name, key.to_string())));
        if let Some(since) = since {
            self.queue_depth.get_or_create(&labels).dec();
            self.queue_duration
                .get_or_create(&labels)
                .observe(since.elapsed().as_secs_f64());
        }
    }

    /// A failed reconcile was requeued with backoff.
    pub fn queue_retry(&self, name: &'static str) {
        self.queue_retries
            .get_or_create(&QueueLabels { name })
            .inc();
    }

    /// One finished request to the API server.
    pub fn rest_request(&self, host: &str, method: &str, code: &str) {
        self.rest_requests
            .get_or_create(&RestLabels {
                code: code.to_string(),
                host: host.to_string(),
                method: method.to_string(),
            })
            .inc();
    }

    /// Counts one reconcile of `controller` as running until the guard is dropped.
    pub fn start_reconcile(&self, controller: &'static str) -> InFlight<'_> {
        let labels = ControllerLabels { controller };
        let now = self.in_flight.get_or_create(&labels).inc() + 1;
        self.active_workers.get_or_create(&labels).inc();
        self.in_flight_max
            .get_or_create(&labels)
            .inner()
            .fetch_max(now, Ordering::Relaxed);
        InFlight {
            metrics: self,
            controller,
        }
    }

    /// The configured bound on concurrent reconciles of `controller`.
    pub fn set_max_concurrent(&self, controller: &'static str, limit: u16) {
        self.max_concurrent
            .get_or_create(&ControllerLabels { controller })
            .set(i64::from(limit));
    }

    /// Whether this replica holds the leader lease `name`.
    pub fn set_leader(&self, name: &'static str, leading: bool) {
        self.leader
            .get_or_create(&LeaseLabels { name })
            .set(i64::from(leading));
    }

    /// Marks the operator ready: every cache has synced (leadership does not matter).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

async fn metrics(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

async fn ready(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = Router::new()
        .route("/metrics", get(self::metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(metrics);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciles_are_counted_with_controller_runtime_names() {
        let metrics = Metrics::default();
        metrics.reconciled("databasecluster", true, Duration::from_millis(12));
        metrics.reconciled("databasecluster", false, Duration::from_millis(3));
        metrics.set_leader("devctl-operator", true);
        {
            let _a = metrics.start_reconcile("webapp");
            let _b = metrics.start_reconcile("webapp");
        }
        let _c = metrics.start_reconcile("webapp");
        let text = metrics.encode();
        assert!(
            text.contains(r#"devctl_reconciles_in_flight{controller="webapp"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"devctl_reconciles_in_flight_max{controller="webapp"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"controller_runtime_reconcile_total{controller="databasecluster",result="success"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"controller_runtime_reconcile_errors_total{controller="databasecluster"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("controller_runtime_reconcile_time_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains(r#"leader_election_master_status{name="devctl-operator"} 1"#),
            "{text}"
        );
    }
}
