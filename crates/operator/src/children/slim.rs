//! What the caches keep of each child kind — the operator's memory grows with this.
//!
//! The applier does not need a child's body to know that it is as we left it: the hash
//! annotation says which desired state we applied, and a fingerprint of the live content
//! ([`content`], computed from the full object as the watch delivers it, then kept in the
//! cached copy under [`CONTENT_ANNOTATION`]) says whether anyone changed it since. So most
//! kinds are cached as metadata only, and no Secret's data is ever kept. StatefulSets and
//! Deployments keep what the status computation reads (replicas, the first container's
//! image, claim sizes, status). What is kept of an object is stored packed as JSON text, not
//! as its struct (see `caches::MetaStore`).

use std::hash::Hasher;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, Pod, PodSpec, PodTemplateSpec, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Resource;

use super::HASH_ANNOTATION;

/// Where a cached copy carries the fingerprint of the content it was slimmed from. Exists
/// only in the operator's memory, never on the server.
pub const CONTENT_ANNOTATION: &str = "devctl.io/cached-content";

/// SipHash with fixed keys of `value`'s JSON: stable within the process, which is all a
/// record needs. Serialised straight into the hasher: neither the text nor a tree of the
/// object is built (a `serde_json::Value` of a pod is a few hundred allocations).
pub(crate) fn fingerprint<T: serde::Serialize + ?Sized>(value: &T) -> u64 {
    struct Hashing(std::collections::hash_map::DefaultHasher);
    impl std::io::Write for Hashing {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut hashing = Hashing(std::collections::hash_map::DefaultHasher::new());
    // Serialising into a sink that cannot fail fails only for a map with non-string keys,
    // which no Kubernetes object has.
    let _ = serde_json::to_writer(&mut hashing, value);
    hashing.0.finish()
}

/// [`fingerprint`] of text already serialised.
pub(crate) fn fingerprint_bytes(bytes: &[u8]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    hasher.write(bytes);
    hasher.finish()
}

/// A kind's `status`, set aside while its content is fingerprinted.
pub trait StatusField {
    /// `f` of the object without its status, which is put back afterwards.
    fn without_status<R>(&mut self, f: impl FnOnce(&Self) -> R) -> R;
}

macro_rules! status_field {
    (with: $($with:ty),*; without: $($without:ty),*) => {
        $(impl StatusField for $with {
            fn without_status<R>(&mut self, f: impl FnOnce(&Self) -> R) -> R {
                let status = self.status.take();
                let result = f(self);
                self.status = status;
                result
            }
        })*
        $(impl StatusField for $without {
            fn without_status<R>(&mut self, f: impl FnOnce(&Self) -> R) -> R {
                f(self)
            }
        })*
    };
}

status_field!(
    with: StatefulSet, Deployment, Service, PodDisruptionBudget, Pod, PersistentVolumeClaim;
    without: ConfigMap, Secret, ServiceAccount, Role, RoleBinding, Lease
);

/// A fingerprint of everything in `object` but its status and the server's bookkeeping
/// (`resourceVersion`, `generation`, `managedFields`): it changes when someone changes the
/// object's content, not when a controller reports status. Those fields are set aside while
/// the object is hashed and put back, so nothing of it is copied.
pub fn content<K: Resource + serde::Serialize + StatusField>(object: &mut K) -> u64 {
    let meta = object.meta_mut();
    let resource_version = meta.resource_version.take();
    let generation = meta.generation.take();
    let managed_fields = meta.managed_fields.take();
    let cached = meta
        .annotations
        .as_mut()
        .and_then(|annotations| annotations.remove(CONTENT_ANNOTATION));
    let content = object.without_status(fingerprint);
    let meta = object.meta_mut();
    meta.resource_version = resource_version;
    meta.generation = generation;
    meta.managed_fields = managed_fields;
    if let (Some(cached), Some(annotations)) = (cached, meta.annotations.as_mut()) {
        annotations.insert(CONTENT_ANNOTATION.into(), cached);
    }
    content
}

/// Notes `content` in the cached copy.
pub fn set_cached_content<K: Resource>(object: &mut K, content: Option<u64>) {
    let annotations = object
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default);
    match content {
        Some(content) => annotations.insert(CONTENT_ANNOTATION.into(), format!("{content:016x}")),
        None => annotations.remove(CONTENT_ANNOTATION),
    };
}

/// The fingerprint a cached copy carries.
pub fn cached_content<K: Resource>(object: &K) -> Option<u64> {
    let text = object
        .meta()
        .annotations
        .as_ref()?
        .get(CONTENT_ANNOTATION)?;
    u64::from_str_radix(text, 16).ok()
}

/// What the cache keeps of an object, without its `resourceVersion`: when it is the same
/// before and after an event, the event is no news for the owner (a status heartbeat of a
/// field the operator does not keep).
pub fn significance<K: Resource + serde::Serialize>(object: &mut K) -> u64 {
    let resource_version = object.meta_mut().resource_version.take();
    let significance = fingerprint(object);
    object.meta_mut().resource_version = resource_version;
    significance
}

/// The metadata the operator reads of a child it applies: identity, versions, deletion, the
/// hash of what we applied and the controller owner. Labels and other annotations are in the
/// content fingerprint; kept they would be most of a slim child's size.
pub fn metadata<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.labels = None;
    meta.managed_fields = None;
    meta.finalizers = None;
    meta.generate_name = None;
    meta.creation_timestamp = None;
    meta.uid = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| k == HASH_ANNOTATION);
    }
    if let Some(owners) = meta.owner_references.as_mut() {
        owners.retain(|o| o.controller == Some(true));
        for owner in owners.iter_mut() {
            owner.block_owner_deletion = None;
        }
    }
}

pub fn config_map(object: &mut ConfigMap) {
    object.data = None;
    object.binary_data = None;
}

/// No Secret data in memory, ever.
pub fn secret(object: &mut Secret) {
    object.data = None;
    object.string_data = None;
}

pub fn service(object: &mut Service) {
    object.spec = None;
    object.status = None;
}

pub fn service_account(object: &mut ServiceAccount) {
    object.secrets = None;
    object.image_pull_secrets = None;
}

pub fn role(object: &mut Role) {
    object.rules = None;
}

pub fn role_binding(object: &mut RoleBinding) {
    object.subjects = None;
}

pub fn pod_disruption_budget(object: &mut PodDisruptionBudget) {
    object.spec = None;
    object.status = None;
}

/// The containers' names and images: what "is the rollout of this image done" reads.
fn slim_template(template: &mut PodTemplateSpec) {
    let containers = template
        .spec
        .take()
        .map(|spec| spec.containers)
        .unwrap_or_default()
        .into_iter()
        .map(|c| Container {
            name: c.name,
            image: c.image,
            ..Container::default()
        })
        .collect();
    *template = PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers,
            ..PodSpec::default()
        }),
    };
}

/// Replicas, images, the claim templates' requested sizes and the status fields the
/// cluster's status and pod plan read (generation seen, revisions). No counts: the cluster
/// counts its pods, their revisions and readiness from the pod cache as they change, so a
/// status update that only counts them again is no news to the owner.
pub fn stateful_set(object: &mut StatefulSet) {
    object.status = object.status.take().map(|s| StatefulSetStatus {
        observed_generation: s.observed_generation,
        current_revision: s.current_revision,
        update_revision: s.update_revision,
        ..StatefulSetStatus::default()
    });
    let spec = &mut object.spec;
    slim_template(&mut spec.template);
    spec.selector = Default::default();
    for claim in spec.volume_claim_templates.iter_mut().flatten() {
        *claim = PersistentVolumeClaim {
            metadata: kube::api::ObjectMeta {
                name: claim.metadata.name.take(),
                ..Default::default()
            },
            spec: claim.spec.take().map(|s| PersistentVolumeClaimSpec {
                resources: s.resources,
                ..Default::default()
            }),
            status: None,
        };
    }
}

/// The name, labels, requested size and capacity (what volume expansion reads); not the
/// binding and provisioning annotations other controllers write while a claim settles.
pub fn persistent_volume_claim(object: &mut PersistentVolumeClaim) {
    let meta = &mut object.metadata;
    meta.annotations = None;
    meta.owner_references = None;
    meta.finalizers = None;
    object.spec = object.spec.take().map(|s| PersistentVolumeClaimSpec {
        resources: s.resources,
        ..Default::default()
    });
    object.status = object.status.take().map(|s| PersistentVolumeClaimStatus {
        capacity: s.capacity,
        ..Default::default()
    });
}

/// Replicas, images and the status.
pub fn deployment(object: &mut Deployment) {
    slim_template(&mut object.spec.template);
    object.spec.selector = Default::default();
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_ignores_status_and_bookkeeping_but_not_spec_or_labels() {
        let sts = |rv: &str, replicas: i32, ready: i32, label: &str| -> StatefulSet {
            serde_json::from_value(json!({
                "metadata": { "name": "db", "resourceVersion": rv, "generation": 3, "labels": { "a": label } },
                "spec": { "replicas": replicas, "selector": {}, "serviceName": "db",
                          "template": { "spec": { "containers": [{ "name": "postgres", "image": "postgres:16" }] } } },
                "status": { "replicas": replicas, "readyReplicas": ready }
            }))
            .unwrap()
        };
        let mut first = sts("1", 3, 0, "x");
        let base = content(&mut first);
        assert_eq!(first, sts("1", 3, 0, "x"), "the object is left as it was");
        assert_eq!(base, content(&mut sts("2", 3, 3, "x")), "status only");
        assert_ne!(base, content(&mut sts("3", 2, 0, "x")), "spec");
        assert_ne!(base, content(&mut sts("4", 3, 0, "y")), "labels");
    }

    #[test]
    fn a_fingerprint_streamed_is_the_fingerprint_of_the_text() {
        let mut sts: StatefulSet = serde_json::from_value(json!({
            "metadata": { "name": "db", "labels": { "a": "b" } },
            "spec": { "selector": {}, "template": {} }
        }))
        .unwrap();
        let text = serde_json::to_vec(&sts).unwrap();
        assert_eq!(fingerprint(&sts), fingerprint_bytes(&text));
        assert_eq!(
            significance(&mut sts),
            fingerprint_bytes(&text),
            "no version to leave out"
        );
    }

    #[test]
    fn the_cached_copy_carries_its_fingerprint_and_no_secret_data() {
        let mut secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": "db-credentials", "resourceVersion": "7" },
            "data": { "password": "c2VjcmV0" }
        }))
        .unwrap();
        let fingerprint = content(&mut secret);
        super::secret(&mut secret);
        set_cached_content(&mut secret, Some(fingerprint));
        assert!(secret.data.is_none());
        assert_eq!(cached_content(&secret), Some(fingerprint));
        // The fingerprint of the slim copy's own content is another one: it is never
        // compared with a fingerprint of a full object.
        assert_ne!(content(&mut secret), fingerprint);
        assert_eq!(
            cached_content(&secret),
            Some(fingerprint),
            "the cached fingerprint is put back after hashing"
        );
    }

    #[test]
    fn a_slim_stateful_set_keeps_what_the_status_reads() {
        let mut sts: StatefulSet = serde_json::from_value(json!({
            "metadata": { "name": "db" },
            "spec": { "replicas": 3, "selector": { "matchLabels": { "a": "b" } }, "serviceName": "db",
                      "template": { "metadata": { "labels": { "a": "b" } },
                                    "spec": { "containers": [{ "name": "postgres", "image": "postgres:16",
                                                                "env": [{ "name": "X", "value": "y" }] }] } },
                      "volumeClaimTemplates": [{ "metadata": { "name": "data", "labels": { "a": "b" } },
                                                 "spec": { "accessModes": ["ReadWriteOnce"],
                                                           "resources": { "requests": { "storage": "1Gi" } } } }] },
            "status": { "replicas": 3, "readyReplicas": 2 }
        }))
        .unwrap();
        stateful_set(&mut sts);
        let spec = &sts.spec;
        assert_eq!(spec.replicas, Some(3));
        let container = &spec.template.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.image.as_deref(), Some("postgres:16"));
        assert!(container.env.is_none());
        let claim = &spec.volume_claim_templates.as_ref().unwrap()[0];
        let size = &claim
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests;
        assert_eq!(size.as_ref().unwrap()["storage"].0, "1Gi");
        let status = sts.status.as_ref().unwrap();
        // Its owner counts pods itself; the StatefulSet's counts would only wake it.
        assert_eq!((status.replicas, status.ready_replicas), (0, None));
    }
}
