//! The major upgrade's state machine, step by step, over hand-made observations.

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::STATUS_ANNOTATION;
use serde_json::{Value, json};

use super::*;

const NOW: &str = "2026-12-07T12:00:00Z";

fn cluster(version: &str, upgrade: Option<Value>) -> DatabaseCluster {
    let mut status = json!({ "currentPrimary": "db-0", "currentVersion": "15.8" });
    if let Some(upgrade) = upgrade {
        status["majorUpgrade"] = upgrade;
    }
    serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "db", "namespace": "ns", "uid": "uid-db" },
        "spec": {
            "engine": "postgres", "version": version, "replicas": 3,
            "storage": { "size": "1Gi" },
        },
        "status": status,
    }))
    .unwrap()
}

fn upgrade(step: &str, primary: Option<&str>, message: Option<&str>) -> Value {
    let mut value =
        json!({ "from": "15.8", "to": "17.2", "step": step, "method": "Copy", "startedAt": NOW });
    value["method"] = json!("copy");
    if let Some(primary) = primary {
        value["primary"] = json!(primary);
    }
    if let Some(message) = message {
        value["message"] = json!(message);
    }
    value
}

fn pod(name: &str, revision: &str, ready: bool, result: Option<Value>) -> Pod {
    let mut annotations = json!({
        STATUS_ANNOTATION: json!({ "role": if name == "db-1" { "primary" } else { "replica" }, "ready": ready }).to_string(),
    });
    if let Some(result) = result {
        annotations[MAJOR_UPGRADE_RESULT_ANNOTATION] = json!(result.to_string());
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "labels": { "controller-revision-hash": revision },
            "annotations": annotations,
        },
        "status": { "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
    }))
    .unwrap()
}

/// The StatefulSet rendering `image`, its status current at `revision`.
fn stateful_set(image: &str, revision: &str) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": { "name": "db", "namespace": "ns", "generation": 4 },
        "spec": {
            "selector": {}, "serviceName": "db",
            "template": { "spec": { "containers": [{ "name": "postgres", "image": image }] } },
        },
        "status": { "replicas": 3, "observedGeneration": 4, "updateRevision": revision },
    }))
    .unwrap()
}

fn decide_on(
    db: &DatabaseCluster,
    pods: &[Pod],
    sts: &StatefulSet,
    backups_on: bool,
    backup: Option<BackupSeen>,
) -> Decision {
    let pods: Vec<&Pod> = pods.iter().collect();
    let primary = db
        .status
        .as_ref()
        .and_then(|s| s.current_primary.clone())
        .unwrap_or_default();
    decide(&Inputs {
        db,
        pods: &pods,
        stateful_set: Some(sts),
        primary: &primary,
        backups_on,
        backup,
        now: NOW.parse().unwrap(),
    })
}

fn all_old(ready: bool) -> Vec<Pod> {
    (0..3)
        .map(|i| pod(&format!("db-{i}"), "old", ready, None))
        .collect()
}

fn step_of(decision: &Decision) -> Option<MajorUpgradeStep> {
    decision.record.as_ref().map(|r| r.step)
}

#[test]
fn nothing_happens_within_a_major() {
    let db = cluster("15.9", None);
    let d = decide_on(
        &db,
        &all_old(true),
        &stateful_set("postgres:15.8", "old"),
        true,
        None,
    );
    assert_eq!(d, Decision::default());
}

#[test]
fn a_higher_major_waits_for_every_instance_then_backs_up_first() {
    let db = cluster("17.2", None);
    let sts = stateful_set("postgres:15.8", "old");
    let mut pods = all_old(true);
    pods[2] = pod("db-2", "old", false, None);
    let d = decide_on(&db, &pods, &sts, true, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Pending));
    assert_eq!(d.target_version.as_deref(), Some("15.8"));
    assert!(!d.hold);
    assert_eq!(d.events[0].reason, "MajorUpgradeStarted");
    assert!(
        d.events[0].note.contains("db-pre-upgrade-15-17"),
        "{}",
        d.events[0].note
    );

    let d = decide_on(&db, &all_old(true), &sts, true, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::BackingUp));
    assert_eq!(d.create_backup.as_deref(), Some("db-pre-upgrade-15-17"));
    assert_eq!(d.target_version.as_deref(), Some("15.8"));
    assert!(d.replace.is_empty() && !d.hold);
}

#[test]
fn without_backups_the_primary_stops_at_once() {
    let db = cluster("17.2", None);
    let d = decide_on(
        &db,
        &all_old(true),
        &stateful_set("postgres:15.8", "old"),
        false,
        None,
    );
    let record = d.record.unwrap();
    assert_eq!(record.step, MajorUpgradeStep::Upgrading);
    assert_eq!(record.primary.as_deref(), Some("db-0"));
    assert_eq!(d.target_version.as_deref(), Some("17.2"));
    assert!(d.hold);
}

#[test]
fn the_backup_must_complete_and_a_failed_one_refuses_with_nothing_stopped() {
    let mut value = upgrade("BackingUp", None, None);
    value["backup"] = json!("db-pre-upgrade-15-17");
    let db = cluster("17.2", Some(value));
    let sts = stateful_set("postgres:15.8", "old");
    let seen = |phase: BackupPhase, message: Option<&str>| BackupSeen {
        name: "db-pre-upgrade-15-17".into(),
        phase: Some(phase),
        message: message.map(str::to_string),
        created: Some(NOW.parse().unwrap()),
        ours: true,
    };
    let running = seen(BackupPhase::Running, None);
    let d = decide_on(&db, &all_old(true), &sts, true, Some(running));
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::BackingUp));
    assert_eq!(d.create_backup.as_deref(), Some("db-pre-upgrade-15-17"));

    let done = seen(BackupPhase::Completed, None);
    let d = decide_on(&db, &all_old(true), &sts, true, Some(done));
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Upgrading));
    assert_eq!(d.target_version.as_deref(), Some("17.2"));

    let failed = seen(BackupPhase::Failed, Some("the store is gone"));
    let d = decide_on(&db, &all_old(true), &sts, true, Some(failed));
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Refused));
    assert_eq!(d.target_version.as_deref(), Some("15.8"));
    let (reason, message) = d.problem.unwrap();
    assert_eq!(reason, MAJOR_UPGRADE_REFUSED);
    assert!(message.contains("the store is gone"), "{message}");
    assert!(d.replace.is_empty());
}

#[test]
fn the_primary_is_replaced_once_the_stateful_set_renders_the_new_major() {
    let db = cluster("17.2", Some(upgrade("Upgrading", Some("db-1"), None)));
    // The template is not applied yet: nothing is replaced.
    let d = decide_on(
        &db,
        &all_old(true),
        &stateful_set("postgres:15.8", "old"),
        true,
        None,
    );
    assert!(d.replace.is_empty());
    assert!(d.hold);
    // Applied: the primary alone goes; the replicas keep serving.
    let d = decide_on(
        &db,
        &all_old(true),
        &stateful_set("postgres:17.2", "new"),
        true,
        None,
    );
    assert_eq!(
        d.replace,
        vec![("db-1".to_string(), "uid-db-1".to_string())]
    );
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Upgrading));
}

#[test]
fn an_upgraded_primary_that_serves_has_the_replicas_cloned_again() {
    let db = cluster("17.2", Some(upgrade("Upgrading", Some("db-1"), None)));
    let sts = stateful_set("postgres:17.2", "new");
    let result = json!({ "to": "17.2", "result": "Upgraded", "oldIntact": true });
    let mut pods = all_old(true);
    pods[1] = pod("db-1", "new", false, Some(result.clone()));
    let d = decide_on(&db, &pods, &sts, true, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Upgrading));
    pods[1] = pod("db-1", "new", true, Some(result));
    let d = decide_on(&db, &pods, &sts, true, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Recloning));

    let db = cluster("17.2", Some(upgrade("Recloning", Some("db-1"), None)));
    let d = decide_on(&db, &pods, &sts, true, None);
    assert_eq!(
        d.replace,
        vec![
            ("db-0".to_string(), "uid-db-0".to_string()),
            ("db-2".to_string(), "uid-db-2".to_string())
        ]
    );
    assert!(d.hold);
}

#[test]
fn a_result_of_another_attempt_is_not_this_ones() {
    let db = cluster("17.2", Some(upgrade("Upgrading", Some("db-1"), None)));
    let stale = json!({ "to": "16.4", "result": "Refused", "message": "old" });
    let mut pods = all_old(true);
    pods[1] = pod("db-1", "new", false, Some(stale));
    let d = decide_on(
        &db,
        &pods,
        &stateful_set("postgres:17.2", "new"),
        true,
        None,
    );
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Upgrading));
    assert!(d.problem.is_none());
}

#[test]
fn done_once_the_new_version_runs_everywhere() {
    let mut db = cluster("17.2", Some(upgrade("Recloning", Some("db-1"), None)));
    db.status.as_mut().unwrap().current_version = Some("17.2".into());
    let d = decide_on(
        &db,
        &all_old(true),
        &stateful_set("postgres:17.2", "new"),
        true,
        None,
    );
    assert_eq!(d.record, None);
    assert_eq!(d.target_version, None);
    assert!(!d.hold);
    assert_eq!(d.events[0].reason, "MajorUpgradeCompleted");
}

#[test]
fn a_refused_check_goes_back_to_the_old_major_and_is_not_tried_again() {
    let db = cluster("17.2", Some(upgrade("Upgrading", Some("db-1"), None)));
    let refused = json!({ "to": "17.2", "result": "Refused", "message": "pg_upgrade --check: reg* data types in user tables", "oldIntact": true });
    let mut pods = all_old(true);
    pods[1] = pod("db-1", "new", false, Some(refused.clone()));
    let d = decide_on(
        &db,
        &pods,
        &stateful_set("postgres:17.2", "new"),
        true,
        None,
    );
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Refused));
    assert_eq!(d.target_version.as_deref(), Some("15.8"));
    assert_eq!(d.events[0].reason, "MajorUpgradeFailed");
    let (reason, message) = d.problem.clone().unwrap();
    assert_eq!(reason, MAJOR_UPGRADE_REFUSED);
    assert!(message.contains("reg* data types"), "{message}");

    // Recorded: once the template is the old one again, the primary's pod is replaced.
    let record = serde_json::to_value(d.record.unwrap()).unwrap();
    let db = cluster("17.2", Some(record));
    let d = decide_on(
        &db,
        &pods,
        &stateful_set("postgres:15.8", "old"),
        true,
        None,
    );
    assert_eq!(
        d.replace,
        vec![("db-1".to_string(), "uid-db-1".to_string())]
    );
    assert_eq!(d.target_version.as_deref(), Some("15.8"));
    assert!(d.hold && d.events.is_empty());
    // Back and serving: settled, nothing more, failover no longer held.
    let d = decide_on(
        &db,
        &all_old(true),
        &stateful_set("postgres:15.8", "old"),
        true,
        None,
    );
    assert!(d.replace.is_empty() && !d.hold);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Refused));
    // A new spec.version starts again.
    let mut db = db;
    db.spec.version = "18.1".into();
    let d = decide_on(
        &db,
        &all_old(true),
        &stateful_set("postgres:15.8", "old"),
        true,
        None,
    );
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::BackingUp));
    assert_eq!(d.create_backup.as_deref(), Some("db-pre-upgrade-15-18"));
}

#[test]
fn a_link_mode_failure_that_disabled_the_old_data_points_at_the_backup() {
    let mut value = upgrade("Upgrading", Some("db-1"), None);
    value["backup"] = json!("db-pre-upgrade-15-17");
    value["method"] = json!("link");
    let db = cluster("17.2", Some(value));
    let failed = json!({ "to": "17.2", "result": "Failed", "message": "pg_upgrade failed", "oldIntact": false });
    let mut pods = all_old(true);
    pods[1] = pod("db-1", "new", false, Some(failed));
    let d = decide_on(
        &db,
        &pods,
        &stateful_set("postgres:17.2", "new"),
        true,
        None,
    );
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Failed));
    // Not started on the old major: its data may share files with the new cluster.
    assert_eq!(d.target_version.as_deref(), Some("17.2"));
    let (reason, message) = d.problem.unwrap();
    assert_eq!(reason, MAJOR_UPGRADE_FAILED);
    assert!(
        message.contains("restore the backup db-pre-upgrade-15-17"),
        "{message}"
    );
}

#[test]
fn a_copy_mode_failure_starts_the_old_data_again() {
    let db = cluster("17.2", Some(upgrade("Upgrading", Some("db-1"), None)));
    let failed =
        json!({ "to": "17.2", "result": "Failed", "message": "disk full", "oldIntact": true });
    let mut pods = all_old(true);
    pods[1] = pod("db-1", "new", false, Some(failed));
    let d = decide_on(
        &db,
        &pods,
        &stateful_set("postgres:17.2", "new"),
        true,
        None,
    );
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Failed));
    assert_eq!(d.target_version.as_deref(), Some("15.8"));
    assert_eq!(d.problem.unwrap().0, MAJOR_UPGRADE_FAILED);
}

#[test]
fn an_earlier_attempts_backup_is_never_taken_for_this_ones() {
    let db = cluster("17.2", None);
    let sts = stateful_set("postgres:15.8", "old");
    // Kept from an attempt that was refused: this attempt takes one of its own.
    let earlier = BackupSeen {
        name: "db-pre-upgrade-15-17".into(),
        phase: Some(BackupPhase::Completed),
        message: None,
        created: Some("2026-11-01T00:00:00Z".parse().unwrap()),
        ours: true,
    };
    let d = decide_on(&db, &all_old(true), &sts, true, Some(earlier.clone()));
    let name = d.create_backup.clone().unwrap();
    assert!(name.starts_with("db-pre-upgrade-15-17-"), "{name}");
    // A backup of the attempt's name that is not the attempt's refuses before any stop.
    let mut value = upgrade("BackingUp", None, None);
    value["backup"] = json!("db-pre-upgrade-15-17");
    let db = cluster("17.2", Some(value));
    let d = decide_on(&db, &all_old(true), &sts, true, Some(earlier.clone()));
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Refused));
    let d = decide_on(
        &db,
        &all_old(true),
        &sts,
        true,
        Some(BackupSeen {
            created: Some(NOW.parse().unwrap()),
            ours: false,
            ..earlier
        }),
    );
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Refused));
    assert!(d.replace.is_empty());
}

#[test]
fn the_primary_moves_to_the_first_instance_before_anything_stops() {
    let mut db = cluster("17.2", None);
    db.status.as_mut().unwrap().current_primary = Some("db-2".into());
    let sts = stateful_set("postgres:15.8", "old");
    let d = decide_on(&db, &all_old(true), &sts, true, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Pending));
    assert_eq!(d.switch_to.as_deref(), Some("db-0"));
    assert!(!d.hold && d.create_backup.is_none() && d.replace.is_empty());
    // Asked only while every instance is ready (else it would be refused again and again).
    let mut pods = all_old(true);
    pods[0] = pod("db-0", "old", false, None);
    let d = decide_on(&db, &pods, &sts, true, None);
    assert_eq!(d.switch_to, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Pending));
    // While it runs, nothing else starts.
    db.status.as_mut().unwrap().target_primary = Some("db-0".into());
    let d = decide_on(&db, &all_old(true), &sts, true, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Pending));
    assert!(d.create_backup.is_none());
    // A switchover that ended elsewhere since the upgrade began is not asked again.
    let mut aborted = db.clone();
    let status = aborted.status.as_mut().unwrap();
    status.target_primary = None;
    status.last_switchover_time = Some("2026-12-07T12:00:30Z".into());
    let mut pending = upgrade("Pending", None, None);
    pending["startedAt"] = json!(NOW);
    status.major_upgrade = Some(serde_json::from_value(pending).unwrap());
    let d = decide_on(&aborted, &all_old(true), &sts, true, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Refused));
    assert_eq!(d.switch_to, None);
    assert!(d.problem.unwrap().1.contains("did not complete"));
    // Done: on with the backup.
    let status = db.status.as_mut().unwrap();
    status.target_primary = None;
    status.current_primary = Some("db-0".into());
    let d = decide_on(&db, &all_old(true), &sts, true, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::BackingUp));
    assert_eq!(d.switch_to, None);
}

#[test]
fn the_way_back_is_finished_even_when_spec_version_changes_meanwhile() {
    let refused = upgrade("Refused", Some("db-1"), Some("pg_upgrade --check: no"));
    // The user sets the version back before the primary came back on 15.
    let db = cluster("15.8", Some(refused));
    let mut pods = all_old(true);
    pods[1] = pod("db-1", "new", false, None);
    let d = decide_on(
        &db,
        &pods,
        &stateful_set("postgres:15.8", "old"),
        true,
        None,
    );
    assert_eq!(
        d.replace,
        vec![("db-1".to_string(), "uid-db-1".to_string())]
    );
    assert_eq!(d.target_version.as_deref(), Some("15.8"));
    assert!(d.hold);
    // Back: the record goes with the spec back on the running version.
    let d = decide_on(
        &db,
        &all_old(true),
        &stateful_set("postgres:15.8", "old"),
        true,
        None,
    );
    assert_eq!(d, Decision::default());
}

#[test]
fn the_ordinary_rollout_and_failover_return_once_every_replica_is_cloned() {
    let db = cluster("17.2", Some(upgrade("Recloning", Some("db-1"), None)));
    let sts = stateful_set("postgres:17.2", "new");
    let mut pods: Vec<Pod> = (0..3)
        .map(|i| pod(&format!("db-{i}"), "new", true, None))
        .collect();
    let d = decide_on(&db, &pods, &sts, true, None);
    assert!(d.replace.is_empty() && !d.hold);
    pods[2] = pod("db-2", "new", false, None);
    assert!(decide_on(&db, &pods, &sts, true, None).hold);
}

#[test]
fn an_upgraded_primary_that_never_serves_fails_and_copy_mode_goes_back() {
    let db = cluster("17.2", Some(upgrade("Upgrading", Some("db-1"), None)));
    let sts = stateful_set("postgres:17.2", "new");
    let result =
        |at: &str| json!({ "to": "17.2", "result": "Upgraded", "oldIntact": true, "at": at });
    let mut pods = all_old(true);
    // Within the deadline: it is starting.
    pods[1] = pod("db-1", "new", false, Some(result("2026-12-07T11:55:00Z")));
    let d = decide_on(&db, &pods, &sts, true, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Upgrading));
    // Past it: failed, and (copy mode) back on 15, where the step puts the kept data back.
    pods[1] = pod("db-1", "new", false, Some(result("2026-12-07T11:40:00Z")));
    let d = decide_on(&db, &pods, &sts, true, None);
    assert_eq!(step_of(&d), Some(MajorUpgradeStep::Failed));
    assert_eq!(d.target_version.as_deref(), Some("15.8"));
    let (reason, message) = d.problem.unwrap();
    assert_eq!(reason, MAJOR_UPGRADE_FAILED);
    assert!(message.contains("did not serve within 600 s"), "{message}");
}
