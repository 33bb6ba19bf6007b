//! One cache per child kind, shared by every controller: a label-selected watch (only what
//! devctl manages, so memory grows with what devctl owns) and a fan-out of "this owner's
//! child changed" triggers to the controllers.
//!
//! Registering a kind is one line in [`CachesBuilder`]'s caller; controllers name the kinds
//! they own by their `KIND` string and read typed objects with [`Caches::get`]. No reflector
//! store is used: each kind keeps an entry per object (what the applier reads) and, for kinds
//! whose objects are read, the slimmed object packed as JSON, decoded again per read — a
//! fraction of the struct's size, for a few microseconds per read.
//!
//! Some objects change all the time without news for their owner: a lock its holder renews
//! every second. Those are registered with [`CachesBuilder::add_observed`]: their owner is
//! triggered only when the part that matters changes, and the cache notes on the operator's
//! monotonic clock when each object last changed at all ([`Caches::changed_at`]), which is
//! how the silence of a lock is measured without comparing clocks between machines.

use std::any::Any;
use std::collections::{BTreeMap, HashSet};
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

use super::compact::{ByNamespace, CompactString, Uid};
use super::{Applier, ChildKind, HASH_ANNOTATION, slim};
use super::{prune, scoped_api};
use crate::debounce::Urgency;
use crate::error::{Error, Result};
use crate::lean_decode::{Lean, ManagedFields, SkipFields};

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

/// What [`super::Applier`] needs to know of a live child without its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMeta {
    pub resource_version: Option<CompactString>,
    /// The [`HASH_ANNOTATION`] of the live object.
    pub hash: Option<CompactString>,
    /// Fingerprint of the live object's content ([`slim::content`]).
    pub content: Option<u64>,
    /// The uid of its controller owner.
    pub controller: Option<Uid>,
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

/// What an observed kind's watch saw of one object last.
#[derive(Debug, Clone)]
struct Seen {
    resource_version: Option<CompactString>,
    significant: u64,
    changed_at: Instant,
}

/// The last change of every object of an observed kind, by namespace and name.
#[derive(Debug, Default)]
struct Observations {
    seen: Mutex<ByNamespace<Seen>>,
}

impl Observations {
    /// Notes `object` as the watch delivers it at `now`; returns whether it is news for its
    /// owner: new, or its `significant` value differs from the last one seen.
    fn record<K: Resource>(&self, object: &K, significant: u64, now: Instant) -> bool {
        let namespace = object.meta().namespace.as_deref().unwrap_or_default();
        let name = object.name_any();
        let resource_version = object
            .meta()
            .resource_version
            .as_deref()
            .map(CompactString::from);
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = seen.get(namespace, &name);
        let news = previous.is_none_or(|p| p.significant != significant);
        // A re-list delivers unchanged objects again: they did not change then.
        let changed_at = match previous {
            Some(p) if p.resource_version == resource_version => p.changed_at,
            _ => now,
        };
        seen.insert(
            namespace,
            &name,
            Seen {
                resource_version,
                significant,
                changed_at,
            },
        );
        news
    }

    fn forget(&self, namespace: &str, name: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.remove(namespace, name);
    }

    /// Keeps only what `exists` says is still there: a re-list reports no deletions that
    /// happened while the watch was down.
    fn retain(&self, exists: impl Fn(&str, &str) -> bool) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.retain(|namespace, name, _| exists(namespace, name));
    }

    fn changed_at(&self, namespace: &str, name: &str) -> Option<Instant> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(namespace, name).map(|s| s.changed_at)
    }
}

/// The parts of a child the applier reads ([`LiveMeta`]).
fn live_meta<K: Resource>(object: &K) -> LiveMeta {
    LiveMeta {
        resource_version: object.meta().resource_version.as_deref().map(Into::into),
        hash: object
            .annotations()
            .get(HASH_ANNOTATION)
            .map(|hash| hash.as_str().into()),
        content: slim::cached_content(object),
        controller: object
            .owner_references()
            .iter()
            .find(|r| r.controller == Some(true))
            .map(|r| Uid::new(&r.uid)),
    }
}

/// What a store keeps of an object beside its metadata ([`MetaStore::keep`]).
struct Kept {
    significance: u64,
    packed: Option<Box<[u8]>>,
}

/// What the cache keeps of one object: what the applier reads and, for kinds the operator
/// reads more of, the slimmed object packed as JSON.
#[derive(Debug, Clone)]
struct MetaEntry {
    meta: LiveMeta,
    /// A hash of what this store keeps of the object, without its `resourceVersion`
    /// ([`MetaStore::keep`]): whether an event is news.
    significance: u64,
    /// The slimmed object as JSON text, without its `resourceVersion` (in `meta`): a
    /// quarter or less of what its k8s-openapi struct holds (a `Pod` struct alone is 2,464
    /// bytes however empty, each label a map node and two strings), decoded again by each
    /// read. `None` for metadata-only kinds.
    packed: Option<Box<[u8]>>,
}

type MetaMap = ByNamespace<MetaEntry>;

/// The store of every child kind: for metadata-only kinds ([`CachesBuilder::add_metadata`])
/// a few hundred bytes per child, where a reflector keeps the kind's whole struct even with
/// every field empty (824 bytes for a `Service`, plus a map node for two annotations); for
/// kinds whose objects are read, the slimmed object packed as JSON beside that.
#[derive(Default)]
struct MetaStore {
    entries: std::sync::RwLock<MetaMap>,
    /// A (re-)list in progress: it replaces `entries` when complete, as a reflector's does.
    listing: Mutex<Option<MetaMap>>,
    /// Whether objects are kept (packed), not only their metadata.
    keeps_objects: bool,
}

impl MetaStore {
    fn keeping_objects() -> Self {
        Self {
            keeps_objects: true,
            ..Self::default()
        }
    }

    /// The kept object, decoded (`None` for metadata-only kinds).
    fn object<K: Resource + serde::de::DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<K> {
        self.read(namespace, name, |entry| {
            // Text this store wrote from a `K`: it decodes as one. Packed without its
            // resourceVersion, which the entry's metadata holds.
            let mut object: K = serde_json::from_slice(entry.packed.as_deref()?).ok()?;
            object.meta_mut().resource_version = entry
                .meta
                .resource_version
                .as_ref()
                .map(ToString::to_string);
            Some(object)
        })
        .flatten()
    }

    /// What this store keeps of `object` beside its metadata: its significance and, for
    /// stores keeping objects, the object packed — both from one serialisation without the
    /// `resourceVersion` (which changes with every write and the entry's metadata holds).
    fn keep<K: Resource + serde::Serialize>(&self, object: &mut K) -> Kept {
        if !self.keeps_objects {
            return Kept {
                significance: slim::significance(object),
                packed: None,
            };
        }
        let resource_version = object.meta_mut().resource_version.take();
        let packed = serde_json::to_vec(object).ok();
        object.meta_mut().resource_version = resource_version;
        Kept {
            significance: packed.as_deref().map_or(0, slim::fingerprint_bytes),
            packed: packed.map(Vec::into_boxed_slice),
        }
    }

    fn meta(&self, namespace: &str, name: &str) -> Option<LiveMeta> {
        self.read(namespace, name, |entry| entry.meta.clone())
    }

    fn read<T>(&self, namespace: &str, name: &str, f: impl FnOnce(&MetaEntry) -> T) -> Option<T> {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        entries.get(namespace, name).map(f)
    }

    /// Takes `event` in. `kept`: what [`Self::keep`] made of the event's object when the
    /// caller has made it already (made here otherwise).
    fn apply<K: Resource + serde::Serialize + Clone>(
        &self,
        event: &watcher::Event<K>,
        kept: Option<Kept>,
    ) {
        let entry = |object: &K| {
            let Kept {
                significance,
                packed,
            } = kept.unwrap_or_else(|| self.keep(&mut object.clone()));
            (
                object.namespace().unwrap_or_default(),
                object.name_any(),
                MetaEntry {
                    meta: live_meta(object),
                    significance,
                    packed,
                },
            )
        };
        let mut listing = self.listing.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = || self.entries.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Init => *listing = Some(MetaMap::default()),
            watcher::Event::InitApply(object) => {
                let (namespace, name, value) = entry(object);
                listing
                    .get_or_insert_default()
                    .insert(&namespace, &name, value);
            }
            watcher::Event::InitDone => {
                if let Some(listed) = listing.take() {
                    *entries() = listed;
                }
            }
            watcher::Event::Apply(object) => {
                let (namespace, name, value) = entry(object);
                entries().insert(&namespace, &name, value);
            }
            watcher::Event::Delete(object) => {
                let namespace = object.meta().namespace.as_deref().unwrap_or_default();
                entries().remove(namespace, &object.name_any());
            }
        }
    }

    fn owned(&self, namespace: &str, owner_uid: &str) -> Vec<String> {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        let owner = Uid::new(owner_uid);
        entries
            .in_namespace(namespace)
            .filter(|(_, e)| e.meta.controller.as_ref() == Some(&owner))
            .map(|(name, _)| name.to_string())
            .collect()
    }
}

/// The names of a kind's cached objects by namespace and `app.kubernetes.io/instance` label,
/// for kinds the operator finds by the cluster they belong to (pods, claims): a reconcile
/// looks up its own few instead of testing every cached object (work that grew with the
/// number of clusters, on every reconcile).
#[derive(Default)]
struct InstanceIndex {
    members: std::sync::RwLock<IndexMap>,
    /// A (re-)list in progress: it replaces `members` when complete, as the store's does.
    listing: Mutex<Option<IndexMap>>,
}

/// Object names by namespace and instance.
type IndexMap = ByNamespace<Vec<CompactString>>;

impl InstanceIndex {
    /// The object's namespace and instance label.
    fn key<K: Resource>(object: &K) -> Option<(&str, &str)> {
        Some((
            object.meta().namespace.as_deref()?,
            object.labels().get(devctl_api::labels::INSTANCE)?.as_str(),
        ))
    }

    fn insert<K: Resource>(map: &mut IndexMap, object: &K) {
        if let Some((namespace, instance)) = Self::key(object) {
            let names = map.get_or_insert_with(namespace, instance, Vec::new);
            let name = object.name_any();
            if !names.iter().any(|n| *n == name) {
                names.push(name.into());
            }
        }
    }

    fn remove<K: Resource>(map: &mut IndexMap, object: &K) {
        if let Some((namespace, instance)) = Self::key(object)
            && let Some(names) = map.get_mut(namespace, instance)
        {
            let name = object.name_any();
            names.retain(|n| *n != name);
            if names.is_empty() {
                map.remove(namespace, instance);
            }
        }
    }

    /// Whether `object` is listed under its current labels (then under no others).
    fn lists<K: Resource>(map: &IndexMap, object: &K) -> bool {
        let name = object.name_any();
        Self::key(object)
            .and_then(|(namespace, instance)| map.get(namespace, instance))
            .is_some_and(|names| names.iter().any(|n| *n == name))
    }

    /// Takes `event` in; `previous` gives the cached copy it replaces (its labels may differ),
    /// asked for only when the object is not listed under its current labels already.
    fn apply<K: Resource>(&self, event: &watcher::Event<K>, previous: impl FnOnce() -> Option<K>) {
        let mut listing = self.listing.lock().unwrap_or_else(PoisonError::into_inner);
        let members = || self.members.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Init => *listing = Some(IndexMap::default()),
            watcher::Event::InitApply(object) => {
                Self::insert(listing.get_or_insert_default(), object);
            }
            watcher::Event::InitDone => {
                if let Some(listed) = listing.take() {
                    *members() = listed;
                }
            }
            watcher::Event::Apply(object) => {
                let mut members = members();
                if !Self::lists(&members, object)
                    && let Some(previous) = previous()
                {
                    Self::remove(&mut members, &previous);
                }
                Self::insert(&mut members, object);
            }
            watcher::Event::Delete(object) => {
                let mut members = members();
                if !Self::lists(&members, object)
                    && let Some(previous) = previous()
                {
                    Self::remove(&mut members, &previous);
                }
                Self::remove(&mut members, object);
            }
        }
    }

    /// `f` of the names of the instance's objects (none: an empty slice).
    fn with_names<T>(
        &self,
        namespace: &str,
        instance: &str,
        f: impl FnOnce(&[CompactString]) -> T,
    ) -> T {
        let members = self.members.read().unwrap_or_else(PoisonError::into_inner);
        let names = members.get(namespace, instance);
        f(names.map_or(&[], Vec::as_slice))
    }
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

    /// A reconcile trigger for every change of a child owned by an object of kind `O`, and
    /// whether it may be coalesced with the ones around it.
    pub fn owner_triggers<O>(&self) -> impl Stream<Item = (ObjectRef<O>, Urgency)> + Send + 'static
    where
        O: Resource<DynamicType = ()> + 'static,
    {
        let kind = O::kind(&()).to_string();
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
            let object = (owner.kind == kind).then(|| {
                (
                    ObjectRef::<O>::new(&owner.name).within(&owner.namespace),
                    urgency,
                )
            });
            futures::future::ready(object)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, instance: &str) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": "ns",
                "labels": { devctl_api::labels::INSTANCE: instance } }
        }))
        .unwrap()
    }

    #[test]
    fn the_instance_index_follows_labels_deletes_and_relists() {
        let index = InstanceIndex::default();
        let names = |instance: &str| {
            let mut names = index.with_names("ns", instance, |names| {
                names.iter().map(ToString::to_string).collect::<Vec<_>>()
            });
            names.sort();
            names
        };
        index.apply(
            &watcher::Event::<k8s_openapi::api::core::v1::Pod>::Init,
            || None,
        );
        index.apply(&watcher::Event::InitApply(pod("a-0", "a")), || None);
        index.apply(&watcher::Event::InitApply(pod("a-1", "a")), || None);
        assert!(names("a").is_empty(), "a list counts once complete");
        index.apply(
            &watcher::Event::<k8s_openapi::api::core::v1::Pod>::InitDone,
            || None,
        );
        assert_eq!(names("a"), ["a-0", "a-1"]);

        // Relabelled: found under its new instance only; an update is not a duplicate.
        index.apply(&watcher::Event::Apply(pod("a-1", "b")), || {
            Some(pod("a-1", "a"))
        });
        index.apply(&watcher::Event::Apply(pod("a-1", "b")), || {
            Some(pod("a-1", "b"))
        });
        assert_eq!(
            (names("a"), names("b")),
            (vec!["a-0".to_string()], vec!["a-1".to_string()])
        );
        assert!(index.with_names("other-ns", "a", <[CompactString]>::is_empty));

        index.apply(&watcher::Event::Delete(pod("a-0", "a")), || {
            Some(pod("a-0", "a"))
        });
        assert!(names("a").is_empty());

        // A re-list replaces everything: what was deleted meanwhile is gone.
        index.apply(
            &watcher::Event::<k8s_openapi::api::core::v1::Pod>::Init,
            || None,
        );
        index.apply(&watcher::Event::InitApply(pod("c-0", "c")), || None);
        index.apply(
            &watcher::Event::<k8s_openapi::api::core::v1::Pod>::InitDone,
            || None,
        );
        assert!(names("b").is_empty());
        assert_eq!(names("c"), ["c-0"]);
    }

    fn secret(name: &str, version: &str, owner: &str) -> k8s_openapi::api::core::v1::Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name, "namespace": "ns", "resourceVersion": version,
                "annotations": { HASH_ANNOTATION: "h" },
                "ownerReferences": [{ "apiVersion": "v1", "kind": "X", "name": "o", "uid": owner, "controller": true }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_metadata_store_keeps_what_the_applier_reads_and_swaps_in_a_relist_whole() {
        let store = MetaStore::default();
        store.apply(&watcher::Event::Apply(secret("a", "1", "u1")), None);
        store.apply(&watcher::Event::Apply(secret("b", "2", "u1")), None);
        let a = store.meta("ns", "a").unwrap();
        assert_eq!(a.resource_version.as_deref(), Some("1"));
        assert_eq!(a.hash.as_deref(), Some("h"));
        assert!(a.controller.is_some_and(|c| c.is("u1")));
        let mut owned = store.owned("ns", "u1");
        owned.sort();
        assert_eq!(owned, ["a", "b"]);
        assert!(store.owned("other", "u1").is_empty());

        // A re-list: the old entries stay readable until it is complete, then only what it
        // listed is left (b was deleted while the watch was down).
        store.apply(
            &watcher::Event::<k8s_openapi::api::core::v1::Secret>::Init,
            None,
        );
        store.apply(&watcher::Event::InitApply(secret("a", "3", "u1")), None);
        assert!(store.meta("ns", "b").is_some());
        store.apply(
            &watcher::Event::<k8s_openapi::api::core::v1::Secret>::InitDone,
            None,
        );
        assert!(store.meta("ns", "b").is_none());
        assert_eq!(
            store.meta("ns", "a").unwrap().resource_version.as_deref(),
            Some("3")
        );
        store.apply(&watcher::Event::Delete(secret("a", "4", "u1")), None);
        assert!(store.meta("ns", "a").is_none());
    }

    #[test]
    fn a_store_keeping_objects_gives_back_what_it_took_in_less_room() {
        use k8s_openapi::api::core::v1::Pod;
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "db-0", "namespace": "ns", "resourceVersion": "7",
                "labels": { devctl_api::labels::INSTANCE: "db", "devctl.io/role": "primary",
                            "controller-revision-hash": "db-5d8f7c9b4" },
                "annotations": { "devctl.io/status": "{\"role\":\"primary\",\"ready\":true}" } },
            "status": { "conditions": [{ "type": "Ready", "status": "True" }],
                        "containerStatuses": [{ "name": "postgres", "ready": true, "restartCount": 0,
                                                "image": "postgres:16", "imageID": "" }] }
        }))
        .unwrap();
        let store = MetaStore::keeping_objects();
        store.apply(&watcher::Event::Apply(pod.clone()), None);
        assert_eq!(store.object::<Pod>("ns", "db-0"), Some(pod.clone()));
        let packed = store
            .read("ns", "db-0", |e| e.packed.as_ref().map(|p| p.len()))
            .flatten()
            .unwrap();
        // The struct alone, before any of its strings and maps.
        assert!(packed < std::mem::size_of::<Pod>() / 4, "{packed} bytes");
        assert_eq!(store.object::<Pod>("ns", "db-1"), None);
        // Only the resourceVersion moved: the same significance (such an event is no news),
        // and the object read back carries the new version.
        let significance = |store: &MetaStore| store.read("ns", "db-0", |e| e.significance);
        let before = significance(&store);
        let mut next = pod.clone();
        next.metadata.resource_version = Some("8".into());
        store.apply(&watcher::Event::Apply(next.clone()), None);
        assert_eq!(significance(&store), before);
        assert_eq!(store.object::<Pod>("ns", "db-0"), Some(next.clone()));
        next.labels_mut()
            .insert("devctl.io/role".into(), "replica".into());
        store.apply(&watcher::Event::Apply(next), None);
        assert_ne!(
            significance(&store),
            before,
            "a label is kept, so it is news"
        );

        // A metadata-only store keeps no object.
        let metadata = MetaStore::default();
        metadata.apply(&watcher::Event::Apply(pod), None);
        assert!(metadata.meta("ns", "db-0").is_some());
        assert_eq!(metadata.object::<Pod>("ns", "db-0"), None);
    }
    use k8s_openapi::api::coordination::v1::Lease;
    use std::time::Duration;

    fn lease(resource_version: &str, holder: &str) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "db-primary", "namespace": "ns", "resourceVersion": resource_version },
            "spec": { "holderIdentity": holder }
        }))
        .unwrap()
    }

    fn holder(lease: &Lease) -> u64 {
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .map_or(0, |h| h.len() as u64)
    }

    #[test]
    fn renewals_are_no_news_but_move_the_change_time() {
        let observations = Observations::default();
        let start = Instant::now();
        let later = start + Duration::from_secs(3);
        let first = lease("1", "db-0");
        assert!(observations.record(&first, holder(&first), start), "new");
        assert_eq!(observations.changed_at("ns", "db-primary"), Some(start));
        // The same version again (a re-list): neither news nor a change.
        assert!(!observations.record(&first, holder(&first), later));
        assert_eq!(observations.changed_at("ns", "db-primary"), Some(start));
        // A renewal: a new version, the same holder.
        let renewed = lease("2", "db-0");
        assert!(!observations.record(&renewed, holder(&renewed), later));
        assert_eq!(observations.changed_at("ns", "db-primary"), Some(later));
        // Another holder is news.
        let taken = lease("3", "db-10");
        assert!(observations.record(&taken, holder(&taken), later));
        observations.retain(|_, _| false);
        assert_eq!(observations.changed_at("ns", "db-primary"), None);
        assert!(
            observations.record(&taken, holder(&taken), later),
            "new again"
        );
        observations.forget("ns", "db-primary");
        assert_eq!(observations.changed_at("ns", "db-primary"), None);
    }
}
