//! The Helm chart (`deploy/helm/devctl`, generated from the same Rust as
//! `devctl operator install`) with the pinned helm built from its Go module, against the
//! test cluster: lint, a server-side dry run, and a real install, upgrade and uninstall that
//! give the install's objects and RBAC rules and leave only the CRDs behind.

use std::process::Stdio;

mod support;

use support::helm::{Helm, chart, describe, helm_binary, live};

use devctl_operator::manifests::{self, InstallOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_upgrades_and_uninstalls_what_operator_install_would() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    let helm = Helm {
        binary: helm_binary(),
        kubeconfig: cluster.kubeconfig_path().to_path_buf(),
        home: tempfile::tempdir().unwrap(),
    };
    let chart = chart();
    let chart = chart.to_str().unwrap();

    // The commands as the docs and the issue write them: no namespace given, so the release
    // lives in `default` and the chart creates devctl-system itself.
    let lint = helm.ok(&["lint", chart]);
    assert!(lint.contains("0 chart(s) failed"), "{lint}");
    let lint = helm.ok(&["lint", chart, "--namespace", manifests::NAMESPACE]);
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    helm.ok(&["install", "devctl", chart]);
    let expected = manifests::manifests(&InstallOptions::default());
    for object in &expected {
        let found = live(cluster, object)
            .unwrap_or_else(|| panic!("{} missing after helm install", describe(object)));
        if object["kind"] == "Namespace" {
            assert_eq!(
                found["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted",
                "the namespace is labelled as `devctl operator install` labels it"
            );
        }
        if matches!(object["kind"].as_str(), Some("ClusterRole" | "Role")) {
            assert_eq!(
                found["rules"],
                object["rules"],
                "rules of {}",
                describe(object)
            );
        }
        if matches!(
            object["kind"].as_str(),
            Some("ClusterRoleBinding" | "RoleBinding")
        ) {
            assert_eq!(found["roleRef"], object["roleRef"], "{}", describe(object));
            assert_eq!(
                found["subjects"],
                object["subjects"],
                "{}",
                describe(object)
            );
        }
    }

    // What the API server would accept, for both scopes and both release namespaces (the
    // namespace exists now, so nothing is refused for want of it).
    for extra in [
        &[][..],
        &["-n", manifests::NAMESPACE][..],
        &[
            "-n",
            manifests::NAMESPACE,
            "--set",
            "watchNamespaces={default}",
        ][..],
    ] {
        let mut args = vec!["template", "devctl", chart];
        args.extend_from_slice(extra);
        server_dry_run(cluster, &helm.ok(&args), extra);
    }

    helm.ok(&["upgrade", "devctl", chart, "--set", "replicaCount=2"]);
    let deployment = expected.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(live(cluster, deployment).unwrap()["spec"]["replicas"], 2);

    let uninstalled = helm.ok(&["uninstall", "devctl"]);
    assert!(
        uninstalled.contains("resource policy"),
        "the CRDs are kept and helm says so: {uninstalled}"
    );
    for object in &expected {
        let left = live(cluster, object);
        if object["kind"] == "CustomResourceDefinition" {
            assert!(left.is_some(), "{} was deleted", describe(object));
        } else {
            assert!(
                left.is_none_or(|o| o["metadata"]["deletionTimestamp"].is_string()),
                "{} left behind by helm uninstall",
                describe(object)
            );
        }
    }

    // A release inside devctl-system (`-n devctl-system --create-namespace`): Helm makes the
    // namespace, so the chart does not render it. The kept CRDs belong to the first release
    // (Helm adopts nothing of another release): removed first, as docs/helm.md says.
    for crd in expected
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
    {
        let name = crd["metadata"]["name"].as_str().unwrap();
        let deleted = cluster
            .kubectl()
            .args(["delete", "crd", name, "--wait"])
            .output()
            .unwrap();
        assert!(
            deleted.status.success(),
            "{}",
            String::from_utf8_lossy(&deleted.stderr)
        );
    }
    let namespace = expected.iter().find(|o| o["kind"] == "Namespace").unwrap();
    devctl_testenv::eventually(
        "the uninstalled release's namespace to be gone",
        std::time::Duration::from_secs(120),
        || async { live(cluster, namespace).is_none().then_some(()) },
    )
    .await
    .unwrap();
    let in_namespace = ["-n", manifests::NAMESPACE];
    let mut install = vec!["install", "devctl", chart, "--create-namespace"];
    install.extend_from_slice(&in_namespace);
    helm.ok(&install);
    assert!(live(cluster, deployment).is_some(), "no Deployment");
    let mut manifest = vec!["get", "manifest", "devctl"];
    manifest.extend_from_slice(&in_namespace);
    assert!(
        !helm.ok(&manifest).contains("kind: Namespace"),
        "the release's own namespace is Helm's, not the chart's"
    );
    let mut uninstall = vec!["uninstall", "devctl"];
    uninstall.extend_from_slice(&in_namespace);
    helm.ok(&uninstall);
    assert!(
        live(cluster, deployment).is_none_or(|o| o["metadata"]["deletionTimestamp"].is_string()),
        "the Deployment was left behind"
    );
}

/// `kubectl apply --dry-run=server` of rendered YAML must succeed.
fn server_dry_run(cluster: &devctl_testenv::Cluster, rendered: &str, what: &[&str]) {
    let mut apply = cluster.kubectl();
    apply
        .args(["apply", "--dry-run=server", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = apply.spawn().unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(rendered.as_bytes())
            .unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "server-side dry run of helm template {what:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
