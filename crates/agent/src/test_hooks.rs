//! Faults a test injects into a running agent, to reach paths no outside fault reaches at
//! the right moment (a replica slow to acknowledge a failover, a CHECKPOINT that fails right
//! after a promotion).
//!
//! Enabled only when [`TEST_HOOKS_ENV`] names a file, which only the test environment's pod
//! runner sets: the operator renders no such variable. The file holds `key=value` lines and
//! is read again at each hook point, so a test can change it while the agent runs. A file
//! that is missing or unreadable means no hooks; an unknown key or a malformed value is
//! ignored with a warning (a test that mistypes one sees its fault not happen).

use std::path::PathBuf;
use std::time::Duration;

/// The variable naming the hooks file.
pub const TEST_HOOKS_ENV: &str = "DEVCTL_AGENT_TEST_HOOKS";

/// Delay a replica's acknowledgement of a failover epoch by this many milliseconds after it
/// stopped streaming (its report otherwise changes as usual).
pub const FAILOVER_ACK_DELAY_MS: &str = "failover-ack-delay-ms";
/// `fail`: the CHECKPOINT after a promotion fails (without running).
pub const CHECKPOINT_AFTER_PROMOTE: &str = "checkpoint-after-promote";
/// `refuse`: the agent cannot take the primary lock to run as the primary — as the target
/// of a failover or a switchover, or starting as the primary — as if those writes to the
/// Lease were refused; everything else works.
pub const PROMOTION_LOCK: &str = "promotion-lock";
/// `stop`: a replica's WAL receiver is stopped (`primary_conninfo` emptied), so it falls
/// behind its primary; removing the line lets it stream again.
pub const WAL_RECEIVER: &str = "wal-receiver";
/// Seconds: PostgreSQL's `archive_timeout` from the engine's next start (60 otherwise), so a
/// test can have WAL a dead primary never archived; MariaDB: how old the open binary log's
/// transactions get before it is rotated and archived (read at each archiving round).
pub const ARCHIVE_TIMEOUT_S: &str = "archive-timeout-s";

/// `fail`: the upgrade step of a major upgrade fails after `pg_upgrade` finished and before
/// the upgraded data takes the old one's place (the old data stays whole).
pub const MAJOR_UPGRADE: &str = "major-upgrade";

/// The hooks file of this agent, if any.
#[derive(Debug, Clone, Default)]
pub struct TestHooks {
    path: Option<PathBuf>,
}

impl TestHooks {
    pub fn from_env() -> Self {
        Self {
            path: std::env::var_os(TEST_HOOKS_ENV)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
        }
    }

    fn value(&self, key: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.path.as_ref()?).ok()?;
        lookup(&text, key)
    }

    /// [`FAILOVER_ACK_DELAY_MS`].
    pub fn failover_ack_delay(&self) -> Option<Duration> {
        let value = self.value(FAILOVER_ACK_DELAY_MS)?;
        match value.parse::<u64>() {
            Ok(ms) => Some(Duration::from_millis(ms)),
            Err(_) => {
                tracing::warn!("test hook {FAILOVER_ACK_DELAY_MS}={value}: not a number");
                None
            }
        }
    }

    /// [`CHECKPOINT_AFTER_PROMOTE`]`=fail`.
    pub fn checkpoint_after_promote_fails(&self) -> bool {
        self.value(CHECKPOINT_AFTER_PROMOTE)
            .is_some_and(|v| v == "fail")
    }
}

impl TestHooks {
    /// [`PROMOTION_LOCK`]`=refuse`.
    pub fn promotion_lock_refused(&self) -> bool {
        self.value(PROMOTION_LOCK).is_some_and(|v| v == "refuse")
    }

    /// [`WAL_RECEIVER`]`=stop`.
    pub fn wal_receiver_stopped(&self) -> bool {
        self.value(WAL_RECEIVER).is_some_and(|v| v == "stop")
    }

    /// [`MAJOR_UPGRADE`]`=fail`.
    pub fn major_upgrade_fails(&self) -> bool {
        self.value(MAJOR_UPGRADE).is_some_and(|v| v == "fail")
    }

    /// [`ARCHIVE_TIMEOUT_S`].
    pub fn archive_timeout(&self) -> Option<u32> {
        let value = self.value(ARCHIVE_TIMEOUT_S)?;
        value
            .parse()
            .inspect_err(|_| tracing::warn!("test hook {ARCHIVE_TIMEOUT_S}={value}: not a number"))
            .ok()
    }
}

/// The value of `key` in `key=value` lines (the last one wins).
fn lookup(text: &str, key: &str) -> Option<String> {
    text.lines()
        .rev()
        .filter_map(|line| line.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_for_a_key_wins_and_others_are_ignored() {
        let text = "failover-ack-delay-ms = 100\nother=x\nfailover-ack-delay-ms=250\n";
        assert_eq!(lookup(text, FAILOVER_ACK_DELAY_MS).as_deref(), Some("250"));
        assert_eq!(lookup(text, CHECKPOINT_AFTER_PROMOTE), None);
    }

    #[test]
    fn without_a_file_there_are_no_hooks() {
        let hooks = TestHooks::default();
        assert_eq!(hooks.failover_ack_delay(), None);
        assert!(!hooks.checkpoint_after_promote_fails());
        let missing = TestHooks {
            path: Some("/nonexistent/devctl-hooks".into()),
        };
        assert_eq!(missing.failover_ack_delay(), None);
    }
}
