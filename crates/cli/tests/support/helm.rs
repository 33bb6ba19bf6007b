//! The pinned helm (built from its Go module by tools/helm/build.sh, or `$DEVCTL_HELM`), the
//! chart in deploy/helm/devctl, and reading back what a release made.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub fn helm_binary() -> PathBuf {
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

pub fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/devctl")
}

pub struct Helm {
    pub binary: PathBuf,
    pub kubeconfig: PathBuf,
    pub home: tempfile::TempDir,
}

impl Helm {
    pub fn run(&self, args: &[&str]) -> Output {
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

    pub fn ok(&self, args: &[&str]) -> String {
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
pub fn live(cluster: &devctl_testenv::Cluster, object: &Value) -> Option<Value> {
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

pub fn describe(object: &Value) -> String {
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or_default(),
        object["metadata"]["namespace"].as_str().unwrap_or("-"),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}
