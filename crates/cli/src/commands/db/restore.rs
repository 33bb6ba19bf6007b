//! `devctl db restore`: a NEW DatabaseCluster bootstrapped from a completed backup (to a point
//! in time with --to), with the source cluster's spec when it still exists.

use std::time::Duration;

use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use devctl_api::database_cluster::DatabaseCluster;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::{is_ready, progress};
use crate::cluster::{self, Connection};
use crate::wait;

#[allow(clippy::too_many_arguments)]
pub(super) async fn restore(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
    from: &str,
    to: Option<&str>,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let backups: Api<DatabaseBackup> =
        Api::namespaced(connection.client.clone(), &connection.namespace);
    let backup = backups.get_opt(from).await.map_err(|e| {
        cluster::explain(
            e,
            &format!("reading databasebackup {from}"),
            &connection.server,
        )
    })?;
    let Some(backup) = backup else {
        anyhow::bail!(
            "databasebackup {from} not found in namespace {}",
            connection.namespace
        );
    };
    let status = backup.status.clone().unwrap_or_default();
    if status.phase != Some(BackupPhase::Completed) {
        anyhow::bail!(
            "databasebackup {from} is {}, not Completed: only a completed backup can be restored",
            status.phase.map(|p| p.as_str()).unwrap_or("Pending")
        );
    }
    if api.get_opt(name).await?.is_some() {
        anyhow::bail!(
            "databasecluster {name} already exists: a restore creates a new cluster, never overwrites one"
        );
    }
    // The source's spec when it still exists (engine, version, size, instances, backups).
    let source = api.get_opt(&backup.spec.cluster.name).await?;
    let mut spec = match &source {
        Some(db) => serde_json::to_value(&db.spec)?,
        None => json!({
            "engine": status.engine.clone().unwrap_or_else(|| "postgres".into()),
            "version": status.version.clone().unwrap_or_default(),
            "storage": { "size": "10Gi" },
        }),
    };
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("bootstrap");
    }
    let mut recovery = json!({ "backup": from });
    if let Some(to) = to {
        recovery["targetTime"] = json!(to);
    }
    spec["bootstrap"] = json!({ "recovery": recovery });
    let db: DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": name }, "spec": spec,
    }))?;
    api.create(&PostParams::default(), &db).await.map_err(|e| {
        cluster::explain(
            e,
            &format!("creating databasecluster {name}"),
            &connection.server,
        )
    })?;
    println!(
        "databasecluster {}/{name} created from databasebackup {from}{}",
        connection.namespace,
        to.map(|t| format!(" (to {t})")).unwrap_or_default()
    );
    if wait {
        eprintln!("Waiting for {name} to be Ready...");
        wait::until(api, name, timeout, progress, is_ready).await?;
        println!("databasecluster {name} is Ready");
    }
    Ok(())
}
