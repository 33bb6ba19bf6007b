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

/// Which finished backups retention removes (pure): beyond the newest `keep_last`
/// completed ones (and failed ones older than the last of those), or older than
/// `retention_days`, but never the newest completed one.
/// Running and pending backups are never touched.
pub fn expired(
    backups: &[DatabaseBackup],
    keep_last: Option<i32>,
    retention_days: i32,
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
    let cutoff = now
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_hours(
            24 * i64::from(retention_days.max(1)),
        ))
        .unwrap_or(Timestamp::MIN);
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
        let too_old = started(backup)
            .parse::<Timestamp>()
            .is_ok_and(|t| t < cutoff);
        if too_many || too_old {
            out.push(*backup);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(names(expired(&backups, Some(2), 7, now)), ["b", "a"]);
        let old = vec![backup(
            "old",
            "2026-01-01T00:00:00Z",
            BackupPhase::Completed,
        )];
        assert!(
            expired(&old, None, 7, now).is_empty(),
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
        assert_eq!(names(expired(&backups, Some(2), 7, now)), ["c", "b", "a"]);
        // Only failures and no completed one: none is older than a kept completed backup.
        let failures = vec![
            backup("x", "2026-11-30T11:01:00Z", BackupPhase::Failed),
            backup("y", "2026-11-30T11:02:00Z", BackupPhase::Failed),
        ];
        assert!(expired(&failures, Some(1), 7, now).is_empty());
    }
}
