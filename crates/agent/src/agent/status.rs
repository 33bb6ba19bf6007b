//! The instance's report on its pod (`db.devctl.io/status`).

use super::*;

impl Agent {
    pub(super) fn status(&self) -> InstanceStatus {
        let probe = self.probe.clone().unwrap_or_default();
        let stopped_for_switchover = self.final_lsn.is_some();
        let writable = probe.role == devctl_api::instance::ROLE_PRIMARY;
        InstanceStatus {
            role: if stopped_for_switchover {
                Some(devctl_api::instance::ROLE_PRIMARY.to_string())
            } else {
                (!probe.role.is_empty()).then_some(probe.role)
            },
            ready: self.ready && !stopped_for_switchover,
            system_identifier: probe.system_identifier,
            timeline: match (self.mode, probe.timeline, self.stream_timeline) {
                (Mode::Replica, Some(probed), Some(streamed)) => Some(probed.max(streamed)),
                (_, probed, _) => probed,
            },
            received_lsn: probe.received_lsn,
            replayed_lsn: probe.replayed_lsn,
            lag_bytes: probe.lag_bytes,
            gtid_position: probe.gtid_position,
            lag_seconds: probe.lag_seconds,
            clone_address: self.clone_address(),
            promotion_position: self.promotion_position(),
            // Asked for but switched off (a restarted engine, before the agent switches it
            // on again): not in force.
            semi_sync_active: probe.semi_sync_active.or((self.mariadb()
                && writable
                && self.view().synchronous.is_some())
            .then_some(false)),
            engine_version: probe.engine_version,
            address: Some(self.config.address()),
            heartbeat: None,
            // The engine being down outranks everything else: an older complaint (an
            // invalid Secret not yet corrected) would otherwise hide the crash.
            last_error: self
                .shared
                .restore_hole()
                .or_else(|| self.engine_error.clone())
                .or_else(|| self.secret_problem.clone())
                .or_else(|| self.invalid_error.clone())
                .or_else(|| self.role_problem.clone())
                .or_else(|| self.restore_problem.clone())
                .or_else(|| self.apply_error.clone())
                .or_else(|| self.switchover_problem.clone())
                .or_else(|| self.replica_problem.clone())
                .or_else(|| self.replication_problem.clone())
                .or_else(|| self.replication_invalid.clone())
                .or_else(|| self.replication_apply_error.clone())
                .or_else(|| self.slot_problem.clone()),
            final_lsn: self.final_lsn.clone(),
            streaming_replicas: probe.streaming_replicas,
            replication_slots: (self.mode == Mode::Primary && self.cluster.is_some()).then(|| {
                probe
                    .slots
                    .iter()
                    .filter(|s| !s.lost)
                    .map(|s| s.name.clone())
                    .collect()
            }),
            restarts: (self.restarts > 0).then_some(self.restarts),
            last_restart_time: self.last_restart.as_ref().map(|(at, _)| at.clone()),
            last_exit: self.last_restart.as_ref().map(|(_, exit)| exit.clone()),
            moved_aside: self.moved_aside_copy(),
            backup: self.shared.backup(),
            // The primary's archiving, while there is a destination to archive to.
            wal_archive: (self.cluster.is_some()
                && self.mode == Mode::Primary
                && self.pod_view.borrow().destination.is_some())
            .then(|| self.shared.wal_archive())
            .flatten(),
            failover_epoch: self
                .failover_ack
                .filter(|_| self.mode == Mode::Replica && self.view().failed_primary.is_some()),
            credentials_version: match self.mode {
                Mode::Primary => self.applied.clone(),
                // MariaDB: every instance applies them itself.
                Mode::Replica if self.mariadb() => self.applied.clone(),
                // Replicas do not apply credentials: the roles replicate from the primary
                // within seconds, so a replica that runs reports the Secret version it has
                // seen (simpler than waiting for its replay LSN to pass the primary's
                // apply, and what the operator needs to clear `CredentialsRegenerated`).
                Mode::Replica if self.probe.is_some() => {
                    self.desired.as_ref().map(|d| d.version.clone())
                }
                Mode::Replica => None,
            },
        }
    }

    /// Writes the report if it changed (or the heartbeat is due). `Some(Stale)` when the pod
    /// was replaced; forbidden before any successful write is fatal (exit 77).
    pub(super) async fn report(&mut self) -> Result<Option<Outcome>> {
        match self.reporter.report(self.status()).await {
            Ok(_) => {
                self.reported_once = true;
                Ok(None)
            }
            Err(WriteError::Stale(why)) => Ok(Some(Outcome::Stale(why))),
            Err(WriteError::Forbidden(e)) if !self.reported_once => {
                Err(Error::Forbidden(format!("reporting on the pod: {e}")))
            }
            Err(e) => {
                tracing::warn!("cannot write the report: {e}");
                Ok(None)
            }
        }
    }
}
