//! The instance's role as one state machine (docs/agent.md, "Roles"): a pure transition
//! function from the role and what the agent observes to the next role and the steps that
//! get it there. The shell (the rest of this module) observes — the DatabaseCluster's status,
//! the data directory, the engine, the primary lock — and executes the steps in order; a
//! step that fails ends the list and the role stays what it was, so every transition either
//! happens whole or is tried again on the next observation.
//!
//! The invariant every transition keeps: **an engine accepts writes only while its agent
//! holds the primary lock and is not past its lapse margin** (without high availability there
//! is no lock, and the operator's `currentPrimary`/`targetPrimary` decide alone).

/// Where the instance is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// No engine runs yet: waiting for `status.currentPrimary`, then initdb, a restore, a
    /// clone, or a restart on the data there is.
    Bootstrapping,
    /// The engine replays the primary's WAL (streaming, or trying to).
    Replica,
    /// A failover is under way (`status.failedPrimary`): streaming stopped so the position is
    /// final; reported for the epoch once the WAL receiver is down, then waiting to be elected.
    Candidate { epoch: i64 },
    /// Elected, a switchover's target that replayed the old primary's last WAL, or named the
    /// primary on a standby's data: taking the lock and promoting.
    Promoting,
    /// The engine accepts writes; under high availability the agent holds the lock.
    Primary,
    /// A switchover away from this primary: checkpoint, clean shutdown (the standbys receive
    /// everything), `finalLSN` reported; never restarted as the primary while it lasts.
    HandingOver { target: String },
    /// This primary must not write: its lock lapsed or is another's, a failover away from it
    /// is under way, or another pod is named the primary. The engine is stopped at once.
    Fenced,
    /// A former primary rewound to the new primary's history, restarted as its standby,
    /// until it streams.
    Rejoining,
    /// The data could not follow the primary (a rewind that failed or never streamed, WAL
    /// the primary and the archive no longer have): cloning the primary afresh, until it
    /// streams.
    Recloning,
}

/// The engine as the last probe saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineState {
    /// Not running (before the first start, or stopped for a role change).
    Stopped,
    /// In recovery. `streaming`: its WAL receiver streams; `receiver_down`: none runs.
    Recovering {
        streaming: bool,
        receiver_down: bool,
    },
    /// Out of recovery: it accepts writes.
    AcceptsWrites,
}

/// The data directory while the engine is stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataState {
    Empty,
    /// A standby's (`standby.signal`).
    Standby,
    /// A primary's. `clean_stop`: the shutdown checkpoint when it was stopped cleanly (read
    /// from the control file when a switchover away from it is pending), or why that could
    /// not be read.
    Primary {
        clean_stop: Option<Result<String, String>>,
    },
    /// An older major's (`data`) than the binaries run (`binaries`): a major upgrade is under
    /// way (docs/major-upgrade.md).
    OlderMajor {
        data: u32,
        binaries: u32,
    },
}

/// A switchover target's view of the old primary (read only while this pod is the target).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Not this pod's switchover.
    None,
    /// Why it does not promote yet (the old primary runs, or its last WAL is not replayed).
    Waiting(String),
    /// The old primary stopped, reported `finalLSN`, and this standby replayed past it.
    CaughtUp,
}

/// What the agent observes for one decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub me: String,
    /// `status.currentPrimary`, `targetPrimary`, `failedPrimary`, `failoverEpoch`.
    pub current: Option<String>,
    pub target: Option<String>,
    pub failed: Option<String>,
    pub epoch: i64,
    /// `status.currentVersion` is set: the cluster has been ready, so its primary has data an
    /// empty volume must never replace.
    pub initialized: bool,
    /// `DEVCTL_BOOTSTRAP=recovery`: the first primary restores a backup instead of initdb.
    pub recovery: bool,
    /// Which way `spec.highAvailability` goes: with it a lost primary is failed over.
    pub high_availability: bool,
    pub replicas: i32,
    pub engine: EngineState,
    pub data: DataState,
    /// The primary lock lapsed, is another's, or its renewal missed the deadline.
    pub lock_lost: Option<String>,
    /// This replica's report acknowledges `epoch`.
    pub acknowledged: bool,
    /// A test hook holds the acknowledgement back ([`crate::test_hooks`]).
    pub acknowledgement_held: bool,
    /// Why this standby's position must not count in an election: MariaDB data not yet
    /// following the primary (a former primary not checked for errant transactions, a
    /// clone that has not replicated) may hold another history than the primary's.
    pub not_a_candidate: Option<String>,
    pub handover: Handover,
    /// A rejoining former primary did not stream in time, or its engine exited twice.
    pub rejoin_failed: bool,
    /// Why this replica cannot resume: the WAL it needs is gone from its primary and the
    /// archive.
    pub wal_gone: Option<String>,
    /// `status.majorUpgrade.step` while a major upgrade is under way.
    pub upgrade_step: Option<String>,
}

/// One thing the shell does; the steps of a transition run in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do but report this and look again.
    Wait(String),
    /// Take (or renew) the primary lock; without high availability there is none to take.
    TakeLock,
    /// initdb into the empty data directory.
    Bootstrap,
    /// Restore the backup the pod's annotation names into the empty data directory.
    Restore,
    /// `pg_basebackup` of this primary into the empty data directory.
    Clone(String),
    /// `pg_rewind` to this primary's history.
    Rewind(String),
    StartPrimary,
    StartReplica,
    /// Report the final position for this epoch (`failoverEpoch` in the report).
    Acknowledge(i64),
    /// Take the engine out of recovery.
    Promote,
    /// The engine accepts writes: renew the lock, checkpoint in the background, and run as
    /// the primary.
    Promoted,
    /// Stop the engine at once (fast shutdown, SIGKILL within the lapse budget).
    Fence(String),
    /// Checkpoint, clean shutdown, release the lock, report `finalLSN`.
    HandOver(String),
    /// Stop the engine, move a former primary's data aside (kept for the administrator).
    MoveAside,
    /// Stop the engine and empty a replica's data directory (the primary has all of it).
    CloneAfresh(String),
    /// Empty the data directory of an older major (a replica after a major upgrade: the
    /// primary runs the new one and has all of it).
    EmptyOlderMajor,
    /// Publish `Rejoined` (a former primary) or `Recloned` (a replica) on the cluster.
    Announce,
}

/// The next role and the steps that lead there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub role: Role,
    pub steps: Vec<Step>,
    /// The transition to make instead when a step cannot complete (otherwise the role
    /// stays and the steps are tried again on the next observation).
    pub if_refused: Option<Box<Transition>>,
}

fn to(role: Role, steps: Vec<Step>) -> Transition {
    Transition {
        role,
        steps,
        if_refused: None,
    }
}

fn stay(role: &Role) -> Transition {
    to(role.clone(), Vec::new())
}

fn wait(role: Role, why: impl Into<String>) -> Transition {
    to(role, vec![Step::Wait(why.into())])
}

/// Take the lock, promote, run as the primary. Should the promotion not be confirmed (its
/// call gave up; the engine may still leave recovery) the instance is `Promoting`: the next
/// observation says whether the engine accepts writes.
fn promote() -> Transition {
    Transition {
        if_refused: Some(Box::new(to(Role::Promoting, Vec::new()))),
        ..to(
            Role::Primary,
            vec![Step::TakeLock, Step::Promote, Step::Promoted],
        )
    }
}

/// Why this instance must not be (or stay) the primary: the operator declared a failover
/// away from it.
pub fn failover_away(obs: &Observation) -> Option<String> {
    (obs.failed.as_deref() == Some(obs.me.as_str())).then(|| {
        format!(
            "a failover away from this instance is under way (epoch {})",
            obs.epoch
        )
    })
}

/// Why the primary with an empty data directory does not initialise one, and what moves on:
/// with high availability a failover to a replica (which this pod then clones); without it
/// nothing fails over, so a restore (the replicas keep the data, but no step promotes them).
pub fn lost_primary_data(
    cluster: &str,
    pod: &str,
    replicas: i32,
    high_availability: bool,
) -> String {
    let next = if replicas > 1 && high_availability {
        format!(
            "a replica takes over by failover once the primary lock expires (with autoFailover off: `devctl db promote {cluster} <replica>`); this pod then clones it"
        )
    } else if replicas > 1 {
        format!(
            "without spec.highAvailability nothing fails over on its own: promote a replica with `devctl db promote {cluster} <replica> --force` (what this primary had not sent to it is lost); this pod then clones it"
        )
    } else {
        format!(
            "restore a backup into a new cluster (`devctl db restore NEW --from BACKUP`), or delete {cluster}"
        )
    };
    format!(
        "the data of the primary {pod} is gone (its volume is new) but the cluster has run before: refusing to initialise an empty database in its place; {next}"
    )
}

/// The transition from `role` on `obs`.
pub fn transition(role: &Role, obs: &Observation, cluster: &str) -> Transition {
    match obs.engine {
        EngineState::Stopped => before_start(role, obs, cluster),
        // A primary still replaying a restored archive is fenced like any other.
        _ if *role == Role::Primary => as_primary(role, obs),
        EngineState::AcceptsWrites => accepting_writes(role, obs),
        EngineState::Recovering { .. } => in_recovery(role, obs),
    }
}

/// The transition of a primary whose lock was lost (detected by the lock's own timer).
pub fn lock_lost(why: String) -> Transition {
    to(Role::Fenced, vec![Step::Fence(why)])
}

/// The transition after the engine exited on its own `failures` times in a row, if the
/// role has one: a rejoining former primary that cannot run as a standby is re-cloned.
pub fn after_crash(role: &Role, failures: u32) -> Option<Transition> {
    (*role == Role::Rejoining && failures >= 2).then(|| to(Role::Recloning, vec![Step::MoveAside]))
}

/// The primary: fenced when its lock is lost, a failover away from it is under way, or
/// another pod is named; handed over in a switchover.
fn as_primary(role: &Role, obs: &Observation) -> Transition {
    let me = obs.me.as_str();
    if let Some(why) = &obs.lock_lost {
        return lock_lost(why.clone());
    }
    if let Some(why) = failover_away(obs) {
        return to(Role::Fenced, vec![Step::Fence(why)]);
    }
    match obs.current.as_deref() {
        Some(c) if c == me => match obs.target.as_deref().filter(|t| *t != me) {
            Some(t) => to(
                Role::HandingOver {
                    target: t.to_string(),
                },
                vec![Step::HandOver(t.to_string())],
            ),
            None => stay(role),
        },
        // Promoted (targetPrimary names this pod): the primary until the operator names
        // it. Otherwise another pod is the primary: stop, and rejoin.
        Some(other) if obs.target.as_deref() != Some(me) => to(
            Role::Fenced,
            vec![Step::Fence(format!("status.currentPrimary names {other}"))],
        ),
        _ => stay(role),
    }
}

/// No engine runs, and the data is an older major's than the binaries (a major upgrade): the
/// primary waits for the upgrade step, which runs before the agent (nothing here starts the
/// old data on the new binaries, nor removes the primary's); a replica empties its data and
/// clones the primary once that runs the new major (`Recloning`).
fn older_major(obs: &Observation, current: &str, data: u32, binaries: u32) -> Transition {
    let me = obs.me.as_str();
    let step = obs.upgrade_step.as_deref();
    if current == me {
        return wait(
            Role::Bootstrapping,
            format!(
                "the data directory is PostgreSQL {data}'s and these binaries run {binaries}: the major upgrade step did not upgrade it (status.majorUpgrade); not starting"
            ),
        );
    }
    match step {
        Some("Recloning") => to(
            Role::Recloning,
            vec![
                Step::EmptyOlderMajor,
                Step::Clone(current.to_string()),
                Step::StartReplica,
            ],
        ),
        _ => wait(
            Role::Bootstrapping,
            format!(
                "the data directory is PostgreSQL {data}'s and these binaries run {binaries}: cloned again once the primary runs {binaries} (status.majorUpgrade)"
            ),
        ),
    }
}

/// No engine runs: how to get data and in which role to start it.
fn before_start(role: &Role, obs: &Observation, cluster: &str) -> Transition {
    let me = obs.me.as_str();
    let Some(current) = obs.current.as_deref() else {
        return wait(role.clone(), "waiting for status.currentPrimary");
    };
    let target = obs.target.as_deref();
    if let DataState::OlderMajor { data, binaries } = obs.data {
        return older_major(obs, current, data, binaries);
    }
    if current == me {
        return match &obs.data {
            DataState::Empty if obs.initialized => wait(
                Role::Bootstrapping,
                lost_primary_data(cluster, me, obs.replicas, obs.high_availability),
            ),
            // Before the lock: no engine runs while the backup downloads.
            DataState::Empty if obs.recovery => to(Role::Bootstrapping, vec![Step::Restore]),
            _ if let Some(why) = failover_away(obs) => {
                wait(Role::Fenced, format!("{why}: not starting as the primary"))
            }
            // Named the primary on a standby's data: start it as a standby; it promotes only
            // once the operator elects it (see `in_recovery`).
            DataState::Standby => to(Role::Replica, vec![Step::StartReplica]),
            DataState::Primary { clean_stop } if let Some(t) = target.filter(|t| *t != me) => {
                match clean_stop {
                    Some(Ok(_)) => wait(
                        Role::HandingOver {
                            target: t.to_string(),
                        },
                        format!("stopped for a switchover to {t}"),
                    ),
                    Some(Err(why)) => wait(
                        role.clone(),
                        format!("reading the control file for the switchover to {t}: {why}"),
                    ),
                    // Not stopped cleanly: run as the primary; the switchover then
                    // checkpoints and stops it cleanly.
                    None => to(Role::Primary, vec![Step::TakeLock, Step::StartPrimary]),
                }
            }
            DataState::Empty => to(
                Role::Primary,
                vec![Step::TakeLock, Step::Bootstrap, Step::StartPrimary],
            ),
            DataState::Primary { .. } => {
                to(Role::Primary, vec![Step::TakeLock, Step::StartPrimary])
            }
            // Decided above (`older_major`).
            DataState::OlderMajor { .. } => stay(role),
        };
    }
    match &obs.data {
        // Promoted in a switchover or failover; the operator has yet to name it.
        DataState::Primary { .. } if target == Some(me) => {
            to(Role::Primary, vec![Step::TakeLock, Step::StartPrimary])
        }
        // A former primary: its history may have forked from the new primary's.
        DataState::Primary { .. } => to(
            Role::Rejoining,
            vec![Step::Rewind(current.to_string()), Step::StartReplica],
        ),
        DataState::Standby => to(standby_role(role, obs), vec![Step::StartReplica]),
        DataState::Empty => to(
            if *role == Role::Recloning {
                Role::Recloning
            } else {
                Role::Replica
            },
            vec![Step::Clone(current.to_string()), Step::StartReplica],
        ),
        // Decided above (`older_major`).
        DataState::OlderMajor { .. } => stay(role),
    }
}

/// The role a standby starts in: a rejoining or re-cloning one stays so until it streams;
/// during a failover it is a candidate.
fn standby_role(role: &Role, obs: &Observation) -> Role {
    match role {
        Role::Rejoining | Role::Recloning => role.clone(),
        _ if obs.failed.is_some() => Role::Candidate { epoch: obs.epoch },
        _ => Role::Replica,
    }
}

/// The engine accepts writes.
fn accepting_writes(role: &Role, obs: &Observation) -> Transition {
    let me = obs.me.as_str();
    match role {
        // Stopping already: the shell is at it.
        Role::HandingOver { .. } | Role::Fenced => stay(role),
        // Out of recovery while not (yet) the primary — a promotion that completed after its
        // call gave up. It runs as the primary only if this pod is the one named and takes
        // the lock; otherwise it is stopped at once and rejoins as a standby.
        _ => {
            let named = failover_away(obs).is_none()
                && (obs.target.as_deref() == Some(me) || obs.current.as_deref() == Some(me));
            if named {
                // The engine already accepts writes: without the lock it is fenced at once.
                Transition {
                    if_refused: Some(Box::new(to(
                        Role::Fenced,
                        vec![Step::Fence(
                            "the engine accepts writes but the primary lock cannot be taken".into(),
                        )],
                    ))),
                    ..to(Role::Primary, vec![Step::TakeLock, Step::Promoted])
                }
            } else {
                to(
                    Role::Fenced,
                    vec![Step::Fence(
                        "the engine accepts writes although this instance runs as a replica".into(),
                    )],
                )
            }
        }
    }
}

/// The engine is in recovery.
fn in_recovery(role: &Role, obs: &Observation) -> Transition {
    let me = obs.me.as_str();
    let EngineState::Recovering {
        streaming,
        receiver_down,
    } = obs.engine
    else {
        return stay(role);
    };
    match role {
        // Stopping already: nothing to decide.
        Role::HandingOver { .. } | Role::Fenced | Role::Primary | Role::Bootstrapping => stay(role),
        // A failover while rejoining or re-cloning: a standby like any other, it takes part
        // (the operator waits for every live replica's acknowledgement).
        Role::Rejoining | Role::Recloning if obs.failed.is_some() => {
            failing_over(role, obs, receiver_down)
        }
        Role::Rejoining | Role::Recloning if streaming => to(Role::Replica, vec![Step::Announce]),
        Role::Rejoining if obs.rejoin_failed => to(Role::Recloning, vec![Step::MoveAside]),
        Role::Rejoining | Role::Recloning => stay(role),
        Role::Replica | Role::Candidate { .. } | Role::Promoting => {
            if obs.failed.is_some() {
                return failing_over(role, obs, receiver_down);
            }
            if let Some(why) = &obs.wal_gone
                && *role == Role::Replica
            {
                return to(Role::Recloning, vec![Step::CloneAfresh(why.clone())]);
            }
            let current = obs.current.as_deref();
            let target = obs.target.as_deref();
            if target == Some(me) && current.is_some_and(|c| c != me) {
                // A switchover to this pod.
                return match &obs.handover {
                    Handover::CaughtUp => promote(),
                    Handover::Waiting(why) => {
                        wait(Role::Replica, format!("switchover to this pod: {why}"))
                    }
                    Handover::None => stay(&Role::Replica),
                };
            }
            if current == Some(me) {
                // Named the primary on a standby's data. Only the operator's election (or a
                // switchover) says it is the most advanced: it promotes when targetPrimary
                // names it too, never on currentPrimary alone (a cluster recreated on kept
                // volumes names its first pod, whatever its data).
                return if target == Some(me) {
                    promote()
                } else {
                    wait(
                        Role::Replica,
                        "status.currentPrimary names this pod but its data is a standby's: it promotes only once the operator elects it (status.targetPrimary)",
                    )
                };
            }
            // Back from a failover or switchover that went elsewhere.
            stay(&Role::Replica)
        }
    }
}

/// A failover is under way and this instance is a standby.
fn failing_over(role: &Role, obs: &Observation, receiver_down: bool) -> Transition {
    let epoch = obs.epoch;
    let me = obs.me.as_str();
    // A rejoining or re-cloning standby stays so (it still owes its announcement, and its
    // deadline applies once the failover is over), acknowledging like a candidate.
    let candidate = match role {
        Role::Rejoining | Role::Recloning => role.clone(),
        _ => Role::Candidate { epoch },
    };
    if *role != candidate && *role != Role::Promoting {
        // Streaming stops (the position becomes final) as the role is entered.
        return stay(&candidate);
    }
    if !obs.acknowledged {
        return if let Some(why) = &obs.not_a_candidate {
            // Neither counted nor elected: the operator waits for the others (or a human).
            wait(
                candidate,
                format!("failover (epoch {epoch}): not acknowledging: {why}"),
            )
        } else if !receiver_down {
            wait(
                candidate,
                format!("failover (epoch {epoch}): stopping streaming"),
            )
        } else if obs.acknowledgement_held {
            wait(
                candidate,
                "test hook: holding the failover acknowledgement back",
            )
        } else {
            to(candidate, vec![Step::Acknowledge(epoch)])
        };
    }
    if obs.target.as_deref() == Some(me) {
        return promote();
    }
    stay(&candidate)
}

#[cfg(test)]
#[path = "role_tests.rs"]
mod tests;
