//! devctl-operator: reconciles devctl's custom resources into Kubernetes objects.
//!
//! Layout: `children` applies children and deletes orphans for every controller;
//! `database_cluster` holds the DatabaseCluster controller, its desired state (`resources`,
//! one file per child) and status; `engine` renders PostgreSQL/MySQL configuration.

pub mod backoff;
pub mod children;
pub mod context;
pub mod database_cluster;
pub mod engine;
pub mod error;
pub mod leader_election;
pub mod manifests;
pub mod metrics;
pub mod pod_security;
pub mod reconciler;
pub mod subset;
pub mod web_app;

pub use context::Settings;
pub use error::Error;

/// Runs every controller (DatabaseCluster, WebApp) for each of `namespaces` (all namespaces
/// when empty) until `stop` turns true.
pub async fn run(
    client: kube::Client,
    namespaces: &[String],
    settings: Settings,
    instance: &str,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    let mut controllers: Vec<futures::future::BoxFuture<'static, ()>> = Vec::new();
    for namespace in scopes {
        controllers.push(Box::pin(database_cluster::run(
            client.clone(),
            namespace.clone(),
            settings.clone(),
            instance.to_string(),
            stopped(stop.clone()),
        )));
        controllers.push(Box::pin(web_app::run(
            client.clone(),
            namespace,
            settings.clone(),
            instance.to_string(),
            stopped(stop.clone()),
        )));
    }
    futures::future::join_all(controllers).await;
}
