//! What every controller's reconcile shell shares: object keys, timestamps, the error policy
//! with per-object backoff, status writes with server-side apply, and events.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::children::{Change, FIELD_MANAGER};
use crate::context::Context;
use crate::error::{Error, Result};

/// `namespace/name`, the key of per-object state such as the backoff.
pub fn key<K: Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// Now, truncated to seconds: metav1.Time has second precision on the wire, so a recomputed
/// status compares equal to the stored one.
pub fn now() -> Time {
    use k8s_openapi::jiff::Timestamp;
    let now = Timestamp::now();
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Runs one reconcile of `controller`, counting and timing it in the metrics.
pub async fn measured(
    ctx: &Context,
    controller: &'static str,
    reconcile: impl std::future::Future<Output = Result<Action>>,
) -> Result<Action> {
    let started = std::time::Instant::now();
    let result = reconcile.await;
    ctx.settings
        .metrics
        .reconciled(controller, result.is_ok(), started.elapsed());
    result
}

/// The error policy of every controller: retry with per-object exponential backoff.
pub fn error_policy<K: Resource>(object: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = key(object.as_ref());
    let delay = ctx.backoff.next_delay(&key);
    tracing::warn!(object = %key, %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Writes the whole `status` with server-side apply (fields left out would be removed).
pub async fn write_status<K>(ctx: &Context, object: &K, status: serde_json::Value) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let namespace = object
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        &object.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Records an event about `object`; a failure to record is logged, never fatal.
pub async fn publish<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    object: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &object.object_ref(&())).await {
        tracing::warn!(object = %key(object), %error, "could not publish an event");
    }
}

/// One Normal event per created, updated or deleted child.
pub async fn publish_changes<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    object: &K,
    changes: &[Change],
) {
    for change in changes {
        let (reason, kind, name) = match change {
            Change::Created(kind, name) => ("Created", kind, name),
            Change::Updated(kind, name) => ("Updated", kind, name),
            Change::Deleted(kind, name) => ("Deleted", kind, name),
        };
        publish(
            ctx,
            object,
            EventType::Normal,
            reason,
            reason,
            format!("{reason} {} {name}", kind.as_str()),
        )
        .await;
    }
}

/// An API for one namespace, or for all when `None`.
pub fn scoped_api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The predicate of every primary watch: reconcile only when something a user or the
/// finalizer helper changed — the spec (generation), deletion, finalizers or annotations.
/// The operator's own status writes change none of these, so they do not trigger another
/// reconcile; deletions still do.
pub fn relevant_change<K: Resource>(object: &K) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let meta = object.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    Some(hasher.finish())
}

/// The cache of a controller's own resource and the stream that triggers its reconciles:
/// pruned objects, filtered by [`relevant_change`] so the operator's status writes do not
/// trigger it again.
pub fn watch_primary<K>(
    client: &kube::Client,
    namespace: Option<&str>,
) -> (
    kube::runtime::reflector::Store<K>,
    impl futures::Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + 'static,
)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    use kube::runtime::WatchStreamExt;
    let (reader, writer) = kube::runtime::reflector::store::<K>();
    let stream = kube::runtime::watcher(scoped_api::<K>(client, namespace), Default::default())
        .default_backoff()
        .modify(prune)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(relevant_change, kube::runtime::PredicateConfig::default());
    (reader, stream)
}

/// Drops what the operator never reads from cached objects: managedFields and kubectl's
/// last-applied-configuration (a full copy of the object). Caches are the operator's memory.
pub fn prune<K: Resource>(object: &mut K) {
    object.managed_fields_mut().clear();
    if let Some(annotations) = object.meta_mut().annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// A cache of the children of kind `K` devctl manages (label-selected, so memory grows with
/// what devctl owns) and the stream of touched children that triggers their owners.
pub fn watch_children<K>(
    client: &kube::Client,
    namespace: Option<&str>,
) -> (
    kube::runtime::reflector::Store<K>,
    impl futures::Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + 'static,
)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    use kube::runtime::WatchStreamExt;
    let (reader, writer) = kube::runtime::reflector::store::<K>();
    let config =
        kube::runtime::watcher::Config::default().labels(&devctl_api::labels::managed_selector());
    let stream = kube::runtime::watcher(scoped_api::<K>(client, namespace), config)
        .default_backoff()
        .modify(prune)
        .reflect(writer)
        .touched_objects();
    (reader, stream)
}

/// Drives a controller's result stream to its end, logging each reconcile.
pub async fn log_results<K, E>(
    results: impl futures::Stream<Item = Result<(kube::runtime::reflector::ObjectRef<K>, Action), E>>,
) where
    K: Resource,
    K::DynamicType: std::fmt::Debug,
    E: std::fmt::Display,
{
    use futures::StreamExt;
    results
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(object = %object, "reconciled"),
                Err(error) => tracing::debug!(%error, "reconcile failed"),
            }
        })
        .await;
}
