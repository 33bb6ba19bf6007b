//! A PostgreSQL major upgrade (docs/major-upgrade.md) of a ~1 GB `pgbench` database on
//! process-backed pods (Debian's PostgreSQL 15 → PyPI's 17, `devctl-agent`, the operator
//! in-process), once by copy and once by link: the time writes are unavailable — from the
//! old primary's pod being deleted (its agent stops PostgreSQL) until the instance accepts a
//! write on 17 — and from the `spec.version` patch until the cluster is Ready on 17.
//!
//! `cargo build --release -p devctl-agent && cargo bench -p devctl-operator --bench major_upgrade -- [scale]`
//! (pgbench scale, default 70 ≈ 1 GB). Results and the machine: docs/performance.md.

use std::time::{Duration, Instant};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_testenv::workload;
use devctl_testenv::{Cluster, ClusterOptions, PodBacking};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};

type BoxError = Box<dyn std::error::Error>;

async fn poll<T>(
    what: &str,
    limit: Duration,
    every: Duration,
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
        tokio::time::sleep(every).await;
    }
}

fn ready_on(db: &DatabaseCluster, version: &str) -> bool {
    db.status.as_ref().is_some_and(|s| {
        s.current_version.as_deref() == Some(version)
            && s.major_upgrade.is_none()
            && devctl_api::conditions::find(&s.conditions, "Ready")
                .is_some_and(|c| c.status == "True")
    })
}

/// One cluster `name` on 15 loaded with `scale`, upgraded to 17 by `method`.
async fn upgrade_once(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    method: &str,
    scale: u32,
) -> Result<(), BoxError> {
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), namespace);
    let db: DatabaseCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": name },
        "spec": { "engine": "postgres", "version": "15.8", "replicas": 1,
                  "storage": { "size": "10Gi" } }
    }))?;
    dbs.create(&PostParams::default(), &db).await?;
    poll(
        "Ready on 15",
        Duration::from_secs(300),
        Duration::from_millis(200),
        async || dbs.get(name).await.ok().filter(|d| ready_on(d, "15.8")),
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets.get(&format!("{name}-credentials")).await?;
    let password = String::from_utf8(secret.data.unwrap_or_default()["password"].0.clone())?;
    let dir = tempfile::tempdir()?;
    let passfile = workload::app_passfile(dir.path(), &password)?;
    let pod_name = format!("{name}-0");
    let address = workload::reported_address(client, namespace, &pod_name)
        .await
        .ok_or("no address")?;
    let init = tokio::process::Command::new("pgbench")
        .args(["-i", "-q", "-s", &scale.to_string()])
        .env("PGHOST", &address.0)
        .env("PGPORT", &address.1)
        .env("PGUSER", "app")
        .env("PGDATABASE", "app")
        .env("PGPASSFILE", &passfile)
        .output()
        .await?;
    if !init.status.success() {
        return Err(format!("pgbench -i: {}", String::from_utf8_lossy(&init.stderr)).into());
    }
    let size = workload::psql_at(&passfile, &address, "select pg_database_size('app')").await?;
    let bytes: f64 = size.trim().parse().unwrap_or(f64::NAN);

    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let old_uid = pods.get(&pod_name).await?.uid();
    let patched = Instant::now();
    dbs.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({
            "spec": { "version": "17.2", "upgrade": { "method": method } }
        })),
    )
    .await?;
    // The stop: the primary's pod deleted (its agent stops PostgreSQL at once).
    poll(
        "the primary's pod to be replaced",
        Duration::from_secs(120),
        Duration::from_millis(50),
        async || {
            let pod = pods.get_opt(&pod_name).await.ok()?;
            (pod.is_none()
                || pod
                    .as_ref()
                    .is_some_and(|p| p.metadata.deletion_timestamp.is_some() || p.uid() != old_uid))
            .then_some(())
        },
    )
    .await?;
    let stopped = Instant::now();
    // Writes accepted on 17, asked of the new pod's reported address directly.
    poll(
        "a write accepted on 17",
        Duration::from_secs(600),
        Duration::from_millis(100),
        async || {
            let pod = pods.get_opt(&pod_name).await.ok()??;
            if pod.uid() == old_uid {
                return None;
            }
            let address = workload::reported_address(client, namespace, &pod_name).await?;
            let version = workload::psql_at(
                &passfile,
                &address,
                "select current_setting('server_version_num') from (select txid_current()) w",
            )
            .await
            .ok()?;
            version.starts_with("17").then_some(())
        },
    )
    .await?;
    let writes = stopped.elapsed().as_secs_f64();
    poll(
        "Ready on 17",
        Duration::from_secs(600),
        Duration::from_millis(200),
        async || dbs.get(name).await.ok().filter(|d| ready_on(d, "17.2")),
    )
    .await?;
    println!(
        "{method}: {:.0} MiB; stop -> a write accepted on 17: {writes:.1} s; patch -> Ready on 17: {:.1} s",
        bytes / 1048576.0,
        patched.elapsed().as_secs_f64()
    );
    Ok(())
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
    cluster.install_crds(&devctl_api::crds()).await?;
    let namespace = cluster.create_namespace("upgrade").await?;
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
    for method in ["copy", "link"] {
        upgrade_once(&client, &namespace, method, method, scale).await?;
    }
    Ok(())
}
