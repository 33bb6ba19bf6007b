//! What the operator does to the database pods themselves: the role label that the `-rw` and
//! `-ro` Services select by, and ordered replacement after a pod template change.
//!
//! The StatefulSet uses `OnDelete`, so its controller never replaces a pod on its own: a
//! rolling update that took the primary first (or two instances at once) would interrupt
//! writes more than needed. Instead, one outdated pod at a time is deleted — replicas first
//! (highest ordinal first), the primary last — and only while every instance is ready, so the
//! previous replacement streams again before the next starts; a pod Kubernetes says cannot
//! run at all goes first, without waiting. The StatefulSet controller recreates the deleted
//! pod from the new template on the same claim.

use devctl_api::instance::{ROLE_LABEL, ROLE_PRIMARY, ROLE_REPLICA};

use super::instances::blocker;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::instances::ordinal;
use super::primary::Primary;

/// The label the StatefulSet controller puts on each pod: the revision it was created from.
const REVISION_LABEL: &str = "controller-revision-hash";

/// The pods, not being deleted, that the StatefulSet's controller created at its update
/// revision: its `updatedReplicas`, seen from the pod cache as soon as each pod exists rather
/// than from its next status update.
pub fn at_update_revision(pods: &[&Pod], sts: Option<&StatefulSet>) -> i32 {
    let Some(update_revision) = update_revision(sts) else {
        return 0;
    };
    let updated = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| at_revision(p, update_revision))
        .count();
    i32::try_from(updated).unwrap_or(i32::MAX)
}

/// The revision the StatefulSet's controller creates pods at, once its status says.
pub fn update_revision(sts: Option<&StatefulSet>) -> Option<&str> {
    sts.and_then(|s| s.status.as_ref())
        .and_then(|s| s.update_revision.as_deref())
}

/// Whether the StatefulSet's status describes its current spec (else its revision is stale).
pub fn revision_current(sts: Option<&StatefulSet>) -> bool {
    sts.is_some_and(|s| {
        s.status
            .as_ref()
            .and_then(|st| st.observed_generation)
            .is_some_and(|g| Some(g) >= s.metadata.generation)
    })
}

pub fn at_revision(pod: &Pod, revision: &str) -> bool {
    pod.labels().get(REVISION_LABEL).map(String::as_str) == Some(revision)
}

/// A change to one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodAction {
    /// Set the role label to this value (`None`: remove it).
    Label {
        pod: String,
        role: Option<&'static str>,
    },
    /// Delete this outdated pod (its replacement comes from the new template).
    Replace {
        pod: String,
        uid: String,
        primary: bool,
    },
}

/// The role each pod should carry: the primary is the pod named in `status.currentPrimary`.
/// During a switchover or a failover the old primary carries none: it has stopped writing
/// (or is lost), and neither `-rw` nor `-ro` may send clients to it. The failover's elected
/// target stays a replica until it has promoted and holds the lock (`currentPrimary`).
pub fn role_of(pod: &str, primary: &Primary) -> Option<&'static str> {
    if primary.failed.as_deref() == Some(pod) {
        return None;
    }
    if pod == primary.current {
        primary.target.is_none().then_some(ROLE_PRIMARY)
    } else {
        Some(ROLE_REPLICA)
    }
}

/// What to do to `pods` now (pure): every missing or wrong role label, and at most one pod
/// replacement. `ready` counts the ready instances of the `replicas` the cluster runs. An
/// outdated pod is replaced once every instance is ready — or at once when Kubernetes says
/// it cannot run at all ([`blocker`]: no node can hold it, its image cannot be pulled, a
/// key it needs is missing): it serves nothing, and only a new pod from the fixed template
/// mends it. A pod that is merely not ready (recovering, a replica that lost its primary)
/// waits, as before.
pub fn plan(
    pods: &[&Pod],
    sts: Option<&StatefulSet>,
    primary: &Primary,
    replicas: i32,
    ready: i32,
) -> Vec<PodAction> {
    let mut actions: Vec<PodAction> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let name = p.name_any();
            let role = role_of(&name, primary);
            (p.labels().get(ROLE_LABEL).map(String::as_str) != role)
                .then_some(PodAction::Label { pod: name, role })
        })
        .collect();

    let Some(update_revision) = update_revision(sts) else {
        return actions;
    };
    // The StatefulSet's status must describe its current spec, else its revision is stale.
    let revision_current = revision_current(sts);
    let everyone_ready = ready >= replicas && pods.len() as i32 >= replicas;
    let anyone_leaving = pods.iter().any(|p| p.metadata.deletion_timestamp.is_some());
    // A pod deleted now could be the one the switchover or failover needs.
    let switching = primary.target.is_some() || primary.failed.is_some();
    if !revision_current || anyone_leaving || switching {
        return actions;
    }
    let mut outdated: Vec<&&Pod> = pods
        .iter()
        .filter(|p| !at_revision(p, update_revision))
        .collect();
    // Replicas before the primary; among replicas the highest ordinal first.
    outdated.sort_by_key(|p| {
        let name = p.name_any();
        (
            name == primary.current,
            std::cmp::Reverse(ordinal(&name).unwrap_or(0)),
        )
    });
    let next = match outdated.iter().find(|p| blocker(p).is_some()) {
        Some(stuck) => Some(stuck),
        None if everyone_ready => outdated.first(),
        None => None,
    };
    if let Some(pod) = next {
        let name = pod.name_any();
        actions.push(PodAction::Replace {
            primary: name == primary.current,
            uid: pod.uid().unwrap_or_default(),
            pod: name,
        });
    }
    actions
}

/// A write to one pod, in the order the executor makes them.
#[derive(Debug, Clone, PartialEq)]
pub enum PodWrite {
    /// The role label, with the pod's missing annotations in the same patch.
    Label {
        pod: String,
        role: Option<&'static str>,
        annotations: Option<serde_json::Value>,
    },
    /// Delete it (bound to its uid) so that its StatefulSet makes it again from the new
    /// template.
    Replace {
        pod: String,
        uid: String,
        primary: bool,
    },
    /// Only annotations (null values remove one).
    Annotate {
        pod: String,
        annotations: serde_json::Value,
    },
}

/// The rollout (pure): the role labels and the one replacement of [`plan`], each pod's
/// backup annotations riding on its label patch, then the annotations of the pods whose
/// label is right. A replaced pod gets nothing: its replacement gets them.
pub fn writes(
    actions: Vec<PodAction>,
    annotations: Vec<(String, serde_json::Value)>,
) -> Vec<PodWrite> {
    let mut annotations: std::collections::BTreeMap<String, serde_json::Value> =
        annotations.into_iter().collect();
    let mut writes: Vec<PodWrite> = actions
        .into_iter()
        .map(|action| match action {
            PodAction::Label { pod, role } => PodWrite::Label {
                annotations: annotations.remove(&pod),
                pod,
                role,
            },
            PodAction::Replace { pod, uid, primary } => {
                annotations.remove(&pod);
                PodWrite::Replace { pod, uid, primary }
            }
        })
        .collect();
    writes.extend(
        annotations
            .into_iter()
            .map(|(pod, annotations)| PodWrite::Annotate { pod, annotations }),
    );
    writes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, revision: &str, role: Option<&str>) -> Pod {
        let mut labels = json!({ REVISION_LABEL: revision });
        if let Some(role) = role {
            labels[ROLE_LABEL] = json!(role);
        }
        serde_json::from_value(json!({
            "metadata": { "name": name, "uid": format!("uid-{name}"), "labels": labels }
        }))
        .unwrap()
    }

    fn sts(update_revision: &str) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": { "name": "db", "generation": 2 },
            "spec": { "selector": {}, "serviceName": "x", "template": {} },
            "status": { "replicas": 3, "observedGeneration": 2, "updateRevision": update_revision }
        }))
        .unwrap()
    }

    fn primary(current: &str) -> Primary {
        Primary {
            current: current.into(),
            target: None,
            ..Default::default()
        }
    }

    #[test]
    fn pods_at_the_update_revision_are_counted_from_their_labels() {
        let mut leaving = pod("db-2", "b", None);
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let pods = [pod("db-0", "b", None), pod("db-1", "a", None), leaving];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(at_update_revision(&refs, Some(&sts("b"))), 1);
        assert_eq!(at_update_revision(&refs, Some(&sts("a"))), 1);
        // No update revision known yet: nothing counts.
        assert_eq!(at_update_revision(&refs, None), 0);
    }

    #[test]
    fn labels_follow_current_primary() {
        let pods = [pod("db-0", "a", None), pod("db-1", "a", Some("primary"))];
        let refs: Vec<&Pod> = pods.iter().collect();
        let actions = plan(&refs, Some(&sts("a")), &primary("db-0"), 2, 2);
        assert_eq!(
            actions,
            [
                PodAction::Label {
                    pod: "db-0".into(),
                    role: Some(ROLE_PRIMARY)
                },
                PodAction::Label {
                    pod: "db-1".into(),
                    role: Some(ROLE_REPLICA)
                },
            ]
        );
        // Mid-switchover the old primary loses its label and nothing is replaced.
        let switching = Primary {
            current: "db-1".into(),
            target: Some("db-0".into()),
            ..Default::default()
        };
        let pods = [
            pod("db-0", "a", Some("replica")),
            pod("db-1", "old", Some("primary")),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(
            plan(&refs, Some(&sts("a")), &switching, 2, 2),
            [PodAction::Label {
                pod: "db-1".into(),
                role: None
            }]
        );
    }

    #[test]
    fn replicas_are_replaced_first_highest_ordinal_first_and_the_primary_last() {
        let roles = |n: &str| Some(if n == "db-0" { "primary" } else { "replica" });
        let mk = |revisions: [&str; 3]| -> Vec<Pod> {
            ["db-0", "db-1", "db-2"]
                .iter()
                .zip(revisions)
                .map(|(n, r)| pod(n, r, roles(n)))
                .collect()
        };
        let step = |pods: &[Pod]| {
            let refs: Vec<&Pod> = pods.iter().collect();
            plan(&refs, Some(&sts("new")), &primary("db-0"), 3, 3)
        };
        let first = step(&mk(["old", "old", "old"]));
        assert!(
            matches!(&first[..], [PodAction::Replace { pod, primary: false, .. }] if pod == "db-2")
        );
        let second = step(&mk(["old", "old", "new"]));
        assert!(
            matches!(&second[..], [PodAction::Replace { pod, primary: false, .. }] if pod == "db-1")
        );
        let last = step(&mk(["old", "new", "new"]));
        assert!(
            matches!(&last[..], [PodAction::Replace { pod, primary: true, .. }] if pod == "db-0")
        );
        assert!(step(&mk(["new", "new", "new"])).is_empty());
    }

    #[test]
    fn during_a_failover_the_failed_primary_has_no_role_and_the_target_waits_as_a_replica() {
        let pods = [
            pod("db-0", "old", Some("primary")),
            pod("db-1", "old", Some("replica")),
            pod("db-2", "old", Some("replica")),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let failing = |target: &str| Primary {
            current: "db-0".into(),
            target: Some(target.into()),
            failed: Some("db-0".into()),
            epoch: Some(1),
            last_failover_time: Some("2025-01-01T00:00:00Z".into()),
            failed_targets: Vec::new(),
            last_switchover_time: None,
            last_failover: None,
        };
        for target in [devctl_api::instance::TARGET_PENDING, "db-2"] {
            // Nothing replaced although every revision is outdated and all pods are ready.
            assert_eq!(
                plan(&refs, Some(&sts("new")), &failing(target), 3, 3),
                [PodAction::Label {
                    pod: "db-0".into(),
                    role: None
                }]
            );
            assert_eq!(role_of("db-2", &failing(target)), Some(ROLE_REPLICA));
        }
        // Done: the new primary and the old one as a replica.
        let done = Primary {
            current: "db-2".into(),
            epoch: Some(1),
            last_failover_time: Some("2025-01-01T00:00:00Z".into()),
            ..Default::default()
        };
        assert_eq!(role_of("db-2", &done), Some(ROLE_PRIMARY));
        assert_eq!(role_of("db-0", &done), Some(ROLE_REPLICA));
        // And a later rollout replaces replicas before the new primary.
        let refs: Vec<&Pod> = pods.iter().collect();
        assert!(matches!(
            &plan(&refs, Some(&sts("new")), &done, 3, 3)[..],
            [.., PodAction::Replace { pod, primary: false, .. }] if pod == "db-1"
        ));
        let updated = [
            pod("db-0", "new", Some("replica")),
            pod("db-1", "new", Some("replica")),
            pod("db-2", "old", Some("primary")),
        ];
        let refs: Vec<&Pod> = updated.iter().collect();
        assert!(matches!(
            &plan(&refs, Some(&sts("new")), &done, 3, 3)[..],
            [PodAction::Replace { pod, primary: true, .. }] if pod == "db-2"
        ));
    }

    #[test]
    fn an_outdated_pod_that_cannot_run_is_replaced_first_and_the_others_wait() {
        let pods = [
            pod("db-0", "old", Some("primary")),
            pod("db-1", "old", Some("replica")),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        // Merely not ready (recovering, lost its primary): nothing is replaced.
        assert!(plan(&refs, Some(&sts("new")), &primary("db-0"), 2, 1).is_empty());

        let unschedulable = |name: &str, revision: &str, role: &str| {
            let mut p = pod(name, revision, Some(role));
            p.status = Some(
                serde_json::from_value(json!({
                    "phase": "Pending",
                    "conditions": [{ "type": "PodScheduled", "status": "False",
                        "reason": "Unschedulable", "message": "0/3 nodes are available" }],
                }))
                .unwrap(),
            );
            p
        };
        // db-1 cannot run: it goes first, without waiting for the others.
        let pods = [
            pod("db-0", "old", Some("primary")),
            unschedulable("db-1", "old", "replica"),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert!(matches!(
            &plan(&refs, Some(&sts("new")), &primary("db-0"), 2, 1)[..],
            [PodAction::Replace { pod, primary: false, .. }] if pod == "db-1"
        ));
        // Once it runs the new template (and still cannot run), a ready db-0 waits.
        let pods = [
            pod("db-0", "old", Some("primary")),
            unschedulable("db-1", "new", "replica"),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert!(plan(&refs, Some(&sts("new")), &primary("db-0"), 2, 1).is_empty());
        // A primary that cannot run on an outdated template is replaced too.
        let stuck = [unschedulable("db-0", "old", "primary")];
        let refs: Vec<&Pod> = stuck.iter().collect();
        assert!(matches!(
            &plan(&refs, Some(&sts("new")), &primary("db-0"), 1, 0)[..],
            [PodAction::Replace { pod, primary: true, .. }] if pod == "db-0"
        ));
    }
}
