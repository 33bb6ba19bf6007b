//! my.cnf for MariaDB (10.11, 11.x): the MySQL family's settings plus GTID replication
//! (docs/mariadb.md). What differs per instance (`server_id`, `report_host`) and what follows
//! the role (`read_only`, replication, semi-synchronous acknowledgements) the agent sets.

use std::collections::BTreeMap;

pub use super::mysql::{CONF, CONFIG_DIR, DATA_DIR};

/// How long a semi-synchronous primary waits for a replica's acknowledgement before MariaDB
/// falls back to asynchronous replication: its maximum (about 49 days), so it never does in
/// practice — a primary without a replica that acknowledges stops committing instead, as a
/// PostgreSQL primary with synchronous standbys does. Should it ever fall back, the agent
/// reports it and the cluster says `SynchronousReplicationDegraded`.
pub const SEMI_SYNC_TIMEOUT_MS: u64 = 4_294_967_295;

pub fn render(memory_mib: u64) -> BTreeMap<String, String> {
    BTreeMap::from([(CONF.to_string(), my_cnf(memory_mib))])
}

fn my_cnf(memory_mib: u64) -> String {
    format!(
        "{}
# GTID replication: every instance writes a binary log (a replica too, so that it can be
# promoted with its history), in rows, synced at each commit.
log-bin = mysql-bin
relay-log = relay-bin
binlog_format = ROW
sync_binlog = 1
log_slave_updates = ON
gtid_domain_id = 0
gtid_strict_mode = ON
binlog_expire_logs_seconds = 259200
slave_net_timeout = 10

# Every instance starts read-only and without replication: its agent makes the primary
# writable only while it holds the primary lock, and points a replica at the primary.
read_only = ON
skip_slave_start = ON

# Semi-synchronous replication (switched on by the primary's agent when
# spec.replication.synchronous is set): acknowledged after the replica has the binary log
# event, before the commit is visible; never a silent fall back to asynchronous.
rpl_semi_sync_slave_enabled = ON
rpl_semi_sync_master_wait_point = AFTER_SYNC
rpl_semi_sync_master_timeout = {SEMI_SYNC_TIMEOUT_MS}
",
        super::mysql::server_section(memory_mib)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn instances_start_read_only_with_gtid_and_row_binary_logs() {
        let cnf = super::my_cnf(2048);
        for line in [
            "read_only = ON",
            "skip_slave_start = ON",
            "binlog_format = ROW",
            "log_slave_updates = ON",
            "gtid_strict_mode = ON",
            "rpl_semi_sync_master_wait_point = AFTER_SYNC",
            "innodb_buffer_pool_size = 1024M",
        ] {
            assert!(cnf.lines().any(|l| l == line), "{line} missing:\n{cnf}");
        }
    }
}
