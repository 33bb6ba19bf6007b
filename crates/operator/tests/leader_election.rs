//! Two operator replicas: only the Lease holder reconciles; when it shuts down the other
//! takes over within one lease duration.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use devctl_api::database_cluster::DatabaseCluster;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::json;
use support::{TIMEOUT, is_ready};

struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_replica(
    kubeconfig: &std::path::Path,
    identity: &str,
    lease_namespace: &str,
    watch: &str,
    log: &std::path::Path,
) -> Replica {
    Replica(
        Command::new(env!("CARGO_BIN_EXE_devctl-operator"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "--leader-elect",
                "--leader-election-namespace",
                lease_namespace,
                "--namespace",
                watch,
            ])
            .args(["--metrics-bind-address", "127.0.0.1:0"])
            .env("POD_NAME", identity)
            .env("DEVCTL_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

thread_local! {
    static LOG_DIR: std::cell::RefCell<Option<std::path::PathBuf>> = const { std::cell::RefCell::new(None) };
}

/// The replicas' logs, for failure messages.
fn replica_logs() -> String {
    LOG_DIR.with(|dir| {
        let Some(dir) = dir.borrow().clone() else {
            return String::new();
        };
        ["a.log", "b.log"]
            .iter()
            .map(|f| {
                format!(
                    "--- {f}:\n{}",
                    std::fs::read_to_string(dir.join(f)).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    })
}

fn database(name: &str) -> DatabaseCluster {
    serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": name },
        "spec": { "version": "16.2", "storage": { "size": "1Gi" } }
    }))
    .unwrap()
}

async fn holder_becomes(leases: &Api<Lease>, identity: &str) {
    let wait = await_condition(
        leases.clone(),
        "devctl-operator",
        |lease: Option<&Lease>| {
            lease
                .and_then(|l| l.spec.as_ref())
                .and_then(|s| s.holder_identity.as_deref())
                == Some(identity)
        },
    );
    tokio::time::timeout(TIMEOUT, wait)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{identity} did not become the leader within {TIMEOUT:?}; {}",
                replica_logs()
            )
        })
        .unwrap();
}

#[tokio::test]
async fn only_the_leader_reconciles_and_the_follower_takes_over() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let lease_namespace = cluster.create_namespace("leases").await.unwrap();
    let work = cluster.create_namespace("led").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    LOG_DIR.with(|d| *d.borrow_mut() = Some(dir.path().to_path_buf()));
    let kubeconfig = |user: &str| {
        let path = dir.path().join(format!("{user}.kubeconfig"));
        devctl_testenv::kubeconfig::write(
            &cluster.kubeconfig_for(user, &["system:masters"]).unwrap(),
            &path,
        )
        .unwrap();
        path
    };
    let client = cluster.client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_namespace);
    let dbs: Api<DatabaseCluster> = Api::namespaced(client, &work);

    let a = start_replica(
        &kubeconfig("replica-a"),
        "replica-a",
        &lease_namespace,
        &work,
        &dir.path().join("a.log"),
    );
    holder_becomes(&leases, "replica-a").await;
    let audit = cluster.audit_log().unwrap();
    let mark = audit.mark();
    let _b = start_replica(
        &kubeconfig("replica-b"),
        "replica-b",
        &lease_namespace,
        &work,
        &dir.path().join("b.log"),
    );

    dbs.create(&PostParams::default(), &database("first"))
        .await
        .unwrap();
    let ready = await_condition(dbs.clone(), "first", |db: Option<&DatabaseCluster>| {
        db.is_some_and(|d| is_ready(d, 1))
    });
    tokio::time::timeout(TIMEOUT, ready)
        .await
        .expect("the leader did not reconcile")
        .unwrap();
    let follower_writes: Vec<_> = audit
        .requests_since(mark)
        .unwrap()
        .into_iter()
        .filter(|r| r.user == "replica-b" && r.is_write() && r.resource != "leases")
        .collect();
    assert!(
        follower_writes.is_empty(),
        "the follower wrote: {follower_writes:#?}"
    );

    // Graceful shutdown of the leader releases the lease; the follower takes over at once.
    let stopped = Instant::now();
    // SAFETY: signalling the child we started.
    unsafe {
        libc::kill(a.0.id() as libc::pid_t, libc::SIGTERM);
    }
    holder_becomes(&leases, "replica-b").await;
    let handover = stopped.elapsed();
    println!("leader handover after SIGTERM: {handover:?}");
    let bound = Duration::from_secs(devctl_operator::leader_election::LEASE_DURATION_SECONDS + 5);
    assert!(
        handover < bound,
        "handover took {handover:?}, expected below {bound:?}"
    );
    drop(a);

    dbs.create(&PostParams::default(), &database("second"))
        .await
        .unwrap();
    let ready = await_condition(dbs.clone(), "second", |db: Option<&DatabaseCluster>| {
        db.is_some_and(|d| is_ready(d, 1))
    });
    tokio::time::timeout(TIMEOUT, ready)
        .await
        .expect("the new leader did not reconcile")
        .unwrap();
}
