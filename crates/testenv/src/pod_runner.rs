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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use devctl_api::instance::{InstanceStatus, ROLE_PRIMARY, ROLE_REPLICA, STATUS_ANNOTATION, env};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolumeClaim, Pod, Secret, ServiceAccount, Volume,
};
use kube::api::{Api, PostParams};
use kube::config::Kubeconfig;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Resource, ResourceExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::kubeconfig::{self, Credentials};
use crate::process::{self, free_port};
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

const RESTART_BACKOFF_MIN: Duration = Duration::from_secs(1);
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// An agent that ran this long restarts after [`RESTART_BACKOFF_MIN`] again.
const RESTART_BACKOFF_RESET: Duration = Duration::from_secs(60);
/// Back-off while a pod cannot be started yet (no ServiceAccount, claim, ConfigMap...).
const PREPARE_BACKOFF_MIN: Duration = Duration::from_millis(250);
const PREPARE_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often a running agent is checked for having exited.
const POLL: Duration = Duration::from_millis(50);
/// `PATH` for agents: Debian's MariaDB (`mariadbd`) is in `/usr/sbin`.
const AGENT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Patches in flight at once in Simulated mode.
const SIMULATED_CONCURRENCY: usize = 8;
/// How long fault methods wait for processes to stop or continue, or for the runner thread.
/// A process in uninterruptible sleep (an fsync while the suite's lanes load the disk) takes
/// its SIGSTOP only when it wakes: 10 s was once not enough under the full suite.
const FAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often fault methods look.
const FAULT_POLL: Duration = Duration::from_millis(5);
/// Connections a partitioned proxy holds at most (the oldest are closed beyond).
const MAX_HELD_CONNECTIONS: usize = 256;
/// How long the proxy tries to reach the API server for a connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// Stops (SIGSTOP) the running agent of the newest pod named `pod`, its process group and
    /// every descendant (the engine: PostgreSQL's postmaster and its backends), parents
    /// first, until no new process shows up; returns once all of them are stopped (state `T`).
    /// The runner neither counts a stopped agent as exited nor restarts it. Freezing again
    /// stops what started since. Fails when no agent runs, or when it ends meanwhile.
    pub fn freeze(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.require_processes("freeze")?;
        match self.stop_tree(&(namespace.to_string(), pod.to_string()))? {
            Some(_) => Ok(()),
            None => Err(Error::Process(format!(
                "the agent of pod {namespace}/{pod} ended while it was being frozen"
            ))),
        }
    }

    /// Continues (SIGCONT) what [`Self::freeze`] stopped of the pod's running agent, and
    /// everything else of its process tree; returns once none of them is stopped. `Ok` when
    /// no agent runs: an agent that ended had what it left stopped continued.
    pub fn thaw(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.require_processes("thaw")?;
        let key = (namespace.to_string(), pod.to_string());
        let continued = {
            let mut shared = lock(&self.shared);
            let Some(pid) = running_pid(&shared, &key) else {
                return Ok(());
            };
            let frozen = shared.frozen.remove(&pid).unwrap_or_default();
            let mut pids = process_tree(pid);
            pids.extend(
                frozen
                    .iter()
                    .filter(|p| !pids.contains(p))
                    .collect::<Vec<_>>(),
            );
            // Children first: the agent finds its engine running when it runs again.
            pids.reverse();
            signal_all(&pids, libc::SIGCONT);
            process::forget_stopped(&frozen);
            pids
        };
        poll(
            &format!("the processes of pod {namespace}/{pod} ({continued:?}) to continue"),
            || continued.iter().all(|p| !is_stopped(*p)).then_some(()),
        )
    }

    /// Kills (SIGKILL) the running agent of the newest pod named `pod` with its process group
    /// and every descendant (stopped first, so none forks or reacts meanwhile), and starts no
    /// agent for a pod of that name (a replacement too) until [`Self::release`]. Returns once
    /// the runner has recorded the exit ([`Self::exits`]: `requested: false`, signal 9) and
    /// every process it killed is gone.
    /// Without a running agent (between restarts, or not started yet) it only holds.
    pub fn kill_and_hold(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.require_processes("kill_and_hold")?;
        let key = (namespace.to_string(), pod.to_string());
        lock(&self.shared).held.insert(key.clone());
        self.faults.send_modify(|generation| *generation += 1);
        let Some(pid) = running_pid(&lock(&self.shared), &key) else {
            return Ok(());
        };
        // Best effort: the kill below does not depend on it.
        if let Err(e) = self.stop_tree(&key) {
            tracing::debug!(%namespace, %pod, error = %e, "pod runner: kill_and_hold could not stop every process first");
        }
        let mut killed = Vec::new();
        {
            let mut shared = lock(&self.shared);
            // Still our unreaped child while it is listed as running (it is reaped only
            // after it is taken off the list, under this lock): its pid and group are ours.
            if running_pid(&shared, &key) == Some(pid) {
                let mut pids = process_tree(pid);
                // SAFETY: kill(2) on the group the unreaped agent leads.
                unsafe {
                    libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
                }
                let frozen = shared.frozen.remove(&pid).unwrap_or_default();
                pids.extend(
                    frozen
                        .iter()
                        .filter(|p| !pids.contains(p))
                        .collect::<Vec<_>>(),
                );
                signal_all(&pids, libc::SIGKILL);
                process::forget_stopped(&frozen);
                killed = pids;
            }
        }
        poll(
            &format!("the runner to record the exit of pod {namespace}/{pod}'s agent {pid}"),
            || {
                lock(&self.shared)
                    .exits
                    .get(&key)
                    .is_some_and(|exits| exits.iter().any(|e| e.pid == pid))
                    .then_some(())
            },
        )?;
        // SIGKILL is delivered asynchronously: a process outside the agent's group (a child
        // that detached) can still be running for a moment after kill(2) returned. The fault
        // is in place only once the whole tree is gone.
        poll(
            &format!("every process of pod {namespace}/{pod}'s agent {pid} to be gone"),
            || {
                killed
                    .iter()
                    .all(|&p| !process::is_running(p))
                    .then_some(())
            },
        )
    }

    /// Ends [`Self::kill_and_hold`] for pods named `pod`: the supervisor starts their agent
    /// again at once (see [`Self::wait_running`]).
    pub fn release(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.require_processes("release")?;
        lock(&self.shared)
            .held
            .remove(&(namespace.to_string(), pod.to_string()));
        self.faults.send_modify(|generation| *generation += 1);
        Ok(())
    }

    /// Cuts the agents of pods named `pod` off from the API server: their proxies close
    /// every connection they forward and, until [`Self::heal`], accept new ones but forward
    /// nothing (clients time out). Keyed by name: it also applies to a pod of that name that
    /// does not exist yet or replaces this one. Returns once every current proxy of that name
    /// has closed its connections.
    pub fn partition(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.require_processes("partition")?;
        self.set_partitioned(namespace, pod, true)
    }

    /// Ends [`Self::partition`]: the proxies forward again, including the connections they
    /// held meanwhile. Returns once every current proxy of that name forwards.
    pub fn heal(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.require_processes("heal")?;
        self.set_partitioned(namespace, pod, false)
    }

    fn require_processes(&self, what: &str) -> Result<(), Error> {
        if self.processes {
            Ok(())
        } else {
            Err(Error::Process(format!(
                "PodRunner::{what} needs process-backed pods (PodBacking::Processes)"
            )))
        }
    }

    fn set_partitioned(&self, namespace: &str, pod: &str, on: bool) -> Result<(), Error> {
        let key = (namespace.to_string(), pod.to_string());
        {
            let mut shared = lock(&self.shared);
            if on {
                shared.partitioned.insert(key.clone());
            } else {
                shared.partitioned.remove(&key);
            }
        }
        let mut generation = 0;
        self.faults.send_modify(|g| {
            *g += 1;
            generation = *g;
        });
        let what = if on { "partition" } else { "heal" };
        poll(
            &format!("the API proxies of pod {namespace}/{pod} to {what}"),
            || {
                lock(&self.shared)
                    .proxies
                    .values()
                    .filter(|p| p.namespace == key.0 && p.name == key.1)
                    .all(|p| p.applied.load(Ordering::SeqCst) >= generation)
                    .then_some(())
            },
        )
    }

    /// SIGSTOPs the tree of the running agent of pod `key` in rounds (signal what is new,
    /// wait until it is stopped) until a round finds nothing new; the agent's pid. `Err` when
    /// no agent runs at first, `Ok(None)` when it ended meanwhile.
    fn stop_tree(&self, key: &(String, String)) -> Result<Option<u32>, Error> {
        let mut stopped: Vec<u32> = Vec::new();
        let mut agent = None;
        for _ in 0..20 {
            let new = {
                let mut shared = lock(&self.shared);
                let pid = match (running_pid(&shared, key), agent) {
                    (Some(pid), None) => pid,
                    (Some(pid), Some(first)) if pid == first => pid,
                    (_, Some(_)) => return Ok(None),
                    (None, None) => {
                        return Err(Error::Process(format!(
                            "pod {}/{} has no running agent",
                            key.0, key.1
                        )));
                    }
                };
                agent = Some(pid);
                // Listed as running, so not reaped (see `kill_and_hold`): signalling its
                // tree under the lock reaches no stranger.
                let new: Vec<u32> = process_tree(pid)
                    .into_iter()
                    .filter(|p| !stopped.contains(p))
                    .collect();
                signal_all(&new, libc::SIGSTOP);
                process::continue_at_exit(&new);
                let frozen = shared.frozen.entry(pid).or_default();
                frozen.extend(&new);
                frozen.sort_unstable();
                frozen.dedup();
                new
            };
            if new.is_empty() {
                return Ok(agent);
            }
            stopped.extend(&new);
            poll(&format!("processes {new:?} to stop"), || {
                new.iter().all(|p| is_stopped_or_gone(*p)).then_some(())
            })?;
        }
        Err(Error::Process(format!(
            "pod {}/{}: processes kept appearing while stopping them ({stopped:?})",
            key.0, key.1
        )))
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

// ---------------------------------------------------------------------------------------
// Simulated mode
// ---------------------------------------------------------------------------------------

struct SimulatedPod {
    namespace: String,
    name: String,
    uid: String,
    secret: Option<String>,
    report: InstanceStatus,
    /// The credentials version last patched (or seen) on the pod.
    sent: Option<Option<String>>,
}

async fn simulate(client: kube::Client, mut shutdown: watch::Receiver<bool>) {
    let pods = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels(DATABASE_POD_SELECTOR),
    )
    .default_backoff();
    let secrets = watcher(
        Api::<Secret>::all(client.clone()),
        watcher::Config::default().labels(DATABASE_SECRET_SELECTOR),
    )
    .default_backoff();
    let mut pods = std::pin::pin!(pods);
    let mut secrets = std::pin::pin!(secrets);
    let limit = Arc::new(Semaphore::new(SIMULATED_CONCURRENCY));
    let mut versions: HashMap<(String, String), String> = HashMap::new();
    let mut known: HashMap<String, SimulatedPod> = HashMap::new();

    let send = |pod: &mut SimulatedPod, version: Option<String>, annotated: Option<String>| {
        pod.sent = Some(version.clone());
        let mut report = pod.report.clone();
        report.credentials_version = version;
        report.heartbeat = Some(now_rfc3339());
        let client = client.clone();
        let limit = limit.clone();
        let (namespace, name, uid) = (pod.namespace.clone(), pod.name.clone(), pod.uid.clone());
        tokio::spawn(async move {
            let Ok(_permit) = limit.acquire_owned().await else {
                return;
            };
            // The API server may be restarting (fault tests): retry until it answers, or
            // the report would never come and the pod stay unready forever.
            let mut delay = Duration::from_millis(250);
            for _ in 0..40 {
                match patch_report(&client, &namespace, &name, &uid, &report, annotated.clone())
                    .await
                {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(%namespace, pod = %name, error = %e, "pod runner: report failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
            tracing::warn!(%namespace, pod = %name, "pod runner: gave up reporting");
        });
    };

    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(event) = pods.next() => {
                let pod = match event {
                    Ok(Event::Apply(pod) | Event::InitApply(pod)) => pod,
                    Ok(Event::Delete(pod)) => {
                        known.remove(&pod.uid().unwrap_or_default());
                        continue;
                    }
                    Ok(Event::Init | Event::InitDone) => continue,
                    Err(e) => {
                        tracing::debug!(error = %e, "pod runner: pod watch");
                        continue;
                    }
                };
                let Some(uid) = pod.uid() else { continue };
                if pod.metadata.deletion_timestamp.is_some() {
                    known.remove(&uid);
                    continue;
                }
                if pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
                    continue;
                }
                let entry = known.entry(uid.clone()).or_insert_with(|| simulated_pod(&pod, uid));
                let desired = entry
                    .secret
                    .as_ref()
                    .and_then(|s| versions.get(&(entry.namespace.clone(), s.clone())))
                    .cloned();
                let current = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref());
                if current
                    .as_ref()
                    .is_some_and(|c| c.ready && c.credentials_version == desired)
                {
                    entry.sent = Some(desired);
                    continue;
                }
                if entry.sent.as_ref() == Some(&desired) {
                    continue;
                }
                let unannotated = pod
                    .metadata
                    .annotations
                    .is_none()
                    .then(|| pod.resource_version().unwrap_or_default());
                send(entry, desired, unannotated);
            }
            Some(event) = secrets.next() => {
                let secret = match event {
                    Ok(Event::Apply(s) | Event::InitApply(s)) => s,
                    Ok(Event::Delete(s)) => {
                        versions.remove(&(s.namespace().unwrap_or_default(), s.name_any()));
                        continue;
                    }
                    Ok(Event::Init | Event::InitDone) => continue,
                    Err(e) => {
                        tracing::debug!(error = %e, "pod runner: secret watch");
                        continue;
                    }
                };
                let key = (secret.namespace().unwrap_or_default(), secret.name_any());
                let version = secret.resource_version().unwrap_or_default();
                if versions.get(&key) == Some(&version) {
                    continue;
                }
                versions.insert(key.clone(), version.clone());
                for pod in known.values_mut() {
                    if pod.namespace == key.0
                        && pod.secret.as_deref() == Some(key.1.as_str())
                        && pod.sent.as_ref() != Some(&Some(version.clone()))
                    {
                        send(pod, Some(version.clone()), None);
                    }
                }
            }
        }
    }
}

fn simulated_pod(pod: &Pod, uid: String) -> SimulatedPod {
    let name = pod.name_any();
    let namespace = pod.namespace().unwrap_or_default();
    let container = pod.spec.as_ref().and_then(|s| s.containers.first());
    let plain_env = |key: &str| -> Option<String> {
        container?
            .env
            .as_ref()?
            .iter()
            .find(|e| e.name == key)?
            .value
            .clone()
    };
    let image = container.and_then(|c| c.image.clone()).unwrap_or_default();
    let (engine, tag) = image_name_and_tag(&image);
    let port = plain_env(env::PORT)
        .unwrap_or_else(|| if engine == "postgres" { "5432" } else { "3306" }.to_string());
    let cluster = pod
        .labels()
        .get("app.kubernetes.io/instance")
        .cloned()
        .unwrap_or_default();
    let role = if name.ends_with("-0") {
        ROLE_PRIMARY
    } else {
        ROLE_REPLICA
    };
    SimulatedPod {
        report: InstanceStatus {
            role: Some(role.into()),
            ready: true,
            system_identifier: Some(fake_system_identifier(&namespace, &cluster)),
            timeline: Some(1),
            engine_version: tag,
            address: Some(format!("127.0.0.1:{port}")),
            ..InstanceStatus::default()
        },
        secret: plain_env(env::CREDENTIALS_SECRET),
        namespace,
        name,
        uid,
        sent: None,
    }
}

/// A stable fake system identifier per database cluster (19 digits, like PostgreSQL's).
fn fake_system_identifier(namespace: &str, cluster: &str) -> String {
    // FNV-1a: stable across runs and Rust versions, unlike `DefaultHasher`.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in namespace.bytes().chain([b'/']).chain(cluster.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (7_000_000_000_000_000_000 + hash % 1_000_000_000_000_000_000).to_string()
}

/// `registry/library/postgres:16.4@sha256:…` → (`postgres`, `Some("16.4")`).
fn image_name_and_tag(image: &str) -> (String, Option<String>) {
    let image = image.split('@').next().unwrap_or_default();
    let last = image.rsplit('/').next().unwrap_or_default();
    match last.split_once(':') {
        Some((name, tag)) => (name.to_string(), Some(tag.to_string())),
        None => (last.to_string(), None),
    }
}

fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// Writes `report` into the pod's [`STATUS_ANNOTATION`] with a JSON patch that tests the
/// pod's uid first (a replaced pod of the same name is left alone). `unannotated_version`
/// is the resourceVersion at which the pod had no annotations at all (the patch then
/// creates the map, guarded by that version); on a conflict the pod is read again.
async fn patch_report(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
    report: &InstanceStatus,
    mut unannotated_version: Option<String>,
) -> Result<(), Error> {
    let value = serde_json::to_string(report).map_err(|e| Error::Process(e.to_string()))?;
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
    for attempt in 0..5 {
        if attempt > 0 {
            let Some(pod) = api.get_opt(name).await? else {
                return Ok(());
            };
            if pod.uid().as_deref() != Some(uid) {
                return Ok(());
            }
            unannotated_version = pod
                .metadata
                .annotations
                .is_none()
                .then(|| pod.resource_version().unwrap_or_default());
        }
        let mut ops =
            vec![serde_json::json!({ "op": "test", "path": "/metadata/uid", "value": uid })];
        match &unannotated_version {
            Some(version) => {
                ops.push(serde_json::json!({
                    "op": "test", "path": "/metadata/resourceVersion", "value": version
                }));
                ops.push(serde_json::json!({
                    "op": "add", "path": "/metadata/annotations",
                    "value": { STATUS_ANNOTATION: value }
                }));
            }
            None => ops.push(serde_json::json!({
                "op": "add",
                "path": format!("/metadata/annotations/{}", STATUS_ANNOTATION.replace('~', "~0").replace('/', "~1")),
                "value": value
            })),
        }
        let request = http::Request::patch(&path)
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .body(serde_json::to_vec(&ops).map_err(|e| Error::Process(e.to_string()))?)
            .map_err(|e| Error::Process(e.to_string()))?;
        match client.request::<Pod>(request).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            // A failed `test` (uid or version) or a conflict: look again.
            Err(kube::Error::Api(status)) if matches!(status.code, 400 | 409 | 422 | 500) => {
                tracing::debug!(%namespace, pod = %name, %status.message, "pod runner: report patch retried");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Process(format!(
        "report on pod {namespace}/{name}: gave up after 5 conflicts"
    )))
}

// ---------------------------------------------------------------------------------------
// Processes mode
// ---------------------------------------------------------------------------------------

struct Ctx {
    root: PathBuf,
    agent: PathBuf,
    server: String,
    server_ca_pem: String,
    client: kube::Client,
    shared: SharedState,
    faults: Arc<watch::Sender<u64>>,
    /// Claim uid → the lock held by the supervisor whose agent uses that claim.
    claim_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Ctx {
    fn claim_lock(&self, claim_uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.claim_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(claim_uid.to_string())
            .or_default()
            .clone()
    }

    fn claim_dir(&self, namespace: &str, claim: &str, uid: &str) -> PathBuf {
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

struct Supervisor {
    ctx: Arc<Ctx>,
    /// By pod uid.
    tasks: HashMap<String, PodTask>,
    pods_listed: Option<HashSet<String>>,
    claims_listed: Option<HashSet<String>>,
    removals: Vec<tokio::task::JoinHandle<()>>,
}

impl Supervisor {
    fn new(ctx: Arc<Ctx>) -> Self {
        Self {
            ctx,
            tasks: HashMap::new(),
            pods_listed: None,
            claims_listed: None,
            removals: Vec::new(),
        }
    }

    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
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

/// `(namespace, claim, uid)` of every claim directory under `claims`.
fn claim_dirs(claims: &Path) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    let Ok(namespaces) = std::fs::read_dir(claims) else {
        return found;
    };
    for namespace in namespaces.flatten() {
        let Ok(dirs) = std::fs::read_dir(namespace.path()) else {
            continue;
        };
        for dir in dirs.flatten() {
            let name = dir.file_name().to_string_lossy().to_string();
            // `<claim>-<uid>`, a uid being 36 characters.
            if name.len() > 37 && name.is_char_boundary(name.len() - 37) {
                let (claim, uid) = name.split_at(name.len() - 37);
                found.push((
                    namespace.file_name().to_string_lossy().to_string(),
                    claim.to_string(),
                    uid[1..].to_string(),
                ));
            }
        }
    }
    found
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

/// Waits until a stop is requested; the grace it asks for.
async fn stop_requested(stop: &mut watch::Receiver<Option<Duration>>) -> Duration {
    loop {
        if let Some(grace) = *stop.borrow_and_update() {
            return grace;
        }
        if stop.changed().await.is_err() {
            return Duration::ZERO;
        }
    }
}

/// Sleeps `delay`; `true` if a stop was requested meanwhile.
async fn stopped_within(stop: &mut watch::Receiver<Option<Duration>>, delay: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => false,
        _ = stop_requested(stop) => true,
    }
}

/// Runs `attempt` until it succeeds, with back-off, noting each new reason in the pod's log;
/// `None` if the pod is stopped meanwhile.
async fn retrying<T, F, Fut>(
    stop: &mut watch::Receiver<Option<Duration>>,
    log: &Path,
    what: &str,
    mut attempt: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut backoff = PREPARE_BACKOFF_MIN;
    let mut last: Option<String> = None;
    loop {
        if stop.borrow().is_some() {
            return None;
        }
        match attempt().await {
            Ok(value) => return Some(value),
            Err(why) => {
                if last.as_ref() != Some(&why) {
                    note(log, &format!("cannot {what} yet (retrying): {why}"));
                    tracing::info!(log = %log.display(), "pod runner: cannot {what} yet: {why}");
                    last = Some(why);
                }
                if stopped_within(stop, backoff).await {
                    return None;
                }
                backoff = (backoff * 2).min(PREPARE_BACKOFF_MAX);
            }
        }
    }
}

/// A line from the runner in a pod's log.
fn note(log: &Path, message: &str) {
    if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(file, "devctl-testenv: {} {message}", now_rfc3339());
    }
}

/// What a pod's container asks for, checked before anything is started.
struct Plan {
    container: Container,
    volumes: Vec<Volume>,
    /// The image's name (`postgres`, `mysql`).
    engine: String,
    run_as: RunAs,
    service_account: String,
}

impl Plan {
    fn new(pod: &Pod) -> Result<Self, String> {
        let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
        let container = spec
            .containers
            .first()
            .ok_or("the pod has no container")?
            .clone();
        let command = container.command.clone().unwrap_or_default();
        let is_agent = command
            .first()
            .and_then(|c| Path::new(c).file_name())
            .is_some_and(|n| n == "devctl-agent");
        if !is_agent {
            return Err(format!(
                "container {:?} runs {command:?}, not devctl-agent: not started (the runner \
                 only runs devctl-agent)",
                container.name
            ));
        }
        let (engine, _) = image_name_and_tag(container.image.as_deref().unwrap_or_default());
        let run_as = RunAs::for_engine(&engine)?;
        Ok(Self {
            volumes: spec.volumes.clone().unwrap_or_default(),
            service_account: spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into()),
            container,
            engine,
            run_as,
        })
    }

    /// `(volume name, claim name)` of each claim volume.
    fn claims(&self) -> Vec<(String, String)> {
        self.volumes
            .iter()
            .filter_map(|v| {
                let claim = v.persistent_volume_claim.as_ref()?;
                Some((v.name.clone(), claim.claim_name.clone()))
            })
            .collect()
    }
}

/// The user an agent runs as.
#[derive(Clone, Debug)]
struct RunAs {
    user: String,
    uid: u32,
    gid: u32,
    /// Running as root: switch to `uid`/`gid` and chown what it writes.
    switch: bool,
}

impl RunAs {
    fn for_engine(engine: &str) -> Result<Self, String> {
        // SAFETY: geteuid/getegid cannot fail.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if euid != 0 {
            return Ok(Self {
                user: std::env::var("USER").unwrap_or_else(|_| euid.to_string()),
                uid: euid,
                gid: egid,
                switch: false,
            });
        }
        let user = match engine {
            "postgres" => "postgres",
            "mysql" | "mariadb" => "mysql",
            other => {
                return Err(format!(
                    "image {other:?}: no user to run it as (postgres:* and mysql:* images only)"
                ));
            }
        };
        let (uid, gid) = lookup_user(user).ok_or_else(|| {
            format!("user {user:?} does not exist on this machine: install the engine's package")
        })?;
        Ok(Self {
            user: user.into(),
            uid,
            gid,
            switch: true,
        })
    }

    fn owner(&self) -> Option<(u32, u32)> {
        self.switch.then_some((self.uid, self.gid))
    }
}

fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let name = CString::new(name).ok()?;
    // SAFETY: getpwnam_r writes into `entry` and `buffer`, which outlive the call; `result`
    // points to `entry` or is null.
    unsafe {
        let mut entry: libc::passwd = std::mem::zeroed();
        let mut buffer = vec![0 as libc::c_char; 16 * 1024];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            name.as_ptr(),
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        );
        (rc == 0 && !result.is_null()).then_some((entry.pw_uid, entry.pw_gid))
    }
}

/// Creates `path` (and parents) with `mode`, owned by `owner` if given.
fn make_dir(path: &Path, owner: Option<(u32, u32)>, mode: u32) -> Result<(), Error> {
    std::fs::create_dir_all(path)
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
        .and_then(|()| match owner {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid)),
            None => Ok(()),
        })
        .map_err(|e| Error::io(format!("create {}", path.display()), e))
}

/// Debian's newest PostgreSQL: `/usr/lib/postgresql/<highest>/bin`.
fn postgres_bin_dir() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
}

/// The agent binary as other users can run it: as is when every directory above it can be
/// traversed by others, else a copy in `<root>/bin` (a checkout under `/root` is private).
fn agent_for_others(agent: &Path, root: &Path) -> Result<PathBuf, Error> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(agent.to_path_buf());
    }
    let canonical = std::fs::canonicalize(agent)
        .map_err(|e| Error::io(format!("resolve {}", agent.display()), e))?;
    let mode = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode())
            .unwrap_or(0)
    };
    let reachable = canonical.ancestors().skip(1).all(|d| mode(d) & 0o001 != 0)
        && mode(&canonical) & 0o005 == 0o005;
    if reachable {
        return Ok(canonical);
    }
    let bin = root.join("bin");
    make_dir(&bin, None, 0o755)?;
    let copy = bin.join("devctl-agent");
    std::fs::copy(&canonical, &copy)
        .and_then(|_| std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)))
        .map_err(|e| Error::io(format!("copy the agent to {}", copy.display()), e))?;
    Ok(copy)
}

/// Supervises one pod: waits for its claims to be free, then runs its agent until stopped.
async fn run_pod(
    ctx: Arc<Ctx>,
    pod: Pod,
    claim_uids: Arc<Mutex<Vec<String>>>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let uid = pod.uid().unwrap_or_default();
    let log = ctx
        .root
        .join("logs")
        .join(format!("{namespace}_{name}_{uid}.log"));
    lock(&ctx.shared).pods.insert(
        (namespace.clone(), name.clone()),
        PodRecord {
            uid: uid.clone(),
            log: log.clone(),
        },
    );
    let plan = match Plan::new(&pod) {
        Ok(plan) => plan,
        Err(why) => {
            note(&log, &why);
            tracing::warn!(%namespace, pod = %name, "pod runner: {why}");
            return;
        }
    };
    // By uid alone: engines put Unix sockets in these directories, and a socket's path must
    // fit in 107 bytes.
    let pod_dir = ctx.root.join("pods").join(&uid);

    let claims = {
        let (ctx, plan, namespace) = (&ctx, &plan, &namespace);
        match retrying(&mut stop, &log, "find its claims", || {
            resolve_claims(ctx, namespace, plan)
        })
        .await
        {
            Some(claims) => claims,
            None => return,
        }
    };
    let mut uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
    uids.sort();
    uids.dedup();
    *claim_uids
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = uids.clone();
    // At most one agent per claim: wait for the previous pod's agent to be gone.
    let mut guards = Vec::new();
    for claim_uid in &uids {
        let claim_lock = ctx.claim_lock(claim_uid);
        let guard = match claim_lock.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                note(
                    &log,
                    &format!("waiting for the previous agent on claim {claim_uid} to exit"),
                );
                tokio::select! {
                    guard = claim_lock.lock_owned() => guard,
                    _ = stop_requested(&mut stop) => return,
                }
            }
        };
        guards.push(guard);
    }
    let ports = match free_port().and_then(|p| Ok((p, free_port()?))) {
        Ok(ports) => ports,
        Err(e) => {
            note(&log, &format!("no free port: {e}"));
            return;
        }
    };
    // The agent's way to the API server, which `partition` cuts.
    let proxy = match ApiProxy::start(&ctx, &namespace, &name, &uid, &log).await {
        Ok(proxy) => proxy,
        Err(why) => {
            note(&log, &format!("no API proxy: {why}"));
            return;
        }
    };
    let key = (namespace.clone(), name.clone());

    let mut backoff = RESTART_BACKOFF_MIN;
    let mut starts = 0u32;
    // The pod's Ready condition was set False after an agent exit.
    let mut marked_unready = false;
    loop {
        if held(&ctx, &key) && wait_released(&ctx, &key, &log, &mut stop).await {
            break;
        }
        let launch = {
            let (ctx, pod, plan, claims, pod_dir) = (&ctx, &pod, &plan, &claims, &pod_dir);
            let server = proxy.url.as_str();
            match retrying(&mut stop, &log, "start", || {
                prepare(ctx, pod, plan, claims, pod_dir, ports, server)
            })
            .await
            {
                Some(launch) => launch,
                None => break,
            }
        };
        // Started and listed as running under the lock `kill_and_hold` sets the hold under:
        // no agent starts once it returned.
        let spawned = {
            let mut shared = lock(&ctx.shared);
            if shared.held.contains(&key) {
                None
            } else {
                let spawned = Agent::spawn(
                    &ctx,
                    &namespace,
                    &name,
                    &uid,
                    &plan,
                    launch,
                    &log,
                    starts + 1,
                );
                if let Ok(agent) = &spawned {
                    shared.running.insert(uid.clone(), agent.pid);
                }
                Some(spawned)
            }
        };
        let agent = match spawned {
            None => continue,
            Some(Ok(agent)) => agent,
            Some(Err(why)) => {
                starts += 1;
                note(&log, &format!("cannot start the agent: {why}"));
                if stopped_within(&mut stop, backoff).await {
                    break;
                }
                backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
                continue;
            }
        };
        starts += 1;
        // Taken off `running` (under the lock) before it is reaped. A pod marked not ready
        // when its last agent went is Ready again once the new one's readiness probe passes.
        let exit = {
            let mut supervise = std::pin::pin!(agent.supervise(&mut stop));
            let mut probe = std::pin::pin!(probe_until_ready(&ctx, &pod, ports.1, &log));
            let mut probing = marked_unready;
            loop {
                tokio::select! {
                    exit = &mut supervise => break exit,
                    _ = &mut probe, if probing => {
                        probing = false;
                        marked_unready = false;
                    }
                }
            }
        };
        lock(&ctx.shared)
            .exits
            .entry(key.clone())
            .or_default()
            .push(exit.clone());
        let how = match (exit.code, exit.signal) {
            (Some(code), _) => format!("exited with code {code}"),
            (_, Some(signal)) => format!("was killed by signal {signal}"),
            _ => "ended".to_string(),
        };
        note(
            &log,
            &format!("agent (pid {}) {how} after {:?}", exit.pid, exit.uptime),
        );
        if exit.requested {
            break;
        }
        // What a kubelet's failing readiness probe would show: the operator must not count
        // an instance whose agent is gone by its last report.
        for _ in 0..3 {
            if set_pod_ready(&ctx, &pod, false, &log).await {
                marked_unready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if held(&ctx, &key) {
            // Released: started again at once, the hold standing in for the back-off.
            if wait_released(&ctx, &key, &log, &mut stop).await {
                break;
            }
            continue;
        }
        tracing::info!(%namespace, pod = %name, pid = exit.pid, "pod runner: agent {how}; restarting in {backoff:?}");
        if exit.uptime >= RESTART_BACKOFF_RESET {
            backoff = RESTART_BACKOFF_MIN;
        }
        note(&log, &format!("restarting in {backoff:?}"));
        if stopped_within(&mut stop, backoff).await {
            break;
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
    }
    drop(proxy);
    // The pod's volumes go with it (claims stay).
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(pod_dir)).await;
    drop(guards);
}

/// Sets the pod's `Ready` and `ContainersReady` conditions (the pod's uid as precondition: a
/// replacement of the same name is not touched). Returns whether it was written.
async fn set_pod_ready(ctx: &Ctx, pod: &Pod, ready: bool, log: &Path) -> bool {
    let namespace = pod.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = if ready { "True" } else { "False" };
    let reason = if ready { None } else { Some("AgentExited") };
    let condition = |type_: &str| {
        serde_json::json!({
            "type": type_, "status": status, "lastTransitionTime": now, "reason": reason,
        })
    };
    let patch = serde_json::json!({
        "metadata": { "uid": pod.uid() },
        "status": { "conditions": [condition("Ready"), condition("ContainersReady")] },
    });
    match api
        .patch_status(
            &pod.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(patch),
        )
        .await
    {
        Ok(_) => {
            note(log, &format!("pod marked Ready={status}"));
            true
        }
        Err(e) => {
            note(log, &format!("cannot mark the pod Ready={status}: {e}"));
            false
        }
    }
}

/// Polls the agent's `/readyz` on `health_port` (as a kubelet's readiness probe would, every
/// half second) until it answers 200, then marks the pod Ready.
async fn probe_until_ready(ctx: &Ctx, pod: &Pod, health_port: u16, log: &Path) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let answer = async {
            let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, health_port)).await?;
            stream
                .write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")
                .await?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head).await?;
            Ok::<_, std::io::Error>(head)
        };
        let ok = tokio::time::timeout(Duration::from_secs(1), answer)
            .await
            .is_ok_and(|r| r.is_ok_and(|head| head.ends_with(b" 200")));
        if ok && set_pod_ready(ctx, pod, true, log).await {
            return;
        }
    }
}

/// Whether agents of pods named `key` must not start ([`PodRunner::kill_and_hold`]).
fn held(ctx: &Ctx, key: &(String, String)) -> bool {
    lock(&ctx.shared).held.contains(key)
}

/// Waits until pods named `key` are released; `true` if the pod is stopped meanwhile.
async fn wait_released(
    ctx: &Ctx,
    key: &(String, String),
    log: &Path,
    stop: &mut watch::Receiver<Option<Duration>>,
) -> bool {
    let mut changes = ctx.faults.subscribe();
    note(log, "held (kill_and_hold): no agent starts until released");
    while held(ctx, key) {
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    stop_requested(stop).await;
                    return true;
                }
            }
            _ = stop_requested(stop) => return true,
        }
    }
    note(log, "released: starting the agent");
    false
}

/// A claim volume of a pod: its local directory.
struct ClaimVolume {
    volume: String,
    uid: String,
    dir: PathBuf,
}

async fn resolve_claims(
    ctx: &Ctx,
    namespace: &str,
    plan: &Plan,
) -> Result<Vec<ClaimVolume>, String> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let mut resolved = Vec::new();
    for (volume, claim) in plan.claims() {
        let found = api
            .get_opt(&claim)
            .await
            .map_err(|e| format!("read claim {claim}: {e}"))?
            .ok_or_else(|| format!("claim {namespace}/{claim} does not exist (yet)"))?;
        if found.metadata.deletion_timestamp.is_some() {
            return Err(format!("claim {namespace}/{claim} is being deleted"));
        }
        let uid = found.uid().unwrap_or_default();
        let dir = ctx.claim_dir(namespace, &claim, &uid);
        let claims_dir = ctx.root.join("claims");
        for parent in [claims_dir.clone(), claims_dir.join(namespace)] {
            make_dir(&parent, None, 0o755).map_err(|e| e.to_string())?;
        }
        make_dir(&dir, plan.run_as.owner(), 0o755).map_err(|e| e.to_string())?;
        lock(&ctx.shared)
            .claims
            .insert((namespace.to_string(), claim.clone()), dir.clone());
        resolved.push(ClaimVolume { volume, uid, dir });
    }
    Ok(resolved)
}

/// Everything one start of an agent needs.
struct Launch {
    args: Vec<String>,
    env: BTreeMap<String, String>,
    home: PathBuf,
}

/// Prepares one start: volumes, environment, a fresh token.
async fn prepare(
    ctx: &Ctx,
    pod: &Pod,
    plan: &Plan,
    claims: &[ClaimVolume],
    pod_dir: &Path,
    (port, health_port): (u16, u16),
    server: &str,
) -> Result<Launch, String> {
    let namespace = pod.namespace().unwrap_or_default();
    let owner = plan.run_as.owner();
    let pods_dir = ctx.root.join("pods");
    for dir in [pods_dir.clone(), pod_dir.to_path_buf()] {
        make_dir(&dir, None, 0o755).map_err(|e| e.to_string())?;
    }

    // Volumes → local directories.
    let mut volumes: HashMap<String, PathBuf> = claims
        .iter()
        .map(|c| (c.volume.clone(), c.dir.clone()))
        .collect();
    for volume in &plan.volumes {
        let dir = pod_dir.join(&volume.name);
        if volume.empty_dir.is_some() {
            make_dir(&dir, owner, 0o755).map_err(|e| e.to_string())?;
        } else if let Some(source) = &volume.config_map {
            let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
            let found = api
                .get_opt(&source.name)
                .await
                .map_err(|e| format!("read ConfigMap {}: {e}", source.name))?;
            let files = match found {
                Some(cm) => {
                    let mut files: BTreeMap<String, Vec<u8>> = cm
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect();
                    files.extend(
                        cm.binary_data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0)),
                    );
                    files
                }
                None if source.optional == Some(true) => BTreeMap::new(),
                None => {
                    return Err(format!(
                        "ConfigMap {namespace}/{} (volume {}) does not exist (yet)",
                        source.name, volume.name
                    ));
                }
            };
            write_volume(&dir, files, source.items.as_deref(), None, 0o644)?;
        } else if let Some(source) = &volume.secret {
            let secret_name = source.secret_name.clone().unwrap_or_default();
            let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
            let found = api
                .get_opt(&secret_name)
                .await
                .map_err(|e| format!("read Secret {secret_name}: {e}"))?;
            let files = match found {
                Some(secret) => secret
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect(),
                None if source.optional == Some(true) => BTreeMap::new(),
                None => {
                    return Err(format!(
                        "Secret {namespace}/{secret_name} (volume {}) does not exist (yet)",
                        volume.name
                    ));
                }
            };
            write_volume(&dir, files, source.items.as_deref(), owner, 0o600)?;
        } else {
            continue;
        }
        volumes.insert(volume.name.clone(), dir);
    }
    // Mount paths → local directories, longest first.
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for mount in plan.container.volume_mounts.iter().flatten() {
        let Some(dir) = volumes.get(&mount.name) else {
            continue;
        };
        let dir = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => {
                let dir = dir.join(sub);
                make_dir(&dir, owner, 0o755).map_err(|e| e.to_string())?;
                dir
            }
            None => dir.clone(),
        };
        mounts.push((mount.mount_path.trim_end_matches('/').to_string(), dir));
    }
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    let rewrite = |value: &str| -> String {
        for (path, dir) in &mounts {
            if let Some(rest) = value.strip_prefix(path.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{}{rest}", dir.display());
            }
        }
        value.to_string()
    };

    let mut env = resolve_env(ctx, pod, &plan.container).await?;
    for value in env.values_mut() {
        *value = rewrite(value);
    }
    let expand_all = |list: &Option<Vec<String>>| -> Vec<String> {
        list.iter()
            .flatten()
            .map(|a| rewrite(&expand(a, &env)))
            .collect()
    };
    let args = expand_all(&plan.container.args);

    // What differs from a container.
    let home = pod_dir.join("home");
    make_dir(&home, owner, 0o700).map_err(|e| e.to_string())?;
    let kubeconfig = pod_dir.join("kubeconfig");
    let token = service_account_token(ctx, pod, &plan.service_account).await?;
    let user = format!("system:serviceaccount:{namespace}:{}", plan.service_account);
    // Through the pod's API proxy (see `PodRunner::partition`).
    let mut config = kubeconfig::build(
        server,
        &ctx.server_ca_pem,
        &user,
        Credentials::Token(&token),
    )
    .map_err(|e| e.to_string())?;
    for context in &mut config.contexts {
        if let Some(context) = &mut context.context {
            context.namespace = Some(namespace.clone());
        }
    }
    kubeconfig::write(&config, &kubeconfig).map_err(|e| e.to_string())?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&kubeconfig, Some(uid), Some(gid))
            .map_err(|e| format!("chown {}: {e}", kubeconfig.display()))?;
    }
    let loopback = "127.0.0.1".to_string();
    env.insert(env::PORT.into(), port.to_string());
    env.insert(env::HEALTH_PORT.into(), health_port.to_string());
    env.insert(env::LISTEN_ADDRESS.into(), loopback.clone());
    env.insert(env::POD_IP.into(), loopback);
    // Service names do not resolve here: replicas take the primary's address from its
    // report.
    env.insert(env::PRIMARY_FROM.into(), "annotation".into());
    match (plan.engine.as_str(), postgres_bin_dir()) {
        ("postgres", Some(bin)) => {
            env.insert(env::ENGINE_BIN_DIR.into(), bin.display().to_string());
        }
        _ => {
            env.remove(env::ENGINE_BIN_DIR);
        }
    }
    env.insert("PATH".into(), AGENT_PATH.into());
    env.insert("HOME".into(), home.display().to_string());
    env.insert("USER".into(), plan.run_as.user.clone());
    env.insert("LOGNAME".into(), plan.run_as.user.clone());
    env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
    env.insert(
        AGENT_TEST_HOOKS_ENV.into(),
        hooks_path(&ctx.root, &namespace, &pod.name_any())
            .display()
            .to_string(),
    );
    env.entry("LANG".into()).or_insert_with(|| "C.UTF-8".into());
    for passed in ["RUST_LOG", "RUST_BACKTRACE"] {
        if let Ok(value) = std::env::var(passed) {
            env.entry(passed.into()).or_insert(value);
        }
    }
    Ok(Launch { args, env, home })
}

/// Writes a ConfigMap's or Secret's keys as files into `dir` (emptied first), or only
/// `items` at their paths.
fn write_volume(
    dir: &Path,
    mut files: BTreeMap<String, Vec<u8>>,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    owner: Option<(u32, u32)>,
    mode: u32,
) -> Result<(), String> {
    if let Some(items) = items {
        files = items
            .iter()
            .filter_map(|item| Some((item.path.clone(), files.get(&item.key)?.clone())))
            .collect();
    }
    let _ = std::fs::remove_dir_all(dir);
    make_dir(dir, None, 0o755).map_err(|e| e.to_string())?;
    for (path, content) in files {
        let file = dir.join(&path);
        if let Some(parent) = file.parent() {
            make_dir(parent, None, 0o755).map_err(|e| e.to_string())?;
        }
        std::fs::write(&file, content)
            .and_then(|()| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)))
            .and_then(|()| match owner {
                Some((uid, gid)) => std::os::unix::fs::chown(&file, Some(uid), Some(gid)),
                None => Ok(()),
            })
            .map_err(|e| format!("write {}: {e}", file.display()))?;
    }
    Ok(())
}

/// The container's environment as the kubelet would set it (`envFrom`, then `env` in order
/// with `$(VAR)` references expanded; the pod's IP is loopback).
async fn resolve_env(
    ctx: &Ctx,
    pod: &Pod,
    container: &Container,
) -> Result<BTreeMap<String, String>, String> {
    let namespace = pod.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut env = BTreeMap::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(source) = &from.config_map_ref {
            match config_maps
                .get_opt(&source.name)
                .await
                .map_err(|e| format!("read ConfigMap {}: {e}", source.name))?
            {
                Some(cm) => env.extend(
                    cm.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (format!("{prefix}{k}"), v)),
                ),
                None if source.optional == Some(true) => {}
                None => {
                    return Err(format!(
                        "ConfigMap {namespace}/{} does not exist (yet)",
                        source.name
                    ));
                }
            }
        }
        if let Some(source) = &from.secret_ref {
            match secrets
                .get_opt(&source.name)
                .await
                .map_err(|e| format!("read Secret {}: {e}", source.name))?
            {
                Some(secret) => {
                    env.extend(secret.data.unwrap_or_default().into_iter().map(|(k, v)| {
                        (
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v.0).into_owned(),
                        )
                    }))
                }
                None if source.optional == Some(true) => {}
                None => {
                    return Err(format!(
                        "Secret {namespace}/{} does not exist (yet)",
                        source.name
                    ));
                }
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = if let Some(value) = &var.value {
            expand(value, &env)
        } else if let Some(from) = &var.value_from {
            if let Some(field) = &from.field_ref {
                field_value(pod, &field.field_path).ok_or_else(|| {
                    format!(
                        "env {}: unsupported fieldRef {}",
                        var.name, field.field_path
                    )
                })?
            } else if let Some(key) = &from.secret_key_ref {
                let found = secrets
                    .get_opt(&key.name)
                    .await
                    .map_err(|e| format!("read Secret {}: {e}", key.name))?;
                match found.and_then(|s| s.data?.remove(&key.key)) {
                    Some(value) => String::from_utf8_lossy(&value.0).into_owned(),
                    None if key.optional == Some(true) => continue,
                    None => {
                        return Err(format!(
                            "env {}: key {} of Secret {namespace}/{} does not exist (yet)",
                            var.name, key.key, key.name
                        ));
                    }
                }
            } else if let Some(key) = &from.config_map_key_ref {
                let found = config_maps
                    .get_opt(&key.name)
                    .await
                    .map_err(|e| format!("read ConfigMap {}: {e}", key.name))?;
                match found.and_then(|c| c.data?.remove(&key.key)) {
                    Some(value) => value,
                    None if key.optional == Some(true) => continue,
                    None => {
                        return Err(format!(
                            "env {}: key {} of ConfigMap {namespace}/{} does not exist (yet)",
                            var.name, key.key, key.name
                        ));
                    }
                }
            } else {
                tracing::debug!(var = %var.name, "pod runner: unsupported valueFrom, left out");
                continue;
            }
        } else {
            String::new()
        };
        env.insert(var.name.clone(), value);
    }
    Ok(env)
}

/// A downward-API field of the pod, as the runner's process sees it.
fn field_value(pod: &Pod, path: &str) -> Option<String> {
    let meta = pod.meta();
    let spec = pod.spec.as_ref();
    let keyed = |prefix: &str, map: Option<&BTreeMap<String, String>>| -> Option<Option<String>> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key).cloned()))
    };
    if let Some(value) = keyed("metadata.labels['", meta.labels.as_ref()) {
        return Some(value.unwrap_or_default());
    }
    if let Some(value) = keyed("metadata.annotations['", meta.annotations.as_ref()) {
        return Some(value.unwrap_or_default());
    }
    Some(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "status.podIP" | "status.podIPs" | "status.hostIP" | "status.hostIPs" => "127.0.0.1".into(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        _ => return None,
    })
}

/// Kubernetes' `$(VAR)` expansion: defined variables are replaced, `$$` is a literal `$`,
/// anything else stays as written.
fn expand(value: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
            && let Some(found) = env.get(&inner[..end])
        {
            out.push_str(found);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A token for the pod's ServiceAccount (TokenRequest, bound to the pod, 1 h).
async fn service_account_token(
    ctx: &Ctx,
    pod: &Pod,
    service_account: &str,
) -> Result<String, String> {
    let namespace = pod.namespace().unwrap_or_default();
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                uid: pod.uid(),
            }),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    match api
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
    {
        Ok(answer) => answer
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                format!("TokenRequest for {namespace}/{service_account} returned no token")
            }),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(format!(
            "ServiceAccount {namespace}/{service_account} does not exist (yet): {}",
            status.message
        )),
        Err(e) => Err(format!(
            "TokenRequest for ServiceAccount {namespace}/{service_account}: {e}"
        )),
    }
}

/// A running agent process. Dropping it kills its process tree.
struct Agent {
    child: Option<Child>,
    pid: u32,
    pod_uid: String,
    /// Where it is listed as running (from its start until just before it is reaped).
    shared: SharedState,
    started: Instant,
    log: PathBuf,
    /// Where this run's output starts in the log.
    offset: u64,
}

impl Agent {
    #[allow(clippy::too_many_arguments)]
    fn spawn(
        ctx: &Ctx,
        namespace: &str,
        name: &str,
        uid: &str,
        plan: &Plan,
        launch: Launch,
        log_path: &Path,
        start: u32,
    ) -> Result<Self, String> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|e| format!("open {}: {e}", log_path.display()))?;
        let _ = writeln!(
            log,
            "devctl-testenv: {} start {start} of {} {:?} as {} (uid {})",
            now_rfc3339(),
            ctx.agent.display(),
            launch.args,
            plan.run_as.user,
            plan.run_as.uid,
        );
        let offset = log.metadata().map(|m| m.len()).unwrap_or(0);
        let log_err = log
            .try_clone()
            .map_err(|e| format!("clone the log handle: {e}"))?;
        let mut command = Command::new(&ctx.agent);
        command
            .args(&launch.args)
            .env_clear()
            .envs(&launch.env)
            .current_dir(&launch.home)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        if plan.run_as.switch {
            command.uid(plan.run_as.uid).gid(plan.run_as.gid);
        }
        let child = process::spawn(&format!("devctl-agent {namespace}/{name}"), command)
            .map_err(|e| format!("spawn {}: {e}", ctx.agent.display()))?;
        let pid = child.id();
        tracing::info!(%namespace, pod = %name, pid, log = %log_path.display(), "pod runner: agent started");
        Ok(Self {
            child: Some(child),
            pid,
            pod_uid: uid.to_string(),
            shared: ctx.shared.clone(),
            started: Instant::now(),
            log: log_path.to_path_buf(),
            offset,
        })
    }

    /// Whether it has exited (without reaping it: the pid, and so its process group, stays
    /// ours until [`Self::reap`]).
    fn exited(&self) -> bool {
        // SAFETY: waitid writes into `info`; WNOWAIT leaves the child waitable.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let rc = libc::waitid(
                libc::P_PID,
                self.pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            rc != 0 || info.si_pid() != 0
        }
    }

    /// Runs until it exits or a stop is requested (then SIGTERM, SIGKILL after the grace).
    async fn supervise(mut self, stop: &mut watch::Receiver<Option<Duration>>) -> Exit {
        loop {
            if self.exited() {
                return self.reap(false);
            }
            tokio::select! {
                grace = stop_requested(stop) => {
                    self.terminate(grace).await;
                    return self.reap(true);
                }
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }

    async fn terminate(&mut self, grace: Duration) {
        // SAFETY: signalling our own child, not reaped yet (see `exited`).
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
        }
        // A frozen agent (`PodRunner::freeze`) acts on SIGTERM once continued, and shuts
        // down an engine that runs.
        self.continue_tree();
        let deadline = Instant::now() + grace;
        while !self.exited() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !self.exited() {
            tracing::info!(
                pid = self.pid,
                ?grace,
                "pod runner: agent did not stop in time, killing it"
            );
            self.kill_group();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !self.exited() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    /// SIGCONT to its process tree.
    fn continue_tree(&self) {
        // SAFETY: the pid is our unreaped child and leads its process group.
        unsafe {
            libc::kill(-(self.pid as libc::pid_t), libc::SIGCONT);
        }
        signal_all(&process_tree(self.pid), libc::SIGCONT);
    }

    /// SIGKILL to its process group (what it started), to itself and to its descendants in
    /// other groups (PostgreSQL's backends).
    fn kill_group(&self) {
        let tree = process_tree(self.pid);
        // SAFETY: the pid is our unreaped child and leads its process group.
        unsafe {
            libc::kill(-(self.pid as libc::pid_t), libc::SIGKILL);
            libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
        }
        signal_all(&tree, libc::SIGKILL);
    }

    /// Takes it off the running list: from then on no fault method signals it, and it may
    /// be reaped (its pid, and so its group id, freed).
    fn unlist(&self) {
        let mut shared = lock(&self.shared);
        if shared.running.get(&self.pod_uid) == Some(&self.pid) {
            shared.running.remove(&self.pod_uid);
        }
    }

    /// Continues what `PodRunner::freeze` left stopped of it (once reaped: what outlives it
    /// runs again, finds its parent gone and exits).
    fn continue_frozen(&self) {
        let frozen = lock(&self.shared).frozen.remove(&self.pid);
        if let Some(frozen) = frozen {
            signal_all(&frozen, libc::SIGCONT);
            process::forget_stopped(&frozen);
        }
    }

    /// Kills what is left of its process group, reaps it, and says how it ended.
    fn reap(mut self, requested: bool) -> Exit {
        self.unlist();
        // SAFETY: the exited leader is not reaped yet, so the group id is still ours.
        unsafe {
            libc::kill(-(self.pid as libc::pid_t), libc::SIGKILL);
        }
        let status = self.child.take().and_then(|mut child| child.wait().ok());
        process::forget_pid(self.pid);
        self.continue_frozen();
        Exit {
            pod_uid: self.pod_uid.clone(),
            pid: self.pid,
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            at: SystemTime::now(),
            uptime: self.started.elapsed(),
            last_line: last_line(&self.log, self.offset),
            requested,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.unlist();
            self.kill_group();
            let _ = child.wait();
            process::forget_pid(self.pid);
            self.continue_frozen();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Faults: process trees and the API server proxy
// ---------------------------------------------------------------------------------------

/// Polls `check` every [`FAULT_POLL`] until it returns `Some`, for [`FAULT_TIMEOUT`] at most.
fn poll<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> Result<T, Error> {
    let deadline = Instant::now() + FAULT_TIMEOUT;
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: FAULT_TIMEOUT,
            });
        }
        std::thread::sleep(FAULT_POLL);
    }
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    pid: u32,
    state: char,
    ppid: u32,
    pgrp: u32,
}

/// Reads `pid (comm) state ppid pgrp …`; `comm` may hold spaces and parentheses.
fn parse_stat(text: &str) -> Option<ProcStat> {
    let (head, rest) = text.rsplit_once(')')?;
    let pid = head.split_once('(')?.0.trim().parse().ok()?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        state,
        ppid,
        pgrp,
    })
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Stopped by a signal (or traced).
fn is_stopped(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|s| matches!(s.state, 'T' | 't'))
}

fn is_stopped_or_gone(pid: u32) -> bool {
    proc_stat(pid).is_none_or(|s| matches!(s.state, 'T' | 't' | 'Z' | 'X'))
}

/// `pid`, the members of the process group it leads and all their descendants (whatever
/// their group or session), parents first, zombies left out.
fn process_tree(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let table: Vec<ProcStat> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(proc_stat)
        .collect();
    tree_of(pid, &table)
}

fn tree_of(pid: u32, table: &[ProcStat]) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for p in table {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let dead: HashSet<u32> = table
        .iter()
        .filter(|p| matches!(p.state, 'Z' | 'X'))
        .map(|p| p.pid)
        .collect();
    // The group's members whose parent is gone were reparented: reached from the group.
    let roots = table
        .iter()
        .filter(|p| p.pid == pid)
        .chain(table.iter().filter(|p| p.pgrp == pid && p.pid != pid))
        .map(|p| p.pid);
    let mut seen = HashSet::new();
    let mut tree = Vec::new();
    for root in roots {
        let mut queue = std::collections::VecDeque::from([root]);
        while let Some(p) = queue.pop_front() {
            if !seen.insert(p) {
                continue;
            }
            if !dead.contains(&p) {
                tree.push(p);
            }
            queue.extend(children.get(&p).into_iter().flatten());
        }
    }
    tree
}

fn signal_all(pids: &[u32], signal: libc::c_int) {
    for pid in pids {
        // SAFETY: kill(2) has no memory effects; callers pass processes they own (an
        // unreaped agent's tree, see `PodRunner::kill_and_hold`).
        unsafe {
            libc::kill(*pid as libc::pid_t, signal);
        }
    }
}

/// A pod's API server proxy (see [`PodRunner::partition`]); closed on drop.
struct ApiProxy {
    uid: String,
    /// What the agent's kubeconfig names: `https://<API server address>:<proxy port>`.
    url: String,
    shared: SharedState,
    task: tokio::task::JoinHandle<()>,
}

impl ApiProxy {
    /// Listens on the API server's address (loopback), another port: its serving
    /// certificate, for `localhost` and `127.0.0.1`, covers it.
    async fn start(
        ctx: &Ctx,
        namespace: &str,
        name: &str,
        uid: &str,
        log: &Path,
    ) -> Result<Self, String> {
        let server: http::Uri = ctx
            .server
            .parse()
            .map_err(|e| format!("the API server URL {}: {e}", ctx.server))?;
        let host = server
            .host()
            .ok_or_else(|| format!("the API server URL {} has no host", ctx.server))?;
        let upstream = format!("{host}:{}", server.port_u16().unwrap_or(443));
        let ip = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .map_err(|e| format!("bind the API proxy on {ip}: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("the API proxy's address: {e}"))?;
        let key = (namespace.to_string(), name.to_string());
        let mut changes = ctx.faults.subscribe();
        let applied = Arc::new(AtomicU64::new(*changes.borrow_and_update()));
        let partitioned = {
            let mut shared = lock(&ctx.shared);
            shared.proxies.insert(
                uid.to_string(),
                ProxyRecord {
                    namespace: key.0.clone(),
                    name: key.1.clone(),
                    addr,
                    applied: applied.clone(),
                },
            );
            shared.partitioned.contains(&key)
        };
        if partitioned {
            note(
                log,
                &format!("API proxy {addr}: partitioned from the API server"),
            );
        }
        let proxy = Proxy {
            upstream: upstream.into(),
            key,
            shared: ctx.shared.clone(),
            log: log.to_path_buf(),
            applied,
        };
        let task = tokio::spawn(proxy.serve(listener, changes, partitioned));
        tracing::debug!(%namespace, pod = %name, %addr, "pod runner: API proxy started");
        Ok(Self {
            uid: uid.to_string(),
            url: format!("https://{addr}"),
            shared: ctx.shared.clone(),
            task,
        })
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        // Dropping the task's future drops its connections too.
        self.task.abort();
        lock(&self.shared).proxies.remove(&self.uid);
    }
}

struct Proxy {
    upstream: Arc<str>,
    /// `(namespace, pod)`: how partitions are keyed.
    key: (String, String),
    shared: SharedState,
    log: PathBuf,
    applied: Arc<AtomicU64>,
}

impl Proxy {
    async fn serve(
        self,
        listener: TcpListener,
        mut changes: watch::Receiver<u64>,
        mut partitioned: bool,
    ) {
        let mut forwarded = JoinSet::new();
        // Accepted while partitioned: neither read nor answered, like a dropped network.
        let mut held = std::collections::VecDeque::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) if partitioned => {
                        if held.len() >= MAX_HELD_CONNECTIONS {
                            held.pop_front();
                        }
                        held.push_back(stream);
                    }
                    Ok((stream, _)) => {
                        forwarded.spawn(forward(stream, self.upstream.clone()));
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "pod runner: API proxy accept");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let generation = *changes.borrow_and_update();
                    let now = lock(&self.shared).partitioned.contains(&self.key);
                    if now && !partitioned {
                        let open = forwarded.len();
                        forwarded.abort_all();
                        // Each aborted task's future, and so its sockets, is dropped by then.
                        while forwarded.join_next().await.is_some() {}
                        note(&self.log, &format!("API proxy: partitioned from the API server, {open} connection(s) closed"));
                    } else if !now && partitioned {
                        note(&self.log, &format!("API proxy: healed, {} held connection(s) forwarded", held.len()));
                        for stream in held.drain(..) {
                            forwarded.spawn(forward(stream, self.upstream.clone()));
                        }
                    }
                    partitioned = now;
                    self.applied.store(generation, Ordering::SeqCst);
                }
                Some(_) = forwarded.join_next(), if !forwarded.is_empty() => {}
            }
        }
    }
}

/// Copies bytes both ways between `client` and the API server until either end closes.
async fn forward(mut client: TcpStream, upstream: Arc<str>) {
    let connected =
        tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(&*upstream)).await;
    let Ok(Ok(mut server)) = connected else {
        tracing::debug!(%upstream, "pod runner: API proxy cannot reach the API server");
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

/// The last non-empty line the process wrote after `from`.
fn last_line(path: &Path, from: u64) -> Option<String> {
    let mut file = File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(from.max(len.saturating_sub(64 * 1024))))
        .ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    String::from_utf8_lossy(&tail)
        .lines()
        .map(str::trim_end)
        .rfind(|l| !l.trim().is_empty() && !l.starts_with("devctl-testenv:"))
        .map(|l| l.chars().take(500).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_references_like_the_kubelet() {
        let env: BTreeMap<String, String> = [("A".to_string(), "x".to_string())].into();
        assert_eq!(expand("$(A)/b", &env), "x/b");
        assert_eq!(expand("$$(A) $(B) $", &env), "$(A) $(B) $");
    }

    #[test]
    fn reads_image_names_and_tags() {
        assert_eq!(
            image_name_and_tag("docker.io/library/postgres:16.4@sha256:ab"),
            ("postgres".into(), Some("16.4".into()))
        );
        assert_eq!(image_name_and_tag("mysql"), ("mysql".into(), None));
        assert_eq!(
            image_name_and_tag("localhost:5000/mysql:8.4"),
            ("mysql".into(), Some("8.4".into()))
        );
    }

    #[test]
    fn finds_claim_directories() {
        let dir = tempfile::tempdir().unwrap();
        let uid = "0f6e3c1a-1111-2222-3333-444455556666";
        std::fs::create_dir_all(dir.path().join("ns").join(format!("data-my-pg-0-{uid}"))).unwrap();
        assert_eq!(
            claim_dirs(dir.path()),
            vec![("ns".into(), "data-my-pg-0".into(), uid.into())]
        );
    }

    #[test]
    fn reads_proc_stat_with_odd_command_names() {
        let stat = "4242 (postgres: a) b) T 4200 4200 4200 0 -1 4194560 1 0";
        assert_eq!(
            parse_stat(stat),
            Some(ProcStat {
                pid: 4242,
                state: 'T',
                ppid: 4200,
                pgrp: 4200,
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_process_tree_takes_the_group_and_descendants_in_other_sessions() {
        let p = |pid, state, ppid, pgrp| ProcStat {
            pid,
            state,
            ppid,
            pgrp,
        };
        let table = [
            p(1, 'S', 0, 1),
            // The agent, its engine (same group), a backend in a session of its own and
            // the backend's child.
            p(10, 'S', 1, 10),
            p(11, 'S', 10, 10),
            p(12, 'S', 11, 12),
            p(13, 'S', 12, 12),
            // A group member whose parent is gone (reparented to 1).
            p(14, 'S', 1, 10),
            // A zombie, and strangers.
            p(15, 'Z', 10, 10),
            p(20, 'S', 1, 20),
            p(21, 'S', 20, 20),
        ];
        assert_eq!(tree_of(10, &table), vec![10, 11, 12, 13, 14]);
        assert_eq!(tree_of(99, &table), Vec::<u32>::new());
    }

    #[test]
    fn fake_system_identifiers_are_stable_and_per_cluster() {
        let a = fake_system_identifier("ns", "a");
        assert_eq!(a, fake_system_identifier("ns", "a"));
        assert_ne!(a, fake_system_identifier("ns", "b"));
        assert_eq!(a.len(), 19);
    }
}
