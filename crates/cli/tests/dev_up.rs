//! `devctl dev up` as a user runs it: the built binary, its output, Ctrl-C.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use devctl_testenv::process::is_running;

fn children_of(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    // Children may be forked by any thread: read every task's list.
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            all.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    all
}

#[test]
fn dev_up_runs_a_cluster_until_ctrl_c() {
    let mut devctl = Command::new(env!("CARGO_BIN_EXE_devctl"))
        .args(["dev", "up", "--nodes", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = devctl.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let kubeconfig = lines
        .find_map(|l| {
            l.trim()
                .strip_prefix("export KUBECONFIG=")
                .map(str::to_string)
        })
        .expect("dev up never printed the KUBECONFIG line");
    let kubectl = lines
        .find_map(|l| l.trim().strip_suffix(" get nodes").map(str::to_string))
        .expect("dev up never printed a first command to try");

    let output = Command::new(&kubectl)
        .args(["get", "nodes", "-o", "json"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let nodes: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(nodes["items"].as_array().unwrap().len(), 2);

    // The newcomer's path: apply the example, the in-process operator makes it Running.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/postgres.yaml");
    let apply = Command::new(&kubectl)
        .args(["apply", "-f", example])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(
        apply.status.success(),
        "{}",
        String::from_utf8_lossy(&apply.stderr)
    );
    let wait = Command::new(&kubectl)
        .args([
            "wait",
            "dbc/my-postgres",
            "--for=jsonpath={.status.phase}=Running",
            "--timeout=60s",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(
        wait.status.success(),
        "the example never reached Running: {}",
        String::from_utf8_lossy(&wait.stderr)
    );
    // ... and `devctl db status` says so.
    let status = Command::new(env!("CARGO_BIN_EXE_devctl"))
        .args(["db", "status", "my-postgres"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && printed.lines().any(|l| l.contains("Running")),
        "devctl db status my-postgres:\n{printed}{}",
        String::from_utf8_lossy(&status.stderr)
    );

    let processes = children_of(devctl.id());
    assert!(
        processes.len() >= 5,
        "expected etcd, apiserver, controller-manager, scheduler, kwok: {processes:?}"
    );
    // SAFETY: signalling the child we started.
    unsafe {
        libc::kill(devctl.id() as libc::pid_t, libc::SIGINT);
    }
    let status = devctl.wait().unwrap();
    assert!(status.success(), "dev up exited with {status} after Ctrl-C");
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes.iter().any(|p| is_running(*p)) {
        assert!(
            Instant::now() < deadline,
            "control-plane processes survived dev up: {processes:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !std::path::Path::new(&kubeconfig).exists(),
        "the kubeconfig was left behind"
    );
}
