//! Replicated MariaDB (docs/mariadb.md): what the agent does to the engine for each role.
//!
//! The role state machine ([`crate::agent`]) is the same as PostgreSQL's; this module gives
//! its steps their MariaDB meaning:
//! - every instance starts `read_only` with `skip_slave_start` (my.cnf); the primary's agent
//!   makes it writable only while it holds the primary lock;
//! - a replica is cloned from the primary with `mariadb-backup` streamed over the primary
//!   agent's clone endpoint ([`clone`]), then replicates by GTID
//!   (`MASTER_USE_GTID=slave_pos`);
//! - a standby's data carries the marker [`REPLICA_MARKER`] (PostgreSQL's `standby.signal`);
//!   a primary stopped for a switchover leaves its final GTID position in
//!   [`HANDOVER_MARKER`];
//! - a candidate in a failover stops its IO thread and applies its relay log, so its
//!   `gtid_current_pos` is final; the elected one stops replication and leaves read-only;
//! - a former primary rejoins only without errant transactions (GTIDs the new primary lacks).
//!
//! This file holds the pure parts (SQL, parsing, markers); [`ops`] runs them.

pub mod archive;
pub mod backup;
pub mod binlog;
pub mod clone;
pub mod ops;

use std::collections::HashMap;
use std::path::Path;

use devctl_api::gtid::Position;
use devctl_api::instance::{ROLE_PRIMARY, ROLE_REPLICA};

use crate::engine::Probe;

/// Marker of a replica's data directory: `clone <gtid>` (cloned at that position, where
/// replication starts), `rejoin` (a former primary: checked for errant transactions first),
/// or `replica` (replicating; its `gtid_slave_pos` is its own).
pub const REPLICA_MARKER: &str = ".devctl-replica";
/// The final `gtid_binlog_pos` of a primary stopped for a switchover.
pub const HANDOVER_MARKER: &str = ".devctl-handover";
/// The `gtid_current_pos` at which this instance was promoted (the fork point a returning
/// former primary is checked against).
pub const PROMOTED_MARKER: &str = ".devctl-promoted-at";
/// The errant transactions of a former primary, dumped as SQL into its data directory
/// before that is moved aside.
pub const ERRANT_DUMP: &str = "errant-transactions.sql";

/// What [`REPLICA_MARKER`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// Cloned: replication starts at this position.
    Cloned(String),
    /// A former primary: checked for errant transactions before it replicates.
    Rejoin,
    /// Replicating.
    Replica,
}

impl Marker {
    pub fn parse(text: &str) -> Self {
        let text = text.trim();
        match text.strip_prefix("clone") {
            Some(rest) if rest.is_empty() || rest.starts_with(' ') => {
                Marker::Cloned(rest.trim().to_string())
            }
            _ if text == "rejoin" => Marker::Rejoin,
            _ => Marker::Replica,
        }
    }

    pub fn render(&self) -> String {
        match self {
            Marker::Cloned(gtid) => format!("clone {gtid}\n"),
            Marker::Rejoin => "rejoin\n".into(),
            Marker::Replica => "replica\n".into(),
        }
    }
}

/// The marker of `data`, if it is a replica's.
pub fn read_marker(data: &Path) -> Option<Marker> {
    std::fs::read_to_string(data.join(REPLICA_MARKER))
        .ok()
        .map(|t| Marker::parse(&t))
}

/// The probe's one statement batch: the server's state, the replicas registered with it,
/// and its own replication (each result set starts with its column names; an empty one
/// prints nothing).
/// The replication threads are read first: a relay log found applied then is applied in the
/// position read after (a failover candidate's acknowledged position must hold everything).
pub const PROBE_SQL: &str = "SHOW SLAVE STATUS;\n\
     SELECT VERSION() AS devctl_version, @@read_only AS read_only, \
     @@gtid_current_pos AS gtid_current, @@gtid_binlog_pos AS gtid_binlog, \
     @@rpl_semi_sync_master_enabled AS semi_sync_enabled, \
     (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
       WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_STATUS') AS semi_sync_status;\n\
     SHOW SLAVE HOSTS;\n";

/// A replica's replication threads (`SHOW SLAVE STATUS`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replication {
    pub master_host: String,
    pub master_port: Option<u16>,
    /// `Slave_IO_Running`: `Yes`, `Connecting` or `No`.
    pub io_running: String,
    pub sql_running: bool,
    pub seconds_behind: Option<i64>,
    /// Everything the IO thread received is applied.
    pub relay_applied: bool,
    pub last_io_errno: i64,
    pub last_io_error: String,
    pub last_sql_error: String,
}

impl Replication {
    /// The IO thread receives and the SQL thread applies.
    pub fn streaming(&self) -> bool {
        self.io_running == "Yes" && self.sql_running
    }
}

/// What [`PROBE_SQL`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MariadbProbe {
    pub version: String,
    pub read_only: bool,
    pub gtid_current: String,
    pub gtid_binlog: String,
    pub semi_sync_enabled: bool,
    pub semi_sync_active: bool,
    /// `report_host`s (pod names) of the replicas registered with this server.
    pub replica_hosts: Vec<String>,
    pub replication: Option<Replication>,
}

/// Splits batch output (tab-separated, column names first) into result sets keyed by their
/// first column's name.
fn result_sets(out: &str) -> HashMap<String, Vec<HashMap<String, String>>> {
    const HEADERS: [&str; 3] = ["devctl_version", "Server_id", "Slave_IO_State"];
    let mut sets: HashMap<String, Vec<HashMap<String, String>>> = HashMap::new();
    let mut columns: Option<Vec<String>> = None;
    for line in out.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        if HEADERS.contains(&fields[0]) {
            columns = Some(fields.iter().map(|f| f.to_string()).collect());
            sets.entry(fields[0].to_string()).or_default();
            continue;
        }
        let Some(names) = &columns else { continue };
        let row: HashMap<String, String> = names
            .iter()
            .cloned()
            .zip(fields.iter().map(|f| unescape(f)))
            .collect();
        sets.entry(names[0].clone()).or_default().push(row);
    }
    sets
}

/// The client's batch escaping (`\t`, `\n`, `\\`, `\0`) undone.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('0') => out.push('\0'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

pub fn parse_probe(out: &str) -> Result<MariadbProbe, String> {
    let sets = result_sets(out);
    let server = sets
        .get("devctl_version")
        .and_then(|rows| rows.first())
        .ok_or_else(|| format!("unexpected probe output {:?}", out.lines().next()))?;
    let get = |row: &HashMap<String, String>, key: &str| row.get(key).cloned().unwrap_or_default();
    let on = |value: String| matches!(value.as_str(), "1" | "ON" | "Yes");
    let replication = sets
        .get("Slave_IO_State")
        .and_then(|rows| rows.first())
        .map(|row| Replication {
            master_host: get(row, "Master_Host"),
            master_port: get(row, "Master_Port").parse().ok(),
            io_running: get(row, "Slave_IO_Running"),
            sql_running: on(get(row, "Slave_SQL_Running")),
            seconds_behind: get(row, "Seconds_Behind_Master").parse().ok(),
            relay_applied: get(row, "Slave_SQL_Running_State").contains("read all relay log")
                || (get(row, "Master_Log_File") == get(row, "Relay_Master_Log_File")
                    && get(row, "Read_Master_Log_Pos") == get(row, "Exec_Master_Log_Pos")),
            last_io_errno: get(row, "Last_IO_Errno").parse().unwrap_or(0),
            last_io_error: get(row, "Last_IO_Error"),
            last_sql_error: get(row, "Last_SQL_Error"),
        });
    let mut replica_hosts: Vec<String> = sets
        .get("Server_id")
        .map(|rows| {
            rows.iter()
                .map(|r| get(r, "Host"))
                .filter(|h| !h.is_empty())
                .collect()
        })
        .unwrap_or_default();
    replica_hosts.sort();
    Ok(MariadbProbe {
        version: crate::engine::version_number(&get(server, "devctl_version")),
        read_only: on(get(server, "read_only")),
        gtid_current: get(server, "gtid_current"),
        gtid_binlog: get(server, "gtid_binlog"),
        semi_sync_enabled: on(get(server, "semi_sync_enabled")),
        semi_sync_active: on(get(server, "semi_sync_status")),
        replica_hosts,
        replication,
    })
}

impl MariadbProbe {
    /// The engine-neutral probe the role state machine and the report read: writable is the
    /// primary's role; a replica "streams" while both replication threads run.
    pub fn to_probe(&self, system_identifier: Option<String>) -> Probe {
        let primary = !self.read_only;
        Probe {
            role: if primary { ROLE_PRIMARY } else { ROLE_REPLICA }.into(),
            system_identifier,
            engine_version: (!self.version.is_empty()).then(|| self.version.clone()),
            wal_receiver: self.replication.as_ref().filter(|_| !primary).map(|r| {
                if r.streaming() {
                    "streaming"
                } else {
                    "stopped"
                }
                .to_string()
            }),
            streaming_replicas: primary.then(|| self.replica_hosts.clone()),
            gtid_position: (!self.gtid_current.is_empty()).then(|| self.gtid_current.clone()),
            lag_seconds: self
                .replication
                .as_ref()
                .filter(|_| !primary)
                .and_then(|r| r.seconds_behind),
            semi_sync_active: (primary && self.semi_sync_enabled).then_some(self.semi_sync_active),
            mariadb: Some(self.clone()),
            ..Probe::default()
        }
    }
}

/// The instance's `server_id`: its ordinal plus one (unique within the cluster, never 0),
/// or a hash of its name for a pod without an ordinal.
pub fn server_id(pod: &str) -> u32 {
    match pod
        .rsplit_once('-')
        .and_then(|(_, n)| n.parse::<u32>().ok())
    {
        Some(ordinal) if ordinal < 1_000_000 => ordinal + 1,
        _ => {
            let hash = pod.bytes().fold(0x811c_9dc5_u32, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
            });
            1_000_000 + hash % 1_000_000_000
        }
    }
}

/// A string literal for SQL (single quotes; backslash and quote escaped).
pub fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for c in text.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// Points this replica at `host:port` and starts replication by GTID. `start`: the
/// position to start from (a fresh clone's); otherwise its own `gtid_slave_pos`.
pub fn replicate_sql(
    host: &str,
    port: u16,
    user: &str,
    password: &str,
    start: Option<&str>,
) -> String {
    let mut sql = String::from("STOP SLAVE;\n");
    if let Some(start) = start {
        sql.push_str(&format!(
            "SET GLOBAL gtid_slave_pos = {};\n",
            literal(start)
        ));
    }
    sql.push_str(&format!(
        "CHANGE MASTER TO MASTER_HOST = {}, MASTER_PORT = {port}, MASTER_USER = {}, MASTER_PASSWORD = {}, MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1, MASTER_HEARTBEAT_PERIOD = 2;\n\
         START SLAVE;\n",
        literal(host),
        literal(user),
        literal(password),
    ));
    sql
}

/// A failover candidate: stop receiving, keep applying what was received.
pub const STOP_RECEIVING_SQL: &str = "STOP SLAVE IO_THREAD;\n";

/// Takes a replica out of replication and makes it writable.
pub const PROMOTE_SQL: &str = "STOP SLAVE;\nRESET SLAVE ALL;\nSET GLOBAL read_only = OFF;\n";

/// A former primary about to rejoin: replication starts after everything it wrote itself.
pub const SLAVE_POS_FROM_BINLOG_SQL: &str = "SET GLOBAL gtid_slave_pos = @@gtid_binlog_pos;\n";

/// Creates (or updates) the replication user: it may replicate and nothing else. Outside the
/// binary log, on every instance (as the app user: [`crate::engine::Engine::apply_credentials`]).
pub fn replication_user_sql(user: &str, password_hash: &str) -> String {
    format!(
        "SET SESSION sql_log_bin = 0;\n\
         CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY PASSWORD '{password_hash}';\n\
         ALTER USER '{user}'@'%' IDENTIFIED BY PASSWORD '{password_hash}';\n\
         GRANT REPLICATION SLAVE ON *.* TO '{user}'@'%';\n"
    )
}

/// Whether an IO thread error says this replica has transactions the primary's binary log
/// lacks: its history diverged ("… diverged due to executing extra erroneous transactions"),
/// or it is ahead of the primary ("… which is not in the master's binlog"): errant
/// transactions either way.
pub fn diverged(replication: &Replication) -> bool {
    replication.last_io_errno == 1236
        && (replication.last_io_error.contains("diverged")
            || replication
                .last_io_error
                .contains("not in the master's binlog"))
}

/// Whether an IO thread error says the primary no longer has the binary logs this replica
/// needs (purged, or the primary was cloned after them): only a new clone helps. Other
/// errors (a packet too large, a lost connection) are reported, never acted on.
pub fn binlog_gone(replication: &Replication) -> bool {
    replication.last_io_errno == 1236
        && !diverged(replication)
        && (replication.last_io_error.contains("purged")
            || replication
                .last_io_error
                .contains("Could not find GTID state"))
}

/// The entries of a `gtid_binlog_state` (one per domain and server: the last sequence
/// number each server logged in each domain).
pub fn binlog_state(text: &str) -> Result<Vec<devctl_api::gtid::Gtid>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let parsed: Position = part.parse()?;
            Ok(parsed.first().ok_or("empty GTID")?)
        })
        .collect()
}

/// The errant transactions of a returning former primary, exactly: its own server's
/// transactions (`own_state`, its `gtid_binlog_state`) past the last the new primary logged
/// from that server (`primary_state`). `None` when the primary's state does not name this
/// server (its binary log does not reach back to it: the caller falls back to the promotion
/// position); `Some(None)` when there are none.
pub fn errant_by_state(
    own_state: &str,
    own_server: u32,
    primary_state: &str,
) -> Result<Option<Option<String>>, String> {
    let own = binlog_state(own_state)?;
    let primary = binlog_state(primary_state)?;
    let mut ranges = Vec::new();
    for mine in own.iter().filter(|g| g.server == own_server) {
        let Some(theirs) = primary
            .iter()
            .find(|g| g.domain == mine.domain && g.server == own_server)
        else {
            return Ok(None);
        };
        if theirs.sequence < mine.sequence {
            let first = theirs.sequence + 1;
            ranges.push(if first == mine.sequence {
                mine.to_string()
            } else {
                format!("{}-{}-{first}..{mine}", mine.domain, mine.server)
            });
        }
    }
    Ok(Some((!ranges.is_empty()).then(|| ranges.join(", "))))
}

/// The errant transactions of a returning former primary (`own`: its `gtid_binlog_pos`)
/// against the new primary's fork point (its position when promoted), if any.
pub fn errant(own: &str, fork: &str) -> Result<Option<String>, String> {
    let own: Position = own.parse()?;
    let fork: Position = fork.parse()?;
    Ok(own.errant_against(&fork))
}

#[cfg(test)]
mod tests;
