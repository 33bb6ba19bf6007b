//! Shared set-up for the operator's integration tests: a namespace on the shared cluster, the
//! CRDs, and the operator running in-process for that namespace under its own identity.

#![allow(dead_code)]

use std::time::Duration;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_operator::Settings;
use devctl_operator::database_cluster::controller;
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
        audit
            .requests_since(mark)
            .unwrap()
            .into_iter()
            .filter(|r| r.user == OPERATOR_USER && r.is_write())
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

/// A fresh namespace with the operator watching it.
pub async fn start(prefix: &str) -> Env {
    // `RUST_LOG=devctl_operator=debug` shows the operator's logs in failing tests.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace(prefix).await.unwrap();
    let client = cluster.client().await.unwrap();
    let operator_client = cluster
        .client_for(OPERATOR_USER, &["system:masters"])
        .await
        .unwrap();
    let (tx, reconciled) = mpsc::unbounded_channel();
    let settings = Settings {
        health_requeue: Duration::from_secs(300),
        ..Settings::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (stop_web_apps, web_apps_stopped) = tokio::sync::oneshot::channel::<()>();
    let databases = controller::controller(
        operator_client.clone(),
        Some(namespace.clone()),
        settings.clone(),
        "test".into(),
        async {
            let _ = stopped.await;
            let _ = stop_web_apps.send(());
        },
    )
    .map(|r| r.map(|(o, _)| o.name).ok());
    let web_apps = devctl_operator::web_app::controller::controller(
        operator_client,
        Some(namespace.clone()),
        settings,
        "test".into(),
        async {
            let _ = web_apps_stopped.await;
        },
    )
    .map(|r| r.map(|(o, _)| o.name).ok());
    tokio::spawn(
        futures::stream::select(databases, web_apps).for_each(move |name| {
            if let Some(name) = name {
                let _ = tx.send(name);
            }
            async {}
        }),
    );
    Env {
        cluster,
        namespace,
        client,
        reconciled,
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
