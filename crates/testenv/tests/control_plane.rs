//! The bare control plane behaves like a real API server.

use std::time::Duration;

use devctl_testenv::{eventually, shared_control_plane};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::runtime::watcher;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn watch_sees_a_configmap_update() {
    let cp = shared_control_plane().await.unwrap();
    let ns = cp.create_namespace("watch").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(cp.client().await.unwrap(), &ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "settings" }, "data": { "color": "blue" }
    }))
    .unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();

    let mut events = watcher(
        api.clone(),
        watcher::Config::default().fields("metadata.name=settings"),
    )
    .boxed();
    // Wait for the initial list to finish so the update is seen as a live event.
    loop {
        match tokio::time::timeout(TIMEOUT, events.next())
            .await
            .expect("watch: no InitDone")
        {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(Ok(_)) => {}
            other => panic!("watch ended early: {other:?}"),
        }
    }
    api.patch(
        "settings",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "color": "green" } })),
    )
    .await
    .unwrap();
    let updated = tokio::time::timeout(TIMEOUT, async {
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(cm)) = event {
                return cm;
            }
        }
        panic!("watch ended without the update");
    })
    .await
    .expect("the update did not arrive on the watch");
    assert_eq!(updated.data.unwrap()["color"], "green");
}

#[tokio::test]
async fn missing_credentials_get_401_and_missing_permissions_get_403() {
    let cp = shared_control_plane().await.unwrap();
    let ns = cp.create_namespace("authz").await.unwrap();

    let anonymous: Api<ConfigMap> = Api::namespaced(cp.anonymous_client().await.unwrap(), &ns);
    match anonymous.list(&Default::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 401, "{status:?}"),
        other => panic!("anonymous list should be 401, got {other:?}"),
    }

    let stranger: Api<ConfigMap> =
        Api::namespaced(cp.client_for("mallory", &["devs"]).await.unwrap(), &ns);
    match stranger.list(&Default::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status.message.contains("\"mallory\""),
                "message names the user: {}",
                status.message
            );
        }
        other => panic!("a user without RBAC should get 403, got {other:?}"),
    }
}

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "widgets.testenv.devctl.io" },
        "spec": {
            "group": "testenv.devctl.io",
            "names": { "kind": "Widget", "plural": "widgets", "singular": "widget" },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "properties": {
                                "min": { "type": "integer" },
                                "max": { "type": "integer" }
                            },
                            "x-kubernetes-validations": [{
                                "rule": "self.min <= self.max",
                                "message": "min must not exceed max"
                            }]
                        },
                        "status": {
                            "type": "object",
                            "properties": { "phase": { "type": "string" } }
                        }
                    }
                }}
            }]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn crd_with_status_subresource_and_cel_rule() {
    let cp = shared_control_plane().await.unwrap();
    cp.install_crds(&[widget_crd()]).await.unwrap();
    let ns = cp.create_namespace("crd").await.unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("testenv.devctl.io", "v1", "Widget"),
        "widgets",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(cp.client().await.unwrap(), &ns, &resource);

    let widget = |name: &str, min: i64, max: i64| {
        serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": "testenv.devctl.io/v1", "kind": "Widget",
            "metadata": { "name": name },
            "spec": { "min": min, "max": max }
        }))
        .unwrap()
    };
    let created = api
        .create(&PostParams::default(), &widget("good", 1, 3))
        .await
        .unwrap();
    let generation = created.metadata.generation;
    assert_eq!(generation, Some(1));

    let patched = api
        .patch_status(
            "good",
            &PatchParams::apply("testenv-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "testenv.devctl.io/v1", "kind": "Widget",
                "status": { "phase": "Ready" }
            })),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["phase"], "Ready");
    assert_eq!(
        patched.metadata.generation, generation,
        "a status patch must not bump the generation"
    );

    match api
        .create(&PostParams::default(), &widget("bad", 5, 2))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("min must not exceed max"),
                "{}",
                status.message
            );
        }
        other => panic!("the CEL rule should reject min > max, got {other:?}"),
    }
}

#[tokio::test]
async fn pinned_kubectl_talks_to_the_control_plane() {
    let cp = shared_control_plane().await.unwrap();
    let ns = cp.create_namespace("kubectl").await.unwrap();
    let output = cp
        .kubectl()
        .args([
            "create",
            "configmap",
            "from-kubectl",
            "-n",
            &ns,
            "--from-literal=k=v",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let output = cp
        .kubectl()
        .args(["version", "-o", "json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let version: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        version["clientVersion"]["gitVersion"],
        cp.kubernetes_version()
    );
    assert_eq!(
        version["serverVersion"]["gitVersion"],
        cp.kubernetes_version()
    );

    let api: Api<ConfigMap> = Api::namespaced(cp.client().await.unwrap(), &ns);
    let cm = api.get("from-kubectl").await.unwrap();
    assert_eq!(cm.data.unwrap()["k"], "v");
}

#[tokio::test]
async fn audit_log_counts_requests_by_user() {
    let cp = shared_control_plane().await.unwrap();
    let audit = cp
        .audit_log()
        .expect("the shared control plane logs audit events");
    let ns = cp.create_namespace("audit").await.unwrap();
    let mark = audit.mark();
    let api: Api<ConfigMap> = Api::namespaced(cp.client().await.unwrap(), &ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({ "metadata": { "name": "counted" } })).unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    api.get("counted").await.unwrap();

    let requests = eventually(
        "the audit log to show the create and the get",
        TIMEOUT,
        || async {
            let requests = audit.requests_since(mark).ok()?;
            let mine: Vec<_> = requests
                .into_iter()
                .filter(|r| r.namespace.as_deref() == Some(&ns))
                .collect();
            (mine.len() >= 2).then_some(mine)
        },
    )
    .await
    .unwrap();
    let counts = devctl_testenv::audit::count_by_verb_resource_user(&requests);
    let admin = devctl_testenv::control_plane::ADMIN_USER.to_string();
    assert_eq!(
        counts.get(&("create".into(), "configmaps".into(), admin.clone())),
        Some(&1)
    );
    assert_eq!(
        counts.get(&("get".into(), "configmaps".into(), admin)),
        Some(&1)
    );
    assert_eq!(requests.iter().filter(|r| r.is_write()).count(), 1);
}
