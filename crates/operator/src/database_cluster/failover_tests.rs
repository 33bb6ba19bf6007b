//! Failover's pure decisions: the election order, the quorum, when a lock counts as lost,
//! each step from the loss to the new primary (docs/failover.md).

use super::*;
use devctl_api::database_cluster::SynchronousMethod;

fn ha(auto_failover: bool) -> HighAvailabilitySpec {
    HighAvailabilitySpec {
        enabled: true,
        auto_failover,
        failover_timeout: "30s".into(),
    }
}

fn replica(timeline: i64, received: &str, replayed: &str, epoch: Option<i64>) -> InstanceStatus {
    InstanceStatus {
        role: Some("replica".into()),
        ready: true,
        timeline: Some(timeline),
        received_lsn: Some(received.into()),
        replayed_lsn: Some(replayed.into()),
        failover_epoch: epoch,
        ..Default::default()
    }
}

fn reports(epoch: Option<i64>) -> Vec<(String, Option<InstanceStatus>)> {
    vec![
        (
            "db-0".into(),
            Some(InstanceStatus {
                role: Some("primary".into()),
                ready: true,
                ..Default::default()
            }),
        ),
        (
            "db-1".into(),
            Some(replica(1, "0/3000000", "0/3000000", epoch)),
        ),
        (
            "db-2".into(),
            Some(replica(1, "0/3000100", "0/3000000", epoch)),
        ),
    ]
}

fn healthy() -> Primary {
    Primary {
        current: "db-0".into(),
        ..Default::default()
    }
}

fn pending(epoch: i64) -> Primary {
    Primary {
        current: "db-0".into(),
        target: Some(TARGET_PENDING.into()),
        failed: Some("db-0".into()),
        epoch: Some(epoch),
        last_failover_time: Some("2025-01-01T00:00:00Z".into()),
        failed_targets: Vec::new(),
        last_switchover_time: None,
        last_failover: None,
    }
}

fn lease(holder: Option<&str>, ever_held: bool, unchanged_for: u64) -> LeaseObservation {
    LeaseObservation {
        holder: holder.map(str::to_string),
        ever_held,
        unchanged_for: Duration::from_secs(unchanged_for),
    }
}

struct Case {
    ha: HighAvailabilitySpec,
    synchronous: Option<SynchronousSpec>,
    primary: Primary,
    lease: Option<LeaseObservation>,
    reports: Vec<(String, Option<InstanceStatus>)>,
    requested: Option<&'static str>,
    since_start: Duration,
    /// `spec.highAvailability` off (no lock is tended).
    ha_off: bool,
    forced: bool,
    /// Pods that showed life since the failover started.
    live: BTreeSet<String>,
}

impl Case {
    fn new(primary: Primary, lease: Option<LeaseObservation>) -> Self {
        Self {
            ha: ha(true),
            synchronous: None,
            primary,
            lease,
            reports: reports(None),
            requested: None,
            since_start: Duration::ZERO,
            ha_off: false,
            forced: false,
            live: BTreeSet::new(),
        }
    }

    fn plan(&self) -> Step {
        plan(&self.inputs())
    }

    fn inputs(&self) -> Inputs<'_> {
        let primary_ready = self
            .reports
            .iter()
            .any(|(name, r)| *name == self.primary.current && r.as_ref().is_some_and(|r| r.ready));
        Inputs {
            cluster: "db",
            high_availability: (!self.ha_off).then_some(&self.ha),
            synchronous: self.synchronous.as_ref(),
            primary: &self.primary,
            lease: self.lease.as_ref(),
            reports: &self.reports,
            replicas: 3,
            requested: self.requested,
            primary_ready,
            forced: self.forced,
            since_start: self.since_start,
            since_switchover: Duration::MAX,
            live: &self.live,
            suspended: false,
        }
    }
}

#[test]
fn lsns_are_two_hexadecimal_halves() {
    assert_eq!(parse_lsn("0/3000060"), Some(0x300_0060));
    assert_eq!(parse_lsn("1/0"), Some(1 << 32));
    assert!(parse_lsn("16/B374D848") > parse_lsn("F/FFFFFFFF"));
    assert_eq!(parse_lsn("nonsense"), None);
    assert_eq!(parse_lsn("0/"), None);
}

#[test]
fn election_order_is_timeline_then_received_then_replayed_then_lowest_name() {
    let pick = |a: InstanceStatus, b: InstanceStatus| {
        most_advanced(&[("db-2", &a), ("db-1", &b)]).map(str::to_string)
    };
    // A higher timeline wins over more WAL on an older one.
    assert_eq!(
        pick(
            replica(2, "0/1000000", "0/1000000", None),
            replica(1, "0/9000000", "0/9000000", None)
        ),
        Some("db-2".into())
    );
    // Received before replayed; compared as numbers, not text ("0/A..." > "0/9...").
    assert_eq!(
        pick(
            replica(1, "0/A000000", "0/1000000", None),
            replica(1, "0/9000000", "0/9000000", None)
        ),
        Some("db-2".into())
    );
    assert_eq!(
        pick(
            replica(1, "0/9000000", "0/9000000", None),
            replica(1, "0/9000000", "0/8000000", None)
        ),
        Some("db-2".into())
    );
    // Equal: the lowest ordinal (db-2 < db-10 by ordinal, not by text).
    let same = replica(1, "0/9000000", "0/9000000", None);
    assert_eq!(pick(same.clone(), same.clone()), Some("db-1".into()));
    assert_eq!(
        most_advanced(&[("db-10", &same), ("db-2", &same)]),
        Some("db-2")
    );
    // A report without positions ranks last.
    assert_eq!(
        most_advanced(&[("db-1", &InstanceStatus::default()), ("db-2", &same)]),
        Some("db-2")
    );
    assert_eq!(most_advanced(&[]), None);
}

#[test]
fn mariadb_replicas_are_elected_by_their_gtid_position() {
    let at = |position: &str| InstanceStatus {
        role: Some("replica".into()),
        ready: true,
        gtid_position: Some(position.into()),
        ..InstanceStatus::default()
    };
    // Sequence numbers, not text ("0-1-9" > "0-1-10" as text).
    assert_eq!(
        most_advanced(&[("db-1", &at("0-1-9")), ("db-2", &at("0-1-10"))]),
        Some("db-2")
    );
    // Equal positions: the lowest ordinal; none at all ranks last.
    assert_eq!(
        most_advanced(&[("db-2", &at("0-1-10")), ("db-1", &at("0-1-10"))]),
        Some("db-1")
    );
    assert_eq!(
        most_advanced(&[("db-1", &InstanceStatus::default()), ("db-2", &at("0-1-1"))]),
        Some("db-2")
    );
}

#[test]
fn quorum_rule() {
    let any = |number| SynchronousSpec {
        method: SynchronousMethod::Any,
        number,
    };
    let t = Duration::from_secs(30);
    let now = Duration::ZERO;
    // 5 instances: 4 standbys, ANY 2 → 3 positions needed, whatever time passes.
    assert!(!enough_acknowledged(
        Some(&any(2)),
        5,
        2,
        4,
        Duration::from_secs(3600),
        t
    ));
    assert!(enough_acknowledged(Some(&any(2)), 5, 3, 4, now, t));
    // ANY 1 of 2 standbys → both; ANY 2 of 2 → one suffices.
    assert!(!enough_acknowledged(Some(&any(1)), 3, 1, 2, now, t));
    assert!(enough_acknowledged(Some(&any(1)), 3, 2, 2, now, t));
    assert!(enough_acknowledged(Some(&any(2)), 3, 1, 2, now, t));
    // FIRST k counts the same way.
    let first = SynchronousSpec {
        method: SynchronousMethod::First,
        number: 1,
    };
    assert!(!enough_acknowledged(Some(&first), 3, 1, 2, now, t));
    assert!(enough_acknowledged(Some(&first), 3, 2, 2, now, t));
    // Asynchronous: every live replica, or one after a further timeout; never none.
    assert!(!enough_acknowledged(
        None,
        3,
        1,
        2,
        Duration::from_secs(29),
        t
    ));
    assert!(enough_acknowledged(None, 3, 2, 2, now, t));
    assert!(enough_acknowledged(None, 3, 1, 2, t, t));
    assert!(!enough_acknowledged(None, 3, 0, 0, t, t));
}

#[test]
fn a_lock_counts_as_lost_only_once_unchanged_for_the_timeout() {
    let step = |lease| Case::new(healthy(), Some(lease)).plan();
    assert_eq!(
        step(lease(Some("db-0"), true, 12)),
        Step::Idle {
            expires_in: Some(Duration::from_secs(18))
        }
    );
    assert!(matches!(
        step(lease(Some("db-0"), true, 30)),
        Step::Start { epoch: 1, candidate: None, ref failed, ref message, by_lock: true }
            if failed == "db-0" && message.contains("did not renew the lock for 30s")
    ));
    // Released and not taken back counts; never held does not.
    assert!(matches!(
        step(lease(None, true, 31)),
        Step::Start { ref message, .. } if message.contains("released")
    ));
    assert_eq!(
        step(lease(None, true, 5)),
        Step::Idle {
            expires_in: Some(Duration::from_secs(25))
        }
    );
    assert_eq!(
        step(lease(None, false, 3600)),
        Step::Idle { expires_in: None }
    );
    // Not during a switchover, nor without high availability or a lock.
    let mut switching = Case::new(healthy(), Some(lease(None, true, 3600)));
    switching.primary.target = Some("db-1".into());
    assert_eq!(switching.plan(), Step::Idle { expires_in: None });
    assert_eq!(
        Case::new(healthy(), None).plan(),
        Step::Idle { expires_in: None }
    );
    let off = Case::new(healthy(), Some(lease(Some("db-0"), true, 3600)));
    let step = plan(&Inputs {
        high_availability: None,
        cluster: "db",
        synchronous: None,
        primary: &off.primary,
        lease: off.lease.as_ref(),
        reports: &off.reports,
        replicas: 3,
        requested: None,
        primary_ready: false,
        forced: false,
        since_start: Duration::ZERO,
        since_switchover: Duration::MAX,
        live: &BTreeSet::new(),
        suspended: false,
    });
    assert_eq!(step, Step::Idle { expires_in: None });
    // The next epoch follows the last one.
    let mut again = Case::new(healthy(), Some(lease(Some("db-0"), true, 30)));
    again.primary.epoch = Some(4);
    assert!(matches!(again.plan(), Step::Start { epoch: 5, .. }));
}

#[test]
fn a_lock_released_for_a_switchover_counts_from_the_end_of_its_deadline() {
    // Aborted at its deadline (20 s): the old primary released the lock 19 s ago and
    // takes it back now; that is no loss for a lock duration.
    let case = Case::new(healthy(), Some(lease(None, true, 19)));
    let at = |since_switchover: u64| {
        plan(&Inputs {
            since_switchover: Duration::from_secs(since_switchover),
            ..case.inputs()
        })
    };
    assert_eq!(
        at(20),
        Step::Idle {
            expires_in: Some(Duration::from_secs(30))
        }
    );
    assert!(matches!(at(60), Step::Idle { .. }));
    // With a 30 s lock the deadline is 60 s: lost once the released lock was not taken
    // for 30 s after it.
    let released = Case::new(healthy(), Some(lease(None, true, 3600)));
    assert!(matches!(
        plan(&Inputs {
            since_switchover: Duration::from_secs(90),
            ..released.inputs()
        }),
        Step::Start { .. }
    ));
    // A held lock is judged as before.
    let held = Case::new(healthy(), Some(lease(Some("db-0"), true, 30)));
    assert!(matches!(
        plan(&Inputs {
            since_switchover: Duration::ZERO,
            ..held.inputs()
        }),
        Step::Start { .. }
    ));
}

#[test]
fn without_automatic_failover_or_a_replica_the_loss_is_reported() {
    let mut off = Case::new(healthy(), Some(lease(Some("db-0"), true, 40)));
    off.ha = ha(false);
    assert!(matches!(
        off.plan(),
        Step::Lost { ref message } if message.contains("automatic failover is off")
            && message.contains("devctl db promote db POD")
    ));
    let mut alone = Case::new(healthy(), Some(lease(Some("db-0"), true, 40)));
    alone.reports.truncate(1);
    assert!(matches!(
        alone.plan(),
        Step::Lost { ref message } if message.contains("no replica")
    ));
}

#[test]
fn a_promote_request_after_the_loss_fails_over_to_that_pod_only() {
    let mut manual = Case::new(healthy(), Some(lease(Some("db-0"), true, 40)));
    manual.ha = ha(false);
    manual.requested = Some("db-1");
    assert!(matches!(
        manual.plan(),
        Step::Start { epoch: 1, candidate: Some(ref c), .. } if c == "db-1"
    ));
    manual.requested = Some("db-7");
    assert!(matches!(manual.plan(), Step::Refuse(m) if m.contains("not an instance")));
    manual.requested = Some("db-0");
    assert_eq!(manual.plan(), Step::AlreadyPrimary);

    // Pending: only the requested pod, once it has its own final position, even though
    // db-2 is further ahead and acknowledged first.
    let mut pending_manual = Case::new(pending(1), Some(lease(Some("db-0"), true, 40)));
    pending_manual.ha = ha(false);
    pending_manual.requested = Some("db-1");
    pending_manual.reports[2].1 = Some(replica(1, "0/9000000", "0/9000000", Some(1)));
    assert_eq!(pending_manual.plan(), Step::Pending { recheck_in: None });
    pending_manual.reports[1].1 = Some(replica(1, "0/1000000", "0/1000000", Some(1)));
    assert_eq!(pending_manual.plan(), Step::Elect("db-1".into()));
    pending_manual.requested = Some("db-0");
    assert!(matches!(pending_manual.plan(), Step::Refuse(m) if m.contains("failed over")));
}

#[test]
fn without_a_lock_a_promote_request_fails_over_only_from_a_primary_that_does_not_serve() {
    let down = |case: &mut Case| {
        case.reports[0].1 = Some(InstanceStatus {
            role: Some("primary".into()),
            ready: false,
            ..Default::default()
        });
    };
    for (ha_off, lease) in [(true, None), (false, Some(lease(None, false, 3600)))] {
        let mut case = Case::new(healthy(), lease);
        case.ha_off = ha_off;
        // Nothing asked: nothing happens, whatever the primary's state.
        down(&mut case);
        assert_eq!(case.plan(), Step::Idle { expires_in: None });
        case.requested = Some("db-2");
        // Only when the request accepts a failover: a primary merely restarting would
        // lose what it had not sent.
        assert!(matches!(
            case.plan(),
            Step::Refuse(ref m) if m.contains("devctl db promote db db-2 --force")
        ));
        case.forced = true;
        assert!(matches!(
            case.plan(),
            Step::Start { epoch: 1, candidate: Some(ref c), ref failed, by_lock: false, ref message }
                if c == "db-2" && failed == "db-0" && message.contains("not ready")
        ));
        // A serving primary hands over by switchover instead.
        case.reports = reports(None);
        assert_eq!(case.plan(), Step::Idle { expires_in: None });
        down(&mut case);
        // Only a replica: not an unknown pod, not one that reports no role.
        case.requested = Some("db-5");
        assert!(matches!(case.plan(), Step::Refuse(m) if m.contains("not an instance")));
        case.reports[1].1 = None;
        case.requested = Some("db-1");
        assert!(matches!(case.plan(), Step::Refuse(m) if m.contains("does not run as a replica")));
        // Under way: the switchover's target is not a failover.
        case.primary.target = Some("db-2".into());
        assert_eq!(case.plan(), Step::Idle { expires_in: None });
    }
    // With high availability and no lock cached (yet), nothing is decided.
    let mut unknown = Case::new(healthy(), None);
    down(&mut unknown);
    unknown.requested = Some("db-2");
    unknown.forced = true;
    assert_eq!(unknown.plan(), Step::Idle { expires_in: None });
    // With a lock that was held, the lock decides (here: not expired yet).
    let mut held = Case::new(healthy(), Some(lease(Some("db-0"), true, 5)));
    down(&mut held);
    held.requested = Some("db-2");
    held.forced = true;
    assert!(matches!(
        held.plan(),
        Step::Idle {
            expires_in: Some(_)
        }
    ));
}

#[test]
fn without_high_availability_a_stale_lock_does_not_hold_up_the_promotion() {
    let mut case = Case::new(
        Primary {
            target: Some("db-1".into()),
            ..pending(1)
        },
        Some(lease(Some("db-0"), true, 3600)),
    );
    case.ha_off = true;
    case.reports[1].1 = Some(InstanceStatus {
        role: Some("primary".into()),
        ready: true,
        ..Default::default()
    });
    assert!(matches!(case.plan(), Step::Done { ref to, .. } if to == "db-1"));
    case.ha_off = false;
    assert_eq!(case.plan(), Step::Promoting("db-1".into()));
}

#[test]
fn the_election_waits_for_final_positions_of_this_epoch() {
    // Positions acknowledged for an older epoch do not count.
    let mut case = Case::new(pending(2), Some(lease(Some("db-0"), true, 40)));
    case.reports = reports(Some(1));
    case.live = ["db-1", "db-2"].map(String::from).into();
    assert_eq!(case.plan(), Step::Pending { recheck_in: None });
    // One of two: asynchronous waits for the other, or the further timeout.
    case.reports[1].1 = Some(replica(1, "0/3000000", "0/3000000", Some(2)));
    case.since_start = Duration::from_secs(10);
    assert_eq!(
        case.plan(),
        Step::Pending {
            recheck_in: Some(Duration::from_secs(20))
        }
    );
    case.since_start = Duration::from_secs(30);
    assert_eq!(case.plan(), Step::Elect("db-1".into()));
    // Both: the most advanced.
    case.since_start = Duration::ZERO;
    case.reports = reports(Some(2));
    assert_eq!(case.plan(), Step::Elect("db-2".into()));
    // A replica whose report did not change since the start (its agent is dead) does not
    // hold up an asynchronous election — past the first LIVENESS_GRACE, within which a live
    // one that is merely slower to show life than another is to acknowledge (the race this
    // grace closes: db-1 elected with db-2 further ahead) is waited for.
    case.live.remove("db-2");
    case.reports[2].1 = Some(InstanceStatus {
        ready: false,
        ..replica(1, "0/3000100", "0/3000000", None)
    });
    case.since_start = Duration::from_secs(1);
    assert_eq!(
        case.plan(),
        Step::Pending {
            recheck_in: Some(LIVENESS_GRACE - Duration::from_secs(1))
        }
    );
    case.since_start = LIVENESS_GRACE;
    assert_eq!(case.plan(), Step::Elect("db-1".into()));
    // Synchronous ANY 1 of 2: both positions, however long it takes.
    case.synchronous = Some(SynchronousSpec {
        method: SynchronousMethod::Any,
        number: 1,
    });
    case.since_start = Duration::from_secs(3600);
    assert_eq!(case.plan(), Step::Pending { recheck_in: None });
}

#[test]
fn an_asynchronous_election_waits_for_a_live_replica_that_is_slow_to_acknowledge() {
    // Nothing streams once the primary is gone: no replica is ready. db-1 acknowledged
    // first; db-2 is further ahead and alive (its report changed since the start) but
    // has not acknowledged yet.
    let mut case = Case::new(pending(1), Some(lease(Some("db-0"), true, 40)));
    case.reports[1].1 = Some(InstanceStatus {
        ready: false,
        ..replica(1, "0/3000000", "0/3000000", Some(1))
    });
    case.reports[2].1 = Some(InstanceStatus {
        ready: false,
        ..replica(1, "0/3000100", "0/3000000", None)
    });
    case.live = ["db-1", "db-2"].map(String::from).into();
    case.since_start = Duration::from_secs(5);
    assert_eq!(
        case.plan(),
        Step::Pending {
            recheck_in: Some(Duration::from_secs(25))
        },
        "the first acknowledgement does not win while a live replica has not answered"
    );
    // It answers: the most advanced wins.
    case.reports[2].1 = Some(InstanceStatus {
        ready: false,
        ..replica(1, "0/3000100", "0/3000000", Some(1))
    });
    assert_eq!(case.plan(), Step::Elect("db-2".into()));
    // It never answers: the wait is bounded by failoverTimeout from the start.
    case.reports[2].1 = Some(InstanceStatus {
        ready: false,
        ..replica(1, "0/3000100", "0/3000000", None)
    });
    case.since_start = Duration::from_secs(30);
    assert_eq!(case.plan(), Step::Elect("db-1".into()));
}

#[test]
fn targets_that_did_not_promote_are_not_elected_again_and_the_failover_stops_when_none_is_left() {
    // db-2 is the most advanced, but was elected in this failover and did not promote.
    let mut case = Case::new(pending(2), Some(lease(Some("db-0"), true, 40)));
    case.reports = reports(Some(2));
    case.primary.failed_targets = vec!["db-2".into()];
    assert_eq!(case.plan(), Step::Elect("db-1".into()));
    // Both replicas tried: nobody is elected, and the status says what to do.
    case.primary.failed_targets = vec!["db-2".into(), "db-1".into()];
    assert!(matches!(
        case.plan(),
        Step::Stuck { ref message }
            if message.contains("db-2, db-1 did not take the primary lock")
                && message.contains("no other replica is left")
                && message.contains("devctl db promote db POD")
    ));
    // A human may still pick one of them.
    case.requested = Some("db-1");
    assert_eq!(case.plan(), Step::Elect("db-1".into()));
    // Three tried in a larger cluster: stop, although replicas are left.
    let mut large = Case::new(pending(4), Some(lease(Some("db-0"), true, 40)));
    large.reports = reports(Some(4));
    large
        .reports
        .push(("db-3".into(), Some(replica(1, "0/1", "0/1", Some(4)))));
    large
        .reports
        .push(("db-4".into(), Some(replica(1, "0/1", "0/1", Some(4)))));
    large.primary.failed_targets = vec!["db-1".into(), "db-2".into(), "db-3".into()];
    let step = plan(&Inputs {
        replicas: 5,
        ..large.inputs()
    });
    assert!(
        matches!(step, Step::Stuck { ref message } if message.contains("stops electing after 3")),
        "{step:?}"
    );
}

#[test]
fn done_once_the_target_reports_primary_and_holds_the_lock() {
    let mut case = Case::new(
        Primary {
            target: Some("db-2".into()),
            ..pending(3)
        },
        Some(lease(Some("db-0"), true, 40)),
    );
    assert_eq!(case.plan(), Step::Promoting("db-2".into()));
    case.reports[2].1 = Some(InstanceStatus {
        role: Some("primary".into()),
        ready: true,
        ..Default::default()
    });
    assert_eq!(
        case.plan(),
        Step::Promoting("db-2".into()),
        "not the holder yet"
    );
    case.lease = Some(lease(Some("db-2"), true, 0));
    assert_eq!(
        case.plan(),
        Step::Done {
            from: "db-0".into(),
            to: "db-2".into(),
            epoch: 3
        }
    );
    // Requests wait until the failover is done.
    case.requested = Some("db-1");
    assert!(matches!(case.plan(), Step::Done { .. }));
}

#[test]
fn a_target_that_never_promotes_is_replaced_once_the_lock_shows_it_died() {
    let mut case = Case::new(
        Primary {
            target: Some("db-2".into()),
            ..pending(3)
        },
        Some(lease(Some("db-0"), true, 3600)),
    );
    // Within two lock durations of the start: the target still has time.
    case.since_start = Duration::from_secs(59);
    assert_eq!(case.plan(), Step::Promoting("db-2".into()));
    // Later, with nobody renewing the lock for a duration: elect again.
    case.since_start = Duration::from_secs(60);
    assert!(matches!(
        case.plan(),
        Step::Reelect { epoch: 4, ref message, .. }
            if message.contains("db-2, elected in epoch 3, did not promote")
    ));
    // The target took the lock lately (it is promoting): not lost; nor while its
    // promotion may still be replaying what it received (it renews when that returns).
    case.lease = Some(lease(Some("db-2"), true, 5));
    assert_eq!(case.plan(), Step::Promoting("db-2".into()));
    case.lease = Some(lease(Some("db-2"), true, 104));
    assert_eq!(case.plan(), Step::Promoting("db-2".into()));
    // One that took it and then died is lost once that is over too.
    case.lease = Some(lease(Some("db-2"), true, 105));
    assert!(matches!(case.plan(), Step::Reelect { epoch: 4, ref lost, .. } if lost == "db-2"));
    // A target that reports a ready primary is never replaced (it fences itself if it
    // cannot hold the lock, and then its report says so).
    case.lease = Some(lease(Some("db-0"), true, 3600));
    case.reports[2].1 = Some(InstanceStatus {
        role: Some("primary".into()),
        ready: true,
        ..Default::default()
    });
    assert_eq!(case.plan(), Step::Promoting("db-2".into()));
    // Without high availability nothing tells a dead target from a slow one.
    case.reports = reports(Some(3));
    case.ha_off = true;
    assert_eq!(case.plan(), Step::Promoting("db-2".into()));
}

#[test]
fn without_a_lock_a_new_forced_request_replaces_a_target_that_has_not_promoted() {
    let mut case = Case::new(
        Primary {
            target: Some("db-1".into()),
            ..pending(1)
        },
        None,
    );
    case.ha_off = true;
    assert_eq!(case.plan(), Step::Promoting("db-1".into()));
    case.requested = Some("db-2");
    assert_eq!(case.plan(), Step::Promoting("db-1".into()), "not forced");
    case.forced = true;
    assert!(matches!(
        case.plan(),
        Step::Reelect { epoch: 2, ref lost, ref message, .. }
            if lost == "db-1" && message.contains("electing db-2 as requested")
    ));
    // Not for the target itself, the failed primary, or with a lock (which decides).
    case.requested = Some("db-1");
    assert_eq!(case.plan(), Step::Promoting("db-1".into()));
    case.requested = Some("db-0");
    assert_eq!(case.plan(), Step::Promoting("db-1".into()));
    case.requested = Some("db-2");
    case.ha_off = false;
    case.lease = Some(lease(Some("db-0"), true, 3600));
    assert_eq!(case.plan(), Step::Promoting("db-1".into()));
}
