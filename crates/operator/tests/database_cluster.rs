//! The DatabaseCluster controller against the real control plane (`Cluster` mode).

mod support;

use devctl_api::database_cluster::{DatabaseCluster, KEEP_VOLUMES_ANNOTATION, Phase};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use support::{OPERATOR_USER, TIMEOUT, assert_rejected, condition_status, is_ready, start};

fn database(name: &str, replicas: i32) -> DatabaseCluster {
    serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1",
        "kind": "DatabaseCluster",
        "metadata": { "name": name },
        "spec": { "engine": "postgres", "version": "16.2", "replicas": replicas, "storage": { "size": "10Gi" } }
    }))
    .unwrap()
}

async fn wait_gone<K>(api: &kube::Api<K>, name: &str, uid: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::time::timeout(
        TIMEOUT,
        await_condition(api.clone(), name, conditions::is_deleted(uid)),
    )
    .await
    .unwrap_or_else(|_| panic!("{name} was not deleted within {TIMEOUT:?}"))
    .unwrap();
}

async fn password(env: &support::Env, name: &str) -> Vec<u8> {
    let secret: Secret = env
        .api::<Secret>()
        .get(&format!("{name}-credentials"))
        .await
        .unwrap();
    secret.data.unwrap()["password"].0.clone()
}

#[tokio::test]
async fn sample_converges_is_idempotent_and_heals() {
    let mut env = start("sample").await;
    let dbs = env.dbs();
    dbs.create(&PostParams::default(), &database("my-postgres", 3))
        .await
        .unwrap();
    let db = env
        .wait_db("my-postgres", "Ready with 3 ready replicas", |db| {
            is_ready(db, 3)
        })
        .await;
    let status = db.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Running));
    assert_eq!(
        status.connection_secret_name.as_deref(),
        Some("my-postgres-credentials")
    );
    assert_eq!(
        status.primary_endpoint.as_deref(),
        Some(format!("my-postgres-rw.{}.svc.cluster.local", env.namespace).as_str())
    );
    assert!(
        db.finalizers()
            .contains(&"db.devctl.io/finalizer".to_string())
    );

    // Exactly the children, with owner references and labels.
    let uid = db.metadata.uid.clone().unwrap();
    let owned = |meta: &kube::api::ObjectMeta| {
        meta.owner_references
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r.uid == uid && r.controller == Some(true)))
            && meta.labels.as_ref().is_some_and(|l| {
                l.get("app.kubernetes.io/managed-by").map(String::as_str) == Some("devctl-operator")
            })
    };
    let selector = ListParams::default().labels("app.kubernetes.io/instance=my-postgres");
    let services: Vec<String> = env
        .api::<Service>()
        .list(&selector)
        .await
        .unwrap()
        .items
        .iter()
        .inspect(|s| assert!(owned(&s.metadata)))
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        services,
        ["my-postgres-headless", "my-postgres-ro", "my-postgres-rw"]
    );
    let config: ConfigMap = env.api().get("my-postgres-config").await.unwrap();
    assert!(owned(&config.metadata));
    let data = config.data.unwrap();
    assert!(
        data["pg_hba.conf"].contains("scram-sha-256") && !data["pg_hba.conf"].contains("trust")
    );
    assert!(data["postgresql.conf"].contains("shared_buffers = 128MB"));
    let secret: Secret = env.api().get("my-postgres-credentials").await.unwrap();
    assert!(owned(&secret.metadata));
    let keys: Vec<&String> = secret.data.as_ref().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["dbname", "host", "password", "port", "uri", "username"]
    );
    let sts: StatefulSet = env.api().get("my-postgres").await.unwrap();
    assert!(owned(&sts.metadata));
    assert_eq!(sts.spec.replicas, Some(3));
    assert_eq!(
        sts.spec.service_name.as_deref(),
        Some("my-postgres-headless")
    );
    let pdb: PodDisruptionBudget = env.api().get("my-postgres").await.unwrap();
    assert!(owned(&pdb.metadata));

    // `kubectl get dbc` shows the printer columns.
    let out = env
        .cluster
        .kubectl()
        .args(["get", "dbc", "-n", &env.namespace])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "ENGINE", "VERSION", "REPLICAS", "READY", "PHASE", "AGE"
        ]
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..6],
        ["my-postgres", "postgres", "16.2", "3", "3", "Running"]
    );

    // Idempotency: forced reconciles of a converged cluster make zero write requests.
    let password_before = password(&env, "my-postgres").await;
    let writes = env
        .writes_during_forced_reconciles(&dbs, "my-postgres", 5)
        .await;
    assert!(
        writes.is_empty(),
        "steady-state reconciles wrote: {writes:#?}"
    );
    let services_after = env
        .api::<Service>()
        .list(&selector)
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(services_after, 3, "no duplicate children");

    // Self-heal: deleted children come back, a hand-scaled StatefulSet is restored.
    let sts_api = env.api::<StatefulSet>();
    let old_uid = sts.metadata.uid.clone().unwrap();
    sts_api
        .delete("my-postgres", &DeleteParams::background())
        .await
        .unwrap();
    wait_gone(&sts_api, "my-postgres", &old_uid).await;
    let recreated = await_condition(sts_api.clone(), "my-postgres", |s: Option<&StatefulSet>| {
        s.is_some_and(|s| s.status.as_ref().and_then(|st| st.ready_replicas) == Some(3))
    });
    let recreated = tokio::time::timeout(TIMEOUT, recreated)
        .await
        .expect("the deleted StatefulSet was not recreated and ready within the timeout")
        .unwrap()
        .unwrap();
    assert_ne!(recreated.metadata.uid.as_deref(), Some(old_uid.as_str()));
    env.wait_db(
        "my-postgres",
        "Ready again after the StatefulSet was deleted",
        |db| is_ready(db, 3),
    )
    .await;

    for (delete, name) in [
        ("service", "my-postgres-rw"),
        ("configmap", "my-postgres-config"),
    ] {
        let out = env
            .cluster
            .kubectl()
            .args(["delete", delete, name, "-n", &env.namespace, "--wait=true"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let what = format!("{delete} {name} to be recreated");
        devctl_testenv::eventually(&what, TIMEOUT, || async {
            let out = env
                .cluster
                .kubectl()
                .args(["get", delete, name, "-n", &env.namespace])
                .output()
                .ok()?;
            out.status.success().then_some(())
        })
        .await
        .unwrap();
    }

    sts_api
        .patch(
            "my-postgres",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 0 } })),
        )
        .await
        .unwrap();
    let restored = await_condition(sts_api.clone(), "my-postgres", |s: Option<&StatefulSet>| {
        s.is_some_and(|s| s.spec.replicas == Some(3) && s.metadata.generation.unwrap_or(0) > 2)
    });
    tokio::time::timeout(TIMEOUT, restored)
        .await
        .expect("hand-scaled StatefulSet was not restored to 3")
        .unwrap();
    env.wait_db(
        "my-postgres",
        "Ready after the hand scale was undone",
        |db| is_ready(db, 3),
    )
    .await;
    assert_eq!(
        password(&env, "my-postgres").await,
        password_before,
        "the password must never change"
    );

    // Events for what the operator did, visible to `kubectl describe`.
    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let reasons: Vec<&str> = events
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("my-postgres"))
        .filter_map(|e| e.reason.as_deref())
        .collect();
    assert!(reasons.contains(&"Applied"), "{reasons:?}");
    for event in &events.items {
        let note = event.note.clone().unwrap_or_default();
        assert!(
            !note.contains(std::str::from_utf8(&password_before).unwrap()),
            "a secret leaked into an event"
        );
    }
}

#[tokio::test]
async fn scaling_follows_kubectl_scale() {
    let env = start("scale").await;
    env.dbs()
        .create(&PostParams::default(), &database("scaled", 3))
        .await
        .unwrap();
    env.wait_db("scaled", "Ready with 3", |db| is_ready(db, 3))
        .await;

    for replicas in [5, 1] {
        let out = env
            .cluster
            .kubectl()
            .args([
                "scale",
                "dbc/scaled",
                &format!("--replicas={replicas}"),
                "-n",
                &env.namespace,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let db = env
            .wait_db("scaled", &format!("Ready with {replicas}"), |db| {
                is_ready(db, replicas) && db.status.as_ref().is_some_and(|s| s.replicas == replicas)
            })
            .await;
        let sts: StatefulSet = env.api().get("scaled").await.unwrap();
        assert_eq!(sts.spec.replicas, Some(replicas));
        // The read-only Service and the PDB exist exactly when there are replicas.
        let ro = env
            .api::<Service>()
            .get_opt("scaled-ro")
            .await
            .unwrap()
            .is_some();
        let pdb = env
            .api::<PodDisruptionBudget>()
            .get_opt("scaled")
            .await
            .unwrap()
            .is_some();
        assert_eq!(
            (ro, pdb),
            (replicas > 1, replicas > 1),
            "at {replicas} replicas"
        );
        assert_eq!(
            db.status.as_ref().unwrap().observed_generation,
            db.metadata.generation
        );
        assert_eq!(
            db.status.as_ref().unwrap().replica_endpoint.is_some(),
            replicas > 1
        );
    }
}

#[tokio::test]
async fn storage_grows_in_place_and_never_shrinks() {
    let env = start("storage").await;
    env.dbs()
        .create(&PostParams::default(), &database("sized", 2))
        .await
        .unwrap();
    env.wait_db("sized", "Ready with 2", |db| is_ready(db, 2))
        .await;

    env.dbs()
        .patch(
            "sized",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "storage": { "size": "20Gi" } } })),
        )
        .await
        .unwrap();
    let claims = env.api::<PersistentVolumeClaim>();
    devctl_testenv::eventually(
        "both claims to request and report 20Gi",
        TIMEOUT,
        || async {
            let list = claims
                .list(&ListParams::default().labels("app.kubernetes.io/instance=sized"))
                .await
                .ok()?;
            let all = list.items.len() == 2
                && list.items.iter().all(|c| {
                    let sizes = || -> Option<(String, String)> {
                        let requested = c
                            .spec
                            .as_ref()?
                            .resources
                            .as_ref()?
                            .requests
                            .as_ref()?
                            .get("storage")?
                            .0
                            .clone();
                        let capacity = c
                            .status
                            .as_ref()?
                            .capacity
                            .as_ref()?
                            .get("storage")?
                            .0
                            .clone();
                        Some((requested, capacity))
                    };
                    sizes().is_some_and(|(r, c)| r == "20Gi" && c == "20Gi")
                });
            all.then_some(())
        },
    )
    .await
    .unwrap();
    env.wait_db("sized", "status.storageSize 20Gi", |db| {
        db.status.as_ref().and_then(|s| s.storage_size.as_deref()) == Some("20Gi")
            && condition_status(db, "Progressing").is_some_and(|(s, _)| s == "False")
    })
    .await;
    // The claim template is immutable and stays as it was.
    let sts: StatefulSet = env.api().get("sized").await.unwrap();
    let template = &sts.spec.volume_claim_templates.unwrap()[0];
    assert_eq!(
        template
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"]
            .0,
        "10Gi"
    );

    let shrink = env
        .dbs()
        .patch(
            "sized",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "storage": { "size": "5Gi" } } })),
        )
        .await;
    assert_rejected(shrink, "storage.size cannot shrink");
}

#[tokio::test]
async fn invalid_specs_are_rejected_with_field_messages() {
    let env = start("invalid").await;
    let dbs = env.dbs();
    let cases = [
        (json!({ "replicas": 0 }), "spec.replicas"),
        (json!({ "replicas": 8 }), "spec.replicas"),
        (json!({ "version": "16" }), "spec.version"),
        (
            json!({ "storage": { "size": "10GB" } }),
            "spec.storage.size",
        ),
        (json!({ "engine": "oracle" }), "spec.engine"),
    ];
    // Raw objects: some values (engine "oracle") cannot even be held by the Rust types.
    let raw = kube::api::Api::<kube::api::DynamicObject>::namespaced_with(
        env.client.clone(),
        &env.namespace,
        &kube::discovery::ApiResource::erase::<DatabaseCluster>(&()),
    );
    for (i, (overrides, field)) in cases.into_iter().enumerate() {
        let mut body = serde_json::to_value(database(&format!("bad-{i}"), 1)).unwrap();
        for (k, v) in overrides.as_object().unwrap() {
            body["spec"][k] = v.clone();
        }
        let result = raw
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await;
        assert_rejected(result, field);
    }

    // Engine change on an existing cluster.
    dbs.create(&PostParams::default(), &database("fixed-engine", 1))
        .await
        .unwrap();
    let change = dbs
        .patch(
            "fixed-engine",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "engine": "mysql" } })),
        )
        .await;
    assert_rejected(change, "engine is immutable");
}

#[tokio::test]
async fn deleting_runs_the_finalizer_and_removes_children_and_volumes_unless_kept_or_orphaned() {
    let env = start("delete").await;
    let dbs = env.dbs();
    dbs.create(&PostParams::default(), &database("doomed", 2))
        .await
        .unwrap();
    let mut kept = database("kept", 1);
    kept.metadata.annotations = Some(
        [(KEEP_VOLUMES_ANNOTATION.to_string(), "true".to_string())]
            .into_iter()
            .collect(),
    );
    dbs.create(&PostParams::default(), &kept).await.unwrap();
    dbs.create(&PostParams::default(), &database("orphaned", 1))
        .await
        .unwrap();
    let mut uids = Vec::new();
    for (name, replicas) in [("doomed", 2), ("kept", 1), ("orphaned", 1)] {
        let db = env
            .wait_db(name, "Ready", |db| is_ready(db, replicas))
            .await;
        uids.push((name, db.metadata.uid.clone().unwrap()));
    }
    let claims = env.api::<PersistentVolumeClaim>();
    let kept_claim = claims.get("data-kept-0").await.unwrap();
    let orphaned_claim = claims.get("data-orphaned-0").await.unwrap();
    for (name, uid) in &uids {
        let params = if *name == "orphaned" {
            DeleteParams::orphan()
        } else {
            DeleteParams::default()
        };
        dbs.delete(name, &params).await.unwrap();
        wait_gone(&dbs, name, uid).await;
    }
    let sts_api = env.api::<StatefulSet>();
    devctl_testenv::eventually(
        "children and doomed's volume claims to go",
        TIMEOUT,
        || async {
            let sts = sts_api.get_opt("doomed").await.ok()?;
            let cm = env.api::<ConfigMap>().get_opt("doomed-config").await.ok()?;
            let secret = env
                .api::<Secret>()
                .get_opt("doomed-credentials")
                .await
                .ok()?;
            let kept_sts = sts_api.get_opt("kept").await.ok()?;
            let data0 = claims.get_opt("data-doomed-0").await.ok()?;
            let data1 = claims.get_opt("data-doomed-1").await.ok()?;
            [
                sts.is_none(),
                cm.is_none(),
                secret.is_none(),
                kept_sts.is_none(),
            ]
            .into_iter()
            .chain([data0.is_none(), data1.is_none()])
            .all(|gone| gone)
            .then_some(())
        },
    )
    .await
    .unwrap();
    // The annotated cluster's claim is the same claim, not deleted and not made anew.
    let still = claims.get("data-kept-0").await.unwrap();
    assert_eq!(still.metadata.uid, kept_claim.metadata.uid);
    assert!(still.metadata.deletion_timestamp.is_none());
    // Deleted with the Orphan policy: its StatefulSet stays, and so do the claims it uses.
    assert!(sts_api.get_opt("orphaned").await.unwrap().is_some());
    let still = claims.get("data-orphaned-0").await.unwrap();
    assert_eq!(still.metadata.uid, orphaned_claim.metadata.uid);
    assert!(still.metadata.deletion_timestamp.is_none());

    let env = &env;
    let notes = |name: &'static str| async move {
        support::operator_events_about(&env.client, &env.namespace, name)
            .await
            .into_iter()
            .filter(|(reason, _, _)| reason == "Deleting")
            .map(|(_, note, _)| note)
            .collect::<Vec<_>>()
    };
    let doomed = notes("doomed").await;
    assert!(
        doomed
            .iter()
            .any(|n| n.contains("its 2 volume claims deleted")),
        "{doomed:?}"
    );
    let kept = notes("kept").await;
    assert!(
        kept.iter().any(|n| n.contains("its volumes are kept")),
        "{kept:?}"
    );
    let orphaned = notes("orphaned").await;
    assert!(
        orphaned
            .iter()
            .any(|n| n.contains("propagationPolicy Orphan")),
        "{orphaned:?}"
    );
}

/// Deleted with `--cascade=orphan` (its StatefulSet, pods, claims and Secrets stay) and
/// created again under the same name: the new cluster adopts what the old one left — nothing
/// made anew, the same password, the same pod — and is Ready on it; the event says so.
#[tokio::test]
async fn a_cluster_created_again_after_an_orphaning_delete_adopts_what_it_left() {
    let env = start("adopt").await;
    let dbs = env.dbs();
    dbs.create(&PostParams::default(), &database("shop", 1))
        .await
        .unwrap();
    let first = env.wait_db("shop", "Ready", |db| is_ready(db, 1)).await;
    let first_uid = first.metadata.uid.clone().unwrap();
    let password_before = password(&env, "shop").await;
    let pod_before = env.api::<Pod>().get("shop-0").await.unwrap();
    // Every kind of child the cluster has, by name, with its uid.
    let children = [
        ("StatefulSet", "shop"),
        ("ConfigMap", "shop-config"),
        ("Secret", "shop-credentials"),
        ("Secret", "shop-replication"),
        ("Service", "shop-rw"),
        ("Service", "shop-headless"),
    ];
    let env = &env;
    let meta = |kind: &'static str, name: &'static str| async move {
        let meta = match kind {
            "StatefulSet" => env.api::<StatefulSet>().get(name).await.map(|o| o.metadata),
            "ConfigMap" => env.api::<ConfigMap>().get(name).await.map(|o| o.metadata),
            "Secret" => env.api::<Secret>().get(name).await.map(|o| o.metadata),
            _ => env.api::<Service>().get(name).await.map(|o| o.metadata),
        };
        meta.unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
    };
    let controller = support::controller_uid;
    let mut before = Vec::new();
    for (kind, name) in children {
        let meta = meta(kind, name).await;
        assert_eq!(
            controller(&meta).as_deref(),
            Some(first_uid.as_str()),
            "{kind} {name}"
        );
        before.push(meta.uid.unwrap());
    }

    dbs.delete("shop", &DeleteParams::orphan()).await.unwrap();
    wait_gone(&dbs, "shop", &first_uid).await;
    for (kind, name) in children {
        devctl_testenv::eventually(&format!("{kind} {name} orphaned"), TIMEOUT, || async {
            controller(&meta(kind, name).await).is_none().then_some(())
        })
        .await
        .unwrap();
    }

    // Created again with other replicas: adopting would scale pods it did not make, so
    // nothing is adopted (not even the children listed before the StatefulSet) and it says
    // why. Deleting it leaves the orphans and their volumes as they were.
    dbs.create(&PostParams::default(), &database("shop", 2))
        .await
        .unwrap();
    let refused = env
        .wait_db("shop", "Stalled with ChildNotOwned", |db| {
            db.metadata.uid.as_deref() != Some(first_uid.as_str())
                && condition_status(db, "Stalled") == Some(("True".into(), "ChildNotOwned".into()))
        })
        .await;
    let message =
        &devctl_api::conditions::find(&refused.status.as_ref().unwrap().conditions, "Stalled")
            .unwrap()
            .message;
    assert!(
        message.contains(
            "running 1 × postgres (postgres:16.2), where this resource asks for 2 × postgres"
        ),
        "{message}"
    );
    for (kind, name) in children {
        assert_eq!(
            controller(&meta(kind, name).await),
            None,
            "{kind} {name}: not adopted"
        );
    }
    let refused_uid = refused.metadata.uid.clone().unwrap();
    dbs.delete("shop", &DeleteParams::default()).await.unwrap();
    wait_gone(&dbs, "shop", &refused_uid).await;
    for ((kind, name), uid) in children.into_iter().zip(&before) {
        assert_eq!(
            meta(kind, name).await.uid.as_ref(),
            Some(uid),
            "{kind} {name}: still there"
        );
    }
    assert!(
        env.api::<PersistentVolumeClaim>()
            .get_opt("data-shop-0")
            .await
            .unwrap()
            .is_some()
    );

    dbs.create(&PostParams::default(), &database("shop", 1))
        .await
        .unwrap();
    let second = env
        .wait_db("shop", "Ready on what the first left", |db| {
            is_ready(db, 1) && db.metadata.uid.as_deref() != Some(first_uid.as_str())
        })
        .await;
    let second_uid = second.metadata.uid.clone().unwrap();
    assert_eq!(
        condition_status(&second, "Stalled").map(|(s, _)| s),
        Some("False".into())
    );
    for ((kind, name), uid) in children.into_iter().zip(&before) {
        let meta = meta(kind, name).await;
        assert_eq!(
            meta.uid.as_ref(),
            Some(uid),
            "{kind} {name}: the same object"
        );
        assert_eq!(
            controller(&meta).as_deref(),
            Some(second_uid.as_str()),
            "{kind} {name}: controlled by the new cluster"
        );
    }
    assert_eq!(
        password(env, "shop").await,
        password_before,
        "the same password"
    );
    let pod = env.api::<Pod>().get("shop-0").await.unwrap();
    assert_eq!(pod.metadata.uid, pod_before.metadata.uid, "the same pod");
    let notes: Vec<String> = support::operator_events_about(&env.client, &env.namespace, "shop")
        .await
        .into_iter()
        .map(|(_, note, _)| note)
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("Adopted ") && n.contains("StatefulSet shop")),
        "{notes:?}"
    );
}

#[tokio::test]
async fn a_pod_no_node_can_hold_is_reported_and_replaced_once_the_spec_is_fixed() {
    let env = start("unschedulable").await;
    let dbs = env.dbs();
    let mut greedy = database("greedy", 1);
    // The simulated nodes have 32 CPUs each.
    greedy.spec.resources =
        serde_json::from_value(json!({ "requests": { "cpu": "64", "memory": "1Gi" } })).unwrap();
    dbs.create(&PostParams::default(), &greedy).await.unwrap();
    let stuck = env
        .wait_db(
            "greedy",
            "an instance message naming the scheduler's reason",
            |db| {
                db.status.as_ref().is_some_and(|s| {
                    s.instances.iter().any(|i| {
                        i.message.as_deref().is_some_and(|m| {
                            m.starts_with("the pod cannot be scheduled: ")
                                && m.contains("Insufficient cpu")
                        })
                    })
                })
            },
        )
        .await;
    let ready = devctl_api::conditions::find(&stuck.status.as_ref().unwrap().conditions, "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.status, "False");
    assert!(
        ready
            .message
            .contains("greedy-0: the pod cannot be scheduled"),
        "{ready:?}"
    );
    let old_uid = env
        .api::<k8s_openapi::api::core::v1::Pod>()
        .get("greedy-0")
        .await
        .unwrap()
        .metadata
        .uid;

    // The StatefulSet replaces pods only when told (OnDelete): the operator replaces the
    // pending pod, which serves nothing, without waiting for it to become ready first.
    dbs.patch(
        "greedy",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "resources": { "requests": { "cpu": "250m" } } } })),
    )
    .await
    .unwrap();
    env.wait_db("greedy", "Ready with 1 on the fixed template", |db| {
        is_ready(db, 1)
    })
    .await;
    let pod = env
        .api::<k8s_openapi::api::core::v1::Pod>()
        .get("greedy-0")
        .await
        .unwrap();
    assert_ne!(pod.metadata.uid, old_uid, "the pending pod was replaced");
}

#[tokio::test]
async fn minor_upgrades_roll_and_downgrades_are_refused() {
    let env = start("upgrade").await;
    let dbs = env.dbs();
    dbs.create(&PostParams::default(), &database("versioned", 2))
        .await
        .unwrap();
    env.wait_db("versioned", "Ready with 2", |db| is_ready(db, 2))
        .await;

    dbs.patch(
        "versioned",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "version": "16.4" } })),
    )
    .await
    .unwrap();
    env.wait_db("versioned", "running 16.4", |db| {
        is_ready(db, 2)
            && db
                .status
                .as_ref()
                .and_then(|s| s.current_version.as_deref())
                == Some("16.4")
    })
    .await;
    let sts: StatefulSet = env.api().get("versioned").await.unwrap();
    let image = sts.spec.template.spec.as_ref().unwrap().containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("postgres:16.4"));

    dbs.patch(
        "versioned",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "version": "16.1" } })),
    )
    .await
    .unwrap();
    let db = env
        .wait_db("versioned", "Degraded=True VersionChangeRefused", |db| {
            condition_status(db, "Degraded") == Some(("True".into(), "VersionChangeRefused".into()))
        })
        .await;
    let message = devctl_api::conditions::find(&db.status.unwrap().conditions, "Degraded")
        .unwrap()
        .message
        .clone();
    assert!(message.contains("downgrade from 16.4 to 16.1"), "{message}");
    let sts: StatefulSet = env.api().get("versioned").await.unwrap();
    let image = sts.spec.template.spec.as_ref().unwrap().containers[0]
        .image
        .clone();
    assert_eq!(
        image.as_deref(),
        Some("postgres:16.4"),
        "a refused downgrade must not roll the pods"
    );
    // GitOps tools see a failure that needs a human, naming the field and the reason.
    let refused = devctl_testenv::kstatus::compute(
        &serde_json::to_value(dbs.get("versioned").await.unwrap()).unwrap(),
    );
    assert_eq!(
        refused.status,
        devctl_testenv::kstatus::Status::Failed,
        "{refused:?}"
    );
    assert!(
        refused.message.contains("spec.version") && refused.message.contains("downgrade"),
        "{refused:?}"
    );

    // Back to the running version: nothing blocks any more.
    dbs.patch(
        "versioned",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "version": "16.4" } })),
    )
    .await
    .unwrap();
    let db = env
        .wait_db("versioned", "Ready again at 16.4", |db| is_ready(db, 2))
        .await;
    assert_eq!(
        condition_status(&db, "Stalled").map(|(s, _)| s),
        Some("False".into())
    );
    let current = devctl_testenv::kstatus::compute(&serde_json::to_value(&db).unwrap());
    assert_eq!(
        current.status,
        devctl_testenv::kstatus::Status::Current,
        "{current:?}"
    );
}

/// A cluster admitted with the finalizer and deleted before it ever made a data volume holds
/// no data: its deletion takes no final backup and does not wait for one, though
/// `finalBackup` asks for it.
#[tokio::test]
async fn a_cluster_deleted_before_it_ran_takes_no_final_backup() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("never-ran").await.unwrap();
    let mut operator = support::OperatorProcess::start(
        cluster,
        &namespace,
        devctl_operator::manifests::RULES,
        &[],
    )
    .await;
    operator.wait_ready().await;
    // Stopped: nothing reconciles the cluster between its creation and its deletion.
    operator.stop();
    let client = cluster.client().await.unwrap();
    let dbs: kube::Api<DatabaseCluster> = kube::Api::namespaced(client.clone(), &namespace);
    let mut db = database("never-ran", 1);
    db.metadata.finalizers = Some(vec![devctl_api::database_cluster::FINALIZER.into()]);
    db.spec.backup = Some(
        serde_json::from_value(json!({
            "enabled": true, "finalBackup": true,
            "destination": { "endpoint": "https://127.0.0.1:9", "bucket": "none",
                             "credentialsSecret": "no-such-secret" },
        }))
        .unwrap(),
    );
    let created = dbs.create(&PostParams::default(), &db).await.unwrap();
    dbs.delete("never-ran", &DeleteParams::default())
        .await
        .unwrap();

    operator.restart();
    // The default finalBackupTimeout is 10 minutes: waiting for a backup would show here.
    wait_gone(&dbs, "never-ran", &created.uid().unwrap()).await;
    let backups: kube::Api<devctl_api::database_backup::DatabaseBackup> =
        kube::Api::namespaced(client.clone(), &namespace);
    assert!(
        backups.get_opt("never-ran-final").await.unwrap().is_none(),
        "no final backup of a cluster that never ran"
    );
    let skipped = support::events_matching(&client, &namespace, "never-ran", |e| {
        e.reason.as_deref() == Some("FinalBackupSkipped") && e.type_.as_deref() == Some("Normal")
    })
    .await;
    assert!(
        skipped
            .iter()
            .any(|(_, note, _)| note.contains("never made a data volume")),
        "{skipped:#?}\n{}",
        operator.logs()
    );
}

/// The mutating webhook admits a new cluster with the finalizer (tests/webhooks.rs); its
/// first reconcile then spends no write on it, and one created without the webhooks gets it
/// from the reconciler.
#[tokio::test]
async fn a_cluster_admitted_with_the_finalizer_costs_no_finalizer_write() {
    let env = start("admitted").await;
    let audit = env.cluster.audit_log().unwrap();
    let mark = audit.mark();
    let mut admitted = database("admitted", 1);
    admitted.metadata.finalizers = Some(vec![devctl_api::database_cluster::FINALIZER.into()]);
    env.dbs()
        .create(&PostParams::default(), &admitted)
        .await
        .unwrap();
    env.dbs()
        .create(&PostParams::default(), &database("plain", 1))
        .await
        .unwrap();
    for name in ["admitted", "plain"] {
        let db = env.wait_db(name, "Ready", |db| is_ready(db, 1)).await;
        assert_eq!(
            db.finalizers(),
            [devctl_api::database_cluster::FINALIZER],
            "{name}"
        );
    }
    let writes = env.operator_writes_since(mark);
    let finalizer_writes = |name: &str| {
        writes
            .iter()
            .filter(|r| {
                r.resource == "databaseclusters"
                    && r.subresource.is_none()
                    && r.name.as_deref() == Some(name)
            })
            .count()
    };
    assert_eq!(
        finalizer_writes("admitted"),
        0,
        "no write adds what is there"
    );
    assert_eq!(finalizer_writes("plain"), 1, "the reconciler adds it once");
}

#[tokio::test]
async fn a_denied_child_becomes_a_condition_and_an_event_and_is_retried_with_backoff() {
    let env = start("denied").await;
    // A ValidatingAdmissionPolicy that denies the ConfigMap of this cluster only.
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": format!("deny-{}", env.namespace) },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{ "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"] }]
            },
            "validations": [{ "expression": "object.metadata.name != 'blocked-config'", "message": "blocked by test policy", "reason": "Forbidden" }]
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": format!("deny-{}", env.namespace) },
        "spec": {
            "policyName": format!("deny-{}", env.namespace),
            "validationActions": ["Deny"],
            "matchResources": { "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": env.namespace } } }
        }
    });
    let dynamic = |kind: &str| {
        let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
        let plural = if kind.ends_with("Policy") {
            format!("{}ies", kind.to_lowercase().trim_end_matches('y'))
        } else {
            format!("{}s", kind.to_lowercase())
        };
        kube::api::Api::<kube::api::DynamicObject>::all_with(
            env.client.clone(),
            &kube::discovery::ApiResource::from_gvk_with_plural(&gvk, &plural),
        )
    };
    let pp = PatchParams::apply("test").force();
    let name = format!("deny-{}", env.namespace);
    dynamic("ValidatingAdmissionPolicy")
        .patch(&name, &pp, &Patch::Apply(&policy))
        .await
        .unwrap();
    dynamic("ValidatingAdmissionPolicyBinding")
        .patch(&name, &pp, &Patch::Apply(&binding))
        .await
        .unwrap();
    // Policies take effect asynchronously: wait until a probe ConfigMap is denied.
    let probe_api = env.api::<ConfigMap>();
    devctl_testenv::eventually("the admission policy to deny", TIMEOUT, || async {
        let cm: ConfigMap =
            serde_json::from_value(json!({ "metadata": { "name": "blocked-config" } })).ok()?;
        match probe_api
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &cm,
            )
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("blocked by test policy") => Some(()),
            _ => None,
        }
    })
    .await
    .unwrap();

    let audit = env.cluster.audit_log().unwrap();
    let mark = audit.mark();
    env.dbs()
        .create(&PostParams::default(), &database("blocked", 1))
        .await
        .unwrap();
    let db = env
        .wait_db("blocked", "Ready=False with the denial", |db| {
            condition_status(db, "Degraded").is_some_and(|(s, _)| s == "True")
        })
        .await;
    let ready = devctl_api::conditions::find(&db.status.as_ref().unwrap().conditions, "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("ConfigMap blocked-config")
            && ready.message.contains("blocked by test policy"),
        "{}",
        ready.message
    );
    let denied = devctl_testenv::kstatus::compute(&serde_json::to_value(&db).unwrap());
    assert_eq!(
        denied.status,
        devctl_testenv::kstatus::Status::Failed,
        "{denied:?}"
    );
    assert!(
        denied.message.contains("blocked by test policy"),
        "{denied:?}"
    );

    // Retried with growing delays (1 s, 2 s, 4 s, 8 s, ...), not in a tight loop.
    let attempts = devctl_testenv::eventually(
        "five apply attempts of the denied ConfigMap",
        TIMEOUT,
        || async {
            let attempts: Vec<_> = audit
                .requests_since(mark)
                .ok()?
                .into_iter()
                .filter(|r| {
                    r.user == OPERATOR_USER
                        && r.verb == "patch"
                        && r.resource == "configmaps"
                        && r.name.as_deref() == Some("blocked-config")
                })
                .collect();
            (attempts.len() >= 5).then_some(attempts)
        },
    )
    .await
    .unwrap();
    let times: Vec<i64> = attempts
        .iter()
        .map(|r| {
            r.received
                .as_deref()
                .unwrap()
                .parse::<k8s_openapi::jiff::Timestamp>()
                .unwrap()
                .as_millisecond()
        })
        .collect();
    let gaps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // Each gap is the backoff delay (±10 % jitter) plus a reconcile's own time, which a
    // loaded machine stretches by up to two seconds (seen: 2.8, 2.7, 4.1, 8.0 s while
    // another suite compiled): the growth is judged from the first gap to the fourth
    // (1 s → 8 s), not pair by pair. A fixed or no delay keeps the ratio near 1.
    assert!(
        gaps.iter().all(|&g| g >= 800),
        "no retry sooner than about a second: {gaps:?} ms"
    );
    assert!(
        gaps[3] >= 2 * gaps[0],
        "delays must grow (about 1, 2, 4, 8 s): {gaps:?} ms"
    );

    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("blocked")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("blocked by test policy"))),
        "no Warning event for the denial"
    );

    // Lifting the denial: the next retry succeeds and the condition clears.
    dynamic("ValidatingAdmissionPolicyBinding")
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    dynamic("ValidatingAdmissionPolicy")
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let db = env
        .wait_db("blocked", "Ready after the denial was lifted", |db| {
            is_ready(db, 1) && condition_status(db, "Degraded").is_some_and(|(s, _)| s == "False")
        })
        .await;
    let lifted = devctl_testenv::kstatus::compute(&serde_json::to_value(&db).unwrap());
    assert_eq!(
        lifted.status,
        devctl_testenv::kstatus::Status::Current,
        "{lifted:?}"
    );
}

#[tokio::test]
async fn kubectl_explain_describes_the_fields() {
    let env = start("explain").await;
    let what = "kubectl explain databasecluster.spec.storage to show the field descriptions";
    let text = devctl_testenv::eventually(what, TIMEOUT, || async {
        let out = env
            .cluster
            .kubectl()
            .args(["explain", "databasecluster.spec.storage"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.success() && text.contains("storageClassName")).then_some(text)
    })
    .await
    .unwrap();
    assert!(
        text.contains("Persistent storage for each instance"),
        "{text}"
    );
    assert!(
        text.contains("can grow") && text.contains("never shrink"),
        "{text}"
    );
}

/// The caches keep children slim (metadata and a content fingerprint; no Secret data at
/// all), and drift is still found and undone: hand edits of the StatefulSet, the ConfigMap's
/// data and the Secret's data, and a deleted Service — then quiet again, with the password
/// unchanged throughout.
#[tokio::test]
async fn slim_caches_still_restore_drift_and_hold_no_secret_data() {
    let mut env = start("slim").await;
    let dbs = env.dbs();
    dbs.create(&PostParams::default(), &database("slim", 1))
        .await
        .unwrap();
    env.wait_db("slim", "Ready", |db| is_ready(db, 1)).await;
    let password_before = password(&env, "slim").await;

    let assert_slim = |env: &support::Env| {
        // Secrets and ConfigMaps are known by their metadata only: no object, so no data.
        for (kind, name) in [
            ("Secret", "slim-credentials"),
            ("Secret", "slim-replication"),
            ("ConfigMap", "slim-config"),
        ] {
            let live = env
                .caches
                .kind(kind)
                .expect("the kind is cached")
                .meta(&env.namespace, name)
                .unwrap_or_else(|| panic!("{kind} {name} is known to the cache"));
            assert!(
                live.hash.is_some() && live.content.is_some() && live.controller.is_some(),
                "{kind} {name}: {live:?}"
            );
        }
        for name in ["slim-credentials", "slim-replication"] {
            assert!(
                env.caches.get::<Secret>(&env.namespace, name).is_none(),
                "Secret {name} is cached as an object (with its data)"
            );
        }
        assert!(
            env.caches
                .get::<ConfigMap>(&env.namespace, "slim-config")
                .is_none(),
            "the ConfigMap is cached as an object (with its data)"
        );
        let sts = env
            .caches
            .get::<StatefulSet>(&env.namespace, "slim")
            .expect("the StatefulSet is cached");
        let pod = sts.spec.template.spec.as_ref().expect("containers kept");
        assert!(
            pod.containers
                .iter()
                .all(|c| c.env.is_none() && c.image.is_some()),
            "the StatefulSet is cached with more than the images"
        );
        assert!(pod.volumes.is_none() && pod.init_containers.is_none());
    };
    assert_slim(&env);

    // Hand edits by another field manager, each undone.
    let hand = PatchParams::default();
    let sts_api = env.api::<StatefulSet>();
    sts_api
        .patch(
            "slim",
            &hand,
            &Patch::Strategic(json!({ "spec": { "template": { "spec": { "containers": [
                { "name": "postgres", "image": "postgres:hand-edited" }
            ] } } } })),
        )
        .await
        .unwrap();
    let config_api = env.api::<ConfigMap>();
    config_api
        .patch(
            "slim-config",
            &hand,
            &Patch::Merge(json!({ "data": { "postgresql.conf": "fsync = off\n" } })),
        )
        .await
        .unwrap();
    let secret_api = env.api::<Secret>();
    let evil = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "evil.example");
    secret_api
        .patch(
            "slim-credentials",
            &hand,
            &Patch::Merge(json!({ "data": { "host": evil } })),
        )
        .await
        .unwrap();
    let services = env.api::<Service>();
    let old_service = services.get("slim-rw").await.unwrap();
    services
        .delete("slim-rw", &DeleteParams::background())
        .await
        .unwrap();

    devctl_testenv::eventually("every hand edit undone", TIMEOUT, || async {
        let sts = sts_api.get("slim").await.ok()?;
        let image = sts
            .spec
            .template
            .spec
            .as_ref()?
            .containers
            .first()?
            .image
            .clone()?;
        let config = config_api.get("slim-config").await.ok()?;
        let conf = config.data?.get("postgresql.conf")?.clone();
        let secret = secret_api.get("slim-credentials").await.ok()?;
        let host = secret.data?.get("host")?.0.clone();
        let service = services.get("slim-rw").await.ok()?;
        (image.starts_with("postgres:16")
            && conf.contains("shared_buffers")
            && host != b"evil.example"
            && service.uid() != old_service.uid())
        .then_some(())
    })
    .await
    .unwrap();
    // The restore's reconcile reports the StatefulSet it applied as rolling out (Ready
    // false): wait for that rollout, so Ready below is the status written after it and no
    // write of the restore lands in the steady-state window.
    devctl_testenv::eventually("the restored StatefulSet to roll out", TIMEOUT, || async {
        let live = sts_api.get("slim").await.ok()?;
        let status = live.status.as_ref()?;
        (status.observed_generation == live.metadata.generation
            && status.update_revision.is_some()
            && status.current_revision == status.update_revision
            && status.ready_replicas == Some(1))
        .then_some(())
    })
    .await
    .unwrap();
    env.wait_db("slim", "Ready after the hand edits", |db| is_ready(db, 1))
        .await;
    assert_eq!(
        password(&env, "slim").await,
        password_before,
        "restoring the Secret must keep its password"
    );
    assert_slim(&env);

    // Converged again: forced reconciles write nothing.
    let writes = env.writes_during_forced_reconciles(&dbs, "slim", 3).await;
    assert!(
        writes.is_empty(),
        "steady-state reconciles wrote: {writes:#?}"
    );
}

/// The operator's event recorder, with its generated rights: a repeat is counted in the first
/// event's series (the first note stays), another action is another event, and a series
/// whose event was deleted starts a new event.
#[tokio::test]
async fn a_repeated_event_is_one_event_with_a_series() {
    use devctl_operator::event_recorder::{Event as Occurrence, EventType, Recorder, Reporter};
    use kube::Resource as _;
    let env = start("events").await;
    let recorder = Recorder::new(
        env.cluster.client_for(OPERATOR_USER, &[]).await.unwrap(),
        Reporter {
            controller: "devctl-operator".into(),
            instance: Some("under-test".into()),
        },
    );
    let config: ConfigMap =
        serde_json::from_value(json!({ "metadata": { "name": "regarding" } })).unwrap();
    let regarding = env
        .api::<ConfigMap>()
        .create(&PostParams::default(), &config)
        .await
        .unwrap()
        .object_ref(&());
    let occurrence = |action: &str, note: &str| Occurrence {
        type_: EventType::Warning,
        reason: "Tested".into(),
        note: Some(note.into()),
        action: action.into(),
        secondary: None,
    };
    for note in ["first", "second", "third"] {
        recorder
            .publish(&occurrence("Retry", note), &regarding)
            .await
            .unwrap();
    }
    recorder
        .publish(&occurrence("Other", "apart"), &regarding)
        .await
        .unwrap();
    let events = env.api::<Event>();
    let tested = || async {
        let mut list: Vec<(String, String, i32)> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Tested"))
            .map(|e| {
                (
                    e.action.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                    e.series.map(|s| s.count).unwrap_or(1),
                )
            })
            .collect();
        list.sort();
        list
    };
    assert_eq!(
        tested().await,
        [
            ("Other".to_string(), "apart".to_string(), 1),
            ("Retry".to_string(), "first".to_string(), 3),
        ]
    );

    let retry = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|e| e.action.as_deref() == Some("Retry"))
        .unwrap();
    events
        .delete(&retry.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    recorder
        .publish(&occurrence("Retry", "fourth"), &regarding)
        .await
        .unwrap();
    assert_eq!(
        tested().await,
        [
            ("Other".to_string(), "apart".to_string(), 1),
            ("Retry".to_string(), "fourth".to_string(), 1),
        ]
    );
}

/// A pod that goes while the cluster is being deleted (here: after devctl's cleanup, while
/// another finalizer still holds the cluster) is not made again with a new claim: the
/// cleanup deletes the StatefulSet before it lists the claims.
#[tokio::test]
async fn no_claim_is_made_again_after_the_cleanup() {
    let env = start("delete-race").await;
    let dbs = env.dbs();
    let mut held = database("held", 1);
    held.metadata.finalizers = Some(vec!["test.devctl.io/hold".into()]);
    dbs.create(&PostParams::default(), &held).await.unwrap();
    env.wait_db("held", "Ready", |db| is_ready(db, 1)).await;
    let claims = env.api::<PersistentVolumeClaim>();
    let first = claims.get("data-held-0").await.unwrap();
    dbs.delete("held", &DeleteParams::default()).await.unwrap();
    env.wait_db("held", "devctl's finalizer done", |db| {
        !db.finalizers()
            .iter()
            .any(|f| f == devctl_api::database_cluster::FINALIZER)
    })
    .await;
    // The cluster still exists (the other finalizer), so the garbage collector has not
    // touched its children; the pod goes anyway.
    let pods = env.api::<k8s_openapi::api::core::v1::Pod>();
    let _ = pods.delete("held-0", &DeleteParams::default()).await;
    devctl_testenv::eventually(
        "the StatefulSet, its pod and the claim to go (a StatefulSet left would remake both)",
        TIMEOUT,
        || async {
            let sts = env.api::<StatefulSet>().get_opt("held").await.ok()?;
            let pod = pods.get_opt("held-0").await.ok()?;
            let claim = claims.get_opt("data-held-0").await.ok()?;
            (sts.is_none() && pod.is_none() && claim.is_none()).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e} (first claim uid {:?})", first.metadata.uid));
    dbs.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .unwrap();
}
