//! Watches, reconcile and error policy of the DatabaseCluster controller: the thin async
//! shell around the pure desired state (`resources`) and status (`status`).

use std::sync::Arc;

use devctl_api::database_cluster::{self, DatabaseCluster, FINALIZER, Phase};
use devctl_api::labels;
use devctl_api::quantity;
use futures::stream::BoxStream;
use futures::{Future, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

use super::resources::{self, Inputs, Names, secret};
use super::status::{self, Observed};
use crate::children::{Change, Children, Stores};
use crate::context::{Context, Settings};
use crate::error::{Error, Result};
use crate::reconciler::{
    error_policy, key, log_results, measured, now, publish, publish_changes, watch_children,
    watch_primary, write_status,
};

/// One item per finished reconcile: the object and the next action, or the error.
pub type ReconcileResult = Result<
    (ObjectRef<DatabaseCluster>, Action),
    kube::runtime::controller::Error<Error, watcher::Error>,
>;

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
    let (config_maps, config_map_stream) = watch_children::<ConfigMap>(&client, ns);
    let (secrets, secret_stream) = watch_children::<Secret>(&client, ns);
    let (services, service_stream) = watch_children::<Service>(&client, ns);
    let (stateful_sets, stateful_set_stream) = watch_children::<StatefulSet>(&client, ns);
    let (pod_disruption_budgets, pdb_stream) = watch_children::<PodDisruptionBudget>(&client, ns);
    let (persistent_volume_claims, pvc_stream) =
        watch_children::<PersistentVolumeClaim>(&client, ns);

    let (db_reader, db_stream) = watch_primary::<DatabaseCluster>(&client, ns);

    let stores = Stores {
        config_maps,
        secrets,
        services,
        stateful_sets,
        pod_disruption_budgets,
        persistent_volume_claims,
        ..Stores::default()
    };
    let context = Arc::new(Context::new(client, stores, settings, instance));

    Controller::for_stream(db_stream, db_reader)
        .owns_stream(config_map_stream)
        .owns_stream(secret_stream)
        .owns_stream(service_stream)
        .owns_stream(stateful_set_stream)
        .owns_stream(pdb_stream)
        // Claims are created by the StatefulSet controller without an owner: map them back
        // through their instance label.
        .watches_stream(pvc_stream, |pvc: PersistentVolumeClaim| {
            let instance = pvc.labels().get(labels::INSTANCE)?.clone();
            Some(ObjectRef::<DatabaseCluster>::new(&instance).within(&pvc.namespace()?))
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .boxed()
}

async fn reconcile(db: Arc<DatabaseCluster>, ctx: Arc<Context>) -> Result<Action> {
    measured(&ctx, "databasecluster", reconcile_with_finalizer(db, &ctx)).await
}

async fn reconcile_with_finalizer(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    let namespace = db
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<DatabaseCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let action = finalizer(&api, FINALIZER, db, |event| async {
        match event {
            FinalizerEvent::Apply(db) => apply(db, ctx).await,
            FinalizerEvent::Cleanup(db) => cleanup(db, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))?;
    Ok(action)
}

/// The version to run and, when the requested change is refused, why.
fn plan_version(db: &DatabaseCluster) -> (String, Option<String>) {
    let requested = &db.spec.version;
    match db
        .status
        .as_ref()
        .and_then(|s| s.current_version.as_deref())
    {
        Some(running) => match database_cluster::check_version_change(running, requested) {
            Ok(()) => (requested.clone(), None),
            Err(refused) => (
                running.to_string(),
                Some(format!(
                    "spec.version {requested}: {refused}; still running {running}"
                )),
            ),
        },
        None => (requested.clone(), None),
    }
}

async fn apply(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    let names = Names::of(&db)?;
    let (target_version, version_refused) = plan_version(&db);
    let previous_sts = ctx
        .stores
        .stateful_set(&names.namespace, &names.stateful_set());

    let converged = converge(&db, ctx, &names, &target_version, previous_sts.as_deref()).await;
    let (changes, volumes_pending, error) = match &converged {
        Ok((changes, pending)) => (changes.clone(), *pending, None),
        Err(e) => (Vec::new(), None, Some((e.reason(), e.to_string()))),
    };

    let sts = ctx
        .stores
        .stateful_set(&names.namespace, &names.stateful_set());
    let target_image = resources::stateful_set::image(&db, &target_version);
    let observed = Observed {
        stateful_set: sts.as_deref(),
        target_version: &target_version,
        target_image: &target_image,
        version_refused: version_refused.clone(),
        volumes_pending,
        error,
        cluster_domain: &ctx.settings.cluster_domain,
    };
    let status = status::compute(&db, &observed, &now());
    if status.is_some() && status != db.status {
        write_status(ctx, db.as_ref(), json!(status)).await?;
    }

    publish_events(
        &db,
        ctx,
        &changes,
        previous_sts.as_deref(),
        version_refused.as_deref(),
    )
    .await;
    if let Err(error) = converged {
        publish(
            ctx,
            db.as_ref(),
            EventType::Warning,
            error.reason(),
            "Reconcile",
            error.to_string(),
        )
        .await;
        return Err(error);
    }
    ctx.backoff.reset(&key(db.as_ref()));
    Ok(Action::requeue(ctx.settings.health_requeue))
}

/// Applies the children, deletes orphans and expands volumes.
async fn converge(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
    target_version: &str,
    sts: Option<&StatefulSet>,
) -> Result<(Vec<Change>, Option<(usize, usize)>)> {
    let password = existing_or_new_password(ctx, names).await?;
    let existing_claim_size = sts
        .and_then(|s| s.spec.volume_claim_templates.as_ref())
        .and_then(|t| t.first())
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone());
    let inputs = Inputs {
        password: &password,
        version: target_version,
        existing_claim_size: existing_claim_size.as_deref(),
        cluster_domain: &ctx.settings.cluster_domain,
    };
    let desired = resources::desired(db, &inputs)?;
    let owner_uid = db.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let children = Children {
        client: &ctx.client,
        stores: &ctx.stores,
        namespace: &names.namespace,
        owner_uid: &owner_uid,
    };
    let changes = children.sync(&desired, resources::KINDS).await?;
    let pending = expand_volumes(db, ctx, names).await?;
    Ok((changes, pending))
}

/// The existing Secret's password (cache first, then the API so a cold cache never causes a
/// new password), or a new one.
async fn existing_or_new_password(ctx: &Context, names: &Names) -> Result<String> {
    if let Some(password) = ctx
        .stores
        .secret(&names.namespace, &names.secret())
        .and_then(|s| secret::existing_password(&s))
    {
        return Ok(password);
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let live = api
        .get_opt(&names.secret())
        .await
        .map_err(|source| Error::Child {
            action: "read",
            kind: "Secret",
            name: names.secret(),
            source,
        })?;
    Ok(live
        .as_ref()
        .and_then(secret::existing_password)
        .unwrap_or_else(secret::generate_password))
}

/// Grows claims smaller than `spec.storage.size` in place (claim templates are immutable).
/// Returns `(expanded, total)` while some volume has not reached the size yet.
async fn expand_volumes(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
) -> Result<Option<(usize, usize)>> {
    let Some(want) = quantity::to_bytes(&db.spec.storage.size) else {
        return Ok(None);
    };
    let prefix = format!(
        "{}-{}-",
        resources::stateful_set::DATA_VOLUME,
        names.stateful_set()
    );
    let claims: Vec<_> = ctx.stores.persistent_volume_claims.state_filter(|pvc| {
        pvc.namespace().as_deref() == Some(names.namespace.as_str())
            && pvc.labels().get(labels::INSTANCE) == Some(&names.name)
            && pvc.name_any().starts_with(&prefix)
    });
    let bytes = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| quantity::to_bytes(&q.0)).unwrap_or(0)
    };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let mut expanded = 0;
    for claim in &claims {
        let requested = bytes(
            claim
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage")),
        );
        let capacity = bytes(
            claim
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage")),
        );
        if requested < want {
            let patch = json!({ "spec": { "resources": { "requests": { "storage": db.spec.storage.size } } } });
            api.patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|source| Error::Child {
                action: "expand",
                kind: "PersistentVolumeClaim",
                name: claim.name_any(),
                source,
            })?;
            publish(
                ctx,
                db,
                EventType::Normal,
                "ExpandingVolume",
                "Resize",
                format!(
                    "Expanding PersistentVolumeClaim {} to {}",
                    claim.name_any(),
                    db.spec.storage.size
                ),
            )
            .await;
        }
        if capacity >= want {
            expanded += 1;
        }
    }
    Ok((expanded < claims.len()).then_some((expanded, claims.len())))
}

async fn publish_events(
    db: &DatabaseCluster,
    ctx: &Context,
    changes: &[Change],
    previous_sts: Option<&StatefulSet>,
    version_refused: Option<&str>,
) {
    let previous_replicas = previous_sts.and_then(|s| s.spec.replicas);
    if let Some(from) = previous_replicas
        && from != db.spec.replicas
    {
        publish(
            ctx,
            db,
            EventType::Normal,
            "Scaling",
            "Scale",
            format!("Scaling from {from} to {} instances", db.spec.replicas),
        )
        .await;
    }
    publish_changes(ctx, db, changes).await;
    // Once per refusal: only when the condition is not already saying so.
    let already_refused = db
        .status
        .as_ref()
        .and_then(|s| devctl_api::conditions::find(&s.conditions, devctl_api::conditions::DEGRADED))
        .is_some_and(|c| c.reason == "VersionChangeRefused");
    if let Some(message) = version_refused
        && !already_refused
    {
        publish(
            ctx,
            db,
            EventType::Warning,
            "VersionChangeRefused",
            "Upgrade",
            message.to_string(),
        )
        .await;
    }
}

/// Bounded cleanup before the finalizer is removed. Children go away through garbage
/// collection (controller owner references); the backup issue adds a final backup here.
/// Longest a cleanup may take before it counts as failed (and is retried with backoff), so a
/// hung step can never hold the finalizer — and the namespace — forever unnoticed.
pub const CLEANUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

async fn cleanup(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    tokio::time::timeout(CLEANUP_TIMEOUT, run_cleanup(db, ctx))
        .await
        .map_err(|_| Error::CleanupTimeout(CLEANUP_TIMEOUT))?
}

async fn run_cleanup(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    if db.status.as_ref().and_then(|s| s.phase) != Some(Phase::Deleting) {
        // The whole status: with server-side apply, fields left out would be removed.
        let mut status = db.status.clone().unwrap_or_default();
        status.phase = Some(Phase::Deleting);
        write_status(ctx, db.as_ref(), json!(status)).await?;
        publish(
            ctx,
            db.as_ref(),
            EventType::Normal,
            "Deleting",
            "Delete",
            "Deleting the cluster; its children are garbage-collected".into(),
        )
        .await;
    }
    ctx.backoff.reset(&key(db.as_ref()));
    Ok(Action::await_change())
}
