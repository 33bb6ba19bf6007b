//! `devctl db backup`: a DatabaseBackup NAME-<time> now, optionally followed to Completed or
//! Failed.

use std::time::Duration;

use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use devctl_api::database_cluster::DatabaseCluster;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::{TargetArg, get};
use crate::cluster::{self, Connection};
use crate::wait;

fn backup_progress(backup: Option<&DatabaseBackup>) -> String {
    let Some(backup) = backup else {
        return "not found".into();
    };
    let status = backup.status.clone().unwrap_or_default();
    let phase = status.phase.map(|p| p.as_str()).unwrap_or("Pending");
    let mut line = format!("phase {phase}");
    if let Some(instance) = &status.instance {
        line.push_str(&format!(", on {instance}"));
    }
    if let Some(size) = status.size {
        line.push_str(&format!(", {size} bytes"));
    }
    if let Some(message) = &status.message {
        line.push_str(&format!(": {message}"));
    }
    line
}

pub(super) async fn backup(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
    target: Option<TargetArg>,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    get(connection, api, name).await?;
    let backups: Api<DatabaseBackup> =
        Api::namespaced(connection.client.clone(), &connection.namespace);
    let stamp = k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%d%H%M%S");
    let mut spec = json!({ "cluster": { "name": name } });
    if let Some(target) = target {
        spec["target"] = json!(match target {
            TargetArg::Replica => "replica",
            TargetArg::Primary => "primary",
        });
    }
    // Named by the time, like scheduled backups (so they sort together); a name taken in the
    // same second (another `db backup`, or a scheduled run) gets a counter instead of an error.
    let mut backup_name = format!("{name}-{stamp}");
    for attempt in 2.. {
        let object: DatabaseBackup = serde_json::from_value(json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseBackup",
            "metadata": {
                "name": backup_name,
                // As on the backups the operator creates (scheduled, final), so
                // `kubectl get dbb -l db.devctl.io/cluster=NAME` lists them all.
                "labels": { devctl_operator::database_cluster::backup_lifecycle::CLUSTER_LABEL: name },
            },
            "spec": spec,
        }))?;
        match backups.create(&PostParams::default(), &object).await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 && attempt <= 9 => {
                backup_name = format!("{name}-{stamp}-{attempt}");
            }
            Err(e) => {
                return Err(cluster::explain(
                    e,
                    &format!("creating databasebackup {backup_name}"),
                    &connection.server,
                ));
            }
        }
    }
    println!(
        "databasebackup {}/{backup_name} created",
        connection.namespace
    );
    if !wait {
        return Ok(());
    }
    wait::until(&backups, &backup_name, timeout, backup_progress, |b| {
        b.and_then(|b| b.status.as_ref())
            .and_then(|s| s.phase)
            .is_some_and(BackupPhase::is_final)
    })
    .await?;
    let done = backups.get(&backup_name).await?;
    let status = done.status.unwrap_or_default();
    match status.phase {
        Some(BackupPhase::Completed) => {
            println!(
                "databasebackup {backup_name} Completed: {} bytes at {}",
                status.size.unwrap_or(0),
                status.object_path.unwrap_or_default()
            );
            Ok(())
        }
        _ => anyhow::bail!(
            "databasebackup {backup_name} failed: {}",
            status.message.unwrap_or_else(|| "no reason given".into())
        ),
    }
}
