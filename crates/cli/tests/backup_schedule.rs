//! Scheduled backups, retention and the final backup (docs/backup.md), on process-backed
//! PostgreSQL with a real S3 store (versitygw).

mod support;

use std::time::{Duration, Instant};

use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use devctl_api::database_cluster::DatabaseCluster;
use devctl_testenv::s3::S3Server;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::databases::{Env, ready};

async fn store_secrets(env: &Env, s3: &S3Server) {
    let secrets = env.api::<Secret>();
    for (name, data) in [
        (
            "s3-credentials",
            json!({ "accessKeyId": s3.access_key_id(), "secretAccessKey": s3.secret_access_key() }),
        ),
        ("s3-ca", json!({ "ca.crt": s3.ca_pem() })),
    ] {
        let secret: Secret =
            serde_json::from_value(json!({ "metadata": { "name": name }, "stringData": data }))
                .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
}

fn destination(s3: &S3Server) -> serde_json::Value {
    json!({
        "endpoint": s3.endpoint(), "bucket": s3.bucket(), "path": "scheduled",
        "credentialsSecret": "s3-credentials", "caSecret": "s3-ca",
    })
}

async fn backups(env: &Env, cluster: &str) -> Vec<DatabaseBackup> {
    let mut list: Vec<DatabaseBackup> = env
        .api::<DatabaseBackup>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|b| b.spec.cluster.name == cluster && b.metadata.deletion_timestamp.is_none())
        .collect();
    list.sort_by_key(|b| b.metadata.name.clone());
    list
}

fn completed(b: &DatabaseBackup) -> bool {
    b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Completed)
}

async fn events(env: &Env, reason: &str) -> usize {
    env.events(reason).await.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_keeps_the_last_two_catches_up_once_and_pauses() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let mut env = Env::start("schedule").await;
    let audit = env
        .cluster
        .audit_log()
        .expect("the shared cluster logs audit events");
    let mark = audit.mark();
    store_secrets(&env, s3).await;
    env.create_spec(
        "sched",
        json!({
            "engine": "postgres", "version": "16.2", "replicas": 1,
            "storage": { "size": "1Gi" },
            "backup": { "enabled": true, "schedule": "* * * * *", "keepLast": 2, "destination": destination(s3) },
        }),
    )
    .await;
    env.wait_db("sched", "Ready", ready).await;
    env.shell_ok(
        "sched",
        "create table t (v int); insert into t select generate_series(1, 100)",
    )
    .await;

    // Two scheduled runs.
    devctl_testenv::eventually(
        "two scheduled backups",
        Duration::from_secs(200),
        || async { (events(&env, "ScheduledBackup").await >= 2).then_some(()) },
    )
    .await
    .unwrap();

    // The operator is down across two scheduled times: exactly one catch-up.
    env.stop_operator();
    let before: Vec<String> = backups(&env, "sched")
        .await
        .iter()
        .map(|b| b.metadata.name.clone().unwrap())
        .collect();
    tokio::time::sleep(Duration::from_secs(130)).await;
    let restarted = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y%m%d%H%M%S")
        .to_string();
    env.start_operator();
    devctl_testenv::eventually("the catch-up backup", Duration::from_secs(30), || async {
        // A new name, not a larger count: keepLast deletes the oldest once the new one is done.
        backups(&env, "sched")
            .await
            .iter()
            .any(|b| {
                b.metadata
                    .name
                    .as_ref()
                    .is_some_and(|n| !before.contains(n))
            })
            .then_some(())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    // New backups for scheduled times before the restart: the catch-up, once.
    let caught_up: Vec<String> = backups(&env, "sched")
        .await
        .iter()
        .filter_map(|b| b.metadata.name.clone())
        .filter(|n| !before.contains(n))
        .filter(|n| {
            n.rsplit('-')
                .next()
                .is_some_and(|t| *t <= *restarted.as_str())
        })
        .collect();
    assert_eq!(caught_up.len(), 1, "{caught_up:?}");

    // Four runs or more: keepLast 2 leaves exactly two, in the API and in the store, and the
    // WAL the older one needs. (Read together, again until they agree: a run every minute.)
    let wal_kept = |kept: &[DatabaseBackup]| {
        let oldest = kept[0].status.clone().unwrap_or_default();
        let (Some(prefix), Some(begin)) = (oldest.prefix, oldest.begin_wal) else {
            return false;
        };
        // Exactly the segment (a `<segment>.<offset>.backup` history file shares its prefix).
        let key = format!("{prefix}wal/{begin}");
        s3.objects(&key).iter().any(|(k, _)| *k == key)
    };
    let base_dirs = |kept: &[DatabaseBackup]| {
        let prefix = kept[0]
            .status
            .as_ref()
            .and_then(|s| s.prefix.clone())
            .unwrap_or_default();
        s3.objects(&format!("{prefix}base/"))
            .iter()
            .filter_map(|(k, _)| {
                k.strip_prefix(&format!("{prefix}base/"))?
                    .split('/')
                    .next()
                    .map(str::to_string)
            })
            .collect::<std::collections::BTreeSet<String>>()
            .len()
    };
    devctl_testenv::eventually(
        "retention to leave two completed backups with their WAL and two BackupExpired events",
        Duration::from_secs(240),
        || async {
            let all = backups(&env, "sched").await;
            let done = all.iter().filter(|b| completed(b)).count();
            // The event follows the deletion (the object is gone first): wait for both.
            (events(&env, "ScheduledBackup").await >= 4
                && events(&env, "BackupExpired").await >= 2
                && done == 2
                && all.len() == 2
                && base_dirs(&all) == 2
                && wal_kept(&all))
            .then_some(())
        },
    )
    .await
    .unwrap();

    // Retention read the DatabaseBackups from the backup controller's store: the operator
    // lists them when that watch starts (twice here: the operator was restarted) and at most
    // once more per start, by a reconcile that ran before the store's first list — not on
    // every reconcile of a cluster with backups on (dozens in this test).
    let requests = audit.requests_since(mark).unwrap();
    let operator = |r: &&devctl_testenv::audit::Request| {
        r.user == "devctl-operator-under-test"
            && r.namespace.as_deref() == Some(env.namespace.as_str())
    };
    let lists = requests
        .iter()
        .filter(operator)
        .filter(|r| r.verb == "list" && r.resource == "databasebackups")
        .count();
    let status_writes = requests
        .iter()
        .filter(operator)
        .filter(|r| r.resource == "databaseclusters" && r.subresource.as_deref() == Some("status"))
        .count();
    assert!(
        lists <= 4,
        "{lists} lists of DatabaseBackups by the operator ({status_writes} cluster status writes)"
    );

    // A finished backup is seen at once: its pod's report wakes it (the backup controller
    // looks by itself only every 30 s). Its `Ready` turns within seconds of the time the
    // agent stopped it.
    for backup in backups(&env, "sched").await.iter().filter(|b| completed(b)) {
        let status = backup.status.clone().unwrap_or_default();
        let stopped: k8s_openapi::jiff::Timestamp =
            status.stopped_at.as_deref().unwrap().parse().unwrap();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.last_transition_time.0)
            .unwrap();
        let seen_after = ready.duration_since(stopped).as_secs_f64();
        assert!(
            seen_after <= 8.0,
            "{}: Ready {seen_after} s after the agent stopped it",
            backup.metadata.name.as_deref().unwrap_or_default()
        );
    }

    // Paused: nothing is created or pruned any more, so the oldest kept backup stays put.
    env.api::<DatabaseCluster>()
        .patch(
            "sched",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "backup": { "enabled": false } } })),
        )
        .await
        .unwrap();
    let kept: Vec<DatabaseBackup> = backups(&env, "sched")
        .await
        .into_iter()
        .filter(completed)
        .collect();
    assert!(
        wal_kept(&kept),
        "the WAL the oldest kept backup needs is gone"
    );

    // The oldest kept backup restores.
    let kubeconfig = env.kubeconfig.clone();
    let from = kept[0].metadata.name.clone().unwrap();
    tokio::task::spawn_blocking(move || {
        support::devctl_ok(
            &kubeconfig,
            &[
                "db",
                "restore",
                "sched-copy",
                "--from",
                &from,
                "--wait",
                "--timeout",
                "400",
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(
        env.instance_sql_ok("sched-copy", "sched-copy-0", "select count(*) from t")
            .await,
        "100"
    );

    let paused_at = events(&env, "ScheduledBackup").await;
    tokio::time::sleep(Duration::from_secs(75)).await;
    assert_eq!(events(&env, "ScheduledBackup").await, paused_at);
    let db = env.api::<DatabaseCluster>().get("sched").await.unwrap();
    assert_eq!(db.status.unwrap().next_scheduled_backup, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_takes_a_final_backup_and_never_waits_past_the_bound() {
    let s3 = S3Server::start().await.unwrap();
    let env = Env::start("final").await;
    store_secrets(&env, &s3).await;
    // fin's bound leaves a loaded machine time for the backup; fin-down's is the one measured.
    let manifest = |bound: &str| {
        json!({
            "engine": "postgres", "version": "16.2", "replicas": 1,
            "storage": { "size": "1Gi" },
            "backup": {
                "enabled": true, "schedule": "0 3 * * *", "finalBackup": true, "keepLast": 1,
                "finalBackupTimeout": bound, "destination": destination(&s3),
            },
        })
    };
    for (name, bound) in [("fin", "150s"), ("fin-down", "40s")] {
        env.create_spec(name, manifest(bound)).await;
    }
    for name in ["fin", "fin-down"] {
        env.wait_db(name, "Ready", ready).await;
    }
    env.shell_ok(
        "fin",
        "create table t (v int); insert into t select generate_series(1, 42)",
    )
    .await;
    let dbs = env.api::<DatabaseCluster>();

    // Deleted with the store up: a final backup that outlives the cluster and restores.
    dbs.delete("fin", &DeleteParams::default()).await.unwrap();
    devctl_testenv::eventually("fin to be gone", Duration::from_secs(200), || async {
        dbs.get_opt("fin").await.unwrap().is_none().then_some(())
    })
    .await
    .unwrap();
    let last = env.api::<DatabaseBackup>().get("fin-final").await.unwrap();
    assert!(completed(&last), "{:?}", last.status);
    // The final backup holds the data: the volume goes with the cluster.
    let claims = env.api::<PersistentVolumeClaim>();
    devctl_testenv::eventually(
        "fin's claim to be deleted",
        Duration::from_secs(60),
        || async {
            claims
                .get_opt("data-fin-0")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await
    .unwrap();
    let kubeconfig = env.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        support::devctl_ok(
            &kubeconfig,
            &[
                "db",
                "restore",
                "fin-back",
                "--from",
                "fin-final",
                "--wait",
                "--timeout",
                "400",
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(
        env.instance_sql_ok("fin-back", "fin-back-0", "select count(*) from t")
            .await,
        "42"
    );

    // The same manifest applied again (as GitOps does): a new cluster of the old name backs
    // up with no change to its spec, beside the old one's files, and its retention
    // (keepLast: 1) never takes the old one's final backup.
    let final_status = last.status.clone().unwrap();
    let final_files = s3.objects(&format!(
        "{}base/{}/",
        final_status.prefix.clone().unwrap(),
        final_status.backup_id.clone().unwrap()
    ));
    assert!(!final_files.is_empty());
    env.create_spec("fin", manifest("150s")).await;
    env.wait_db("fin", "Ready", ready).await;
    env.shell_ok(
        "fin",
        "create table t (v int); insert into t select generate_series(1, 7)",
    )
    .await;
    for _ in 0..2 {
        env.devctl_ok(&["db", "backup", "fin", "--wait", "--timeout", "300"])
            .await;
    }
    let new_uid = dbs.get("fin").await.unwrap().metadata.uid.unwrap();
    devctl_testenv::eventually(
        "keepLast: 1 to expire the new cluster's first backup",
        Duration::from_secs(120),
        || async {
            let mine: Vec<DatabaseBackup> = backups(&env, "fin")
                .await
                .into_iter()
                .filter(|b| {
                    b.status.as_ref().and_then(|s| s.cluster_uid.as_deref())
                        == Some(new_uid.as_str())
                })
                .collect();
            (mine.len() == 1 && mine.iter().all(completed)).then_some(())
        },
    )
    .await
    .unwrap();
    let kept = env.api::<DatabaseBackup>().get("fin-final").await.unwrap();
    assert_ne!(
        kept.status.as_ref().and_then(|s| s.cluster_uid.as_deref()),
        Some(new_uid.as_str())
    );
    assert_eq!(
        s3.objects(&format!(
            "{}base/{}/",
            final_status.prefix.clone().unwrap(),
            final_status.backup_id.clone().unwrap()
        )),
        final_files,
        "the old cluster's final backup files changed"
    );
    env.devctl_ok(&[
        "db",
        "restore",
        "fin-again",
        "--from",
        "fin-final",
        "--wait",
        "--timeout",
        "400",
    ])
    .await;
    assert_eq!(
        env.instance_sql_ok("fin-again", "fin-again-0", "select count(*) from t")
            .await,
        "42"
    );

    // With the store down, deletion still finishes within the bound, with FinalBackupSkipped.
    s3.stop().await.unwrap();
    let started = Instant::now();
    dbs.delete("fin-down", &DeleteParams::default())
        .await
        .unwrap();
    devctl_testenv::eventually("fin-down to be gone", Duration::from_secs(120), || async {
        dbs.get_opt("fin-down")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(40 + 30),
        "{:?}",
        started.elapsed()
    );
    assert!(events(&env, "FinalBackupSkipped").await >= 1);
    // No final backup: the volume holds the only copy and is kept, and a Warning says so.
    assert!(events(&env, "VolumesKept").await >= 1);
    let kept = claims.get("data-fin-down-0").await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_none());
}
