//! The WebApp controller against the real control plane (`Cluster` mode).

mod support;

use devctl_api::web_app::WebApp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, PodSpec, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use support::{TIMEOUT, assert_rejected, start};

fn web_app(name: &str) -> WebApp {
    serde_json::from_value(json!({
        "apiVersion": "apps.devctl.io/v1", "kind": "WebApp",
        "metadata": { "name": name },
        "spec": { "image": "myregistry/myapp:v2.1.0", "replicas": 5, "port": 8080 }
    }))
    .unwrap()
}

fn condition(app: &WebApp, type_: &str) -> Option<String> {
    let status = app.status.as_ref()?;
    Some(
        devctl_api::conditions::find(&status.conditions, type_)?
            .status
            .clone(),
    )
}

fn available_with(app: &WebApp, replicas: i32) -> bool {
    condition(app, "Available").as_deref() == Some("True")
        && condition(app, "Ready").as_deref() == Some("True")
        && app
            .status
            .as_ref()
            .is_some_and(|s| s.ready_replicas == replicas && s.available_replicas == replicas)
        && app.status.as_ref().and_then(|s| s.observed_generation) == app.metadata.generation
}

async fn deployment_matches(
    env: &support::Env,
    what: &str,
    check: impl Fn(&Deployment) -> bool + Send + 'static,
) -> Deployment {
    let wait = await_condition(
        env.api::<Deployment>(),
        "my-service-deployment",
        move |d: Option<&Deployment>| d.is_some_and(&check),
    );
    tokio::time::timeout(TIMEOUT, wait)
        .await
        .unwrap_or_else(|_| {
            panic!("timed out after {TIMEOUT:?} waiting for the Deployment: {what}")
        })
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn seed_sample_becomes_available_is_idempotent_and_heals() {
    let mut env = start("webapp").await;
    let apps = env.web_apps();
    apps.create(&PostParams::default(), &web_app("my-service"))
        .await
        .unwrap();
    env.wait_web_app("my-service", "Available with 5 ready pods", |a| {
        available_with(a, 5)
    })
    .await;

    let deployment: Deployment = env.api().get("my-service-deployment").await.unwrap();
    let spec = &deployment.spec;
    assert_eq!(spec.replicas, Some(5));
    let container = &spec.template.spec.as_ref().unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("myregistry/myapp:v2.1.0"));
    assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 8080);
    let service: Service = env.api().get("my-service-svc").await.unwrap();
    let port = &service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
    assert_eq!(port.port, 80);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8080))
    );

    let out = env
        .cluster
        .kubectl()
        .args(["get", "wa", "-n", &env.namespace])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "IMAGE", "REPLICAS", "READY", "AGE"]);
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["my-service", "myregistry/myapp:v2.1.0", "5", "5"]
    );

    // Idempotency: forced reconciles of a converged WebApp make zero write requests.
    let writes = env
        .writes_during_forced_reconciles(&apps, "my-service", 5)
        .await;
    assert!(
        writes.is_empty(),
        "steady-state reconciles wrote: {writes:#?}"
    );
    let selector = ListParams::default().labels("app.kubernetes.io/instance=my-service");
    assert_eq!(
        env.api::<Deployment>()
            .list(&selector)
            .await
            .unwrap()
            .items
            .len(),
        1,
        "no duplicate Deployment"
    );
    assert_eq!(
        env.api::<Service>()
            .list(&selector)
            .await
            .unwrap()
            .items
            .len(),
        1,
        "no duplicate Service"
    );

    // Changing image and replicas updates the Deployment in place.
    let uid = deployment.metadata.uid.clone().unwrap();
    let change = json!({ "spec": { "image": "myregistry/myapp:v2.2.0", "replicas": 3 } });
    apps.patch(
        "my-service",
        &PatchParams::default(),
        &Patch::Merge(&change),
    )
    .await
    .unwrap();
    let updated = deployment_matches(&env, "image v2.2.0 and 3 replicas", |d| {
        d.spec.replicas == Some(3)
            && d.spec.template.spec.as_ref().is_some_and(|p| {
                p.containers[0].image.as_deref() == Some("myregistry/myapp:v2.2.0")
            })
    })
    .await;
    assert_eq!(
        updated.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "updated in place, not recreated"
    );
    env.wait_web_app("my-service", "Available with 3 ready pods", |a| {
        available_with(a, 3)
    })
    .await;

    // Self-heal: a deleted Deployment comes back, hand-changed replicas are restored.
    env.api::<Deployment>()
        .delete("my-service-deployment", &DeleteParams::background())
        .await
        .unwrap();
    let recreated = deployment_matches(&env, "recreated", move |d| {
        d.metadata.uid.as_deref() != Some(uid.as_str())
    })
    .await;
    assert_eq!(recreated.spec.replicas, Some(3));
    env.api::<Deployment>()
        .patch(
            "my-service-deployment",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 7 } })),
        )
        .await
        .unwrap();
    deployment_matches(&env, "replicas restored to 3", |d| {
        d.spec.replicas == Some(3) && d.metadata.generation > Some(2)
    })
    .await;

    // Events are visible in `kubectl describe`.
    let out = env
        .cluster
        .kubectl()
        .args(["describe", "webapp", "my-service", "-n", &env.namespace])
        .output()
        .unwrap();
    let description = String::from_utf8_lossy(&out.stdout);
    assert!(
        description.contains("Created") && description.contains("Deployment my-service-deployment"),
        "{description}"
    );
    assert!(
        description.contains("Scaling from 5 to 3 pods"),
        "{description}"
    );
    assert!(
        description.contains("Applied")
            && description.contains("Updated Deployment my-service-deployment"),
        "{description}"
    );

    // A WebApp has no finalizer, so no reconcile sees it go: the operator forgets what it
    // remembered of it when its watch sees it deleted.
    let app_uid = env
        .web_apps()
        .get("my-service")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    assert!(
        env.caches
            .applier()
            .remembers_owner(&env.namespace, &app_uid),
        "the applier keeps the orphan scan of a live WebApp"
    );
    env.web_apps()
        .delete("my-service", &DeleteParams::default())
        .await
        .unwrap();
    devctl_testenv::eventually(
        "the operator to forget the deleted WebApp",
        std::time::Duration::from_secs(30),
        || async {
            (!env
                .caches
                .applier()
                .remembers_owner(&env.namespace, &app_uid))
            .then_some(())
        },
    )
    .await
    .unwrap();
}

/// Makes the API server admit only pods that pass Pod Security Standards `restricted` in the
/// test's namespace (the label `restricted_namespace` in crates/cli/tests/support sets).
async fn enforce_restricted(env: &support::Env) {
    let out = env
        .cluster
        .kubectl()
        .args([
            "label",
            "namespace",
            &env.namespace,
            "pod-security.kubernetes.io/enforce=restricted",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The label is enforced: a pod with no security context is refused.
    let plain: Pod = serde_json::from_value(json!({
        "metadata": { "name": "plain" },
        "spec": { "containers": [{ "name": "app", "image": "myregistry/myapp:v2.1.0" }] }
    }))
    .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match env.api::<Pod>().create(&dry_run, &plain).await {
        Err(kube::Error::Api(status)) => assert!(
            status.code == 403 && status.message.contains("violates PodSecurity \"restricted"),
            "{status:?}"
        ),
        other => panic!("a plain pod was not refused in a restricted namespace: {other:?}"),
    }
}

/// The pods of the WebApp `name` (admitted by the API server), after it is Available with
/// `replicas` ready pods.
async fn admitted_pods(env: &support::Env, name: &str, replicas: i32) -> Vec<PodSpec> {
    env.wait_web_app(name, "Available in a restricted namespace", |a| {
        available_with(a, replicas)
    })
    .await;
    let selector = ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"));
    let pods: Vec<PodSpec> = env
        .api::<Pod>()
        .list(&selector)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.spec)
        .collect();
    assert_eq!(pods.len(), replicas as usize, "pods of {name}");
    pods
}

/// `(runAsUser, runAsGroup, runAsNonRoot, automountServiceAccountToken)` of a pod spec.
fn identity(pod: &PodSpec) -> (Option<i64>, Option<i64>, Option<bool>, Option<bool>) {
    let context = pod.security_context.clone().unwrap_or_default();
    (
        context.run_as_user,
        context.run_as_group,
        context.run_as_non_root,
        pod.automount_service_account_token,
    )
}

#[tokio::test]
async fn pods_are_admitted_in_a_restricted_namespace_as_non_root_without_a_token() {
    let env = start("webapp-restricted").await;
    enforce_restricted(&env).await;
    let apps = env.web_apps();

    // Default: UID and GID 65532, no service account token.
    let mut app = web_app("default-uid");
    app.spec.replicas = 2;
    apps.create(&PostParams::default(), &app).await.unwrap();
    let pods = admitted_pods(&env, "default-uid", 2).await;
    let deployment: Deployment = env.api().get("default-uid-deployment").await.unwrap();
    let template = deployment.spec.template.spec.unwrap();
    let expected = (Some(65532), Some(65532), Some(true), Some(false));
    assert_eq!(identity(&template), expected);
    let container = template.containers[0].security_context.clone().unwrap();
    assert_eq!(container.allow_privilege_escalation, Some(false));
    for pod in pods {
        assert_eq!(identity(&pod), expected);
    }

    // A user-set UID and GID are used.
    let mut app = web_app("chosen-uid");
    app.spec.replicas = 1;
    app.spec.security_context =
        Some(serde_json::from_value(json!({ "runAsUser": 1000, "runAsGroup": 3000 })).unwrap());
    apps.create(&PostParams::default(), &app).await.unwrap();
    let pods = admitted_pods(&env, "chosen-uid", 1).await;
    let deployment: Deployment = env.api().get("chosen-uid-deployment").await.unwrap();
    let expected = (Some(1000), Some(3000), Some(true), Some(false));
    assert_eq!(identity(&deployment.spec.template.spec.unwrap()), expected);
    for pod in pods {
        assert_eq!(identity(&pod), expected);
    }
}

#[tokio::test]
async fn invalid_web_apps_are_rejected_with_field_messages() {
    let env = start("webapp-invalid").await;
    let raw = kube::api::Api::<kube::api::DynamicObject>::namespaced_with(
        env.client.clone(),
        &env.namespace,
        &kube::discovery::ApiResource::erase::<WebApp>(&()),
    );
    let cases = [
        (json!({ "replicas": 0 }), "spec.replicas"),
        (json!({ "port": 0 }), "spec.port"),
        (json!({ "port": 70000 }), "spec.port"),
        (json!({ "image": "" }), "spec.image"),
        (
            json!({ "securityContext": { "runAsUser": 0 } }),
            "spec.securityContext.runAsUser",
        ),
        (
            json!({ "securityContext": { "runAsUser": 0 } }),
            "pods must run as non-root",
        ),
        (
            json!({ "securityContext": { "runAsGroup": 0 } }),
            "spec.securityContext.runAsGroup",
        ),
        (
            json!({ "securityContext": { "runAsGroup": 0 } }),
            "root's group",
        ),
        (
            json!({ "securityContext": { "runAsUser": -1 } }),
            "spec.securityContext.runAsUser",
        ),
        (
            json!({ "securityContext": { "runAsUser": 2147483648i64 } }),
            "spec.securityContext.runAsUser",
        ),
    ];
    for (i, (overrides, field)) in cases.into_iter().enumerate() {
        let mut body = serde_json::to_value(web_app(&format!("bad-{i}"))).unwrap();
        for (k, v) in overrides.as_object().unwrap() {
            body["spec"][k] = v.clone();
        }
        assert_rejected(
            raw.create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await,
            field,
        );
    }
}

/// Deleted with `--cascade=orphan` and created again: the new WebApp adopts the same
/// Deployment and Service (nothing made anew) and is Available on them.
#[tokio::test]
async fn a_web_app_created_again_after_an_orphaning_delete_adopts_what_it_left() {
    let env = start("webapp-adopt").await;
    let apps = env.web_apps();
    let mut app = web_app("kept");
    app.spec.replicas = 1;
    apps.create(&PostParams::default(), &app).await.unwrap();
    let first = env
        .wait_web_app("kept", "Available", |a| available_with(a, 1))
        .await;
    let first_uid = first.metadata.uid.clone().unwrap();
    let controller = support::controller_uid;
    let deployments = env.api::<Deployment>();
    let services = env.api::<Service>();
    let deployment = deployments.get("kept-deployment").await.unwrap().metadata;
    let service = services.get("kept-svc").await.unwrap().metadata;
    assert_eq!(controller(&deployment), Some(first_uid.clone()));

    apps.delete("kept", &DeleteParams::orphan()).await.unwrap();
    tokio::time::timeout(
        TIMEOUT,
        await_condition(apps.clone(), "kept", conditions::is_deleted(&first_uid)),
    )
    .await
    .expect("the WebApp was not deleted")
    .unwrap();
    devctl_testenv::eventually("the Deployment and Service orphaned", TIMEOUT, || async {
        let d = deployments.get("kept-deployment").await.ok()?.metadata;
        let s = services.get("kept-svc").await.ok()?.metadata;
        (controller(&d).is_none() && controller(&s).is_none()).then_some(())
    })
    .await
    .unwrap();

    apps.create(&PostParams::default(), &app).await.unwrap();
    let second = env
        .wait_web_app("kept", "Available on what the first left", |a| {
            available_with(a, 1) && a.metadata.uid.as_deref() != Some(first_uid.as_str())
        })
        .await;
    let second_uid = second.metadata.uid.clone();
    for (what, before, now) in [
        (
            "Deployment",
            &deployment,
            deployments.get("kept-deployment").await.unwrap().metadata,
        ),
        (
            "Service",
            &service,
            services.get("kept-svc").await.unwrap().metadata,
        ),
    ] {
        assert_eq!(now.uid, before.uid, "{what}: the same object");
        assert_eq!(
            controller(&now),
            second_uid,
            "{what}: controlled by the new WebApp"
        );
    }
}

#[tokio::test]
async fn deleting_a_web_app_garbage_collects_its_children() {
    let env = start("webapp-delete").await;
    let apps = env.web_apps();
    let mut app = web_app("short-lived");
    app.spec.replicas = 1;
    apps.create(&PostParams::default(), &app).await.unwrap();
    let app = env
        .wait_web_app("short-lived", "Available", |a| available_with(a, 1))
        .await;
    apps.delete("short-lived", &DeleteParams::default())
        .await
        .unwrap();
    let uid = app.metadata.uid.unwrap();
    tokio::time::timeout(
        TIMEOUT,
        await_condition(apps.clone(), "short-lived", conditions::is_deleted(&uid)),
    )
    .await
    .expect("the WebApp was not deleted")
    .unwrap();
    devctl_testenv::eventually(
        "the Deployment and Service to be garbage-collected",
        TIMEOUT,
        || async {
            let deployment = env
                .api::<Deployment>()
                .get_opt("short-lived-deployment")
                .await
                .ok()?;
            let service = env.api::<Service>().get_opt("short-lived-svc").await.ok()?;
            (deployment.is_none() && service.is_none()).then_some(())
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_pod_no_node_can_hold_is_reported_before_the_progress_deadline_and_fixing_the_spec_mends_it()
 {
    let env = start("webapp-unschedulable").await;
    let apps = env.web_apps();
    let mut app = web_app("greedy");
    app.spec.replicas = 1;
    // The simulated nodes have 32 CPUs each.
    app.spec.resources =
        serde_json::from_value(json!({ "requests": { "cpu": "64", "memory": "128Mi" } })).unwrap();
    apps.create(&PostParams::default(), &app).await.unwrap();
    let stuck = env
        .wait_web_app("greedy", "Ready naming the scheduler's reason", |a| {
            a.status.as_ref().is_some_and(|s| {
                devctl_api::conditions::find(&s.conditions, "Ready").is_some_and(|c| {
                    c.status == "False"
                        && c.message.contains("the pod cannot be scheduled: ")
                        && c.message.contains("Insufficient cpu")
                })
            })
        })
        .await;
    let status = stuck.status.unwrap();
    let progressing = devctl_api::conditions::find(&status.conditions, "Progressing").unwrap();
    assert_eq!(progressing.status, "True", "{progressing:?}");
    assert!(
        progressing.message.starts_with("0/1 pods ready")
            && progressing.message.contains("; pod greedy-deployment-"),
        "{progressing:?}"
    );

    apps.patch(
        "greedy",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "resources": { "requests": { "cpu": "100m" } } } })),
    )
    .await
    .unwrap();
    let app = env
        .wait_web_app("greedy", "Available on the fixed spec", |a| {
            available_with(a, 1)
        })
        .await;
    let ready = devctl_api::conditions::find(&app.status.unwrap().conditions, "Ready")
        .unwrap()
        .clone();
    assert!(!ready.message.contains("cannot be scheduled"), "{ready:?}");
}
