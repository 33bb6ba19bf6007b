//! The war story's fix: the operator is gone, a DatabaseCluster still carries its finalizer,
//! and `uninstall --skip-finalizers` still removes everything, saying what it skipped.

mod support;

use devctl_api::database_cluster::DatabaseCluster;
use kube::api::Api;
use support::*;

#[tokio::test]
async fn uninstall_with_the_operator_stopped_strips_finalizers() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    devctl_ok(&kubeconfig, &["operator", "install"]);
    let namespace = cluster.create_namespace("stranded").await.unwrap();

    // Let the operator put its finalizer on the cluster, then stop it for good.
    let operator = Operator::start(
        &operator_kubeconfig(cluster, dir.path()).await,
        &dir.path().join("operator.log"),
    );
    wait_admitting(cluster).await;
    devctl_ok(
        &kubeconfig,
        &[
            "db",
            "create",
            "stranded",
            "-n",
            &namespace,
            "--version",
            "16.2",
            "--wait",
            "--timeout",
            "60",
        ],
    );
    operator.stop();
    let dbs: Api<DatabaseCluster> = Api::namespaced(cluster.client().await.unwrap(), &namespace);
    assert!(
        dbs.get("stranded")
            .await
            .unwrap()
            .metadata
            .finalizers
            .unwrap()
            .contains(&"db.devctl.io/finalizer".to_string())
    );

    // Without the operator, --delete-resources alone cannot finish: it times out and says why.
    let stuck = devctl(
        &kubeconfig,
        &[
            "operator",
            "uninstall",
            "--delete-resources",
            "--timeout",
            "3",
        ],
    );
    assert!(!stuck.status.success());
    assert!(
        stderr(&stuck).contains("--skip-finalizers"),
        "{}",
        stderr(&stuck)
    );

    let out = devctl_ok(
        &kubeconfig,
        &[
            "operator",
            "uninstall",
            "--skip-finalizers",
            "--timeout",
            "60",
        ],
    );
    assert!(
        out.contains(&format!("databasecluster {namespace}/stranded: removed finalizer db.devctl.io/finalizer; its cleanup was skipped")),
        "{out}"
    );
    let all: Api<DatabaseCluster> = Api::all(cluster.client().await.unwrap());
    assert!(
        matches!(all.list(&Default::default()).await, Err(kube::Error::Api(s)) if s.code == 404),
        "CRD and resources are gone"
    );
}
