//! MariaDB on process-backed pods (Debian's MariaDB 10.11, `devctl-agent`), docs/mariadb.md:
//! - a physical backup of ~1 GiB taken on a replica into a real S3 store (versitygw over TLS
//!   on the same machine) and its restore into a new cluster: time and throughput;
//! - failover of a 3-instance semi-synchronous cluster: the primary's processes killed, the
//!   time to the first write acknowledged through `-rw`, and the operator's flight record.
//!
//! `cargo build --release -p devctl-agent && cargo bench -p devctl-operator --bench mariadb -- [MiB]`
//! (default 1024). Results and the machine: docs/performance.md.

use std::time::{Duration, Instant, SystemTime};

use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use devctl_api::database_cluster::DatabaseCluster;
use devctl_testenv::workload::{self, Access, Writer};
use devctl_testenv::{Cluster, ClusterOptions, PodBacking};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;

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

async fn password(secrets: &Api<Secret>, name: &str) -> Result<String, BoxError> {
    let secret = secrets.get(&format!("{name}-credentials")).await?;
    Ok(String::from_utf8(
        secret.data.unwrap_or_default()["password"].0.clone(),
    )?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mib: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1024);
    let cluster = Cluster::start_with(ClusterOptions {
        pods: PodBacking::processes()?,
        ..ClusterOptions::default()
    })
    .await?;
    let s3 = devctl_testenv::s3::S3Server::start().await?;
    cluster.install_crds(&devctl_api::crds()).await?;
    let namespace = cluster.create_namespace("mariadb").await?;
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
            json!({ "accessKeyId": s3.access_key_id(), "secretAccessKey": s3.secret_access_key() }),
        ),
        ("s3-ca", json!({ "ca.crt": s3.ca_pem() })),
    ] {
        let secret: Secret =
            serde_json::from_value(json!({ "metadata": { "name": name }, "stringData": data }))?;
        secrets.create(&PostParams::default(), &secret).await?;
    }
    let destination = json!({ "enabled": true, "destination": {
        "endpoint": s3.endpoint(), "bucket": s3.bucket(),
        "credentialsSecret": "s3-credentials", "caSecret": "s3-ca" } });
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let create = async |name: &str, spec: serde_json::Value| -> Result<(), BoxError> {
        let db: DatabaseCluster = serde_json::from_value(json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
            "metadata": { "name": name }, "spec": spec,
        }))?;
        dbs.create(&PostParams::default(), &db).await?;
        Ok(())
    };

    // Backup and restore.
    create(
        "big",
        json!({ "engine": "mariadb", "version": "10.11", "replicas": 2,
                "storage": { "size": "10Gi" }, "backup": destination }),
    )
    .await?;
    poll("Ready", Duration::from_secs(300), async || {
        dbs.get("big").await.ok().filter(|d| ready(d, 2))
    })
    .await?;
    let big_password = password(&secrets, "big").await?;
    let access = Access::Mariadb(big_password.clone());
    let primary = workload::reported_address(&client, &namespace, "big-0")
        .await
        .ok_or("no address")?;
    let loaded = Instant::now();
    workload::sql_at(
        &access,
        &primary,
        "CREATE TABLE big (id INT PRIMARY KEY, pad CHAR(250) NOT NULL)",
    )
    .await?;
    // ~300 bytes a row in InnoDB; 500,000 rows a statement.
    let rows = mib * 1024 * 1024 / 300;
    let mut first = 1;
    while first <= rows {
        let last = (first + 499_999).min(rows);
        let insert =
            format!("INSERT INTO big SELECT seq, REPEAT('x', 250) FROM seq_{first}_to_{last}");
        let out = tokio::process::Command::new("mariadb")
            .args(["--no-defaults", "--protocol=TCP", "-u", "app", "-D", "app"])
            .args(["-h", &primary.0, "-P", &primary.1, "-e", &insert])
            .env("MYSQL_PWD", &big_password)
            .output()
            .await?;
        if !out.status.success() {
            return Err(format!("loading: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        first = last + 1;
    }
    let size = workload::sql_at(
        &access,
        &primary,
        "SELECT SUM(data_length + index_length) FROM information_schema.tables WHERE table_schema = 'app'",
    )
    .await?;
    let bytes: f64 = size.trim().parse().unwrap_or(f64::NAN);
    println!(
        "loaded {rows} rows: {:.0} MiB in {:.1} s",
        bytes / 1048576.0,
        loaded.elapsed().as_secs_f64()
    );
    // The replica has it all before the backup starts.
    let replica = workload::reported_address(&client, &namespace, "big-1")
        .await
        .ok_or("no address")?;
    poll(
        "the replica to catch up",
        Duration::from_secs(600),
        async || {
            workload::sql_at(&access, &replica, "SELECT COUNT(*) FROM big")
                .await
                .ok()
                .filter(|n| n.trim() == rows.to_string())
        },
    )
    .await?;

    let backups: Api<DatabaseBackup> = Api::namespaced(client.clone(), &namespace);
    let backup: DatabaseBackup = serde_json::from_value(json!({
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
    let started = Instant::now();
    create(
        "copy",
        json!({ "engine": "mariadb", "version": "10.11", "replicas": 1,
                "storage": { "size": "10Gi" }, "backup": { "enabled": false },
                "bootstrap": { "recovery": { "backup": "big-1" } } }),
    )
    .await?;
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

    // Failover: five kills of the primary of a semi-synchronous cluster under a writer.
    let timeout = Duration::from_secs(10);
    create(
        "ha",
        json!({ "engine": "mariadb", "version": "10.11", "replicas": 3,
                "storage": { "size": "1Gi" }, "backup": { "enabled": false },
                "replication": { "synchronous": { "method": "any", "number": 1 } },
                "highAvailability": { "enabled": true, "failoverTimeout": "10s" } }),
    )
    .await?;
    poll("Ready", Duration::from_secs(300), async || {
        dbs.get("ha").await.ok().filter(|d| ready(d, 3))
    })
    .await?;
    let access = Access::Mariadb(password(&secrets, "ha").await?);
    let address = workload::reported_address(&client, &namespace, "ha-0")
        .await
        .ok_or("no address")?;
    workload::sql_at(
        &access,
        &address,
        "CREATE TABLE t (v BIGINT PRIMARY KEY, pod VARCHAR(64))",
    )
    .await?;
    let runner = cluster.pod_runner().ok_or("no pod runner")?;
    let mut first_value = 1;
    for round in 1..=5 {
        let writer = Writer::start_with(
            client.clone(),
            &namespace,
            "ha",
            access.clone(),
            first_value,
            Duration::from_millis(20),
        );
        poll("writes", Duration::from_secs(60), async || {
            (writer.acks().len() > 20).then_some(())
        })
        .await?;
        let primary = dbs
            .get("ha")
            .await?
            .status
            .and_then(|s| s.current_primary)
            .ok_or("no primary")?;
        let killed = SystemTime::now();
        runner.kill_and_hold(&namespace, &primary)?;
        let ack = poll(
            "a write after the kill",
            Duration::from_secs(120),
            async || {
                writer
                    .acks()
                    .into_iter()
                    .find(|a| a.pod != primary && a.at > killed)
            },
        )
        .await?;
        let acks = writer.finish().await;
        first_value = acks.last().map_or(first_value, |a| a.value + 1);
        let unavailable = ack.at.duration_since(killed)?.as_secs_f64();
        runner.release(&namespace, &primary)?;
        poll("Ready again", Duration::from_secs(300), async || {
            dbs.get("ha").await.ok().filter(|d| ready(d, 3))
        })
        .await?;
        let record = dbs.get("ha").await?.status.and_then(|s| s.last_failover);
        let new_primary = workload::reported_address(&client, &namespace, &ack.pod)
            .await
            .ok_or("no address")?;
        let present = workload::sql_at(&access, &new_primary, "SELECT v FROM t").await?;
        let present: std::collections::BTreeSet<i64> = present
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let lost = acks.iter().filter(|a| !present.contains(&a.value)).count();
        println!(
            "failover {round}: {primary} killed, first write acknowledged by {} after {unavailable:.2} s (failoverTimeout {} s; bound {} s); {lost} of {} acknowledged rows lost; record {:?}",
            ack.pod,
            timeout.as_secs(),
            timeout.as_secs() + 5,
            acks.len(),
            record.map(|r| (
                r.detected_at,
                r.elected_at,
                r.promoted_at,
                r.service_switched_at
            ))
        );
    }
    Ok(())
}
