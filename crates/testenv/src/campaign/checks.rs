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

/// One instance's probe answers ([`crate::workload::WriteProbe`], ten a second): whether
/// it acknowledged a probe commit, by time since the campaign started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSamples {
    pub pod: String,
    pub samples: Vec<(Duration, bool)>,
}

impl ProbeSamples {
    /// The spans `[first, last]` of consecutive acknowledged probes.
    pub fn writable_spans(&self) -> Vec<(Duration, Duration)> {
        let mut spans = Vec::new();
        let mut open: Option<(Duration, Duration)> = None;
        for &(at, writable) in &self.samples {
            open = match (open, writable) {
                (Some((from, _)), true) => Some((from, at)),
                (None, true) => Some((at, at)),
                (Some(span), false) => {
                    spans.push(span);
                    None
                }
                (None, false) => None,
            };
        }
        spans.extend(open);
        spans
    }
}

/// Two instances that accepted writes at once: their writable spans overlap (probes are not
/// synchronised between instances, so a span is the stretch between an instance's first and
/// last acknowledged probe of a run). Each pair with the time their overlap starts.
pub fn two_writable(probes: &[ProbeSamples]) -> Vec<(String, String, Duration)> {
    let spans: Vec<(&str, (Duration, Duration))> = probes
        .iter()
        .flat_map(|p| {
            p.writable_spans()
                .into_iter()
                .map(move |s| (p.pod.as_str(), s))
        })
        .collect();
    let mut overlaps = Vec::new();
    for (i, (a, (from_a, to_a))) in spans.iter().enumerate() {
        for (b, (from_b, to_b)) in &spans[i + 1..] {
            if a != b && from_a <= to_b && from_b <= to_a {
                overlaps.push((a.to_string(), b.to_string(), *from_a.max(from_b)));
            }
        }
    }
    overlaps
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
    pub probes: Vec<ProbeSamples>,
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
            // The first rows name the loss; thousands would bury the rest of the report.
            let shown = &lost[..lost.len().min(20)];
            let more = if lost.len() > shown.len() { " …" } else { "" };
            failures.push(format!(
                "{} acknowledged rows lost: {shown:?}{more}",
                lost.len()
            ));
        }
        for (a, b, at) in two_writable(&records.probes) {
            failures.push(format!("{a} and {b} were writable at once, from {at:?}"));
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

    /// `pod`'s probes every 100 ms from 0, writable where `pattern` has a `w`.
    fn probes(pod: &str, pattern: &str) -> ProbeSamples {
        ProbeSamples {
            pod: pod.into(),
            samples: pattern
                .chars()
                .enumerate()
                .map(|(i, c)| (Duration::from_millis(100 * i as u64), c == 'w'))
                .collect(),
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
            // A failover: db-0 stops, nobody for a moment, then db-1.
            probes: vec![
                probes("db-0", "ww...."),
                probes("db-1", "...www"),
                probes("db-2", "......"),
            ],
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

    /// Planted: a second instance acknowledging commits while the first still does.
    #[test]
    fn two_writable_instances_at_once_fail_the_run() {
        let mut records = clean();
        records.probes[0] = probes("db-0", "ww..w.");
        assert_eq!(
            two_writable(&records.probes),
            [(
                "db-0".to_string(),
                "db-1".to_string(),
                Duration::from_millis(400)
            )]
        );
        let verdict = Verdict::of(1, &records);
        assert_eq!(
            verdict.failures,
            ["db-0 and db-1 were writable at once, from 400ms"]
        );
        // Spans that only touch in time overlap too: one probe of each at the same instant.
        assert_eq!(
            two_writable(&[probes("a", "ww.."), probes("b", ".ww.")]).len(),
            1
        );
        assert!(two_writable(&[probes("a", "ww.."), probes("b", "..ww")]).is_empty());
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
