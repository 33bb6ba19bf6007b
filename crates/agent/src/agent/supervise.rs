//! Running the engine: start, watch (probes, watches, the primary lock, signals), stop for a
//! role change, restart with backoff after a crash.

use super::*;

/// Sleeps until `at`, or forever without it.
pub(super) async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits for a change on an optional receiver (forever without one); `false` when its
/// watch ended.
pub(super) async fn changed<T>(rx: &mut Option<watch::Receiver<T>>) -> bool {
    match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

pub(super) enum Exit {
    Act(Action),
    Crashed(ExitStatus),
    Signalled,
    Stale(String),
}

/// How long to wait before starting the engine again after its `failures`-th exit in a row:
/// nothing after a first crash whose processes are all gone (`drained`: every output pipe
/// they shared reached its end, so no old backend still holds the shared memory a new
/// postmaster refuses to start beside), else `backoff` (1 s, doubling up to
/// [`MAX_BACKOFF`]). A restore waiting for WAL (`failures` kept at 0) always waits: each
/// start replays the archive from the backup's checkpoint.
fn restart_wait(failures: u32, drained: bool, backoff: Duration) -> Duration {
    if failures == 1 && drained {
        Duration::ZERO
    } else {
        backoff
    }
}

/// Whether the engine's last error line can say why it exited with `status`: when it exited
/// by itself or aborted (PostgreSQL's PANIC). Killed by any other signal (the OOM killer, a
/// person), the last line is some earlier error — often a client's failed login — not why.
pub(super) fn log_explains_exit(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal().is_none_or(|signal| signal == libc::SIGABRT)
}

/// Since when a primary has seen the same number of its replicas streaming, fewer than
/// expected: it probes fast for [`AWAITING_REPLICAS_FAST_FOR`] after each change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AwaitingReplicas {
    streaming: usize,
    since: tokio::time::Instant,
}

impl AwaitingReplicas {
    /// After a probe that found `streaming` replicas streaming while more are expected (or
    /// `None`: all of them, or not a PostgreSQL primary).
    pub(super) fn next(
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

    pub(super) fn hurries(&self, now: tokio::time::Instant) -> bool {
        now.saturating_duration_since(self.since) < AWAITING_REPLICAS_FAST_FOR
    }
}

impl Agent {
    pub(super) fn start_engine(&mut self) -> Result<Child> {
        // Before it runs: a standby's engine that leaves recovery on its own archives nothing.
        self.shared.set_standby_engine(self.mode == Mode::Replica);
        if self.mariadb() {
            // A switchover's final position is the news only while stopped.
            crate::mariadb::ops::clear_handover(&self.engine);
            // Replication is pointed at the primary anew once the engine runs.
            self.conninfo_applied = None;
        }
        let mut command = self.engine.server_command();
        if let Some(seconds) = self.hooks.archive_timeout().filter(|_| !self.mariadb()) {
            // The last `-c` of a setting wins.
            command.args(["-c", &format!("archive_timeout={seconds}")]);
        }
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

    pub(super) async fn supervise(&mut self, mut fresh: bool) -> Result<Outcome> {
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
                    if let Some(source) = &self.clone_source {
                        // Stopping: no copy is served from here any more.
                        source.set_serving(false);
                    }
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
                            if self.mariadb() {
                                match crate::mariadb::ops::prepare_handover(&self.engine).await {
                                    Ok(position) => tracing::info!(
                                        %position,
                                        "switchover: read-only, sessions ended, every transaction sent; stopping"
                                    ),
                                    Err(e) => tracing::warn!("preparing the switchover: {e}"),
                                }
                            } else if let Err(e) = self
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
                            // Out of recovery though never promoted by this agent.
                            self.forked_on_its_own = self.shared.standby_engine();
                        }
                    }
                    let clean = match &action {
                        Action::Fence(_) => {
                            if self.mariadb() {
                                crate::mariadb::ops::fence(&self.engine).await;
                            }
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
                        self.publish_errant().await;
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
                    let (last_error, drained) = self.engine_exit_reason().await;
                    let last_error = last_error.filter(|_| log_explains_exit(&status));
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
                    if let Some(next) = role::after_crash(&self.role, failures) {
                        tracing::warn!(
                            "{name} exited ({status}){why} twice while rejoining as a standby: re-cloning"
                        );
                        self.move_data_aside()?;
                        self.set_role(next.role);
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
                    // The first crash of an engine that ran stably restarts at once when its
                    // children are gone (the output they shared was read to its end above):
                    // a primary's writers wait for it. Otherwise, and after a second crash in
                    // a row, it backs off.
                    let wait = restart_wait(failures, drained, backoff);
                    let message = format!("{exit}; restarting in {}s", wait.as_secs());
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
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.sigterm.recv() => return Ok(Outcome::Stopped),
                        _ = self.sigint.recv() => return Ok(Outcome::Stopped),
                    }
                    if !wait.is_zero() {
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
        }
    }

    /// The primary's lock lapsed or is another's ([`role::lock_lost`]): fenced at once.
    fn lost_lock(&mut self, why: String) -> Exit {
        let next = role::lock_lost(why.clone());
        self.set_role(next.role);
        // Whatever the cut-off tick had decided: the fence comes first.
        self.action = None;
        Exit::Act(Action::Fence(why))
    }

    /// The last error line the engine printed before it exited, once its output is read
    /// to the end (bounded: a child it left behind may hold the pipe open), and whether
    /// every pipe reached its end (every process that shared it is gone).
    pub(super) async fn engine_exit_reason(&mut self) -> (Option<String>, bool) {
        let mut drained = true;
        for task in self.engine_output.drain(..) {
            drained &= tokio::time::timeout(Duration::from_secs(1), task)
                .await
                .is_ok();
        }
        (self.engine_last_error.take(), drained)
    }

    /// Stops the engine: its fast-shutdown signal, then SIGKILL after [`STOP_TIMEOUT`].
    /// Returns whether it exited cleanly.
    pub(super) async fn stop(&self, child: &mut Child) -> bool {
        self.stop_within(child, STOP_TIMEOUT).await
    }

    /// [`Self::stop`] with SIGKILL after `timeout`.
    pub(super) async fn stop_within(&self, child: &mut Child, timeout: Duration) -> bool {
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

    pub(super) async fn watch_engine(
        &mut self,
        child: &mut Child,
        fresh: &mut bool,
    ) -> Result<Exit> {
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
                        return Ok(self.lost_lock(reason));
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
                                return Ok(self.lost_lock(
                                    "the primary lock's renew deadline passed while probing and reporting".into(),
                                ));
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

    /// Primary under high availability: renews the lock while the engine is healthy and no
    /// failover away from this instance is under way. Returns why to fence, if so: a hold that
    /// lapsed (checked before any request: after a freeze the answer must not depend on the
    /// network), the lock held by another pod, or a failover away from here.
    pub(super) async fn tend_lock(&mut self) -> Option<String> {
        let view = self.view();
        let durations = self.lock_durations()?;
        let duration = durations.hold;
        if self.mode != Mode::Primary {
            return None;
        }
        if let Some(why) = role::failover_away(&self.observe(&view)) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_crash_restarts_at_once_and_a_crash_loop_backs_off() {
        let second = Duration::from_secs(1);
        assert_eq!(restart_wait(1, true, second), Duration::ZERO);
        // An old backend may still hold the shared memory: wait.
        assert_eq!(restart_wait(1, false, second), second);
        assert_eq!(restart_wait(2, true, second), second);
        assert_eq!(
            restart_wait(3, true, Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        // A point-in-time restore waiting for WAL keeps its count at 0 and always waits.
        assert_eq!(restart_wait(0, true, second), second);
    }

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
}
