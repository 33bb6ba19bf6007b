//! Before the engine runs: waiting for the cluster's word, then initdb, a restore, a clone or a
//! rewind, as the role state machine ([`super::role`]) decides.

use super::*;
use role::Step;

/// Where carrying out a transition's steps before the engine runs ended.
pub(super) enum StartStep {
    /// The engine is to start (`true`: on data just initialised).
    Started(bool),
    /// SIGTERM/SIGINT or a replaced pod.
    Ended(Outcome),
    /// Look again at once (a restore completed; nothing left to do).
    Again,
    /// Report this and look again later.
    Wait(String),
}

/// What one clone attempt came to.
pub(super) enum CloneStep {
    Cloned,
    Stopped,
    /// The pod was replaced.
    Stale(String),
    /// Waiting for something (the replication Secret, the primary's report).
    Wait(String),
    /// `pg_basebackup` failed (retried with backoff).
    Failed(String),
}

impl Agent {
    /// MySQL family (one instance, no cluster watch): an empty data directory is bootstrapped
    /// only for a cluster that has never been ready; for one that has, the data is gone and a
    /// new empty database must not take its place — reported until the agent is stopped.
    /// A cluster the agent may not read is bootstrapped as before (the Role grants the read).
    pub(super) async fn refuse_an_empty_volume(&mut self) -> Result<Result<(), Outcome>> {
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

    /// PostgreSQL, no engine running: the role state machine ([`role::transition`]) decides
    /// from the cluster's status and the data directory — wait, initdb, restore, clone,
    /// rewind — and this carries its steps out until one starts the engine (retrying a failed
    /// clone or restore with backoff). Returns whether the data was just initialised.
    pub(super) async fn prepare_postgres(&mut self) -> Result<Result<bool, Outcome>> {
        let cluster_name = self.config.cluster.clone();
        let mut backoff = Duration::from_secs(1);
        if self.binaries_major.is_none()
            && let Some(bin) = self.engine.postgres_bin_dir()
        {
            match crate::major_upgrade::binaries_major(bin).await {
                Ok(major) => self.binaries_major = Some(major),
                Err(e) => tracing::warn!("the binaries' major: {e}"),
            }
        }
        loop {
            self.refresh_replication_secret()?;
            let view = match &mut self.cluster {
                Some(rx) => rx.borrow_and_update().clone(),
                None => return Ok(Ok(false)),
            };
            let mut retry_in = WAIT_INTERVAL;
            let problem = if let Some((message, forbidden)) = view.error.clone() {
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
                let observation = self.observe_stopped(&view).await;
                let next = role::transition(&self.role, &observation, &cluster_name);
                // A switchover's clean stop, as the observation read it from the control file.
                let clean_stop = match &observation.data {
                    role::DataState::Primary {
                        clean_stop: Some(Ok(checkpoint)),
                    } => Some(checkpoint.clone()),
                    _ => None,
                };
                match self
                    .start_steps(next, clean_stop, &mut backoff, &mut retry_in)
                    .await?
                {
                    StartStep::Started(fresh) => return Ok(Ok(fresh)),
                    StartStep::Ended(outcome) => return Ok(Err(outcome)),
                    StartStep::Again => continue,
                    StartStep::Wait(problem) => Some(problem),
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

    /// What the role state machine needs before the engine runs: the cluster's status and
    /// the data directory (its control file only when a switchover away from it is pending).
    async fn observe_stopped(&self, view: &ClusterView) -> role::Observation {
        let me = self.config.pod_name.as_str();
        let older = match (
            crate::major_upgrade::data_major(self.engine.data_dir()),
            self.binaries_major,
        ) {
            (Some(data), Some(binaries)) if data < binaries => Some((data, binaries)),
            _ => None,
        };
        let data = if !self.engine.is_bootstrapped() {
            role::DataState::Empty
        } else if let Some((data, binaries)) = older {
            role::DataState::OlderMajor { data, binaries }
        } else if self.engine.is_standby() {
            role::DataState::Standby
        } else {
            let handing_over = view.current_primary.as_deref() == Some(me)
                && view.target_primary.as_deref().is_some_and(|t| t != me);
            let clean_stop = if handing_over && self.mariadb() {
                self.mariadb_clean_stop()
            } else if handing_over {
                match self.engine.control_data().await {
                    Ok(control) if control.is_clean_primary_shutdown() => {
                        Some(Ok(control.checkpoint))
                    }
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                }
            } else {
                None
            };
            role::DataState::Primary { clean_stop }
        };
        role::Observation {
            engine: role::EngineState::Stopped,
            data,
            ..self.observe(view)
        }
    }

    /// Carries out a transition's steps before the engine runs, in order; the first that
    /// cannot complete says why (and the role stays).
    async fn start_steps(
        &mut self,
        next: role::Transition,
        clean_stop: Option<String>,
        backoff: &mut Duration,
        retry_in: &mut Duration,
    ) -> Result<StartStep> {
        let mut fresh = false;
        for step in next.steps {
            match step {
                Step::Wait(why) => {
                    if let Role::HandingOver { target } = &next.role
                        && let Some(checkpoint) = &clean_stop
                    {
                        if self.final_lsn.as_ref() != Some(checkpoint) {
                            tracing::info!(
                                final_lsn = %checkpoint,
                                %target,
                                "stopped for a switchover: not restarting as the primary"
                            );
                        }
                        self.final_lsn = Some(checkpoint.clone());
                    }
                    if matches!(next.role, Role::Fenced | Role::HandingOver { .. }) {
                        self.mode = Mode::Primary;
                        self.ready = false;
                    }
                    self.set_role(next.role);
                    return Ok(StartStep::Wait(why));
                }
                Step::TakeLock => {
                    if let Err(why) = self.gate_primary().await {
                        self.ready = false;
                        return Ok(StartStep::Wait(why));
                    }
                }
                Step::Bootstrap => {
                    tracing::info!("this pod is status.currentPrimary: bootstrapping");
                    self.engine.bootstrap().await?;
                    fresh = true;
                }
                Step::Restore => match self.restore().await? {
                    Ok(Ok(())) => {
                        *backoff = Duration::from_secs(1);
                        return Ok(StartStep::Again);
                    }
                    Ok(Err(RestoreError::Wait(why))) => return Ok(StartStep::Wait(why)),
                    Ok(Err(RestoreError::Failed(why))) => {
                        *retry_in = *backoff;
                        *backoff = (*backoff * 2).min(MAX_BACKOFF);
                        return Ok(StartStep::Wait(format!(
                            "restoring: {why}; retrying in {}s",
                            retry_in.as_secs()
                        )));
                    }
                    Err(outcome) => return Ok(StartStep::Ended(outcome)),
                },
                Step::Clone(primary) => match self.try_clone(&primary).await? {
                    CloneStep::Cloned => {}
                    CloneStep::Stopped => return Ok(StartStep::Ended(Outcome::Stopped)),
                    CloneStep::Stale(why) => return Ok(StartStep::Ended(Outcome::Stale(why))),
                    CloneStep::Wait(why) => return Ok(StartStep::Wait(why)),
                    CloneStep::Failed(why) => {
                        *retry_in = *backoff;
                        *backoff = (*backoff * 2).min(MAX_BACKOFF);
                        return Ok(StartStep::Wait(format!(
                            "{why}; retrying in {}s",
                            retry_in.as_secs()
                        )));
                    }
                },
                Step::Rewind(primary) if self.mariadb() => {
                    if let Err(why) = self.prepare_rejoin_mariadb(&primary) {
                        return Ok(StartStep::Wait(why));
                    }
                }
                Step::Rewind(primary) => {
                    if let Err(why) = self.prepare_rejoin(&primary).await {
                        if matches!(self.rejoining, Some(Rejoin::Recloned(_))) {
                            // Moved aside: the next look clones.
                            self.set_role(Role::Recloning);
                        }
                        return Ok(StartStep::Wait(why));
                    }
                }
                Step::EmptyOlderMajor => {
                    tracing::info!(
                        "a major upgrade: emptying this replica's data of the older major to clone the primary again"
                    );
                    self.remove_data()?;
                }
                Step::StartPrimary => {
                    if self.role != Role::Primary {
                        tracing::info!(role = ?next.role, "starting the engine as the primary");
                    }
                    self.mode = Mode::Primary;
                    self.role_problem = None;
                    self.final_lsn = None;
                    self.set_role(next.role);
                    return Ok(StartStep::Started(fresh));
                }
                Step::StartReplica => {
                    if self.engine.is_standby() && !matches!(next.role, Role::Rejoining) {
                        tracing::info!("resuming as a replica on the existing data");
                    }
                    self.mode = Mode::Replica;
                    self.role_problem = None;
                    self.set_role(next.role);
                    return Ok(StartStep::Started(false));
                }
                step => {
                    // Steps of a running engine never follow from a stopped one.
                    return Ok(StartStep::Wait(format!(
                        "internal: step {step:?} with the engine stopped"
                    )));
                }
            }
        }
        self.set_role(next.role);
        Ok(StartStep::Again)
    }

    /// PostgreSQL, `DEVCTL_BOOTSTRAP=recovery`, empty data directory: restores the base
    /// backup the annotation names (`recovery.signal`, `restore_command`, the target); the
    /// engine then replays the archive and promotes. `Err` on SIGTERM/SIGINT or a replaced
    /// pod.
    pub(super) async fn restore(&mut self) -> Result<Result<Result<(), RestoreError>, Outcome>> {
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
        let mariadb = self.mariadb();
        let result = tokio::select! {
            result = async {
                if mariadb {
                    crate::mariadb::backup::restore(&shared).await
                } else {
                    restore_postgres(&shared).await
                }
            } => result,
            _ = self.sigterm.recv() => return Ok(Err(Outcome::Stopped)),
            _ = self.sigint.recv() => return Ok(Err(Outcome::Stopped)),
        };
        match &result {
            Ok(message) => {
                tracing::info!("{message}");
                // MariaDB: the binary logs are replayed once the engine runs.
                if mariadb {
                    self.mysql_restore_pending = true;
                } else {
                    self.recovering = true;
                }
                self.role_problem = None;
            }
            Err(RestoreError::Failed(why)) => tracing::error!("restoring: {why}"),
            Err(RestoreError::Wait(_)) => {}
        }
        Ok(Ok(result.map(|_| ())))
    }

    /// A former primary's data, `primary` now current: once `primary` reports ready as the
    /// primary, rejoin as its standby (`standby.signal`, `primary_conninfo`,
    /// `recovery_target_timeline = 'latest'` are written before the start). Returns why not
    /// yet.
    pub(super) async fn prepare_rejoin(&mut self, primary: &str) -> Result<(), String> {
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
            && rewind_waits_for_checkpoint(own, theirs, self.forked_on_its_own)
            && waiting_since.elapsed() < REJOIN_TIMELINE_WAIT
        {
            return Err(format!(
                "this instance holds a former primary's data (timeline {own}); waiting for the new primary {primary} to checkpoint its new timeline (it reports {})",
                theirs.map_or_else(|| "none".to_string(), |t| t.to_string())
            ));
        }
        self.rejoin_timeline_wait = None;
        let forked_on_its_own = std::mem::take(&mut self.forked_on_its_own);
        if forked_on_its_own && own.is_some() && own == theirs {
            // Its timeline was never archived, so a promotion since may have taken the same
            // number for another history: pg_rewind would take the two for one ("no rewind
            // required") and the standby would replay the primary's WAL onto other data.
            self.move_data_aside().map_err(|e| e.one_line())?;
            return Err(format!(
                "this instance's engine left recovery on its own on timeline {} and the primary {primary} now runs a timeline of that number: moved the data aside to clone the primary",
                own.unwrap_or_default()
            ));
        }
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
        self.cascade = None;
        self.final_lsn = None;
        self.rejoin_deadline = Some(Instant::now() + REJOIN_TIMEOUT);
        Ok(())
    }

    /// Moves the data directory aside (`<data>.old-<unix time>`, kept for the
    /// administrator) and recreates it empty, so the next preparation clones the primary.
    pub(super) fn move_data_aside(&mut self) -> Result<()> {
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
        // One copy per instance: the newest (an older one would hold only older commits,
        // and every copy could fill the volume).
        if let Some(parent) = data.parent()
            && let Ok(entries) = std::fs::read_dir(parent)
        {
            let names: Vec<String> = entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
            let keep = aside
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            for old in older_copies(&names, &name, &keep) {
                let path = parent.join(&old);
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => {
                        tracing::warn!(removed = %path.display(), "removed an older moved-aside copy")
                    }
                    Err(e) => tracing::warn!("removing the older copy {}: {e}", path.display()),
                }
            }
        }
        self.rejoin_deadline = None;
        self.rejoining = Some(Rejoin::Recloned(aside.display().to_string()));
        prepare_dir(&data, "data directory", env::DATA_DIR, DirOwner::Agent)
    }

    /// The moved-aside copy of the data directory on the volume, if any (read each report:
    /// an administrator who deletes it clears the message).
    pub(super) fn moved_aside_copy(&self) -> Option<String> {
        let data = &self.config.data_dir;
        let name = data.file_name()?.to_string_lossy().into_owned();
        let parent = data.parent()?;
        let names: Vec<String> = std::fs::read_dir(parent)
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        newest_copy(&names, &name).map(|copy| parent.join(copy).display().to_string())
    }

    /// A replica's data, removed for a fresh clone: the primary has all of it, and a copy
    /// kept aside could fill the volume.
    pub(super) fn remove_data(&mut self) -> Result<()> {
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
    pub(super) async fn try_clone(&mut self, primary: &str) -> Result<CloneStep> {
        let Some(secret) = self.config.replication_secret.clone() else {
            return Err(Error::Usage(format!(
                "missing environment variable {} (a replica needs the replication Secret)",
                extra_env::REPLICATION_SECRET
            )));
        };
        if self.mariadb() {
            return self.try_clone_mariadb(primary).await;
        }
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
}

/// The newest moved-aside copy of the data directory `name` among `names` (pure).
pub(super) fn newest_copy(names: &[String], name: &str) -> Option<String> {
    let prefix = format!("{name}.old-");
    names
        .iter()
        .filter_map(|n| {
            let stamp = n.strip_prefix(&prefix)?;
            let stamp: u64 = stamp
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| stamp.parse().ok())??;
            Some((stamp, n))
        })
        .max()
        .map(|(_, n)| n.clone())
}

/// The moved-aside copies of the data directory `name` (`<name>.old-<unix time>`) among
/// `names`, other than `keep` (pure).
pub(super) fn older_copies(names: &[String], name: &str, keep: &str) -> Vec<String> {
    let prefix = format!("{name}.old-");
    names
        .iter()
        .filter(|n| {
            n.as_str() != keep
                && n.strip_prefix(&prefix).is_some_and(|stamp| {
                    !stamp.is_empty() && stamp.bytes().all(|b| b.is_ascii_digit())
                })
        })
        .cloned()
        .collect()
}

/// Whether a former primary on timeline `own` must wait before rewinding from a primary
/// that reports timeline `theirs` (its control file's): while that is not past its own, or
/// unknown. pg_rewind before PostgreSQL 16 reads the source's timeline from its control
/// file, which names a new timeline only after the promotion's checkpoint (a replica's
/// only after its next restartpoint): rewinding earlier finds "no rewind required" or
/// records a timeline the standby then cannot reach. One exception: an engine that left
/// recovery on its own (`forked_on_its_own`, promoted behind its agent's back) forked off
/// the primary's timeline and never archived its own: a primary on an older timeline has
/// nothing left to checkpoint, and one on the same number runs another history (the
/// instance is then cloned afresh, see `prepare_rejoin`).
fn rewind_waits_for_checkpoint(own: i64, theirs: Option<i64>, forked_on_its_own: bool) -> bool {
    match theirs {
        None => true,
        Some(_) if forked_on_its_own => false,
        Some(theirs) => theirs <= own,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_rewind_waits_until_the_primary_checkpointed_a_newer_timeline() {
        use super::rewind_waits_for_checkpoint as waits;
        // After a failover: the new primary has not checkpointed its new timeline yet (it
        // may even report an older one: a replica's control file lags until a restartpoint).
        assert!(waits(3, Some(3), false));
        assert!(waits(3, Some(2), false));
        assert!(waits(3, None, false));
        // Checkpointed: the new timeline is in its control file.
        assert!(!waits(3, Some(4), false));
        // This instance's engine left recovery on its own: its timeline forked off the
        // primary's, which has nothing left to checkpoint.
        assert!(!waits(2, Some(1), true));
        assert!(!waits(2, Some(2), true));
        assert!(!waits(2, Some(3), true));
        assert!(waits(2, None, true));
    }

    use super::*;

    #[test]
    fn one_moved_aside_copy_is_kept() {
        let names: Vec<String> = [
            "data",
            "data.old-100",
            "data.old-200",
            "data.old-x",
            "other.old-1",
            "data.clone",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            older_copies(&names, "data", "data.old-200"),
            ["data.old-100"]
        );
        assert_eq!(newest_copy(&names, "data").as_deref(), Some("data.old-200"));
    }
}
