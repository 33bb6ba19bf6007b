//! A replica's upkeep: where it streams from, through which slot, its archive fallback, and
//! when it must re-clone.

use super::*;

impl Agent {
    /// The primary's address without asking anyone: the Service's with `service`, the last
    /// known otherwise.
    pub(super) fn known_primary_address(&self) -> Option<PrimaryAddress> {
        match &self.config.primary_from {
            PrimaryFrom::Service { host } => Some(PrimaryAddress {
                host: host.clone(),
                port: self.config.port,
            }),
            PrimaryFrom::Annotation => self.primary_address.clone(),
        }
    }

    /// Where this replica streams from: the target of a switchover under way (cascading,
    /// see [`switchover_upstream`]), or the primary.
    pub(super) fn upstream_address(&self) -> Option<PrimaryAddress> {
        match &self.cascade {
            Some((_, address)) => Some(address.clone()),
            None => self.known_primary_address(),
        }
    }

    pub(super) fn conninfo_for(&self, address: &PrimaryAddress) -> String {
        primary_conninfo(
            &address.host,
            address.port,
            &self.replication_user(),
            &self.passfile(),
            &self.config.pod_name,
        )
    }

    /// Before (re)starting a replica: the password file and the standby settings.
    pub(super) fn prepare_replica_start(&mut self) -> Result<()> {
        if self.mariadb() {
            // Pointed at the primary once the engine runs (`tick_replica_mariadb`).
            return Ok(());
        }
        if let Err(e) = self.write_passfile() {
            return Err(Error::DataDir(e));
        }
        let conninfo = if self.view().failed_primary.is_some() {
            // Failover under way: start without streaming (the position stays final).
            Some(String::new())
        } else {
            self.upstream_address()
                .map(|address| self.conninfo_for(&address))
        };
        let extras = self.standby_extras();
        self.engine
            .write_standby_settings(conninfo.as_deref(), &extras)
            .map_err(Error::DataDir)?;
        self.extras_applied = Some(extras);
        self.wal_removed_since = None;
        if conninfo.is_some() {
            self.conninfo_applied = conninfo;
        }
        Ok(())
    }

    /// Replica: its slot once the primary reports keeping it (a primary run by an older
    /// agent has none, and streaming through a missing slot fails), and the archive as the
    /// fallback while the cluster archives.
    pub(super) fn standby_extras(&self) -> StandbyExtras {
        StandbyExtras {
            // Cascading from a switchover's target: no slot (the target, still a standby,
            // keeps none for this replica; the new primary creates it once promoted).
            slot: if self.cascade.is_some() {
                String::new()
            } else {
                self.slot_on_primary().unwrap_or_default()
            },
            // During a failover nothing more is replayed (from the archive either): the
            // position reported for the election is final.
            restore_command: if self.view().failed_primary.is_none()
                && matches!(self.pod_view.borrow().destination(), Ok(Some(_)))
            {
                self.engine.standby_restore_command()
            } else {
                String::new()
            },
        }
    }

    /// This replica's slot, when the current primary's last report lists it (never an
    /// earlier primary's list: after a failover the new one has to create it first).
    fn slot_on_primary(&self) -> Option<String> {
        let slot = slot_name(&self.config.pod_name);
        let current = self.view().current_primary;
        self.primary_slots
            .as_ref()
            .filter(|(primary, slots)| Some(primary) == current.as_ref() && slots.contains(&slot))
            .map(|_| slot)
    }

    /// Replica: the primary's address (`annotation`: from its report, kept when the report
    /// is not ready, e.g. while the primary restarts) and the slots it keeps. Returns why
    /// they are unknown, if so.
    pub(super) async fn refresh_primary_address(&mut self) -> Option<String> {
        if let Err(e) = self.write_passfile() {
            return Some(e);
        }
        let view = self.view();
        if view.failed_primary.is_some() {
            self.cascade = None;
            return None;
        }
        let upstream = switchover_upstream(&view, &self.config.pod_name)
            .filter(|target| self.cascade_refused.as_ref() != Some(target));
        match upstream {
            Some(target) => {
                let cascading = self.cascading_from(&target);
                if cascading && self.target_lacks_wal() {
                    // The target (keeping no slot for this replica) recycled WAL it still
                    // needs: back to the old primary, whose slot kept it, for this switchover.
                    tracing::warn!(%target, "the switchover's target no longer has the WAL this replica needs: streaming from the primary");
                    self.cascade = None;
                    self.cascade_refused = Some(target);
                } else {
                    // The target's own address (in both modes: the `-rw` Service still leads
                    // to the old primary), read while it reports streaming; read again while
                    // this replica does not stream (a restarted target has a new address). A
                    // failed read keeps the address known: the target's report is not ready
                    // for a moment while it promotes.
                    if !(cascading && self.ready)
                        && let Ok(Some(report)) = read_report(&self.pods, &target).await
                        && report.ready
                        && let Some(address) = report.address.as_deref().and_then(parse_address)
                    {
                        if self.cascade.as_ref() != Some(&(target.clone(), address.clone())) {
                            tracing::info!(%target, %address, "a switchover is under way: streaming from its target (cascading)");
                        }
                        self.cascade = Some((target.clone(), address));
                    }
                    if self.cascading_from(&target) {
                        return None;
                    }
                    // Not known (yet): stream from the primary.
                    self.cascade = None;
                }
            }
            None => {
                self.cascade_refused = None;
                // The target is the primary now: keep streaming from it, slot-less, until its
                // report lists this replica's slot (below); then address and slot change in
                // one reload. Anything else (aborted): back to the primary now.
                if self.cascade.as_ref().is_some_and(|(target, _)| {
                    view.current_primary.as_deref() != Some(target.as_str())
                }) {
                    self.cascade = None;
                }
            }
        }
        // Named ourselves (a promotion we do not make): keep streaming from where we do.
        // (`None`: no problem to report.)
        let primary = view
            .current_primary
            .filter(|p| *p != self.config.pod_name)?;
        // `service`: the address is the Service's; the report is read only until it lists
        // this replica's slot (not a GET of the primary's pod every probe).
        if !matches!(self.config.primary_from, PrimaryFrom::Annotation)
            && self.slot_on_primary().is_some()
        {
            self.end_cascade_once_slotted();
            return None;
        }
        match resolve_primary_report(&self.pods, &self.config, &primary).await {
            Ok((address, report)) => {
                if self.primary_address.as_ref() != Some(&address) {
                    tracing::info!(%primary, %address, "the primary's address");
                }
                self.primary_address = Some(address);
                self.primary_slots = report.replication_slots.map(|slots| (primary, slots));
                self.end_cascade_once_slotted();
                None
            }
            // `service`: the Service's address serves whatever the report says.
            Err(_) if !matches!(self.config.primary_from, PrimaryFrom::Annotation) => None,
            Err(why) => Some(why),
        }
    }

    /// A switchover's target became the primary and its report lists this replica's slot:
    /// stream from the primary's address through the slot (one reload; `annotation`: the
    /// same address, so only the slot changes).
    fn end_cascade_once_slotted(&mut self) {
        if self.cascade.is_some() && self.slot_on_primary().is_some() {
            self.cascade = None;
        }
    }

    /// Streaming from `target` (a switchover's) already.
    fn cascading_from(&self, target: &str) -> bool {
        self.cascade
            .as_ref()
            .is_some_and(|(name, _)| name == target)
    }

    /// Cascading: the target recently said that WAL this replica asks for is gone.
    fn target_lacks_wal(&self) -> bool {
        said_recently(
            self.engine_last_error.peek().as_ref(),
            Instant::now(),
            &[WAL_REMOVED],
        )
    }

    /// A replica's probe: a changed primary address is applied (`ALTER SYSTEM` and a
    /// reload), and the replica is ready only while it streams.
    pub(super) async fn tick_replica(&mut self, probe: Probe, resolve_problem: Option<String>) {
        let mut conninfo_error = None;
        let failing_over = self.view().failed_primary.is_some();
        let desired = if failing_over || self.hooks.wal_receiver_stopped() {
            // Failover: stop the WAL receiver so the position reported is final.
            Some(String::new())
        } else {
            self.upstream_address()
                .map(|address| self.conninfo_for(&address))
        };
        let conninfo = desired.filter(|c| self.conninfo_applied.as_deref() != Some(c.as_str()));
        let extras =
            Some(self.standby_extras()).filter(|e| self.extras_applied.as_ref() != Some(e));
        if conninfo.is_some() || extras.is_some() {
            // One reload for all of them: each reload that changes one restarts the WAL
            // receiver.
            match self
                .engine
                .set_standby_settings(conninfo.as_deref(), extras.as_ref())
                .await
            {
                Ok(()) => {
                    match conninfo.as_deref() {
                        Some("") => {
                            tracing::info!("primary_conninfo emptied: WAL receiver stopped")
                        }
                        Some(_) => tracing::info!("primary_conninfo set; configuration reloaded"),
                        None => {}
                    }
                    if let Some(extras) = &extras {
                        tracing::info!(slot = %extras.slot, archive = !extras.restore_command.is_empty(), "primary_slot_name and restore_command set; configuration reloaded");
                    }
                    if conninfo.is_some() {
                        self.conninfo_applied = conninfo;
                    }
                    if extras.is_some() {
                        self.extras_applied = extras;
                    }
                }
                Err(e) => {
                    tracing::error!(
                        "setting the standby's primary_conninfo, slot and restore_command: {e}"
                    );
                    conninfo_error = Some(format!(
                        "setting primary_conninfo, primary_slot_name and restore_command: {e}"
                    ));
                }
            }
        }
        // (Rejoining, re-cloning and the announcement are the role's: `drive_role`.)
        self.ready = probe.is_streaming();
        if probe.wal_receiver.is_some() && probe.timeline.is_some() {
            self.stream_timeline = probe.timeline;
        }
        self.replica_problem = if self.ready {
            None
        } else if failing_over {
            let show = |lsn: &Option<String>| lsn.clone().unwrap_or_else(|| "none".into());
            Some(format!(
                "failover (epoch {}): streaming stopped at received {}, replayed {}",
                self.view().failover_epoch,
                show(&probe.received_lsn),
                show(&probe.replayed_lsn)
            ))
        } else {
            let from = self
                .upstream_address()
                .map(|a| format!(" at {a}"))
                .unwrap_or_default();
            let receiver = probe.wal_receiver.as_deref().unwrap_or("not running");
            let mut message =
                format!("not streaming from the primary{from} (WAL receiver: {receiver})");
            if probe.role != devctl_api::instance::ROLE_REPLICA {
                message = format!(
                    "the engine is not in recovery although this instance is a replica; {message}"
                );
            }
            if let Some(why) = resolve_problem {
                message = format!("{message}; {why}");
            }
            Some(message)
        }
        .or(conninfo_error);
        // Slots left from when this instance was a primary would pin its WAL for no one.
        self.apply_slots(&probe, false).await;
        self.probe = Some(probe);
    }

    /// Replica: whether it must re-clone because the WAL it needs is gone — the primary keeps
    /// saying so ([`wal_removed_step`]) and nothing was replayed for
    /// [`WAL_REMOVED_RECLONE_AFTER`] (the archive, when there is one, had its turn).
    pub(super) fn wal_gone(&mut self, probe: &Probe) -> Option<String> {
        if self.cascade.is_some() {
            // A target lacking WAL sends this replica back to the primary, not to a clone.
            self.wal_removed_since = None;
            return None;
        }
        let last = self.engine_last_error.peek();
        let (since, fire) = wal_removed_step(
            self.wal_removed_since.clone(),
            probe.is_streaming(),
            last.as_ref(),
            &probe.replayed_lsn,
            Instant::now(),
        );
        if self.wal_removed_since.is_none()
            && since.is_some()
            && let Some((line, _)) = &last
        {
            tracing::warn!("the primary no longer has the WAL this replica needs: {line}");
        }
        self.wal_removed_since = since;
        fire.then(|| {
            let said = last.map(|(line, _)| line).unwrap_or_default();
            if let Some(words) = TIMELINE_DEAD_END.iter().find(|w| said.contains(*w)) {
                return format!(
                    "this replica's timeline is not the primary's (the engine says: {words}) and nothing was replayed for {}s: it followed a promotion that did not last",
                    WAL_REMOVED_RECLONE_AFTER.as_secs()
                );
            }
            format!(
                "the primary no longer has the WAL this replica needs (requested WAL segment {WAL_REMOVED}) and {} for {}s",
                if self.extras_applied.as_ref().is_some_and(|e| !e.restore_command.is_empty()) {
                    "the archive did not provide it"
                } else {
                    "there is no archive to fetch it from"
                },
                WAL_REMOVED_RECLONE_AFTER.as_secs()
            )
        })
    }

    /// Event `Rejoined` on the cluster: a former primary streams from the new one.
    pub(super) async fn publish_rejoined(&self, how: &Rejoin) {
        let view = self.view();
        let reference = self.cluster_reference();
        let pod = &self.config.pod_name;
        let primary = view.current_primary.unwrap_or_default();
        let event = ClusterEvent {
            type_: EventType::Normal,
            reason: match how {
                Rejoin::CaughtUpByClone(_) => "Recloned",
                _ => "Rejoined",
            }
            .into(),
            note: Some(match how {
                Rejoin::Rewound => format!(
                    "{pod} rejoined as a standby of {primary} (rewound from its former primary's data)"
                ),
                Rejoin::Followed => format!(
                    "{pod} rejoined as a replica of {primary} (its former primary's data has no transactions {primary} lacks)"
                ),
                Rejoin::Recloned(aside) => format!(
                    "{pod} rejoined as a standby of {primary} (re-cloned: its former primary's data could not follow and was moved aside to {aside})"
                ),
                Rejoin::CaughtUpByClone(reason) => {
                    format!("{pod} was re-cloned from {primary} and streams again: {reason}")
                }
            }),
            action: match how {
                Rejoin::CaughtUpByClone(_) => format!("Reclone {pod}"),
                _ => format!("Rejoin {pod}"),
            },
            secondary: None,
        };
        publish(&self.recorder, &reference, &event).await;
    }

    /// The DatabaseCluster, for events about it.
    pub(super) fn cluster_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(format!("{}/v1beta1", devctl_api::DB_GROUP)),
            kind: Some("DatabaseCluster".into()),
            name: Some(self.config.cluster.clone()),
            namespace: Some(self.config.pod_namespace.clone()),
            uid: self.view().uid.clone(),
            ..Default::default()
        }
    }
}

/// During a switchover to another replica (`status.targetPrimary` names it; no failover
/// under way), the instance a replica streams from: the target, already. A standby follows
/// its upstream's promotion onto the new timeline by itself (cascading replication), so the
/// new primary has its synchronous standby the moment it promotes, instead of once the
/// operator names it and each replica re-points. Its WAL still comes from the old primary,
/// through the target, until the old primary stops. `None`: stream from the primary —
/// also when the old primary's synchronous commits need more than one standby: every other
/// replica cascades, so the target alone acknowledges them until it stops.
pub(super) fn switchover_upstream(view: &ClusterView, me: &str) -> Option<String> {
    if view.failed_primary.is_some()
        || view
            .synchronous
            .as_ref()
            .is_some_and(|(_, number)| *number > 1)
    {
        return None;
    }
    let target = view.target_primary.as_deref()?;
    (target != me
        && target != devctl_api::instance::TARGET_PENDING
        && Some(target) != view.current_primary.as_deref())
    .then(|| target.to_string())
}

/// Publishes `event` on `reference`; a failure is logged (events are news, not state).
pub(super) async fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    event: &ClusterEvent,
) {
    if let Err(e) = recorder.publish(event, reference).await {
        tracing::warn!(
            "publishing the {} event: {}",
            event.reason,
            one_line(&e.to_string())
        );
    }
}

/// How recent the engine's "already removed" line must be to count: a WAL receiver the
/// primary still refuses says it again every 5 s (`wal_retrieve_retry_interval`).
const WAL_REMOVED_RECENT: Duration = Duration::from_secs(15);

/// What the engine says when this replica's timeline forked off the primary's after the
/// point the primary is at — it followed a promotion that did not last (a switchover's target
/// promoted as the switchover was abandoned, while this replica cascaded from it), or its
/// position lies past the fork (an asynchronous replica ahead of the elected one): streaming
/// cannot resume, and it re-clones like a replica whose WAL is gone.
const TIMELINE_DEAD_END: [&str; 3] = [
    "is behind recovery timeline",
    "is not a child of this server's history",
    // This replica's position lies past where the primary's timeline forked off.
    "is not in this server's history",
];

/// Whether the engine's last error line, said at most [`WAL_REMOVED_RECENT`] before `now`,
/// holds one of `words`.
fn said_recently(last_error: Option<&(String, Instant)>, now: Instant, words: &[&str]) -> bool {
    last_error.is_some_and(|(line, at)| {
        words.iter().any(|w| line.contains(w))
            && now.saturating_duration_since(*at) < WAL_REMOVED_RECENT
    })
}

/// One look at a replica that may have lost the WAL it needs (or its primary's timeline):
/// since when (and at which replayed position) the primary has kept saying so, and whether
/// that lasted
/// [`WAL_REMOVED_RECLONE_AFTER`] without replay moving. Anything else — streaming, another
/// error since, an old line — starts over.
pub(super) fn wal_removed_step(
    since: Option<(Instant, Option<String>)>,
    streaming: bool,
    last_error: Option<&(String, Instant)>,
    replayed: &Option<String>,
    now: Instant,
) -> (Option<(Instant, Option<String>)>, bool) {
    let recent = said_recently(last_error, now, &[WAL_REMOVED])
        || said_recently(last_error, now, &TIMELINE_DEAD_END);
    if streaming || !recent {
        return (None, false);
    }
    match since {
        Some((start, at)) if at == *replayed => (
            Some((start, at)),
            now.saturating_duration_since(start) >= WAL_REMOVED_RECLONE_AFTER,
        ),
        // First said, or replay moved (from the archive): still catching up.
        _ => (Some((now, replayed.clone())), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_streams_from_a_switchovers_target_only_while_the_switchover_is_under_way() {
        let view =
            |current: Option<&str>, target: Option<&str>, failed: Option<&str>| ClusterView {
                current_primary: current.map(Into::into),
                target_primary: target.map(Into::into),
                failed_primary: failed.map(Into::into),
                replicas: 3,
                synchronous: Some(("ANY".into(), 1)),
                ..Default::default()
            };
        let upstream = |v: &ClusterView| switchover_upstream(v, "db-2");
        // Steady state: the primary.
        assert_eq!(upstream(&view(Some("db-0"), None, None)), None);
        // A switchover to db-1: stream from db-1 already.
        assert_eq!(
            upstream(&view(Some("db-0"), Some("db-1"), None)),
            Some("db-1".to_string())
        );
        // This replica is the target: it streams from the old primary until it promotes.
        assert_eq!(upstream(&view(Some("db-0"), Some("db-2"), None)), None);
        // Done (the target is the primary): the primary.
        assert_eq!(upstream(&view(Some("db-1"), Some("db-1"), None)), None);
        // A failover (its target pending or elected): nobody; the WAL receiver stops.
        assert_eq!(
            upstream(&view(Some("db-0"), Some("pending"), Some("db-0"))),
            None
        );
        assert_eq!(
            upstream(&view(Some("db-0"), Some("db-1"), Some("db-0"))),
            None
        );
        assert_eq!(upstream(&view(Some("db-0"), Some("pending"), None)), None);
        // ANY 2: the old primary's commits need a second standby besides the target, to the
        // end (also with five instances: every other replica would cascade).
        let two_needed = ClusterView {
            synchronous: Some(("ANY".into(), 2)),
            ..view(Some("db-0"), Some("db-1"), None)
        };
        assert_eq!(upstream(&two_needed), None);
        assert_eq!(
            upstream(&ClusterView {
                replicas: 5,
                ..two_needed
            }),
            None
        );
        // Asynchronous: cascade.
        let asynchronous = ClusterView {
            synchronous: None,
            ..view(Some("db-0"), Some("db-1"), None)
        };
        assert_eq!(upstream(&asynchronous), Some("db-1".to_string()));
    }

    #[test]
    fn a_replica_re_clones_only_while_the_primary_keeps_saying_its_wal_is_gone() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let removed = |s: u64| {
            (
                "FATAL:  could not receive data from WAL stream: ERROR:  requested WAL segment 000000010000000000000003 has already been removed".to_string(),
                at(s),
            )
        };
        let lsn = |l: &str| Some(l.to_string());
        // First said: the clock starts.
        let (since, fire) =
            wal_removed_step(None, false, Some(&removed(0)), &lsn("0/3000000"), at(1));
        assert!(!fire);
        assert_eq!(since, Some((at(1), lsn("0/3000000"))));
        // Said again, nothing replayed, 20 s on: re-clone.
        let (kept, fire) = wal_removed_step(
            since.clone(),
            false,
            Some(&removed(20)),
            &lsn("0/3000000"),
            at(21),
        );
        assert!(fire);
        assert_eq!(kept, since);
        // Replay moved (the archive answers): start over.
        let (moved, fire) = wal_removed_step(
            since.clone(),
            false,
            Some(&removed(20)),
            &lsn("0/4000000"),
            at(21),
        );
        assert!(!fire);
        assert_eq!(moved, Some((at(21), lsn("0/4000000"))));
        // The line is old (nothing said it for 15 s): not the reason it does not stream now.
        assert_eq!(
            wal_removed_step(
                since.clone(),
                false,
                Some(&removed(1)),
                &lsn("0/3000000"),
                at(21)
            ),
            (None, false)
        );
        // Another error since (a switchover, a password): start over.
        let other = ("FATAL:  password authentication failed".to_string(), at(20));
        assert_eq!(
            wal_removed_step(
                since.clone(),
                false,
                Some(&other),
                &lsn("0/3000000"),
                at(21)
            ),
            (None, false)
        );
        // A timeline this replica followed and the primary never had: the same clock.
        let dead_end = (
            "FATAL:  highest timeline 3 of the primary is behind recovery timeline 4".to_string(),
            at(20),
        );
        let (_, fire) = wal_removed_step(
            since.clone(),
            false,
            Some(&dead_end),
            &lsn("0/3000000"),
            at(21),
        );
        assert!(fire);
        // Streaming: all is well.
        assert_eq!(
            wal_removed_step(since, true, Some(&removed(20)), &lsn("0/3000000"), at(21)),
            (None, false)
        );
    }
}
