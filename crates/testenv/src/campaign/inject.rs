//! Carrying out one fault of an episode against the live cluster: resolve its target when
//! it starts (the primary or a replica at that moment), inject it, hold it for its length,
//! and undo it. An injection that cannot be made (the pod has no running agent just then)
//! is recorded as skipped; the undo always runs.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::SWITCHOVER_ANNOTATION;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use super::plan::{Fault, FaultKind, Target};
use super::stats::FaultRun;
use super::world::World;
use crate::Error;

/// The major version the campaign runs and the minor it starts at; each rolling update moves
/// to the next minor (never back: a downgrade is refused, rightly).
pub const MAJOR: u32 = 16;
pub const FIRST_MINOR: u32 = 2;
/// How long an API write is retried (the API server may be restarting).
const WRITE_BOUND: Duration = Duration::from_secs(60);

/// What the faults of a campaign share.
pub struct Ctx<'w> {
    pub world: &'w World,
    pub name: String,
    /// When the campaign started: every time recorded is measured from it.
    pub started: Instant,
    pub timeline: Mutex<Vec<(Duration, String)>>,
    /// The last primary seen (the API server may be away when a fault starts).
    primary: Mutex<Option<String>>,
    /// How many faults hold the store down.
    store_down: tokio::sync::Mutex<u32>,
    /// The minor version the cluster was last moved to.
    minor: AtomicU32,
    /// A scale-up waits this long for the new instances at most.
    pub scale_bound: Duration,
    /// The cluster's engine (a MariaDB rolling update changes resources, not the version).
    pub engine: devctl_api::database_cluster::Engine,
    /// Print the timeline as it goes (the long run).
    pub progress: bool,
}

impl<'w> Ctx<'w> {
    pub fn new(world: &'w World, name: &str, started: Instant, scale_bound: Duration) -> Self {
        Self {
            world,
            name: name.to_string(),
            started,
            timeline: Mutex::new(Vec::new()),
            primary: Mutex::new(None),
            store_down: tokio::sync::Mutex::new(0),
            minor: AtomicU32::new(FIRST_MINOR),
            scale_bound,
            engine: devctl_api::database_cluster::Engine::Postgres,
            progress: false,
        }
    }

    /// Notes `what` in the timeline, now.
    pub fn note(&self, what: impl Into<String>) {
        let at = self.started.elapsed();
        let what = what.into();
        tracing::info!(at = at.as_secs_f64(), "campaign: {what}");
        if self.progress {
            eprintln!("{:>9.3} s  {what}", at.as_secs_f64());
        }
        if let Ok(mut timeline) = self.timeline.lock() {
            timeline.push((at, what));
        }
    }

    fn dbs(&self) -> Api<DatabaseCluster> {
        Api::namespaced(self.world.client.clone(), &self.world.namespace)
    }

    /// The cluster now (none while the API server is away).
    pub async fn cluster(&self) -> Option<DatabaseCluster> {
        self.dbs().get_opt(&self.name).await.ok().flatten()
    }

    /// The primary and the instance count, as the cluster says now or last said.
    async fn shape(&self) -> (Option<String>, usize) {
        let db = self.cluster().await;
        let replicas = db.as_ref().map_or(3, |d| d.spec.replicas.max(1) as usize);
        let current = db.and_then(|d| d.status?.current_primary);
        let mut known = self.primary.lock().unwrap_or_else(|e| e.into_inner());
        if current.is_some() {
            known.clone_from(&current);
        }
        (known.clone(), replicas)
    }

    /// The pod `target` names for a fault of episode `episode` starting at `start`.
    async fn resolve(&self, target: Target, episode: usize, start: Duration) -> Option<String> {
        let (primary, replicas) = self.shape().await;
        match target {
            Target::Cluster => None,
            Target::Primary => primary,
            Target::Replica => {
                let others = self.replicas(primary.as_deref(), replicas);
                let pick = (episode + start.as_millis() as usize) % others.len().max(1);
                others.get(pick).cloned()
            }
        }
    }

    /// The pods of a cluster of `replicas` instances other than `primary`, by ordinal.
    pub fn replicas(&self, primary: Option<&str>, replicas: usize) -> Vec<String> {
        (0..replicas)
            .map(|i| format!("{}-{i}", self.name))
            .filter(|p| Some(p.as_str()) != primary)
            .collect()
    }

    /// Merge-patches the cluster, retried while the API server does not answer.
    async fn patch(&self, patch: serde_json::Value) -> Result<(), Error> {
        let dbs = self.dbs();
        crate::eventually(
            "the campaign's patch of the cluster",
            WRITE_BOUND,
            || async {
                dbs.patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .ok()
                    .map(|_| ())
            },
        )
        .await
    }

    async fn set_replicas(&self, replicas: i32) -> Result<(), Error> {
        self.patch(json!({ "spec": { "replicas": replicas } }))
            .await
    }
}

/// Runs `fault` (of episode `episode`, which began at `begun`); what happened.
pub async fn run(
    ctx: &Ctx<'_>,
    episode: usize,
    fault: &Fault,
    alone: bool,
    begun: Instant,
) -> FaultRun {
    tokio::time::sleep_until((begun + fault.start).into()).await;
    let pod = ctx.resolve(fault.target, episode, fault.start).await;
    let at = ctx.started.elapsed();
    let mut run = FaultRun {
        episode,
        kind: fault.kind,
        target: fault.target,
        pod: pod.clone(),
        at,
        alone,
        skipped: None,
        unavailable: None,
        recovery: None,
    };
    if fault.kind.targets_an_instance() && pod.is_none() {
        run.skipped = Some("no instance to aim at".into());
        ctx.note(format!(
            "episode {episode}: {:?} skipped: no instance",
            fault.kind
        ));
        return run;
    }
    let on = pod.as_deref().map(|p| format!(" {p}")).unwrap_or_default();
    ctx.note(format!(
        "episode {episode}: {:?}{on} for {:?}",
        fault.kind, fault.length
    ));
    if let Err(e) = inject(ctx, fault, pod.as_deref().unwrap_or_default()).await {
        ctx.note(format!(
            "episode {episode}: {:?}{on} not injected: {e}",
            fault.kind
        ));
        run.skipped = Some(e.to_string());
    } else {
        ctx.note(format!("episode {episode}: {:?}{on} over", fault.kind));
    }
    run
}

/// One of the pod runner's fault methods, run on the blocking pool.
type PodFault = fn(&crate::PodRunner, &str, &str) -> Result<(), Error>;

/// Injects `fault` on `pod` (empty for a fault not aimed at an instance), holds it, undoes it.
async fn inject(ctx: &Ctx<'_>, fault: &Fault, pod: &str) -> Result<(), Error> {
    let world = ctx.world;
    let namespace = world.namespace.clone();
    let runner = world.runner()?;
    let (ns, name) = (namespace.clone(), pod.to_string());
    let blocking = |f: PodFault| {
        let (ns, name) = (ns.clone(), name.clone());
        async move {
            tokio::task::spawn_blocking(move || f(runner, &ns, &name))
                .await
                .map_err(|e| Error::Process(format!("fault task: {e}")))?
        }
    };
    let hold = fault.length;
    match fault.kind {
        FaultKind::KillEngine => blocking(|r, n, p| r.kill_engine(n, p).map(|_| ())).await,
        FaultKind::KillAgent => blocking(|r, n, p| r.kill_agent(n, p).map(|_| ())).await,
        // A lasting pod fault: made, held for its length, undone whether or not it took.
        FaultKind::KillPod | FaultKind::Freeze | FaultKind::Partition => {
            let (make, undo): (PodFault, PodFault) = match fault.kind {
                FaultKind::KillPod => (|r, n, p| r.kill_and_hold(n, p), |r, n, p| r.release(n, p)),
                FaultKind::Freeze => (|r, n, p| r.freeze(n, p), |r, n, p| r.thaw(n, p)),
                _ => (|r, n, p| r.partition(n, p), |r, n, p| r.heal(n, p)),
            };
            let made = blocking(make).await;
            tokio::time::sleep(hold).await;
            blocking(undo).await?;
            made
        }
        FaultKind::DeletePod => {
            let pods: Api<Pod> = Api::namespaced(world.client.clone(), &namespace);
            pods.delete(pod, &DeleteParams::default())
                .await
                .map(|_| ())
                .map_err(|e| Error::Process(format!("deleting pod {pod}: {e}")))
        }
        FaultKind::KillOperator => {
            world.operator.kill_and_hold();
            tokio::time::sleep(hold).await;
            world.operator.release()
        }
        FaultKind::RestartApiServer => world.cluster.restart_api_server().await,
        FaultKind::StoreDown => {
            {
                let mut down = ctx.store_down.lock().await;
                *down += 1;
                world.store.stop().await?;
            }
            tokio::time::sleep(hold).await;
            let mut down = ctx.store_down.lock().await;
            *down -= 1;
            if *down == 0 {
                world.store.restart().await?;
            }
            Ok(())
        }
        FaultKind::Switchover => {
            let (primary, replicas) = ctx.shape().await;
            let target = ctx
                .replicas(primary.as_deref(), replicas)
                .into_iter()
                .next()
                .ok_or_else(|| Error::Process("no replica to switch over to".into()))?;
            ctx.note(format!("switchover to {target}"));
            ctx.patch(json!({ "metadata": { "annotations": { SWITCHOVER_ANNOTATION: target } } }))
                .await
        }
        FaultKind::RollingUpdate => {
            let minor = ctx.minor.fetch_add(1, Ordering::SeqCst) + 1;
            if ctx.engine == devctl_api::database_cluster::Engine::Mariadb {
                // A new pod template without a version change (a MariaDB series is fixed).
                let cpu = format!("{}m", 250 + minor);
                return ctx
                    .patch(json!({ "spec": { "resources": { "requests": { "cpu": cpu } } } }))
                    .await;
            }
            ctx.patch(json!({ "spec": { "version": format!("{MAJOR}.{minor}") } }))
                .await
        }
        FaultKind::Scale => {
            ctx.set_replicas(5).await?;
            let grown = crate::eventually("five ready instances", ctx.scale_bound, || async {
                let status = ctx.cluster().await?.status?;
                (status.ready_replicas == 5).then_some(())
            })
            .await;
            ctx.set_replicas(3).await?;
            grown
        }
    }
}
