//! What a child cache keeps of each object: per kind, an entry per object (what the applier
//! reads) and, for kinds whose objects are read, the slimmed object packed as JSON; an index
//! by instance, and when each object of an observed kind last changed. The watches that fill
//! these, and the caches controllers read, are [`super::caches`].

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use super::compact::{ByNamespace, CompactString, Uid};
use super::{HASH_ANNOTATION, slim};

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

/// What an observed kind's watch saw of one object last.
#[derive(Debug, Clone)]
struct Seen {
    resource_version: Option<CompactString>,
    significant: u64,
    changed_at: Instant,
}

/// The last change of every object of an observed kind, by namespace and name.
#[derive(Debug, Default)]
pub(super) struct Observations {
    seen: Mutex<ByNamespace<Seen>>,
}

impl Observations {
    /// Notes `object` as the watch delivers it at `now`; returns whether it is news for its
    /// owner: new, or its `significant` value differs from the last one seen.
    pub(super) fn record<K: Resource>(&self, object: &K, significant: u64, now: Instant) -> bool {
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

    pub(super) fn forget(&self, namespace: &str, name: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.remove(namespace, name);
    }

    /// Keeps only what `exists` says is still there: a re-list reports no deletions that
    /// happened while the watch was down.
    pub(super) fn retain(&self, exists: impl Fn(&str, &str) -> bool) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.retain(|namespace, name, _| exists(namespace, name));
    }

    pub(super) fn changed_at(&self, namespace: &str, name: &str) -> Option<Instant> {
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
pub(super) struct Kept {
    pub(super) significance: u64,
    packed: Option<Box<[u8]>>,
}

/// What the cache keeps of one object: what the applier reads and, for kinds the operator
/// reads more of, the slimmed object packed as JSON.
#[derive(Debug, Clone)]
pub(super) struct MetaEntry {
    meta: LiveMeta,
    /// A hash of what this store keeps of the object, without its `resourceVersion`
    /// ([`MetaStore::keep`]): whether an event is news.
    pub(super) significance: u64,
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
///
/// [`CachesBuilder::add_metadata`]: super::CachesBuilder::add_metadata
#[derive(Default)]
pub(super) struct MetaStore {
    entries: std::sync::RwLock<MetaMap>,
    /// A (re-)list in progress: it replaces `entries` when complete, as a reflector's does.
    listing: Mutex<Option<MetaMap>>,
    /// Whether objects are kept (packed), not only their metadata.
    keeps_objects: bool,
}

impl MetaStore {
    pub(super) fn keeping_objects() -> Self {
        Self {
            keeps_objects: true,
            ..Self::default()
        }
    }

    /// The kept object, decoded (`None` for metadata-only kinds).
    pub(super) fn object<K: Resource + serde::de::DeserializeOwned>(
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
    pub(super) fn keep<K: Resource + serde::Serialize>(&self, object: &mut K) -> Kept {
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

    pub(super) fn meta(&self, namespace: &str, name: &str) -> Option<LiveMeta> {
        self.read(namespace, name, |entry| entry.meta.clone())
    }

    pub(super) fn read<T>(
        &self,
        namespace: &str,
        name: &str,
        f: impl FnOnce(&MetaEntry) -> T,
    ) -> Option<T> {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        entries.get(namespace, name).map(f)
    }

    /// Takes `event` in. `kept`: what [`Self::keep`] made of the event's object when the
    /// caller has made it already (made here otherwise).
    pub(super) fn apply<K: Resource + serde::Serialize + Clone>(
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

    pub(super) fn owned(&self, namespace: &str, owner_uid: &str) -> Vec<String> {
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
pub(super) struct InstanceIndex {
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
    pub(super) fn apply<K: Resource>(
        &self,
        event: &watcher::Event<K>,
        previous: impl FnOnce() -> Option<K>,
    ) {
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
    pub(super) fn with_names<T>(
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
