//! `devctl db delete`: deletes a DatabaseCluster, keeping its volumes with --keep-volumes, and
//! says what happens to them.

use std::time::Duration;

use devctl_api::database_cluster::{
    DatabaseCluster, FINALIZER, KEEP_VOLUMES_ANNOTATION, keeps_volumes,
};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::cluster::{self, Connection};
use crate::wait;

pub(super) async fn delete(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: String,
    keep_volumes: bool,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    if keep_volumes {
        let patch = json!({ "metadata": { "annotations": { KEEP_VOLUMES_ANNOTATION: "true" } } });
        let marked = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| {
                cluster::explain(
                    e,
                    &format!("marking databasecluster {name} to keep its volumes"),
                    &connection.server,
                )
            })?;
        if marked.metadata.deletion_timestamp.is_some() {
            eprintln!(
                "warning: databasecluster {name} was already being deleted; its volumes may be deleted already"
            );
        }
    }
    let deleted = api
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| {
            cluster::explain(
                e,
                &format!("deleting databasecluster {name}"),
                &connection.server,
            )
        })?;
    // The object as the deletion left it: still there while the operator's finalizer
    // cleans up, which is what deletes the volumes (or keeps them, as annotated).
    let volumes = match deleted.left() {
        Some(db) if keeps_volumes(db.annotations()) => " (its volumes are kept)",
        Some(db)
            if db.finalizers().iter().any(|f| f == FINALIZER)
                && db.spec.backup.as_ref().is_some_and(|b| b.final_backup) =>
        {
            " (its volumes are deleted after its final backup, kept if that does not complete)"
        }
        Some(db) if db.finalizers().iter().any(|f| f == FINALIZER) => {
            " (its volumes are deleted with it)"
        }
        _ => "",
    };
    println!(
        "databasecluster {}/{name} deleted{volumes}",
        connection.namespace
    );
    if wait {
        wait::until_deleted(api, &name, timeout).await?;
    }
    Ok(())
}
