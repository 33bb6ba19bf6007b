//! Replicated MariaDB on process-backed pods with Debian's MariaDB 10.11 (docs/mariadb.md):
//! GTID replication from clones streamed by `mariadb-backup`, read-only replicas, the `-rw`
//! and `-ro` Services by role, failover with semi-synchronous replication and errant
//! transactions, and switchover.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
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

/// The pods an EndpointSlice of `service` points at.
async fn endpoints(env: &Env, service: &str) -> BTreeSet<String> {
    let slices = env
        .api::<EndpointSlice>()
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .unwrap();
    slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .filter_map(|e| e.target_ref.as_ref()?.name.clone())
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn wait_endpoints(env: &Env, service: &str, expected: BTreeSet<String>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let found = endpoints(env, service).await;
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
}
