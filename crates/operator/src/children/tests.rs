//! The applier's record of its own writes, a child's hash, the waves of a sync and the
//! `Applied` event's summary.

use super::*;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

#[test]
fn our_own_echo_is_held_except_a_workload_update() {
    let applier = Applier::default();
    let owner = caches::OwnerKey {
        kind: "DatabaseCluster".into(),
        namespace: "ns".into(),
        name: "db".into(),
    };
    let key = |kind: &'static str, name: &str| (kind, "ns".to_string(), name.to_string());
    applier.record(key("ConfigMap", "c"), Some("5".into()), None, true, false);
    assert!(applier.hold("ConfigMap", "ns", "c", "5", &owner));
    assert!(
        !applier.hold("ConfigMap", "ns", "c", "6", &owner),
        "someone else's"
    );
    // Created by us: the StatefulSet controller's first status update is the news.
    applier.record(key("StatefulSet", "db"), Some("7".into()), None, true, true);
    assert!(applier.hold("StatefulSet", "ns", "db", "7", &owner));
    assert!(!applier.hold("StatefulSet", "ns", "db", "8", &owner));
    // Updated by us: the echo may be all that follows (no new generation, no status update).
    applier.record(
        key("StatefulSet", "db"),
        Some("9".into()),
        None,
        true,
        false,
    );
    assert!(!applier.hold("StatefulSet", "ns", "db", "9", &owner));
    // Read by a drift check, not written: not an echo.
    applier.record(key("ConfigMap", "c"), Some("10".into()), None, false, false);
    assert!(!applier.hold("ConfigMap", "ns", "c", "10", &owner));
}

fn config_map(data: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "c", "namespace": "n", "labels": { "a": "b" } },
        "data": { "k": data }
    })
}

#[test]
fn the_hash_follows_the_body_and_is_carried_in_an_annotation() {
    let a = Child::new::<ConfigMap>(config_map("1")).unwrap();
    let again = Child::new::<ConfigMap>(config_map("1")).unwrap();
    let b = Child::new::<ConfigMap>(config_map("2")).unwrap();
    assert_eq!(a.hash, again.hash);
    assert_ne!(a.hash, b.hash);
    assert_eq!(a.body["metadata"]["annotations"][HASH_ANNOTATION], a.hash);
    assert_eq!(a.kind, "ConfigMap");
    assert_eq!(a.name, "c");
}

#[test]
fn a_field_the_type_does_not_have_is_a_render_error() {
    let mut body = config_map("1");
    body["dta"] = json!({ "k": "v" });
    assert!(Child::new::<ConfigMap>(body).is_err());
}

#[test]
fn workloads_wait_for_what_is_listed_before_them() {
    let child = |kind: &'static str, name: &str| Child {
        kind,
        name: name.into(),
        body: json!({}),
        hash: String::new(),
        placeholder: false,
        live: None,
        create_only: false,
    };
    let names_in_waves = |desired: &[Child]| -> Vec<Vec<String>> {
        waves(desired)
            .iter()
            .map(|w| w.iter().map(|c| c.name.clone()).collect())
            .collect()
    };
    let desired = [
        child("ConfigMap", "a"),
        child("Secret", "b"),
        child("StatefulSet", "c"),
        child("PodDisruptionBudget", "d"),
    ];
    assert_eq!(
        names_in_waves(&desired),
        [vec!["a", "b"], vec!["c"], vec!["d"]]
    );
    assert!(waves(&[]).is_empty());
    let mut create = child("Secret", "e");
    create.create_only = true;
    let with_create = [child("ConfigMap", "a"), create, child("StatefulSet", "c")];
    assert_eq!(
        names_in_waves(&with_create),
        [vec!["e"], vec!["a"], vec!["c"]],
        "creates first, alone"
    );
    let only = [child("Deployment", "x")];
    assert_eq!(waves(&only).len(), 1);

    // A RoleBinding waits one wave for its Role: with the workload, or after the rest.
    let rbac = [
        child("Role", "r"),
        child("RoleBinding", "rb"),
        child("ConfigMap", "a"),
        child("StatefulSet", "c"),
        child("PodDisruptionBudget", "d"),
    ];
    assert_eq!(
        names_in_waves(&rbac),
        [vec!["r", "a"], vec!["rb", "c"], vec!["d"]]
    );
    let no_workload = [child("Role", "r"), child("RoleBinding", "rb")];
    assert_eq!(names_in_waves(&no_workload), [vec!["r"], vec!["rb"]]);
}

#[test]
fn the_applied_event_lists_what_changed() {
    let changes = [
        Change::Created("ConfigMap", "a".into()),
        Change::Created("Secret", "b".into()),
        Change::Updated("StatefulSet", "c".into()),
        Change::Deleted("Service", "d".into()),
    ];
    assert_eq!(
        Change::summary(&changes),
        "Created ConfigMap a, Secret b; updated StatefulSet c; deleted Service d"
    );
    assert_eq!(
        Change::summary(&[Change::Deleted("Service", "d".into())]),
        "Deleted Service d"
    );
}
