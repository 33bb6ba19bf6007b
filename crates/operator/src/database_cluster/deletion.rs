//! Act on deletion: the cluster's cleanup before its finalizer goes — its data claims
//! deleted unless they must stay, the `Deleting` phase and event (the final backup, when one
//! is due, ran before: [`super::backup_lifecycle::final_backup`]).

use std::sync::Arc;

use devctl_api::database_cluster::{self, DatabaseCluster, Phase};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use super::backup_lifecycle;
use super::claims::live_data_claims;
use super::resources::Names;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::reconciler::{key, publish, write_status};

/// What the deletion of a cluster did with its volumes.
enum Volumes {
    /// This many data claims deleted (or going already).
    Deleted(usize),
    /// Kept as asked (why, for the event).
    Kept(String),
    /// Kept with everything else: deleted with the `Orphan` propagation policy, its
    /// StatefulSet and pods stay and still use them.
    Orphaned,
    /// Kept because deleting them could lose the only copy of the data, or was refused (why).
    KeptForSafety(String),
}

/// Deletes the cluster's data claims when the cluster goes: StatefulSets never delete them,
/// and a cluster created again under the same name must not start on the old data. Not a
/// retention policy on the StatefulSet, which would also delete the data when someone
/// deletes only the StatefulSet (it is restored, the data must survive that). They are kept
/// when asked ([`database_cluster::KEEP_VOLUMES_ANNOTATION`]), when the cluster is deleted
/// with the `Orphan` propagation policy (its StatefulSet and pods stay and still use them),
/// and when a final backup was asked for and did not complete (they hold the only copy).
/// The claims are listed live (a claim the StatefulSet made a moment ago may not be cached
/// yet) and each delete is bound to the claim's uid.
async fn dispose_of_volumes(db: &DatabaseCluster, ctx: &Context, names: &Names) -> Result<Volumes> {
    if database_cluster::keeps_volumes(db.annotations()) {
        return Ok(Volumes::Kept(format!(
            "{}: \"true\"",
            database_cluster::KEEP_VOLUMES_ANNOTATION
        )));
    }
    // Orphan propagation: the garbage collector takes the owner references off the children
    // and then drops its `orphan` finalizer — either may be what this reconcile sees.
    let statefulsets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let stateful_set = statefulsets.get_opt(&names.stateful_set()).await?;
    let ours = |sts: &StatefulSet| {
        sts.owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == db.uid().as_ref())
    };
    let orphaned = db.finalizers().iter().any(|f| f == "orphan")
        || stateful_set.as_ref().is_some_and(|sts| !ours(sts));
    if orphaned {
        return Ok(Volumes::Orphaned);
    }
    if let Some(backup) = db.spec.backup.as_ref().filter(|b| b.final_backup) {
        if !backup.enabled {
            return Ok(Volumes::KeptForSafety(
                "spec.backup.finalBackup asked for a final backup, but backups are disabled (spec.backup.enabled: false), so none was taken".into(),
            ));
        }
        let name = super::schedule::final_backup_name(&names.name);
        let backups: Api<devctl_api::database_backup::DatabaseBackup> =
            Api::namespaced(ctx.client.clone(), &names.namespace);
        let completed = backups.get_opt(&name).await?.is_some_and(|b| {
            backup_lifecycle::taken_for_this_deletion(&b, db)
                && b.status.as_ref().and_then(|s| s.phase)
                    == Some(devctl_api::database_backup::BackupPhase::Completed)
        });
        // A cluster that never made a data volume has nothing a backup could hold.
        if !completed && !live_data_claims(ctx, names).await?.is_empty() {
            return Ok(Volumes::KeptForSafety(format!(
                "spec.backup.finalBackup asked for a final backup and {name} did not complete"
            )));
        }
    }
    // The StatefulSet goes first: once it is being deleted its controller makes no pod and
    // no claim, so the list below holds every claim there will be (the garbage collector,
    // left to itself, deletes it only after the finalizer is gone, and a pod it recreated
    // meanwhile would leave a new claim behind).
    if let Some(sts) = stateful_set.filter(|sts| sts.metadata.deletion_timestamp.is_none()) {
        let params = kube::api::DeleteParams {
            preconditions: sts.uid().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..kube::api::DeleteParams::background()
        };
        match statefulsets.delete(&names.stateful_set(), &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {}
            Err(source) => {
                return Err(Error::Child {
                    action: "deleting",
                    kind: "StatefulSet",
                    name: names.stateful_set(),
                    source,
                });
            }
        }
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let claims = live_data_claims(ctx, names).await?;
    for claim in &claims {
        let name = claim.name_any();
        let params = kube::api::DeleteParams {
            preconditions: claim.uid().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            // Gone already, or replaced by a claim that is not the one listed.
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {}
            // The operator's rights lack it (an older Role): the cluster still goes.
            Err(kube::Error::Api(status)) if status.code == 403 => {
                return Ok(Volumes::KeptForSafety(format!(
                    "the operator may not delete PersistentVolumeClaims here ({})",
                    status.message
                )));
            }
            Err(source) => {
                return Err(Error::Child {
                    action: "deleting",
                    kind: "PersistentVolumeClaim",
                    name,
                    source,
                });
            }
        }
    }
    Ok(Volumes::Deleted(claims.len()))
}

/// Bounded cleanup before the finalizer is removed (the final backup, when one is due, has run
/// before it): the data claims are deleted unless the cluster asks to keep them; the other
/// children go away through garbage collection (controller owner references).
/// Longest a cleanup may take before it counts as failed (and is retried with backoff), so a
/// hung step can never hold the finalizer — and the namespace — forever unnoticed.
pub const CLEANUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

pub async fn cleanup(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    tokio::time::timeout(CLEANUP_TIMEOUT, run_cleanup(db, ctx))
        .await
        .map_err(|_| Error::CleanupTimeout(CLEANUP_TIMEOUT))?
}

async fn run_cleanup(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    let names = Names::of(&db)?;
    // A cluster deleted during a failover leaves no note of it behind.
    ctx.failover_liveness.forget(
        &(names.namespace.clone(), names.name.clone()),
        Some(i64::MAX),
    );
    let disposed = dispose_of_volumes(&db, ctx, &names).await?;
    let orphaned = matches!(disposed, Volumes::Orphaned);
    let volumes = match disposed {
        Volumes::Orphaned => "deleted with propagationPolicy Orphan: its children, pods and \
            volumes stay, and a cluster created again under this name adopts them"
            .to_string(),
        Volumes::Deleted(1) => "its volume claim deleted".to_string(),
        Volumes::Deleted(deleted) => format!("its {deleted} volume claims deleted"),
        Volumes::Kept(why) => format!("its volumes are kept ({why})"),
        Volumes::KeptForSafety(why) => {
            publish(
                ctx,
                db.as_ref(),
                EventType::Warning,
                "VolumesKept",
                "Delete",
                format!(
                    "Keeping the volume claims data-{}-*: {why}; delete them when the data is no longer needed",
                    names.stateful_set()
                ),
            )
            .await;
            format!("its volumes are kept: {why}")
        }
    };
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
            if orphaned {
                format!("Deleting the cluster, {volumes}")
            } else {
                format!("Deleting the cluster; its children are garbage-collected, {volumes}")
            },
        )
        .await;
    }
    ctx.backoff.reset(&key(db.as_ref()));
    // The object goes with the finalizer: its series must not outlive it.
    if let Some(namespace) = db.namespace() {
        ctx.settings
            .metrics
            .forget_cluster(&namespace, &db.name_any());
        if let Some(uid) = db.uid() {
            ctx.caches.applier().forget_owner(&namespace, &uid);
        }
    }
    Ok(Action::await_change())
}
