//! `devctl db list`: the DatabaseClusters of the namespace (or all) as a table or JSON/YAML.

use devctl_api::database_cluster::DatabaseCluster;
use kube::ResourceExt;

use crate::cluster::{Connection, GlobalArgs};
use crate::output;

pub(super) async fn list(
    global: &GlobalArgs,
    connection: &Connection,
    all_namespaces: bool,
) -> anyhow::Result<()> {
    let header = [
        "NAME", "ENGINE", "VERSION", "REPLICAS", "READY", "PHASE", "AGE",
    ];
    crate::commands::list(
        connection,
        global.output,
        all_namespaces,
        "databaseclusters",
        &header,
        |db: &DatabaseCluster| {
            let status = db.status.clone().unwrap_or_default();
            vec![
                db.name_any(),
                db.spec.engine.to_string(),
                db.spec.version.clone(),
                db.spec.replicas.to_string(),
                status.ready_replicas.to_string(),
                status
                    .phase
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_default(),
                output::age(db.metadata.creation_timestamp.as_ref()),
            ]
        },
    )
    .await
}
