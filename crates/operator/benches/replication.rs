//! A 3-instance PostgreSQL cluster on process-backed pods (real PostgreSQL 15 behind each
//! kwok pod, `devctl-agent` supervising it): time from apply to `Ready`, replication lag
//! under a `pgbench` write load (as the primary sees it and as the replicas report it), the
//! agents' memory, and the operator's reconciles of the idle cluster afterwards (agents
//! rewrite their reports once a minute; that heartbeat must not wake the operator).
//!
//! `cargo build --release -p devctl-agent && cargo bench -p devctl-operator --bench replication -- [seconds]`
//! (pgbench runs `seconds`, default 30; `DEVCTL_BENCH_IDLE_SECONDS` the idle phase, default
//! 150). Results and the machine are in docs/performance.md.

use std::time::{Duration, Instant};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::InstanceStatus;
use devctl_testenv::{Cluster, ClusterOptions, PodBacking};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index]
}

/// Resident memory of `pid` in MiB, from /proc.
fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(30);
    let cluster = Cluster::start_with(ClusterOptions {
        pods: PodBacking::processes()?,
        ..ClusterOptions::default()
    })
    .await?;
    cluster.install_crds(&devctl_api::crds()).await?;
    let namespace = cluster.create_namespace("replication").await?;
    let client = cluster.client().await?;
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let settings = devctl_operator::Settings::default();
    let metrics = settings.metrics.clone();
    tokio::spawn({
        let client = client.clone();
        let namespace = namespace.clone();
        async move {
            let _ = devctl_operator::run(client, &[namespace], settings, "bench", stopped).await;
        }
    });

    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let db: DatabaseCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "bench" },
        "spec": { "engine": "postgres", "version": "16.2", "replicas": 3,
                  "storage": { "size": "1Gi" }, "backup": { "enabled": false } }
    }))?;
    let started = Instant::now();
    dbs.create(&PostParams::default(), &db).await?;
    let ready = await_condition(dbs.clone(), "bench", |db: Option<&DatabaseCluster>| {
        db.and_then(|d| d.status.as_ref()).is_some_and(|s| {
            s.ready_replicas == 3
                && devctl_api::conditions::find(&s.conditions, "Ready")
                    .is_some_and(|c| c.status == "True")
        })
    });
    tokio::time::timeout(Duration::from_secs(300), ready).await??;
    let time_to_ready = started.elapsed();

    // pgbench against the primary as the app user, through a passfile.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let primary = pods.get("bench-0").await?;
    let address = InstanceStatus::from_annotations(primary.metadata.annotations.as_ref())
        .and_then(|r| r.address)
        .ok_or("no address in the primary's report")?;
    let (host, port) = address.rsplit_once(':').ok_or("malformed address")?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = secrets.get("bench-credentials").await?;
    let password = String::from_utf8(secret.data.unwrap_or_default()["password"].0.clone())?;
    let dir = tempfile::tempdir()?;
    let passfile = dir.path().join("pgpass");
    std::fs::write(&passfile, format!("{host}:{port}:app:app:{password}\n"))?;
    std::fs::set_permissions(
        &passfile,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    let pg = |program: &str| {
        let mut command = tokio::process::Command::new(program);
        command
            .env("PGHOST", host)
            .env("PGPORT", port)
            .env("PGUSER", "app")
            .env("PGDATABASE", "app")
            .env("PGPASSFILE", &passfile);
        command
    };
    let init = pg("pgbench")
        .args(["-i", "-q", "-s", "10"])
        .output()
        .await?;
    if !init.status.success() {
        return Err(format!("pgbench -i: {}", String::from_utf8_lossy(&init.stderr)).into());
    }
    let load = pg("pgbench")
        .args(["-c", "4", "-j", "2", "-T", &seconds.to_string(), "-n"])
        .output();
    let sample = async {
        // Lag as the primary sees it, every 100 ms: bytes not yet replayed by each standby.
        let mut lags = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(seconds);
        while Instant::now() < deadline {
            let out = pg("psql")
                .args([
                    "-X", "-A", "-t", "-c",
                    "select pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) from pg_stat_replication",
                ])
                .output()
                .await;
            if let Ok(out) = out {
                lags.extend(
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .filter_map(|l| l.trim().parse::<f64>().ok()),
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        lags
    };
    let reported = async {
        // Lag as the replicas report it (`lagBytes` in their pods' reports), every 500 ms.
        let mut lags = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(seconds);
        while Instant::now() < deadline {
            for pod in ["bench-1", "bench-2"] {
                if let Ok(pod) = pods.get(pod).await
                    && let Some(lag) =
                        InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())
                            .and_then(|r| r.lag_bytes)
                {
                    lags.push(lag as f64);
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        lags
    };
    let (load, mut lags, mut reported) = tokio::join!(load, sample, reported);
    reported.sort_by(|a, b| a.total_cmp(b));
    let load = load?;
    let summary = String::from_utf8_lossy(&load.stdout);
    let tps = summary
        .lines()
        .find(|l| l.starts_with("tps"))
        .unwrap_or("tps = ?")
        .to_string();
    lags.sort_by(|a, b| a.total_cmp(b));

    let runner = cluster.pod_runner().ok_or("no pod runner")?;
    let mut agent_rss = Vec::new();
    for pod in ["bench-0", "bench-1", "bench-2"] {
        if let Some(pid) = runner.pid(&namespace, pod) {
            agent_rss.push((pod, rss_mib(pid).unwrap_or(f64::NAN)));
        }
    }

    // The idle cluster: what wakes the operator when nothing changes.
    let idle: u64 = std::env::var("DEVCTL_BENCH_IDLE_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let reconciles = || {
        metrics
            .encode()
            .lines()
            .filter(|l| {
                l.starts_with("controller_runtime_reconcile_total{")
                    && l.contains(r#"controller="databasecluster""#)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let before = reconciles();
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let idle_reconciles = reconciles() - before;

    println!(
        "apply → Ready (3 instances, real PostgreSQL): {:.1} s",
        time_to_ready.as_secs_f64()
    );
    println!("pgbench -c 4 -j 2 -T {seconds} (scale 10): {tps}");
    println!(
        "replication lag under load ({} samples): p50 {:.0} B, p99 {:.0} B, max {:.0} B",
        lags.len(),
        percentile(&lags, 0.5),
        percentile(&lags, 0.99),
        lags.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "replication lag the replicas report ({} samples of lagBytes): p50 {:.0} B, p99 {:.0} B, max {:.0} B",
        reported.len(),
        percentile(&reported, 0.5),
        percentile(&reported, 0.99),
        reported.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "idle {idle} s after the load: {idle_reconciles} reconciles of the cluster (health requeue {} s)",
        devctl_operator::Settings::default()
            .health_requeue
            .as_secs()
    );
    for (pod, rss) in agent_rss {
        println!("devctl-agent RSS {pod}: {rss:.1} MiB");
    }
    Ok(())
}
