//! The status computed from what was observed: phase, conditions (ready, progressing,
//! degraded, stalled, backups), replica counts and the failover fields.

use super::super::resources::test_support::sample;
use super::*;
use devctl_api::conditions::{RECONCILING, STALLED};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

fn sts(ready: i32, replicas: i32, done: bool) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": { "name": "my-postgres", "generation": 1 },
        "spec": {
            "replicas": replicas, "selector": {}, "serviceName": "x",
            "template": { "spec": { "containers": [{ "name": "postgres", "image": "postgres:16.2" }] } }
        },
        "status": {
            "observedGeneration": 1, "replicas": replicas, "readyReplicas": ready,
            "updatedReplicas": replicas,
            "currentRevision": "a", "updateRevision": if done { "a" } else { "b" }
        }
    }))
    .unwrap()
}

fn observed<'a>(sts: Option<&'a StatefulSet>) -> Observed<'a> {
    Observed {
        stateful_set: sts,
        target_version: "16.2",
        target_image: "postgres:16.2",
        version_refused: None,
        replication_refused: None,
        scale_down_refused: None,
        volumes_pending: None,
        credentials_regenerated: false,
        stateful_set_applied: false,
        // The pods are the StatefulSet's status says: all at its update revision.
        updated_pods: sts
            .and_then(|s| s.status.as_ref())
            .and_then(|s| s.updated_replicas)
            .unwrap_or(0),
        failure: None,
        cluster_domain: "cluster.local",
        // Every ready pod's agent reports its engine ready.
        primary: Primary {
            current: "my-postgres-0".into(),
            target: None,
            ..Default::default()
        },
        primary_lost: None,
        failover_stuck: None,
        backup_problem: None,
        backup_health: None,
        last_backup: None,
        last_scheduled_backup: None,
        next_scheduled_backup: None,
        major_upgrade: None,
        upgrade_progress: None,
        upgrade_problem: None,
        synchronous_degraded: None,
        instances: Instances {
            ready: sts
                .and_then(|s| s.status.as_ref())
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0),
            // One per pod the StatefulSet counts, the first `readyReplicas` of them ready.
            summaries: (0..sts
                .and_then(|s| s.status.as_ref())
                .map_or(0, |s| s.replicas))
                .map(|i| devctl_api::database_cluster::InstanceSummary {
                    name: format!("my-postgres-{i}"),
                    ready: i < sts
                        .and_then(|s| s.status.as_ref())
                        .and_then(|s| s.ready_replicas)
                        .unwrap_or(0),
                    ..Default::default()
                })
                .collect(),
            ..Instances::default()
        },
    }
}

fn now() -> Time {
    Time(Timestamp::from_second(1_000).unwrap())
}

fn condition<'a>(
    s: &'a DatabaseClusterStatus,
    t: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    conditions::find(&s.conditions, t).unwrap()
}

#[test]
fn backups_and_wal_archiving_have_a_condition_each_while_backups_are_configured() {
    use super::super::backup::Health;
    let mut db = sample();
    let mut seen = observed(None);
    // Never configured: neither condition.
    let status = compute(&db, &seen, &now()).unwrap();
    assert!(conditions::find(&status.conditions, BACKUP_FAILING).is_none());
    assert!(conditions::find(&status.conditions, WAL_ARCHIVING_FAILING).is_none());
    // Both failing at once: both True (Degraded can name only one).
    seen.backup_health = Some(Health {
        backup_failing: Some("the last backup b failed: store down".into()),
        wal_archiving_failing: Some("WAL archiving fails: store down".into()),
        store_took_wal_since_the_failure: false,
    });
    let status = compute(&db, &seen, &now()).unwrap();
    for type_ in [BACKUP_FAILING, WAL_ARCHIVING_FAILING] {
        let c = condition(&status, type_);
        assert_eq!((c.status.as_str(), c.reason.as_str()), (TRUE, type_));
        assert!(c.message.contains("store down"), "{}", c.message);
    }
    // The store is back: both False.
    db.status = Some(status);
    seen.backup_health = Some(Health::default());
    let status = compute(&db, &seen, &now()).unwrap();
    for type_ in [BACKUP_FAILING, WAL_ARCHIVING_FAILING] {
        assert_eq!(condition(&status, type_).status, FALSE);
    }
    // Backups switched off: False, saying so, not a stale True.
    db.status = Some(status);
    seen.backup_health = None;
    let status = compute(&db, &seen, &now()).unwrap();
    assert_eq!(condition(&status, BACKUP_FAILING).reason, "BackupsOff");
    assert_eq!(condition(&status, WAL_ARCHIVING_FAILING).status, FALSE);
}

#[test]
fn a_backup_that_failed_on_a_store_that_was_down_clears_when_the_store_takes_wal_again() {
    use super::super::backup::Health;
    let failure = "the last backup b1 failed: store unreachable";
    let degraded_by_it = |status: &DatabaseClusterStatus| {
        let c = condition(status, DEGRADED);
        c.status == TRUE && c.reason == BACKUP_FAILING
    };
    let mut db = sample();
    let mut seen = observed(None);
    // The store is down: the backup failed and WAL archiving fails.
    seen.backup_health = Some(Health {
        backup_failing: Some(failure.into()),
        wal_archiving_failing: Some("WAL archiving fails: store unreachable".into()),
        store_took_wal_since_the_failure: false,
    });
    seen.backup_problem = Some((BACKUP_FAILING, failure.into()));
    db.status = compute(&db, &seen, &now());
    // It is back and has taken WAL since: cleared, and it stays cleared.
    seen.backup_health = Some(Health {
        backup_failing: Some(failure.into()),
        wal_archiving_failing: None,
        store_took_wal_since_the_failure: true,
    });
    for _ in 0..2 {
        let status = compute(&db, &seen, &now()).unwrap();
        let c = condition(&status, BACKUP_FAILING);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (FALSE, STORE_RETURNED)
        );
        assert!(c.message.starts_with(failure), "{}", c.message);
        assert!(!degraded_by_it(&status));
        db.status = Some(status);
    }
    // A backup that failed with the store fine (WAL archiving never failed) stands
    // although WAL keeps flowing.
    let mut db = sample();
    let mut fine = observed(None);
    fine.backup_health = Some(Health {
        backup_failing: Some(failure.into()),
        wal_archiving_failing: None,
        store_took_wal_since_the_failure: false,
    });
    fine.backup_problem = Some((BACKUP_FAILING, failure.into()));
    db.status = compute(&db, &fine, &now());
    fine.backup_health = Some(Health {
        store_took_wal_since_the_failure: true,
        ..fine.backup_health.clone().unwrap()
    });
    let status = compute(&db, &fine, &now()).unwrap();
    assert_eq!(condition(&status, BACKUP_FAILING).status, TRUE);
    assert!(degraded_by_it(&status));
}

#[test]
fn a_stateful_set_applied_in_this_reconcile_counts_as_created() {
    let mut fresh = observed(None);
    fresh.stateful_set_applied = true;
    let status = compute(&sample(), &fresh, &now()).unwrap();
    assert_eq!(status.phase, Some(Phase::Creating));
    assert_eq!(
        condition(&status, PROGRESSING).message,
        format!("0/{} instances ready", sample().spec.replicas)
    );
    assert_eq!(condition(&status, READY).status, FALSE);
}

#[test]
fn conditions_exist_from_the_first_reconcile() {
    let status = compute(&sample(), &observed(None), &now()).unwrap();
    assert_eq!(status.phase, Some(Phase::Pending));
    assert_eq!(condition(&status, READY).status, FALSE);
    assert_eq!(condition(&status, PROGRESSING).status, TRUE);
    assert_eq!(condition(&status, DEGRADED).status, FALSE);
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(
        status.primary_endpoint.as_deref(),
        Some("my-postgres-rw.prod.svc.cluster.local")
    );
    assert_eq!(
        status.replica_endpoint.as_deref(),
        Some("my-postgres-ro.prod.svc.cluster.local")
    );
}

#[test]
fn ready_when_every_instance_runs_the_target_version() {
    let s = sts(3, 3, true);
    let status = compute(&sample(), &observed(Some(&s)), &now()).unwrap();
    assert_eq!(status.phase, Some(Phase::Running));
    assert_eq!(condition(&status, READY).status, TRUE);
    assert_eq!(condition(&status, PROGRESSING).status, FALSE);
    assert_eq!(status.current_version.as_deref(), Some("16.2"));
}

#[test]
fn ready_once_every_instance_is_even_before_the_stateful_set_counts_them() {
    // The StatefulSet controller has not counted the pods yet (its status says 0 of
    // everything); the pods at its update revision and the instances (pods Ready, agents
    // reporting) are what Ready means, so the cluster does not wait for it.
    let mut s = sts(0, 3, true);
    if let Some(st) = s.status.as_mut() {
        st.replicas = 0;
        st.updated_replicas = Some(0);
    }
    let mut seen = observed(Some(&s));
    seen.updated_pods = 3;
    seen.instances.ready = 3;
    seen.instances.summaries = (0..3)
        .map(|i| devctl_api::database_cluster::InstanceSummary {
            name: format!("my-postgres-{i}"),
            ready: true,
            ..Default::default()
        })
        .collect();
    let status = compute(&sample(), &seen, &now()).unwrap();
    assert_eq!(condition(&status, READY).status, TRUE);
    assert_eq!(status.ready_replicas, 3);
    assert_eq!(status.replicas, 3);
    // A pod still at the old revision: not yet.
    seen.updated_pods = 2;
    let status = compute(&sample(), &seen, &now()).unwrap();
    assert_eq!(condition(&status, READY).status, FALSE);
    // ... and not before the instances are, whatever the StatefulSet counts.
    let s = sts(3, 3, true);
    let mut seen = observed(Some(&s));
    seen.instances.ready = 2;
    let status = compute(&sample(), &seen, &now()).unwrap();
    assert_eq!(condition(&status, READY).status, FALSE);
}

#[test]
fn replicas_counts_the_pods_that_exist_not_the_stateful_sets_count() {
    // The StatefulSet's status still says 0 replicas; two pods are in the cache already.
    let mut s = sts(0, 2, true);
    if let Some(st) = s.status.as_mut() {
        st.replicas = 0;
    }
    let mut seen = observed(Some(&s));
    seen.instances.summaries = ["my-postgres-0", "my-postgres-1"]
        .map(|name| devctl_api::database_cluster::InstanceSummary {
            name: name.into(),
            ..Default::default()
        })
        .into();
    let status = compute(&sample(), &seen, &now()).unwrap();
    assert_eq!(status.replicas, 2);
}

#[test]
fn ready_pods_are_not_enough_the_agents_must_report_their_engines_ready() {
    let s = sts(3, 3, true);
    let mut seen = observed(Some(&s));
    seen.instances = Instances {
        ready: 2,
        summaries: vec![devctl_api::database_cluster::InstanceSummary {
            name: "my-postgres-2".into(),
            message: Some("initdb failed: disk full".into()),
            ..Default::default()
        }],
        credentials_applied: false,
    };
    let status = compute(&sample(), &seen, &now()).unwrap();
    assert_eq!(status.ready_replicas, 2);
    let ready = condition(&status, READY);
    assert_eq!(ready.status, FALSE);
    assert!(
        ready
            .message
            .contains("my-postgres-2: initdb failed: disk full"),
        "{}",
        ready.message
    );
    assert_eq!(status.current_version, None);
}

#[test]
fn a_converged_status_recomputes_to_itself() {
    let s = sts(3, 3, true);
    let mut db = sample();
    db.status = compute(&db, &observed(Some(&s)), &now());
    let later = Time(Timestamp::from_second(5_000).unwrap());
    assert_eq!(
        compute(&db, &observed(Some(&s)), &later),
        db.status,
        "no write in steady state"
    );
}

#[test]
fn a_change_is_in_progress_from_the_write_that_records_it() {
    let s = sts(3, 3, true);
    let mut scaled = sample();
    scaled.status = compute(&scaled, &observed(Some(&s)), &now());
    scaled.spec.replicas = 5;
    scaled.metadata.generation = Some(2);
    let status = compute(&scaled, &observed(Some(&s)), &now()).unwrap();
    assert_eq!(status.observed_generation, Some(2));
    assert_eq!(condition(&status, READY).status, FALSE);
    assert_eq!(condition(&status, READY).reason, "Scaling");
    assert_eq!(condition(&status, RECONCILING).status, TRUE);
    assert_eq!(condition(&status, RECONCILING).reason, "Scaling");

    let mut upgraded = sample();
    upgraded.status = compute(&upgraded, &observed(Some(&s)), &now());
    upgraded.spec.version = "16.4".into();
    let mut o = observed(Some(&s));
    o.target_version = "16.4";
    o.target_image = "postgres:16.4";
    let status = compute(&upgraded, &o, &now()).unwrap();
    assert_eq!(condition(&status, READY).reason, "Upgrading");
    assert_eq!(condition(&status, RECONCILING).status, TRUE);
    assert_eq!(status.current_version.as_deref(), Some("16.2"));

    // Another image of the same version (`spec.image`): the pods are replaced, an upgrade.
    let mut reimaged = sample();
    reimaged.status = compute(&reimaged, &observed(Some(&s)), &now());
    let mut o = observed(Some(&s));
    o.target_image = "registry.example/postgres:16.2-patched";
    let status = compute(&reimaged, &o, &now()).unwrap();
    assert_eq!(condition(&status, READY).reason, "Upgrading");
    assert_eq!(condition(&status, RECONCILING).reason, "Upgrading");

    let mut fresh = observed(Some(&s));
    fresh.stateful_set_applied = true;
    let status = compute(&sample(), &fresh, &now()).unwrap();
    assert_eq!(
        condition(&status, READY).status,
        FALSE,
        "the cache predates the apply"
    );
}

#[test]
fn a_refused_version_change_is_stalled_and_not_ready() {
    let s = sts(3, 3, true);
    let mut o = observed(Some(&s));
    o.version_refused = Some("spec.version 16.1: downgrade from 16.2 to 16.1".into());
    let status = compute(&sample(), &o, &now()).unwrap();
    assert_eq!(condition(&status, STALLED).status, TRUE);
    assert!(condition(&status, STALLED).message.contains("spec.version"));
    assert_eq!(condition(&status, RECONCILING).status, FALSE);
    assert_eq!(condition(&status, READY).reason, "VersionChangeRefused");
    assert_eq!(condition(&status, DEGRADED).reason, "VersionChangeRefused");
}

#[test]
fn a_refused_scale_down_is_stalled_with_its_reason() {
    let s = sts(5, 5, true);
    let mut o = observed(Some(&s));
    o.scale_down_refused =
        Some("spec.replicas 3: scaling down would remove the primary my-postgres-4".into());
    let status = compute(&sample(), &o, &now()).unwrap();
    for type_ in [STALLED, DEGRADED] {
        assert_eq!(condition(&status, type_).status, TRUE);
        assert_eq!(condition(&status, type_).reason, SCALE_DOWN_REFUSED);
    }
    assert_eq!(condition(&status, READY).status, FALSE);
}

#[test]
fn a_transient_error_is_reconciling_not_stalled() {
    let mut o = observed(None);
    o.failure = Some(Failure {
        reason: "ApiError",
        message: "apply StatefulSet my-postgres: timeout".into(),
        permanent: false,
    });
    let status = compute(&sample(), &o, &now()).unwrap();
    assert_eq!(condition(&status, STALLED).status, FALSE);
    assert_eq!(condition(&status, RECONCILING).status, TRUE);
    // `Progressing` and `Reconciling` say the same, also on a converged cluster.
    let s = sts(3, 3, true);
    let mut o = observed(Some(&s));
    o.failure = Some(Failure {
        reason: "ApiError",
        message: "apply Service my-postgres-rw: timeout".into(),
        permanent: false,
    });
    let status = compute(&sample(), &o, &now()).unwrap();
    for type_ in [PROGRESSING, RECONCILING] {
        assert_eq!(
            (
                condition(&status, type_).status.as_str(),
                condition(&status, type_).reason.as_str()
            ),
            ("True", "ApiError"),
            "{type_}"
        );
    }
}

#[test]
fn errors_become_degraded_and_not_ready() {
    let mut o = observed(None);
    o.failure = Some(Failure {
        reason: "Forbidden",
        message: "apply StatefulSet my-postgres: forbidden".into(),
        permanent: true,
    });
    let status = compute(&sample(), &o, &now()).unwrap();
    assert_eq!(condition(&status, READY).reason, "Forbidden");
    assert_eq!(condition(&status, DEGRADED).status, TRUE);
    assert_eq!(status.phase, Some(Phase::Failed));
    assert_eq!(
        condition(&status, STALLED).status,
        TRUE,
        "a denied child needs a human"
    );
}

fn served(s: &StatefulSet) -> DatabaseCluster {
    let mut db = sample();
    db.status = compute(&db, &observed(Some(s)), &now());
    assert_eq!(
        db.status.as_ref().unwrap().current_version.as_deref(),
        Some("16.2")
    );
    db
}

#[test]
fn a_failover_is_progressing_and_recorded_in_the_status() {
    let s = sts(2, 3, true);
    let db = served(&sts(3, 3, true));
    let mut o = observed(Some(&s));
    o.primary = Primary {
        current: "my-postgres-0".into(),
        target: Some(devctl_api::instance::TARGET_PENDING.into()),
        failed: Some("my-postgres-0".into()),
        epoch: Some(2),
        last_failover_time: Some("2025-01-01T00:00:00Z".into()),
        failed_targets: Vec::new(),
        last_switchover_time: None,
        last_failover: None,
    };
    let status = compute(&db, &o, &now()).unwrap();
    let progressing = condition(&status, PROGRESSING);
    assert_eq!(progressing.status, TRUE);
    assert_eq!(progressing.reason, FAILING_OVER);
    assert_eq!(
        progressing.message,
        "failing over from my-postgres-0 (epoch 2): waiting for the replicas' final positions"
    );
    assert_eq!(condition(&status, READY).status, FALSE);
    assert_eq!(status.target_primary.as_deref(), Some("pending"));
    assert_eq!(status.failover_epoch, Some(2));
    assert_eq!(status.failed_primary.as_deref(), Some("my-postgres-0"));
    assert_eq!(
        status.last_failover_time.as_deref(),
        Some("2025-01-01T00:00:00Z")
    );
    // The failed primary is down: fewer instances, not a primary nobody replaces.
    assert_eq!(condition(&status, DEGRADED).reason, INSTANCES_UNAVAILABLE);

    o.primary.target = Some("my-postgres-2".into());
    let status = compute(&db, &o, &now()).unwrap();
    assert_eq!(
        condition(&status, PROGRESSING).message,
        "failing over from my-postgres-0 (epoch 2): promoting my-postgres-2"
    );

    // Done: the new primary, the epoch and time kept, nothing in progress.
    let s = sts(3, 3, true);
    let mut o = observed(Some(&s));
    o.primary = Primary {
        current: "my-postgres-2".into(),
        epoch: Some(2),
        last_failover_time: Some("2025-01-01T00:00:00Z".into()),
        ..Default::default()
    };
    let status = compute(&db, &o, &now()).unwrap();
    assert_eq!(condition(&status, READY).status, TRUE);
    assert_eq!(condition(&status, DEGRADED).status, FALSE);
    assert_eq!(status.current_primary.as_deref(), Some("my-postgres-2"));
    assert_eq!(status.target_primary, None);
    assert_eq!(status.failed_primary, None);
    assert_eq!(status.failover_epoch, Some(2));
}

#[test]
fn a_lost_primary_without_automatic_failover_is_degraded_with_what_to_do() {
    let s = sts(2, 3, true);
    let db = served(&sts(3, 3, true));
    let mut o = observed(Some(&s));
    o.version_refused = Some("spec.version 16.1: downgrade".into());
    o.primary_lost = Some(
        "the primary my-postgres-0 did not renew the lock for 30s; automatic failover is off (spec.highAvailability.autoFailover): promote a replica with `devctl db promote my-postgres POD`".into(),
    );
    let status = compute(&db, &o, &now()).unwrap();
    let degraded = condition(&status, DEGRADED);
    assert_eq!(degraded.status, TRUE);
    assert_eq!(degraded.reason, PRIMARY_UNAVAILABLE);
    assert!(degraded.message.contains("devctl db promote my-postgres"));
    assert_eq!(status.failover_epoch, None, "nothing started");
}

#[test]
fn fewer_ready_instances_than_declared_is_degraded_once_the_cluster_has_served() {
    let s = sts(2, 3, true);
    let mut o = observed(Some(&s));
    o.instances.summaries = vec![
        devctl_api::database_cluster::InstanceSummary {
            name: "my-postgres-0".into(),
            ready: true,
            ..Default::default()
        },
        devctl_api::database_cluster::InstanceSummary {
            name: "my-postgres-1".into(),
            message: Some("the engine does not accept connections yet".into()),
            ..Default::default()
        },
        devctl_api::database_cluster::InstanceSummary {
            name: "my-postgres-2".into(),
            ready: true,
            ..Default::default()
        },
    ];
    // Creating: not degraded yet.
    let status = compute(&sample(), &o, &now()).unwrap();
    assert_eq!(condition(&status, DEGRADED).status, FALSE);
    let status = compute(&served(&sts(3, 3, true)), &o, &now()).unwrap();
    let degraded = condition(&status, DEGRADED);
    assert_eq!(degraded.reason, INSTANCES_UNAVAILABLE);
    assert!(
        degraded
            .message
            .starts_with("2/3 instances ready; my-postgres-1"),
        "{}",
        degraded.message
    );
    // A primary that does not accept connections says more.
    o.instances.summaries[0].ready = false;
    let status = compute(&served(&sts(3, 3, true)), &o, &now()).unwrap();
    let degraded = condition(&status, DEGRADED);
    assert_eq!(degraded.reason, PRIMARY_UNAVAILABLE);
    assert!(
        degraded.message.contains("no automatic failover"),
        "{}",
        degraded.message
    );
    // While pods are replaced by a rollout, it is progress, not degradation.
    let rolling = sts(2, 3, false);
    let mut o = observed(Some(&rolling));
    o.instances.ready = 2;
    let status = compute(&served(&sts(3, 3, true)), &o, &now()).unwrap();
    assert_eq!(condition(&status, DEGRADED).status, FALSE);
}

#[test]
fn a_mariadb_primary_that_fell_back_to_asynchronous_replication_degrades_the_cluster() {
    let db = sample();
    let mut seen = observed(None);
    let status = compute(&db, &seen, &now()).unwrap();
    assert_ne!(
        condition(&status, DEGRADED).reason,
        SYNCHRONOUS_REPLICATION_DEGRADED
    );
    seen.synchronous_degraded = Some("the primary my-postgres-0 replicates asynchronously".into());
    let status = compute(&db, &seen, &now()).unwrap();
    let c = condition(&status, DEGRADED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        (TRUE, SYNCHRONOUS_REPLICATION_DEGRADED)
    );
    assert!(c.message.contains("asynchronously"), "{}", c.message);
}
