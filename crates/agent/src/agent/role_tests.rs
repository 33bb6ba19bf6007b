//! Every edge of the role state machine (docs/agent.md, "Roles").

use super::*;

const CLUSTER: &str = "db";

/// `db-1`'s view: `db-0` is the primary, nothing under way, the engine stopped on empty data.
fn obs() -> Observation {
    Observation {
        me: "db-1".into(),
        current: Some("db-0".into()),
        target: None,
        failed: None,
        epoch: 0,
        initialized: true,
        recovery: false,
        high_availability: true,
        replicas: 3,
        engine: EngineState::Stopped,
        data: DataState::Empty,
        lock_lost: None,
        acknowledged: false,
        acknowledgement_held: false,
        not_a_candidate: None,
        handover: Handover::None,
        rejoin_failed: false,
        wal_gone: None,
        upgrade_step: None,
    }
}

fn named(o: Observation) -> Observation {
    Observation {
        current: Some("db-1".into()),
        ..o
    }
}

fn primary_data() -> DataState {
    DataState::Primary { clean_stop: None }
}

fn recovering(streaming: bool, receiver_down: bool) -> EngineState {
    EngineState::Recovering {
        streaming,
        receiver_down,
    }
}

fn failing_over(o: Observation) -> Observation {
    Observation {
        failed: Some("db-0".into()),
        epoch: 2,
        engine: recovering(false, false),
        ..o
    }
}

fn promotes(t: Transition) {
    assert_eq!(t.role, Role::Primary);
    assert_eq!(t.steps, [Step::TakeLock, Step::Promote, Step::Promoted]);
    // Not confirmed (the lock is another's, or pg_promote gave up): Promoting, and the next
    // observation tells.
    assert_eq!(
        t.if_refused.map(|t| (t.role, t.steps)),
        Some((Role::Promoting, vec![]))
    );
}

fn next(role: Role, o: &Observation) -> (Role, Vec<Step>) {
    let t = transition(&role, o, CLUSTER);
    (t.role, t.steps)
}

fn fence_reason(steps: &[Step]) -> String {
    match steps {
        [Step::Fence(why)] => why.clone(),
        other => panic!("expected a fence, got {other:?}"),
    }
}

// --- Before the engine runs ------------------------------------------------------------

#[test]
fn bootstrapping_waits_for_the_cluster_to_name_a_primary() {
    let o = Observation {
        current: None,
        ..obs()
    };
    let (role, steps) = next(Role::Bootstrapping, &o);
    assert_eq!(role, Role::Bootstrapping);
    assert_eq!(
        steps,
        [Step::Wait("waiting for status.currentPrimary".into())]
    );
}

#[test]
fn the_named_primary_initialises_empty_data_only_under_the_lock_and_only_once() {
    let fresh = Observation {
        initialized: false,
        ..named(obs())
    };
    assert_eq!(
        next(Role::Bootstrapping, &fresh),
        (
            Role::Primary,
            vec![Step::TakeLock, Step::Bootstrap, Step::StartPrimary]
        )
    );
    // The cluster ran before: an empty volume never replaces its data.
    let (role, steps) = next(Role::Bootstrapping, &named(obs()));
    assert_eq!(role, Role::Bootstrapping);
    assert!(
        matches!(&steps[..], [Step::Wait(why)] if why.contains("refusing to initialise")),
        "{steps:?}"
    );
}

#[test]
fn a_restored_clusters_first_primary_restores_before_taking_the_lock() {
    let o = Observation {
        initialized: false,
        recovery: true,
        ..named(obs())
    };
    assert_eq!(
        next(Role::Bootstrapping, &o),
        (Role::Bootstrapping, vec![Step::Restore])
    );
}

#[test]
fn the_named_primary_restarts_on_its_data_under_the_lock() {
    let o = Observation {
        data: primary_data(),
        ..named(obs())
    };
    assert_eq!(
        next(Role::Bootstrapping, &o),
        (Role::Primary, vec![Step::TakeLock, Step::StartPrimary])
    );
    // A fenced primary whose cluster still names it (no failover): the same, lock first.
    assert_eq!(
        next(Role::Fenced, &o),
        (Role::Primary, vec![Step::TakeLock, Step::StartPrimary])
    );
}

#[test]
fn the_named_primary_on_a_standbys_data_starts_as_a_standby_to_promote() {
    let o = Observation {
        data: DataState::Standby,
        ..named(obs())
    };
    assert_eq!(
        next(Role::Bootstrapping, &o),
        (Role::Replica, vec![Step::StartReplica])
    );
}

#[test]
fn a_primary_failed_over_away_from_does_not_start() {
    let o = Observation {
        data: primary_data(),
        failed: Some("db-1".into()),
        epoch: 3,
        ..named(obs())
    };
    let (role, steps) = next(Role::Fenced, &o);
    assert_eq!(role, Role::Fenced);
    assert!(
        matches!(&steps[..], [Step::Wait(why)] if why.contains("epoch 3") && why.contains("not starting")),
        "{steps:?}"
    );
}

#[test]
fn a_failed_primary_on_a_standbys_data_does_not_take_part_in_its_own_failover() {
    let o = Observation {
        data: DataState::Standby,
        failed: Some("db-1".into()),
        epoch: 3,
        ..named(obs())
    };
    let (role, steps) = next(Role::Bootstrapping, &o);
    assert_eq!(role, Role::Fenced);
    assert!(matches!(&steps[..], [Step::Wait(_)]), "{steps:?}");
}

#[test]
fn a_primary_stopped_cleanly_for_a_switchover_hands_over_and_stays_down() {
    let o = Observation {
        target: Some("db-2".into()),
        data: DataState::Primary {
            clean_stop: Some(Ok("0/3000060".into())),
        },
        ..named(obs())
    };
    assert_eq!(
        next(
            Role::HandingOver {
                target: "db-2".into()
            },
            &o
        ),
        (
            Role::HandingOver {
                target: "db-2".into()
            },
            vec![Step::Wait("stopped for a switchover to db-2".into())]
        )
    );
    // Not stopped cleanly (a crash): run as the primary so the switchover stops it cleanly.
    let crashed = Observation {
        data: primary_data(),
        ..o.clone()
    };
    assert_eq!(
        next(Role::Bootstrapping, &crashed),
        (Role::Primary, vec![Step::TakeLock, Step::StartPrimary])
    );
    // The control file cannot be read: wait, role unchanged.
    let unreadable = Observation {
        data: DataState::Primary {
            clean_stop: Some(Err("no pg_controldata".into())),
        },
        ..o
    };
    let (role, steps) = next(Role::Bootstrapping, &unreadable);
    assert_eq!(role, Role::Bootstrapping);
    assert!(matches!(&steps[..], [Step::Wait(why)] if why.contains("no pg_controldata")));
}

#[test]
fn a_switchover_target_restarted_after_its_promotion_runs_as_the_primary() {
    let o = Observation {
        target: Some("db-1".into()),
        data: primary_data(),
        ..obs()
    };
    assert_eq!(
        next(Role::Bootstrapping, &o),
        (Role::Primary, vec![Step::TakeLock, Step::StartPrimary])
    );
}

#[test]
fn a_former_primary_rewinds_and_rejoins_as_a_standby() {
    let o = Observation {
        data: primary_data(),
        ..obs()
    };
    for from in [
        Role::Fenced,
        Role::HandingOver {
            target: "db-0".into(),
        },
        Role::Bootstrapping,
    ] {
        assert_eq!(
            next(from, &o),
            (
                Role::Rejoining,
                vec![Step::Rewind("db-0".into()), Step::StartReplica]
            )
        );
    }
}

#[test]
fn a_standby_resumes_as_a_replica_or_a_candidate_during_a_failover() {
    let o = Observation {
        data: DataState::Standby,
        ..obs()
    };
    assert_eq!(
        next(Role::Bootstrapping, &o),
        (Role::Replica, vec![Step::StartReplica])
    );
    let during = Observation {
        failed: Some("db-0".into()),
        epoch: 4,
        ..o.clone()
    };
    assert_eq!(
        next(Role::Bootstrapping, &during),
        (Role::Candidate { epoch: 4 }, vec![Step::StartReplica])
    );
    // Rejoining and re-cloning last until it streams.
    assert_eq!(next(Role::Rejoining, &o).0, Role::Rejoining);
    assert_eq!(next(Role::Recloning, &o).0, Role::Recloning);
}

#[test]
fn empty_data_clones_the_primary() {
    assert_eq!(
        next(Role::Bootstrapping, &obs()),
        (
            Role::Replica,
            vec![Step::Clone("db-0".into()), Step::StartReplica]
        )
    );
    assert_eq!(
        next(Role::Recloning, &obs()),
        (
            Role::Recloning,
            vec![Step::Clone("db-0".into()), Step::StartReplica]
        )
    );
}

// --- The primary -------------------------------------------------------------------------

fn running_primary() -> Observation {
    Observation {
        engine: EngineState::AcceptsWrites,
        data: primary_data(),
        ..named(obs())
    }
}

#[test]
fn a_primary_stays_while_it_is_named_and_holds_the_lock() {
    assert_eq!(
        next(Role::Primary, &running_primary()),
        (Role::Primary, vec![])
    );
    // A restored primary still replaying its archive: the same.
    let replaying = Observation {
        engine: recovering(false, true),
        ..running_primary()
    };
    assert_eq!(next(Role::Primary, &replaying), (Role::Primary, vec![]));
}

#[test]
fn a_primary_that_lost_its_lock_is_fenced() {
    let o = Observation {
        lock_lost: Some("the primary lock is held by db-2".into()),
        ..running_primary()
    };
    let (role, steps) = next(Role::Primary, &o);
    assert_eq!(role, Role::Fenced);
    assert_eq!(fence_reason(&steps), "the primary lock is held by db-2");
    assert_eq!(lock_lost("lapsed".into()).role, Role::Fenced);
}

#[test]
fn a_primary_failed_over_away_from_is_fenced() {
    let o = Observation {
        failed: Some("db-1".into()),
        epoch: 5,
        ..running_primary()
    };
    let (role, steps) = next(Role::Primary, &o);
    assert_eq!(role, Role::Fenced);
    assert!(fence_reason(&steps).contains("epoch 5"));
}

#[test]
fn a_primary_no_longer_named_is_fenced_unless_it_is_the_target() {
    let o = Observation {
        current: Some("db-2".into()),
        ..running_primary()
    };
    let (role, steps) = next(Role::Primary, &o);
    assert_eq!(role, Role::Fenced);
    assert_eq!(fence_reason(&steps), "status.currentPrimary names db-2");
    // Promoted by a switchover or failover, not named yet: stays the primary.
    let promoted = Observation {
        current: Some("db-0".into()),
        target: Some("db-1".into()),
        ..running_primary()
    };
    assert_eq!(next(Role::Primary, &promoted), (Role::Primary, vec![]));
}

#[test]
fn a_primary_asked_to_switch_over_hands_over() {
    let o = Observation {
        target: Some("db-2".into()),
        ..running_primary()
    };
    assert_eq!(
        next(Role::Primary, &o),
        (
            Role::HandingOver {
                target: "db-2".into()
            },
            vec![Step::HandOver("db-2".into())]
        )
    );
}

#[test]
fn a_stopping_primary_is_left_to_stop() {
    for role in [
        Role::Fenced,
        Role::HandingOver {
            target: "db-2".into(),
        },
    ] {
        assert_eq!(next(role.clone(), &running_primary()), (role, vec![]));
    }
}

// --- A replica -----------------------------------------------------------------------------

fn running_replica() -> Observation {
    Observation {
        engine: recovering(true, false),
        data: DataState::Standby,
        ..obs()
    }
}

#[test]
fn a_streaming_replica_stays_a_replica() {
    assert_eq!(
        next(Role::Replica, &running_replica()),
        (Role::Replica, vec![])
    );
}

#[test]
fn a_replica_whose_wal_is_gone_re_clones() {
    let o = Observation {
        engine: recovering(false, false),
        wal_gone: Some("requested WAL segment has already been removed".into()),
        ..running_replica()
    };
    assert_eq!(
        next(Role::Replica, &o),
        (
            Role::Recloning,
            vec![Step::CloneAfresh(
                "requested WAL segment has already been removed".into()
            )]
        )
    );
}

#[test]
fn a_failover_makes_a_replica_a_candidate_that_acknowledges_once_its_receiver_is_down() {
    let o = failing_over(running_replica());
    // Entering: the shell stops streaming.
    assert_eq!(
        next(Role::Replica, &o),
        (Role::Candidate { epoch: 2 }, vec![])
    );
    let candidate = Role::Candidate { epoch: 2 };
    // The receiver still runs: wait.
    let (role, steps) = next(candidate.clone(), &o);
    assert_eq!(role, candidate);
    assert!(matches!(&steps[..], [Step::Wait(_)]));
    // Down: the final position is reported.
    let down = Observation {
        engine: recovering(false, true),
        ..o.clone()
    };
    assert_eq!(
        next(candidate.clone(), &down),
        (candidate.clone(), vec![Step::Acknowledge(2)])
    );
    // A test hook holds it back.
    let held = Observation {
        acknowledgement_held: true,
        ..down.clone()
    };
    assert!(
        matches!(&next(candidate.clone(), &held).1[..], [Step::Wait(why)] if why.contains("test hook"))
    );
    // Data that may hold another history (MariaDB, not yet following): never acknowledged.
    let unchecked = Observation {
        not_a_candidate: Some("a former primary not yet checked".into()),
        ..down.clone()
    };
    assert!(
        matches!(&next(candidate.clone(), &unchecked).1[..], [Step::Wait(why)] if why.contains("not acknowledging"))
    );
    // Acknowledged, another is elected: a candidate still.
    let acked = Observation {
        acknowledged: true,
        target: Some("db-2".into()),
        ..down.clone()
    };
    assert_eq!(next(candidate.clone(), &acked), (candidate.clone(), vec![]));
    // A new epoch (the first target failed): a candidate of that epoch, acknowledging anew.
    let later = Observation { epoch: 3, ..down };
    assert_eq!(
        next(candidate, &later),
        (Role::Candidate { epoch: 3 }, vec![])
    );
}

#[test]
fn an_elected_candidate_promotes_under_the_lock() {
    let o = Observation {
        engine: recovering(false, true),
        acknowledged: true,
        target: Some("db-1".into()),
        ..failing_over(running_replica())
    };
    promotes(transition(&Role::Candidate { epoch: 2 }, &o, CLUSTER));
    // Never before acknowledging: its position must be in the election.
    let unacked = Observation {
        acknowledged: false,
        ..o.clone()
    };
    assert_eq!(
        next(Role::Candidate { epoch: 2 }, &unacked),
        (Role::Candidate { epoch: 2 }, vec![Step::Acknowledge(2)])
    );
    // Still in recovery after a promotion that was not confirmed: again.
    promotes(transition(&Role::Promoting, &o, CLUSTER));
    // No longer elected (the operator moved on): back to a candidate.
    let moved_on = Observation {
        target: Some("db-2".into()),
        ..o
    };
    assert_eq!(
        next(Role::Promoting, &moved_on),
        (Role::Candidate { epoch: 2 }, vec![])
    );
}

#[test]
fn a_failover_that_ends_elsewhere_makes_a_candidate_a_replica_again() {
    assert_eq!(
        next(Role::Candidate { epoch: 2 }, &running_replica()),
        (Role::Replica, vec![])
    );
    assert_eq!(
        next(Role::Promoting, &running_replica()),
        (Role::Replica, vec![])
    );
}

#[test]
fn a_switchover_target_promotes_only_once_it_replayed_the_old_primarys_last_wal() {
    let waiting = Observation {
        target: Some("db-1".into()),
        handover: Handover::Waiting("waiting for db-0 to stop and report finalLSN".into()),
        ..running_replica()
    };
    assert_eq!(
        next(Role::Replica, &waiting),
        (
            Role::Replica,
            vec![Step::Wait(
                "switchover to this pod: waiting for db-0 to stop and report finalLSN".into()
            )]
        )
    );
    let caught_up = Observation {
        handover: Handover::CaughtUp,
        ..waiting
    };
    promotes(transition(&Role::Replica, &caught_up, CLUSTER));
}

#[test]
fn a_replica_named_the_primary_promotes_only_once_elected() {
    // currentPrimary alone (a cluster recreated on kept volumes names its first pod,
    // whatever its data): never.
    let o = named(running_replica());
    let (role, steps) = next(Role::Replica, &o);
    assert_eq!(role, Role::Replica);
    assert!(
        matches!(&steps[..], [Step::Wait(why)] if why.contains("targetPrimary")),
        "{steps:?}"
    );
    // Elected as well: under the lock.
    let elected = Observation {
        target: Some("db-1".into()),
        ..o
    };
    promotes(transition(&Role::Replica, &elected, CLUSTER));
}

#[test]
fn an_engine_out_of_recovery_runs_as_the_primary_only_when_named_and_locked() {
    let promoted = Observation {
        engine: EngineState::AcceptsWrites,
        target: Some("db-1".into()),
        ..running_replica()
    };
    let t = transition(&Role::Promoting, &promoted, CLUSTER);
    assert_eq!(
        (t.role.clone(), t.steps.clone()),
        (Role::Primary, vec![Step::TakeLock, Step::Promoted])
    );
    // Without the lock it is fenced at once.
    let refused = t.if_refused.expect("a fallback");
    assert_eq!(refused.role, Role::Fenced);
    assert!(fence_reason(&refused.steps).contains("lock"));
    // A promotion that completed after its call gave up: the same from a candidate.
    assert_eq!(
        next(Role::Candidate { epoch: 0 }, &promoted).0,
        Role::Primary
    );
    // Not named (or failed over away from): stopped at once.
    let stray = Observation {
        engine: EngineState::AcceptsWrites,
        ..running_replica()
    };
    for role in [
        Role::Replica,
        Role::Rejoining,
        Role::Recloning,
        Role::Promoting,
    ] {
        let (to, steps) = next(role, &stray);
        assert_eq!(to, Role::Fenced);
        assert!(fence_reason(&steps).contains("accepts writes"));
    }
    let away = Observation {
        failed: Some("db-1".into()),
        ..promoted
    };
    assert_eq!(next(Role::Promoting, &away).0, Role::Fenced);
}

#[test]
fn a_rejoining_former_primary_is_announced_once_it_streams_or_re_clones() {
    let streaming = running_replica();
    assert_eq!(
        next(Role::Rejoining, &streaming),
        (Role::Replica, vec![Step::Announce])
    );
    assert_eq!(
        next(Role::Recloning, &streaming),
        (Role::Replica, vec![Step::Announce])
    );
    let stuck = Observation {
        engine: recovering(false, false),
        ..running_replica()
    };
    assert_eq!(next(Role::Rejoining, &stuck), (Role::Rejoining, vec![]));
    let expired = Observation {
        rejoin_failed: true,
        ..stuck
    };
    assert_eq!(
        next(Role::Rejoining, &expired),
        (Role::Recloning, vec![Step::MoveAside])
    );
    // An engine that exits twice while rejoining: the same.
    assert_eq!(
        after_crash(&Role::Rejoining, 2).map(|t| (t.role, t.steps)),
        Some((Role::Recloning, vec![Step::MoveAside]))
    );
    assert_eq!(after_crash(&Role::Rejoining, 1), None);
    // A failover meanwhile: it acknowledges like any standby, and stays what it was (its
    // announcement and deadline still apply afterwards).
    let failover = Observation {
        engine: recovering(false, true),
        ..failing_over(stuck_for_failover())
    };
    for role in [Role::Rejoining, Role::Recloning] {
        assert_eq!(
            next(role.clone(), &failover),
            (role.clone(), vec![Step::Acknowledge(2)])
        );
        let elected = Observation {
            acknowledged: true,
            target: Some("db-1".into()),
            ..failover.clone()
        };
        promotes(transition(&role, &elected, CLUSTER));
    }
    assert_eq!(after_crash(&Role::Replica, 3), None);
}

fn stuck_for_failover() -> Observation {
    Observation {
        engine: recovering(false, false),
        ..running_replica()
    }
}

#[test]
fn only_the_failed_primary_is_told_to_step_down() {
    let o = Observation {
        failed: Some("db-0".into()),
        epoch: 2,
        me: "db-0".into(),
        ..obs()
    };
    assert!(failover_away(&o).is_some_and(|m| m.contains("epoch 2")));
    assert_eq!(
        failover_away(&Observation {
            me: "db-1".into(),
            ..o
        }),
        None
    );
    assert_eq!(failover_away(&obs()), None);
}

#[test]
fn data_of_an_older_major_is_never_started_and_a_replica_clones_the_upgraded_primary() {
    let older = DataState::OlderMajor {
        data: 15,
        binaries: 17,
    };
    // The primary waits for the upgrade step (its init container): nothing starts 15's data
    // on 17's binaries, nothing removes it.
    let t = transition(
        &Role::Bootstrapping,
        &named(Observation {
            data: older.clone(),
            upgrade_step: Some("Upgrading".into()),
            ..obs()
        }),
        CLUSTER,
    );
    assert_eq!(t.role, Role::Bootstrapping);
    assert!(
        matches!(&t.steps[..], [Step::Wait(why)] if why.contains("major upgrade step")),
        "{t:?}"
    );
    // A replica waits while the primary is upgraded …
    let upgrading = Observation {
        data: older.clone(),
        upgrade_step: Some("Upgrading".into()),
        ..obs()
    };
    let t = transition(&Role::Bootstrapping, &upgrading, CLUSTER);
    assert!(matches!(&t.steps[..], [Step::Wait(_)]), "{t:?}");
    // … and without an upgrade under way (a failed one, back on the old template: its pod
    // runs the old binaries and never sees this state).
    let t = transition(
        &Role::Bootstrapping,
        &Observation {
            upgrade_step: None,
            ..upgrading.clone()
        },
        CLUSTER,
    );
    assert!(matches!(&t.steps[..], [Step::Wait(_)]), "{t:?}");
    // Once the primary runs the new major, it empties its data and clones it.
    let t = transition(
        &Role::Bootstrapping,
        &Observation {
            upgrade_step: Some("Recloning".into()),
            ..upgrading
        },
        CLUSTER,
    );
    assert_eq!(t.role, Role::Recloning);
    assert_eq!(
        t.steps,
        [
            Step::EmptyOlderMajor,
            Step::Clone("db-0".into()),
            Step::StartReplica
        ]
    );
}
