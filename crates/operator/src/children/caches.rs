//! One cache per child kind, shared by every controller: a label-selected watch (only what
//! devctl manages, so memory grows with what devctl owns) and a fan-out of "this owner's
//! child changed" triggers to the controllers.
//!
//! Registering a kind is one line in [`CachesBuilder`]'s caller; controllers name the kinds
//! they own by their `KIND` string and read typed objects with [`Caches::get`]. No reflector
//! store is used: each kind keeps an entry per object (what the applier reads) and, for kinds
//! whose objects are read, the slimmed object packed as JSON, decoded again per read — a
//! fraction of the struct's size, for a few microseconds per read ([`super::store`]).
//!
//! Some objects change all the time without news for their owner: a lock its holder renews
//! every second. Those are registered with [`CachesBuilder::add_observed`]: their owner is
//! triggered only when the part that matters changes, and the cache notes on the operator's
//! monotonic clock when each object last changed at all ([`Caches::changed_at`]), which is
//! how the silence of a lock is measured without comparing clocks between machines.

use std::any::Any;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use kube::api::Api;
use kube::discovery::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use super::compact::CompactString;
use super::store::{InstanceIndex, MetaStore, Observations};
use super::{Applier, ChildKind, slim};
use super::{prune, scoped_api};
use crate::debounce::Urgency;
use crate::error::{Error, Result};
use crate::lean_decode::{Lean, ManagedFields, SkipFields};

pub use super::store::LiveMeta;

/// Which owner a child event concerns: its kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerKey {
    pub kind: CompactString,
    pub namespace: CompactString,
    pub name: CompactString,
}

impl OwnerKey {
    /// `object` itself as the owner its children name.
    pub fn of<K: Resource<DynamicType = ()>>(object: &K) -> Option<Self> {
        Some(Self {
            kind: K::kind(&()).as_ref().into(),
            namespace: object.meta().namespace.as_deref()?.into(),
            name: object.name_any().into(),
        })
    }

    /// The `O` an object belongs to by its labels (`app.kubernetes.io/name=<app_name>`,
    /// `instance=<owner>`): for what another controller made without an owner reference to
    /// it, such as a StatefulSet's claims and pods or a ReplicaSet's pods.
    pub fn by_labels<O: Resource<DynamicType = ()>>(
        object: &impl Resource,
        app_name: &str,
    ) -> Option<Self> {
        let labels = object.meta().labels.as_ref()?;
        if labels.get(devctl_api::labels::NAME).map(String::as_str) != Some(app_name) {
            return None;
        }
        Some(Self {
            kind: O::kind(&()).as_ref().into(),
            namespace: object.meta().namespace.as_deref()?.into(),
            name: labels.get(devctl_api::labels::INSTANCE)?.as_str().into(),
        })
    }
}

/// A child event for its owner, and whether it may wait for the rest of its burst.
#[derive(Debug, Clone)]
struct Trigger {
    owner: OwnerKey,
    urgency: Urgency,
}

/// Owners whose child events may not wait ([`Caches::hurry`]).
type Hurried = Arc<Mutex<HashSet<OwnerKey>>>;

/// The controllers' own stores of their primary kind, by type, for a controller that reads
/// another's objects ([`Caches::share_store`]).
type SharedStores = Arc<Mutex<HashMap<std::any::TypeId, Box<dyn Any + Send + Sync>>>>;

/// How to find the owner of a child of kind `K`.
pub type OwnerOf<K> = fn(&K) -> Option<OwnerKey>;

/// The owner named by the controller owner reference (how devctl links its children).
pub fn controller_owner<K: Resource>(object: &K) -> Option<OwnerKey> {
    let owner = object
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true))?;
    Some(OwnerKey {
        kind: owner.kind.as_str().into(),
        namespace: object.meta().namespace.as_deref()?.into(),
        name: owner.name.as_str().into(),
    })
}

/// Where a cache stands. Not `Store::wait_until_ready`: it wakes only the last of several
/// concurrent waiters, and every reconcile waits here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheState {
    /// The first list has not arrived.
    Syncing,
    /// The first list is in the store (later watch errors leave it usable, if stale).
    Synced,
    /// The first list failed; the watch retries with backoff.
    Failing { message: String, forbidden: bool },
}

/// What an apply of a child returned, as the applier records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub resource_version: Option<CompactString>,
    /// [`slim::content`] of the response, as the cache computes it for watch events.
    pub content: Option<u64>,
}

impl Written {
    /// The record of a write's response (an apply or a create), pruned as the watch prunes.
    fn of<K: ChildKind>(mut object: K) -> Self {
        prune(&mut object);
        Written {
            resource_version: object.meta().resource_version.as_deref().map(Into::into),
            content: Some(slim::content(&mut object)),
        }
    }
}

/// Whether an apply may find the object already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The child is ours (the cache or our own record knows it): the apply takes over
    /// whatever someone else changed in it.
    Existing,
    /// The child is not known to exist: the apply only creates. It carries a
    /// `resourceVersion` no stored object has, which the API server ignores when it creates
    /// the object and checks when one exists: an object of that name — someone else's, or
    /// ours while the cache does not show it — fails the apply with 409 and is left
    /// untouched.
    New,
}

/// The `resourceVersion` of [`Claim::New`]: etcd's first revision, which no object has
/// (etcd starts at revision 1 and its first write is revision 2; the API server's
/// resourceVersions are etcd revisions).
const NO_OBJECT_HAS_THIS_VERSION: &str = "1";

/// The cache of one kind, seen without its type.
pub trait KindCache: Send + Sync {
    fn api_resource(&self) -> &ApiResource;
    fn meta(&self, namespace: &str, name: &str) -> Option<LiveMeta>;
    /// The content fingerprint of a full object of this kind (an API response), computed as
    /// the cache computes it for what its watch delivers.
    fn content_of(&self, object: &Value) -> Option<u64>;
    /// Applies `body` to the child `name` with server-side apply under our field manager
    /// (forced), only as a create when `claim` is [`Claim::New`]. The response is decoded
    /// straight into the kind's type without its managedFields — not through a generic JSON
    /// tree — and only what the applier records of it is kept: its version and its content
    /// fingerprint.
    fn apply<'a>(
        &'a self,
        client: &Client,
        namespace: &'a str,
        name: &'a str,
        body: &'a Value,
        claim: Claim,
    ) -> BoxFuture<'a, kube::Result<Written>>;
    /// Creates the object `body` (a POST: it fails with 409 if one of that name exists).
    fn create<'a>(
        &'a self,
        client: &Client,
        namespace: &'a str,
        body: &'a Value,
    ) -> BoxFuture<'a, kube::Result<Written>>;
    /// The cached object as JSON, for kinds cached with their body (`None` for slim ones).
    fn body(&self, namespace: &str, name: &str) -> Option<Value>;
    /// Names of the cached objects controlled by the owner with `owner_uid`.
    fn owned(&self, namespace: &str, owner_uid: &str) -> Vec<String>;
    /// Resolves once the first list arrived or failed.
    fn wait_settled(&self) -> BoxFuture<'static, ()>;
    /// Resolves once the first list arrived.
    fn wait_synced(&self) -> BoxFuture<'static, ()>;
    fn state(&self) -> CacheState;
    fn as_any(&self) -> &dyn Any;
}

struct TypedCache<K: ChildKind> {
    /// Every object's metadata; the slimmed objects themselves unless the kind was
    /// registered with [`CachesBuilder::add_metadata`].
    entries: Arc<MetaStore>,
    api_resource: ApiResource,
    state: watch::Receiver<CacheState>,
    /// For kinds registered with [`CachesBuilder::add_observed`].
    observations: Option<Arc<Observations>>,
    /// Objects are kept whole (pruned only), so drift checks need no request.
    keeps_body: bool,
    /// For kinds registered with [`CachesBuilder::add_trimmed`].
    by_instance: Option<Arc<InstanceIndex>>,
    kind: std::marker::PhantomData<fn() -> K>,
}

impl<K: ChildKind> TypedCache<K> {
    fn find(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.entries.object(namespace, name).map(Arc::new)
    }
}

impl<K: ChildKind> KindCache for TypedCache<K> {
    fn api_resource(&self) -> &ApiResource {
        &self.api_resource
    }

    fn meta(&self, namespace: &str, name: &str) -> Option<LiveMeta> {
        self.entries.meta(namespace, name)
    }

    fn body(&self, namespace: &str, name: &str) -> Option<Value> {
        if !self.keeps_body {
            return None;
        }
        let mut body = serde_json::to_value(self.find(namespace, name)?.as_ref()).ok()?;
        let annotations = body
            .pointer_mut("/metadata/annotations")
            .and_then(Value::as_object_mut);
        if let Some(annotations) = annotations {
            annotations.remove(slim::CONTENT_ANNOTATION);
        }
        Some(body)
    }

    fn content_of(&self, object: &Value) -> Option<u64> {
        let mut object: K = serde_json::from_value(object.clone()).ok()?;
        prune(&mut object);
        Some(slim::content(&mut object))
    }

    fn apply<'a>(
        &'a self,
        client: &Client,
        namespace: &'a str,
        name: &'a str,
        body: &'a Value,
        claim: Claim,
    ) -> BoxFuture<'a, kube::Result<Written>> {
        let api: Api<Lean<K, ManagedFields>> = Api::namespaced(client.clone(), namespace);
        async move {
            let params = kube::api::PatchParams::apply(super::FIELD_MANAGER).force();
            let create_only;
            let body = match claim {
                Claim::Existing => body,
                Claim::New => {
                    let mut with_version = body.clone();
                    if let Some(metadata) = with_version
                        .get_mut("metadata")
                        .and_then(Value::as_object_mut)
                    {
                        metadata
                            .insert("resourceVersion".into(), NO_OBJECT_HAS_THIS_VERSION.into());
                    }
                    create_only = with_version;
                    &create_only
                }
            };
            let applied = api
                .patch(name, &params, &kube::api::Patch::Apply(body))
                .await?;
            Ok(Written::of(applied.0))
        }
        .boxed()
    }

    fn create<'a>(
        &'a self,
        client: &Client,
        namespace: &'a str,
        body: &'a Value,
    ) -> BoxFuture<'a, kube::Result<Written>> {
        let api: Api<Lean<K, ManagedFields>> = Api::namespaced(client.clone(), namespace);
        let client = client.clone();
        async move {
            // By hand rather than `Api::create`, which takes the body as the API's own type:
            // the response is decoded lean, the body is the rendered JSON.
            let params = kube::api::PostParams {
                field_manager: Some(super::FIELD_MANAGER.to_string()),
                ..Default::default()
            };
            let bytes = serde_json::to_vec(body).map_err(kube::Error::SerdeError)?;
            let mut request = kube::core::Request::new(api.resource_url())
                .create(&params, bytes)
                .map_err(kube::Error::BuildRequest)?;
            request.extensions_mut().insert("create");
            let created = client.request::<Lean<K, ManagedFields>>(request).await?;
            Ok(Written::of(created.0))
        }
        .boxed()
    }

    fn owned(&self, namespace: &str, owner_uid: &str) -> Vec<String> {
        self.entries.owned(namespace, owner_uid)
    }

    fn wait_settled(&self) -> BoxFuture<'static, ()> {
        let mut state = self.state.clone();
        async move {
            // An error means the watch is gone: the operator is stopping.
            let _ = state.wait_for(|s| *s != CacheState::Syncing).await;
        }
        .boxed()
    }

    fn wait_synced(&self) -> BoxFuture<'static, ()> {
        let mut state = self.state.clone();
        async move {
            let _ = state.wait_for(|s| *s == CacheState::Synced).await;
        }
        .boxed()
    }

    fn state(&self) -> CacheState {
        self.state.borrow().clone()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Every child cache of one watch scope (a namespace, or all), shared by the controllers.
#[derive(Clone)]
pub struct Caches {
    kinds: Arc<BTreeMap<&'static str, Arc<dyn KindCache>>>,
    triggers: broadcast::Sender<Trigger>,
    hurried: Hurried,
    applier: Arc<Applier>,
    shared: SharedStores,
}

impl Caches {
    /// The synced cache of `kind`. An unregistered kind is a programming error, a watch that
    /// cannot list (RBAC) an error that names the kind and the API server's reason.
    pub fn kind(&self, kind: &'static str) -> Result<&dyn KindCache> {
        let cache = self
            .kinds
            .get(kind)
            .map(|c| c.as_ref())
            .ok_or(Error::UnregisteredKind(kind))?;
        match cache.state() {
            CacheState::Synced => Ok(cache),
            CacheState::Failing { message, forbidden } => Err(Error::CacheUnavailable {
                kind,
                message,
                forbidden,
            }),
            CacheState::Syncing => Err(Error::CacheUnavailable {
                kind,
                message: "the first list has not arrived yet".into(),
                forbidden: false,
            }),
        }
    }

    fn typed<K: ChildKind>(&self) -> Option<&TypedCache<K>> {
        self.kinds.get(K::KIND)?.as_any().downcast_ref()
    }

    /// The cached object of kind `K`.
    pub fn get<K: ChildKind>(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.typed::<K>()?.find(namespace, name)
    }

    /// When the watch last saw the object change (any change of its `resourceVersion`) on
    /// the operator's monotonic clock; objects present at the first list count as changed
    /// then. Only for kinds registered with [`CachesBuilder::add_observed`].
    pub fn changed_at<K: ChildKind>(&self, namespace: &str, name: &str) -> Option<Instant> {
        self.typed::<K>()?
            .observations
            .as_ref()?
            .changed_at(namespace, name)
    }

    /// Cached objects of kind `K` in `namespace` labelled `app.kubernetes.io/instance:
    /// instance`, looked up in the kind's index. Only kinds registered with
    /// [`CachesBuilder::add_trimmed`] are indexed; for others the answer is empty.
    pub fn of_instance<K: ChildKind>(&self, namespace: &str, instance: &str) -> Vec<Arc<K>> {
        let Some(cache) = self.typed::<K>() else {
            return Vec::new();
        };
        let Some(index) = &cache.by_instance else {
            return Vec::new();
        };
        index.with_names(namespace, instance, |names| {
            names
                .iter()
                .filter_map(|name| cache.find(namespace, name))
                .collect()
        })
    }

    /// Resolves once every cache has listed its objects (what `/readyz` reports).
    pub async fn wait_synced(&self) {
        futures::future::join_all(self.kinds.values().map(|c| c.wait_synced())).await;
    }

    /// Resolves once each cache of `kinds` has listed its objects or failed to: no reconcile
    /// works from a cache that is still filling (it would take present children for missing).
    pub async fn wait_settled(&self, kinds: &[&'static str]) {
        let waits = kinds
            .iter()
            .filter_map(|k| self.kinds.get(k))
            .map(|c| c.wait_settled());
        futures::future::join_all(waits).await;
    }

    /// Triggers a reconcile of `owner` (by every controller of its kind).
    pub fn trigger(&self, owner: OwnerKey) {
        // No receiver (no controller running yet) is fine.
        let _ = self.triggers.send(Trigger {
            owner,
            urgency: Urgency::Coalesce,
        });
    }

    /// Whether `owner`'s child events are released to its reconcile at once (`true`: a
    /// failover or switchover waits on them) or coalesced into bursts (the default). An
    /// owner's watch forgets it when the owner is deleted.
    pub fn hurry(&self, owner: &OwnerKey, hurry: bool) {
        let mut hurried = self.hurried.lock().unwrap_or_else(PoisonError::into_inner);
        if hurry {
            if !hurried.contains(owner) {
                hurried.insert(owner.clone());
            }
        } else {
            hurried.remove(owner);
        }
    }

    /// The applier that keeps the record of what was applied.
    pub fn applier(&self) -> &Applier {
        &self.applier
    }

    /// Offers a controller's store of its primary kind `K` to the other controllers of this
    /// scope: one watch of `K`, read by more than its own controller (retention reads the
    /// DatabaseBackups the DatabaseBackup controller watches).
    pub fn share_store<K>(&self, store: kube::runtime::reflector::Store<K>)
    where
        K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        self.shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(std::any::TypeId::of::<K>(), Box::new(store));
    }

    /// The store of `K` its controller shares, once that store has listed everything
    /// (`None` before: a reader falls back to a live list).
    pub fn shared_store<K>(&self) -> Option<kube::runtime::reflector::Store<K>>
    where
        K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        let store = shared
            .get(&std::any::TypeId::of::<K>())?
            .downcast_ref::<kube::runtime::reflector::Store<K>>()?
            .clone();
        // `wait_until_ready` resolves at once when the first list is done.
        futures::FutureExt::now_or_never(store.wait_until_ready())
            .is_some_and(|ready| ready.is_ok())
            .then_some(store)
    }

    /// Every owner trigger of an owner of kind `kind` (what [`Self::owner_triggers`] maps
    /// to its own kind), for a controller woken by another kind's child events.
    pub fn triggers_of_kind(
        &self,
        kind: &str,
    ) -> impl Stream<Item = (OwnerKey, Urgency)> + Send + use<> {
        let kind = CompactString::from(kind);
        let receiver = self.triggers.subscribe();
        futures::stream::unfold(receiver, |mut receiver| async move {
            loop {
                match receiver.recv().await {
                    Ok(trigger) => return Some((trigger, receiver)),
                    Err(broadcast::error::RecvError::Lagged(missed)) => tracing::warn!(
                        missed,
                        "missed child events; their owners are reconciled at the next health check"
                    ),
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .filter_map(move |Trigger { owner, urgency }| {
            futures::future::ready((owner.kind == kind).then_some((owner, urgency)))
        })
    }

    /// A reconcile trigger for every change of a child owned by an object of kind `O`, and
    /// whether it may be coalesced with the ones around it.
    pub fn owner_triggers<O>(&self) -> impl Stream<Item = (ObjectRef<O>, Urgency)> + Send + 'static
    where
        O: Resource<DynamicType = ()> + 'static,
    {
        self.triggers_of_kind(&O::kind(&()))
            .map(|(owner, urgency)| {
                (
                    ObjectRef::<O>::new(&owner.name).within(&owner.namespace),
                    urgency,
                )
            })
    }
}

/// Registers the child kinds of one watch scope, then starts their watches.
pub struct CachesBuilder {
    client: Client,
    namespace: Option<String>,
    kinds: BTreeMap<&'static str, Arc<dyn KindCache>>,
    watches: Vec<BoxFuture<'static, ()>>,
    triggers: broadcast::Sender<Trigger>,
    hurried: Hurried,
    applier: Arc<Applier>,
}

/// Objects per list page of a cache's (re-)list.
pub const LIST_PAGE_SIZE: u32 = 100;

/// Trigger messages buffered per controller before the slowest one misses some.
const TRIGGER_BUFFER: usize = 4096;

impl CachesBuilder {
    pub fn new(client: Client, namespace: Option<String>) -> Self {
        Self {
            client,
            namespace,
            kinds: BTreeMap::new(),
            watches: Vec::new(),
            triggers: broadcast::channel(TRIGGER_BUFFER).0,
            hurried: Hurried::default(),
            applier: Arc::default(),
        }
    }

    /// Caches `K`, whose owner is its controller owner reference, keeping of each object
    /// only what `slim` leaves (see [`slim`]: a child's metadata is enough to know whether it
    /// is as we left it).
    pub fn add_slim<K: ChildKind>(self, slim: fn(&mut K)) -> Self {
        self.register::<K, ManagedFields>(controller_owner::<K>, slim, None, false)
    }

    /// [`Self::add_slim`] for kinds the operator reads nothing of but their [`LiveMeta`]
    /// ([`KindCache::meta`]): no object is kept, and [`Caches::get`] finds none.
    pub fn add_metadata<K: ChildKind>(self, slim: fn(&mut K)) -> Self {
        self.register_with::<K, ManagedFields>(controller_owner::<K>, slim, None, false, true, true)
    }

    /// Caches `K`, finding the owner with `owner_of` and keeping of each object only what
    /// `trim` leaves (for kinds the operator reads a few fields of, such as pods). `S` names
    /// fields `trim` drops, left out already while decoding.
    pub fn add_trimmed<K: ChildKind, S: SkipFields>(
        self,
        owner_of: OwnerOf<K>,
        trim: fn(&mut K),
    ) -> Self {
        self.register_with::<K, S>(owner_of, trim, None, false, false, false)
    }

    /// Caches `K` (kept whole but pruned), finding the owner with `owner_of`, but triggers the owner only when
    /// `significant(object)` changed since the last event for that object (or the object is
    /// new or deleted), and notes when each object last changed ([`Caches::changed_at`]).
    /// For objects rewritten often without news, such as a lock its holder renews.
    pub fn add_observed<K: ChildKind>(
        self,
        owner_of: OwnerOf<K>,
        significant: fn(&K) -> u64,
    ) -> Self {
        self.register::<K, ManagedFields>(owner_of, |_| {}, Some(significant), true)
    }

    /// Every kind: pruned, fingerprinted ([`slim::content`]) and slimmed before it is stored.
    /// An event triggers the owner only when it is news: the object is new or gone, or what
    /// the cache keeps of it changed (for observed kinds: its significant part), and it is
    /// not the echo of the operator's own apply.
    fn register<K: ChildKind, S: SkipFields>(
        self,
        owner_of: OwnerOf<K>,
        trim: fn(&mut K),
        significant: Option<fn(&K) -> u64>,
        keeps_body: bool,
    ) -> Self {
        self.register_with::<K, S>(owner_of, trim, significant, keeps_body, true, false)
    }

    /// [`Self::register`]; `fingerprinted`: whether to note the content fingerprint (kinds
    /// the operator applies; for the others, such as pods, a change of what is not kept is
    /// no news); `metadata_only`: keep a [`MetaStore`] entry instead of the object.
    fn register_with<K: ChildKind, S: SkipFields>(
        mut self,
        owner_of: OwnerOf<K>,
        trim: fn(&mut K),
        significant: Option<fn(&K) -> u64>,
        keeps_body: bool,
        fingerprinted: bool,
        metadata_only: bool,
    ) -> Self {
        let (set_state, state) = watch::channel(CacheState::Syncing);
        // Small list pages: the first list of a kind is its largest burst of memory (full
        // objects, before they are slimmed).
        let config = watcher::Config::default()
            .labels(&devctl_api::labels::managed_selector())
            .page_size(LIST_PAGE_SIZE);
        // Decoded without what `prune` and `trim` would drop at once (`S`).
        let api: Api<Lean<K, S>> = scoped_api(&self.client, self.namespace.as_deref());
        let triggers = self.triggers.clone();
        let hurried = self.hurried.clone();
        let applier = self.applier.clone();
        let observations = significant.map(|_| Arc::new(Observations::default()));
        let observed = observations.clone();
        let entries = Arc::new(if metadata_only {
            MetaStore::default()
        } else {
            MetaStore::keeping_objects()
        });
        let reader = entries.clone();
        let cached =
            move |namespace: &str, name: &str| reader.read(namespace, name, |_| ()).is_some();
        let previous = entries.clone();
        // Whether an object as delivered is news for its owner (decided before the store
        // takes it, so the previous copy is still there to compare with).
        let news = move |object: &K, significance: Option<u64>| match (significant, &observed) {
            (Some(significant), Some(observed)) => {
                observed.record(object, significant(object), Instant::now())
            }
            _ => previous
                .read(
                    &object.namespace().unwrap_or_default(),
                    &object.name_any(),
                    |old| old.significance,
                )
                .is_none_or(|old| Some(old) != significance),
        };
        // Our own writes come back as events: not news (see `Applier::hold`).
        let held = {
            let applier = applier.clone();
            move |object: &K, owner: &OwnerKey| {
                let (Some(namespace), Some(version)) =
                    (object.namespace(), object.resource_version())
                else {
                    return false;
                };
                applier.hold(K::KIND, &namespace, &object.name_any(), &version, owner)
            }
        };
        let forget = observations.clone();
        let writing = entries.clone();
        // Kinds the operator does not apply (pods, claims) are looked up by the cluster
        // they belong to.
        let by_instance = (!fingerprinted).then(|| Arc::new(InstanceIndex::default()));
        let indexing = by_instance.clone();
        let replaced = entries.clone();
        let watch = watcher(api, config)
            .default_backoff()
            .map_ok(crate::lean_decode::unwrap_event)
            .modify(move |object: &mut K| slim_for_cache(object, trim, fingerprinted, keeps_body))
            .for_each(move |mut event| {
                if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = &event {
                    let known = cached(&o.namespace().unwrap_or_default(), &o.name_any());
                    rescan_if_new(o, known, &applier);
                }
                // What the cache keeps of the object, serialised once: its significance (for
                // whether it is news) and the store's entry.
                let kept = match &mut event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        Some(writing.keep(o))
                    }
                    _ => None,
                };
                let significance = kept.as_ref().map(|k| k.significance);
                let owner = match &event {
                    Ok(watcher::Event::Apply(o)) => news(o, significance)
                        .then(|| owner_of(o))
                        .flatten()
                        .filter(|owner| !held(o, owner)),
                    // Objects of a re-list may have changed while the watch was down; the
                    // first list is not news (each controller reconciles everything at start).
                    Ok(watcher::Event::InitApply(o)) => {
                        let news = news(o, significance);
                        (news && *set_state.borrow() == CacheState::Synced)
                            .then(|| owner_of(o))
                            .flatten()
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        forget_deleted(o, &applier, forget.as_deref());
                        owner_of(o)
                    }
                    _ => None,
                };
                if let (Some(index), Ok(event)) = (&indexing, &event) {
                    reindex(index, event, &replaced);
                }
                if let Ok(event) = &event {
                    writing.apply(event, kept);
                }
                match &event {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(observations) = &forget {
                            observations.retain(|namespace, name| cached(namespace, name));
                        }
                        applier.forget_missing(K::KIND, &cached);
                        set_state.send_replace(CacheState::Synced);
                    }
                    Err(error) => watch_failed(K::KIND, error, &set_state),
                    _ => {}
                }
                if let Some(owner) = owner {
                    trigger_owner(K::KIND, owner, &hurried, &triggers);
                }
                futures::future::ready(())
            })
            .boxed();
        self.watches.push(watch);
        self.kinds.insert(
            K::KIND,
            Arc::new(TypedCache::<K> {
                entries,
                api_resource: super::api_resource::<K>(),
                state,
                observations,
                keeps_body,
                by_instance,
                kind: std::marker::PhantomData,
            }),
        );
        self
    }

    /// The caches and the future that runs their watches (drive it for as long as the caches
    /// are used; dropping it stops every watch).
    pub fn build(self) -> (Caches, impl Future<Output = ()> + Send + 'static) {
        let caches = Caches {
            kinds: Arc::new(self.kinds),
            triggers: self.triggers,
            hurried: self.hurried,
            applier: self.applier,
            shared: SharedStores::default(),
        };
        let watches = futures::future::join_all(self.watches).map(|_| ());
        (caches, watches)
    }
}

/// Takes `event` into the instance index. The copy it replaces is decoded only when its
/// labels may have moved it (the store still holds that copy).
fn reindex<K: ChildKind>(index: &InstanceIndex, event: &watcher::Event<K>, store: &MetaStore) {
    let previous = || match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
            store.object::<K>(&o.namespace().unwrap_or_default(), &o.name_any())
        }
        _ => None,
    };
    index.apply(event, previous);
}

/// A deleted child: what the applier and the observations remembered of it goes.
fn forget_deleted<K: ChildKind>(
    object: &K,
    applier: &Applier,
    observations: Option<&Observations>,
) {
    if let Some(namespace) = object.namespace() {
        applier.forget(K::KIND, &namespace, &object.name_any());
        if let Some(observations) = observations {
            observations.forget(&namespace, &object.name_any());
        }
    }
}

/// A child new to the cache (`known`: it was cached already) may be one the last orphan
/// scan of its owner could not see yet: the next reconcile scans again. Not for a child our
/// own apply created: it was wanted when its owner's scan was recorded.
fn rescan_if_new<K: ChildKind>(object: &K, known: bool, applier: &Applier) {
    if !known
        && let (Some(namespace), Some(controller)) = (
            object.namespace(),
            object
                .owner_references()
                .iter()
                .find(|r| r.controller == Some(true)),
        )
        && !applier.wrote(K::KIND, &namespace, &object.name_any())
    {
        applier.forget_owner(&namespace, &controller.uid);
    }
}

/// A child's event reconciles its owner: at once while a failover or switchover hurries it,
/// else coalesced with the rest of a burst.
fn trigger_owner(
    kind: &str,
    owner: OwnerKey,
    hurried: &Hurried,
    triggers: &broadcast::Sender<Trigger>,
) {
    tracing::debug!(kind, owner = %owner.name, "child event triggers its owner");
    let urgency = if hurried
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&owner)
    {
        Urgency::Now
    } else {
        Urgency::Coalesce
    };
    // No receiver (no controller running yet, e.g. a follower) is fine.
    let _ = triggers.send(Trigger { owner, urgency });
}

/// What a cache keeps of an object as delivered: without managedFields and the
/// last-applied annotation, trimmed (`trim`), its content fingerprint noted first
/// (`fingerprinted`), and for applied kinds not kept whole only the metadata the applier
/// reads.
fn slim_for_cache<K: ChildKind>(
    object: &mut K,
    trim: fn(&mut K),
    fingerprinted: bool,
    keeps_body: bool,
) {
    prune(object);
    let content = fingerprinted.then(|| slim::content(object));
    trim(object);
    // Applied kinds not kept whole: their metadata beyond what the applier reads is in the
    // fingerprint.
    if fingerprinted && !keeps_body {
        slim::metadata(object);
    }
    if content.is_some() {
        slim::set_cached_content(object, content);
    }
}

/// A watch of `kind` failed (it retries with backoff): a cache not synced yet says why
/// (and whether it was refused).
fn watch_failed(kind: &str, error: &watcher::Error, set_state: &watch::Sender<CacheState>) {
    tracing::warn!(kind, %error, "watching children failed; retrying with backoff");
    if *set_state.borrow() != CacheState::Synced {
        let forbidden = matches!(
            error,
            watcher::Error::InitialListFailed(kube::Error::Api(s))
                | watcher::Error::WatchStartFailed(kube::Error::Api(s))
                if s.code == 403
        );
        set_state.send_replace(CacheState::Failing {
            message: error.to_string(),
            forbidden,
        });
    }
}
