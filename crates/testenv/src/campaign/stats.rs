//! What a campaign measured, by fault kind (pure): write unavailability (the longest stretch
//! without an acknowledged row around a fault) and recovery time (fault over → cluster
//! Ready), summarised as percentiles for docs/reliability.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::plan::{FaultKind, Target};

/// One fault as it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRun {
    pub episode: usize,
    pub kind: FaultKind,
    /// The primary, a replica, or the cluster as a whole.
    pub target: Target,
    /// The pod it hit, when it targets an instance.
    pub pod: Option<String>,
    /// Since the campaign started.
    pub at: Duration,
    /// Whether it ran alone in its episode (only those are measured by kind).
    pub alone: bool,
    /// Why it could not be injected (e.g. the pod had no running agent at that moment).
    pub skipped: Option<String>,
    /// The longest time without an acknowledged row from just before it until writes
    /// resumed after the episode.
    pub unavailable: Option<Duration>,
    /// From the episode's last fault ending to the cluster Ready again.
    pub recovery: Option<Duration>,
}

/// The longest gap between consecutive acknowledgements (`acks`, sorted times) that ends
/// after `from` and starts before `until`: the write outage a fault at `from` caused, when
/// writes resumed by `until`. `None` without an acknowledgement on both sides of `from`.
pub fn largest_gap(acks: &[Duration], from: Duration, until: Duration) -> Option<Duration> {
    acks.windows(2)
        .filter(|pair| pair[1] > from && pair[0] < until)
        .map(|pair| pair[1] - pair[0])
        .max()
}

/// Percentiles of one measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub samples: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Nearest-rank percentiles of `values` (seconds); `None` without any.
    pub fn of(values: &[Duration]) -> Option<Self> {
        let mut sorted: Vec<f64> = values.iter().map(Duration::as_secs_f64).collect();
        sorted.sort_by(f64::total_cmp);
        let rank =
            |p: f64| sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1];
        (!sorted.is_empty()).then(|| Self {
            samples: sorted.len(),
            p50: rank(0.50),
            p95: rank(0.95),
            p99: rank(0.99),
            max: sorted[sorted.len() - 1],
        })
    }
}

/// Per fault kind and target: how many ran (alone or in a pair), how many were skipped, and the
/// summaries of the faults that ran alone.
#[derive(Debug, Clone, PartialEq)]
pub struct KindReport {
    pub kind: FaultKind,
    pub target: Target,
    pub ran: usize,
    pub skipped: usize,
    pub unavailable: Option<Summary>,
    pub recovery: Option<Summary>,
}

pub fn by_kind(runs: &[FaultRun]) -> Vec<KindReport> {
    let mut kinds: BTreeMap<(FaultKind, u8), Vec<&FaultRun>> = BTreeMap::new();
    for run in runs {
        kinds
            .entry((run.kind, run.target as u8))
            .or_default()
            .push(run);
    }
    kinds
        .into_iter()
        .map(|((kind, _), runs)| {
            let target = runs[0].target;
            let measured: Vec<&&FaultRun> = runs
                .iter()
                .filter(|r| r.alone && r.skipped.is_none())
                .collect();
            let unavailable: Vec<Duration> =
                measured.iter().filter_map(|r| r.unavailable).collect();
            let recovery: Vec<Duration> = measured.iter().filter_map(|r| r.recovery).collect();
            KindReport {
                kind,
                target,
                ran: runs.iter().filter(|r| r.skipped.is_none()).count(),
                skipped: runs.iter().filter(|r| r.skipped.is_some()).count(),
                unavailable: Summary::of(&unavailable),
                recovery: Summary::of(&recovery),
            }
        })
        .collect()
}

/// The per-kind table of docs/reliability.md (Markdown).
pub fn table(reports: &[KindReport]) -> String {
    let cell = |s: &Option<Summary>| match s {
        Some(s) => format!(
            "{} | {:.2} / {:.2} / {:.2} / {:.2}",
            s.samples, s.p50, s.p95, s.p99, s.max
        ),
        None => "0 | –".to_string(),
    };
    let mut out = String::from(
        "| fault | ran | skipped | measured alone | write unavailability p50 / p95 / p99 / max (s) | measured alone | recovery p50 / p95 / p99 / max (s) |\n|---|---:|---:|---:|---|---:|---|\n",
    );
    for r in reports {
        let on = match r.target {
            Target::Primary => " (primary)",
            Target::Replica => " (replica)",
            Target::Cluster => "",
        };
        let _ = writeln!(
            out,
            "| {:?}{on} | {} | {} | {} | {} |",
            r.kind,
            r.ran,
            r.skipped,
            cell(&r.unavailable),
            cell(&r.recovery)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|v| Duration::from_millis(*v)).collect()
    }

    #[test]
    fn the_outage_is_the_longest_gap_around_the_fault() {
        let acks = ms(&[0, 100, 200, 300, 5300, 5400, 9000, 9100]);
        // A fault at 250 ms: writes stop at 300, resume at 5,300; the later gap to 9,000
        // falls in the window too when it ends before `until`.
        assert_eq!(
            largest_gap(&acks, Duration::from_millis(250), Duration::from_secs(6)),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            largest_gap(&acks, Duration::from_millis(250), Duration::from_secs(10)),
            Some(Duration::from_millis(5000))
        );
        assert_eq!(
            largest_gap(&acks, Duration::from_millis(5350), Duration::from_secs(10)),
            Some(Duration::from_millis(3600))
        );
        // Nothing acknowledged after the fault: no measurement.
        assert_eq!(
            largest_gap(&acks, Duration::from_secs(20), Duration::from_secs(30)),
            None
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<Duration> = (1..=20).map(Duration::from_secs).collect();
        let s = Summary::of(&values).unwrap();
        assert_eq!(
            (s.samples, s.p50, s.p95, s.p99, s.max),
            (20, 10.0, 19.0, 20.0, 20.0)
        );
        assert_eq!(Summary::of(&[]), None);
        let one = Summary::of(&ms(&[1500])).unwrap();
        assert_eq!((one.p50, one.p99), (1.5, 1.5));
    }

    #[test]
    fn only_faults_that_ran_alone_are_measured_by_kind() {
        let run = |kind, alone, skipped: Option<&str>, secs| FaultRun {
            episode: 0,
            kind,
            target: if kind == FaultKind::Switchover {
                Target::Cluster
            } else {
                Target::Primary
            },
            pod: None,
            at: Duration::ZERO,
            alone,
            skipped: skipped.map(String::from),
            unavailable: Some(Duration::from_secs(secs)),
            recovery: Some(Duration::from_secs(secs)),
        };
        let reports = by_kind(&[
            run(FaultKind::Freeze, true, None, 4),
            run(FaultKind::Freeze, false, None, 40),
            run(FaultKind::Freeze, true, Some("no agent"), 400),
            run(FaultKind::Switchover, true, None, 1),
        ]);
        assert_eq!(reports.len(), 2);
        let freeze = &reports[0];
        assert_eq!(
            (freeze.kind, freeze.ran, freeze.skipped),
            (FaultKind::Freeze, 2, 1)
        );
        assert_eq!(freeze.unavailable.unwrap().samples, 1);
        assert_eq!(freeze.unavailable.unwrap().max, 4.0);
        let table = table(&reports);
        assert!(
            table.contains("| Freeze (primary) | 2 | 1 | 1 | 4.00 / 4.00 / 4.00 / 4.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| Switchover | 1 | 0 | 1 | 1.00 /"),
            "{table}"
        );
    }
}
