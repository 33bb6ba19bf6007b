//! How the operator binary behaves with many DatabaseClusters on the real control plane:
//! time until every cluster is Ready, the requests and reconciles that took, the latency the
//! operator adds on top of Kubernetes, its memory (RSS) and CPU time, the requests it makes
//! once converged (idle, health checks included) and after a restart (should be no writes).
//!
//! `cargo bench -p devctl-operator --bench scale -- <clusters>` (default 100). Results and the
//! method are recorded in docs/performance.md.
//!
//! The operator runs with `--health-requeue-seconds` set to about how long the control plane
//! takes to bring N clusters up (0.35 s per cluster, at least 30 s: 350 s for 1,000), so
//! health checks do not inflate the converge figures, and the idle phase lasts past it, so
//! every cluster's health check runs in it; its metrics endpoint is on a free
//! loopback port; the bench reads `/metrics` (Prometheus text) over plain HTTP/1.0. Sources:
//! *audit* = the API server's audit log, requests of the operator's user only; *metrics* =
//! `rest_client_requests_total` (every request the operator sent, by method and status code;
//! writes are POST, PUT, PATCH and DELETE), `controller_runtime_reconcile_total` and
//! `controller_runtime_reconcile_time_seconds` of the operator process; */proc* = `VmRSS`,
//! `VmHWM` and user + system CPU time of the operator process.
//!
//! Every printed figure (`name  value`):
//! - `clusters`: N, created before the operator starts, as its mutating webhook admits them
//!   (the engine's requests and the finalizer filled in; `DEVCTL_BENCH_WEBHOOKS=off` creates
//!   them as an install without webhooks does, leaving the finalizer to the first reconcile).
//! - `all Ready after`: operator start until the bench's DatabaseCluster watch has seen every
//!   cluster with condition `Ready=True`.
//! - `operator CPU`: /proc, CPU seconds from start to convergence and during the idle phase.
//! - `operator RSS`: /proc, after the idle phase (now and peak); `operator RSS at converge`:
//!   the same when every cluster had become Ready.
//! - `writes while idle`: audit, write verbs during the idle phase (should be 0); any are
//!   listed by verb and resource in `writes while idle by kind`.
//! - `converge requests`, `… per cluster`, `converge writes`, `… per cluster`,
//!   `converge requests by method`, `converge 5xx`, `converge 429`, `converge 403` (the
//!   operator runs under the generated least-privilege ClusterRole, as installed),
//!   `converge request errors` (no response): metrics, snapshot taken as soon as every
//!   cluster is Ready.
//! - `converge reconciles databasecluster` (by result, and per cluster) and
//!   `converge reconciles all controllers`: metrics, same snapshot.
//! - `converge reconcile p50` / `p99`: metrics, quantiles of the DatabaseCluster controller's
//!   reconcile-time histogram in the same snapshot (linear interpolation inside a bucket).
//! - `converge PATCH latency p50 / p99` (and `POST`, `GET`): metrics, quantiles of the
//!   operator's `rest_client_request_duration_seconds` for that verb (time to the response's
//!   headers, as seen by the operator: queueing in the API server and in the operator's own
//!   runtime included), same snapshot; a reconcile's time is mostly a few rounds of these.
//! - `operator latency p50` / `p99` / `max`: per cluster, the moment the bench saw it Ready
//!   minus the moment it saw its StatefulSet ready (`status.readyReplicas >= spec.replicas`,
//!   at least one replica); both seen through concurrent watches, no polling. Negative values
//!   and clusters whose StatefulSet was not yet seen ready count as 0 (`operator latency
//!   samples` says how many).
//! - `idle seconds`, `idle requests`, `idle writes`, `idle reconciles databasecluster`:
//!   metrics, differences over the idle phase, which lasts max(20 s, health requeue + 15 s)
//!   so that every cluster's health check runs at least once.
//! - `restart stop`: how the first process was stopped (SIGTERM, SIGKILL only if it had not
//!   exited within 30 s) and how long that took.
//! - `restart reconciles reached after`: start of the second process until its
//!   `controller_runtime_reconcile_total{controller="databasecluster"}` reaches N (polled every
//!   500 ms); the bench then waits 10 s more.
//! - `restart writes (audit)`: audit, operator writes from the restart until then (should be
//!   0), listed in `restart writes by kind`; `restart requests`, `restart writes`,
//!   `restart GET requests`, `restart requests by method`, `restart 5xx`, `restart 429`,
//!   `restart 403`:
//!   metrics of the second process.
//! - `restart operator CPU` / `restart operator RSS`: /proc, the second process at that point.
//! - `restart control plane CPU`: /proc, CPU seconds kube-apiserver and etcd used from the
//!   first process's stop until then (the restart's reads, plus the control plane's own
//!   background work over those seconds).
//! - `calibration CPU`: thread CPU time of a fixed piece of work like the operator's (a pod's
//!   JSON decoded into k8s-openapi's `Pod` and encoded again, 50,000 times, in the bench
//!   process), before the operator starts and after it stopped: a reading of the machine's
//!   speed at those moments. It moved 2.2× within one hour on the two-vCPU bench VM
//!   (docs/performance.md, twelfth look); CPU and latency figures of runs whose calibrations
//!   differ do not compare.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_testenv::audit::Request;
use devctl_testenv::{AuditLog, AuditMark, Cluster, ClusterOptions, Options};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The integration tests' set-up: the bench's operator gets the same generated rights.
#[path = "../tests/support/mod.rs"]
mod support;

const OPERATOR_USER: &str = "devctl-operator-bench";
/// The `run_controller` name of the DatabaseCluster controller (its `controller` label).
const CONTROLLER: &str = "databasecluster";
/// `--health-requeue-seconds` for `clusters`: about the time to bring them all up.
fn health_requeue(clusters: usize) -> Duration {
    Duration::from_secs(((clusters as f64 * 0.35) as u64).max(30))
}
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(600);
const RESTART_TIMEOUT: Duration = Duration::from_secs(300);
const RESTART_SETTLE: Duration = Duration::from_secs(10);
const STOP_GRACE: Duration = Duration::from_secs(30);
const REQUESTS: &str = "rest_client_requests_total";
const RECONCILES: &str = "controller_runtime_reconcile_total";
const RECONCILE_BUCKETS: &str = "controller_runtime_reconcile_time_seconds_bucket";
const REQUEST_LATENCY_BUCKETS: &str = "rest_client_request_duration_seconds_bucket";
const WRITE_METHODS: [&str; 4] = ["POST", "PUT", "PATCH", "DELETE"];

// ---------------------------------------------------------------------------------------
// /proc

fn proc_status(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0))
        })
        .unwrap_or(0)
}

/// Rounds of the calibration work ([`calibrate`]).
const CALIBRATION_ROUNDS: usize = 50_000;

fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Thread CPU time of a fixed piece of work like the operator's: a running pod's JSON
/// decoded into `Pod` and encoded again [`CALIBRATION_ROUNDS`] times.
fn calibrate() -> Result<Duration, Error> {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "db-0", "namespace": "scale", "resourceVersion": "123456",
            "uid": "0b7d3c1e-5f0a-4c6e-9d2b-000000000001",
            "labels": { "app.kubernetes.io/name": "postgresql", "app.kubernetes.io/instance": "db",
                        "app.kubernetes.io/managed-by": "devctl", "devctl.io/role": "primary",
                        "controller-revision-hash": "db-5d8f7c9b4", "apps.kubernetes.io/pod-index": "0",
                        "statefulset.kubernetes.io/pod-name": "db-0" },
            "annotations": { "devctl.io/status": "{\"role\":\"primary\",\"ready\":true,\"lsn\":\"0/3000060\"}" },
            "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                  "uid": "0b7d3c1e-5f0a-4c6e-9d2b-000000000002", "controller": true }] },
        "spec": { "containers": [{ "name": "postgres", "image": "postgres:16.2",
                                   "ports": [{ "containerPort": 5432, "name": "postgres" }],
                                   "env": [{ "name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata" }] }],
                  "nodeName": "kwok-node-0" },
        "status": { "phase": "Running", "podIP": "10.0.0.12",
                    "conditions": [{ "type": "Ready", "status": "True", "lastTransitionTime": "2026-12-03T16:00:00Z" }],
                    "containerStatuses": [{ "name": "postgres", "ready": true, "restartCount": 0,
                                            "image": "postgres:16.2", "imageID": "",
                                            "state": { "running": { "startedAt": "2026-12-03T16:00:00Z" } } }] }
    });
    let text = serde_json::to_vec(&pod)?;
    let started = thread_cpu_time();
    let mut encoded = 0;
    for _ in 0..CALIBRATION_ROUNDS {
        let decoded: k8s_openapi::api::core::v1::Pod = serde_json::from_slice(&text)?;
        encoded += serde_json::to_vec(&decoded)?.len();
    }
    std::hint::black_box(encoded);
    Ok(thread_cpu_time() - started)
}

/// User + system CPU seconds of `pid`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// CPU seconds used so far by the API server and etcd, by name.
fn control_plane_cpu(cluster: &Cluster) -> Vec<(String, f64)> {
    let pids = cluster.pids();
    ["kube-apiserver", "etcd"]
        .into_iter()
        .map(|name| {
            let seconds = pids
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, pid)| cpu_seconds(*pid))
                .sum();
            (name.to_string(), seconds)
        })
        .collect()
}

/// CPU time and memory of a process at one moment.
#[derive(Debug, Clone, Copy)]
struct Usage {
    cpu_seconds: f64,
    rss_kib: u64,
    peak_kib: u64,
}

impl Usage {
    fn of(pid: u32) -> Self {
        Self {
            cpu_seconds: cpu_seconds(pid),
            rss_kib: proc_status(pid, "VmRSS:"),
            peak_kib: proc_status(pid, "VmHWM:"),
        }
    }

    /// "X MiB now, Y MiB peak".
    fn memory(&self) -> String {
        format!(
            "{:.1} MiB now, {:.1} MiB peak",
            self.rss_kib as f64 / 1024.0,
            self.peak_kib as f64 / 1024.0
        )
    }
}

// ---------------------------------------------------------------------------------------
// The operator process

/// A running `devctl-operator` with its metrics endpoint on a loopback port.
struct Operator {
    child: tokio::process::Child,
    pid: u32,
    metrics: SocketAddr,
    log: PathBuf,
}

/// How a process was stopped.
struct Stopped {
    graceful: bool,
    took: Duration,
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.graceful {
            "SIGTERM"
        } else {
            "SIGKILL (no exit within the SIGTERM grace)"
        };
        write!(f, "{how}, exited after {:.2} s", self.took.as_secs_f64())
    }
}

/// Changes `db` as the operator's mutating webhook admits a create (its handler's
/// operations, applied here because the clusters exist before the operator that serves the
/// webhook starts; tests/webhooks.rs covers the path through the API server).
fn admit(db: &mut serde_json::Value) -> Result<(), Error> {
    let cluster: DatabaseCluster = serde_json::from_value(db.clone())?;
    let operations = devctl_operator::webhook::handlers::mutation(
        &cluster,
        &kube::core::admission::Operation::Create,
    );
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(operations))?;
    json_patch::patch(db, &patch)?;
    Ok(())
}

/// A loopback address no one listens on right now.
fn free_loopback_address() -> Result<SocketAddr, Error> {
    let port = devctl_testenv::process::free_port()
        .map_err(|e| format!("finding a free loopback port: {e}"))?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

impl Operator {
    fn start(
        kubeconfig: &Path,
        namespace: &str,
        log: PathBuf,
        health_requeue: Duration,
    ) -> Result<Self, Error> {
        let metrics = free_loopback_address()?;
        let stderr =
            std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        // DEVCTL_BENCH_OPERATOR: another build of the operator (e.g. one with frame pointers
        // for `perf record -g -p <pid>`).
        let binary = std::env::var_os("DEVCTL_BENCH_OPERATOR")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_devctl-operator").into());
        let child = tokio::process::Command::new(binary)
            // The bench measures the controllers; webhooks have their own tests.
            .env("DEVCTL_WEBHOOK_BIND_ADDRESS", "off")
            // DEVCTL_BENCH_LOG (e.g. `devctl_operator::children=debug`) to see why reconciles run.
            .env(
                "DEVCTL_LOG",
                std::env::var("DEVCTL_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", namespace])
            .args(["--metrics-bind-address", &metrics.to_string()])
            .args([
                "--health-requeue-seconds",
                &health_requeue.as_secs().to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting the operator: {e}"))?;
        let pid = child.id().ok_or("the operator exited at once")?;
        Ok(Self {
            child,
            pid,
            metrics,
            log,
        })
    }

    fn usage(&self) -> Usage {
        Usage::of(self.pid)
    }

    fn scrape(&self) -> Result<Metrics, Error> {
        scrape(self.metrics)
            .map_err(|e| format!("scraping http://{}/metrics: {e}", self.metrics).into())
    }

    /// Resolves when the process exits, with an error naming its log.
    async fn exited(&mut self) -> Error {
        let status = self.child.wait().await;
        format!(
            "the operator exited ({status:?}); see {}",
            self.log.display()
        )
        .into()
    }

    /// SIGTERM, then SIGKILL if it has not exited within [`STOP_GRACE`].
    async fn stop(mut self) -> Result<Stopped, Error> {
        let started = Instant::now();
        // SAFETY: signalling the child we started and have not reaped yet.
        let signalled = unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGTERM) } == 0;
        let graceful = signalled
            && matches!(
                tokio::time::timeout(STOP_GRACE, self.child.wait()).await,
                Ok(Ok(_))
            );
        if !graceful {
            self.child
                .kill()
                .await
                .map_err(|e| format!("killing the operator: {e}"))?;
        }
        Ok(Stopped {
            graceful,
            took: started.elapsed(),
        })
    }

    /// Polls `/metrics` every 500 ms until the DatabaseCluster controller has reconciled
    /// `count` times (over all results); returns how long that took from `since`.
    async fn wait_for_reconciles(
        &mut self,
        count: usize,
        since: Instant,
    ) -> Result<Duration, Error> {
        let mut reached = 0.0;
        let mut last_error = None;
        loop {
            match self.scrape() {
                Ok(metrics) => {
                    reached = metrics.reconciles(Some(CONTROLLER));
                    if reached >= count as f64 {
                        return Ok(since.elapsed());
                    }
                }
                // Not listening yet, most likely.
                Err(e) => last_error = Some(e),
            }
            if since.elapsed() > RESTART_TIMEOUT {
                let error = last_error.map_or(String::new(), |e| format!(" (last error: {e})"));
                return Err(format!(
                    "the restarted operator reached {reached} of {count} {CONTROLLER} \
                     reconciles in {RESTART_TIMEOUT:?}{error}; see {}",
                    self.log.display()
                )
                .into());
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                error = self.exited() => return Err(error),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Prometheus metrics

/// GET `/metrics` from `address` over HTTP/1.0 (the server closes the connection after the
/// response, so the body is everything after the headers).
fn scrape(address: SocketAddr) -> Result<Metrics, Error> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or("no end of the headers in the response")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("unexpected response {status:?}").into());
    }
    Metrics::parse(body)
}

/// One sample: `name{labels} value`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// One scrape of the operator's metrics.
#[derive(Debug)]
struct Metrics {
    samples: Vec<Sample>,
}

fn label<'a>(labels: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    labels.get(key).map_or("", String::as_str)
}

/// A sample value or `le` bound: a float, `+Inf`, `-Inf` or `NaN`.
fn parse_value(text: &str) -> Result<f64, Error> {
    match text {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => text
            .parse()
            .map_err(|e| format!("bad value {text:?}: {e}").into()),
    }
}

/// The labels after a sample's `{` up to the closing `}`, and the rest of the line.
fn parse_labels(text: &str) -> Result<(BTreeMap<String, String>, &str), Error> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let (key, after) = rest
            .split_once("=\"")
            .ok_or_else(|| format!("bad labels {text:?}"))?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("unterminated label in {text:?}").into()),
                },
                Some((_, c)) => value.push(c),
                None => return Err(format!("unterminated label in {text:?}").into()),
            }
        };
        labels.insert(key.trim().to_string(), value);
        rest = &after[end + 1..];
    }
}

impl Metrics {
    /// Parses the Prometheus / OpenMetrics text format: comments and `# EOF` are skipped,
    /// as are timestamps and exemplars after a value.
    fn parse(text: &str) -> Result<Self, Error> {
        let mut samples = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let split = line
                .find(['{', ' '])
                .ok_or_else(|| format!("no value in {line:?}"))?;
            let (name, rest) = line.split_at(split);
            let (labels, rest) = match rest.strip_prefix('{') {
                Some(inner) => parse_labels(inner)?,
                None => (BTreeMap::new(), rest),
            };
            let value = rest
                .split_whitespace()
                .next()
                .ok_or_else(|| format!("no value in {line:?}"))?;
            samples.push(Sample {
                name: name.to_string(),
                labels,
                value: parse_value(value)?,
            });
        }
        Ok(Self { samples })
    }

    /// The sum of the samples of `name` whose labels `keep` accepts.
    fn sum(&self, name: &str, keep: impl Fn(&BTreeMap<String, String>) -> bool) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && keep(&s.labels))
            .map(|s| s.value)
            .fold(0.0, |total, value| total + value)
    }

    /// The samples of `name` summed by the value of label `key`.
    fn sum_by(
        &self,
        name: &str,
        key: &str,
        keep: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, f64> {
        let mut sums = BTreeMap::new();
        for s in self
            .samples
            .iter()
            .filter(|s| s.name == name && keep(&s.labels))
        {
            *sums.entry(label(&s.labels, key).to_string()).or_insert(0.0) += s.value;
        }
        sums
    }

    /// Every request sent to the API server.
    fn requests(&self) -> f64 {
        self.sum(REQUESTS, |_| true)
    }

    /// Requests with a write method.
    fn writes(&self) -> f64 {
        self.sum(REQUESTS, |l| WRITE_METHODS.contains(&label(l, "method")))
    }

    /// Requests whose status `code` matches.
    fn by_code(&self, code: impl Fn(&str) -> bool) -> f64 {
        self.sum(REQUESTS, |l| code(label(l, "code")))
    }

    fn server_errors(&self) -> f64 {
        self.by_code(|c| c.parse::<u16>().is_ok_and(|c| c >= 500))
    }

    /// Requests the operator's rights did not allow.
    fn forbidden(&self) -> f64 {
        self.by_code(|c| c == "403")
    }

    fn throttled(&self) -> f64 {
        self.by_code(|c| c == "429")
    }

    /// Requests that got no response (transport errors).
    fn failed(&self) -> f64 {
        self.by_code(|c| c == "<error>")
    }

    fn by_method(&self) -> BTreeMap<String, f64> {
        self.sum_by(REQUESTS, "method", |_| true)
    }

    /// Reconciles of `controller` (all controllers for `None`), over all results.
    fn reconciles(&self, controller: Option<&str>) -> f64 {
        self.sum(RECONCILES, |l| {
            controller.is_none_or(|c| label(l, "controller") == c)
        })
    }

    fn reconciles_by_result(&self, controller: &str) -> BTreeMap<String, f64> {
        self.sum_by(RECONCILES, "result", |l| {
            label(l, "controller") == controller
        })
    }

    /// The reconcile-time histogram of `controller`: (upper bound, cumulative count), by bound.
    fn reconcile_buckets(&self, controller: &str) -> Result<Vec<(f64, f64)>, Error> {
        self.buckets(RECONCILE_BUCKETS, |l| label(l, "controller") == controller)
    }

    /// The request-latency histogram of `verb`, summed over hosts.
    fn request_buckets(&self, verb: &str) -> Result<Vec<(f64, f64)>, Error> {
        self.buckets(REQUEST_LATENCY_BUCKETS, |l| label(l, "verb") == verb)
    }

    /// The buckets of histogram `name` over the series `keep` accepts, summed by bound:
    /// (upper bound, cumulative count), sorted by bound.
    fn buckets(
        &self,
        name: &str,
        keep: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> Result<Vec<(f64, f64)>, Error> {
        let mut by_bound: Vec<(f64, f64)> = Vec::new();
        for s in self
            .samples
            .iter()
            .filter(|s| s.name == name && keep(&s.labels))
        {
            let bound = parse_value(label(&s.labels, "le"))?;
            match by_bound.iter_mut().find(|(b, _)| *b == bound) {
                Some((_, count)) => *count += s.value,
                None => by_bound.push((bound, s.value)),
            }
        }
        by_bound.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(by_bound)
    }
}

/// A quantile of a histogram.
#[derive(Debug, Clone, Copy)]
enum Quantile {
    Seconds(f64),
    /// In the `+Inf` bucket: above the last finite bound.
    Above(f64),
}

impl fmt::Display for Quantile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Seconds(s) => write!(f, "{:.1} ms", s * 1000.0),
            Self::Above(s) => write!(f, "> {:.1} ms", s * 1000.0),
        }
    }
}

/// The `q` quantile of a cumulative histogram (`buckets` sorted by bound, the last `+Inf`),
/// as Prometheus' `histogram_quantile` does: find the bucket holding rank `q × count` and
/// interpolate linearly between its lower bound (the previous bound, 0 for the first) and its
/// upper bound. `None` for an empty histogram.
fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<Quantile> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(bound, cumulative) in buckets {
        if cumulative >= rank {
            if bound.is_infinite() {
                return Some(Quantile::Above(lower));
            }
            let share = if cumulative > below {
                (rank - below) / (cumulative - below)
            } else {
                1.0
            };
            return Some(Quantile::Seconds(lower + (bound - lower) * share));
        }
        (lower, below) = (bound, cumulative);
    }
    None
}

fn show_quantile(q: Option<Quantile>) -> String {
    q.map_or("n/a (none)".into(), |q| q.to_string())
}

/// "GET 12, PATCH 3".
fn show_counts<V: fmt::Display>(counts: &BTreeMap<String, V>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------------------------------
// Watches

fn ready(db: &DatabaseCluster) -> bool {
    db.status.as_ref().is_some_and(|s| {
        devctl_api::conditions::find(&s.conditions, "Ready").is_some_and(|c| c.status == "True")
    })
}

/// At least one replica, and all of them ready.
fn stateful_set_ready(sts: &StatefulSet) -> bool {
    let wanted = sts.spec.replicas.unwrap_or(1);
    let ready = sts
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    wanted >= 1 && ready >= wanted
}

/// The DatabaseCluster a StatefulSet belongs to: its owner, else its own name (the operator
/// names the StatefulSet after the cluster, `Names::stateful_set`).
fn owning_cluster(sts: &StatefulSet) -> String {
    sts.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "DatabaseCluster")
        .map(|o| o.name.clone())
        .or_else(|| sts.metadata.name.clone())
        .unwrap_or_default()
}

enum Seen {
    Cluster(Box<DatabaseCluster>),
    StatefulSet(Box<StatefulSet>),
}

/// When the bench first saw each cluster Ready and each cluster's StatefulSet ready.
#[derive(Default)]
struct Convergence {
    cluster_ready: BTreeMap<String, Instant>,
    stateful_set_ready: BTreeMap<String, Instant>,
}

impl Convergence {
    /// Per cluster, cluster Ready − StatefulSet ready, clamped at 0; and how many were
    /// clamped (cluster seen Ready first, or its StatefulSet not seen ready at all).
    fn latencies(&self) -> (Vec<Duration>, usize) {
        let mut clamped = 0;
        let mut latencies: Vec<Duration> = self
            .cluster_ready
            .iter()
            .map(|(name, &ready)| match self.stateful_set_ready.get(name) {
                Some(&sts) if sts <= ready => ready - sts,
                _ => {
                    clamped += 1;
                    Duration::ZERO
                }
            })
            .collect();
        latencies.sort();
        (latencies, clamped)
    }
}

/// The `q` quantile of sorted `values` by nearest rank.
fn percentile(q: f64, sorted: &[Duration]) -> Option<Duration> {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

fn show_ms(d: Option<Duration>) -> String {
    d.map_or("n/a".into(), |d| {
        format!("{:.0} ms", d.as_secs_f64() * 1000.0)
    })
}

/// Follows both watches until `count` clusters are Ready, or fails if the operator exits.
async fn converge(
    events: &mut BoxStream<'static, Result<Seen, watcher::Error>>,
    operator: &mut Operator,
    count: usize,
    seen: &mut Convergence,
) -> Result<(), Error> {
    while seen.cluster_ready.len() < count {
        let event = tokio::select! {
            event = events.next() => event.ok_or("the watches ended")?,
            error = operator.exited() => return Err(error),
        };
        match event {
            // The watcher retries with backoff; say why, and go on.
            Err(e) => eprintln!("watch error: {e}"),
            Ok(Seen::Cluster(db)) if ready(&db) => {
                let name = db.metadata.name.clone().unwrap_or_default();
                seen.cluster_ready.entry(name).or_insert_with(Instant::now);
            }
            Ok(Seen::StatefulSet(sts)) if stateful_set_ready(&sts) => {
                seen.stateful_set_ready
                    .entry(owning_cluster(&sts))
                    .or_insert_with(Instant::now);
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Audit log

/// The operator's write requests logged since `mark`.
fn operator_writes(audit: &AuditLog, mark: AuditMark) -> Result<Vec<Request>, Error> {
    Ok(audit
        .requests_since(mark)?
        .into_iter()
        .filter(|r| r.user == OPERATOR_USER && r.is_write())
        .collect())
}

/// "patch statefulsets 2, update databaseclusters/status 1".
fn by_kind(requests: &[Request]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in requests {
        *counts
            .entry(format!("{} {}", r.verb, r.full_resource()))
            .or_insert(0) += 1;
    }
    counts
}

fn row(name: &str, value: impl fmt::Display) {
    println!("{name:<40}{value}");
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let count: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let per_cluster = |v: f64| format!("{:.1}", v / count as f64);
    let nodes = count.div_ceil(100).max(1) + 1;
    let cluster = Cluster::start_with(ClusterOptions {
        control_plane: Options {
            audit: true,
            ..Options::default()
        },
        nodes,
        ..ClusterOptions::default()
    })
    .await?;
    cluster.install_crds(&devctl_api::crds()).await?;
    let namespace = cluster.create_namespace("scale").await?;
    let client = cluster.client().await?;
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let admitted = std::env::var("DEVCTL_BENCH_WEBHOOKS").as_deref() != Ok("off");
    for i in 0..count {
        let mut db = json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
            "metadata": { "name": format!("db-{i}") },
            "spec": { "version": "16.2", "storage": { "size": "1Gi" } }
        });
        if admitted {
            admit(&mut db)?;
        }
        let db: DatabaseCluster = serde_json::from_value(db)?;
        dbs.create(&PostParams::default(), &db).await?;
    }
    let audit = cluster.audit_log().ok_or("no audit log")?;

    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("operator.kubeconfig");
    // The generated least-privilege rights, as `devctl operator install` grants them: a
    // request they do not allow shows up as `converge 403`, not as a passing bench.
    support::bind_rules(&cluster, OPERATOR_USER, devctl_operator::manifests::RULES).await;
    devctl_testenv::kubeconfig::write(&cluster.kubeconfig_for(OPERATOR_USER, &[])?, &kubeconfig)?;

    // Converge: both watches, merged, until every cluster is Ready.
    let clusters = watcher(dbs.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .map(|e| e.map(|db| Seen::Cluster(Box::new(db))));
    let sets = watcher(stateful_sets, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .map(|e| e.map(|sts| Seen::StatefulSet(Box::new(sts))));
    let mut events = futures::stream::select(clusters, sets).boxed();
    let calibration_before = calibrate()?;
    let started = Instant::now();
    let mut operator = Operator::start(
        &kubeconfig,
        &namespace,
        dir.path().join("operator.log"),
        health_requeue(count),
    )?;
    let mut seen = Convergence::default();
    tokio::time::timeout(
        CONVERGE_TIMEOUT,
        converge(&mut events, &mut operator, count, &mut seen),
    )
    .await
    .map_err(|_| {
        format!(
            "only {} of {count} clusters Ready after {CONVERGE_TIMEOUT:?}",
            seen.cluster_ready.len()
        )
    })??;
    let converged = started.elapsed();
    let at_converge = operator.scrape()?;
    let usage_converge = operator.usage();
    drop(events);
    let (latencies, clamped) = seen.latencies();
    let buckets = at_converge.reconcile_buckets(CONTROLLER)?;

    // Idle long enough for every cluster's health requeue to fire at least once.
    let idle = Duration::from_secs(20).max(health_requeue(count) + Duration::from_secs(15));
    let idle_mark = audit.mark();
    tokio::time::sleep(idle).await;
    let idle_writes = operator_writes(audit, idle_mark)?;
    let after_idle = operator.scrape()?;
    let usage_idle = operator.usage();

    // Restart: stop, start again, wait for a reconcile per cluster, then 10 s more.
    let stopped = operator.stop().await?;
    let restart_mark = audit.mark();
    let control_plane_before = control_plane_cpu(&cluster);
    let restarted = Instant::now();
    let mut operator = Operator::start(
        &kubeconfig,
        &namespace,
        dir.path().join("operator-restart.log"),
        health_requeue(count),
    )?;
    let reconciled_after = operator.wait_for_reconciles(count, restarted).await?;
    tokio::time::sleep(RESTART_SETTLE).await;
    let restart_writes = operator_writes(audit, restart_mark)?;
    let control_plane_restart: Vec<(String, f64)> = control_plane_cpu(&cluster)
        .into_iter()
        .zip(&control_plane_before)
        .map(|((name, after), (_, before))| (name, after - before))
        .collect();
    let after_restart = operator.scrape()?;
    let usage_restart = operator.usage();
    operator.stop().await?;
    let calibration_after = calibrate()?;

    // One instance: ConfigMap, Secret, headless and read-write Services, StatefulSet.
    row(
        "clusters",
        format!(
            "{count} (one instance each; {})",
            if admitted {
                "admitted as by the mutating webhook"
            } else {
                "no webhooks"
            }
        ),
    );
    row(
        "all Ready after",
        format!("{:.1} s", converged.as_secs_f64()),
    );
    row(
        "operator CPU",
        format!(
            "{:.2} s to converge, {:.2} s in {} s idle",
            usage_converge.cpu_seconds,
            usage_idle.cpu_seconds - usage_converge.cpu_seconds,
            idle.as_secs()
        ),
    );
    row("operator RSS", usage_idle.memory());
    row("operator RSS at converge", usage_converge.memory());
    row("writes while idle", idle_writes.len());
    if !idle_writes.is_empty() {
        row(
            "writes while idle by kind",
            show_counts(&by_kind(&idle_writes)),
        );
    }

    let requests = at_converge.requests();
    let writes = at_converge.writes();
    row("converge requests", requests);
    row("converge requests per cluster", per_cluster(requests));
    row("converge writes", writes);
    row("converge writes per cluster", per_cluster(writes));
    row(
        "converge requests by method",
        show_counts(&at_converge.by_method()),
    );
    row("converge 5xx", at_converge.server_errors());
    row("converge 429", at_converge.throttled());
    row("converge 403", at_converge.forbidden());
    row("converge request errors", at_converge.failed());
    let reconciles = at_converge.reconciles(Some(CONTROLLER));
    row(
        &format!("converge reconciles {CONTROLLER}"),
        format!(
            "{reconciles} ({})",
            show_counts(&at_converge.reconciles_by_result(CONTROLLER))
        ),
    );
    row("converge reconciles per cluster", per_cluster(reconciles));
    row(
        "converge reconciles all controllers",
        at_converge.reconciles(None),
    );
    row(
        "converge reconcile p50",
        show_quantile(quantile(0.5, &buckets)),
    );
    row(
        "converge reconcile p99",
        show_quantile(quantile(0.99, &buckets)),
    );
    for verb in ["PATCH", "POST", "GET"] {
        let requests = at_converge.request_buckets(verb)?;
        row(
            &format!("converge {verb} latency p50 / p99"),
            format!(
                "{} / {}",
                show_quantile(quantile(0.5, &requests)),
                show_quantile(quantile(0.99, &requests))
            ),
        );
    }
    row("operator latency p50", show_ms(percentile(0.5, &latencies)));
    row(
        "operator latency p99",
        show_ms(percentile(0.99, &latencies)),
    );
    row("operator latency max", show_ms(latencies.last().copied()));
    row(
        "operator latency samples",
        format!("{} ({clamped} counted as 0)", latencies.len()),
    );

    row("idle seconds", idle.as_secs());
    row(
        "idle requests",
        after_idle.requests() - at_converge.requests(),
    );
    row("idle writes", after_idle.writes() - at_converge.writes());
    row(
        &format!("idle reconciles {CONTROLLER}"),
        after_idle.reconciles(Some(CONTROLLER)) - at_converge.reconciles(Some(CONTROLLER)),
    );

    let restart_methods = after_restart.by_method();
    row("restart stop", stopped);
    row(
        "restart reconciles reached after",
        format!("{:.1} s", reconciled_after.as_secs_f64()),
    );
    row("restart writes (audit)", restart_writes.len());
    if !restart_writes.is_empty() {
        row(
            "restart writes by kind",
            show_counts(&by_kind(&restart_writes)),
        );
    }
    row("restart requests", after_restart.requests());
    row("restart writes", after_restart.writes());
    row(
        "restart GET requests",
        restart_methods.get("GET").copied().unwrap_or(0.0),
    );
    row("restart requests by method", show_counts(&restart_methods));
    row("restart 5xx", after_restart.server_errors());
    row("restart 429", after_restart.throttled());
    row("restart 403", after_restart.forbidden());
    row(
        "restart operator CPU",
        format!("{:.2} s", usage_restart.cpu_seconds),
    );
    row("restart operator RSS", usage_restart.memory());
    row(
        "restart control plane CPU",
        control_plane_restart
            .iter()
            .map(|(name, seconds)| format!("{name} {seconds:.2} s"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    row(
        "calibration CPU",
        format!(
            "{} ms before, {} ms after (fixed work, bench process)",
            calibration_before.as_millis(),
            calibration_after.as_millis()
        ),
    );
    if std::env::var_os("DEVCTL_BENCH_LOG").is_some() {
        row("operator logs kept in", dir.keep().display());
    }
    Ok(())
}
