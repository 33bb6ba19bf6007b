//! Backups that restore (docs/backup.md), on process-backed pods with real PostgreSQL and
//! MariaDB and a real S3 store (versitygw over TLS): `devctl db backup`, WAL archiving,
//! `devctl db restore` with and without a target time, a store that goes down.

mod support;

use std::time::Duration;

use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use devctl_api::database_cluster::DatabaseCluster;
use devctl_testenv::s3::S3Server;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use support::backups::{BACKUP_TIMEOUT, backup_ok, newest_backup, restore_ok, spec, store_secrets};
use support::databases::{Env, READY_TIMEOUT};

const CHECKSUM: &str =
    "select count(*) || ':' || md5(coalesce(string_agg(v::text, ',' order by v), '')) from t";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_backups_restore_whole_and_to_a_point_in_time() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let env = Env::start("backup-pg").await;
    store_secrets(&env, s3).await;
    env.create_spec("pg", spec("postgres", "17.2", 3, s3)).await;
    env.wait_ready_with("pg", 3).await;
    env.shell_ok(
        "pg",
        "create table t (v int primary key); insert into t select generate_series(1, 1000)",
    )
    .await;

    // A: an on-demand backup, taken on a replica, stored with its WAL.
    let first = backup_ok(&env, "pg").await;
    let status = first.status.clone().unwrap();
    assert_eq!(status.phase, Some(BackupPhase::Completed));
    let instance = status.instance.clone().unwrap();
    assert_ne!(instance, "pg-0", "the backup should run on a replica");
    let prefix = status.prefix.clone().unwrap();
    let objects = s3.objects(&prefix);
    let names: Vec<&str> = objects.iter().map(|(k, _)| k.as_str()).collect();
    let base = format!("{prefix}base/{}/", status.backup_id.clone().unwrap());
    assert!(
        names.contains(&format!("{base}data.tar").as_str()),
        "{names:#?}"
    );
    assert!(
        names.contains(&format!("{base}backup.json").as_str()),
        "{names:#?}"
    );
    assert!(
        names
            .iter()
            .any(|n| n.starts_with(&format!("{prefix}wal/"))),
        "{names:#?}"
    );
    assert!(
        status.begin_lsn.is_some() && status.end_wal.is_some(),
        "{status:#?}"
    );
    // The cluster's controller records it from the agent's report, apart from the backup's.
    env.wait_db("pg", "status.lastBackup", |db| {
        db.status.as_ref().is_some_and(|s| s.last_backup.is_some())
    })
    .await;

    // Batch A, a point in time T, batch B, and at once the first backup replayed to T: the
    // WAL holding T is not in the store yet (it goes within archive_timeout), so the restore
    // waits for it rather than failing.
    env.shell_ok("pg", "insert into t select generate_series(1001, 1500)")
        .await;
    let after_a = env.instance_sql_ok("pg", "pg-0", CHECKSUM).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = k8s_openapi::jiff::Timestamp::now().to_string();
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.shell_ok("pg", "insert into t select generate_series(1501, 2000)")
        .await;
    let after_b = env.instance_sql_ok("pg", "pg-0", CHECKSUM).await;
    restore_ok(
        &env,
        "pg-pitr",
        &first.metadata.name.clone().unwrap(),
        Some(&t),
    )
    .await;
    assert_eq!(
        env.instance_sql_ok("pg-pitr", "pg-pitr-0", CHECKSUM).await,
        after_a,
        "point-in-time restore to {t}"
    );

    // The whole of a second backup.
    let second = backup_ok(&env, "pg").await;
    restore_ok(
        &env,
        "pg-copy",
        &second.metadata.name.clone().unwrap(),
        None,
    )
    .await;
    assert_eq!(
        env.instance_sql_ok("pg-copy", "pg-copy-0", CHECKSUM).await,
        after_b
    );

    // After a switchover (a new timeline), a backup still restores.
    let kubeconfig = env.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        support::devctl_ok(
            &kubeconfig,
            &["db", "promote", "pg", "pg-1", "--wait", "--timeout", "150"],
        )
    })
    .await
    .unwrap();
    env.shell_ok("pg", "insert into t values (-1)").await;
    let after_switch = env.instance_sql_ok("pg", "pg-1", CHECKSUM).await;
    let third = backup_ok(&env, "pg").await;
    assert!(third.status.as_ref().unwrap().timeline.unwrap_or(0) >= 2);
    restore_ok(&env, "pg-tl", &third.metadata.name.clone().unwrap(), None).await;
    assert_eq!(
        env.instance_sql_ok("pg-tl", "pg-tl-0", CHECKSUM).await,
        after_switch
    );

    // Once restored, the restore is history: the source store's credentials are taken back,
    // and deleting the backup it came from (retention does) degrades nothing.
    let secrets = env.api::<Secret>();
    devctl_testenv::eventually(
        "the restored cluster's restore-store Secret to be removed",
        Duration::from_secs(60),
        || async {
            secrets
                .get_opt("pg-tl-restore-store")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await
    .unwrap();
    env.api::<DatabaseBackup>()
        .delete(&third.metadata.name.clone().unwrap(), &Default::default())
        .await
        .unwrap();
    // A spec change, so the reconcile that follows the deletion is seen in observedGeneration.
    let changed = env
        .api::<DatabaseCluster>()
        .patch(
            "pg-tl",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "spec": { "backup": { "keepLast": 9 } } })),
        )
        .await
        .unwrap()
        .metadata
        .generation;
    let db = env
        .wait_db("pg-tl", "the spec change reconciled", |db| {
            db.status.as_ref().and_then(|s| s.observed_generation) == changed
        })
        .await;
    let degraded = support::databases::condition(&db, "Degraded");
    assert!(
        degraded
            .as_ref()
            .is_some_and(|(s, r, _)| s == "False" || r != "RestoreSourceUnavailable"),
        "{degraded:?}"
    );

    // Its DatabaseBackup is gone, its files are not: `recovery.source` with the store and the
    // backup's id alone (the operator finds the cluster and system identifier in the store).
    let backup_id = third.status.as_ref().unwrap().backup_id.clone().unwrap();
    let mut from_store = spec("postgres", "17.2", 1, s3);
    from_store["bootstrap"] = json!({ "recovery": { "source": {
        "destination": from_store["backup"]["destination"].clone(),
        "backupId": backup_id,
    } } });
    env.create_spec("pg-store", from_store).await;
    env.wait_ready_with("pg-store", 1).await;
    assert_eq!(
        env.instance_sql_ok("pg-store", "pg-store-0", CHECKSUM)
            .await,
        after_switch
    );

    env.assert_never_shown(s3.secret_access_key()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_fails_the_backup_and_both_conditions_clear_when_it_returns() {
    // Its own store: stopping it must not disturb the other tests.
    let s3 = S3Server::start().await.unwrap();
    let env = Env::start("backup-down").await;
    store_secrets(&env, &s3).await;
    env.create_spec("down", spec("postgres", "16.2", 1, &s3))
        .await;
    env.wait_ready_with("down", 1).await;
    env.shell_ok("down", "create table t (v int); insert into t values (1)")
        .await;
    // A cluster that has run a while has archived WAL (so its agent knows the store):
    // one segment reaches the archive before the store goes down.
    env.superuser_sql("down-0", "select pg_switch_wal()").await;
    devctl_testenv::eventually("a segment archived", Duration::from_secs(60), || async {
        env.report("down-0")
            .await
            .wal_archive
            .and_then(|a| a.last_archived)
    })
    .await
    .unwrap();
    // BackupFailing stands until WAL archiving fails too (it outranks a failed backup):
    // watched from before the store goes down.
    let since = env.mark_db("down").await;
    s3.stop().await.unwrap();

    let kubeconfig = env.kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || {
        support::devctl(
            &kubeconfig,
            &[
                "db",
                "backup",
                "down",
                "--wait",
                "--timeout",
                BACKUP_TIMEOUT,
            ],
        )
    })
    .await
    .unwrap();
    assert!(!out.status.success(), "{}", support::stdout(&out));
    let failed = newest_backup(&env, "down").await;
    let status = failed.status.unwrap();
    assert_eq!(
        status.phase,
        Some(BackupPhase::Failed),
        "the CLI said: {}{}\nthe agent's log ends: {}",
        support::stdout(&out),
        support::stderr(&out),
        env.agent_log("down-0")
    );
    let message = status.message.unwrap_or_default();
    assert!(!message.is_empty());
    assert!(
        support::stderr(&out).contains(&message),
        "the CLI shows the reason: {}",
        support::stderr(&out)
    );
    // Published right after the Failed phase the CLI waited for.
    devctl_testenv::eventually("a BackupFailed event", Duration::from_secs(30), || async {
        env.api::<Event>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("BackupFailed"))
            .then_some(())
    })
    .await
    .unwrap();
    let degraded = |reason: &'static str| {
        move |db: &DatabaseCluster| {
            support::databases::condition(db, "Degraded")
                .is_some_and(|(s, r, _)| s == "True" && r == reason)
        }
    };
    env.wait_db_since(&since, "Degraded BackupFailing", degraded("BackupFailing"))
        .await;
    // WAL keeps coming; archiving it fails while the store is down.
    env.shell_ok("down", "insert into t select generate_series(1, 100000)")
        .await;
    env.wait_db(
        "down",
        "Degraded WALArchivingFailing",
        degraded("WALArchivingFailing"),
    )
    .await;
    // Each has its own condition too: both stand while the store is down (Degraded names one).
    let failing = |want: &'static str| {
        move |db: &DatabaseCluster| {
            ["BackupFailing", "WALArchivingFailing"]
                .iter()
                .all(|type_| {
                    support::databases::condition(db, type_)
                        .is_some_and(|(s, r, _)| s == want && (want == "False" || r == *type_))
                })
        }
    };
    env.wait_db(
        "down",
        "BackupFailing=True and WALArchivingFailing=True",
        failing("True"),
    )
    .await;
    // Nothing half-written is reported complete.
    assert!(
        s3.objects("")
            .iter()
            .all(|(k, _)| !k.ends_with("backup.json")),
        "{:?}",
        s3.objects("")
    );

    // Both clear when the store returns, before any new backup: WAL reaches it again.
    s3.restart().await.unwrap();
    env.shell_ok("down", "insert into t select generate_series(1, 500000)")
        .await;
    let back = env
        .wait_db(
            "down",
            "BackupFailing=False and WALArchivingFailing=False once the store is back",
            failing("False"),
        )
        .await;
    let (_, reason, message) = support::databases::condition(&back, "BackupFailing").unwrap();
    assert_eq!(reason, "StoreReturned", "{message}");
    let ok = backup_ok(&env, "down").await;
    assert_eq!(ok.status.unwrap().phase, Some(BackupPhase::Completed));
    env.wait_db("down", "not Degraded", |db| {
        support::databases::condition(db, "Degraded").is_some_and(|(s, _, _)| s == "False")
    })
    .await;
    env.assert_never_shown(s3.secret_access_key()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_dump_and_restore_round_trip() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let env = Env::start("backup-my").await;
    store_secrets(&env, s3).await;
    env.create_spec("my", spec("mysql", "8.0", 1, s3)).await;
    env.wait_ready_with("my", 1).await;
    env.shell_ok(
        "my",
        "create table t (v int primary key); insert into t values (1),(2),(3),(42)",
    )
    .await;
    let sum = "select concat(count(*), ':', md5(group_concat(v order by v))) from t";
    let before = env.shell_ok("my", sum).await;
    let backup = backup_ok(&env, "my").await;
    assert_eq!(
        backup.status.as_ref().unwrap().phase,
        Some(BackupPhase::Completed)
    );
    restore_ok(
        &env,
        "my-copy",
        &backup.metadata.name.clone().unwrap(),
        None,
    )
    .await;
    assert_eq!(env.shell_ok("my-copy", sum).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_left_behind_past_its_slot_catches_up_from_the_archive() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let env = Env::start("backup-lag").await;
    store_secrets(&env, s3).await;
    let mut spec = spec("postgres", "16.2", 2, s3);
    // A 256Mi volume: the primary keeps at most 64 MB of WAL for a replica's slot.
    spec["storage"]["size"] = json!("256Mi");
    spec["backup"]["destination"]["path"] = json!("lag");
    env.create_spec("lag", spec).await;
    env.wait_ready_with("lag", 2).await;
    env.shell_ok(
        "lag",
        "create table t (v int); insert into t select generate_series(1, 100)",
    )
    .await;
    let rows = env.leave_replica_behind("lag-0", "lag-1").await;
    assert_eq!(rows, 124);
    // The segments it needs come from the archive; then it streams again, never re-cloned.
    devctl_testenv::eventually("lag-1 to hold every row", READY_TIMEOUT, || async {
        let out = env
            .instance_sql("lag", "lag-1", "select count(*) from t")
            .await;
        (support::stdout(&out).trim() == rows.to_string()).then_some(())
    })
    .await
    .unwrap();
    env.wait_ready_with("lag", 2).await;
    assert!(
        env.agent_log_all("lag-1")
            .contains("standby catching up from the archive"),
        "lag-1 did not fetch from the archive:\n{}",
        env.agent_log("lag-1")
    );
    assert!(env.events("Recloned").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_backup_report_deletes_nothing_and_fails_the_backup() {
    use devctl_api::instance::{BackupReport, InstanceStatus, STATUS_ANNOTATION};
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let env = Env::start("backup-forged").await;
    store_secrets(&env, s3).await;
    // Two clusters under one destination: fv is the victim, fa's pod the forger.
    for name in ["fv", "fa"] {
        let mut spec = spec("postgres", "16.2", 1, s3);
        spec["backup"]["destination"]["path"] = json!("forged");
        env.create_spec(name, spec).await;
    }
    env.wait_ready_with("fv", 1).await;
    env.wait_ready_with("fa", 1).await;
    let victim = backup_ok(&env, "fv").await;
    let victim_prefix = victim.status.unwrap().prefix.unwrap();
    let before = s3.objects(&victim_prefix);
    assert!(!before.is_empty());

    // fa's backup, held running: its only pod frozen first, so the agent never starts it and
    // nothing but the forgery writes the report.
    let runner = env.cluster.pod_runner().unwrap();
    runner.freeze(&env.namespace, "fa-0").unwrap();
    let backups = env.api::<DatabaseBackup>();
    let forged: DatabaseBackup = serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseBackup",
        "metadata": { "name": "fa-forged" },
        "spec": { "cluster": { "name": "fa" } },
    }))
    .unwrap();
    backups
        .create(&PostParams::default(), &forged)
        .await
        .unwrap();
    let running = devctl_testenv::eventually("fa-forged to run", READY_TIMEOUT, || async {
        let b = backups.get("fa-forged").await.ok()?;
        let status = b.status.clone()?;
        (status.phase == Some(BackupPhase::Running) && status.instance.is_some()).then_some(b)
    })
    .await
    .unwrap();
    let status = running.status.clone().unwrap();
    let instance = status.instance.clone().unwrap();
    assert_eq!(instance, "fa-0");
    let pods = env.api::<Pod>();
    let pod = pods.get(&instance).await.unwrap();
    let mut report = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref()).unwrap();
    report.backup = Some(BackupReport {
        name: "fa-forged".into(),
        uid: running.metadata.uid.clone().unwrap(),
        backup_id: status.backup_id.clone().unwrap(),
        phase: "Completed".into(),
        prefix: Some(victim_prefix.clone()),
        begin_wal: Some("../x".into()),
        end_wal: Some("FFFFFFFFFFFFFFFFFFFFFFFF".into()),
        ..BackupReport::default()
    });
    let patch = json!({ "metadata": { "annotations": {
        STATUS_ANNOTATION: serde_json::to_string(&report).unwrap()
    } } });
    pods.patch(&instance, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();

    let failed = devctl_testenv::eventually("fa-forged to fail", READY_TIMEOUT, || async {
        let b = backups.get("fa-forged").await.ok()?;
        let status = b.status.clone()?;
        status.phase.filter(|p| p.is_final()).map(|_| status)
    })
    .await
    .unwrap();
    runner.thaw(&env.namespace, &instance).unwrap();
    assert_eq!(failed.phase, Some(BackupPhase::Failed), "{failed:#?}");
    assert!(
        failed
            .message
            .as_deref()
            .is_some_and(|m| m.contains("invalid report") && m.contains(&victim_prefix)),
        "{failed:#?}"
    );
    assert_ne!(failed.prefix.as_deref(), Some(victim_prefix.as_str()));
    let events =
        devctl_testenv::eventually("an InvalidBackupReport event", READY_TIMEOUT, || async {
            let found = env.events("InvalidBackupReport").await;
            (!found.is_empty()).then_some(found)
        })
        .await
        .unwrap();
    assert_eq!(
        events[0].regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("fa-forged")
    );
    assert_eq!(
        s3.objects(&victim_prefix),
        before,
        "the victim's files changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_a_restore_to_the_end_of_the_archive_has_every_acknowledged_row() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let env = Env::start("backup-gap").await;
    store_secrets(&env, s3).await;
    let runner = env.cluster.pod_runner().unwrap();
    // archive_timeout an hour: what the primary wrote last is in no archived segment when
    // it dies (set before the pods start: the engine reads it at its start).
    for pod in ["gap-0", "gap-1", "gap-2"] {
        runner
            .set_agent_hooks(&env.namespace, pod, "archive-timeout-s=3600")
            .unwrap();
    }
    let mut spec = spec("postgres", "16.2", 3, s3);
    spec["backup"]["destination"]["path"] = json!("gap");
    spec["highAvailability"] = json!({ "enabled": true, "failoverTimeout": "10s" });
    spec["replication"] = json!({ "synchronous": { "method": "any", "number": 1 } });
    env.create_spec("gap", spec).await;
    env.wait_ready_with("gap", 3).await;
    env.shell_ok(
        "gap",
        "create table t (v int primary key); insert into t select generate_series(1, 100)",
    )
    .await;
    let before = backup_ok(&env, "gap").await;
    // Acknowledged by a synchronous standby, then the primary dies before archiving them.
    env.shell_ok("gap", "insert into t select generate_series(101, 300)")
        .await;
    runner.kill_and_hold(&env.namespace, "gap-0").unwrap();
    devctl_testenv::eventually("a new primary", READY_TIMEOUT, || async {
        let db = env.api::<DatabaseCluster>().get("gap").await.ok()?;
        let status = db.status?;
        (status.current_primary.as_deref() != Some("gap-0") && status.failed_primary.is_none())
            .then_some(())
    })
    .await
    .unwrap();
    let filled = devctl_testenv::eventually("an ArchiveGapFilled event", READY_TIMEOUT, || async {
        let found = env.events("ArchiveGapFilled").await;
        (!found.is_empty()).then_some(found)
    })
    .await
    .unwrap();
    assert!(env.events("ArchiveGap").await.is_empty(), "{filled:#?}");

    // The backup from before the failover, restored to the end of the archive: every row.
    restore_ok(
        &env,
        "gap-restored",
        &before.metadata.name.clone().unwrap(),
        None,
    )
    .await;
    assert_eq!(
        env.shell_ok("gap-restored", "select count(*), max(v) from t")
            .await
            .split_whitespace()
            .filter(|w| w.chars().all(|c| c.is_ascii_digit()))
            .collect::<Vec<_>>(),
        ["300", "300"]
    );
    runner.release(&env.namespace, "gap-0").unwrap();
}
