//! PostgreSQL major version upgrades in place (docs/major-upgrade.md), on process-backed pods
//! running the binaries of the major their image declares (Debian's 15; 17 and 18 from
//! `tools/install-postgres-majors.sh`), the operator in-process and a real S3 store:
//! `kubectl patch` of `spec.version` to a higher major, a refused `pg_upgrade --check`, a
//! failure after the stop that goes back to the old major, and link mode.

mod support;

use std::time::Duration;

use devctl_api::database_backup::DatabaseBackup;
use devctl_api::database_cluster::{DatabaseCluster, MajorUpgradeStep};
use serde_json::json;
use support::backups::{backup_ok, restore_ok, spec, store_secrets};
use support::databases::{Env, condition};

/// From the patch to every instance ready on the new major (the bound).
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(300);

const COUNT: &str = "select count(*) || ':' || coalesce(sum(v), 0) from t";

/// `kubectl patch` of `spec.version`, as a user runs it.
fn patch_version(env: &Env, name: &str, version: &str, extra: serde_json::Value) {
    let mut patch = json!({ "spec": { "version": version } });
    if let Some(extra) = extra.as_object() {
        for (k, v) in extra {
            patch["spec"][k] = v.clone();
        }
    }
    let out = env
        .cluster
        .kubectl()
        .args([
            "--kubeconfig",
            &env.kubeconfig.display().to_string(),
            "patch",
            "databasecluster",
            name,
            "--type=merge",
            "-p",
            &patch.to_string(),
        ])
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl patch {name} to {version}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits (up to [`UPGRADE_TIMEOUT`]) for `what` on the cluster, with its status and the
/// instances' logs when it does not come.
async fn wait_for(
    env: &Env,
    name: &str,
    pods: &[&str],
    what: &str,
    check: impl Fn(&DatabaseCluster) -> bool,
) -> DatabaseCluster {
    let api = env.api::<DatabaseCluster>();
    let found = devctl_testenv::eventually(what, UPGRADE_TIMEOUT, || async {
        let db = api.get(name).await.ok()?;
        check(&db).then_some(db)
    })
    .await;
    match found {
        Ok(db) => db,
        Err(e) => {
            let status = api.get(name).await.ok().and_then(|d| d.status);
            let logs: String = pods
                .iter()
                .map(|p| format!("--- {p}:\n{}\n", env.agent_log(p)))
                .collect();
            panic!("{name}: {e}\nstatus: {status:#?}\n{logs}")
        }
    }
}

fn running(db: &DatabaseCluster, version: &str) -> bool {
    support::databases::ready(db)
        && db.status.as_ref().is_some_and(|s| {
            s.current_version.as_deref() == Some(version)
                && s.major_upgrade.is_none()
                && s.ready_replicas == db.spec.replicas
        })
        && db.status.as_ref().and_then(|s| s.observed_generation) == db.metadata.generation
}

fn server_major(version: &str) -> &str {
    version.split('.').next().unwrap_or_default()
}

/// `server_version_num` of `pod`'s engine (e.g. `170011`).
async fn server_version(env: &Env, name: &str, pod: &str) -> String {
    env.instance_sql_ok(name, pod, "select current_setting('server_version_num')")
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_upgrade_from_15_to_17_with_every_row_and_a_backup_first() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let env = Env::start("major-up").await;
    store_secrets(&env, s3).await;
    let mut cluster = spec("postgres", "15.8", 3, s3);
    cluster["backup"]["destination"]["path"] = json!("major");
    env.create_spec("up", cluster).await;
    env.wait_ready_with("up", 3).await;
    env.shell_ok(
        "up",
        "create table t (v int primary key); insert into t select generate_series(1, 10000); create index t_v_mod on t ((v % 7))",
    )
    .await;
    let before = env.instance_sql_ok("up", "up-0", COUNT).await;
    backup_ok(&env, "up").await;
    // The primary elsewhere than at ordinal 0: the upgrade moves it back there first.
    env.devctl_ok(&["db", "promote", "up", "up-2", "--wait", "--timeout", "150"])
        .await;

    patch_version(&env, "up", "17.2", json!({}));
    // Under way: the step is in the status and in `devctl db status`.
    let db = wait_for(&env, "up", &["up-0"], "the upgrade to start", |db| {
        db.status
            .as_ref()
            .is_some_and(|s| s.major_upgrade.is_some())
    })
    .await;
    let upgrade = db.status.as_ref().unwrap().major_upgrade.clone().unwrap();
    assert_eq!(
        (upgrade.from.as_str(), upgrade.to.as_str()),
        ("15.8", "17.2")
    );
    let shown = env.devctl_ok(&["db", "status", "up"]).await;
    assert!(
        shown.contains("Upgrade:     15.8 -> 17.2 (copy)"),
        "{shown}"
    );

    let started = std::time::Instant::now();
    let db = wait_for(
        &env,
        "up",
        &["up-0", "up-1", "up-2"],
        "every instance ready on 17.2",
        |db| running(db, "17.2"),
    )
    .await;
    eprintln!("upgraded in {} s", started.elapsed().as_secs());
    let (status, reason, _) = condition(&db, "Ready").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Ready"));

    // Every row, on every instance, each running 17; the replicas stream from the primary.
    for pod in ["up-0", "up-1", "up-2"] {
        let version = server_version(&env, "up", pod).await;
        assert!(version.starts_with("17"), "{pod} runs {version}");
        assert_eq!(env.instance_sql_ok("up", pod, COUNT).await, before, "{pod}");
    }
    let primary = db.status.as_ref().unwrap().current_primary.clone().unwrap();
    assert_eq!(
        primary, "up-0",
        "the upgrade moves the primary to ordinal 0"
    );
    let streaming = env
        .superuser_sql(
            &primary,
            "select count(*) from pg_stat_replication where state = 'streaming'",
        )
        .await;
    assert_eq!(streaming.trim(), "2", "replicas streaming from {primary}");
    // The planner statistics are rebuilt in the background and the old data directory goes
    // once the upgrade is confirmed.
    devctl_testenv::eventually(
        "vacuumdb --analyze-in-stages to run on the new primary",
        Duration::from_secs(60),
        || async {
            env.agent_log_all(&primary)
                .contains("statistics rebuilt")
                .then_some(())
        },
    )
    .await
    .unwrap();

    // The backup taken first is kept by retention, and named for the upgrade.
    let backups = env.api::<DatabaseBackup>();
    let first = backups.get("up-pre-upgrade-15-17").await.unwrap();
    assert_eq!(
        first
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .get("db.devctl.io/keep")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(
        first
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map(|p| p.as_str()),
        Some("Completed")
    );
    for reason in ["MajorUpgradeStarted", "MajorUpgradeCompleted"] {
        assert!(!env.events(reason).await.is_empty(), "no {reason} event");
    }

    // Writes go on, and a backup taken after the upgrade restores on 17.
    env.shell_ok("up", "insert into t values (10001)").await;
    let after = env.instance_sql_ok("up", &primary, COUNT).await;
    let later = backup_ok(&env, "up").await;
    restore_ok(&env, "up-copy", &later.metadata.name.clone().unwrap(), None).await;
    assert_eq!(
        env.instance_sql_ok("up-copy", "up-copy-0", COUNT).await,
        after
    );
    let restored = env.api::<DatabaseCluster>().get("up-copy").await.unwrap();
    assert_eq!(server_major(&restored.spec.version), "17");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_check_and_a_failed_upgrade_keep_15_and_link_mode_reaches_18() {
    let env = Env::start("major-one").await;
    env.create_spec(
        "one",
        json!({ "engine": "postgres", "version": "15.8", "replicas": 1, "storage": { "size": "1Gi" } }),
    )
    .await;
    env.wait_ready_with("one", 1).await;
    env.shell_ok(
        "one",
        "create table t (v int primary key); insert into t select generate_series(1, 1000)",
    )
    .await;
    // pg_upgrade refuses reg* types in user tables (their OIDs do not survive).
    env.superuser_sql(
        "one-0",
        "create table planted (f regproc); insert into planted values ('now')",
    )
    .await;
    let before = env.instance_sql_ok("one", "one-0", COUNT).await;

    // 1. Refused by pg_upgrade --check: still 15, every row, the reason in the conditions.
    patch_version(&env, "one", "17.2", json!({}));
    let db = wait_for(
        &env,
        "one",
        &["one-0"],
        "the upgrade refused and 15 back",
        |db| {
            db.status.as_ref().is_some_and(|s| {
                s.major_upgrade
                    .as_ref()
                    .is_some_and(|u| u.step == MajorUpgradeStep::Refused)
                    && s.ready_replicas == 1
            }) && condition(db, "Stalled")
                .is_some_and(|(s, r, _)| s == "True" && r == "MajorUpgradeRefused")
        },
    )
    .await;
    let (_, _, message) = condition(&db, "Degraded").unwrap();
    assert!(message.contains("reg"), "{message}");
    assert_eq!(
        db.status.as_ref().unwrap().current_version.as_deref(),
        Some("15.8")
    );
    let version = server_version(&env, "one", "one-0").await;
    assert!(version.starts_with("15"), "{version}");
    assert_eq!(env.instance_sql_ok("one", "one-0", COUNT).await, before);
    assert!(!env.events("MajorUpgradeFailed").await.is_empty());

    // 2. Fixed, but the step fails after the stop (injected): back on 15 with every row.
    env.superuser_sql("one-0", "drop table planted").await;
    let runner = env.cluster.pod_runner().unwrap();
    runner
        .set_agent_hooks(&env.namespace, "one-0", "major-upgrade=fail")
        .unwrap();
    patch_version(&env, "one", "17.4", json!({}));
    let db = wait_for(
        &env,
        "one",
        &["one-0"],
        "the upgrade failed and 15 back",
        |db| {
            db.status.as_ref().is_some_and(|s| {
                s.major_upgrade
                    .as_ref()
                    .is_some_and(|u| u.step == MajorUpgradeStep::Failed && u.to == "17.4")
                    && s.ready_replicas == 1
            })
        },
    )
    .await;
    let (status, reason, _) = condition(&db, "Degraded").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "MajorUpgradeFailed")
    );
    let version = server_version(&env, "one", "one-0").await;
    assert!(version.starts_with("15"), "{version}");
    assert_eq!(env.instance_sql_ok("one", "one-0", COUNT).await, before);

    // 3. Link mode to 18 (Debian's 15 has no data checksums, 18's initdb defaults to them).
    runner.set_agent_hooks(&env.namespace, "one-0", "").unwrap();
    patch_version(
        &env,
        "one",
        "18.1",
        json!({ "upgrade": { "method": "link" } }),
    );
    wait_for(&env, "one", &["one-0"], "ready on 18.1", |db| {
        running(db, "18.1")
    })
    .await;
    let version = server_version(&env, "one", "one-0").await;
    assert!(version.starts_with("18"), "{version}");
    assert_eq!(env.instance_sql_ok("one", "one-0", COUNT).await, before);
    env.shell_ok("one", "insert into t values (-1)").await;
}
