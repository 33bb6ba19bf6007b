//! Backup and restore of a ~1 GB `pgbench` database on process-backed pods (real PostgreSQL
//! 15, `devctl-agent`) into a real S3 store (versitygw over TLS on the same machine): time and
//! throughput of an on-demand backup (taken on a replica) and of a restore into a new cluster,
//! and the WAL archive lag (RPO) under a write load: how far the last archived segment trails
//! the primary's current WAL position.
//!
//! `cargo build --release -p devctl-agent && cargo bench -p devctl-operator --bench backup -- [scale]`
//! (pgbench scale, default 70 ≈ 1 GB). Results and the machine: docs/performance.md.

use std::time::{Duration, Instant};

use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use devctl_api::database_cluster::DatabaseCluster;
use devctl_testenv::workload;
use devctl_testenv::{Cluster, ClusterOptions, PodBacking};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

type BoxError = Box<dyn std::error::Error>;

async fn poll<T>(
    what: &str,
    limit: Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> Result<T, BoxError> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ready(db: &DatabaseCluster, replicas: i32) -> bool {
    db.status.as_ref().is_some_and(|s| {
        s.ready_replicas == replicas
            && devctl_api::conditions::find(&s.conditions, "Ready")
                .is_some_and(|c| c.status == "True")
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let scale: u32 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(70);
    let cluster = Cluster::start_with(ClusterOptions {
        pods: PodBacking::processes()?,
        ..ClusterOptions::default()
    })
    .await?;
    let s3 = devctl_testenv::s3::S3Server::start().await?;
    cluster.install_crds(&devctl_api::crds()).await?;
    let namespace = cluster.create_namespace("backup").await?;
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
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    for (name, data) in [
        (
            "s3-credentials",
            serde_json::json!({ "accessKeyId": s3.access_key_id(), "secretAccessKey": s3.secret_access_key() }),
        ),
        ("s3-ca", serde_json::json!({ "ca.crt": s3.ca_pem() })),
    ] {
        let secret: Secret = serde_json::from_value(
            serde_json::json!({ "metadata": { "name": name }, "stringData": data }),
        )?;
        secrets.create(&PostParams::default(), &secret).await?;
    }
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let db: DatabaseCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "big" },
        "spec": { "engine": "postgres", "version": "16.2", "replicas": 2, "storage": { "size": "10Gi" },
                  "backup": { "enabled": true, "destination": {
                      "endpoint": s3.endpoint(), "bucket": s3.bucket(),
                      "credentialsSecret": "s3-credentials", "caSecret": "s3-ca" } } }
    }))?;
    dbs.create(&PostParams::default(), &db).await?;
    poll("Ready", Duration::from_secs(300), async || {
        dbs.get("big").await.ok().filter(|d| ready(d, 2))
    })
    .await?;

    let secret = secrets.get("big-credentials").await?;
    let password = String::from_utf8(secret.data.unwrap_or_default()["password"].0.clone())?;
    let dir = tempfile::tempdir()?;
    let passfile = workload::app_passfile(dir.path(), &password)?;
    let primary = workload::reported_address(&client, &namespace, "big-0")
        .await
        .ok_or("no address")?;
    let pgbench = |args: &[&str]| {
        let mut c = tokio::process::Command::new("pgbench");
        c.args(args)
            .env("PGHOST", &primary.0)
            .env("PGPORT", &primary.1)
            .env("PGUSER", "app")
            .env("PGDATABASE", "app")
            .env("PGPASSFILE", &passfile);
        c
    };
    let loaded = Instant::now();
    let init = pgbench(&["-i", "-q", "-s", &scale.to_string()])
        .output()
        .await?;
    if !init.status.success() {
        return Err(format!("pgbench -i: {}", String::from_utf8_lossy(&init.stderr)).into());
    }
    let size = workload::psql_at(&passfile, &primary, "select pg_database_size('app')").await?;
    let bytes: f64 = size.trim().parse().unwrap_or(f64::NAN);
    println!(
        "pgbench -i -s {scale}: {:.0} MiB in {:.1} s",
        bytes / 1048576.0,
        loaded.elapsed().as_secs_f64()
    );

    // RPO under load: last archived segment vs the current WAL position, every second.
    let load = pgbench(&["-c", "2", "-j", "2", "-T", "60", "-n"]).output();
    let rpo = async {
        let mut lags = Vec::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            // Seconds since the last segment reached the store: the data at risk.
            let age = workload::psql_at(
                &passfile,
                &primary,
                "select extract(epoch from now() - last_archived_time) from pg_stat_archiver",
            )
            .await;
            if let Ok(age) = age
                && let Ok(age) = age.trim().parse::<f64>()
            {
                lags.push(age);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        lags
    };
    let (load, mut lags) = tokio::join!(load, rpo);
    let load = load?;
    let tps = String::from_utf8_lossy(&load.stdout)
        .lines()
        .find(|l| l.starts_with("tps"))
        .unwrap_or("tps = ?")
        .to_string();
    lags.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        lags.get(((lags.len().max(1) - 1) as f64 * p) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!("pgbench -c 2 -T 60: {tps}");
    println!(
        "archive age under load (seconds since the last segment was archived, {} samples): p50 {:.1} s, p95 {:.1} s, max {:.1} s (archive_timeout 60 s)",
        lags.len(),
        pct(0.5),
        pct(0.95),
        lags.last().copied().unwrap_or(f64::NAN)
    );

    let backups: Api<DatabaseBackup> = Api::namespaced(client.clone(), &namespace);
    let backup: DatabaseBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseBackup",
        "metadata": { "name": "big-1" }, "spec": { "cluster": { "name": "big" } }
    }))?;
    let started = Instant::now();
    backups.create(&PostParams::default(), &backup).await?;
    let done = poll("the backup", Duration::from_secs(1800), async || {
        backups.get("big-1").await.ok().filter(|b| {
            b.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(BackupPhase::is_final)
        })
    })
    .await?;
    let took = started.elapsed().as_secs_f64();
    let status = done.status.unwrap_or_default();
    let stored = status.size.unwrap_or(0) as f64;
    println!(
        "backup ({:?} on {}): {:.1} s, {:.0} MiB stored, {:.1} MiB/s",
        status.phase,
        status.instance.unwrap_or_default(),
        took,
        stored / 1048576.0,
        stored / 1048576.0 / took
    );

    let restored: DatabaseCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "copy" },
        "spec": { "engine": "postgres", "version": "16.2", "replicas": 1, "storage": { "size": "10Gi" },
                  "backup": { "enabled": true, "destination": {
                      "endpoint": s3.endpoint(), "bucket": s3.bucket(),
                      "credentialsSecret": "s3-credentials", "caSecret": "s3-ca" } },
                  "bootstrap": { "recovery": { "backup": "big-1" } } }
    }))?;
    let started = Instant::now();
    dbs.create(&PostParams::default(), &restored).await?;
    poll("the restore", Duration::from_secs(1800), async || {
        dbs.get("copy").await.ok().filter(|d| ready(d, 1))
    })
    .await?;
    let took = started.elapsed().as_secs_f64();
    println!(
        "restore into a new cluster (apply → Ready): {:.1} s, {:.1} MiB/s of backup",
        took,
        stored / 1048576.0 / took
    );
    Ok(())
}
