//! The reconcile core as a user sees it, with the operator binary and its generated RBAC:
//! no writes or events in steady state (normalised quantities, other managers' list elements,
//! a restart), pruning of fields we stop setting, bounded concurrency, credentials that never
//! silently lock a user out, names that fit every child, errors that are never swallowed.

mod support;

use std::time::Duration;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::web_app::WebApp;
use devctl_operator::manifests::RULES;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{
    OperatorProcess, TIMEOUT, assert_rejected, condition_status, events_about, is_ready,
    operator_events_about, operator_warnings_about,
};

fn database(name: &str, replicas: i32, extra: serde_json::Value) -> DatabaseCluster {
    let mut spec = json!({ "engine": "postgres", "version": "16.2", "replicas": replicas, "storage": { "size": "1Gi" } });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": name }, "spec": spec
    }))
    .unwrap()
}

async fn wait_db(
    dbs: &Api<DatabaseCluster>,
    name: &str,
    what: &str,
    check: impl Fn(&DatabaseCluster) -> bool,
) -> DatabaseCluster {
    let wait = kube::runtime::wait::await_condition(
        dbs.clone(),
        name,
        move |db: Option<&DatabaseCluster>| db.is_some_and(&check),
    );
    match tokio::time::timeout(TIMEOUT, wait).await {
        Ok(Ok(Some(db))) => db,
        other => {
            let current = dbs
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|d| d.status);
            panic!("{name}: {what} ({other:?}); status: {current:#?}")
        }
    }
}

/// Write requests of `user` since `mark`, from the audit log.
fn writes_since(
    cluster: &devctl_testenv::Cluster,
    mark: devctl_testenv::audit::AuditMark,
    user: &str,
) -> Vec<devctl_testenv::audit::Request> {
    cluster
        .audit_log()
        .expect("the shared cluster logs audit events")
        .requests_since(mark)
        .unwrap()
        .into_iter()
        .filter(|r| r.user == user && r.is_write())
        .collect()
}

/// Forces `times` reconciles of the DatabaseCluster `name` (an annotation change passes the
/// watch predicate) and waits for each to finish.
async fn force_reconciles(
    operator: &OperatorProcess,
    dbs: &Api<DatabaseCluster>,
    name: &str,
    times: usize,
) {
    for i in 0..times {
        let before = operator.reconciles("databasecluster");
        let poke =
            json!({ "metadata": { "annotations": { "test.devctl.io/poke": format!("{i}") } } });
        dbs.patch(name, &PatchParams::default(), &Patch::Merge(&poke))
            .await
            .unwrap();
        operator
            .wait_reconciles("databasecluster", before + 1.0)
            .await;
    }
}

#[tokio::test]
async fn normalised_quantities_and_other_managers_elements_cause_no_writes_or_events() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("steady").await.unwrap();
    let operator = OperatorProcess::start(cluster, &namespace, RULES, &[]).await;
    let client = cluster.client().await.unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let db = database(
        "halfcpu",
        1,
        json!({ "resources": { "requests": { "cpu": "0.5", "memory": "512Mi" } } }),
    );
    dbs.create(&PostParams::default(), &db).await.unwrap();
    wait_db(&dbs, "halfcpu", "Ready", |db| is_ready(db, 1)).await;
    // Under the generated least-privilege RBAC, creating a cluster meets no error on the way.
    assert_eq!(
        operator_warnings_about(&client, &namespace, "halfcpu").await,
        [],
        "operator logs:\n{}",
        operator.logs()
    );

    // Another manager injects a sidecar into the StatefulSet and adds an owner to the
    // ConfigMap: list elements that are theirs, not ours.
    let sidecar = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": { "name": "halfcpu" },
        "spec": { "template": { "spec": { "containers": [{
            "name": "log-shipper", "image": "busybox:1.36",
            "securityContext": { "allowPrivilegeEscalation": false, "runAsNonRoot": true,
                "capabilities": { "drop": ["ALL"] }, "seccompProfile": { "type": "RuntimeDefault" } }
        }] } } }
    });
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    sts.patch(
        "halfcpu",
        &PatchParams::apply("sidecar-injector").force(),
        &Patch::Apply(&sidecar),
    )
    .await
    .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let other = config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "other-owner" } })).unwrap(),
        )
        .await
        .unwrap();
    let second_owner = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "halfcpu-config",
            "ownerReferences": [{ "apiVersion": "v1", "kind": "ConfigMap", "name": "other-owner", "uid": other.metadata.uid }] }
    });
    config_maps
        .patch(
            "halfcpu-config",
            &PatchParams::apply("other-owner").force(),
            &Patch::Apply(&second_owner),
        )
        .await
        .unwrap();
    devctl_testenv::eventually(
        "the StatefulSet to roll out the sidecar",
        TIMEOUT,
        || async {
            let live = sts.get("halfcpu").await.ok()?;
            let status = live.status.as_ref()?;
            let done = live.spec.template.spec.as_ref()?.containers.len() == 2
                && status.observed_generation == live.metadata.generation
                && status.update_revision.is_some()
                && status.current_revision == status.update_revision
                && status.ready_replicas == Some(1);
            done.then_some(())
        },
    )
    .await
    .unwrap();
    wait_db(&dbs, "halfcpu", "Ready with the sidecar", |db| {
        is_ready(db, 1)
    })
    .await;
    let events_before = operator_events_about(&client, &namespace, "halfcpu").await;
    let mark = cluster.audit_log().unwrap().mark();
    force_reconciles(&operator, &dbs, "halfcpu", 3).await;
    let writes = writes_since(cluster, mark, &operator.user);
    assert!(
        writes.is_empty(),
        "steady-state reconciles wrote: {writes:#?}\n{}",
        operator.logs()
    );
    assert_eq!(
        operator_events_about(&client, &namespace, "halfcpu").await,
        events_before,
        "no new events"
    );

    let live = sts.get("halfcpu").await.unwrap();
    let containers: Vec<_> = live
        .spec
        .template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert!(
        containers.contains(&"log-shipper".to_string()),
        "the other manager's sidecar stays: {containers:?}"
    );
    let owners = config_maps
        .get("halfcpu-config")
        .await
        .unwrap()
        .metadata
        .owner_references
        .unwrap();
    assert_eq!(owners.len(), 2, "both owners stay: {owners:?}");

    // Someone else changing a field of ours is drift: it is put back.
    sts.patch(
        "halfcpu",
        &PatchParams::apply("someone").force(),
        &Patch::Apply(json!({ "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": { "name": "halfcpu" },
            "spec": { "template": { "spec": { "containers": [{ "name": "postgres", "image": "postgres:15.0" }] } } } })),
    )
    .await
    .unwrap();
    devctl_testenv::eventually("the postgres image to be put back", TIMEOUT, || async {
        let live = sts.get("halfcpu").await.ok()?;
        let image = live
            .spec
            .template
            .spec?
            .containers
            .into_iter()
            .find(|c| c.name == "postgres")?
            .image?;
        (image == "postgres:16.2").then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_field_removed_from_the_spec_is_pruned_from_the_child() {
    let env = support::start("prune").await;
    let apps = env.web_apps();
    let app: WebApp = serde_json::from_value(json!({
        "apiVersion": "apps.devctl.io/v1", "kind": "WebApp", "metadata": { "name": "limited" },
        "spec": { "image": "nginx:1.27", "replicas": 1, "port": 8080,
            "resources": { "requests": { "cpu": "100m" }, "limits": { "cpu": "1", "memory": "256Mi" } } }
    }))
    .unwrap();
    apps.create(&PostParams::default(), &app).await.unwrap();
    let deployments: Api<Deployment> = env.api();
    let limits = |d: &Deployment| {
        d.spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].resources.as_ref())
            .and_then(|r| r.limits.clone())
    };
    devctl_testenv::eventually("the Deployment with limits", TIMEOUT, || async {
        limits(&deployments.get("limited-deployment").await.ok()?).map(|_| ())
    })
    .await
    .unwrap();

    apps.patch(
        "limited",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([{ "op": "remove", "path": "/spec/resources/limits" }]))
                .unwrap(),
        ),
    )
    .await
    .unwrap();
    devctl_testenv::eventually(
        "the limits to be pruned from the Deployment",
        TIMEOUT,
        || async {
            let d = deployments.get("limited-deployment").await.ok()?;
            limits(&d).is_none().then_some(())
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_restart_over_converged_clusters_writes_nothing_and_ready_stays_true() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("restart").await.unwrap();
    let mut operator = OperatorProcess::start(cluster, &namespace, RULES, &[]).await;
    let client = cluster.client().await.unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let names = ["alpha", "bravo", "charlie"];
    for (i, name) in names.iter().enumerate() {
        let db = database(
            name,
            i as i32 + 1,
            json!({ "resources": { "requests": { "cpu": "0.25" } } }),
        );
        dbs.create(&PostParams::default(), &db).await.unwrap();
    }
    for (i, name) in names.iter().enumerate() {
        wait_db(&dbs, name, "Ready", |db| is_ready(db, i as i32 + 1)).await;
    }
    let mut events_before = Vec::new();
    for name in names {
        events_before.push(operator_events_about(&client, &namespace, name).await);
    }

    // Record every status the clusters go through from here on.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(
        String,
        Option<(String, String)>,
    )>::new()));
    let recorder = {
        let seen = seen.clone();
        let dbs = dbs.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            let stream = kube::runtime::watcher(dbs, Default::default());
            let mut stream = std::pin::pin!(kube::runtime::WatchStreamExt::applied_objects(stream));
            while let Some(Ok(db)) = stream.next().await {
                let name = kube::ResourceExt::name_any(&db);
                seen.lock()
                    .unwrap()
                    .push((name, condition_status(&db, "Ready")));
            }
        })
    };

    operator.stop();
    let mark = cluster.audit_log().unwrap().mark();
    operator.restart();
    operator.wait_ready().await;
    operator
        .wait_reconciles("databasecluster", names.len() as f64)
        .await;
    // A health requeue or a late trigger would show up within this window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    recorder.abort();

    let writes = writes_since(cluster, mark, &operator.user);
    assert!(
        writes.is_empty(),
        "the restarted operator wrote: {writes:#?}\n{}",
        operator.logs()
    );
    for (name, before) in names.iter().zip(&events_before) {
        assert_eq!(
            &operator_events_about(&client, &namespace, name).await,
            before,
            "no new events about {name}"
        );
    }
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    for (name, ready) in seen.iter() {
        assert_eq!(
            ready.as_ref().map(|(s, _)| s.as_str()),
            Some("True"),
            "{name} left Ready=True: {seen:?}"
        );
    }
}

#[tokio::test]
async fn concurrency_bounds_the_reconciles_in_flight() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("concurrency").await.unwrap();
    let operator =
        OperatorProcess::start(cluster, &namespace, RULES, &["--concurrency", "2"]).await;
    let dbs: Api<DatabaseCluster> = Api::namespaced(cluster.client().await.unwrap(), &namespace);
    let count = 50;
    for i in 0..count {
        dbs.create(
            &PostParams::default(),
            &database(&format!("db-{i:02}"), 1, json!({})),
        )
        .await
        .unwrap();
    }
    devctl_testenv::eventually(
        &format!("{count} clusters Ready"),
        Duration::from_secs(240),
        || async {
            let list = dbs.list(&Default::default()).await.ok()?;
            (list.items.iter().filter(|db| is_ready(db, 1)).count() == count).then_some(())
        },
    )
    .await
    .unwrap();
    let high_water = operator
        .metric(r#"devctl_reconciles_in_flight_max{controller="databasecluster"}"#)
        .expect("the high-water mark is exported");
    assert!(
        (1.0..=2.0).contains(&high_water),
        "in flight at most 2, got {high_water}"
    );
    assert_eq!(
        operator.metric(
            r#"controller_runtime_max_concurrent_reconciles{controller="databasecluster"}"#
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn names_must_be_dns_labels_of_at_most_50_characters() {
    let env = support::start("names").await;
    let long = "a".repeat(61);
    assert_rejected(
        env.dbs()
            .create(&PostParams::default(), &database(&long, 1, json!({})))
            .await,
        "at most 50 characters",
    );
    assert_rejected(
        env.dbs()
            .create(
                &PostParams::default(),
                &database("my.postgres", 1, json!({})),
            )
            .await,
        "DNS-1035 label",
    );
    for name in [long.as_str(), "my.app"] {
        let app: WebApp = serde_json::from_value(json!({
            "apiVersion": "apps.devctl.io/v1", "kind": "WebApp", "metadata": { "name": name },
            "spec": { "image": "nginx:1.27", "replicas": 1, "port": 8080 }
        }))
        .unwrap();
        let result = env.web_apps().create(&PostParams::default(), &app).await;
        assert_rejected(result, "metadata.name");
    }
    let fifty = "b".repeat(50);
    env.dbs()
        .create(&PostParams::default(), &database(&fifty, 1, json!({})))
        .await
        .unwrap();

    // Adding a storage class later is a change of class too.
    env.dbs()
        .create(&PostParams::default(), &database("classless", 1, json!({})))
        .await
        .unwrap();
    let add_class = json!({ "spec": { "storage": { "storageClassName": "fast" } } });
    assert_rejected(
        env.dbs()
            .patch(
                "classless",
                &PatchParams::default(),
                &Patch::Merge(&add_class),
            )
            .await,
        "storage.storageClassName is immutable",
    );
}

#[tokio::test]
async fn a_deleted_credentials_secret_is_regenerated_and_reported() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("credentials").await.unwrap();
    let operator = OperatorProcess::start(cluster, &namespace, RULES, &[]).await;
    let client = cluster.client().await.unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    dbs.create(&PostParams::default(), &database("keys", 1, json!({})))
        .await
        .unwrap();
    wait_db(&dbs, "keys", "Ready", |db| is_ready(db, 1)).await;
    let password = |s: &Secret| s.data.as_ref().unwrap()["password"].0.clone();
    let old = secrets.get("keys-credentials").await.unwrap();

    // The condition clears once the instance reports the new password applied, within a
    // second: watched from before the delete.
    let since = devctl_testenv::watch::Since::now(&dbs, "keys")
        .await
        .unwrap();
    secrets
        .delete("keys-credentials", &DeleteParams::default())
        .await
        .unwrap();
    let db = since
        .until("Degraded with CredentialsRegenerated", TIMEOUT, |db| {
            condition_status(db, "Degraded")
                == Some(("True".into(), "CredentialsRegenerated".into()))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", operator.logs()));
    let status = db.status.unwrap();
    let message = &devctl_api::conditions::find(&status.conditions, "Degraded")
        .unwrap()
        .message;
    assert!(message.contains("keys-credentials"), "{message}");
    let new = secrets.get("keys-credentials").await.unwrap();
    assert_ne!(new.metadata.uid, old.metadata.uid);
    assert_ne!(password(&new), password(&old), "a new password");
    let events = events_about(&client, &namespace, "keys").await;
    assert!(
        events
            .iter()
            .any(|(reason, _, _)| reason == "CredentialsRegenerated"),
        "{events:?}\n{}",
        operator.logs()
    );
    for (_, note, _) in &events {
        assert!(
            !note.contains(std::str::from_utf8(&password(&new)).unwrap()),
            "a password in an event"
        );
    }
    let logs = operator.logs();
    for secret in [&old, &new] {
        assert!(
            !logs.contains(std::str::from_utf8(&password(secret)).unwrap()),
            "a password in the logs"
        );
    }
}

#[tokio::test]
async fn a_credentials_secret_devctl_does_not_own_is_never_touched() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("foreign").await.unwrap();
    let _operator = OperatorProcess::start(cluster, &namespace, RULES, &[]).await;
    let client = cluster.client().await.unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let theirs: Secret = serde_json::from_value(json!({
        "metadata": { "name": "shop-credentials" }, "stringData": { "password": "their-password" }
    }))
    .unwrap();
    let theirs = secrets
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    dbs.create(&PostParams::default(), &database("shop", 1, json!({})))
        .await
        .unwrap();
    let db = wait_db(
        &dbs,
        "shop",
        "Degraded with CredentialsSecretNotOwned",
        |db| {
            condition_status(db, "Degraded")
                == Some(("True".into(), "CredentialsSecretNotOwned".into()))
        },
    )
    .await;
    let status = db.status.unwrap();
    let message = &devctl_api::conditions::find(&status.conditions, "Degraded")
        .unwrap()
        .message;
    assert!(message.contains("shop-credentials"), "{message}");
    let after = secrets.get("shop-credentials").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, theirs.metadata.resource_version,
        "untouched"
    );
    assert!(after.metadata.owner_references.is_none());
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    assert!(
        sts.get_opt("shop").await.unwrap().is_none(),
        "nothing half-made"
    );
    // The credentials are created before anything else, so the clash stops the rest too.
    let config_maps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    assert!(
        config_maps.get_opt("shop-config").await.unwrap().is_none(),
        "nothing half-made"
    );
}

/// A ConfigMap named like a cluster's child but made by someone else is never taken over,
/// whether its keys clash with the operator's or not: it is not written at all, the cluster
/// says which object is in the way and who made it, and removing it lets the cluster be made.
/// A child of the cluster that lost the label the caches select by is still the cluster's:
/// it is repaired, not refused.
#[tokio::test]
async fn a_child_someone_else_made_is_left_as_it_was() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("theirs").await.unwrap();
    let _operator = OperatorProcess::start(cluster, &namespace, RULES, &[]).await;
    let client = cluster.client().await.unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let theirs = |name: &str, key: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": { "name": name, "labels": { "team": "payments" } },
            "data": { key: "their value" },
        }))
        .unwrap()
    };
    // `cart-config` holds a key the operator renders too; `shop-config` does not.
    let mut made = Vec::new();
    for (name, key) in [("shop-config", "notes"), ("cart-config", "postgresql.conf")] {
        let created = config_maps
            .create(
                &PostParams {
                    field_manager: Some("payments-team".into()),
                    ..Default::default()
                },
                &theirs(name, key),
            )
            .await
            .unwrap();
        made.push(created);
    }
    for name in ["shop", "cart"] {
        dbs.create(&PostParams::default(), &database(name, 1, json!({})))
            .await
            .unwrap();
    }
    for (name, original) in ["shop", "cart"].into_iter().zip(&made) {
        let config_map = original.metadata.name.as_deref().unwrap();
        let db = wait_db(&dbs, name, "Stalled with ChildNotOwned", |db| {
            condition_status(db, "Stalled") == Some(("True".into(), "ChildNotOwned".into()))
        })
        .await;
        let status = db.status.unwrap();
        let message = &devctl_api::conditions::find(&status.conditions, "Stalled")
            .unwrap()
            .message;
        assert!(
            message.contains(&format!(
                "ConfigMap {config_map} exists and is not owned by this resource (made by payments-team)"
            )),
            "{message}"
        );
        let after = config_maps.get(config_map).await.unwrap();
        assert_eq!(
            after.metadata.resource_version, original.metadata.resource_version,
            "{config_map}: never written"
        );
        assert!(
            sts.get_opt(name).await.unwrap().is_none(),
            "{name}: nothing that reads its configuration was made"
        );
    }
    // Out of the way: the next attempt makes the cluster's own ConfigMap.
    config_maps
        .delete("shop-config", &DeleteParams::default())
        .await
        .unwrap();
    let owned_by_shop = |cm: &ConfigMap| {
        cm.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.kind == "DatabaseCluster" && r.name == "shop")
    };
    devctl_testenv::eventually("shop's own ConfigMap and StatefulSet", TIMEOUT, || async {
        let ours = config_maps.get_opt("shop-config").await.ok().flatten()?;
        (owned_by_shop(&ours) && sts.get_opt("shop").await.ok().flatten().is_some()).then_some(())
    })
    .await
    .unwrap();
    // shop's ConfigMap loses the label the caches select by and a key is changed: still
    // shop's by its owner reference, so both are put back.
    let label = devctl_api::labels::MANAGED_BY;
    config_maps
        .patch(
            "shop-config",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": { "labels": { label: null } },
                "data": { "postgresql.conf": "edited by hand" },
            })),
        )
        .await
        .unwrap();
    devctl_testenv::eventually("shop-config repaired", TIMEOUT, || async {
        let cm = config_maps.get("shop-config").await.ok()?;
        let labelled = kube::ResourceExt::labels(&cm).contains_key(label);
        let conf = cm.data.as_ref()?.get("postgresql.conf")?;
        (labelled && conf != "edited by hand" && owned_by_shop(&cm)).then_some(())
    })
    .await
    .unwrap();
    // The cluster that never owned `cart-config` does not take it along when deleted.
    dbs.delete("cart", &DeleteParams::default()).await.unwrap();
    devctl_testenv::eventually("cart deleted", TIMEOUT, || async {
        dbs.get_opt("cart").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
    let kept = config_maps.get("cart-config").await.unwrap();
    assert_eq!(
        kept.metadata.resource_version, made[1].metadata.resource_version,
        "cart-config: still theirs, never written"
    );
}

/// A cluster created again under the name of one just deleted finds the old cluster's
/// Secret until the garbage collector removes it (held here by a finalizer): that is a wait,
/// not a stall, and the new cluster gets its own Secret once the old one is gone.
#[tokio::test]
async fn a_cluster_created_again_waits_for_the_old_ones_children() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("again").await.unwrap();
    let _operator = OperatorProcess::start(cluster, &namespace, RULES, &[]).await;
    let client = cluster.client().await.unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let first = dbs
        .create(&PostParams::default(), &database("shop", 1, json!({})))
        .await
        .unwrap();
    let hold = json!({ "metadata": { "finalizers": ["test.devctl.io/hold"] } });
    devctl_testenv::eventually("shop's Secret, held", TIMEOUT, || async {
        secrets.get_opt("shop-credentials").await.ok()??;
        secrets
            .patch(
                "shop-credentials",
                &PatchParams::default(),
                &Patch::Merge(&hold),
            )
            .await
            .ok()
    })
    .await
    .unwrap();
    dbs.delete("shop", &DeleteParams::default()).await.unwrap();
    // Its other Secret is not held: the garbage collector removes it, which may take a
    // moment after the cluster goes; only the held one may be left when shop comes again.
    devctl_testenv::eventually(
        "shop deleted, its held Secret being deleted, its other Secret gone",
        TIMEOUT,
        || async {
            let gone = dbs.get_opt("shop").await.ok()?.is_none();
            let secret = secrets.get("shop-credentials").await.ok()?;
            let replication_gone = secrets.get_opt("shop-replication").await.ok()?.is_none();
            (gone && secret.metadata.deletion_timestamp.is_some() && replication_gone).then_some(())
        },
    )
    .await
    .unwrap();
    let again = dbs
        .create(&PostParams::default(), &database("shop", 1, json!({})))
        .await
        .unwrap();
    assert_ne!(again.metadata.uid, first.metadata.uid);
    let db = wait_db(
        &dbs,
        "shop",
        "Ready=False, WaitingForGarbageCollection",
        |db| {
            condition_status(db, "Ready")
                == Some(("False".into(), "WaitingForGarbageCollection".into()))
        },
    )
    .await;
    assert_ne!(
        condition_status(&db, "Stalled").map(|(status, _)| status),
        Some("True".into()),
        "a wait, not a stall"
    );
    let status = db.status.unwrap();
    let message = &devctl_api::conditions::find(&status.conditions, "Ready")
        .unwrap()
        .message;
    assert!(
        message
            .contains("Secret shop-credentials still belongs to the deleted DatabaseCluster shop"),
        "{message}"
    );
    secrets
        .patch(
            "shop-credentials",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    let new_uid = again.metadata.uid.unwrap();
    devctl_testenv::eventually("the new shop's own Secret", TIMEOUT, || async {
        let secret = secrets.get_opt("shop-credentials").await.ok()??;
        secret
            .metadata
            .owner_references
            .unwrap_or_default()
            .iter()
            .any(|r| r.controller == Some(true) && r.uid == new_uid)
            .then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_forbidden_watch_is_a_warning_in_the_logs() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("nowatch").await.unwrap();
    let without_pdbs: Vec<_> = RULES
        .iter()
        .copied()
        .filter(|r| !r.resources.contains(&"poddisruptionbudgets"))
        .collect();
    let operator = OperatorProcess::start(
        cluster,
        &namespace,
        &without_pdbs,
        &["--log-format", "json"],
    )
    .await;
    devctl_testenv::eventually(
        "a warning about the forbidden PodDisruptionBudget watch",
        TIMEOUT,
        || async {
            let logs = operator.logs();
            logs.lines()
                .any(|l| {
                    l.contains("\"WARN\"")
                        && l.contains("PodDisruptionBudget")
                        && l.contains("forbidden")
                })
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", operator.logs()));
    // Without every cache the operator is not ready, and says so.
    assert!(
        operator
            .http_get("/readyz")
            .unwrap()
            .starts_with("HTTP/1.1 503")
    );
}

#[tokio::test]
async fn a_label_an_older_operator_set_is_pruned_by_the_next_apply() {
    let env = support::start("upgrade").await;
    env.dbs()
        .create(&PostParams::default(), &database("legacy", 1, json!({})))
        .await
        .unwrap();
    env.wait_db("legacy", "Ready", |db| is_ready(db, 1)).await;
    // What an older devctl applied: the same ConfigMap with one more label, under our field
    // manager, with its own hash.
    let config_maps: Api<ConfigMap> = env.api();
    let live = config_maps.get("legacy-config").await.unwrap();
    let mut labels = live.metadata.labels.clone().unwrap();
    labels.insert("devctl.io/legacy".into(), "true".into());
    let old_apply = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "legacy-config", "labels": labels,
            "annotations": { "devctl.io/last-applied-hash": "0000000000000000" },
            "ownerReferences": live.metadata.owner_references },
        "data": live.data,
    });
    config_maps
        .patch(
            "legacy-config",
            &PatchParams::apply(devctl_operator::children::FIELD_MANAGER).force(),
            &Patch::Apply(&old_apply),
        )
        .await
        .unwrap();
    devctl_testenv::eventually("the legacy label to be pruned", TIMEOUT, || async {
        let cm = config_maps.get("legacy-config").await.ok()?;
        let labels = cm.metadata.labels?;
        (!labels.contains_key("devctl.io/legacy")
            && labels.contains_key("app.kubernetes.io/instance"))
        .then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_failed_status_write_does_not_hide_the_reconcile_error() {
    use devctl_operator::manifests::Rule;
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("hidden").await.unwrap();
    // May watch PodDisruptionBudgets but not create them, and may not write status.
    let mut rules: Vec<Rule> = RULES
        .iter()
        .copied()
        .filter(|r| {
            !r.resources.contains(&"poddisruptionbudgets")
                && !r.resources.contains(&"databaseclusters/status")
        })
        .collect();
    rules.push(Rule {
        group: "policy",
        resources: &["poddisruptionbudgets"],
        verbs: &["get", "list", "watch"],
    });
    let operator = OperatorProcess::start(cluster, &namespace, &rules, &[]).await;
    let client = cluster.client().await.unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    dbs.create(&PostParams::default(), &database("guarded", 3, json!({})))
        .await
        .unwrap();
    devctl_testenv::eventually(
        "a Warning event about the PodDisruptionBudget",
        TIMEOUT,
        || async {
            let events = events_about(&client, &namespace, "guarded").await;
            events
                .iter()
                .any(|(reason, note, _)| {
                    reason == "Forbidden" && note.contains("PodDisruptionBudget guarded")
                })
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", operator.logs()));

    // The controller-runtime metrics a dashboard reads are there and move.
    devctl_testenv::eventually("a retry to be counted", TIMEOUT, || async {
        let retries = operator.metric(r#"workqueue_retries_total{name="databasecluster"}"#)?;
        (retries >= 1.0).then_some(())
    })
    .await
    .unwrap();
    let text = operator.http_get("/metrics").unwrap();
    let value = |series: &str| {
        operator
            .metric(series)
            .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
    };
    assert!(value(r#"workqueue_adds_total{name="databasecluster"}"#) >= 1.0);
    assert!(value(r#"workqueue_work_duration_seconds_count{name="databasecluster"}"#) >= 1.0);
    assert!(value(r#"workqueue_queue_duration_seconds_count{name="databasecluster"}"#) >= 1.0);
    value(r#"workqueue_depth{name="databasecluster"}"#);
    value(r#"controller_runtime_active_workers{controller="databasecluster"}"#);
    assert_eq!(
        value(r#"controller_runtime_max_concurrent_reconciles{controller="databasecluster"}"#),
        4.0
    );
    let rest: f64 = text
        .lines()
        .filter(|l| l.starts_with("rest_client_requests_total{") && l.contains(r#"method="PATCH""#))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(rest >= 1.0, "PATCH requests counted:\n{text}");
    let timed = |verb: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with("rest_client_request_duration_seconds_count{")
                    && l.contains(&format!(r#"verb="{verb}""#))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(timed("PATCH") >= 1.0, "PATCH latencies recorded:\n{text}");
    assert!(timed("WATCH") >= 1.0, "watch openings timed apart:\n{text}");
    assert!(
        text.contains(r#"code="403""#),
        "the denied requests are counted by code:\n{text}"
    );
}
