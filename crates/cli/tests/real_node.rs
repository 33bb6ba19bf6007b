//! devctl where users run it: a real node (containerd, runc, a kubelet and kube-proxy, the CNI
//! bridge, CoreDNS; docs/testenv.md) running the operator image from tools/image/build.sh,
//! installed with the Helm chart, and PostgreSQL 15 in containers: streaming replication over
//! the `-rw` name, `devctl db shell` through a port-forward, failover after a deleted primary
//! pod and after a hung agent (the kubelet's probes), a backup to versitygw restored into a
//! new cluster, a drain held by the PodDisruptionBudget, and `helm uninstall`.
//!
//! One test, its steps in order: they share one node, and a drain touches every pod on it.
//! It skips (with the reason) only where containers cannot run; under `CI=true` that fails.

mod support;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_operator::manifests::{self, InstallOptions};
use devctl_testenv::real_node::{NODE_NAME, POSTGRES_IMAGE, RealNode};
use devctl_testenv::s3::S3Server;
use devctl_testenv::{Cluster, ClusterOptions, PodBacking, eventually};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use support::databases::ready;
use support::helm::{Helm, chart, describe, helm_binary, live};

const NAMESPACE: &str = "shop";
const READY: Duration = Duration::from_secs(300);
const FAILOVER: Duration = Duration::from_secs(180);

struct World {
    cluster: Cluster,
    s3: S3Server,
    helm: Helm,
    kubeconfig: PathBuf,
}

impl World {
    fn kubectl(&self, args: &[&str]) -> Output {
        self.cluster
            .kubectl()
            .args(args)
            .output()
            .expect("run kubectl")
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}):\n{}{}",
            out.status,
            support::stdout(&out),
            support::stderr(&out)
        );
        support::stdout(&out)
    }

    fn apply(&self, object: &Value) {
        let out = self.apply_output(object);
        assert!(
            out.status.success(),
            "kubectl apply of {} failed:\n{}",
            describe(object),
            support::stderr(&out)
        );
    }

    /// `kubectl apply -f -` of `object`.
    fn apply_output(&self, object: &Value) -> Output {
        let mut child = self
            .cluster
            .kubectl()
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(object.to_string().as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// `devctl -n shop ARGS`, off the runtime's threads.
    async fn devctl(&self, args: &[&str]) -> Output {
        let kubeconfig = self.kubeconfig.clone();
        let mut all = vec!["-n".to_string(), NAMESPACE.to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            support::devctl(&kubeconfig, &args)
        })
        .await
        .unwrap()
    }

    async fn devctl_ok(&self, args: &[&str]) -> String {
        support::succeeded(args, self.devctl(args).await)
    }

    /// `sql` as the superuser in the app database on `pod`'s socket, through the kubelet
    /// (`kubectl exec`).
    fn superuser_sql(&self, pod: &str, sql: &str) -> String {
        self.kubectl_ok(&[
            "exec",
            "-n",
            NAMESPACE,
            pod,
            "-c",
            "postgres",
            "--",
            "psql",
            "-h",
            "/var/run/postgresql",
            "-U",
            "postgres",
            "-d",
            "app",
            "-X",
            "-A",
            "-t",
            "-c",
            sql,
        ])
        .trim()
        .to_string()
    }

    async fn db(&self, name: &str) -> DatabaseCluster {
        let api: Api<DatabaseCluster> =
            Api::namespaced(self.cluster.client().await.unwrap(), NAMESPACE);
        api.get(name).await.unwrap()
    }

    async fn wait_ready(&self, name: &str, why: &str) -> DatabaseCluster {
        let api: Api<DatabaseCluster> =
            Api::namespaced(self.cluster.client().await.unwrap(), NAMESPACE);
        let result = eventually(
            &format!("databasecluster {name} Ready ({why})"),
            READY,
            || async {
                api.get(name).await.ok().filter(|db| {
                    ready(db)
                        && db
                            .status
                            .as_ref()
                            .is_some_and(|s| s.ready_replicas == db.spec.replicas)
                })
            },
        )
        .await;
        match result {
            Ok(db) => db,
            Err(e) => panic!("{e}\n{}", self.diagnose()),
        }
    }

    fn diagnose(&self) -> String {
        let pods = self.kubectl(&["get", "pods", "-A", "-o", "wide"]);
        let events = self.kubectl(&["get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp"]);
        let node = self
            .cluster
            .real_node()
            .map(|n| n.describe())
            .unwrap_or_default();
        format!(
            "pods:\n{}\nevents in {NAMESPACE}:\n{}\n{node}\n{}",
            support::stdout(&pods),
            support::stdout(&events),
            self.cluster.describe()
        )
    }

    async fn pods(&self, cluster: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.cluster.client().await.unwrap(), NAMESPACE);
        api.list(
            &ListParams::default().labels(&format!("{}={cluster}", devctl_api::labels::INSTANCE)),
        )
        .await
        .unwrap()
        .items
    }
}

fn primary(db: &DatabaseCluster) -> String {
    db.status
        .as_ref()
        .and_then(|s| s.current_primary.clone())
        .expect("a current primary")
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The host pid of `pod`'s agent: the process running devctl-agent as its container's first
/// process (pid 1 in the container's namespace: `devctl-agent wal-push`, which PostgreSQL
/// starts, runs the same binary with the same environment), whose environment names the pod's
/// UID.
fn agent_pid(pod: &Pod) -> Option<i32> {
    // The pod's UID: another test's process-backed pod may have the same name.
    let wanted = format!("POD_UID={}", pod.metadata.uid.as_deref()?);
    let agents = devctl_testenv::process::processes_where(|pid, exe| {
        if !exe.ends_with("devctl-agent") {
            return false;
        }
        let first_in_container =
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .is_some_and(|ids| ids.split_whitespace().last() == Some("1"))
            });
        first_in_container
            && std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|environ| environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()))
    });
    agents.first().and_then(|pid| i32::try_from(*pid).ok())
}

async fn start() -> Option<World> {
    if let Some(why) = RealNode::unavailable() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the real node cannot run on this CI machine: {why}"
        );
        eprintln!("skipped: {why}");
        return None;
    }
    let cluster = Cluster::start_with(ClusterOptions {
        nodes: 0,
        pods: PodBacking::None,
        real_node: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let address = cluster.real_node().unwrap().address();
    let s3 = S3Server::start_on(address).await.unwrap();
    let helm = Helm {
        binary: helm_binary(),
        kubeconfig: cluster.kubeconfig_path().to_path_buf(),
        home: tempfile::tempdir().unwrap(),
    };
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();
    Some(World {
        cluster,
        s3,
        helm,
        kubeconfig,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_and_postgres_run_in_containers_on_a_real_node() {
    let Some(world) = start().await else {
        return;
    };
    let chart = chart();
    let chart = chart.to_str().unwrap();

    // The chart, as the docs write it: the image it names was imported into containerd.
    world
        .helm
        .ok(&["install", "devctl", chart, "--wait", "--timeout", "300s"]);
    let operator_pods: Value = serde_json::from_str(&world.kubectl_ok(&[
        "get",
        "pods",
        "-n",
        manifests::NAMESPACE,
        "-o",
        "json",
    ]))
    .unwrap();
    let operator = &operator_pods["items"][0];
    assert_eq!(operator["spec"]["nodeName"], NODE_NAME, "{operator}");
    assert_eq!(
        operator["spec"]["containers"][0]["image"],
        format!(
            "{}:v{}",
            devctl_testenv::real_node::OPERATOR_IMAGE_REPOSITORY,
            env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(operator["status"]["phase"], "Running");

    // The validating webhook answers through its Service (the API server reaches the pod
    // through kube-proxy's rules).
    let namespace = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": { "name": NAMESPACE, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
        }},
    });
    world.apply(&namespace);
    let bad = json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "refused", "namespace": NAMESPACE },
        "spec": { "engine": "mariadb", "version": "10.6", "replicas": 1, "storage": { "size": "1Gi" } },
    });
    // kube-proxy programs the new Service's rules within a second or so of the pod's
    // readiness (helm --wait): until then the API server's call is refused.
    let out = eventually(
        "the webhook to answer through its Service",
        Duration::from_secs(60),
        || async {
            let out = world.apply_output(&bad);
            (!support::stderr(&out).contains("failed calling webhook")).then_some(out)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", world.diagnose()));
    let stderr = support::stderr(&out);
    assert!(
        !out.status.success()
            && stderr.contains("denied the request")
            && stderr.contains("spec.version"),
        "the webhook refuses MariaDB 10.6, naming spec.version: {stderr}"
    );

    // Three instances in containers, under PSS `restricted`, backing up to versitygw on the
    // host (reached from the pod network).
    for secret in [
        json!({ "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "s3-credentials", "namespace": NAMESPACE },
            "stringData": { "accessKeyId": world.s3.access_key_id(), "secretAccessKey": world.s3.secret_access_key() } }),
        json!({ "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "s3-ca", "namespace": NAMESPACE },
            "stringData": { "ca.crt": world.s3.ca_pem() } }),
    ] {
        world.apply(&secret);
    }
    world.apply(&json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "pg", "namespace": NAMESPACE },
        "spec": {
            "engine": "postgres", "version": "15.18", "replicas": 3, "image": POSTGRES_IMAGE,
            "storage": { "size": "1Gi" },
            "highAvailability": { "enabled": true, "failoverTimeout": "10s" },
            "backup": { "enabled": true, "destination": {
                "endpoint": world.s3.endpoint(), "bucket": world.s3.bucket(), "path": "real-node",
                "credentialsSecret": "s3-credentials", "caSecret": "s3-ca",
            }},
        },
    }));
    let db = world
        .wait_ready("pg", "three instances in containers")
        .await;
    let first_primary = primary(&db);
    let pods = world.pods("pg").await;
    assert_eq!(pods.len(), 3);
    for pod in &pods {
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some(NODE_NAME)
        );
    }

    // Streaming replication, the replicas connected through the `-rw` Service's DNS name.
    assert_eq!(
        world.superuser_sql(
            &first_primary,
            "select count(*) from pg_stat_replication where state = 'streaming'"
        ),
        "2"
    );
    for pod in pods
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .filter(|p| *p != first_primary)
    {
        let sender = world.superuser_sql(pod, "select sender_host from pg_stat_wal_receiver");
        assert!(sender.starts_with("pg-rw"), "{pod} streams from {sender:?}");
    }

    // `devctl db shell` through a port-forward (the API server, the kubelet, containerd).
    let rows = world
        .devctl_ok(&[
            "db", "shell", "pg", "--port-forward", "--", "-A", "-t", "-c",
            "create table orders (id int primary key); insert into orders select generate_series(1, 1000); select count(*) from orders",
        ])
        .await;
    assert!(rows.trim().ends_with("1000"), "{rows}");

    // The primary's pod deleted while the node takes no new pods (cordoned, as for
    // maintenance): its replacement cannot start, the lock it released is not taken back,
    // and a replica takes over after failoverTimeout. Uncordoned, the pod comes back and
    // rejoins as a replica. (A deleted primary pod that returns within failoverTimeout takes
    // its lock back and stays primary: docs/failover.md.)
    world.kubectl_ok(&["cordon", NODE_NAME]);
    world.kubectl_ok(&[
        "delete",
        "pod",
        "-n",
        NAMESPACE,
        &first_primary,
        "--wait=false",
    ]);
    let db = eventually(
        "a new primary after the primary's pod was deleted",
        FAILOVER,
        || async {
            let db = world.db("pg").await;
            let current = db.status.as_ref().and_then(|s| s.current_primary.clone())?;
            (current != first_primary).then_some(db)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", world.diagnose()));
    world.kubectl_ok(&["uncordon", NODE_NAME]);
    let second_primary = primary(&db);
    world
        .wait_ready("pg", "the deleted primary's pod rejoined")
        .await;
    assert_eq!(
        world.superuser_sql(
            &second_primary,
            "select count(*) from pg_stat_replication where state = 'streaming'"
        ),
        "2",
        "both other instances stream from the new primary {second_primary}"
    );
    assert_eq!(
        world.superuser_sql(&first_primary, "select pg_is_in_recovery()"),
        "t"
    );
    assert_eq!(
        world.superuser_sql(&second_primary, "select count(*) from orders"),
        "1000"
    );

    // A backup to versitygw, restored into a new cluster.
    world
        .devctl_ok(&["db", "backup", "pg", "--wait", "--timeout", "300"])
        .await;
    let backups = world.kubectl_ok(&[
        "get",
        "databasebackups",
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    world
        .devctl_ok(&[
            "db",
            "restore",
            "pg-restored",
            "--from",
            backups.trim(),
            "--wait",
            "--timeout",
            "400",
        ])
        .await;
    assert_eq!(
        world.superuser_sql("pg-restored-0", "select count(*) from orders"),
        "1000"
    );

    // A hung agent (stopped): the kubelet's probes turn the pod NotReady and a replica takes
    // over; the liveness probe restarts the container, which rejoins.
    // The primary now (the restore and the backup may have moved it).
    let hung = primary(&world.db("pg").await);
    let api: Api<Pod> = Api::namespaced(world.cluster.client().await.unwrap(), NAMESPACE);
    let pid = agent_pid(&api.get(&hung).await.unwrap())
        .unwrap_or_else(|| panic!("no devctl-agent process for {hung}"));
    // SAFETY: kill(2) with SIGSTOP on the agent's pid.
    unsafe {
        libc::kill(pid, libc::SIGSTOP);
    }
    eventually(
        &format!("{hung} NotReady through its readiness probe"),
        FAILOVER,
        || async {
            api.get(&hung)
                .await
                .ok()
                .filter(|p| !pod_ready(p))
                .map(|_| ())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", world.diagnose()));
    let db = eventually(
        "a replica takes over from the hung primary",
        FAILOVER,
        || async {
            let db = world.db("pg").await;
            let current = db.status.as_ref().and_then(|s| s.current_primary.clone())?;
            (current != hung).then_some(db)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", world.diagnose()));
    let third_primary = primary(&db);
    eventually(
        &format!("the liveness probe to restart {hung}'s container, and it to rejoin"),
        FAILOVER,
        || async {
            let pod = api.get(&hung).await.ok()?;
            let restarts = pod
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .find(|c| c.name == "postgres")?
                .restart_count;
            (restarts >= 1 && pod_ready(&pod)).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", world.diagnose()));
    world
        .wait_ready("pg", "the hung agent's container restarted and rejoined")
        .await;
    assert_eq!(
        world.superuser_sql(&hung, "select pg_is_in_recovery()"),
        "t"
    );
    assert_eq!(
        world.superuser_sql(&third_primary, "select count(*) from orders"),
        "1000"
    );

    // A drain is held by the PodDisruptionBudget: one instance at a time.
    let drained = world.kubectl(&[
        "drain",
        NODE_NAME,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--pod-selector",
        &format!("{}=pg", devctl_api::labels::INSTANCE),
        "--timeout",
        "40s",
    ]);
    let output = format!("{}{}", support::stdout(&drained), support::stderr(&drained));
    assert!(!drained.status.success(), "the drain finished: {output}");
    assert!(output.contains("disruption budget"), "{output}");
    // kubectl says "evicting pod" for each attempt and "pod/… evicted" for each eviction.
    let evicted = output
        .lines()
        .filter(|l| l.trim_end().ends_with(" evicted"))
        .count();
    assert_eq!(evicted, 1, "exactly one instance was evicted: {output}");
    let serving = world
        .pods("pg")
        .await
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
        .count();
    assert_eq!(
        serving, 2,
        "two instances kept serving through the drain: {output}"
    );
    world.kubectl_ok(&["uncordon", NODE_NAME]);
    world
        .wait_ready("pg", "the evicted instance came back after uncordon")
        .await;

    // `helm uninstall` removes what the chart made (the CRDs stay, as Helm keeps crds/) and
    // nothing else: the databases and their pods stay.
    world.helm.ok(&["uninstall", "devctl", "--wait"]);
    for object in manifests::manifests(&InstallOptions::default()) {
        let left = live(&world.cluster, &object);
        if object["kind"] == "CustomResourceDefinition" {
            assert!(left.is_some(), "{} was deleted", describe(&object));
        } else {
            assert!(
                left.is_none_or(|o| o["metadata"]["deletionTimestamp"].is_string()),
                "{} left behind by helm uninstall",
                describe(&object)
            );
        }
    }
    for name in ["pg", "pg-restored"] {
        world.db(name).await;
        assert!(!world.pods(name).await.is_empty(), "{name}'s pods are gone");
    }
}
