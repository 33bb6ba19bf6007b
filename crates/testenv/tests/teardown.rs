//! Nothing outlives a test: not on drop, not when the test process is killed.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use devctl_testenv::process::is_running;
use devctl_testenv::{ControlPlane, eventually};

const TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn dropping_a_control_plane_stops_its_processes_and_removes_its_directory() {
    let cp = ControlPlane::start().await.unwrap();
    let pids = cp.pids();
    let dir = cp.dir().to_path_buf();
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(pids.iter().all(|(_, pid)| is_running(*pid)));
    drop(cp);
    for (name, pid) in pids {
        assert!(!is_running(pid), "{name} ({pid}) still runs after drop");
    }
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

/// Run by the next test in a child process, which is then killed with SIGKILL.
#[tokio::test]
#[ignore = "helper: run only as the child of killed_test_process_takes_its_control_plane_with_it"]
async fn child_holds_a_control_plane() {
    if std::env::var_os("DEVCTL_TESTENV_CHILD").is_none() {
        return;
    }
    let cp = ControlPlane::start().await.unwrap();
    let pids: Vec<String> = cp.pids().iter().map(|(_, pid)| pid.to_string()).collect();
    println!("READY {} {}", cp.dir().display(), pids.join(" "));
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn killed_test_process_takes_its_control_plane_with_it() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holds_a_control_plane",
            "--ignored",
            "--nocapture",
        ])
        .env("DEVCTL_TESTENV_CHILD", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("READY "))
    })
    .await
    .unwrap()
    .expect("the child never reported a running control plane");
    let mut fields = line.split_whitespace().skip(1);
    let dir = PathBuf::from(fields.next().unwrap());
    let pids: Vec<u32> = fields.map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|pid| is_running(*pid)));

    child.kill().unwrap(); // SIGKILL: no destructor, no atexit hook runs.
    child.wait().unwrap();
    eventually(
        "the killed test's etcd and kube-apiserver to die",
        TIMEOUT,
        || async { pids.iter().all(|pid| !is_running(*pid)).then_some(()) },
    )
    .await
    .unwrap();
    // A SIGKILLed process cannot clean its directory; that is all it leaves.
    let _ = std::fs::remove_dir_all(dir);
}

/// Run by the next test in a child process: fails while it holds a control plane.
#[tokio::test]
#[ignore = "helper: run only as the child of a_failing_test_keeps_its_logs_and_stops_its_processes"]
async fn child_fails_holding_a_control_plane() {
    if std::env::var_os("DEVCTL_TESTENV_CHILD").is_none() {
        return;
    }
    let cp = ControlPlane::start().await.unwrap();
    let pids: Vec<String> = cp.pids().iter().map(|(_, pid)| pid.to_string()).collect();
    println!("PIDS {}", pids.join(" "));
    panic!("this test fails on purpose");
}

#[test]
fn a_failing_test_keeps_its_logs_and_stops_its_processes() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_fails_holding_a_control_plane",
            "--ignored",
            "--nocapture",
        ])
        .env("DEVCTL_TESTENV_CHILD", "1")
        .env_remove("DEVCTL_KEEP_TESTENV")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the child test must fail\n{stdout}\n{stderr}"
    );
    let dir = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("devctl-testenv: kept ")?
                .strip_suffix(" (the test failed)")
        })
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no `kept <dir> (the test failed)` line\n{stderr}"));
    let pids: Vec<u32> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PIDS "))
        .unwrap_or_else(|| panic!("the child never started its control plane\n{stdout}"))
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    let kept = dir.join("logs").join("kube-apiserver.log").is_file();
    let running: Vec<u32> = pids.iter().copied().filter(|p| is_running(*p)).collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(kept, "{} holds no kube-apiserver log", dir.display());
    assert!(
        running.is_empty(),
        "still running after the failed test: {running:?}"
    );
}
