//! `devctl` as a kubectl plugin: an executable named `kubectl-devctl` on PATH (here a symlink
//! to the built `devctl`, as docs/distribution.md tells users to install it), run through the
//! pinned kubectl, behaves exactly like `devctl`.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// A directory holding `kubectl-devctl`, a symlink to the devctl under test.
fn plugin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_devctl"),
        dir.path().join("kubectl-devctl"),
    )
    .unwrap();
    dir
}

/// PATH with `dir` first, where kubectl looks for plugins.
fn path_with(dir: &Path) -> OsString {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&rest)))
        .unwrap()
}

/// Runs `program args` with PATH as given and nothing else that could tell the two
/// invocations apart (no KUBECONFIG, no DEVCTL_LOG: the tests pass `--kubeconfig`).
fn run(program: &Path, args: &[&str], path: &OsString) -> Output {
    Command::new(program)
        .args(args)
        .env("PATH", path)
        .env_remove("KUBECONFIG")
        .env_remove("DEVCTL_LOG")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

fn ok(output: Output, what: &str) -> Vec<u8> {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_devctl_prints_what_devctl_prints_and_its_help_says_kubectl_devctl() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("plugin").await.unwrap();
    let kubectl = cluster.binaries().path("kubectl");
    let kubeconfig = cluster.kubeconfig_path().to_str().unwrap().to_string();
    let plugins = plugin_dir();
    let path = path_with(plugins.path());
    let devctl = Path::new(env!("CARGO_BIN_EXE_devctl"));

    // Help and usage name the command the user typed.
    let help = ok(
        run(&kubectl, &["devctl", "db", "status", "--help"], &path),
        "kubectl devctl db status --help",
    );
    let help = String::from_utf8_lossy(&help);
    assert!(help.contains("Usage: kubectl devctl db status"), "{help}");
    let help = ok(
        run(devctl, &["db", "status", "--help"], &path),
        "devctl db status --help",
    );
    let help = String::from_utf8_lossy(&help);
    assert!(help.contains("Usage: devctl db status"), "{help}");

    // A Running cluster (simulated pods), made by the in-process operator for this namespace.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let client = cluster.client().await.unwrap();
    let watched = vec![namespace.clone()];
    let operator = tokio::spawn(async move {
        devctl_operator::run(
            client,
            &watched,
            devctl_operator::Settings::default(),
            "test",
            stopped,
        )
        .await
    });
    let create_args: Vec<String> = [
        "db",
        "create",
        "orders",
        "--kubeconfig",
        &kubeconfig,
        "-n",
        &namespace,
        "--version",
        "16.2",
        "--replicas",
        "1",
        "--storage",
        "1Gi",
        "--wait",
        "--timeout",
        "60",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (devctl_path, create_path) = (devctl.to_path_buf(), path.clone());
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = create_args.iter().map(String::as_str).collect();
        ok(
            run(&devctl_path, &args, &create_path),
            "devctl db create --wait",
        )
    })
    .await
    .unwrap();
    // The operator stops so that nothing changes the cluster between the invocations.
    let _ = stop.send(true);
    if tokio::time::timeout(Duration::from_secs(30), operator)
        .await
        .is_err()
    {
        panic!("the in-process operator did not stop within 30 s");
    }

    let status = [
        "db",
        "status",
        "orders",
        "--kubeconfig",
        &kubeconfig,
        "-n",
        &namespace,
        "-o",
        "json",
    ];
    let plugin_args: Vec<&str> = std::iter::once("devctl").chain(status).collect();
    // A late write (an event, a pod status) between the two would differ for a reason
    // other than the plugin; devctl before and after the plugin agreeing rules that out.
    for _ in 0..3 {
        let before = ok(run(devctl, &status, &path), "devctl db status");
        let plugin = ok(
            run(&kubectl, &plugin_args, &path),
            "kubectl devctl db status",
        );
        let after = ok(run(devctl, &status, &path), "devctl db status");
        if before != after {
            continue;
        }
        let json: serde_json::Value = serde_json::from_slice(&plugin)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&plugin)));
        assert_eq!(json["databaseCluster"]["metadata"]["name"], "orders");
        assert_eq!(json["databaseCluster"]["status"]["phase"], "Running");
        assert_eq!(json["pods"].as_array().map(Vec::len), Some(1), "{json:#}");
        assert!(
            plugin == before,
            "kubectl devctl printed:\n{}\ndevctl printed:\n{}",
            String::from_utf8_lossy(&plugin),
            String::from_utf8_lossy(&before)
        );
        return;
    }
    panic!("db status kept changing between invocations; cannot compare");
}
