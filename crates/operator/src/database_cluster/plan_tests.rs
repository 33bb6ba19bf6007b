//! The decision tables replayed without a control plane: a failover, a switchover, a rolling
//! update and a scale-down, each as a sequence of observations — what the caches would hold
//! after the previous plan's writes and the agents' answers — asserting every plan.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use devctl_api::database_cluster::{DatabaseCluster, FailoverReason, FailoverRecord};
use devctl_api::instance::{
    BACKUP_DESTINATION_ANNOTATION, BACKUP_DESTINATION_OFF, ROLE_LABEL, STATUS_ANNOTATION,
    SWITCHOVER_ANNOTATION, TARGET_PENDING,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::*;
use crate::database_cluster::observe::Observation;
use crate::database_cluster::pods::PodWrite;
use crate::database_cluster::primary::{LeaseObservation, Primary};
use crate::database_cluster::primary_step::LEASE_RECHECK;
use crate::database_cluster::reasons;
use crate::database_cluster::resources;
use crate::database_cluster::resources::Names;

const REVISION_LABEL: &str = "controller-revision-hash";

/// One instance as the caches show it.
#[derive(Clone)]
struct Instance {
    name: String,
    role_label: Option<&'static str>,
    revision: &'static str,
    report: Value,
}

/// A cluster `db` in namespace `ns` and what the caches hold of it.
struct World {
    cluster: Value,
    instances: Vec<Instance>,
    update_revision: &'static str,
    /// The StatefulSet's `spec.replicas`, as the last apply left it.
    stateful_set_replicas: i64,
    lease: Option<LeaseObservation>,
    live: BTreeSet<String>,
    lease_confirmed: Option<bool>,
    now: Timestamp,
}

fn primary_report() -> Value {
    json!({ "role": "primary", "ready": true, "timeline": 1, "streamingReplicas": ["db-1", "db-2"] })
}

fn replica_report(received: &str) -> Value {
    json!({ "role": "replica", "ready": true, "timeline": 1, "receivedLSN": received, "replayedLSN": received })
}

impl World {
    /// Three healthy instances, `db-0` the primary, high availability with automatic
    /// failover after 30 s.
    fn three() -> Self {
        let instance = |n: usize, role: &'static str, report: Value| Instance {
            name: format!("db-{n}"),
            role_label: Some(role),
            revision: "r1",
            report,
        };
        Self {
            cluster: json!({
                "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
                "metadata": { "name": "db", "namespace": "ns", "uid": "uid-db", "resourceVersion": "1" },
                "spec": {
                    "engine": "postgres", "version": "15.8", "replicas": 3,
                    "storage": { "size": "1Gi" },
                    "highAvailability": { "enabled": true, "autoFailover": true, "failoverTimeout": "30s" },
                },
                "status": { "currentPrimary": "db-0", "currentVersion": "15.8" },
            }),
            instances: vec![
                instance(0, "primary", primary_report()),
                instance(1, "replica", replica_report("0/3000000")),
                instance(2, "replica", replica_report("0/3000000")),
            ],
            update_revision: "r1",
            stateful_set_replicas: 3,
            lease: Some(LeaseObservation {
                holder: Some("db-0".into()),
                ever_held: true,
                unchanged_for: Duration::from_secs(5),
            }),
            live: BTreeSet::new(),
            lease_confirmed: None,
            now: "2026-12-06T12:00:00Z".parse().unwrap(),
        }
    }

    fn pod(&self, instance: &Instance) -> Pod {
        let mut labels = json!({
            "app.kubernetes.io/name": "databasecluster",
            "app.kubernetes.io/instance": "db",
            REVISION_LABEL: instance.revision,
        });
        if let Some(role) = instance.role_label {
            labels[ROLE_LABEL] = json!(role);
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": instance.name, "namespace": "ns", "uid": format!("uid-{}", instance.name),
                "labels": labels,
                "annotations": {
                    STATUS_ANNOTATION: instance.report.to_string(),
                    BACKUP_DESTINATION_ANNOTATION: BACKUP_DESTINATION_OFF,
                },
            },
            "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] },
        }))
        .unwrap()
    }

    fn observation(&self) -> Observation {
        let cluster: DatabaseCluster = serde_json::from_value(self.cluster.clone()).unwrap();
        let replicas = self.stateful_set_replicas;
        let stateful_set: StatefulSet = serde_json::from_value(json!({
            "metadata": { "name": "db", "namespace": "ns", "generation": 2 },
            "spec": { "replicas": replicas, "selector": {}, "serviceName": "db", "template": {} },
            "status": { "replicas": replicas, "observedGeneration": 2, "updateRevision": self.update_revision },
        }))
        .unwrap();
        Observation {
            names: Names::of(&cluster).unwrap(),
            cluster: Arc::new(cluster),
            stateful_set: Some(Arc::new(stateful_set)),
            store: Default::default(),
            pods: self
                .instances
                .iter()
                .map(|i| Arc::new(self.pod(i)))
                .collect(),
            lease: self.lease.clone().map(|observation| {
                let lease = serde_json::from_value(json!({
                    "metadata": { "name": "db-primary", "resourceVersion": "7" },
                }))
                .unwrap();
                (Arc::new(lease), observation)
            }),
            live: self.live.clone(),
            claims: Vec::new(),
            lease_confirmed: self.lease_confirmed,
            pre_upgrade_backup: None,
        }
    }

    fn plan(&self) -> Plan {
        plan(&self.observation(), self.now)
    }

    fn instance(&mut self, name: &str) -> &mut Instance {
        self.instances.iter_mut().find(|i| i.name == name).unwrap()
    }

    /// What the executor's writes leave: the status recorded, the pod writes made (a
    /// replaced pod comes back at the update revision, its role label gone); the lock
    /// confirmation is per reconcile.
    fn carry_out(&mut self, plan: &Plan) {
        record(&mut self.cluster, &plan.primary.primary);
        for write in &plan.pods {
            match write {
                PodWrite::Label { pod, role, .. } => self.instance(pod).role_label = *role,
                PodWrite::Replace { pod, .. } => {
                    let revision = self.update_revision;
                    let instance = self.instance(pod);
                    instance.revision = revision;
                    instance.role_label = None;
                }
                PodWrite::Annotate { .. } => {}
            }
        }
        if plan.primary.drop_request_when_recorded || plan.primary.answer_now.is_some() {
            self.cluster["metadata"]["annotations"] = json!({});
        }
        self.lease_confirmed = None;
    }

    fn later(&mut self, seconds: u64) {
        self.now += Duration::from_secs(seconds);
        if let Some(lease) = &mut self.lease {
            lease.unchanged_for += Duration::from_secs(seconds);
        }
    }
}

/// The status fields the primary step owns, as the status write records them.
fn record(cluster: &mut Value, primary: &Primary) {
    let status = &mut cluster["status"];
    status["currentPrimary"] = json!(primary.current);
    status["targetPrimary"] = json!(primary.target);
    status["failedPrimary"] = json!(primary.failed);
    status["failoverEpoch"] = json!(primary.epoch);
    status["lastFailoverTime"] = json!(primary.last_failover_time);
    status["failedTargets"] = json!(primary.failed_targets);
    status["lastSwitchoverTime"] = json!(primary.last_switchover_time);
    status["lastFailover"] = json!(primary.last_failover);
}

fn reasons(plan: &Plan) -> Vec<&'static str> {
    plan.with_status
        .iter()
        .flat_map(|t| t.events.iter().map(|e| e.reason))
        .collect()
}

fn labels(plan: &Plan) -> Vec<(String, Option<&'static str>)> {
    plan.pods
        .iter()
        .filter_map(|w| match w {
            PodWrite::Label { pod, role, .. } => Some((pod.clone(), *role)),
            _ => None,
        })
        .collect()
}

fn replaced(plan: &Plan) -> Vec<String> {
    plan.pods
        .iter()
        .filter_map(|w| match w {
            PodWrite::Replace { pod, .. } => Some(pod.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_steady_cluster_plans_no_write() {
    let world = World::three();
    let plan = world.plan();
    assert_eq!(plan.primary.primary, world.observation().recorded_primary());
    assert!(plan.pods.is_empty(), "{:?}", plan.pods);
    assert!(plan.news.is_empty() && plan.with_status.is_none());
    assert!(!plan.hurry && !plan.needs_lease_confirmation());
    // It looks again when the lock would expire unrenewed.
    assert_eq!(plan.primary.timer, Some(Duration::from_secs(25)));
}

#[test]
fn a_whole_failover_from_a_lost_primary_to_the_most_advanced_replica() {
    let mut world = World::three();
    // The primary stops renewing its lock.
    world.later(31);
    world.instance("db-0").report = json!({ "role": "primary", "ready": false });
    let first = world.plan();
    assert!(
        first.needs_lease_confirmation(),
        "judged from the cache only"
    );
    assert_eq!(
        first.primary.primary,
        world.observation().recorded_primary()
    );
    assert!(first.primary.epoch_started.is_none() && reasons(&first).is_empty());

    // The API server has a newer lock: the watch is behind; nothing happens, look again soon.
    world.lease_confirmed = Some(false);
    let behind = world.plan();
    assert!(!behind.needs_lease_confirmation());
    assert_eq!(
        behind.primary.primary,
        world.observation().recorded_primary()
    );
    assert_eq!(behind.primary.timer, Some(LEASE_RECHECK));
    assert!(behind.primary.epoch_started.is_none() && reasons(&behind).is_empty());
    assert!(
        behind.pods.is_empty(),
        "no label moves on an unconfirmed lock"
    );

    // Confirmed: epoch 1 starts; the lost primary loses its role label at once.
    world.lease_confirmed = Some(true);
    let start = world.plan();
    assert_eq!(reasons(&start), ["PrimaryLost"]);
    assert_eq!(start.primary.epoch_started, Some(1));
    assert_eq!(start.primary.primary.failed.as_deref(), Some("db-0"));
    assert_eq!(
        start.primary.primary.target.as_deref(),
        Some(TARGET_PENDING)
    );
    assert_eq!(
        start.primary.primary.last_failover_time.as_deref(),
        Some("2026-12-06T12:00:31Z")
    );
    assert!(start.hurry);
    assert_eq!(
        start.primary.primary.last_failover,
        Some(FailoverRecord {
            reason: FailoverReason::PrimaryLost,
            failed_primary: "db-0".into(),
            new_primary: None,
            // The lock last changed 36 s before, by the operator's own watch.
            primary_last_seen_at: Some("2026-12-06T11:59:55.000Z".into()),
            detected_at: "2026-12-06T12:00:31.000Z".into(),
            elected_at: None,
            promoted_at: None,
            service_switched_at: None,
        })
    );
    assert_eq!(labels(&start), [("db-0".to_string(), None)]);
    assert!(replaced(&start).is_empty(), "no pod goes during a failover");
    world.carry_out(&start);

    // One replica acknowledged: it waits for the other, which is live.
    world.later(1);
    world.live = ["db-1", "db-2"].map(String::from).into();
    world.instance("db-1").report = json!({ "role": "replica", "ready": false, "timeline": 1, "receivedLSN": "0/3000100", "replayedLSN": "0/3000100", "failoverEpoch": 1 });
    let waiting = world.plan();
    assert!(reasons(&waiting).is_empty());
    assert!(!waiting.needs_lease_confirmation() && waiting.primary.epoch_started.is_none());
    assert_eq!(
        waiting.primary.primary.target.as_deref(),
        Some(TARGET_PENDING)
    );

    // Both acknowledged: the most advanced final position wins.
    world.instance("db-2").report = json!({ "role": "replica", "ready": false, "timeline": 1, "receivedLSN": "0/3000200", "replayedLSN": "0/3000100", "failoverEpoch": 1 });
    let elect = world.plan();
    assert_eq!(reasons(&elect), ["FailingOver"]);
    assert_eq!(elect.primary.primary.target.as_deref(), Some("db-2"));
    let record = elect.primary.primary.last_failover.clone().unwrap();
    assert_eq!(record.new_primary.as_deref(), Some("db-2"));
    assert_eq!(
        record.elected_at.as_deref(),
        Some("2026-12-06T12:00:32.000Z")
    );
    world.carry_out(&elect);

    // The target promotes and takes the lock: it is the primary, the others replicas.
    world.later(2);
    world.instance("db-2").report = primary_report();
    world.lease = Some(LeaseObservation {
        holder: Some("db-2".into()),
        ever_held: true,
        unchanged_for: Duration::ZERO,
    });
    let done = world.plan();
    assert_eq!(reasons(&done), ["Promoted"]);
    assert_eq!(done.primary.primary.current, "db-2");
    assert_eq!(done.primary.primary.failed, None);
    assert_eq!(done.primary.primary.target, None);
    let record = done.primary.primary.last_failover.clone().unwrap();
    assert_eq!(
        (record.detected_at.as_str(), record.promoted_at.as_deref()),
        ("2026-12-06T12:00:31.000Z", Some("2026-12-06T12:00:34.000Z"))
    );
    // The executor notes the relabel's time once it is written.
    assert_eq!(record.service_switched_at, None);
    assert_eq!(
        labels(&done),
        [
            ("db-0".to_string(), Some("replica")),
            ("db-2".to_string(), Some("primary")),
        ]
    );
    world.carry_out(&done);
    let after = world.plan();
    assert!(after.pods.is_empty() && after.with_status.is_none() && !after.hurry);
}

#[test]
fn a_switchover_records_its_target_waits_for_the_promotion_and_drops_the_request() {
    let mut world = World::three();
    world.cluster["metadata"]["annotations"] = json!({ SWITCHOVER_ANNOTATION: "db-1" });
    let start = world.plan();
    assert_eq!(reasons(&start), ["SwitchingOver"]);
    assert_eq!(start.primary.primary.target.as_deref(), Some("db-1"));
    assert_eq!(
        start.primary.primary.last_switchover_time.as_deref(),
        Some("2026-12-06T12:00:00Z")
    );
    assert!(
        !start.needs_lease_confirmation(),
        "a human's request needs no lock read"
    );
    assert!(start.hurry && start.primary.answer_now.is_none());
    let record = start.primary.primary.last_failover.clone().unwrap();
    assert_eq!(record.reason, FailoverReason::Switchover);
    assert_eq!(
        (
            record.failed_primary.as_str(),
            record.new_primary.as_deref()
        ),
        ("db-0", Some("db-1"))
    );
    assert_eq!(
        record.elected_at.as_deref(),
        Some(record.detected_at.as_str())
    );
    world.carry_out(&start);

    // The old primary stopped at its final LSN; the target has not promoted yet.
    world.later(3);
    world.instance("db-0").report =
        json!({ "role": "primary", "ready": false, "finalLSN": "0/3000000" });
    let waiting = world.plan();
    assert!(reasons(&waiting).is_empty());
    assert_eq!(waiting.primary.primary.target.as_deref(), Some("db-1"));
    assert!(waiting.primary.timer.is_some(), "the deadline is looked at");

    world.later(2);
    world.instance("db-1").report = primary_report();
    let done = world.plan();
    assert_eq!(reasons(&done), ["Promoted"]);
    assert_eq!(done.primary.primary.current, "db-1");
    assert!(done.primary.drop_request_when_recorded);
    assert_eq!(
        done.primary
            .primary
            .last_failover
            .as_ref()
            .unwrap()
            .promoted_at
            .as_deref(),
        Some("2026-12-06T12:00:05.000Z")
    );
    assert_eq!(
        labels(&done),
        [
            ("db-0".to_string(), Some("replica")),
            ("db-1".to_string(), Some("primary")),
        ]
    );
    world.carry_out(&done);

    // Asking for the primary it now is: answered at once, nothing else.
    world.cluster["metadata"]["annotations"] = json!({ SWITCHOVER_ANNOTATION: "db-1" });
    let moot = world.plan();
    assert_eq!(moot.primary.answer_now, Some(None));
    // A pod that is no instance: refused, with the reason for the event.
    world.cluster["metadata"]["annotations"] = json!({ SWITCHOVER_ANNOTATION: "db-7" });
    let refused = world.plan();
    assert!(
        matches!(&refused.primary.answer_now, Some(Some(why)) if why.contains("db-7 is not an instance")),
        "{:?}",
        refused.primary.answer_now
    );
}

#[test]
fn a_rolling_update_replaces_replicas_highest_first_and_the_primary_last_one_at_a_time() {
    let mut world = World::three();
    world.update_revision = "r2";
    let mut order = Vec::new();
    for _ in 0..3 {
        let plan = world.plan();
        let replacing = replaced(&plan);
        assert_eq!(replacing.len(), 1, "one pod at a time: {replacing:?}");
        order.push(replacing[0].clone());
        world.carry_out(&plan);
        // The new pod is not ready yet: nothing else goes; its label comes back first.
        let name = replacing[0].clone();
        let report = world.instance(&name).report.clone();
        world.instance(&name).report = json!({ "role": report["role"], "ready": false });
        let next = world.plan();
        assert!(replaced(&next).is_empty(), "waits for {name} to be ready");
        let role = if name == "db-0" { "primary" } else { "replica" };
        assert_eq!(labels(&next), [(name.clone(), Some(role))]);
        world.carry_out(&next);
        world.instance(&name).report = report;
    }
    assert_eq!(order, ["db-2", "db-1", "db-0"]);
    assert!(world.plan().pods.is_empty());
}

#[test]
fn a_scale_down_is_news_once_and_a_scale_down_past_the_primary_waits_for_a_switchover() {
    let mut world = World::three();
    world.cluster["spec"]["replicas"] = json!(2);
    let mut observation = world.observation();
    let plan = plan(&observation, world.now);
    assert_eq!(
        plan.news
            .iter()
            .map(|n| n.note.as_str())
            .collect::<Vec<_>>(),
        ["Scaling from 3 to 2 instances"]
    );
    // The StatefulSet scaled: no more news.
    let sts = Arc::make_mut(observation.stateful_set.as_mut().unwrap());
    sts.spec.replicas = Some(2);
    assert!(super::plan(&observation, world.now).news.is_empty());

    // The primary is the instance that would go: refused once, and the cluster keeps it.
    let mut world = World::three();
    world.cluster["status"]["currentPrimary"] = json!("db-2");
    world.instance("db-2").report = primary_report();
    world.instance("db-2").role_label = Some("primary");
    world.instance("db-0").report = replica_report("0/3000000");
    world.instance("db-0").role_label = Some("replica");
    world.lease.as_mut().unwrap().holder = Some("db-2".into());
    world.cluster["spec"]["replicas"] = json!(2);
    let refused = world.plan();
    assert_eq!(
        refused.news.iter().map(|n| n.reason).collect::<Vec<_>>(),
        [reasons::SCALE_DOWN_REFUSED]
    );
    // Nothing scales (no `Scaling` news: the StatefulSet keeps three) and no switchover
    // starts by itself: the user moves the primary.
    assert_eq!(
        resources::stateful_set::instances(&world.observation().cluster),
        3
    );
    assert_eq!(
        refused.primary.primary,
        world.observation().recorded_primary()
    );
    assert!(refused.with_status.is_none());
    world.cluster["status"]["conditions"] = json!([{
        "type": "Degraded", "status": "True", "reason": reasons::SCALE_DOWN_REFUSED,
        "message": "", "lastTransitionTime": "2026-12-06T12:00:00Z",
    }]);
    assert!(
        world.plan().news.is_empty(),
        "published once while it stands"
    );
}
