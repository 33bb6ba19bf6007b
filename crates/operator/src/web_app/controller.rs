//! Watches, reconcile and error policy of the WebApp controller. No finalizer: a WebApp has
//! nothing to clean up beyond its children, which garbage collection removes.

use std::sync::Arc;

use devctl_api::web_app::WebApp;
use futures::stream::BoxStream;
use futures::{Future, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

use super::resources;
use super::status;
use crate::children::{Children, Stores};
use crate::context::{Context, Settings};
use crate::error::{Error, Result};
use crate::reconciler::{
    error_policy, key, log_results, measured, now, publish, publish_changes, watch_children,
    watch_primary, write_status,
};

/// One item per finished reconcile: the object and the next action, or the error.
pub type ReconcileResult =
    Result<(ObjectRef<WebApp>, Action), kube::runtime::controller::Error<Error, watcher::Error>>;

/// Runs the controller until `shutdown` resolves, logging each reconcile.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    settings: Settings,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    log_results(controller(client, namespace, settings, instance, shutdown)).await;
}

/// The controller as a stream of reconcile results (tests count reconciles with it).
pub fn controller(
    client: Client,
    namespace: Option<String>,
    settings: Settings,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> BoxStream<'static, ReconcileResult> {
    let ns = namespace.as_deref();
    let (deployments, deployment_stream) = watch_children::<Deployment>(&client, ns);
    let (services, service_stream) = watch_children::<Service>(&client, ns);
    let (reader, apps) = watch_primary::<WebApp>(&client, ns);
    let stores = Stores {
        deployments,
        services,
        ..Stores::default()
    };
    let context = Arc::new(Context::new(client, stores, settings, instance));
    Controller::for_stream(apps, reader)
        .owns_stream(deployment_stream)
        .owns_stream(service_stream)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .boxed()
}

async fn reconcile(app: Arc<WebApp>, ctx: Arc<Context>) -> Result<Action> {
    measured(&ctx, "webapp", reconcile_web_app(app, &ctx)).await
}

async fn reconcile_web_app(app: Arc<WebApp>, ctx: &Context) -> Result<Action> {
    if app.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the children; nothing to do.
        return Ok(Action::await_change());
    }
    let namespace = app
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let deployment_name = resources::deployment_name(&app);
    let previous = ctx.stores.deployment(&namespace, &deployment_name);

    let converged = async {
        let desired = resources::desired(&app)?;
        let owner_uid = app.uid().ok_or(Error::MissingField("metadata.uid"))?;
        Children {
            client: &ctx.client,
            stores: &ctx.stores,
            namespace: &namespace,
            owner_uid: &owner_uid,
        }
        .sync(&desired, resources::KINDS)
        .await
    }
    .await;

    let deployment = ctx.stores.deployment(&namespace, &deployment_name);
    let error = converged
        .as_ref()
        .err()
        .map(|e| (e.reason(), e.to_string()));
    let status = status::compute(&app, deployment.as_deref(), error, &now());
    if Some(&status) != app.status.as_ref() {
        write_status(ctx, app.as_ref(), json!(status)).await?;
    }

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
    match converged {
        Ok(changes) => {
            publish_changes(ctx, app.as_ref(), &changes).await;
            ctx.backoff.reset(&key(app.as_ref()));
            Ok(Action::requeue(ctx.settings.health_requeue))
        }
        Err(error) => {
            publish(
                ctx,
                app.as_ref(),
                EventType::Warning,
                error.reason(),
                "Reconcile",
                error.to_string(),
            )
            .await;
            Err(error)
        }
    }
}
