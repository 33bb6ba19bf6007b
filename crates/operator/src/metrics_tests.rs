//! Reconcile metrics under controller-runtime's names, and each cluster's series: read from
//! its status, dropped when they no longer apply or when the lease is lost.

use super::*;

#[test]
fn reconciles_are_counted_with_controller_runtime_names() {
    let metrics = Metrics::default();
    metrics.reconciled("databasecluster", true, Duration::from_millis(12));
    metrics.reconciled("databasecluster", false, Duration::from_millis(3));
    metrics.set_leader("devctl-operator", true);
    {
        let _a = metrics.start_reconcile("webapp");
        let _b = metrics.start_reconcile("webapp");
    }
    let _c = metrics.start_reconcile("webapp");
    metrics.set_max_concurrent("webapp", 4);
    let text = metrics.encode();
    for series in [
        r#"workqueue_retries_total{name="webapp"} 0"#,
        r#"workqueue_adds_total{name="webapp"} 0"#,
        r#"workqueue_depth{name="webapp"} 0"#,
    ] {
        assert!(text.contains(series), "{series} before any retry: {text}");
    }
    assert!(
        text.contains(r#"controller_runtime_reconcile_errors_total{controller="webapp"} 0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"devctl_reconciles_in_flight{controller="webapp"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"devctl_reconciles_in_flight_max{controller="webapp"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"controller_runtime_reconcile_total{controller="databasecluster",result="success"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"controller_runtime_reconcile_errors_total{controller="databasecluster"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains("controller_runtime_reconcile_time_seconds_bucket"),
        "{text}"
    );
    assert!(
        text.contains(r#"leader_election_master_status{name="devctl-operator"} 1"#),
        "{text}"
    );
}

fn snapshot(phase: &'static str, lag: &[(&str, i64)]) -> ClusterSnapshot {
    ClusterSnapshot {
        phase: Some(phase),
        created: Some(1_700_000_000.0),
        desired_replicas: 2,
        replicas: 2,
        ready_replicas: 1,
        lag_bytes: lag.iter().map(|(p, l)| (p.to_string(), *l)).collect(),
        lag_seconds: lag
            .iter()
            .map(|(p, l)| (p.to_string(), *l / 1000))
            .collect(),
        engine_restarts: lag.iter().map(|(p, _)| (p.to_string(), 1)).collect(),
        last_backup: Some(1_700_000_100.5),
        next_scheduled_backup: Some(1_700_086_400.0),
        schedule: Some("0 2 * * *".into()),
        failover_epoch: 2,
        last_failover: Some(1_700_000_200.0),
        last_failover_steps: vec![("elect", 1.5), ("promote", 2.25)],
    }
}

fn now() -> Timestamp {
    "2026-11-30T12:00:00Z"
        .parse()
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

#[test]
fn a_cluster_exports_its_status_and_drops_what_no_longer_applies() {
    let metrics = Metrics::default();
    metrics.set_cluster("ns", "db", &snapshot("Creating", &[("db-1", 7)]), now());
    metrics.set_cluster("ns", "other", &snapshot("Running", &[]), now());
    metrics.set_cluster("ns", "db", &snapshot("Running", &[("db-2", 9)]), now());
    let text = metrics.encode();
    for line in [
        r#"devctl_clusters{namespace="ns",phase="Running"} 2"#,
        r#"devctl_cluster_phase{namespace="ns",cluster="db",phase="Running"} 1"#,
        r#"devctl_cluster_replication_lag_bytes{namespace="ns",cluster="db",pod="db-2"} 9"#,
        r#"devctl_cluster_engine_restarts{namespace="ns",cluster="db",pod="db-2"} 1"#,
        r#"devctl_cluster_ready_replicas{namespace="ns",cluster="db"} 1"#,
        r#"devctl_cluster_desired_replicas{namespace="ns",cluster="db"} 2"#,
        r#"devctl_cluster_last_backup_timestamp_seconds{namespace="ns",cluster="db"} 1700000100.5"#,
        r#"devctl_cluster_backup_schedule_interval_seconds{namespace="ns",cluster="db"} 86400.0"#,
        r#"devctl_cluster_failovers_total{namespace="ns",cluster="db"} 2"#,
        r#"devctl_cluster_last_failover_timestamp_seconds{namespace="ns",cluster="db"} 1700000200.0"#,
        r#"devctl_cluster_last_failover_seconds{namespace="ns",cluster="db",phase="elect"} 1.5"#,
        r#"devctl_cluster_last_failover_seconds{namespace="ns",cluster="db",phase="promote"} 2.25"#,
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    assert!(!text.contains(r#"phase="Creating""#), "{text}");
    assert!(!text.contains(r#"pod="db-1""#), "{text}");

    // A later failover counts on; backups turned off take their series along.
    let mut later = snapshot("Running", &[("db-2", 9)]);
    later.failover_epoch = 3;
    later.schedule = None;
    later.last_backup = None;
    // A new record whose steps are not all reached: its earlier steps' series go.
    later.last_failover_steps = vec![("elect", 0.5)];
    metrics.set_cluster("ns", "db", &later, now());
    let text = metrics.encode();
    assert!(!text.contains(r#"cluster="db",phase="promote""#), "{text}");
    assert!(
        text.contains(r#"devctl_cluster_failovers_total{namespace="ns",cluster="db"} 3"#),
        "{text}"
    );
    assert!(
        !text.contains(
            r#"devctl_cluster_backup_schedule_interval_seconds{namespace="ns",cluster="db"}"#
        ),
        "{text}"
    );
    assert!(
        !text.contains(
            r#"devctl_cluster_last_backup_timestamp_seconds{namespace="ns",cluster="db"}"#
        ),
        "{text}"
    );

    metrics.forget_cluster("ns", "db");
    let text = metrics.encode();
    assert!(!text.contains(r#"cluster="db""#), "{text}");
    assert!(
        text.contains(r#"devctl_clusters{namespace="ns",phase="Running"} 1"#),
        "{text}"
    );
    metrics.forget_cluster("ns", "other");
    assert!(!metrics.encode().contains(r#"namespace="ns""#));
}

#[test]
fn losing_the_lease_drops_every_cluster() {
    let metrics = Metrics::default();
    metrics.set_leader("devctl-operator", true);
    metrics.set_cluster("ns", "db", &snapshot("Running", &[("db-1", 1)]), now());
    metrics.set_leader("devctl-operator", false);
    let text = metrics.encode();
    assert!(!text.contains(r#"namespace="ns""#), "{text}");
}

#[test]
fn the_schedule_interval_is_the_longest_gap() {
    assert_eq!(schedule_interval("0 2 * * *", now()), Some(86_400.0));
    assert_eq!(schedule_interval("*/15 * * * *", now()), Some(900.0));
    // Weekdays only: Friday's run to Monday's.
    assert_eq!(
        schedule_interval("0 2 * * 1-5", now()),
        Some(3.0 * 86_400.0)
    );
    assert_eq!(schedule_interval("not a schedule", now()), None);
}

#[test]
fn a_snapshot_reads_the_status() {
    use devctl_api::database_cluster::{DatabaseClusterStatus, InstanceSummary, Phase};
    let db: DatabaseCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "db", "namespace": "ns", "creationTimestamp": "2026-11-30T10:00:00Z" },
        "spec": { "engine": "postgres", "version": "16.2", "replicas": 3,
                  "storage": { "size": "1Gi" }, "backup": { "schedule": "0 * * * *" } },
    }))
    .unwrap();
    let status = DatabaseClusterStatus {
        phase: Some(Phase::Running),
        ready_replicas: 3,
        replicas: 3,
        last_backup: Some("2026-11-30T11:00:05Z".into()),
        instances: vec![
            InstanceSummary {
                name: "db-0".into(),
                ..Default::default()
            },
            InstanceSummary {
                name: "db-1".into(),
                lag_bytes: Some(0),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let snapshot = ClusterSnapshot::of(&db, &status);
    assert_eq!(snapshot.phase, Some("Running"));
    assert_eq!(snapshot.created, Some(1_796_032_800.0));
    assert_eq!(snapshot.desired_replicas, 3);
    assert_eq!(snapshot.lag_bytes, vec![("db-1".to_string(), 0)]);
    assert_eq!(snapshot.last_backup, Some(1_796_036_405.0));
    assert_eq!(snapshot.schedule.as_deref(), Some("0 * * * *"));
    assert_eq!(snapshot.failover_epoch, 0);
    assert_eq!(snapshot.last_failover, None);
}

#[test]
fn a_flight_record_gives_the_duration_of_each_step_it_reached() {
    let record = devctl_api::database_cluster::FailoverRecord {
        reason: devctl_api::database_cluster::FailoverReason::PrimaryLost,
        failed_primary: "db-0".into(),
        new_primary: Some("db-1".into()),
        primary_last_seen_at: None,
        detected_at: "2026-12-06T12:00:00.000Z".into(),
        elected_at: Some("2026-12-06T12:00:01.250Z".into()),
        promoted_at: Some("2026-12-06T12:00:03.000Z".into()),
        service_switched_at: None,
    };
    assert_eq!(
        failover_steps(&record),
        [("elect", 1.25), ("promote", 1.75)]
    );
    let switched = devctl_api::database_cluster::FailoverRecord {
        service_switched_at: Some("2026-12-06T12:00:03.100Z".into()),
        ..record
    };
    let steps = failover_steps(&switched);
    assert_eq!(steps.len(), 4);
    assert!(
        (steps[2].1 - 0.1).abs() < 1e-9 && (steps[3].1 - 3.1).abs() < 1e-9,
        "{steps:?}"
    );
    // A failover the lock decided also knows when the primary was last seen: detect runs
    // from there, and so does the total.
    let lost = devctl_api::database_cluster::FailoverRecord {
        primary_last_seen_at: Some("2026-12-06T11:59:50.000Z".into()),
        ..switched
    };
    let steps = failover_steps(&lost);
    assert_eq!(
        steps.iter().map(|(step, _)| *step).collect::<Vec<_>>(),
        FAILOVER_STEPS
    );
    assert!(
        (steps[0].1 - 10.0).abs() < 1e-9 && (steps[4].1 - 13.1).abs() < 1e-9,
        "{steps:?}"
    );
}
