//! The episodes of a campaign, made from a seed (pure): `--seed N` makes the same faults in
//! the same order with the same timing, so a failing run can be replayed.

use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// A fault the campaign can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL of an instance's engine (its agent stays).
    KillEngine,
    /// SIGKILL of an instance's agent.
    KillAgent,
    /// Every process of the pod killed and held down (`kill_and_hold`) for the fault's length.
    KillPod,
    /// SIGSTOP of the pod's processes, SIGCONT after the fault's length.
    Freeze,
    /// The instance cut from the API server for the fault's length.
    Partition,
    /// The pod deleted (its StatefulSet makes it again).
    DeletePod,
    /// The operator SIGKILLed and started again after the fault's length.
    KillOperator,
    /// The API server restarted.
    RestartApiServer,
    /// The object store down for the fault's length.
    StoreDown,
    /// A switchover (`devctl db promote`) to a replica.
    Switchover,
    /// A rolling minor update (a new pod template).
    RollingUpdate,
    /// Scale 3 → 5 → 3.
    Scale,
}

impl FaultKind {
    pub const ALL: [Self; 12] = [
        Self::KillEngine,
        Self::KillAgent,
        Self::KillPod,
        Self::Freeze,
        Self::Partition,
        Self::DeletePod,
        Self::KillOperator,
        Self::RestartApiServer,
        Self::StoreDown,
        Self::Switchover,
        Self::RollingUpdate,
        Self::Scale,
    ];

    /// The kind named `name` (as `Debug` prints it, e.g. `KillPod`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| format!("{k:?}") == name)
    }

    /// Whether the fault targets one instance (the primary or a replica).
    pub fn targets_an_instance(self) -> bool {
        matches!(
            self,
            Self::KillEngine
                | Self::KillAgent
                | Self::KillPod
                | Self::Freeze
                | Self::Partition
                | Self::DeletePod
        )
    }

    /// Whether the fault lasts (has a length) rather than happening at an instant.
    pub fn lasts(self) -> bool {
        matches!(
            self,
            Self::KillPod | Self::Freeze | Self::Partition | Self::KillOperator | Self::StoreDown
        )
    }
}

/// Which instance a fault hits, resolved when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Primary,
    Replica,
    /// The fault is not aimed at an instance.
    Cluster,
}

/// One fault of an episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub target: Target,
    /// From the episode's start.
    pub start: Duration,
    /// How long it lasts (zero for a fault that happens at an instant).
    pub length: Duration,
}

/// One fault, or two that overlap; between episodes the runner waits for the cluster to be
/// Ready or for the recovery bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Episode {
    pub faults: Vec<Fault>,
}

/// What a campaign may do.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The fault kinds to draw from.
    pub kinds: Vec<FaultKind>,
    /// In an episode of two faults, the second starts within this of the first.
    pub overlap_within: Duration,
    /// Lasting faults last between these.
    pub shortest: Duration,
    pub longest: Duration,
    /// One episode in this many has two faults.
    pub pair_one_in: u32,
    /// Aim every instance fault at this target instead of drawing one (a focused run).
    pub target: Option<Target>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            kinds: FaultKind::ALL.to_vec(),
            overlap_within: Duration::from_secs(5),
            shortest: Duration::from_secs(2),
            longest: Duration::from_secs(20),
            pair_one_in: 3,
            target: None,
        }
    }
}

/// A number in `0..bound` from `rng` (the modulo bias is irrelevant at these sizes).
fn below(rng: &mut ChaCha8Rng, bound: u64) -> u64 {
    rng.next_u64() % bound.max(1)
}

fn between(rng: &mut ChaCha8Rng, low: Duration, high: Duration) -> Duration {
    let span = high.saturating_sub(low).as_millis() as u64;
    low + Duration::from_millis(below(rng, span + 1))
}

fn fault(rng: &mut ChaCha8Rng, limits: &Limits, start: Duration) -> Fault {
    let kind = limits.kinds[below(rng, limits.kinds.len() as u64) as usize];
    let target = if !kind.targets_an_instance() {
        Target::Cluster
    } else {
        // Drawn even when a focused run overrides it: the rest of the sequence stays the same.
        let drawn = if below(rng, 2) == 0 {
            Target::Primary
        } else {
            Target::Replica
        };
        limits.target.unwrap_or(drawn)
    };
    let length = if kind.lasts() {
        between(rng, limits.shortest, limits.longest)
    } else {
        Duration::ZERO
    };
    Fault {
        kind,
        target,
        start,
        length,
    }
}

/// The `faults` faults a campaign with `seed` runs, as episodes (the last may hold one
/// fault more than asked when it is a pair: never fewer).
pub fn plan(seed: u64, faults: usize, limits: &Limits) -> Vec<Episode> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut episodes = Vec::new();
    let mut planned = 0;
    while planned < faults && !limits.kinds.is_empty() {
        let first = fault(&mut rng, limits, Duration::ZERO);
        let mut episode = Episode {
            faults: vec![first],
        };
        if below(&mut rng, u64::from(limits.pair_one_in)) == 0 {
            let start = between(&mut rng, Duration::ZERO, limits.overlap_within);
            episode.faults.push(fault(&mut rng, limits, start));
        }
        planned += episode.faults.len();
        episodes.push(episode);
    }
    episodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_makes_the_same_campaign_and_another_seed_another() {
        let limits = Limits::default();
        assert_eq!(plan(7, 40, &limits), plan(7, 40, &limits));
        assert_ne!(plan(7, 40, &limits), plan(8, 40, &limits));
    }

    #[test]
    fn a_campaign_has_the_faults_asked_for_within_the_limits() {
        let limits = Limits::default();
        let episodes = plan(1, 200, &limits);
        let faults: Vec<&Fault> = episodes.iter().flat_map(|e| &e.faults).collect();
        assert!((200..=201).contains(&faults.len()), "{}", faults.len());
        // Every kind comes up in 200 faults, pairs too, and every fault keeps to its limits.
        for kind in FaultKind::ALL {
            assert!(
                faults.iter().any(|f| f.kind == kind),
                "{kind:?} never drawn"
            );
        }
        assert!(episodes.iter().any(|e| e.faults.len() == 2));
        for fault in &faults {
            assert!(fault.start <= limits.overlap_within);
            if fault.kind.lasts() {
                assert!((limits.shortest..=limits.longest).contains(&fault.length));
            } else {
                assert_eq!(fault.length, Duration::ZERO);
            }
            assert_eq!(
                fault.kind.targets_an_instance(),
                fault.target != Target::Cluster,
                "{fault:?}"
            );
        }
        // The first fault of an episode starts it.
        assert!(episodes.iter().all(|e| e.faults[0].start.is_zero()));
    }

    #[test]
    fn a_focused_run_aims_every_instance_fault_at_its_target_and_keeps_the_timing() {
        let drawn = plan(5, 40, &Limits::default());
        let focused = plan(
            5,
            40,
            &Limits {
                target: Some(Target::Primary),
                ..Limits::default()
            },
        );
        assert_eq!(drawn.len(), focused.len());
        for (a, b) in drawn
            .iter()
            .flat_map(|e| &e.faults)
            .zip(focused.iter().flat_map(|e| &e.faults))
        {
            assert_eq!((a.kind, a.start, a.length), (b.kind, b.start, b.length));
            let expected = if a.kind.targets_an_instance() {
                Target::Primary
            } else {
                Target::Cluster
            };
            assert_eq!(b.target, expected);
        }
    }

    #[test]
    fn a_campaign_limited_to_some_kinds_draws_only_those() {
        let limits = Limits {
            kinds: vec![FaultKind::Switchover, FaultKind::KillEngine],
            ..Limits::default()
        };
        assert!(
            plan(3, 30, &limits)
                .iter()
                .flat_map(|e| &e.faults)
                .all(|f| limits.kinds.contains(&f.kind))
        );
    }
}
