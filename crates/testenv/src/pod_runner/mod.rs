//! Database pods that do something: the test environment's stand-in for a kubelet.
//!
//! kwok marks pods Running and Ready but runs nothing. For the database pods the operator
//! creates (label selector [`DATABASE_POD_SELECTOR`]), the [`PodRunner`] adds what a kubelet
//! would do, in one of two ways ([`PodBacking`]):
//!
//! - **Simulated** (cheap, the default): each database pod bound to a node gets a ready
//!   [`InstanceStatus`] report in its annotation [`STATUS_ANNOTATION`] at once, as if an
//!   agent had written it (ordinal 0 is the primary), and again whenever the credentials
//!   Secret named by `DEVCTL_CREDENTIALS_SECRET` changes. One patch per pod: the scale bench
//!   runs a thousand clusters this way.
//! - **Processes**: each database pod bound to a node gets one `devctl-agent` process on this
//!   machine, run like a container with `restartPolicy: Always`: the container's environment
//!   resolved (downward API, Secret and ConfigMap references), every value under a volume's
//!   mount path rewritten to that volume's local directory, loopback ports, and restarts with
//!   back-off (1 s doubling to 30 s, reset after 60 s of uptime). Each agent's output goes to
//!   `<root>/logs/<namespace>_<pod>_<pod uid>.log`.
//!
//! # Design
//! - **Its own thread and runtime.** A cluster is shared by all tests of a binary while every
//!   `#[tokio::test]` has its own runtime, which ends with the test: watches and supervision
//!   tasks living on a test's runtime would die with it. The runner therefore runs on a
//!   dedicated thread with a current-thread runtime, started by [`crate::Cluster::start_with`]
//!   and stopped when the cluster is dropped (SIGTERM to every agent, SIGKILL after 10 s).
//!   Agents are forked from the crate's spawner thread like every other process
//!   ([`crate::process`]): `PR_SET_PDEATHSIG` and the `atexit` hook kill them (and their
//!   process group, i.e. the engine they started) when the test process ends however it ends.
//! - **One process per claim.** kwok deletes a terminating pod at once, so a StatefulSet
//!   recreates it (same name, same claim) while the old agent may still be shutting its
//!   engine down. Two engines on one data directory would corrupt it, which a real cluster
//!   prevents by attaching a ReadWriteOnce volume to one pod at a time. Here each claim (by
//!   uid) has a lock that a pod's supervisor holds from before its first start until its last
//!   process has exited; the replacement waits for it.
//! - **A token for the pod's ServiceAccount.** The agent must act with the rights the
//!   operator gave its cluster (a narrow Role), not as admin, or tests would not notice a
//!   missing permission. Each start gets a fresh TokenRequest token for
//!   `spec.serviceAccountName`, bound to the pod (invalid once the pod is gone), in a
//!   kubeconfig passed as `KUBECONFIG`.
//! - **Volumes**: a claim is `<root>/claims/<namespace>/<claim>-<claim uid>` (survives the pod,
//!   removed when the claim is deleted); `emptyDir`, `configMap` and `secret` volumes live in
//!   `<root>/pods/<pod uid>/<volume>` (removed with the pod; short, because engines put their
//!   Unix sockets there and a socket path must fit in 107 bytes). The root is a
//!   directory under `/tmp` readable by all (`/tmp/devctl-testenv-pods-*`), because as root
//!   the agent runs as the image's user (`postgres` or `mysql`), which must reach it while
//!   the control plane's directory is private.
//!
//! # Faults (process-backed pods)
//! Failover tests hurt a pod's processes through its [`PodRunner`]. The methods are
//! synchronous and can be called from any thread or runtime: each signals processes and
//! changes the shared state itself, then blocks until the processes are stopped or continued,
//! or the runner thread has applied the change (polling every 5 ms: milliseconds as a rule,
//! 10 s at most). None of that needs the caller's runtime.
//! - [`PodRunner::freeze`] / [`PodRunner::thaw`]: SIGSTOP / SIGCONT the agent, its process
//!   group and every descendant (PostgreSQL's backends start sessions of their own, out of
//!   the group), like a paused machine. A stopped agent has not exited: the runner records no
//!   exit and restarts nothing. Stopping the pod or the runner sends SIGCONT after SIGTERM (a
//!   stopped process acts on SIGTERM only once continued), an agent that ends has what it
//!   left stopped continued, and the `atexit` hook continues what is still stopped.
//! - [`PodRunner::kill_and_hold`] / [`PodRunner::release`]: SIGKILL the agent and every
//!   process it started (all stopped first, so none forks or reacts meanwhile); the exit is
//!   recorded like any other (`requested: false`, signal 9), and no agent starts for a pod of
//!   that *name* until it is released (then at once, the hold standing in for the back-off).
//!   A holding supervisor keeps its claims' locks: a replacement pod waits for them as
//!   before, then for the release. Still one agent per claim.
//! - [`PodRunner::partition`] / [`PodRunner::heal`]: agents reach the API server through a
//!   TCP proxy of their pod's own ([`PodRunner::api_proxy`], `127.0.0.1:<port>`, one per pod
//!   uid for its supervisor's life, named in the kubeconfig the agent gets). TLS passes
//!   through untouched: the serving certificate is for `localhost` and `127.0.0.1`, whatever
//!   the port. `partition` closes every connection the proxy forwards at once and from then
//!   on accepts new ones but forwards nothing, like a dropped network (clients time out
//!   rather than being refused); `heal` forwards again, the connections held meanwhile too
//!   (as retransmissions would get through). A partition is keyed by pod *name*: set before
//!   the pod exists or while it is replaced, it applies to every pod of that name until
//!   healed. The operator, the tests, kwok and other pods talk to the API server directly.
//!
//! [`InstanceStatus`]: devctl_api::instance::InstanceStatus
//! [`STATUS_ANNOTATION`]: devctl_api::instance::STATUS_ANNOTATION

mod agent;
pub mod engines;
mod environment;
mod faults;
mod launch;
mod plan;
mod pod;
mod process_tree;
mod proxy;
mod readiness;
mod simulated;
mod superuser;
mod supervisor;
mod volumes;

use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use kube::config::Kubeconfig;
use tokio::sync::watch;

use self::agent::agent_for_others;
use self::process_tree::{process_tree, signal_all};
use self::simulated::simulate;
use self::supervisor::{Ctx, Supervisor};
use self::volumes::make_dir;
use crate::kubeconfig;
use crate::process;
use crate::{Error, eventually};

/// The pods the runner backs: what the operator puts on database pods.
pub const DATABASE_POD_SELECTOR: &str =
    "app.kubernetes.io/name=databasecluster,app.kubernetes.io/component=database";

/// The Secrets whose changes Simulated mode reports as applied credentials.
pub const DATABASE_SECRET_SELECTOR: &str = "app.kubernetes.io/name=databasecluster";

/// Environment variable naming the `devctl-agent` binary for [`PodBacking::processes`].
pub const AGENT_BIN_ENV: &str = "DEVCTL_AGENT_BIN";

/// The variable naming an agent's test hooks file (`devctl_agent::test_hooks`); only the
/// runner sets it, never anything the operator renders.
pub const AGENT_TEST_HOOKS_ENV: &str = "DEVCTL_AGENT_TEST_HOOKS";

/// The test hooks file of the agents of pods named `pod` (`<root>/hooks/<namespace>_<pod>`).
fn hooks_path(root: &Path, namespace: &str, pod: &str) -> PathBuf {
    root.join("hooks").join(format!("{namespace}_{pod}"))
}

/// How long stopping the runner waits for agents after SIGTERM before SIGKILL.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The longest grace a deleted pod's agent gets (its `terminationGracePeriodSeconds`, capped).
pub const MAX_POD_GRACE: Duration = Duration::from_secs(30);

/// What backs database pods in a [`crate::Cluster`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PodBacking {
    /// Nothing: pods are kwok's alone and nobody reports on them.
    None,
    /// Every database pod gets a ready report at once (no engine, no process).
    #[default]
    Simulated,
    /// Every database pod gets a `devctl-agent` process running `agent`.
    Processes { agent: PathBuf },
}

impl PodBacking {
    /// [`PodBacking::Processes`] with the agent [`find_agent`] finds.
    pub fn processes() -> Result<Self, Error> {
        Ok(Self::Processes {
            agent: find_agent()?,
        })
    }
}

/// The `devctl-agent` binary: `$DEVCTL_AGENT_BIN`, else `devctl-agent` next to the current
/// executable or in its parent directory (test binaries live in `target/<profile>/deps/`,
/// binaries in `target/<profile>/`).
pub fn find_agent() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os(AGENT_BIN_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Process(format!(
                "{AGENT_BIN_ENV}={} is not a file",
                path.display()
            )))
        };
    }
    let exe = std::env::current_exe().map_err(|e| Error::io("find the current executable", e))?;
    let mut tried = Vec::new();
    for dir in exe
        .parent()
        .into_iter()
        .chain(exe.parent().and_then(Path::parent))
    {
        let candidate = dir.join("devctl-agent");
        if candidate.is_file() {
            return Ok(candidate);
        }
        tried.push(candidate.display().to_string());
    }
    Err(Error::Process(format!(
        "no devctl-agent binary for process-backed pods: run `cargo build -p devctl-agent` \
         or set {AGENT_BIN_ENV} (looked at {})",
        tried.join(", ")
    )))
}

/// How an agent process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The pod it ran for.
    pub pod_uid: String,
    pub pid: u32,
    /// Exit code, when it exited by itself.
    pub code: Option<i32>,
    /// Signal that ended it.
    pub signal: Option<i32>,
    pub at: SystemTime,
    /// How long it ran.
    pub uptime: Duration,
    /// Its last non-empty line of output (stdout and stderr share the log).
    pub last_line: Option<String>,
    /// The runner stopped it (pod deleted or replaced, claim deleted, runner stopping);
    /// `false` for an agent that exited by itself (and is restarted) or was killed by
    /// [`PodRunner::kill_and_hold`].
    pub requested: bool,
}

/// What the runner thread shares with the [`PodRunner`] handle.
#[derive(Default)]
struct Shared {
    /// `(namespace, pod)` → the newest pod of that name seen.
    pods: HashMap<(String, String), PodRecord>,
    exits: HashMap<(String, String), Vec<Exit>>,
    /// Pod uid → running agent's pid.
    running: HashMap<String, u32>,
    /// `(namespace, claim)` → its directory.
    claims: HashMap<(String, String), PathBuf>,
    /// `(namespace, pod)` whose agents must not start ([`PodRunner::kill_and_hold`]).
    held: HashSet<(String, String)>,
    /// `(namespace, pod)` whose proxies forward nothing ([`PodRunner::partition`]).
    partitioned: HashSet<(String, String)>,
    /// Agent pid → the processes [`PodRunner::freeze`] stopped (it included).
    frozen: HashMap<u32, Vec<u32>>,
    /// Pod uid → its API server proxy.
    proxies: HashMap<String, ProxyRecord>,
}

struct PodRecord {
    uid: String,
    log: PathBuf,
}

struct ProxyRecord {
    namespace: String,
    name: String,
    addr: SocketAddr,
    /// The newest fault generation the proxy has applied.
    applied: Arc<AtomicU64>,
}

/// The running agent of the newest pod named `key`.
fn running_pid(shared: &Shared, key: &(String, String)) -> Option<u32> {
    shared.running.get(&shared.pods.get(key)?.uid).copied()
}

type SharedState = Arc<Mutex<Shared>>;

fn lock(shared: &SharedState) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The running runner of a [`crate::Cluster`] ([`crate::Cluster::pod_runner`]): where its
/// files are and what its agents did. Stopped on drop.
pub struct PodRunner {
    root: PathBuf,
    processes: bool,
    keep_dir: bool,
    shared: SharedState,
    /// The generation of the fault settings (held, partitioned), bumped on each change.
    faults: Arc<watch::Sender<u64>>,
    shutdown: Option<watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the runner needs from its control plane.
pub(crate) struct Connection {
    /// The runner's own (admin) identity.
    pub kubeconfig: Kubeconfig,
    pub server: String,
    pub server_ca_pem: String,
}

impl PodRunner {
    /// Starts the runner for `backing` (`None` for [`PodBacking::None`]).
    pub(crate) fn start(
        backing: &PodBacking,
        connection: Connection,
    ) -> Result<Option<Self>, Error> {
        let agent = match backing {
            PodBacking::None => return Ok(None),
            PodBacking::Simulated => None,
            PodBacking::Processes { agent } => {
                if !agent.is_file() {
                    return Err(Error::Process(format!(
                        "the agent {} does not exist: run `cargo build -p devctl-agent` or \
                         point {AGENT_BIN_ENV} at it",
                        agent.display()
                    )));
                }
                Some(agent.clone())
            }
        };
        let root = tempfile::Builder::new()
            .prefix("devctl-testenv-pods-")
            .tempdir_in("/tmp")
            .map_err(|e| Error::io("create the pod runner's directory", e))?
            .keep();
        let keep_dir = std::env::var("DEVCTL_KEEP_TESTENV").is_ok_and(|v| v == "1");
        if !keep_dir {
            process::remove_dir_at_exit(&root);
        }
        make_dir(&root, None, 0o755)?;
        make_dir(&root.join("logs"), None, 0o755)?;
        make_dir(&root.join("hooks"), None, 0o755)?;
        let shared = SharedState::default();
        let faults = Arc::new(watch::Sender::new(0));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let processes = agent.is_some();
        let agent = match agent {
            Some(agent) => Some(agent_for_others(&agent, &root)?),
            None => None,
        };
        let thread = {
            let root = root.clone();
            let shared = shared.clone();
            let faults = faults.clone();
            std::thread::Builder::new()
                .name("testenv-pod-runner".into())
                .spawn(move || run_thread(root, agent, connection, shared, faults, shutdown_rx))
                .map_err(|e| Error::io("start the pod runner thread", e))?
        };
        tracing::info!(root = %root.display(), processes, "pod runner started");
        Ok(Some(Self {
            root,
            processes,
            keep_dir,
            shared,
            faults,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }))
    }

    /// Whether pods get processes (else reports are simulated).
    pub fn runs_processes(&self) -> bool {
        self.processes
    }

    /// The runner's directory (`/tmp/devctl-testenv-pods-*`): `claims/`, `pods/`, `logs/`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where agents' logs go: `<namespace>_<pod>_<pod uid>.log`, appended across restarts,
    /// the runner's own notes prefixed `devctl-testenv:`.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// The log of the newest pod named `pod` the runner has started.
    pub fn log_path(&self, namespace: &str, pod: &str) -> Option<PathBuf> {
        lock(&self.shared)
            .pods
            .get(&(namespace.to_string(), pod.to_string()))
            .map(|r| r.log.clone())
    }

    /// Sets the test hooks of the agents of pods named `pod` (`key=value` lines, see
    /// `devctl_agent::test_hooks`), read by a running agent at its next hook point and by
    /// every agent started later; empty text clears them.
    pub fn set_agent_hooks(&self, namespace: &str, pod: &str, hooks: &str) -> Result<(), Error> {
        let path = hooks_path(&self.root, namespace, pod);
        let staged = path.with_extension("new");
        std::fs::write(&staged, hooks)
            .and_then(|()| {
                std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o644))
            })
            .and_then(|()| std::fs::rename(&staged, &path))
            .map_err(|e| Error::io(format!("write the agent hooks {}", path.display()), e))
    }

    /// Every agent exit of pods named `pod` (all uids), oldest first.
    pub fn exits(&self, namespace: &str, pod: &str) -> Vec<Exit> {
        lock(&self.shared)
            .exits
            .get(&(namespace.to_string(), pod.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// The running agent of the newest pod named `pod`.
    pub fn pid(&self, namespace: &str, pod: &str) -> Option<u32> {
        let shared = lock(&self.shared);
        let record = shared.pods.get(&(namespace.to_string(), pod.to_string()))?;
        shared.running.get(&record.uid).copied()
    }

    /// Every running agent's pid.
    pub fn pids(&self) -> Vec<u32> {
        lock(&self.shared).running.values().copied().collect()
    }

    /// The local directory of claim `claim` (`<root>/claims/<namespace>/<claim>-<uid>`),
    /// once a pod using it was started; `None` after the claim was deleted.
    pub fn claim_dir(&self, namespace: &str, claim: &str) -> Option<PathBuf> {
        lock(&self.shared)
            .claims
            .get(&(namespace.to_string(), claim.to_string()))
            .cloned()
    }

    /// Waits until the newest pod named `pod` has a running agent; its pid.
    pub async fn wait_running(
        &self,
        namespace: &str,
        pod: &str,
        timeout: Duration,
    ) -> Result<u32, Error> {
        let what = format!(
            "an agent for pod {namespace}/{pod} to run (logs in {})",
            self.logs_dir().display()
        );
        eventually(&what, timeout, || async { self.pid(namespace, pod) }).await
    }

    /// The running agent of the newest pod named `pod` and every process it started (its
    /// process group and all descendants, in other sessions too), parents first, without
    /// zombies; empty when no agent runs.
    pub fn agent_pids(&self, namespace: &str, pod: &str) -> Vec<u32> {
        let shared = lock(&self.shared);
        match running_pid(&shared, &(namespace.to_string(), pod.to_string())) {
            Some(pid) => process_tree(pid),
            None => Vec::new(),
        }
    }

    /// The address of the API server proxy of the newest pod named `pod`, which its agent's
    /// kubeconfig names (see [`Self::partition`]); `None` before its supervisor set it up.
    pub fn api_proxy(&self, namespace: &str, pod: &str) -> Option<SocketAddr> {
        let shared = lock(&self.shared);
        let record = shared.pods.get(&(namespace.to_string(), pod.to_string()))?;
        shared.proxies.get(&record.uid).map(|p| p.addr)
    }

    /// Stops every agent (SIGTERM, SIGKILL after [`SHUTDOWN_GRACE`]) and the runner thread.
    fn stop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(true);
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the pod runner thread panicked");
        }
        // Agents continue what they left stopped when they end; this is for a runner thread
        // that did not end them.
        let frozen: Vec<u32> = std::mem::take(&mut lock(&self.shared).frozen)
            .into_values()
            .flatten()
            .collect();
        signal_all(&frozen, libc::SIGCONT);
        process::forget_stopped(&frozen);
    }
}

impl Drop for PodRunner {
    fn drop(&mut self) {
        self.stop();
        process::dispose_dir(&self.root, self.keep_dir);
    }
}

fn run_thread(
    root: PathBuf,
    agent: Option<PathBuf>,
    connection: Connection,
    shared: SharedState,
    faults: Arc<watch::Sender<u64>>,
    shutdown: watch::Receiver<bool>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "pod runner: cannot build its runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let client = match kubeconfig::client(connection.kubeconfig.clone()).await {
            Ok(client) => client,
            Err(e) => {
                tracing::error!(error = %e, "pod runner: cannot make a client");
                return;
            }
        };
        match agent {
            None => simulate(client, shutdown).await,
            Some(agent) => {
                let ctx = Arc::new(Ctx {
                    root,
                    agent,
                    server: connection.server,
                    server_ca_pem: connection.server_ca_pem,
                    client,
                    shared,
                    faults,
                    claim_locks: Mutex::default(),
                });
                Supervisor::new(ctx).run(shutdown).await;
            }
        }
    });
}

fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// A line from the runner in a pod's log.
fn note(log: &Path, message: &str) {
    if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(file, "devctl-testenv: {} {message}", now_rfc3339());
    }
}
