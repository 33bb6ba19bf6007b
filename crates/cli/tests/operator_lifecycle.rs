//! The whole life of an installation, as a platform team runs it: install twice, run the
//! operator with only its ServiceAccount's rights, create databases and web apps in a
//! namespace enforcing Pod Security Standards `restricted`, drive them with the CLI, refuse to
//! uninstall while they exist, then uninstall everything.

mod support;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_operator::manifests::{self, InstallOptions, NAMESPACE};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use support::*;

#[tokio::test]
async fn install_run_drive_and_uninstall() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();
    let dir = tempfile::tempdir().unwrap();

    // Install, wait for the operator Deployment (its pod is admitted in a restricted namespace).
    let first = devctl_ok(
        &kubeconfig,
        &["operator", "install", "--wait", "--timeout", "60"],
    );
    assert!(
        first.contains("deployment devctl-operator created"),
        "{first}"
    );
    let deployments: Api<Deployment> = Api::namespaced(cluster.client().await.unwrap(), NAMESPACE);
    let operator_deployment = deployments.get("devctl-operator").await.unwrap();
    assert_eq!(
        operator_deployment.status.unwrap().available_replicas,
        Some(1)
    );
    let out = cluster
        .kubectl()
        .args([
            "get",
            "namespace",
            NAMESPACE,
            "-o",
            "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "restricted");

    // A second install changes nothing.
    let second = devctl_ok(&kubeconfig, &["operator", "install"]);
    let changed: Vec<&str> = second
        .lines()
        .filter(|l| l.ends_with(" created") || l.ends_with(" configured"))
        .collect();
    assert!(
        changed.is_empty(),
        "second install changed: {changed:?}\n{second}"
    );
    assert_eq!(
        second.lines().filter(|l| l.ends_with(" unchanged")).count(),
        manifests::manifests(&InstallOptions::default()).len()
    );

    // The operator runs with nothing but its ServiceAccount's token.
    let operator_kubeconfig = operator_kubeconfig(cluster, dir.path()).await;
    let log = dir.path().join("operator.log");
    let operator = Operator::start(&operator_kubeconfig, &log);
    wait_admitting(cluster).await;

    let namespace = restricted_namespace(cluster, "lifecycle").await;
    let ns = namespace.as_str();
    let created = devctl(
        &kubeconfig,
        &[
            "db",
            "create",
            "orders",
            "-n",
            ns,
            "--version",
            "16.2",
            "--replicas",
            "3",
            "--storage",
            "5Gi",
            "--wait",
            "--timeout",
            "60",
        ],
    );
    assert!(
        created.status.success(),
        "db create --wait failed: {}{}\noperator log:\n{}",
        stdout(&created),
        stderr(&created),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(
        stderr(&created).contains("phase"),
        "progress is shown: {}",
        stderr(&created)
    );
    let out = cluster
        .kubectl()
        .args(["apply", "-n", ns, "-f"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/webapp.yaml"
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    devctl_ok(
        &kubeconfig,
        &[
            "webapp",
            "create",
            "api",
            "-n",
            ns,
            "--image",
            "registry.example/api:1.0",
            "--port",
            "9000",
            "--replicas",
            "2",
            "--wait",
            "--timeout",
            "60",
        ],
    );

    let list = devctl_ok(&kubeconfig, &["db", "list", "-n", ns]);
    let header: Vec<&str> = list.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "ENGINE", "VERSION", "REPLICAS", "READY", "PHASE", "AGE"
        ]
    );
    assert!(list.lines().nth(1).unwrap().starts_with("orders"), "{list}");
    let json: serde_json::Value = serde_json::from_str(&devctl_ok(
        &kubeconfig,
        &["db", "list", "-n", ns, "-o", "json"],
    ))
    .unwrap();
    assert_eq!(json[0]["metadata"]["name"], "orders");

    let status = devctl_ok(&kubeconfig, &["db", "status", "orders", "-n", ns]);
    for expected in [
        "Phase:       Running",
        "3/3 ready",
        &format!("orders-rw.{ns}.svc.cluster.local"),
        "Ready",
        "orders-0",
        "orders-2",
        "Created",
    ] {
        assert!(
            status.contains(expected),
            "db status lacks {expected:?}:\n{status}"
        );
    }
    let credentials = devctl_ok(&kubeconfig, &["db", "credentials", "orders", "-n", ns]);
    assert!(
        credentials.contains("********")
            && credentials.contains("postgresql://app:********@orders-rw"),
        "{credentials}"
    );
    let shown: serde_json::Value = serde_json::from_str(&devctl_ok(
        &kubeconfig,
        &[
            "db",
            "credentials",
            "orders",
            "-n",
            ns,
            "--show-password",
            "-o",
            "json",
        ],
    ))
    .unwrap();
    let password = shown["password"].as_str().unwrap();
    assert_eq!(password.len(), 32);
    assert!(
        !credentials.contains(password),
        "the password leaked without --show-password"
    );
    // my-service was applied with kubectl (no --wait): its five pods become ready on the
    // control plane's schedule, so wait for its Ready condition before reading its status.
    let waited = cluster
        .kubectl()
        .args([
            "wait",
            "-n",
            ns,
            "--for=condition=Ready",
            "webapp/my-service",
            "--timeout=60s",
        ])
        .output()
        .unwrap();
    assert!(
        waited.status.success(),
        "webapp my-service not Ready within 60 s: {}\n{}",
        String::from_utf8_lossy(&waited.stderr),
        devctl_ok(&kubeconfig, &["webapp", "status", "my-service", "-n", ns])
    );
    let app_status = devctl_ok(&kubeconfig, &["webapp", "status", "my-service", "-n", ns]);
    assert!(app_status.contains("5/5 ready"), "{app_status}");
    assert!(
        devctl_ok(&kubeconfig, &["webapp", "list", "-n", ns]).contains("registry.example/api:1.0")
    );

    // Uninstall is refused while resources exist, and says which.
    let refused = devctl(&kubeconfig, &["operator", "uninstall"]);
    assert!(!refused.status.success());
    let message = stderr(&refused);
    assert_eq!(message.lines().count(), 1, "one-line reason: {message}");
    assert!(
        message.contains(&format!("databasecluster {ns}/orders"))
            && message.contains(&format!("webapp {ns}/my-service")),
        "{message}"
    );

    // `db delete --keep-volumes`: the cluster goes through its finalizer, its data stays.
    let deleted = devctl_ok(
        &kubeconfig,
        &[
            "db",
            "delete",
            "orders",
            "-n",
            ns,
            "--keep-volumes",
            "--wait",
            "--timeout",
            "60",
        ],
    );
    assert!(
        deleted.contains(&format!(
            "databasecluster {ns}/orders deleted (its volumes are kept)"
        )),
        "{deleted}"
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client().await.unwrap(), ns);
    let kept: Vec<String> = claims
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .map(|c| c.metadata.name.unwrap_or_default())
        .collect();
    assert_eq!(
        kept,
        ["data-orders-0", "data-orders-1", "data-orders-2"],
        "the claims are kept"
    );

    // With --delete-resources the operator (still running) finalizes them, then everything goes.
    let uninstall = devctl(
        &kubeconfig,
        &[
            "operator",
            "uninstall",
            "--delete-resources",
            "--timeout",
            "60",
        ],
    );
    assert!(
        uninstall.status.success(),
        "{}{}",
        stdout(&uninstall),
        stderr(&uninstall)
    );
    operator.stop();
    assert_nothing_left(cluster).await;
}

/// Every object the manifests create is gone, and no devctl custom resource remains.
async fn assert_nothing_left(cluster: &devctl_testenv::Cluster) {
    for object in manifests::manifests(&InstallOptions::default()) {
        let kind = object["kind"].as_str().unwrap().to_lowercase();
        let name = object["metadata"]["name"].as_str().unwrap();
        let mut args = vec!["get".to_string(), kind.clone(), name.to_string()];
        if let Some(ns) = object["metadata"]["namespace"].as_str() {
            args.extend(["-n".to_string(), ns.to_string()]);
        }
        let out = cluster.kubectl().args(&args).output().unwrap();
        assert!(!out.status.success(), "{kind} {name} was left behind");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("NotFound")
                || String::from_utf8_lossy(&out.stderr).contains("not found")
        );
    }
    let dbs: Api<DatabaseCluster> = Api::all(cluster.client().await.unwrap());
    assert!(
        matches!(dbs.list(&Default::default()).await, Err(kube::Error::Api(s)) if s.code == 404),
        "the CRD is gone"
    );
}
