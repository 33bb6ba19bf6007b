//! `devctl db create`: a new DatabaseCluster from the flags, optionally waited for until Ready.

use std::time::Duration;

use devctl_api::database_cluster::{DatabaseCluster, Engine};
use kube::api::{Api, PostParams};
use serde_json::json;

use super::{EngineArg, is_ready, progress};
use crate::cluster::{self, Connection};
use crate::wait;

#[allow(clippy::too_many_arguments)]
pub(super) async fn create(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: String,
    engine: EngineArg,
    version: String,
    replicas: i32,
    storage: String,
    storage_class: Option<String>,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let engine = match engine {
        EngineArg::Postgres => Engine::Postgres,
        EngineArg::Mysql => Engine::Mysql,
        EngineArg::Mariadb => Engine::Mariadb,
    };
    let mut storage_spec = json!({ "size": storage });
    if let Some(class) = storage_class {
        storage_spec["storageClassName"] = json!(class);
    }
    let db: DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": name },
        "spec": { "engine": engine, "version": version, "replicas": replicas, "storage": storage_spec }
    }))?;
    api.create(&PostParams::default(), &db).await.map_err(|e| {
        cluster::explain(
            e,
            &format!("creating databasecluster {name}"),
            &connection.server,
        )
    })?;
    println!("databasecluster {}/{name} created", connection.namespace);
    if wait {
        eprintln!("Waiting for {name} to be Ready...");
        wait::until(api, &name, timeout, progress, is_ready).await?;
        println!("databasecluster {name} is Ready");
    }
    Ok(())
}
