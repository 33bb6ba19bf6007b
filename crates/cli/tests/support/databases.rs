//! Process-backed database clusters for the CLI's data-path tests: a shared cluster whose
//! database pods run `devctl-agent` with Debian's PostgreSQL/MariaDB, a namespace per test,
//! the operator in-process, and `devctl` as a user runs it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::{InstanceStatus, STATUS_ANNOTATION};
use devctl_testenv::watch::Since;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

pub const READY_TIMEOUT: Duration = Duration::from_secs(150);

/// The `devctl-agent` binary the process runner starts (built on demand: cargo builds only
/// the tested package's binaries for its tests).
pub fn ensure_agent_built() {
    let path = Path::new(env!("CARGO_BIN_EXE_devctl")).with_file_name("devctl-agent");
    if !path.exists() {
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "devctl-agent", "--bin", "devctl-agent"])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building devctl-agent failed");
    }
}

/// The user the in-process operator acts as (the suite's operator tests use the same name).
const OPERATOR_USER: &str = "devctl-operator-under-test";

pub struct Env {
    pub cluster: &'static devctl_testenv::Cluster,
    pub client: kube::Client,
    /// Acts as the operator: bound to the generated ClusterRole only.
    operator_client: kube::Client,
    pub namespace: String,
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    /// Dropping it stops the in-process operator.
    operator: Option<tokio::sync::watch::Sender<bool>>,
}

impl Env {
    pub async fn start(prefix: &str) -> Self {
        ensure_agent_built();
        let cluster = devctl_testenv::shared_process_cluster().await.unwrap();
        cluster.install_crds(&devctl_api::crds()).await.unwrap();
        let namespace = cluster.create_namespace(prefix).await.unwrap();
        let client = cluster.client().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let mut config = cluster.admin_kubeconfig().unwrap();
        for context in &mut config.contexts {
            if let Some(c) = context.context.as_mut() {
                c.namespace = Some(namespace.clone());
            }
        }
        devctl_testenv::kubeconfig::write(&config, &kubeconfig).unwrap();
        let operator_client = cluster
            .client_with_rules(
                OPERATOR_USER,
                devctl_operator::manifests::cluster_role(devctl_operator::manifests::RULES),
            )
            .await
            .unwrap();
        let mut env = Self {
            cluster,
            client,
            operator_client,
            namespace,
            kubeconfig,
            _dir: dir,
            operator: None,
        };
        env.start_operator();
        env
    }

    /// Runs the operator in this process for the test's namespace, with exactly the rights
    /// `devctl operator install` grants it (a right it lacks fails the data-path tests too).
    pub fn start_operator(&mut self) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let client = self.operator_client.clone();
        let watched = self.namespace.clone();
        tokio::spawn(async move {
            let _ = devctl_operator::run(
                client,
                &[watched],
                devctl_operator::Settings::default(),
                "test",
                stopped,
            )
            .await;
        });
        self.operator = Some(stop);
    }

    pub fn stop_operator(&mut self) {
        if let Some(stop) = self.operator.take() {
            let _ = stop.send(true);
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub async fn create(&self, name: &str, engine: &str, version: &str) {
        self.create_with(name, engine, version, 1).await
    }

    pub async fn create_with(&self, name: &str, engine: &str, version: &str, replicas: i32) {
        self.create_spec(
            name,
            json!({
                "engine": engine, "version": version, "replicas": replicas,
                "storage": { "size": "1Gi" },
                "backup": { "enabled": false },
            }),
        )
        .await
    }

    /// Creates the cluster `name` with this `spec`.
    pub async fn create_spec(&self, name: &str, spec: serde_json::Value) {
        let db: DatabaseCluster = serde_json::from_value(json!({
            "apiVersion": "db.devctl.io/v1beta1",
            "kind": "DatabaseCluster",
            "metadata": { "name": name },
            "spec": spec,
        }))
        .unwrap();
        self.api::<DatabaseCluster>()
            .create(&PostParams::default(), &db)
            .await
            .unwrap();
    }

    /// Waits until `condition` holds for the cluster `name`, printing its status and the
    /// agents' logs when it does not.
    pub async fn wait_db(
        &self,
        name: &str,
        what: &str,
        condition: impl Fn(&DatabaseCluster) -> bool,
    ) -> DatabaseCluster {
        let api = self.api::<DatabaseCluster>();
        let wait = await_condition(api.clone(), name, move |db: Option<&DatabaseCluster>| {
            db.is_some_and(&condition)
        });
        match tokio::time::timeout(READY_TIMEOUT, wait).await {
            Ok(Ok(Some(db))) => db,
            other => {
                let current = api.get_opt(name).await.ok().flatten();
                panic!(
                    "{name}: {what} ({other:?}) within {READY_TIMEOUT:?}\nstatus: {:#?}\nagent log:\n{}",
                    current.and_then(|d| d.status),
                    self.agent_log(&format!("{name}-0"))
                )
            }
        }
    }

    /// The cluster `name`'s version now: before an action whose effect may not last (see
    /// [`devctl_testenv::watch`]), for [`Env::wait_db_since`].
    pub async fn mark_db(&self, name: &str) -> Since<DatabaseCluster> {
        Since::now(&self.api::<DatabaseCluster>(), name)
            .await
            .unwrap()
    }

    /// [`Env::wait_db`] for a state that may stand only briefly: looks at every version
    /// of the cluster after `since`.
    pub async fn wait_db_since(
        &self,
        since: &Since<DatabaseCluster>,
        what: &str,
        condition: impl Fn(&DatabaseCluster) -> bool,
    ) -> DatabaseCluster {
        match since.until(what, READY_TIMEOUT, condition).await {
            Ok(db) => db,
            Err(e) => {
                let name = since.name();
                let current = self
                    .api::<DatabaseCluster>()
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten();
                panic!(
                    "{name}: {e}\nstatus: {:#?}\nagent log:\n{}",
                    current.and_then(|d| d.status),
                    self.agent_log(&format!("{name}-0"))
                )
            }
        }
    }

    /// Leaves the replica `replica` behind past what its primary `primary` keeps
    /// for it: its WAL receiver stopped (test hook), then WAL segments switched until its
    /// slot's `max_slot_wal_keep_size` (a quarter of the volume) and `wal_keep_size` are
    /// exceeded, and checkpoints until the segment it needs next is gone from the primary.
    /// Returns the rows `t` then holds; the hook is cleared (it streams again, or tries).
    pub async fn leave_replica_behind(&self, primary: &str, replica: &str) -> usize {
        let runner = self.cluster.pod_runner().expect("process-backed pods");
        runner
            .set_agent_hooks(&self.namespace, replica, "wal-receiver=stop")
            .unwrap();
        devctl_testenv::eventually(
            &format!("{replica} to stop streaming from {primary}"),
            READY_TIMEOUT,
            || async {
                let streaming = self
                    .superuser_sql(
                        primary,
                        "select count(*) from pg_stat_replication where state = 'streaming'",
                    )
                    .await;
                (streaming == "0").then_some(())
            },
        )
        .await
        .unwrap();
        let needed = self
            .superuser_sql(
                primary,
                &format!(
                    "select pg_walfile_name(restart_lsn) from pg_replication_slots where slot_name = 'devctl_{}'",
                    replica.replace('-', "_")
                ),
            )
            .await;
        assert!(!needed.is_empty(), "{primary} keeps no slot for {replica}");
        // 24 segments (384 MB) past it: beyond a 256Mi volume's 64 MB slot bound.
        self.superuser_sql(
            primary,
            "do $$ begin for i in 1..24 loop insert into t values (-i); perform pg_switch_wal(); end loop; end $$",
        )
        .await;
        devctl_testenv::eventually(
            &format!("{primary} to remove {needed}, which {replica} needs next"),
            READY_TIMEOUT,
            || async {
                self.superuser_sql(primary, "checkpoint").await;
                let left = self
                    .superuser_sql(
                        primary,
                        &format!("select count(*) from pg_ls_waldir() where name = '{needed}'"),
                    )
                    .await;
                (left == "0").then_some(())
            },
        )
        .await
        .unwrap();
        runner
            .set_agent_hooks(&self.namespace, replica, "")
            .unwrap();
        self.superuser_sql(primary, "select count(*) from t")
            .await
            .parse()
            .unwrap()
    }

    /// The events of the test's namespace with `reason`.
    pub async fn events(&self, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        self.api::<k8s_openapi::api::events::v1::Event>()
            .list(&kube::api::ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }

    pub async fn wait_ready(&self, name: &str) -> DatabaseCluster {
        self.wait_db(name, "Ready", ready).await
    }

    /// Waits until the cluster `name` is Ready with `replicas` ready instances.
    pub async fn wait_ready_with(&self, name: &str, replicas: i32) -> DatabaseCluster {
        self.wait_db(
            name,
            &format!("Ready with {replicas} instances"),
            move |db| {
                ready(db)
                    && db
                        .status
                        .as_ref()
                        .is_some_and(|s| s.ready_replicas == replicas)
            },
        )
        .await
    }

    /// An instance's whole log, for assertions about what it ever printed (`agent_log` keeps
    /// only the tail, for failure messages: a busy engine scrolls a line out of it in seconds).
    pub fn agent_log_all(&self, pod: &str) -> String {
        self.cluster
            .pod_runner()
            .and_then(|r| r.log_path(&self.namespace, pod))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_else(|| "(no log)".into())
    }

    /// The last 40 lines of an instance's log, for failure messages.
    pub fn agent_log(&self, pod: &str) -> String {
        self.cluster
            .pod_runner()
            .and_then(|r| r.log_path(&self.namespace, pod))
            .map(|p| devctl_testenv::process::tail(&p, 40))
            .unwrap_or_else(|| "(no log)".into())
    }

    /// The pods the ready endpoints of `service`'s EndpointSlices point at (where a client of
    /// the Service is sent).
    pub async fn endpoints(&self, service: &str) -> std::collections::BTreeSet<String> {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let slices = self
            .api::<EndpointSlice>()
            .list(
                &kube::api::ListParams::default()
                    .labels(&format!("kubernetes.io/service-name={service}")),
            )
            .await
            .unwrap();
        slices
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
            .filter_map(|e| e.target_ref.as_ref()?.name.clone())
            .collect()
    }

    pub async fn report(&self, pod: &str) -> InstanceStatus {
        let pod = self.api::<Pod>().get(pod).await.unwrap();
        InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())
            .unwrap_or_else(|| panic!("no {STATUS_ANNOTATION} on the pod"))
    }

    pub async fn password(&self, name: &str) -> String {
        let secret = self
            .api::<Secret>()
            .get(&format!("{name}-credentials"))
            .await
            .unwrap();
        String::from_utf8(secret.data.unwrap()["password"].0.clone()).unwrap()
    }

    /// `devctl db shell NAME -- -c SQL` (off the runtime's threads: it blocks).
    pub async fn shell(&self, name: &str, sql: &str) -> std::process::Output {
        self.devctl(&["db", "shell", name, "--", "-c", sql]).await
    }

    /// `devctl db shell NAME --instance POD -- -A -t -c SQL`: one instance, unaligned rows.
    pub async fn instance_sql(&self, name: &str, pod: &str, sql: &str) -> std::process::Output {
        self.devctl(&[
            "db",
            "shell",
            name,
            "--instance",
            pod,
            "--",
            "-A",
            "-t",
            "-c",
            sql,
        ])
        .await
    }

    /// `sql` as the superuser `postgres` on `pod`'s private socket (peer authentication, as
    /// the agent itself connects): for what the application role may not do (CHECKPOINT,
    /// `pg_switch_wal()`).
    pub async fn superuser_sql(&self, pod: &str, sql: &str) -> String {
        let runner = self.cluster.pod_runner().expect("process-backed pods");
        runner
            .superuser_sql(&self.namespace, pod, sql)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    pub async fn instance_sql_ok(&self, name: &str, pod: &str, sql: &str) -> String {
        let out = self.instance_sql(name, pod, sql).await;
        assert!(
            out.status.success(),
            "devctl db shell {name} --instance {pod} -- -c {sql:?} failed ({}):\n{}{}",
            out.status,
            super::stdout(&out),
            super::stderr(&out)
        );
        super::stdout(&out).trim().to_string()
    }

    /// `devctl ARGS` against this cluster, off the runtime's threads; its stdout, asserting
    /// it succeeded.
    pub async fn devctl_ok(&self, args: &[&str]) -> String {
        super::succeeded(args, self.devctl(args).await)
    }

    /// `devctl ARGS` against this cluster, off the runtime's threads.
    pub async fn devctl(&self, args: &[&str]) -> std::process::Output {
        let kubeconfig = self.kubeconfig.clone();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            super::devctl(&kubeconfig, &args)
        })
        .await
        .unwrap()
    }

    pub async fn shell_ok(&self, name: &str, sql: &str) -> String {
        let out = self.shell(name, sql).await;
        assert!(
            out.status.success(),
            "devctl db shell {name} -- -c {sql:?} failed ({}):\n{}{}",
            out.status,
            super::stdout(&out),
            super::stderr(&out)
        );
        super::stdout(&out)
    }

    /// Logs in as `app` with `password` straight at the instance's reported address.
    pub async fn psql_login(&self, pod: &str, password: &str) -> std::process::Output {
        self.psql_login_as(pod, "app", password, "app").await
    }

    /// Logs in as `user` to `database` with `password` at the instance's reported address.
    pub async fn psql_login_as(
        &self,
        pod: &str,
        user: &str,
        password: &str,
        database: &str,
    ) -> std::process::Output {
        let address = self.report(pod).await.address.expect("no address reported");
        let (host, port) = address.rsplit_once(':').unwrap();
        let dir = tempfile::tempdir().unwrap();
        let passfile = dir.path().join("pgpass");
        std::fs::write(
            &passfile,
            format!("{host}:{port}:{database}:{user}:{password}\n"),
        )
        .unwrap();
        std::fs::set_permissions(
            &passfile,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        tokio::process::Command::new("psql")
            .args(["-X", "-A", "-t", "-c", "select current_user"])
            .env("PGHOST", host)
            .env("PGPORT", port)
            .env("PGUSER", user)
            .env("PGDATABASE", database)
            .env("PGPASSFILE", &passfile)
            .env("PGCONNECT_TIMEOUT", "5")
            .env_remove("PGPASSWORD")
            .output()
            .await
            .unwrap()
    }

    /// Fails if `secret` appears in any agent or engine log, in the namespace's events, in a
    /// pod annotation or in the cluster's status.
    pub async fn assert_never_shown(&self, secret: &str) {
        let runner = self.cluster.pod_runner().unwrap();
        // The agents' and engines' logs, and the control plane's (API server, audit log, kwok).
        let logs = std::fs::read_dir(runner.logs_dir())
            .unwrap()
            .chain(std::fs::read_dir(self.cluster.log_dir()).unwrap());
        for entry in logs {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                !text.contains(secret),
                "a password appears in {}",
                path.display()
            );
        }
        let events: Api<k8s_openapi::api::events::v1::Event> = self.api();
        let events =
            serde_json::to_string(&events.list(&Default::default()).await.unwrap()).unwrap();
        assert!(!events.contains(secret), "a password appears in an event");
        let pods =
            serde_json::to_string(&self.api::<Pod>().list(&Default::default()).await.unwrap())
                .unwrap();
        assert!(!pods.contains(secret), "a password appears in a pod");
        let dbs = serde_json::to_string(
            &self
                .api::<DatabaseCluster>()
                .list(&Default::default())
                .await
                .unwrap(),
        )
        .unwrap();
        assert!(
            !dbs.contains(secret),
            "a password appears in a DatabaseCluster"
        );
    }
}

pub fn ready(db: &DatabaseCluster) -> bool {
    let Some(status) = db.status.as_ref() else {
        return false;
    };
    status.observed_generation == db.metadata.generation
        && devctl_api::conditions::find(&status.conditions, "Ready")
            .is_some_and(|c| c.status == "True")
}

pub fn condition(db: &DatabaseCluster, type_: &str) -> Option<(String, String, String)> {
    let c = devctl_api::conditions::find(&db.status.as_ref()?.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}
