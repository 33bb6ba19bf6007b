//! The one place that applies children and deletes orphans, for every controller.
//!
//! A reconciler renders the children it wants as [`Child`] values (pure, typed through the
//! k8s-openapi type of each kind); [`Applier::sync`] applies with server-side apply under one
//! field manager only what needs it and deletes owned children that are no longer wanted.
//!
//! When is a child applied? Every child carries [`HASH_ANNOTATION`], a hash of the body we
//! apply. A child is applied when it is missing, when its hash differs (the desired state
//! changed — server-side apply then also prunes fields we stopped setting), or when someone
//! else changed it and [`drift::drifted`] finds a field of ours with another value.
//!
//! "Someone else changed it" is decided without keeping children's bodies in memory: the
//! caches keep a slim copy of each child plus a fingerprint of its content (everything but
//! its status and the server's bookkeeping, see [`slim`]), and the applier remembers the
//! `resourceVersion` and fingerprint each of its applies returned. A child whose version or
//! fingerprint is the one we left is ours as we left it; only otherwise is its full body
//! fetched (one GET) and compared. Steady state therefore costs zero writes and zero reads;
//! after a restart (an empty record) each child is read once.
//!
//! Caches of children are shared by all controllers, one per kind ([`caches`]). An object of a
//! child's name that the owner does not control is adopted or refused ([`orphans`]).

pub mod caches;
pub mod compact;
pub mod drift;
pub mod orphans;
pub mod slim;
pub mod store;

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use sha2::Digest;

pub use caches::{Caches, CachesBuilder, Claim, KindCache, LiveMeta, Written};
pub use orphans::{Orphanage, orphan_of};

use crate::error::{Error, Result};
use compact::{ByNamespace, CompactString};
use orphans::{HeldBy, Holder, describe_holder};

pub use crate::names::FIELD_MANAGER;

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

/// Drops what the operator never reads from cached objects: managedFields and kubectl's
/// last-applied-configuration (a full copy of the object). Caches are the operator's memory.
pub fn prune<K: Resource>(object: &mut K) {
    object.managed_fields_mut().clear();
    if let Some(annotations) = object.meta_mut().annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Hash of the body devctl last applied to a child.
pub const HASH_ANNOTATION: &str = "devctl.io/last-applied-hash";

/// A kind of object devctl creates as a child: any namespaced k8s-openapi type.
pub trait ChildKind:
    k8s_openapi::Resource<Scope = k8s_openapi::NamespaceResourceScope>
    + Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + serde::Serialize
    + serde::de::DeserializeOwned
    + slim::StatusField
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> ChildKind for K where
    K: k8s_openapi::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + slim::StatusField
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// The image of a pod template's first container (the workload's own: devctl puts its
/// database or app container first).
pub fn template_image(template: &k8s_openapi::api::core::v1::PodTemplateSpec) -> Option<&str> {
    template.spec.as_ref()?.containers.first()?.image.as_deref()
}

/// A child as the reconciler wants it: the full server-side apply body, checked against its
/// k8s-openapi type, with its hash annotation.
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    /// The kind, e.g. `StatefulSet`.
    pub kind: &'static str,
    pub name: String,
    pub body: Value,
    /// Hash of `body` without the annotation that carries it.
    pub hash: String,
    /// The body holds placeholders for values only the live object has (a password the
    /// reconcile did not read because the Secret is as we left it): never applied as is.
    pub placeholder: bool,
    /// The live object, when the renderer already read it (saves the drift check's GET).
    pub live: Option<Value>,
    /// Written only by creating it, never applied over an object of that name: the renderer
    /// did not look whether one exists (a Secret without devctl's labels is invisible to the
    /// label-selected cache, and must never be overwritten). An existing object fails the
    /// apply with [`Error::ChildExists`]; the renderer then reads it and renders again.
    pub create_only: bool,
}

impl Child {
    /// A child of kind `K` from its apply body. In debug builds the body goes through `K` so a
    /// misspelt or misplaced field fails here, in a unit test, instead of being dropped by the
    /// API server.
    pub fn new<K: ChildKind>(body: Value) -> Result<Self> {
        let name = body
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .ok_or(Error::MissingField("metadata.name of a child"))?
            .to_string();
        // Rendering is pure, so checking every body against its type in the unit tests (debug
        // builds) proves it for every release: the check costs as much as the rest of a
        // reconcile's rendering, on every reconcile.
        if cfg!(debug_assertions) {
            let typed: K =
                serde_json::from_value(body.clone()).map_err(|source| Error::Render {
                    kind: K::KIND,
                    source,
                })?;
            let round_trip = serde_json::to_value(&typed).map_err(|source| Error::Render {
                kind: K::KIND,
                source,
            })?;
            // The round trip keeps every field the type knows; anything else was a mistake.
            // The rendered body, not the round trip, is applied: a typed struct may
            // serialise defaults we never meant to own.
            if let Some(path) = drift::drifted(&body, &round_trip) {
                return Err(Error::UnknownField {
                    kind: K::KIND,
                    path,
                });
            }
        }
        let mut body = body;
        let hash = hash(&body);
        if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            let annotations = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(annotations) = annotations.as_object_mut() {
                annotations.insert(HASH_ANNOTATION.into(), Value::String(hash.clone()));
            }
        }
        Ok(Self {
            kind: K::KIND,
            name,
            body,
            hash,
            placeholder: false,
            live: None,
            create_only: false,
        })
    }
}

/// 64 bits of SHA-256 over the canonical JSON: enough to notice a change, short in every child.
fn hash(body: &Value) -> String {
    // Serialised straight into the digest (the same bytes as `to_string`, without the text).
    struct Digesting(sha2::Sha256);
    impl std::io::Write for Digesting {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.update(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut digesting = Digesting(sha2::Sha256::new());
    // Writing a Value into a sink that cannot fail cannot fail.
    let _ = serde_json::to_writer(&mut digesting, body);
    let digest = digesting.0.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// What a sync changed, for the `Applied` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created(&'static str, String),
    /// An object devctl made for a deleted owner of the same name, left behind by a deletion
    /// that kept its children (`--cascade=orphan`), now controlled by this owner.
    Adopted(&'static str, String),
    Updated(&'static str, String),
    Deleted(&'static str, String),
}

impl Change {
    /// `Created ConfigMap a, Secret b; adopted Service e; updated StatefulSet c; deleted
    /// Service d`.
    pub fn summary(changes: &[Change]) -> String {
        let mut parts = Vec::new();
        for (verb, pick) in [
            ("Created", 0u8),
            ("adopted", 3),
            ("updated", 1),
            ("deleted", 2),
        ] {
            let items: Vec<String> = changes
                .iter()
                .filter_map(|c| match (c, pick) {
                    (Change::Created(k, n), 0)
                    | (Change::Updated(k, n), 1)
                    | (Change::Deleted(k, n), 2)
                    | (Change::Adopted(k, n), 3) => Some(format!("{k} {n}")),
                    _ => None,
                })
                .collect();
            if !items.is_empty() {
                parts.push(format!("{verb} {}", items.join(", ")));
            }
        }
        let mut summary = parts.join("; ");
        if let Some(first) = summary.get(..1) {
            summary = first.to_uppercase() + &summary[1..];
        }
        summary
    }
}

/// Whether a reconcile's outcome created or updated a child of `kind` (whose cached status
/// is then stale: it describes the object before this apply).
pub fn applied(outcome: Result<&[Change], &Error>, kind: &str) -> bool {
    outcome.is_ok_and(|changes| {
        changes
            .iter()
            .any(|c| matches!(c, Change::Created(k, _) | Change::Adopted(k, _) | Change::Updated(k, _) if *k == kind))
    })
}

/// Identity of one child in the apply record.
type ChildKey = (&'static str, String, String);

/// What one of our applies (or a drift check that found nothing) left behind.
#[derive(Debug, Clone)]
struct Applied {
    resource_version: CompactString,
    content: Option<u64>,
    /// The version is one our apply returned (not one a drift check read): its watch event
    /// is our own echo.
    written: bool,
    /// That apply created the child.
    created: bool,
}

/// Applies children and deletes orphans; remembers the `resourceVersion` and content
/// fingerprint each of its applies returned, so an unchanged child is recognised without
/// reading its content.
#[derive(Default)]
pub struct Applier {
    /// By kind, then namespace and name.
    applied: Mutex<HashMap<&'static str, ByNamespace<Applied>>>,
    /// Children being applied now, with the watch events for them that arrived meanwhile
    /// (version and owner): whether those are our echo is known once the apply returns.
    applying: Mutex<HashMap<ChildKey, Vec<(String, caches::OwnerKey)>>>,
    /// Per owner (namespace, uid): the set of wanted children (a hash) its last orphan scan
    /// was made for. Orphans appear only when that set shrinks (or before a restart, when
    /// the record is empty), so scanning every cache on every reconcile — work that grows
    /// with the number of clusters — is skipped otherwise.
    scanned: Mutex<ByNamespace<u64>>,
    /// Per owner (namespace, uid): the key of the inputs its children were last rendered
    /// from, and those children, after a sync that left every one of them as rendered.
    rendered: Mutex<ByNamespace<Rendered>>,
}

/// What an owner's last complete sync was rendered from and made: no bodies (no password is
/// kept), a few hundred bytes per owner.
struct Rendered {
    inputs: u64,
    children: Box<[(&'static str, CompactString)]>,
}

impl Applier {
    fn recorded(&self, key: &ChildKey) -> Option<Applied> {
        let (kind, namespace, name) = key;
        self.applied
            .lock()
            .ok()?
            .get(kind)?
            .get(namespace, name)
            .cloned()
    }

    fn record(
        &self,
        key: ChildKey,
        resource_version: Option<CompactString>,
        content: Option<u64>,
        written: bool,
        created: bool,
    ) {
        let (kind, namespace, name) = key;
        if let Ok(mut applied) = self.applied.lock() {
            match resource_version {
                Some(resource_version) => {
                    applied.entry(kind).or_default().insert(
                        &namespace,
                        &name,
                        Applied {
                            resource_version,
                            content,
                            written,
                            created,
                        },
                    );
                }
                None => {
                    if let Some(of_kind) = applied.get_mut(kind) {
                        of_kind.remove(&namespace, &name);
                    }
                }
            }
        }
    }

    /// Called by a cache for a watch event that would trigger `owner`: whether to hold it
    /// back. The version one of our applies returned is only the echo of our own write
    /// (dropped); an event for a child being applied now waits until the apply returns.
    pub fn hold(
        &self,
        kind: &'static str,
        namespace: &str,
        name: &str,
        resource_version: &str,
        owner: &caches::OwnerKey,
    ) -> bool {
        let key = (kind, namespace.to_string(), name.to_string());
        // A workload's own echo is news: the owner reports it not rolled out until the
        // workload's controller has seen the apply, and nothing else may follow (an apply
        // that leaves the generation alone gets no status update). Not after a create: the
        // controller's first status update follows, and that is news.
        if WORKLOADS.contains(&kind) {
            return self
                .recorded(&key)
                .is_some_and(|r| r.written && r.created && r.resource_version == resource_version);
        }
        if self
            .recorded(&key)
            .is_some_and(|r| r.written && r.resource_version == resource_version)
        {
            return true;
        }
        let Ok(mut applying) = self.applying.lock() else {
            return false;
        };
        match applying.get_mut(&key) {
            Some(held) => {
                held.push((resource_version.to_string(), owner.clone()));
                true
            }
            None => false,
        }
    }

    fn begin(&self, key: &ChildKey) {
        if let Ok(mut applying) = self.applying.lock() {
            applying.insert(key.clone(), Vec::new());
        }
    }

    /// Ends an apply: the owners of held events that were not our own write.
    fn finish(&self, key: &ChildKey, written: Option<&str>) -> Vec<caches::OwnerKey> {
        let held = self
            .applying
            .lock()
            .ok()
            .and_then(|mut applying| applying.remove(key))
            .unwrap_or_default();
        held.into_iter()
            .filter(|(version, _)| Some(version.as_str()) != written)
            .map(|(_, owner)| owner)
            .collect()
    }

    /// Whether the live child is ours as we left it: the version our last apply returned,
    /// or a later one whose content (all but the status) is the same. A later version with
    /// the same content is remembered, so the next look is a string comparison.
    pub fn unchanged(
        &self,
        kind: &'static str,
        namespace: &str,
        name: &str,
        live: &LiveMeta,
    ) -> bool {
        let key = (kind, namespace.to_string(), name.to_string());
        let Some(recorded) = self.recorded(&key) else {
            return false;
        };
        if live.resource_version.as_deref() == Some(recorded.resource_version.as_str()) {
            return true;
        }
        let same_content = live.content.is_some() && live.content == recorded.content;
        if same_content {
            self.record(
                key,
                live.resource_version.clone(),
                live.content,
                false,
                false,
            );
        }
        same_content
    }

    /// Forgets the children of `kind` a fresh listing does not hold (called by the cache
    /// when a list or re-list is complete): a child deleted while the watch was down sends no
    /// delete event, and a record of it would let an object someone else makes under its
    /// name be applied as ours.
    pub fn forget_missing(&self, kind: &'static str, listed: impl Fn(&str, &str) -> bool) {
        if let Ok(mut applied) = self.applied.lock()
            && let Some(of_kind) = applied.get_mut(kind)
        {
            of_kind.retain(|namespace, name, _| listed(namespace, name));
        }
    }

    /// Forgets a child that no longer exists (called by the cache on delete events).
    pub fn forget(&self, kind: &'static str, namespace: &str, name: &str) {
        if let Ok(mut applied) = self.applied.lock()
            && let Some(of_kind) = applied.get_mut(kind)
        {
            of_kind.remove(namespace, name);
        }
    }

    /// Whether the child exists because of one of our applies: one is in flight, or the
    /// version recorded is one an apply returned.
    pub fn wrote(&self, kind: &'static str, namespace: &str, name: &str) -> bool {
        let key = (kind, namespace.to_string(), name.to_string());
        let applying = self.applying.lock().is_ok_and(|a| a.contains_key(&key));
        applying || self.recorded(&key).is_some_and(|r| r.written)
    }

    /// Whether anything of the owner `uid` is remembered (what its last orphan scan saw):
    /// how a test sees that a deleted owner leaves nothing behind in the operator's memory.
    pub fn remembers_owner(&self, namespace: &str, uid: &str) -> bool {
        self.scanned
            .lock()
            .is_ok_and(|s| s.contains(namespace, uid))
            || self
                .rendered
                .lock()
                .is_ok_and(|r| r.contains(namespace, uid))
    }

    /// Forgets an owner that is gone (its children go with it).
    pub fn forget_owner(&self, namespace: &str, uid: &str) {
        if let Ok(mut scanned) = self.scanned.lock() {
            scanned.remove(namespace, uid);
        }
        self.forget_render(Owner { namespace, uid });
    }

    /// Whether rendering `owner`'s children again from inputs whose key is `inputs` can be
    /// skipped: its last complete sync was rendered from the same inputs — so it would
    /// render the same children — and every one of them is still as that sync left it.
    /// Rendering is a pure function of its inputs, so the key stands for the children; a
    /// child changed or deleted by anyone else is not as we left it and needs the render.
    pub fn render_unneeded(&self, caches: &Caches, owner: Owner<'_>, inputs: u64) -> bool {
        let children = match self.rendered.lock() {
            Ok(rendered) => match rendered.get(owner.namespace, owner.uid) {
                Some(r) if r.inputs == inputs => r.children.clone(),
                _ => return false,
            },
            Err(_) => return false,
        };
        children.iter().all(|(kind, name)| {
            caches
                .kind(kind)
                .ok()
                .and_then(|cache| cache.meta(owner.namespace, name))
                .is_some_and(|live| self.unchanged(kind, owner.namespace, name, &live))
        })
    }

    /// Remembers that `desired`, rendered from inputs with key `inputs`, were all synced.
    pub fn remember_render(&self, owner: Owner<'_>, inputs: u64, desired: &[Child]) {
        let children = desired
            .iter()
            .map(|c| (c.kind, CompactString::from(c.name.as_str())))
            .collect();
        if let Ok(mut rendered) = self.rendered.lock() {
            rendered.insert(owner.namespace, owner.uid, Rendered { inputs, children });
        }
    }

    /// Forgets `owner`'s last render: called before a sync that may stop half way, whose
    /// children then match neither that render nor the new one.
    pub fn forget_render(&self, owner: Owner<'_>) {
        if let Ok(mut rendered) = self.rendered.lock() {
            rendered.remove(owner.namespace, owner.uid);
        }
    }

    /// A merge patch of a child outside of [`Self::sync`] (a pod's role label): its echo does
    /// not trigger the owner, whose reconcile made the change.
    pub async fn patch_quietly<K: ChildKind>(
        &self,
        client: &Client,
        caches: &Caches,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> kube::Result<K> {
        let key: ChildKey = (
            <K as k8s_openapi::Resource>::KIND,
            namespace.to_string(),
            name.to_string(),
        );
        let api: Api<K> = Api::namespaced(client.clone(), namespace);
        self.write(
            caches,
            key,
            api.patch(name, &PatchParams::default(), &Patch::Merge(patch)),
            |patched| {
                let version = patched.meta().resource_version.as_deref();
                (version.map(CompactString::from), None)
            },
            false,
        )
        .await
    }

    /// Runs `write` of the child `key` so that its echo is known as ours: events for the
    /// child that arrive meanwhile wait ([`Self::hold`]), the version it returns is recorded
    /// (with `content`, its fingerprint, and whether it `created` the child), and the held
    /// events that were not its echo trigger their owners then.
    async fn write<T>(
        &self,
        caches: &Caches,
        key: ChildKey,
        write: impl std::future::Future<Output = kube::Result<T>>,
        version_and_content: impl FnOnce(&T) -> (Option<CompactString>, Option<u64>),
        created: bool,
    ) -> kube::Result<T> {
        self.begin(&key);
        let written = write.await;
        let version = written.as_ref().ok().and_then(|object| {
            let (version, content) = version_and_content(object);
            self.record(key.clone(), version.clone(), content, true, created);
            version
        });
        for other in self.finish(&key, version.as_deref()) {
            caches.trigger(other);
        }
        written
    }

    /// Number of remembered children (for tests of the record's bound).
    pub fn remembered(&self) -> usize {
        self.applied
            .lock()
            .map(|a| a.values().map(ByNamespace::len).sum())
            .unwrap_or(0)
    }

    /// The object of `child`'s name as the API has it now (one GET; `None` when there is none).
    async fn read(
        client: &Client,
        cache: &dyn KindCache,
        namespace: &str,
        child: &Child,
    ) -> Result<Option<DynamicObject>> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, cache.api_resource());
        api.get_opt(&child.name)
            .await
            .map_err(|source| Error::Child {
                action: "read",
                kind: child.kind,
                name: child.name.clone(),
                source,
            })
    }

    /// The live child's full body: what the renderer already read if it is this version, the
    /// cached body for kinds cached whole, else one GET (`None` when it is gone).
    async fn fetch(
        client: &Client,
        cache: &dyn KindCache,
        namespace: &str,
        child: &Child,
        live: &LiveMeta,
    ) -> Result<Option<Value>> {
        if let Some(body) = &child.live {
            let version = body
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str);
            if version.is_some() && version == live.resource_version.as_deref() {
                return Ok(Some(body.clone()));
            }
        }
        if let Some(body) = cache.body(namespace, &child.name) {
            return Ok(Some(body));
        }
        Self::read(client, cache, namespace, child)
            .await?
            .map(|o| {
                serde_json::to_value(o).map_err(|source| Error::Render {
                    kind: child.kind,
                    source,
                })
            })
            .transpose()
    }

    /// Who holds the object of `child`'s name that a create found, or that the cache shows
    /// controlled by another object: one GET, only then.
    async fn holder(
        client: &Client,
        cache: &dyn KindCache,
        owner: Owner<'_>,
        child: &Child,
    ) -> Result<Holder> {
        let Some(object) = Self::read(client, cache, owner.namespace, child).await? else {
            return Ok(Holder::Gone);
        };
        let refused = |detail: String| {
            Holder::Other(Error::ChildNotOwned {
                kind: child.kind,
                name: child.name.clone(),
                detail,
            })
        };
        Ok(match describe_holder(&object, owner.uid, child) {
            HeldBy::Owner => Holder::Owner,
            HeldBy::Orphan => Holder::Orphan,
            HeldBy::PreviousOwner(previous) => Holder::Other(Error::ChildOfDeletedOwner {
                kind: child.kind,
                name: child.name.clone(),
                previous,
            }),
            HeldBy::Other(detail) => refused(detail),
        })
    }

    /// Creates a create-only `child` (a Secret with generated passwords): never applied over
    /// what exists.
    async fn create_only(
        &self,
        client: &Client,
        caches: &Caches,
        owner: Owner<'_>,
        child: &Child,
    ) -> Result<Option<Change>> {
        let key: ChildKey = (child.kind, owner.namespace.to_string(), child.name.clone());
        let cache = caches.kind(child.kind)?;
        tracing::debug!(kind = child.kind, name = %child.name, namespace = owner.namespace, "creating child");
        let created = self
            .write(
                caches,
                key,
                cache.create(client, owner.namespace, &child.body),
                |created| (created.resource_version.clone(), created.content),
                true,
            )
            .await;
        match created {
            Ok(_) => Ok(Some(Change::Created(child.kind, child.name.clone()))),
            Err(kube::Error::Api(status)) if status.code == 409 => Err(Error::ChildExists {
                kind: child.kind,
                name: child.name.clone(),
            }),
            Err(source) => Err(Error::Child {
                action: "create",
                kind: child.kind,
                name: child.name.clone(),
                source,
            }),
        }
    }

    /// Applies `child` if it is missing, its desired state changed, or someone else changed
    /// it; what changed, if anything.
    async fn apply_one(
        &self,
        client: &Client,
        caches: &Caches,
        owner: Owner<'_>,
        child: &Child,
    ) -> Result<Option<Change>> {
        if child.create_only {
            return self.create_only(client, caches, owner, child).await;
        }
        let key: ChildKey = (child.kind, owner.namespace.to_string(), child.name.clone());
        let cache = caches.kind(child.kind)?;
        let mut live = cache.meta(owner.namespace, &child.name);
        // Labelled like ours, controlled by another object: another owner's child of that
        // name (two resources wanting one name), or the child of a deleted owner of the same
        // name that the garbage collector has not removed yet. Never taken over. Controlled
        // by nobody: an orphan of a deletion that kept the children, adopted if it was made
        // for this owner's name. (Read again first: the cache may be behind.)
        let mut adopting = false;
        if let Some(l) = &live
            && !l.controller.as_ref().is_some_and(|c| c.is(owner.uid))
        {
            match Self::holder(client, cache, owner, child).await? {
                Holder::Other(refused) => return Err(refused),
                Holder::Orphan => adopting = true,
                Holder::Owner | Holder::Gone => {}
            }
        }
        let reason = match &live {
            // Applied whatever it holds: the apply makes the owner its controller.
            Some(_) if adopting => "adopting an orphan".to_string(),
            None => "missing".to_string(),
            Some(l) if l.hash.as_deref() != Some(child.hash.as_str()) => {
                "desired state changed".to_string()
            }
            Some(l) if self.unchanged(child.kind, owner.namespace, &child.name, l) => {
                return Ok(None);
            }
            Some(l) => match Self::fetch(client, cache, owner.namespace, child, l).await? {
                // Deleted since the cache saw it.
                None => {
                    live = None;
                    "missing".to_string()
                }
                Some(body) => match drift::drifted(&child.body, &body) {
                    // Ours as we left it: remember this version, no write.
                    None => {
                        let version = body
                            .pointer("/metadata/resourceVersion")
                            .and_then(Value::as_str)
                            .map(CompactString::from);
                        self.record(key, version, cache.content_of(&body), false, false);
                        return Ok(None);
                    }
                    // The path only: values of a Secret must never reach a log.
                    Some(path) => format!("changed by someone else at {path}"),
                },
            },
        };
        if child.placeholder {
            // The renderer saw the child as we left it and did not read its values; it
            // changed since. The cache event of that change reconciles the owner again.
            return Err(Error::StaleChild {
                kind: child.kind,
                name: child.name.clone(),
            });
        }
        // Neither the cache nor our record knows it: only create it. An object of that name
        // that is there after all is someone else's until its owner reference says otherwise.
        let mut claim = if live.is_none() && self.recorded(&key).is_none() {
            Claim::New
        } else {
            Claim::Existing
        };
        let mut created = live.is_none();
        // A create that finds an object, then an apply: at most one more of each if the
        // object goes and comes back meanwhile.
        let mut attempts = 0;
        tracing::debug!(kind = child.kind, name = %child.name, namespace = owner.namespace, %reason, ?claim, "applying child");
        let applied = loop {
            let applied = self
                .write(
                    caches,
                    key.clone(),
                    cache.apply(client, owner.namespace, &child.name, &child.body, claim),
                    |applied| (applied.resource_version.clone(), applied.content),
                    created,
                )
                .await;
            attempts += 1;
            let source = match applied {
                Ok(applied) => break applied,
                Err(source) => source,
            };
            let exists = matches!(&source, kube::Error::Api(status) if status.code == 409);
            if claim == Claim::New && exists && attempts < 4 {
                match Self::holder(client, cache, owner, child).await? {
                    // Ours, though the cache does not show it (its labels were changed):
                    // repaired like any drifted child. An orphan made for this owner: adopted.
                    holder @ (Holder::Owner | Holder::Orphan) => {
                        claim = Claim::Existing;
                        created = false;
                        adopting = matches!(holder, Holder::Orphan);
                        continue;
                    }
                    Holder::Gone => continue,
                    Holder::Other(refused) => return Err(refused),
                }
            }
            return Err(Error::Child {
                action: "apply",
                kind: child.kind,
                name: child.name.clone(),
                source,
            });
        };
        let written = applied.resource_version;
        if adopting {
            return Ok(Some(Change::Adopted(child.kind, child.name.clone())));
        }
        Ok(match live {
            None if created => Some(Change::Created(child.kind, child.name.clone())),
            None => Some(Change::Updated(child.kind, child.name.clone())),
            Some(l) if l.resource_version == written => None,
            Some(_) => Some(Change::Updated(child.kind, child.name.clone())),
        })
    }

    /// Applies every child that needs it, then deletes the owner's children of `kinds` that
    /// are not in `desired`. Returns what changed.
    ///
    /// Children are applied in waves, in `desired` order: each workload (a StatefulSet or
    /// Deployment) waits for everything listed before it — the configuration, Secrets and
    /// rights its pods read — except the bindings of those rights, which go with it one wave
    /// after their Roles ([`waves`]); the children between two workloads are applied together
    /// ([`APPLIES_AT_ONCE`] at a time), so creating a cluster takes a few round trips instead
    /// of one per child. Children that are only created ([`Child::create_only`]) go first.
    pub async fn sync(
        &self,
        client: &Client,
        caches: &Caches,
        owner: Owner<'_>,
        desired: &[Child],
        kinds: &[&'static str],
    ) -> Result<Vec<Change>> {
        // A workload of the owner's name that another object controls or that cannot be
        // adopted stops the sync before anything is written: the children listed before it
        // (its configuration, Secrets, Services) are not adopted or changed for pods that
        // stay someone else's.
        for child in desired.iter().filter(|c| WORKLOADS.contains(&c.kind)) {
            let cache = caches.kind(child.kind)?;
            if let Some(live) = cache.meta(owner.namespace, &child.name)
                && !live.controller.as_ref().is_some_and(|c| c.is(owner.uid))
                && let Holder::Other(refused) = Self::holder(client, cache, owner, child).await?
            {
                return Err(refused);
            }
        }
        let mut changes = Vec::new();
        for batch in waves(desired)
            .iter()
            .flat_map(|wave| wave.chunks(APPLIES_AT_ONCE))
        {
            let applied = futures::future::join_all(
                batch
                    .iter()
                    .map(|child| self.apply_one(client, caches, owner, child)),
            )
            .await;
            for change in applied {
                changes.extend(change?);
            }
        }

        let wanted: BTreeSet<(&str, &str)> =
            desired.iter().map(|c| (c.kind, c.name.as_str())).collect();
        let wanted_hash = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            (&wanted, kinds).hash(&mut hasher);
            hasher.finish()
        };
        let scanned = self
            .scanned
            .lock()
            .ok()
            .and_then(|s| s.get(owner.namespace, owner.uid).copied());
        if scanned == Some(wanted_hash) {
            return Ok(changes);
        }
        for &kind in kinds {
            let cache = caches.kind(kind)?;
            for name in cache.owned(owner.namespace, owner.uid) {
                if wanted.contains(&(kind, name.as_str())) {
                    continue;
                }
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), owner.namespace, cache.api_resource());
                match api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => changes.push(Change::Deleted(kind, name.clone())),
                    // Already gone: the cache lagged behind.
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(source) => {
                        return Err(Error::Child {
                            action: "delete",
                            kind,
                            name,
                            source,
                        });
                    }
                }
                self.forget(kind, owner.namespace, &name);
            }
        }
        if let Ok(mut scanned) = self.scanned.lock() {
            scanned.insert(owner.namespace, owner.uid, wanted_hash);
        }
        Ok(changes)
    }
}

/// Applies one reconcile sends at once: with `--concurrency` reconciles, what the operator
/// keeps in flight (and the connections the client keeps open for them). Eight: everything
/// a cluster's pods read besides its Secrets (six children, seven with a backup store) goes
/// in one round trip, so creating a cluster takes one round trip fewer than with four.
const APPLIES_AT_ONCE: usize = 8;

/// Kinds whose pods read the children listed before them.
const WORKLOADS: [&str; 2] = ["StatefulSet", "Deployment"];

/// Kinds that name a child listed before them, which must exist first: binding a Role the
/// operator may not `bind`, the API server checks the Role's rules and, with the Role not
/// made yet, refuses the RoleBinding ("not found") — a failed reconcile per new cluster.
const BINDINGS: [&str; 1] = ["RoleBinding"];

/// `desired` cut into waves: each workload with the bindings listed before it, the other
/// children between workloads together. A binding thus goes one wave after its Role and
/// still before the pods that use it, at no extra round trip.
fn waves(desired: &[Child]) -> Vec<Vec<&Child>> {
    // Children that must not exist yet go first, alone: one that exists after all stops
    // the sync before anything else is made.
    let first: Vec<&Child> = desired.iter().filter(|c| c.create_only).collect();
    let mut waves = vec![first];
    let mut current = Vec::new();
    let mut bindings = Vec::new();
    for child in desired.iter().filter(|c| !c.create_only) {
        if WORKLOADS.contains(&child.kind) {
            waves.push(std::mem::take(&mut current));
            let mut wave = std::mem::take(&mut bindings);
            wave.push(child);
            waves.push(wave);
        } else if BINDINGS.contains(&child.kind) {
            bindings.push(child);
        } else {
            current.push(child);
        }
    }
    waves.push(current);
    waves.push(bindings);
    waves.retain(|wave| !wave.is_empty());
    waves
}

/// The object whose children are synced.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub namespace: &'a str,
    pub uid: &'a str,
}

/// The API resource of a child kind.
pub fn api_resource<K: ChildKind>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

#[cfg(test)]
mod tests;
