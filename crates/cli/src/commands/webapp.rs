//! `devctl webapp create|list|status|delete`.

use std::time::Duration;

use clap::Subcommand;
use devctl_api::conditions;
use devctl_api::web_app::WebApp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use super::db::{pods_and_events, print_pods_and_events};
use crate::cluster::{self, GlobalArgs};
use crate::output;
use crate::wait;

#[derive(Subcommand)]
pub enum WebappCommand {
    /// Create a web app.
    Create {
        name: String,
        /// Container image.
        #[arg(long)]
        image: String,
        /// Port the application listens on.
        #[arg(long, value_parser = clap::value_parser!(i32).range(1..=65535))]
        port: i32,
        /// Number of pods.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..))]
        replicas: i32,
        /// Wait until every pod is ready.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "5m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
    /// List web apps.
    List {
        /// List across all namespaces.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Show a web app's conditions, pods and recent events.
    Status { name: String },
    /// Delete a web app.
    Delete {
        name: String,
        #[arg(long)]
        wait: bool,
        #[arg(long, default_value = "5m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
}

fn progress(app: Option<&WebApp>) -> String {
    let Some(app) = app else {
        return "not found".into();
    };
    let status = app.status.clone().unwrap_or_default();
    let ready = conditions::find(&status.conditions, conditions::READY);
    format!(
        "{}/{} ready{}",
        status.ready_replicas,
        app.spec.replicas,
        ready
            .map(|c| format!(" — {}: {}", c.reason, c.message))
            .unwrap_or_default()
    )
}

fn is_ready(app: Option<&WebApp>) -> bool {
    app.is_some_and(|a| {
        a.status.as_ref().is_some_and(|s| {
            s.observed_generation == a.metadata.generation
                && conditions::find(&s.conditions, conditions::READY)
                    .is_some_and(|c| c.status == conditions::TRUE)
        })
    })
}

pub async fn run(global: &GlobalArgs, command: WebappCommand) -> anyhow::Result<()> {
    let connection = cluster::connect(global).await?;
    let api: Api<WebApp> = Api::namespaced(connection.client.clone(), &connection.namespace);
    match command {
        WebappCommand::Create {
            name,
            image,
            port,
            replicas,
            wait,
            timeout,
        } => {
            let app: WebApp = serde_json::from_value(json!({
                "apiVersion": "apps.devctl.io/v1", "kind": "WebApp",
                "metadata": { "name": name },
                "spec": { "image": image, "port": port, "replicas": replicas }
            }))?;
            api.create(&PostParams::default(), &app)
                .await
                .map_err(|e| {
                    cluster::explain(e, &format!("creating webapp {name}"), &connection.server)
                })?;
            println!("webapp {}/{name} created", connection.namespace);
            if wait {
                eprintln!("Waiting for {name} to be Ready...");
                wait::until(&api, &name, timeout, progress, is_ready).await?;
                println!("webapp {name} is Ready");
            }
            Ok(())
        }
        WebappCommand::List { all_namespaces } => {
            let header = ["NAME", "IMAGE", "REPLICAS", "READY", "AGE"];
            super::list(
                &connection,
                global.output,
                all_namespaces,
                "webapps",
                &header,
                |a: &WebApp| {
                    vec![
                        a.name_any(),
                        a.spec.image.clone(),
                        a.spec.replicas.to_string(),
                        a.status
                            .as_ref()
                            .map(|s| s.ready_replicas)
                            .unwrap_or(0)
                            .to_string(),
                        output::age(a.metadata.creation_timestamp.as_ref()),
                    ]
                },
            )
            .await
        }
        WebappCommand::Status { name } => {
            let app = match api.get_opt(&name).await {
                Ok(Some(app)) => app,
                Ok(None) => anyhow::bail!(
                    "webapp {name} not found in namespace {}",
                    connection.namespace
                ),
                Err(e) => {
                    return Err(cluster::explain(
                        e,
                        &format!("reading webapp {name}"),
                        &connection.server,
                    ));
                }
            };
            let status = app.status.clone().unwrap_or_default();
            let related = pods_and_events(&connection, status.selector.as_deref(), &name).await;
            let (pods, events) = related.lists();
            if output::structured(
                global.output,
                &json!({ "webApp": app, "pods": pods, "events": events }),
            )? {
                return related.check();
            }
            println!("Name:      {}/{}", connection.namespace, name);
            println!("Image:     {}", app.spec.image);
            println!(
                "Pods:      {}/{} ready, {} available",
                status.ready_replicas, app.spec.replicas, status.available_replicas
            );
            println!("Service:   {}-svc:80 -> {}", name, app.spec.port);
            output::conditions(&status.conditions);
            print_pods_and_events(&related);
            related.check()
        }
        WebappCommand::Delete {
            name,
            wait,
            timeout,
        } => {
            api.delete(&name, &DeleteParams::default())
                .await
                .map_err(|e| {
                    cluster::explain(e, &format!("deleting webapp {name}"), &connection.server)
                })?;
            println!("webapp {}/{name} deleted", connection.namespace);
            if wait {
                wait::until_deleted(&api, &name, timeout).await?;
            }
            Ok(())
        }
    }
}
