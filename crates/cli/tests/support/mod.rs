//! Running `devctl` and `devctl-operator` as a user would: the built binaries, their exit
//! codes and output.

#![allow(dead_code)]

pub mod backups;
pub mod databases;
pub mod helm;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use devctl_operator::manifests::{NAME, NAMESPACE};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};

pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `devctl` with `args` against `kubeconfig`.
pub fn devctl(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_devctl"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("DEVCTL_LOG")
        .output()
        .expect("run devctl")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

/// Runs `devctl` and fails the test (with its output) unless it exits 0.
pub fn devctl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    succeeded(args, devctl(kubeconfig, args))
}

/// The stdout of `devctl ARGS`, failing the test (with its output) unless it exited 0.
pub fn succeeded(args: &[&str], out: Output) -> String {
    assert!(
        out.status.success(),
        "devctl {args:?} failed ({}):\n{}{}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// The `devctl-operator` binary next to `devctl` (built on demand: cargo builds only the
/// tested package's binaries for its tests).
pub fn operator_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_devctl")).with_file_name("devctl-operator");
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "devctl-operator", "--bin", "devctl-operator"])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building devctl-operator failed");
    }
    path
}

/// A kubeconfig that authenticates as the operator's ServiceAccount with a token from the
/// TokenRequest API: the operator gets exactly the rights the installed RBAC gives it.
pub async fn operator_kubeconfig(cluster: &devctl_testenv::Cluster, dir: &Path) -> PathBuf {
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client().await.unwrap(), NAMESPACE);
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "spec": { "audiences": [], "expirationSeconds": 3600 }
    }))
    .unwrap();
    let token = accounts
        .create_token_request(NAME, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("TokenRequest returned no token");
    let path = dir.join("operator.kubeconfig");
    let kubeconfig = cluster
        .kubeconfig_with_token(&format!("system:serviceaccount:{NAMESPACE}:{NAME}"), &token)
        .unwrap();
    devctl_testenv::kubeconfig::write(&kubeconfig, &path).unwrap();
    path
}

/// The operator binary running with `kubeconfig` and leader election on (as the installed
/// Deployment runs it, so the leader-election Role and the webhooks' rights are exercised
/// too); killed on drop. The installed webhook configurations point at a Service that routes
/// nowhere on the simulated cluster, so it serves them on loopback (`--webhook-url`).
pub struct Operator(Child);

impl Operator {
    pub fn start(kubeconfig: &Path, log: &Path) -> Self {
        let log = std::fs::File::create(log).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self(
            Command::new(operator_binary())
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .arg("--leader-elect")
                .args(["--metrics-bind-address", "127.0.0.1:0"])
                .arg(format!("--webhook-bind-address=127.0.0.1:{port}"))
                .arg(format!("--webhook-url=https://127.0.0.1:{port}"))
                .env_remove("DEVCTL_WEBHOOK_BIND_ADDRESS")
                .env("DEVCTL_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    pub fn stop(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh namespace where pods must pass Pod Security Standards `restricted`.
pub async fn restricted_namespace(cluster: &devctl_testenv::Cluster, prefix: &str) -> String {
    let namespace = cluster.create_namespace(prefix).await.unwrap();
    let out = cluster
        .kubectl()
        .args([
            "label",
            "namespace",
            &namespace,
            "pod-security.kubernetes.io/enforce=restricted",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    namespace
}

/// Waits until the installed operator's webhooks admit a DatabaseCluster (a server-side dry
/// run): right after start the configurations still lack its CA, and the API server picks
/// up the new one asynchronously.
pub async fn wait_admitting(cluster: &devctl_testenv::Cluster) {
    let client = cluster.client().await.unwrap();
    let dbs: Api<devctl_api::database_cluster::DatabaseCluster> =
        Api::namespaced(client, "default");
    let probe: devctl_api::database_cluster::DatabaseCluster =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
            "metadata": { "name": "webhook-probe" },
            "spec": { "version": "16.2", "storage": { "size": "1Gi" } },
        }))
        .unwrap();
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    devctl_testenv::eventually(
        "the operator's webhooks to admit a dry-run create",
        Duration::from_secs(60),
        || {
            let dbs = dbs.clone();
            let probe = probe.clone();
            let params = params.clone();
            async move { dbs.create(&params, &probe).await.ok().map(|_| ()) }
        },
    )
    .await
    .unwrap();
}
