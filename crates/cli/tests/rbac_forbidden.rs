//! Least privilege is real: with one rule removed from the installed ClusterRole, the operator
//! fails loudly — a Forbidden condition naming the resource — instead of silently.

mod support;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_operator::manifests::{self, RULES};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use support::*;

#[tokio::test]
async fn a_removed_rule_becomes_a_forbidden_condition() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    devctl_ok(&kubeconfig, &["operator", "install"]);

    let without_pdbs: Vec<_> = RULES
        .iter()
        .copied()
        .filter(|r| !r.resources.contains(&"poddisruptionbudgets"))
        .collect();
    assert_eq!(without_pdbs.len(), RULES.len() - 1);
    let roles = Api::<DynamicObject>::all_with(
        cluster.client().await.unwrap(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRole"),
            "clusterroles",
        ),
    );
    roles
        .patch(
            manifests::NAME,
            &PatchParams::apply(manifests::INSTALL_FIELD_MANAGER).force(),
            &Patch::Apply(manifests::cluster_role(&without_pdbs)),
        )
        .await
        .unwrap();

    let _operator = Operator::start(
        &operator_kubeconfig(cluster, dir.path()).await,
        &dir.path().join("operator.log"),
    );
    wait_admitting(cluster).await;
    let namespace = cluster.create_namespace("forbidden").await.unwrap();
    devctl_ok(
        &kubeconfig,
        &[
            "db",
            "create",
            "guarded",
            "-n",
            &namespace,
            "--version",
            "16.2",
            "--replicas",
            "3",
        ],
    );

    let dbs: Api<DatabaseCluster> = Api::namespaced(cluster.client().await.unwrap(), &namespace);
    let forbidden =
        kube::runtime::wait::await_condition(dbs, "guarded", |db: Option<&DatabaseCluster>| {
            db.and_then(|d| d.status.as_ref())
                .and_then(|s| devctl_api::conditions::find(&s.conditions, "Degraded"))
                .is_some_and(|c| c.reason == "Forbidden")
        });
    let db = tokio::time::timeout(TIMEOUT, forbidden)
        .await
        .expect("no Forbidden condition")
        .unwrap()
        .unwrap();
    let ready = devctl_api::conditions::find(&db.status.as_ref().unwrap().conditions, "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("poddisruptionbudgets") && ready.message.contains("forbidden"),
        "{}",
        ready.message
    );
    let status = devctl_ok(&kubeconfig, &["db", "status", "guarded", "-n", &namespace]);
    assert!(status.contains("Forbidden"), "{status}");

    // `--wait` gives up with the failing condition's message.
    let waited = devctl(
        &kubeconfig,
        &[
            "db",
            "create",
            "guarded-too",
            "-n",
            &namespace,
            "--version",
            "16.2",
            "--replicas",
            "2",
            "--wait",
            "--timeout",
            "15",
        ],
    );
    assert_eq!(waited.status.code(), Some(1));
    let last = stderr(&waited)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert!(
        last.starts_with("error: timed out after 15s waiting for guarded-too")
            && last.contains("Forbidden")
            && last.contains("poddisruptionbudgets"),
        "{last}"
    );
}
