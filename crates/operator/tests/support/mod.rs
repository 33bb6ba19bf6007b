//! Shared set-up for the operator's integration tests: a namespace on the shared cluster, the
//! CRDs, and the operator running in-process for that namespace under its own identity.

#![allow(dead_code)]

use std::time::Duration;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_operator::Settings;
use devctl_testenv::Cluster;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::wait::await_condition;
use tokio::sync::mpsc;

pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The user the in-process operator authenticates as (so the audit log can tell its
/// requests from the test's own).
pub const OPERATOR_USER: &str = "devctl-operator-under-test";

pub struct Env {
    pub cluster: &'static Cluster,
    pub namespace: String,
    pub client: kube::Client,
    /// Receives the name of every object after each finished reconcile.
    pub reconciled: mpsc::UnboundedReceiver<String>,
    /// The operator's child caches (to inspect what it keeps in memory).
    pub caches: devctl_operator::children::Caches,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Env {
    pub fn dbs(&self) -> Api<DatabaseCluster> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn web_apps(&self) -> Api<devctl_api::web_app::WebApp> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Waits until `condition` holds for the WebApp `name`.
    pub async fn wait_web_app(
        &self,
        name: &str,
        what: &str,
        condition: impl Fn(&devctl_api::web_app::WebApp) -> bool,
    ) -> devctl_api::web_app::WebApp {
        let api = self.web_apps();
        let wait = await_condition(
            api.clone(),
            name,
            move |app: Option<&devctl_api::web_app::WebApp>| app.is_some_and(&condition),
        );
        match tokio::time::timeout(TIMEOUT, wait).await {
            Ok(Ok(Some(app))) => app,
            Ok(other) => panic!("watching {name} for {what}: {other:?}"),
            Err(_) => {
                let current = api.get_opt(name).await.ok().flatten();
                panic!(
                    "timed out after {TIMEOUT:?} waiting for {name}: {what}\ncurrent status: {:#?}",
                    current.and_then(|a| a.status)
                )
            }
        }
    }

    /// Waits until `condition` holds for the DatabaseCluster `name`.
    pub async fn wait_db(
        &self,
        name: &str,
        what: &str,
        condition: impl Fn(&DatabaseCluster) -> bool,
    ) -> DatabaseCluster {
        let api = self.dbs();
        let wait = await_condition(api.clone(), name, move |db: Option<&DatabaseCluster>| {
            db.is_some_and(&condition)
        });
        match tokio::time::timeout(TIMEOUT, wait).await {
            Ok(Ok(Some(db))) => db,
            Ok(other) => panic!("watching {name} for {what}: {other:?}"),
            Err(_) => {
                let current = api.get_opt(name).await.ok().flatten();
                panic!(
                    "timed out after {TIMEOUT:?} waiting for {name}: {what}\ncurrent status: {:#?}",
                    current.and_then(|d| d.status)
                )
            }
        }
    }

    /// Forces `times` reconciles of `name` (an annotation change passes the watch predicate)
    /// and returns the write requests the operator made meanwhile, from the audit log.
    pub async fn writes_during_forced_reconciles<K>(
        &mut self,
        api: &Api<K>,
        name: &str,
        times: usize,
    ) -> Vec<devctl_testenv::audit::Request>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let audit = self
            .cluster
            .audit_log()
            .expect("the shared cluster logs audit events");
        self.drain();
        let mark = audit.mark();
        for i in 0..times {
            let poke = serde_json::json!({ "metadata": { "annotations": { "test.devctl.io/poke": i.to_string() } } });
            api.patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&poke),
            )
            .await
            .unwrap();
            self.next_reconcile(name).await;
        }
        self.operator_writes_since(mark)
    }

    /// The write requests the operator made in this namespace since `mark`, from the audit
    /// log (other tests share the control plane and the operator's user).
    pub fn operator_writes_since(
        &self,
        mark: devctl_testenv::audit::AuditMark,
    ) -> Vec<devctl_testenv::audit::Request> {
        self.cluster
            .audit_log()
            .expect("the shared cluster logs audit events")
            .requests_since(mark)
            .unwrap()
            .into_iter()
            .filter(|r| {
                r.user == OPERATOR_USER
                    && r.is_write()
                    && r.namespace.as_deref() == Some(self.namespace.as_str())
            })
            .collect()
    }

    /// Drops reconcile notifications received so far.
    pub fn drain(&mut self) {
        while self.reconciled.try_recv().is_ok() {}
    }

    /// Waits for the next finished reconcile of `name`.
    pub async fn next_reconcile(&mut self, name: &str) {
        let wait = async {
            while let Some(object) = self.reconciled.recv().await {
                if object == name {
                    return;
                }
            }
        };
        tokio::time::timeout(TIMEOUT, wait)
            .await
            .unwrap_or_else(|_| panic!("no reconcile of {name} within {TIMEOUT:?}"));
    }
}

/// A fresh namespace on the shared cluster (simulated instance reports) with the operator
/// watching it.
pub async fn start(prefix: &str) -> Env {
    start_on(devctl_testenv::shared_cluster().await.unwrap(), prefix).await
}

/// A fresh namespace on `cluster` with the operator watching it.
pub async fn start_on(cluster: &'static Cluster, prefix: &str) -> Env {
    // `RUST_LOG=devctl_operator=debug` shows the operator's logs in failing tests.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace(prefix).await.unwrap();
    let client = cluster.client().await.unwrap();
    // The generated rules, not system:masters: a rule the operator lacks fails the tests.
    bind_rules(cluster, OPERATOR_USER, devctl_operator::manifests::RULES).await;
    let operator_client = cluster.client_for(OPERATOR_USER, &[]).await.unwrap();
    let (tx, reconciled) = mpsc::unbounded_channel();
    let settings = Settings {
        health_requeue: Duration::from_secs(300),
        ..Settings::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (operator, watches) = devctl_operator::Operator::start(
        operator_client,
        std::slice::from_ref(&namespace),
        settings,
    );
    let caches = operator
        .caches(Some(&namespace))
        .expect("the namespace's caches")
        .clone();
    let reconciles = operator
        .controllers("test", async {
            let _ = stopped.await;
        })
        .for_each(move |reconciled| {
            if let Ok(name) = reconciled.result {
                let _ = tx.send(name);
            }
            async {}
        });
    // Dropping `Env` stops the controllers; their end stops the watches.
    tokio::spawn(async move {
        tokio::select! {
            _ = reconciles => {},
            _ = watches => {},
        }
    });
    Env {
        cluster,
        namespace,
        client,
        reconciled,
        caches,
        _stop: stop,
    }
}

pub fn condition_status(db: &DatabaseCluster, type_: &str) -> Option<(String, String)> {
    let status = db.status.as_ref()?;
    let c = devctl_api::conditions::find(&status.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone()))
}

pub fn is_ready(db: &DatabaseCluster, replicas: i32) -> bool {
    condition_status(db, "Ready").is_some_and(|(s, _)| s == "True")
        && db
            .status
            .as_ref()
            .is_some_and(|s| s.ready_replicas == replicas)
        && db.status.as_ref().and_then(|s| s.observed_generation) == db.metadata.generation
}

/// Asserts the API server rejected a request with 422 and a message containing `expected`.
pub fn assert_rejected<T: std::fmt::Debug>(result: Result<T, kube::Error>, expected: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{expected}: {status:?}");
            assert!(
                status.message.contains(expected),
                "{expected:?} not in: {}",
                status.message
            );
        }
        other => panic!("expected a 422 mentioning {expected:?}, got {other:?}"),
    }
}

/// Binds `user` to a ClusterRole named after it with `rules` (normally the generated
/// `manifests::RULES`): the operator under test gets exactly the rights an install grants.
pub async fn bind_rules(cluster: &Cluster, user: &str, rules: &[devctl_operator::manifests::Rule]) {
    cluster
        .client_with_rules(user, devctl_operator::manifests::cluster_role(rules))
        .await
        .unwrap();
}

/// The `devctl-operator` binary watching one namespace as a user bound to the generated
/// ClusterRole (exactly the rights `devctl operator install` grants); killed on drop.
pub struct OperatorProcess {
    child: std::process::Child,
    pub user: String,
    pub metrics_port: u16,
    pub log: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
    namespace: String,
    extra: Vec<String>,
    _dir: tempfile::TempDir,
}

impl OperatorProcess {
    /// Starts the binary for `namespace` with the rules in `rules` (normally
    /// `manifests::RULES`) and `extra` arguments.
    pub async fn start(
        cluster: &Cluster,
        namespace: &str,
        rules: &[devctl_operator::manifests::Rule],
        extra: &[&str],
    ) -> Self {
        let user = format!("devctl-operator-{namespace}");
        bind_rules(cluster, &user, rules).await;
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        devctl_testenv::kubeconfig::write(
            &cluster.kubeconfig_for(&user, &[]).unwrap(),
            &kubeconfig,
        )
        .unwrap();
        let log = dir.path().join("operator.log");
        let mut process = Self {
            child: std::process::Command::new("true").spawn().unwrap(),
            user,
            metrics_port: 0,
            log,
            kubeconfig,
            namespace: namespace.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            _dir: dir,
        };
        process.spawn();
        process
    }

    fn spawn(&mut self) {
        let _ = self.child.wait();
        self.metrics_port = devctl_testenv::process::free_port().unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = std::process::Command::new(env!("CARGO_BIN_EXE_devctl-operator"))
            // Webhooks have their own tests; on the shared control plane they would judge every test's objects.
            .env("DEVCTL_WEBHOOK_BIND_ADDRESS", "off")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--namespace", &self.namespace])
            .args([
                "--metrics-bind-address",
                &format!("127.0.0.1:{}", self.metrics_port),
            ])
            .args(&self.extra)
            .env("DEVCTL_LOG", "info,devctl_operator=debug")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(&mut self) {
        // SAFETY: signalling the child we started.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "devctl-operator exited with {status} on SIGTERM"
        );
    }

    /// SIGKILL: no shutdown, nothing released.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the binary again with the same arguments (after [`Self::stop`]).
    pub fn restart(&mut self) {
        self.spawn();
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The body of `GET path` on the metrics port, or `None` while it does not answer.
    pub fn http_get(&self, path: &str) -> Option<String> {
        http_get(self.metrics_port, path)
    }

    /// The value of the metric line starting with `series` (name and labels), if present.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let text = self.http_get("/metrics")?;
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    /// Successful reconciles of `controller` so far.
    pub fn reconciles(&self, controller: &str) -> f64 {
        self.metric(&format!(
            r#"controller_runtime_reconcile_total{{controller="{controller}",result="success"}}"#
        ))
        .unwrap_or(0.0)
    }

    /// Waits until `/readyz` answers 200 (every cache synced).
    pub async fn wait_ready(&self) {
        let what = format!("the operator's /readyz to answer 200\n{}", self.logs());
        devctl_testenv::eventually(&what, TIMEOUT, || async {
            self.http_get("/readyz")?
                .starts_with("HTTP/1.1 200")
                .then_some(())
        })
        .await
        .unwrap();
    }

    /// Waits until `controller` has finished `count` successful reconciles in total.
    pub async fn wait_reconciles(&self, controller: &str, count: f64) {
        let what = format!("{count} reconciles of {controller}");
        let reached = devctl_testenv::eventually(&what, TIMEOUT, || async {
            (self.reconciles(controller) >= count).then_some(())
        })
        .await;
        if let Err(error) = reached {
            panic!(
                "{error}\nmetrics:\n{}\nlogs:\n{}",
                self.http_get("/metrics").unwrap_or_default(),
                self.logs()
            );
        }
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET on loopback (no client library needed for three endpoints), or `None`
/// while nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

/// Events about the object `name`, as `(reason, note, count)` (a repeated event is counted in
/// its series, not recorded again).
pub async fn events_about(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Vec<(String, String, i32)> {
    events_matching(client, namespace, name, |_| true).await
}

/// [`events_about`], only those the operator published: what steady-state tests compare.
/// Other controllers' events arrive when their broadcasters get to them — the
/// StatefulSet controller's `SuccessfulCreate` for a pod was seen landing seconds after the
/// pod was Ready.
pub async fn operator_events_about(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Vec<(String, String, i32)> {
    events_matching(client, namespace, name, published_by_the_operator).await
}

/// The operator's Warning events about `name`: a healthy create or update publishes none.
pub async fn operator_warnings_about(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Vec<(String, String, i32)> {
    events_matching(client, namespace, name, |e| {
        published_by_the_operator(e) && e.type_.as_deref() == Some("Warning")
    })
    .await
}

fn published_by_the_operator(event: &k8s_openapi::api::events::v1::Event) -> bool {
    event.reporting_controller.as_deref() == Some(devctl_operator::context::CONTROLLER_NAME)
}

/// Events about `name` that `keep` accepts, as [`events_about`] shows them.
pub async fn events_matching(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    keep: impl Fn(&k8s_openapi::api::events::v1::Event) -> bool,
) -> Vec<(String, String, i32)> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), namespace);
    events
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| keep(e))
        .map(|e| {
            let count = e.series.as_ref().map(|s| s.count).unwrap_or(1);
            (
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
                count,
            )
        })
        .collect()
}

/// The uid of the object that controls `meta` (its controller owner reference), if any.
pub fn controller_uid(meta: &kube::api::ObjectMeta) -> Option<String> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.clone())
}
