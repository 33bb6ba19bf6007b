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
//!
//! Per DatabaseCluster, from the status each reconcile computes (docs/monitoring.md), in the
//! kube-state-metrics style so the series of one cluster join on `namespace` and `cluster`:
//! `devctl_clusters{namespace,phase}`, `devctl_cluster_phase{namespace,cluster,phase}` (1 for
//! the current phase), `devctl_cluster_created_timestamp_seconds`,
//! `devctl_cluster_desired_replicas`, `devctl_cluster_replicas`,
//! `devctl_cluster_ready_replicas`, `devctl_cluster_replication_lag_bytes{...,pod}`,
//! `devctl_cluster_replication_lag_seconds{...,pod}` (MariaDB),
//! `devctl_cluster_engine_restarts{...,pod}`,
//! `devctl_cluster_last_backup_timestamp_seconds`,
//! `devctl_cluster_next_scheduled_backup_timestamp_seconds`,
//! `devctl_cluster_backup_schedule_interval_seconds`, `devctl_cluster_failovers_total` and
//! `devctl_cluster_last_failover_timestamp_seconds`. A cluster's series go when its
//! finalizer's cleanup runs, and all of them when this replica stops leading (its view of the
//! clusters goes stale; the new leader exports the current one).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use devctl_api::database_cluster::{DatabaseCluster, DatabaseClusterStatus};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets_range};
use prometheus_client::registry::Registry;

use crate::children::compact::{ByNamespace, CompactString};

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
struct RestLatencyLabels {
    host: String,
    verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    name: &'static str,
}

/// A label value of a per-cluster series, kept inline up to 24 bytes: every cluster has
/// half a dozen series, each with its own copy of its labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct LabelText(CompactString);

impl From<&str> for LabelText {
    fn from(text: &str) -> Self {
        Self(CompactString::from(text))
    }
}

impl EncodeLabelValue for LabelText {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, &self.0)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    namespace: LabelText,
    cluster: LabelText,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterPhaseLabels {
    namespace: LabelText,
    cluster: LabelText,
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespacePhaseLabels {
    namespace: LabelText,
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabels {
    namespace: LabelText,
    cluster: LabelText,
    pod: LabelText,
}

/// Gauges of values that are not integers (timestamps, durations).
type FloatGauge = Gauge<f64, AtomicU64>;

/// The per-cluster families. Each cluster's series are set from its status and removed
/// with it, so they live in their own struct next to the bookkeeping that makes removal
/// possible.
#[derive(Default)]
struct ClusterFamilies {
    clusters: Family<NamespacePhaseLabels, Gauge>,
    phase: Family<ClusterPhaseLabels, Gauge>,
    created: Family<ClusterLabels, FloatGauge>,
    desired_replicas: Family<ClusterLabels, Gauge>,
    replicas: Family<ClusterLabels, Gauge>,
    ready_replicas: Family<ClusterLabels, Gauge>,
    lag_bytes: Family<InstanceLabels, Gauge>,
    lag_seconds: Family<InstanceLabels, Gauge>,
    engine_restarts: Family<InstanceLabels, Gauge>,
    last_backup: Family<ClusterLabels, FloatGauge>,
    next_backup: Family<ClusterLabels, FloatGauge>,
    schedule_interval: Family<ClusterLabels, FloatGauge>,
    failovers: Family<ClusterLabels, Counter>,
    last_failover: Family<ClusterLabels, FloatGauge>,
    last_failover_steps: Family<ClusterPhaseLabels, FloatGauge>,
}

/// What was exported for one cluster, so that the next update (or the cleanup) can remove
/// series that no longer apply: label values are not enumerable from a `Family`.
#[derive(Debug, Default)]
struct ExportedCluster {
    phase: Option<&'static str>,
    lag_pods: Vec<String>,
    lag_seconds_pods: Vec<String>,
    restart_pods: Vec<String>,
    /// The schedule the interval was computed for, and the interval: scanning a cron
    /// expression's runs is the one costly step, and the schedule rarely changes.
    schedule: Option<(String, Option<f64>)>,
}

/// What the metrics say of one DatabaseCluster (pure): the inputs of
/// [`Metrics::observe_cluster`] once parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterSnapshot {
    pub phase: Option<&'static str>,
    pub created: Option<f64>,
    pub desired_replicas: i64,
    pub replicas: i64,
    pub ready_replicas: i64,
    /// Reported lag per pod; instances that report none (the primary) have no series.
    pub lag_bytes: Vec<(String, i64)>,
    /// Reported lag in seconds per pod (MariaDB replicas).
    pub lag_seconds: Vec<(String, i64)>,
    /// Engine restarts per pod since its agent started; pods without any have no series.
    pub engine_restarts: Vec<(String, i64)>,
    pub last_backup: Option<f64>,
    pub next_scheduled_backup: Option<f64>,
    /// `spec.backup.schedule` while scheduled backups are on.
    pub schedule: Option<String>,
    pub failover_epoch: u64,
    pub last_failover: Option<f64>,
    /// The last failover's or switchover's step durations in seconds, by
    /// [`FAILOVER_STEPS`] (`status.lastFailover`); a step not reached has none.
    pub last_failover_steps: Vec<(&'static str, f64)>,
}

/// The steps of `status.lastFailover` the `devctl_cluster_last_failover_seconds` gauge
/// measures: `detect` (the lost primary's lock last seen renewed → detected; failovers the
/// lock decided), `elect` (detected → elected), `promote` (elected → promoted), `switch`
/// (promoted → the `-rw` relabel written) and `total` (from the first of those times the
/// record has → the relabel).
pub const FAILOVER_STEPS: [&str; 5] = ["detect", "elect", "promote", "switch", "total"];

/// The step durations of a flight record (pure).
pub fn failover_steps(
    record: &devctl_api::database_cluster::FailoverRecord,
) -> Vec<(&'static str, f64)> {
    // In whole milliseconds until the difference: epoch seconds as f64 would round it.
    let at = |t: Option<&str>| {
        t.and_then(|t| t.parse::<Timestamp>().ok())
            .map(Timestamp::as_millisecond)
    };
    let last_seen = at(record.primary_last_seen_at.as_deref());
    let detected = at(Some(record.detected_at.as_str()));
    let elected = at(record.elected_at.as_deref());
    let promoted = at(record.promoted_at.as_deref());
    let switched = at(record.service_switched_at.as_deref());
    [
        (last_seen, detected),
        (detected, elected),
        (elected, promoted),
        (promoted, switched),
        (last_seen.or(detected), switched),
    ]
    .into_iter()
    .zip(FAILOVER_STEPS)
    .filter_map(|((from, to), step)| Some((step, (to? - from?).max(0) as f64 / 1000.0)))
    .collect()
}

impl ClusterSnapshot {
    /// The snapshot of `db` with the status the reconcile computed for it.
    pub fn of(db: &DatabaseCluster, status: &DatabaseClusterStatus) -> Self {
        let seconds = |t: Option<&str>| {
            t.and_then(|t| t.parse::<Timestamp>().ok())
                .map(|t| t.as_millisecond() as f64 / 1000.0)
        };
        let schedule = db
            .spec
            .backup
            .as_ref()
            .filter(|b| b.enabled)
            .map(|b| b.schedule.clone());
        Self {
            phase: status.phase.map(|p| p.as_str()),
            created: db
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_millisecond() as f64 / 1000.0),
            desired_replicas: i64::from(db.spec.replicas),
            replicas: i64::from(status.replicas),
            ready_replicas: i64::from(status.ready_replicas),
            lag_bytes: status
                .instances
                .iter()
                .filter_map(|i| Some((i.name.clone(), i.lag_bytes?)))
                .collect(),
            lag_seconds: status
                .instances
                .iter()
                .filter_map(|i| Some((i.name.clone(), i.lag_seconds?)))
                .collect(),
            engine_restarts: status
                .instances
                .iter()
                .filter_map(|i| Some((i.name.clone(), i64::from(i.restarts?))))
                .collect(),
            last_backup: seconds(status.last_backup.as_deref()),
            next_scheduled_backup: seconds(status.next_scheduled_backup.as_deref()),
            schedule,
            failover_epoch: status
                .failover_epoch
                .and_then(|e| u64::try_from(e).ok())
                .unwrap_or(0),
            last_failover: seconds(status.last_failover_time.as_deref()),
            last_failover_steps: status
                .last_failover
                .as_ref()
                .map(failover_steps)
                .unwrap_or_default(),
        }
    }
}

/// The longest time between two consecutive runs of `schedule` over the next 31 days (at
/// most 1000 runs), so that "the last backup is older than this" means a run was missed
/// even for schedules with gaps (weekdays only); `None` for an invalid expression.
pub fn schedule_interval(schedule: &str, from: Timestamp) -> Option<f64> {
    use k8s_openapi::jiff::tz::TimeZone;
    let cron = crate::database_cluster::schedule::parse(schedule).ok()?;
    let horizon = from.as_second().saturating_add(31 * 24 * 3600);
    let mut previous = cron
        .find_next_occurrence(&from.to_zoned(TimeZone::UTC), false)
        .ok()?;
    let mut longest: Option<i64> = None;
    for _ in 0..1000 {
        let Ok(next) = cron.find_next_occurrence(&previous, false) else {
            break;
        };
        let gap = next.timestamp().as_second() - previous.timestamp().as_second();
        longest = Some(longest.map_or(gap, |l| l.max(gap)));
        if next.timestamp().as_second() > horizon {
            break;
        }
        previous = next;
    }
    longest.map(|l| l as f64)
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
    rest_latency: Family<RestLatencyLabels, Histogram>,
    cluster_families: ClusterFamilies,
    /// What each cluster exports, by (namespace, name); also serialises updates of the
    /// per-cluster families so the per-phase counts stay consistent.
    exported: std::sync::Mutex<ByNamespace<ExportedCluster>>,
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
        // Finer than the reconcile buckets (ratio ~1.6): a write's latency is what a reconcile's
        // time is made of, and quantiles are interpolated inside a bucket.
        let rest_latency = Family::<RestLatencyLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets_range(0.001, 60.0, 24))
        });
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
            "rest_client_request_duration_seconds",
            "Time from sending a request to the API server to its response's headers, by verb (WATCH for watches: until the stream opened)",
            rest_latency.clone(),
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
        let cluster_families = ClusterFamilies::default();
        register_cluster_families(&mut registry, &cluster_families);
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
            rest_latency,
            cluster_families,
            exported: Default::default(),
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

    /// How long one request took until its response's headers arrived (a refused or fenced
    /// request is not timed: it never reached the API server, or was cut off).
    pub fn rest_latency(&self, host: &str, verb: &'static str, took: Duration) {
        self.rest_latency
            .get_or_create(&RestLatencyLabels {
                host: host.to_string(),
                verb,
            })
            .observe(took.as_secs_f64());
    }

    /// Counts one reconcile of `controller` as running until the guard is dropped.
    pub fn start_reconcile(&self, controller: &'static str) -> InFlight<'_> {
        let labels = ControllerLabels { controller };
        // Zero until the first failure, as controller-runtime exports it: an error rate of a
        // controller that never failed is 0, not an absent series alerts cannot divide by.
        let _ = self.errors.get_or_create(&labels);
        for result in ["success", "error"] {
            let _ = self
                .reconciles
                .get_or_create(&ResultLabels { controller, result });
        }
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
        // The controller's queue series exist from its start, at zero, as client-go's
        // workqueue exports them: a rate over a series that appears only at the first retry
        // sees nothing, and a dashboard shows "no data" instead of 0.
        let queue = QueueLabels { name: controller };
        let _ = self.queue_adds.get_or_create(&queue);
        let _ = self.queue_retries.get_or_create(&queue);
        let _ = self.queue_depth.get_or_create(&queue);
    }

    /// Whether this replica holds the leader lease `name`.
    pub fn set_leader(&self, name: &'static str, leading: bool) {
        self.leader
            .get_or_create(&LeaseLabels { name })
            .set(i64::from(leading));
        if !leading {
            // Its controllers stopped: what it knows of the clusters only gets older, and
            // two replicas exporting them would count each cluster twice.
            self.forget_all_clusters();
        }
    }

    /// Sets the series of the DatabaseCluster `db` from the status a reconcile computed.
    pub fn observe_cluster(&self, db: &DatabaseCluster, status: &DatabaseClusterStatus) {
        let Some(namespace) = db.namespace() else {
            return;
        };
        self.set_cluster(
            &namespace,
            &db.name_any(),
            &ClusterSnapshot::of(db, status),
            Timestamp::now(),
        );
    }

    /// Sets the series of the cluster `namespace/name` to `snapshot` and removes those that
    /// no longer apply (a pod gone, a previous phase).
    pub fn set_cluster(
        &self,
        namespace: &str,
        name: &str,
        snapshot: &ClusterSnapshot,
        now: Timestamp,
    ) {
        let Ok(mut exported) = self.exported.lock() else {
            return;
        };
        let f = &self.cluster_families;
        let state = exported.get_or_insert_with(namespace, name, ExportedCluster::default);
        let labels = ClusterLabels {
            namespace: namespace.into(),
            cluster: name.into(),
        };
        if state.phase != snapshot.phase {
            if let Some(old) = state.phase {
                f.phase.remove(&phase_labels(&labels, old));
                count_phase(&f.clusters, namespace, old, -1);
            }
            if let Some(new) = snapshot.phase {
                f.phase.get_or_create(&phase_labels(&labels, new)).set(1);
                count_phase(&f.clusters, namespace, new, 1);
            }
            state.phase = snapshot.phase;
        }
        set_or_remove(&f.created, &labels, snapshot.created);
        f.desired_replicas
            .get_or_create(&labels)
            .set(snapshot.desired_replicas);
        f.replicas.get_or_create(&labels).set(snapshot.replicas);
        f.ready_replicas
            .get_or_create(&labels)
            .set(snapshot.ready_replicas);
        let instance = |pod: &str| InstanceLabels {
            namespace: namespace.into(),
            cluster: name.into(),
            pod: pod.into(),
        };
        export_per_pod(
            &f.lag_bytes,
            &mut state.lag_pods,
            &snapshot.lag_bytes,
            instance,
        );
        export_per_pod(
            &f.lag_seconds,
            &mut state.lag_seconds_pods,
            &snapshot.lag_seconds,
            instance,
        );
        export_per_pod(
            &f.engine_restarts,
            &mut state.restart_pods,
            &snapshot.engine_restarts,
            instance,
        );
        set_or_remove(&f.last_backup, &labels, snapshot.last_backup);
        set_or_remove(&f.next_backup, &labels, snapshot.next_scheduled_backup);
        let interval = match (&snapshot.schedule, &state.schedule) {
            (Some(want), Some((had, interval))) if want == had => *interval,
            (Some(want), _) => {
                let interval = schedule_interval(want, now);
                state.schedule = Some((want.clone(), interval));
                interval
            }
            (None, _) => {
                state.schedule = None;
                None
            }
        };
        set_or_remove(&f.schedule_interval, &labels, interval);
        let failovers = f.failovers.get_or_create(&labels);
        let counted = failovers.get();
        if snapshot.failover_epoch >= counted {
            failovers.inc_by(snapshot.failover_epoch - counted);
        } else {
            // Only a cluster recreated under the same name starts over; a counter cannot go
            // down, so the series starts again (Prometheus reads it as a reset).
            drop(failovers);
            f.failovers.remove(&labels);
            f.failovers
                .get_or_create(&labels)
                .inc_by(snapshot.failover_epoch);
        }
        set_or_remove(&f.last_failover, &labels, snapshot.last_failover);
        for step in FAILOVER_STEPS {
            let step_labels = phase_labels(&labels, step);
            match snapshot
                .last_failover_steps
                .iter()
                .find(|(s, _)| *s == step)
            {
                Some((_, seconds)) => {
                    f.last_failover_steps
                        .get_or_create(&step_labels)
                        .set(*seconds);
                }
                None => {
                    f.last_failover_steps.remove(&step_labels);
                }
            }
        }
    }

    /// Removes every series of the cluster `namespace/name` (it is being deleted).
    pub fn forget_cluster(&self, namespace: &str, name: &str) {
        let Ok(mut exported) = self.exported.lock() else {
            return;
        };
        if let Some(state) = exported.remove(namespace, name) {
            self.remove_cluster_series(namespace, name, &state);
        }
    }

    fn forget_all_clusters(&self) {
        let Ok(mut exported) = self.exported.lock() else {
            return;
        };
        exported.retain(|namespace, name, state| {
            self.remove_cluster_series(namespace, name, state);
            false
        });
    }

    fn remove_cluster_series(&self, namespace: &str, name: &str, state: &ExportedCluster) {
        let f = &self.cluster_families;
        let labels = ClusterLabels {
            namespace: namespace.into(),
            cluster: name.into(),
        };
        if let Some(phase) = state.phase {
            f.phase.remove(&phase_labels(&labels, phase));
            count_phase(&f.clusters, namespace, phase, -1);
        }
        for (family, pods) in [
            (&f.lag_bytes, &state.lag_pods),
            (&f.lag_seconds, &state.lag_seconds_pods),
            (&f.engine_restarts, &state.restart_pods),
        ] {
            for pod in pods {
                family.remove(&InstanceLabels {
                    namespace: namespace.into(),
                    cluster: name.into(),
                    pod: pod.as_str().into(),
                });
            }
        }
        for family in [&f.desired_replicas, &f.replicas, &f.ready_replicas] {
            family.remove(&labels);
        }
        for family in [
            &f.created,
            &f.last_backup,
            &f.next_backup,
            &f.schedule_interval,
            &f.last_failover,
        ] {
            family.remove(&labels);
        }
        f.failovers.remove(&labels);
        for step in FAILOVER_STEPS {
            f.last_failover_steps.remove(&phase_labels(&labels, step));
        }
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

fn phase_labels(cluster: &ClusterLabels, phase: &'static str) -> ClusterPhaseLabels {
    ClusterPhaseLabels {
        namespace: cluster.namespace.clone(),
        cluster: cluster.cluster.clone(),
        phase,
    }
}

/// Adds `by` to the number of clusters in `phase` in `namespace`; a count that reaches zero
/// goes, so namespaces without clusters leave nothing behind.
fn count_phase(
    clusters: &Family<NamespacePhaseLabels, Gauge>,
    namespace: &str,
    phase: &'static str,
    by: i64,
) {
    let labels = NamespacePhaseLabels {
        namespace: namespace.into(),
        phase,
    };
    let now = clusters.get_or_create(&labels).inc_by(by) + by;
    if now <= 0 {
        clusters.remove(&labels);
    }
}

/// Sets one series per pod of `values` and removes those of pods in `exported` (what the
/// last update set) that `values` no longer has; `exported` then names the pods set now.
fn export_per_pod(
    family: &Family<InstanceLabels, Gauge>,
    exported: &mut Vec<String>,
    values: &[(String, i64)],
    instance: impl Fn(&str) -> InstanceLabels,
) {
    for gone in exported
        .iter()
        .filter(|p| !values.iter().any(|(q, _)| q == *p))
    {
        family.remove(&instance(gone));
    }
    for (pod, value) in values {
        family.get_or_create(&instance(pod)).set(*value);
    }
    *exported = values.iter().map(|(p, _)| p.clone()).collect();
}

fn set_or_remove(
    family: &Family<ClusterLabels, FloatGauge>,
    labels: &ClusterLabels,
    value: Option<f64>,
) {
    match value {
        Some(value) => {
            family.get_or_create(labels).set(value);
        }
        None => {
            family.remove(labels);
        }
    }
}

fn register_cluster_families(registry: &mut Registry, f: &ClusterFamilies) {
    registry.register(
        "devctl_clusters",
        "DatabaseClusters by namespace and status.phase",
        f.clusters.clone(),
    );
    registry.register(
        "devctl_cluster_phase",
        "1 for the status.phase a DatabaseCluster is in (only the current phase has a series)",
        f.phase.clone(),
    );
    registry.register(
        "devctl_cluster_created_timestamp_seconds",
        "When the DatabaseCluster was created (metadata.creationTimestamp), Unix seconds",
        f.created.clone(),
    );
    registry.register(
        "devctl_cluster_desired_replicas",
        "Instances the DatabaseCluster asks for (spec.replicas)",
        f.desired_replicas.clone(),
    );
    registry.register(
        "devctl_cluster_replicas",
        "Instances that exist (status.replicas)",
        f.replicas.clone(),
    );
    registry.register(
        "devctl_cluster_ready_replicas",
        "Instances whose engine accepts connections (status.readyReplicas)",
        f.ready_replicas.clone(),
    );
    registry.register(
        "devctl_cluster_replication_lag_bytes",
        "Bytes of WAL a replica has not replayed yet, as its agent reports (status.instances[].lagBytes; PostgreSQL)",
        f.lag_bytes.clone(),
    );
    registry.register(
        "devctl_cluster_replication_lag_seconds",
        "Seconds a replica's applied transactions are behind the primary's, as its agent reports (status.instances[].lagSeconds; MariaDB Seconds_Behind_Master)",
        f.lag_seconds.clone(),
    );
    registry.register(
        "devctl_cluster_engine_restarts",
        "Times an instance's agent restarted its engine after it exited on its own, since the agent started (status.instances[].restarts); resets when the agent restarts",
        f.engine_restarts.clone(),
    );
    registry.register(
        "devctl_cluster_last_backup_timestamp_seconds",
        "Completion time of the last successful backup (status.lastBackup), Unix seconds",
        f.last_backup.clone(),
    );
    registry.register(
        "devctl_cluster_next_scheduled_backup_timestamp_seconds",
        "When the backup schedule runs next (status.nextScheduledBackup), Unix seconds",
        f.next_backup.clone(),
    );
    registry.register(
        "devctl_cluster_backup_schedule_interval_seconds",
        "Longest gap between two runs of spec.backup.schedule, while scheduled backups are on",
        f.schedule_interval.clone(),
    );
    registry.register(
        "devctl_cluster_failovers",
        "Failovers of the DatabaseCluster (status.failoverEpoch)",
        f.failovers.clone(),
    );
    registry.register(
        "devctl_cluster_last_failover_timestamp_seconds",
        "When the last failover started (status.lastFailoverTime), Unix seconds",
        f.last_failover.clone(),
    );
    registry.register(
        "devctl_cluster_last_failover_seconds",
        "How long each step of the last failover or switchover took (status.lastFailover), by phase: detect, elect, promote, switch, total",
        f.last_failover_steps.clone(),
    );
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
#[path = "metrics_tests.rs"]
mod tests;
