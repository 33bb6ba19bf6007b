//! The MariaDB steps of the role state machine, run on the engine (SQL over the private
//! socket as the socket-authenticated administrator, and the engine's own tools).

use std::time::Duration;

use super::{
    HANDOVER_MARKER, MariadbProbe, Marker, PROBE_SQL, PROMOTE_SQL, PROMOTED_MARKER, REPLICA_MARKER,
    STOP_RECEIVING_SQL, parse_probe,
};
use crate::engine::{Engine, Probe, write_private};
use crate::process;

/// How long a fence's `read_only = ON` may take before the engine is stopped regardless.
const FENCE_READ_ONLY_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a switchover waits for the replicas to have been sent every transaction.
const HANDOVER_SEND_TIMEOUT: Duration = Duration::from_secs(20);

/// One probe: the engine-neutral view plus MariaDB's own.
pub async fn probe(engine: &Engine) -> Result<Probe, String> {
    let out = engine.admin_sql_named(PROBE_SQL).await?;
    let found: MariadbProbe = parse_probe(&out)?;
    let id = engine.system_identifier().await.ok();
    Ok(found.to_probe(id))
}

/// Points the replica at the primary and starts replication (`start`: a fresh clone's
/// position, set as `gtid_slave_pos` first).
pub async fn replicate(
    engine: &Engine,
    host: &str,
    port: u16,
    user: &str,
    password: &str,
    start: Option<&str>,
) -> Result<(), String> {
    let sql = super::replicate_sql(host, port, user, password, start);
    engine
        .admin_sql(&sql)
        .await
        .map(|_| ())
        .map_err(|e| format!("CHANGE MASTER TO {host}:{port}: {e}"))
}

/// A failover candidate restarted meanwhile (`skip_slave_start`): what its relay log holds
/// is applied all the same.
pub async fn start_applying(engine: &Engine) -> Result<(), String> {
    engine
        .admin_sql("START SLAVE SQL_THREAD;\n")
        .await
        .map(|_| ())
}

/// `@@gtid_slave_pos`: the replicated transactions applied.
pub async fn slave_position(engine: &Engine) -> Result<String, String> {
    Ok(engine
        .admin_sql("SELECT @@gtid_slave_pos;\n")
        .await?
        .trim()
        .to_string())
}

/// `@@gtid_binlog_state`: per domain and server the last transaction this server logged.
pub async fn binlog_state(engine: &Engine) -> Result<String, String> {
    Ok(engine
        .admin_sql("SELECT @@gtid_binlog_state;\n")
        .await?
        .trim()
        .to_string())
}

/// The primary's `@@gtid_binlog_state`, asked as the replication user over the network
/// (the password in an option file of the run directory, never in argv).
pub async fn primary_binlog_state(
    engine: &Engine,
    host: &str,
    port: u16,
    user: &str,
    password: &str,
) -> Result<String, String> {
    let quote = |v: &str| format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""));
    let options = engine.config().run_dir.join("replication-client.cnf");
    write_private(
        &options,
        format!(
            "[client]\nhost={}\nport={port}\nuser={}\npassword={}\nprotocol=TCP\n",
            quote(host),
            quote(user),
            quote(password)
        )
        .as_bytes(),
    )?;
    let client = engine.mysql_tool("mariadb")?;
    let args = vec![
        format!("--defaults-file={}", options.display()),
        "--batch".to_string(),
        "--skip-column-names".into(),
        "--connect-timeout=5".into(),
    ];
    let output = process::run(
        &client,
        &args,
        &[],
        &engine.config().run_dir,
        b"SELECT @@global.gtid_binlog_state;\n",
        Duration::from_secs(10),
    )
    .await;
    let _ = std::fs::remove_file(&options);
    let output = output?;
    if !output.status.success() {
        return Err(format!(
            "asking the primary {host}:{port} for its binary log state: {}",
            output.error_line()
        ));
    }
    Ok(output.stdout.trim().to_string())
}

/// A failover candidate: stops receiving (what arrived is still applied).
pub async fn stop_receiving(engine: &Engine) -> Result<(), String> {
    engine.admin_sql(STOP_RECEIVING_SQL).await.map(|_| ())
}

/// Takes the replica out of replication and makes it writable; records the position it was
/// promoted at (a returning former primary's writes past it are errant).
pub async fn promote(engine: &Engine) -> Result<(), String> {
    let position = engine
        .admin_sql("SELECT @@gtid_current_pos;\n")
        .await?
        .trim()
        .to_string();
    write_private(
        &engine.data_dir().join(PROMOTED_MARKER),
        position.as_bytes(),
    )?;
    // A new term of the binary log archive begins here.
    super::archive::begin_term(
        engine.data_dir(),
        super::server_id(&engine.config().pod_name),
        &position,
    )?;
    engine.admin_sql(PROMOTE_SQL).await?;
    promoted(engine)
}

/// The engine accepts writes as the primary: its data is no replica's any more (also when
/// the promotion's call failed after `read_only = OFF` took effect).
pub fn promoted(engine: &Engine) -> Result<(), String> {
    remove_marker(engine, REPLICA_MARKER)
}

/// The position this instance was promoted at, if it was.
pub fn promoted_at(engine: &Engine) -> Option<String> {
    std::fs::read_to_string(engine.data_dir().join(PROMOTED_MARKER))
        .ok()
        .map(|t| t.trim().to_string())
}

/// The primary, holding the lock: writable.
pub async fn make_writable(engine: &Engine) -> Result<(), String> {
    engine
        .admin_sql("SET GLOBAL read_only = OFF;\n")
        .await
        .map(|_| ())
}

/// Fencing: read-only at once if the engine answers quickly (then it is stopped anyway).
pub async fn fence(engine: &Engine) {
    match engine
        .admin_sql_for("SET GLOBAL read_only = ON;\n", FENCE_READ_ONLY_TIMEOUT)
        .await
    {
        Ok(_) => tracing::info!("fenced: read_only = ON"),
        Err(e) => tracing::warn!("fencing: read_only = ON did not complete ({e}); stopping"),
    }
}

/// A switchover away from this primary: read-only, client sessions ended, every transaction
/// sent to the replicas (bounded); returns (and records) the final `gtid_binlog_pos`.
pub async fn prepare_handover(engine: &Engine) -> Result<String, String> {
    engine
        .admin_sql_for("SET GLOBAL read_only = ON;\n", HANDOVER_SEND_TIMEOUT)
        .await?;
    // Sessions of the application (not the replicas' binlog dumps nor this one).
    let kill = "SELECT CONCAT('KILL CONNECTION ', ID, ';') FROM information_schema.PROCESSLIST \
                WHERE ID <> CONNECTION_ID() AND COMMAND NOT IN ('Binlog Dump', 'Daemon') \
                AND USER NOT IN ('system user', 'event_scheduler');\n";
    if let Ok(statements) = engine.admin_sql(kill).await
        && !statements.trim().is_empty()
    {
        let _ = engine.admin_sql(&statements).await;
    }
    let final_position = engine
        .admin_sql("SELECT @@gtid_binlog_pos;\n")
        .await?
        .trim()
        .to_string();
    let deadline = tokio::time::Instant::now() + HANDOVER_SEND_TIMEOUT;
    let waiting = "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                   WHERE COMMAND = 'Binlog Dump' AND STATE NOT LIKE 'Master has sent all binlog%';\n";
    loop {
        match engine.admin_sql(waiting).await {
            Ok(out) if out.trim() == "0" => break,
            _ if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(
                    "switchover: a replica was not sent every transaction within {HANDOVER_SEND_TIMEOUT:?}; the target waits for {final_position}"
                );
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    write_private(
        &engine.data_dir().join(HANDOVER_MARKER),
        final_position.as_bytes(),
    )?;
    Ok(final_position)
}

/// The final position a primary stopped for a switchover recorded, if it did.
pub fn handed_over_at(engine: &Engine) -> Option<String> {
    std::fs::read_to_string(engine.data_dir().join(HANDOVER_MARKER))
        .ok()
        .map(|t| t.trim().to_string())
}

/// Forgets a switchover's final position (the engine starts again).
pub fn clear_handover(engine: &Engine) {
    let _ = std::fs::remove_file(engine.data_dir().join(HANDOVER_MARKER));
}

/// A switchover's target: `None` once it applied everything up to `final_position`,
/// otherwise why not yet.
pub async fn caught_up(engine: &Engine, final_position: &str) -> Result<Option<String>, String> {
    let wanted: devctl_api::gtid::Position = final_position.parse()?;
    let out = engine.admin_sql("SELECT @@gtid_current_pos;\n").await?;
    let have: devctl_api::gtid::Position = out.trim().parse()?;
    Ok((!have.contains(&wanted)).then(|| {
        format!("applied {have}, waiting for the old primary's last transaction {wanted}")
    }))
}

/// Switches semi-synchronous acknowledgements on this primary on or off.
pub async fn set_semi_sync(engine: &Engine, on: bool) -> Result<(), String> {
    let value = if on { "ON" } else { "OFF" };
    engine
        .admin_sql(&format!(
            "SET GLOBAL rpl_semi_sync_master_enabled = {value};\n"
        ))
        .await
        .map(|_| ())
}

/// A clone takes its primary's system identifier (what backups and the archive are filed
/// under: one per cluster, as PostgreSQL's).
pub fn adopt_system_identifier(engine: &Engine, id: &str) -> Result<(), String> {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(format!(
            "the primary reports an unusable system identifier {id:?}"
        ));
    }
    write_private(
        &engine.data_dir().join(crate::engine::SYSTEM_ID_FILE),
        id.as_bytes(),
    )
}

/// Writes the standby marker.
pub fn set_marker(engine: &Engine, marker: &Marker) -> Result<(), String> {
    write_private(
        &engine.data_dir().join(REPLICA_MARKER),
        marker.render().as_bytes(),
    )
}

fn remove_marker(engine: &Engine, name: &str) -> Result<(), String> {
    match std::fs::remove_file(engine.data_dir().join(name)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {name}: {e}")),
    }
}

/// `gtid_binlog_pos`: what this server wrote to its binary log (its own and replicated).
pub async fn binlog_position(engine: &Engine) -> Result<String, String> {
    Ok(engine
        .admin_sql("SELECT @@gtid_binlog_pos;\n")
        .await?
        .trim()
        .to_string())
}

/// A former primary rejoining: replication starts after what it wrote itself.
pub async fn slave_pos_from_binlog(engine: &Engine) -> Result<(), String> {
    engine
        .admin_sql(super::SLAVE_POS_FROM_BINLOG_SQL)
        .await
        .map(|_| ())
}

/// Dumps the transactions of this server's binary log after `fork` (the errant ones) as
/// SQL into `path`, for the administrator: `mariadb-binlog` of every binary log file.
pub async fn dump_errant(
    engine: &Engine,
    fork: &str,
    path: &std::path::Path,
) -> Result<(), String> {
    let program = engine.mysql_tool("mariadb-binlog")?;
    let data = engine.data_dir();
    let mut files: Vec<String> = std::fs::read_dir(data)
        .map_err(|e| format!("reading {}: {e}", data.display()))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("mysql-bin.")
                .is_some_and(|s| s.chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err("no binary log files".into());
    }
    let mut args = vec![format!("--start-position={fork}")];
    args.extend(files.iter().map(|f| data.join(f).display().to_string()));
    let output = process::run(&program, &args, &[], data, b"", Duration::from_secs(300)).await?;
    if !output.status.success() {
        return Err(format!("mariadb-binlog failed: {}", output.error_line()));
    }
    write_private(path, output.stdout.as_bytes())
}
