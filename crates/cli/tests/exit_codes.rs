//! Exit codes and messages: 0 on success, non-zero with a one-line reason for user errors;
//! `--help` for every command.

mod support;

use std::process::Command;

use support::*;

fn run(args: &[&str], kubeconfig: Option<&std::path::Path>) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_devctl"));
    command.args(args).env_remove("KUBECONFIG");
    if let Some(k) = kubeconfig {
        command.env("KUBECONFIG", k);
    }
    command.output().unwrap()
}

#[test]
fn every_command_has_help() {
    let commands: &[&[&str]] = &[
        &[],
        &["operator"],
        &["operator", "manifests"],
        &["operator", "install"],
        &["operator", "uninstall"],
        &["db"],
        &["db", "create"],
        &["db", "list"],
        &["db", "status"],
        &["db", "credentials"],
        &["db", "delete"],
        &["webapp"],
        &["webapp", "create"],
        &["webapp", "list"],
        &["webapp", "status"],
        &["webapp", "delete"],
        &["dev"],
        &["dev", "up"],
        &["completions"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let out = run(&args, None);
        assert!(out.status.success(), "{args:?} --help failed");
        assert!(
            stdout(&out).contains("Usage: devctl"),
            "{args:?}: {}",
            stdout(&out)
        );
    }
    let completions = run(&["completions", "bash"], None);
    assert!(completions.status.success() && stdout(&completions).contains("_devctl"));
}

#[test]
fn invalid_flag_values_fail_with_the_reason() {
    let out = run(
        &["db", "create", "x", "--version", "16.2", "--replicas", "9"],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    let first = stderr(&out).lines().next().unwrap_or_default().to_string();
    assert!(
        first.starts_with("error: invalid value '9' for '--replicas"),
        "{first}"
    );
    let out = run(
        &[
            "db",
            "create",
            "x",
            "--version",
            "16.2",
            "--engine",
            "oracle",
        ],
        None,
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out)
            .lines()
            .next()
            .unwrap()
            .contains("invalid value 'oracle'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn unknown_context_and_unreachable_cluster_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: gone\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: gone\n  context:\n    cluster: gone\n    user: u\nusers:\n- name: u\n  user:\n    token: t\ncurrent-context: gone\n",
    )
    .unwrap();

    let out = run(&["db", "list", "--context", "nope"], Some(&kubeconfig));
    assert_eq!(out.status.code(), Some(1));
    let message = stderr(&out);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(
        message.starts_with("error: cannot use kubeconfig context \"nope\""),
        "{message}"
    );

    let out = run(&["db", "list"], Some(&kubeconfig));
    assert_eq!(out.status.code(), Some(1));
    let message = stderr(&out);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(
        message.contains("cannot reach the cluster at https://127.0.0.1:1"),
        "{message}"
    );
}

#[tokio::test]
async fn a_wait_that_times_out_fails_with_the_failing_condition() {
    // CRDs installed but no operator running: the cluster never becomes Ready.
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("timeout").await.unwrap();
    let out = devctl(
        cluster.kubeconfig_path(),
        &[
            "db",
            "create",
            "never",
            "-n",
            &namespace,
            "--version",
            "16.2",
            "--wait",
            "--timeout",
            "2",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let last = stderr(&out).lines().last().unwrap_or_default().to_string();
    assert!(
        last.starts_with("error: timed out after 2s waiting for never"),
        "{last}"
    );

    let missing = devctl(
        cluster.kubeconfig_path(),
        &["db", "status", "ghost", "-n", &namespace],
    );
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        stderr(&missing).trim(),
        format!("error: databasecluster ghost not found in namespace {namespace}")
    );
}

#[tokio::test]
async fn installing_without_permissions_says_forbidden() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("intern.kubeconfig");
    devctl_testenv::kubeconfig::write(
        &cluster.kubeconfig_for("intern", &["interns"]).unwrap(),
        &kubeconfig,
    )
    .unwrap();
    let out = devctl(&kubeconfig, &["operator", "install"]);
    assert_eq!(out.status.code(), Some(1));
    let message = stderr(&out);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(
        message.contains("forbidden") && message.contains("\"intern\""),
        "{message}"
    );
}
