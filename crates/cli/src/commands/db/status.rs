//! `devctl db status`: a cluster's phase, endpoints, backups, conditions, instances, pods and
//! recent events (or all of it as JSON/YAML).

use devctl_api::database_cluster::DatabaseCluster;
use kube::api::Api;
use serde_json::json;

use super::get;
use super::pods_and_events::{pods_and_events, print_pods_and_events};
use crate::cluster::{Connection, GlobalArgs};
use crate::output::{self, table};

pub(super) async fn status(
    global: &GlobalArgs,
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
) -> anyhow::Result<()> {
    let db = get(connection, api, name).await?;
    let status = db.status.clone().unwrap_or_default();
    let related = pods_and_events(connection, status.selector.as_deref(), name).await;
    let (pods, events) = related.lists();
    if output::structured(
        global.output,
        &json!({ "databaseCluster": db, "pods": pods, "events": events }),
    )? {
        return related.check();
    }
    println!("Name:        {}/{}", connection.namespace, name);
    println!("Engine:      {} {}", db.spec.engine, db.spec.version);
    if let Some(running) = status
        .current_version
        .as_deref()
        .filter(|v| *v != db.spec.version)
    {
        println!("Running:     {running}");
    }
    if let Some(upgrade) = &status.major_upgrade {
        println!(
            "Upgrade:     {} -> {} ({}): {:?}{}",
            upgrade.from,
            upgrade.to,
            upgrade.method.as_str(),
            upgrade.step,
            upgrade
                .message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        );
    }
    println!(
        "Phase:       {}",
        status.phase.map(|p| p.as_str()).unwrap_or("Pending")
    );
    println!(
        "Instances:   {}/{} ready",
        status.ready_replicas, db.spec.replicas
    );
    println!(
        "Storage:     {} per instance",
        status
            .storage_size
            .as_deref()
            .unwrap_or(&db.spec.storage.size)
    );
    println!(
        "Primary:     {}",
        status.primary_endpoint.as_deref().unwrap_or("-")
    );
    println!(
        "Replicas:    {}",
        status.replica_endpoint.as_deref().unwrap_or("-")
    );
    println!(
        "Credentials: secret/{}",
        status.connection_secret_name.as_deref().unwrap_or("-")
    );
    if let Some(epoch) = status.failover_epoch {
        println!(
            "Failovers:   {epoch} (last at {})",
            status.last_failover_time.as_deref().unwrap_or("-")
        );
    }
    if let Some(record) = &status.last_failover {
        let last_seen = record
            .primary_last_seen_at
            .as_deref()
            .map(|t| format!("last seen {t}, "))
            .unwrap_or_default();
        println!(
            "Last move:   {:?} from {} to {}: {last_seen}detected {}, elected {}, promoted {}, service switched {}",
            record.reason,
            record.failed_primary,
            record.new_primary.as_deref().unwrap_or("-"),
            record.detected_at,
            record.elected_at.as_deref().unwrap_or("-"),
            record.promoted_at.as_deref().unwrap_or("-"),
            record.service_switched_at.as_deref().unwrap_or("-"),
        );
    }
    println!(
        "Last backup: {}",
        match (&status.last_backup, &status.last_backup_name) {
            (Some(at), Some(name)) => format!("{at} ({name})"),
            (Some(at), None) => at.clone(),
            _ => "-".into(),
        }
    );
    println!(
        "Next backup: {}",
        status
            .next_scheduled_backup
            .as_deref()
            .map(|t| format!(
                "{t} (schedule {})",
                db.spec
                    .backup
                    .as_ref()
                    .map(|b| b.schedule.as_str())
                    .unwrap_or("-")
            ))
            .unwrap_or_else(|| "- (no schedule running)".into())
    );
    output::conditions(&status.conditions);
    if !status.instances.is_empty() {
        println!();
        // MariaDB has GTID positions and lag in seconds where PostgreSQL has timelines and
        // bytes.
        let mariadb = db.spec.engine == devctl_api::database_cluster::Engine::Mariadb;
        table(
            &[
                "INSTANCE",
                "ROLE",
                "READY",
                if mariadb { "GTID" } else { "TIMELINE" },
                "LAG",
                "RESTARTS",
                "MESSAGE",
            ],
            &status
                .instances
                .iter()
                .map(|i| {
                    let (position, lag) = if mariadb {
                        (
                            i.gtid_position.clone().unwrap_or_else(|| "-".into()),
                            i.lag_seconds.map_or("-".into(), |l| format!("{l}s")),
                        )
                    } else {
                        (
                            i.timeline.map_or("-".into(), |t| t.to_string()),
                            i.lag_bytes.map_or("-".into(), |l| format!("{l} B")),
                        )
                    };
                    vec![
                        i.name.clone(),
                        i.role.clone().unwrap_or_else(|| "-".into()),
                        i.ready.to_string(),
                        position,
                        lag,
                        restarts(i.restarts, i.last_restart_time.as_deref()),
                        i.message.clone().unwrap_or_default(),
                    ]
                })
                .collect::<Vec<_>>(),
        );
    }
    print_pods_and_events(&related);
    related.check()
}

/// `kubectl get pods`' form: `0`, or `2 (5m ago)`.
fn restarts(count: Option<i32>, last: Option<&str>) -> String {
    let count = count.unwrap_or(0);
    let ago = last
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|t| {
            let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t);
            format!(" ({} ago)", output::age(Some(&at)))
        });
    match ago {
        Some(ago) if count > 0 => format!("{count}{ago}"),
        _ => count.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_read_like_kubectls() {
        assert_eq!(restarts(None, None), "0");
        let five_minutes_ago = (k8s_openapi::jiff::Timestamp::now()
            - k8s_openapi::jiff::SignedDuration::from_secs(300))
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
        assert_eq!(restarts(Some(2), Some(&five_minutes_ago)), "2 (5m ago)");
        assert_eq!(restarts(Some(1), Some("not a time")), "1");
    }
}
