//! The fault matrix, reduced to suite size; the full size is the same test with
//! `DEVCTL_FAULT_CLUSTERS=100 DEVCTL_FAULT_KILLS=20` (figures in docs/performance.md): the
//! operator binary with its generated
//! RBAC, killed at random moments while clusters converge; a second writer fighting over a
//! child and the status; the API server restarted after an etcd compaction, so every watch
//! resumes into `410 Gone`. Each ends with zero orphans, zero duplicate children, zero
//! regenerated passwords and every cluster Ready, and prints its counts.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_operator::manifests::RULES;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use rand::Rng;
use serde_json::json;
use support::{OperatorProcess, is_ready};

fn database(name: &str, replicas: i32) -> DatabaseCluster {
    serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": name },
        "spec": { "version": "16.2", "replicas": replicas, "storage": { "size": "1Gi" } }
    }))
    .unwrap()
}

/// What the end state of a namespace's clusters must be, with the counts to print.
#[derive(Debug, Default)]
struct Audit {
    clusters: usize,
    children: usize,
    orphans: Vec<String>,
    unexpected: Vec<String>,
    missing: Vec<String>,
}

/// The children each cluster must have, by kind and name.
fn expected_children(db: &DatabaseCluster) -> Vec<(&'static str, String)> {
    let name = db.name_any();
    let mut expected = vec![
        ("ConfigMap", format!("{name}-config")),
        ("Secret", format!("{name}-credentials")),
        ("Service", format!("{name}-headless")),
        ("Service", format!("{name}-rw")),
        ("ServiceAccount", format!("{name}-agent")),
        ("Role", format!("{name}-agent")),
        ("RoleBinding", format!("{name}-agent")),
        ("StatefulSet", name.clone()),
    ];
    if db.spec.engine == devctl_api::database_cluster::Engine::Postgres {
        expected.push(("Secret", format!("{name}-replication")));
    }
    if db.spec.replicas > 1 {
        expected.push(("Service", format!("{name}-ro")));
        expected.push(("PodDisruptionBudget", name.clone()));
    }
    // The primary lock exists only with high availability (PostgreSQL).
    let high_availability = db
        .spec
        .high_availability
        .as_ref()
        .is_some_and(|ha| ha.enabled);
    if high_availability && db.spec.engine == devctl_api::database_cluster::Engine::Postgres {
        expected.push(("Lease", devctl_api::instance::primary_lease_name(&name)));
    }
    expected
}

async fn list_managed<K>(client: &kube::Client, namespace: &str) -> Vec<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    api.list(&ListParams::default().labels(&devctl_api::labels::managed_selector()))
        .await
        .unwrap()
        .items
}

/// Every devctl-managed object in `namespace` against what the clusters there should own.
async fn audit_namespace(client: &kube::Client, namespace: &str) -> Audit {
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), namespace);
    let dbs = dbs.list(&ListParams::default()).await.unwrap().items;
    let uids: BTreeMap<String, &DatabaseCluster> =
        dbs.iter().filter_map(|d| Some((d.uid()?, d))).collect();
    let mut live: Vec<(&'static str, String, Vec<String>)> = Vec::new();
    macro_rules! collect {
        ($kind:ty, $name:literal) => {
            for o in list_managed::<$kind>(client, namespace).await {
                let owners = o
                    .owner_references()
                    .iter()
                    .filter(|r| r.controller == Some(true))
                    .map(|r| r.uid.clone())
                    .collect();
                live.push(($name, o.name_any(), owners));
            }
        };
    }
    collect!(ConfigMap, "ConfigMap");
    collect!(Secret, "Secret");
    collect!(Service, "Service");
    collect!(StatefulSet, "StatefulSet");
    collect!(PodDisruptionBudget, "PodDisruptionBudget");
    collect!(k8s_openapi::api::core::v1::ServiceAccount, "ServiceAccount");
    collect!(k8s_openapi::api::rbac::v1::Role, "Role");
    collect!(k8s_openapi::api::rbac::v1::RoleBinding, "RoleBinding");
    collect!(k8s_openapi::api::coordination::v1::Lease, "Lease");
    let mut audit = Audit {
        clusters: dbs.len(),
        children: live.len(),
        ..Audit::default()
    };
    for (kind, name, owners) in &live {
        match owners.first().and_then(|uid| uids.get(uid)) {
            None => audit.orphans.push(format!("{kind} {name}")),
            Some(db) => {
                if !expected_children(db).contains(&(*kind, name.clone())) {
                    audit.unexpected.push(format!("{kind} {name}"));
                }
            }
        }
    }
    for db in &dbs {
        for (kind, name) in expected_children(db) {
            if !live.iter().any(|(k, n, _)| *k == kind && *n == name) {
                audit.missing.push(format!("{kind} {name}"));
            }
        }
    }
    audit
}

/// Passwords by Secret name (with the Secret's uid), to show none is ever regenerated.
async fn passwords(client: &kube::Client, namespace: &str) -> BTreeMap<String, (String, Vec<u8>)> {
    list_managed::<Secret>(client, namespace)
        .await
        .into_iter()
        .filter_map(|s| {
            let password = s.data.as_ref()?.get("password")?.0.clone();
            Some((s.name_any(), (s.uid()?, password)))
        })
        .collect()
}

async fn wait_all_ready(dbs: &Api<DatabaseCluster>, count: usize, operator: &OperatorProcess) {
    let what = format!("{count} clusters Ready");
    let ready = devctl_testenv::eventually(&what, Duration::from_secs(300), || async {
        let list = dbs.list(&ListParams::default()).await.ok()?;
        let ready = list
            .items
            .iter()
            .filter(|db| is_ready(db, db.spec.replicas))
            .count();
        (ready == count).then_some(())
    })
    .await;
    if let Err(error) = ready {
        panic!("{error}\n{}", operator.logs());
    }
}

fn assert_clean(what: &str, audit: &Audit) {
    println!(
        "{what}: {} clusters, {} children, {} orphans, {} unexpected, {} missing",
        audit.clusters,
        audit.children,
        audit.orphans.len(),
        audit.unexpected.len(),
        audit.missing.len()
    );
    assert!(
        audit.orphans.is_empty(),
        "{what}: orphans {:?}",
        audit.orphans
    );
    assert!(
        audit.unexpected.is_empty(),
        "{what}: duplicate or unexpected children {:?}",
        audit.unexpected
    );
    assert!(
        audit.missing.is_empty(),
        "{what}: missing children {:?}",
        audit.missing
    );
}

#[tokio::test]
async fn sigkill_at_random_moments_while_clusters_converge_loses_nothing() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("sigkill").await.unwrap();
    let mut operator = OperatorProcess::start(cluster, &namespace, RULES, &[]).await;
    let client = cluster.client().await.unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let size = |var: &str, default: usize| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let count = size("DEVCTL_FAULT_CLUSTERS", 20);
    let kills = size("DEVCTL_FAULT_KILLS", 8);
    for i in 0..count {
        let replicas = if i % 4 == 0 { 3 } else { 1 };
        dbs.create(
            &PostParams::default(),
            &database(&format!("kill-{i:02}"), replicas),
        )
        .await
        .unwrap();
    }
    let mut first_seen: BTreeMap<String, (String, Vec<u8>)> = BTreeMap::new();
    for _ in 0..kills {
        let pause = rand::rng().random_range(100..1500);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        operator.kill();
        for (name, secret) in passwords(&client, &namespace).await {
            first_seen.entry(name).or_insert(secret);
        }
        operator.restart();
    }
    wait_all_ready(&dbs, count, &operator).await;
    let audit = audit_namespace(&client, &namespace).await;
    assert_clean(
        &format!("{kills} SIGKILLs over {count} converging clusters"),
        &audit,
    );
    let now = passwords(&client, &namespace).await;
    let regenerated: Vec<&String> = first_seen
        .iter()
        .filter(|(name, seen)| now.get(*name) != Some(seen))
        .map(|(name, _)| name)
        .collect();
    println!(
        "passwords seen during the kills: {}, regenerated: {}",
        first_seen.len(),
        regenerated.len()
    );
    assert!(
        regenerated.is_empty(),
        "regenerated passwords: {regenerated:?}"
    );
    // The claims of every instance exist once.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, &namespace);
    let claims = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    let instances: i32 = dbs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|d| d.spec.replicas)
        .sum();
    assert_eq!(claims, instances as usize, "one claim per instance");
}

#[tokio::test]
async fn a_second_writer_fighting_over_a_child_and_the_status_loses_nothing() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("fight").await.unwrap();
    let operator = OperatorProcess::start(cluster, &namespace, RULES, &[]).await;
    let client = cluster.client().await.unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    dbs.create(&PostParams::default(), &database("contested", 3))
        .await
        .unwrap();
    wait_all_ready(&dbs, 1, &operator).await;
    let before = passwords(&client, &namespace).await;

    // For a few seconds another writer scales the StatefulSet down with updates based on what
    // it last read (so it meets 409 Conflicts) and overwrites the status.
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let mut conflicts = 0;
    let mut writes = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < deadline {
        let mut live = sts.get("contested").await.unwrap();
        live.spec.replicas = Some(0);
        tokio::time::sleep(Duration::from_millis(50)).await;
        match sts
            .replace("contested", &PostParams::default(), &live)
            .await
        {
            Ok(_) => writes += 1,
            Err(kube::Error::Api(status)) if status.code == 409 => conflicts += 1,
            Err(error) => panic!("{error}"),
        }
        let status = json!({ "status": { "phase": "Failed", "readyReplicas": 0 } });
        if dbs
            .patch_status("contested", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .is_ok()
        {
            writes += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("second writer: {writes} writes, {conflicts} conflicts");

    // The operator puts both back; nothing is lost or duplicated.
    devctl_testenv::eventually(
        "the StatefulSet back at 3 replicas",
        Duration::from_secs(60),
        || async { (sts.get("contested").await.ok()?.spec.replicas == Some(3)).then_some(()) },
    )
    .await
    .unwrap();
    // The status is the operator's again at the next reconcile (a health check at the latest;
    // a forced one here).
    let poke = json!({ "metadata": { "annotations": { "test.devctl.io/poke": "after-fight" } } });
    dbs.patch("contested", &PatchParams::default(), &Patch::Merge(&poke))
        .await
        .unwrap();
    wait_all_ready(&dbs, 1, &operator).await;
    let db = dbs.get("contested").await.unwrap();
    assert_eq!(
        db.status.as_ref().and_then(|s| s.phase).map(|p| p.as_str()),
        Some("Running")
    );
    assert_clean("second writer", &audit_namespace(&client, &namespace).await);
    assert_eq!(
        passwords(&client, &namespace).await,
        before,
        "no regenerated password"
    );
}

#[tokio::test]
async fn an_api_server_restart_into_compacted_history_relists_and_converges() {
    // Its own cluster: a restart is an outage for everyone on it.
    let cluster = devctl_testenv::Cluster::start_with(devctl_testenv::ClusterOptions {
        control_plane: devctl_testenv::Options {
            audit: true,
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("restart").await.unwrap();
    let operator = OperatorProcess::start(&cluster, &namespace, RULES, &[]).await;
    operator.wait_ready().await;
    let client = cluster.client().await.unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let count = 10;
    for i in 0..count {
        dbs.create(
            &PostParams::default(),
            &database(&format!("api-{i:02}"), 1 + (i % 2) as i32 * 2),
        )
        .await
        .unwrap();
    }
    // Mid-convergence: every credentials Secret exists, the instances are still starting.
    let passwords_before = devctl_testenv::eventually(
        "every credentials Secret to exist",
        Duration::from_secs(60),
        || async {
            let now = passwords(&client, &namespace).await;
            let credentials = now.keys().filter(|k| k.ends_with("-credentials")).count();
            (credentials == count).then_some(now)
        },
    )
    .await
    .unwrap();

    // The server goes down hard and every resourceVersion the operator's watches hold is
    // compacted away before it is back: each watch resumes into 410 Gone and must list
    // afresh. (Compacting while the server was up let a write of the still-converging
    // operator hand a watch a version from after the compaction; that watch rightly resumed
    // without a LIST, and the check below failed.)
    let audit = cluster.audit_log().unwrap();
    let mark = audit.mark();
    let compacted = cluster
        .kill_api_server_compact_etcd_and_restart()
        .await
        .unwrap();
    println!("killed the API server, compacted etcd at revision {compacted}, restarted it");

    wait_all_ready(&dbs, count, &operator).await;
    // Each watch comes back with its own backoff: wait (bounded) for every fresh LIST.
    let kinds = [
        "databaseclusters",
        "statefulsets",
        "secrets",
        "configmaps",
        "services",
    ];
    let relisted = devctl_testenv::eventually(
        "a fresh LIST of every watched kind",
        Duration::from_secs(60),
        || async {
            let lists: Vec<String> = audit
                .requests_since(mark)
                .ok()?
                .into_iter()
                .filter(|r| r.user == operator.user && r.verb == "list")
                .map(|r| r.resource)
                .collect();
            kinds
                .iter()
                .all(|k| lists.iter().any(|r| r == k))
                .then_some(lists)
        },
    )
    .await;
    match relisted {
        Ok(lists) => println!("the operator listed after the restart: {lists:?}"),
        Err(error) => panic!("{error}\n{}", operator.logs()),
    }
    assert_clean(
        "API server restart after compaction",
        &audit_namespace(&client, &namespace).await,
    );
    let now = passwords(&client, &namespace).await;
    for (name, seen) in &passwords_before {
        assert_eq!(now.get(name), Some(seen), "{name} regenerated");
    }
    cluster.check_processes().unwrap();
}
