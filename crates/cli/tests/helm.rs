//! The Helm chart (`deploy/helm/devctl`, generated from the same Rust as
//! `devctl operator install`) with the pinned helm built from its Go module, against the
//! test cluster: lint, a server-side dry run, and a real install, upgrade and uninstall that
//! give the install's objects and RBAC rules and leave only the CRDs behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use devctl_operator::manifests::{self, InstallOptions};
use serde_json::Value;

fn helm_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("DEVCTL_HELM") {
        return PathBuf::from(path);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/helm/build.sh");
    let output = Command::new("bash").arg(script).output().unwrap();
    assert!(
        output.status.success(),
        "tools/helm/build.sh failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(stdout.lines().last().unwrap().trim())
}

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/devctl")
}

struct Helm {
    binary: PathBuf,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    fn run(&self, args: &[&str]) -> Output {
        let home = self.home.path();
        Command::new(&self.binary)
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "helm {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

/// `kubectl get KIND NAME -o json`, or `None` when it does not exist.
fn live(cluster: &devctl_testenv::Cluster, object: &Value) -> Option<Value> {
    let mut command = cluster.kubectl();
    command.args([
        "get",
        object["kind"].as_str().unwrap(),
        object["metadata"]["name"].as_str().unwrap(),
        "-o",
        "json",
    ]);
    if let Some(namespace) = object["metadata"]["namespace"].as_str() {
        command.args(["-n", namespace]);
    }
    let output = command.output().unwrap();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("NotFound"), "kubectl get failed: {stderr}");
        return None;
    }
    Some(serde_json::from_slice(&output.stdout).unwrap())
}

fn describe(object: &Value) -> String {
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or_default(),
        object["metadata"]["namespace"].as_str().unwrap_or("-"),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

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

    let lint = helm.ok(&["lint", chart, "--namespace", manifests::NAMESPACE]);
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    // What the API server would accept, for both scopes.
    for extra in [&[][..], &["--set", "watchNamespaces={default}"][..]] {
        let mut args = vec!["template", "devctl", chart, "-n", manifests::NAMESPACE];
        args.extend_from_slice(extra);
        let rendered = helm.ok(&args);
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
        // The Namespace is the release's: a dry run cannot create objects inside it, so the
        // namespace must exist first.
        assert!(
            output.status.success()
                || String::from_utf8_lossy(&output.stderr)
                    .contains("namespaces \"devctl-system\" not found"),
            "server-side dry run of {extra:?} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    helm.ok(&[
        "install",
        "devctl",
        chart,
        "-n",
        manifests::NAMESPACE,
        "--create-namespace",
    ]);
    let expected: Vec<Value> = manifests::manifests(&InstallOptions::default())
        .into_iter()
        .filter(|o| o["kind"] != "Namespace")
        .collect();
    for object in &expected {
        let found = live(cluster, object)
            .unwrap_or_else(|| panic!("{} missing after helm install", describe(object)));
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

    helm.ok(&[
        "upgrade",
        "devctl",
        chart,
        "-n",
        manifests::NAMESPACE,
        "--set",
        "replicaCount=2",
    ]);
    let deployment = expected.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(live(cluster, deployment).unwrap()["spec"]["replicas"], 2);

    let uninstalled = helm.ok(&["uninstall", "devctl", "-n", manifests::NAMESPACE]);
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
}
