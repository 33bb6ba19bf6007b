//! Failover and switchover on process-backed pods (real PostgreSQL 15 behind each kwok pod):
//! a writer commits one row every 20 ms through the `-rw` resolution while the primary is
//! killed (SIGKILL of its agent and engine, kept from restarting until the failover is over),
//! with synchronous (`ANY 1`) and asynchronous replication. Each failover is split into
//! detection (kill → `status.failedPrimary`, bounded below by `failoverTimeout`), election
//! (→ `targetPrimary` names a pod), promotion (→ `currentPrimary` moves) and the Service
//! switch (→ the `-rw` EndpointSlice holds only the new primary); the write-unavailability
//! window is the gap between the last acknowledged row before the kill and the first after.
//! Acknowledged rows missing from the new primary are counted at the end.
//!
//! `cargo build --release -p devctl-agent && cargo bench -p devctl-operator --bench failover -- [runs]`
//! (default 10 failovers per mode, 5 switchovers). Results and the machine: docs/performance.md.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::{SWITCHOVER_ANNOTATION, TARGET_PENDING};
use devctl_testenv::workload::{self, Ack, Writer};
use devctl_testenv::{Cluster, ClusterOptions, PodBacking};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};

type BoxError = Box<dyn std::error::Error>;

const FAILOVER_TIMEOUT_SECS: u64 = 10;
const LIMIT: Duration = Duration::from_secs(180);

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn summary(name: &str, mut values: Vec<f64>) {
    values.sort_by(|a, b| a.total_cmp(b));
    println!(
        "  {name:<28} p50 {:>6.2} s   p95 {:>6.2} s   max {:>6.2} s",
        percentile(&values, 0.5),
        percentile(&values, 0.95),
        values.last().copied().unwrap_or(f64::NAN)
    );
}

async fn poll<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> Result<T, BoxError> {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Bench {
    cluster: &'static Cluster,
    client: kube::Client,
    namespace: String,
}

impl Bench {
    fn dbs(&self) -> Api<DatabaseCluster> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn status(&self, name: &str) -> devctl_api::database_cluster::DatabaseClusterStatus {
        self.dbs()
            .get(name)
            .await
            .ok()
            .and_then(|d| d.status)
            .unwrap_or_default()
    }

    async fn ready(&self, name: &str, replicas: i32) -> Result<(), BoxError> {
        poll("Ready", async || {
            let s = self.status(name).await;
            (s.ready_replicas == replicas
                && s.target_primary.is_none()
                && devctl_api::conditions::find(&s.conditions, "Ready")
                    .is_some_and(|c| c.status == "True"))
            .then_some(())
        })
        .await
    }

    async fn create(&self, name: &str, synchronous: bool) -> Result<(), BoxError> {
        let mut spec = serde_json::json!({
            "engine": "postgres", "version": "16.2", "replicas": 3,
            "storage": { "size": "1Gi" }, "backup": { "enabled": false },
            "highAvailability": { "enabled": true, "failoverTimeout": format!("{FAILOVER_TIMEOUT_SECS}s") },
        });
        if synchronous {
            spec["replication"] =
                serde_json::json!({ "synchronous": { "method": "any", "number": 1 } });
        }
        let db: DatabaseCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
            "metadata": { "name": name }, "spec": spec,
        }))?;
        self.dbs().create(&PostParams::default(), &db).await?;
        self.ready(name, 3).await
    }

    async fn passfile(
        &self,
        name: &str,
        dir: &std::path::Path,
    ) -> Result<std::path::PathBuf, BoxError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = secrets.get(&format!("{name}-credentials")).await?;
        let password = String::from_utf8(secret.data.unwrap_or_default()["password"].0.clone())?;
        Ok(workload::app_passfile(dir, &password)?)
    }

    async fn sql(
        &self,
        passfile: &std::path::Path,
        pod: &str,
        sql: &str,
    ) -> Result<String, BoxError> {
        let address = workload::reported_address(&self.client, &self.namespace, pod)
            .await
            .ok_or("no reported address")?;
        Ok(workload::psql_at(passfile, &address, sql).await?)
    }
}

fn acks_from(writer: &Writer, pod: &str, since: SystemTime) -> Vec<Ack> {
    writer
        .acks()
        .into_iter()
        .filter(|a| a.pod == pod && a.at > since)
        .collect()
}

fn secs(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from)
        .map(|d| d.as_secs_f64())
        .unwrap_or(f64::NAN)
}

/// `runs` failovers of the cluster `name`; returns the rows acknowledged and lost.
async fn failovers(
    bench: &Bench,
    name: &str,
    synchronous: bool,
    runs: usize,
) -> Result<(), BoxError> {
    bench.create(name, synchronous).await?;
    let dir = tempfile::tempdir()?;
    let passfile = bench.passfile(name, dir.path()).await?;
    let primary = bench
        .status(name)
        .await
        .current_primary
        .ok_or("no primary")?;
    bench
        .sql(
            &passfile,
            &primary,
            "create table t (v bigint primary key, pod text)",
        )
        .await?;
    let writer = Writer::start(
        bench.client.clone(),
        &bench.namespace,
        name,
        passfile.clone(),
        1,
        Duration::from_millis(20),
    );
    let runner = bench.cluster.pod_runner().ok_or("no pod runner")?;
    let (mut detection, mut election, mut promotion, mut service, mut unavailable, mut total) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for run in 0..runs {
        let old = bench
            .status(name)
            .await
            .current_primary
            .ok_or("no primary")?;
        let since = SystemTime::now();
        poll("writes before the kill", async || {
            (acks_from(&writer, &old, since).len() >= 10).then_some(())
        })
        .await?;
        let killed = SystemTime::now();
        runner.kill_and_hold(&bench.namespace, &old)?;
        let last_before = writer
            .acks()
            .iter()
            .filter(|a| a.at <= killed)
            .map(|a| a.at)
            .max()
            .unwrap_or(killed);
        let (mut detected, mut elected, mut promoted) = (None, None, None);
        let new = poll("the failover", async || {
            let s = bench.status(name).await;
            let now = SystemTime::now();
            if detected.is_none() && s.failed_primary.as_deref() == Some(old.as_str()) {
                detected = Some(now);
            }
            if elected.is_none()
                && s.target_primary
                    .as_deref()
                    .is_some_and(|t| t != TARGET_PENDING)
            {
                elected = Some(now);
            }
            match s.current_primary {
                Some(p) if p != old && s.target_primary.is_none() => {
                    promoted = Some(now);
                    Some(p)
                }
                _ => None,
            }
        })
        .await?;
        let switched = poll("the -rw Service", async || {
            (workload::rw_pods(&bench.client, &bench.namespace, name).await
                == BTreeSet::from([new.clone()]))
            .then(SystemTime::now)
        })
        .await?;
        let first_after = poll("a write on the new primary", async || {
            acks_from(&writer, &new, killed).first().map(|a| a.at)
        })
        .await?;
        let (detected, promoted) = (detected.unwrap_or(killed), promoted.unwrap_or(killed));
        let elected = elected.unwrap_or(promoted);
        detection.push(secs(killed, detected));
        election.push(secs(detected, elected));
        promotion.push(secs(elected, promoted));
        service.push(secs(promoted, switched));
        unavailable.push(secs(last_before, first_after));
        total.push(secs(killed, first_after));
        eprintln!(
            "{name} run {run}: {old} → {new}, writes again after {:.2} s",
            secs(killed, first_after)
        );
        runner.release(&bench.namespace, &old)?;
        bench.ready(name, 3).await?;
    }
    let acks = writer.finish().await;
    let primary = bench
        .status(name)
        .await
        .current_primary
        .ok_or("no primary")?;
    let rows: BTreeSet<i64> = bench
        .sql(&passfile, &primary, "select v from t")
        .await?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let lost = acks.iter().filter(|a| !rows.contains(&a.value)).count();
    let mode = if synchronous {
        "synchronous ANY 1"
    } else {
        "asynchronous"
    };
    println!("failover, {mode}, failoverTimeout {FAILOVER_TIMEOUT_SECS}s, {runs} runs:");
    summary("detection", detection);
    summary("election", election);
    summary("promotion", promotion);
    summary("Service switch", service);
    summary("kill → first write", total);
    summary("write unavailability", unavailable);
    println!("  acknowledged rows: {}, lost: {lost}", acks.len());
    Ok(())
}

async fn switchovers(bench: &Bench, name: &str, runs: usize) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let passfile = bench.passfile(name, dir.path()).await?;
    let writer = Writer::start(
        bench.client.clone(),
        &bench.namespace,
        name,
        passfile,
        1_000_000,
        Duration::from_millis(20),
    );
    let (mut done, mut unavailable) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let s = bench.status(name).await;
        let old = s.current_primary.ok_or("no primary")?;
        let target = ["0", "1", "2"]
            .iter()
            .map(|o| format!("{name}-{o}"))
            .find(|p| *p != old)
            .ok_or("no target")?;
        let since = SystemTime::now();
        poll("writes before the switchover", async || {
            (acks_from(&writer, &old, since).len() >= 10).then_some(())
        })
        .await?;
        let asked = SystemTime::now();
        let patch =
            serde_json::json!({ "metadata": { "annotations": { SWITCHOVER_ANNOTATION: target } } });
        bench
            .dbs()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let last_before = poll("the old primary to stop", async || {
            let s = bench.status(name).await;
            s.target_primary.is_some().then_some(())
        })
        .await
        .map(|()| {
            writer
                .acks()
                .iter()
                .filter(|a| a.pod == old)
                .map(|a| a.at)
                .max()
                .unwrap_or(asked)
        })?;
        let first_after = poll("a write on the new primary", async || {
            acks_from(&writer, &target, asked).first().map(|a| a.at)
        })
        .await?;
        done.push(secs(asked, first_after));
        unavailable.push(secs(last_before, first_after).max(0.0));
        bench.ready(name, 3).await?;
    }
    let acks = writer.finish().await;
    println!("switchover (db promote), {runs} runs:");
    summary("request → first write", done);
    summary("write unavailability", unavailable);
    println!("  acknowledged rows: {}", acks.len());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10);
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start_with(ClusterOptions {
            pods: PodBacking::processes()?,
            ..ClusterOptions::default()
        })
        .await?,
    ));
    cluster.install_crds(&devctl_api::crds()).await?;
    let namespace = cluster.create_namespace("failover").await?;
    let client = cluster.client().await?;
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn({
        let (client, namespace) = (client.clone(), namespace.clone());
        async move {
            let _ = devctl_operator::run(
                client,
                &[namespace],
                devctl_operator::Settings::default(),
                "bench",
                stopped,
            )
            .await;
        }
    });
    let bench = Bench {
        cluster,
        client,
        namespace,
    };
    failovers(&bench, "sync", true, runs).await?;
    switchovers(&bench, "sync", 5.min(runs)).await?;
    failovers(&bench, "async", false, runs).await?;
    Ok(())
}
