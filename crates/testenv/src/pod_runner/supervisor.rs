//! Processes mode: watches database pods and claims, runs one supervisor task per pod, stops
//! it when its pod or a claim it uses goes, and removes a deleted claim's directory.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::sync::watch;

use super::pod::run_pod;
use super::volumes::claim_dirs;
use super::{DATABASE_POD_SELECTOR, MAX_POD_GRACE, SHUTDOWN_GRACE, SharedState, lock};

pub(super) struct Ctx {
    pub(super) root: PathBuf,
    pub(super) agent: PathBuf,
    pub(super) server: String,
    pub(super) server_ca_pem: String,
    pub(super) client: kube::Client,
    pub(super) shared: SharedState,
    pub(super) faults: Arc<watch::Sender<u64>>,
    /// Claim uid → the lock held by the supervisor whose agent uses that claim.
    pub(super) claim_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Ctx {
    pub(super) fn claim_lock(&self, claim_uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.claim_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(claim_uid.to_string())
            .or_default()
            .clone()
    }

    pub(super) fn claim_dir(&self, namespace: &str, claim: &str, uid: &str) -> PathBuf {
        self.root
            .join("claims")
            .join(namespace)
            .join(format!("{claim}-{uid}"))
    }
}

/// One pod's supervisor task, seen from the watch loop.
struct PodTask {
    namespace: String,
    name: String,
    grace: Duration,
    /// The uids of the claims it uses, once it has looked them up.
    claim_uids: Arc<Mutex<Vec<String>>>,
    stop: watch::Sender<Option<Duration>>,
    handle: tokio::task::JoinHandle<()>,
    stopping: bool,
}

impl PodTask {
    fn stop(&mut self, grace: Duration) {
        self.stopping = true;
        let _ = self.stop.send(Some(grace));
    }
}

pub(super) struct Supervisor {
    ctx: Arc<Ctx>,
    /// By pod uid.
    tasks: HashMap<String, PodTask>,
    pods_listed: Option<HashSet<String>>,
    claims_listed: Option<HashSet<String>>,
    removals: Vec<tokio::task::JoinHandle<()>>,
}

impl Supervisor {
    pub(super) fn new(ctx: Arc<Ctx>) -> Self {
        Self {
            ctx,
            tasks: HashMap::new(),
            pods_listed: None,
            claims_listed: None,
            removals: Vec::new(),
        }
    }

    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let client = self.ctx.client.clone();
        let pods = watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels(DATABASE_POD_SELECTOR),
        )
        .default_backoff();
        let claims = watcher(
            Api::<PersistentVolumeClaim>::all(client),
            watcher::Config::default(),
        )
        .default_backoff();
        let mut pods = std::pin::pin!(pods);
        let mut claims = std::pin::pin!(claims);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                Some(event) = pods.next() => self.on_pod_event(event),
                Some(event) = claims.next() => self.on_claim_event(event),
            }
            self.tasks
                .retain(|_, t| !(t.stopping && t.handle.is_finished()));
            self.removals.retain(|h| !h.is_finished());
        }
        for task in self.tasks.values_mut() {
            let grace = if task.stopping {
                task.grace.min(SHUTDOWN_GRACE)
            } else {
                SHUTDOWN_GRACE
            };
            task.stop(grace);
        }
        for (_, task) in self.tasks.drain() {
            let _ = task.handle.await;
        }
        for removal in self.removals.drain(..) {
            let _ = removal.await;
        }
    }

    fn on_pod_event(&mut self, event: Result<Event<Pod>, watcher::Error>) {
        match event {
            Ok(Event::Apply(pod)) => self.on_pod(pod),
            Ok(Event::InitApply(pod)) => {
                if let (Some(listed), Some(uid)) = (&mut self.pods_listed, pod.uid()) {
                    listed.insert(uid);
                }
                self.on_pod(pod);
            }
            Ok(Event::Delete(pod)) => {
                if let Some(uid) = pod.uid() {
                    self.stop_pod(&uid, pod_grace(&pod));
                }
            }
            Ok(Event::Init) => self.pods_listed = Some(HashSet::new()),
            Ok(Event::InitDone) => {
                let Some(listed) = self.pods_listed.take() else {
                    return;
                };
                let gone: Vec<(String, Duration)> = self
                    .tasks
                    .iter()
                    .filter(|(uid, _)| !listed.contains(*uid))
                    .map(|(uid, t)| (uid.clone(), t.grace))
                    .collect();
                for (uid, grace) in gone {
                    self.stop_pod(&uid, grace);
                }
            }
            Err(e) => tracing::debug!(error = %e, "pod runner: pod watch"),
        }
    }

    fn on_pod(&mut self, pod: Pod) {
        let Some(uid) = pod.uid() else { return };
        if pod.metadata.deletion_timestamp.is_some() {
            self.stop_pod(&uid, pod_grace(&pod));
            return;
        }
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none()
            || self.tasks.contains_key(&uid)
        {
            return;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        // Same name, new uid: the old pod is gone even if its deletion was not seen.
        let replaced: Vec<(String, Duration)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.namespace == namespace && t.name == name)
            .map(|(uid, t)| (uid.clone(), t.grace))
            .collect();
        for (old, grace) in replaced {
            self.stop_pod(&old, grace);
        }
        let (stop, stop_rx) = watch::channel(None);
        let claim_uids = Arc::new(Mutex::new(Vec::new()));
        let grace = pod_grace(&pod);
        let handle = tokio::spawn(run_pod(self.ctx.clone(), pod, claim_uids.clone(), stop_rx));
        self.tasks.insert(
            uid,
            PodTask {
                namespace,
                name,
                grace,
                claim_uids,
                stop,
                handle,
                stopping: false,
            },
        );
    }

    fn stop_pod(&mut self, uid: &str, grace: Duration) {
        if let Some(task) = self.tasks.get_mut(uid)
            && !task.stopping
        {
            task.stop(grace);
        }
    }

    fn on_claim_event(&mut self, event: Result<Event<PersistentVolumeClaim>, watcher::Error>) {
        match event {
            Ok(Event::Apply(_)) => {}
            Ok(Event::InitApply(claim)) => {
                if let (Some(listed), Some(uid)) = (&mut self.claims_listed, claim.uid()) {
                    listed.insert(uid);
                }
            }
            Ok(Event::Delete(claim)) => {
                if let Some(uid) = claim.uid() {
                    self.claim_gone(claim.namespace().unwrap_or_default(), claim.name_any(), uid);
                }
            }
            Ok(Event::Init) => self.claims_listed = Some(HashSet::new()),
            Ok(Event::InitDone) => {
                // Claims deleted while the watch was down: their directories are orphans.
                let Some(listed) = self.claims_listed.take() else {
                    return;
                };
                for (namespace, claim, uid) in claim_dirs(&self.ctx.root.join("claims")) {
                    if !listed.contains(&uid) {
                        self.claim_gone(namespace, claim, uid);
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "pod runner: claim watch"),
        }
    }

    /// Stops the agents using the claim, then removes its directory.
    fn claim_gone(&mut self, namespace: String, claim: String, uid: String) {
        let users: Vec<(String, Duration)> = self
            .tasks
            .iter()
            .filter(|(_, t)| {
                t.claim_uids
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .contains(&uid)
            })
            .map(|(pod_uid, t)| (pod_uid.clone(), t.grace))
            .collect();
        for (pod_uid, grace) in users {
            self.stop_pod(&pod_uid, grace);
        }
        let ctx = self.ctx.clone();
        self.removals.push(tokio::spawn(async move {
            let claim_lock = ctx.claim_lock(&uid);
            let _guard = claim_lock.lock().await;
            let dir = ctx.claim_dir(&namespace, &claim, &uid);
            let removed = dir.clone();
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(removed)).await;
            let mut shared = lock(&ctx.shared);
            let key = (namespace.clone(), claim.clone());
            if shared.claims.get(&key) == Some(&dir) {
                shared.claims.remove(&key);
            }
            drop(shared);
            ctx.claim_locks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&uid);
            tracing::info!(%namespace, %claim, dir = %dir.display(), "pod runner: claim deleted, directory removed");
        }));
    }
}

/// The pod's `terminationGracePeriodSeconds` (default 30 s), at most [`MAX_POD_GRACE`].
fn pod_grace(pod: &Pod) -> Duration {
    let seconds = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    Duration::from_secs(seconds.max(0) as u64).min(MAX_POD_GRACE)
}
