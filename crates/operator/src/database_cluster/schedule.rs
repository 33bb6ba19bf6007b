//! Scheduled backups and retention (docs/backup.md), decided from the spec, the status and
//! the clock (pure).
//!
//! A schedule creates `DatabaseBackup`s named `<cluster>-<scheduled time>`: the name is
//! deterministic, so a reconcile that runs twice for one scheduled time, or an operator that
//! restarts, creates it once. Runs missed while the operator was down become exactly one
//! catch-up backup (for the latest missed time), not a burst.

use std::str::FromStr;

use croner::Cron;
use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use k8s_openapi::jiff::{Timestamp, tz::TimeZone};

/// What the schedule asks for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// A backup to create for this scheduled time (the latest one that has passed).
    pub run: Option<Timestamp>,
    /// The next scheduled time after now.
    pub next: Option<Timestamp>,
}

/// Parses a five-field cron expression (UTC).
pub fn parse(schedule: &str) -> Result<Cron, String> {
    Cron::from_str(schedule.trim()).map_err(|e| {
        format!("spec.backup.schedule {schedule:?} is not a valid cron expression: {e}")
    })
}

/// Decides the run from the last scheduled time (or, before any, when the cluster was
/// created: the first run is the first scheduled time after it).
pub fn due(cron: &Cron, last: Timestamp, now: Timestamp) -> Due {
    let utc = |t: Timestamp| t.to_zoned(TimeZone::UTC);
    let next_after = |t: Timestamp| {
        cron.find_next_occurrence(&utc(t), false)
            .ok()
            .map(|z| z.timestamp())
    };
    let first = next_after(last);
    let run = match first {
        Some(first) if first <= now => cron
            .find_previous_occurrence(&utc(now), true)
            .ok()
            .map(|z| z.timestamp())
            .filter(|t| *t > last),
        _ => None,
    };
    Due {
        run,
        next: next_after(now),
    }
}

/// The name of the backup for one scheduled time.
pub fn backup_name(cluster: &str, at: Timestamp) -> String {
    format!("{cluster}-{}", at.strftime("%Y%m%d%H%M%S"))
}

/// The final backup's name.
pub fn final_backup_name(cluster: &str) -> String {
    format!("{cluster}-final")
}

/// The retention rules in words, for events: `keepLast 2, 7 days`.
pub fn policy(keep_last: Option<i32>, retention_days: Option<i32>) -> String {
    let count = keep_last.map(|k| format!("keepLast {k}"));
    let age = retention_days.map(|d| format!("{d} days"));
    [count, age]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which finished backups retention removes (pure): beyond the newest `keep_last`
/// completed ones (and failed ones older than the last of those), or older than
/// `retention_days` (no age limit when `None`), but never the newest completed one.
/// Running and pending backups are never touched.
pub fn expired(
    backups: &[DatabaseBackup],
    keep_last: Option<i32>,
    retention_days: Option<i32>,
    now: Timestamp,
) -> Vec<&DatabaseBackup> {
    let started = |b: &DatabaseBackup| {
        b.status
            .as_ref()
            .and_then(|s| s.started_at.clone())
            .unwrap_or_default()
    };
    let phase = |b: &DatabaseBackup| b.status.as_ref().and_then(|s| s.phase);
    let mut finished: Vec<&DatabaseBackup> = backups
        .iter()
        .filter(|b| phase(b).is_some_and(BackupPhase::is_final))
        .filter(|b| b.metadata.deletion_timestamp.is_none())
        .collect();
    // Newest first.
    finished.sort_by_key(|b| std::cmp::Reverse(started(b)));
    let newest_completed = finished
        .iter()
        .position(|b| phase(b) == Some(BackupPhase::Completed));
    let cutoff = retention_days.map(|days| {
        now.checked_sub(k8s_openapi::jiff::SignedDuration::from_hours(
            24 * i64::from(days.max(1)),
        ))
        .unwrap_or(Timestamp::MIN)
    });
    let mut completed_seen = 0;
    let mut out = Vec::new();
    for (index, backup) in finished.iter().enumerate() {
        let is_completed = phase(backup) == Some(BackupPhase::Completed);
        if is_completed {
            completed_seen += 1;
        }
        if Some(index) == newest_completed {
            continue;
        }
        // A failed one goes once it is older than the last completed one kept: it restores
        // nothing, and `keepLast: 2` must leave two backups, not two and every failure.
        let too_many = keep_last.is_some_and(|k| {
            if is_completed {
                completed_seen > k
            } else {
                completed_seen >= k
            }
        });
        let too_old = cutoff.is_some_and(|cutoff| {
            started(backup)
                .parse::<Timestamp>()
                .is_ok_and(|t| t < cutoff)
        });
        if too_many || too_old {
            out.push(*backup);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use devctl_api::database_cluster::v1beta1::{BackupSpec, DEFAULT_RETENTION_DAYS};

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_first_run_is_the_first_time_after_creation() {
        let cron = parse("0 2 * * *").unwrap();
        let due = due(&cron, t("2026-11-30T10:00:00Z"), t("2026-11-30T11:00:00Z"));
        assert_eq!(due.run, None);
        assert_eq!(due.next, Some(t("2026-12-01T02:00:00Z")));
    }

    #[test]
    fn missed_runs_make_exactly_one_catch_up_for_the_latest_time() {
        let cron = parse("*/5 * * * *").unwrap();
        let due = due(&cron, t("2026-11-30T10:00:00Z"), t("2026-11-30T10:17:30Z"));
        assert_eq!(due.run, Some(t("2026-11-30T10:15:00Z")));
        assert_eq!(due.next, Some(t("2026-11-30T10:20:00Z")));
        // Once recorded, nothing more until the next time.
        let again = super::due(&cron, t("2026-11-30T10:15:00Z"), t("2026-11-30T10:17:31Z"));
        assert_eq!(again.run, None);
    }

    #[test]
    fn bad_schedules_name_the_field() {
        assert!(
            parse("every day")
                .unwrap_err()
                .contains("spec.backup.schedule")
        );
    }

    fn backup(name: &str, started: &str, phase: BackupPhase) -> DatabaseBackup {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseBackup",
            "metadata": { "name": name },
            "spec": { "cluster": { "name": "db" } },
            "status": { "phase": phase.as_str(), "startedAt": started },
        }))
        .unwrap()
    }

    #[test]
    fn keep_last_keeps_the_newest_completed_and_retention_never_removes_the_newest() {
        let now = t("2026-11-30T12:00:00Z");
        let backups = vec![
            backup("a", "2026-11-30T11:01:00Z", BackupPhase::Completed),
            backup("b", "2026-11-30T11:02:00Z", BackupPhase::Completed),
            backup("c", "2026-11-30T11:03:00Z", BackupPhase::Completed),
            backup("d", "2026-11-30T11:04:00Z", BackupPhase::Completed),
            backup("e", "2026-11-30T11:05:00Z", BackupPhase::Running),
        ];
        let names = |v: Vec<&DatabaseBackup>| -> Vec<String> {
            v.iter().map(|b| b.metadata.name.clone().unwrap()).collect()
        };
        assert_eq!(names(expired(&backups, Some(2), Some(7), now)), ["b", "a"]);
        let old = vec![backup(
            "old",
            "2026-01-01T00:00:00Z",
            BackupPhase::Completed,
        )];
        assert!(
            expired(&old, None, Some(7), now).is_empty(),
            "the newest completed stays"
        );
    }

    #[test]
    fn keep_last_also_removes_failed_backups_older_than_the_last_kept() {
        let now = t("2026-11-30T12:00:00Z");
        let backups = vec![
            backup("a", "2026-11-30T11:01:00Z", BackupPhase::Failed),
            backup("b", "2026-11-30T11:02:00Z", BackupPhase::Completed),
            backup("c", "2026-11-30T11:03:00Z", BackupPhase::Failed),
            backup("d", "2026-11-30T11:04:00Z", BackupPhase::Completed),
            backup("e", "2026-11-30T11:05:00Z", BackupPhase::Completed),
            backup("f", "2026-11-30T11:06:00Z", BackupPhase::Failed),
        ];
        let names = |v: Vec<&DatabaseBackup>| -> Vec<String> {
            v.iter().map(|b| b.metadata.name.clone().unwrap()).collect()
        };
        // Kept: e and d (the two newest completed) and f, a failure newer than them (it
        // says what went wrong last). c failed before d was taken, b is one too many.
        assert_eq!(
            names(expired(&backups, Some(2), Some(7), now)),
            ["c", "b", "a"]
        );
        // Only failures and no completed one: none is older than a kept completed backup.
        let failures = vec![
            backup("x", "2026-11-30T11:01:00Z", BackupPhase::Failed),
            backup("y", "2026-11-30T11:02:00Z", BackupPhase::Failed),
        ];
        assert!(expired(&failures, Some(1), Some(7), now).is_empty());
    }

    #[test]
    fn keep_last_alone_keeps_by_count_however_old() {
        let now = t("2026-11-30T12:00:00Z");
        let daily: Vec<DatabaseBackup> = (1..=20)
            .map(|day| {
                backup(
                    &format!("d{day:02}"),
                    &format!("2026-11-{day:02}T02:00:00Z"),
                    BackupPhase::Completed,
                )
            })
            .collect();
        let names = |v: Vec<&DatabaseBackup>| -> Vec<String> {
            v.iter().map(|b| b.metadata.name.clone().unwrap()).collect()
        };
        let spec = |keep_last: Option<i32>, retention: Option<i32>| BackupSpec {
            keep_last,
            retention,
            ..BackupSpec::enabled_with_defaults()
        };
        // `keepLast: 15` alone: fifteen backups stay, the oldest 29 days old.
        let count_only = spec(Some(15), None);
        assert_eq!(count_only.retention_days(), None);
        assert_eq!(
            names(expired(
                &daily,
                count_only.keep_last,
                count_only.retention_days(),
                now
            )),
            ["d05", "d04", "d03", "d02", "d01"]
        );
        assert_eq!(
            policy(count_only.keep_last, count_only.retention_days()),
            "keepLast 15"
        );
        // Neither set: seven days.
        let neither = spec(None, None);
        assert_eq!(neither.retention_days(), Some(DEFAULT_RETENTION_DAYS));
        assert_eq!(
            expired(&daily, neither.keep_last, neither.retention_days(), now).len(),
            19,
            "all are older than seven days; the newest completed one stays"
        );
        // Both: either rule removes a backup.
        let both = spec(Some(15), Some(20));
        assert_eq!(
            policy(both.keep_last, both.retention_days()),
            "keepLast 15, 20 days"
        );
        assert_eq!(
            names(expired(&daily, both.keep_last, both.retention_days(), now)),
            [
                "d10", "d09", "d08", "d07", "d06", "d05", "d04", "d03", "d02", "d01"
            ]
        );
    }
}
