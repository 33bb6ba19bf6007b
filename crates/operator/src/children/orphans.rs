//! Who holds an object of a child's name that the owner does not plainly control: the owner,
//! an orphan devctl made for the owner's name (adopted), or someone else (refused).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::DynamicObject;
use serde_json::Value;

use super::{Child, FIELD_MANAGER};
use crate::error::Error;

/// What the object of a child's name is to the owner ([`Applier::holder`]).
///
/// [`Applier::holder`]: super::Applier::holder
pub(super) enum Holder {
    /// The owner controls it: the owner's child.
    Owner,
    /// Made by devctl for a deleted owner of the same name and controlled by nobody: the
    /// owner takes it over ([`orphan_of`]).
    Orphan,
    /// Deleted since.
    Gone,
    /// Someone else's (or a deleted owner's, until the garbage collector removes it).
    Other(Error),
}

/// Who holds an object of a child's name, as read from it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HeldBy {
    Owner,
    /// Left behind for this owner's name by a deletion that kept the children.
    Orphan,
    /// A deleted owner of the same kind and name (another uid), or an object being deleted:
    /// the garbage collector's, gone soon.
    PreviousOwner(String),
    /// Its controller, else the field managers of its fields (status writers aside).
    Other(String),
}

pub(super) fn describe_holder(object: &DynamicObject, owner_uid: &str, child: &Child) -> HeldBy {
    fn controller_of(references: &[OwnerReference]) -> Option<&OwnerReference> {
        references.iter().find(|r| r.controller == Some(true))
    }
    let controller = controller_of(
        object
            .metadata
            .owner_references
            .as_deref()
            .unwrap_or_default(),
    );
    if controller.is_some_and(|c| c.uid == owner_uid) {
        return HeldBy::Owner;
    }
    let ours: Vec<OwnerReference> = child
        .body
        .pointer("/metadata/ownerReferences")
        .and_then(|references| serde_json::from_value(references.clone()).ok())
        .unwrap_or_default();
    let ours = controller_of(&ours);
    if let Some(controller) = controller {
        let what = format!("{} {}", controller.kind, controller.name);
        let same_name = ours
            .as_ref()
            .is_some_and(|o| o.kind == controller.kind && o.name == controller.name);
        return if same_name || object.metadata.deletion_timestamp.is_some() {
            HeldBy::PreviousOwner(what)
        } else {
            HeldBy::Other(format!("controlled by {what}"))
        };
    }
    if object.metadata.deletion_timestamp.is_some() {
        return HeldBy::PreviousOwner("someone".to_string());
    }
    let wanted_labels = child
        .body
        .pointer("/metadata/labels")
        .cloned()
        .and_then(|labels| serde_json::from_value(labels).ok())
        .unwrap_or_default();
    match orphan_of(&object.metadata, &wanted_labels) {
        Orphanage::Ours => {
            let (live, wanted) = (workload(&object.data), workload(&child.body));
            return if live == wanted {
                HeldBy::Orphan
            } else {
                // Another engine's pods, another version's, or another number of them: the
                // apply would roll or scale pods that run on data this resource did not
                // write (an upgrade or a scale-down is a change of a cluster it runs).
                HeldBy::Other(format!(
                    "left behind by a deleted owner of this name running {live}, where this \
                     resource asks for {wanted}; not adopted — create it as it was to adopt \
                     it, then change it"
                ))
            };
        }
        Orphanage::Devctls => {
            return HeldBy::Other(
                "left behind by another deleted owner; no object controls it".to_string(),
            );
        }
        Orphanage::NotOne => {}
    }
    let managers = makers(&object.metadata);
    HeldBy::Other(match managers.as_slice() {
        [] => "made by someone else".to_string(),
        _ => format!("made by {}", managers.join(", ")),
    })
}

/// The field managers of an object's fields, status writers aside, sorted.
fn makers(meta: &ObjectMeta) -> Vec<&str> {
    let mut managers: Vec<&str> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| entry.subresource.as_deref().unwrap_or_default().is_empty())
        .filter_map(|entry| entry.manager.as_deref())
        .collect();
    managers.sort_unstable();
    managers.dedup();
    managers
}

/// A workload's replicas and containers, `1 × postgres (postgres:16.2)` (empty for other
/// kinds): what must be the same for an orphaned workload to be adopted.
fn workload(body: &Value) -> String {
    let Some(containers) = body
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
    else {
        return String::new();
    };
    let containers: Vec<String> = containers
        .iter()
        .map(|c| {
            let field = |key: &str| c.get(key).and_then(Value::as_str).unwrap_or("?");
            format!("{} ({})", field("name"), field("image"))
        })
        .collect();
    // A missing `replicas` is the API's default, one.
    let replicas = body
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    format!("{replicas} × {}", containers.join(", "))
}

/// What an object nobody controls is to an owner that wants its name.
#[derive(Debug, PartialEq, Eq)]
pub enum Orphanage {
    /// Devctl made it (its field manager and `managed-by` label) for an owner of this kind
    /// and name (the `app.kubernetes.io/name` and `instance` labels the owner gives its
    /// children), and a deletion that kept the children (`--cascade=orphan`) left it
    /// controlled by nobody: the owner adopts it, as a ReplicaSet adopts its pods.
    Ours,
    /// Devctl made it for another owner.
    Devctls,
    /// Controlled by an object, being deleted, or not devctl's.
    NotOne,
}

/// Whether `meta` is an orphan devctl made for the owner whose children carry
/// `wanted_labels`.
pub fn orphan_of(
    meta: &ObjectMeta,
    wanted_labels: &std::collections::BTreeMap<String, String>,
) -> Orphanage {
    use devctl_api::labels::{INSTANCE, MANAGED_BY, MANAGER, NAME};
    let controlled = meta
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true));
    let labels = meta.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key));
    if controlled
        || meta.deletion_timestamp.is_some()
        || label(MANAGED_BY).map(String::as_str) != Some(MANAGER)
        || !makers(meta).contains(&FIELD_MANAGER)
    {
        return Orphanage::NotOne;
    }
    let same = |key: &str| label(key).is_some() && label(key) == wanted_labels.get(key);
    if same(NAME) && same(INSTANCE) {
        Orphanage::Ours
    } else {
        Orphanage::Devctls
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    #[test]
    fn the_holder_of_a_name_is_its_controller_else_its_makers() {
        let reference = |kind: &str, name: &str, uid: &str| {
            json!({ "apiVersion": "db.devctl.io/v1beta1", "kind": kind, "name": name,
                    "uid": uid, "controller": true })
        };
        let child = Child::new::<ConfigMap>(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "shop-config",
                          "labels": { "app.kubernetes.io/name": "databasecluster",
                                      "app.kubernetes.io/instance": "shop",
                                      "app.kubernetes.io/managed-by": "devctl-operator" },
                          "ownerReferences": [reference("DatabaseCluster", "shop", "u-1")] },
        }))
        .unwrap();
        let object = |extra: Value| -> DynamicObject {
            let mut object = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": "shop-config", "managedFields": [
                    { "manager": "payments-team", "operation": "Update", "apiVersion": "v1" },
                    { "manager": "kube-controller-manager", "operation": "Update",
                      "apiVersion": "v1", "subresource": "status" },
                    { "manager": "payments-team", "operation": "Apply", "apiVersion": "v1" },
                ] },
            });
            if let (Some(metadata), Some(extra)) = (
                object.get_mut("metadata").and_then(Value::as_object_mut),
                extra.as_object(),
            ) {
                metadata.extend(extra.clone());
            }
            serde_json::from_value(object).unwrap()
        };
        let controlled_by = |kind: &str, name: &str, uid: &str| {
            json!({ "ownerReferences": [
                { "apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "u-0" },
                reference(kind, name, uid),
            ] })
        };
        let held = |extra: Value| describe_holder(&object(extra), "u-1", &child);
        assert_eq!(
            held(controlled_by("DatabaseCluster", "shop", "u-1")),
            HeldBy::Owner
        );
        assert_eq!(
            held(controlled_by("WebApp", "web", "u-2")),
            HeldBy::Other("controlled by WebApp web".into())
        );
        // The cluster deleted before this one of the same name: the garbage collector's.
        assert_eq!(
            held(controlled_by("DatabaseCluster", "shop", "u-0")),
            HeldBy::PreviousOwner("DatabaseCluster shop".into())
        );
        assert_eq!(
            held(json!({})),
            HeldBy::Other("made by payments-team".into())
        );
        assert_eq!(
            held(json!({ "managedFields": [] })),
            HeldBy::Other("made by someone else".into())
        );
        // Orphaned by `--cascade=orphan`: made by devctl for a cluster of this name,
        // controlled by nobody — adopted. Made for another name, or by devctl's field manager
        // without its labels: not.
        let orphan = |instance: &str, managed_by: &str| {
            json!({
                "labels": { "app.kubernetes.io/name": "databasecluster",
                            "app.kubernetes.io/instance": instance,
                            "app.kubernetes.io/managed-by": managed_by },
                "managedFields": [
                    { "manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": "v1" },
                    { "manager": "kube-controller-manager", "operation": "Update",
                      "apiVersion": "v1", "subresource": "status" },
                ],
            })
        };
        assert_eq!(held(orphan("shop", "devctl-operator")), HeldBy::Orphan);
        assert_eq!(
            held(orphan("shop-old", "devctl-operator")),
            HeldBy::Other("left behind by another deleted owner; no object controls it".into())
        );
        assert_eq!(
            held(orphan("shop", "helm")),
            HeldBy::Other("made by devctl-operator".into())
        );
        let mut controlled = orphan("shop", "devctl-operator");
        controlled["ownerReferences"] =
            controlled_by("WebApp", "web", "u-2")["ownerReferences"].clone();
        assert_eq!(
            held(controlled),
            HeldBy::Other("controlled by WebApp web".into())
        );
        assert!(matches!(
            held(json!({ "deletionTimestamp": "2026-12-05T12:00:00Z" })),
            HeldBy::PreviousOwner(_)
        ));
    }

    #[test]
    fn an_orphaned_workload_is_adopted_only_as_it_was() {
        use k8s_openapi::api::apps::v1::StatefulSet;
        let labels = json!({ "app.kubernetes.io/name": "databasecluster",
                             "app.kubernetes.io/instance": "shop",
                             "app.kubernetes.io/managed-by": "devctl-operator" });
        let workload = |container: &str| {
            json!({
                "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": { "name": "shop", "labels": labels.clone() },
                "spec": { "serviceName": "shop-headless",
                          "selector": { "matchLabels": {} },
                          "template": { "spec": { "containers": [
                              { "name": container, "image": format!("{container}:16") } ] } } },
            })
        };
        let child = Child::new::<StatefulSet>(workload("postgres")).unwrap();
        let live = |container: &str| -> DynamicObject {
            let mut body = workload(container);
            body["metadata"]["managedFields"] = json!([
                { "manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": "apps/v1" } ]);
            serde_json::from_value(body).unwrap()
        };
        assert_eq!(
            describe_holder(&live("postgres"), "u-1", &child),
            HeldBy::Orphan
        );
        // Another version, or another number of pods: not adopted either.
        let mut upgraded = live("postgres");
        upgraded.data["spec"]["template"]["spec"]["containers"][0]["image"] = "postgres:15".into();
        let mut scaled = live("postgres");
        scaled.data["spec"]["replicas"] = 3.into();
        for (other, running) in [
            (upgraded, "1 × postgres (postgres:15)"),
            (scaled, "3 × postgres (postgres:16)"),
        ] {
            assert!(
                matches!(describe_holder(&other, "u-1", &child),
                         HeldBy::Other(m) if m.contains(&format!("running {running}, where"))),
                "{running}"
            );
        }
        assert_eq!(
            describe_holder(&live("mysql"), "u-1", &child),
            HeldBy::Other(
                "left behind by a deleted owner of this name running 1 × mysql (mysql:16), \
                 where this resource asks for 1 × postgres (postgres:16); not adopted — create \
                 it as it was to adopt it, then change it"
                    .into()
            )
        );
    }
}
