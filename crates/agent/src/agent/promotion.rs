//! Becoming the primary: the lock gate, a failover's acknowledgement and election, a
//! switchover's hand-over, the promotion and what follows it.

use super::*;
use role::Step;

impl Agent {
    /// High availability: takes (or renews) the primary lock before the engine may run as the
    /// primary; `Err` says why not (also kept in `lock_problem`).
    pub(super) async fn gate_primary(&mut self) -> Result<(), String> {
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

    /// The role's next step with the engine running ([`role::transition`]): observes and
    /// carries the steps out. Returns the latest probe (taken again after a promotion, for
    /// the primary's upkeep).
    pub(super) async fn drive_role(&mut self, probe: Probe) -> Probe {
        let view = self.view();
        let observation = self.observe_running(&view, &probe).await;
        let next = role::transition(&self.role, &observation, &self.config.cluster);
        let promoting = next.steps.contains(&Step::Promoted);
        self.running_steps(next).await;
        if promoting
            && self.role == Role::Primary
            && let Ok(after) = self.engine.probe().await
        {
            return after;
        }
        probe
    }

    /// An engine that does not answer the probe (or before the probe): a primary — or one
    /// whose promotion may have completed — is judged as accepting writes, so the cluster's
    /// word fences it all the same.
    pub(super) async fn drive_role_unprobed(&mut self) {
        if !matches!(self.role, Role::Primary | Role::Promoting) {
            return;
        }
        let view = self.view();
        let observation = role::Observation {
            engine: role::EngineState::AcceptsWrites,
            ..self.observe(&view)
        };
        let next = role::transition(&self.role, &observation, &self.config.cluster);
        self.running_steps(next).await;
    }

    /// The cluster's side of an observation (the engine stopped, nothing else known yet).
    pub(super) fn observe(&self, view: &ClusterView) -> role::Observation {
        role::Observation {
            me: self.config.pod_name.clone(),
            current: view.current_primary.clone(),
            target: view.target_primary.clone(),
            failed: view.failed_primary.clone(),
            epoch: view.failover_epoch,
            initialized: view.initialized,
            recovery: self.config.recovery,
            high_availability: view.lock_duration.is_some(),
            replicas: view.replicas,
            engine: role::EngineState::Stopped,
            data: role::DataState::Empty,
            lock_lost: None,
            acknowledged: false,
            acknowledgement_held: false,
            not_a_candidate: None,
            handover: role::Handover::None,
            rejoin_failed: false,
            wal_gone: None,
            upgrade_step: view.major_upgrade.as_ref().map(|(step, _)| step.clone()),
        }
    }

    /// What the role state machine needs while the engine runs: the probe, this replica's
    /// failover acknowledgement, and — only as a switchover's target — the old primary's
    /// report and this standby's progress past its `finalLSN`.
    async fn observe_running(&mut self, view: &ClusterView, probe: &Probe) -> role::Observation {
        let me = self.config.pod_name.clone();
        let epoch = view.failover_epoch;
        // Stopped for the failover: no WAL receiver, and neither streaming nor the archive
        // configured (nothing more is replayed, so the position is final).
        let receiver_down = match probe.mariadb.as_ref() {
            // MariaDB: the IO thread stopped (by the agent) and the relay log applied.
            Some(found) => {
                self.conninfo_applied.as_deref() == Some("")
                    && found
                        .replication
                        .as_ref()
                        .is_none_or(|r| r.io_running == "No" && r.relay_applied)
            }
            None => {
                self.conninfo_applied.as_deref() == Some("")
                    && self
                        .extras_applied
                        .as_ref()
                        .is_none_or(|e| e.restore_command.is_empty())
                    && probe.wal_receiver.is_none()
            }
        };
        let engine = if probe.role == devctl_api::instance::ROLE_PRIMARY {
            role::EngineState::AcceptsWrites
        } else {
            role::EngineState::Recovering {
                streaming: probe.is_streaming(),
                receiver_down,
            }
        };
        if view.failed_primary.is_none() {
            self.failover_ack = None;
        } else if receiver_down && self.failover_stopped.is_none_or(|(e, _)| e != epoch) {
            self.failover_stopped = Some((epoch, Instant::now()));
        }
        let acknowledgement_held = self.hooks.failover_ack_delay().is_some_and(|delay| {
            self.failover_stopped
                .is_some_and(|(e, at)| e == epoch && at.elapsed() < delay)
        });
        let switchover_to_me = view.failed_primary.is_none()
            && view.target_primary.as_deref() == Some(me.as_str())
            && view.current_primary.as_deref().is_some_and(|c| c != me)
            && self.mode == Mode::Replica;
        let handover = match view.current_primary.as_deref() {
            Some(old) if switchover_to_me => {
                self.watch_old_primary(old);
                self.observe_handover(old).await
            }
            _ => {
                self.handover_watch = None;
                role::Handover::None
            }
        };
        let wal_gone = if self.role == Role::Replica && view.failed_primary.is_none() {
            self.wal_gone(probe)
        } else {
            // A failover, a rejoin or a clone under way: not this question.
            self.wal_removed_since = None;
            None
        };
        role::Observation {
            engine,
            acknowledged: self.failover_ack == Some(epoch),
            acknowledgement_held,
            not_a_candidate: self.not_a_candidate(),
            handover,
            rejoin_failed: self.rejoin_deadline.is_some_and(|d| Instant::now() >= d),
            wal_gone,
            ..self.observe(view)
        }
    }

    /// A switchover's target: watches the old primary's pod, so that its report (stopping,
    /// then `finalLSN`) wakes the main loop at once rather than at the next probe — each
    /// probe period the target waited was time nobody could write.
    fn watch_old_primary(&mut self, old: &str) {
        if self.handover_watch.as_ref().is_some_and(|w| w.pod == old) {
            return;
        }
        let shared = self.shared.clone();
        let fields = format!("metadata.name={old}");
        let pods = self.pods.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(pods, watcher::Config::default().fields(&fields))
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                if event.is_ok() {
                    shared.changed.notify_one();
                }
            }
        });
        self.handover_watch = Some(HandoverWatch {
            pod: old.to_string(),
            task,
        });
    }

    /// A switchover's target: whether the old primary stopped and reported `finalLSN` and this
    /// standby received it and replayed past it (a switchover loses nothing).
    async fn observe_handover(&self, old: &str) -> role::Handover {
        let why = match read_report(&self.pods, old).await {
            Err(e) => e,
            Ok(report) => match report.filter(|r| !r.ready).and_then(|r| r.final_lsn) {
                None => format!("waiting for {old} to stop and report finalLSN"),
                Some(final_lsn) => match self.engine.switchover_progress(&final_lsn).await {
                    Ok(Some(why)) => why,
                    Err(e) => e,
                    Ok(None) => {
                        tracing::info!(%final_lsn, %old, "replayed the old primary's shutdown checkpoint");
                        return role::Handover::CaughtUp;
                    }
                },
            },
        };
        role::Handover::Waiting(why)
    }

    /// Carries out a transition's steps with the engine running, in order; the first that
    /// cannot complete is reported (`switchover_problem`) and the role stays.
    async fn running_steps(&mut self, next: role::Transition) {
        let mut next = next;
        let mut refused = None;
        let (problem, done) = loop {
            let (problem, done) = self.run_steps(&next.steps).await;
            match next.if_refused.take() {
                Some(instead) if !done => {
                    tracing::warn!(
                        "{}; instead: {:?}",
                        problem.as_deref().unwrap_or_default(),
                        instead.steps
                    );
                    refused = problem;
                    next = *instead;
                }
                // What was refused stays the news unless the fallback has its own.
                _ => break (problem.or(refused), done),
            }
        };
        if problem
            .as_ref()
            .is_some_and(|p| self.switchover_problem.as_ref() != Some(p))
        {
            tracing::info!("{}", problem.as_deref().unwrap_or_default());
        }
        self.switchover_problem = problem;
        if done {
            self.set_role(next.role);
        }
    }

    /// Runs `steps` in order until one cannot complete: what to report, and whether all
    /// completed (a `Wait` completes the transition, reporting why nothing else happens).
    async fn run_steps(&mut self, steps: &[Step]) -> (Option<String>, bool) {
        for step in steps.iter().cloned() {
            match step {
                Step::Wait(why) => return (Some(why), true),
                Step::TakeLock => {
                    if let Err(why) = self.gate_primary().await {
                        return (Some(format!("promoting this pod: {why}")), false);
                    }
                    // The primary, or about to be: its new timeline belongs in the archive.
                    self.shared.set_standby_engine(false);
                }
                Step::Acknowledge(epoch) => {
                    tracing::info!(
                        epoch,
                        received = ?self.probe.as_ref().and_then(|p| p.received_lsn.clone()),
                        "failover: stopped streaming; reporting the final position"
                    );
                    self.failover_ack = Some(epoch);
                }
                Step::Promote => {
                    tracing::info!(role = ?self.role, "promoting");
                    self.shared.set_standby_engine(false);
                    if self.mariadb()
                        && self.view().synchronous.is_some()
                        && let Err(e) = crate::mariadb::ops::set_semi_sync(&self.engine, true).await
                    {
                        // Never writable without the acknowledgements the spec asks for.
                        return (
                            Some(format!(
                                "promoting this pod: semi-synchronous replication: {e}"
                            )),
                            false,
                        );
                    }
                    if let Err(e) = self.engine.promote().await {
                        // Not promoted (yet): should the promotion complete later while
                        // another is elected, its timeline must stay out of the archive. A
                        // late promotion that is still wanted takes the lock, which allows
                        // archiving again (`accepting_writes`).
                        self.shared.set_standby_engine(self.mode == Mode::Replica);
                        return (Some(format!("promoting this pod: {e}")), false);
                    }
                }
                Step::Promoted => self.promoted().await,
                Step::Fence(why) => {
                    self.action.get_or_insert(Action::Fence(why));
                }
                Step::HandOver(target) => {
                    tracing::info!(%target, "status.targetPrimary names another pod");
                    self.action.get_or_insert(Action::Switchover(target));
                }
                Step::MoveAside => {
                    self.action.get_or_insert(Action::Reclone);
                }
                Step::CloneAfresh(why) => {
                    self.action.get_or_insert(Action::CloneAfresh(why));
                }
                Step::Announce => {
                    self.rejoin_deadline = None;
                    if let Some(how) = self.rejoining.take() {
                        tracing::info!(?how, "streaming from the primary again");
                        self.publish_rejoined(&how).await;
                    }
                }
                step => {
                    return (
                        Some(format!("internal: step {step:?} with the engine running")),
                        false,
                    );
                }
            }
        }
        (None, true)
    }

    /// In the background, after a promotion: the old timeline's segments the dead primary had
    /// not archived ([`crate::archive_gap`]); event `ArchiveGapFilled`, or a Warning
    /// `ArchiveGap` naming what could not be uploaded.
    fn fill_archive_gap(&self) {
        let shared = self.shared.clone();
        let engine = self.engine.clone();
        let recorder = self.recorder.clone();
        let reference = self.cluster_reference();
        let data_dir = self.config.data_dir.clone();
        let pod = self.config.pod_name.clone();
        tokio::spawn(async move {
            let segment_size = engine
                .wal_segment_size()
                .await
                .unwrap_or(crate::wal::DEFAULT_SEGMENT_SIZE);
            let filled = tokio::time::timeout(
                crate::archive_gap::FILL_TIMEOUT,
                crate::archive_gap::fill(&shared, &data_dir, segment_size),
            )
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "not done within {}s",
                    crate::archive_gap::FILL_TIMEOUT.as_secs()
                ))
            });
            // The new timeline's first segment holds the old one's tail: archived now.
            let tail = match &filled {
                Ok(Some(_)) => Some(crate::archive_gap::archive_promotion_segment(&engine).await),
                _ => None,
            };
            let event = |type_, reason: &str, note: String| ClusterEvent {
                type_,
                reason: reason.into(),
                note: Some(note),
                action: "ArchiveOldTimeline".into(),
                secondary: None,
            };
            let news = match filled {
                Ok(None) => None,
                Ok(Some(_)) if let Some(Err(why)) = &tail => Some(event(
                    EventType::Warning,
                    "ArchiveGap",
                    format!(
                        "{pod} could not archive the segment holding the old timeline's tail: {why}"
                    ),
                )),
                Ok(Some(filled)) if !filled.failed.is_empty() => Some(event(
                    EventType::Warning,
                    "ArchiveGap",
                    format!(
                        "{pod} could not archive segments of the old timeline that the archive lacks ({}); a restore past them stops there",
                        filled
                            .failed
                            .iter()
                            .map(|(name, why)| format!("{name}: {why}"))
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                )),
                Ok(Some(filled)) => Some(event(
                    EventType::Normal,
                    "ArchiveGapFilled",
                    format!(
                        "{pod} made the archive whole up to its promotion: {} segment(s) of the old timeline the old primary had not archived{}, and {} (the old timeline's tail on the new one); a restore to the end of the archive now has every commit made before the failover",
                        filled.uploaded.len(),
                        if filled.uploaded.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", filled.uploaded.join(", "))
                        },
                        tail.and_then(Result::ok).unwrap_or_default()
                    ),
                )),
                Err(why) => Some(event(
                    EventType::Warning,
                    "ArchiveGap",
                    format!(
                        "{pod} could not check the archive for the old timeline's segments: {why}"
                    ),
                )),
            };
            if let Some(event) = news {
                super::replica::publish(&recorder, &reference, &event).await;
            }
        });
    }

    /// Enters `role`, logging the change; the engine's mode follows the role once it runs.
    pub(super) fn set_role(&mut self, role: Role) {
        if self.role != role {
            tracing::info!(from = ?self.role, to = ?role, "role");
            self.role = role;
        }
    }

    /// The engine left recovery (a switchover or failover target): checkpoint in the
    /// background — best effort, nothing waits for it: the instance is the primary from the
    /// moment it accepts writes — and run as the primary.
    pub(super) async fn promoted(&mut self) {
        tracing::info!("promoted: running as the primary");
        if self.mariadb() {
            if let Err(e) = crate::mariadb::ops::promoted(&self.engine) {
                tracing::warn!("removing the replica marker after the promotion: {e}");
            }
            self.running_as_primary();
            return;
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
        if let Err(e) = self.engine.clear_standby_extras().await {
            tracing::warn!("removing the standby's slot name and restore_command: {e}");
        }
        self.fill_archive_gap();
        self.running_as_primary();
    }

    /// What a promotion resets, whatever the engine.
    fn running_as_primary(&mut self) {
        self.mode = Mode::Primary;
        self.switchover_problem = None;
        self.replica_problem = None;
        self.role_problem = None;
        self.primary_address = None;
        self.cascade = None;
        self.conninfo_applied = None;
        self.extras_applied = None;
        self.rejoin_deadline = None;
        self.failover_ack = None;
        self.sync_applied = None;
        self.wal_removed_since = None;
    }
}
