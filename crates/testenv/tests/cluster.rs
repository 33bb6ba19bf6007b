//! The cluster mode: controllers, scheduler and kwok make workloads behave as on a real cluster.

use std::time::Duration;

use devctl_testenv::{eventually, shared_cluster};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

fn pod_template(app: &str) -> serde_json::Value {
    json!({
        "metadata": { "labels": { "app": app } },
        "spec": {
            "containers": [{ "name": "main", "image": "registry.example/app:1" }]
        }
    })
}

async fn ready_replicas<K>(api: &Api<K>, name: &str, want: i32, ready: fn(&K) -> Option<i32>)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let what = format!("{name} to have {want} ready replicas");
    let wait = await_condition(api.clone(), name, move |obj: Option<&K>| {
        obj.and_then(ready) == Some(want)
    });
    tokio::time::timeout(TIMEOUT, wait)
        .await
        .unwrap_or_else(|_| panic!("timed out after {TIMEOUT:?} waiting for {what}"))
        .unwrap();
}

#[tokio::test]
async fn deployment_and_statefulset_become_ready_through_kwok() {
    let cluster = shared_cluster().await.unwrap();
    let ns = cluster.create_namespace("workloads").await.unwrap();
    let client = cluster.client().await.unwrap();

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "spec": {
            "replicas": 3,
            "selector": { "matchLabels": { "app": "web" } },
            "template": pod_template("web")
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();

    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let statefulset: StatefulSet = serde_json::from_value(json!({
        "metadata": { "name": "db" },
        "spec": {
            "replicas": 3,
            "serviceName": "db",
            "selector": { "matchLabels": { "app": "db" } },
            "template": {
                "metadata": { "labels": { "app": "db" } },
                "spec": {
                    "containers": [{
                        "name": "main", "image": "registry.example/db:1",
                        "volumeMounts": [{ "name": "data", "mountPath": "/data" }]
                    }]
                }
            },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": { "requests": { "storage": "1Gi" } }
                }
            }]
        }
    }))
    .unwrap();
    statefulsets
        .create(&PostParams::default(), &statefulset)
        .await
        .unwrap();

    ready_replicas(&deployments, "web", 3, |d| {
        d.status.as_ref()?.ready_replicas
    })
    .await;
    ready_replicas(&statefulsets, "db", 3, |s| {
        s.status.as_ref()?.ready_replicas
    })
    .await;

    // The claims were provisioned and bound (kwok's volume stages, default storage class).
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let bound = claims.list(&ListParams::default()).await.unwrap();
    assert_eq!(bound.items.len(), 3);
    for claim in &bound.items {
        assert_eq!(
            claim.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Bound")
        );
    }

    // Deleting a pod: the StatefulSet recreates it and becomes ready again.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let old = pods.get("db-1").await.unwrap();
    let old_uid = old.metadata.uid.clone().unwrap();
    pods.delete("db-1", &DeleteParams::default()).await.unwrap();
    eventually(
        "db-1 to be recreated with a new uid and be Ready",
        TIMEOUT,
        || async {
            let pod = pods.get_opt("db-1").await.ok()??;
            let ready = pod
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (pod.metadata.uid.as_deref() != Some(old_uid.as_str()) && ready).then_some(())
        },
    )
    .await
    .unwrap();
    ready_replicas(&statefulsets, "db", 3, |s| {
        s.status.as_ref()?.ready_replicas
    })
    .await;
}

#[tokio::test]
async fn deleting_the_owner_garbage_collects_the_statefulset() {
    let cluster = shared_cluster().await.unwrap();
    let ns = cluster.create_namespace("gc").await.unwrap();
    let client = cluster.client().await.unwrap();

    let owners: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let owner = owners
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "owner" } })).unwrap(),
        )
        .await
        .unwrap();
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let statefulset: StatefulSet = serde_json::from_value(json!({
        "metadata": {
            "name": "owned",
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                "uid": owner.metadata.uid.unwrap(), "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "replicas": 1,
            "serviceName": "owned",
            "selector": { "matchLabels": { "app": "owned" } },
            "template": pod_template("owned")
        }
    }))
    .unwrap();
    let created = statefulsets
        .create(&PostParams::default(), &statefulset)
        .await
        .unwrap();
    ready_replicas(&statefulsets, "owned", 1, |s| {
        s.status.as_ref()?.ready_replicas
    })
    .await;

    owners
        .delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    let uid = created.metadata.uid.unwrap();
    let gone = await_condition(statefulsets.clone(), "owned", conditions::is_deleted(&uid));
    tokio::time::timeout(TIMEOUT, gone)
        .await
        .expect("the garbage collector did not delete the owned StatefulSet")
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    eventually(
        "the StatefulSet's pod to be garbage-collected",
        TIMEOUT,
        || async {
            pods.list(&ListParams::default().labels("app=owned"))
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        },
    )
    .await
    .unwrap();
}
