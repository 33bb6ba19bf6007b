//! Watches, reconcile and error policy of the DatabaseCluster controller: the thin async
//! shell around the pure desired state (`resources`) and status (`status`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use devctl_api::database_cluster::{self, DatabaseCluster, FINALIZER, Phase};
use devctl_api::labels;
use devctl_api::quantity;
use futures::Future;
use futures::stream::BoxStream;
use k8s_openapi::Resource as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::backup;
use super::backup_lifecycle;
use super::claims::{data_claims, live_data_claims};
use super::failover;
use super::instances::{self, Instances};
use super::pods::{self, PodAction};
use super::primary::{LeaseObservation, Primary};
use super::resources::{self, Inputs, Names, lease, secret};
use super::status::{self, Observed};
use super::switchover::{self, Step};
use crate::children::caches::OwnerKey;
use crate::children::{Caches, Change, Orphanage, Owner, applied, orphan_of};
use crate::context::{Context, Settings};
use crate::error::{Error, Result};
use crate::reconciler::{
    Announcement, Transition, ensure_finalizer, key, now, publish, report_transition,
    run_controller, write_status,
};
use devctl_api::instance::{BACKUP_STORE_SECRET_SUFFIX, RESTORE_STORE_SECRET_SUFFIX};
use devctl_api::instance::{
    FORCE_FAILOVER_ANNOTATION, InstanceStatus, ROLE_LABEL, SWITCHOVER_ANNOTATION, TARGET_PENDING,
    primary_lease_name,
};

/// The controller as a stream of finished reconciles.
pub fn controller(
    client: Client,
    namespace: Option<String>,
    caches: Caches,
    settings: Settings,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> BoxStream<'static, crate::Reconciled> {
    run_controller::<DatabaseCluster, _, _>(
        "databasecluster",
        resources::READS,
        client,
        namespace,
        caches,
        settings,
        instance,
        shutdown,
        |db, ctx| async move { reconcile(db, &ctx).await },
    )
}

/// The cluster an object belongs to by its labels (`app.kubernetes.io/name=databasecluster`,
/// `instance=<cluster>`): for what other controllers create without an owner reference to
/// the cluster — the StatefulSet's volume claims and pods.
pub fn labelled_owner<K: Resource>(object: &K) -> Option<OwnerKey> {
    OwnerKey::by_labels::<DatabaseCluster>(object, resources::APP_NAME)
}

async fn reconcile(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    let namespace = db
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<DatabaseCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    // A final backup runs before the finalizer's cleanup, bounded in time, so the
    // finalizer never holds the namespace hostage.
    if db.metadata.deletion_timestamp.is_some()
        && db.finalizers().iter().any(|f| f == FINALIZER)
        && let Some(wait) = backup_lifecycle::final_backup(&db, ctx, &Names::of(&db)?).await
    {
        return Ok(Action::requeue(wait));
    }
    if db.metadata.deletion_timestamp.is_none() && !db.finalizers().iter().any(|f| f == FINALIZER) {
        // A new cluster (or one whose finalizer was removed by hand): the finalizer goes on in
        // the same round trips as the children, which do not depend on it — a deletion
        // meanwhile still removes the children through their owner references, and a cluster
        // without a data volume gets no final backup.
        let (added, applied) = tokio::join!(
            ensure_finalizer(&api, FINALIZER, db.clone()),
            apply(db, ctx)
        );
        added?;
        return applied;
    }
    let action = finalizer(&api, FINALIZER, db, |event| async {
        match event {
            FinalizerEvent::Apply(db) => apply(db, ctx).await,
            FinalizerEvent::Cleanup(db) => cleanup(db, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))?;
    Ok(action)
}

/// The version to run and, when the requested change is refused, why.
fn plan_version(db: &DatabaseCluster) -> (String, Option<String>) {
    let requested = &db.spec.version;
    match db
        .status
        .as_ref()
        .and_then(|s| s.current_version.as_deref())
    {
        Some(running) => match database_cluster::check_version_change(running, requested) {
            Ok(()) => (requested.clone(), None),
            Err(refused) => (
                running.to_string(),
                Some(format!(
                    "spec.version {requested}: {refused}; still running {running}"
                )),
            ),
        },
        None => (requested.clone(), None),
    }
}

async fn apply(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    let names = Names::of(&db)?;
    let (target_version, version_refused) = plan_version(&db);
    let previous_sts = ctx
        .caches
        .get::<StatefulSet>(&names.namespace, &names.stateful_set());

    let store = backup::resolve(ctx, &db, &names).await;
    let converged = converge(
        &db,
        ctx,
        &names,
        &target_version,
        previous_sts.as_deref(),
        &store,
    )
    .await;
    let (volumes_pending, credentials_regenerated) = match &converged {
        Ok(c) => (c.volumes_pending, c.credentials_regenerated),
        Err(_) => (None, false),
    };
    publish_events(
        &db,
        ctx,
        previous_sts.as_deref(),
        version_refused.as_deref(),
        credentials_regenerated.then(|| names.secret()).as_deref(),
    )
    .await;

    // One look at the pods serves the failover, the switchover, the pod changes and the
    // status.
    let cached_pods = cluster_pods(ctx, &names);
    let pods: Vec<&Pod> = cached_pods.iter().map(|p| p.as_ref()).collect();
    let step = primary_step(&db, ctx, &names, &pods).await;
    let primary = step.primary.clone();
    // Each step of a failover or switchover waits for a report of a pod or the lock: those
    // may not wait for the rest of a burst.
    if let Some(owner) = OwnerKey::of(db.as_ref()) {
        ctx.caches
            .hurry(&owner, primary.failed.is_some() || primary.target.is_some());
    }
    // Pods last: their labels and replacements follow the children just applied.
    let converged = match converged {
        Ok(c) => manage_pods(&db, ctx, &names, &primary, &pods, &store)
            .await
            .map(|()| c.changes),
        Err(e) => Err(e),
    };
    let backups = backup::observe(&pods, &store);
    let mut scheduled = backup_lifecycle::schedule_step(&db, ctx, &names, &store).await;
    if let Some(why) = backup_lifecycle::prune(&db, ctx, &names, &store).await {
        tracing::warn!(cluster = %key(db.as_ref()), "retention: {why}");
        scheduled
            .problem
            .get_or_insert((status::BACKUP_FAILING, format!("retention: {why}")));
    }
    let timer = next_look(
        &db,
        ctx,
        &names,
        &pods,
        &primary,
        &store,
        [step.timer, scheduled.wait],
    );
    if let Some(timer) = timer {
        ctx.backoff.retry_within(&key(db.as_ref()), timer);
    }
    let transition = announced_with_status(&db, &step, &pods);
    let (action, recorded) = report_transition(
        ctx,
        db.as_ref(),
        converged,
        |outcome| {
            let sts = ctx
                .caches
                .get::<StatefulSet>(&names.namespace, &names.stateful_set());
            let target_image = resources::stateful_set::image(&db, &target_version);
            let instances = observe_instances(&db, ctx, &names, &pods);
            let observed = Observed {
                stateful_set: sts.as_deref(),
                target_version: &target_version,
                target_image: &target_image,
                version_refused,
                replication_refused: resources::stateful_set::replication_refused(&db),
                scale_down_refused: resources::stateful_set::scale_down_refused(&db),
                volumes_pending,
                credentials_regenerated,
                stateful_set_applied: applied(outcome, StatefulSet::KIND),
                updated_pods: pods::at_update_revision(&pods, sts.as_deref()),
                failure: outcome.err().map(Error::failure),
                cluster_domain: &ctx.settings.cluster_domain,
                instances,
                primary: primary.clone(),
                primary_lost: step.primary_lost.clone(),
                failover_stuck: step.failover_stuck.clone(),
                backup_problem: backups.0.clone().or(scheduled.problem.clone()),
                // A schedule or retention failure is a backup failure too.
                backup_health: backups.2.clone().map(|mut health| {
                    if let Some((reason, why)) = &scheduled.problem
                        && *reason == status::BACKUP_FAILING
                    {
                        health.backup_failing.get_or_insert_with(|| why.clone());
                    }
                    health
                }),
                last_backup: backups.1.clone(),
                last_scheduled_backup: scheduled.last.clone(),
                next_scheduled_backup: scheduled.next.clone(),
            };
            let status = status::compute(&db, &observed, &now());
            if let Some(status) = &status {
                // Every reconcile, not only on writes: cheap, and a restarted operator
                // exports unchanged clusters too.
                ctx.settings.metrics.observe_cluster(&db, status);
            }
            (status.is_some() && status != db.status).then(|| json!(status))
        },
        transition,
        // The primary lock's expiry is the one deadline no event announces: nothing happens
        // when nobody renews it, so the reconcile comes back when it would expire.
        timer,
    )
    .await?;
    if recorded && step.drop_request_when_recorded {
        drop_request(ctx, &names).await;
    }
    Ok(action)
}

/// How soon a failover under way looks again when nothing else wakes it: after a lock
/// duration (`spec.highAvailability.failoverTimeout`).
fn failover_recheck(
    high_availability: Option<&devctl_api::database_cluster::HighAvailabilitySpec>,
) -> Option<Duration> {
    high_availability.and_then(|ha| ha.failover_timeout())
}

/// How often a cluster whose backup destination or restore source is misconfigured looks
/// again (what it waits for — a Secret, a DatabaseBackup — is not watched).
const CONFIGURATION_RECHECK: Duration = Duration::from_secs(30);

/// Past a deadline, so that the reconcile finds it passed rather than a moment short.
const TIMER_MARGIN: Duration = Duration::from_millis(250);

/// How soon to look again when the cache says the lock expired but the API server has a
/// newer one: the watch is behind and catches up within moments.
const LEASE_RECHECK: Duration = Duration::from_secs(1);

/// The pod named in `status.currentPrimary`, the switchover or failover target and the
/// failover bookkeeping, as the status says now. Until a primary is recorded: the one pod
/// whose agent reports it runs as primary (pods a deleted cluster of this name left running,
/// now adopted), else the first instance.
fn recorded_primary(
    db: &DatabaseCluster,
    names: &Names,
    pods: &[&Pod],
    lock_holder: Option<&str>,
) -> Primary {
    let status = db.status.as_ref();
    Primary {
        current: status
            .and_then(|s| s.current_primary.clone())
            .or_else(|| running_primary(pods, lock_holder))
            .unwrap_or_else(|| format!("{}-0", names.stateful_set())),
        target: status.and_then(|s| s.target_primary.clone()),
        failed: status.and_then(|s| s.failed_primary.clone()),
        epoch: status.and_then(|s| s.failover_epoch),
        last_failover_time: status.and_then(|s| s.last_failover_time.clone()),
        failed_targets: status.map(|s| s.failed_targets.clone()).unwrap_or_default(),
        last_switchover_time: status.and_then(|s| s.last_switchover_time.clone()),
    }
}

/// A Warning `EngineRestarted` for each instance whose agent reports an engine restart the
/// status does not record yet (told apart by its time: an agent started again counts from
/// zero; restarts between two reconciles are one event naming the count).
fn engine_restarts(db: &DatabaseCluster, pods: &[&Pod]) -> Vec<Announcement> {
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

/// The pod, not being deleted, whose agent reports the primary role: the only one, or the
/// one of them that holds the primary lock (`lock_holder`; a fenced former primary may still
/// show its last report). `None` when the pods do not say.
fn running_primary(pods: &[&Pod], lock_holder: Option<&str>) -> Option<String> {
    let primaries: Vec<String> = pods
        .iter()
        .filter(|pod| {
            pod.metadata.deletion_timestamp.is_none()
                && InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())
                    .and_then(|report| report.role)
                    .as_deref()
                    == Some(devctl_api::instance::ROLE_PRIMARY)
        })
        .map(|pod| pod.name_any())
        .collect();
    match primaries.as_slice() {
        [only] => Some(only.clone()),
        _ => lock_holder
            .filter(|holder| primaries.iter().any(|p| p == holder))
            .map(str::to_string),
    }
}

/// Who holds the cluster's primary lock, as the cache saw it.
fn lock_holder(ctx: &Context, names: &Names) -> Option<String> {
    observe_lease(ctx, names).and_then(|(_, observation)| observation.holder)
}

/// The cluster's pods from the cache.
pub(crate) fn cluster_pods(ctx: &Context, names: &Names) -> Vec<Arc<Pod>> {
    let mut pods = ctx.caches.of_instance::<Pod>(&names.namespace, &names.name);
    pods.retain(|pod| {
        pod.labels().get(labels::NAME).map(String::as_str) == Some(resources::APP_NAME)
    });
    pods
}

/// Who is primary after this reconcile and what else the failover or switchover step
/// decided.
#[derive(Debug, Clone)]
struct PrimaryStep {
    /// What the status will say.
    primary: Primary,
    /// The primary is lost and nothing fails over on its own: why ([`Observed`]).
    primary_lost: Option<String>,
    /// The failover under way elects nobody: why ([`Observed`]).
    failover_stuck: Option<String>,
    /// Events of a step the status records: published once, after its status write.
    events: Vec<Announcement>,
    /// The switchover request is answered once the status records the answer.
    drop_request_when_recorded: bool,
    /// When to look again although nothing may happen.
    timer: Option<Duration>,
}

impl PrimaryStep {
    fn unchanged(primary: Primary) -> Self {
        Self {
            primary,
            primary_lost: None,
            failover_stuck: None,
            events: Vec::new(),
            drop_request_when_recorded: false,
            timer: None,
        }
    }

    /// A decision the live lock did not confirm: nothing changes; look again shortly.
    fn unconfirmed(primary: Primary) -> Self {
        Self {
            timer: Some(LEASE_RECHECK),
            ..Self::unchanged(primary)
        }
    }
}

/// The agents' reports by pod name.
fn reports<'a>(pods: impl Iterator<Item = &'a &'a Pod>) -> Vec<(String, Option<InstanceStatus>)> {
    pods.map(|p| {
        (
            p.name_any(),
            InstanceStatus::from_annotations(p.metadata.annotations.as_ref()),
        )
    })
    .collect()
}

/// The primary lock as the cache saw it, and when it last changed.
fn observe_lease(ctx: &Context, names: &Names) -> Option<(Arc<Lease>, LeaseObservation)> {
    let name = primary_lease_name(&names.name);
    let lease = ctx.caches.get::<Lease>(&names.namespace, &name)?;
    let observation = LeaseObservation {
        holder: lease::holder(&lease).map(str::to_string),
        ever_held: lease::ever_held(&lease),
        unchanged_for: ctx
            .caches
            .changed_at::<Lease>(&names.namespace, &name)
            .map(|at| at.elapsed())
            .unwrap_or_default(),
    };
    Some((lease, observation))
}

/// Whether the API server still has the lock at the cached version: a watch that fell
/// behind (or broke) sees no renewals, and a failover is too disruptive to start on that.
async fn lease_confirmed(ctx: &Context, names: &Names, cached: &Lease) -> bool {
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), &names.namespace);
    match api.get_opt(&primary_lease_name(&names.name)).await {
        Ok(live) => {
            live.and_then(|l| l.metadata.resource_version) == cached.metadata.resource_version
        }
        Err(error) => {
            tracing::warn!(%error, "reading the primary lock failed; the failover waits");
            false
        }
    }
}

/// Whether a failover decision may be acted on: one judged from the cached lock only once the
/// API server confirms the lock ([`lease_confirmed`]); one on a human's request at once.
async fn decision_confirmed(
    ctx: &Context,
    names: &Names,
    observed_lease: Option<&(Arc<Lease>, LeaseObservation)>,
    by_lock: bool,
) -> bool {
    match observed_lease {
        _ if !by_lock => true,
        Some((cached, _)) => lease_confirmed(ctx, names, cached).await,
        None => false,
    }
}

/// Time since `status.lastFailoverTime` on the wall clock (the only time the status keeps);
/// unknown counts as long ago.
fn since(time: Option<&str>) -> Duration {
    use k8s_openapi::jiff::Timestamp;
    let Some(started) = time.and_then(|t| t.parse::<Timestamp>().ok()) else {
        return Duration::MAX;
    };
    Duration::try_from(Timestamp::now().duration_since(started)).unwrap_or_default()
}

/// The events published with this reconcile's status write: the failover or switchover
/// step's, and a restart the status records for the first time.
fn announced_with_status(
    db: &DatabaseCluster,
    step: &PrimaryStep,
    pods: &[&Pod],
) -> Option<Transition> {
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

/// When the reconcile looks again by itself: the earliest of `timers` (the failover or
/// switchover step's, the schedule's), a misconfiguration's recheck, and at once when the
/// primary moved while a scale-down waits for that; with [`TIMER_MARGIN`].
fn next_look(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
    pods: &[&Pod],
    primary: &Primary,
    store: &backup::Resolved,
    timers: [Option<Duration>; 2],
) -> Option<Duration> {
    // A backup destination or restore source that cannot be used as configured waits for a
    // Secret or a DatabaseBackup the caches do not hold (they keep only what devctl labels):
    // the cluster looks again every `CONFIGURATION_RECHECK` while that lasts, so fixing the
    // cause clears `Degraded` without waiting for the health requeue.
    let recheck = (store.restore_problem.is_some() || store.destination_problem.is_some())
        .then_some(CONFIGURATION_RECHECK);
    // The primary moved in this reconcile while a scale-down waits for that: the children
    // were rendered from the status before the move, and the status write's echo wakes
    // nobody — look again at once.
    let primary_moved = (resources::stateful_set::scale_down_refused(db).is_some()
        && primary.current
            != recorded_primary(db, names, pods, lock_holder(ctx, names).as_deref()).current)
        .then_some(Duration::ZERO);
    timers
        .into_iter()
        .chain([recheck, primary_moved])
        .flatten()
        .min()
        .map(|timer| timer + TIMER_MARGIN)
}

/// Carries a failover ([`failover::plan`]) or, when none is due, a switchover
/// ([`switchover::plan`]) one step; never both in one reconcile.
async fn primary_step(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
    pods: &[&Pod],
) -> PrimaryStep {
    let observed_lease = observe_lease(ctx, names);
    let holder = observed_lease
        .as_ref()
        .and_then(|(_, observation)| observation.holder.as_deref());
    let recorded = recorded_primary(db, names, pods, holder);
    // A pod being deleted is no candidate and has nothing left to report.
    let live_reports = reports(
        pods.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none()),
    );
    let carrier = FailoverCarrier {
        db,
        ctx,
        names,
        pods,
        high_availability: lease::failover_timeout(db).and(db.spec.high_availability.as_ref()),
        requested: switchover::requested(db),
        cluster_key: (names.namespace.clone(), names.name.clone()),
        observed_lease,
    };
    let live = match (&recorded.failed, recorded.epoch) {
        (Some(_), Some(epoch)) => {
            ctx.failover_liveness
                .live(carrier.cluster_key.clone(), epoch, pods)
        }
        _ => {
            ctx.failover_liveness
                .forget(&carrier.cluster_key, recorded.epoch);
            BTreeSet::new()
        }
    };
    let step = failover::plan(&failover::Inputs {
        cluster: &names.name,
        high_availability: carrier.high_availability,
        synchronous: db
            .spec
            .replication
            .as_ref()
            .and_then(|r| r.synchronous.as_ref()),
        primary: &recorded,
        lease: carrier.lease(),
        reports: &live_reports,
        replicas: resources::stateful_set::instances(db),
        requested: carrier.requested,
        primary_ready: pods
            .iter()
            .any(|p| p.name_any() == recorded.current && instances::serves(p)),
        forced: db
            .annotations()
            .get(FORCE_FAILOVER_ANNOTATION)
            .is_some_and(|v| v == "true"),
        since_start: since(recorded.last_failover_time.as_deref()),
        since_switchover: since(recorded.last_switchover_time.as_deref()),
        live: &live,
    });
    carrier.carry(step, recorded).await
}

/// What a failover step is carried out with ([`primary_step`]).
struct FailoverCarrier<'a> {
    db: &'a DatabaseCluster,
    ctx: &'a Context,
    names: &'a Names,
    pods: &'a [&'a Pod],
    high_availability: Option<&'a devctl_api::database_cluster::HighAvailabilitySpec>,
    /// The pod a switchover request names.
    requested: Option<&'a str>,
    cluster_key: (String, String),
    observed_lease: Option<(Arc<Lease>, LeaseObservation)>,
}

impl FailoverCarrier<'_> {
    fn lease(&self) -> Option<&LeaseObservation> {
        self.observed_lease.as_ref().map(|(_, o)| o)
    }

    /// Carries `step` from the `recorded` status.
    async fn carry(&self, step: failover::Step, recorded: Primary) -> PrimaryStep {
        let db = self.db;
        match step {
            failover::Step::Idle { expires_in } => self.no_failover(recorded, expires_in).await,
            failover::Step::Lost { message } => PrimaryStep {
                events: degraded_news(db, status::PRIMARY_UNAVAILABLE, "PrimaryLost", &message),
                primary_lost: Some(message),
                ..PrimaryStep::unchanged(recorded)
            },
            failover::Step::Refuse(message) => {
                publish(
                    self.ctx,
                    db,
                    EventType::Warning,
                    "SwitchoverRefused",
                    "Switchover",
                    message,
                )
                .await;
                drop_request(self.ctx, self.names).await;
                PrimaryStep::unchanged(recorded)
            }
            failover::Step::AlreadyPrimary => {
                drop_request(self.ctx, self.names).await;
                PrimaryStep::unchanged(recorded)
            }
            failover::Step::Start {
                failed,
                epoch,
                candidate: _,
                message,
                by_lock,
            } => self.start(recorded, failed, epoch, message, by_lock).await,
            failover::Step::Stuck { message } => PrimaryStep {
                events: degraded_news(db, status::FAILOVER_STUCK, "FailoverStuck", &message),
                failover_stuck: Some(message),
                ..PrimaryStep::unchanged(recorded)
            },
            failover::Step::Pending { recheck_in } => PrimaryStep {
                timer: recheck_in,
                ..PrimaryStep::unchanged(recorded)
            },
            failover::Step::Elect(target) => self.elect(recorded, target),
            // Nothing announces a target that died before promoting (it never takes the
            // lock): look again after a lock duration ([`failover::Step::Reelect`]).
            failover::Step::Promoting(_) => PrimaryStep {
                timer: failover_recheck(self.high_availability),
                ..PrimaryStep::unchanged(recorded)
            },
            failover::Step::Reelect {
                epoch,
                lost,
                message,
                by_lock,
            } => self.reelect(recorded, epoch, lost, message, by_lock).await,
            failover::Step::Done { from, to, epoch } => PrimaryStep {
                events: vec![Announcement {
                    type_: EventType::Normal,
                    reason: "Promoted",
                    action: format!("Promote {to}"),
                    note: format!(
                        "Promoted {to} (failover from {from}, epoch {epoch}); {from} rejoins as a standby once it is back"
                    ),
                }],
                drop_request_when_recorded: self.requested.is_some(),
                ..PrimaryStep::unchanged(Primary {
                    current: to,
                    target: None,
                    failed: None,
                    failed_targets: Vec::new(),
                    ..recorded
                })
            },
        }
    }

    /// No failover is due: a switchover may be.
    async fn no_failover(&self, recorded: Primary, expires_in: Option<Duration>) -> PrimaryStep {
        let clock = switchover::Clock {
            // A switchover an older operator started has no start time: from now.
            since_start: recorded
                .last_switchover_time
                .as_deref()
                .map_or(Duration::ZERO, |t| since(Some(t))),
            lock_duration: self.high_availability.and_then(|ha| ha.failover_timeout()),
            lock: self.lease(),
        };
        let all_reports = reports(self.pods.iter());
        let mut step = self.switchover_step(recorded, &all_reports, &clock).await;
        step.timer = match (step.timer, expires_in) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        step
    }

    /// An election (re)starts only once the lock confirms the decision (read live); the
    /// replicas' liveness counts from then. `false`: look again shortly.
    async fn election_confirmed(&self, epoch: i64, by_lock: bool) -> bool {
        if !decision_confirmed(self.ctx, self.names, self.observed_lease.as_ref(), by_lock).await {
            return false;
        }
        self.ctx
            .failover_liveness
            .started(self.cluster_key.clone(), epoch, self.pods);
        true
    }

    /// The primary is lost: a failover starts (once the lock says so, read live).
    async fn start(
        &self,
        recorded: Primary,
        failed: String,
        epoch: i64,
        message: String,
        by_lock: bool,
    ) -> PrimaryStep {
        if !self.election_confirmed(epoch, by_lock).await {
            return PrimaryStep::unconfirmed(recorded);
        }
        PrimaryStep {
            events: vec![Announcement {
                type_: EventType::Warning,
                reason: "PrimaryLost",
                action: "Failover".into(),
                note: message,
            }],
            // Every step of a failover looks again by itself: what comes next (an
            // acknowledgement, a promotion) may never be announced by an event, and the
            // echo of this status write wakes nobody.
            timer: failover_recheck(self.high_availability),
            ..PrimaryStep::unchanged(Primary {
                target: Some(TARGET_PENDING.into()),
                failed: Some(failed),
                epoch: Some(epoch),
                last_failover_time: Some(now().0.to_string()),
                failed_targets: Vec::new(),
                ..recorded
            })
        }
    }

    /// The replicas' final positions elect `target`.
    fn elect(&self, recorded: Primary, target: String) -> PrimaryStep {
        let failed = recorded.failed.clone().unwrap_or_default();
        let epoch = recorded.epoch.unwrap_or(0);
        let why = if self.requested == Some(target.as_str()) {
            "as requested".to_string()
        } else {
            "the most advanced of the replicas' final positions".to_string()
        };
        PrimaryStep {
            // A target that never takes the lock (frozen, refused) changes nothing the
            // operator watches: look again after a lock duration, as while promoting.
            timer: failover_recheck(self.high_availability),
            events: vec![Announcement {
                type_: EventType::Normal,
                reason: "FailingOver",
                action: format!("Elect {target}"),
                note: format!(
                    "Failing over from {failed} (epoch {epoch}): {target} promotes, {why}"
                ),
            }],
            ..PrimaryStep::unchanged(Primary {
                target: Some(target),
                ..recorded
            })
        }
    }

    /// The elected target was lost before it promoted: elect again, without it.
    async fn reelect(
        &self,
        recorded: Primary,
        epoch: i64,
        lost: String,
        message: String,
        by_lock: bool,
    ) -> PrimaryStep {
        if !self.election_confirmed(epoch, by_lock).await {
            return PrimaryStep::unconfirmed(recorded);
        }
        PrimaryStep {
            events: vec![Announcement {
                type_: EventType::Warning,
                reason: "FailoverTargetLost",
                action: "Failover".into(),
                note: message,
            }],
            timer: failover_recheck(self.high_availability),
            // A request for the lost target would hold the new election up.
            drop_request_when_recorded: self.requested == Some(lost.as_str()),
            ..PrimaryStep::unchanged(Primary {
                target: Some(TARGET_PENDING.into()),
                epoch: Some(epoch),
                last_failover_time: Some(now().0.to_string()),
                // Not elected again in this failover.
                failed_targets: recorded
                    .failed_targets
                    .iter()
                    .cloned()
                    .chain((!recorded.failed_targets.contains(&lost)).then(|| lost.clone()))
                    .collect(),
                ..recorded
            })
        }
    }
}

/// A Warning event `event` for a `Degraded` condition with `reason` and `message`, unless the
/// status shows it already: published when the message first appears, not each reconcile.
fn degraded_news(
    db: &DatabaseCluster,
    reason: &str,
    event: &'static str,
    message: &str,
) -> Vec<Announcement> {
    let already = db
        .status
        .as_ref()
        .and_then(|s| devctl_api::conditions::find(&s.conditions, devctl_api::conditions::DEGRADED))
        .is_some_and(|c| c.reason == reason && c.message == message);
    if already {
        return Vec::new();
    }
    vec![Announcement {
        type_: EventType::Warning,
        reason: event,
        action: "Failover".into(),
        note: message.to_string(),
    }]
}

impl FailoverCarrier<'_> {
    /// Carries a switchover one step ([`switchover::plan`]) from the `recorded` status.
    async fn switchover_step(
        &self,
        recorded: Primary,
        reports: &[(String, Option<InstanceStatus>)],
        clock: &switchover::Clock<'_>,
    ) -> PrimaryStep {
        let (db, ctx, names) = (self.db, self.ctx, self.names);
        let step = switchover::plan(
            &recorded,
            switchover::requested(db),
            reports,
            resources::stateful_set::instances(db),
            clock,
        );
        match step {
            Step::Idle => PrimaryStep::unchanged(recorded),
            // Look again at the deadline (and then every lock duration: a target holding the
            // lock is given up on only once it stops renewing it).
            Step::Waiting(_) => PrimaryStep {
                timer: Some(
                    super::primary::deadline(clock.lock_duration)
                        .checked_sub(clock.since_start)
                        .filter(|left| !left.is_zero())
                        .or(clock.lock_duration)
                        .unwrap_or(LEASE_RECHECK),
                ),
                ..PrimaryStep::unchanged(Primary {
                    last_switchover_time: recorded
                        .last_switchover_time
                        .clone()
                        .or_else(|| Some(now().0.to_string())),
                    ..recorded
                })
            },
            Step::Abort {
                target,
                fail_over: false,
                message,
            } => self.abort_back(recorded, target, message, clock).await,
            Step::Abort {
                target,
                fail_over: true,
                message,
            } => self.abort_into_failover(recorded, target, message).await,
            Step::AlreadyPrimary => {
                drop_request(ctx, names).await;
                PrimaryStep::unchanged(recorded)
            }
            Step::Refuse(message) => {
                publish(
                    ctx,
                    db,
                    EventType::Warning,
                    "SwitchoverRefused",
                    "Switchover",
                    message,
                )
                .await;
                drop_request(ctx, names).await;
                PrimaryStep::unchanged(recorded)
            }
            Step::Start(target) => PrimaryStep {
                events: vec![Announcement {
                    type_: EventType::Normal,
                    reason: "SwitchingOver",
                    action: "Switchover".into(),
                    note: format!(
                        "Switching over from {} to {target}: the primary checkpoints and stops, {target} promotes once it has all of its WAL",
                        recorded.current
                    ),
                }],
                ..PrimaryStep::unchanged(Primary {
                    target: Some(target),
                    last_switchover_time: Some(now().0.to_string()),
                    ..recorded
                })
            },
            Step::Done { from, to } => PrimaryStep {
                events: vec![Announcement {
                    type_: EventType::Normal,
                    reason: "Promoted",
                    action: format!("Promote {to}"),
                    note: format!(
                        "Promoted {to} (switchover from {from}); {from} rejoins as a standby"
                    ),
                }],
                drop_request_when_recorded: switchover::requested(db).is_some(),
                ..PrimaryStep::unchanged(Primary {
                    current: to,
                    target: None,
                    ..recorded
                })
            },
        }
    }

    /// The switchover's target did not promote in time: the old primary serves again.
    async fn abort_back(
        &self,
        recorded: Primary,
        target: String,
        message: String,
        clock: &switchover::Clock<'_>,
    ) -> PrimaryStep {
        let (db, ctx, names) = (self.db, self.ctx, self.names);
        let observed_lease = self.observed_lease.as_ref();
        // With a lock, judged from the cached one: confirmed with the API server first
        // (a target that took it meanwhile may be promoting).
        if !decision_confirmed(ctx, names, observed_lease, clock.lock.is_some()).await {
            return PrimaryStep::unconfirmed(recorded);
        }
        PrimaryStep {
            events: vec![Announcement {
                type_: EventType::Warning,
                reason: "SwitchoverAborted",
                action: "Switchover".into(),
                note: message,
            }],
            // The request would start the same switchover again (a newer one, naming
            // another pod, stays).
            drop_request_when_recorded: switchover::requested(db) == Some(target.as_str()),
            ..PrimaryStep::unchanged(Primary {
                target: None,
                ..recorded
            })
        }
    }

    /// The switchover's target holds the lock and stopped renewing it: fail over without it.
    async fn abort_into_failover(
        &self,
        recorded: Primary,
        target: String,
        message: String,
    ) -> PrimaryStep {
        let (db, ctx, names, pods) = (self.db, self.ctx, self.names, self.pods);
        let observed_lease = self.observed_lease.as_ref();
        // Judged from the cached lock: confirmed with the API server first.
        if !decision_confirmed(ctx, names, observed_lease, true).await {
            return PrimaryStep::unconfirmed(recorded);
        }
        let epoch = recorded.epoch.unwrap_or(0) + 1;
        ctx.failover_liveness
            .started((names.namespace.clone(), names.name.clone()), epoch, pods);
        PrimaryStep {
            events: vec![
                Announcement {
                    type_: EventType::Warning,
                    reason: "SwitchoverAborted",
                    action: "Switchover".into(),
                    note: format!("{message} (epoch {epoch})"),
                },
                Announcement {
                    type_: EventType::Warning,
                    reason: "PrimaryLost",
                    action: "Failover".into(),
                    note: format!(
                        "{target}, the switchover's target, holds the primary lock and stopped renewing it; failing over from {} without {target} (epoch {epoch})",
                        recorded.current
                    ),
                },
            ],
            drop_request_when_recorded: switchover::requested(db) == Some(target.as_str()),
            ..PrimaryStep::unchanged(Primary {
                target: Some(TARGET_PENDING.into()),
                failed: Some(recorded.current.clone()),
                epoch: Some(epoch),
                last_failover_time: Some(now().0.to_string()),
                failed_targets: vec![target],
                ..recorded
            })
        }
    }
}

/// Removes the switchover request (answered: done, refused or moot).
async fn drop_request(ctx: &Context, names: &Names) {
    let api: Api<DatabaseCluster> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let patch = json!({ "metadata": { "annotations": {
        SWITCHOVER_ANNOTATION: null,
        FORCE_FAILOVER_ANNOTATION: null,
    } } });
    if let Err(error) = api
        .patch(&names.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(%error, "removing the switchover request failed; retried next time");
    }
}

/// Labels each pod with its role and replaces at most one outdated pod ([`pods::plan`]).
async fn manage_pods(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
    primary: &Primary,
    pods: &[&Pod],
    store: &backup::Resolved,
) -> Result<()> {
    let sts = ctx
        .caches
        .get::<StatefulSet>(&names.namespace, &names.stateful_set());
    let instances = observe_instances(db, ctx, names, pods);
    let replicas = resources::stateful_set::instances(db);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
    // A pod's annotations and role label go in one patch. Its echo is no news: the status
    // reads neither the role label nor annotations the operator itself wrote.
    let mut annotations: std::collections::BTreeMap<String, serde_json::Value> =
        backup::pod_annotations(pods, store, &primary.current)
            .into_iter()
            .collect();
    let patch_pod = |action: &'static str, pod: String, metadata: serde_json::Value| {
        let patch = json!({ "metadata": metadata });
        async move {
            match ctx
                .caches
                .applier()
                .patch_quietly::<Pod>(&ctx.client, &ctx.caches, &names.namespace, &pod, &patch)
                .await
            {
                Ok(_) => Ok(()),
                // Gone meanwhile: its replacement is labelled on the next pass.
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(source) => Err(Error::Child {
                    action,
                    kind: Pod::KIND,
                    name: pod,
                    source,
                }),
            }
        }
    };
    for action in pods::plan(pods, sts.as_deref(), primary, replicas, instances.ready) {
        match action {
            PodAction::Label { pod, role } => {
                let mut metadata = json!({ "labels": { ROLE_LABEL: role } });
                if let Some(annotations) = annotations.remove(&pod) {
                    metadata["annotations"] = annotations;
                }
                patch_pod("label", pod, metadata).await?;
            }
            PodAction::Replace { pod, uid, primary } => {
                // Its replacement gets them.
                annotations.remove(&pod);
                let params = kube::api::DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match api.delete(&pod, &params).await {
                    Ok(_) => {
                        let which = if primary { "the primary" } else { "a replica" };
                        publish(
                            ctx,
                            db,
                            EventType::Normal,
                            "ReplacingInstance",
                            // Per pod: the recorder folds events of one action into a series.
                            &format!("Replace {pod}"),
                            format!(
                                "Replacing pod {pod} ({which}) with the new pod template; replicas go first, the primary last"
                            ),
                        )
                        .await;
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(source) => {
                        return Err(Error::Child {
                            action: "delete",
                            kind: Pod::KIND,
                            name: pod,
                            source,
                        });
                    }
                }
            }
        }
    }
    for (pod, annotations) in annotations {
        patch_pod("annotate", pod, json!({ "annotations": annotations })).await?;
    }
    Ok(())
}

/// The cluster's instances from the agents' reports on its pods.
fn observe_instances(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
    pods: &[&Pod],
) -> Instances {
    let credentials_version = ctx
        .caches
        .kind(Secret::KIND)
        .ok()
        .and_then(|secrets| secrets.meta(&names.namespace, &names.secret()))
        .and_then(|live| live.resource_version);
    // The instances the cluster runs (a refused scale-down keeps some past spec.replicas),
    // as the pod replacements count them.
    instances::observe(
        pods,
        resources::stateful_set::instances(db),
        credentials_version.as_deref(),
    )
}

/// What one convergence did.
struct Converged {
    changes: Vec<Change>,
    /// `(expanded, total)` while some volume has not reached the requested size.
    volumes_pending: Option<(usize, usize)>,
    /// The credentials Secret was gone while the cluster's data existed: a new password.
    credentials_regenerated: bool,
}

/// Applies the children, deletes orphans and expands volumes.
async fn converge(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
    target_version: &str,
    sts: Option<&StatefulSet>,
    store: &backup::Resolved,
) -> Result<Converged> {
    let owner_uid = db.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let existing_claim_size = sts
        .and_then(|s| s.spec.volume_claim_templates.as_ref())
        .and_then(|t| t.first())
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone());
    // The backup and restore stores' Secrets do not depend on the passwords: rendered once.
    let mut stores = Vec::new();
    if let Some(destination) = &store.destination {
        stores.push(backup::store_secret(
            db,
            names,
            target_version,
            BACKUP_STORE_SECRET_SUFFIX,
            destination,
        )?);
    }
    if let Some((_, source)) = &store.restore {
        stores.push(backup::store_secret(
            db,
            names,
            target_version,
            RESTORE_STORE_SECRET_SUFFIX,
            source,
        )?);
    }
    let settled = Inputs {
        password: None,
        replication_password: None,
        version: target_version,
        existing_claim_size: existing_claim_size.as_deref(),
        cluster_domain: &ctx.settings.cluster_domain,
        agent_image: &ctx.settings.agent_image,
    };
    let render_key = settled.render_key(db, &stores);
    let owner = Owner {
        namespace: &names.namespace,
        uid: &owner_uid,
    };
    let applier = ctx.caches.applier();
    // Most reconciles (a pod's report, a health check) change no input of the render: when
    // every child is still as the last complete sync left it, rendering them again and
    // comparing would find nothing to do.
    if applier.render_unneeded(&ctx.caches, owner, render_key) {
        return Ok(Converged {
            changes: Vec::new(),
            volumes_pending: expand_volumes(db, ctx, names).await?,
            credentials_regenerated: false,
        });
    }
    applier.forget_render(owner);
    // Passwords are read only when a credentials Secret may have to be written: a Secret as
    // we left it is rendered with placeholders and skipped. If its desired state changed
    // after all (its hash does not depend on the password), read them and render again.
    let mut read = false;
    // A Secret the cache does not know is created, never applied over one of its name; if
    // one exists after all (a Secret without devctl's labels, or ours not yet seen by the
    // watch), both are read and everything is rendered and synced again.
    let (changes, credentials) = loop {
        let (mut desired, credentials) = loop {
            // Regenerated silently: the primary's agent applies it and the replicas read it.
            let replication = credentials(
                ctx,
                names,
                &names.replication_secret(),
                &owner_uid,
                false,
                read,
            )
            .await?;
            let credentials =
                credentials(ctx, names, &names.secret(), &owner_uid, sts.is_some(), read).await?;
            let inputs = Inputs {
                password: credentials.password.as_deref(),
                replication_password: replication.password.as_deref(),
                ..settled
            };
            let mut desired = resources::desired(db, &inputs)?;
            let secrets = ctx.caches.kind(Secret::KIND)?;
            let outdated = desired.iter().any(|child| {
                child.placeholder
                    && secrets
                        .meta(&names.namespace, &child.name)
                        .and_then(|live| live.hash)
                        .as_deref()
                        != Some(child.hash.as_str())
            });
            if outdated && !read {
                read = true;
                continue;
            }
            for read in [&replication, &credentials] {
                let secret = desired
                    .iter_mut()
                    .find(|c| c.kind == Secret::KIND && c.name == read.name);
                if let Some(secret) = secret {
                    secret.live.clone_from(&read.live);
                    secret.create_only = read.create_only;
                }
            }
            break (desired, credentials);
        };
        desired.extend(stores.iter().cloned());
        match applier
            .sync(&ctx.client, &ctx.caches, owner, &desired, resources::KINDS)
            .await
        {
            Err(Error::ChildExists { kind, .. }) if kind == Secret::KIND && !read => read = true,
            synced => {
                let changes = synced?;
                applier.remember_render(owner, render_key, &desired);
                break (changes, credentials);
            }
        }
    };
    let volumes_pending = expand_volumes(db, ctx, names).await?;
    Ok(Converged {
        changes,
        volumes_pending,
        credentials_regenerated: credentials.regenerated,
    })
}

struct Credentials {
    /// The Secret's name.
    name: String,
    /// `None` when the Secret is as we left it and was not read.
    password: Option<String>,
    regenerated: bool,
    /// The Secret as read, for the applier's drift check.
    live: Option<serde_json::Value>,
    /// Neither the cache nor our record knows the Secret and it was not read: a new password,
    /// written by creating the Secret ([`crate::children::Child::create_only`]).
    create_only: bool,
}

/// The password of the Secret `secret_name` (credentials or replication): the one it holds,
/// or a new one when it is gone or empty (`regenerated` when the data already existed). A
/// Secret of that name that the cluster does not control is never read or touched. The
/// cache keeps no Secret data, so the password is read from the API — only when `read` is
/// set or the Secret is not as our last apply left it; otherwise it is not needed (`None`).
async fn credentials(
    ctx: &Context,
    names: &Names,
    secret_name: &str,
    owner_uid: &str,
    data_exists: bool,
    read: bool,
) -> Result<Credentials> {
    let owned_by_us = |s: &Secret| {
        s.owner_references()
            .iter()
            .any(|r| r.controller == Some(true) && r.uid == owner_uid)
    };
    let not_owned = || Error::CredentialsSecretNotOwned {
        name: secret_name.to_string(),
    };
    if let Some(cached) = ctx
        .caches
        .kind(Secret::KIND)?
        .meta(&names.namespace, secret_name)
    {
        // Controlled by another object: read below, which tells a deleted cluster's Secret
        // the garbage collector is about to remove from someone else's.
        let ours = cached.controller.as_ref().is_some_and(|c| c.is(owner_uid));
        let as_we_left_it = ours
            && ctx
                .caches
                .applier()
                .unchanged(Secret::KIND, &names.namespace, secret_name, &cached);
        if as_we_left_it && !read {
            return Ok(Credentials {
                name: secret_name.to_string(),
                password: None,
                regenerated: false,
                live: None,
                create_only: false,
            });
        }
    } else if !read
        && !ctx
            .caches
            .applier()
            .wrote(Secret::KIND, &names.namespace, secret_name)
    {
        // Unknown to the cache and not written by us: most likely there is none. Creating it
        // cannot overwrite one there is after all, so it need not be looked up first.
        return Ok(Credentials {
            name: secret_name.to_string(),
            password: Some(secret::generate_password()),
            regenerated: data_exists,
            live: None,
            create_only: true,
        });
    }
    // A Secret without devctl's labels is not in the cache, and a cold or lagging cache must
    // never cause a new password: the API has the last word.
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let live = api
        .get_opt(secret_name)
        .await
        .map_err(|source| Error::Child {
            action: "read",
            kind: "Secret",
            name: secret_name.to_string(),
            source,
        })?;
    let (password, regenerated) = match &live {
        // The Secret of a deleted cluster of this name, not removed yet: a wait.
        Some(live)
            if !owned_by_us(live)
                && (live.metadata.deletion_timestamp.is_some()
                    || live.owner_references().iter().any(|r| {
                        r.controller == Some(true)
                            && r.kind == <DatabaseCluster as kube::Resource>::kind(&())
                            && r.name == names.name
                    })) =>
        {
            return Err(Error::ChildOfDeletedOwner {
                kind: Secret::KIND,
                name: secret_name.to_string(),
                previous: format!("DatabaseCluster {}", names.name),
            });
        }
        Some(live)
            if !owned_by_us(live)
                && orphan_of(&live.metadata, &names.owner_labels()) != Orphanage::Ours =>
        {
            return Err(not_owned());
        }
        // Ours, or left behind for this name by a deletion that kept the children: its
        // password stays (the sync adopts it).
        Some(live) => match secret::existing_password(live) {
            Some(password) => (password, false),
            None => (secret::generate_password(), data_exists),
        },
        None => (secret::generate_password(), data_exists),
    };
    Ok(Credentials {
        name: secret_name.to_string(),
        password: Some(password),
        regenerated,
        live: live.and_then(|l| serde_json::to_value(l).ok()),
        create_only: false,
    })
}

/// What the deletion of a cluster did with its volumes.
enum Volumes {
    /// This many data claims deleted (or going already).
    Deleted(usize),
    /// Kept as asked (why, for the event).
    Kept(String),
    /// Kept with everything else: deleted with the `Orphan` propagation policy, its
    /// StatefulSet and pods stay and still use them.
    Orphaned,
    /// Kept because deleting them could lose the only copy of the data, or was refused (why).
    KeptForSafety(String),
}

/// Deletes the cluster's data claims when the cluster goes: StatefulSets never delete them,
/// and a cluster created again under the same name must not start on the old data. Not a
/// retention policy on the StatefulSet, which would also delete the data when someone
/// deletes only the StatefulSet (it is restored, the data must survive that). They are kept
/// when asked ([`database_cluster::KEEP_VOLUMES_ANNOTATION`]), when the cluster is deleted
/// with the `Orphan` propagation policy (its StatefulSet and pods stay and still use them),
/// and when a final backup was asked for and did not complete (they hold the only copy).
/// The claims are listed live (a claim the StatefulSet made a moment ago may not be cached
/// yet) and each delete is bound to the claim's uid.
async fn dispose_of_volumes(db: &DatabaseCluster, ctx: &Context, names: &Names) -> Result<Volumes> {
    if database_cluster::keeps_volumes(db.annotations()) {
        return Ok(Volumes::Kept(format!(
            "{}: \"true\"",
            database_cluster::KEEP_VOLUMES_ANNOTATION
        )));
    }
    // Orphan propagation: the garbage collector takes the owner references off the children
    // and then drops its `orphan` finalizer — either may be what this reconcile sees.
    let statefulsets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let stateful_set = statefulsets.get_opt(&names.stateful_set()).await?;
    let ours = |sts: &StatefulSet| {
        sts.owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == db.uid().as_ref())
    };
    let orphaned = db.finalizers().iter().any(|f| f == "orphan")
        || stateful_set.as_ref().is_some_and(|sts| !ours(sts));
    if orphaned {
        return Ok(Volumes::Orphaned);
    }
    if let Some(backup) = db.spec.backup.as_ref().filter(|b| b.final_backup) {
        if !backup.enabled {
            return Ok(Volumes::KeptForSafety(
                "spec.backup.finalBackup asked for a final backup, but backups are disabled (spec.backup.enabled: false), so none was taken".into(),
            ));
        }
        let name = super::schedule::final_backup_name(&names.name);
        let backups: Api<devctl_api::database_backup::DatabaseBackup> =
            Api::namespaced(ctx.client.clone(), &names.namespace);
        let completed = backups.get_opt(&name).await?.is_some_and(|b| {
            backup_lifecycle::taken_for_this_deletion(&b, db)
                && b.status.as_ref().and_then(|s| s.phase)
                    == Some(devctl_api::database_backup::BackupPhase::Completed)
        });
        // A cluster that never made a data volume has nothing a backup could hold.
        if !completed && !live_data_claims(ctx, names).await?.is_empty() {
            return Ok(Volumes::KeptForSafety(format!(
                "spec.backup.finalBackup asked for a final backup and {name} did not complete"
            )));
        }
    }
    // The StatefulSet goes first: once it is being deleted its controller makes no pod and
    // no claim, so the list below holds every claim there will be (the garbage collector,
    // left to itself, deletes it only after the finalizer is gone, and a pod it recreated
    // meanwhile would leave a new claim behind).
    if let Some(sts) = stateful_set.filter(|sts| sts.metadata.deletion_timestamp.is_none()) {
        let params = kube::api::DeleteParams {
            preconditions: sts.uid().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..kube::api::DeleteParams::background()
        };
        match statefulsets.delete(&names.stateful_set(), &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {}
            Err(source) => {
                return Err(Error::Child {
                    action: "deleting",
                    kind: "StatefulSet",
                    name: names.stateful_set(),
                    source,
                });
            }
        }
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let claims = live_data_claims(ctx, names).await?;
    for claim in &claims {
        let name = claim.name_any();
        let params = kube::api::DeleteParams {
            preconditions: claim.uid().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            // Gone already, or replaced by a claim that is not the one listed.
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {}
            // The operator's rights lack it (an older Role): the cluster still goes.
            Err(kube::Error::Api(status)) if status.code == 403 => {
                return Ok(Volumes::KeptForSafety(format!(
                    "the operator may not delete PersistentVolumeClaims here ({})",
                    status.message
                )));
            }
            Err(source) => {
                return Err(Error::Child {
                    action: "deleting",
                    kind: "PersistentVolumeClaim",
                    name,
                    source,
                });
            }
        }
    }
    Ok(Volumes::Deleted(claims.len()))
}

/// Grows claims smaller than `spec.storage.size` in place (claim templates are immutable).
/// Returns `(expanded, total)` while some volume has not reached the size yet.
async fn expand_volumes(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
) -> Result<Option<(usize, usize)>> {
    let Some(want) = quantity::to_bytes(&db.spec.storage.size) else {
        return Ok(None);
    };
    let claims = data_claims(ctx, names);
    let bytes = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| quantity::to_bytes(&q.0)).unwrap_or(0)
    };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let mut expanded = 0;
    for claim in &claims {
        let requested = bytes(
            claim
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage")),
        );
        let capacity = bytes(
            claim
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage")),
        );
        if requested < want {
            let patch = json!({ "spec": { "resources": { "requests": { "storage": db.spec.storage.size } } } });
            api.patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|source| Error::Child {
                action: "expand",
                kind: "PersistentVolumeClaim",
                name: claim.name_any(),
                source,
            })?;
            publish(
                ctx,
                db,
                EventType::Normal,
                "ExpandingVolume",
                "Resize",
                format!(
                    "Expanding PersistentVolumeClaim {} to {}",
                    claim.name_any(),
                    db.spec.storage.size
                ),
            )
            .await;
        }
        if capacity >= want {
            expanded += 1;
        }
    }
    Ok((expanded < claims.len()).then_some((expanded, claims.len())))
}

async fn publish_events(
    db: &DatabaseCluster,
    ctx: &Context,
    previous_sts: Option<&StatefulSet>,
    version_refused: Option<&str>,
    regenerated_secret: Option<&str>,
) {
    let previous_replicas = previous_sts.and_then(|s| s.spec.replicas);
    let to = resources::stateful_set::instances(db);
    if let Some(from) = previous_replicas
        && from != to
    {
        publish(
            ctx,
            db,
            EventType::Normal,
            "Scaling",
            "Scale",
            format!("Scaling from {from} to {to} instances"),
        )
        .await;
    }
    // Once per refusal: only when the condition is not already saying so.
    // Each refusal is published when it first shows, not on every reconcile while it stands.
    // (`Degraded` may show another reason meanwhile; `Stalled` shows the refusal.)
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
        publish(
            ctx,
            db,
            EventType::Warning,
            "VersionChangeRefused",
            "Upgrade",
            message.to_string(),
        )
        .await;
    }
    let refusals = [
        (
            status::REPLICATION_UNSUPPORTED,
            resources::stateful_set::replication_refused(db),
        ),
        (
            status::SCALE_DOWN_REFUSED,
            resources::stateful_set::scale_down_refused(db),
        ),
    ];
    for (reason, message) in refusals {
        if let Some(message) = message
            && !degraded_for(reason)
        {
            publish(ctx, db, EventType::Warning, reason, "Scale", message).await;
        }
    }
    if let Some(name) = regenerated_secret {
        publish(
            ctx,
            db,
            EventType::Warning,
            status::CREDENTIALS_REGENERATED,
            "Credentials",
            format!(
                "Secret {name} was deleted while the cluster's data exists: it was recreated with a new password, which the database does not have yet"
            ),
        )
        .await;
    }
}

/// Bounded cleanup before the finalizer is removed (the final backup, when one is due, has run
/// before it): the data claims are deleted unless the cluster asks to keep them; the other
/// children go away through garbage collection (controller owner references).
/// Longest a cleanup may take before it counts as failed (and is retried with backoff), so a
/// hung step can never hold the finalizer — and the namespace — forever unnoticed.
pub const CLEANUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

async fn cleanup(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    tokio::time::timeout(CLEANUP_TIMEOUT, run_cleanup(db, ctx))
        .await
        .map_err(|_| Error::CleanupTimeout(CLEANUP_TIMEOUT))?
}

async fn run_cleanup(db: Arc<DatabaseCluster>, ctx: &Context) -> Result<Action> {
    let names = Names::of(&db)?;
    // A cluster deleted during a failover leaves no note of it behind.
    ctx.failover_liveness.forget(
        &(names.namespace.clone(), names.name.clone()),
        Some(i64::MAX),
    );
    let disposed = dispose_of_volumes(&db, ctx, &names).await?;
    let orphaned = matches!(disposed, Volumes::Orphaned);
    let volumes = match disposed {
        Volumes::Orphaned => "deleted with propagationPolicy Orphan: its children, pods and \
            volumes stay, and a cluster created again under this name adopts them"
            .to_string(),
        Volumes::Deleted(1) => "its volume claim deleted".to_string(),
        Volumes::Deleted(deleted) => format!("its {deleted} volume claims deleted"),
        Volumes::Kept(why) => format!("its volumes are kept ({why})"),
        Volumes::KeptForSafety(why) => {
            publish(
                ctx,
                db.as_ref(),
                EventType::Warning,
                "VolumesKept",
                "Delete",
                format!(
                    "Keeping the volume claims data-{}-*: {why}; delete them when the data is no longer needed",
                    names.stateful_set()
                ),
            )
            .await;
            format!("its volumes are kept: {why}")
        }
    };
    if db.status.as_ref().and_then(|s| s.phase) != Some(Phase::Deleting) {
        // The whole status: with server-side apply, fields left out would be removed.
        let mut status = db.status.clone().unwrap_or_default();
        status.phase = Some(Phase::Deleting);
        write_status(ctx, db.as_ref(), json!(status)).await?;
        publish(
            ctx,
            db.as_ref(),
            EventType::Normal,
            "Deleting",
            "Delete",
            if orphaned {
                format!("Deleting the cluster, {volumes}")
            } else {
                format!("Deleting the cluster; its children are garbage-collected, {volumes}")
            },
        )
        .await;
    }
    ctx.backoff.reset(&key(db.as_ref()));
    // The object goes with the finalizer: its series must not outlive it.
    if let Some(namespace) = db.namespace() {
        ctx.settings
            .metrics
            .forget_cluster(&namespace, &db.name_any());
        if let Some(uid) = db.uid() {
            ctx.caches.applier().forget_owner(&namespace, &uid);
        }
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use devctl_api::instance::STATUS_ANNOTATION;

    fn pod(name: &str, role: Option<&str>, deleting: bool) -> Pod {
        let mut pod = serde_json::json!({ "metadata": { "name": name } });
        if let Some(role) = role {
            pod["metadata"]["annotations"] = serde_json::json!({
                STATUS_ANNOTATION: serde_json::json!({ "role": role, "ready": true }).to_string(),
            });
        }
        if deleting {
            pod["metadata"]["deletionTimestamp"] = "2026-12-05T12:00:00Z".into();
        }
        serde_json::from_value(pod).unwrap()
    }

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

    /// A cluster that adopts the running pods of a deleted one of its name starts from the
    /// primary they run, not from its first instance.
    #[test]
    fn until_one_is_recorded_the_primary_is_the_pod_that_runs_as_primary() {
        let primary_of = |pods: &[Pod]| {
            let pods: Vec<&Pod> = pods.iter().collect();
            running_primary(&pods, None)
        };
        let replica = pod("shop-0", Some("replica"), false);
        let primary = pod("shop-1", Some("primary"), false);
        assert_eq!(
            primary_of(&[replica.clone(), primary.clone()]),
            Some("shop-1".to_string())
        );
        // None reports, two claim it, or the only one is going: no answer from the pods.
        assert_eq!(primary_of(&[pod("shop-0", None, false)]), None);
        assert_eq!(
            primary_of(&[primary.clone(), pod("shop-2", Some("primary"), false)]),
            None
        );
        assert_eq!(
            primary_of(&[replica, pod("shop-1", Some("primary"), true)]),
            None
        );
        // Two say so (a fenced former primary's last report): the lock holder among them.
        let two = [primary.clone(), pod("shop-2", Some("primary"), false)];
        let two: Vec<&Pod> = two.iter().collect();
        assert_eq!(running_primary(&two, Some("shop-2")), Some("shop-2".into()));
        assert_eq!(running_primary(&two, Some("shop-0")), None);
    }
}
