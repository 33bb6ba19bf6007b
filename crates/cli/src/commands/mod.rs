pub mod db;
pub mod dev;
pub mod operator;
pub mod shell;
pub mod webapp;

use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};

use crate::cluster::{self, Connection};
use crate::output::{self, Format};

/// `list` for a kind: in the namespace or across all (a NAMESPACE column then), as a table
/// of `header` and `row`, or as JSON/YAML.
pub async fn list<K>(
    connection: &Connection,
    format: Format,
    all_namespaces: bool,
    plural: &str,
    header: &[&str],
    row: impl Fn(&K) -> Vec<String>,
) -> anyhow::Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = if all_namespaces {
        Api::all(connection.client.clone())
    } else {
        Api::namespaced(connection.client.clone(), &connection.namespace)
    };
    let items = api
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster::explain(e, &format!("listing {plural}"), &connection.server))?
        .items;
    if output::structured(format, &items)? {
        return Ok(());
    }
    if items.is_empty() {
        let scope = if all_namespaces {
            "any namespace"
        } else {
            &connection.namespace
        };
        eprintln!("No {plural} found in {scope}.");
        return Ok(());
    }
    let mut header = header.to_vec();
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| {
            let mut cells = row(item);
            if all_namespaces {
                cells.insert(0, item.namespace().unwrap_or_default());
            }
            cells
        })
        .collect();
    output::table(&header, &rows);
    Ok(())
}
