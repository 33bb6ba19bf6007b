//! Fault injection on process-backed pods: [`PodRunner`]'s freeze/thaw, kill-and-hold/release
//! and partition/heal (see the module docs), and the supervisor's side of a hold.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::pod::stop_requested;
use super::process_tree::{
    children_named, is_stopped, is_stopped_or_gone, process_tree, signal_all,
};
use super::supervisor::Ctx;
use super::{PodRunner, lock, note, running_pid};
use crate::Error;
use crate::process;

/// How long fault methods wait for processes to stop or continue, or for the runner thread.
/// A process in uninterruptible sleep (an fsync while the suite's lanes load the disk) takes
/// its SIGSTOP only when it wakes: 10 s was once not enough under the full suite.
const FAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The command names of the engines an agent starts.
const ENGINES: &[&str] = &["postgres", "mariadbd", "mysqld"];
/// How often fault methods look.
const FAULT_POLL: Duration = Duration::from_millis(5);

impl PodRunner {
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
        self.exit_recorded(&key, pid)?;
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

    /// The running agent of pod `key`, or an error naming the pod.
    fn running_agent(shared: &super::Shared, key: &(String, String)) -> Result<u32, Error> {
        running_pid(shared, key)
            .ok_or_else(|| Error::Process(format!("pod {}/{} has no running agent", key.0, key.1)))
    }

    /// Waits until the runner recorded the exit of pod `key`'s agent `pid`.
    fn exit_recorded(&self, key: &(String, String), pid: u32) -> Result<(), Error> {
        poll(
            &format!(
                "the runner to record the exit of pod {}/{}'s agent {pid}",
                key.0, key.1
            ),
            || {
                lock(&self.shared)
                    .exits
                    .get(key)
                    .is_some_and(|exits| exits.iter().any(|e| e.pid == pid))
                    .then_some(())
            },
        )
    }

    /// SIGKILLs the engine (PostgreSQL's postmaster, or the MariaDB server) that the running
    /// agent of the newest pod named `pod` started; the agent stays and sees its engine crash.
    /// Returns the killed pid once it is gone. Fails when no agent or no engine runs.
    pub fn kill_engine(&self, namespace: &str, pod: &str) -> Result<u32, Error> {
        self.require_processes("kill_engine")?;
        let key = (namespace.to_string(), pod.to_string());
        let engine = {
            let shared = lock(&self.shared);
            let agent = Self::running_agent(&shared, &key)?;
            let engine = children_named(agent, ENGINES)
                .into_iter()
                .next()
                .ok_or_else(|| {
                    Error::Process(format!("the agent of pod {namespace}/{pod} runs no engine"))
                })?;
            signal_all(&[engine], libc::SIGKILL);
            engine
        };
        poll(
            &format!("engine {engine} of pod {namespace}/{pod} to be gone"),
            || (!process::is_running(engine)).then_some(engine),
        )
    }

    /// SIGKILLs the running agent of the newest pod named `pod` alone. As when a container's
    /// first process dies, the runner then kills what is left of its group (the engine) and
    /// starts the agent again after its back-off. Returns the killed pid once the runner has
    /// recorded its exit.
    pub fn kill_agent(&self, namespace: &str, pod: &str) -> Result<u32, Error> {
        self.require_processes("kill_agent")?;
        let key = (namespace.to_string(), pod.to_string());
        let pid = {
            let shared = lock(&self.shared);
            let pid = Self::running_agent(&shared, &key)?;
            // Listed as running, so not reaped: the pid is still our child.
            signal_all(&[pid], libc::SIGKILL);
            pid
        };
        self.exit_recorded(&key, pid).map(|()| pid)
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

    pub(super) fn require_processes(&self, what: &str) -> Result<(), Error> {
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
}

/// Whether agents of pods named `key` must not start ([`PodRunner::kill_and_hold`]).
pub(super) fn held(ctx: &Ctx, key: &(String, String)) -> bool {
    lock(&ctx.shared).held.contains(key)
}

/// Waits until pods named `key` are released; `true` if the pod is stopped meanwhile.
pub(super) async fn wait_released(
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
