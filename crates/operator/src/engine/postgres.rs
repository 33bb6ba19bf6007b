//! postgresql.conf and pg_hba.conf.

use std::collections::BTreeMap;

/// Where the config files are mounted in the container.
pub const CONFIG_DIR: &str = "/etc/devctl";
pub const DATA_DIR: &str = "/var/lib/postgresql/data";
pub const CONF: &str = "postgresql.conf";
pub const HBA: &str = "pg_hba.conf";
pub const IDENT: &str = "pg_ident.conf";

pub fn render(memory_mib: u64, storage_mib: u64) -> BTreeMap<String, String> {
    BTreeMap::from([
        (CONF.to_string(), postgresql_conf(memory_mib, storage_mib)),
        (HBA.to_string(), pg_hba_conf()),
        (IDENT.to_string(), pg_ident_conf()),
    ])
}

/// WAL kept for replicas, bounded by the volume: `wal_keep_size` (for any standby, with or
/// without its slot) at most an eighth of it and 512 MB; each replica's slot
/// (`max_slot_wal_keep_size`) at most a quarter, at least 64 MB. A replica further behind
/// than its slot allows catches up from the archive or is re-cloned (docs/replication.md);
/// a replica that is gone for good can never fill the primary's disk.
fn wal_retention_mib(storage_mib: u64) -> (u64, u64) {
    ((storage_mib / 8).min(512), (storage_mib / 4).max(64))
}

fn postgresql_conf(memory_mib: u64, storage_mib: u64) -> String {
    let (wal_keep, slot_keep) = wal_retention_mib(storage_mib);
    let max_connections = super::max_connections(memory_mib);
    let shared_buffers = memory_mib / 4;
    let effective_cache_size = memory_mib * 3 / 4;
    // Each connection may run a few sorts/hashes at once; keep their sum within the memory
    // not given to shared_buffers.
    let work_mem_kb = ((memory_mib - shared_buffers) * 1024 / (max_connections * 3)).max(1024);
    let maintenance_work_mem = (memory_mib / 16).clamp(16, 2048);
    format!(
        "# Rendered by devctl-operator from spec.resources ({memory_mib} MiB) and spec.storage ({storage_mib} MiB); edits are overwritten.
listen_addresses = '*'
port = 5432
max_connections = {max_connections}
password_encryption = scram-sha-256

# Memory
shared_buffers = {shared_buffers}MB
effective_cache_size = {effective_cache_size}MB
work_mem = {work_mem_kb}kB
maintenance_work_mem = {maintenance_work_mem}MB

# Write-ahead log and streaming replication
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
wal_keep_size = {wal_keep}MB
max_slot_wal_keep_size = {slot_keep}MB
hot_standby = on
wal_log_hints = on
# A standby that lost its primary retries every second, not every 5 s: with synchronous
# replication, commits after the primary restarts wait for a standby to reconnect.
wal_retrieve_retry_interval = 1s

# Logging to stderr (collected by the container runtime)
logging_collector = off
log_min_duration_statement = 1000
log_connections = on
log_disconnections = on
"
    )
}

/// Password authentication with scram-sha-256 for every rule; no `trust`, no `md5`. The one
/// exception is the superuser `postgres` over the agent's private Unix socket (mode 0700,
/// `unix_socket_permissions`, in the agent's run directory: its own with mode 0700, or the
/// pod's emptyDir, which only the pod's user uses): peer authentication, so the superuser
/// has no password that could leak (CloudNativePG's instance manager does the same). The agent's base
/// backups (`pg_basebackup`) are a replication connection of that same superuser.
fn pg_hba_conf() -> String {
    "# Rendered by devctl-operator; edits are overwritten.
# TYPE  DATABASE     USER      ADDRESS    METHOD
local   all          postgres             peer map=devctl
local   replication  postgres             peer map=devctl
local   all          all                  scram-sha-256
host    all          all   0.0.0.0/0  scram-sha-256
host    all          all   ::/0       scram-sha-256
host    replication  all   0.0.0.0/0  scram-sha-256
host    replication  all   ::/0       scram-sha-256
"
    .to_string()
}

/// Maps the agent's operating-system user (whatever UID the image runs as) to `postgres`
/// for peer authentication on the private socket.
fn pg_ident_conf() -> String {
    "# Rendered by devctl-operator; edits are overwritten.
# MAPNAME  SYSTEM-USERNAME  PG-USERNAME
devctl     /^.*$            postgres
"
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunes_memory_from_resources() {
        let files = render(4096, 1024);
        let conf = &files[CONF];
        assert!(conf.contains("shared_buffers = 1024MB"), "{conf}");
        assert!(conf.contains("effective_cache_size = 3072MB"), "{conf}");
        assert!(conf.contains("max_connections = 400"), "{conf}");
    }

    #[test]
    fn bounds_the_wal_kept_for_replicas_by_the_volume() {
        let conf = &render(512, 1024)[CONF];
        assert!(conf.contains("wal_keep_size = 128MB\n"), "{conf}");
        assert!(conf.contains("max_slot_wal_keep_size = 256MB\n"), "{conf}");
        assert!(
            conf.contains("wal_retrieve_retry_interval = 1s\n"),
            "{conf}"
        );
        assert_eq!(wal_retention_mib(100 * 1024), (512, 25 * 1024));
        assert_eq!(wal_retention_mib(128), (16, 64));
    }

    #[test]
    fn every_network_rule_uses_scram_and_only_the_local_superuser_uses_peer() {
        let hba = &render(512, 1024)[HBA];
        for rule in hba
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            let fields: Vec<&str> = rule.split_whitespace().collect();
            if fields[0] == "local" && fields[2] == "postgres" {
                assert_eq!(fields[3..], ["peer", "map=devctl"], "{rule}");
            } else {
                assert!(rule.trim_end().ends_with("scram-sha-256"), "{rule}");
            }
        }
        assert!(!hba.contains("trust") && !hba.contains("md5"));
    }
}
