//! Child processes that can never outlive the process that started them.
//!
//! Three layers make sure nothing is left running:
//! 1. [`ManagedProcess`] kills its child on `Drop` (which also runs while a panic unwinds);
//! 2. every child is started with `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when the
//!    test process dies, even by `SIGKILL`;
//! 3. an `atexit` hook kills whatever is still registered (shared control planes live in
//!    statics, which Rust never drops), continues the processes a test stopped
//!    ([`crate::PodRunner::freeze`]: a stopped process acts on no signal but SIGKILL and
//!    SIGCONT, and an engine's backends are in sessions of their own, out of reach of the
//!    group kill) and removes their temporary directories.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process.
//! Test harnesses run each test on its own short-lived thread, so children are forked from
//! one dedicated spawner thread that lives as long as the process.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, Once, OnceLock};

use crate::Error;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .map(|_| ())
            .unwrap_or_else(|e| panic!("cannot start the testenv spawner thread: {e}"));
        Mutex::new(tx)
    })
}

/// What the `atexit` hook cleans up: live child pids and temporary directories.
#[derive(Default)]
struct Registry {
    pids: BTreeMap<u32, String>,
    dirs: Vec<PathBuf>,
    /// Processes stopped on purpose (SIGSTOP) and not continued yet.
    stopped: BTreeSet<u32>,
    /// Real nodes to tear down (after the kills), by directory.
    nodes: Vec<(PathBuf, crate::real_node::teardown::Leftovers)>,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: registering a plain `extern "C" fn` with libc's atexit has no preconditions.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
    });
    REGISTRY.get_or_init(Mutex::default)
}

extern "C" fn cleanup_at_exit() {
    let Ok(mut registry) = registry().lock() else {
        return;
    };
    for pid in std::mem::take(&mut registry.pids).into_keys() {
        // SAFETY: kill(2) on a pid we started and have not reaped; at worst ESRCH. Every
        // child leads its own process group (see `spawn`): the group goes too, so what a
        // child started itself (a database agent's engine) does not outlive it.
        unsafe {
            libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
    // After the kills: what was stopped and is still alive (an engine's backends, which
    // leave the agent's process group) runs again, sees its parent gone and exits.
    for pid in std::mem::take(&mut registry.stopped) {
        // SAFETY: kill(2) with SIGCONT; at worst ESRCH.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGCONT);
        }
    }
    // Containers outlive the kubelet and containerd: see crate::real_node::teardown.
    for (_, leftovers) in std::mem::take(&mut registry.nodes) {
        crate::real_node::teardown::clean(&leftovers);
    }
    for dir in std::mem::take(&mut registry.dirs) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Tears the real node in `dir` down at process exit unless it was before (see
/// [`forget_clean_at_exit`]).
pub(crate) fn clean_at_exit(dir: &Path, leftovers: crate::real_node::teardown::Leftovers) {
    if let Ok(mut r) = registry().lock() {
        r.nodes.push((dir.to_path_buf(), leftovers));
    }
}

pub(crate) fn forget_clean_at_exit(dir: &Path) {
    if let Ok(mut r) = registry().lock() {
        r.nodes.retain(|(d, _)| d != dir);
    }
}

/// Removes `dir` at process exit unless it was removed before (see [`forget_dir_at_exit`]).
pub(crate) fn remove_dir_at_exit(dir: &Path) {
    if let Ok(mut r) = registry().lock() {
        r.dirs.push(dir.to_path_buf());
    }
}

pub(crate) fn forget_dir_at_exit(dir: &Path) {
    if let Ok(mut r) = registry().lock() {
        r.dirs.retain(|d| d != dir);
    }
}

/// What a dropped environment does with its directory: keeps it when asked to
/// (`DEVCTL_KEEP_TESTENV=1`, `keep`) or when its test is failing (the logs explain the
/// failure), says so on stderr, and removes it otherwise.
pub(crate) fn dispose_dir(dir: &Path, keep: bool) {
    forget_dir_at_exit(dir);
    if keep {
        eprintln!(
            "devctl-testenv: kept {} (DEVCTL_KEEP_TESTENV=1)",
            dir.display()
        );
    } else if std::thread::panicking() {
        eprintln!("devctl-testenv: kept {} (the test failed)", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Sends SIGCONT to `pids` at process exit unless [`forget_stopped`] was called for them:
/// for processes stopped on purpose (SIGSTOP).
pub(crate) fn continue_at_exit(pids: &[u32]) {
    if let Ok(mut r) = registry().lock() {
        r.stopped.extend(pids);
    }
}

/// Undoes [`continue_at_exit`] (the processes were continued or killed).
pub(crate) fn forget_stopped(pids: &[u32]) {
    if let Ok(mut r) = registry().lock() {
        for pid in pids {
            r.stopped.remove(pid);
        }
    }
}

/// Starts `command` from the spawner thread with `PR_SET_PDEATHSIG = SIGKILL`, in a process
/// group of its own, and registers it for the `atexit` hook (which kills its whole group).
/// Unregister it with [`forget_pid`] once it has been reaped.
///
/// The pre-exec step runs after `Command::uid`/`gid` took effect: changing credentials
/// clears the parent-death signal, so setting it last keeps it for a child that drops root.
pub(crate) fn spawn(name: &str, mut command: Command) -> std::io::Result<Child> {
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (prctl, getppid, setpgid, _exit).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            // Own process group: a Ctrl-C in the terminal reaches us, and we stop the
            // children in order instead of the terminal killing them all at once.
            libc::setpgid(0, 0);
            Ok(())
        });
    }
    let gone = || std::io::Error::other(format!("{name}: the testenv spawner thread is gone"));
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .map_err(|_| std::io::Error::other(format!("{name}: spawner lock poisoned")))?
        .send((command, tx))
        .map_err(|_| gone())?;
    let child = rx.recv().map_err(|_| gone())??;
    if let Ok(mut r) = registry().lock() {
        r.pids.insert(child.id(), name.to_string());
    }
    Ok(child)
}

/// Stops the `atexit` hook from killing `pid` (call once it has been reaped).
pub(crate) fn forget_pid(pid: u32) {
    if let Ok(mut r) = registry().lock() {
        r.pids.remove(&pid);
    }
}

/// Polls `probe` every `interval` until it answers `Ok`: fails at once with `alive`'s error
/// (a process it depends on exited), and after `timeout` with `what` and the probe's last
/// answer (see [`with_description`] to add where the logs are).
pub(crate) async fn poll_until<F, Fut>(
    what: &str,
    timeout: std::time::Duration,
    interval: std::time::Duration,
    mut alive: impl FnMut() -> Result<(), Error>,
    mut probe: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        alive()?;
        let last = match probe().await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if std::time::Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("{what} (last answer: {last})"),
                after: timeout,
            });
        }
        tokio::time::sleep(interval).await;
    }
}

/// A timeout with `description` (where the logs are) added to what it waited for.
pub(crate) fn with_description(error: Error, description: impl FnOnce() -> String) -> Error {
    match error {
        Error::Timeout { what, after } => Error::Timeout {
            what: format!("{what}; {}", description()),
            after,
        },
        other => other,
    }
}

/// A running child process whose output goes to a log file.
pub struct ManagedProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
    /// Exactly how it was started, so that [`Self::restart`] repeats it.
    program: PathBuf,
    args: Vec<String>,
    /// Started again whenever it exits, as a kubelet restarts a static pod
    /// ([`crate::ControlPlane`]'s supervisor); [`crate::ControlPlane::check_processes`] then
    /// does not count its exit as a failure.
    restart_on_exit: bool,
    /// How many times it was started again.
    restarts: u32,
    /// When it was last started: [`Self::restart`] waits [`RESTART_BACKOFF`] after it.
    started_at: std::time::Instant,
}

/// A process restarted sooner than this after its last start waits for the rest: one that
/// keeps crashing leaves a log per attempt, not per half second.
const RESTART_BACKOFF: std::time::Duration = std::time::Duration::from_secs(5);

impl ManagedProcess {
    /// Starts `program` with `args`, stdout and stderr appended to `log_path`.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        log_path: &Path,
    ) -> Result<Self, Error> {
        Self::start_with_env(name, program, args, &[], log_path)
    }

    /// [`Self::start`] with `env` added to the inherited environment (not kept for a
    /// restart: a supervised process is started with [`Self::start`]).
    pub fn start_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log_path: &Path,
    ) -> Result<Self, Error> {
        let child = spawn_logged(name, program, args, env, log_path)?;
        Ok(Self {
            name: name.to_string(),
            child,
            log_path: log_path.to_path_buf(),
            program: program.to_path_buf(),
            args: args.to_vec(),
            restart_on_exit: false,
            restarts: 0,
            started_at: std::time::Instant::now(),
        })
    }

    /// Marks it to be started again whenever it exits (see [`Self::restart`]).
    pub(crate) fn set_restart_on_exit(&mut self) {
        self.restart_on_exit = true;
    }

    pub(crate) fn restarts_on_exit(&self) -> bool {
        self.restart_on_exit
    }

    /// How many times it was started again.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Starts the process again with the same command once it has exited (and at least
    /// [`RESTART_BACKOFF`] after its last start); the previous run's log is kept as
    /// `<log>.<restarts>`. `Ok(None)` while it still runs or waits.
    pub(crate) fn restart(&mut self) -> Result<Option<std::process::ExitStatus>, Error> {
        let status = match self.child.try_wait() {
            Ok(None) => return Ok(None),
            Ok(Some(status)) => status,
            Err(e) => return Err(Error::io(format!("wait for {}", self.name), e)),
        };
        if self.started_at.elapsed() < RESTART_BACKOFF {
            return Ok(None);
        }
        forget_pid(self.child.id());
        let restarts = self.restarts + 1;
        let mut previous = self.log_path.clone().into_os_string();
        previous.push(format!(".{restarts}"));
        std::fs::rename(&self.log_path, &previous)
            .map_err(|e| Error::io(format!("move {} aside", self.log_path.display()), e))?;
        // The old child has been reaped: replacing it signals nothing.
        self.child = spawn_logged(&self.name, &self.program, &self.args, &[], &self.log_path)?;
        self.restarts = restarts;
        self.started_at = std::time::Instant::now();
        Ok(Some(status))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// `Err` with the exit status and the end of the log when the process has exited.
    pub fn check_running(&mut self) -> Result<(), Error> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::Process(format!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.name,
                self.log_path.display(),
                tail(&self.log_path, 25)
            ))),
            Err(e) => Err(Error::io(format!("wait for {}", self.name), e)),
        }
    }

    /// Stops the process: SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub fn stop(&mut self, grace: std::time::Duration) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: signalling our own, not yet reaped child.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = std::time::Instant::now() + grace;
            while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        forget_pid(self.child.id());
    }
}

/// Starts `program` with `args`, stdout and stderr written to a new `log_path`.
fn spawn_logged(
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(&str, &str)],
    log_path: &Path,
) -> Result<Child, Error> {
    let log = File::create(log_path)
        .map_err(|e| Error::io(format!("create {}", log_path.display()), e))?;
    let log_err = log
        .try_clone()
        .map_err(|e| Error::io("clone log handle", e))?;
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    let child = spawn(name, command)
        .map_err(|e| Error::io(format!("start {} ({})", name, program.display()), e))?;
    tracing::debug!(name, pid = child.id(), log = %log_path.display(), "started");
    Ok(child)
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        // Test processes are disposable: no grace period on drop keeps teardown fast.
        self.stop(std::time::Duration::ZERO);
    }
}

/// The running processes (pids) `keep` accepts, given each one's pid and executable.
pub fn processes_where(keep: impl Fn(u32, &Path) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| keep(*pid, &exe))
        })
        .collect()
}

/// Whether `pid` is a running process (a zombie has exited already and does not count).
pub fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// The last `lines` lines of a log file (for error messages).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Claims `port` among the test processes of this machine for as long as this process lives:
/// an exclusive `flock` on `<tmp>/devctl-testenv-ports/<port>`, which the kernel drops when
/// the process ends, however it ends. `false` when another live process holds it. Where the
/// claim cannot be made at all (no writable temporary directory), the bind check alone decides.
fn claim_for_life(port: u16) -> bool {
    use std::os::fd::AsRawFd;
    static CLAIMS: Mutex<Vec<File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("devctl-testenv-ports");
    let file = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
    });
    let Ok(file) = file else {
        return true;
    };
    // SAFETY: flock(2) on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return false;
    }
    CLAIMS.lock().unwrap_or_else(|p| p.into_inner()).push(file);
    true
}

/// A free TCP port on loopback for a server the caller starts next.
///
/// The port comes from below the kernel's ephemeral range: a port the kernel handed out for
/// `bind(0)` and that was released again is just as likely to be taken next as the source
/// port of any outgoing connection (a watch, a replication stream) before the server binds
/// it, which fails the server with "address already in use". A port is handed out once per
/// machine at a time: within this process by a set, across the suite's parallel test
/// processes by a lock file each holds for life ([`claim_for_life`]). Binding it first only
/// checks that nothing else listens there. (Before the lock files two lanes once picked the
/// same port within moments: etcd failed with "bind: address already in use".)
pub fn free_port() -> Result<u16, Error> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let (low, high) = ports_below_ephemeral_range();
    if high > low {
        let seed = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            std::process::id(),
        );
        let span = u64::from(high - low);
        for attempt in 0..512u64 {
            let offset = seed.wrapping_add(attempt.wrapping_mul(7919)) % span;
            let Ok(port) = u16::try_from(u64::from(low) + offset) else {
                continue;
            };
            if handed_out.contains(&port) {
                continue;
            }
            // Free on every loopback address and on the wildcard one (an agent's health
            // server listens on 0.0.0.0), and not handed out by another test process.
            if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() && claim_for_life(port) {
                handed_out.insert(port);
                return Ok(port);
            }
        }
    }
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("bind a free port", e))?;
    let port = listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("read a bound port", e))?;
    handed_out.insert(port);
    Ok(port)
}

/// The ports from 20000 up to the start of the kernel's ephemeral range (empty when that
/// range starts lower than usual).
fn ports_below_ephemeral_range() -> (u16, u16) {
    const LOW: u16 = 20_000;
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    (LOW, ephemeral_start.max(LOW))
}
