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
    assert_eq!(
        stderr(&out).lines().count(),
        1,
        "one line: {}",
        stderr(&out)
    );
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
    let out = run(&["db", "create", "x", "--wait", "--timeout", "soon"], None);
    assert_eq!(out.status.code(), Some(2));
    let first = stderr(&out).lines().next().unwrap_or_default().to_string();
    assert!(
        first.starts_with("error: invalid value 'soon' for '--timeout")
            && first.contains("use e.g. 90s, 5m, 1h or 1m30s"),
        "{first}"
    );
}

#[test]
fn usage_errors_are_one_line() {
    for (args, says) in [
        (
            &["db", "create", "x"][..],
            "the following required arguments were not provided: --version <VERSION>",
        ),
        (
            &["db", "stauts", "x"][..],
            "unrecognized subcommand 'stauts'",
        ),
        (
            &["db", "list", "--colour"][..],
            "unexpected argument '--colour'",
        ),
    ] {
        let out = run(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{args:?}: {err}"
        );
    }
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
            // A duration as kubectl and helm take it (a bare number of seconds works too).
            "--timeout",
            "2s",
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

#[tokio::test]
async fn a_status_whose_pods_cannot_be_listed_says_so_and_fails() {
    use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
    use kube::core::{ApiResource, GroupVersionKind};
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("nopods").await.unwrap();
    let admin = cluster.client().await.unwrap();
    let db: devctl_api::database_cluster::DatabaseCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster", "metadata": { "name": "orders" },
        "spec": { "version": "16.2", "storage": { "size": "1Gi" } },
        "status": { "selector": "app.kubernetes.io/instance=orders" }
    }))
    .unwrap();
    let dbs: Api<devctl_api::database_cluster::DatabaseCluster> =
        Api::namespaced(admin.clone(), &namespace);
    dbs.create(&PostParams::default(), &db).await.unwrap();
    dbs.patch_status(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({ "status": { "selector": "app.kubernetes.io/instance=orders" } }),
        ),
    )
    .await
    .unwrap();
    // A viewer who may read clusters and events, not pods.
    let role = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": { "name": "viewer" },
        "rules": [
            { "apiGroups": ["db.devctl.io"], "resources": ["databaseclusters"], "verbs": ["get", "list"] },
            { "apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["list"] }
        ]
    });
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": { "name": "viewer" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer" }]
    });
    for (kind, plural, body) in [
        ("Role", "roles", &role),
        ("RoleBinding", "rolebindings", &binding),
    ] {
        let api = Api::<DynamicObject>::namespaced_with(
            admin.clone(),
            &namespace,
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
                plural,
            ),
        );
        api.patch(
            "viewer",
            &PatchParams::apply("devctl-test"),
            &Patch::Apply(body),
        )
        .await
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("viewer.kubeconfig");
    devctl_testenv::kubeconfig::write(&cluster.kubeconfig_for("viewer", &[]).unwrap(), &kubeconfig)
        .unwrap();

    let out = devctl(&kubeconfig, &["db", "status", "orders", "-n", &namespace]);
    let (stdout, stderr) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("Name:        "),
        "what could be read is shown: {stdout}"
    );
    let pods = stdout.split("Pods:").nth(1).unwrap_or_default();
    assert!(
        pods.contains("could not list") && pods.contains("forbidden"),
        "{stdout}"
    );
    assert!(!pods.trim_start().starts_with("(none)"), "{stdout}");
    assert!(
        stderr.contains("forbidden") && stderr.contains("pods"),
        "{stderr}"
    );
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let mut fds = [0; 2];
    // SAFETY: a pipe whose read end is closed before the child starts.
    let write_end = unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::close(fds[0]);
        std::os::fd::OwnedFd::from_raw_fd(fds[1])
    };
    use std::os::fd::FromRawFd;
    let out = Command::new(env!("CARGO_BIN_EXE_devctl"))
        .args(["completions", "bash"])
        .stdout(std::process::Stdio::from(write_end))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.is_empty(),
        "nothing to say about a reader that left: {stderr}"
    );
}
