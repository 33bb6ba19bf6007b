//! Watches, reconcile and error policy of the WebApp controller. No finalizer: a WebApp has
//! nothing to clean up beyond its children, which garbage collection removes.

use std::sync::Arc;

use devctl_api::web_app::WebApp;
use futures::Future;
use futures::stream::BoxStream;
use k8s_openapi::Resource as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::resources;
use super::status;
use crate::children::caches::OwnerKey;
use crate::children::{Caches, Owner, applied};
use crate::context::{Context, Settings};
use crate::database_cluster::instances;
use crate::error::{Error, Result};
use crate::reconciler::{now, publish, report, run_controller};

/// The controller as a stream of finished reconciles.
pub fn controller(
    client: Client,
    namespace: Option<String>,
    caches: Caches,
    settings: Settings,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> BoxStream<'static, crate::Reconciled> {
    run_controller::<WebApp, _, _>(
        "webapp",
        resources::KINDS,
        None,
        client,
        namespace,
        caches,
        settings,
        instance,
        shutdown,
        |app, ctx| async move { reconcile(app, &ctx).await },
    )
}

/// The WebApp an object belongs to by its labels (`app.kubernetes.io/name=webapp`,
/// `instance=<app>`): for what the Deployment's ReplicaSets create, the pods.
pub fn labelled_owner<K: Resource>(object: &K) -> Option<OwnerKey> {
    OwnerKey::by_labels::<WebApp>(object, resources::APP_NAME)
}

/// Why one of the app's pods cannot run, when Kubernetes says so (the first by name): the
/// Deployment's own conditions say so only when its progress deadline has passed.
fn pod_blocker(ctx: &Context, namespace: &str, app: &WebApp) -> Option<String> {
    let mut pods = ctx.caches.of_instance::<Pod>(namespace, &app.name_any());
    pods.retain(|pod| {
        pod.metadata.deletion_timestamp.is_none()
            && pod
                .labels()
                .get(devctl_api::labels::NAME)
                .map(String::as_str)
                == Some(resources::APP_NAME)
    });
    pods.sort_by_key(|pod| pod.name_any());
    pods.iter()
        .find_map(|pod| instances::blocker(pod).map(|why| format!("pod {}: {why}", pod.name_any())))
}

async fn reconcile(app: Arc<WebApp>, ctx: &Context) -> Result<Action> {
    if app.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the children; nothing to do.
        return Ok(Action::await_change());
    }
    let namespace = app
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let deployment_name = resources::deployment_name(&app);
    let previous = ctx.caches.get::<Deployment>(&namespace, &deployment_name);

    let converged = async {
        let desired = resources::desired(&app)?;
        let uid = app.uid().ok_or(Error::MissingField("metadata.uid"))?;
        let owner = Owner {
            namespace: &namespace,
            uid: &uid,
        };
        ctx.caches
            .applier()
            .sync(&ctx.client, &ctx.caches, owner, &desired, resources::KINDS)
            .await
    }
    .await;

    if let Some(from) = previous.as_ref().and_then(|d| d.spec.replicas)
        && from != app.spec.replicas
    {
        let note = format!("Scaling from {from} to {} pods", app.spec.replicas);
        publish(
            ctx,
            app.as_ref(),
            EventType::Normal,
            "Scaling",
            "Scale",
            note,
        )
        .await;
    }
    report(ctx, app.as_ref(), converged, |outcome| {
        let deployment = ctx.caches.get::<Deployment>(&namespace, &deployment_name);
        let observed = status::Observed {
            deployment: deployment.as_deref(),
            applied_now: applied(outcome, Deployment::KIND),
            failure: outcome.err().map(Error::failure),
            pod_blocker: pod_blocker(ctx, &namespace, &app),
        };
        let status = status::compute(&app, &observed, &now());
        (Some(&status) != app.status.as_ref()).then(|| json!(status))
    })
    .await
}
