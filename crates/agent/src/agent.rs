//! The agent proper: wait for credentials, bootstrap, run and supervise the engine, keep
//! the application role in line with the Secret, and report.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use devctl_api::instance::{InstanceStatus, env};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Secret};
use kube::Api;
use kube::runtime::events::{Event as ClusterEvent, EventType, Recorder};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::process::Child;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use crate::backup::{
    BackupContext, MYSQL_RESTORED, PodView, RestoreError, Shared, SwitchVia, restore_mysql,
    restore_postgres, run_backup, should_start,
};
use crate::cluster::{
    ClusterView, PrimaryAddress, read_report, resolve_primary, resolve_primary_report,
    watch_cluster, watch_error_is_forbidden,
};
use crate::config::{Config, EngineKind, PodRef, PrimaryFrom, extra_env};
use crate::credentials::{Credentials, REPLICATION_USER, ReplicationCredentials, pgpass_line};
use crate::engine::{
    Engine, Probe, StandbyExtras, prepare_dir, primary_conninfo, slot_name, write_private,
};
use crate::error::{Error, Result, one_line};
use crate::health::{self, Health};
use crate::lease::{
    AcquireError, LockDurations, PrimaryLock, fence_stop_timeout, lock_durations, renew_deadline,
    renew_interval,
};
use crate::process;
use crate::report::{Reporter, WriteError};

/// Probe period once the engine is ready (faster while it starts).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);
const STARTING_PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// How long a PostgreSQL primary keeps probing every [`STARTING_PROBE_INTERVAL`] while the
/// same replicas do not stream from it: long enough for a replica's restart or a rollout step;
/// a replica that stays away (a lost node) is then looked for at [`PROBE_INTERVAL`], not with a
/// `psql` twice a second for as long as it is gone.
const AWAITING_REPLICAS_FAST_FOR: Duration = Duration::from_secs(60);
/// How long a stopping engine gets before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(50);
/// Restart backoff: 1 s doubling to 30 s; giving up after this many consecutive failures
/// (an engine that ran longer than [`STABLE_UPTIME`] resets the count).
pub const MAX_FAILURES: u32 = 5;
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// PostgreSQL's words when a point-in-time restore replayed every archived segment without
/// reaching its target: the segment holding the target time is not in the store yet.
const RECOVERY_TARGET_NOT_REACHED: &str =
    "recovery ended before configured recovery target was reached";
/// How long such a restore keeps retrying: several of the source's `archive_timeout`s (60 s),
/// after which the WAL past the target is in the store if the source still runs.
const RECOVERY_TARGET_WAIT: Duration = Duration::from_secs(300);
const STABLE_UPTIME: Duration = Duration::from_secs(60);
/// How often a waiting agent looks again (status.currentPrimary, the primary's report).
const WAIT_INTERVAL: Duration = Duration::from_secs(2);
/// The replication password file in the run directory (mode 0600).
pub const REPLICATION_PASSFILE: &str = "replication.pgpass";

/// How the engine runs: decided from `status.currentPrimary` (PostgreSQL) or always
/// `Primary` (MySQL family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Primary,
    Replica,
}

/// The `lastError` of a replica named in `status.currentPrimary` without a switchover
/// (`status.targetPrimary`): failover is not implemented.
pub const PROMOTION_UNSUPPORTED: &str = "promotion is not supported yet";
/// How long a former primary restarted as a standby may take to stream before it is
/// re-cloned (its history may have forked from the new primary's).
pub const REJOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How a former primary came back as a standby (the `Rejoined` event says it).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rejoin {
    /// `pg_rewind` to the fork point.
    Rewound,
    /// Its data could not follow the new primary (the rewind failed, or it did not stream
    /// in time): moved aside to this path and the primary cloned anew.
    Recloned(String),
    /// A replica fell further behind than the WAL its primary keeps and the archive holds:
    /// its data was removed and the primary cloned anew (event `Recloned`).
    CaughtUpByClone(String),
}

/// A role change the running engine must stop for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    /// This primary is `currentPrimary` and `targetPrimary` names another pod: checkpoint,
    /// fast shutdown, report `finalLSN`, never restart as the primary.
    Switchover(String),
    /// A rejoined former primary did not stream within [`REJOIN_TIMEOUT`]: move its data
    /// aside and clone the primary.
    Reclone,
    /// A replica cannot resume streaming: the primary removed WAL it still needs and the
    /// archive does not have it. Its data (nothing the primary lacks) is removed and the
    /// primary cloned anew.
    CloneAfresh(String),
    /// This primary must stop writing at once (docs/failover.md): its lock lapsed, another
    /// pod holds it, or the operator declared a failover away from it.
    Fence(String),
}

/// Why the agent does not take the lock to run as the primary under the test hook
/// [`crate::test_hooks::PROMOTION_LOCK`].
const PROMOTION_LOCK_REFUSED: &str = "the primary lock: refused (test hook promotion-lock=refuse)";

/// The CHECKPOINT after a promotion is retried this often, this many times (PostgreSQL's own
/// spread end-of-recovery checkpoint has completed by then).
const CHECKPOINT_RETRY_INTERVAL: Duration = Duration::from_secs(5);
const CHECKPOINT_RETRIES: u32 = 60;
/// PostgreSQL's words when a replica asks its primary for WAL the primary no longer has.
const WAL_REMOVED: &str = "has already been removed";
/// How long a replica keeps trying (streaming, then the archive through `restore_command`)
/// without replaying anything after the primary said so, before it re-clones.
const WAL_REMOVED_RECLONE_AFTER: Duration = Duration::from_secs(20);

/// How long a former primary waits for the new primary's control file to show a timeline
/// past its own before it rewinds anyway.
const REJOIN_TIMELINE_WAIT: Duration = Duration::from_secs(60);

/// How long a fenced engine gets for its fast shutdown before SIGKILL without a primary lock
/// (with one: [`fence_stop_timeout`] of its duration).
pub const FENCE_STOP_TIMEOUT: Duration = Duration::from_secs(3);

/// Why this instance must not be (or stay) the primary: the operator has declared a
/// failover away from it.
fn failover_away(view: &ClusterView, me: &str) -> Option<String> {
    let failed = view.failed_primary.as_deref()?;
    (failed == me).then(|| {
        format!(
            "a failover away from this instance is under way (epoch {})",
            view.failover_epoch
        )
    })
}

/// `synchronous_standby_names` for the primary `me` from the cluster's spec: every other
/// instance by name (never `*`, which would count a running `pg_basebackup` as a standby).
pub fn synchronous_standby_names(view: &ClusterView, me: &str) -> String {
    let Some((method, number)) = &view.synchronous else {
        return String::new();
    };
    let Some((prefix, _)) = me.rsplit_once('-') else {
        return String::new();
    };
    let others: Vec<String> = (0..view.replicas.max(1))
        .map(|ordinal| format!("{prefix}-{ordinal}"))
        .filter(|name| name != me)
        .map(|name| format!("\"{name}\""))
        .collect();
    if others.is_empty() {
        return String::new();
    }
    format!("{method} {number} ({})", others.join(", "))
}

/// What one clone attempt came to.
enum CloneStep {
    Cloned,
    Stopped,
    /// The pod was replaced.
    Stale(String),
    /// Waiting for something (the replication Secret, the primary's report).
    Wait(String),
    /// `pg_basebackup` failed (retried with backoff).
    Failed(String),
}

/// How the agent ended without an error (both exit 0).
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// SIGTERM/SIGINT; the engine stopped cleanly.
    Stopped,
    /// The pod was deleted or replaced by a newer one of the same name.
    Stale(String),
}

/// What the credentials watch has seen.
#[derive(Clone, Debug, Default)]
pub(crate) struct SecretView {
    /// The initial list completed.
    pub listed: bool,
    pub secret: Option<Secret>,
    /// The last watch error (message, forbidden) since the last successful event.
    pub error: Option<(String, bool)>,
}

impl SecretView {
    /// What keeps the `what` Secret `name` from being used, for `lastError`.
    fn problem(&self, what: &str, name: &str) -> Option<String> {
        if let Some((message, _)) = &self.error {
            Some(format!("watching {what} Secret {name}: {message}"))
        } else if self.listed && self.secret.is_none() {
            Some(format!("{what} Secret {name} not found"))
        } else {
            None
        }
    }
}

/// Takes in `secret` when its `resourceVersion` is newer than `seen`: parsed into `desired`,
/// or — when its content is unusable — reported in `invalid` while the previous password
/// stays in force.
fn take_in_secret<C>(
    secret: &Secret,
    seen: &mut Option<String>,
    desired: &mut Option<C>,
    invalid: &mut Option<String>,
    parse: impl Fn(&Secret) -> Result<C>,
) {
    let version = secret.metadata.resource_version.clone();
    if version == *seen {
        return;
    }
    *seen = version;
    match parse(secret) {
        Ok(c) => {
            *desired = Some(c);
            *invalid = None;
        }
        Err(e) => {
            let message = format!("{}; keeping the previous password", e.one_line());
            tracing::error!("{message}");
            *invalid = Some(message);
        }
    }
}

/// Watches one Secret (field selector on its name: the agent's Role allows only that name,
/// so it never lists all Secrets).
pub(crate) fn watch_secret(
    client: kube::Client,
    namespace: &str,
    name: &str,
    what: &'static str,
) -> watch::Receiver<SecretView> {
    let (tx, rx) = watch::channel(SecretView::default());
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let fields = format!("metadata.name={name}");
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default().fields(&fields))
            .default_backoff()
            .boxed();
        let mut buffer = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => buffer = None,
                Ok(watcher::Event::InitApply(s)) => buffer = Some(s),
                Ok(watcher::Event::InitDone) => tx.send_modify(|v| {
                    v.listed = true;
                    v.secret = buffer.take();
                    v.error = None;
                }),
                Ok(watcher::Event::Apply(s)) => tx.send_modify(|v| {
                    v.listed = true;
                    v.secret = Some(s);
                    v.error = None;
                }),
                Ok(watcher::Event::Delete(_)) => tx.send_modify(|v| {
                    v.listed = true;
                    v.secret = None;
                    v.error = None;
                }),
                Err(e) => {
                    let forbidden = watch_error_is_forbidden(&e);
                    let message = one_line(&e.to_string());
                    tracing::warn!("watching the {what} Secret: {message}");
                    tx.send_modify(|v| v.error = Some((message, forbidden)));
                }
            }
        }
    });
    rx
}

/// Sleeps until `at`, or forever without it.
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits for a change on an optional receiver (forever without one); `false` when its
/// watch ended.
async fn changed<T>(rx: &mut Option<watch::Receiver<T>>) -> bool {
    match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

enum Exit {
    Act(Action),
    Crashed(ExitStatus),
    Signalled,
    Stale(String),
}

struct Agent {
    config: Config,
    engine: Engine,
    reporter: Reporter,
    reported_once: bool,
    health: Arc<Health>,
    secrets: watch::Receiver<SecretView>,
    sigterm: Signal,
    sigint: Signal,
    /// The Secret version last looked at, and the last valid credentials.
    seen_version: Option<String>,
    desired: Option<Credentials>,
    /// The Secret version the roles have.
    applied: Option<String>,
    /// The Secret is missing or cannot be watched.
    secret_problem: Option<String>,
    /// The Secret's latest version is invalid (the previous password stays).
    invalid_error: Option<String>,
    apply_error: Option<String>,
    engine_error: Option<String>,
    /// Restarts of the engine after it exited on its own, the last one's time and how it
    /// exited (reported: a crash healed within a second stays visible).
    restarts: i32,
    last_restart: Option<(String, String)>,
    /// The running engine's last error line and the tasks copying its output.
    engine_last_error: process::LastError,
    engine_output: Vec<tokio::task::JoinHandle<()>>,
    probe: Option<Probe>,
    ready: bool,
    /// The cluster's pods (reading the primary's report).
    pods: Api<Pod>,
    /// PostgreSQL: the DatabaseCluster watch and the replication Secret's (when configured).
    cluster: Option<watch::Receiver<ClusterView>>,
    replication: Option<watch::Receiver<SecretView>>,
    mode: Mode,
    /// Waiting for `status.currentPrimary`, or a role change the agent cannot make.
    role_problem: Option<String>,
    /// The replication Secret: version last looked at, last valid content, problems.
    replication_seen: Option<String>,
    replication_desired: Option<ReplicationCredentials>,
    replication_problem: Option<String>,
    replication_invalid: Option<String>,
    /// Primary: `<replication version>/<credentials version>` the replication role has.
    replication_applied: Option<String>,
    replication_apply_error: Option<String>,
    /// Replica: the replication Secret version in the password file.
    passfile_version: Option<String>,
    /// Replica: where it streams from, the conninfo PostgreSQL has, and why it does not
    /// stream.
    primary_address: Option<PrimaryAddress>,
    conninfo_applied: Option<String>,
    replica_problem: Option<String>,
    /// Planned switchover: the shutdown checkpoint this former primary stopped at (reported
    /// as `finalLSN` until it rejoins as a standby).
    final_lsn: Option<String>,
    /// Target of a switchover: why it does not promote yet.
    switchover_problem: Option<String>,
    /// A role change to make (stopping the engine).
    action: Option<Action>,
    /// A former primary rejoining as a standby: when to give up and re-clone.
    rejoin_deadline: Option<Instant>,
    /// Since when a former primary waits for the new primary's checkpointed timeline.
    rejoin_timeline_wait: Option<Instant>,
    /// PostgreSQL: the primary lock (used while `spec.highAvailability.enabled`).
    lock: Option<PrimaryLock>,
    /// Why the lock was not taken or renewed last time.
    lock_problem: Option<String>,
    /// Failover: the epoch for which this replica stopped its WAL receiver.
    failover_ack: Option<i64>,
    /// Failover: the epoch and when this replica saw its WAL receiver stopped (the test hook
    /// [`crate::test_hooks::FAILOVER_ACK_DELAY_MS`] counts from there).
    failover_stopped: Option<(i64, Instant)>,
    /// Faults a test injects ([`crate::test_hooks`]); none outside tests.
    hooks: crate::test_hooks::TestHooks,
    /// The timeline last received while streaming: once the receiver stops, the probe falls
    /// back to the last restartpoint's, which may be older.
    stream_timeline: Option<i64>,
    /// Primary: the `synchronous_standby_names` the engine has.
    sync_applied: Option<String>,
    /// Why the replication slots could not be brought in line last time.
    slot_problem: Option<String>,
    /// Replica: the slots its primary reports having, and the slot and `restore_command`
    /// the engine has.
    primary_slots: Option<Vec<String>>,
    extras_applied: Option<StandbyExtras>,
    /// Replica: since when (and at which replayed position) the primary has been saying that
    /// the WAL this replica needs is gone.
    wal_removed_since: Option<(Instant, Option<String>)>,
    /// A former primary was rewound or re-cloned and waits to stream (for the `Rejoined`
    /// event, which says how).
    rejoining: Option<Rejoin>,
    recorder: Recorder,
    /// Backups, WAL archiving and restore (docs/backup.md), shared with the WAL socket
    /// and the backup task.
    shared: Arc<Shared>,
    /// The pod's annotations (wakes the loop when a backup request arrives).
    pod_view: watch::Receiver<PodView>,
    /// The backup being taken.
    backup_task: Option<tokio::task::JoinHandle<()>>,
    /// A malformed backup request (logged once).
    backup_request_problem: Option<String>,
    /// PostgreSQL: a restored data directory replays the archive and has not promoted yet.
    recovering: bool,
    /// Leftover recovery settings were looked for once this engine ran as the primary.
    recovery_settings_checked: bool,
    /// MySQL family, `DEVCTL_BOOTSTRAP=recovery`: the dump is still to be replayed.
    mysql_restore_pending: bool,
    mysql_restore_at: Option<Instant>,
    mysql_restore_backoff: Duration,
    /// What the restore waits for or why it failed.
    restore_problem: Option<String>,
}

/// Runs the instance described by `config` until SIGTERM/SIGINT, a replaced pod, or an
/// error.
pub async fn run(config: Config) -> Result<Outcome> {
    let signal_error =
        |e: std::io::Error| Error::Internal(format!("installing signal handlers: {e}"));
    let sigterm = signal(SignalKind::terminate()).map_err(signal_error)?;
    let sigint = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let engine = Engine::locate(&config)?;
    prepare_dir(&config.data_dir, "data directory", env::DATA_DIR)?;
    prepare_dir(&config.run_dir, "run directory", env::RUN_DIR)?;
    let client = kube_client().await?;
    let shared = Arc::new(Shared::new(config.clone(), engine.clone(), client.clone()));
    if config.engine == EngineKind::Postgres {
        // Before the engine starts: its archive_command talks to this socket.
        crate::archive::serve(shared.clone())?;
    }
    let health = Arc::new(Health::default());
    health::serve(config.health_port, health.clone()).await?;
    let pod = PodRef {
        name: config.pod_name.clone(),
        namespace: config.pod_namespace.clone(),
        uid: Some(config.pod_uid.clone()),
    };
    let postgres = config.engine == EngineKind::Postgres;
    let cluster = postgres.then(|| watch_cluster(client.clone(), &config));
    let replication = match (&config.replication_secret, postgres) {
        (Some(name), true) => Some(watch_secret(
            client.clone(),
            &config.pod_namespace,
            name,
            "replication",
        )),
        _ => None,
    };
    let lock = postgres.then(|| {
        PrimaryLock::new(
            Api::namespaced(client.clone(), &config.pod_namespace),
            &devctl_api::instance::primary_lease_name(&config.cluster),
            &config.pod_name,
        )
    });
    let recorder = Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "devctl-agent".into(),
            instance: Some(config.pod_name.clone()),
        },
    );
    let mut agent = Agent {
        pod_view: shared.pod.clone(),
        shared,
        backup_task: None,
        backup_request_problem: None,
        recovering: false,
        recovery_settings_checked: false,
        mysql_restore_pending: false,
        mysql_restore_at: None,
        mysql_restore_backoff: Duration::from_secs(1),
        restore_problem: None,
        lock,
        lock_problem: None,
        failover_ack: None,
        failover_stopped: None,
        rejoin_timeline_wait: None,
        hooks: crate::test_hooks::TestHooks::from_env(),
        stream_timeline: None,
        sync_applied: None,
        slot_problem: None,
        primary_slots: None,
        extras_applied: None,
        wal_removed_since: None,
        rejoining: None,
        recorder,
        secrets: watch_secret(
            client.clone(),
            &config.pod_namespace,
            &config.credentials_secret,
            "credentials",
        ),
        pods: Api::namespaced(client.clone(), &config.pod_namespace),
        cluster,
        replication,
        mode: Mode::Primary,
        role_problem: None,
        replication_seen: None,
        replication_desired: None,
        replication_problem: None,
        replication_invalid: None,
        replication_applied: None,
        replication_apply_error: None,
        passfile_version: None,
        primary_address: None,
        conninfo_applied: None,
        replica_problem: None,
        final_lsn: None,
        switchover_problem: None,
        action: None,
        rejoin_deadline: None,
        reporter: Reporter::new(client, pod),
        reported_once: false,
        config,
        engine,
        health,
        sigterm,
        sigint,
        seen_version: None,
        desired: None,
        applied: None,
        secret_problem: None,
        invalid_error: None,
        apply_error: None,
        engine_error: None,
        restarts: 0,
        last_restart: None,
        engine_last_error: Default::default(),
        engine_output: Vec::new(),
        probe: None,
        ready: false,
    };
    agent.main().await
}

/// Why the primary with an empty data directory does not initialise one, and what moves on:
/// with high availability a failover to a replica (which this pod then clones); without it
/// nothing fails over, so a restore (the replicas keep the data, but no step promotes them).
fn lost_primary_data(cluster: &str, pod: &str, replicas: i32, high_availability: bool) -> String {
    let next = if replicas > 1 && high_availability {
        format!(
            "a replica takes over by failover once the primary lock expires (with autoFailover off: `devctl db promote {cluster} <replica>`); this pod then clones it"
        )
    } else if replicas > 1 {
        format!(
            "without spec.highAvailability nothing fails over on its own: promote a replica with `devctl db promote {cluster} <replica> --force` (what this primary had not sent to it is lost); this pod then clones it"
        )
    } else {
        format!(
            "restore a backup into a new cluster (`devctl db restore NEW --from BACKUP`), or delete {cluster}"
        )
    };
    format!(
        "the data of the primary {pod} is gone (its volume is new) but the cluster has run before: refusing to initialise an empty database in its place; {next}"
    )
}

/// A client from the environment: `KUBECONFIG`, else the in-cluster service account.
pub async fn kube_client() -> Result<kube::Client> {
    let config = kube::Config::infer().await.map_err(|e| {
        Error::Internal(format!(
            "Kubernetes client configuration: {}",
            one_line(&e.to_string())
        ))
    })?;
    kube::Client::try_from(config)
        .map_err(|e| Error::Internal(format!("Kubernetes client: {}", one_line(&e.to_string()))))
}

impl Agent {
    async fn main(&mut self) -> Result<Outcome> {
        tracing::info!(
            engine = self.engine.name(),
            pod = %self.config.pod_name,
            data_dir = %self.config.data_dir.display(),
            "devctl-agent starting"
        );
        // Before the first report: the backup it names must survive this restart.
        self.shared.load_previous_backup().await;
        let credentials = match self.wait_for_credentials().await? {
            Ok(c) => c,
            Err(outcome) => return Ok(outcome),
        };
        self.secret_problem = None;
        self.seen_version = Some(credentials.version.clone());
        self.desired = Some(credentials);
        let fresh = if self.cluster.is_some() {
            match self.prepare_postgres().await? {
                Ok(fresh) => fresh,
                Err(outcome) => return Ok(outcome),
            }
        } else {
            let fresh = !self.engine.is_bootstrapped();
            if fresh {
                if let Err(outcome) = self.refuse_an_empty_volume().await? {
                    return Ok(outcome);
                }
                self.engine.bootstrap().await?;
            }
            self.mysql_restore_pending =
                self.config.recovery && !self.config.data_dir.join(MYSQL_RESTORED).exists();
            fresh
        };
        if self.cluster.is_some() && self.mode == Mode::Primary && self.engine.is_recovering() {
            // A restored data directory not promoted yet (also after an agent restart).
            self.recovering = true;
        }
        self.supervise(fresh).await
    }

    /// MySQL family (one instance, no cluster watch): an empty data directory is bootstrapped
    /// only for a cluster that has never been ready; for one that has, the data is gone and a
    /// new empty database must not take its place — reported until the agent is stopped.
    /// A cluster the agent may not read is bootstrapped as before (the Role grants the read).
    async fn refuse_an_empty_volume(&mut self) -> Result<Result<(), Outcome>> {
        loop {
            let problem = match self.shared.cluster_has_run().await {
                Ok(false) => {
                    self.role_problem = None;
                    return Ok(Ok(()));
                }
                Err(e) if crate::error::is_forbidden(&e) => {
                    tracing::warn!(error = %one_line(&e.to_string()), "cannot read the DatabaseCluster: bootstrapping without knowing whether it ran before");
                    self.role_problem = None;
                    return Ok(Ok(()));
                }
                Ok(true) => {
                    lost_primary_data(&self.config.cluster, &self.config.pod_name, 1, false)
                }
                Err(e) => format!(
                    "reading DatabaseCluster {} before bootstrapping: {}",
                    self.config.cluster,
                    one_line(&e.to_string())
                ),
            };
            if self.role_problem.as_ref() != Some(&problem) {
                tracing::warn!("{problem}");
            }
            self.role_problem = Some(problem);
            if let Some(outcome) = self.report().await? {
                return Ok(Err(outcome));
            }
            tokio::select! {
                _ = tokio::time::sleep(WAIT_INTERVAL * 5) => {}
                _ = self.sigterm.recv() => return Ok(Err(Outcome::Stopped)),
                _ = self.sigint.recv() => return Ok(Err(Outcome::Stopped)),
            }
        }
    }

    /// PostgreSQL: waits for `status.currentPrimary`, then bootstraps (this pod is the
    /// primary) or clones the primary (another pod is) into an empty data directory,
    /// retrying a failed clone with backoff. Returns whether the data was just initialised.
    async fn prepare_postgres(&mut self) -> Result<Result<bool, Outcome>> {
        let cluster_name = self.config.cluster.clone();
        let me = self.config.pod_name.clone();
        let mut backoff = Duration::from_secs(1);
        loop {
            self.refresh_replication_secret()?;
            let view = match &mut self.cluster {
                Some(rx) => rx.borrow_and_update().clone(),
                None => return Ok(Ok(false)),
            };
            let mut retry_in = WAIT_INTERVAL;
            let problem = if let Some((message, forbidden)) = view.error {
                let message = format!("watching DatabaseCluster {cluster_name}: {message}");
                if forbidden {
                    return Err(Error::Forbidden(message));
                }
                Some(message)
            } else if !view.listed {
                None
            } else if !view.exists {
                Some(format!("DatabaseCluster {cluster_name} not found"))
            } else {
                let bootstrapped = self.engine.is_bootstrapped();
                let standby = self.engine.is_standby();
                let target = view.target_primary.clone();
                let away = failover_away(&view, &me);
                let high_availability = view.lock_duration.is_some();
                match view.current_primary {
                    None => Some("waiting for status.currentPrimary".to_string()),
                    Some(primary) if primary == me && !bootstrapped && view.initialized => {
                        // The primary's volume is new (its claim was deleted or lost) but the
                        // cluster has run: initdb (or a restore of an older backup) here would
                        // silently replace its data with an empty or older database.
                        Some(lost_primary_data(
                            &cluster_name,
                            &me,
                            view.replicas,
                            high_availability,
                        ))
                    }
                    Some(primary) if primary == me && !bootstrapped && self.config.recovery => {
                        // A restored cluster's first instance: the backup instead of initdb
                        // (before the primary lock: no engine runs while it downloads).
                        match self.restore().await? {
                            Ok(Ok(())) => {
                                backoff = Duration::from_secs(1);
                                continue;
                            }
                            Ok(Err(RestoreError::Wait(why))) => Some(why),
                            Ok(Err(RestoreError::Failed(why))) => {
                                retry_in = backoff;
                                backoff = (backoff * 2).min(MAX_BACKOFF);
                                Some(format!(
                                    "restoring: {why}; retrying in {}s",
                                    retry_in.as_secs()
                                ))
                            }
                            Err(outcome) => return Ok(Err(outcome)),
                        }
                    }
                    Some(primary) if primary == me => {
                        if bootstrapped && standby {
                            tracing::warn!(
                                "status.currentPrimary names this pod, but its data is a standby's; promotion is not supported yet"
                            );
                            self.mode = Mode::Replica;
                            self.role_problem = Some(PROMOTION_UNSUPPORTED.into());
                            return Ok(Ok(false));
                        }
                        if let Some(why) = away {
                            // Fenced: the operator elects another primary; this data rejoins
                            // as a standby once it has.
                            self.mode = Mode::Primary;
                            self.ready = false;
                            Some(format!("{why}: not starting as the primary"))
                        } else if bootstrapped
                            && let Some(target) = target.as_ref().filter(|t| **t != me)
                        {
                            // A planned switchover away from this pod.
                            match self.engine.control_data().await {
                                Ok(control) if control.is_clean_primary_shutdown() => {
                                    if self.final_lsn.as_deref()
                                        != Some(control.checkpoint.as_str())
                                    {
                                        tracing::info!(
                                            final_lsn = %control.checkpoint,
                                            %target,
                                            "stopped for a switchover: not restarting as the primary"
                                        );
                                    }
                                    self.final_lsn = Some(control.checkpoint);
                                    self.mode = Mode::Primary;
                                    self.ready = false;
                                    Some(format!("stopped for a switchover to {target}"))
                                }
                                Ok(_) if self.gate_primary().await.is_err() => {
                                    self.lock_problem.clone()
                                }
                                Ok(control) => {
                                    // Not stopped cleanly: run as the primary; the
                                    // switchover then checkpoints and stops it cleanly.
                                    tracing::info!(
                                        state = %control.state,
                                        %target,
                                        "switchover pending on data not shut down cleanly: starting as the primary to stop it cleanly"
                                    );
                                    self.final_lsn = None;
                                    self.mode = Mode::Primary;
                                    self.role_problem = None;
                                    return Ok(Ok(false));
                                }
                                Err(e) => Some(format!(
                                    "reading the control file for the switchover to {target}: {e}"
                                )),
                            }
                        } else if let Err(why) = self.gate_primary().await {
                            self.mode = Mode::Primary;
                            self.ready = false;
                            Some(why)
                        } else {
                            self.mode = Mode::Primary;
                            self.role_problem = None;
                            self.final_lsn = None;
                            if bootstrapped {
                                return Ok(Ok(false));
                            }
                            tracing::info!("this pod is status.currentPrimary: bootstrapping");
                            self.engine.bootstrap().await?;
                            return Ok(Ok(true));
                        }
                    }
                    Some(primary) => {
                        if bootstrapped
                            && !standby
                            && target.as_deref() == Some(me.as_str())
                            && let Err(why) = self.gate_primary().await
                        {
                            Some(why)
                        } else if bootstrapped && !standby && target.as_deref() == Some(me.as_str())
                        {
                            // Promoted in a switchover or failover; the operator has yet to
                            // name it currentPrimary.
                            tracing::info!(
                                "this pod is status.targetPrimary and holds a primary's data: running as the primary"
                            );
                            self.mode = Mode::Primary;
                            self.role_problem = None;
                            self.final_lsn = None;
                            return Ok(Ok(false));
                        } else if bootstrapped && !standby {
                            match self.prepare_rejoin(&primary).await {
                                Ok(()) => {
                                    self.mode = Mode::Replica;
                                    self.role_problem = None;
                                    return Ok(Ok(false));
                                }
                                Err(why) => Some(why),
                            }
                        } else if bootstrapped {
                            tracing::info!(%primary, "resuming as a replica on the existing data");
                            self.mode = Mode::Replica;
                            self.role_problem = None;
                            return Ok(Ok(false));
                        } else {
                            match self.try_clone(&primary).await? {
                                CloneStep::Cloned => {
                                    self.mode = Mode::Replica;
                                    self.role_problem = None;
                                    return Ok(Ok(false));
                                }
                                CloneStep::Stopped => return Ok(Err(Outcome::Stopped)),
                                CloneStep::Stale(why) => return Ok(Err(Outcome::Stale(why))),
                                CloneStep::Wait(why) => Some(why),
                                CloneStep::Failed(why) => {
                                    retry_in = backoff;
                                    backoff = (backoff * 2).min(MAX_BACKOFF);
                                    Some(format!("{why}; retrying in {}s", retry_in.as_secs()))
                                }
                            }
                        }
                    }
                }
            };
            if let Some(problem) = &problem
                && self.role_problem.as_ref() != Some(problem)
            {
                tracing::warn!("{problem}");
            }
            self.role_problem = problem;
            if let Some(outcome) = self.report().await? {
                return Ok(Err(outcome));
            }
            tokio::select! {
                _ = tokio::time::sleep(retry_in) => {}
                ok = changed(&mut self.cluster) => if !ok {
                    return Err(Error::Internal("the DatabaseCluster watch ended".into()));
                },
                ok = changed(&mut self.replication) => if !ok {
                    return Err(Error::Internal("the replication Secret watch ended".into()));
                },
                _ = self.sigterm.recv() => return Ok(Err(Outcome::Stopped)),
                _ = self.sigint.recv() => return Ok(Err(Outcome::Stopped)),
            }
        }
    }

    /// PostgreSQL, `DEVCTL_BOOTSTRAP=recovery`, empty data directory: restores the base
    /// backup the annotation names (`recovery.signal`, `restore_command`, the target); the
    /// engine then replays the archive and promotes. `Err` on SIGTERM/SIGINT or a replaced
    /// pod.
    async fn restore(&mut self) -> Result<Result<Result<(), RestoreError>, Outcome>> {
        // Only once there is something to restore: "waiting" is reported without flicker.
        if let Ok(view) = self.shared.pod_view().await
            && view.restore.is_some()
        {
            self.role_problem = Some("restoring a backup: downloading the base backup".into());
            if let Some(outcome) = self.report().await? {
                return Ok(Err(outcome));
            }
        }
        let shared = self.shared.clone();
        let result = tokio::select! {
            result = restore_postgres(&shared) => result,
            _ = self.sigterm.recv() => return Ok(Err(Outcome::Stopped)),
            _ = self.sigint.recv() => return Ok(Err(Outcome::Stopped)),
        };
        match &result {
            Ok(message) => {
                tracing::info!("{message}");
                self.recovering = true;
                self.role_problem = None;
            }
            Err(RestoreError::Failed(why)) => tracing::error!("restoring: {why}"),
            Err(RestoreError::Wait(_)) => {}
        }
        Ok(Ok(result.map(|_| ())))
    }

    /// High availability: takes (or renews) the primary lock before the engine may run as the
    /// primary; `Err` says why not (also kept in `lock_problem`).
    async fn gate_primary(&mut self) -> Result<(), String> {
        if self.hooks.promotion_lock_refused() {
            let why = format!("not starting as the primary: {PROMOTION_LOCK_REFUSED}");
            self.lock_problem = Some(why.clone());
            return Err(why);
        }
        let (Some(duration), Some(lock)) = (self.lock_durations(), self.lock.as_mut()) else {
            return Ok(());
        };
        match lock.acquire(duration).await {
            Ok(()) => {
                self.lock_problem = None;
                Ok(())
            }
            Err(why) => {
                let why = format!("not starting as the primary: {why}");
                self.lock_problem = Some(why.clone());
                Err(why)
            }
        }
    }

    /// A former primary's data, `primary` now current: once `primary` reports ready as the
    /// primary, rejoin as its standby (`standby.signal`, `primary_conninfo`,
    /// `recovery_target_timeline = 'latest'` are written before the start). Returns why not
    /// yet.
    async fn prepare_rejoin(&mut self, primary: &str) -> Result<(), String> {
        if self.config.replication_secret.is_none() {
            return Err(format!(
                "this instance holds a primary's data but status.currentPrimary names {primary}; rejoining needs {}",
                extra_env::REPLICATION_SECRET
            ));
        }
        if self.replication_desired.is_none() {
            return Err(self
                .replication_problem
                .clone()
                .or_else(|| self.replication_invalid.clone())
                .unwrap_or_else(|| "waiting for the replication Secret".to_string()));
        }
        let report = read_report(&self.pods, primary).await?;
        let acting = report.as_ref().is_some_and(|r| {
            r.ready && r.role.as_deref() == Some(devctl_api::instance::ROLE_PRIMARY)
        });
        if !acting {
            return Err(format!(
                "this instance holds a former primary's data; waiting for the new primary {primary} to report ready as the primary"
            ));
        }
        // pg_rewind before PostgreSQL 16 takes the source's timeline from its control file,
        // which names the new timeline only after the promotion's checkpoint: rewinding
        // earlier finds "no rewind required" and the standby cannot follow.
        let own = self
            .engine
            .control_data()
            .await
            .ok()
            .and_then(|c| c.timeline);
        let theirs = report.as_ref().and_then(|r| r.timeline);
        let waiting_since = *self.rejoin_timeline_wait.get_or_insert_with(Instant::now);
        if let Some(own) = own
            && theirs.is_none_or(|t| t <= own)
            && waiting_since.elapsed() < REJOIN_TIMELINE_WAIT
        {
            return Err(format!(
                "this instance holds a former primary's data (timeline {own}); waiting for the new primary {primary} to checkpoint its new timeline (it reports {})",
                theirs.map_or_else(|| "none".to_string(), |t| t.to_string())
            ));
        }
        self.rejoin_timeline_wait = None;
        let address = resolve_primary(&self.pods, &self.config, primary).await?;
        self.write_passfile()?;
        // Its history may have forked from the new primary's (writes after the last WAL the
        // new primary received): rewind to the fork point; re-clone when that fails.
        self.role_problem = Some(format!("rewinding to follow the new primary {primary}"));
        let _ = self.report().await;
        let user = self.replication_user();
        let passfile = self.passfile();
        if let Err(e) = self
            .engine
            .rewind_from(&address.host, address.port, &user, &passfile)
            .await
        {
            tracing::error!("{e}");
            self.move_data_aside().map_err(|e| e.one_line())?;
            return Err(format!("{e}; moved the data aside to clone the primary"));
        }
        self.rejoining = Some(Rejoin::Rewound);
        tracing::info!(%primary, %address, "this instance holds a former primary's data: rejoining as a standby of the new primary");
        self.primary_address = Some(address);
        self.conninfo_applied = None;
        self.final_lsn = None;
        self.rejoin_deadline = Some(Instant::now() + REJOIN_TIMEOUT);
        Ok(())
    }

    /// Moves the data directory aside (`<data>.old-<unix time>`, kept for the
    /// administrator) and recreates it empty, so the next preparation clones the primary.
    fn move_data_aside(&mut self) -> Result<()> {
        let data = self.config.data_dir.clone();
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let name = data
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "data".into());
        let aside = data.with_file_name(format!("{name}.old-{stamp}"));
        std::fs::rename(&data, &aside).map_err(|e| {
            Error::DataDir(format!(
                "cannot move {} aside to {}: {e}",
                data.display(),
                aside.display()
            ))
        })?;
        tracing::warn!(aside = %aside.display(), "moved the former primary's data aside; cloning the primary");
        self.rejoin_deadline = None;
        self.rejoining = Some(Rejoin::Recloned(aside.display().to_string()));
        prepare_dir(&data, "data directory", env::DATA_DIR)
    }

    /// A replica's data, removed for a fresh clone: the primary has all of it, and a copy
    /// kept aside could fill the volume.
    fn remove_data(&mut self) -> Result<()> {
        let data = self.config.data_dir.clone();
        crate::engine::clear_dir(&data);
        if self.engine.is_bootstrapped() {
            return Err(Error::DataDir(format!(
                "cannot empty {} to re-clone the primary",
                data.display()
            )));
        }
        tracing::warn!(data = %data.display(), "removed the replica's data; cloning the primary");
        self.rejoin_deadline = None;
        Ok(())
    }

    /// One attempt to clone `primary` into the empty data directory.
    async fn try_clone(&mut self, primary: &str) -> Result<CloneStep> {
        let Some(secret) = self.config.replication_secret.clone() else {
            return Err(Error::Usage(format!(
                "missing environment variable {} (a replica needs the replication Secret)",
                extra_env::REPLICATION_SECRET
            )));
        };
        if self.replication_desired.is_none() {
            return Ok(CloneStep::Wait(
                self.replication_problem
                    .clone()
                    .or_else(|| self.replication_invalid.clone())
                    .unwrap_or_else(|| format!("waiting for the replication Secret {secret}")),
            ));
        }
        let address = match resolve_primary(&self.pods, &self.config, primary).await {
            Ok(address) => address,
            Err(why) => return Ok(CloneStep::Wait(why)),
        };
        if let Err(e) = self.write_passfile() {
            return Ok(CloneStep::Failed(e));
        }
        let user = self.replication_user();
        let message = format!("cloning the primary {primary} from {address}");
        tracing::info!("{message}");
        self.role_problem = Some(message);
        if let Some(Outcome::Stale(why)) = self.report().await? {
            return Ok(CloneStep::Stale(why));
        }
        let passfile = self.passfile();
        let result = tokio::select! {
            result = self.engine.clone_from(&address.host, address.port, &user, &passfile) => result,
            _ = self.sigterm.recv() => return Ok(CloneStep::Stopped),
            _ = self.sigint.recv() => return Ok(CloneStep::Stopped),
        };
        match result {
            Ok(()) => {
                tracing::info!(%primary, %address, "cloned the primary");
                self.primary_address = Some(address);
                Ok(CloneStep::Cloned)
            }
            Err(e) => {
                tracing::error!("{e}");
                Ok(CloneStep::Failed(e))
            }
        }
    }

    fn passfile(&self) -> std::path::PathBuf {
        self.config.run_dir.join(REPLICATION_PASSFILE)
    }

    fn replication_user(&self) -> String {
        self.replication_desired
            .as_ref()
            .map(|r| r.username.clone())
            .unwrap_or_else(|| REPLICATION_USER.to_string())
    }

    /// Writes the replication password file (0600) when the Secret's version changed.
    fn write_passfile(&mut self) -> Result<(), String> {
        let Some(replication) = &self.replication_desired else {
            return Ok(());
        };
        if self.passfile_version.as_deref() == Some(replication.version.as_str())
            && self.passfile().is_file()
        {
            return Ok(());
        }
        let line = pgpass_line(&replication.username, &replication.password);
        write_private(&self.passfile(), line.as_bytes())?;
        self.passfile_version = Some(replication.version.clone());
        Ok(())
    }

    /// Takes in the replication Secret's latest state (forbidden is fatal before the engine
    /// runs, only reported after).
    fn refresh_replication_secret(&mut self) -> Result<()> {
        let Some(rx) = &mut self.replication else {
            return Ok(());
        };
        let view = rx.borrow_and_update().clone();
        let name = self.config.replication_secret.clone().unwrap_or_default();
        if let Some((message, true)) = &view.error
            && self.probe.is_none()
        {
            return Err(Error::Forbidden(format!(
                "watching replication Secret {name}: {message}"
            )));
        }
        self.replication_problem = view.problem("replication", &name);
        if let Some(secret) = &view.secret {
            take_in_secret(
                secret,
                &mut self.replication_seen,
                &mut self.replication_desired,
                &mut self.replication_invalid,
                ReplicationCredentials::from_secret,
            );
        }
        Ok(())
    }

    /// The primary's address without asking anyone: the Service's with `service`, the last
    /// known otherwise.
    fn known_primary_address(&self) -> Option<PrimaryAddress> {
        match &self.config.primary_from {
            PrimaryFrom::Service { host } => Some(PrimaryAddress {
                host: host.clone(),
                port: self.config.port,
            }),
            PrimaryFrom::Annotation => self.primary_address.clone(),
        }
    }

    fn conninfo_for(&self, address: &PrimaryAddress) -> String {
        primary_conninfo(
            &address.host,
            address.port,
            &self.replication_user(),
            &self.passfile(),
            &self.config.pod_name,
        )
    }

    /// Before (re)starting a replica: the password file and the standby settings.
    fn prepare_replica_start(&mut self) -> Result<()> {
        if let Err(e) = self.write_passfile() {
            return Err(Error::DataDir(e));
        }
        let conninfo = if self.view().failed_primary.is_some() {
            // Failover under way: start without streaming (the position stays final).
            Some(String::new())
        } else {
            self.known_primary_address()
                .map(|address| self.conninfo_for(&address))
        };
        let extras = self.standby_extras();
        self.engine
            .write_standby_settings(conninfo.as_deref(), &extras)
            .map_err(Error::DataDir)?;
        self.extras_applied = Some(extras);
        self.wal_removed_since = None;
        if conninfo.is_some() {
            self.conninfo_applied = conninfo;
        }
        Ok(())
    }

    /// Replica: its slot once the primary reports keeping it (a primary run by an older
    /// agent has none, and streaming through a missing slot fails), and the archive as the
    /// fallback while the cluster archives.
    fn standby_extras(&self) -> StandbyExtras {
        let slot = slot_name(&self.config.pod_name);
        StandbyExtras {
            slot: self
                .primary_slots
                .as_ref()
                .filter(|slots| slots.contains(&slot))
                .map(|_| slot)
                .unwrap_or_default(),
            restore_command: if matches!(self.pod_view.borrow().destination(), Ok(Some(_))) {
                self.engine.standby_restore_command()
            } else {
                String::new()
            },
        }
    }

    /// Waits until the credentials Secret exists and is valid (exit 65 when it is not,
    /// 77 when watching it is forbidden), reporting while it is missing.
    async fn wait_for_credentials(&mut self) -> Result<Result<Credentials, Outcome>> {
        let name = self.config.credentials_secret.clone();
        loop {
            let view = self.secrets.borrow_and_update().clone();
            let problem = if let Some((message, forbidden)) = view.error {
                if forbidden {
                    return Err(Error::Forbidden(format!(
                        "watching credentials Secret {name}: {message}"
                    )));
                }
                Some(format!("watching credentials Secret {name}: {message}"))
            } else if view.listed {
                match view.secret {
                    Some(secret) => return Credentials::from_secret(&secret).map(Ok),
                    None => Some(format!("credentials Secret {name} not found")),
                }
            } else {
                None
            };
            if let Some(problem) = problem {
                tracing::warn!("{problem}; waiting");
                self.secret_problem = Some(problem);
                if let Some(outcome) = self.report().await? {
                    return Ok(Err(outcome));
                }
            }
            tokio::select! {
                changed = self.secrets.changed() => {
                    if changed.is_err() {
                        return Err(Error::Internal("the credentials watch ended".into()));
                    }
                }
                _ = self.sigterm.recv() => return Ok(Err(Outcome::Stopped)),
                _ = self.sigint.recv() => return Ok(Err(Outcome::Stopped)),
            }
        }
    }

    fn start_engine(&mut self) -> Result<Child> {
        let mut command = self.engine.server_command();
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        process::die_with_parent(&mut command);
        let mut child = process::spawn(&mut command)
            .map_err(|e| Error::Engine(format!("cannot start {}: {e}", self.engine.name())))?;
        let prefix = match self.engine.name() {
            "postgres" => "[postgres] ",
            "mariadbd" => "[mariadbd] ",
            _ => "[mysqld] ",
        };
        self.engine_last_error = Default::default();
        self.engine_output.clear();
        if let Some(out) = child.stdout.take() {
            let last_error = Some(self.engine_last_error.clone());
            self.engine_output
                .push(process::forward(out, prefix, last_error));
        }
        if let Some(err) = child.stderr.take() {
            let last_error = Some(self.engine_last_error.clone());
            self.engine_output
                .push(process::forward(err, prefix, last_error));
        }
        tracing::info!(pid = child.id(), "{} started", self.engine.name());
        Ok(child)
    }

    async fn supervise(&mut self, mut fresh: bool) -> Result<Outcome> {
        let mut failures = 0u32;
        let mut backoff = Duration::from_secs(1);
        // Since when a point-in-time restore has been waiting for WAL past its target.
        let mut waiting_for_target_wal: Option<tokio::time::Instant> = None;
        loop {
            if self.mode == Mode::Replica {
                self.prepare_replica_start()?;
            }
            let mut child = self.start_engine()?;
            let started = Instant::now();
            let exit = self.watch_engine(&mut child, &mut fresh).await;
            let exit = match exit {
                Ok(exit) => exit,
                Err(e) => {
                    self.stop(&mut child).await;
                    return Err(e);
                }
            };
            match exit {
                Exit::Act(action) => {
                    match &action {
                        Action::Switchover(target) => {
                            tracing::info!(
                                %target,
                                "planned switchover: CHECKPOINT, then a fast shutdown (the walsenders send all WAL, the shutdown checkpoint included, to the standbys)"
                            );
                            self.role_problem =
                                Some(format!("stopping for a switchover to {target}"));
                            self.ready = false;
                            self.health.set_ready(false);
                            let _ = self.report().await;
                            if let Err(e) = self
                                .engine
                                .admin_sql_for("CHECKPOINT;\n", STOP_TIMEOUT)
                                .await
                            {
                                tracing::warn!("CHECKPOINT before the switchover: {e}");
                            }
                        }
                        Action::Reclone => tracing::warn!(
                            "the former primary did not stream within {REJOIN_TIMEOUT:?} (its history may have forked): stopping it to re-clone"
                        ),
                        Action::CloneAfresh(reason) => {
                            tracing::warn!("{reason}: stopping to clone the primary afresh");
                            self.role_problem = Some(format!("re-cloning: {reason}"));
                        }
                        Action::Fence(reason) => {
                            tracing::warn!("fencing: {reason}; fast shutdown of the engine now");
                            self.role_problem = Some(format!("fenced: {reason}"));
                        }
                    }
                    let clean = match &action {
                        Action::Fence(_) => {
                            let timeout = self
                                .lock_duration()
                                .map(fence_stop_timeout)
                                .unwrap_or(FENCE_STOP_TIMEOUT);
                            let clean = self.stop_within(&mut child, timeout).await;
                            if let Some(lock) = self.lock.as_mut() {
                                lock.drop_hold();
                            }
                            clean
                        }
                        _ => self.stop(&mut child).await,
                    };
                    if let (Action::Switchover(_), true, Some(lock)) =
                        (&action, clean, self.lock.as_mut())
                    {
                        lock.release().await;
                    }
                    tracing::info!(clean, "{} stopped for a role change", self.engine.name());
                    self.ready = false;
                    self.health.set_ready(false);
                    if action == Action::Reclone {
                        self.move_data_aside()?;
                    }
                    if let Action::CloneAfresh(reason) = &action {
                        self.remove_data()?;
                        self.rejoining = Some(Rejoin::CaughtUpByClone(reason.clone()));
                    }
                    match self.prepare_postgres().await? {
                        Ok(_) => {
                            failures = 0;
                            backoff = Duration::from_secs(1);
                            continue;
                        }
                        Err(outcome) => return Ok(outcome),
                    }
                }
                Exit::Signalled => {
                    tracing::info!("stopping on signal");
                    let clean = self.stop(&mut child).await;
                    if clean
                        && self.mode == Mode::Primary
                        && let Some(lock) = self.lock.as_mut()
                    {
                        lock.release().await;
                    }
                    self.ready = false;
                    self.health.set_ready(false);
                    let _ = tokio::time::timeout(Duration::from_secs(5), self.report()).await;
                    return if clean {
                        tracing::info!("{} stopped cleanly", self.engine.name());
                        Ok(Outcome::Stopped)
                    } else {
                        Err(Error::Engine(format!(
                            "{} did not stop cleanly",
                            self.engine.name()
                        )))
                    };
                }
                Exit::Stale(why) => {
                    tracing::warn!("{why}: this agent is stale; stopping the engine and exiting");
                    self.stop(&mut child).await;
                    return Ok(Outcome::Stale(why));
                }
                Exit::Crashed(status) => {
                    process::release(child.id());
                    if started.elapsed() > STABLE_UPTIME {
                        failures = 0;
                        backoff = Duration::from_secs(1);
                    }
                    failures += 1;
                    self.ready = false;
                    self.health.set_ready(false);
                    self.health.set_failed(true);
                    let name = self.engine.name();
                    let last_error = self
                        .engine_exit_reason()
                        .await
                        .filter(|_| log_explains_exit(&status));
                    // The WAL past a restore's target time reaches the store within the
                    // source's archive_timeout: waited for, not counted as failures (nor
                    // reported as restarts).
                    let waiting_for_wal = last_error
                        .as_deref()
                        .is_some_and(|line| line.contains(RECOVERY_TARGET_NOT_REACHED))
                        && waiting_for_target_wal
                            .get_or_insert_with(tokio::time::Instant::now)
                            .elapsed()
                            < RECOVERY_TARGET_WAIT;
                    if waiting_for_wal {
                        failures = 0;
                    }
                    let why = last_error
                        .map(|line| format!(" — {line}"))
                        .unwrap_or_default();
                    if failures >= 2 && self.rejoin_deadline.is_some() {
                        tracing::warn!(
                            "{name} exited ({status}){why} twice while rejoining as a standby: re-cloning"
                        );
                        self.move_data_aside()?;
                        match self.prepare_postgres().await? {
                            Ok(_) => {
                                failures = 0;
                                backoff = Duration::from_secs(1);
                                continue;
                            }
                            Err(outcome) => return Ok(outcome),
                        }
                    }
                    if failures >= MAX_FAILURES {
                        return Err(Error::Engine(format!(
                            "{name} exited {failures} times in a row (last: {status}{why}); giving up"
                        )));
                    }
                    let exit = format!("{name} exited ({status}){why}");
                    let message = format!("{exit}; restarting in {}s", backoff.as_secs());
                    tracing::error!("{message}");
                    self.engine_error = Some(message);
                    if !waiting_for_wal {
                        self.restarts = self.restarts.saturating_add(1);
                        self.last_restart = Some((crate::report::now_rfc3339(), exit));
                    }
                    if let Some(outcome) = self.report().await? {
                        return Ok(outcome);
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.sigterm.recv() => return Ok(Outcome::Stopped),
                        _ = self.sigint.recv() => return Ok(Outcome::Stopped),
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// The last error line the engine printed before it exited, once its output is read
    /// to the end (bounded: a child it left behind may hold the pipe open).
    async fn engine_exit_reason(&mut self) -> Option<String> {
        for task in self.engine_output.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
        }
        self.engine_last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Stops the engine: its fast-shutdown signal, then SIGKILL after [`STOP_TIMEOUT`].
    /// Returns whether it exited cleanly.
    async fn stop(&self, child: &mut Child) -> bool {
        self.stop_within(child, STOP_TIMEOUT).await
    }

    /// [`Self::stop`] with SIGKILL after `timeout`.
    async fn stop_within(&self, child: &mut Child, timeout: Duration) -> bool {
        let pid = child.id();
        let clean = if let Some(pid) = pid {
            process::signal(pid, self.engine.stop_signal());
            match tokio::time::timeout(timeout, child.wait()).await {
                Ok(Ok(status)) => {
                    tracing::info!("{} exited ({status})", self.engine.name());
                    status.success()
                }
                Ok(Err(e)) => {
                    tracing::error!("waiting for {}: {e}", self.engine.name());
                    false
                }
                Err(_) => {
                    tracing::error!(
                        "{} did not stop within {timeout:?}; killing it",
                        self.engine.name()
                    );
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    false
                }
            }
        } else {
            true // already reaped
        };
        process::release(pid);
        clean
    }

    async fn watch_engine(&mut self, child: &mut Child, fresh: &mut bool) -> Result<Exit> {
        let mut next_probe = tokio::time::Instant::now() + STARTING_PROBE_INTERVAL;
        let mut reaper = tokio::time::interval(Duration::from_secs(1));
        let mut was_ready = false;
        let mut next_lock = tokio::time::Instant::now();
        let mut awaiting: Option<AwaitingReplicas> = None;
        loop {
            // Only a primary under high availability tends the lock.
            let lock_due = match (self.mode, self.lock_duration()) {
                (Mode::Primary, Some(_)) if self.lock.is_some() => Some(next_lock),
                _ => None,
            };
            tokio::select! {
                // First: after a freeze (SIGSTOP) every timer is due, and a lapsed lock must
                // stop the engine before anything else runs.
                biased;
                _ = sleep_until_opt(lock_due) => {
                    // The hold lapses on time even while a renewal hangs: its own timer.
                    let lapse = self
                        .lock_duration()
                        .and_then(|d| self.lock.as_ref().and_then(|lock| lock.lapses_at(d)));
                    let fence = match lapse {
                        Some(at) => tokio::time::timeout_at(at, self.tend_lock())
                            .await
                            .unwrap_or_else(|_| {
                                Some("the primary lock's renew deadline passed while renewing it".into())
                            }),
                        None => self.tend_lock().await,
                    };
                    if let Some(reason) = fence {
                        return Ok(Exit::Act(Action::Fence(reason)));
                    }
                    let interval = self
                        .lock_duration()
                        .map(renew_interval)
                        .unwrap_or(PROBE_INTERVAL);
                    next_lock = tokio::time::Instant::now() + interval;
                }
                status = child.wait() => {
                    return match status {
                        Ok(status) => Ok(Exit::Crashed(status)),
                        Err(e) => Err(Error::Internal(format!("waiting for the engine: {e}"))),
                    };
                }
                _ = self.sigterm.recv() => return Ok(Exit::Signalled),
                _ = self.sigint.recv() => return Ok(Exit::Signalled),
                changed = self.secrets.changed() => {
                    if changed.is_err() {
                        return Err(Error::Internal("the credentials watch ended".into()));
                    }
                    next_probe = tokio::time::Instant::now();
                }
                ok = changed(&mut self.cluster) => {
                    if !ok {
                        return Err(Error::Internal("the DatabaseCluster watch ended".into()));
                    }
                    next_probe = tokio::time::Instant::now();
                }
                ok = changed(&mut self.replication) => {
                    if !ok {
                        return Err(Error::Internal("the replication Secret watch ended".into()));
                    }
                    next_probe = tokio::time::Instant::now();
                }
                // A backup's progress, or a new request on the pod: act and report promptly.
                _ = self.shared.changed.notified() => next_probe = tokio::time::Instant::now(),
                changed = self.pod_view.changed() => {
                    if changed.is_err() {
                        return Err(Error::Internal("the pod watch ended".into()));
                    }
                    next_probe = tokio::time::Instant::now();
                }
                _ = reaper.tick() => process::reap_orphans(),
                _ = tokio::time::sleep_until(next_probe) => {
                    // A primary's hold on the lock lapses on time even while a probe or a
                    // report hangs (the lock arm cannot run meanwhile): the deadline bounds
                    // them, and missing it fences.
                    let lapse = match (self.mode, self.lock_duration(), self.lock.as_ref()) {
                        (Mode::Primary, Some(d), Some(lock)) => lock.lapses_at(d),
                        _ => None,
                    };
                    let work = async {
                        self.tick(fresh, &mut was_ready).await;
                        self.report().await
                    };
                    let reported = match lapse {
                        Some(at) => match tokio::time::timeout_at(at, work).await {
                            Ok(reported) => reported,
                            Err(_) => {
                                return Ok(Exit::Act(Action::Fence(
                                    "the primary lock's renew deadline passed while probing and reporting".into(),
                                )));
                            }
                        },
                        None => work.await,
                    };
                    if let Some(Outcome::Stale(why)) = reported? {
                        return Ok(Exit::Stale(why));
                    }
                    if let Some(action) = self.action.take() {
                        return Ok(Exit::Act(action));
                    }
                    let now = tokio::time::Instant::now();
                    awaiting = AwaitingReplicas::next(awaiting, self.streaming_short_of_replicas(), now);
                    let hurry_for_replicas = awaiting.is_some_and(|a| a.hurries(now));
                    let interval = if self.ready
                        && self.switchover_problem.is_none()
                        && !hurry_for_replicas
                    {
                        PROBE_INTERVAL
                    } else {
                        STARTING_PROBE_INTERVAL
                    };
                    next_probe = tokio::time::Instant::now() + interval;
                }
            }
        }
    }

    /// A PostgreSQL primary some of whose replicas do not stream from it (yet): how many do.
    /// It probes often for a while ([`AwaitingReplicas`]), so the operator learns soon that a
    /// replica streams again (a replica counts as ready only once its primary lists it).
    fn streaming_short_of_replicas(&self) -> Option<usize> {
        let expected = usize::try_from(self.view().replicas.saturating_sub(1)).unwrap_or(0);
        if self.mode != Mode::Primary {
            return None;
        }
        let streaming = self.probe.as_ref()?.streaming_replicas.as_ref()?.len();
        (streaming < expected).then_some(streaming)
    }

    /// The primary lock's durations, while high availability is on, from the spec (as this
    /// agent sees it) and the Lease ([`lock_durations`]).
    fn lock_durations(&self) -> Option<LockDurations> {
        let own = self.view().lock_duration?;
        Some(match &self.lock {
            Some(lock) => lock_durations(own, lock.view.borrow().lease.as_ref()),
            None => lock_durations(own, None),
        })
    }

    /// The duration this instance fences on as the holder ([`LockDurations::hold`]).
    fn lock_duration(&self) -> Option<Duration> {
        self.lock_durations().map(|d| d.hold)
    }

    /// The cluster as last seen (empty for the MySQL family).
    fn view(&self) -> ClusterView {
        self.cluster
            .as_ref()
            .map(|rx| rx.borrow().clone())
            .unwrap_or_default()
    }

    /// Primary under high availability: renews the lock while the engine is healthy and no
    /// failover away from this instance is under way. Returns why to fence, if so: a hold that
    /// lapsed (checked before any request: after a freeze the answer must not depend on the
    /// network), the lock held by another pod, or a failover away from here.
    async fn tend_lock(&mut self) -> Option<String> {
        let view = self.view();
        let durations = self.lock_durations()?;
        let duration = durations.hold;
        if self.mode != Mode::Primary {
            return None;
        }
        if let Some(why) = failover_away(&view, &self.config.pod_name) {
            return Some(why);
        }
        let me = self.config.pod_name.clone();
        let lock = self.lock.as_mut()?;
        let had_hold = lock.lapses_at(duration).is_some();
        if had_hold && !lock.held(duration) {
            return Some(format!(
                "the primary lock was not renewed within its renew deadline of {}ms ({})",
                renew_deadline(duration).as_millis(),
                self.lock_problem
                    .clone()
                    .unwrap_or_else(|| "no renewal attempt completed".into())
            ));
        }
        if had_hold && let Some(holder) = lock.view.borrow().holder().filter(|h| *h != me) {
            return Some(format!("the primary lock is held by {holder}"));
        }
        if let Some(error) = &self.engine_error {
            // Unhealthy: let the lock lapse (and fence at the deadline) rather than keep
            // a primary that does not serve.
            self.lock_problem = Some(format!("not renewing the primary lock: {error}"));
            return None;
        }
        match lock.acquire(durations).await {
            Ok(()) => self.lock_problem = None,
            // A fresh read names another holder: this hold is over, whatever our clock says
            // (after a suspended VM resumes, its monotonic clock has not advanced).
            Err(AcquireError::HeldBy { holder, .. }) if had_hold => {
                return Some(format!("the primary lock is held by {holder}"));
            }
            Err(why) => {
                let why = why.to_string();
                if self.lock_problem.as_deref() != Some(why.as_str()) {
                    tracing::warn!("renewing the primary lock: {why}");
                }
                let lapsed = had_hold && !lock.held(duration);
                self.lock_problem = Some(why.clone());
                if lapsed {
                    return Some(format!(
                        "the primary lock was not renewed within its renew deadline of {}ms ({why})",
                        renew_deadline(duration).as_millis()
                    ));
                }
            }
        }
        None
    }

    /// Takes in the Secret's latest state, probes the engine and applies credentials.
    async fn tick(&mut self, fresh: &mut bool, was_ready: &mut bool) {
        let name = self.config.credentials_secret.clone();
        let view = self.secrets.borrow_and_update().clone();
        self.secret_problem = view.problem("credentials", &name);
        if let Some(secret) = &view.secret {
            take_in_secret(
                secret,
                &mut self.seen_version,
                &mut self.desired,
                &mut self.invalid_error,
                Credentials::from_secret,
            );
        }

        if let Err(e) = self.refresh_replication_secret() {
            self.replication_problem = Some(e.one_line());
        }
        self.check_role();
        let resolve_problem = if self.mode == Mode::Replica {
            self.refresh_primary_address().await
        } else {
            None
        };

        match self.engine.probe().await {
            Ok(mut probe) => {
                *was_ready = true;
                self.engine_error = None;
                self.health.set_failed(false);
                if *fresh {
                    if let Err(e) = self.engine.secure_root().await {
                        tracing::warn!("restricting root to the socket: {e}");
                    }
                    *fresh = false;
                }
                if self.cluster.is_some()
                    && let Some(id) = &probe.system_identifier
                {
                    self.shared.set_system_identifier(id);
                }
                if !self.tick_restore(&probe).await {
                    // Restoring: not ready, no credentials, no backups yet.
                    self.ready = false;
                    self.probe = Some(probe);
                    self.health.set_ready(false);
                    return;
                }
                self.tend_backup(&probe);
                if self.mode == Mode::Replica {
                    let view = self.view();
                    let mut promoted = if view.failed_primary.is_some() {
                        self.tick_failover(&view, &probe).await
                    } else {
                        self.failover_ack = None;
                        match self.switchover_source() {
                            Some(old) => self.try_promote(&old).await,
                            None => {
                                self.switchover_problem = None;
                                false
                            }
                        }
                    };
                    if !promoted
                        && probe.role == devctl_api::instance::ROLE_PRIMARY
                        && self.action.is_none()
                    {
                        // Out of recovery without a promotion this tick: one that completed
                        // after its call gave up. The engine accepts writes, so it runs as
                        // the primary only if this pod is the one named and holds the lock;
                        // otherwise it is stopped at once and rejoins (rewinds) as a standby.
                        let me = self.config.pod_name.as_str();
                        let named = view.failed_primary.as_deref() != Some(me)
                            && (view.target_primary.as_deref() == Some(me)
                                || view.current_primary.as_deref() == Some(me));
                        if named && self.gate_primary().await.is_ok() {
                            tracing::info!(
                                "the engine left recovery after its promotion call returned: running as the primary"
                            );
                            self.promoted().await;
                            promoted = true;
                        } else {
                            self.action = Some(Action::Fence(
                                "the engine accepts writes although this instance runs as a replica"
                                    .into(),
                            ));
                        }
                    }
                    if !promoted {
                        self.tick_replica(probe, resolve_problem).await;
                        self.health.set_ready(self.ready);
                        return;
                    }
                    self.mode = Mode::Primary;
                    self.switchover_problem = None;
                    self.replica_problem = None;
                    self.role_problem = None;
                    self.primary_address = None;
                    self.conninfo_applied = None;
                    self.rejoin_deadline = None;
                    self.failover_ack = None;
                    self.sync_applied = None;
                    if let Ok(after) = self.engine.probe().await {
                        probe = after;
                    }
                }
                let primary = probe.role == devctl_api::instance::ROLE_PRIMARY;
                if primary
                    && let Some(desired) = self.desired.clone()
                    && self.applied.as_deref() != Some(desired.version.as_str())
                {
                    match self.engine.apply_credentials(&desired).await {
                        Ok(()) => {
                            tracing::info!(
                                version = %desired.version,
                                user = %desired.username,
                                database = %desired.dbname,
                                "applied the credentials Secret"
                            );
                            self.applied = Some(desired.version.clone());
                            self.apply_error = None;
                        }
                        Err(e) => {
                            let message = format!("applying credentials: {e}");
                            tracing::error!("{message}");
                            self.apply_error = Some(message);
                        }
                    }
                }
                if primary && self.applied.is_some() {
                    self.apply_replication_role().await;
                    self.apply_synchronous_standbys().await;
                }
                if self.cluster.is_some() {
                    self.apply_slots(&probe, primary).await;
                }
                self.ready = self.applied.is_some() || !primary;
                self.probe = Some(probe);
            }
            Err(e) => {
                self.ready = false;
                if *was_ready {
                    let message =
                        format!("{} is not accepting connections: {e}", self.engine.name());
                    tracing::warn!("{message}");
                    self.engine_error = Some(message);
                }
            }
        }
        self.health.set_ready(self.ready);
    }

    /// A restore's progress on the running engine; `false` while it is not done.
    /// PostgreSQL: done once the engine has promoted (then the recovery settings are
    /// cleared, also leftovers of an agent that stopped in between). MySQL family: replays
    /// the dump (retried with backoff) before anything else touches the server.
    async fn tick_restore(&mut self, probe: &Probe) -> bool {
        if self.cluster.is_some() {
            if self.mode != Mode::Primary {
                return true;
            }
            let leftovers = !self.recovery_settings_checked
                && probe.role == devctl_api::instance::ROLE_PRIMARY
                && self.engine.has_recovery_settings();
            if !self.recovering && !leftovers {
                self.recovery_settings_checked |= probe.role == devctl_api::instance::ROLE_PRIMARY;
                return true;
            }
            if probe.role != devctl_api::instance::ROLE_PRIMARY {
                self.restore_problem = Some(format!(
                    "restoring a backup: replaying archived WAL (replayed {})",
                    probe.replayed_lsn.as_deref().unwrap_or("nothing yet")
                ));
                return false;
            }
            match self.engine.clear_recovery_settings().await {
                Ok(()) => {
                    tracing::info!(
                        timeline = ?probe.timeline,
                        "the restored instance promoted: recovery settings cleared; running as the primary"
                    );
                    self.recovering = false;
                    self.recovery_settings_checked = true;
                    self.restore_problem = None;
                    true
                }
                Err(e) => {
                    self.restore_problem = Some(format!(
                        "clearing the recovery settings after the restore: {e}"
                    ));
                    false
                }
            }
        } else {
            if !self.mysql_restore_pending {
                return true;
            }
            if self.mysql_restore_at.is_some_and(|at| Instant::now() < at) {
                return false;
            }
            let shared = self.shared.clone();
            match restore_mysql(&shared).await {
                Ok(message) => {
                    tracing::info!("{message}");
                    self.mysql_restore_pending = false;
                    self.restore_problem = None;
                    true
                }
                Err(RestoreError::Wait(why)) => {
                    self.restore_problem = Some(why);
                    self.mysql_restore_at = Some(Instant::now() + WAIT_INTERVAL);
                    false
                }
                Err(RestoreError::Failed(why)) => {
                    let retry_in = self.mysql_restore_backoff;
                    self.mysql_restore_backoff = (retry_in * 2).min(MAX_BACKOFF);
                    let message = format!("restoring: {why}; retrying in {}s", retry_in.as_secs());
                    tracing::error!("{message}");
                    self.restore_problem = Some(message);
                    self.mysql_restore_at = Some(Instant::now() + retry_in);
                    false
                }
            }
        }
    }

    /// Starts the backup the pod's request names, unless one runs or that request (same
    /// uid) already finished. It runs as its own task: probes, reports and the primary lock
    /// go on meanwhile.
    fn tend_backup(&mut self, probe: &Probe) {
        if let Some(task) = &self.backup_task {
            if !task.is_finished() {
                return;
            }
            self.backup_task = None;
        }
        let view = self.pod_view.borrow().clone();
        let request = match view.backup_request() {
            None => {
                self.backup_request_problem = None;
                return;
            }
            Some(Err(e)) => {
                if self.backup_request_problem.as_ref() != Some(&e) {
                    tracing::warn!("{e}");
                }
                self.backup_request_problem = Some(e);
                return;
            }
            Some(Ok(request)) => request,
        };
        self.backup_request_problem = None;
        if !should_start(&request, self.shared.backup().as_ref()) {
            return;
        }
        let replica = probe.role == devctl_api::instance::ROLE_REPLICA;
        let switch_via = if replica && self.replication_desired.is_some() {
            self.known_primary_address().map(|address| SwitchVia {
                host: address.host,
                port: address.port,
                user: self.replication_user(),
                passfile: self.passfile(),
            })
        } else {
            None
        };
        let context = BackupContext {
            version: probe.engine_version.clone(),
            replica,
            switch_via,
        };
        self.backup_task = Some(tokio::spawn(run_backup(
            self.shared.clone(),
            request,
            context,
        )));
    }

    /// Compares this instance's mode with `status.currentPrimary`/`targetPrimary`: a
    /// primary asked to hand over (or no longer named) gets an [`Action`]; a replica named
    /// without a switchover only reports it (failover is not implemented).
    fn check_role(&mut self) {
        let Some(rx) = &mut self.cluster else {
            return;
        };
        let view = rx.borrow_and_update().clone();
        let away = failover_away(&view, &self.config.pod_name);
        let (current, target) = (view.current_primary, view.target_primary);
        let me = self.config.pod_name.as_str();
        let mut problem = None;
        match (self.mode, current.as_deref()) {
            (Mode::Primary, _) if away.is_some() => {
                if self.action.is_none()
                    && let Some(why) = away
                {
                    self.action = Some(Action::Fence(why));
                }
            }
            (Mode::Primary, Some(c)) if c == me => {
                if let Some(t) = target.as_deref().filter(|t| *t != me)
                    && self.action.is_none()
                {
                    tracing::info!(target = %t, "status.targetPrimary names another pod");
                    self.action = Some(Action::Switchover(t.to_string()));
                }
            }
            // Promoted in a switchover or failover (targetPrimary names this pod): the primary
            // until the operator names it. Otherwise another pod is the primary: stop, and
            // rejoin as its standby.
            (Mode::Primary, Some(other))
                if target.as_deref() != Some(me) && self.action.is_none() =>
            {
                self.action = Some(Action::Fence(format!(
                    "status.currentPrimary names {other}"
                )));
            }
            (Mode::Replica, Some(c)) if c == me => {
                problem = Some(PROMOTION_UNSUPPORTED.to_string());
            }
            _ => {}
        }
        if problem.is_some() && problem != self.role_problem {
            tracing::warn!(
                current_primary = ?current,
                "status.currentPrimary changed to name {}; {}",
                current.as_deref().unwrap_or("?"),
                problem.as_deref().unwrap_or_default()
            );
        }
        self.role_problem = problem;
    }

    /// Failover (`status.failedPrimary` set): stop streaming (the conninfo is emptied by
    /// [`Self::tick_replica`]), report the final position for this epoch, and — once elected
    /// (`targetPrimary` names this pod) — take the lock and promote. Returns whether it
    /// promoted.
    async fn tick_failover(&mut self, view: &ClusterView, probe: &Probe) -> bool {
        let epoch = view.failover_epoch;
        let stopped = self.conninfo_applied.as_deref() == Some("") && probe.wal_receiver.is_none();
        if stopped && self.failover_stopped.is_none_or(|(e, _)| e != epoch) {
            self.failover_stopped = Some((epoch, Instant::now()));
        }
        let held_back = self.hooks.failover_ack_delay().is_some_and(|delay| {
            self.failover_stopped
                .is_some_and(|(_, at)| at.elapsed() < delay)
        });
        if stopped && held_back && self.failover_ack != Some(epoch) {
            tracing::info!(
                epoch,
                "test hook: holding the failover acknowledgement back"
            );
        } else if stopped && self.failover_ack != Some(epoch) {
            tracing::info!(
                epoch,
                received = ?probe.received_lsn,
                replayed = ?probe.replayed_lsn,
                timeline = ?probe.timeline,
                "failover: stopped streaming; reporting the final position"
            );
            self.failover_ack = Some(epoch);
        }
        let me = self.config.pod_name.clone();
        if view.target_primary.as_deref() != Some(me.as_str()) || self.failover_ack != Some(epoch) {
            self.switchover_problem = None;
            return false;
        }
        if let Err(why) = self.gate_primary().await {
            let why = format!("failover to this pod: {why}");
            if self.switchover_problem.as_deref() != Some(why.as_str()) {
                tracing::info!("{why}");
            }
            self.switchover_problem = Some(why);
            return false;
        }
        tracing::info!(epoch, "elected by the operator: promoting");
        match self.engine.promote().await {
            Ok(()) => {
                self.promoted().await;
                true
            }
            Err(e) => {
                self.switchover_problem = Some(format!("failover to this pod: promoting: {e}"));
                false
            }
        }
    }

    /// The engine left recovery (a switchover or failover target): renew the lock at once
    /// (the promotion took time), and checkpoint in the background — best effort, nothing
    /// waits for it: the instance is the primary from the moment it accepts writes.
    async fn promoted(&mut self) {
        tracing::info!("promoted: running as the primary");
        if let (Some(duration), Some(lock)) = (self.lock_durations(), self.lock.as_mut())
            && let Err(why) = lock.acquire(duration).await
        {
            tracing::warn!("renewing the primary lock after promotion: {why}");
        }
        let (engine, hooks) = (self.engine.clone(), self.hooks.clone());
        tokio::spawn(async move {
            // Retried while it fails (for at most [`CHECKPOINT_RETRIES`] tries): a former
            // primary rewinds only once the new timeline is in the control file.
            for attempt in 1..=CHECKPOINT_RETRIES {
                match engine.checkpoint_after_promotion(&hooks).await {
                    Ok(()) => {
                        tracing::info!("checkpointed after the promotion");
                        return;
                    }
                    Err(e) if attempt == 1 => tracing::warn!(
                        "CHECKPOINT after the promotion (best effort, retried every {}s): {e}",
                        CHECKPOINT_RETRY_INTERVAL.as_secs()
                    ),
                    Err(_) => {}
                }
                tokio::time::sleep(CHECKPOINT_RETRY_INTERVAL).await;
            }
        });
    }

    /// Primary: `synchronous_standby_names` in line with `spec.replication.synchronous`.
    async fn apply_synchronous_standbys(&mut self) {
        if self.cluster.is_none() {
            return; // PostgreSQL only
        }
        let desired = synchronous_standby_names(&self.view(), &self.config.pod_name);
        if self.sync_applied.as_deref() == Some(desired.as_str()) {
            return;
        }
        match self.engine.set_synchronous_standby_names(&desired).await {
            Ok(()) => {
                tracing::info!(synchronous_standby_names = %desired, "synchronous replication set");
                self.sync_applied = Some(desired);
            }
            Err(e) => {
                let message = format!("setting synchronous_standby_names: {e}");
                tracing::error!("{message}");
                self.replication_apply_error = Some(message);
            }
        }
    }

    /// The agent's replication slots in line with the cluster: on the primary one per other
    /// instance (`spec.replicas`), a lost one (past `max_slot_wal_keep_size`) made anew
    /// once unused; slots of removed instances and any on a replica dropped. Slots the
    /// agent did not name are never touched.
    async fn apply_slots(&mut self, probe: &Probe, primary: bool) {
        let desired = if primary {
            desired_slots(&self.view(), &self.config.pod_name)
        } else {
            Vec::new()
        };
        let mut problems = Vec::new();
        for change in slot_changes(&desired, &probe.slots) {
            let result = match &change {
                SlotChange::Create(name) => self.engine.create_slot(name).await,
                SlotChange::Drop(name) => self.engine.drop_slot(name).await,
                SlotChange::Renew(name) => match self.engine.drop_slot(name).await {
                    Ok(()) => self.engine.create_slot(name).await,
                    Err(e) => Err(e),
                },
            };
            match result {
                Ok(()) => tracing::info!(?change, "replication slot"),
                Err(e) => problems.push(format!("replication slot {change:?}: {e}")),
            }
        }
        let problem = (!problems.is_empty()).then(|| problems.join("; "));
        if problem.is_some() && problem != self.slot_problem {
            tracing::warn!("{}", problem.as_deref().unwrap_or_default());
        }
        self.slot_problem = problem;
    }

    /// The old primary when this replica is a switchover's target (`targetPrimary` names
    /// this pod, `currentPrimary` another).
    fn switchover_source(&self) -> Option<String> {
        let view = self.cluster.as_ref()?.borrow().clone();
        let me = self.config.pod_name.as_str();
        if view.target_primary.as_deref() != Some(me) {
            return None;
        }
        view.current_primary.filter(|c| c != me)
    }

    /// Switchover target: promotes once `old` reports `finalLSN` (stopped, not ready) and
    /// this standby has received it and replayed past it: a switchover loses nothing.
    /// Returns whether it promoted; otherwise `switchover_problem` says why not.
    async fn try_promote(&mut self, old: &str) -> bool {
        let why = match read_report(&self.pods, old).await {
            Err(e) => format!("switchover to this pod: {e}"),
            Ok(report) => match report.filter(|r| !r.ready).and_then(|r| r.final_lsn) {
                None => {
                    format!("switchover to this pod: waiting for {old} to stop and report finalLSN")
                }
                Some(final_lsn) => match self.engine.switchover_progress(&final_lsn).await {
                    Ok(Some(why)) => format!("switchover to this pod: {why}"),
                    Err(e) => format!("switchover to this pod: {e}"),
                    Ok(None) if self.gate_primary().await.is_err() => {
                        format!(
                            "switchover to this pod: {}",
                            self.lock_problem.clone().unwrap_or_default()
                        )
                    }
                    Ok(None) => {
                        tracing::info!(%final_lsn, %old, "replayed the old primary's shutdown checkpoint: promoting");
                        match self.engine.promote().await {
                            Ok(()) => {
                                self.promoted().await;
                                return true;
                            }
                            Err(e) => format!("switchover to this pod: promoting: {e}"),
                        }
                    }
                },
            },
        };
        if self.switchover_problem.as_deref() != Some(why.as_str()) {
            tracing::info!("{why}");
        }
        self.switchover_problem = Some(why);
        false
    }

    /// Replica: the primary's address (`annotation`: from its report, kept when the report
    /// is not ready, e.g. while the primary restarts) and the slots it keeps. Returns why
    /// they are unknown, if so.
    async fn refresh_primary_address(&mut self) -> Option<String> {
        if let Err(e) = self.write_passfile() {
            return Some(e);
        }
        if self.view().failed_primary.is_some() {
            return None;
        }
        let current = self
            .cluster
            .as_ref()
            .and_then(|rx| rx.borrow().current_primary.clone());
        // Named ourselves (a promotion we do not make): keep streaming from where we do.
        // (`None`: no problem to report.)
        let primary = current.filter(|p| *p != self.config.pod_name)?;
        match resolve_primary_report(&self.pods, &self.config, &primary).await {
            Ok((address, report)) => {
                if self.primary_address.as_ref() != Some(&address) {
                    tracing::info!(%primary, %address, "the primary's address");
                }
                self.primary_address = Some(address);
                self.primary_slots = report.replication_slots;
                None
            }
            // `service`: the Service's address serves whatever the report says.
            Err(_) if !matches!(self.config.primary_from, PrimaryFrom::Annotation) => None,
            Err(why) => Some(why),
        }
    }

    /// A replica's probe: a changed primary address is applied (`ALTER SYSTEM` and a
    /// reload), and the replica is ready only while it streams.
    async fn tick_replica(&mut self, probe: Probe, resolve_problem: Option<String>) {
        let mut conninfo_error = None;
        let failing_over = self.view().failed_primary.is_some();
        let desired = if failing_over || self.hooks.wal_receiver_stopped() {
            // Failover: stop the WAL receiver so the position reported is final.
            Some(String::new())
        } else {
            self.known_primary_address()
                .map(|address| self.conninfo_for(&address))
        };
        if let Some(conninfo) = desired
            && self.conninfo_applied.as_deref() != Some(conninfo.as_str())
        {
            match self.engine.set_primary_conninfo(&conninfo).await {
                Ok(()) => {
                    if conninfo.is_empty() {
                        tracing::info!("primary_conninfo emptied: WAL receiver stopped");
                    } else {
                        tracing::info!("primary_conninfo set; configuration reloaded");
                    }
                    self.conninfo_applied = Some(conninfo);
                }
                Err(e) => {
                    tracing::error!("setting primary_conninfo: {e}");
                    conninfo_error = Some(format!("setting primary_conninfo: {e}"));
                }
            }
        }
        let extras = self.standby_extras();
        if !failing_over && self.extras_applied.as_ref() != Some(&extras) {
            match self.engine.set_standby_extras(&extras).await {
                Ok(()) => {
                    tracing::info!(slot = %extras.slot, archive = !extras.restore_command.is_empty(), "primary_slot_name and restore_command set; configuration reloaded");
                    self.extras_applied = Some(extras);
                }
                Err(e) => {
                    tracing::error!("setting primary_slot_name and restore_command: {e}");
                    conninfo_error = Some(format!("setting primary_slot_name and restore_command: {e}"));
                }
            }
        }
        self.ready = probe.is_streaming();
        if !failing_over
            && self.action.is_none()
            && let Some(reason) = self.wal_gone(&probe)
        {
            self.action = Some(Action::CloneAfresh(reason));
        }
        if probe.wal_receiver.is_some() && probe.timeline.is_some() {
            self.stream_timeline = probe.timeline;
        }
        if self.ready {
            if self.rejoin_deadline.take().is_some() {
                tracing::info!("the former primary streams from the new primary");
            }
            if let Some(how) = self.rejoining.take() {
                self.publish_rejoined(&how).await;
            }
        } else if self.rejoin_deadline.is_some_and(|d| Instant::now() >= d) && self.action.is_none()
        {
            self.action = Some(Action::Reclone);
        }
        self.replica_problem = if self.ready {
            None
        } else if failing_over {
            let show = |lsn: &Option<String>| lsn.clone().unwrap_or_else(|| "none".into());
            Some(format!(
                "failover (epoch {}): streaming stopped at received {}, replayed {}",
                self.view().failover_epoch,
                show(&probe.received_lsn),
                show(&probe.replayed_lsn)
            ))
        } else {
            let from = self
                .known_primary_address()
                .map(|a| format!(" at {a}"))
                .unwrap_or_default();
            let receiver = probe.wal_receiver.as_deref().unwrap_or("not running");
            let mut message =
                format!("not streaming from the primary{from} (WAL receiver: {receiver})");
            if probe.role != devctl_api::instance::ROLE_REPLICA {
                message = format!(
                    "the engine is not in recovery although this instance is a replica; {message}"
                );
            }
            if let Some(why) = resolve_problem {
                message = format!("{message}; {why}");
            }
            Some(message)
        }
        .or(conninfo_error);
        self.probe = Some(probe);
    }

    /// Replica: whether it must re-clone because the WAL it needs is gone — the primary
    /// said so (its walsender's error in the engine's log) and nothing was replayed since,
    /// for [`WAL_REMOVED_RECLONE_AFTER`] (the archive, when there is one, had its turn).
    fn wal_gone(&mut self, probe: &Probe) -> Option<String> {
        if self.ready {
            self.wal_removed_since = None;
            return None;
        }
        let said = {
            let mut last = self
                .engine_last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match last.as_deref() {
                Some(line) if line.contains(WAL_REMOVED) => last.take(),
                _ => None,
            }
        };
        let replayed = probe.replayed_lsn.clone();
        match (&self.wal_removed_since, said) {
            (None, None) => return None,
            (None, Some(line)) => {
                tracing::warn!("the primary no longer has the WAL this replica needs: {line}");
                self.wal_removed_since = Some((Instant::now(), replayed));
                return None;
            }
            // Replaying (from the archive): still catching up.
            (Some((_, at)), _) if *at != replayed => {
                self.wal_removed_since = Some((Instant::now(), replayed));
                return None;
            }
            _ => {}
        }
        let (since, _) = self.wal_removed_since.as_ref()?;
        (since.elapsed() >= WAL_REMOVED_RECLONE_AFTER).then(|| {
            format!(
                "the primary no longer has the WAL this replica needs (requested WAL segment {WAL_REMOVED}) and {} for {}s",
                if self.extras_applied.as_ref().is_some_and(|e| !e.restore_command.is_empty()) {
                    "the archive did not provide it"
                } else {
                    "there is no archive to fetch it from"
                },
                WAL_REMOVED_RECLONE_AFTER.as_secs()
            )
        })
    }

    /// Event `Rejoined` on the cluster: a former primary streams from the new one.
    async fn publish_rejoined(&self, how: &Rejoin) {
        let view = self.view();
        let reference = ObjectReference {
            api_version: Some(format!("{}/v1beta1", devctl_api::DB_GROUP)),
            kind: Some("DatabaseCluster".into()),
            name: Some(self.config.cluster.clone()),
            namespace: Some(self.config.pod_namespace.clone()),
            uid: view.uid.clone(),
            ..Default::default()
        };
        let pod = &self.config.pod_name;
        let primary = view.current_primary.unwrap_or_default();
        let event = ClusterEvent {
            type_: EventType::Normal,
            reason: match how {
                Rejoin::CaughtUpByClone(_) => "Recloned",
                _ => "Rejoined",
            }
            .into(),
            note: Some(match how {
                Rejoin::Rewound => format!(
                    "{pod} rejoined as a standby of {primary} (rewound from its former primary's data)"
                ),
                Rejoin::Recloned(aside) => format!(
                    "{pod} rejoined as a standby of {primary} (re-cloned: its former primary's data could not follow and was moved aside to {aside})"
                ),
                Rejoin::CaughtUpByClone(reason) => format!(
                    "{pod} was re-cloned from {primary} and streams again: {reason}"
                ),
            }),
            action: match how {
                Rejoin::CaughtUpByClone(_) => format!("Reclone {pod}"),
                _ => format!("Rejoin {pod}"),
            },
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(
                "publishing the Rejoined event: {}",
                one_line(&e.to_string())
            );
        }
    }

    /// Primary: the replication role in line with the replication Secret, once the app
    /// role and database exist (the role may connect to no database).
    async fn apply_replication_role(&mut self) {
        let (Some(replication), Some(app)) =
            (self.replication_desired.clone(), self.desired.clone())
        else {
            return;
        };
        let key = format!("{}/{}", replication.version, app.version);
        if self.replication_applied.as_deref() == Some(key.as_str()) {
            return;
        }
        match self.engine.apply_replication_role(&replication, &app).await {
            Ok(()) => {
                tracing::info!(
                    version = %replication.version,
                    user = %replication.username,
                    "applied the replication Secret"
                );
                self.replication_applied = Some(key);
                self.replication_apply_error = None;
            }
            Err(e) => {
                let message = format!("applying the replication role: {e}");
                tracing::error!("{message}");
                self.replication_apply_error = Some(message);
            }
        }
    }

    fn status(&self) -> InstanceStatus {
        let probe = self.probe.clone().unwrap_or_default();
        let stopped_for_switchover = self.final_lsn.is_some();
        InstanceStatus {
            role: if stopped_for_switchover {
                Some(devctl_api::instance::ROLE_PRIMARY.to_string())
            } else {
                (!probe.role.is_empty()).then_some(probe.role)
            },
            ready: self.ready && !stopped_for_switchover,
            system_identifier: probe.system_identifier,
            timeline: match (self.mode, probe.timeline, self.stream_timeline) {
                (Mode::Replica, Some(probed), Some(streamed)) => Some(probed.max(streamed)),
                (_, probed, _) => probed,
            },
            received_lsn: probe.received_lsn,
            replayed_lsn: probe.replayed_lsn,
            lag_bytes: probe.lag_bytes,
            engine_version: probe.engine_version,
            address: Some(self.config.address()),
            heartbeat: None,
            // The engine being down outranks everything else: an older complaint (an
            // invalid Secret not yet corrected) would otherwise hide the crash.
            last_error: self
                .engine_error
                .clone()
                .or_else(|| self.secret_problem.clone())
                .or_else(|| self.invalid_error.clone())
                .or_else(|| self.role_problem.clone())
                .or_else(|| self.restore_problem.clone())
                .or_else(|| self.apply_error.clone())
                .or_else(|| self.switchover_problem.clone())
                .or_else(|| self.replica_problem.clone())
                .or_else(|| self.replication_problem.clone())
                .or_else(|| self.replication_invalid.clone())
                .or_else(|| self.replication_apply_error.clone())
                .or_else(|| self.slot_problem.clone()),
            final_lsn: self.final_lsn.clone(),
            streaming_replicas: probe.streaming_replicas,
            replication_slots: (self.mode == Mode::Primary && self.cluster.is_some()).then(|| {
                probe
                    .slots
                    .iter()
                    .filter(|s| !s.lost)
                    .map(|s| s.name.clone())
                    .collect()
            }),
            restarts: (self.restarts > 0).then_some(self.restarts),
            last_restart_time: self.last_restart.as_ref().map(|(at, _)| at.clone()),
            last_exit: self.last_restart.as_ref().map(|(_, exit)| exit.clone()),
            backup: self.shared.backup(),
            // The primary's archiving, while there is a destination to archive to.
            wal_archive: (self.cluster.is_some()
                && self.mode == Mode::Primary
                && self.pod_view.borrow().destination.is_some())
            .then(|| self.shared.wal_archive())
            .flatten(),
            failover_epoch: self
                .failover_ack
                .filter(|_| self.mode == Mode::Replica && self.view().failed_primary.is_some()),
            credentials_version: match self.mode {
                Mode::Primary => self.applied.clone(),
                // Replicas do not apply credentials: the roles replicate from the primary
                // within seconds, so a replica that runs reports the Secret version it has
                // seen (simpler than waiting for its replay LSN to pass the primary's
                // apply, and what the operator needs to clear `CredentialsRegenerated`).
                Mode::Replica if self.probe.is_some() => {
                    self.desired.as_ref().map(|d| d.version.clone())
                }
                Mode::Replica => None,
            },
        }
    }

    /// Writes the report if it changed (or the heartbeat is due). `Some(Stale)` when the pod
    /// was replaced; forbidden before any successful write is fatal (exit 77).
    async fn report(&mut self) -> Result<Option<Outcome>> {
        match self.reporter.report(self.status()).await {
            Ok(_) => {
                self.reported_once = true;
                Ok(None)
            }
            Err(WriteError::Stale(why)) => Ok(Some(Outcome::Stale(why))),
            Err(WriteError::Forbidden(e)) if !self.reported_once => {
                Err(Error::Forbidden(format!("reporting on the pod: {e}")))
            }
            Err(e) => {
                tracing::warn!("cannot write the report: {e}");
                Ok(None)
            }
        }
    }
}

/// The slots the primary `me` keeps: one per other instance of `spec.replicas`.
fn desired_slots(view: &ClusterView, me: &str) -> Vec<String> {
    let Some((prefix, _)) = me.rsplit_once('-') else {
        return Vec::new();
    };
    (0..view.replicas.max(1))
        .map(|ordinal| format!("{prefix}-{ordinal}"))
        .filter(|name| name != me)
        .map(|name| slot_name(&name))
        .collect()
}

/// One step bringing the agent's slots in line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SlotChange {
    Create(String),
    Drop(String),
    /// Lost (invalidated) and unused: dropped and created anew, reserving WAL from now.
    Renew(String),
}

/// What turns `existing` into `desired`. An active slot is never dropped (PostgreSQL
/// refuses; its walsender ends when the removed pod goes away, and the next probe retries).
fn slot_changes(desired: &[String], existing: &[crate::engine::Slot]) -> Vec<SlotChange> {
    let mut changes = Vec::new();
    for name in desired {
        match existing.iter().find(|s| &s.name == name) {
            None => changes.push(SlotChange::Create(name.clone())),
            Some(slot) if slot.lost && !slot.active => {
                changes.push(SlotChange::Renew(name.clone()))
            }
            Some(_) => {}
        }
    }
    for slot in existing {
        if !desired.contains(&slot.name) && !slot.active {
            changes.push(SlotChange::Drop(slot.name.clone()));
        }
    }
    changes
}

/// Whether the engine's last error line can say why it exited with `status`: when it exited
/// by itself or aborted (PostgreSQL's PANIC). Killed by any other signal (the OOM killer, a
/// person), the last line is some earlier error — often a client's failed login — not why.
fn log_explains_exit(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal().is_none_or(|signal| signal == libc::SIGABRT)
}

/// Since when a primary has seen the same number of its replicas streaming, fewer than
/// expected: it probes fast for [`AWAITING_REPLICAS_FAST_FOR`] after each change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AwaitingReplicas {
    streaming: usize,
    since: tokio::time::Instant,
}

impl AwaitingReplicas {
    /// After a probe that found `streaming` replicas streaming while more are expected (or
    /// `None`: all of them, or not a PostgreSQL primary).
    fn next(
        previous: Option<Self>,
        streaming: Option<usize>,
        now: tokio::time::Instant,
    ) -> Option<Self> {
        let streaming = streaming?;
        Some(match previous {
            Some(p) if p.streaming == streaming => p,
            _ => Self {
                streaming,
                since: now,
            },
        })
    }

    fn hurries(&self, now: tokio::time::Instant) -> bool {
        now.saturating_duration_since(self.since) < AWAITING_REPLICAS_FAST_FOR
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_exit_or_an_abort_takes_its_reason_from_the_log() {
        use std::os::unix::process::ExitStatusExt;
        use std::process::ExitStatus;
        // wait(2) statuses: exit code in the high byte, terminating signal in the low bits.
        assert!(log_explains_exit(&ExitStatus::from_raw(1 << 8)));
        assert!(log_explains_exit(&ExitStatus::from_raw(libc::SIGABRT)));
        assert!(!log_explains_exit(&ExitStatus::from_raw(libc::SIGKILL)));
        assert!(!log_explains_exit(&ExitStatus::from_raw(libc::SIGSEGV)));
    }

    #[test]
    fn a_primary_hurries_for_missing_replicas_for_a_minute_after_each_change() {
        let start = tokio::time::Instant::now();
        let later = |s: u64| start + Duration::from_secs(s);
        let a = AwaitingReplicas::next(None, Some(0), start);
        assert!(a.is_some_and(|a| a.hurries(later(59))));
        // Still none streaming a minute later: the usual cadence.
        let a = AwaitingReplicas::next(a, Some(0), later(61));
        assert!(a.is_some_and(|a| !a.hurries(later(61))));
        // One arrives (another still missing): a minute of fast probes again.
        let a = AwaitingReplicas::next(a, Some(1), later(70));
        assert!(a.is_some_and(|a| a.hurries(later(120))));
        assert!(a.is_some_and(|a| !a.hurries(later(131))));
        // All stream: nothing awaited; the next shortfall starts afresh.
        assert_eq!(AwaitingReplicas::next(a, None, later(140)), None);
        let a = AwaitingReplicas::next(None, Some(1), later(150));
        assert!(a.is_some_and(|a| a.hurries(later(150))));
    }

    #[test]
    fn synchronous_standbys_are_the_other_instances_by_name() {
        let mut view = ClusterView {
            replicas: 3,
            synchronous: Some(("ANY".into(), 1)),
            ..Default::default()
        };
        assert_eq!(
            synchronous_standby_names(&view, "db-1"),
            r#"ANY 1 ("db-0", "db-2")"#
        );
        view.replicas = 1;
        assert_eq!(synchronous_standby_names(&view, "db-0"), "");
        view.synchronous = None;
        view.replicas = 3;
        assert_eq!(synchronous_standby_names(&view, "db-0"), "");
    }

    #[test]
    fn the_primary_keeps_one_slot_per_other_instance_and_drops_the_rest() {
        use crate::engine::Slot;
        let view = ClusterView {
            replicas: 3,
            ..Default::default()
        };
        let desired = desired_slots(&view, "db-1");
        assert_eq!(desired, ["devctl_db_0", "devctl_db_2"]);
        let slot = |name: &str, active, lost| Slot {
            name: name.into(),
            active,
            lost,
        };
        // Missing: created. Present and healthy: kept.
        assert_eq!(
            slot_changes(&desired, &[slot("devctl_db_0", true, false)]),
            [SlotChange::Create("devctl_db_2".into())]
        );
        // Lost: renewed once unused; an active one is left to its walsender.
        assert_eq!(
            slot_changes(
                &desired,
                &[slot("devctl_db_0", false, true), slot("devctl_db_2", true, true)]
            ),
            [SlotChange::Renew("devctl_db_0".into())]
        );
        // A removed instance's slot (scaled down to 2) and the primary's own: dropped, but
        // not while a walsender still streams through it.
        let two = desired_slots(&ClusterView { replicas: 2, ..view.clone() }, "db-0");
        assert_eq!(
            slot_changes(
                &two,
                &[
                    slot("devctl_db_1", true, false),
                    slot("devctl_db_2", false, false),
                    slot("devctl_db_0", false, false),
                ]
            ),
            [
                SlotChange::Drop("devctl_db_2".into()),
                SlotChange::Drop("devctl_db_0".into())
            ]
        );
        assert_eq!(
            slot_changes(&[], &[slot("devctl_db_2", true, false)]),
            []
        );
        // A single instance keeps none.
        assert!(desired_slots(&ClusterView { replicas: 1, ..view }, "db-0").is_empty());
    }

    #[test]
    fn only_the_failed_primary_is_told_to_step_down() {
        let view = ClusterView {
            failed_primary: Some("db-0".into()),
            failover_epoch: 2,
            ..Default::default()
        };
        assert!(failover_away(&view, "db-0").is_some_and(|m| m.contains("epoch 2")));
        assert_eq!(failover_away(&view, "db-1"), None);
        assert_eq!(failover_away(&ClusterView::default(), "db-0"), None);
    }
}
