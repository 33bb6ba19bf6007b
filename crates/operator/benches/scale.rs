//! How the operator binary behaves with many DatabaseClusters on the real control plane:
//! time until every cluster is Ready, its memory (RSS) and CPU time, and the write requests it
//! makes once converged (should be zero).
//!
//! `cargo bench -p devctl-operator --bench scale -- <clusters>` (default 100). Results and the
//! method are recorded in docs/performance.md.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_testenv::{Cluster, ClusterOptions, Options};
use futures::StreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

const OPERATOR_USER: &str = "devctl-operator-bench";

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

fn ready(db: &DatabaseCluster) -> bool {
    db.status.as_ref().is_some_and(|s| {
        devctl_api::conditions::find(&s.conditions, "Ready").is_some_and(|c| c.status == "True")
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let count: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
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
    for i in 0..count {
        let db: DatabaseCluster = serde_json::from_value(json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
            "metadata": { "name": format!("db-{i}") },
            "spec": { "version": "16.2", "storage": { "size": "1Gi" } }
        }))?;
        dbs.create(&PostParams::default(), &db).await?;
    }

    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("operator.kubeconfig");
    devctl_testenv::kubeconfig::write(
        &cluster.kubeconfig_for(OPERATOR_USER, &["system:masters"])?,
        &kubeconfig,
    )?;
    let started = Instant::now();
    let mut operator = Command::new(env!("CARGO_BIN_EXE_devctl-operator"))
        // The bench measures the controllers; webhooks have their own tests.
        .env("DEVCTL_WEBHOOK_BIND_ADDRESS", "off")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--namespace", &namespace, "--metrics-bind-address", "off"])
        .env("DEVCTL_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("operator.log"))?)
        .spawn()?;
    let pid = operator.id();

    // Time until every cluster reports Ready (one watch, no polling).
    let mut ready_names = std::collections::BTreeSet::new();
    let mut events = watcher(dbs.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let deadline = Duration::from_secs(600);
    tokio::time::timeout(deadline, async {
        while let Some(Ok(db)) = events.next().await {
            if ready(&db) {
                ready_names.insert(db.metadata.name.clone().unwrap_or_default());
                if ready_names.len() == count {
                    break;
                }
            }
        }
    })
    .await
    .map_err(|_| {
        format!(
            "only {} of {count} clusters Ready after {deadline:?}",
            ready_names.len()
        )
    })?;
    let converged = started.elapsed();
    let cpu_converge = cpu_seconds(pid);

    // Idle for 20 s: count the operator's writes and CPU.
    let audit = cluster.audit_log().ok_or("no audit log")?;
    let mark = audit.mark();
    let idle = Duration::from_secs(20);
    tokio::time::sleep(idle).await;
    let writes = audit
        .requests_since(mark)?
        .into_iter()
        .filter(|r| r.user == OPERATOR_USER && r.is_write())
        .count();
    let cpu_idle = cpu_seconds(pid) - cpu_converge;
    let rss = proc_status(pid, "VmRSS:");
    let peak = proc_status(pid, "VmHWM:");
    let _ = operator.kill();
    let _ = operator.wait();

    // One instance: ConfigMap, Secret, headless and read-write Services, StatefulSet.
    println!("clusters            {count} (1 instance and 5 children each)");
    println!("all Ready after     {:.1} s", converged.as_secs_f64());
    println!(
        "operator CPU        {cpu_converge:.2} s to converge, {cpu_idle:.2} s in {} s idle",
        idle.as_secs()
    );
    println!(
        "operator RSS        {:.1} MiB now, {:.1} MiB peak",
        rss as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    println!("writes while idle   {writes}");
    Ok(())
}
