//! The events a reconcile publishes, decided from the observation (pure): news the moment it
//! first shows — a scale, a refused change, an engine restart — not on every reconcile while
//! it stands.

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::InstanceStatus;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::primary_step::PrimaryStep;
use super::reasons;
use super::resources;
use crate::reconciler::{Announcement, Transition};

/// Published after the children are applied, whatever the status write: a scale, and each
/// refused change when it first shows.
pub fn news(
    db: &DatabaseCluster,
    previous_sts: Option<&StatefulSet>,
    version_refused: Option<&str>,
) -> Vec<Announcement> {
    let mut news = Vec::new();
    let to = resources::stateful_set::instances(db);
    if let Some(from) = previous_sts.and_then(|s| s.spec.replicas)
        && from != to
    {
        news.push(announcement(
            EventType::Normal,
            "Scaling",
            "Scale",
            format!("Scaling from {from} to {to} instances"),
        ));
    }
    // Each refusal is published when it first shows, not on every reconcile while it stands
    // (`Degraded` may show another reason meanwhile; `Stalled` shows the refusal).
    let degraded_for = |reason: &str| {
        db.status.as_ref().is_some_and(|s| {
            [
                devctl_api::conditions::DEGRADED,
                devctl_api::conditions::STALLED,
            ]
            .into_iter()
            .filter_map(|t| devctl_api::conditions::find(&s.conditions, t))
            .any(|c| c.reason == reason)
        })
    };
    if let Some(message) = version_refused
        && !degraded_for("VersionChangeRefused")
    {
        news.push(announcement(
            EventType::Warning,
            "VersionChangeRefused",
            "Upgrade",
            message.to_string(),
        ));
    }
    let refusals = [
        (
            reasons::REPLICATION_UNSUPPORTED,
            resources::stateful_set::replication_refused(db),
        ),
        (
            reasons::SCALE_DOWN_REFUSED,
            resources::stateful_set::scale_down_refused(db),
        ),
    ];
    for (reason, message) in refusals {
        if let Some(message) = message
            && !degraded_for(reason)
        {
            news.push(announcement(EventType::Warning, reason, "Scale", message));
        }
    }
    news
}

/// The credentials Secret `name` was recreated while the data exists (known only once the
/// children are applied).
pub fn credentials_regenerated(name: &str) -> Announcement {
    announcement(
        EventType::Warning,
        reasons::CREDENTIALS_REGENERATED,
        "Credentials",
        format!(
            "Secret {name} was deleted while the cluster's data exists: it was recreated with a new password, which the database does not have yet"
        ),
    )
}

/// `SwitchoverRefused`: a request that cannot be carried out, answered at once.
pub fn switchover_refused(message: String) -> Announcement {
    announcement(
        EventType::Warning,
        "SwitchoverRefused",
        "Switchover",
        message,
    )
}

/// One `ReplacingInstance` per pod replaced with the new template.
pub fn replacing(pod: &str, primary: bool) -> Announcement {
    let which = if primary { "the primary" } else { "a replica" };
    announcement(
        EventType::Normal,
        "ReplacingInstance",
        // Per pod: the recorder folds events of one action into a series.
        &format!("Replace {pod}"),
        format!(
            "Replacing pod {pod} ({which}) with the new pod template; replicas go first, the primary last"
        ),
    )
}

/// One `ExpandingVolume` per claim grown.
pub fn expanding(claim: &str, size: &str) -> Announcement {
    announcement(
        EventType::Normal,
        "ExpandingVolume",
        "Resize",
        format!("Expanding PersistentVolumeClaim {claim} to {size}"),
    )
}

fn announcement(
    type_: EventType,
    reason: &'static str,
    action: &str,
    note: String,
) -> Announcement {
    Announcement {
        type_,
        reason,
        action: action.to_string(),
        note,
    }
}

/// The events published with this reconcile's status write: the failover or switchover
/// step's, and a restart the status records for the first time.
pub fn with_status(db: &DatabaseCluster, step: &PrimaryStep, pods: &[&Pod]) -> Option<Transition> {
    let events: Vec<Announcement> = step
        .events
        .iter()
        .cloned()
        .chain(engine_restarts(db, pods))
        .collect();
    (!events.is_empty()).then(|| Transition {
        resource_version: db.resource_version(),
        events,
    })
}

/// A Warning `EngineRestarted` for each instance whose agent reports an engine restart the
/// status does not record yet (told apart by its time: an agent started again counts from
/// zero; restarts between two reconciles are one event naming the count).
pub fn engine_restarts(db: &DatabaseCluster, pods: &[&Pod]) -> Vec<Announcement> {
    // A cluster's first status: the pods' restarts (if any: pods of a deleted cluster of this
    // name it adopts) are older than the cluster, so not its news.
    if db.status.is_none() {
        return Vec::new();
    }
    let recorded = |name: &str| {
        db.status
            .as_ref()
            .and_then(|s| s.instances.iter().find(|i| i.name == name))
            .and_then(|i| i.last_restart_time.clone())
    };
    pods.iter()
        .filter_map(|pod| {
            let name = pod.name_any();
            let report = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())?;
            let at = report.last_restart_time?;
            (recorded(&name).as_deref() != Some(at.as_str())).then(|| Announcement {
                type_: EventType::Warning,
                reason: "EngineRestarted",
                action: "Restart".into(),
                note: format!(
                    "{name}: {} at {at}; its agent restarted it ({} since the agent started)",
                    report.last_exit.as_deref().unwrap_or("the engine exited"),
                    match report.restarts.unwrap_or(1) {
                        1 => "1 restart".to_string(),
                        n => format!("{n} restarts"),
                    }
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use devctl_api::instance::STATUS_ANNOTATION;

    /// One Warning per restart the status has not recorded: none for a report without
    /// restarts or one the status already shows; a new one after the agent started again.
    #[test]
    fn an_engine_restart_is_announced_once() {
        let with_restart = |name: &str, at: Option<&str>, count: i32| -> Pod {
            let mut report = serde_json::json!({ "role": "primary", "ready": true });
            if let Some(at) = at {
                report["restarts"] = count.into();
                report["lastRestartTime"] = at.into();
                report["lastExit"] = "postgres exited (signal: 9 (SIGKILL))".into();
            }
            serde_json::from_value(serde_json::json!({ "metadata": {
                "name": name,
                "annotations": { STATUS_ANNOTATION: report.to_string() },
            } }))
            .unwrap()
        };
        let cluster = |recorded: Option<&str>| -> DatabaseCluster {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
                "metadata": { "name": "shop", "namespace": "ns" },
                "spec": { "engine": "postgres", "version": "16.4", "storage": { "size": "1Gi" } },
                "status": { "instances": [
                    { "name": "shop-0", "ready": true, "lastRestartTime": recorded } ] },
            }))
            .unwrap()
        };
        let announced = |db: &DatabaseCluster, pod: &Pod| engine_restarts(db, &[pod]);
        let earlier = "2026-12-05T12:00:00Z";
        let later = "2026-12-05T12:05:00Z";
        assert!(announced(&cluster(None), &with_restart("shop-0", None, 0)).is_empty());
        // No status yet: the restarts of pods it adopts are older than the cluster.
        let mut new_cluster = cluster(None);
        new_cluster.status = None;
        assert!(
            announced(
                &new_cluster,
                &with_restart("shop-0", Some("2026-12-05T11:00:00Z"), 4)
            )
            .is_empty()
        );
        let news = announced(&cluster(None), &with_restart("shop-0", Some(earlier), 1));
        assert_eq!(news.len(), 1);
        assert_eq!(news[0].reason, "EngineRestarted");
        assert_eq!(
            news[0].note,
            "shop-0: postgres exited (signal: 9 (SIGKILL)) at 2026-12-05T12:00:00Z; its agent \
             restarted it (1 restart since the agent started)"
        );
        assert!(
            announced(
                &cluster(Some(earlier)),
                &with_restart("shop-0", Some(earlier), 1)
            )
            .is_empty()
        );
        // The agent started again and counts from one: still news.
        assert_eq!(
            announced(
                &cluster(Some(earlier)),
                &with_restart("shop-0", Some(later), 1)
            )
            .len(),
            1
        );
    }
}
