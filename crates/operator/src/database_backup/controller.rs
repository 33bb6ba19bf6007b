//! Reconcile of one DatabaseBackup: request it from an instance's agent, follow the agent's
//! report, finish it. `Completed` and `Failed` are final.

use std::sync::Arc;
use std::time::Duration;

use devctl_api::conditions::{self, Desired, FALSE, READY, RECONCILING, STALLED, TRUE};
use devctl_api::database_backup::{
    BackupPhase, BackupTarget, DatabaseBackup, DatabaseBackupStatus,
};
use devctl_api::database_cluster::{DatabaseCluster, Engine};
use devctl_api::instance::{
    BACKUP_REQUEST_ANNOTATION, BackupReport, BackupRequest, InstanceStatus, ROLE_PRIMARY,
    ROLE_REPLICA,
};
use futures::Future;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::children::Caches;
use crate::context::{Context, Settings};
use crate::database_cluster::backup;
use crate::database_cluster::observe::cluster_pods;
use crate::database_cluster::resources::Names;
use crate::error::{Error, Result};
use crate::reconciler::{now, publish, run_controller, write_status};

/// How often a running backup is looked at when nothing wakes it: each report of its pod
/// wakes it ([`unfinished_backups_of`]); this only bounds the wait for a report whose event
/// was missed (a trigger channel that lagged) and for the start limit.
const RUNNING_RECHECK: Duration = Duration::from_secs(30);
/// How long a backup may wait for an instance to take it before it fails.
pub const PENDING_LIMIT: Duration = Duration::from_secs(600);

/// Whether a backup created at `created` has waited for an instance longer than
/// [`PENDING_LIMIT`] at `now` (pure).
pub fn pending_too_long(
    created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> bool {
    created.is_some_and(|created| {
        Duration::try_from(now.0.duration_since(created.0))
            .is_ok_and(|waited| waited > PENDING_LIMIT)
    })
}

/// How long an instance asked to take a backup may go without reporting it (the agent
/// starts a requested backup within a tick or two; one that never does must not hold the
/// cluster's later backups and WAL pruning up for ever).
pub const START_LIMIT: Duration = Duration::from_secs(180);

/// Whether a backup requested at `started` (RFC 3339) and not reported by its instance has
/// waited longer than [`START_LIMIT`] at `now` (pure; an unreadable time has not).
pub fn never_started(started: Option<&str>, now: &k8s_openapi::jiff::Timestamp) -> bool {
    started
        .and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .is_some_and(|started| {
            Duration::try_from(now.duration_since(started)).is_ok_and(|d| d > START_LIMIT)
        })
}

/// How long a backup waits for another one of the same cluster.
const PENDING_RECHECK: Duration = Duration::from_secs(5);

pub fn controller(
    client: Client,
    namespace: Option<String>,
    caches: Caches,
    settings: Settings,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> BoxStream<'static, crate::Reconciled> {
    run_controller::<DatabaseBackup, _, _>(
        "databasebackup",
        &["Pod"],
        // The agent's report is on the pod, whose events go to the cluster: they wake the
        // cluster's unfinished backups too.
        Some(crate::reconciler::Wake {
            owner_kind: "DatabaseCluster",
            pick: unfinished_backups_of,
        }),
        client,
        namespace,
        caches,
        settings,
        instance,
        shutdown,
        |backup, ctx| async move { reconcile(backup, &ctx).await },
    )
}

/// The backups of the cluster `owner` that have not finished: what a change of one of the
/// cluster's children (a pod's report above all) may move on (pure over the store).
pub fn unfinished_backups_of(
    store: &kube::runtime::reflector::Store<DatabaseBackup>,
    owner: &crate::children::caches::OwnerKey,
) -> Vec<kube::runtime::reflector::ObjectRef<DatabaseBackup>> {
    store
        .state()
        .iter()
        .filter(|backup| {
            backup.metadata.namespace.as_deref() == Some(owner.namespace.as_str())
                && backup.spec.cluster.name == owner.name.as_str()
                && !backup
                    .status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .is_some_and(BackupPhase::is_final)
        })
        .map(|backup| kube::runtime::reflector::ObjectRef::from_obj(backup.as_ref()))
        .collect()
}

/// The backup's directory name in the store: sortable by time.
pub fn backup_id(name: &str, at: &k8s_openapi::jiff::Timestamp) -> String {
    format!("{}-{name}", at.strftime("%Y%m%dT%H%M%SZ"))
}

fn request_of(pod: &Pod) -> Option<BackupRequest> {
    serde_json::from_str(pod.annotations().get(BACKUP_REQUEST_ANNOTATION)?).ok()
}

/// The pod that already holds a request of the backup `uid`, and that request (pure).
fn requested_on(pods: &[&Pod], uid: &str) -> Option<(String, BackupRequest)> {
    pods.iter().find_map(|pod| {
        request_of(pod)
            .filter(|r| r.uid == uid)
            .map(|r| (pod.name_any(), r))
    })
}

/// Whether `pod` reports a backup other than `uid` still running: its agent takes the next
/// one once that one ends (pure).
fn busy_with_another(pod: Option<&Pod>, uid: &str) -> bool {
    pod.and_then(report_of)
        .and_then(|r| r.backup)
        .is_some_and(|b| b.uid != uid && b.phase == "Running")
}

fn report_of(pod: &Pod) -> Option<InstanceStatus> {
    InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())
}

/// The instance that takes the backup: a ready, streaming replica (the least behind, then the
/// highest ordinal) unless `primary` is asked or none streams (pure).
pub fn choose_instance(
    pods: &[&Pod],
    primary: &str,
    target: Option<BackupTarget>,
    engine: Engine,
) -> Option<String> {
    let ready_primary = pods.iter().find(|p| {
        p.name_any() == primary
            && report_of(p).is_some_and(|r| r.ready && r.role.as_deref() == Some(ROLE_PRIMARY))
    });
    if target == Some(BackupTarget::Primary) || engine == Engine::Mysql {
        return ready_primary.map(|p| p.name_any());
    }
    let replica = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.name_any(), report_of(p)?)))
        .filter(|(_, r)| r.ready && r.role.as_deref() == Some(ROLE_REPLICA))
        .min_by_key(|(name, r)| {
            (
                r.lag_bytes.unwrap_or(i64::MAX),
                std::cmp::Reverse(crate::database_cluster::instances::ordinal(name)),
            )
        })
        .map(|(name, _)| name);
    replica.or_else(|| ready_primary.map(|p| p.name_any()))
}

fn conditions_for(phase: BackupPhase, message: &str) -> Vec<Desired> {
    let (status, reason) = match phase {
        BackupPhase::Completed => (TRUE, "Completed"),
        BackupPhase::Failed => (FALSE, "Failed"),
        BackupPhase::Running => (FALSE, "Running"),
        BackupPhase::Pending => (FALSE, "Pending"),
    };
    // kstatus's abnormal-true pair, so GitOps tools and `kubectl wait` tell a backup under way
    // (InProgress) from a failed one (Failed: it is never retried, a new backup is needed).
    let (reconciling, stalled) = match phase {
        BackupPhase::Completed => (
            Desired::new(RECONCILING, FALSE, reason, "the backup is complete"),
            Desired::new(STALLED, FALSE, "AsExpected", "nothing blocks progress"),
        ),
        BackupPhase::Failed => (
            Desired::new(
                RECONCILING,
                FALSE,
                "Stalled",
                "the backup failed and is not retried (see Stalled)",
            ),
            Desired::new(STALLED, TRUE, reason, message.to_string()),
        ),
        BackupPhase::Running | BackupPhase::Pending => (
            Desired::new(RECONCILING, TRUE, reason, message.to_string()),
            Desired::new(STALLED, FALSE, "AsExpected", "nothing blocks progress"),
        ),
    };
    vec![
        Desired::new(READY, status, reason, message.to_string()),
        reconciling,
        stalled,
    ]
}

async fn write(
    ctx: &Context,
    backup: &DatabaseBackup,
    mut status: DatabaseBackupStatus,
    message: &str,
) -> Result<()> {
    let phase = status.phase.unwrap_or(BackupPhase::Pending);
    let previous = backup.status.clone().unwrap_or_default();
    status.observed_generation = backup.metadata.generation;
    status.conditions = conditions::merge(
        &previous.conditions,
        &conditions_for(phase, message),
        backup.metadata.generation,
        &now(),
    );
    if Some(&status) == backup.status.as_ref() {
        return Ok(());
    }
    write_status(ctx, backup, json!(status)).await
}

/// Why a pod's backup report cannot be taken in (values from pods are untrusted: the
/// operator deletes files under the prefix it records). The prefix must be the one the
/// operator recorded — the cluster's, or that plus a digits-only system identifier — and WAL
/// names 24-hex segment names (pure).
pub fn invalid_report(recorded_prefix: &str, report: &BackupReport) -> Option<String> {
    if let Some(prefix) = &report.prefix {
        let ok = prefix == recorded_prefix
            || prefix
                .strip_prefix(recorded_prefix)
                .and_then(|rest| rest.strip_suffix('/'))
                .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()));
        if !ok {
            return Some(format!(
                "the instance reported the prefix {prefix:?}, which is not under the cluster's {recorded_prefix:?} (<prefix><system identifier>/)"
            ));
        }
    }
    for (field, wal) in [("beginWAL", &report.begin_wal), ("endWAL", &report.end_wal)] {
        if let Some(name) = wal
            && !(name.len() == 24 && name.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Some(format!(
                "the instance reported {field} {name:?}, which is not a WAL segment name (24 hexadecimal digits)"
            ));
        }
    }
    None
}

fn copy_report(status: &mut DatabaseBackupStatus, report: &BackupReport) {
    status.started_at = report.started_at.clone().or(status.started_at.take());
    status.stopped_at = report.stopped_at.clone();
    status.engine = report.engine.clone();
    status.version = report.version.clone();
    status.size = report.size;
    status.object_path = report.object_path.clone();
    if report.prefix.is_some() {
        status.prefix = report.prefix.clone();
    }
    status.begin_lsn = report.begin_lsn.clone();
    status.end_lsn = report.end_lsn.clone();
    status.timeline = report.timeline;
    status.begin_wal = report.begin_wal.clone();
    status.end_wal = report.end_wal.clone();
}

/// The label `db.devctl.io/cluster-uid` on a backup that does not carry it yet (one a user
/// or an older CLI created): `kubectl get dbb -l` finds a cluster's backups by it.
async fn label_cluster_uid(ctx: &Context, backup: &DatabaseBackup, uid: &str) -> Result<()> {
    use crate::database_cluster::backup_lifecycle::CLUSTER_UID_LABEL;
    if backup.labels().get(CLUSTER_UID_LABEL).map(String::as_str) == Some(uid) {
        return Ok(());
    }
    let api: Api<DatabaseBackup> =
        Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
    let patch = json!({ "metadata": { "labels": { CLUSTER_UID_LABEL: uid } } });
    api.patch(
        &backup.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::Child {
        action: "label",
        kind: "DatabaseBackup",
        name: backup.name_any(),
        source,
    })
}

async fn set_request(api: &Api<Pod>, pod: &str, request: Option<&BackupRequest>) -> Result<()> {
    let value = request.and_then(|r| serde_json::to_string(r).ok());
    let patch = json!({ "metadata": { "annotations": { BACKUP_REQUEST_ANNOTATION: value } } });
    match api
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Child {
            action: "annotate",
            kind: "Pod",
            name: pod.to_string(),
            source,
        }),
    }
}

async fn fail(
    ctx: &Context,
    backup: &DatabaseBackup,
    mut status: DatabaseBackupStatus,
    why: String,
) -> Result<Action> {
    status.phase = Some(BackupPhase::Failed);
    status.message = Some(why.clone());
    status.stopped_at = status.stopped_at.or_else(|| Some(now().0.to_string()));
    write(ctx, backup, status, &why).await?;
    publish(
        ctx,
        backup,
        EventType::Warning,
        "BackupFailed",
        "Backup",
        why,
    )
    .await;
    Ok(Action::await_change())
}

async fn reconcile(backup: Arc<DatabaseBackup>, ctx: &Context) -> Result<Action> {
    let namespace = backup
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let uid = backup.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let status = backup.status.clone().unwrap_or_default();
    if status.phase.is_some_and(BackupPhase::is_final) {
        return Ok(Action::await_change());
    }
    let dbs: Api<DatabaseCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let cluster_name = &backup.spec.cluster.name;
    let Some(cluster) = dbs.get_opt(cluster_name).await? else {
        return fail(
            ctx,
            &backup,
            status,
            format!("spec.cluster.name: DatabaseCluster {cluster_name} not found"),
        )
        .await;
    };
    let names = Names::of(&cluster)?;
    let cached = cluster_pods(ctx, &names);
    let run = Run {
        ctx,
        backup: &backup,
        uid,
        name: backup.name_any(),
        cluster: &cluster,
        names,
        pods: cached.iter().map(|p| p.as_ref()).collect(),
        pods_api: Api::namespaced(ctx.client.clone(), &namespace),
        backups: Api::namespaced(ctx.client.clone(), &namespace),
    };
    match status.instance.clone() {
        Some(instance) => run.follow(status, instance).await,
        None => run.start(status).await,
    }
}

/// One reconcile of one backup: what its steps read.
struct Run<'a> {
    ctx: &'a Context,
    backup: &'a DatabaseBackup,
    uid: String,
    name: String,
    cluster: &'a DatabaseCluster,
    names: Names,
    /// The cluster's pods, from the cache.
    pods: Vec<&'a Pod>,
    pods_api: Api<Pod>,
    backups: Api<DatabaseBackup>,
}

impl Run<'_> {
    fn cluster_name(&self) -> &str {
        &self.backup.spec.cluster.name
    }

    async fn fail(&self, status: DatabaseBackupStatus, why: String) -> Result<Action> {
        fail(self.ctx, self.backup, status, why).await
    }

    /// Under way: follow the agent's report.
    async fn follow(&self, mut status: DatabaseBackupStatus, instance: String) -> Result<Action> {
        let pod = self.pods.iter().find(|p| p.name_any() == instance).copied();
        // A report of another request (an older one of this backup's name, or a stale one
        // left on the pod) is not this backup's.
        let report = pod
            .and_then(report_of)
            .and_then(|r| r.backup)
            .filter(|b| b.uid == self.uid && Some(&b.backup_id) == status.backup_id.as_ref());
        if let Some(why) = report
            .as_ref()
            .and_then(|r| invalid_report(status.prefix.as_deref().unwrap_or_default(), r))
        {
            set_request(&self.pods_api, &instance, None).await?;
            publish(
                self.ctx,
                self.backup,
                EventType::Warning,
                "InvalidBackupReport",
                "Backup",
                format!("{instance}: {why}; nothing is deleted or recorded from it"),
            )
            .await;
            return self
                .fail(status, format!("invalid report from {instance}: {why}"))
                .await;
        }
        match report {
            Some(report) if report.phase == "Completed" || report.phase == "Failed" => {
                self.finished(status, &report, &instance).await
            }
            Some(report) => {
                copy_report(&mut status, &report);
                self.running(status, &instance).await
            }
            None => self.unreported(status, &instance, pod).await,
        }
    }

    /// The agent reports the backup finished: record it, drop the request.
    async fn finished(
        &self,
        mut status: DatabaseBackupStatus,
        report: &BackupReport,
        instance: &str,
    ) -> Result<Action> {
        copy_report(&mut status, report);
        set_request(&self.pods_api, instance, None).await?;
        if report.phase == "Failed" {
            let why = report
                .error
                .clone()
                .unwrap_or_else(|| "the agent gave no reason".into());
            return self.fail(status, why).await;
        }
        status.phase = Some(BackupPhase::Completed);
        status.message = None;
        let size = status.size.unwrap_or(0);
        write(
            self.ctx,
            self.backup,
            status.clone(),
            "the backup is stored and restorable",
        )
        .await?;
        publish(
            self.ctx,
            self.backup,
            EventType::Normal,
            "BackupCompleted",
            "Backup",
            format!(
                "Backup {} of {} completed on {instance}: {size} bytes at {}",
                status.backup_id.as_deref().unwrap_or_default(),
                self.cluster_name(),
                status.object_path.as_deref().unwrap_or_default()
            ),
        )
        .await;
        Ok(Action::await_change())
    }

    /// Asked of `instance`, whose report does not show it (yet).
    async fn unreported(
        &self,
        status: DatabaseBackupStatus,
        instance: &str,
        pod: Option<&Pod>,
    ) -> Result<Action> {
        let requested = pod.and_then(request_of).is_some_and(|r| r.uid == self.uid);
        if pod.is_none() || !requested {
            // The cache may not show yet the request written a moment ago: the API server
            // says whether the pod (still) holds it.
            let live = self.pods_api.get_opt(instance).await?;
            if live
                .as_ref()
                .and_then(request_of)
                .is_some_and(|r| r.uid == self.uid)
            {
                return Ok(Action::requeue(RUNNING_RECHECK));
            }
            return self
                .fail(
                    status,
                    format!("the instance {instance} was replaced or restarted before it finished the backup"),
                )
                .await;
        }
        // Never reported (no report was ever copied) and the instance is not busy with
        // another backup it was asked for before (it finishes that one first).
        if status.engine.is_none()
            && !busy_with_another(pod, &self.uid)
            && never_started(
                status.started_at.as_deref(),
                &k8s_openapi::jiff::Timestamp::now(),
            )
        {
            set_request(&self.pods_api, instance, None).await?;
            return self
                .fail(
                    status,
                    format!(
                        "the instance {instance} did not start the backup within {} minutes (see its log)",
                        START_LIMIT.as_secs() / 60
                    ),
                )
                .await;
        }
        Ok(Action::requeue(RUNNING_RECHECK))
    }

    /// Failing before it starts: a request of this backup already on a pod (a reconcile
    /// that read the backup behind its own writes) goes too, or it would hold later
    /// backups up.
    async fn fail_unstarted(&self, status: DatabaseBackupStatus, why: String) -> Result<Action> {
        if let Some((pod, _)) = requested_on(&self.pods, &self.uid) {
            set_request(&self.pods_api, &pod, None).await?;
        }
        self.fail(status, why).await
    }

    /// Not started: made for this cluster (not an earlier one of its name), a destination,
    /// no other backup of the cluster under way, an instance.
    async fn start(&self, mut status: DatabaseBackupStatus) -> Result<Action> {
        let cluster_name = self.cluster_name();
        let cluster_uid = self.cluster.uid().unwrap_or_default();
        if let Some(recorded) =
            crate::database_cluster::backup_lifecycle::recorded_cluster_uid(self.backup)
            && recorded != cluster_uid
        {
            let why = format!(
                "made for an earlier DatabaseCluster {cluster_name} (uid {recorded}), not the one that exists now (uid {cluster_uid})"
            );
            return self.fail_unstarted(status, why).await;
        }
        let store = match backup::destination(self.ctx, self.cluster, &self.names).await {
            Ok(Some(store)) => store,
            Ok(None) => {
                let why =
                    format!("backups of {cluster_name} are disabled (spec.backup.enabled: false)");
                return self.fail_unstarted(status, why).await;
            }
            Err(why) => return self.fail_unstarted(status, why).await,
        };
        // Already asked of an instance: this reconcile read the backup before its own
        // status write reached the cache. The request on the pod is the attempt under way;
        // a second one under another id would never be reported (the agent runs a
        // backup's uid once).
        let started = k8s_openapi::jiff::Timestamp::now();
        let (instance, request, asked_now) = match requested_on(&self.pods, &self.uid) {
            Some((instance, request)) => (instance, request, false),
            None => {
                if let Some(waiting) = self.wait_for_another(&mut status).await? {
                    return Ok(waiting);
                }
                let Some(instance) = self.instance() else {
                    return self.pending(status).await;
                };
                // Named by the backup's creation, not by this reconcile: a reconcile that
                // reads the backup from a cache behind both writes asks again under the
                // same id, which the agent's report then matches.
                let named_at = self
                    .backup
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(started, |t| t.0);
                let request = BackupRequest {
                    name: self.name.clone(),
                    uid: self.uid.clone(),
                    backup_id: backup_id(&self.name, &named_at),
                };
                label_cluster_uid(self.ctx, self.backup, &cluster_uid).await?;
                set_request(&self.pods_api, &instance, Some(&request)).await?;
                (instance, request, true)
            }
        };
        status.phase = Some(BackupPhase::Running);
        status.cluster_uid = Some(cluster_uid.clone());
        status.instance = Some(instance.clone());
        status.backup_id = Some(request.backup_id.clone());
        status.started_at = Some(started.to_string());
        status.endpoint = Some(store.location.endpoint.clone());
        status.bucket = Some(store.location.bucket.clone());
        status.region = Some(store.location.region.clone());
        status.prefix = Some(store.location.prefix.clone());
        let declared = self
            .cluster
            .spec
            .backup
            .as_ref()
            .and_then(|b| b.destination.as_ref());
        status.credentials_secret = declared.map(|d| d.credentials_secret.clone());
        status.ca_secret = declared.and_then(|d| d.ca_secret.clone());
        let action = self.running(status, &instance).await?;
        if asked_now {
            publish(
                self.ctx,
                self.backup,
                EventType::Normal,
                "BackupStarted",
                "Backup",
                format!(
                    "Backing up {cluster_name} on {instance} as {}",
                    request.backup_id
                ),
            )
            .await;
        }
        Ok(action)
    }

    /// Records the backup running on `instance`; looks again shortly.
    async fn running(&self, status: DatabaseBackupStatus, instance: &str) -> Result<Action> {
        write(
            self.ctx,
            self.backup,
            status,
            &format!("running on {instance}"),
        )
        .await?;
        Ok(Action::requeue(RUNNING_RECHECK))
    }

    /// Another backup of the cluster is under way on one of its pods: wait (Pending). A
    /// request whose backup is gone or finished is stale and dropped.
    async fn wait_for_another(&self, status: &mut DatabaseBackupStatus) -> Result<Option<Action>> {
        for pod in &self.pods {
            let Some(other) = request_of(pod).filter(|r| r.uid != self.uid) else {
                continue;
            };
            match self.backups.get_opt(&other.name).await? {
                Some(b)
                    if b.uid().as_deref() == Some(other.uid.as_str())
                        && !b
                            .status
                            .as_ref()
                            .and_then(|s| s.phase)
                            .is_some_and(BackupPhase::is_final) =>
                {
                    status.phase = Some(BackupPhase::Pending);
                    let message = format!(
                        "waiting for backup {} of {} to finish",
                        other.name,
                        self.cluster_name()
                    );
                    write(self.ctx, self.backup, status.clone(), &message).await?;
                    return Ok(Some(Action::requeue(PENDING_RECHECK)));
                }
                _ => set_request(&self.pods_api, &pod.name_any(), None).await?,
            }
        }
        Ok(None)
    }

    /// The instance to take the backup ([`choose_instance`]).
    fn instance(&self) -> Option<String> {
        let primary = self
            .cluster
            .status
            .as_ref()
            .and_then(|s| s.current_primary.clone())
            .unwrap_or_else(|| format!("{}-0", self.names.stateful_set()));
        choose_instance(
            &self.pods,
            &primary,
            self.backup.spec.target,
            self.cluster.spec.engine,
        )
    }

    /// No instance can take it now. Not forever: a backup that never starts holds the
    /// cluster's WAL pruning up. It waits for an instance since it was made, or since the
    /// cluster's last backup ended (one that queued behind another is not blamed for that
    /// one's time).
    async fn pending(&self, mut status: DatabaseBackupStatus) -> Result<Action> {
        let cluster_name = self.cluster_name();
        let others = self.backups.list(&kube::api::ListParams::default()).await?;
        let last_ended = others
            .items
            .iter()
            .filter(|b| b.spec.cluster.name == cluster_name && b.uid() != Some(self.uid.clone()))
            .filter_map(|b| {
                b.status
                    .as_ref()?
                    .stopped_at
                    .as_deref()?
                    .parse::<k8s_openapi::jiff::Timestamp>()
                    .ok()
            })
            .max()
            .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time);
        let since = [self.backup.metadata.creation_timestamp.clone(), last_ended]
            .into_iter()
            .flatten()
            .max_by_key(|t| t.0);
        if pending_too_long(since.as_ref(), &now()) {
            let why = format!(
                "no ready instance of {cluster_name} could take the backup within {} minutes",
                PENDING_LIMIT.as_secs() / 60
            );
            return self.fail(status, why).await;
        }
        status.phase = Some(BackupPhase::Pending);
        write(
            self.ctx,
            self.backup,
            status,
            &format!("waiting for a ready instance of {cluster_name}"),
        )
        .await?;
        Ok(Action::requeue(PENDING_RECHECK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change of a cluster's child wakes that cluster's unfinished backups, and only those.
    #[test]
    fn a_clusters_child_events_wake_its_unfinished_backups() {
        let (store, mut writer) = kube::runtime::reflector::store::<DatabaseBackup>();
        let mut backup = |name: &str, namespace: &str, cluster: &str, phase: Option<&str>| {
            let backup: DatabaseBackup = serde_json::from_value(serde_json::json!({
                "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseBackup",
                "metadata": { "name": name, "namespace": namespace },
                "spec": { "cluster": { "name": cluster } },
                "status": phase.map(|p| serde_json::json!({ "phase": p })),
            }))
            .unwrap();
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(backup));
        };
        backup("running", "ns", "db", Some("Running"));
        backup("pending", "ns", "db", Some("Pending"));
        backup("new", "ns", "db", None);
        backup("done", "ns", "db", Some("Completed"));
        backup("failed", "ns", "db", Some("Failed"));
        backup("other-cluster", "ns", "shop", Some("Running"));
        backup("other-namespace", "elsewhere", "db", Some("Running"));
        let owner = crate::children::caches::OwnerKey {
            kind: "DatabaseCluster".into(),
            namespace: "ns".into(),
            name: "db".into(),
        };
        let mut woken: Vec<String> = unfinished_backups_of(&store, &owner)
            .into_iter()
            .map(|r| r.name)
            .collect();
        woken.sort();
        assert_eq!(woken, ["new", "pending", "running"]);
    }

    #[test]
    fn a_backup_already_requested_on_a_pod_is_adopted_under_the_same_id() {
        // A reconcile that reads the backup before its own status write reached the cache
        // finds the request on the pod: the same attempt, never a second id.
        let pod = |name: &str, request: Option<&BackupRequest>| -> Pod {
            let mut annotations = std::collections::BTreeMap::new();
            if let Some(r) = request {
                annotations.insert(
                    BACKUP_REQUEST_ANNOTATION.to_string(),
                    serde_json::to_string(r).unwrap(),
                );
            }
            Pod {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.into()),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                ..Default::default()
            }
        };
        let at = k8s_openapi::jiff::Timestamp::from_second(1_765_000_001).unwrap();
        let mine = BackupRequest {
            name: "db-1".into(),
            uid: "u1".into(),
            backup_id: backup_id("db-1", &at),
        };
        let other = BackupRequest {
            uid: "u0".into(),
            ..mine.clone()
        };
        let pods = [
            pod("db-0", Some(&other)),
            pod("db-1", Some(&mine)),
            pod("db-2", None),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let (instance, request) = requested_on(&refs, "u1").unwrap();
        assert_eq!((instance.as_str(), request), ("db-1", mine.clone()));
        assert_eq!(requested_on(&refs, "u9"), None);
        // An instance busy with an earlier backup is not blamed for not starting this one.
        let mut busy = pod("db-1", Some(&mine));
        let report = serde_json::json!({ "ready": true,
            "backup": { "name": "db-0", "uid": "u0", "backupId": "x", "phase": "Running" } });
        busy.metadata.annotations.as_mut().unwrap().insert(
            devctl_api::instance::STATUS_ANNOTATION.to_string(),
            report.to_string(),
        );
        assert!(busy_with_another(Some(&busy), "u1"));
        assert!(!busy_with_another(Some(&busy), "u0"));
        assert!(!busy_with_another(Some(&pods[2]), "u1"));
    }

    #[test]
    fn a_backup_its_instance_never_reports_fails_after_three_minutes() {
        use k8s_openapi::jiff::Timestamp;
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let started = at(0).to_string();
        assert!(!never_started(Some(&started), &at(180)));
        assert!(never_started(Some(&started), &at(181)));
        assert!(!never_started(None, &at(181)));
        assert!(!never_started(Some("yesterday"), &at(181)));
    }

    #[test]
    fn a_backup_no_instance_takes_fails_after_ten_minutes() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use k8s_openapi::jiff::Timestamp;
        let at = |s: i64| Time(Timestamp::from_second(s).unwrap());
        assert!(!pending_too_long(Some(&at(0)), &at(600)));
        assert!(pending_too_long(Some(&at(0)), &at(601)));
        assert!(!pending_too_long(None, &at(601)));
    }

    #[test]
    fn a_report_must_stay_under_the_recorded_prefix_with_segment_names() {
        let report = |prefix: &str, begin: &str| BackupReport {
            prefix: Some(prefix.into()),
            begin_wal: Some(begin.into()),
            end_wal: Some("000000010000000000000004".into()),
            ..BackupReport::default()
        };
        let segment = "000000010000000000000003";
        let recorded = "devctl/ns/db/";
        assert_eq!(
            invalid_report(
                recorded,
                &report("devctl/ns/db/7400000000000000001/", segment)
            ),
            None
        );
        // Once recorded with its system identifier: exactly that.
        assert_eq!(
            invalid_report(
                "devctl/ns/db/7400000000000000001/",
                &report("devctl/ns/db/7400000000000000001/", segment)
            ),
            None
        );
        for forged in [
            "devctl/ns/other/7400000000000000001/",
            "devctl/ns/db/../other/",
            "devctl/ns/db/74x/",
            "devctl/ns/db//",
            "devctl/ns/db/7400000000000000001/base/",
            "devctl/ns/",
        ] {
            assert!(
                invalid_report(recorded, &report(forged, segment)).is_some(),
                "{forged}"
            );
        }
        assert!(
            invalid_report(
                "devctl/ns/db/7400000000000000001/",
                &report("devctl/ns/db/7400000000000000002/", segment)
            )
            .is_some()
        );
        let why = invalid_report(recorded, &report("devctl/ns/db/7/", "../x")).unwrap();
        assert!(why.contains("beginWAL") && why.contains("../x"), "{why}");
    }

    fn pod(name: &str, role: &str, ready: bool, lag: i64) -> Pod {
        let report = InstanceStatus {
            role: Some(role.into()),
            ready,
            lag_bytes: Some(lag),
            ..Default::default()
        };
        serde_json::from_value(json!({
            "metadata": { "name": name, "annotations": {
                devctl_api::instance::STATUS_ANNOTATION: serde_json::to_string(&report).unwrap()
            } }
        }))
        .unwrap()
    }

    #[test]
    fn kstatus_reads_a_backup_under_way_as_in_progress_and_a_failed_one_as_failed() {
        let of = |phase| {
            let conditions = conditions_for(phase, "the store refused: AccessDenied");
            let find = |t: &str| {
                let c = conditions.iter().find(|c| c.type_ == t).unwrap();
                (c.status, c.reason.clone())
            };
            (find(READY), find(RECONCILING), find(STALLED))
        };
        let (ready, reconciling, stalled) = of(BackupPhase::Running);
        assert_eq!((ready.0, reconciling.0, stalled.0), (FALSE, TRUE, FALSE));
        assert_eq!(reconciling.1, "Running");
        let (ready, reconciling, stalled) = of(BackupPhase::Failed);
        assert_eq!((ready.0, reconciling.0, stalled.0), (FALSE, FALSE, TRUE));
        assert_eq!(stalled.1, "Failed");
        let failed = conditions_for(BackupPhase::Failed, "the store refused: AccessDenied");
        assert!(
            failed
                .iter()
                .any(|c| c.type_ == STALLED && c.message.contains("AccessDenied"))
        );
        let (ready, reconciling, stalled) = of(BackupPhase::Completed);
        assert_eq!((ready.0, reconciling.0, stalled.0), (TRUE, FALSE, FALSE));
    }

    #[test]
    fn a_streaming_replica_takes_the_backup_unless_the_primary_is_asked() {
        let pods = [
            pod("db-0", "primary", true, 0),
            pod("db-1", "replica", true, 100),
            pod("db-2", "replica", true, 10),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(
            choose_instance(&refs, "db-0", None, Engine::Postgres).as_deref(),
            Some("db-2")
        );
        assert_eq!(
            choose_instance(&refs, "db-0", Some(BackupTarget::Primary), Engine::Postgres)
                .as_deref(),
            Some("db-0")
        );
        let alone = [
            pod("db-0", "primary", true, 0),
            pod("db-1", "replica", false, 0),
        ];
        let refs: Vec<&Pod> = alone.iter().collect();
        assert_eq!(
            choose_instance(&refs, "db-0", None, Engine::Postgres).as_deref(),
            Some("db-0")
        );
    }

    #[test]
    fn backup_ids_sort_by_time() {
        let a: k8s_openapi::jiff::Timestamp = "2026-11-30T09:05:00Z".parse().unwrap();
        let b: k8s_openapi::jiff::Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        assert_eq!(backup_id("x", &a), "20261130T090500Z-x");
        assert!(backup_id("z", &a) < backup_id("a", &b));
    }
}
