//! my.cnf. Only options that MySQL 8 and MariaDB 10.11+ both accept.

use std::collections::BTreeMap;

pub const CONFIG_DIR: &str = "/etc/mysql/conf.d";
pub const DATA_DIR: &str = "/var/lib/mysql";
pub const CONF: &str = "my.cnf";

pub fn render(memory_mib: u64) -> BTreeMap<String, String> {
    BTreeMap::from([(CONF.to_string(), my_cnf(memory_mib))])
}

fn my_cnf(memory_mib: u64) -> String {
    format!(
        "{}
# Binary log for replication
log-bin = mysql-bin
binlog_format = ROW
sync_binlog = 1
",
        server_section(memory_mib)
    )
}

/// The `[mysqld]` section's sizing and character set, shared with MariaDB's my.cnf.
pub(super) fn server_section(memory_mib: u64) -> String {
    let max_connections = super::max_connections(memory_mib);
    let buffer_pool = (memory_mib / 2).max(32);
    format!(
        "# Rendered by devctl-operator from spec.resources ({memory_mib} MiB); edits are overwritten.
[mysqld]
bind-address = 0.0.0.0
port = 3306
skip-name-resolve
max_connections = {max_connections}
character-set-server = utf8mb4
collation-server = utf8mb4_unicode_ci

# InnoDB
innodb_buffer_pool_size = {buffer_pool}M
innodb_flush_log_at_trx_commit = 1
innodb_file_per_table = 1
"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn buffer_pool_is_half_the_memory() {
        let cnf = &super::render(2048)[super::CONF];
        assert!(cnf.contains("innodb_buffer_pool_size = 1024M"), "{cnf}");
        assert!(cnf.starts_with("# Rendered") && cnf.contains("[mysqld]"));
    }
}
