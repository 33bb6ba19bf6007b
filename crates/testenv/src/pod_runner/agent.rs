//! One `devctl-agent` process: spawned as the pod's user with its output in the pod's log,
//! watched until it exits or is stopped, its process tree killed and reaped.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::launch::Launch;
use super::plan::Plan;
use super::pod::stop_requested;
use super::process_tree::{process_tree, signal_all};
use super::supervisor::Ctx;
use super::volumes::make_dir;
use super::{Exit, SharedState, lock, now_rfc3339};
use crate::Error;
use crate::process;

/// How often a running agent is checked for having exited.
const POLL: Duration = Duration::from_millis(50);

/// The agent binary as other users can run it: as is when every directory above it can be
/// traversed by others, else a copy in `<root>/bin` (a checkout under `/root` is private).
pub(super) fn agent_for_others(agent: &Path, root: &Path) -> Result<PathBuf, Error> {
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

/// A running agent process. Dropping it kills its process tree.
pub(super) struct Agent {
    child: Option<Child>,
    pub(super) pid: u32,
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
    pub(super) fn spawn(
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
    pub(super) async fn supervise(mut self, stop: &mut watch::Receiver<Option<Duration>>) -> Exit {
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
