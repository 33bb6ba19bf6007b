//! Replicated MariaDB on process-backed pods with Debian's MariaDB 10.11 (docs/mariadb.md):
//! GTID replication from clones streamed by `mariadb-backup`, read-only replicas, the `-rw`
//! and `-ro` Services by role, failover with semi-synchronous replication and errant
//! transactions, and switchover.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_testenv::workload::{self, Access, Writer};
use serde_json::json;
use support::databases::{Env, ready};

/// The failover timeout of every cluster here (the lock's duration).
const TIMEOUT: Duration = Duration::from_secs(10);

fn spec(replicas: i32, synchronous: bool) -> serde_json::Value {
    let mut spec = json!({
        "engine": "mariadb", "version": "10.11", "replicas": replicas,
        "storage": { "size": "1Gi" },
        "backup": { "enabled": false },
        "highAvailability": {
            "enabled": true,
            "failoverTimeout": format!("{}s", TIMEOUT.as_secs()),
        },
    });
    if synchronous {
        spec["replication"] = json!({ "synchronous": { "method": "any", "number": 1 } });
    }
    spec
}

/// `sql` as the app user on one instance (`devctl db shell --instance`), batch output.
async fn sql_on(env: &Env, name: &str, pod: &str, sql: &str) -> std::process::Output {
    env.devctl(&[
        "db",
        "shell",
        name,
        "--instance",
        pod,
        "--",
        "-N",
        "-B",
        "-c",
        sql,
    ])
    .await
}

async fn sql_ok(env: &Env, name: &str, pod: &str, sql: &str) -> String {
    let out = sql_on(env, name, pod, sql).await;
    assert!(
        out.status.success(),
        "{sql:?} on {pod} failed ({}):\n{}{}",
        out.status,
        support::stdout(&out),
        support::stderr(&out)
    );
    support::stdout(&out).trim().to_string()
}

/// Waits (bounded) until `sql` answers `expected` on `pod`.
async fn wait_answer(env: &Env, name: &str, pod: &str, sql: &str, expected: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = sql_on(env, name, pod, sql).await;
        let answer = support::stdout(&out).trim().to_string();
        if out.status.success() && answer == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{pod}: {sql:?} answered {answer:?} ({}), not {expected:?} within 60s\nagent log:\n{}",
            support::stderr(&out),
            env.agent_log(pod)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A writer committing a row every 50 ms through `-rw` of `name`, once it has 20
/// acknowledgements.
async fn writing(env: &Env, name: &str, password: &str) -> Writer {
    let writer = Writer::start_with(
        env.client.clone(),
        &env.namespace,
        name,
        Access::Mariadb(password.to_string()),
        1,
        Duration::from_millis(50),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while writer.acks().len() < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writer got no acknowledgements"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    writer
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn wait_endpoints(env: &Env, service: &str, expected: BTreeSet<String>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let found = env.endpoints(service).await;
        if found == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{service} points at {found:?}, not {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_replicate_by_gtid_and_replicas_refuse_writes() {
    let env = Env::start("maria").await;
    env.create_spec("m3", spec(3, true)).await;
    let db = env.wait_ready("m3").await;
    let status = db.status.clone().unwrap();
    assert_eq!(status.ready_replicas, 3, "{status:#?}");
    assert_eq!(status.current_primary.as_deref(), Some("m3-0"));

    sql_ok(
        &env,
        "m3",
        "m3-0",
        "CREATE TABLE t (v INT PRIMARY KEY, pod VARCHAR(64)); INSERT INTO t VALUES (1, 'm3-0')",
    )
    .await;
    for replica in ["m3-1", "m3-2"] {
        wait_answer(&env, "m3", replica, "SELECT pod FROM t WHERE v = 1", "m3-0").await;
        // Read-only binds the app user (no SUPER, no READ ONLY ADMIN).
        let out = sql_on(&env, "m3", replica, "INSERT INTO t VALUES (2, 'replica')").await;
        assert!(!out.status.success(), "a replica accepted a write");
        assert!(
            support::stderr(&out).contains("read-only")
                || support::stderr(&out).contains("read_only"),
            "{}",
            support::stderr(&out)
        );
    }
    wait_endpoints(&env, "m3-rw", set(&["m3-0"])).await;
    wait_endpoints(&env, "m3-ro", set(&["m3-1", "m3-2"])).await;

    // The replicas report their GTID position and lag; the primary lists them.
    let db = env
        .wait_db("m3", "the replicas report their GTID positions", |db| {
            db.status.as_ref().is_some_and(|s| {
                s.instances
                    .iter()
                    .filter(|i| i.name != "m3-0")
                    .all(|i| i.gtid_position.is_some() && i.lag_seconds.is_some())
            })
        })
        .await;
    assert!(ready(&db));
    let primary = env.report("m3-0").await;
    assert_eq!(
        primary.streaming_replicas,
        Some(vec!["m3-1".to_string(), "m3-2".to_string()])
    );
    assert_eq!(primary.semi_sync_active, Some(true), "{primary:?}");
    let out = env.devctl_ok(&["db", "status", "m3"]).await;
    assert!(out.contains("GTID") && out.contains("0-1-"), "{out}");

    // As a user creates one: the CLI, another series (Debian's 10.11 runs it here).
    env.devctl_ok(&[
        "db",
        "create",
        "solo",
        "--engine",
        "mariadb",
        "--version",
        "11.4",
        "--wait",
    ])
    .await;
    let solo = env.wait_ready("solo").await;
    assert_eq!(solo.spec.engine.as_str(), "mariadb");
    sql_ok(&env, "solo", "solo-0", "CREATE TABLE t (v INT PRIMARY KEY)").await;
}

/// The `reason` events, once there is at least one.
async fn wait_events(env: &Env, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
    devctl_testenv::eventually(
        &format!("a {reason} event"),
        support::databases::READY_TIMEOUT,
        || async {
            let found = env.events(reason).await;
            (!found.is_empty()).then_some(found)
        },
    )
    .await
    .unwrap()
}

/// Asks every instance `SELECT @@read_only` every 200 ms until stopped; returns the moments
/// two instances answered writable at once (never, for fenced failover).
fn probe_writable(
    env: &Env,
    name: &str,
    password: &str,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Vec<String>>,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let client = env.client.clone();
    let namespace = env.namespace.clone();
    let name = name.to_string();
    let access = Access::Mariadb(password.to_string());
    let task = tokio::spawn(async move {
        let mut both = Vec::new();
        while !*stopped.borrow() {
            let mut writable = Vec::new();
            for i in 0..3 {
                let pod = format!("{name}-{i}");
                if let Some(address) = workload::reported_address(&client, &namespace, &pod).await
                    && workload::sql_at(&access, &address, "SELECT @@read_only")
                        .await
                        .as_deref()
                        == Ok("0")
                {
                    writable.push(pod);
                }
            }
            if writable.len() > 1 {
                both.push(format!("{writable:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        both
    });
    (stop, task)
}

/// Runs a MariaDB server on the stopped instance `pod`'s data directory by hand (as an
/// administrator might on an isolated host) and commits `sql` there: a transaction that only
/// this instance has.
async fn plant_errant_transaction(env: &Env, pod: &str, sql: &str) {
    let runner = env.cluster.pod_runner().unwrap();
    let claim = runner
        .claim_dir(&env.namespace, &format!("data-{pod}"))
        .expect("the pod's claim");
    let data = claim.join("data");
    let socket = format!("/tmp/devctl-errant-{}.sock", std::process::id());
    let pid_file = format!("/tmp/devctl-errant-{}.pid", std::process::id());
    let mut server = tokio::process::Command::new("/usr/sbin/mariadbd");
    server.args([
        "--no-defaults",
        &format!("--datadir={}", data.display()),
        &format!("--socket={socket}"),
        &format!("--pid-file={pid_file}"),
        "--skip-networking",
        "--skip-grant-tables",
        "--log-bin=mysql-bin",
        "--relay-log=relay-bin",
        "--server-id=1",
        "--gtid-strict-mode=ON",
        "--log-slave-updates",
        "--binlog-format=ROW",
    ]);
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        server.arg("--user=mysql");
    }
    let mut server = server
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = |sql: String| {
        let socket = socket.clone();
        async move {
            tokio::process::Command::new("mariadb")
                .args([
                    "--no-defaults",
                    &format!("--socket={socket}"),
                    "-N",
                    "-B",
                    "-e",
                    &sql,
                ])
                .output()
                .await
                .unwrap()
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = client(sql.to_string()).await;
        if out.status.success() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "planting on {pod}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let out = client("SHUTDOWN".into()).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = tokio::time::timeout(Duration::from_secs(60), server.wait())
        .await
        .expect("the hand-run server stops")
        .unwrap();
    assert!(status.success(), "the hand-run server exited {status}");
}

async fn values(env: &Env, name: &str, pod: &str) -> BTreeSet<i64> {
    sql_ok(env, name, pod, "SELECT v FROM t")
        .await
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_semi_synchronous_primary_fails_over_losing_nothing_and_an_errant_one_is_recloned()
{
    let env = Env::start("mariafo").await;
    env.create_spec("mf", spec(3, true)).await;
    env.wait_ready("mf").await;
    sql_ok(
        &env,
        "mf",
        "mf-0",
        "CREATE TABLE t (v BIGINT PRIMARY KEY, pod VARCHAR(64))",
    )
    .await;
    let password = env.password("mf").await;
    let (stop_probe, prober) = probe_writable(&env, "mf", &password);
    let writer = writing(&env, "mf", &password).await;

    let runner = env.cluster.pod_runner().unwrap();
    let killed = SystemTime::now();
    runner.kill_and_hold(&env.namespace, "mf-0").unwrap();
    let db = env
        .wait_db("mf", "a new primary", |db| {
            db.status
                .as_ref()
                .and_then(|s| s.current_primary.as_deref())
                .is_some_and(|p| p != "mf-0")
        })
        .await;
    let new_primary = db.status.unwrap().current_primary.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let first = loop {
        if let Some(ack) = writer
            .acks()
            .into_iter()
            .find(|a| a.pod != "mf-0" && a.at > killed)
        {
            break ack;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no write acknowledged after the failover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let unavailable = first.at.duration_since(killed).unwrap();
    eprintln!(
        "first write acknowledged by {} {unavailable:?} after the kill",
        first.pod
    );
    // The bound is failoverTimeout + 5 s; the suite allows three times the slack.
    assert!(
        unavailable <= TIMEOUT + Duration::from_secs(15),
        "the first write after the kill came {unavailable:?} later\nmf-1:\n{}\nmf-2:\n{}",
        env.agent_log("mf-1"),
        env.agent_log("mf-2")
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let acks = writer.finish().await;
    let present = values(&env, "mf", &new_primary).await;
    let lost: Vec<i64> = acks
        .iter()
        .map(|a| a.value)
        .filter(|v| !present.contains(v))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged rows lost in the failover: {lost:?}"
    );

    // While it is away, the old primary commits a transaction no one else has.
    plant_errant_transaction(&env, "mf-0", "INSERT INTO app.t VALUES (1000000, 'errant')").await;
    runner.release(&env.namespace, "mf-0").unwrap();
    let events = wait_events(&env, "ErrantTransactions").await;
    let note = events[0].note.clone().unwrap_or_default();
    eprintln!("ErrantTransactions: {note}");
    assert!(note.contains("mf-0") && note.contains("0-1-"), "{note}");
    env.wait_db("mf", "three instances ready again", |db| {
        ready(db) && db.status.as_ref().is_some_and(|s| s.ready_replicas == 3)
    })
    .await;
    sql_ok(
        &env,
        "mf",
        &new_primary,
        "INSERT INTO t VALUES (2000000, 'after')",
    )
    .await;
    wait_answer(
        &env,
        "mf",
        "mf-0",
        "SELECT COUNT(*) FROM t WHERE v IN (1000000, 2000000)",
        "1",
    )
    .await;
    assert!(!values(&env, "mf", &new_primary).await.contains(&1000000));
    // The discarded transaction is kept for the administrator.
    let aside = env
        .report("mf-0")
        .await
        .moved_aside
        .expect("a moved-aside copy");
    let dump =
        std::fs::read_to_string(std::path::Path::new(&aside).join("errant-transactions.sql"))
            .unwrap_or_default();
    assert!(
        dump.contains("1000000") || dump.contains("BINLOG"),
        "{aside}: {dump}"
    );

    let _ = stop_probe.send(true);
    let both = prober.await.unwrap();
    assert!(both.is_empty(), "two writable instances at once: {both:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_with_db_promote_loses_nothing_and_the_old_primary_replicates() {
    let env = Env::start("mariaso").await;
    env.create_spec("ms", spec(3, true)).await;
    env.wait_ready("ms").await;
    sql_ok(
        &env,
        "ms",
        "ms-0",
        "CREATE TABLE t (v BIGINT PRIMARY KEY, pod VARCHAR(64))",
    )
    .await;
    let password = env.password("ms").await;
    let writer = writing(&env, "ms", &password).await;
    env.devctl_ok(&["db", "promote", "ms", "ms-1", "--wait"])
        .await;
    let db = env
        .wait_db("ms", "ms-1 the primary and Ready", |db| {
            ready(db)
                && db
                    .status
                    .as_ref()
                    .and_then(|s| s.current_primary.as_deref())
                    == Some("ms-1")
        })
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !writer.acks().iter().any(|a| a.pod == "ms-1") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no write acknowledged by ms-1"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let acks = writer.finish().await;
    let present = values(&env, "ms", "ms-1").await;
    let lost: Vec<i64> = acks
        .iter()
        .map(|a| a.value)
        .filter(|v| !present.contains(v))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged rows lost in the switchover: {lost:?}"
    );
    assert!(db.status.unwrap().last_switchover_time.is_some());

    // The old primary replicates from the new one.
    wait_events(&env, "Rejoined").await;
    sql_ok(
        &env,
        "ms",
        "ms-1",
        "INSERT INTO t VALUES (2000000, 'after')",
    )
    .await;
    for pod in ["ms-0", "ms-2"] {
        wait_answer(
            &env,
            "ms",
            pod,
            "SELECT pod FROM t WHERE v = 2000000",
            "after",
        )
        .await;
    }
    wait_endpoints(&env, "ms-rw", set(&["ms-1"])).await;
    wait_endpoints(&env, "ms-ro", set(&["ms-0", "ms-2"])).await;
}

const CHECKSUM: &str = "SELECT CONCAT(COUNT(*), ':', MD5(IFNULL(GROUP_CONCAT(v ORDER BY v SEPARATOR ','), ''))) FROM t";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_physical_backup_of_a_replica_restores_whole_and_to_a_point_in_time() {
    use support::backups::{backup_ok, restore_ok, spec as backup_spec, store_secrets};
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let env = Env::start("mariabk").await;
    store_secrets(&env, s3).await;
    // The primary rotates its binary log after 3 s (60 s otherwise), so the restore to a
    // point in time finds the transactions past it archived within seconds.
    env.cluster
        .pod_runner()
        .unwrap()
        .set_agent_hooks(&env.namespace, "mb-0", "archive-timeout-s=3")
        .unwrap();
    env.create_spec("mb", backup_spec("mariadb", "10.11", 3, s3))
        .await;
    env.wait_ready_with("mb", 3).await;
    sql_ok(
        &env,
        "mb",
        "mb-0",
        "CREATE TABLE t (v INT PRIMARY KEY); INSERT INTO t SELECT seq FROM seq_1_to_1000",
    )
    .await;

    let first = backup_ok(&env, "mb").await;
    let status = first.status.clone().unwrap();
    let instance = status.instance.clone().unwrap();
    assert_ne!(instance, "mb-0", "the backup should run on a replica");
    let prefix = status.prefix.clone().unwrap();
    let names: Vec<String> = s3.objects(&prefix).into_iter().map(|(k, _)| k).collect();
    let base = format!("{prefix}base/{}/", status.backup_id.clone().unwrap());
    for object in ["data.xbstream", "backup.json"] {
        assert!(names.contains(&format!("{base}{object}")), "{names:#?}");
    }

    // Batch A, a point in time T, batch B; the first backup replayed to T has A, not B.
    sql_ok(
        &env,
        "mb",
        "mb-0",
        "INSERT INTO t SELECT seq FROM seq_1001_to_1500",
    )
    .await;
    let after_a = sql_ok(&env, "mb", "mb-0", CHECKSUM).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = k8s_openapi::jiff::Timestamp::now().to_string();
    tokio::time::sleep(Duration::from_secs(2)).await;
    sql_ok(
        &env,
        "mb",
        "mb-0",
        "INSERT INTO t SELECT seq FROM seq_1501_to_2000",
    )
    .await;
    let after_b = sql_ok(&env, "mb", "mb-0", CHECKSUM).await;
    restore_ok(
        &env,
        "mb-pitr",
        &first.metadata.name.clone().unwrap(),
        Some(&t),
    )
    .await;
    assert_eq!(
        sql_ok(&env, "mb-pitr", "mb-pitr-0", CHECKSUM).await,
        after_a,
        "point-in-time restore to {t}"
    );
    let names: Vec<String> = s3.objects(&prefix).into_iter().map(|(k, _)| k).collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with(&format!("{prefix}binlog/")) && n.ends_with(".json")),
        "{names:#?}"
    );

    // The whole of a second backup.
    let second = backup_ok(&env, "mb").await;
    restore_ok(
        &env,
        "mb-copy",
        &second.metadata.name.clone().unwrap(),
        None,
    )
    .await;
    assert_eq!(
        sql_ok(&env, "mb-copy", "mb-copy-0", CHECKSUM).await,
        after_b
    );

    // The restored cluster grows: a replica clones it and replicates (its GTID state
    // continues the copy's).
    env.api::<DatabaseCluster>()
        .patch(
            "mb-copy",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "spec": { "replicas": 2 } })),
        )
        .await
        .unwrap();
    env.wait_ready_with("mb-copy", 2).await;
    sql_ok(&env, "mb-copy", "mb-copy-0", "INSERT INTO t VALUES (5000)").await;
    wait_answer(
        &env,
        "mb-copy",
        "mb-copy-1",
        "SELECT COUNT(*) FROM t WHERE v = 5000",
        "1",
    )
    .await;
    assert_eq!(
        sql_ok(&env, "mb-copy", "mb-copy-1", "SELECT COUNT(*) FROM t").await,
        "2001"
    );
}
