//! What every controller's reconcile shell shares: object keys, timestamps, the error policy
//! with per-object backoff, status writes with server-side apply, and events.

use std::future::Future;
use std::sync::Arc;

use futures::TryStreamExt;
use futures::stream::BoxStream;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::children::caches::OwnerKey;
use crate::children::compact::{ByNamespace, Uid};
use crate::children::{Caches, Change, FIELD_MANAGER};
use crate::context::{Context, Settings};
use crate::error::{Error, Result};
use crate::lean_decode::{Lean, ManagedFields};

/// `namespace/name`, the key of per-object state such as the backoff.
pub fn key<K: Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// `kind/namespace/name`: the key of [`crate::status_writes::StatusWrites`], whose entries
/// several controllers share.
fn status_key<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!("{}/{}", K::kind(&()), key(object))
}

/// Now, truncated to seconds: metav1.Time has second precision on the wire, so a recomputed
/// status compares equal to the stored one.
pub fn now() -> Time {
    use k8s_openapi::jiff::Timestamp;
    let now = Timestamp::now();
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
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
    // Not through `report_transition`: a status it remembers is no longer the last written.
    ctx.status_writes.forget(&status_key(object));
    write_status_at(ctx, object, status, None).await
}

/// [`write_status`], refused by the API server (409) unless the object is still at
/// `resource_version`.
async fn write_status_at<K>(
    ctx: &Context,
    object: &K,
    status: serde_json::Value,
    resource_version: Option<&str>,
) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let namespace = object
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    // The response is not read: decoded without its managedFields (one entry per writer).
    let api: Api<Lean<K, ManagedFields>> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    if let Some(resource_version) = resource_version {
        body["metadata"] =
            json!({ "name": object.name_any(), "resourceVersion": resource_version });
    }
    tracing::debug!(object = %key(object), status = %body["status"], "writing status");
    api.patch_status(
        &object.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Records an event about `object`: queued for the publishing task ([`crate::event_recorder::EventQueue`]);
/// a failure to publish is logged there, never fatal.
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
    ctx.events.send(event, object.object_ref(&())).await;
}

/// One Normal event `Applied` per reconcile that changed children, listing the changes.
pub async fn publish_applied<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    object: &K,
    changes: &[Change],
) {
    if changes.is_empty() {
        return;
    }
    let summary = Change::summary(changes);
    // The recorder folds events with the same reason and action into one series and keeps
    // the first note: the summary as the action keeps different changes apart (the field
    // allows 128 characters).
    let action: String = summary.chars().take(128).collect();
    publish(ctx, object, EventType::Normal, "Applied", &action, summary).await;
}

use crate::children::{prune, scoped_api};

/// The predicate of every primary watch: reconcile only when something a user or the
/// finalizer helper changed — the spec (generation), deletion, finalizers, annotations or
/// labels.
/// The operator's own status writes change none of these, so they do not trigger another
/// reconcile; deletions still do.
pub fn relevant_change<K: Resource>(object: &K) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let meta = object.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    // Without the operator's own finalizer: adding it is no news (the reconcile that added
    // it goes on to apply). Someone removing it is not either; the next reconcile (at the
    // latest the health check) puts it back.
    meta.finalizers
        .iter()
        .flatten()
        .filter(|f| f.as_str() != devctl_api::database_cluster::FINALIZER)
        .for_each(|f| f.hash(&mut hasher));
    meta.annotations.hash(&mut hasher);
    // Labels too: `kubectl label` is a way users force a reconcile, as annotating is.
    meta.labels.hash(&mut hasher);
    Some(hasher.finish())
}

/// Adds `finalizer` to the object when it is missing and the object is not being deleted,
/// and returns the object as the API server has it now. kube's `finalizer` helper would stop
/// after the patch and wait for its echo: that is one more reconcile per new object, before
/// anything is applied.
pub async fn ensure_finalizer<K>(api: &Api<K>, finalizer: &str, object: Arc<K>) -> Result<Arc<K>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    if object.meta().deletion_timestamp.is_some()
        || object.finalizers().iter().any(|f| f == finalizer)
    {
        return Ok(object);
    }
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, PatchOperation, TestOperation};
    let list = PointerBuf::from_tokens(["metadata", "finalizers"]);
    // The test fails the patch when someone changed the list meanwhile (finalizers are not
    // deduplicated by the API server); the retry sees the new list.
    let (path, value) = match object.meta().finalizers.as_deref() {
        None | Some([]) => (list.clone(), json!([finalizer])),
        Some(_) => (
            PointerBuf::from_tokens(["metadata", "finalizers", "-"]),
            json!(finalizer),
        ),
    };
    let patch = json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: list,
            value: json!(object.meta().finalizers),
        }),
        PatchOperation::Add(AddOperation { path, value }),
    ]);
    let name = object.name_any();
    let patched = api
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await?;
    Ok(Arc::new(patched))
}

/// The cache of a controller's own resource and the stream that triggers its reconciles:
/// pruned objects, filtered by [`relevant_change`] so the operator's status writes do not
/// trigger it again. `gone` is called with each object the watch sees deleted, so that what
/// the operator remembers of it goes too (a kind without a finalizer is never reconciled
/// once it is gone).
pub fn watch_primary<K>(
    client: &kube::Client,
    namespace: Option<&str>,
    gone: impl Fn(&K) + Send + 'static,
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
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let (reader, writer) = kube::runtime::reflector::store::<K>();
    let config = kube::runtime::watcher::Config::default()
        .page_size(crate::children::caches::LIST_PAGE_SIZE);
    // Decoded without the field managers' records, which `prune` would drop at once.
    let api = scoped_api::<Lean<K, ManagedFields>>(client, namespace);
    let relevant = Arc::new(std::sync::Mutex::new(RelevantChanges::default()));
    let seen = relevant.clone();
    let stream = kube::runtime::watcher(api, config)
        .default_backoff()
        .map_ok(crate::lean_decode::unwrap_event)
        .modify(prune)
        .inspect_ok(move |event| {
            seen.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .follow(event);
            if let kube::runtime::watcher::Event::Delete(object) = event {
                gone(object);
            }
        })
        .reflect(writer)
        .applied_objects()
        .filter(move |object| {
            let pass = match object {
                Ok(object) => relevant
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .is_news(object),
                Err(_) => true,
            };
            std::future::ready(pass)
        });
    (reader, stream)
}

/// The last [`relevant_change`] of every object of a primary watch, by namespace and name —
/// kube's `predicate_filter` keeps the same with a key of three strings per object and forgets
/// deleted objects only after an hour.
#[derive(Default)]
struct RelevantChanges {
    last: ByNamespace<(Uid, u64)>,
    /// The objects of a (re-)list in progress: when it completes, objects deleted while the
    /// watch was down are forgotten.
    listing: Option<ByNamespace<()>>,
}

impl RelevantChanges {
    /// Whether `object` changed in a way that matters since its last event (or is new, or
    /// another object of the same name).
    fn is_news<K: Resource>(&mut self, object: &K) -> bool {
        let meta = object.meta();
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        let name = meta.name.as_deref().unwrap_or_default();
        let uid = Uid::new(meta.uid.as_deref().unwrap_or_default());
        let Some(change) = relevant_change(object) else {
            return true;
        };
        let news = self
            .last
            .get(namespace, name)
            .is_none_or(|(last_uid, last)| *last_uid != uid || *last != change);
        if news {
            self.last.insert(namespace, name, (uid, change));
        }
        news
    }

    fn follow<K: Resource>(&mut self, event: &kube::runtime::watcher::Event<K>) {
        use kube::runtime::watcher::Event;
        let key = |object: &K| {
            let meta = object.meta();
            (
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default(),
            )
        };
        match event {
            Event::Init => self.listing = Some(ByNamespace::default()),
            Event::InitApply(object) => {
                let (namespace, name) = key(object);
                self.listing
                    .get_or_insert_default()
                    .insert(&namespace, &name, ());
            }
            Event::InitDone => {
                if let Some(listed) = self.listing.take() {
                    self.last
                        .retain(|namespace, name, _| listed.contains(namespace, name));
                }
            }
            Event::Delete(object) => {
                let (namespace, name) = key(object);
                self.last.remove(&namespace, &name);
            }
            Event::Apply(_) => {}
        }
    }
}

/// Drives a stream of finished reconciles to its end, logging each. Failed reconciles are
/// logged by the error policy; what else fails (a watch, the queue) is a warning here.
pub async fn log_results(results: impl futures::Stream<Item = crate::Reconciled>) {
    use futures::StreamExt;
    results
        .for_each(|reconciled| async move {
            match reconciled.result {
                Ok(name) => {
                    tracing::debug!(controller = reconciled.controller, object = %name, "reconciled")
                }
                Err(error) => {
                    tracing::debug!(controller = reconciled.controller, %error, "reconcile failed")
                }
            }
        })
        .await;
}

/// Objects of a controller's kind that another kind's child events concern: for each
/// trigger of an owner of kind `owner_kind`, the objects `pick` finds in the controller's
/// own store (a running backup is woken by its cluster's pod reports).
pub struct Wake<K: kube::runtime::reflector::Lookup + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    pub owner_kind: &'static str,
    pub pick: fn(
        &kube::runtime::reflector::Store<K>,
        &crate::children::caches::OwnerKey,
    ) -> Vec<kube::runtime::reflector::ObjectRef<K>>,
}

/// The shell every controller runs in: the primary watch, reconcile triggers from the shared
/// child caches, bounded concurrency, no reconcile before the caches of the kinds it `reads`
/// have listed their objects (or failed to, which its sync then reports), metrics,
/// the error policy and graceful shutdown. `reconcile` holds only what differs per kind.
#[allow(clippy::too_many_arguments)]
pub fn run_controller<K, F, Fut>(
    name: &'static str,
    reads: &'static [&'static str],
    wake: Option<Wake<K>>,
    client: Client,
    namespace: Option<String>,
    caches: Caches,
    settings: Settings,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    mut reconcile: F,
) -> BoxStream<'static, crate::Reconciled>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    F: FnMut(Arc<K>, Arc<Context>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Action>> + Send + 'static,
{
    use futures::StreamExt;
    let forgetting = caches.clone();
    let (reader, objects) = watch_primary::<K>(&client, namespace.as_deref(), move |object| {
        if let (Some(owner), Some(uid)) = (OwnerKey::of(object), object.uid()) {
            forgetting.applier().forget_owner(&owner.namespace, &uid);
            forgetting.hurry(&owner, false);
        }
    });
    caches.share_store(reader.clone());
    let mut owner_triggers = caches.owner_triggers::<K>().boxed();
    if let Some(wake) = wake {
        let store = reader.clone();
        let woken = caches
            .triggers_of_kind(wake.owner_kind)
            .flat_map(move |(owner, urgency)| {
                let picked = (wake.pick)(&store, &owner);
                futures::stream::iter(picked.into_iter().map(move |object| (object, urgency)))
            });
        owner_triggers = futures::stream::select(owner_triggers, woken).boxed();
    }
    let concurrency = settings.concurrency;
    let metrics = settings.metrics.clone();
    metrics.set_max_concurrent(name, concurrency);
    let queued = metrics.clone();
    let objects = objects.inspect(move |object| {
        if let Ok(object) = object {
            queued.queue_add(name, key(object));
        }
    });
    let queued = metrics.clone();
    // A burst of child events (a pod turning ready, its StatefulSet counting it, the claim
    // binding) becomes one reconcile: each owner is released once its children were quiet
    // for `--child-event-window-ms` ([`crate::debounce`]), unless it is in a hurry
    // ([`crate::children::caches::Caches::hurry`]). Primary events and requeues are not delayed.
    let triggers = crate::debounce::debounce(owner_triggers, settings.child_event_window).inspect(
        move |object| {
            queued.queue_add(
                name,
                format!(
                    "{}/{}",
                    object.namespace.as_deref().unwrap_or_default(),
                    object.name
                ),
            );
        },
    );
    let finished = metrics.clone();
    let context = Arc::new(Context::new(client, caches, settings, instance));
    Controller::for_stream(objects, reader)
        .reconcile_on(triggers)
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            move |object, ctx: Arc<Context>| {
                let object_key = key(object.as_ref());
                let work = reconcile(object, ctx.clone());
                async move {
                    ctx.caches.wait_settled(reads).await;
                    let _slot = ctx
                        .settings
                        .workers
                        .slot(name, ctx.settings.concurrency)
                        .await;
                    ctx.settings.metrics.queue_start(name, &object_key);
                    tracing::debug!(object = %object_key, "reconcile starts");
                    let _in_flight = ctx.settings.metrics.start_reconcile(name);
                    let started = std::time::Instant::now();
                    let result = work.await;
                    ctx.settings
                        .metrics
                        .reconciled(name, result.is_ok(), started.elapsed());
                    result
                }
            },
            move |object, error, ctx: Arc<Context>| {
                ctx.settings.metrics.queue_retry(name);
                error_policy(object, error, ctx)
            },
            context,
        )
        .map(move |result| crate::Reconciled {
            controller: name,
            result: match result {
                Ok((object, _)) => Ok(object.name),
                Err(kube::runtime::controller::Error::ReconcilerFailed(error, object)) => {
                    Err(format!("{object}: {error}"))
                }
                Err(kube::runtime::controller::Error::ObjectNotFound(object)) => {
                    // A child's event for an owner deleted meanwhile: nothing to reconcile, and
                    // its queue entry is done (or `workqueue_depth` would count it forever).
                    let object_key = format!(
                        "{}/{}",
                        object.namespace.as_deref().unwrap_or_default(),
                        object.name
                    );
                    finished.queue_start(name, &object_key);
                    tracing::debug!(controller = name, object = %object_key, "owner is gone");
                    Err(format!("{object_key}: gone"))
                }
                Err(error) => {
                    // A watch or queue failure: not the error policy's, so it is said here.
                    tracing::warn!(controller = name, %error, "controller error");
                    Err(error.to_string())
                }
            },
        })
        .boxed()
}

/// An event that announces a step the status records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    pub type_: EventType,
    pub reason: &'static str,
    pub action: String,
    pub note: String,
}

/// A step of a procedure kept in the status (a switchover or failover moving on). Its status
/// write carries the object's `resourceVersion` as precondition: a reconcile that read an
/// outdated status (its own last write not yet in the cache) cannot take the step a second
/// time. Its events are published only once that write succeeded, so each is published
/// exactly once, whatever restarts or retries happen around it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transition {
    pub resource_version: Option<String>,
    pub events: Vec<Announcement>,
}

/// How soon a reconcile whose transition met a newer object runs again: status writes do
/// not trigger reconciles, so nothing else would bring it back soon.
const STALE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// After a reconcile's children were converged (or failed to): writes the status if it
/// changed (computed from what the reconcile changed, or its error; one request, so no reader
/// sees a new `observedGeneration` without its conditions), publishes the `Applied` event
/// and, on failure, a Warning event; resets the backoff on success. A failed status write
/// never hides the reconcile error.
pub async fn report<K>(
    ctx: &Context,
    object: &K,
    converged: Result<Vec<Change>>,
    status: impl FnOnce(Result<&[Change], &Error>) -> Option<serde_json::Value>,
) -> Result<Action>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    report_transition(ctx, object, converged, status, None, None)
        .await
        .map(|(action, _)| action)
}

/// [`report`] for a reconcile that may take a [`Transition`] and may have to look again
/// `within` a deadline although no event may come; also says whether the transition was
/// recorded (its status written).
pub async fn report_transition<K>(
    ctx: &Context,
    object: &K,
    converged: Result<Vec<Change>>,
    status: impl FnOnce(Result<&[Change], &Error>) -> Option<serde_json::Value>,
    transition: Option<Transition>,
    within: Option<std::time::Duration>,
) -> Result<(Action, bool)>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let precondition = transition
        .as_ref()
        .map(|t| t.resource_version.clone().unwrap_or_default());
    // Unchanged status with a transition: it was recorded before, so it is not news.
    let (status_written, recorded) = match status(converged.as_deref()) {
        // The same status as the last write, whose echo the cache has not shown yet.
        Some(status)
            if precondition.is_none()
                && ctx.status_writes.already_written(
                    &status_key(object),
                    object.meta().resource_version.as_deref(),
                    &status,
                ) =>
        {
            tracing::debug!(object = %key(object), "status already written, its echo is on the way");
            (Ok(()), false)
        }
        Some(status) => {
            let cached_version = object.meta().resource_version.clone();
            let remembered = precondition.is_none().then(|| status.clone());
            let written = write_status_at(ctx, object, status, precondition.as_deref()).await;
            if let (Ok(()), Some(status)) = (&written, remembered) {
                ctx.status_writes
                    .record(&status_key(object), cached_version.as_deref(), &status);
            }
            let recorded = transition.is_some() && written.is_ok();
            (written, recorded)
        }
        None => (Ok(()), false),
    };
    if recorded {
        for event in transition.into_iter().flat_map(|t| t.events) {
            publish(
                ctx,
                object,
                event.type_,
                event.reason,
                &event.action,
                event.note,
            )
            .await;
        }
    }
    let requeue =
        |after: std::time::Duration| Action::requeue(within.map_or(after, |w| w.min(after)));
    let stale = matches!(&status_written, Err(Error::Kube(kube::Error::Api(s))) if s.code == 409)
        && precondition.is_some();
    match converged {
        Ok(changes) => {
            publish_applied(ctx, object, &changes).await;
            if stale {
                tracing::debug!(object = %key(object), "the object changed since this reconcile read it; the step is retried");
                return Ok((requeue(STALE_RETRY), false));
            }
            status_written?;
            ctx.backoff.reset(&key(object));
            Ok((requeue(ctx.settings.health_requeue), recorded))
        }
        Err(error) => {
            if let Err(status_error) = status_written {
                tracing::warn!(object = %key(object), error = %status_error, "could not write the status of a failed reconcile");
            }
            publish(
                ctx,
                object,
                EventType::Warning,
                error.reason(),
                "Reconcile",
                error.to_string(),
            )
            .await;
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher::Event;

    fn object(name: &str, uid: &str, generation: i64, version: &str) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.name = Some(name.into());
        object.metadata.namespace = Some("ns".into());
        object.metadata.uid = Some(uid.into());
        object.metadata.generation = Some(generation);
        object.metadata.resource_version = Some(version.into());
        object
    }

    #[test]
    fn only_relevant_changes_pass_and_deleted_objects_are_forgotten() {
        let mut changes = RelevantChanges::default();
        let first = object("db", "u1", 1, "10");
        assert!(changes.is_news(&first), "a new object");
        // A status write: a new version, the same generation.
        assert!(!changes.is_news(&object("db", "u1", 1, "11")));
        assert!(changes.is_news(&object("db", "u1", 2, "12")), "a new spec");
        let mut labelled = object("db", "u1", 2, "12");
        labelled
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("force".into(), "1".into());
        assert!(
            changes.is_news(&labelled),
            "kubectl label forces a reconcile"
        );
        assert!(!changes.is_news(&labelled), "once");
        // Deleted and created again under the same name with the same spec.
        changes.follow(&Event::Delete(object("db", "u1", 2, "13")));
        assert!(changes.is_news(&object("db", "u2", 1, "14")));
        assert!(
            changes.is_news(&object("db", "u3", 1, "15")),
            "a delete the watch missed"
        );
        // A re-list without the object: it was deleted while the watch was down.
        changes.follow(&Event::<ConfigMap>::Init);
        changes.follow(&Event::InitApply(object("other", "u9", 1, "16")));
        changes.follow(&Event::<ConfigMap>::InitDone);
        assert!(changes.last.get("ns", "db").is_none());
        assert!(changes.is_news(&object("db", "u3", 1, "17")));
    }
}
