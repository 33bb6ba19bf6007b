//! The DatabaseCluster controller's wiring: its watches, the finalizer, and one reconcile as
//! observe ([`Observation`]) → decide ([`plan`], pure) → act ([`act::execute`]); the
//! cleanup on deletion is [`deletion`]'s. docs/database-cluster.md, *How a reconcile works*.

use std::sync::Arc;

use devctl_api::database_cluster::{DatabaseCluster, FINALIZER};
use futures::Future;
use futures::stream::BoxStream;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Client, Resource, ResourceExt};

use super::act;
use super::backup_lifecycle;
use super::deletion::cleanup;
use super::observe::Observation;
use super::plan::plan;
use super::resources::{self, Names};
use crate::children::Caches;
use crate::children::caches::OwnerKey;
use crate::context::{Context, Settings};
use crate::error::{Error, Result};
use crate::reconciler::{ensure_finalizer, run_controller};

/// The controller as a stream of finished reconciles.
pub fn controller(
    client: Client,
    namespace: Option<String>,
    caches: Caches,
    settings: Settings,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> BoxStream<'static, crate::Reconciled> {
    run_controller::<DatabaseCluster, _, _>(
        "databasecluster",
        resources::READS,
        None,
        client,
        namespace,
        caches,
        settings,
        instance,
        shutdown,
        |db, ctx| async move { reconcile(db, &ctx).await },
    )
}

/// The cluster an object belongs to by its labels (`app.kubernetes.io/name=databasecluster`,
/// `instance=<cluster>`): for what other controllers create without an owner reference to
/// the cluster — the StatefulSet's volume claims and pods.
pub fn labelled_owner<K: Resource>(object: &K) -> Option<OwnerKey> {
    OwnerKey::by_labels::<DatabaseCluster>(object, resources::APP_NAME)
}

async fn reconcile(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    let namespace = db
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<DatabaseCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    // A final backup runs before the finalizer's cleanup, bounded in time, so the
    // finalizer never holds the namespace hostage.
    if db.metadata.deletion_timestamp.is_some()
        && db.finalizers().iter().any(|f| f == FINALIZER)
        && let Some(wait) = backup_lifecycle::final_backup(&db, ctx, &Names::of(&db)?).await
    {
        return Ok(Action::requeue(wait));
    }
    if db.metadata.deletion_timestamp.is_none() && !db.finalizers().iter().any(|f| f == FINALIZER) {
        // A new cluster (or one whose finalizer was removed by hand): the finalizer goes on in
        // the same round trips as the children, which do not depend on it — a deletion
        // meanwhile still removes the children through their owner references, and a cluster
        // without a data volume gets no final backup.
        let (added, applied) = tokio::join!(
            ensure_finalizer(&api, FINALIZER, db.clone()),
            apply(db, ctx)
        );
        added?;
        return applied;
    }
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

/// One reconcile of a cluster that is not going away.
async fn apply(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    let mut observation = Observation::observe(db, ctx).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut planned = plan(&observation, now);
    // The one read a decision may ask for: the lock, live, before a failover step judged
    // from the cache is taken. Decided again with the answer.
    if planned.needs_lease_confirmation() {
        observation.confirm_lease(ctx).await;
        planned = plan(&observation, now);
    }
    act::execute(ctx, &observation, planned).await
}
