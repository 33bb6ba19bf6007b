//! PostgreSQL streaming replication on process-backed pods: one primary, streaming replicas,
//! role-aware Services, scaling, re-cloning and ordered rollouts — checked on the real
//! databases through `devctl db shell`.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::InstanceStatus;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use support::databases::{Env, READY_TIMEOUT, condition, ready};

/// The names of the pods starting with `prefix` (`None` when the list fails), with those
/// being deleted or without them.
async fn pod_names(env: &Env, prefix: &str, terminating: bool) -> Option<BTreeSet<String>> {
    let pods = env.api::<Pod>().list(&ListParams::default()).await.ok()?;
    Some(
        pods.items
            .iter()
            .filter(|p| terminating || p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .filter(|n| n.starts_with(prefix))
            .collect(),
    )
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// The application names streaming from the primary (`<name>-0`).
async fn streaming(env: &Env, name: &str) -> BTreeSet<String> {
    streaming_from(env, name, &format!("{name}-0")).await
}

/// The application names streaming from `primary`.
async fn streaming_from(env: &Env, name: &str, primary: &str) -> BTreeSet<String> {
    env.instance_sql_ok(
        name,
        primary,
        "select application_name from pg_stat_replication where state = 'streaming' order by 1",
    )
    .await
    .lines()
    .map(str::to_string)
    .collect()
}

/// The agent's replication slots on `pod` as `name:active`, sorted.
async fn slots(env: &Env, name: &str, pod: &str) -> String {
    env.instance_sql_ok(
        name,
        pod,
        "select coalesce(string_agg(slot_name || ':' || active::text, ',' order by slot_name), '') \
           from pg_replication_slots where slot_name like 'devctl\\_%'",
    )
    .await
}

/// Waits until `pod` has replayed the primary's rows (`count` of them in `t`).
async fn wait_rows(env: &Env, name: &str, pod: &str, count: usize) {
    let expected = count.to_string();
    devctl_testenv::eventually(
        &format!("{pod} to hold {count} rows"),
        READY_TIMEOUT,
        || async {
            let out = env.instance_sql(name, pod, "select count(*) from t").await;
            (support::stdout(&out).trim() == expected).then_some(())
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_stream_serve_the_right_services_scale_and_reclone() {
    let env = Env::start("replication").await;
    env.create_with("ha", "postgres", "16.2", 3).await;
    let db = env.wait_ready_with("ha", 3).await;
    let status = db.status.unwrap();
    assert_eq!(status.current_primary.as_deref(), Some("ha-0"));
    let roles: Vec<(String, Option<String>)> = status
        .instances
        .iter()
        .map(|i| (i.name.clone(), i.role.clone()))
        .collect();
    assert_eq!(
        roles,
        [
            ("ha-0".to_string(), Some("primary".to_string())),
            ("ha-1".to_string(), Some("replica".to_string())),
            ("ha-2".to_string(), Some("replica".to_string())),
        ]
    );

    // One primary, two streaming standbys.
    assert_eq!(
        env.instance_sql_ok("ha", "ha-0", "select pg_is_in_recovery()")
            .await,
        "f"
    );
    for replica in ["ha-1", "ha-2"] {
        assert_eq!(
            env.instance_sql_ok("ha", replica, "select pg_is_in_recovery()")
                .await,
            "t"
        );
    }
    // The primary's side moves from catchup to streaming on its own schedule.
    devctl_testenv::eventually("ha-1 and ha-2 to stream", READY_TIMEOUT, || async {
        (streaming(&env, "ha").await == set(&["ha-1", "ha-2"])).then_some(())
    })
    .await
    .unwrap();

    // The primary keeps a slot per replica, and each replica streams through its own.
    devctl_testenv::eventually("a slot per replica, in use", READY_TIMEOUT, || async {
        (slots(&env, "ha", "ha-0").await == "devctl_ha_1:true,devctl_ha_2:true").then_some(())
    })
    .await
    .unwrap();

    // 1,000 rows written through the primary reach both replicas; replicas refuse writes.
    env.shell_ok(
        "ha",
        "create table t (v int); insert into t select generate_series(1, 1000)",
    )
    .await;
    for replica in ["ha-1", "ha-2"] {
        wait_rows(&env, "ha", replica, 1000).await;
    }
    let refused = env
        .instance_sql("ha", "ha-1", "insert into t values (0)")
        .await;
    assert!(!refused.status.success());
    assert!(
        support::stderr(&refused).contains("read-only transaction"),
        "{}",
        support::stderr(&refused)
    );

    // The Services follow the roles (EndpointSlices from kube-controller-manager).
    devctl_testenv::eventually(
        "-rw to hold the primary, -ro the replicas",
        READY_TIMEOUT,
        || async {
            (env.endpoints("ha-rw").await == set(&["ha-0"])
                && env.endpoints("ha-ro").await == set(&["ha-1", "ha-2"]))
            .then_some(())
        },
    )
    .await
    .unwrap();

    // The replication role streams but cannot read the application's data.
    let replication = env.api::<Secret>().get("ha-replication").await.unwrap();
    let password = String::from_utf8(replication.data.unwrap()["password"].0.clone()).unwrap();
    let login = env
        .psql_login_as("ha-0", "streaming_replica", &password, "app")
        .await;
    assert!(!login.status.success(), "streaming_replica logged into app");

    // 3 → 5: the new instances clone, stream and hold the rows.
    let dbs = env.api::<DatabaseCluster>();
    dbs.patch(
        "ha",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "replicas": 5 } })),
    )
    .await
    .unwrap();
    env.wait_ready_with("ha", 5).await;
    devctl_testenv::eventually("four replicas to stream", READY_TIMEOUT, || async {
        (streaming(&env, "ha").await == set(&["ha-1", "ha-2", "ha-3", "ha-4"])).then_some(())
    })
    .await
    .unwrap();
    for replica in ["ha-3", "ha-4"] {
        wait_rows(&env, "ha", replica, 1000).await;
    }
    // 5 → 3: the highest ordinals leave pg_stat_replication; nothing is lost.
    dbs.patch(
        "ha",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "replicas": 3 } })),
    )
    .await
    .unwrap();
    env.wait_ready_with("ha", 3).await;
    devctl_testenv::eventually("ha-3 and ha-4 to stop streaming", READY_TIMEOUT, || async {
        (streaming(&env, "ha").await == set(&["ha-1", "ha-2"])).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(
        env.instance_sql_ok("ha", "ha-0", "select count(*) from t")
            .await,
        "1000"
    );
    // The removed instances' slots are dropped: they would keep WAL for no one.
    devctl_testenv::eventually(
        "the slots of ha-3 and ha-4 to go",
        READY_TIMEOUT,
        || async {
            (slots(&env, "ha", "ha-0").await == "devctl_ha_1:true,devctl_ha_2:true").then_some(())
        },
    )
    .await
    .unwrap();

    // A deleted replica pod comes back on its data and catches up.
    let report = |pod: &'static str| {
        let env = &env;
        async move { env.report(pod).await }
    };
    let identifier = report("ha-0").await.system_identifier;
    let pods = env.api::<Pod>();
    pods.delete("ha-2", &DeleteParams::default()).await.unwrap();
    env.shell_ok("ha", "insert into t select generate_series(1001, 1100)")
        .await;
    wait_rows(&env, "ha", "ha-2", 1100).await;
    // The engine may serve before the agent's first check has read its identifier.
    let recreated = devctl_testenv::eventually(
        "ha-2's agent to report its system identifier",
        Duration::from_secs(60),
        || async { report("ha-2").await.system_identifier },
    )
    .await
    .unwrap();
    assert_eq!(Some(recreated), identifier);
    let claim_dir = |claim: &str| {
        env.cluster
            .pod_runner()
            .unwrap()
            .claim_dir(&env.namespace, claim)
    };
    let kept = claim_dir("data-ha-2");

    // Its claim deleted too: it clones again from the primary.
    env.api::<PersistentVolumeClaim>()
        .delete("data-ha-2", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("ha-2", &DeleteParams::default()).await.unwrap();
    devctl_testenv::eventually("ha-2 on a new claim", READY_TIMEOUT, || async {
        let dir = claim_dir("data-ha-2")?;
        (Some(&dir) != kept.as_ref()).then_some(())
    })
    .await
    .unwrap();
    wait_rows(&env, "ha", "ha-2", 1100).await;
    env.wait_ready_with("ha", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minor_version_change_replaces_the_replicas_before_the_primary() {
    let env = Env::start("rollout").await;
    env.create_with("roll", "postgres", "16.2", 3).await;
    env.wait_ready_with("roll", 3).await;
    let before: Vec<Option<String>> = {
        let pods = env.api::<Pod>();
        let mut uids = Vec::new();
        for pod in ["roll-0", "roll-1", "roll-2"] {
            uids.push(pods.get(pod).await.unwrap().metadata.uid);
        }
        uids
    };
    env.api::<DatabaseCluster>()
        .patch(
            "roll",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "version": "16.3" } })),
        )
        .await
        .unwrap();
    env.wait_db("roll", "Ready at 16.3", |db| {
        ready(db)
            && db
                .status
                .as_ref()
                .and_then(|s| s.current_version.as_deref())
                == Some("16.3")
    })
    .await;
    // Every pod was replaced, one at a time, replicas first and the primary last.
    let pods = env.api::<Pod>();
    for (pod, old) in ["roll-0", "roll-1", "roll-2"].iter().zip(&before) {
        let now = pods.get(pod).await.unwrap();
        assert_ne!(&now.metadata.uid, old, "{pod} was not replaced");
        let image = now.spec.unwrap().containers[0].image.clone();
        assert_eq!(image.as_deref(), Some("postgres:16.3"));
        let report = InstanceStatus::from_annotations(now.metadata.annotations.as_ref()).unwrap();
        assert!(report.ready, "{pod}: {report:?}");
    }
    // Ready means the replicas stream from the replaced primary, as it sees them itself.
    let primary = pods.get("roll-0").await.unwrap();
    let report = InstanceStatus::from_annotations(primary.metadata.annotations.as_ref()).unwrap();
    assert_eq!(
        report.streaming_replicas,
        Some(vec!["roll-1".to_string(), "roll-2".to_string()]),
        "{report:?}"
    );
    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut replaced: Vec<(Option<String>, String)> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ReplacingInstance"))
        .map(|e| {
            (
                e.event_time.as_ref().map(|t| t.0.to_string()),
                e.note.clone().unwrap_or_default(),
            )
        })
        .collect();
    replaced.sort();
    let order: Vec<&str> = replaced
        .iter()
        .filter_map(|(_, note)| {
            ["roll-0", "roll-1", "roll-2"]
                .into_iter()
                .find(|p| note.contains(&format!("pod {p} ")))
        })
        .collect();
    assert_eq!(order, ["roll-2", "roll-1", "roll-0"], "{replaced:#?}");
    // The replicas stream again from the replaced primary.
    devctl_testenv::eventually("both replicas to stream again", READY_TIMEOUT, || async {
        (streaming(&env, "roll").await == set(&["roll-1", "roll-2"])).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_replicas_are_refused_and_the_message_points_to_mariadb() {
    let env = Env::start("myrepl").await;
    env.create_with("my3", "mysql", "8.0", 3).await;
    let db = env
        .wait_db("my3", "Degraded ReplicationUnsupported", |db| {
            support::databases::condition(db, "Degraded")
                .is_some_and(|(s, r, _)| s == "True" && r == "ReplicationUnsupported")
        })
        .await;
    let (ready_status, _, message) = support::databases::condition(&db, "Ready").unwrap();
    assert_eq!(ready_status, "False");
    assert!(message.contains("spec.replicas"), "{message}");
    let (_, _, degraded) = support::databases::condition(&db, "Degraded").unwrap();
    assert!(degraded.contains("use engine mariadb"), "{degraded}");
    let sts = env
        .api::<k8s_openapi::api::apps::v1::StatefulSet>()
        .get("my3")
        .await
        .unwrap();
    assert_eq!(sts.spec.replicas, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_loses_nothing_and_the_old_primary_streams_from_the_new_one() {
    let env = Env::start("switchover").await;
    env.create_with("sw", "postgres", "16.2", 3).await;
    env.wait_ready_with("sw", 3).await;
    env.shell_ok(
        "sw",
        "create table t (v int); insert into t select generate_series(1, 1000)",
    )
    .await;

    // Not an instance: refused before anything changes.
    let kubeconfig = env.kubeconfig.clone();
    let refused = tokio::task::spawn_blocking(move || {
        support::devctl(&kubeconfig, &["db", "promote", "sw", "sw-9"])
    })
    .await
    .unwrap();
    assert!(!refused.status.success());
    assert!(
        support::stderr(&refused).contains("sw-9 is not an instance of databasecluster sw"),
        "{}",
        support::stderr(&refused)
    );

    let kubeconfig = env.kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || {
        support::devctl_ok(
            &kubeconfig,
            &["db", "promote", "sw", "sw-1", "--wait", "--timeout", "150"],
        )
    })
    .await
    .unwrap();
    assert!(out.contains("sw-1 is the primary"), "{out}");
    let db = env.api::<DatabaseCluster>().get("sw").await.unwrap();
    let status = db.status.unwrap();
    assert_eq!(status.current_primary.as_deref(), Some("sw-1"));
    assert_eq!(status.target_primary, None);
    assert!(
        !db.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(devctl_api::instance::SWITCHOVER_ANNOTATION),
        "the request is removed once done"
    );

    // Nothing lost; the new primary takes writes, the old one is a standby of it.
    assert_eq!(
        env.instance_sql_ok("sw", "sw-1", "select pg_is_in_recovery()")
            .await,
        "f"
    );
    assert_eq!(
        env.instance_sql_ok("sw", "sw-1", "select count(*) from t")
            .await,
        "1000"
    );
    env.shell_ok("sw", "insert into t values (1001)").await;
    devctl_testenv::eventually(
        "sw-0 and sw-2 to stream from sw-1",
        READY_TIMEOUT,
        || async {
            (streaming_from(&env, "sw", "sw-1").await == set(&["sw-0", "sw-2"])).then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        env.instance_sql_ok("sw", "sw-0", "select pg_is_in_recovery()")
            .await,
        "t"
    );
    for replica in ["sw-0", "sw-2"] {
        wait_rows(&env, "sw", replica, 1001).await;
    }
    devctl_testenv::eventually(
        "-rw to hold sw-1, -ro sw-0 and sw-2",
        READY_TIMEOUT,
        || async {
            (env.endpoints("sw-rw").await == set(&["sw-1"])
                && env.endpoints("sw-ro").await == set(&["sw-0", "sw-2"]))
            .then_some(())
        },
    )
    .await
    .unwrap();
    let promoted = env.events("Promoted").await;
    assert_eq!(promoted.len(), 1, "{promoted:#?}");

    // Scaling to one instance would remove the primary (sw-1): refused, with the way out; sw-2
    // goes, sw-0 and sw-1 keep running, and writes go on.
    env.api::<DatabaseCluster>()
        .patch(
            "sw",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 1 } })),
        )
        .await
        .unwrap();
    let db = env
        .wait_db("sw", "the scale-down refused", |db| {
            condition(db, "Stalled")
                .is_some_and(|(status, reason, _)| status == "True" && reason == "ScaleDownRefused")
        })
        .await;
    let (_, _, message) = condition(&db, "Stalled").unwrap();
    assert!(
        message.contains("sw-1") && message.contains("devctl db promote sw sw-0"),
        "{message}"
    );
    assert_eq!(condition(&db, "Ready").unwrap().0, "False");
    devctl_testenv::eventually(
        "sw-2 to go, sw-0 and sw-1 to stay",
        READY_TIMEOUT,
        || async { (pod_names(&env, "sw-", false).await? == set(&["sw-0", "sw-1"])).then_some(()) },
    )
    .await
    .unwrap();
    env.shell_ok("sw", "insert into t values (1002)").await;
    assert!(
        !env.events("ScaleDownRefused").await.is_empty(),
        "a Warning event says why"
    );

    // Once the primary moves to an instance that stays, the scale-down proceeds.
    let kubeconfig = env.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        support::devctl_ok(
            &kubeconfig,
            &["db", "promote", "sw", "sw-0", "--wait", "--timeout", "150"],
        )
    })
    .await
    .unwrap();
    let db = env.wait_ready_with("sw", 1).await;
    devctl_testenv::eventually("only sw-0 to run", READY_TIMEOUT, || async {
        (pod_names(&env, "sw-", true).await? == set(&["sw-0"])).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(db.status.unwrap().current_primary.as_deref(), Some("sw-0"));
    assert_eq!(
        env.instance_sql_ok("sw", "sw-0", "select count(*) from t")
            .await,
        "1002",
        "no row lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_left_behind_past_its_slot_without_an_archive_is_recloned() {
    let env = Env::start("replication-reclone").await;
    // A 256Mi volume: the primary keeps at most 64 MB of WAL for a replica's slot.
    env.create_spec(
        "lag",
        json!({
            "engine": "postgres", "version": "16.2", "replicas": 2,
            "storage": { "size": "256Mi" },
            "backup": { "enabled": false },
        }),
    )
    .await;
    env.wait_ready_with("lag", 2).await;
    devctl_testenv::eventually(
        "lag-1 to stream through its slot",
        READY_TIMEOUT,
        || async { (slots(&env, "lag", "lag-0").await == "devctl_lag_1:true").then_some(()) },
    )
    .await
    .unwrap();
    env.shell_ok(
        "lag",
        "create table t (v int); insert into t select generate_series(1, 100)",
    )
    .await;
    wait_rows(&env, "lag", "lag-1", 100).await;

    let rows = env.leave_replica_behind("lag-0", "lag-1").await;
    assert_eq!(rows, 124);
    // The primary no longer has what lag-1 needs and there is no archive: re-cloned.
    let recloned = devctl_testenv::eventually("a Recloned event", READY_TIMEOUT, || async {
        let found = env.events("Recloned").await;
        (!found.is_empty()).then_some(found)
    })
    .await
    .unwrap();
    let note = recloned[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("lag-1") && note.contains("no archive"),
        "{note}"
    );
    wait_rows(&env, "lag", "lag-1", rows).await;
    devctl_testenv::eventually(
        "lag-1 to stream through its slot again",
        READY_TIMEOUT,
        || async { (slots(&env, "lag", "lag-0").await == "devctl_lag_1:true").then_some(()) },
    )
    .await
    .unwrap();
    env.wait_ready_with("lag", 2).await;
}
