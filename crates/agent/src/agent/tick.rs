//! One probe of the running engine and everything that follows from it: the restore's
//! progress, backups, the role's next step, the primary's and the replica's upkeep.

use super::*;

impl Agent {
    /// Takes in the Secret's latest state, probes the engine and applies credentials.
    pub(super) async fn tick(&mut self, fresh: &mut bool, was_ready: &mut bool) {
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
        if self.cluster.is_some() && self.role == Role::Primary {
            // Before the probe (which may hang): a primary the cluster no longer names stops
            // on its word alone.
            self.drive_role_unprobed().await;
        }
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
                if self.cluster.is_some() {
                    // The role first: a primary the cluster no longer names stops before
                    // anything else runs on it.
                    probe = self.drive_role(probe).await;
                }
                if self.mariadb() {
                    self.mariadb_primary_upkeep(&mut probe).await;
                }
                if !self.tick_restore(&probe).await {
                    // Restoring: not ready, no credentials, no backups yet.
                    self.ready = false;
                    self.probe = Some(probe);
                    self.health.set_ready(false);
                    return;
                }
                self.tend_backup(&probe);
                self.tend_upgrade_followup(&probe);
                if self.mode == Mode::Replica && self.mariadb() {
                    self.tick_replica_mariadb(probe, resolve_problem).await;
                    self.health.set_ready(self.ready);
                    return;
                }
                if self.mode == Mode::Replica {
                    self.tick_replica(probe, resolve_problem).await;
                    self.health.set_ready(self.ready);
                    return;
                }
                let primary = probe.role == devctl_api::instance::ROLE_PRIMARY;
                if primary {
                    self.apply_credentials().await;
                }
                if primary && self.applied.is_some() {
                    self.apply_replication_role().await;
                    if !self.mariadb() {
                        self.apply_synchronous_standbys().await;
                    }
                }
                if self.cluster.is_some() && !self.mariadb() {
                    self.apply_slots(&probe, primary).await;
                }
                self.ready = if self.mariadb() {
                    // A MariaDB primary serves once writable with its users applied (read-only
                    // it is no replica: the restore's first ticks would otherwise count).
                    primary && self.applied.is_some()
                } else {
                    self.applied.is_some() || !primary
                };
                self.probe = Some(probe);
            }
            Err(e) => {
                self.ready = false;
                if self.cluster.is_some() {
                    self.drive_role_unprobed().await;
                }
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

    /// Primary: the app role and database in line with the credentials Secret.
    pub(super) async fn apply_credentials(&mut self) {
        let Some(desired) = self.desired.clone() else {
            return;
        };
        if self.applied.as_deref() == Some(desired.version.as_str()) {
            return;
        }
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

    /// A restore's progress on the running engine; `false` while it is not done.
    /// PostgreSQL: done once the engine has promoted (then the recovery settings are
    /// cleared, also leftovers of an agent that stopped in between). MySQL family: replays
    /// the dump (retried with backoff) before anything else touches the server.
    pub(super) async fn tick_restore(&mut self, probe: &Probe) -> bool {
        if self.config.engine == EngineKind::Postgres {
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
            let result = if self.mariadb() {
                // In the background: a long replay must not hold up the probe, the report
                // and the primary lock's renewal.
                match self.replay_task.take() {
                    Some(task) if task.is_finished() => task.await.unwrap_or_else(|e| {
                        Err(RestoreError::Failed(format!("the replay task ended: {e}")))
                    }),
                    Some(task) => {
                        self.replay_task = Some(task);
                        self.restore_problem =
                            Some("restoring a backup: replaying the archived binary logs".into());
                        return false;
                    }
                    None => {
                        self.replay_task = Some(tokio::spawn(async move {
                            crate::mariadb::backup::replay(&shared).await
                        }));
                        return false;
                    }
                }
            } else {
                restore_mysql(&shared).await
            };
            match result {
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
    pub(super) fn tend_backup(&mut self, probe: &Probe) {
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
}
