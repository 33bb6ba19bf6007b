//! The agent proper: wait for credentials, bootstrap, run and supervise the engine, keep
//! the application role in line with the Secret, and report.
//!
//! One file per responsibility: [`role`] is the instance's role as a pure state machine;
//! [`bootstrap`] gets data before the engine runs; [`supervise`] runs and stops it; [`tick`]
//! probes it and drives the role; [`promotion`], [`primary`] and [`replica`] carry out what
//! each role needs; [`secrets`] follows the Secrets; [`status`] writes the report.

mod bootstrap;
mod mariadb_upkeep;
mod primary;
mod promotion;
mod replica;
pub(crate) mod role;
mod secrets;
mod status;
mod supervise;
mod tick;
mod upgrade_followup;

pub use primary::synchronous_standby_names;
use role::{Role, lost_primary_data};
use secrets::take_in_secret;
pub(crate) use secrets::{SecretView, watch_secret};
use supervise::changed;

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
    ClusterView, PrimaryAddress, parse_address, read_report, resolve_primary,
    resolve_primary_report, watch_cluster, watch_error_is_forbidden,
};
use crate::config::{Config, EngineKind, PodRef, PrimaryFrom, extra_env};
use crate::credentials::{Credentials, REPLICATION_USER, ReplicationCredentials, pgpass_line};
use crate::engine::{
    DirOwner, Engine, Probe, StandbyExtras, prepare_dir, primary_conninfo, slot_name, write_private,
};
use crate::error::{Error, Result, one_line};
use crate::health::{self, Health};
use crate::lease::{
    AcquireError, LockDurations, PrimaryLock, fence_stop_timeout, lock_durations, renew_deadline,
    renew_interval,
};
use crate::process;
use crate::report::{Reporter, WriteError};

/// A watch on another pod's changes that ends when dropped (see `watch_old_primary`).
struct HandoverWatch {
    pod: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HandoverWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

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

/// How long a former primary restarted as a standby may take to stream before it is
/// re-cloned (its history may have forked from the new primary's).
pub const REJOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How a former primary came back as a standby (the `Rejoined` event says it).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rejoin {
    /// `pg_rewind` to the fork point.
    Rewound,
    /// MariaDB: no errant transactions; it replicates on from its own GTID position.
    Followed,
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

/// How the agent ended without an error (both exit 0).
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// SIGTERM/SIGINT; the engine stopped cleanly.
    Stopped,
    /// The pod was deleted or replaced by a newer one of the same name.
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
    /// PostgreSQL: the instance's role ([`role`]).
    role: Role,
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
    /// Replica, during a switchover to another replica: the target and its address, which
    /// this replica streams from meanwhile (`replica::switchover_upstream`).
    cascade: Option<(String, PrimaryAddress)>,
    /// The switchover target this replica went back from (it lacked WAL this replica needs).
    cascade_refused: Option<String>,
    conninfo_applied: Option<String>,
    replica_problem: Option<String>,
    /// Planned switchover: the shutdown checkpoint this former primary stopped at (reported
    /// as `finalLSN` until it rejoins as a standby).
    final_lsn: Option<String>,
    /// Target of a switchover: why it does not promote yet.
    switchover_problem: Option<String>,
    /// Target of a switchover: a watch on the old primary's pod that wakes the main loop
    /// when its report changes (it stopped, its `finalLSN`), instead of the next probe.
    handover_watch: Option<HandoverWatch>,
    /// A role change to make (stopping the engine).
    action: Option<Action>,
    /// A former primary rejoining as a standby: when to give up and re-clone.
    rejoin_deadline: Option<Instant>,
    /// Since when a former primary waits for the new primary's checkpointed timeline.
    rejoin_timeline_wait: Option<Instant>,
    /// The engine was fenced after it left recovery on its own while this agent ran it as a
    /// standby: its timeline forked off the primary's, not after it (see `prepare_rejoin`).
    forked_on_its_own: bool,
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
    /// Replica: the primary whose report it last read and the slots that report lists, and
    /// the slot and `restore_command` the engine has.
    primary_slots: Option<(String, Vec<String>)>,
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
    /// PostgreSQL: the major its binaries run (read once, `postgres --version`).
    binaries_major: Option<u32>,
    /// After a major upgrade: `vacuumdb --analyze-in-stages`, then the old data directory
    /// removed once the cluster records the new version ([`upgrade_followup`]).
    upgrade_followup: Option<tokio::task::JoinHandle<()>>,
    /// MariaDB: what the agent serves clones of its data from (while the primary).
    clone_source: Option<Arc<crate::mariadb::clone::CloneSource>>,
    /// MariaDB: errant transactions found on this former primary (the GTID range), until
    /// the event naming them is published after its data was moved aside.
    errant: Option<String>,
    /// MariaDB: the current primary's promotion position, as its report last said.
    primary_promotion_position: Option<String>,
    /// MariaDB: the GTID the errant transactions follow (where their dump starts).
    errant_from: Option<String>,
    /// MariaDB primary: the binary log archiver's state, and its round under way.
    binlog_archiver: crate::mariadb::archive::SharedArchiver,
    archive_task: Option<tokio::task::JoinHandle<()>>,
    /// MariaDB, restoring: the binary log replay under way.
    replay_task: Option<tokio::task::JoinHandle<std::result::Result<String, RestoreError>>>,
}

/// Runs the instance described by `config` until SIGTERM/SIGINT, a replaced pod, or an
/// error.
pub async fn run(config: Config) -> Result<Outcome> {
    let signal_error =
        |e: std::io::Error| Error::Internal(format!("installing signal handlers: {e}"));
    let sigterm = signal(SignalKind::terminate()).map_err(signal_error)?;
    let sigint = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let engine = Engine::locate(&config)?;
    prepare_dir(
        &config.data_dir,
        "data directory",
        env::DATA_DIR,
        DirOwner::Agent,
    )?;
    // An emptyDir on a real node: root's, not the agent's.
    prepare_dir(
        &config.run_dir,
        "run directory",
        env::RUN_DIR,
        DirOwner::AgentOrVolume,
    )?;
    let client = kube_client().await?;
    let shared = Arc::new(Shared::new(config.clone(), engine.clone(), client.clone()));
    if config.engine == EngineKind::Postgres {
        // Before the engine starts: its archive_command talks to this socket.
        crate::archive::serve(shared.clone())?;
    }
    let clone_source = (config.engine == EngineKind::Mariadb)
        .then(|| crate::mariadb::clone::CloneSource::new(engine.clone()));
    let health = Arc::new(Health::default());
    health::serve(
        config.health_port,
        health.clone(),
        clone_source.clone().map(crate::mariadb::clone::router),
    )
    .await?;
    let pod = PodRef {
        name: config.pod_name.clone(),
        namespace: config.pod_namespace.clone(),
        uid: Some(config.pod_uid.clone()),
    };
    let replicated = config.engine.replicated();
    let cluster = replicated.then(|| watch_cluster(client.clone(), &config));
    let replication = match (&config.replication_secret, replicated) {
        (Some(name), true) => Some(watch_secret(
            client.clone(),
            &config.pod_namespace,
            name,
            "replication",
        )),
        _ => None,
    };
    let lock = replicated.then(|| {
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
        binaries_major: None,
        upgrade_followup: None,
        clone_source,
        errant: None,
        primary_promotion_position: None,
        errant_from: None,
        binlog_archiver: Default::default(),
        archive_task: None,
        replay_task: None,
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
        role: Role::Bootstrapping,
        role_problem: None,
        replication_seen: None,
        replication_desired: None,
        replication_problem: None,
        replication_invalid: None,
        replication_applied: None,
        replication_apply_error: None,
        passfile_version: None,
        primary_address: None,
        cascade: None,
        cascade_refused: None,
        conninfo_applied: None,
        replica_problem: None,
        final_lsn: None,
        switchover_problem: None,
        handover_watch: None,
        forked_on_its_own: false,
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
        if self.mariadb() {
            // A restore whose binary logs are still to be replayed (also one an earlier run
            // of the agent began).
            self.mysql_restore_pending |=
                crate::mariadb::backup::pending(&self.config.data_dir).is_some();
        }
        if self.cluster.is_some() && self.mode == Mode::Primary && self.engine.is_recovering() {
            // A restored data directory not promoted yet (also after an agent restart).
            self.recovering = true;
        }
        self.supervise(fresh).await
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
}
