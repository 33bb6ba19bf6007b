//! One cache per child kind, shared by every controller: a label-selected watch (only what
//! devctl manages, so memory grows with what devctl owns) and a fan-out of "this owner's
//! child changed" triggers to the controllers.
//!
//! Registering a kind is one line in [`CachesBuilder`]'s caller; controllers name the kinds
//! they own by their `KIND` string and read typed objects with [`Caches::get`].

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use kube::api::Api;
use kube::discovery::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use super::{Applier, ChildKind, HASH_ANNOTATION};
use crate::error::{Error, Result};
use crate::reconciler::{prune, scoped_api};

/// Which owner a child event concerns: its kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// How to find the owner of a child of kind `K`.
pub type OwnerOf<K> = fn(&K) -> Option<OwnerKey>;

/// The owner named by the controller owner reference (how devctl links its children).
pub fn controller_owner<K: Resource>(object: &K) -> Option<OwnerKey> {
    let owner = object
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true))?;
    Some(OwnerKey {
        kind: owner.kind.clone(),
        namespace: object.namespace()?,
        name: owner.name.clone(),
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

/// What [`super::Applier`] needs to know of a live child without serialising it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMeta {
    pub resource_version: Option<String>,
    /// The [`HASH_ANNOTATION`] of the live object.
    pub hash: Option<String>,
}

/// The cache of one kind, seen without its type.
pub trait KindCache: Send + Sync {
    fn api_resource(&self) -> &ApiResource;
    fn meta(&self, namespace: &str, name: &str) -> Option<LiveMeta>;
    /// The live object as JSON (for the content check).
    fn json(&self, namespace: &str, name: &str) -> Option<Result<Value>>;
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
    store: Store<K>,
    api_resource: ApiResource,
    state: watch::Receiver<CacheState>,
}

impl<K: ChildKind> TypedCache<K> {
    fn find(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }
}

impl<K: ChildKind> KindCache for TypedCache<K> {
    fn api_resource(&self) -> &ApiResource {
        &self.api_resource
    }

    fn meta(&self, namespace: &str, name: &str) -> Option<LiveMeta> {
        let object = self.find(namespace, name)?;
        Some(LiveMeta {
            resource_version: object.resource_version(),
            hash: object.annotations().get(HASH_ANNOTATION).cloned(),
        })
    }

    fn json(&self, namespace: &str, name: &str) -> Option<Result<Value>> {
        let object = self.find(namespace, name)?;
        Some(
            serde_json::to_value(object.as_ref()).map_err(|source| Error::Render {
                kind: K::KIND,
                source,
            }),
        )
    }

    fn owned(&self, namespace: &str, owner_uid: &str) -> Vec<String> {
        self.store
            .state()
            .iter()
            .filter(|o| o.namespace().as_deref() == Some(namespace))
            .filter(|o| {
                o.owner_references()
                    .iter()
                    .any(|r| r.controller == Some(true) && r.uid == owner_uid)
            })
            .map(|o| o.name_any())
            .collect()
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
    triggers: broadcast::Sender<OwnerKey>,
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

    /// Cached objects of kind `K` that satisfy `predicate`.
    pub fn filter<K: ChildKind>(&self, predicate: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        self.typed::<K>()
            .map(|c| c.store.state_filter(predicate))
            .unwrap_or_default()
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

    /// The applier that keeps the record of what was applied.
    pub fn applier(&self) -> &Applier {
        &self.applier
    }

    /// A reconcile trigger for every change of a child owned by an object of kind `O`.
    pub fn owner_triggers<O>(&self) -> impl Stream<Item = ObjectRef<O>> + Send + 'static
    where
        O: Resource<DynamicType = ()> + 'static,
    {
        let kind = O::kind(&()).to_string();
        let receiver = self.triggers.subscribe();
        futures::stream::unfold(receiver, |mut receiver| async move {
            loop {
                match receiver.recv().await {
                    Ok(owner) => return Some((owner, receiver)),
                    Err(broadcast::error::RecvError::Lagged(missed)) => tracing::warn!(
                        missed,
                        "missed child events; their owners are reconciled at the next health check"
                    ),
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .filter_map(move |owner| {
            let object = (owner.kind == kind)
                .then(|| ObjectRef::<O>::new(&owner.name).within(&owner.namespace));
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
    triggers: broadcast::Sender<OwnerKey>,
    applier: Arc<Applier>,
}

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
            applier: Arc::default(),
        }
    }

    /// Caches `K`, whose owner is its controller owner reference.
    pub fn add<K: ChildKind>(self) -> Self {
        self.add_with_owner::<K>(controller_owner::<K>)
    }

    /// Caches `K`, finding the owner with `owner_of` (for objects other controllers create
    /// without an owner reference, such as a StatefulSet's claims).
    pub fn add_with_owner<K: ChildKind>(self, owner_of: OwnerOf<K>) -> Self {
        self.add_trimmed(owner_of, prune::<K>)
    }

    /// Caches `K`, finding the owner with `owner_of` and keeping of each object only what
    /// `trim` leaves (for kinds the operator reads a few fields of, such as pods).
    pub fn add_trimmed<K: ChildKind>(mut self, owner_of: OwnerOf<K>, trim: fn(&mut K)) -> Self {
        let (store, writer) = reflector::store::<K>();
        let (set_state, state) = watch::channel(CacheState::Syncing);
        let config = watcher::Config::default().labels(&devctl_api::labels::managed_selector());
        let api: Api<K> = scoped_api(&self.client, self.namespace.as_deref());
        let triggers = self.triggers.clone();
        let applier = self.applier.clone();
        let watch = watcher(api, config)
            .default_backoff()
            .modify(trim)
            .reflect(writer)
            .for_each(move |event| {
                let owner = match &event {
                    Ok(watcher::Event::Apply(o)) => owner_of(o),
                    // Objects of a re-list may have changed while the watch was down; the
                    // first list is not news (each controller reconciles everything at start).
                    Ok(watcher::Event::InitApply(o)) if *set_state.borrow() == CacheState::Synced => {
                        owner_of(o)
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        if let Some(namespace) = o.namespace() {
                            applier.forget(K::KIND, &namespace, &o.name_any());
                        }
                        owner_of(o)
                    }
                    Ok(watcher::Event::InitDone) => {
                        set_state.send_replace(CacheState::Synced);
                        None
                    }
                    Ok(_) => None,
                    Err(error) => {
                        tracing::warn!(kind = K::KIND, %error, "watching children failed; retrying with backoff");
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
                        None
                    }
                };
                if let Some(owner) = owner {
                    // No receiver (no controller running yet, e.g. a follower) is fine.
                    let _ = triggers.send(owner);
                }
                futures::future::ready(())
            })
            .boxed();
        self.watches.push(watch);
        self.kinds.insert(
            K::KIND,
            Arc::new(TypedCache {
                store,
                api_resource: super::api_resource::<K>(),
                state,
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
            applier: self.applier,
        };
        let watches = futures::future::join_all(self.watches).map(|_| ());
        (caches, watches)
    }
}
