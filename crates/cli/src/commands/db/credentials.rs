//! `devctl db credentials`: how to connect, from the cluster's connection Secret (the password
//! masked unless --show-password).

use devctl_api::database_cluster::DatabaseCluster;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::json;

use super::get;
use crate::cluster::{self, Connection, GlobalArgs};
use crate::output;

pub(super) async fn credentials(
    global: &GlobalArgs,
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
    show_password: bool,
) -> anyhow::Result<()> {
    let db = get(connection, api, name).await?;
    let secret_name = db
        .status
        .as_ref()
        .and_then(|s| s.connection_secret_name.clone())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "databasecluster {name} has no credentials yet (is the operator running?)"
            )
        })?;
    let secrets: Api<Secret> = Api::namespaced(connection.client.clone(), &connection.namespace);
    let secret = secrets.get(&secret_name).await.map_err(|e| {
        cluster::explain(
            e,
            &format!("reading secret {secret_name}"),
            &connection.server,
        )
    })?;
    let data = secret.data.unwrap_or_default();
    let field = |key: &str| {
        data.get(key)
            .map(|v| String::from_utf8_lossy(&v.0).to_string())
            .unwrap_or_default()
    };
    let password = field("password");
    let mask = |text: String| {
        if show_password {
            text
        } else {
            text.replace(&password, "********")
        }
    };
    let values = json!({
        "username": field("username"),
        "password": mask(password.clone()),
        "host": field("host"),
        "port": field("port"),
        "dbname": field("dbname"),
        "uri": mask(field("uri")),
        "secret": secret_name,
    });
    if output::structured(global.output, &values)? {
        return Ok(());
    }
    for key in [
        "uri", "host", "port", "dbname", "username", "password", "secret",
    ] {
        println!("{key:<9} {}", values[key].as_str().unwrap_or_default());
    }
    if !show_password {
        eprintln!("(password masked; pass --show-password to print it)");
    }
    Ok(())
}
