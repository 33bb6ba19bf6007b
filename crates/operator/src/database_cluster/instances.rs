//! The instances of a DatabaseCluster as their agents report them (pure).
//!
//! Each database pod's `devctl-agent` writes what it observes of its engine into the pod's
//! annotation [`STATUS_ANNOTATION`]; the operator reads those reports from its pod cache and
//! turns them into `status.instances`, `readyReplicas` and `Ready`. A pod that Kubernetes
//! calls Ready is not enough: on kwok it always is, and even on a kubelet the probe can lag
//! the engine.

use std::collections::BTreeMap;

use devctl_api::database_cluster::InstanceSummary;
use devctl_api::instance::{InstanceStatus, ROLE_PRIMARY, ROLE_REPLICA, STATUS_ANNOTATION};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodStatus,
};
use kube::{Resource, ResourceExt};

use super::resources::stateful_set::CONFIG_HASH_ANNOTATION;

/// Keeps of a cached pod only what the operator reads: identity, labels, the agent's report,
/// the configuration hash, readiness, the IP, the phase and why a container last stopped.
/// A pod's spec is most of its size and is the StatefulSet's business; and what is not kept
/// cannot wake the cluster's reconcile when the kubelet rewrites it (probe times, restarts
/// of the running state).
pub fn trim_pod(pod: &mut Pod) {
    let meta = pod.meta_mut();
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| {
            k == STATUS_ANNOTATION
                || k == CONFIG_HASH_ANNOTATION
                || k == devctl_api::instance::BACKUP_DESTINATION_ANNOTATION
                || k == devctl_api::instance::BACKUP_REQUEST_ANNOTATION
                || k == devctl_api::instance::RESTORE_ANNOTATION
                || k == devctl_api::instance::MAJOR_UPGRADE_RESULT_ANNOTATION
        });
        if let Some(report) = annotations.get_mut(STATUS_ANNOTATION) {
            without_heartbeat(report);
        }
    }
    pod.spec = None;
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            conditions: status.conditions.map(|c| {
                c.into_iter()
                    .filter_map(|c| match c.type_.as_str() {
                        "Ready" => Some(PodCondition {
                            type_: c.type_,
                            status: c.status,
                            ..PodCondition::default()
                        }),
                        // Why the scheduler cannot place it, only while it cannot.
                        "PodScheduled" if c.status == "False" => Some(PodCondition {
                            type_: c.type_,
                            status: c.status,
                            reason: c.reason,
                            message: c.message,
                            ..PodCondition::default()
                        }),
                        _ => None,
                    })
                    .collect()
            }),
            container_statuses: status.container_statuses.map(|statuses| {
                statuses
                    .into_iter()
                    .map(|mut s| ContainerStatus {
                        last_state: s.last_state.take().map(|last| ContainerState {
                            terminated: last.terminated.map(|t| ContainerStateTerminated {
                                exit_code: t.exit_code,
                                message: t.message,
                                ..ContainerStateTerminated::default()
                            }),
                            ..ContainerState::default()
                        }),
                        ..blocked_only(s)
                    })
                    .collect()
            }),
            init_container_statuses: status.init_container_statuses.and_then(|statuses| {
                let blocked: Vec<ContainerStatus> = statuses
                    .into_iter()
                    .map(blocked_only)
                    .filter(|s| s.state.is_some())
                    .collect();
                (!blocked.is_empty()).then_some(blocked)
            }),
            pod_ip: status.pod_ip,
            phase: status.phase,
            ..PodStatus::default()
        });
    }
}

/// Takes the `heartbeat` out of a report's text. Agents rewrite their report once a minute
/// with nothing but a new heartbeat; the operator reads nothing of it, and kept it would make
/// every such rewrite a change of the cached pod — a reconcile of its cluster per instance
/// and minute, for nothing. Other keys are kept as they are (also those this version does
/// not know); text that is not a JSON object is left alone for the reader to refuse.
fn without_heartbeat(report: &mut String) {
    if !report.contains("\"heartbeat\"") {
        return;
    }
    if let Ok(serde_json::Value::Object(mut fields)) = serde_json::from_str(report) {
        fields.remove("heartbeat");
        *report = serde_json::Value::Object(fields).to_string();
    }
}

/// Waiting reasons that mean a container cannot be started without a change (a pull that
/// keeps failing, a bad image name, a missing Secret or ConfigMap key), as opposed to the
/// passing `ContainerCreating`/`PodInitializing`. A crash loop is not among them: its state
/// flips between running and waiting on every restart, which kept would wake the cluster each
/// time; the last exit (`lastState`, kept) says why instead.
const BLOCKED_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// A container status reduced to its name and, while it cannot be started, its image and
/// why — made stable, so the kubelet's retries do not look like news: a failing pull
/// alternates between `ErrImagePull` and `ImagePullBackOff` (kept as the latter, without the
/// message).
fn blocked_only(status: ContainerStatus) -> ContainerStatus {
    let waiting = status
        .state
        .and_then(|s| s.waiting)
        .filter(|w| {
            w.reason
                .as_deref()
                .is_some_and(|r| BLOCKED_REASONS.contains(&r))
        })
        .map(|w| match w.reason.as_deref() {
            Some("ErrImagePull" | "ImagePullBackOff") => ContainerStateWaiting {
                reason: Some("ImagePullBackOff".into()),
                message: None,
            },
            _ => w,
        });
    ContainerStatus {
        name: status.name,
        image: if waiting.is_some() {
            status.image
        } else {
            String::new()
        },
        state: waiting.map(|w| ContainerState {
            waiting: Some(w),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }
}

/// Why a pod cannot run its instance, when Kubernetes says so: the scheduler cannot place it,
/// or one of its containers (the agent's copy step first) cannot be started.
pub fn blocker(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if let Some(unscheduled) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
    {
        let why = unscheduled
            .message
            .as_deref()
            .or(unscheduled.reason.as_deref())
            .unwrap_or("no reason given");
        return Some(format!("the pod cannot be scheduled: {why}"));
    }
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    containers.into_iter().find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        // Only the reasons the cache keeps (a pod read whole would show passing ones too).
        let reason = waiting
            .reason
            .as_deref()
            .filter(|r| BLOCKED_REASONS.contains(r))?;
        Some(match reason {
            "ImagePullBackOff" => format!(
                "container {} cannot pull its image {} ({reason})",
                c.name, c.image
            ),
            _ => match waiting.message.as_deref() {
                Some(message) => format!("container {} cannot start ({reason}): {message}", c.name),
                None => format!("container {} cannot start ({reason})", c.name),
            },
        })
    })
}

/// The ordinal of a StatefulSet pod (`<name>-<ordinal>`).
pub fn ordinal(pod_name: &str) -> Option<i32> {
    pod_name.rsplit_once('-')?.1.parse().ok()
}

/// What the operator makes of its cluster's pods.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Instances {
    pub summaries: Vec<InstanceSummary>,
    /// Instances the cluster runs (`instances(db)`: `spec.replicas` but for a refused change)
    /// that are ready.
    pub ready: i32,
    /// Every ready instance reports roles in line with the credentials Secret at
    /// `resourceVersion` `credentials_version` (and at least one instance is ready).
    pub credentials_applied: bool,
}

impl Instances {
    /// The pods that exist (one summary each, terminating ones included): `status.replicas`.
    pub fn existing(&self) -> i32 {
        i32::try_from(self.summaries.len()).unwrap_or(i32::MAX)
    }
}

/// Whether `pod` serves: not being deleted, Ready, and its agent reports the engine ready
/// (what `status.instances[].ready` says, short of a replica's streaming check).
pub fn serves(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod_ready(pod)
        && InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())
            .is_some_and(|r| r.ready)
}

/// Why synchronous replication is not in force although the spec asks for it: a MariaDB
/// primary reports that semi-synchronous replication fell back to asynchronous (pure).
pub fn synchronous_degraded(pods: &[&Pod], primary: &str, synchronous: bool) -> Option<String> {
    if !synchronous {
        return None;
    }
    let pod = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(primary))?;
    let report = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())?;
    (report.ready && report.semi_sync_active == Some(false)).then(|| {
        format!(
            "the primary {primary} replicates asynchronously: MariaDB switched semi-synchronous replication off (no replica acknowledged within rpl_semi_sync_master_timeout); a failover now may lose acknowledged commits"
        )
    })
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The last reason the agent's container stopped, as the kubelet recorded it.
fn termination_message(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find_map(|s| {
        let terminated = s.last_state.as_ref()?.terminated.as_ref()?;
        let message = terminated.message.as_deref().unwrap_or("").trim();
        let line = message.lines().last().unwrap_or("");
        Some(if line.is_empty() {
            format!("the agent exited with code {}", terminated.exit_code)
        } else {
            line.to_string()
        })
    })
}

/// Summarises `pods` (the cluster's pods, in any order) against `replicas` and the
/// credentials Secret's `resourceVersion`.
pub fn observe(pods: &[&Pod], replicas: i32, credentials_version: Option<&str>) -> Instances {
    let mut by_ordinal: BTreeMap<(i32, String), &Pod> = BTreeMap::new();
    for pod in pods {
        let name = pod.name_any();
        by_ordinal.insert((ordinal(&name).unwrap_or(i32::MAX), name), pod);
    }
    let reports: Vec<((i32, String), &Pod, Option<InstanceStatus>)> = by_ordinal
        .into_iter()
        .map(|(key, pod)| {
            let report = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref());
            (key, pod, report)
        })
        .collect();
    // Whom the ready primaries see streaming. A replica's own report can be from before its
    // primary restarted (it says `ready` until its next probe): it counts only once a primary
    // lists it. Primaries that do not report the list (older agents, MySQL) judge nothing.
    let listing_primaries: Vec<(&str, &[String])> = reports
        .iter()
        .filter(|(_, pod, _)| pod.metadata.deletion_timestamp.is_none() && pod_ready(pod))
        .filter_map(|((_, name), _, report)| {
            let report = report.as_ref()?;
            let list = report.streaming_replicas.as_deref()?;
            (report.ready && report.role.as_deref() == Some(ROLE_PRIMARY))
                .then_some((name.as_str(), list))
        })
        .collect();
    let unlisted_replica = |name: &str, report: &InstanceStatus| {
        report.role.as_deref() == Some(ROLE_REPLICA)
            && !listing_primaries.is_empty()
            && !listing_primaries
                .iter()
                .any(|(_, list)| list.iter().any(|n| n == name))
    };
    let mut instances = Instances::default();
    let mut every_ready_has_credentials = true;
    for ((ordinal, name), pod, report) in &reports {
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let unlisted = report.as_ref().is_some_and(|r| unlisted_replica(name, r));
        let ready =
            !terminating && pod_ready(pod) && report.as_ref().is_some_and(|r| r.ready) && !unlisted;
        let message = match report {
            _ if terminating => Some("the pod is being deleted".to_string()),
            Some(r) if r.last_error.is_some() => r.last_error.clone(),
            Some(r) if !r.ready => Some("the engine does not accept connections yet".into()),
            Some(_) if unlisted => Some(format!(
                "not streaming from the primary {} yet",
                listing_primaries
                    .iter()
                    .map(|(primary, _)| *primary)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some(_) if !pod_ready(pod) => Some(
                blocker(pod)
                    .map(|why| format!("the pod is not Ready: {why}"))
                    .unwrap_or_else(|| "the pod is not Ready".into()),
            ),
            Some(r) if r.moved_aside.is_some() => r.moved_aside.as_deref().map(moved_aside),
            Some(_) => None,
            None => Some(
                blocker(pod)
                    .or_else(|| termination_message(pod))
                    .unwrap_or_else(|| "waiting for the agent's first report".to_string()),
            ),
        };
        if ready && *ordinal < replicas {
            instances.ready += 1;
            if report
                .as_ref()
                .and_then(|r| r.credentials_version.as_deref())
                != credentials_version
            {
                every_ready_has_credentials = false;
            }
        }
        instances.summaries.push(InstanceSummary {
            name: name.clone(),
            role: report.as_ref().and_then(|r| r.role.clone()),
            ready,
            timeline: report.as_ref().and_then(|r| r.timeline),
            lag_bytes: report.as_ref().and_then(|r| r.lag_bytes),
            lag_seconds: report.as_ref().and_then(|r| r.lag_seconds),
            // A pod's word: kept only when it is a GTID position of a sane length.
            gtid_position: report
                .as_ref()
                .and_then(|r| r.gtid_position.clone())
                .filter(|p| p.len() <= 256 && p.parse::<devctl_api::gtid::Position>().is_ok()),
            message,
            restarts: report.as_ref().and_then(|r| r.restarts),
            last_restart_time: report.as_ref().and_then(|r| r.last_restart_time.clone()),
            last_exit: report.as_ref().and_then(|r| r.last_exit.clone()),
        });
    }
    instances.credentials_applied =
        credentials_version.is_some() && instances.ready > 0 && every_ready_has_credentials;
    instances
}

/// The message of an instance that keeps a moved-aside copy of its earlier data (`path`
/// comes from the pod: one line, bounded).
fn moved_aside(path: &str) -> String {
    let path: String = path
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(256)
        .collect();
    format!(
        "a copy of its earlier data is kept at {path}: it may hold commits the primary never received (docs/failover.md says how to read them; delete the copy to free the space)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, ready: bool, report: Option<serde_json::Value>) -> Pod {
        let mut annotations = serde_json::Map::new();
        if let Some(report) = report {
            annotations.insert(STATUS_ANNOTATION.into(), json!(report.to_string()));
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "ns",
                "labels": { "app.kubernetes.io/name": "databasecluster", "app.kubernetes.io/instance": "db" },
                "annotations": annotations,
            },
            "spec": { "containers": [{ "name": "postgres", "image": "postgres:16.2" }] },
            "status": {
                "conditions": [
                    { "type": "Ready", "status": if ready { "True" } else { "False" } },
                    { "type": "PodScheduled", "status": "True" },
                ],
                "podIP": "10.0.0.1",
            },
        }))
        .unwrap()
    }

    #[test]
    fn synchronous_replication_is_degraded_only_when_the_primary_reports_it_off() {
        let report = |active: Option<bool>| {
            let mut r = json!({ "ready": true, "role": "primary" });
            if let Some(active) = active {
                r["semiSyncActive"] = json!(active);
            }
            r
        };
        let off = [pod("db-0", true, Some(report(Some(false))))];
        let refs: Vec<&Pod> = off.iter().collect();
        let why = synchronous_degraded(&refs, "db-0", true).unwrap();
        assert!(
            why.contains("db-0") && why.contains("asynchronously"),
            "{why}"
        );
        // Not asked for, or another pod's report, or active: nothing to say.
        assert_eq!(synchronous_degraded(&refs, "db-0", false), None);
        assert_eq!(synchronous_degraded(&refs, "db-1", true), None);
        let on = [pod("db-0", true, Some(report(Some(true))))];
        let refs: Vec<&Pod> = on.iter().collect();
        assert_eq!(synchronous_degraded(&refs, "db-0", true), None);
        // PostgreSQL reports nothing of the kind.
        let pg = [pod("db-0", true, Some(report(None)))];
        let refs: Vec<&Pod> = pg.iter().collect();
        assert_eq!(synchronous_degraded(&refs, "db-0", true), None);
    }

    #[test]
    fn only_agents_that_report_ready_count_and_pod_readiness_alone_does_not() {
        let pods = [
            pod("db-1", true, Some(json!({ "ready": false }))),
            pod(
                "db-0",
                true,
                Some(
                    json!({ "ready": true, "role": "primary", "timeline": 1, "credentialsVersion": "7" }),
                ),
            ),
            pod("db-2", true, None),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let instances = observe(&refs, 3, Some("7"));
        assert_eq!(instances.ready, 1);
        let names: Vec<&str> = instances
            .summaries
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["db-0", "db-1", "db-2"]);
        assert_eq!(instances.summaries[0].role.as_deref(), Some("primary"));
        assert_eq!(instances.summaries[0].message, None);
        assert_eq!(
            instances.summaries[1].message.as_deref(),
            Some("the engine does not accept connections yet")
        );
        assert_eq!(
            instances.summaries[2].message.as_deref(),
            Some("waiting for the agent's first report")
        );
        assert!(instances.credentials_applied);
    }

    #[test]
    fn a_replica_counts_only_once_its_primary_lists_it_streaming() {
        let primary = |streaming: serde_json::Value| {
            pod(
                "db-0",
                true,
                Some(json!({ "ready": true, "role": "primary", "streamingReplicas": streaming })),
            )
        };
        let replica = |name: &str| {
            pod(
                name,
                true,
                Some(json!({ "ready": true, "role": "replica" })),
            )
        };
        // db-2 still says ready from before the primary restarted; the primary does not see it.
        let pods = [primary(json!(["db-1"])), replica("db-1"), replica("db-2")];
        let refs: Vec<&Pod> = pods.iter().collect();
        let instances = observe(&refs, 3, None);
        assert_eq!(instances.ready, 2);
        assert!(instances.summaries[1].ready);
        assert!(!instances.summaries[2].ready);
        assert_eq!(
            instances.summaries[2].message.as_deref(),
            Some("not streaming from the primary db-0 yet")
        );
        let pods = [
            primary(json!(["db-1", "db-2"])),
            replica("db-1"),
            replica("db-2"),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(observe(&refs, 3, None).ready, 3);
        // A primary that does not report the list (an older agent) judges nothing.
        let pods = [
            pod(
                "db-0",
                true,
                Some(json!({ "ready": true, "role": "primary" })),
            ),
            replica("db-1"),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(observe(&refs, 2, None).ready, 2);
    }

    #[test]
    fn the_agents_last_error_is_the_message_and_old_credentials_are_not_applied() {
        let pods = [pod(
            "db-0",
            true,
            Some(json!({ "ready": true, "lastError": "boom", "credentialsVersion": "6" })),
        )];
        let refs: Vec<&Pod> = pods.iter().collect();
        let instances = observe(&refs, 1, Some("7"));
        assert_eq!(instances.summaries[0].message.as_deref(), Some("boom"));
        assert!(!instances.credentials_applied);
    }

    #[test]
    fn a_moved_aside_copy_is_the_message_of_a_healthy_instance_and_errors_outrank_it() {
        let copy = "/var/lib/postgresql/data.old-1764000000";
        let pods = [
            pod(
                "db-0",
                true,
                Some(json!({ "ready": true, "movedAside": copy })),
            ),
            pod(
                "db-1",
                true,
                Some(json!({ "ready": true, "movedAside": copy, "lastError": "boom" })),
            ),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let instances = observe(&refs, 2, None);
        let message = instances.summaries[0].message.clone().unwrap();
        assert!(
            message.contains(copy) && message.contains("commits"),
            "{message}"
        );
        assert!(instances.summaries[0].ready);
        assert_eq!(instances.summaries[1].message.as_deref(), Some("boom"));
        // Values from pods are untrusted: one line, bounded.
        let long = format!("/x\n{}", "a".repeat(1000));
        assert!(!moved_aside(&long).contains('\n'));
        assert!(moved_aside(&long).len() < 500);
    }

    #[test]
    fn trimming_keeps_the_report_and_readiness_and_drops_the_spec() {
        let mut p = pod("db-0", true, Some(json!({ "ready": true })));
        trim_pod(&mut p);
        assert!(p.spec.is_none());
        assert!(pod_ready(&p));
        assert_eq!(
            p.status
                .as_ref()
                .unwrap()
                .conditions
                .as_ref()
                .unwrap()
                .len(),
            1
        );
        assert!(InstanceStatus::from_annotations(p.metadata.annotations.as_ref()).is_some());
        assert_eq!(
            super::super::controller::labelled_owner(&p).unwrap().name,
            "db"
        );
    }

    fn with_status(status: serde_json::Value) -> Pod {
        let mut p = pod("db-0", false, None);
        p.status = Some(serde_json::from_value(status).unwrap());
        trim_pod(&mut p);
        p
    }

    fn message_of(p: &Pod) -> String {
        observe(&[p], 1, None).summaries[0]
            .message
            .clone()
            .unwrap_or_default()
    }

    #[test]
    fn a_pod_that_cannot_run_says_why_and_retries_are_no_news() {
        let unschedulable = with_status(json!({
            "phase": "Pending",
            "conditions": [{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu." }],
        }));
        assert_eq!(
            message_of(&unschedulable),
            "the pod cannot be scheduled: 0/3 nodes are available: 3 Insufficient cpu."
        );

        let pulling = |reason: &str, message: &str| {
            with_status(json!({
                "phase": "Pending",
                "conditions": [{ "type": "PodScheduled", "status": "True" }],
                "containerStatuses": [{ "name": "postgres", "image": "postgres:99", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": { "waiting": { "reason": reason, "message": message } } }],
            }))
        };
        let failed = pulling("ErrImagePull", "rpc error: manifest unknown");
        let backing_off = pulling("ImagePullBackOff", "Back-off pulling image \"postgres:99\"");
        // The kubelet's alternation between the two is the same cached pod.
        assert_eq!(failed, backing_off);
        assert_eq!(
            message_of(&failed),
            "container postgres cannot pull its image postgres:99 (ImagePullBackOff)"
        );

        // The agent's copy step (an init container) missing a Secret key.
        let config = with_status(json!({
            "phase": "Pending",
            "initContainerStatuses": [{ "name": "agent", "image": "devctl:1", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": { "waiting": { "reason": "CreateContainerConfigError",
                    "message": "secret \"db-credentials\" not found" } } }],
            "containerStatuses": [{ "name": "postgres", "image": "postgres:16.2", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": { "waiting": { "reason": "PodInitializing" } } }],
        }));
        assert_eq!(
            message_of(&config),
            "container agent cannot start (CreateContainerConfigError): secret \"db-credentials\" not found"
        );

        // A crash loop keeps nothing of its flipping state; its last exit is the message.
        let crashing = |state: serde_json::Value| {
            with_status(json!({
                "phase": "Running",
                "containerStatuses": [{ "name": "postgres", "image": "postgres:16.2", "imageID": "",
                    "ready": false, "restartCount": 4, "state": state,
                    "lastState": { "terminated": { "exitCode": 1, "message": "initdb: disk full" } } }],
            }))
        };
        let waiting = crashing(json!({ "waiting": { "reason": "CrashLoopBackOff",
            "message": "back-off 40s restarting failed container" } }));
        assert_eq!(
            waiting,
            crashing(json!({ "running": { "startedAt": "2026-12-05T03:00:00Z" } }))
        );
        assert_eq!(message_of(&waiting), "initdb: disk full");

        // Passing states keep nothing beyond what was kept before.
        let creating = with_status(json!({
            "phase": "Pending",
            "containerStatuses": [{ "name": "postgres", "image": "postgres:16.2", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": { "waiting": { "reason": "ContainerCreating" } } }],
        }));
        let status = creating.status.as_ref().unwrap();
        let kept = &status.container_statuses.as_ref().unwrap()[0];
        assert!(kept.state.is_none() && kept.image.is_empty());
        assert_eq!(
            message_of(&creating),
            "waiting for the agent's first report"
        );
    }

    #[test]
    fn a_report_that_only_moves_its_heartbeat_is_the_same_cached_pod() {
        let reported = |heartbeat: &str| {
            let mut p = pod(
                "db-0",
                true,
                Some(json!({ "ready": true, "role": "primary", "timeline": 1,
                    "heartbeat": heartbeat, "futureKey": 7 })),
            );
            trim_pod(&mut p);
            p
        };
        let first = reported("2026-12-05T03:00:00Z");
        assert_eq!(first, reported("2026-12-05T03:01:00Z"));
        let report = InstanceStatus::from_annotations(first.metadata.annotations.as_ref()).unwrap();
        assert!(report.ready && report.heartbeat.is_none());
        assert_eq!(report.timeline, Some(1));
        let text = &first.metadata.annotations.as_ref().unwrap()[STATUS_ANNOTATION];
        assert!(text.contains("\"futureKey\":7"), "{text}");
        assert_eq!(observe(&[&first], 1, None).ready, 1);
    }
}
