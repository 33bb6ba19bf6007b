//! Which replicas showed life since a failover started, as the operator's own watch saw it
//! (docs/failover.md, *Election*).
//!
//! An asynchronous failover waits for the final position of every live replica before it
//! elects, so the most advanced one wins, not the first to answer. A replica's `ready` cannot
//! say it is live: a replica is ready only while it streams, and nothing streams once the
//! primary is gone. Neither can a time an agent writes (its clock is not ours). What can: its
//! report changed after the failover started. A replica that sees the failover stops its WAL
//! receiver and says so in its report, so a live agent's report changes within a probe or
//! two, while a dead agent's report stays what it was.
//!
//! So when a failover epoch starts, the operator notes each pod's report as its cache holds it
//! (a fingerprint); a replica is live once its pod runs and its report differs from that.
//! Only this process's memory holds the note: an operator that takes over a failover under
//! way did not see it start, and counts every running pod with a report as live — it waits
//! rather than elect on fewer positions, within the same bound ([`super::failover`]).

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, PoisonError};

use devctl_api::instance::STATUS_ANNOTATION;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// The reports of a cluster's pods when an epoch started.
#[derive(Debug, Clone)]
struct Baseline {
    epoch: i64,
    /// Seen when the epoch started (else taken over later: everyone running counts).
    at_start: bool,
    reports: HashMap<String, u64>,
}

/// Per cluster (namespace, name), while a failover is under way.
#[derive(Debug, Default)]
pub struct FailoverLiveness {
    baselines: Mutex<HashMap<(String, String), Baseline>>,
}

fn fingerprint(pod: &Pod) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    pod.annotations().get(STATUS_ANNOTATION).hash(&mut hasher);
    hasher.finish()
}

/// Whether `pod` runs: not being deleted, phase `Running`.
fn running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Running")
}

impl FailoverLiveness {
    /// Notes the reports of `pods` as epoch `epoch` of cluster `key` starts (the reconcile that
    /// starts it, before its status is written). A note of that epoch is kept: a reconcile
    /// that ran on a cache without the status write plans the same start again, and by then
    /// a replica's report may have changed already.
    pub fn started(&self, key: (String, String), epoch: i64, pods: &[&Pod]) {
        let mut baselines = self.lock();
        if baselines.get(&key).is_some_and(|b| b.epoch >= epoch) {
            return;
        }
        let reports = pods
            .iter()
            .map(|p| (p.name_any(), fingerprint(p)))
            .collect();
        baselines.insert(
            key,
            Baseline {
                epoch,
                at_start: true,
                reports,
            },
        );
    }

    /// The pods of `pods` that are live in epoch `epoch` of cluster `key`: running, and their
    /// report changed since the epoch started (or, for an epoch this process did not see
    /// start, any running pod with a report).
    pub fn live(&self, key: (String, String), epoch: i64, pods: &[&Pod]) -> BTreeSet<String> {
        let mut baselines = self.lock();
        let stale = taken_over(epoch);
        let baseline = match baselines.get(&key) {
            // A cache behind a newer epoch this process started: that note stays.
            Some(b) if b.epoch > epoch => &stale,
            Some(b) if b.epoch == epoch => b,
            _ => baselines.entry(key).insert_entry(stale.clone()).into_mut(),
        };
        pods.iter()
            .filter(|p| running(p))
            .filter(|p| p.annotations().contains_key(STATUS_ANNOTATION))
            .filter(|p| {
                !baseline.at_start || baseline.reports.get(&p.name_any()) != Some(&fingerprint(p))
            })
            .map(|p| p.name_any())
            .collect()
    }

    /// No failover is under way for cluster `key` as of epoch `recorded` (or it is gone):
    /// forget its note — unless the note is of a newer epoch, which a cache that has not
    /// shown this process's status write yet does not know about.
    pub fn forget(&self, key: &(String, String), recorded: Option<i64>) {
        let mut baselines = self.lock();
        if baselines
            .get(key)
            .is_some_and(|b| recorded.is_some_and(|r| b.epoch <= r))
        {
            baselines.remove(key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Baseline>> {
        self.baselines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn taken_over(epoch: i64) -> Baseline {
    Baseline {
        epoch,
        at_start: false,
        reports: HashMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;

    fn pod(name: &str, report: Option<&str>, phase: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        if let Some(report) = report {
            pod.metadata.annotations = Some(
                [(STATUS_ANNOTATION.to_string(), report.to_string())]
                    .into_iter()
                    .collect(),
            );
        }
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        });
        pod
    }

    fn key() -> (String, String) {
        ("ns".into(), "db".into())
    }

    #[test]
    fn only_replicas_whose_report_changed_after_the_start_are_live() {
        let liveness = FailoverLiveness::default();
        let before = [
            pod("db-1", Some(r#"{"ready":false}"#), "Running"),
            pod("db-2", Some(r#"{"ready":false}"#), "Running"),
        ];
        liveness.started(key(), 1, &before.iter().collect::<Vec<_>>());
        assert!(
            liveness
                .live(key(), 1, &before.iter().collect::<Vec<_>>())
                .is_empty()
        );
        let after = [
            pod(
                "db-1",
                Some(r#"{"ready":false,"lastError":"failover"}"#),
                "Running",
            ),
            pod("db-2", Some(r#"{"ready":false}"#), "Running"),
        ];
        let live = liveness.live(key(), 1, &after.iter().collect::<Vec<_>>());
        assert_eq!(live.into_iter().collect::<Vec<_>>(), ["db-1"]);
    }

    #[test]
    fn a_pod_that_is_not_running_or_being_deleted_is_never_live() {
        let liveness = FailoverLiveness::default();
        liveness.started(key(), 1, &[]);
        let mut deleted = pod("db-1", Some("{}"), "Running");
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let pending = pod("db-2", Some("{}"), "Pending");
        let silent = pod("db-3", None, "Running");
        assert!(
            liveness
                .live(key(), 1, &[&deleted, &pending, &silent])
                .is_empty()
        );
    }

    #[test]
    fn an_epoch_not_seen_starting_counts_every_running_reporter_and_a_new_epoch_starts_over() {
        let liveness = FailoverLiveness::default();
        let pods = [
            pod("db-1", Some("{}"), "Running"),
            pod("db-2", Some("{}"), "Running"),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(liveness.live(key(), 3, &refs).len(), 2);
        liveness.started(key(), 4, &refs);
        assert!(liveness.live(key(), 4, &refs).is_empty());
        // Epoch 5 started elsewhere (another operator): taken over.
        assert_eq!(liveness.live(key(), 5, &refs).len(), 2);
        liveness.forget(&key(), Some(5));
        assert_eq!(liveness.live(key(), 5, &refs).len(), 2);
    }

    #[test]
    fn a_cache_behind_this_process_s_status_write_keeps_the_note_of_the_start() {
        let liveness = FailoverLiveness::default();
        let before = [pod("db-1", Some("{}"), "Running")];
        let refs: Vec<&Pod> = before.iter().collect();
        liveness.started(key(), 2, &refs);
        // The next reconcile still sees epoch 1 done and no failover: nothing is forgotten,
        // and planning the same start again keeps the first note.
        liveness.forget(&key(), Some(1));
        liveness.forget(&key(), None);
        let changed = [pod("db-1", Some(r#"{"lastError":"failover"}"#), "Running")];
        let changed: Vec<&Pod> = changed.iter().collect();
        liveness.started(key(), 2, &changed);
        assert_eq!(liveness.live(key(), 2, &changed).len(), 1);
        // A stale view of epoch 1 does not replace the note of epoch 2.
        assert_eq!(liveness.live(key(), 1, &refs).len(), 1, "taken over");
        assert!(liveness.live(key(), 2, &refs).is_empty());
        // The failover of epoch 2 done: forgotten.
        liveness.forget(&key(), Some(2));
        assert_eq!(liveness.live(key(), 2, &refs).len(), 1, "taken over");
    }
}
