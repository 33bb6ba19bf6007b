//! The campaign's checkers, over what the writer and the probers recorded (pure). A run
//! fails on any of them, and its report names the seed and the timeline, so `--seed N`
//! replays it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

/// Acknowledged rows missing from the final primary (synchronous replication loses none).
pub fn lost_rows(acknowledged: &[i64], present: &BTreeSet<i64>) -> Vec<i64> {
    acknowledged
        .iter()
        .copied()
        .filter(|v| !present.contains(v))
        .collect()
}

/// One probe instant: every instance asked at once whether it acknowledges a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeRound {
    /// Since the campaign started.
    pub at: Duration,
    /// The instances whose probe commit was acknowledged.
    pub writable: BTreeSet<String>,
}

/// The probe instants at which more than one instance accepted writes.
pub fn two_writable(rounds: &[ProbeRound]) -> Vec<&ProbeRound> {
    rounds.iter().filter(|r| r.writable.len() > 1).collect()
}

/// The instances whose table checksum differs from the primary's.
pub fn checksums_disagree<'a>(
    primary: &str,
    checksums: &'a BTreeMap<String, String>,
) -> Vec<&'a str> {
    let Some(reference) = checksums.get(primary) else {
        return checksums.keys().map(String::as_str).collect();
    };
    checksums
        .iter()
        .filter(|(_, sum)| *sum != reference)
        .map(|(pod, _)| pod.as_str())
        .collect()
}

/// How an episode ended: the cluster Ready again after `took` (none: not within the bound).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub episode: usize,
    pub took: Option<Duration>,
    pub bound: Duration,
}

/// The episodes after which the cluster was not Ready within its bound.
pub fn unrecovered(recoveries: &[Recovery]) -> Vec<&Recovery> {
    recoveries
        .iter()
        .filter(|r| r.took.is_none_or(|took| took > r.bound))
        .collect()
}

/// What a run recorded.
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// The writer's acknowledged rows.
    pub acknowledged: Vec<i64>,
    /// The rows on the final primary.
    pub present: BTreeSet<i64>,
    pub rounds: Vec<ProbeRound>,
    /// The final primary.
    pub primary: String,
    /// Each instance's checksum of the table.
    pub checksums: BTreeMap<String, String>,
    pub recoveries: Vec<Recovery>,
    /// Faults and observations, by time since the campaign started.
    pub timeline: Vec<(Duration, String)>,
}

/// What a finished run found.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub seed: u64,
    pub failures: Vec<String>,
    pub timeline: Vec<(Duration, String)>,
}

impl Verdict {
    /// Runs every checker over a run's records.
    pub fn of(seed: u64, records: &Records) -> Self {
        let mut failures = Vec::new();
        let lost = lost_rows(&records.acknowledged, &records.present);
        if !lost.is_empty() {
            failures.push(format!("{} acknowledged rows lost: {lost:?}", lost.len()));
        }
        for round in two_writable(&records.rounds) {
            failures.push(format!(
                "two writable instances at {:?}: {:?}",
                round.at, round.writable
            ));
        }
        let disagree = checksums_disagree(&records.primary, &records.checksums);
        if !disagree.is_empty() {
            failures.push(format!(
                "checksums differ from the primary {}'s on {disagree:?}",
                records.primary
            ));
        }
        for recovery in unrecovered(&records.recoveries) {
            failures.push(match recovery.took {
                Some(took) => format!(
                    "episode {} recovered after {took:?}, past its bound of {:?}",
                    recovery.episode, recovery.bound
                ),
                None => format!(
                    "episode {} did not recover within {:?}",
                    recovery.episode, recovery.bound
                ),
            });
        }
        Self {
            seed,
            failures,
            timeline: records.timeline.clone(),
        }
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The report a failing run prints: the failures, the seed that replays it, the timeline.
    pub fn report(&self) -> String {
        let mut report = String::new();
        let _ = writeln!(
            report,
            "campaign seed {} (replay: --seed {})",
            self.seed, self.seed
        );
        for failure in &self.failures {
            let _ = writeln!(report, "FAILED: {failure}");
        }
        for (at, what) in &self.timeline {
            let _ = writeln!(report, "{:>9.3} s  {what}", at.as_secs_f64());
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(values: &[i64]) -> BTreeSet<i64> {
        values.iter().copied().collect()
    }

    fn round(at_ms: u64, writable: &[&str]) -> ProbeRound {
        ProbeRound {
            at: Duration::from_millis(at_ms),
            writable: writable.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn sums(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(p, s)| (p.to_string(), s.to_string()))
            .collect()
    }

    fn clean() -> Records {
        Records {
            acknowledged: vec![1, 2, 3],
            present: rows(&[1, 2, 3, 4]),
            rounds: vec![round(0, &["db-0"]), round(100, &[]), round(200, &["db-1"])],
            primary: "db-1".into(),
            checksums: sums(&[("db-0", "a"), ("db-1", "a"), ("db-2", "a")]),
            recoveries: vec![Recovery {
                episode: 0,
                took: Some(Duration::from_secs(9)),
                bound: Duration::from_secs(60),
            }],
            timeline: vec![(Duration::from_millis(1500), "Freeze db-0".into())],
        }
    }

    #[test]
    fn a_clean_run_passes() {
        let verdict = Verdict::of(42, &clean());
        assert!(verdict.passed(), "{}", verdict.report());
    }

    /// Planted: an acknowledged row deleted behind the writer's back.
    #[test]
    fn a_lost_acknowledged_row_fails_the_run_and_the_report_names_the_seed() {
        let mut records = clean();
        records.present.remove(&2);
        let verdict = Verdict::of(42, &records);
        assert!(!verdict.passed());
        let report = verdict.report();
        assert!(report.contains("1 acknowledged rows lost: [2]"), "{report}");
        assert!(report.contains("--seed 42"), "{report}");
        assert!(report.contains("    1.500 s  Freeze db-0"), "{report}");
    }

    /// Planted: a second instance acknowledging commits at the same probe instant.
    #[test]
    fn two_writable_instances_at_one_instant_fail_the_run() {
        let mut records = clean();
        records.rounds.push(round(300, &["db-0", "db-1"]));
        assert_eq!(two_writable(&records.rounds), [&records.rounds[3]]);
        let verdict = Verdict::of(1, &records);
        assert_eq!(verdict.failures.len(), 1, "{:?}", verdict.failures);
        assert!(
            verdict.failures[0].contains("two writable instances at 300ms"),
            "{:?}",
            verdict.failures
        );
    }

    #[test]
    fn differing_checksums_and_late_or_missing_recoveries_fail_the_run() {
        assert_eq!(
            checksums_disagree(
                "db-0",
                &sums(&[("db-0", "a"), ("db-1", "b"), ("db-2", "a")])
            ),
            ["db-1"]
        );
        // Without the primary's checksum nothing agrees.
        assert_eq!(
            checksums_disagree("db-9", &sums(&[("db-0", "a")])),
            ["db-0"]
        );
        let bound = Duration::from_secs(60);
        let recoveries = [
            Recovery {
                episode: 0,
                took: Some(Duration::from_secs(60)),
                bound,
            },
            Recovery {
                episode: 1,
                took: Some(Duration::from_secs(61)),
                bound,
            },
            Recovery {
                episode: 2,
                took: None,
                bound,
            },
        ];
        let late: Vec<usize> = unrecovered(&recoveries).iter().map(|r| r.episode).collect();
        assert_eq!(late, [1, 2]);
        let mut records = clean();
        records.recoveries = recoveries.to_vec();
        assert_eq!(Verdict::of(1, &records).failures.len(), 2);
    }
}
