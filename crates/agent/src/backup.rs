//! Backups and restores on the agent's side (docs/backup.md): the agent's own pod watched
//! for the operator's annotations, the store Secrets, the state the WAL socket, the backup
//! task and the main loop share, taking a backup and restoring one.
//!
//! Everything runs on the agent's single runtime thread; the shared state sits behind
//! `std::sync::Mutex`es that are never held across an `.await`.

use std::collections::{BTreeSet, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use devctl_api::instance::{
    BACKUP_DESTINATION_ANNOTATION, BACKUP_REQUEST_ANNOTATION, BACKUP_STORE_SECRET_SUFFIX,
    BackupReport, BackupRequest, InstanceStatus, RESTORE_ANNOTATION, RESTORE_STORE_SECRET_SUFFIX,
    RestoreRequest, StoreLocation, WalArchiveReport,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::core::DynamicObject;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Notify, watch};

use crate::agent::{SecretView, watch_secret};
use crate::cluster::{database_cluster_resource, watch_error_is_forbidden};
use crate::config::{Config, EngineKind};
use crate::engine::{AUTO_CONF, Engine, RECOVERY_SIGNAL, STANDBY_SIGNAL, with_recovery_settings};
use crate::error::one_line;
use crate::process;
use crate::report::now_rfc3339;
use crate::store::{Store, StoreCredentials, StoreError, normalise_location};
use crate::wal::{
    BaseBackupProgress, DEFAULT_SEGMENT_SIZE, MANIFEST, Manifest, Owner, TarEvent, TarStream,
    TarWatcher, base_prefix, data_object, format_lsn, is_backup_id, owner_key, parse_backup_label,
    parse_lsn, parse_manifest_wal_ranges, postgres_target_time, previous_segment_name,
    safe_relative_path, segment_name, segment_range, system_prefix,
};

/// Backup phases ([`BackupReport::phase`]).
pub const RUNNING: &str = "Running";
pub const COMPLETED: &str = "Completed";
pub const FAILED: &str = "Failed";

/// How long a request for the store waits for the Secret watch's first list.
const SECRET_WAIT: Duration = Duration::from_secs(10);
/// How long a backup waits for its WAL to reach the archive (the primary archives a
/// segment at the latest `archive_timeout` after it has data).
const WAL_WAIT: Duration = Duration::from_secs(600);
const WAL_POLL: Duration = Duration::from_secs(2);
/// Marker of a MySQL-family data directory into which the restore's dump was replayed.
pub const MYSQL_RESTORED: &str = ".devctl-restored";

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The operator's annotations on the agent's own pod (raw; parsed where used).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodView {
    /// The initial list completed.
    pub listed: bool,
    pub destination: Option<String>,
    pub backup_request: Option<String>,
    pub restore: Option<String>,
    /// The last watch error since the last successful event.
    pub error: Option<String>,
}

/// Why WAL is not archived yet on a pod the operator has not annotated.
pub const NOT_ANNOTATED: &str = "the operator has not said where backups go yet (no annotation db.devctl.io/backup-destination); keeping the WAL";

impl PodView {
    fn of(pod: Option<&Pod>) -> Self {
        let annotations = pod.and_then(|p| p.metadata.annotations.as_ref());
        let get = |key: &str| {
            annotations
                .and_then(|a| a.get(key))
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        PodView {
            listed: true,
            destination: get(BACKUP_DESTINATION_ANNOTATION),
            backup_request: get(BACKUP_REQUEST_ANNOTATION),
            restore: get(RESTORE_ANNOTATION),
            error: None,
        }
    }

    /// Where backups and WAL go: `None` while backups are off; an error ([`NOT_ANNOTATED`])
    /// until the operator has said.
    pub fn destination(&self) -> Result<Option<StoreLocation>, String> {
        let Some(raw) = &self.destination else {
            return Err(NOT_ANNOTATED.to_string());
        };
        if raw == devctl_api::instance::BACKUP_DESTINATION_OFF {
            return Ok(None);
        }
        let location: StoreLocation = serde_json::from_str(raw).map_err(|e| {
            format!("annotation {BACKUP_DESTINATION_ANNOTATION} is not valid JSON: {e}")
        })?;
        normalise_location(location)
            .map(Some)
            .map_err(|e| format!("annotation {BACKUP_DESTINATION_ANNOTATION}: {e}"))
    }

    pub fn backup_request(&self) -> Option<Result<BackupRequest, String>> {
        let raw = self.backup_request.as_ref()?;
        Some(
            serde_json::from_str::<BackupRequest>(raw)
                .map_err(|e| format!("annotation {BACKUP_REQUEST_ANNOTATION} is not valid: {e}"))
                .and_then(|r| {
                    if r.uid.is_empty() || r.name.is_empty() {
                        Err(format!(
                            "annotation {BACKUP_REQUEST_ANNOTATION} lacks name or uid"
                        ))
                    } else {
                        Ok(r)
                    }
                }),
        )
    }

    pub fn restore(&self) -> Option<Result<RestoreRequest, String>> {
        let raw = self.restore.as_ref()?;
        Some(
            serde_json::from_str::<RestoreRequest>(raw)
                .map_err(|e| format!("annotation {RESTORE_ANNOTATION} is not valid: {e}"))
                .and_then(|mut r| {
                    r.location = normalise_location(r.location)
                        .map_err(|e| format!("annotation {RESTORE_ANNOTATION}: {e}"))?;
                    if !is_backup_id(&r.backup_id) {
                        return Err(format!(
                            "annotation {RESTORE_ANNOTATION}: backupId {:?} is not valid",
                            r.backup_id
                        ));
                    }
                    if let Some(time) = &r.target_time {
                        postgres_target_time(time).map_err(|e| {
                            format!("annotation {RESTORE_ANNOTATION}: targetTime {e}")
                        })?;
                    }
                    Ok(r)
                }),
        )
    }
}

/// Watches the agent's own pod (field selector on its name, like the other watches) for
/// the operator's annotations. The agent's own reports change the pod too: only changes of
/// the annotations read here wake the receiver.
pub fn watch_pod(client: kube::Client, namespace: &str, name: &str) -> watch::Receiver<PodView> {
    let (tx, rx) = watch::channel(PodView::default());
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let fields = format!("metadata.name={name}");
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default().fields(&fields))
            .default_backoff()
            .boxed();
        let mut buffer = None;
        let mut last_error = None;
        while let Some(event) = stream.next().await {
            let view = match event {
                Ok(watcher::Event::Init) => {
                    buffer = None;
                    continue;
                }
                Ok(watcher::Event::InitApply(p)) => {
                    buffer = Some(p);
                    continue;
                }
                Ok(watcher::Event::InitDone) => PodView::of(buffer.take().as_ref()),
                Ok(watcher::Event::Apply(p)) => PodView::of(Some(&p)),
                Ok(watcher::Event::Delete(_)) => PodView::of(None),
                Err(e) => {
                    let message = one_line(&e.to_string());
                    if last_error.as_ref() != Some(&message) {
                        let forbidden = watch_error_is_forbidden(&e);
                        tracing::warn!(
                            forbidden,
                            "watching the pod's own annotations: {message} (falling back to reading the pod when needed)"
                        );
                    }
                    last_error = Some(message.clone());
                    tx.send_if_modified(|v| {
                        let changed = v.error.as_ref() != Some(&message);
                        v.error = Some(message);
                        changed
                    });
                    continue;
                }
            };
            last_error = None;
            tx.send_if_modified(|v| {
                let changed = *v != view;
                if changed {
                    *v = view;
                }
                changed
            });
        }
    });
    rx
}

/// What the WAL socket, the backup task and the main loop share.
pub struct Shared {
    pub config: Config,
    pub engine: Engine,
    client: kube::Client,
    pods: Api<Pod>,
    pub pod: watch::Receiver<PodView>,
    backup_secret: Mutex<Option<watch::Receiver<SecretView>>>,
    restore_secret: Mutex<Option<watch::Receiver<SecretView>>>,
    /// Store clients by location and keys (rebuilt when either changes).
    stores: Mutex<Vec<(StoreLocation, StoreCredentials, Arc<Store>)>>,
    system_identifier: Mutex<Option<String>>,
    cluster_uid: Mutex<Option<String>>,
    /// Cluster prefixes (`s3://bucket/prefix`) whose `owner.json` is this cluster's.
    owners: Mutex<BTreeSet<String>>,
    wal_archive: Mutex<Option<WalArchiveReport>>,
    backup: Mutex<Option<BackupReport>>,
    /// A restore found a hole in the archive: this segment is missing although later WAL of
    /// its timeline is there (the restore stops rather than promote short of it).
    restore_hole: Mutex<Option<String>>,
    /// Wakes the main loop to report a backup's progress.
    pub changed: Notify,
    /// The agent runs its engine as a standby and has not decided to promote it: WAL
    /// offered for the archive now comes from an engine promoted behind the agent's back.
    standby_engine: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Says whether the agent runs its engine as a standby it has not decided to promote
    /// (see [`crate::archive`]: such an engine's WAL is kept out of the archive).
    pub fn set_standby_engine(&self, standby: bool) {
        self.standby_engine
            .store(standby, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn standby_engine(&self) -> bool {
        self.standby_engine
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn new(config: Config, engine: Engine, client: kube::Client) -> Self {
        let pod = watch_pod(client.clone(), &config.pod_namespace, &config.pod_name);
        Shared {
            pods: Api::namespaced(client.clone(), &config.pod_namespace),
            pod,
            client,
            config,
            engine,
            backup_secret: Mutex::new(None),
            restore_secret: Mutex::new(None),
            stores: Mutex::new(Vec::new()),
            system_identifier: Mutex::new(None),
            cluster_uid: Mutex::new(None),
            owners: Mutex::new(BTreeSet::new()),
            wal_archive: Mutex::new(None),
            backup: Mutex::new(None),
            restore_hole: Mutex::new(None),
            standby_engine: std::sync::atomic::AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    /// The pod's annotations: the watch's view, or — before it listed (or when watching is
    /// not allowed) — the pod read by name.
    pub async fn pod_view(&self) -> Result<PodView, String> {
        let view = self.pod.borrow().clone();
        if view.listed {
            return Ok(view);
        }
        match self.pods.get_opt(&self.config.pod_name).await {
            Ok(pod) => Ok(PodView::of(pod.as_ref())),
            Err(e) => Err(format!(
                "reading the pod's annotations: {}",
                one_line(&e.to_string())
            )),
        }
    }

    /// The pod's annotations as last seen by the watch (no request).
    pub fn pod_view_now(&self) -> PodView {
        self.pod.borrow().clone()
    }

    /// The last report's `backup`, read from the pod before the first report is written (so
    /// a restarted agent neither forgets nor reruns a finished request).
    pub async fn load_previous_backup(&self) {
        match self.pods.get_opt(&self.config.pod_name).await {
            Ok(Some(pod)) => {
                let previous = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())
                    .and_then(|s| s.backup);
                if let Some(previous) = &previous {
                    tracing::info!(
                        backup = %previous.name,
                        uid = %previous.uid,
                        phase = %previous.phase,
                        "the last report names a backup"
                    );
                }
                let mut slot = lock(&self.backup);
                if slot.is_none() {
                    *slot = previous;
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "reading the last report's backup: {}",
                one_line(&e.to_string())
            ),
        }
    }

    pub fn backup(&self) -> Option<BackupReport> {
        lock(&self.backup).clone()
    }

    /// Why the restore stopped at a hole in the archive, if it did.
    pub fn restore_hole(&self) -> Option<String> {
        lock(&self.restore_hole).clone()
    }

    pub fn clear_restore_hole(&self) {
        lock(&self.restore_hole).take();
    }

    pub fn set_restore_hole(&self, why: String) {
        *lock(&self.restore_hole) = Some(why);
        self.changed.notify_one();
    }

    pub fn set_backup(&self, report: BackupReport) {
        *lock(&self.backup) = Some(report);
        self.changed.notify_one();
    }

    pub fn wal_archive(&self) -> Option<WalArchiveReport> {
        lock(&self.wal_archive).clone()
    }

    /// Records one archiving attempt (`Ok(name)` stored, `Err(message)` failed).
    pub fn record_archive(&self, result: Result<&str, &str>) {
        let mut slot = lock(&self.wal_archive);
        let report = slot.get_or_insert_with(WalArchiveReport::default);
        match result {
            Ok(name) => {
                report.last_archived = Some(name.to_string());
                report.last_archived_at = Some(now_rfc3339());
                report.failing = false;
                report.error = None;
            }
            Err(message) => {
                report.failing = true;
                report.error = Some(message.to_string());
            }
        }
    }

    /// Archiving is off (no destination): nothing to report.
    pub fn clear_archive(&self) {
        *lock(&self.wal_archive) = None;
    }

    pub fn set_system_identifier(&self, id: &str) {
        let mut slot = lock(&self.system_identifier);
        if slot.as_deref() != Some(id) {
            *slot = Some(id.to_string());
        }
    }

    /// The system identifier (from the probe, else `pg_controldata`/the data directory).
    pub async fn system_identifier(&self) -> Result<String, String> {
        if let Some(id) = lock(&self.system_identifier).clone() {
            return Ok(id);
        }
        let id = self.engine.system_identifier().await?;
        self.set_system_identifier(&id);
        Ok(id)
    }

    /// The store credentials of the cluster's (`restore: false`) or the restore source's
    /// Secret, the watch started on first use.
    async fn credentials(&self, restore: bool) -> Result<StoreCredentials, String> {
        let (slot, suffix, what) = if restore {
            (
                &self.restore_secret,
                RESTORE_STORE_SECRET_SUFFIX,
                "restore store",
            )
        } else {
            (
                &self.backup_secret,
                BACKUP_STORE_SECRET_SUFFIX,
                "backup store",
            )
        };
        let name = format!("{}{suffix}", self.config.cluster);
        let mut rx = lock(slot)
            .get_or_insert_with(|| {
                watch_secret(self.client.clone(), &self.config.pod_namespace, &name, what)
            })
            .clone();
        let deadline = tokio::time::Instant::now() + SECRET_WAIT;
        let view = loop {
            let view = rx.borrow_and_update().clone();
            if view.listed || view.error.is_some() {
                break view;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() {
                    return Err(format!("the {what} Secret watch ended"));
                },
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(format!("waiting for the {what} Secret {name}"));
                }
            }
        };
        match (&view.secret, &view.error) {
            (Some(secret), _) => StoreCredentials::from_secret(secret, &name),
            (None, Some((message, _))) => {
                Err(format!("watching the {what} Secret {name}: {message}"))
            }
            (None, None) => Err(format!("the {what} Secret {name} not found")),
        }
    }

    fn client_for(
        &self,
        location: StoreLocation,
        credentials: StoreCredentials,
    ) -> Result<Arc<Store>, String> {
        let mut stores = lock(&self.stores);
        if let Some((_, _, store)) = stores
            .iter()
            .find(|(l, c, _)| *l == location && *c == credentials)
        {
            return Ok(store.clone());
        }
        let store = Arc::new(Store::new(location.clone(), &credentials)?);
        // At most the cluster's store and a restore source's (and their predecessors).
        if stores.len() >= 4 {
            stores.remove(0);
        }
        stores.push((location, credentials, store.clone()));
        Ok(store)
    }

    /// The cluster's store: `None` while the pod has no destination (backups off).
    pub async fn store(&self) -> Result<Option<Arc<Store>>, String> {
        let view = self.pod_view().await?;
        let Some(location) = view.destination()? else {
            return Ok(None);
        };
        let credentials = self.credentials(false).await?;
        self.client_for(location, credentials).map(Some)
    }

    /// The restore source's store and the request (the annotation and the Secret
    /// `<cluster>-restore-store`), or what is missing.
    pub async fn restore_source(&self) -> Result<(Arc<Store>, RestoreRequest), String> {
        let view = self.pod_view().await?;
        let request = match view.restore() {
            None => {
                return Err(format!(
                    "waiting for the annotation {RESTORE_ANNOTATION} (what to restore)"
                ));
            }
            Some(request) => request?,
        };
        let credentials = self.credentials(true).await?;
        let store = self.client_for(request.location.clone(), credentials)?;
        Ok((store, request))
    }

    /// Whether the DatabaseCluster has been ready before ([`crate::cluster::has_run`]); a
    /// cluster that does not exist (yet) has not.
    pub async fn cluster_has_run(&self) -> Result<bool, kube::Error> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.config.pod_namespace,
            &database_cluster_resource(),
        );
        Ok(api
            .get_opt(&self.config.cluster)
            .await?
            .is_some_and(|o| crate::cluster::has_run(&o)))
    }

    /// The DatabaseCluster's uid (read once).
    async fn cluster_uid(&self) -> Result<String, String> {
        if let Some(uid) = lock(&self.cluster_uid).clone() {
            return Ok(uid);
        }
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.config.pod_namespace,
            &database_cluster_resource(),
        );
        let uid = match api.get_opt(&self.config.cluster).await {
            Ok(Some(object)) => object.metadata.uid.filter(|u| !u.is_empty()),
            Ok(None) => None,
            Err(e) => {
                return Err(format!(
                    "reading DatabaseCluster {}: {}",
                    self.config.cluster,
                    one_line(&e.to_string())
                ));
            }
        }
        .ok_or_else(|| format!("DatabaseCluster {} not found", self.config.cluster))?;
        *lock(&self.cluster_uid) = Some(uid.clone());
        Ok(uid)
    }

    /// Makes the next [`Shared::ensure_owner`] for `sysid` in `store` read the store again.
    pub fn forget_owner(&self, store: &Store, sysid: &str) {
        let key = owner_key(&crate::wal::system_prefix(&store.location.prefix, sysid));
        lock(&self.owners).remove(&store.url(&key));
    }

    /// Before the first write under the cluster's prefix: `<prefix><systemIdentifier>/owner.json`
    /// names this cluster's uid (written when absent). The guard is at the system
    /// identifier's level, below `<path>/<namespace>/<name>/`: a cluster recreated under the
    /// same name has a new system identifier, so it writes a location of its own and never
    /// touches its predecessor's files — which an `owner.json` at the name's level (from
    /// before this layout) keeps naming. Another uid at this level is refused: only a cluster
    /// restored under its source's name (same system identifier) gets there.
    pub async fn ensure_owner(&self, store: &Store) -> Result<(), String> {
        let sysid = self.system_identifier().await?;
        let key = owner_key(&crate::wal::system_prefix(&store.location.prefix, &sysid));
        let url = store.url(&key);
        if lock(&self.owners).contains(&url) {
            return Ok(());
        }
        let uid = self.cluster_uid().await?;
        let read_owner = |key: String| async move {
            match store.get(&key).await {
                Ok(bytes) => serde_json::from_slice::<Owner>(&bytes)
                    .map(|o| Some(o.uid))
                    .map_err(|e| {
                        format!("{} is not valid: {e}; refusing to write", store.url(&key))
                    }),
                Err(StoreError::NotFound(_)) => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        };
        let mut recorded = read_owner(key.clone()).await?;
        if recorded.is_none() {
            // Written before owners were kept per system identifier: the name's owner.json
            // speaks for the files already there (a cluster restored under its source's
            // name and system identifier must not claim them).
            let sys_prefix = crate::wal::system_prefix(&store.location.prefix, &sysid);
            if let Some(legacy) = read_owner(owner_key(&store.location.prefix)).await?
                && legacy != uid
                && !store
                    .keys_after(&sys_prefix, &sys_prefix, 1)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_empty()
            {
                recorded = Some(legacy);
            }
        }
        match owner_verdict(recorded.as_deref(), &uid) {
            OwnerVerdict::Ours => {}
            OwnerVerdict::Claim => {
                let body = serde_json::to_vec(&Owner { uid: uid.clone() })
                    .map_err(|e| format!("encoding {url}: {e}"))?;
                store
                    .put(&key, Bytes::from(body))
                    .await
                    .map_err(|e| e.to_string())?;
                tracing::info!(%url, %uid, "wrote the store's owner file");
            }
            OwnerVerdict::Another(other) => {
                return Err(format!(
                    "{url} names another cluster (uid {other}), not this one ({uid}): this cluster has the system identifier {sysid} of one that archived here before — a cluster restored under its source's name and destination; refusing to write there: give it another spec.backup.destination.path (the source's backups and WAL stay for restores)"
                ));
            }
        }
        lock(&self.owners).insert(url);
        Ok(())
    }
}

/// What an `owner.json` at a system identifier's prefix says to the cluster `uid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerVerdict {
    Ours,
    /// None yet: write ours.
    Claim,
    /// Another cluster's.
    Another(String),
}

/// The verdict on the uid `recorded` in `owner.json` (`None`: no file) for cluster `uid`
/// (pure).
pub fn owner_verdict(recorded: Option<&str>, uid: &str) -> OwnerVerdict {
    match recorded {
        None => OwnerVerdict::Claim,
        Some(r) if r == uid => OwnerVerdict::Ours,
        Some(r) => OwnerVerdict::Another(r.to_string()),
    }
}

/// How a replica's backup asks the primary to switch WAL.
#[derive(Clone, Debug)]
pub struct SwitchVia {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub passfile: PathBuf,
}

/// What the main loop knows when it starts a backup.
#[derive(Clone, Debug, Default)]
pub struct BackupContext {
    pub version: Option<String>,
    /// Taken on a standby: its end segment is archived by the primary.
    pub replica: bool,
    pub switch_via: Option<SwitchVia>,
}

/// Whether `request` is to run now, given the last report (a request already finished —
/// same uid — is never rerun, e.g. after an agent restart; one left `Running` by a
/// previous agent process is).
pub fn should_start(request: &BackupRequest, last: Option<&BackupReport>) -> bool {
    match last {
        Some(last) if last.uid == request.uid => last.phase == RUNNING,
        _ => true,
    }
}

/// Takes the backup `request` and reports its progress into `shared` (phase `Running`,
/// then `Completed` or `Failed`).
pub async fn run_backup(shared: Arc<Shared>, request: BackupRequest, context: BackupContext) {
    let mut report = BackupReport {
        name: request.name.clone(),
        uid: request.uid.clone(),
        backup_id: request.backup_id.clone(),
        phase: RUNNING.into(),
        started_at: Some(now_rfc3339()),
        engine: Some(shared.config.engine.as_str().into()),
        version: context.version.clone(),
        ..BackupReport::default()
    };
    shared.set_backup(report.clone());
    tracing::info!(backup = %request.name, id = %request.backup_id, replica = context.replica, "taking a backup");
    let result = if !is_backup_id(&request.backup_id) {
        Err(format!("backupId {:?} is not valid", request.backup_id))
    } else {
        match shared.config.engine {
            EngineKind::Postgres => take_postgres(&shared, &request, &context, &mut report).await,
            EngineKind::Mysql => take_mysql(&shared, &request, &mut report).await,
            EngineKind::Mariadb => {
                crate::mariadb::backup::take(&shared, &request, &mut report).await
            }
        }
    };
    match result {
        Ok(()) => tracing::info!(
            backup = %request.name,
            size = ?report.size,
            path = ?report.object_path,
            "backup completed"
        ),
        Err(e) => {
            tracing::error!(backup = %request.name, "backup failed: {e}");
            report.phase = FAILED.into();
            report.error = Some(one_line(&e));
            report.stopped_at = Some(now_rfc3339());
        }
    }
    shared.set_backup(report);
}

/// The store, system identifier and prefixes of a backup; fills in `report`.
pub(crate) async fn backup_target(
    shared: &Shared,
    request: &BackupRequest,
    report: &mut BackupReport,
) -> Result<(Arc<Store>, String, String, String), String> {
    let store = shared.store().await?.ok_or_else(|| {
        format!("no backup destination: the pod has no annotation {BACKUP_DESTINATION_ANNOTATION}")
    })?;
    let sysid = shared.system_identifier().await?;
    let sys_prefix = system_prefix(&store.location.prefix, &sysid);
    let base = base_prefix(&sys_prefix, &request.backup_id);
    report.prefix = Some(sys_prefix.clone());
    report.object_path = Some(store.url(&base));
    shared.set_backup(report.clone());
    // Read again for every backup (one request): a store that is down, or an owner file
    // changed since WAL archiving last read it, fails the backup here, before any upload.
    shared.forget_owner(&store, &sysid);
    shared.ensure_owner(&store).await?;
    Ok((store, sysid, sys_prefix, base))
}

/// The last lines of a child's stderr, for error messages.
#[derive(Default)]
pub(crate) struct Tail(VecDeque<String>);

impl Tail {
    pub(crate) fn push(&mut self, line: &str) {
        if self.0.len() == 4 {
            self.0.pop_front();
        }
        self.0.push_back(line.trim().to_string());
    }

    pub(crate) fn text(&self) -> String {
        self.0.iter().cloned().collect::<Vec<_>>().join(" / ")
    }
}

/// Spawns `command` with piped stdout/stderr (dying with the agent); stderr lines go to
/// the log and to `on_line`.
pub(crate) fn spawn_streaming(
    mut command: tokio::process::Command,
    what: &'static str,
    stdin: bool,
    mut on_line: impl FnMut(&str) + Send + 'static,
) -> Result<(tokio::process::Child, tokio::task::JoinHandle<()>), String> {
    command
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    process::die_with_parent(&mut command);
    let mut child = process::spawn(&mut command).map_err(|e| format!("cannot run {what}: {e}"))?;
    let stderr = child.stderr.take();
    let task = tokio::spawn(async move {
        let Some(stderr) = stderr else {
            return;
        };
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::info!(target: "backup", "[{what}] {line}");
            on_line(&line);
        }
    });
    Ok((child, task))
}

pub(crate) async fn finish(
    child: &mut tokio::process::Child,
    kill: bool,
) -> Option<std::process::ExitStatus> {
    let pid = child.id();
    if kill {
        let _ = child.start_kill();
    }
    let status = child.wait().await.ok();
    process::release(pid);
    status
}

async fn take_postgres(
    shared: &Shared,
    request: &BackupRequest,
    context: &BackupContext,
    report: &mut BackupReport,
) -> Result<(), String> {
    let (store, sysid, sys_prefix, base) = backup_target(shared, request, report).await?;
    let segment_size = match shared.engine.wal_segment_size().await {
        Ok(size) if size > 0 && (1u64 << 32).is_multiple_of(size) => size,
        Ok(size) => return Err(format!("unexpected wal_segment_size {size}")),
        Err(e) => {
            tracing::warn!("reading wal_segment_size ({e}); assuming 16 MiB");
            DEFAULT_SEGMENT_SIZE
        }
    };
    let label = format!("devctl {}", request.backup_id);
    let command = shared.engine.base_backup_command(&label)?;
    let progress = Arc::new(Mutex::new(BaseBackupProgress::default()));
    let tail = Arc::new(Mutex::new(Tail::default()));
    let (mut child, stderr_task) = {
        let (progress, tail) = (progress.clone(), tail.clone());
        spawn_streaming(command, "pg_basebackup", false, move |line| {
            lock(&progress).take_line(line);
            lock(&tail).push(line);
        })?
    };
    let Some(mut stdout) = child.stdout.take() else {
        finish(&mut child, true).await;
        return Err("pg_basebackup has no stdout".into());
    };
    let key = format!("{base}{}", data_object("postgres"));
    let mut watcher = TarWatcher::default();
    // On a primary the server itself waits for the archiver before it ends the backup
    // (`-X none`): bounded here, so a failing archive fails the backup instead of hanging.
    let archive_guard = async {
        let mut wait = ArchiveWait::default();
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let waiting = lock(&progress).waiting_for_archive;
            let archive = shared.wal_archive();
            let failing = archive.as_ref().is_some_and(|a| a.failing);
            let last = archive.as_ref().and_then(|a| a.last_archived.as_deref());
            if let Some(why) = wait.observe(waiting, failing, last, tokio::time::Instant::now()) {
                return why;
            }
        }
    };
    let uploaded = tokio::select! {
        result = store.put_stream(&key, &mut stdout, |chunk| watcher.feed(chunk)) => {
            result.map_err(|e| e.to_string())
        }
        why = archive_guard => Err(format!(
            "{why} ({})",
            shared
                .wal_archive()
                .and_then(|a| a.error)
                .unwrap_or_else(|| "see the primary's walArchive".into())
        )),
    };
    let size = match uploaded {
        Ok(size) => size,
        Err(e) => {
            finish(&mut child, true).await;
            let _ = stderr_task.await;
            return Err(e);
        }
    };
    drop(stdout);
    let status = finish(&mut child, false).await;
    let _ = stderr_task.await;
    if !status.is_some_and(|s| s.success()) {
        return Err(format!("pg_basebackup failed: {}", lock(&tail).text()));
    }
    if let Some(e) = &watcher.error {
        return Err(format!("pg_basebackup's output is not a tar stream: {e}"));
    }
    if !watcher.ended {
        return Err("pg_basebackup's tar stream is truncated".into());
    }
    // Where the backup starts: backup_label (pg_basebackup -v prints the points only when
    // it fetches WAL itself). Where it ends: the manifest's WAL-Ranges.
    let progress = lock(&progress).clone();
    let label = watcher
        .label
        .as_deref()
        .and_then(|b| parse_backup_label(&String::from_utf8_lossy(b)));
    let ranges = watcher
        .manifest_tail
        .as_deref()
        .map(|b| parse_manifest_wal_ranges(&String::from_utf8_lossy(b)))
        .unwrap_or_default();
    let begin_lsn = label
        .as_ref()
        .map(|l| l.start_lsn.clone())
        .or_else(|| ranges.first().map(|r| r.start_lsn.clone()))
        .or(progress.start_lsn.clone())
        .ok_or("neither backup_label nor the backup manifest show where the backup starts")?;
    let timeline = label
        .as_ref()
        .and_then(|l| l.timeline)
        .or_else(|| ranges.first().map(|r| r.timeline))
        .or(progress.timeline)
        .ok_or("neither backup_label nor the backup manifest show the backup's timeline")?;
    let (end_timeline, end_lsn) = ranges
        .last()
        .map(|r| (r.timeline, r.end_lsn.clone()))
        .or_else(|| progress.end_lsn.clone().map(|l| (timeline, l)))
        .ok_or("neither the backup manifest nor pg_basebackup show where the backup ends")?;
    let (Some(begin), Some(end)) = (parse_lsn(&begin_lsn), parse_lsn(&end_lsn)) else {
        return Err(format!("malformed LSNs {begin_lsn} / {end_lsn}"));
    };
    let begin_wal = segment_name(timeline, begin, segment_size);
    let end_wal = previous_segment_name(end_timeline, end.max(begin + 1), segment_size);
    report.size = i64::try_from(size).ok();
    report.begin_lsn = Some(format_lsn(begin));
    report.end_lsn = Some(format_lsn(end));
    report.timeline = Some(i64::from(timeline));
    report.begin_wal = Some(begin_wal.clone());
    report.end_wal = Some(end_wal.clone());
    shared.set_backup(report.clone());

    // Every segment of every timeline the backup spans (a standby's backup may span a
    // timeline switch: the manifest's WAL-Ranges list each timeline's part).
    let mut segments = Vec::new();
    for range in &ranges {
        let (Some(start), Some(stop)) = (parse_lsn(&range.start_lsn), parse_lsn(&range.end_lsn))
        else {
            return Err(format!(
                "malformed WAL range {} / {} in the backup manifest",
                range.start_lsn, range.end_lsn
            ));
        };
        let first = segment_name(range.timeline, start, segment_size);
        let last = previous_segment_name(range.timeline, stop.max(start + 1), segment_size);
        match segment_range(&first, &last, segment_size) {
            Some(names) => segments.extend(names),
            None => return Err(format!("the WAL range {first}..{last} is not a range")),
        }
    }
    if segments.is_empty() {
        segments = segment_range(&begin_wal, &end_wal, segment_size).ok_or_else(|| {
            format!("the WAL range {begin_wal}..{end_wal} spans timelines and the backup manifest lists none")
        })?;
    }
    segments.dedup();
    if context.replica {
        // A standby cannot switch WAL itself; the segment it ended in is archived by the
        // primary at the latest after archive_timeout, at once when the primary switches.
        match &context.switch_via {
            Some(via) => match shared
                .engine
                .switch_wal_on(&via.host, via.port, &via.user, &via.passfile)
                .await
            {
                Ok(at) => tracing::info!(%at, "the primary switched WAL for the backup"),
                Err(e) => tracing::warn!(
                    "asking the primary to switch WAL: {e}; waiting for archive_timeout"
                ),
            },
            None => {
                tracing::info!("the primary's address is not known: waiting for archive_timeout")
            }
        }
    }
    wait_for_wal(&store, &sys_prefix, segments).await?;

    report.phase = COMPLETED.into();
    report.stopped_at = Some(now_rfc3339());
    write_manifest(shared, &store, &base, &sysid, report, Some(segment_size)).await
}

/// How long the server may wait for the archiver at the end of a backup while every
/// archiving attempt fails (the store is down, say): a short outage is waited out, a
/// lasting one fails the backup with the archiver's error instead of after [`WAL_WAIT`].
/// Well past PostgreSQL's own pause between rounds of attempts (60 s after three failures),
/// so one failed round followed by a working one never ends a healthy backup.
const ARCHIVE_FAILING_WAIT: Duration = Duration::from_secs(180);

/// The server's wait for the archiver at the end of a backup, observed every few seconds
/// (pure over the instants it is given).
#[derive(Debug, Default)]
struct ArchiveWait {
    waiting_since: Option<tokio::time::Instant>,
    failing_since: Option<tokio::time::Instant>,
    /// The last segment archived when last looked: a success between two looks (which the
    /// `failing` flag no longer shows once a later attempt failed) starts the count again.
    last_archived: Option<String>,
}

impl ArchiveWait {
    /// `Some(why)` when the wait is to end the backup: waiting longer than [`WAL_WAIT`], or
    /// archiving failing all along for [`ARCHIVE_FAILING_WAIT`] while the server waits.
    fn observe(
        &mut self,
        waiting: bool,
        failing: bool,
        last_archived: Option<&str>,
        now: tokio::time::Instant,
    ) -> Option<String> {
        if !waiting {
            return None;
        }
        let waiting_since = *self.waiting_since.get_or_insert(now);
        let progressed = self.last_archived.as_deref() != last_archived;
        self.last_archived = last_archived.map(str::to_string);
        if !failing || progressed {
            self.failing_since = None;
        } else if now.duration_since(*self.failing_since.get_or_insert(now)) >= ARCHIVE_FAILING_WAIT
        {
            return Some(format!(
                "WAL archiving failed for {}s while the server waited for it to end the backup",
                ARCHIVE_FAILING_WAIT.as_secs()
            ));
        }
        (now.duration_since(waiting_since) > WAL_WAIT).then(|| {
            format!(
                "the server waited more than {}s for WAL archiving to end the backup",
                WAL_WAIT.as_secs()
            )
        })
    }
}

/// Whether `segments` (a backup's WAL range) holds the segment of `segment`'s number on a
/// later timeline (pure).
fn continues_on_a_later_timeline(segment: &str, segments: &[String]) -> bool {
    let size = crate::wal::DEFAULT_SEGMENT_SIZE;
    let Some((timeline, number)) = crate::wal::parse_segment_name(segment, size) else {
        return false;
    };
    segments.iter().any(|other| {
        crate::wal::parse_segment_name(other, size)
            .is_some_and(|(t, n)| t > timeline && n == number)
    })
}

/// Why a backup whose WAL range ends in `segment` cannot complete: the primary changed
/// while it ran.
fn spans_a_failover(segment: &str) -> String {
    format!(
        "the backup spans a failover: WAL segment {segment} of its timeline reached the archive only as {segment}.partial (the primary changed while the backup ran), so the WAL this backup needs will never be archived complete; take another backup"
    )
}

/// Waits (at most [`WAL_WAIT`]) until every segment in `segments` — a backup's WAL range,
/// every timeline it spans — is in the archive under `sys_prefix`. A segment archived only
/// as `.partial` (the primary changed while the backup ran) is covered when the range goes
/// on on a later timeline; otherwise the wait fails at once, saying so.
pub async fn wait_for_wal(
    store: &Store,
    sys_prefix: &str,
    segments: Vec<String>,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + WAL_WAIT;
    let all = segments.clone();
    let mut missing: VecDeque<String> = segments.into();
    loop {
        while let Some(name) = missing.front() {
            let key = crate::wal::wal_key(sys_prefix, name);
            match store.head(&key).await {
                Ok(Some(_)) => {
                    missing.pop_front();
                }
                Ok(None) => break,
                Err(e) => return Err(format!("checking the archived WAL: {e}")),
            }
        }
        let Some(first) = missing.front().cloned() else {
            return Ok(());
        };
        let first = first.as_str();
        // A timeline switch at this segment: the old timeline's part of it is archived only
        // as `.partial`. That covers it when the range goes on on the next timeline (whose
        // segment of the same number holds the rest, and is in the range); otherwise no
        // complete one will ever come — said at once, not after the whole wait.
        let partial = format!("{first}.partial");
        match store.head(&crate::wal::wal_key(sys_prefix, &partial)).await {
            Ok(Some(_)) if continues_on_a_later_timeline(first, &all) => {
                missing.pop_front();
                continue;
            }
            Ok(Some(_)) => return Err(spans_a_failover(first)),
            Ok(None) => {}
            Err(e) => return Err(format!("checking the archived WAL: {e}")),
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "WAL segment {first} did not reach the archive within {}s",
                WAL_WAIT.as_secs()
            ));
        }
        tokio::time::sleep(WAL_POLL).await;
    }
}

pub(crate) async fn write_manifest(
    shared: &Shared,
    store: &Store,
    base: &str,
    sysid: &str,
    report: &BackupReport,
    wal_segment_size: Option<u64>,
) -> Result<(), String> {
    let engine = shared.config.engine.as_str();
    let manifest = Manifest {
        format: 1,
        report: report.clone(),
        system_identifier: sysid.to_string(),
        cluster: shared.config.cluster.clone(),
        namespace: shared.config.pod_namespace.clone(),
        cluster_uid: shared.cluster_uid().await?,
        file: data_object(engine).to_string(),
        wal_segment_size,
    };
    let body =
        serde_json::to_vec_pretty(&manifest).map_err(|e| format!("encoding the manifest: {e}"))?;
    store
        .put(&format!("{base}{MANIFEST}"), Bytes::from(body))
        .await
        .map_err(|e| e.to_string())
}

/// Runs `command` and streams its stdout into the object `key`; its stderr lines go to the
/// log and to `on_line`. `Err` (the object removed) when either fails. Returns the size.
pub(crate) async fn stream_to_store(
    store: &Store,
    key: &str,
    command: tokio::process::Command,
    what: &'static str,
    mut on_line: impl FnMut(&str) + Send + 'static,
) -> Result<u64, String> {
    let tail = Arc::new(Mutex::new(Tail::default()));
    let (mut child, stderr_task) = {
        let tail = tail.clone();
        spawn_streaming(command, what, false, move |line| {
            on_line(line);
            lock(&tail).push(line);
        })?
    };
    let Some(mut stdout) = child.stdout.take() else {
        finish(&mut child, true).await;
        return Err(format!("{what} has no stdout"));
    };
    let size = match store.put_stream(key, &mut stdout, |_| {}).await {
        Ok(size) => size,
        Err(e) => {
            finish(&mut child, true).await;
            let _ = stderr_task.await;
            return Err(e.to_string());
        }
    };
    drop(stdout);
    let status = finish(&mut child, false).await;
    let _ = stderr_task.await;
    if !status.is_some_and(|s| s.success()) {
        let _ = store.delete(key).await;
        return Err(format!("{what} failed: {}", lock(&tail).text()));
    }
    Ok(size)
}

async fn take_mysql(
    shared: &Shared,
    request: &BackupRequest,
    report: &mut BackupReport,
) -> Result<(), String> {
    let (store, sysid, _sys_prefix, base) = backup_target(shared, request, report).await?;
    let command = shared.engine.dump_command()?;
    let key = format!("{base}{}", data_object("mysql"));
    let size = stream_to_store(&store, &key, command, "the dump", |_| {}).await?;
    report.size = i64::try_from(size).ok();
    report.phase = COMPLETED.into();
    report.stopped_at = Some(now_rfc3339());
    write_manifest(shared, &store, &base, &sysid, report, None).await
}

/// Why a restore did not happen (yet).
#[derive(Debug, PartialEq, Eq)]
pub enum RestoreError {
    /// Something is missing (the annotation, the Secret): looked at again shortly.
    Wait(String),
    /// It failed: retried with backoff.
    Failed(String),
}

/// Reads and checks the manifest of the requested backup.
pub(crate) async fn read_manifest(
    store: &Store,
    request: &RestoreRequest,
    engine: &str,
) -> Result<(String, Manifest), RestoreError> {
    let base = format!("{}base/{}/", request.location.prefix, request.backup_id);
    let key = format!("{base}{MANIFEST}");
    let bytes = match store.get(&key).await {
        Ok(bytes) => bytes,
        Err(StoreError::NotFound(url)) => {
            return Err(RestoreError::Failed(format!(
                "backup {} is incomplete or does not exist: {url} is missing (a backup without its manifest is never restored from)",
                request.backup_id
            )));
        }
        Err(e) => return Err(RestoreError::Failed(e.to_string())),
    };
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
        RestoreError::Failed(format!("{} is not a valid manifest: {e}", store.url(&key)))
    })?;
    if manifest.report.phase != COMPLETED {
        return Err(RestoreError::Failed(format!(
            "{} says the backup is {}, not Completed",
            store.url(&key),
            manifest.report.phase
        )));
    }
    if manifest.report.engine.as_deref() != Some(engine) {
        return Err(RestoreError::Failed(format!(
            "backup {} is of engine {:?}, this cluster runs {engine}",
            request.backup_id, manifest.report.engine
        )));
    }
    if manifest.file != data_object(engine) {
        return Err(RestoreError::Failed(format!(
            "backup {} holds {:?}, expected {}",
            request.backup_id,
            manifest.file,
            data_object(engine)
        )));
    }
    Ok((base, manifest))
}

/// The temporary sibling directory a restore unpacks into.
pub fn restore_dir(data: &Path) -> PathBuf {
    let name = data
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "data".into());
    data.with_file_name(format!(".{name}.restore"))
}

/// PostgreSQL, empty data directory: downloads the requested base backup into a temporary
/// sibling directory, writes `recovery.signal` and the recovery settings, and renames it
/// into place (an interrupted restore never looks like data).
pub async fn restore_postgres(shared: &Shared) -> Result<String, RestoreError> {
    let (store, request) = shared.restore_source().await.map_err(RestoreError::Wait)?;
    let (base, manifest) = read_manifest(&store, &request, "postgres").await?;
    let data = shared.config.data_dir.clone();
    let temporary = restore_dir(&data);
    let failed = |why: String| {
        let _ = std::fs::remove_dir_all(&temporary);
        RestoreError::Failed(why)
    };
    if temporary.exists() {
        tracing::info!(dir = %temporary.display(), "removing an interrupted restore");
        std::fs::remove_dir_all(&temporary).map_err(|e| {
            RestoreError::Failed(format!("cannot remove {}: {e}", temporary.display()))
        })?;
    }
    create_private_dir(&temporary).map_err(RestoreError::Failed)?;
    let key = format!("{base}{}", manifest.file);
    tracing::info!(
        from = %store.url(&key),
        target_time = ?request.target_time,
        "restoring the base backup"
    );
    let size = match unpack(&store, &key, &temporary).await {
        Ok(size) => size,
        Err(e) => return Err(failed(e)),
    };
    let settle = || -> Result<(), String> {
        // The source's standby marker (a backup taken on a replica) must not come along.
        let _ = std::fs::remove_file(temporary.join(STANDBY_SIGNAL));
        std::fs::write(temporary.join(RECOVERY_SIGNAL), b"")
            .map_err(|e| format!("cannot write {RECOVERY_SIGNAL}: {e}"))?;
        let auto = temporary.join(AUTO_CONF);
        let current = match std::fs::read_to_string(&auto) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", auto.display())),
        };
        let target = request
            .target_time
            .as_deref()
            .map(postgres_target_time)
            .transpose()?;
        let settings = with_recovery_settings(
            &current,
            &shared.engine.restore_command(),
            target.as_deref(),
        );
        crate::engine::write_private(&auto, settings.as_bytes())?;
        // The data directory exists (empty, mode 0700); rename(2) replaces an empty one.
        std::fs::rename(&temporary, &data).map_err(|e| {
            format!(
                "cannot move the restore into {} (is it empty?): {e}",
                data.display()
            )
        })?;
        Ok(())
    };
    settle().map_err(failed)?;
    Ok(format!(
        "restored base backup {} ({size} bytes, WAL {} to {}) from {}; recovering{}",
        request.backup_id,
        manifest.report.begin_wal.as_deref().unwrap_or("?"),
        manifest.report.end_wal.as_deref().unwrap_or("?"),
        store.url(&base),
        request
            .target_time
            .as_deref()
            .map(|t| format!(" to {t}"))
            .unwrap_or_else(|| " to the end of the archive".into())
    ))
}

pub(crate) fn create_private_dir(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot make {} private: {e}", path.display()))
}

/// Unpacks the tar object `key` into `target`, range by range. Only directories and regular
/// files are accepted (pg_basebackup's `-Ft -D -` has no tablespaces). The files are synced
/// at the end with one `syncfs` (an fsync per file would hold the agent's single thread —
/// reports, probes, the health endpoint — for long on many small files), and the runtime
/// gets a turn between entries.
async fn unpack(store: &Store, key: &str, target: &Path) -> Result<u64, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut ranges = store.open_ranges(key).await.map_err(|e| e.to_string())?;
    let mut stream = TarStream::default();
    let mut file: Option<(PathBuf, std::fs::File)> = None;
    let mut ended = false;
    let mut label = false;
    while let Some(bytes) = ranges.next().await? {
        let mut input: &[u8] = &bytes;
        while let Some(event) = stream
            .next(&mut input)
            .map_err(|e| format!("{}: {e}", store.url(key)))?
        {
            match event {
                TarEvent::Entry(entry) => {
                    file = None;
                    tokio::task::yield_now().await;
                    let relative = safe_relative_path(&entry.name).ok_or_else(|| {
                        format!(
                            "refusing the tar entry {:?} (outside the data directory)",
                            entry.name
                        )
                    })?;
                    let path = target.join(&relative);
                    match entry.kind {
                        b'5' => create_private_dir(&path)?,
                        b'0' | b'7' => {
                            if let Some(parent) = path.parent() {
                                create_private_dir(parent)?;
                            }
                            let f = std::fs::OpenOptions::new()
                                .write(true)
                                .create(true)
                                .truncate(true)
                                .mode(0o600)
                                .open(&path)
                                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                            label |= relative == Path::new("backup_label");
                            file = Some((path, f));
                        }
                        b'x' | b'g' => {}
                        b'2' | b'1' => {
                            return Err(format!(
                                "the base backup holds a link {:?} (tablespaces are not supported)",
                                entry.name
                            ));
                        }
                        other => {
                            return Err(format!(
                                "the base backup holds an unsupported entry {:?} (type {:?})",
                                entry.name, other as char
                            ));
                        }
                    }
                }
                TarEvent::Data(data) => {
                    if let Some((path, f)) = &mut file {
                        f.write_all(data)
                            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                    }
                }
                TarEvent::End => {
                    file = None;
                    ended = true;
                }
            }
        }
    }
    drop(file);
    if !ended {
        return Err(format!(
            "{} is truncated (no end-of-archive)",
            store.url(key)
        ));
    }
    if !label {
        return Err(format!("{} holds no backup_label", store.url(key)));
    }
    sync_file_system(target)?;
    Ok(ranges.size)
}

/// Flushes the file system holding `dir` to disk (`syncfs(2)`).
fn sync_file_system(dir: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let handle =
        std::fs::File::open(dir).map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    // SAFETY: syncfs on a file descriptor we own for the duration of the call.
    if unsafe { libc::syncfs(handle.as_raw_fd()) } != 0 {
        return Err(format!(
            "cannot sync {} to disk: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// MySQL family, running and freshly initialised: replays the requested dump into the
/// server (then `FLUSH PRIVILEGES`, the dump carrying the `mysql` schema).
pub async fn restore_mysql(shared: &Shared) -> Result<String, RestoreError> {
    let (store, request) = shared.restore_source().await.map_err(RestoreError::Wait)?;
    let (base, manifest) = read_manifest(&store, &request, "mysql").await?;
    let key = format!("{base}{}", manifest.file);
    tracing::info!(from = %store.url(&key), "replaying the dump");
    let command = shared
        .engine
        .replay_command()
        .map_err(RestoreError::Failed)?;
    let tail = Arc::new(Mutex::new(Tail::default()));
    let (mut child, stderr_task) = {
        let tail = tail.clone();
        spawn_streaming(command, "replay", true, move |line| lock(&tail).push(line))
            .map_err(RestoreError::Failed)?
    };
    let Some(mut stdin) = child.stdin.take() else {
        finish(&mut child, true).await;
        return Err(RestoreError::Failed("the client has no stdin".into()));
    };
    let fed: Result<u64, String> = async {
        let mut ranges = store.open_ranges(&key).await.map_err(|e| e.to_string())?;
        while let Some(bytes) = ranges.next().await? {
            stdin
                .write_all(&bytes)
                .await
                .map_err(|e| format!("feeding the dump to the server: {e}"))?;
        }
        stdin
            .write_all(b"\nFLUSH PRIVILEGES;\n")
            .await
            .map_err(|e| format!("feeding the dump to the server: {e}"))?;
        Ok(ranges.size)
    }
    .await;
    drop(stdin);
    let status = finish(&mut child, fed.is_err()).await;
    let _ = stderr_task.await;
    let size = fed.map_err(|e| RestoreError::Failed(format!("{e} ({})", lock(&tail).text())))?;
    if !status.is_some_and(|s| s.success()) {
        return Err(RestoreError::Failed(format!(
            "replaying {} failed: {}",
            store.url(&key),
            lock(&tail).text()
        )));
    }
    let marker = shared.config.data_dir.join(MYSQL_RESTORED);
    let mut file = std::fs::File::create(&marker)
        .map_err(|e| RestoreError::Failed(format!("cannot write {}: {e}", marker.display())))?;
    let _ = writeln!(file, "{}", request.backup_id);
    Ok(format!(
        "replayed dump {} ({size} bytes) from {}",
        request.backup_id,
        store.url(&base)
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_backup_waiting_on_an_archiver_that_keeps_failing_ends_after_three_minutes() {
        let start = tokio::time::Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut wait = super::ArchiveWait::default();
        let seg = Some("000000010000000000000002");
        // Not waiting yet: failures of the archiver are not the backup's business.
        assert_eq!(wait.observe(false, true, seg, at(0)), None);
        assert_eq!(wait.observe(true, true, seg, at(5)), None);
        // A success in between starts the count again.
        assert_eq!(wait.observe(true, false, seg, at(50)), None);
        assert_eq!(wait.observe(true, true, seg, at(55)), None);
        assert_eq!(wait.observe(true, true, seg, at(230)), None);
        let why = wait.observe(true, true, seg, at(235)).unwrap();
        assert!(why.contains("failed for 180s"), "{why}");
        // A success between two looks (failing again by the next) counts as one too.
        let mut between = super::ArchiveWait::default();
        assert_eq!(between.observe(true, true, seg, at(0)), None);
        let next = Some("000000010000000000000003");
        assert_eq!(between.observe(true, true, next, at(175)), None);
        assert_eq!(between.observe(true, true, next, at(200)), None);
        // An archiver that works but is slow: only the whole bound ends the wait.
        let mut slow = super::ArchiveWait::default();
        assert_eq!(slow.observe(true, false, seg, at(0)), None);
        assert_eq!(slow.observe(true, false, seg, at(600)), None);
        let why = slow.observe(true, false, seg, at(601)).unwrap();
        assert!(why.contains("more than 600s"), "{why}");
    }

    use super::*;

    #[test]
    fn a_partial_segment_covers_a_range_only_when_it_goes_on_on_a_later_timeline() {
        let range: Vec<String> = [
            "000000010000000000000004",
            "000000010000000000000005",
            "000000020000000000000005",
            "000000020000000000000006",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert!(continues_on_a_later_timeline(
            "000000010000000000000005",
            &range
        ));
        assert!(!continues_on_a_later_timeline(
            "000000010000000000000004",
            &range
        ));
        assert!(!continues_on_a_later_timeline(
            "000000020000000000000006",
            &range
        ));
    }

    #[test]
    fn a_system_identifiers_owner_is_claimed_once_and_kept() {
        assert_eq!(owner_verdict(None, "new"), OwnerVerdict::Claim);
        assert_eq!(owner_verdict(Some("new"), "new"), OwnerVerdict::Ours);
        assert_eq!(
            owner_verdict(Some("old"), "new"),
            OwnerVerdict::Another("old".into())
        );
    }

    fn report(uid: &str, phase: &str) -> BackupReport {
        BackupReport {
            uid: uid.into(),
            phase: phase.into(),
            ..BackupReport::default()
        }
    }

    #[test]
    fn a_finished_request_is_never_rerun() {
        let request = BackupRequest {
            name: "b".into(),
            uid: "u1".into(),
            backup_id: "20261130T120000Z-b".into(),
        };
        assert!(should_start(&request, None));
        assert!(should_start(&request, Some(&report("u0", COMPLETED))));
        assert!(!should_start(&request, Some(&report("u1", COMPLETED))));
        assert!(!should_start(&request, Some(&report("u1", FAILED))));
        // Left Running by a previous agent process: taken again.
        assert!(should_start(&request, Some(&report("u1", RUNNING))));
    }

    #[test]
    fn reads_the_annotations() {
        let view = PodView {
            listed: true,
            destination: Some(
                r#"{"endpoint":"https://s3:7070","bucket":"b","prefix":"p/ns/db","region":""}"#.into(),
            ),
            backup_request: Some(r#"{"name":"n","uid":"u","backupId":"20261130T120000Z-n"}"#.into()),
            restore: Some(
                r#"{"endpoint":"https://s3:7070","bucket":"b","prefix":"p/ns/src/74/","backupId":"20261130T120000Z-n","targetTime":"2026-11-30T12:34:56Z"}"#.into(),
            ),
            error: None,
        };
        let destination = view.destination().unwrap().unwrap();
        assert_eq!(destination.prefix, "p/ns/db/");
        assert_eq!(destination.region, "us-east-1");
        assert_eq!(view.backup_request().unwrap().unwrap().uid, "u");
        let restore = view.restore().unwrap().unwrap();
        assert_eq!(restore.location.prefix, "p/ns/src/74/");
        assert_eq!(restore.target_time.as_deref(), Some("2026-11-30T12:34:56Z"));
        let bad = PodView {
            restore: Some(
                r#"{"endpoint":"https://s3","bucket":"b","backupId":"x","targetTime":"now'; DROP"}"#
                    .into(),
            ),
            backup_request: Some("{}".into()),
            ..PodView::default()
        };
        assert!(bad.restore().unwrap().is_err());
        assert!(bad.backup_request().unwrap().is_err());
        // Not annotated yet: an error (WAL is kept); `off`: backups are off.
        assert_eq!(
            PodView::default().destination(),
            Err(NOT_ANNOTATED.to_string())
        );
        let off = PodView {
            destination: Some(devctl_api::instance::BACKUP_DESTINATION_OFF.into()),
            ..PodView::default()
        };
        assert_eq!(off.destination(), Ok(None));
    }
}
