//! The pods and recent events of an owner, listed and printed for `status` commands (`db
//! status`, `webapp status`) and read by `db promote` for the operator's refusal.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::cluster::{self, Connection};
use crate::output::table;

/// Pods and events of an owner, for `status` commands. A list that failed is kept as its
/// error, so the output says so instead of "(none)".
pub struct Related {
    pub pods: Result<Vec<Pod>, String>,
    pub events: Result<Vec<Event>, String>,
}

impl Related {
    /// The errors of the lists that failed, as one error for the exit code.
    pub fn check(&self) -> anyhow::Result<()> {
        let errors: Vec<&str> = [self.pods.as_ref().err(), self.events.as_ref().err()]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("{}", errors.join("; "))
        }
    }

    /// The lists for JSON/YAML output (a failed list is left out; the error follows).
    pub fn lists(&self) -> (Vec<Pod>, Vec<Event>) {
        (
            self.pods.clone().unwrap_or_default(),
            self.events.clone().unwrap_or_default(),
        )
    }
}

/// When an event was last seen: its series' latest occurrence, else its own time.
pub(super) fn last_seen(e: &Event) -> Option<k8s_openapi::jiff::Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or(e.event_time.as_ref().map(|t| t.0))
}

pub async fn pods_and_events(
    connection: &Connection,
    selector: Option<&str>,
    name: &str,
) -> Related {
    let describe = |what: &str, e: kube::Error| {
        format!(
            "{:#}",
            cluster::explain(
                e,
                &format!("listing the {what} of {name}"),
                &connection.server
            )
        )
    };
    let pods: Api<Pod> = Api::namespaced(connection.client.clone(), &connection.namespace);
    let pods = match selector {
        Some(selector) => pods
            .list(&ListParams::default().labels(selector))
            .await
            .map(|l| l.items)
            .map_err(|e| describe("pods", e)),
        None => Ok(Vec::new()),
    };
    let events: Api<Event> = Api::namespaced(connection.client.clone(), &connection.namespace);
    let events = events
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .map(|l| {
            let mut events = l.items;
            events.sort_by_key(last_seen);
            let skip = events.len().saturating_sub(10);
            events.into_iter().skip(skip).collect()
        })
        .map_err(|e| describe("events", e));
    Related { pods, events }
}

pub fn print_pods_and_events(related: &Related) {
    println!("\nPods:");
    match &related.pods {
        Err(error) => println!("  (could not list: {error})"),
        Ok(pods) if pods.is_empty() => println!("  (none)"),
        Ok(pods) => {
            let rows: Vec<Vec<String>> = pods
                .iter()
                .map(|p| {
                    let status = p.status.as_ref();
                    let ready = status
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                        .map(|c| c.status.clone())
                        .unwrap_or_else(|| "Unknown".into());
                    vec![
                        format!("  {}", p.name_any()),
                        status.and_then(|s| s.phase.clone()).unwrap_or_default(),
                        ready,
                        p.spec
                            .as_ref()
                            .and_then(|s| s.node_name.clone())
                            .unwrap_or_default(),
                    ]
                })
                .collect();
            table(&["  NAME", "PHASE", "READY", "NODE"], &rows);
        }
    }
    println!("\nRecent events:");
    match &related.events {
        Err(error) => println!("  (could not list: {error})"),
        Ok(events) if events.is_empty() => println!("  (none)"),
        Ok(events) => {
            for e in events {
                println!(
                    "  {:<8} {:<22} {}",
                    e.type_.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.note.clone().unwrap_or_default()
                );
            }
        }
    }
}
