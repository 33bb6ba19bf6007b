//! MariaDB's side of the shell (docs/mariadb.md): the primary made writable once it holds
//! the lock, its clone endpoint and semi-synchronous acknowledgements; a replica pointed at
//! the primary by GTID, stopped for a failover's election, and a returning former primary
//! checked for errant transactions before it replicates.

use super::bootstrap::CloneStep;
use super::*;
use crate::mariadb::{self as maria, Marker, ops};

impl Agent {
    pub(super) fn mariadb(&self) -> bool {
        self.config.engine == EngineKind::Mariadb
    }

    /// A MariaDB primary: where its agent serves clones.
    pub(super) fn clone_address(&self) -> Option<String> {
        (self.mariadb() && self.mode == Mode::Primary && self.role == Role::Primary).then(|| {
            let host = &self.config.pod_ip;
            if host.contains(':') {
                format!("[{host}]:{}", self.config.health_port)
            } else {
                format!("{host}:{}", self.config.health_port)
            }
        })
    }

    /// A MariaDB primary that was promoted: the position it was promoted at.
    pub(super) fn promotion_position(&self) -> Option<String> {
        (self.mariadb() && self.mode == Mode::Primary)
            .then(|| ops::promoted_at(&self.engine))
            .flatten()
    }

    /// A MariaDB primary holding the lock (role `Primary`), in this order: the app and
    /// replication users applied (the agent writes while the engine is read-only to everyone
    /// else, and before semi-synchronous acknowledgements: no replica has cloned them yet),
    /// semi-synchronous replication as the spec says (from the probe: a restarted engine
    /// has it off), then writable. Also serves clones. `probe` is brought up to date.
    pub(super) async fn mariadb_primary_upkeep(&mut self, probe: &mut Probe) {
        let primary = self.mode == Mode::Primary && self.role == Role::Primary;
        if let Some(source) = &self.clone_source {
            source.set_serving(primary);
            if let Some(replication) = &self.replication_desired {
                source.set_auth(&replication.username, replication.password.expose());
            }
        }
        if !primary {
            return;
        }
        self.tend_binlog_archive();
        if self.mysql_restore_pending {
            // Read-only to all but the agent until the restore's binary logs are replayed.
            return;
        }
        self.apply_credentials().await;
        if self.applied.is_some() {
            self.apply_replication_role().await;
        }
        let Some(mut found) = probe.mariadb.clone() else {
            return;
        };
        let synchronous = self.view().synchronous.is_some();
        if found.semi_sync_enabled != synchronous {
            match ops::set_semi_sync(&self.engine, synchronous).await {
                Ok(()) => {
                    tracing::info!(
                        rpl_semi_sync_master_enabled = synchronous,
                        "semi-synchronous replication set"
                    );
                    found.semi_sync_enabled = synchronous;
                    // Active from the first acknowledged transaction on.
                    found.semi_sync_active = synchronous;
                    self.replication_apply_error = None;
                }
                Err(e) => {
                    let message = format!("setting rpl_semi_sync_master_enabled: {e}");
                    tracing::error!("{message}");
                    self.replication_apply_error = Some(message);
                    // Never writable without the acknowledgements the spec asks for.
                    return;
                }
            }
        }
        if found.read_only {
            match ops::make_writable(&self.engine).await {
                Ok(()) => {
                    tracing::info!("the primary holds the lock: read_only = OFF");
                    found.read_only = false;
                }
                Err(e) => {
                    self.apply_error = Some(format!("making the primary writable: {e}"));
                }
            }
        }
        *probe = found.to_probe(probe.system_identifier.clone());
    }

    /// Why this instance's position must not count in a failover's election (MariaDB): its
    /// data does not follow the primary yet.
    pub(super) fn not_a_candidate(&self) -> Option<String> {
        if !self.mariadb() {
            return None;
        }
        match maria::read_marker(self.engine.data_dir()) {
            Some(Marker::Replica) | None => None,
            Some(Marker::Rejoin) => {
                Some("a former primary's data, not yet checked for errant transactions".into())
            }
            Some(Marker::Cloned(_)) => Some("a clone that has not replicated yet".into()),
        }
    }

    /// Primary: one round of binary log archiving at a time, in the background
    /// ([`crate::mariadb::archive`]); none while a backup destination is not set.
    fn tend_binlog_archive(&mut self) {
        if self.archive_task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        if !matches!(self.pod_view.borrow().destination(), Ok(Some(_))) {
            self.shared.clear_archive();
            return;
        }
        let timeout = Duration::from_secs(u64::from(
            self.hooks
                .archive_timeout()
                .unwrap_or(crate::engine::ARCHIVE_TIMEOUT_SECONDS),
        ));
        let (shared, archiver) = (self.shared.clone(), self.binlog_archiver.clone());
        self.archive_task = Some(tokio::spawn(async move {
            let mut state = archiver.lock().await;
            crate::mariadb::archive::archive_round(&shared, &mut state, timeout).await;
        }));
    }

    /// A MariaDB replica's probe: replication pointed at the primary (a former primary only
    /// without errant transactions), stopped during a failover; ready only while both
    /// replication threads run.
    pub(super) async fn tick_replica_mariadb(
        &mut self,
        probe: Probe,
        resolve_problem: Option<String>,
    ) {
        let failing_over = self.view().failed_primary.is_some();
        let replication = probe.mariadb.as_ref().and_then(|m| m.replication.clone());
        let mut problem = None;
        // Each instance keeps its own users in line (outside the binary log) — not during a
        // failover, which must not wait for it.
        if !failing_over {
            self.apply_credentials().await;
            if self.applied.is_some() {
                self.apply_replication_role().await;
            }
        }
        if failing_over || self.hooks.wal_receiver_stopped() {
            problem = self.stop_receiving(replication.as_ref()).await.err();
        } else if let Some(address) = self.known_primary_address() {
            // The Secret's version too: a new password is a new CHANGE MASTER.
            let key = format!(
                "{address}#{}",
                self.replication_desired
                    .as_ref()
                    .map(|r| r.version.as_str())
                    .unwrap_or_default()
            );
            // Stopped without an error (a failover that went elsewhere, a restart): again.
            let idle = replication
                .as_ref()
                .is_none_or(|r| r.io_running == "No" && r.last_io_errno == 0);
            if self.conninfo_applied.as_deref() != Some(key.as_str()) || idle {
                match self.follow(&address).await {
                    Ok(true) => self.conninfo_applied = Some(key),
                    Ok(false) => {}
                    Err(e) => problem = Some(e),
                }
            }
        }
        if probe.is_streaming()
            && !failing_over
            && maria::read_marker(self.engine.data_dir()).is_some_and(|m| m != Marker::Replica)
        {
            // It follows the primary: its own replication position is the one to keep from
            // now on (and it counts in an election).
            if let Err(e) = ops::set_marker(&self.engine, &Marker::Replica) {
                problem = Some(e);
            }
        }
        if let Some(replication) = &replication
            && self.action.is_none()
            && !failing_over
        {
            self.judge_io_error(replication).await;
        }
        self.ready = probe.is_streaming();
        self.replica_problem = if self.ready {
            None
        } else if failing_over {
            Some(format!(
                "failover (epoch {}): replication stopped at {}",
                self.view().failover_epoch,
                probe.gtid_position.as_deref().unwrap_or("no transaction")
            ))
        } else {
            Some(not_replicating(
                self.known_primary_address(),
                replication.as_ref(),
                resolve_problem,
            ))
        }
        .or(problem);
        self.probe = Some(probe);
    }

    /// A failover: the IO thread stopped so the position becomes final, and the SQL thread
    /// running until the relay log is applied (an engine restarted meanwhile starts neither).
    async fn stop_receiving(
        &mut self,
        replication: Option<&maria::Replication>,
    ) -> Result<(), String> {
        if self.conninfo_applied.as_deref() != Some("") {
            ops::stop_receiving(&self.engine)
                .await
                .map_err(|e| format!("stopping the replication IO thread: {e}"))?;
            tracing::info!("failover: replication IO thread stopped");
            self.conninfo_applied = Some(String::new());
        }
        if let Some(replication) = replication
            && !replication.sql_running
            && !replication.relay_applied
        {
            ops::start_applying(&self.engine)
                .await
                .map_err(|e| format!("applying the relay log: {e}"))?;
            tracing::info!("failover: applying the rest of the relay log");
        }
        Ok(())
    }

    /// Points replication at `address`: a fresh clone from its copy's position, a former
    /// primary once it has no errant transactions, any other replica from its own position.
    /// `Ok(false)`: not pointed (errant transactions found: the data goes aside).
    async fn follow(&mut self, address: &PrimaryAddress) -> Result<bool, String> {
        let Some(replication) = self.replication_desired.clone() else {
            return Err(self
                .replication_problem
                .clone()
                .unwrap_or_else(|| "waiting for the replication Secret".into()));
        };
        let marker = maria::read_marker(self.engine.data_dir()).unwrap_or(Marker::Replica);
        let mut start = None;
        match &marker {
            Marker::Rejoin => match self.errant_transactions(address).await? {
                Some(errant) => {
                    self.errant_found(errant).await;
                    return Ok(false);
                }
                None => ops::slave_pos_from_binlog(&self.engine).await?,
            },
            // Only while it has not replicated past its copy's position (an agent that
            // stopped after START SLAVE must not send it back).
            Marker::Cloned(position) => {
                let applied: devctl_api::gtid::Position =
                    ops::slave_position(&self.engine).await?.parse()?;
                if !applied.contains(&position.parse()?) {
                    start = Some(position.clone());
                }
            }
            Marker::Replica => {}
        }
        ops::replicate(
            &self.engine,
            &address.host,
            address.port,
            &replication.username,
            replication.password.expose(),
            start.as_deref(),
        )
        .await?;
        tracing::info!(%address, ?marker, "replicating from the primary (GTID)");
        Ok(true)
    }

    /// A returning former primary: its transactions the new primary never logged, if any —
    /// exactly, from both binary log states ([`maria::errant_by_state`]); by the primary's
    /// promotion position when its binary log does not reach back to this server.
    async fn errant_transactions(
        &mut self,
        address: &PrimaryAddress,
    ) -> Result<Option<String>, String> {
        let primary = self
            .view()
            .current_primary
            .ok_or("waiting for status.currentPrimary")?;
        let (_, report) = resolve_primary_report(&self.pods, &self.config, &primary).await?;
        self.primary_promotion_position = report.promotion_position.clone();
        let replication = self
            .replication_desired
            .clone()
            .ok_or("waiting for the replication Secret")?;
        let theirs = ops::primary_binlog_state(
            &self.engine,
            &address.host,
            address.port,
            &replication.username,
            replication.password.expose(),
        )
        .await?;
        let own = ops::binlog_state(&self.engine).await?;
        let me = maria::server_id(&self.config.pod_name);
        if let Some(errant) = maria::errant_by_state(&own, me, &theirs)? {
            self.errant_from = errant.as_ref().and_then(|_| {
                maria::binlog_state(&theirs)
                    .ok()?
                    .into_iter()
                    .find(|g| g.server == me)
                    .map(|g| g.to_string())
            });
            return Ok(errant);
        }
        let position = ops::binlog_position(&self.engine).await?;
        let errant = match &report.promotion_position {
            Some(fork) => maria::errant(&position, fork)?,
            None => None,
        };
        self.errant_from = errant.as_ref().and(report.promotion_position);
        Ok(errant)
    }

    /// Errant transactions found (`errant`: the GTID range): dumped for the administrator
    /// into the data directory, which is then moved aside and the primary cloned anew.
    async fn errant_found(&mut self, errant: String) {
        tracing::error!(%errant, "errant transactions: this former primary has GTIDs the new primary lacks; re-cloning");
        let dump = self.engine.data_dir().join(maria::ERRANT_DUMP);
        if let Some(from) = self.errant_from.take()
            && let Err(e) = ops::dump_errant(&self.engine, &from, &dump).await
        {
            tracing::warn!(
                "dumping the errant transactions: {e} (the moved-aside copy keeps its binary logs)"
            );
        }
        self.errant = Some(errant);
        self.action.get_or_insert(Action::Reclone);
    }

    /// A replication error only a new clone mends: transactions the primary lacks (errant:
    /// the data goes aside, kept) or binary logs it no longer has (a replica's data is
    /// removed, a former primary's moved aside). Other errors are only reported.
    async fn judge_io_error(&mut self, replication: &maria::Replication) {
        if maria::diverged(replication) {
            let own = ops::binlog_position(&self.engine).await.unwrap_or_default();
            let errant = self
                .primary_promotion_position
                .as_deref()
                .and_then(|fork| maria::errant(&own, fork).ok().flatten())
                .unwrap_or_else(|| {
                    format!("transactions up to {own} not in the primary's binary log")
                });
            self.errant_from = self.primary_promotion_position.clone();
            self.errant_found(errant).await;
        } else if maria::binlog_gone(replication) {
            let why = format!(
                "the primary no longer has the binary logs this replica needs ({})",
                one_line(&replication.last_io_error)
            );
            let action = if self.role == Role::Replica {
                Action::CloneAfresh(why)
            } else {
                Action::Reclone
            };
            self.action.get_or_insert(action);
        }
    }

    /// MariaDB, engine stopped: a former primary's data is started as a replica, checked for
    /// errant transactions once it runs ([`Self::tick_replica_mariadb`]).
    pub(super) fn prepare_rejoin_mariadb(&mut self, primary: &str) -> Result<(), String> {
        ops::set_marker(&self.engine, &Marker::Rejoin)?;
        ops::clear_handover(&self.engine);
        self.rejoining = Some(Rejoin::Followed);
        tracing::info!(%primary, "this instance holds a former primary's data: rejoining as a replica of the new primary");
        self.conninfo_applied = None;
        self.final_lsn = None;
        self.rejoin_deadline = Some(Instant::now() + REJOIN_TIMEOUT);
        Ok(())
    }

    /// MariaDB, engine stopped: the final position a switchover recorded, for the role
    /// machine (PostgreSQL reads its control file).
    pub(super) fn mariadb_clean_stop(&self) -> Option<Result<String, String>> {
        ops::handed_over_at(&self.engine).map(Ok)
    }

    /// MariaDB: one attempt to clone `primary` through its agent's clone endpoint.
    pub(super) async fn try_clone_mariadb(&mut self, primary: &str) -> Result<CloneStep> {
        let Some(replication) = self.replication_desired.clone() else {
            return Ok(CloneStep::Wait(
                self.replication_problem
                    .clone()
                    .or_else(|| self.replication_invalid.clone())
                    .unwrap_or_else(|| "waiting for the replication Secret".into()),
            ));
        };
        let (address, report) =
            match resolve_primary_report(&self.pods, &self.config, primary).await {
                Ok(found) => found,
                Err(why) => return Ok(CloneStep::Wait(why)),
            };
        let Some(source) = report.clone_address.as_deref().and_then(parse_address) else {
            return Ok(CloneStep::Wait(format!(
                "waiting for the primary {primary} to report where it serves clones"
            )));
        };
        let message = format!("cloning the primary {primary} (mariadb-backup from {source})");
        tracing::info!("{message}");
        self.role_problem = Some(message);
        if let Some(Outcome::Stale(why)) = self.report().await? {
            return Ok(CloneStep::Stale(why));
        }
        let source = source.to_string();
        let result = tokio::select! {
            result = maria::clone::clone_from(
                &self.engine,
                &source,
                &replication.username,
                replication.password.expose(),
            ) => result,
            _ = self.sigterm.recv() => return Ok(CloneStep::Stopped),
            _ = self.sigint.recv() => return Ok(CloneStep::Stopped),
        };
        match result {
            Ok(position) => {
                tracing::info!(%primary, %position, "cloned the primary");
                // Its backups and archive are the cluster's: the primary's identifier.
                if let Some(id) = report.system_identifier.as_deref() {
                    crate::mariadb::ops::adopt_system_identifier(&self.engine, id)
                        .map_err(Error::DataDir)?;
                    self.shared.set_system_identifier(id);
                }
                self.primary_address = Some(address);
                self.conninfo_applied = None;
                Ok(CloneStep::Cloned)
            }
            Err(e) => {
                tracing::error!("{e}");
                Ok(CloneStep::Failed(e))
            }
        }
    }

    /// After an errant former primary's data was moved aside: the Warning event naming what
    /// was discarded and where it is kept.
    pub(super) async fn publish_errant(&mut self) {
        let Some(errant) = self.errant.take() else {
            return;
        };
        let kept = self
            .moved_aside_copy()
            .map(|aside| format!("{aside}/{} and its binary logs", maria::ERRANT_DUMP))
            .unwrap_or_else(|| "nowhere (the copy could not be kept)".into());
        let pod = &self.config.pod_name;
        let primary = self.view().current_primary.unwrap_or_default();
        let event = ClusterEvent {
            type_: EventType::Warning,
            reason: "ErrantTransactions".into(),
            note: Some(format!(
                "{pod} returned with transactions the primary {primary} never had ({errant}): they were discarded from the cluster and {pod} is cloned again; kept in {kept}"
            )),
            action: format!("Reclone {pod}"),
            secondary: None,
        };
        super::replica::publish(&self.recorder, &self.cluster_reference(), &event).await;
    }
}

/// Why a MariaDB replica does not replicate (one line).
fn not_replicating(
    primary: Option<PrimaryAddress>,
    replication: Option<&maria::Replication>,
    resolve_problem: Option<String>,
) -> String {
    let from = primary.map(|a| format!(" at {a}")).unwrap_or_default();
    let threads = replication.map_or_else(
        || "not configured".to_string(),
        |r| {
            let error = [&r.last_io_error, &r.last_sql_error]
                .into_iter()
                .find(|e| !e.is_empty())
                .map(|e| format!(": {}", one_line(e)))
                .unwrap_or_default();
            format!(
                "IO {}, SQL {}{error}",
                r.io_running,
                if r.sql_running { "Yes" } else { "No" }
            )
        },
    );
    let mut message = format!("not replicating from the primary{from} ({threads})");
    if let Some(why) = resolve_problem {
        message = format!("{message}; {why}");
    }
    message
}
