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
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PodSpec, PodTemplateSpec, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Resource;

use super::HASH_ANNOTATION;
use serde_json::Value;

/// Where a cached copy carries the fingerprint of the content it was slimmed from. Exists
/// only in the operator's memory, never on the server.
pub const CONTENT_ANNOTATION: &str = "devctl.io/cached-content";

pub(crate) fn hash_value(value: &Value) -> u64 {
    // SipHash with fixed keys: stable within the process, which is all the record needs.
    // Serialised straight into the hasher: no text of the object is built.
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
    // Writing a Value into a sink that cannot fail cannot fail.
    let _ = serde_json::to_writer(&mut hashing, value);
    hashing.0.finish()
}

/// A fingerprint of everything in `object` but its status and the server's bookkeeping
/// (`resourceVersion`, `generation`, `managedFields`): it changes when someone changes the
/// object's content, not when a controller reports status.
pub fn content<K: serde::Serialize>(object: &K) -> Option<u64> {
    let mut value = serde_json::to_value(object).ok()?;
    let root = value.as_object_mut()?;
    root.remove("status");
    if let Some(meta) = root.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["resourceVersion", "generation", "managedFields"] {
            meta.remove(field);
        }
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove(CONTENT_ANNOTATION);
        }
    }
    Some(hash_value(&value))
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
pub fn significance<K: serde::Serialize>(object: &K) -> u64 {
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    hash_value(&value)
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
        let base = content(&sts("1", 3, 0, "x"));
        assert_eq!(base, content(&sts("2", 3, 3, "x")), "status only");
        assert_ne!(base, content(&sts("3", 2, 0, "x")), "spec");
        assert_ne!(base, content(&sts("4", 3, 0, "y")), "labels");
    }

    #[test]
    fn the_cached_copy_carries_its_fingerprint_and_no_secret_data() {
        let mut secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": "db-credentials", "resourceVersion": "7" },
            "data": { "password": "c2VjcmV0" }
        }))
        .unwrap();
        let fingerprint = content(&secret);
        super::secret(&mut secret);
        set_cached_content(&mut secret, fingerprint);
        assert!(secret.data.is_none());
        assert_eq!(cached_content(&secret), fingerprint);
        // The fingerprint of the slim copy's own content is another one: it is never
        // compared with a fingerprint of a full object.
        assert_ne!(content(&secret), fingerprint);
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
