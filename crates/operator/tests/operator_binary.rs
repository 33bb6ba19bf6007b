//! The `devctl-operator` binary as it is deployed: a kubeconfig, a namespace to watch, JSON
//! logs, SIGTERM to stop. The examples in examples/ are applied with kubectl.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use devctl_api::database_cluster::DatabaseCluster;
use kube::api::Api;
use support::{TIMEOUT, http_get, is_ready};

#[tokio::test]
async fn binary_reconciles_the_examples_in_its_namespace() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("binary").await.unwrap();
    support::bind_rules(
        cluster,
        "devctl-operator-binary",
        devctl_operator::manifests::RULES,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    devctl_testenv::kubeconfig::write(
        &cluster
            .kubeconfig_for("devctl-operator-binary", &[])
            .unwrap(),
        &kubeconfig,
    )
    .unwrap();

    let metrics_port = devctl_testenv::process::free_port().unwrap();
    let mut operator = Command::new(env!("CARGO_BIN_EXE_devctl-operator"))
        // Webhooks have their own tests; on the shared control plane they would judge every test's objects.
        .env("DEVCTL_WEBHOOK_BIND_ADDRESS", "off")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--namespace", &namespace, "--log-format", "json"])
        .args([
            "--metrics-bind-address",
            &format!("127.0.0.1:{metrics_port}"),
        ])
        .env("DEVCTL_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = operator.stderr.take().unwrap();
    let logs = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });

    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    for example in ["postgres.yaml", "mysql.yaml", "mariadb.yaml"] {
        let out = cluster
            .kubectl()
            .args(["apply", "-n", &namespace, "-f"])
            .arg(format!("{examples}/{example}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{example}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dbs: Api<DatabaseCluster> = Api::namespaced(cluster.client().await.unwrap(), &namespace);
    for (name, replicas) in [("my-postgres", 3), ("my-mysql", 1), ("my-mariadb", 3)] {
        let ready = kube::runtime::wait::await_condition(
            dbs.clone(),
            name,
            move |db: Option<&DatabaseCluster>| db.is_some_and(|db| is_ready(db, replicas)),
        );
        tokio::time::timeout(TIMEOUT, ready)
            .await
            .unwrap_or_else(|_| panic!("{name} did not become Ready under the operator binary"))
            .unwrap();
    }
    let mysql_image = cluster
        .kubectl()
        .args([
            "get",
            "sts",
            "my-mysql",
            "-n",
            &namespace,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&mysql_image.stdout), "mysql:8.4");

    // Health and metrics endpoints, with controller-runtime's metric names.
    assert!(
        http_get(metrics_port, "/healthz")
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    assert!(
        http_get(metrics_port, "/readyz")
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    let metrics = http_get(metrics_port, "/metrics").unwrap();
    assert!(
        metrics.contains(
            r#"controller_runtime_reconcile_total{controller="databasecluster",result="success"}"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("controller_runtime_reconcile_time_seconds_bucket"),
        "{metrics}"
    );

    // SAFETY: signalling the child we started.
    unsafe {
        libc::kill(operator.id() as libc::pid_t, libc::SIGTERM);
    }
    let status = operator.wait().unwrap();
    assert!(
        status.success(),
        "devctl-operator exited with {status} on SIGTERM"
    );
    let logs = logs.join().unwrap();
    assert!(
        logs.iter()
            .any(|l| l.starts_with('{') && l.contains("\"starting\"")),
        "expected JSON logs, got: {logs:?}"
    );
}
