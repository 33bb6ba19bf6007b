//! The pod runner: database pods backed by processes (a fake agent script here, so these
//! tests do not depend on the real `devctl-agent`) or by simulated reports.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use devctl_api::instance::{InstanceStatus, STATUS_ANNOTATION};
use devctl_testenv::process::is_running;
use devctl_testenv::{Cluster, ClusterOptions, PodBacking, eventually};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);

/// A stand-in for devctl-agent: records its environment, user and start/stop in the data
/// directory, then waits (or exits 3 when `FAKE_AGENT_MODE=exit3`). On SIGTERM it takes half
/// a second before it notes its stop and exits, so an agent started too early on the same
/// claim would show up in `events` before that stop. With `FAKE_AGENT_MODE=detach` it also
/// starts a child in a session of its own, as PostgreSQL's backends are (its pid in
/// `detached.<agent pid>`), which forks now and then and, like a backend, exits once the
/// agent is gone (no group kill reaches it).
const FAKE_AGENT: &str = r#"#!/bin/sh
data="$DEVCTL_DATA_DIR"
mkdir -p "$data"
echo "start $$" >> "$data/events"
if [ "$FAKE_AGENT_MODE" = exit3 ]; then
  echo "giving up" >&2
  exit 3
fi
env | sort > "$data/env.tmp" && mv "$data/env.tmp" "$data/env"
id -u > "$data/uid"
[ -e "$data/first-run" ] || echo "$$" > "$data/first-run"
trap 'sleep 0.5; echo "stop $$" >> "$data/events"; kill $child $detached 2>/dev/null; exit 0' TERM
sleep 1000 &
child=$!
if [ "$FAKE_AGENT_MODE" = detach ]; then
  setsid sh -c 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"
    while [ -d "/proc/$2" ]; do sleep 0.2; done' sh "$data/detached.$$" $$ &
  detached=$!
fi
echo "$child" > "$data/sleep.pid"
echo "fake agent $$ running"
touch "$data/ready.$$"
wait $child
"#;

/// The fake agent's path (written once per test binary, atomically).
fn fake_agent() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let path = dir.join("fake-devctl-agent.sh");
        let tmp = dir.join(format!("fake-devctl-agent.sh.{}", std::process::id()));
        std::fs::write(&tmp, FAKE_AGENT).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    })
    .clone()
}

fn process_options() -> ClusterOptions {
    ClusterOptions {
        pods: PodBacking::Processes {
            agent: fake_agent(),
        },
        nodes: 1,
        ..ClusterOptions::default()
    }
}

/// The process-backed cluster shared by this binary's tests.
async fn process_cluster() -> &'static Cluster {
    static CLUSTER: tokio::sync::OnceCell<Cluster> = tokio::sync::OnceCell::const_new();
    let cluster = CLUSTER
        .get_or_init(|| async { Cluster::start_with(process_options()).await.unwrap() })
        .await;
    println!("{}", cluster.describe());
    cluster
}

/// A database StatefulSet shaped like the operator's (labels, volumes, env).
fn statefulset(name: &str, replicas: i32, extra_env: serde_json::Value) -> StatefulSet {
    let labels = json!({
        "app.kubernetes.io/name": "databasecluster",
        "app.kubernetes.io/component": "database",
        "app.kubernetes.io/instance": name,
    });
    let field = |path: &str| json!({ "fieldRef": { "fieldPath": path } });
    let mut env = vec![
        json!({ "name": "POD_NAME", "valueFrom": field("metadata.name") }),
        json!({ "name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace") }),
        json!({ "name": "POD_UID", "valueFrom": field("metadata.uid") }),
        json!({ "name": "POD_IP", "valueFrom": field("status.podIP") }),
        json!({ "name": "DEVCTL_ENGINE", "value": "postgres" }),
        json!({ "name": "DEVCTL_CLUSTER", "value": name }),
        json!({ "name": "DEVCTL_DATA_DIR", "value": "/var/lib/postgresql/data/pgdata" }),
        json!({ "name": "DEVCTL_CONFIG_DIR", "value": "/etc/devctl" }),
        json!({ "name": "DEVCTL_RUN_DIR", "value": "/var/run/postgresql" }),
        json!({ "name": "DEVCTL_PORT", "value": "5432" }),
        json!({ "name": "DEVCTL_LISTEN_ADDRESS", "value": "*" }),
        json!({ "name": "DEVCTL_HEALTH_PORT", "value": "8008" }),
        json!({ "name": "DEVCTL_CREDENTIALS_SECRET", "value": format!("{name}-credentials") }),
    ];
    env.extend(extra_env.as_array().cloned().unwrap_or_default());
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": { "name": name, "labels": labels },
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "serviceAccountName": format!("{name}-agent"),
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "postgres",
                        "image": "postgres:16.4",
                        "command": ["/devctl/bin/devctl-agent"],
                        "args": ["run"],
                        "env": env,
                        "volumeMounts": [
                            { "name": "data", "mountPath": "/var/lib/postgresql/data" },
                            { "name": "config", "mountPath": "/etc/devctl" },
                            { "name": "run", "mountPath": "/var/run/postgresql" },
                            { "name": "agent", "mountPath": "/devctl/bin" },
                        ],
                    }],
                    "volumes": [
                        { "name": "config", "configMap": { "name": format!("{name}-config") } },
                        { "name": "run", "emptyDir": {} },
                        { "name": "agent", "emptyDir": {} },
                    ],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": { "requests": { "storage": "1Gi" } },
                },
            }],
        },
    }))
    .unwrap()
}

async fn create_service_account(client: &kube::Client, ns: &str, name: &str) {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa: ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    api.create(&PostParams::default(), &sa).await.unwrap();
}

async fn create_inputs(client: &kube::Client, ns: &str, name: &str) {
    let config: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": format!("{name}-config") },
        "data": { "postgresql.conf": "max_connections = 20\n" },
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": format!("{name}-credentials"),
            "labels": { "app.kubernetes.io/name": "databasecluster" },
        },
        "stringData": { "username": "app", "password": "s3cret" },
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

async fn apply(client: &kube::Client, ns: &str, sts: &StatefulSet) {
    let name = sts.metadata.name.clone().unwrap();
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .patch(
            &name,
            &PatchParams::apply("pod-runner-test").force(),
            &Patch::Apply(sts),
        )
        .await
        .unwrap();
}

async fn pod_uid(client: &kube::Client, ns: &str, name: &str) -> Option<String> {
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()??;
    pod.metadata.uid
}

fn read_env(path: &Path) -> Option<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn events(claim: &Path) -> Vec<String> {
    std::fs::read_to_string(claim.join("pgdata/events"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The env the fake agent recorded once its run with `pid` is ready.
async fn recorded_env(claim: &Path, pid: u32) -> BTreeMap<String, String> {
    let data = claim.join("pgdata");
    eventually(
        &format!(
            "the fake agent {pid} to record its environment in {}",
            data.display()
        ),
        TIMEOUT,
        || async { data.join(format!("ready.{pid}")).exists().then_some(()) },
    )
    .await
    .unwrap();
    read_env(&data.join("env")).unwrap()
}

#[tokio::test]
async fn an_agent_runs_as_its_pod_would_and_its_claim_outlives_the_pod() {
    let cluster = process_cluster().await;
    let runner = cluster
        .pod_runner()
        .expect("a process-backed cluster has a runner");
    assert!(runner.runs_processes());
    let ns = cluster.create_namespace("runner").await.unwrap();
    let client = cluster.client().await.unwrap();
    create_inputs(&client, &ns, "db").await;
    create_service_account(&client, &ns, "db-agent").await;
    let expanded = json!([
        { "name": "TEST_PASSWORD", "valueFrom": { "secretKeyRef": { "name": "db-credentials", "key": "password" } } },
        { "name": "TEST_EXPANDED", "value": "$(POD_NAME).$(POD_NAMESPACE)" },
    ]);
    apply(&client, &ns, &statefulset("db", 1, expanded)).await;

    let first = runner.wait_running(&ns, "db-0", TIMEOUT).await.unwrap();
    let claim = runner
        .claim_dir(&ns, "data-db-0")
        .expect("the claim's directory");
    assert!(claim.starts_with(runner.root()), "{}", claim.display());
    let env = recorded_env(&claim, first).await;
    let uid = pod_uid(&client, &ns, "db-0").await.unwrap();

    // Paths under the mounts point into the runner's directories.
    assert_eq!(
        env["DEVCTL_DATA_DIR"],
        claim.join("pgdata").display().to_string()
    );
    let config_dir = PathBuf::from(&env["DEVCTL_CONFIG_DIR"]);
    assert!(config_dir.starts_with(runner.root()), "{env:?}");
    assert_eq!(
        std::fs::read_to_string(config_dir.join("postgresql.conf")).unwrap(),
        "max_connections = 20\n"
    );
    let run_dir = PathBuf::from(&env["DEVCTL_RUN_DIR"]);
    assert!(
        run_dir.starts_with(runner.root()) && run_dir.is_dir(),
        "{env:?}"
    );
    // Loopback and fresh ports.
    assert_eq!(env["DEVCTL_LISTEN_ADDRESS"], "127.0.0.1");
    assert_eq!(env["POD_IP"], "127.0.0.1");
    assert_ne!(env["DEVCTL_PORT"], "5432");
    assert_ne!(env["DEVCTL_HEALTH_PORT"], "8008");
    assert_ne!(env["DEVCTL_PORT"], env["DEVCTL_HEALTH_PORT"]);
    // The downward API, references and expansion.
    assert_eq!(env["POD_NAME"], "db-0");
    assert_eq!(env["POD_NAMESPACE"], ns);
    assert_eq!(env["POD_UID"], uid);
    assert_eq!(env["TEST_PASSWORD"], "s3cret");
    assert_eq!(env["TEST_EXPANDED"], format!("db-0.{ns}"));
    assert_eq!(env["DEVCTL_CREDENTIALS_SECRET"], "db-credentials");
    // The major the image declares (postgres:16.4), never Debian's 15 in its place.
    assert_eq!(
        PathBuf::from(&env["DEVCTL_ENGINE_BIN_DIR"]),
        devctl_testenv::pod_runner::engines::postgres_bin_dir(Some("16.4")).unwrap(),
        "{env:?}"
    );
    assert!(env["DEVCTL_ENGINE_BIN_DIR"].ends_with("/16/bin"), "{env:?}");
    // As the image's user when we are root.
    let uid_seen = std::fs::read_to_string(claim.join("pgdata/uid")).unwrap();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let postgres = std::process::Command::new("id")
            .args(["-u", "postgres"])
            .output()
            .unwrap();
        assert_eq!(
            uid_seen.trim(),
            String::from_utf8_lossy(&postgres.stdout).trim()
        );
    }
    // The kubeconfig authenticates as the pod's ServiceAccount.
    let kubeconfig = Kubeconfig::read_from(&env["KUBECONFIG"]).unwrap();
    let agent_client = devctl_testenv::kubeconfig::client(kubeconfig)
        .await
        .unwrap();
    let review = Api::<SelfSubjectReview>::all(agent_client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let user = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    assert_eq!(
        user.as_deref(),
        Some(format!("system:serviceaccount:{ns}:db-agent").as_str())
    );
    // Output goes to the pod's log.
    let log = runner.log_path(&ns, "db-0").unwrap();
    assert!(log.starts_with(runner.logs_dir()));
    eventually("the agent's output in its log", TIMEOUT, || async {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(&format!("fake agent {first} running"))
            .then_some(())
    })
    .await
    .unwrap();

    // Deleting the pod: the StatefulSet recreates it on the same claim; the old agent
    // stops before the new one starts, and the data stays.
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("db-0", &DeleteParams::default())
        .await
        .unwrap();
    let second = eventually("a new agent for the recreated db-0", TIMEOUT, || async {
        runner.pid(&ns, "db-0").filter(|pid| *pid != first)
    })
    .await
    .unwrap();
    let new_uid = pod_uid(&client, &ns, "db-0").await.unwrap();
    assert_ne!(new_uid, uid);
    assert!(!is_running(first), "the first agent ({first}) still runs");
    assert_eq!(runner.claim_dir(&ns, "data-db-0").unwrap(), claim);
    let env = recorded_env(&claim, second).await;
    assert_eq!(env["POD_UID"], new_uid);
    assert_eq!(
        std::fs::read_to_string(claim.join("pgdata/first-run"))
            .unwrap()
            .trim(),
        first.to_string(),
        "the data the first agent wrote is still there"
    );
    let events = events(&claim);
    let position = |line: String| {
        events
            .iter()
            .position(|e| *e == line)
            .unwrap_or_else(|| panic!("no {line:?} in {events:?}"))
    };
    assert!(
        position(format!("stop {first}")) < position(format!("start {second}")),
        "the second agent started before the first stopped: {events:?}"
    );
    let exits = runner.exits(&ns, "db-0");
    let stopped = exits
        .iter()
        .find(|e| e.pid == first)
        .expect("the first agent's exit");
    assert!(stopped.requested && stopped.pod_uid == uid, "{stopped:?}");
    assert_eq!(
        stopped.code,
        Some(0),
        "it exited from its TERM trap: {stopped:?}"
    );

    // Deleting the StatefulSet and the claim: the agent stops and the claim's data goes.
    Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .delete("data-db-0", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the deleted claim's directory to be removed",
        TIMEOUT,
        || async {
            (!claim.exists() && runner.claim_dir(&ns, "data-db-0").is_none()).then_some(())
        },
    )
    .await
    .unwrap();
    assert!(
        !is_running(second),
        "the second agent ({second}) still runs"
    );
    assert_eq!(runner.pid(&ns, "db-0"), None);
}

#[tokio::test]
async fn an_agent_that_exits_is_restarted_and_its_exits_are_recorded() {
    let cluster = process_cluster().await;
    let runner = cluster.pod_runner().unwrap();
    let ns = cluster.create_namespace("crash").await.unwrap();
    let client = cluster.client().await.unwrap();
    create_inputs(&client, &ns, "crash").await;
    create_service_account(&client, &ns, "crash-agent").await;
    let mode = json!([{ "name": "FAKE_AGENT_MODE", "value": "exit3" }]);
    apply(&client, &ns, &statefulset("crash", 1, mode)).await;

    // Exit 3, restart after 1 s, exit 3, restart after 2 s...
    let exits = eventually("two recorded exits of crash-0's agent", TIMEOUT, || async {
        let exits = runner.exits(&ns, "crash-0");
        (exits.len() >= 2).then_some(exits)
    })
    .await
    .unwrap();
    for exit in &exits[..2] {
        assert_eq!(exit.code, Some(3), "{exit:?}");
        assert_eq!(exit.signal, None);
        assert!(!exit.requested, "{exit:?}");
        assert_eq!(exit.last_line.as_deref(), Some("giving up"), "{exit:?}");
    }
    assert_ne!(exits[0].pid, exits[1].pid);
    // As a kubelet's failing readiness probe would show: no agent, not Ready (kwok alone
    // keeps the pod Ready whatever runs). This agent never answers /readyz, so it stays so.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ready = eventually("crash-0 to be marked not Ready", TIMEOUT, || async {
        let pod = pods.get("crash-0").await.ok()?;
        let conditions = pod.status?.conditions?;
        let status = |t: &str| {
            conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
        (status("Ready")?.0 == "False").then(|| (status("Ready"), status("ContainersReady")))
    })
    .await
    .unwrap();
    assert_eq!(
        ready,
        (
            Some(("False".into(), Some("AgentExited".into()))),
            Some(("False".into(), Some("AgentExited".into())))
        )
    );
    let gap = exits[1].at.duration_since(exits[0].at).unwrap_or_default();
    assert!(
        gap >= Duration::from_millis(900),
        "restarted after {gap:?}, before the back-off"
    );
    let log = runner.log_path(&ns, "crash-0").unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("exited with code 3") && text.contains("restarting in"),
        "{text}"
    );

    // Without its ServiceAccount (admission keeps a pod from being created without one, but
    // it can go away later) the next start waits for it, and the log says why.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    accounts
        .delete("crash-agent", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the runner to note the missing ServiceAccount",
        TIMEOUT,
        || async {
            std::fs::read_to_string(&log)
                .ok()?
                .contains("ServiceAccount")
                .then_some(())
        },
    )
    .await
    .unwrap();
    let before = runner.exits(&ns, "crash-0").len();
    create_service_account(&client, &ns, "crash-agent").await;
    eventually(
        "the agent to run again once its ServiceAccount is back",
        TIMEOUT,
        || async { (runner.exits(&ns, "crash-0").len() > before).then_some(()) },
    )
    .await
    .unwrap();

    Api::<StatefulSet>::namespaced(client, &ns)
        .delete("crash", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn dropping_a_process_cluster_stops_its_agents_and_removes_their_directories() {
    let cluster = Cluster::start_with(process_options()).await.unwrap();
    let runner = cluster.pod_runner().unwrap();
    let root = runner.root().to_path_buf();
    let ns = cluster.create_namespace("drop").await.unwrap();
    let client = cluster.client().await.unwrap();
    create_inputs(&client, &ns, "db").await;
    create_service_account(&client, &ns, "db-agent").await;
    apply(&client, &ns, &statefulset("db", 1, json!([]))).await;
    let agent = runner.wait_running(&ns, "db-0", TIMEOUT).await.unwrap();
    let claim = runner.claim_dir(&ns, "data-db-0").unwrap();
    recorded_env(&claim, agent).await;
    let sleeper: u32 = std::fs::read_to_string(claim.join("pgdata/sleep.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(is_running(agent) && is_running(sleeper));

    // Dropping joins the runner thread (up to its 10 s grace): not on the runtime's thread.
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
    assert!(
        !is_running(agent),
        "the agent ({agent}) outlived its cluster"
    );
    assert!(
        !is_running(sleeper),
        "the agent's child ({sleeper}) outlived its cluster"
    );
    assert!(!root.exists(), "{} was not removed", root.display());
}

#[tokio::test]
async fn simulated_pods_report_ready_with_ordinal_0_as_primary() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    let runner = cluster
        .pod_runner()
        .expect("the shared cluster simulates database pods");
    assert!(!runner.runs_processes());
    let ns = cluster.create_namespace("simulated").await.unwrap();
    let client = cluster.client().await.unwrap();
    create_inputs(&client, &ns, "sim").await;
    create_service_account(&client, &ns, "sim-agent").await;
    apply(&client, &ns, &statefulset("sim", 2, json!([]))).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let reports = |version: String| {
        let pods = pods.clone();
        async move {
            let mut reports = Vec::new();
            for name in ["sim-0", "sim-1"] {
                let pod = pods.get_opt(name).await.ok()??;
                let report = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())?;
                if report.credentials_version.as_deref() != Some(version.as_str()) {
                    return None;
                }
                reports.push(report);
            }
            Some(reports)
        }
    };
    let version = secrets
        .get("sim-credentials")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let found = eventually(
        &format!("ready reports ({STATUS_ANNOTATION}) on both pods"),
        TIMEOUT,
        || reports(version.clone()),
    )
    .await
    .unwrap();
    assert!(found.iter().all(|r| r.ready));
    assert_eq!(found[0].role.as_deref(), Some("primary"));
    assert_eq!(found[1].role.as_deref(), Some("replica"));
    assert_eq!(found[0].engine_version.as_deref(), Some("16.4"));
    assert_eq!(found[0].address.as_deref(), Some("127.0.0.1:5432"));
    assert_eq!(found[0].timeline, Some(1));
    assert!(found[0].heartbeat.is_some());
    assert!(found[0].system_identifier.is_some());
    assert_eq!(found[0].system_identifier, found[1].system_identifier);

    // New credentials: every pod of the cluster reports the Secret's new version.
    let changed = secrets
        .patch(
            "sim-credentials",
            &PatchParams::default(),
            &Patch::Merge(json!({ "stringData": { "password": "rotated" } })),
        )
        .await
        .unwrap();
    let version = changed.metadata.resource_version.unwrap();
    eventually(
        "both pods to report the new credentials version",
        TIMEOUT,
        || reports(version.clone()),
    )
    .await
    .unwrap();
    assert_eq!(runner.pids(), Vec::<u32>::new());

    Api::<StatefulSet>::namespaced(client, &ns)
        .delete("sim", &DeleteParams::default())
        .await
        .unwrap();
}

/// A process's state (`R`, `S`, `T`...) and process group, from `/proc/<pid>/stat`.
fn proc_state(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some((state, pgrp))
}

fn is_stopped(pid: u32) -> bool {
    proc_state(pid).is_some_and(|(state, _)| state == 'T')
}

/// Asserts `check` for `duration`, looking every 50 ms: for what must not happen.
async fn holds_for(what: &str, duration: Duration, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + duration;
    loop {
        assert!(check(), "{what}");
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `kubeconfig` pointed at `server`.
fn with_server(mut kubeconfig: Kubeconfig, server: &str) -> Kubeconfig {
    for cluster in &mut kubeconfig.clusters {
        if let Some(cluster) = cluster.cluster.as_mut() {
            cluster.server = Some(server.to_string());
        }
    }
    kubeconfig
}

fn server_of(kubeconfig: &Kubeconfig) -> String {
    kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone())
        .unwrap()
}

/// `GET /version` with a fresh client (no pooled connection), given `timeout`: `Some(true)`
/// answered, `Some(false)` failed, `None` timed out.
async fn version_within(kubeconfig: &Kubeconfig, timeout: Duration) -> Option<bool> {
    let client = devctl_testenv::kubeconfig::client(kubeconfig.clone())
        .await
        .unwrap();
    tokio::time::timeout(timeout, client.apiserver_version())
        .await
        .ok()
        .map(|answer| answer.is_ok())
}

/// A raw TCP connection to `addr` that is accepted but gets no byte back within 300 ms.
async fn black_holed(addr: std::net::SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("a partitioned proxy accepts connections (it does not refuse them)");
    stream
        .write_all(b"\x16\x03\x01\x00\x05hello")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf))
        .await
        .is_err()
}

#[tokio::test]
async fn faults_freeze_kill_and_hold_and_partition_a_pods_agent() {
    let cluster = process_cluster().await;
    let runner = cluster.pod_runner().unwrap();
    let ns = cluster.create_namespace("faults").await.unwrap();
    let client = cluster.client().await.unwrap();
    create_inputs(&client, &ns, "f").await;
    create_service_account(&client, &ns, "f-agent").await;
    let mode = json!([{ "name": "FAKE_AGENT_MODE", "value": "detach" }]);
    apply(&client, &ns, &statefulset("f", 1, mode)).await;
    let agent = runner.wait_running(&ns, "f-0", TIMEOUT).await.unwrap();
    let claim = runner.claim_dir(&ns, "data-f-0").unwrap();
    let env = recorded_env(&claim, agent).await;
    let data = claim.join("pgdata");
    let sleeper: u32 = std::fs::read_to_string(data.join("sleep.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let detached_file = data.join(format!("detached.{agent}"));
    let detached: u32 = eventually("the detached child's pid", TIMEOUT, || async {
        std::fs::read_to_string(&detached_file)
            .ok()?
            .trim()
            .parse()
            .ok()
    })
    .await
    .unwrap();
    // The detached child left the agent's process group: only the tree walk finds it.
    assert_eq!(proc_state(sleeper).unwrap().1, agent);
    assert_ne!(proc_state(detached).unwrap().1, agent);
    let pids = runner.agent_pids(&ns, "f-0");
    assert_eq!(pids.first(), Some(&agent), "{pids:?}");
    assert!(
        pids.contains(&sleeper) && pids.contains(&detached),
        "{pids:?}"
    );

    // Freeze: everything stopped, and the runner neither sees an exit nor restarts.
    runner.freeze(&ns, "f-0").unwrap();
    for pid in [agent, sleeper, detached] {
        assert!(is_stopped(pid), "{pid}: {:?}", proc_state(pid));
    }
    holds_for(
        "a frozen agent stays, stopped, and is not restarted",
        Duration::from_secs(1),
        || {
            runner.pid(&ns, "f-0") == Some(agent)
                && runner.exits(&ns, "f-0").is_empty()
                && is_stopped(agent)
        },
    )
    .await;
    runner.thaw(&ns, "f-0").unwrap();
    for pid in [agent, sleeper, detached] {
        let state = proc_state(pid);
        assert!(state.is_some_and(|(s, _)| s != 'T'), "{pid}: {state:?}");
    }
    assert_eq!(runner.pid(&ns, "f-0"), Some(agent));
    assert!(runner.exits(&ns, "f-0").is_empty());

    // The agent's kubeconfig names its pod's proxy: same address, another port, and TLS
    // (the serving certificate's names) still holds through it.
    let agent_config = Kubeconfig::read_from(&env["KUBECONFIG"]).unwrap();
    let proxy = runner.api_proxy(&ns, "f-0").unwrap();
    assert_eq!(server_of(&agent_config), format!("https://{proxy}"));
    assert_eq!(proxy.ip().to_string(), "127.0.0.1");
    assert_ne!(format!("https://{proxy}"), cluster.server());
    assert_eq!(
        version_within(&agent_config, TIMEOUT).await,
        Some(true),
        "GET /version through the proxy"
    );
    let admin_via_proxy = with_server(
        cluster.admin_kubeconfig().unwrap(),
        &format!("https://{proxy}"),
    );
    let watcher = devctl_testenv::kubeconfig::client(admin_via_proxy)
        .await
        .unwrap();
    let mut watch = Api::<k8s_openapi::api::core::v1::Namespace>::all(watcher)
        .watch(
            &kube::api::WatchParams::default()
                .fields(&format!("metadata.name={ns}"))
                .timeout(290)
                .disable_bookmarks(),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    // From "0": the namespace itself comes first.
    let first = tokio::time::timeout(TIMEOUT, watch.try_next()).await;
    assert!(
        matches!(first, Ok(Ok(Some(_)))),
        "the watch through the proxy: {first:?}"
    );

    // Partition: the open watch ends at once, new connections hang, the rest works.
    runner.partition(&ns, "f-0").unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match watch.try_next().await {
                Ok(Some(kube::api::WatchEvent::Bookmark(_))) => continue,
                other => return other,
            }
        }
    })
    .await;
    assert!(
        matches!(ended, Ok(Ok(None) | Err(_))),
        "the watch's connection was closed: {ended:?}"
    );
    assert!(black_holed(proxy).await, "a new connection got an answer");
    assert_eq!(
        version_within(&agent_config, Duration::from_secs(1)).await,
        None,
        "GET /version through a partitioned proxy must time out"
    );
    client.apiserver_version().await.unwrap();
    // Heal: answers again.
    runner.heal(&ns, "f-0").unwrap();
    assert_eq!(
        version_within(&agent_config, TIMEOUT).await,
        Some(true),
        "GET /version through a healed proxy"
    );

    // Kill and hold: the whole tree goes, the exit is recorded, nothing restarts.
    runner.kill_and_hold(&ns, "f-0").unwrap();
    let exit = runner.exits(&ns, "f-0").pop().unwrap();
    assert_eq!(exit.pid, agent);
    assert_eq!(exit.signal, Some(libc::SIGKILL), "{exit:?}");
    assert!(!exit.requested, "{exit:?}");
    for pid in [agent, sleeper, detached] {
        assert!(!is_running(pid), "{pid} outlived kill_and_hold");
    }
    // Longer than the first back-off (1 s).
    holds_for(
        "a held pod's agent is not restarted",
        Duration::from_millis(1500),
        || runner.pid(&ns, "f-0").is_none() && runner.exits(&ns, "f-0").len() == 1,
    )
    .await;

    // Holds and partitions are by name: the pod's replacement waits for the claim (kept by
    // the holding supervisor until the old pod went), then for the release, and starts cut
    // off from the API server, through a proxy of its own.
    runner.partition(&ns, "f-0").unwrap();
    let old_uid = pod_uid(&client, &ns, "f-0").await.unwrap();
    let old_log = runner.log_path(&ns, "f-0").unwrap();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("f-0", &DeleteParams::default())
        .await
        .unwrap();
    let new_log = eventually("the replacement pod to be held", TIMEOUT, || async {
        let log = runner.log_path(&ns, "f-0").filter(|l| *l != old_log)?;
        std::fs::read_to_string(&log)
            .ok()?
            .contains("held (kill_and_hold)")
            .then_some(log)
    })
    .await
    .unwrap();
    let new_uid = pod_uid(&client, &ns, "f-0").await.unwrap();
    assert_ne!(new_uid, old_uid);
    assert!(new_log.to_string_lossy().contains(&new_uid), "{new_log:?}");
    holds_for(
        "a held replacement does not start",
        Duration::from_millis(500),
        || runner.pid(&ns, "f-0").is_none(),
    )
    .await;
    runner.release(&ns, "f-0").unwrap();
    let replacement = runner.wait_running(&ns, "f-0", TIMEOUT).await.unwrap();
    assert_ne!(replacement, agent);
    let new_env = recorded_env(&claim, replacement).await;
    let new_config = Kubeconfig::read_from(&new_env["KUBECONFIG"]).unwrap();
    let new_proxy = runner.api_proxy(&ns, "f-0").unwrap();
    assert_ne!(new_proxy, proxy);
    assert_eq!(server_of(&new_config), format!("https://{new_proxy}"));
    assert!(
        black_holed(new_proxy).await,
        "the replacement is not cut off"
    );
    runner.heal(&ns, "f-0").unwrap();
    assert_eq!(
        version_within(&new_config, TIMEOUT).await,
        Some(true),
        "GET /version through the replacement's healed proxy"
    );

    // Stopping a frozen agent: SIGTERM reaches it once continued, so it exits from its
    // TERM trap (code 0) within the pod's grace instead of being killed after it.
    let sleeper: u32 = std::fs::read_to_string(data.join("sleep.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let detached_file = data.join(format!("detached.{replacement}"));
    let detached: u32 = eventually("the detached child's pid", TIMEOUT, || async {
        std::fs::read_to_string(&detached_file)
            .ok()?
            .trim()
            .parse()
            .ok()
    })
    .await
    .unwrap();
    runner.freeze(&ns, "f-0").unwrap();
    for pid in [replacement, sleeper, detached] {
        assert!(is_stopped(pid), "{pid}: {:?}", proc_state(pid));
    }
    Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .delete("f", &DeleteParams::default())
        .await
        .unwrap();
    let stopped = eventually("the frozen agent's exit", TIMEOUT, || async {
        runner
            .exits(&ns, "f-0")
            .into_iter()
            .find(|e| e.pid == replacement)
    })
    .await
    .unwrap();
    assert!(stopped.requested, "{stopped:?}");
    assert_eq!(stopped.code, Some(0), "{stopped:?}");
    for pid in [sleeper, detached] {
        assert!(!is_running(pid), "{pid} outlived its frozen agent");
    }
}
