//! Least privilege when the operator watches some namespaces: `--watch-namespace` renders a
//! Role and RoleBinding per namespace and nothing namespaced cluster-wide; the operator runs
//! with only that (its ServiceAccount's token) and converges a database there; install prunes
//! the cluster-wide grant of an earlier install and uninstall removes the per-namespace grants;
//! users bound to the built-in `edit` and `view` ClusterRoles get devctl's resources through
//! the aggregated `devctl-edit` and `devctl-view`.
//!
//! The two cluster tests share this binary's cluster and install/uninstall the operator, so
//! they run one at a time ([`SERIAL`]).

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_operator::manifests::{
    self, InstallOptions, NAME, NAMESPACE, RULES, USER_EDIT_NAME, USER_VIEW_NAME,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::Api;
use serde_json::Value;
use support::*;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The resources of the operator's child kinds (everything in `RULES` outside devctl's API
/// groups): none of them may appear in a cluster-wide rule when watching namespaces.
fn child_resources() -> Vec<&'static str> {
    RULES
        .iter()
        .filter(|r| !r.group.ends_with("devctl.io"))
        .flat_map(|r| r.resources.iter().copied())
        .collect()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn manifests_for_a_watched_namespace_grant_nothing_namespaced_cluster_wide() {
    // `manifests` needs no cluster.
    let no_cluster = Path::new("/nonexistent/kubeconfig");
    let printed = devctl_ok(
        no_cluster,
        &["operator", "manifests", "--watch-namespace", "a"],
    );
    let options = InstallOptions {
        watch_namespaces: vec!["a".into()],
        ..InstallOptions::default()
    };
    let objects = manifests::manifests(&options);
    assert_eq!(
        printed,
        manifests::to_yaml(&objects).unwrap(),
        "the CLI prints the library's objects"
    );

    // On the printed text: no ClusterRole document mentions a child kind, no binding is
    // cluster-wide.
    let documents: Vec<&str> = printed.split("---\n").filter(|d| !d.is_empty()).collect();
    let cluster_roles: Vec<&&str> = documents
        .iter()
        .filter(|d| d.lines().any(|l| l == "kind: ClusterRole"))
        .collect();
    assert_eq!(cluster_roles.len(), 2, "only devctl-edit and devctl-view");
    for document in &cluster_roles {
        for resource in child_resources() {
            assert!(
                !document.contains(&format!("- {resource}\n")),
                "a ClusterRole names {resource}:\n{document}"
            );
        }
    }
    assert!(
        !documents
            .iter()
            .any(|d| d.lines().any(|l| l == "kind: ClusterRoleBinding")),
        "no ClusterRoleBinding:\n{printed}"
    );

    // On the objects: the ClusterRoles are the users' ones, rules from RULES are in `a`.
    let names: Vec<&str> = of_kind(&objects, "ClusterRole")
        .iter()
        .filter_map(|r| r["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, [USER_EDIT_NAME, USER_VIEW_NAME]);
    for role in of_kind(&objects, "ClusterRole") {
        for rule in role["rules"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                let resource = resource.as_str().unwrap();
                assert!(
                    !child_resources().contains(&resource),
                    "{resource} in {role}"
                );
            }
        }
    }
    let in_a = |kind: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["namespace"] == "a")
            .unwrap_or_else(|| panic!("no {kind} in namespace a"))
    };
    assert_eq!(in_a("Role")["metadata"]["name"], NAME);
    assert_eq!(in_a("Role")["rules"], manifests::policy_rules(RULES));
    let binding = in_a("RoleBinding");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], NAME);
    assert_eq!(binding["subjects"][0]["kind"], "ServiceAccount");
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    assert!(printed.contains("- --watch-namespace=a\n"), "{printed}");

    // Repeated and comma-separated values, in any order: one grant per namespace.
    let several = devctl_ok(
        no_cluster,
        &[
            "operator",
            "manifests",
            "--watch-namespace",
            "c,a",
            "--watch-namespace",
            "b",
        ],
    );
    for namespace in ["a", "b", "c"] {
        assert_eq!(
            several
                .matches(&format!("  name: {NAME}\n  namespace: {namespace}\n"))
                .count(),
            2,
            "a Role and a RoleBinding in {namespace}:\n{several}"
        );
    }

    // Without the flag: the checked-in cluster-wide default, unchanged.
    let default = devctl_ok(no_cluster, &["operator", "manifests"]);
    assert_eq!(
        default,
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/operator.yaml"
        ))
        .unwrap()
    );
    assert!(default.contains("kind: ClusterRoleBinding"));
    // `-o json`: the same objects as one List.
    let json: serde_json::Value = serde_json::from_str(&devctl_ok(
        no_cluster,
        &["operator", "manifests", "-o", "json"],
    ))
    .unwrap();
    assert_eq!(json["kind"], "List");
    assert_eq!(
        json["items"],
        serde_json::to_value(devctl_operator::manifests::manifests(&Default::default())).unwrap()
    );

    // Not a namespace name: a usage error naming the flag.
    let bad = devctl(
        no_cluster,
        &["operator", "manifests", "--watch-namespace", "Team_A"],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("--watch-namespace"),
        "{}",
        stderr(&bad)
    );
}

/// The operator binary with `kubeconfig`, leader election on and `--namespace` for each of
/// `namespaces` (as the Deployment rendered with `--watch-namespace` runs it); killed on drop.
struct ScopedOperator(Child);

impl ScopedOperator {
    fn start(kubeconfig: &Path, log: &Path, namespaces: &[&str]) -> Self {
        let log = std::fs::File::create(log).unwrap();
        let mut command = Command::new(operator_binary());
        command
            // Webhooks have their own tests; on the shared control plane they would judge every test's objects.
            .env("DEVCTL_WEBHOOK_BIND_ADDRESS", "off")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--leader-elect")
            .args(["--metrics-bind-address", "127.0.0.1:0"])
            .env("DEVCTL_LOG", "info")
            .env_remove("DEVCTL_WATCH_NAMESPACES")
            .stdout(Stdio::null())
            .stderr(log);
        for namespace in namespaces {
            command.arg(format!("--watch-namespace={namespace}"));
        }
        Self(command.spawn().unwrap())
    }
}

impl Drop for ScopedOperator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kubectl auth can-i VERB RESOURCE ARGS...` with `kubeconfig`'s credentials: "yes" or "no".
fn can_i(cluster: &devctl_testenv::Cluster, kubeconfig: &Path, args: &[&str]) -> String {
    let out = cluster
        .kubectl()
        .env("KUBECONFIG", kubeconfig)
        .args(["auth", "can-i"])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn installed_for_one_namespace_the_operator_converges_there_with_only_its_role() {
    let _serial = SERIAL.lock().await;
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let namespace = restricted_namespace(cluster, "scoped").await;
    let ns = namespace.as_str();
    let other = cluster.create_namespace("elsewhere").await.unwrap();

    // A watched namespace must exist: refused before anything is applied.
    let missing = devctl(
        &kubeconfig,
        &["operator", "install", "--watch-namespace", "no-such-ns"],
    );
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("watched namespace no-such-ns does not exist"),
        "{}",
        stderr(&missing)
    );

    // Cluster-wide first, then scoped to one namespace: the cluster-wide grant is pruned.
    devctl_ok(&kubeconfig, &["operator", "install"]);
    let scoped = devctl_ok(
        &kubeconfig,
        &["operator", "install", "--watch-namespace", ns],
    );
    for expected in [
        format!("role {NAME} (namespace {ns}) created"),
        format!("rolebinding {NAME} (namespace {ns}) created"),
        format!("clusterrolebinding {NAME} deleted"),
        format!("clusterrole {NAME} deleted"),
        format!("watching {ns}"),
    ] {
        assert!(scoped.contains(&expected), "lacks {expected:?}:\n{scoped}");
    }
    // Repeating it changes nothing and prunes nothing.
    let again = devctl_ok(
        &kubeconfig,
        &["operator", "install", "--watch-namespace", ns],
    );
    assert!(
        !again.contains(" created")
            && !again.contains(" configured")
            && !again.contains(" deleted"),
        "{again}"
    );

    // No ClusterRoleBinding names the operator's ServiceAccount.
    let client = cluster.client().await.unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    for binding in bindings.list(&Default::default()).await.unwrap() {
        assert!(
            !binding
                .subjects
                .unwrap_or_default()
                .iter()
                .any(|s| s.name == NAME && s.namespace.as_deref() == Some(NAMESPACE)),
            "clusterrolebinding {:?} binds the operator",
            binding.metadata.name
        );
    }

    // The ServiceAccount's real token: rights in the watched namespace, none elsewhere.
    let operator_kubeconfig = operator_kubeconfig(cluster, dir.path()).await;
    let allowed = [
        vec!["get", "secrets", "-n", ns],
        vec!["delete", "secrets", "-n", ns],
        vec!["patch", "databaseclusters.db.devctl.io/status", "-n", ns],
    ];
    for args in &allowed {
        assert_eq!(
            can_i(cluster, &operator_kubeconfig, args),
            "yes",
            "{args:?}"
        );
    }
    let denied = [
        vec!["get", "secrets", "-n", other.as_str()],
        vec!["list", "secrets", "--all-namespaces"],
        vec!["delete", "secrets", "-n", "default"],
        vec![
            "list",
            "databaseclusters.db.devctl.io",
            "-n",
            other.as_str(),
        ],
        vec!["create", "statefulsets.apps", "-n", other.as_str()],
    ];
    for args in &denied {
        assert_eq!(can_i(cluster, &operator_kubeconfig, args), "no", "{args:?}");
    }

    // The operator binary with that token and the same namespace converges a database there.
    // A database in another namespace is created first and never touched.
    devctl_ok(
        &kubeconfig,
        &["db", "create", "ignored", "-n", &other, "--version", "16.2"],
    );
    let log = dir.path().join("operator.log");
    let operator = ScopedOperator::start(&operator_kubeconfig, &log, &[ns]);
    let created = devctl(
        &kubeconfig,
        &[
            "db",
            "create",
            "orders",
            "-n",
            ns,
            "--version",
            "16.2",
            "--replicas",
            "2",
            "--storage",
            "1Gi",
            "--wait",
            "--timeout",
            "60",
        ],
    );
    assert!(
        created.status.success(),
        "db create --wait failed: {}{}\noperator log:\n{}",
        stdout(&created),
        stderr(&created),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), ns);
    let db = dbs.get("orders").await.unwrap();
    let ready = devctl_api::conditions::find(&db.status.as_ref().unwrap().conditions, "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.status, "True", "{ready:?}");
    let ignored = Api::<DatabaseCluster>::namespaced(client.clone(), &other)
        .get("ignored")
        .await
        .unwrap();
    // (The API server defaults an empty status; the operator would add its finalizer, a
    // phase and conditions.)
    assert!(
        ignored.metadata.finalizers.is_none()
            && ignored
                .status
                .as_ref()
                .is_none_or(|s| s.phase.is_none() && s.conditions.is_empty()),
        "the unwatched namespace was reconciled: {:?}",
        ignored.status
    );
    let operator_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !operator_log.to_lowercase().contains("forbidden"),
        "the operator was denied something:\n{operator_log}"
    );

    // Uninstall removes the per-namespace grants too (the operator finalizes `orders` first).
    let uninstall = devctl(
        &kubeconfig,
        &[
            "operator",
            "uninstall",
            "--delete-resources",
            "--timeout",
            "60",
        ],
    );
    assert!(
        uninstall.status.success(),
        "{}{}",
        stdout(&uninstall),
        stderr(&uninstall)
    );
    drop(operator);
    let out = stdout(&uninstall);
    for expected in [
        format!("role {NAME} (namespace {ns}) deleted"),
        format!("rolebinding {NAME} (namespace {ns}) deleted"),
        format!("clusterrole {USER_EDIT_NAME} deleted"),
        format!("clusterrole {USER_VIEW_NAME} deleted"),
    ] {
        assert!(out.contains(&expected), "lacks {expected:?}:\n{out}");
    }
    for kind in ["role", "rolebinding"] {
        let got = cluster
            .kubectl()
            .args(["get", kind, NAME, "-n", ns])
            .output()
            .unwrap();
        assert!(!got.status.success(), "{kind} {NAME} left in {ns}");
    }
}

/// Whether the built-in ClusterRole `name` grants `verb` on `resource` of `group`.
fn grants(role: &ClusterRole, group: &str, resource: &str, verb: &str) -> bool {
    role.rules.iter().flatten().any(|r| {
        r.api_groups.iter().flatten().any(|g| g == group)
            && r.resources.iter().flatten().any(|x| x == resource)
            && r.verbs.iter().any(|v| v == verb)
    })
}

#[tokio::test]
async fn edit_and_view_users_get_devctl_resources_by_aggregation() {
    let _serial = SERIAL.lock().await;
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let namespace = cluster.create_namespace("users").await.unwrap();
    let ns = namespace.as_str();
    devctl_ok(
        &kubeconfig,
        &["operator", "install", "--watch-namespace", ns],
    );

    // The built-in roles pick up devctl-edit / devctl-view (bounded: the controller reacts
    // within a second or two).
    let roles: Api<ClusterRole> = Api::all(cluster.client().await.unwrap());
    let aggregated = devctl_testenv::eventually(
        "the built-in edit, admin and view ClusterRoles to aggregate devctl's roles",
        Duration::from_secs(60),
        || {
            let roles = roles.clone();
            async move {
                let get = |name: &'static str| {
                    let roles = roles.clone();
                    async move { roles.get(name).await.ok() }
                };
                let (edit, admin, view) =
                    (get("edit").await?, get("admin").await?, get("view").await?);
                (grants(&edit, "db.devctl.io", "databaseclusters", "create")
                    && grants(&edit, "apps.devctl.io", "webapps", "delete")
                    && grants(&admin, "db.devctl.io", "databaseclusters", "create")
                    && grants(&view, "db.devctl.io", "databaseclusters/status", "get")
                    && grants(&view, "apps.devctl.io", "webapps", "list")
                    && !grants(&view, "db.devctl.io", "databaseclusters", "create"))
                .then_some(())
            }
        },
    )
    .await;
    if let Err(e) = aggregated {
        panic!("{e} (kube-controller-manager runs clusterrole-aggregation-controller)");
    }

    // alice may edit in the namespace, bob may view.
    for (user, role) in [("alice", "edit"), ("bob", "view")] {
        let out = cluster
            .kubectl()
            .args([
                "create",
                "rolebinding",
                &format!("{user}-{role}"),
                "-n",
                ns,
                &format!("--clusterrole={role}"),
                &format!("--user={user}"),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let user_kubeconfig = |user: &str| {
        let path = dir.path().join(format!("{user}.kubeconfig"));
        devctl_testenv::kubeconfig::write(&cluster.kubeconfig_for(user, &[]).unwrap(), &path)
            .unwrap();
        path
    };
    let alice = user_kubeconfig("alice");
    let bob = user_kubeconfig("bob");

    devctl_ok(
        &alice,
        &["db", "create", "shop", "-n", ns, "--version", "16.2"],
    );
    devctl_ok(
        &alice,
        &[
            "webapp",
            "create",
            "front",
            "-n",
            ns,
            "--image",
            "registry.example/front:1",
            "--port",
            "8080",
        ],
    );
    assert!(devctl_ok(&alice, &["db", "list", "-n", ns]).contains("shop"));

    let refused = devctl(
        &bob,
        &["db", "create", "nope", "-n", ns, "--version", "16.2"],
    );
    assert_eq!(refused.status.code(), Some(1), "{}", stdout(&refused));
    assert!(
        stderr(&refused).contains("forbidden"),
        "{}",
        stderr(&refused)
    );
    assert!(devctl_ok(&bob, &["db", "list", "-n", ns]).contains("shop"));
    assert!(devctl_ok(&bob, &["webapp", "list", "-n", ns]).contains("front"));
    let status = cluster
        .kubectl()
        .env("KUBECONFIG", &bob)
        .args([
            "get",
            "databaseclusters.db.devctl.io",
            "shop",
            "-n",
            ns,
            "--subresource=status",
            "-o",
            "name",
        ])
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "view reads status: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    // Neither may do anything in a namespace where they are not bound.
    let elsewhere = devctl(&bob, &["db", "list", "-n", "default"]);
    assert_eq!(elsewhere.status.code(), Some(1));

    // alice may delete what she created (no operator runs here, so nothing waits on it).
    devctl_ok(&alice, &["db", "delete", "shop", "-n", ns]);
    devctl_ok(&alice, &["webapp", "delete", "front", "-n", ns]);
}
