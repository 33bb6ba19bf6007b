//! Operator replicas under leader election, as deployed: the binary with the generated
//! ClusterRole and leader-election Role, each replica told apart by its User-Agent in the
//! API server's audit log. Only the leader writes; SIGTERM hands over at the followers' next
//! retry, SIGKILL within a lease; a leader paused past its lease writes nothing after it
//! resumes; bad timings are refused at start-up.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_operator::manifests::RULES;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::await_condition;
use serde_json::json;
use support::{TIMEOUT, is_ready};

struct Replica {
    child: Child,
    identity: String,
    log: std::path::PathBuf,
}

impl Replica {
    fn signal(&self, signal: libc::c_int) {
        // SAFETY: signalling the child we started.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) for the process to exit and returns its exit code.
    async fn exit_code(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status.code().unwrap_or(-1));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One shared operator identity with the generated rules: the ClusterRole and the
/// leader-election Role in `lease_namespace`.
async fn operator_kubeconfig(
    cluster: &devctl_testenv::Cluster,
    lease_namespace: &str,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let user = format!("devctl-operator-{lease_namespace}");
    let client = cluster.client().await.unwrap();
    let api = |kind: &str, plural: &str| {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
            plural,
        );
        Api::<DynamicObject>::namespaced_with(client.clone(), lease_namespace, &resource)
    };
    support::bind_rules(cluster, &user, RULES).await;
    let lease_rules = devctl_operator::manifests::leader_election_policy_rules();
    let objects = [
        (
            "Role",
            "roles",
            json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": { "name": user }, "rules": lease_rules }),
        ),
        (
            "RoleBinding",
            "rolebindings",
            json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": { "name": user },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user },
                "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }] }),
        ),
    ];
    for (kind, plural, body) in objects {
        api(kind, plural)
            .patch(
                &user,
                &PatchParams::apply("devctl-test").force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap();
    }
    let path = dir.join("operator.kubeconfig");
    devctl_testenv::kubeconfig::write(&cluster.kubeconfig_for(&user, &[]).unwrap(), &path).unwrap();
    path
}

fn start_replica(
    kubeconfig: &std::path::Path,
    identity: &str,
    lease_namespace: &str,
    watch: &str,
    dir: &std::path::Path,
    extra: &[&str],
) -> Replica {
    let log = dir.join(format!("{identity}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_devctl-operator"))
        // Webhooks have their own tests; on the shared control plane they would judge every test's objects.
        .env("DEVCTL_WEBHOOK_BIND_ADDRESS", "off")
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
        .args(extra)
        .env("POD_NAME", identity)
        .env("DEVCTL_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Replica {
        child,
        identity: identity.to_string(),
        log,
    }
}

fn database(name: &str) -> DatabaseCluster {
    serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": name },
        "spec": { "version": "16.2", "storage": { "size": "1Gi" } }
    }))
    .unwrap()
}

async fn holder_becomes(leases: &Api<Lease>, replica: &Replica, others: &[&Replica]) -> Duration {
    let started = Instant::now();
    let identity = replica.identity.clone();
    let wait = await_condition(
        leases.clone(),
        "devctl-operator",
        move |lease: Option<&Lease>| {
            lease
                .and_then(|l| l.spec.as_ref())
                .and_then(|s| s.holder_identity.as_deref())
                == Some(identity.as_str())
        },
    );
    // A watch error is not a leader: only `Ok(Ok(_))` is.
    if !matches!(
        tokio::time::timeout(Duration::from_secs(90), wait).await,
        Ok(Ok(_))
    ) {
        let logs: Vec<String> = std::iter::once(replica)
            .chain(others.iter().copied())
            .map(|r| format!("--- {}:\n{}", r.identity, r.logs()))
            .collect();
        panic!(
            "{} did not become the leader\n{}",
            replica.identity,
            logs.join("\n")
        );
    }
    started.elapsed()
}

/// Writes by the replica `identity` since `mark` (told apart by the User-Agent), leaving out
/// the election's own Lease requests unless they succeeded.
fn writes_by(
    cluster: &devctl_testenv::Cluster,
    mark: devctl_testenv::audit::AuditMark,
    identity: &str,
) -> Vec<devctl_testenv::audit::Request> {
    cluster
        .audit_log()
        .unwrap()
        .requests_since(mark)
        .unwrap()
        .into_iter()
        .filter(|r| r.user_agent.ends_with(&format!(" {identity}")) && r.is_write())
        .filter(|r| r.resource != "leases" || r.code.is_some_and(|c| c < 300))
        .collect()
}

async fn wait_ready(dbs: &Api<DatabaseCluster>, name: &str, replicas: &[&Replica]) {
    let ready = await_condition(dbs.clone(), name, |db: Option<&DatabaseCluster>| {
        db.is_some_and(|d| is_ready(d, 1))
    });
    if !matches!(tokio::time::timeout(TIMEOUT, ready).await, Ok(Ok(_))) {
        let logs: Vec<String> = replicas
            .iter()
            .map(|r| format!("--- {}:\n{}", r.identity, r.logs()))
            .collect();
        panic!("{name} did not become Ready\n{}", logs.join("\n"));
    }
}

#[tokio::test]
async fn only_the_leader_writes_and_followers_take_over_after_sigterm_and_sigkill() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let lease_namespace = cluster.create_namespace("leases").await.unwrap();
    let work = cluster.create_namespace("led").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = operator_kubeconfig(cluster, &lease_namespace, dir.path()).await;
    let client = cluster.client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_namespace);
    let dbs: Api<DatabaseCluster> = Api::namespaced(client, &work);
    let start = |identity: &str| {
        start_replica(
            &kubeconfig,
            identity,
            &lease_namespace,
            &work,
            dir.path(),
            &[],
        )
    };

    let a = start("replica-a");
    holder_becomes(&leases, &a, &[]).await;
    let audit = cluster.audit_log().unwrap();
    let mark = audit.mark();
    let b = start("replica-b");
    dbs.create(&PostParams::default(), &database("first"))
        .await
        .unwrap();
    wait_ready(&dbs, "first", &[&a, &b]).await;
    assert!(
        !writes_by(cluster, mark, "replica-a").is_empty(),
        "the leader's writes carry its User-Agent"
    );
    let follower = writes_by(cluster, mark, "replica-b");
    assert!(follower.is_empty(), "the follower wrote: {follower:#?}");

    // SIGTERM: the leader finishes, releases the lease, and a follower takes it at its next retry.
    a.signal(libc::SIGTERM);
    let handover = holder_becomes(&leases, &b, &[&a]).await;
    println!("handover after SIGTERM: {handover:?}");
    assert!(
        handover <= Duration::from_secs(9),
        "handover after SIGTERM took {handover:?}"
    );
    let mut a = a;
    assert_eq!(
        a.exit_code(Duration::from_secs(25)).await,
        Some(0),
        "{}",
        a.logs()
    );
    dbs.create(&PostParams::default(), &database("second"))
        .await
        .unwrap();
    wait_ready(&dbs, "second", &[&b]).await;

    // SIGKILL: nothing is released; a follower takes over once the lease has gone unrenewed.
    let c = start("replica-c");
    b.signal(libc::SIGKILL);
    let handover = holder_becomes(&leases, &c, &[&b]).await;
    println!("handover after SIGKILL: {handover:?}");
    assert!(
        handover <= Duration::from_secs(60),
        "handover after SIGKILL took {handover:?}"
    );
    dbs.create(&PostParams::default(), &database("third"))
        .await
        .unwrap();
    wait_ready(&dbs, "third", &[&c]).await;
}

#[tokio::test]
async fn a_leader_paused_past_its_lease_writes_nothing_after_it_resumes() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let lease_namespace = cluster.create_namespace("paused").await.unwrap();
    let work = cluster.create_namespace("split").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = operator_kubeconfig(cluster, &lease_namespace, dir.path()).await;
    let client = cluster.client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_namespace);
    let dbs: Api<DatabaseCluster> = Api::namespaced(client, &work);
    // Different cluster domains make the two replicas want different children (endpoints,
    // the Secret's host): a resumed old leader that wrote would show at once.
    let mut a = start_replica(
        &kubeconfig,
        "replica-a",
        &lease_namespace,
        &work,
        dir.path(),
        &["--cluster-domain", "a.local"],
    );
    holder_becomes(&leases, &a, &[]).await;
    dbs.create(&PostParams::default(), &database("contested"))
        .await
        .unwrap();
    wait_ready(&dbs, "contested", &[&a]).await;
    let b = start_replica(
        &kubeconfig,
        "replica-b",
        &lease_namespace,
        &work,
        dir.path(),
        &["--cluster-domain", "b.local"],
    );

    // Pause the leader in the middle of work: reconciles in flight when it stops would go on
    // writing when it resumes, unless the fence stops them.
    for i in 0..30 {
        dbs.create(&PostParams::default(), &database(&format!("burst-{i}")))
            .await
            .unwrap();
    }
    a.signal(libc::SIGSTOP);
    let paused_mid_work = dbs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|d| d.status.as_ref().is_none_or(|s| s.ready_replicas != 1))
        .count();
    println!("paused the leader with {paused_mid_work} clusters not yet ready");
    holder_becomes(&leases, &b, &[&a]).await;
    // The new leader rewrites what the old one made; the old one's watches will see it all.
    devctl_testenv::eventually("the new leader to own the endpoints", TIMEOUT, || async {
        let db = dbs.get("contested").await.ok()?;
        db.status?
            .primary_endpoint?
            .ends_with("b.local")
            .then_some(())
    })
    .await
    .unwrap();

    let mark = cluster.audit_log().unwrap().mark();
    a.signal(libc::SIGCONT);
    let code = a.exit_code(Duration::from_secs(30)).await;
    assert!(
        code.is_some_and(|c| c != 0),
        "the old leader must stop with an error, got {code:?}\n{}",
        a.logs()
    );
    let logs = a.logs();
    assert!(logs.contains("lost the leader lease"), "{logs}");
    let writes = writes_by(cluster, mark, "replica-a");
    assert!(
        writes.is_empty(),
        "the resumed old leader wrote: {writes:#?}\n{logs}"
    );
    let db = dbs.get("contested").await.unwrap();
    assert!(
        db.status
            .unwrap()
            .primary_endpoint
            .unwrap()
            .ends_with("b.local")
    );
}

#[test]
fn election_timings_that_allow_two_leaders_exit_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_devctl-operator"))
        // Webhooks have their own tests; on the shared control plane they would judge every test's objects.
        .env("DEVCTL_WEBHOOK_BIND_ADDRESS", "off")
        .args([
            "--leader-elect",
            "--leader-elect-lease-duration",
            "10s",
            "--leader-elect-renew-deadline",
            "6s",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--leader-elect-renew-deadline") && stderr.contains("half"),
        "{stderr}"
    );
}
