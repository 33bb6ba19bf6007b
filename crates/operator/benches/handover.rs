//! Leader handover of the `devctl-operator` binary (release) on the real control plane: two
//! replicas with the default election timings; the leader is stopped with SIGTERM (it
//! releases the Lease) or SIGKILL (it does not), and the time until the Lease names the other
//! replica is measured. `cargo bench -p devctl-operator --bench handover -- <rounds>`
//! (default 3). Results and the machine are in docs/performance.md.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(
    kubeconfig: &std::path::Path,
    identity: &str,
    namespace: &str,
    log: &std::path::Path,
) -> Replica {
    let child = Command::new(env!("CARGO_BIN_EXE_devctl-operator"))
        // The bench measures the controllers; webhooks have their own tests.
        .env("DEVCTL_WEBHOOK_BIND_ADDRESS", "off")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--leader-elect",
            "--leader-election-namespace",
            namespace,
            "--namespace",
            namespace,
        ])
        .args(["--metrics-bind-address", "off"])
        .env("POD_NAME", identity)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("start devctl-operator");
    Replica(child)
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(devctl_operator::leader_election::LEASE_NAME)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

/// Polls the Lease every 10 ms until `identity` holds it; the time it took.
async fn until_holder(leases: &Api<Lease>, identity: &str) -> Duration {
    let started = Instant::now();
    while holder(leases).await.as_deref() != Some(identity) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{identity} never took the lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

fn summary(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let pick = |i: usize| samples[i].as_secs_f64();
    println!(
        "{what:<22} min {:.2} s  median {:.2} s  max {:.2} s  ({} rounds)",
        pick(0),
        pick(samples.len() / 2),
        pick(samples.len() - 1),
        samples.len()
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(3);
    let cluster = devctl_testenv::Cluster::start().await?;
    cluster.install_crds(&devctl_api::crds()).await?;
    let namespace = cluster.create_namespace("handover").await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    devctl_testenv::kubeconfig::write(
        &cluster.kubeconfig_for("devctl-operator-bench", &["system:masters"])?,
        &kubeconfig,
    )?;
    let leases: Api<Lease> = Api::namespaced(cluster.client().await?, &namespace);
    let log = |name: &str| dir.path().join(format!("{name}.log"));

    let mut term = Vec::new();
    let mut kill = Vec::new();
    let mut leader = start(&kubeconfig, "replica-0", &namespace, &log("replica-0"));
    until_holder(&leases, "replica-0").await;
    for round in 0..rounds * 2 {
        let next = format!("replica-{}", round + 1);
        let follower = start(&kubeconfig, &next, &namespace, &log(&next));
        // Let the follower start and see the current lease before the leader goes.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let graceful = round % 2 == 0;
        let signal = if graceful {
            libc::SIGTERM
        } else {
            libc::SIGKILL
        };
        // SAFETY: signalling the child we started.
        unsafe {
            libc::kill(leader.0.id() as libc::pid_t, signal);
        }
        let took = until_holder(&leases, &next).await;
        if graceful {
            term.push(took)
        } else {
            kill.push(took)
        }
        drop(leader);
        leader = follower;
    }
    summary("handover after SIGTERM", term);
    summary("handover after SIGKILL", kill);
    Ok(())
}
