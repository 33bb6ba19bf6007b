//! `devctl db promote`: asks the operator for a switchover (or, with --force, a failover) to a
//! pod and, with --wait, follows it until done or refused (the refusal's reason from its event).

use std::time::Duration;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::{FORCE_FAILOVER_ANNOTATION, SWITCHOVER_ANNOTATION};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::pods_and_events::{last_seen, pods_and_events};
use super::{get, is_ready, progress};
use crate::cluster::{self, Connection};
use crate::wait;

pub(super) async fn promote(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
    pod: &str,
    force: bool,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let db = get(connection, api, name).await?;
    let status = db.status.clone().unwrap_or_default();
    if !status.instances.iter().any(|i| i.name == pod) {
        let names: Vec<&str> = status.instances.iter().map(|i| i.name.as_str()).collect();
        anyhow::bail!(
            "{pod} is not an instance of databasecluster {name} (instances: {})",
            names.join(", ")
        );
    }
    let asked_at = k8s_openapi::jiff::Timestamp::now();
    // Without --force an earlier forced request's permission is taken back.
    let patch = json!({ "metadata": { "annotations": {
        SWITCHOVER_ANNOTATION: pod,
        FORCE_FAILOVER_ANNOTATION: force.then_some("true"),
    } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| {
            cluster::explain(
                e,
                &format!("requesting a switchover of databasecluster {name}"),
                &connection.server,
            )
        })?;
    let what = if force {
        "switchover (or, if the primary does not serve, failover) to"
    } else {
        "switchover to"
    };
    println!(
        "databasecluster {}/{name}: {what} {pod} requested",
        connection.namespace
    );
    if !wait {
        return Ok(());
    }
    let target = pod.to_string();
    wait::until(api, name, timeout, progress, move |db| {
        promoted(db, &target) || switchover_refused(db, &target)
    })
    .await?;
    // Done is final once seen (a later readiness blip is not a refusal); a refusal too.
    if !switchover_refused(Some(&get(connection, api, name).await?), pod) {
        println!("{pod} is the primary");
        return Ok(());
    }
    // The operator answered the request without taking it up; its event, published just
    // before, says why (an older one is about an earlier request).
    let recent = |e: &Event| last_seen(e).is_some_and(|at| at >= asked_at - EVENT_CLOCK_SKEW);
    let why = pods_and_events(connection, None, name)
        .await
        .events
        .ok()
        .and_then(|events| {
            events
                .into_iter()
                .rev()
                .find(|e| e.reason.as_deref() == Some(SWITCHOVER_REFUSED) && recent(e))
                .and_then(|e| e.note)
        })
        .unwrap_or_else(|| format!("no reason recorded, see `devctl db status {name}`"));
    anyhow::bail!("the operator refused the switchover of databasecluster {name} to {pod}: {why}")
}

/// How far the operator's clock (event times) may be behind this machine's.
const EVENT_CLOCK_SKEW: k8s_openapi::jiff::SignedDuration =
    k8s_openapi::jiff::SignedDuration::from_secs(30);

/// The event reason of a switchover request the operator did not take up.
const SWITCHOVER_REFUSED: &str = "SwitchoverRefused";

/// `pod` is the ready primary and no switchover is under way.
fn promoted(db: Option<&DatabaseCluster>, pod: &str) -> bool {
    db.and_then(|d| d.status.as_ref())
        .is_some_and(|s| s.current_primary.as_deref() == Some(pod) && s.target_primary.is_none())
        && is_ready(db)
}

/// The request is gone (the operator answers every request by removing it), yet no switchover
/// to `pod` is under way or done: refused.
fn switchover_refused(db: Option<&DatabaseCluster>, pod: &str) -> bool {
    db.is_some_and(|d| {
        !d.annotations().contains_key(SWITCHOVER_ANNOTATION)
            && d.status.as_ref().is_none_or(|s| {
                s.target_primary.is_none() && s.current_primary.as_deref() != Some(pod)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(annotation: Option<&str>, current: &str, target: Option<&str>) -> DatabaseCluster {
        serde_json::from_value(json!({
            "apiVersion": "db.devctl.io/v1beta1",
            "kind": "DatabaseCluster",
            "metadata": {
                "name": "db",
                "generation": 1,
                "annotations": annotation.map(|pod| json!({ SWITCHOVER_ANNOTATION: pod })),
            },
            "spec": { "engine": "postgres", "version": "16.4", "storage": { "size": "1Gi" } },
            "status": {
                "observedGeneration": 1,
                "currentPrimary": current,
                "targetPrimary": target,
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "Ready", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_promote_wait_ends_when_the_request_is_refused_not_at_its_timeout() {
        // Asked, not yet answered.
        let asked = cluster(Some("db-1"), "db-0", None);
        assert!(!promoted(Some(&asked), "db-1") && !switchover_refused(Some(&asked), "db-1"));
        // Taken up: the status names the target, then the request goes.
        let under_way = cluster(None, "db-0", Some("db-1"));
        assert!(!switchover_refused(Some(&under_way), "db-1"));
        // Done.
        let done = cluster(None, "db-1", None);
        assert!(promoted(Some(&done), "db-1") && !switchover_refused(Some(&done), "db-1"));
        // Answered without a switchover: refused.
        let refused = cluster(None, "db-0", None);
        assert!(switchover_refused(Some(&refused), "db-1"));
        assert!(!promoted(Some(&refused), "db-1"));
    }
}
