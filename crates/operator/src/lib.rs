//! devctl-operator: reconciles devctl's custom resources into Kubernetes objects.
//!
//! Layout: `children` applies children, deletes orphans and keeps the shared child caches;
//! `reconciler` is the reconcile shell every controller shares; `database_cluster` and
//! `web_app` hold one controller each, with their desired state (`resources`, one file per
//! child) and status; `engine` renders PostgreSQL/MySQL configuration.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod backoff;
pub mod children;
pub mod client;
pub mod context;
pub mod database_backup;
pub mod database_cluster;
pub mod debounce;
pub mod engine;
pub mod error;
pub mod event_recorder;
pub mod helm;
pub mod leader_election;
pub mod lean_decode;
pub mod manifests;
pub mod memory;
pub mod metrics;
pub mod names;
pub mod pod_security;
pub mod reconciler;
pub mod status_writes;
pub mod web_app;
pub mod webhook;

use futures::stream::BoxStream;
use futures::{Future, FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

pub use context::Settings;
pub use error::Error;

use children::{Caches, CachesBuilder};

/// The registry of child kinds: every kind any controller creates or reads, cached once per
/// watch scope and shared by all controllers, each as slim as what the operator reads of it
/// allows ([`children::slim`]). A new child kind is one line here.
pub fn child_caches(client: kube::Client, namespace: Option<String>) -> CachesBuilder {
    use children::slim;
    CachesBuilder::new(client, namespace)
        .add_metadata::<ConfigMap>(slim::config_map)
        .add_metadata::<Secret>(slim::secret)
        .add_metadata::<Service>(slim::service)
        .add_metadata::<ServiceAccount>(slim::service_account)
        .add_metadata::<Role>(slim::role)
        .add_metadata::<RoleBinding>(slim::role_binding)
        .add_slim::<StatefulSet>(slim::stateful_set)
        .add_slim::<Deployment>(slim::deployment)
        .add_metadata::<PodDisruptionBudget>(slim::pod_disruption_budget)
        .add_trimmed::<PersistentVolumeClaim, lean_decode::ClaimFields>(
            database_cluster::labelled_owner,
            slim::persistent_volume_claim,
        )
        .add_trimmed::<Pod, lean_decode::PodFields>(pod_owner, database_cluster::trim_pod)
        // Agents renew the primary lock every second or so: only a new holder is news, and
        // the cache's change times are how the operator notices a lock nobody renews.
        .add_observed::<Lease>(
            children::caches::controller_owner::<Lease>,
            database_cluster::resources::lease::significant,
        )
}

/// The DatabaseCluster or WebApp a pod belongs to, by its labels (pods carry no owner
/// reference to either: a StatefulSet or a ReplicaSet made them).
fn pod_owner(pod: &Pod) -> Option<children::caches::OwnerKey> {
    database_cluster::labelled_owner(pod).or_else(|| web_app::controller::labelled_owner(pod))
}

/// How often freed memory is returned to the operating system.
const MEMORY_RELEASE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// The caches of every watch scope, running before (and independently of) leadership, so a
/// follower is ready to take over — and to serve webhooks — with warm caches.
pub struct Operator {
    client: kube::Client,
    scopes: Vec<(Option<String>, Caches)>,
    settings: Settings,
}

/// One finished reconcile: the controller and the object's name, or the error.
#[derive(Debug, Clone)]
pub struct Reconciled {
    pub controller: &'static str,
    pub result: Result<String, String>,
}

impl Operator {
    /// Starts the caches for each of `namespaces` (all namespaces when empty). The returned
    /// future runs the watches and marks the operator ready once every cache has synced;
    /// drive it for the operator's lifetime.
    pub fn start(
        client: kube::Client,
        namespaces: &[String],
        settings: Settings,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let scopes: Vec<Option<String>> = if namespaces.is_empty() {
            vec![None]
        } else {
            namespaces.iter().cloned().map(Some).collect()
        };
        let mut watches = Vec::new();
        let mut built = Vec::new();
        for namespace in scopes {
            let (caches, watch) = child_caches(client.clone(), namespace.clone()).build();
            watches.push(watch.boxed());
            built.push((namespace, caches));
        }
        let all: Vec<Caches> = built.iter().map(|(_, c)| c.clone()).collect();
        let metrics = settings.metrics.clone();
        let ready = async move {
            futures::future::join_all(all.iter().map(Caches::wait_synced)).await;
            tracing::info!("caches synced");
            metrics.set_ready(true);
            // The first lists were the largest allocations the operator makes; later bursts
            // (re-lists, many reconciles at once) are given back on a slow tick.
            let mut tick = tokio::time::interval(MEMORY_RELEASE_INTERVAL);
            loop {
                tick.tick().await;
                memory::release_free_memory();
            }
        };
        let run = async move {
            futures::future::join(futures::future::join_all(watches), ready).await;
        };
        (
            Self {
                client,
                scopes: built,
                settings,
            },
            run,
        )
    }

    /// The child caches of the watch scope `namespace` (`None`: all namespaces).
    pub fn caches(&self, namespace: Option<&str>) -> Option<&Caches> {
        self.scopes
            .iter()
            .find(|(scope, _)| scope.as_deref() == namespace)
            .map(|(_, caches)| caches)
    }

    /// Every controller of every scope as one stream of finished reconciles, ending after
    /// `shutdown` resolves and the running reconciles finish.
    pub fn controllers(
        &self,
        instance: &str,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> BoxStream<'static, Reconciled> {
        let shutdown = shutdown.shared();
        let mut streams = Vec::new();
        for (namespace, caches) in &self.scopes {
            streams.push(database_cluster::controller(
                self.client.clone(),
                namespace.clone(),
                caches.clone(),
                self.settings.clone(),
                instance.to_string(),
                shutdown.clone(),
            ));
            streams.push(database_backup::controller(
                self.client.clone(),
                namespace.clone(),
                caches.clone(),
                self.settings.clone(),
                instance.to_string(),
                shutdown.clone(),
            ));
            streams.push(web_app::controller(
                self.client.clone(),
                namespace.clone(),
                caches.clone(),
                self.settings.clone(),
                instance.to_string(),
                shutdown.clone(),
            ));
        }
        futures::stream::select_all(streams).boxed()
    }
}

/// Runs every controller until `stop` turns true (caches, then controllers), logging each
/// reconcile: what `devctl dev up` and the operator binary without leader election run.
pub async fn run(
    client: kube::Client,
    namespaces: &[String],
    settings: Settings,
    instance: &str,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let (operator, watches) = Operator::start(client, namespaces, settings);
    let controllers = reconciler::log_results(operator.controllers(instance, stopped(stop)));
    tokio::select! {
        _ = controllers => {},
        _ = watches => {},
    }
}

/// Resolves when `stop` turns true (or its sender is gone).
pub async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
