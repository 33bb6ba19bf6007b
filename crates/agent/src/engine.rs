//! The engines: locating binaries, bootstrapping an empty data directory, the server's
//! command line, administration over the private Unix socket, and probing.
//!
//! Administration uses the engines' own clients (`psql`, `mariadb`) with SQL on stdin and
//! `-At`/`-NB` output rather than a driver crate: the clients ship in the same image as
//! the server, speak peer/unix_socket authentication over the private socket out of the
//! box, and keep the agent's dependency list (and binary) small. Nothing secret is ever in
//! their argv: role passwords are sent as verifiers inside the SQL on stdin.

use std::path::{Path, PathBuf};
use std::time::Duration;

use devctl_api::instance::{ROLE_PRIMARY, ROLE_REPLICA};
use tokio::process::Command;

use crate::config::{Config, EngineKind, require_file};
use crate::credentials::{
    Credentials, ReplicationCredentials, mysql_native_hash, scram_sha256_verifier,
};
use crate::error::{Error, Result};
use crate::process;

/// PostgreSQL's rendered files (`devctl_operator::engine::postgres`).
pub const PG_CONF: &str = "postgresql.conf";
pub const PG_HBA: &str = "pg_hba.conf";
pub const PG_IDENT: &str = "pg_ident.conf";
/// MySQL's rendered file (`devctl_operator::engine::mysql`).
pub const MY_CNF: &str = "my.cnf";
/// The PostgreSQL superuser, reachable only by peer authentication on the private socket.
pub const PG_SUPERUSER: &str = "postgres";
/// Socket and pid file names in the run directory (MySQL family).
pub const MYSQL_SOCKET: &str = "mysqld.sock";
pub const MYSQL_PID: &str = "mysqld.pid";

const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Clone, Debug)]
enum Binaries {
    Postgres {
        dir: PathBuf,
    },
    Mysql {
        server: PathBuf,
        client: PathBuf,
        /// `mariadb-install-db` (MariaDB) or `None` (MySQL 8: `mysqld --initialize-insecure`).
        install_db: Option<PathBuf>,
        mariadb: bool,
    },
}

/// What one probe of the engine found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    pub role: String,
    pub system_identifier: Option<String>,
    pub timeline: Option<i64>,
    pub received_lsn: Option<String>,
    pub replayed_lsn: Option<String>,
    pub lag_bytes: Option<i64>,
    pub engine_version: Option<String>,
    /// PostgreSQL replicas: `pg_stat_wal_receiver.status` (`streaming`, ...), `None` while
    /// no WAL receiver runs.
    pub wal_receiver: Option<String>,
    /// PostgreSQL primaries: the `application_name`s (pod names) of the replicas streaming
    /// from this instance (`pg_stat_replication.state = 'streaming'`), sorted.
    pub streaming_replicas: Option<Vec<String>>,
    /// PostgreSQL: the agent's physical replication slots on this instance (`devctl_*`).
    pub slots: Vec<Slot>,
    /// MariaDB: `gtid_current_pos`.
    pub gtid_position: Option<String>,
    /// MariaDB replicas: `Seconds_Behind_Master`.
    pub lag_seconds: Option<i64>,
    /// A MariaDB primary with semi-synchronous replication enabled: whether it is active.
    pub semi_sync_active: Option<bool>,
    /// MariaDB: everything its probe found ([`crate::mariadb`]).
    pub mariadb: Option<crate::mariadb::MariadbProbe>,
}

/// One of the agent's physical replication slots as `pg_replication_slots` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    /// A walsender streams through it now.
    pub active: bool,
    /// `wal_status = 'lost'`: it fell further behind than `max_slot_wal_keep_size` and was
    /// invalidated; it retains nothing any more.
    pub lost: bool,
}

/// The prefix of every replication slot the agent manages (others are never touched).
pub const SLOT_PREFIX: &str = "devctl_";

/// The physical replication slot the primary keeps for the instance `pod`: `devctl_` and the
/// pod name with `-`/`.` as `_` (slot names allow `[a-z0-9_]`, at most 63 bytes; a longer
/// name ends in a hash of the whole so two pods never share one).
pub fn slot_name(pod: &str) -> String {
    let body: String = pod
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect();
    let name = format!("{SLOT_PREFIX}{body}");
    if name.len() <= 63 {
        return name;
    }
    // FNV-1a: stable across releases (the slot outlives the agent that named it).
    let hash = pod.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{}_{:016x}", &name[..46], hash)
}

impl Probe {
    /// A replica that streams from its primary (and answered this probe, so it accepts
    /// read connections).
    pub fn is_streaming(&self) -> bool {
        self.role == ROLE_REPLICA && self.wal_receiver.as_deref() == Some("streaming")
    }
}

/// PostgreSQL's marker file of a standby.
pub const STANDBY_SIGNAL: &str = "standby.signal";
/// The file `ALTER SYSTEM` writes, in the data directory.
pub const AUTO_CONF: &str = "postgresql.auto.conf";
/// Settings the agent owns in [`AUTO_CONF`] on a replica.
const STANDBY_SETTINGS: [&str; 3] = [
    "primary_conninfo",
    "primary_slot_name",
    "recovery_target_timeline",
];
/// PostgreSQL's `archive_timeout`: the longest a committed change waits before its WAL
/// segment is switched and archived (docs/backup.md).
pub const ARCHIVE_TIMEOUT_SECONDS: u32 = 60;
/// Marker file of a PostgreSQL data directory recovering from an archive.
pub const RECOVERY_SIGNAL: &str = "recovery.signal";
/// Settings a restore writes into [`AUTO_CONF`] and removes once promoted; replicas drop
/// them too (a clone must never inherit a recovery target).
pub const RECOVERY_SETTINGS: [&str; 8] = [
    "restore_command",
    "recovery_target",
    "recovery_target_time",
    "recovery_target_lsn",
    "recovery_target_xid",
    "recovery_target_name",
    "recovery_target_action",
    "recovery_target_inclusive",
];
/// Settings of the source cluster a restored data directory must not keep.
const SOURCE_SETTINGS: [&str; 3] = [
    "primary_conninfo",
    "primary_slot_name",
    "synchronous_standby_names",
];
/// The MySQL family has no system identifier of its own for the store's layout: a random
/// one is kept in this file of the data directory.
pub const SYSTEM_ID_FILE: &str = ".devctl-system-identifier";

/// `text` as one word for `/bin/sh`, with `%` doubled for PostgreSQL's `%p`/`%f`
/// substitution in `archive_command`/`restore_command`.
pub fn shell_word_for_postgres(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''").replace('%', "%%"))
}

/// A clone may take long on big databases; this only bounds a hung `pg_basebackup`.
const CLONE_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// A libpq connection-string value, always quoted.
fn conninfo_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A string setting's value as PostgreSQL's configuration files (and SQL literals with
/// `standard_conforming_strings`) quote it.
fn quote_setting(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// The `ALTER SYSTEM` lines for a running replica's changed standby settings, and one
/// reload; `None` when nothing changes.
fn standby_settings_sql(conninfo: Option<&str>, extras: Option<&StandbyExtras>) -> Option<String> {
    let mut sql = String::new();
    if let Some(conninfo) = conninfo {
        sql += &format!(
            "ALTER SYSTEM SET primary_conninfo = {};\n",
            quote_setting(conninfo)
        );
    }
    if let Some(extras) = extras {
        sql += &format!(
            "ALTER SYSTEM SET primary_slot_name = {};\nALTER SYSTEM SET restore_command = {};\n",
            quote_setting(&extras.slot),
            quote_setting(&extras.restore_command)
        );
    }
    (!sql.is_empty()).then(|| sql + "SELECT pg_reload_conf();\n")
}

/// `initdb`'s arguments for a PostgreSQL data directory at `data`: the superuser reachable by
/// peer authentication only, SCRAM over the network, UTF-8; `checksums` is the checksum flag
/// (the agent's bootstrap always enables them; a major upgrade's new cluster copies the old
/// one's setting).
pub fn initdb_args(data: &Path, checksums: &[&str]) -> Vec<String> {
    let mut args = vec![
        "-D".to_string(),
        data.display().to_string(),
        format!("--username={PG_SUPERUSER}"),
        "--auth-local=peer".into(),
        "--auth-host=scram-sha-256".into(),
        "--encoding=UTF8".into(),
        "--no-instructions".into(),
    ];
    args.extend(checksums.iter().map(|c| c.to_string()));
    args
}

/// `pg_controldata` (from the binaries in `bin`) of the stopped data directory `data`.
pub async fn control_data(bin: &Path, data: &Path) -> Result<ControlData, String> {
    let args = vec!["-D".to_string(), data.display().to_string()];
    let envs = [("LC_ALL", "C".to_string()), ("LANG", "C".to_string())];
    let output = process::run(
        &bin.join("pg_controldata"),
        &args,
        &envs,
        data,
        b"",
        CLIENT_TIMEOUT,
    )
    .await?;
    if !output.status.success() {
        return Err(format!("pg_controldata failed: {}", output.error_line()));
    }
    parse_control_data(&output.stdout).ok_or_else(|| "unexpected pg_controldata output".to_string())
}

/// `primary_conninfo` for a replica streaming from `host:port` as `user`, the password
/// being in `passfile` (never in the string itself).
pub fn primary_conninfo(
    host: &str,
    port: u16,
    user: &str,
    passfile: &Path,
    application_name: &str,
) -> String {
    format!(
        "host={} port={port} user={} passfile={} application_name={} connect_timeout=5",
        conninfo_value(host),
        conninfo_value(user),
        conninfo_value(&passfile.display().to_string()),
        conninfo_value(application_name)
    )
}

/// A replica's settings besides `primary_conninfo`: the slot it streams through and its
/// `restore_command` (empty: none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StandbyExtras {
    pub slot: String,
    pub restore_command: String,
}

/// `postgresql.auto.conf` with the agent's standby settings replaced (other lines kept;
/// `primary_conninfo` too when `conninfo` is `None`).
pub fn with_standby_settings(
    current: &str,
    conninfo: Option<&str>,
    extras: &StandbyExtras,
) -> String {
    let mut out: String = current
        .lines()
        .filter(|line| {
            let key = line.split('=').next().unwrap_or_default().trim();
            if RECOVERY_SETTINGS.contains(&key) {
                // A clone of a restored primary that had not yet cleared its recovery
                // target: a standby must never stop (and promote) at it.
                return false;
            }
            // Without a new conninfo the previous one stays (a restart while the primary's
            // address is unknown keeps streaming from where it did).
            !STANDBY_SETTINGS.contains(&key) || (conninfo.is_none() && key == "primary_conninfo")
        })
        .map(|line| format!("{line}\n"))
        .collect();
    if let Some(conninfo) = conninfo {
        out.push_str(&format!(
            "primary_conninfo = {}\n",
            quote_setting(&conninfo.replace('\\', "\\\\"))
        ));
    }
    if !extras.slot.is_empty() {
        out.push_str(&format!(
            "primary_slot_name = {}\n",
            quote_setting(&extras.slot)
        ));
    }
    if !extras.restore_command.is_empty() {
        out.push_str(&format!(
            "restore_command = {}\n",
            quote_setting(&extras.restore_command.replace('\\', "\\\\"))
        ));
    }
    out.push_str("recovery_target_timeline = 'latest'\n");
    out
}

/// `postgresql.auto.conf` of a restored data directory: the source's recovery, standby and
/// synchronous-replication settings removed, then `restore_command`, the target and
/// `recovery_target_action = 'promote'`, `recovery_target_timeline = 'latest'`.
pub fn with_recovery_settings(
    current: &str,
    restore_command: &str,
    target_time: Option<&str>,
) -> String {
    let mut out: String = current
        .lines()
        .filter(|line| {
            let key = line.split('=').next().unwrap_or_default().trim();
            !RECOVERY_SETTINGS.contains(&key)
                && !SOURCE_SETTINGS.contains(&key)
                && key != "recovery_target_timeline"
        })
        .map(|line| format!("{line}\n"))
        .collect();
    out.push_str(&format!(
        "restore_command = {}\n",
        quote_setting(&restore_command.replace('\\', "\\\\"))
    ));
    if let Some(time) = target_time {
        out.push_str(&format!("recovery_target_time = {}\n", quote_setting(time)));
    }
    out.push_str("recovery_target_action = 'promote'\n");
    out.push_str("recovery_target_timeline = 'latest'\n");
    out
}

/// Whether `postgresql.auto.conf` still holds recovery settings.
pub fn has_recovery_settings(auto_conf: &str) -> bool {
    auto_conf.lines().any(|line| {
        let key = line.split('=').next().unwrap_or_default().trim();
        RECOVERY_SETTINGS.contains(&key)
    })
}

/// One engine instance as configured by the environment.
#[derive(Clone, Debug)]
pub struct Engine {
    config: Config,
    bins: Binaries,
    /// The OS user the agent (and so the engine) runs as.
    os_user: String,
    /// This executable: PostgreSQL's `archive_command`/`restore_command` run it.
    agent_exe: PathBuf,
}

impl Engine {
    /// Finds the engine's binaries (exit 69 when missing) and checks the rendered
    /// configuration files exist (exit 78).
    pub fn locate(config: &Config) -> Result<Self> {
        let os_user = process::current_user_name().ok_or_else(|| {
            Error::Engine(
                "the agent's user id has no name (no passwd entry); the engines need one".into(),
            )
        })?;
        let bins = match config.engine {
            EngineKind::Postgres => {
                if process::is_root() {
                    return Err(Error::Engine(
                        "PostgreSQL refuses to run as root: run the pod as a non-root user".into(),
                    ));
                }
                Binaries::Postgres {
                    dir: find_postgres_bin_dir(config.engine_bin_dir.as_deref())?,
                }
            }
            EngineKind::Mysql | EngineKind::Mariadb => {
                let dirs =
                    search_dirs(config.engine_bin_dir.as_deref(), &["/usr/sbin", "/usr/bin"]);
                let (server, mariadb) = match find(&dirs, "mariadbd") {
                    Some(s) => (s, true),
                    None => (
                        find(&dirs, "mysqld").ok_or_else(|| {
                            Error::Engine(format!(
                                "neither mariadbd nor mysqld found in {}",
                                describe(&dirs)
                            ))
                        })?,
                        false,
                    ),
                };
                let client = find(&dirs, "mariadb")
                    .or_else(|| find(&dirs, "mysql"))
                    .ok_or_else(|| {
                        Error::Engine(format!(
                            "neither mariadb nor mysql client found in {}",
                            describe(&dirs)
                        ))
                    })?;
                let install_db = if mariadb {
                    find(&dirs, "mariadb-install-db")
                } else {
                    None
                };
                if mariadb && install_db.is_none() {
                    return Err(Error::Engine(format!(
                        "mariadb-install-db not found in {}",
                        describe(&dirs)
                    )));
                }
                Binaries::Mysql {
                    server,
                    client,
                    install_db,
                    mariadb,
                }
            }
        };
        let agent_exe = std::env::current_exe()
            .map_err(|e| Error::Internal(format!("cannot find the agent's own executable: {e}")))?;
        let engine = Engine {
            config: config.clone(),
            bins,
            os_user,
            agent_exe,
        };
        for file in engine.config_files() {
            require_file(&file)?;
        }
        Ok(engine)
    }

    pub fn kind(&self) -> EngineKind {
        self.config.engine
    }

    /// Short name for logs and log-line prefixes.
    pub fn name(&self) -> &'static str {
        match &self.bins {
            Binaries::Postgres { .. } => "postgres",
            Binaries::Mysql { mariadb: true, .. } => "mariadbd",
            Binaries::Mysql { mariadb: false, .. } => "mysqld",
        }
    }

    fn config_files(&self) -> Vec<PathBuf> {
        match self.config.engine {
            EngineKind::Postgres => [PG_CONF, PG_HBA, PG_IDENT]
                .iter()
                .map(|f| self.config.config_file(f))
                .collect(),
            EngineKind::Mysql | EngineKind::Mariadb => vec![self.config.config_file(MY_CNF)],
        }
    }

    /// Whether the data directory already holds a database.
    pub fn is_bootstrapped(&self) -> bool {
        let data = &self.config.data_dir;
        match self.config.engine {
            EngineKind::Postgres => data.join("PG_VERSION").is_file(),
            EngineKind::Mysql | EngineKind::Mariadb => data.join("mysql").is_dir(),
        }
    }

    /// Initialises an empty data directory (exit 69 when that fails; the directory is
    /// emptied again so the next attempt starts clean).
    pub async fn bootstrap(&self) -> Result<()> {
        let data = &self.config.data_dir;
        let (program, args) = match &self.bins {
            Binaries::Postgres { dir } => {
                (dir.join("initdb"), initdb_args(data, &["--data-checksums"]))
            }
            Binaries::Mysql {
                install_db: Some(install_db),
                ..
            } => {
                let mut args = vec![
                    format!(
                        "--defaults-file={}",
                        self.config.config_file(MY_CNF).display()
                    ),
                    format!("--datadir={}", data.display()),
                    "--auth-root-authentication-method=socket".into(),
                    format!("--auth-root-socket-user={}", self.os_user),
                    "--skip-test-db".into(),
                    // The pod's own temporary directory: servers sharing a host's /tmp
                    // (process-backed pods) remove each other's temporary files.
                    format!("--tmpdir={}", self.config.run_dir.display()),
                ];
                if process::is_root() {
                    args.push("--user=root".into());
                }
                (install_db.clone(), args)
            }
            // MySQL 8: best effort, untested here (see the crate docs).
            Binaries::Mysql {
                server,
                install_db: None,
                ..
            } => {
                let mut args = vec![
                    format!(
                        "--defaults-file={}",
                        self.config.config_file(MY_CNF).display()
                    ),
                    "--initialize-insecure".into(),
                    format!("--datadir={}", data.display()),
                ];
                if process::is_root() {
                    args.push("--user=root".into());
                }
                (server.clone(), args)
            }
        };
        tracing::info!(command = %program.display(), args = ?args, "bootstrapping the data directory");
        let output = process::run(&program, &args, &[], data, b"", BOOTSTRAP_TIMEOUT)
            .await
            .map_err(Error::Engine)?;
        for line in output.stdout.lines().chain(output.stderr.lines()) {
            tracing::info!(target: "bootstrap", "{line}");
        }
        if !output.status.success() {
            clear_dir(data);
            return Err(Error::Engine(format!(
                "{} failed: {}",
                program.display(),
                output.error_line()
            )));
        }
        if let Binaries::Mysql {
            install_db: None, ..
        } = &self.bins
        {
            // `--initialize-insecure` leaves root@localhost without a password; the first
            // start restricts it to the socket (see `secure_root_sql`).
            tracing::warn!("MySQL 8 bootstrap: root is restricted to the socket on first start");
        }
        Ok(())
    }

    /// The server's command line (stdout/stderr to be forwarded by the caller).
    pub fn server_command(&self) -> Command {
        let c = &self.config;
        let (program, args): (PathBuf, Vec<String>) = match &self.bins {
            Binaries::Postgres { dir } => (
                dir.join("postgres"),
                vec![
                    "-D".into(),
                    c.data_dir.display().to_string(),
                    "-c".into(),
                    format!("config_file={}", c.config_file(PG_CONF).display()),
                    "-c".into(),
                    format!("hba_file={}", c.config_file(PG_HBA).display()),
                    "-c".into(),
                    format!("ident_file={}", c.config_file(PG_IDENT).display()),
                    "-c".into(),
                    format!("port={}", c.port),
                    "-c".into(),
                    format!("listen_addresses={}", c.listen_address),
                    "-c".into(),
                    format!("unix_socket_directories={}", c.run_dir.display()),
                    "-c".into(),
                    "unix_socket_permissions=0700".into(),
                    // WAL archiving through the agent (docs/backup.md); on a standby
                    // `on` archives nothing until it is promoted.
                    "-c".into(),
                    "archive_mode=on".into(),
                    "-c".into(),
                    format!("archive_command={}", self.archive_command()),
                    "-c".into(),
                    format!("archive_timeout={ARCHIVE_TIMEOUT_SECONDS}"),
                ],
            ),
            Binaries::Mysql { server, .. } => {
                let mut args = vec![
                    // Must come first.
                    format!("--defaults-file={}", c.config_file(MY_CNF).display()),
                    format!("--datadir={}", c.data_dir.display()),
                    format!("--socket={}", c.run_dir.join(MYSQL_SOCKET).display()),
                    format!("--pid-file={}", c.run_dir.join(MYSQL_PID).display()),
                    format!("--tmpdir={}", c.run_dir.display()),
                    format!("--port={}", c.port),
                    format!("--bind-address={}", c.listen_address),
                ];
                if process::is_root() {
                    args.push("--user=root".into());
                }
                if c.engine == EngineKind::Mariadb {
                    // What differs per instance: its replication identity.
                    args.push(format!(
                        "--server-id={}",
                        crate::mariadb::server_id(&c.pod_name)
                    ));
                    args.push(format!("--report-host={}", c.pod_name));
                    args.push(format!("--report-port={}", c.port));
                }
                (server.clone(), args)
            }
        };
        tracing::info!(command = %program.display(), args = ?args, "starting the engine");
        let mut command = Command::new(program);
        command.args(args).current_dir(&c.data_dir);
        command
    }

    /// The signal that makes the server shut down fast but cleanly.
    pub fn stop_signal(&self) -> libc::c_int {
        match self.config.engine {
            // SIGINT: "fast shutdown" (SIGTERM would wait for clients to disconnect).
            EngineKind::Postgres => libc::SIGINT,
            EngineKind::Mysql | EngineKind::Mariadb => libc::SIGTERM,
        }
    }

    /// [`Engine::admin_sql`] with a longer limit (a checkpoint, a promotion).
    pub async fn admin_sql_for(&self, sql: &str, timeout: Duration) -> Result<String, String> {
        self.admin_sql_timeout(sql, timeout).await
    }

    /// Runs `sql` as the engine's administrator over the private socket and returns the
    /// unaligned, tuples-only output (PostgreSQL: `|`-separated; MySQL: tab-separated).
    pub async fn admin_sql(&self, sql: &str) -> Result<String, String> {
        self.admin_sql_timeout(sql, CLIENT_TIMEOUT).await
    }

    async fn admin_sql_timeout(&self, sql: &str, timeout: Duration) -> Result<String, String> {
        let c = &self.config;
        let (program, args) = match &self.bins {
            Binaries::Postgres { dir } => (
                dir.join("psql"),
                vec![
                    "-X".to_string(),
                    "-q".into(),
                    "-A".into(),
                    "-t".into(),
                    "-F".into(),
                    "|".into(),
                    "-v".into(),
                    "ON_ERROR_STOP=1".into(),
                    "-h".into(),
                    c.run_dir.display().to_string(),
                    "-p".into(),
                    c.port.to_string(),
                    "-U".into(),
                    PG_SUPERUSER.into(),
                    "-d".into(),
                    "postgres".into(),
                ],
            ),
            Binaries::Mysql { client, .. } => (
                client.clone(),
                vec![
                    "--no-defaults".to_string(),
                    "--protocol=socket".into(),
                    format!("--socket={}", c.run_dir.join(MYSQL_SOCKET).display()),
                    format!("--user={}", self.os_user),
                    "--batch".into(),
                    "--skip-column-names".into(),
                    "--connect-timeout=5".into(),
                ],
            ),
        };
        // The agent's own writes (roles, settings) never wait for a synchronous standby: a
        // freshly promoted primary applies them before any standby follows it.
        let envs = [
            ("PGCONNECT_TIMEOUT", "5".to_string()),
            ("PGOPTIONS", "-c synchronous_commit=local".to_string()),
        ];
        let output =
            process::run(&program, &args, &envs, &c.run_dir, sql.as_bytes(), timeout).await?;
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(output.error_line())
        }
    }

    /// Creates (or updates) the application role/user and its database from `credentials`.
    /// PostgreSQL's app role is a member of `pg_monitor` (read-only statistics and settings):
    /// the team that owns the database sees replication and activity (`pg_stat_replication`,
    /// `pg_stat_activity`) without superuser rights.
    pub async fn apply_credentials(&self, credentials: &Credentials) -> Result<(), String> {
        let user = &credentials.username;
        let db = &credentials.dbname;
        // Both are checked identifiers ([A-Za-z0-9_]); the verifiers are base64/hex.
        let sql = match &self.bins {
            Binaries::Postgres { .. } => {
                let verifier = scram_sha256_verifier(&credentials.password);
                // This session only: a statement that fails is not logged with its text
                // (the verifier), whatever the server's log_min_error_statement.
                format!(
                    "SET log_statement = 'none';\n\
                     SET log_min_duration_statement = -1;\n\
                     SET log_min_error_statement = 'panic';\n\
                     SELECT 'CREATE ROLE \"{user}\"' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{user}')\\gexec\n\
                     ALTER ROLE \"{user}\" WITH LOGIN NOSUPERUSER NOCREATEROLE NOREPLICATION PASSWORD '{verifier}';\n\
                     GRANT pg_monitor TO \"{user}\";\n\
                     SELECT 'CREATE DATABASE \"{db}\" OWNER \"{user}\"' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{db}')\\gexec\n"
                )
            }
            Binaries::Mysql { mariadb, .. } => {
                let hash = mysql_native_hash(&credentials.password);
                let identified = if *mariadb {
                    format!("IDENTIFIED BY PASSWORD '{hash}'")
                } else {
                    format!("IDENTIFIED WITH mysql_native_password AS '{hash}'")
                };
                // Replicated MariaDB: every instance's agent applies them to its own engine,
                // outside the binary log — never waiting for a semi-synchronous
                // acknowledgement (a promoted replica must not wait for replicas that follow
                // it only once it serves), and never a transaction of its own in the history.
                let local = if self.config.engine == EngineKind::Mariadb {
                    "SET SESSION sql_log_bin = 0;\n"
                } else {
                    ""
                };
                format!(
                    "{local}CREATE DATABASE IF NOT EXISTS `{db}`;\n\
                     CREATE USER IF NOT EXISTS '{user}'@'%' {identified};\n\
                     ALTER USER '{user}'@'%' {identified};\n\
                     GRANT ALL PRIVILEGES ON `{db}`.* TO '{user}'@'%';\n"
                )
            }
        };
        self.admin_sql(&sql).await.map(|_| ())
    }

    /// PostgreSQL: creates (or updates) the replication role from `replication` and makes
    /// sure it can read no application database (it may connect to the empty `postgres`
    /// database and run the file functions `pg_rewind` needs — what physical replication
    /// already gives it — and `pg_switch_wal()`, so a replica's backup can have its last WAL
    /// segment archived at once): `CONNECT` on the app database goes to its owner only,
    /// and no database is connectable by `PUBLIC` (the superuser connects regardless).
    /// Physical replication connections need no `CONNECT` privilege.
    pub async fn apply_replication_role(
        &self,
        replication: &ReplicationCredentials,
        app: &Credentials,
    ) -> Result<(), String> {
        if self.config.engine == EngineKind::Mariadb {
            if replication.username == app.username {
                return Err(format!(
                    "the replication Secret names the app user {}; refusing to make it a replication user",
                    app.username
                ));
            }
            let hash = mysql_native_hash(&replication.password);
            let sql = crate::mariadb::replication_user_sql(&replication.username, &hash);
            return self.admin_sql(&sql).await.map(|_| ());
        }
        let Binaries::Postgres { .. } = &self.bins else {
            return Ok(());
        };
        let user = &replication.username;
        let (app_user, app_db) = (&app.username, &app.dbname);
        if user == app_user {
            return Err(format!(
                "the replication Secret names the app role {user}; refusing to make it a replication role"
            ));
        }
        // Identifiers are checked ([A-Za-z0-9_]); the verifier is base64.
        let verifier = scram_sha256_verifier(&replication.password);
        let sql = format!(
            "SET log_statement = 'none';\n\
             SET log_min_duration_statement = -1;\n\
             SET log_min_error_statement = 'panic';\n\
             SELECT 'CREATE ROLE \"{user}\" WITH REPLICATION LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{user}')\\gexec\n\
             ALTER ROLE \"{user}\" WITH REPLICATION LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS PASSWORD '{verifier}';\n\
             SELECT format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', datname) FROM pg_database WHERE datallowconn\\gexec\n\
             SELECT 'GRANT CONNECT, TEMPORARY ON DATABASE \"{app_db}\" TO \"{app_user}\"' WHERE EXISTS (SELECT FROM pg_database WHERE datname = '{app_db}')\\gexec\n\
             GRANT CONNECT ON DATABASE postgres TO \"{user}\";\n\
             GRANT EXECUTE ON FUNCTION pg_catalog.pg_ls_dir(text, boolean, boolean), pg_catalog.pg_stat_file(text, boolean), pg_catalog.pg_read_binary_file(text), pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean) TO \"{user}\";\n\
             GRANT EXECUTE ON FUNCTION pg_catalog.pg_switch_wal() TO \"{user}\";\n"
        );
        self.admin_sql(&sql).await.map(|_| ())
    }

    /// Whether the data directory is a standby's (`standby.signal`; MariaDB:
    /// [`crate::mariadb::REPLICA_MARKER`]).
    pub fn is_standby(&self) -> bool {
        let marker = match self.config.engine {
            EngineKind::Mariadb => crate::mariadb::REPLICA_MARKER,
            _ => STANDBY_SIGNAL,
        };
        self.config.data_dir.join(marker).is_file()
    }

    /// Before starting a replica: `standby.signal`, and `primary_conninfo` (when known) and
    /// `recovery_target_timeline = 'latest'` in `postgresql.auto.conf`.
    pub fn write_standby_settings(
        &self,
        conninfo: Option<&str>,
        extras: &StandbyExtras,
    ) -> Result<(), String> {
        let data = &self.config.data_dir;
        let signal = data.join(STANDBY_SIGNAL);
        if !signal.is_file() {
            std::fs::write(&signal, b"")
                .map_err(|e| format!("cannot write {}: {e}", signal.display()))?;
        }
        let path = data.join(AUTO_CONF);
        let current = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        write_private(
            &path,
            with_standby_settings(&current, conninfo, extras).as_bytes(),
        )
    }

    /// PostgreSQL, engine stopped: `pg_controldata`'s view of the data directory.
    pub async fn control_data(&self) -> Result<ControlData, String> {
        let Binaries::Postgres { dir } = &self.bins else {
            return Err("pg_controldata is only for PostgreSQL".into());
        };
        control_data(dir, &self.config.data_dir).await
    }

    /// Planned switchover, target: whether this standby has received and replayed the old
    /// primary's shutdown checkpoint at `final_lsn` (`Ok(None)`), or why not yet.
    pub async fn switchover_progress(&self, final_lsn: &str) -> Result<Option<String>, String> {
        if self.config.engine == EngineKind::Mariadb {
            return crate::mariadb::ops::caught_up(self, final_lsn).await;
        }
        if !is_lsn(final_lsn) {
            return Err(format!("malformed finalLSN {final_lsn:?}"));
        }
        let out = self
            .admin_sql(&format!(
                "SELECT pg_is_in_recovery(), pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn(), \
                 pg_wal_lsn_diff(pg_last_wal_receive_lsn(), '{final_lsn}'::pg_lsn) >= 0, \
                 pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '{final_lsn}'::pg_lsn) > 0;\n"
            ))
            .await?;
        let line = out.lines().next().unwrap_or_default();
        let f: Vec<&str> = line.split('|').collect();
        if f.len() != 5 {
            return Err(format!("unexpected output {line:?}"));
        }
        if f[0] != "t" {
            return Err("the engine is not in recovery".into());
        }
        if f[3] == "t" && f[4] == "t" {
            return Ok(None);
        }
        let show = |s: &str| {
            if s.is_empty() {
                "none".to_string()
            } else {
                s.to_string()
            }
        };
        Ok(Some(format!(
            "received {}, replayed {}, the old primary's finalLSN {final_lsn} not reached yet",
            show(f[1]),
            show(f[2])
        )))
    }

    /// Promotes this standby (switchover or failover target): `pg_promote(true, 60)`; `Ok`
    /// once the server has left recovery, whatever the function answered. The CHECKPOINT
    /// that used to follow here is [`Self::checkpoint_after_promotion`], off the critical path.
    pub async fn promote(&self) -> Result<(), String> {
        if self.config.engine == EngineKind::Mariadb {
            return crate::mariadb::ops::promote(self).await;
        }
        let asked = self
            .admin_sql_timeout("SELECT pg_promote(true, 60);\n", Duration::from_secs(75))
            .await;
        // What counts is whether the engine left recovery, not what the function answered:
        // it may answer `f` after its wait while the promotion completes, or its session may
        // fail after the promotion took effect. Either way a server that accepts writes is a
        // primary and must be treated as one (held to the lock, or fenced).
        match self.in_recovery().await {
            Ok(false) => Ok(()),
            Ok(true) => Err(match asked {
                Ok(out) => format!(
                    "pg_promote did not complete within 60s ({}); still in recovery",
                    out.trim()
                ),
                Err(e) => format!("{e}; still in recovery"),
            }),
            Err(e) => Err(match asked {
                Ok(_) => format!("asking whether the promotion took effect: {e}"),
                Err(asked) => asked,
            }),
        }
    }

    /// PostgreSQL: whether the running server is in recovery (a standby, or not promoted yet).
    pub async fn in_recovery(&self) -> Result<bool, String> {
        let out = self.admin_sql("SELECT pg_is_in_recovery();\n").await?;
        match out.trim() {
            "t" => Ok(true),
            "f" => Ok(false),
            other => Err(format!("pg_is_in_recovery() answered {other:?}")),
        }
    }

    /// A CHECKPOINT (up to 5 minutes) after a promotion. Until one completes, the control
    /// file (and so the reported `timeline`, which comes from it) still names the old
    /// timeline, and `pg_rewind` before PostgreSQL 16 reads the source's timeline from there:
    /// a former primary rewinding against it would find "no rewind required". So a former
    /// primary waits for the new primary's reported timeline to pass its own before it
    /// rewinds, and the new primary checkpoints at once (in the background; PostgreSQL's own
    /// end-of-recovery checkpoint is spread out over minutes). The test hook
    /// [`crate::test_hooks::CHECKPOINT_AFTER_PROMOTE`] fails it.
    pub async fn checkpoint_after_promotion(
        &self,
        hooks: &crate::test_hooks::TestHooks,
    ) -> Result<(), String> {
        if hooks.checkpoint_after_promote_fails() {
            return Err("CHECKPOINT failed (test hook checkpoint-after-promote=fail)".into());
        }
        self.admin_sql_timeout("CHECKPOINT;\n", Duration::from_secs(300))
            .await
            .map(|_| ())
    }

    /// On a running replica: a new `primary_conninfo` and/or slot and `restore_command`,
    /// through `ALTER SYSTEM` and **one** reload (each reload that changes them restarts the
    /// WAL receiver; a re-pointed replica that reloaded twice reconnected twice).
    pub async fn set_standby_settings(
        &self,
        conninfo: Option<&str>,
        extras: Option<&StandbyExtras>,
    ) -> Result<(), String> {
        let Some(sql) = standby_settings_sql(conninfo, extras) else {
            return Ok(());
        };
        self.admin_sql(&sql).await.map(|_| ())
    }

    /// Creates the physical slot `name`. It keeps WAL from the replica's first connection on
    /// (not before: a replica that never comes pins nothing; its clone streams its own WAL).
    pub async fn create_slot(&self, name: &str) -> Result<(), String> {
        self.admin_sql(&format!(
            "SELECT pg_create_physical_replication_slot({}, false);\n",
            quote_setting(name)
        ))
        .await
        .map(|_| ())
    }

    /// Drops the slot `name` (refused by PostgreSQL while a walsender uses it).
    pub async fn drop_slot(&self, name: &str) -> Result<(), String> {
        self.admin_sql(&format!(
            "SELECT pg_drop_replication_slot({});\n",
            quote_setting(name)
        ))
        .await
        .map(|_| ())
    }

    /// A promoted replica: its slot and archive fallback removed (a primary has no use for
    /// them, and a leftover `restore_command` would read as a restore's).
    pub async fn clear_standby_extras(&self) -> Result<(), String> {
        self.admin_sql(
            "ALTER SYSTEM RESET primary_slot_name;\nALTER SYSTEM RESET restore_command;\nSELECT pg_reload_conf();\n",
        )
        .await
        .map(|_| ())
    }

    /// On the primary: `synchronous_standby_names` through `ALTER SYSTEM` and a reload.
    pub async fn set_synchronous_standby_names(&self, value: &str) -> Result<(), String> {
        let sql = format!(
            "ALTER SYSTEM SET synchronous_standby_names = {};\nSELECT pg_reload_conf();\n",
            quote_setting(value)
        );
        self.admin_sql(&sql).await.map(|_| ())
    }

    /// PostgreSQL, engine stopped: rewinds this former primary's data to the point where its
    /// history forked from the primary at `host:port` (`pg_rewind`, as `user` with the
    /// password from `passfile`; a data directory not shut down cleanly is first recovered in
    /// single-user mode with our configuration file). The data then needs `standby.signal`
    /// and a `primary_conninfo` to follow the primary.
    pub async fn rewind_from(
        &self,
        host: &str,
        port: u16,
        user: &str,
        passfile: &Path,
    ) -> Result<(), String> {
        let Binaries::Postgres { dir } = &self.bins else {
            return Err("rewinding is only supported for PostgreSQL".into());
        };
        let program = dir.join("pg_rewind");
        if !is_executable(&program) {
            return Err(format!("{} not found", program.display()));
        }
        let data = &self.config.data_dir;
        let source = format!(
            "host={host} port={port} user={user} dbname=postgres passfile={} connect_timeout=10 application_name={}-rewind",
            passfile.display(),
            self.config.pod_name
        );
        let args = vec![
            format!("--target-pgdata={}", data.display()),
            format!("--source-server={source}"),
            format!(
                "--config-file={}",
                self.config.config_file(PG_CONF).display()
            ),
            "--progress".into(),
        ];
        tracing::info!(command = %program.display(), %host, port, "rewinding the former primary");
        let envs = [("LC_ALL", "C".to_string()), ("LANG", "C".to_string())];
        let cwd = data.parent().unwrap_or(data);
        let output = process::run(&program, &args, &envs, cwd, b"", CLONE_TIMEOUT).await?;
        for line in output.stdout.lines().chain(output.stderr.lines()) {
            tracing::info!(target: "rewind", "{line}");
        }
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_rewind from {host}:{port} failed: {}",
                output.error_line()
            ))
        }
    }

    /// PostgreSQL: clones the primary at `host:port` into an empty data directory with
    /// `pg_basebackup` (as `user`, the password read from `passfile` through `PGPASSFILE`),
    /// into a temporary sibling directory renamed into place once complete (with
    /// `standby.signal`), so an interrupted clone never looks like data.
    pub async fn clone_from(
        &self,
        host: &str,
        port: u16,
        user: &str,
        passfile: &Path,
    ) -> Result<(), String> {
        let Binaries::Postgres { dir } = &self.bins else {
            return Err("cloning is only supported for PostgreSQL".into());
        };
        let program = dir.join("pg_basebackup");
        if !is_executable(&program) {
            return Err(format!("{} not found", program.display()));
        }
        let data = &self.config.data_dir;
        let temporary = clone_dir(data);
        if temporary.exists() {
            tracing::info!(dir = %temporary.display(), "removing an interrupted clone");
            std::fs::remove_dir_all(&temporary)
                .map_err(|e| format!("cannot remove {}: {e}", temporary.display()))?;
        }
        let args = vec![
            "-D".to_string(),
            temporary.display().to_string(),
            "-h".into(),
            host.to_string(),
            "-p".into(),
            port.to_string(),
            "-U".into(),
            user.to_string(),
            "-X".into(),
            "stream".into(),
            "--checkpoint=fast".into(),
            "--no-password".into(),
        ];
        tracing::info!(command = %program.display(), args = ?args, "cloning the primary");
        let envs = [
            ("PGPASSFILE", passfile.display().to_string()),
            ("PGCONNECT_TIMEOUT", "10".to_string()),
            ("PGAPPNAME", format!("{}-clone", self.config.pod_name)),
        ];
        let cwd = data.parent().unwrap_or(data);
        let output = process::run(&program, &args, &envs, cwd, b"", CLONE_TIMEOUT).await;
        let failed = |why: String| {
            let _ = std::fs::remove_dir_all(&temporary);
            Err(format!("pg_basebackup from {host}:{port} failed: {why}"))
        };
        let output = match output {
            Ok(output) => output,
            Err(e) => return failed(e),
        };
        for line in output.stdout.lines().chain(output.stderr.lines()) {
            tracing::info!(target: "clone", "{line}");
        }
        if !output.status.success() {
            return failed(output.error_line());
        }
        if let Err(e) = std::fs::write(temporary.join(STANDBY_SIGNAL), b"") {
            return failed(format!("cannot write {STANDBY_SIGNAL}: {e}"));
        }
        // The data directory exists (empty, mode 0700); rename(2) replaces an empty one.
        if let Err(e) = std::fs::rename(&temporary, data) {
            return failed(format!(
                "cannot move the clone into {} (is it empty?): {e}",
                data.display()
            ));
        }
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(data, std::fs::Permissions::from_mode(0o700));
        Ok(())
    }

    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The OS user the engine runs as (MariaDB's socket-authenticated administrator).
    pub(crate) fn os_user(&self) -> &str {
        &self.os_user
    }

    /// MySQL family: the server's socket.
    pub(crate) fn mysql_socket(&self) -> PathBuf {
        self.config.run_dir.join(MYSQL_SOCKET)
    }

    /// One of the MySQL family's tools (`mariadb-backup`, `mbstream`, `mariadb-binlog`), looked
    /// for where the server is.
    pub(crate) fn mysql_tool(&self, name: &str) -> Result<PathBuf, String> {
        let dirs = search_dirs(
            self.config.engine_bin_dir.as_deref(),
            &["/usr/sbin", "/usr/bin"],
        );
        find(&dirs, name).ok_or_else(|| format!("{name} not found in {}", describe(&dirs)))
    }

    /// MySQL family: runs the SQL read from `input` (a replay: no time limit) as the socket
    /// administrator; `--binary-mode` keeps binary log events intact.
    pub(crate) async fn admin_sql_from(
        &self,
        input: &mut (impl tokio::io::AsyncRead + Unpin),
    ) -> Result<(), String> {
        let Binaries::Mysql { client, .. } = &self.bins else {
            return Err("replaying SQL is for the MySQL family".into());
        };
        let mut command = Command::new(client);
        command
            .arg("--no-defaults")
            .arg("--protocol=socket")
            .arg(format!("--socket={}", self.mysql_socket().display()))
            .arg(format!("--user={}", self.os_user))
            .arg("--binary-mode")
            .arg("--batch")
            .current_dir(&self.config.run_dir)
            .env_remove("MYSQL_PWD")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        process::die_with_parent(&mut command);
        let mut child =
            process::spawn(&mut command).map_err(|e| format!("cannot run the client: {e}"))?;
        let pid = child.id();
        let mut stdin = child.stdin.take().ok_or("the client has no stdin")?;
        let copied = tokio::io::copy(input, &mut stdin).await;
        drop(stdin);
        let output = child.wait_with_output().await;
        process::release(pid);
        let output = output.map_err(|e| format!("the client: {e}"))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(stderr.lines().last().unwrap_or("failed").trim().to_string());
        }
        copied.map_err(|e| format!("feeding the client: {e}"))?;
        Ok(())
    }

    /// MySQL family: [`Engine::admin_sql`] with each result set's column names first.
    pub(crate) async fn admin_sql_named(&self, sql: &str) -> Result<String, String> {
        let Binaries::Mysql { client, .. } = &self.bins else {
            return Err("named results are for the MySQL family".into());
        };
        let args = vec![
            "--no-defaults".to_string(),
            "--protocol=socket".into(),
            format!("--socket={}", self.mysql_socket().display()),
            format!("--user={}", self.os_user),
            "--batch".into(),
            "--connect-timeout=5".into(),
        ];
        let output = process::run(
            client,
            &args,
            &[],
            &self.config.run_dir,
            sql.as_bytes(),
            CLIENT_TIMEOUT,
        )
        .await?;
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(output.error_line())
        }
    }

    /// PostgreSQL: the directory of its binaries.
    pub fn postgres_bin_dir(&self) -> Option<&Path> {
        match &self.bins {
            Binaries::Postgres { dir } => Some(dir),
            _ => None,
        }
    }

    /// PostgreSQL's `archive_command`: hands `%p` to the running agent over its socket.
    pub fn archive_command(&self) -> String {
        format!(
            "{} wal-push %p",
            shell_word_for_postgres(&self.agent_exe.display().to_string())
        )
    }

    /// A replica's `restore_command` while the cluster archives: WAL its primary no longer
    /// keeps comes from the cluster's archive (`wal-fetch --standby`).
    pub fn standby_restore_command(&self) -> String {
        format!(
            "{} wal-fetch --standby %f %p",
            shell_word_for_postgres(&self.agent_exe.display().to_string())
        )
    }

    /// PostgreSQL's `restore_command` during a restore: the agent downloads `%f` to `%p`.
    pub fn restore_command(&self) -> String {
        format!(
            "{} wal-fetch %f %p",
            shell_word_for_postgres(&self.agent_exe.display().to_string())
        )
    }

    /// PostgreSQL: whether the data directory recovers from an archive (a restore not yet
    /// promoted).
    pub fn is_recovering(&self) -> bool {
        self.config.data_dir.join(RECOVERY_SIGNAL).is_file()
    }

    /// PostgreSQL: `pg_basebackup` of this very instance as a tar on stdout (`-D - -Ft -X
    /// none`), as the superuser over the private socket (which needs `local replication`
    /// for it in pg_hba.conf), C locale so its `-v` lines can be read.
    pub fn base_backup_command(&self, label: &str) -> Result<Command, String> {
        let Binaries::Postgres { dir } = &self.bins else {
            return Err("base backups are only for PostgreSQL".into());
        };
        let program = dir.join("pg_basebackup");
        if !is_executable(&program) {
            return Err(format!("{} not found", program.display()));
        }
        let c = &self.config;
        let mut command = Command::new(program);
        command
            .args([
                "-D",
                "-",
                "-Ft",
                "-X",
                "none",
                "--checkpoint=fast",
                "-v",
                "-w",
            ])
            .arg("-h")
            .arg(&c.run_dir)
            .args(["-p", &c.port.to_string(), "-U", PG_SUPERUSER, "-l", label])
            .env_remove("PGPASSWORD")
            .env_remove("PGPASSFILE")
            .env("LC_ALL", "C")
            .env("LANG", "C")
            .env("PGAPPNAME", "devctl-backup")
            .env("PGCONNECT_TIMEOUT", "10")
            .current_dir(&c.run_dir);
        Ok(command)
    }

    /// MySQL family: the logical dump of everything on stdout, as the socket account.
    pub fn dump_command(&self) -> Result<Command, String> {
        let Binaries::Mysql { .. } = &self.bins else {
            return Err("logical dumps are only for the MySQL family".into());
        };
        let c = &self.config;
        let dirs = search_dirs(c.engine_bin_dir.as_deref(), &["/usr/sbin", "/usr/bin"]);
        let program = find(&dirs, "mariadb-dump")
            .or_else(|| find(&dirs, "mysqldump"))
            .ok_or_else(|| {
                format!(
                    "neither mariadb-dump nor mysqldump found in {}",
                    describe(&dirs)
                )
            })?;
        let mut command = Command::new(program);
        command
            .arg("--no-defaults")
            .arg("--protocol=socket")
            .arg(format!(
                "--socket={}",
                c.run_dir.join(MYSQL_SOCKET).display()
            ))
            .arg(format!("--user={}", self.os_user))
            .args([
                "--single-transaction",
                "--all-databases",
                "--routines",
                "--events",
                "--triggers",
            ])
            .env_remove("MYSQL_PWD")
            .current_dir(&c.run_dir);
        Ok(command)
    }

    /// MySQL family: the client that replays a dump from its stdin, as the socket account.
    pub fn replay_command(&self) -> Result<Command, String> {
        let Binaries::Mysql { client, .. } = &self.bins else {
            return Err("replaying a dump is only for the MySQL family".into());
        };
        let c = &self.config;
        let mut command = Command::new(client);
        command
            .arg("--no-defaults")
            .arg("--protocol=socket")
            .arg(format!(
                "--socket={}",
                c.run_dir.join(MYSQL_SOCKET).display()
            ))
            .arg(format!("--user={}", self.os_user))
            .args(["--batch", "--binary-mode"])
            .env_remove("MYSQL_PWD")
            .current_dir(&c.run_dir);
        Ok(command)
    }

    /// PostgreSQL: `wal_segment_size` in bytes.
    pub async fn wal_segment_size(&self) -> Result<u64, String> {
        let out = self
            .admin_sql("SELECT setting, unit FROM pg_settings WHERE name = 'wal_segment_size';\n")
            .await?;
        let line = out.lines().next().unwrap_or_default();
        let (value, unit) = line.split_once('|').unwrap_or((line, ""));
        let value: u64 = value
            .trim()
            .parse()
            .map_err(|_| format!("unexpected wal_segment_size {line:?}"))?;
        Ok(match unit.trim() {
            "8kB" => value * 8192,
            "MB" => value * 1024 * 1024,
            _ => value,
        })
    }

    /// PostgreSQL, from a replica: asks the primary at `host:port` to switch to a new WAL
    /// segment (`pg_switch_wal()`, which the primary grants the replication role), so the
    /// segment a replica's backup ends in is archived now rather than at `archive_timeout`.
    pub async fn switch_wal_on(
        &self,
        host: &str,
        port: u16,
        user: &str,
        passfile: &Path,
    ) -> Result<String, String> {
        let Binaries::Postgres { dir } = &self.bins else {
            return Err("switching WAL is only for PostgreSQL".into());
        };
        let conninfo = format!(
            "host={} port={port} user={} dbname=postgres passfile={} connect_timeout=5 application_name=devctl-backup",
            conninfo_value(host),
            conninfo_value(user),
            conninfo_value(&passfile.display().to_string())
        );
        let args = vec![
            "-X".to_string(),
            "-q".into(),
            "-A".into(),
            "-t".into(),
            "-w".into(),
            "-v".into(),
            "ON_ERROR_STOP=1".into(),
            "-d".into(),
            conninfo,
            "-c".into(),
            "SELECT pg_switch_wal()".into(),
        ];
        let output = process::run(
            &dir.join("psql"),
            &args,
            &[],
            &self.config.run_dir,
            b"",
            CLIENT_TIMEOUT,
        )
        .await?;
        if output.status.success() {
            Ok(output.stdout.trim().to_string())
        } else {
            Err(format!(
                "pg_switch_wal() on {host}:{port}: {}",
                output.error_line()
            ))
        }
    }

    /// PostgreSQL, promoted after a restore: removes the recovery settings from
    /// `postgresql.auto.conf` (`ALTER SYSTEM RESET`), so neither a restart nor a clone of
    /// this primary ever recovers towards the old target again.
    pub async fn clear_recovery_settings(&self) -> Result<(), String> {
        let mut sql: String = RECOVERY_SETTINGS
            .iter()
            .map(|name| format!("ALTER SYSTEM RESET {name};\n"))
            .collect();
        sql.push_str("SELECT pg_reload_conf();\n");
        self.admin_sql(&sql).await.map(|_| ())
    }

    /// PostgreSQL: whether `postgresql.auto.conf` still holds recovery settings.
    pub fn has_recovery_settings(&self) -> bool {
        std::fs::read_to_string(self.config.data_dir.join(AUTO_CONF))
            .map(|text| has_recovery_settings(&text))
            .unwrap_or(false)
    }

    /// The identifier the store's layout is keyed by: PostgreSQL's system identifier
    /// (`pg_controldata`, also while the server runs); for the MySQL family a random number
    /// kept in the data directory (created on first use).
    pub async fn system_identifier(&self) -> Result<String, String> {
        match &self.bins {
            Binaries::Postgres { .. } => self
                .control_data()
                .await?
                .system_identifier
                .ok_or_else(|| "pg_controldata shows no system identifier".to_string()),
            Binaries::Mysql { .. } => {
                let path = self.config.data_dir.join(SYSTEM_ID_FILE);
                match std::fs::read_to_string(&path) {
                    Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_string()),
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
                }
                if !self.is_bootstrapped() {
                    return Err("the data directory is not initialised yet".into());
                }
                // 19 digits, like PostgreSQL's.
                let id = rand::random_range(1_000_000_000_000_000_000u64..=u64::MAX).to_string();
                write_private(&path, id.as_bytes())?;
                Ok(id)
            }
        }
    }

    /// For MySQL 8 after `--initialize-insecure`: root only over the socket (best effort).
    pub async fn secure_root(&self) -> Result<(), String> {
        match &self.bins {
            Binaries::Mysql { mariadb: false, .. } => self
                .admin_sql("ALTER USER 'root'@'localhost' IDENTIFIED WITH auth_socket;\n")
                .await
                .map(|_| ()),
            _ => Ok(()),
        }
    }

    /// One query over the socket: succeeds only when the engine accepts connections.
    pub async fn probe(&self) -> Result<Probe, String> {
        if self.config.engine == EngineKind::Mariadb {
            return crate::mariadb::ops::probe(self).await;
        }
        match &self.bins {
            Binaries::Postgres { .. } => {
                let out = self
                    .admin_sql(
                        "SELECT pg_is_in_recovery(), \
                         (SELECT system_identifier FROM pg_control_system()), \
                         COALESCE((SELECT received_tli FROM pg_stat_wal_receiver), \
                                  (SELECT timeline_id FROM pg_control_checkpoint())), \
                         current_setting('server_version'), \
                         pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn(), \
                         pg_wal_lsn_diff(GREATEST(pg_last_wal_receive_lsn(), \
                                                  (SELECT latest_end_lsn FROM pg_stat_wal_receiver)), \
                                         pg_last_wal_replay_lsn()), \
                         (SELECT status FROM pg_stat_wal_receiver), \
                         (SELECT string_agg(application_name, ',' ORDER BY application_name) \
                            FROM pg_stat_replication WHERE state = 'streaming'), \
                         (SELECT string_agg(slot_name || ':' || active::text || ':' || \
                                            COALESCE(wal_status, ''), ',' ORDER BY slot_name) \
                            FROM pg_replication_slots \
                           WHERE slot_type = 'physical' AND slot_name LIKE 'devctl\\_%');\n",
                    )
                    .await?;
                parse_postgres_probe(&out)
            }
            Binaries::Mysql { mariadb, .. } => {
                let sql = if *mariadb {
                    "SELECT VERSION(), '';\n"
                } else {
                    "SELECT VERSION(), @@server_uuid;\n"
                };
                let out = self.admin_sql(sql).await?;
                let mut fields = out.trim_end_matches('\n').split('\t');
                let version = fields.next().map(version_number).filter(|v| !v.is_empty());
                let uuid = fields
                    .next()
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(str::to_string);
                if version.is_none() {
                    return Err(format!("unexpected probe output {out:?}"));
                }
                // MariaDB has no `server_uuid`: the identifier the agent keeps in the data
                // directory (the one its backups are filed under) says the same — this data,
                // not a new bootstrap.
                let uuid = match (uuid, *mariadb) {
                    (None, true) => self.system_identifier().await.ok(),
                    (uuid, _) => uuid,
                };
                Ok(Probe {
                    role: ROLE_PRIMARY.into(),
                    system_identifier: uuid,
                    engine_version: version,
                    ..Probe::default()
                })
            }
        }
    }
}

fn parse_postgres_probe(out: &str) -> Result<Probe, String> {
    let line = out.lines().next().unwrap_or_default();
    let f: Vec<&str> = line.split('|').collect();
    if f.len() != 10 {
        return Err(format!("unexpected probe output {line:?}"));
    }
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let in_recovery = f[0] == "t";
    Ok(Probe {
        role: if in_recovery {
            ROLE_REPLICA
        } else {
            ROLE_PRIMARY
        }
        .into(),
        system_identifier: opt(f[1]),
        timeline: f[2].parse().ok(),
        engine_version: opt(&version_number(f[3])),
        received_lsn: if in_recovery { opt(f[4]) } else { None },
        replayed_lsn: if in_recovery { opt(f[5]) } else { None },
        lag_bytes: if in_recovery {
            f[6].parse::<f64>().ok().map(|v| v as i64)
        } else {
            None
        },
        wal_receiver: if in_recovery { opt(f[7]) } else { None },
        streaming_replicas: (!in_recovery).then(|| {
            f[8].split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(str::to_string)
                .collect()
        }),
        slots: f[9]
            .split(',')
            .filter_map(|slot| {
                let mut parts = slot.trim().splitn(3, ':');
                let name = parts.next().filter(|n| !n.is_empty())?.to_string();
                let active = parts.next() == Some("true");
                let lost = parts.next() == Some("lost");
                Some(Slot { name, active, lost })
            })
            .collect(),
        ..Probe::default()
    })
}

/// What `pg_controldata` says of a stopped data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlData {
    /// `Database cluster state`: `shut down` (a primary stopped cleanly), `shut down in
    /// recovery`, `in production`, ...
    pub state: String,
    /// `Latest checkpoint location` (a shutdown checkpoint's after a clean stop).
    pub checkpoint: String,
    /// `Latest checkpoint's TimeLineID`.
    pub timeline: Option<i64>,
    /// `Database system identifier`.
    pub system_identifier: Option<String>,
    /// `Data page checksum version` is not 0.
    pub data_checksums: Option<bool>,
}

impl ControlData {
    /// A primary's data that was shut down cleanly: nothing follows the checkpoint.
    pub fn is_clean_primary_shutdown(&self) -> bool {
        self.state == "shut down"
    }
}

/// `pg_controldata` output (C locale).
pub fn parse_control_data(out: &str) -> Option<ControlData> {
    let field = |name: &str| {
        out.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    let checkpoint = field("Latest checkpoint location").filter(|l| is_lsn(l))?;
    Some(ControlData {
        state: field("Database cluster state")?,
        checkpoint,
        timeline: field("Latest checkpoint's TimeLineID").and_then(|t| t.parse().ok()),
        system_identifier: field("Database system identifier")
            .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())),
        data_checksums: field("Data page checksum version").map(|v| v != "0"),
    })
}

/// A PostgreSQL LSN as text (`0/3000060`): safe to put in SQL.
pub fn is_lsn(text: &str) -> bool {
    let hex = |s: &str| (1..=8).contains(&s.len()) && s.chars().all(|c| c.is_ascii_hexdigit());
    text.split_once('/').is_some_and(|(a, b)| hex(a) && hex(b))
}

/// `15.18 (Debian 15.18-0+deb12u1)` → `15.18`; `10.11.19-MariaDB-0+deb12u1` → `10.11.19`.
pub fn version_number(text: &str) -> String {
    text.trim()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect::<String>()
        .trim_end_matches('.')
        .to_string()
}

fn search_dirs(explicit: Option<&Path>, extra: &[&str]) -> Vec<PathBuf> {
    if let Some(dir) = explicit {
        return vec![dir.to_path_buf()];
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(extra.iter().map(PathBuf::from));
    dirs
}

fn find(dirs: &[PathBuf], name: &str) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(name)).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn describe(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// `DEVCTL_ENGINE_BIN_DIR`, else the directory of `postgres` on `PATH` (symlinks resolved,
/// so `initdb`/`psql` come from the same installation), else Debian's highest
/// `/usr/lib/postgresql/<version>/bin`.
pub fn find_postgres_bin_dir(explicit: Option<&Path>) -> Result<PathBuf> {
    let complete = |dir: &Path| {
        ["postgres", "initdb", "psql"]
            .iter()
            .all(|b| is_executable(&dir.join(b)))
    };
    if let Some(dir) = explicit {
        return if complete(dir) {
            Ok(dir.to_path_buf())
        } else {
            Err(Error::Engine(format!(
                "{} ({}) does not hold postgres, initdb and psql",
                dir.display(),
                devctl_api::instance::env::ENGINE_BIN_DIR
            )))
        };
    }
    for dir in search_dirs(None, &[]) {
        let candidate = dir.join("postgres");
        if is_executable(&candidate)
            && let Some(real_dir) = std::fs::canonicalize(&candidate)
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf))
            && complete(&real_dir)
        {
            return Ok(real_dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let version = e.file_name().to_str()?.parse::<u32>().ok()?;
                    Some((version, e.path().join("bin")))
                })
                .filter(|(_, bin)| complete(bin))
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).ok_or_else(|| {
        Error::Engine(format!(
            "PostgreSQL binaries (postgres, initdb, psql) not found in PATH or /usr/lib/postgresql/*/bin; set {}",
            devctl_api::instance::env::ENGINE_BIN_DIR
        ))
    })
}

/// Who may own a directory [`prepare_dir`] prepares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirOwner {
    /// The agent's user, mode 0700 (the data directory: PostgreSQL refuses anything else).
    Agent,
    /// The agent's user (mode 0700), or the root of a volume the kubelet made: an emptyDir is
    /// root's, group-owned by the pod's fsGroup with mode 2777, and its mode cannot be changed
    /// by the pod's user. It is used as it is: only the container's own processes see it.
    AgentOrVolume,
}

/// Whether a directory whose mode could not be made 0700 (`error`) is used anyway: only a
/// volume's root (a mount point) someone else owns, where [`DirOwner::AgentOrVolume`] allows
/// it. A directory that merely belongs to someone else (`/tmp`) is refused.
pub fn keeps_volume_mode(
    error: std::io::ErrorKind,
    owner_uid: u32,
    agent_uid: u32,
    mount_point: bool,
    allowed: DirOwner,
) -> bool {
    allowed == DirOwner::AgentOrVolume
        && error == std::io::ErrorKind::PermissionDenied
        && owner_uid != agent_uid
        && mount_point
}

/// Whether `dir` is a mount point: its device differs from its parent's, or (a bind mount
/// from the same filesystem, as with runtimes whose root filesystem is a plain directory)
/// `/proc/self/mountinfo` lists it.
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let parent = dir.parent().unwrap_or(dir);
    if let (Ok(own), Ok(up)) = (std::fs::metadata(dir), std::fs::metadata(parent))
        && own.dev() != up.dev()
    {
        return true;
    }
    let Ok(canonical) = std::fs::canonicalize(dir) else {
        return false;
    };
    let wanted = canonical.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines()
            .filter_map(|line| line.split(' ').nth(4))
            .any(|point| point == wanted)
    })
}

/// Prepares a directory: created with its parents if missing, mode 0700 (or left as the
/// volume made it, see [`DirOwner`]), writable (exit 73 otherwise).
pub fn prepare_dir(dir: &Path, what: &str, variable: &str, allowed: DirOwner) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let fail = |why: String| {
        Err(Error::DataDir(format!(
            "{what} {} ({variable}) {why}",
            dir.display()
        )))
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        return fail(format!("cannot be created: {e}"));
    }
    if let Err(e) = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)) {
        // SAFETY: geteuid(2) has no preconditions.
        let agent_uid = unsafe { libc::geteuid() };
        let owner = std::fs::metadata(dir).map(|m| m.uid()).unwrap_or(agent_uid);
        if !keeps_volume_mode(e.kind(), owner, agent_uid, is_mount_point(dir), allowed) {
            return fail(format!("cannot be made private (mode 0700): {e}"));
        }
        tracing::info!(dir = %dir.display(), owner, "{what} is a volume's root owned by uid {owner}: its mode stays as the volume made it");
    }
    let probe = dir.join(".devctl-agent-write-test");
    match std::fs::write(&probe, b"") {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => fail(format!("is not writable: {e}")),
    }
}

/// The temporary sibling directory a clone is written to.
pub fn clone_dir(data: &Path) -> PathBuf {
    let name = data
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "data".into());
    data.with_file_name(format!(".{name}.clone"))
}

/// Writes `content` to `path` (mode 0600) through a temporary file and a rename.
pub fn write_private(path: &Path, content: &[u8]) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    // A name of its own per write (two tasks may write one file), and a new file, never one
    // (or a link) that is there already: the directory may be a volume others can write to
    // (see `DirOwner::AgentOrVolume`).
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary =
        path.with_file_name(format!(".{name}.devctl-tmp-{}-{write}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(content)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&temporary);
        format!("cannot write {}: {e}", path.display())
    })
}

/// Removes everything inside `dir` (after a failed bootstrap, before a replica's fresh
/// clone; the directory itself may be a volume's mount point).
pub fn clear_dir(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = if path.is_dir() && !path.is_symlink() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_volume_root_someone_else_owns_keeps_its_mode() {
        use DirOwner::{Agent, AgentOrVolume};
        use std::io::ErrorKind::{NotFound, PermissionDenied};
        // An emptyDir mounted as the run directory: root's, the agent runs as 999.
        assert!(keeps_volume_mode(
            PermissionDenied,
            0,
            999,
            true,
            AgentOrVolume
        ));
        // Someone else's directory that is no volume (`/tmp/x`) is refused.
        assert!(!keeps_volume_mode(
            PermissionDenied,
            0,
            999,
            false,
            AgentOrVolume
        ));
        // The data directory must be the agent's own, whoever made it.
        assert!(!keeps_volume_mode(PermissionDenied, 0, 999, true, Agent));
        // The agent's own directory that cannot be changed is a real failure.
        assert!(!keeps_volume_mode(
            PermissionDenied,
            999,
            999,
            true,
            AgentOrVolume
        ));
        assert!(!keeps_volume_mode(NotFound, 0, 999, true, AgentOrVolume));
    }

    #[test]
    fn a_re_pointed_replica_reloads_once_for_its_address_slot_and_archive() {
        let extras = StandbyExtras {
            slot: "db_1".into(),
            restore_command: "fetch '%f'".into(),
        };
        assert_eq!(standby_settings_sql(None, None), None);
        assert_eq!(
            standby_settings_sql(Some("host='a' port=5432"), Some(&extras)).as_deref(),
            Some(
                "ALTER SYSTEM SET primary_conninfo = 'host=''a'' port=5432';\n\
                 ALTER SYSTEM SET primary_slot_name = 'db_1';\n\
                 ALTER SYSTEM SET restore_command = 'fetch ''%f''';\n\
                 SELECT pg_reload_conf();\n"
            )
        );
        let only_conninfo = standby_settings_sql(Some(""), None).unwrap_or_default();
        assert_eq!(only_conninfo.matches("pg_reload_conf").count(), 1);
        assert!(!only_conninfo.contains("primary_slot_name"));
    }

    #[test]
    fn writes_the_standby_settings() {
        let conninfo = primary_conninfo(
            "10.0.0.1",
            5432,
            "streaming_replica",
            Path::new("/run/it's/replication.pgpass"),
            "db-1",
        );
        assert_eq!(
            conninfo,
            r"host='10.0.0.1' port=5432 user='streaming_replica' passfile='/run/it\'s/replication.pgpass' application_name='db-1' connect_timeout=5"
        );
        let current = "# Do not edit this file manually!\nwork_mem = '4MB'\nprimary_conninfo = 'host=old'\nrecovery_target_timeline = 'latest'\n";
        let none = StandbyExtras::default();
        let written = with_standby_settings(current, Some(&conninfo), &none);
        assert_eq!(
            written,
            "# Do not edit this file manually!\nwork_mem = '4MB'\n\
             primary_conninfo = 'host=''10.0.0.1'' port=5432 user=''streaming_replica'' passfile=''/run/it\\\\''s/replication.pgpass'' application_name=''db-1'' connect_timeout=5'\n\
             recovery_target_timeline = 'latest'\n"
        );
        assert_eq!(
            with_standby_settings(&written, Some(&conninfo), &none),
            written
        );
        assert_eq!(
            with_standby_settings("", None, &none),
            "recovery_target_timeline = 'latest'\n"
        );
        assert_eq!(with_standby_settings(&written, None, &none), written);
        // The slot and the archive fallback, replaced (not repeated) on every start; gone
        // once the extras are empty.
        let extras = StandbyExtras {
            slot: "devctl_db_1".into(),
            restore_command: "'/agent' wal-fetch --standby %f %p".into(),
        };
        let with_extras = with_standby_settings(&written, None, &extras);
        assert_eq!(
            with_standby_settings(&with_extras, None, &extras),
            with_extras
        );
        assert!(with_extras.contains("primary_slot_name = 'devctl_db_1'\n"));
        assert!(with_extras.contains("restore_command = '''/agent'' wal-fetch --standby %f %p'\n"));
        assert_eq!(with_standby_settings(&with_extras, None, &none), written);
    }

    #[test]
    fn parses_control_data() {
        let out = "pg_control version number:            1300\n\
                   Database cluster state:               shut down\n\
                   Latest checkpoint location:           0/3000060\n\
                   Latest checkpoint's REDO location:    0/3000060\n\
                   Latest checkpoint's TimeLineID:       1\n";
        let c = parse_control_data(out).unwrap();
        assert_eq!(c.state, "shut down");
        assert_eq!(c.checkpoint, "0/3000060");
        assert_eq!(c.timeline, Some(1));
        assert!(c.is_clean_primary_shutdown());
        assert!(parse_control_data("Database cluster state: in production\n").is_none());
        assert!(is_lsn("16/B374D848"));
        assert!(!is_lsn("0/1'; DROP"));
        assert!(!is_lsn("0x1/2"));
    }

    #[test]
    fn keeps_the_version_number() {
        assert_eq!(version_number("15.18 (Debian 15.18-0+deb12u1)"), "15.18");
        assert_eq!(version_number("10.11.19-MariaDB-0+deb12u1"), "10.11.19");
        assert_eq!(version_number("8.0.36"), "8.0.36");
    }

    #[test]
    fn parses_a_primary_probe() {
        let p = parse_postgres_probe("f|7400000000000000001|1|15.18 (Debian)||||||\n").unwrap();
        assert_eq!(p.role, ROLE_PRIMARY);
        assert_eq!(p.system_identifier.as_deref(), Some("7400000000000000001"));
        assert_eq!(p.timeline, Some(1));
        assert_eq!(p.engine_version.as_deref(), Some("15.18"));
        assert!(!p.is_streaming());
        assert_eq!((p.received_lsn, p.lag_bytes), (None, None));
        assert_eq!(p.streaming_replicas, Some(vec![]));
        let p = parse_postgres_probe(
            "f|7|1|15.18|||||db-1,db-2|devctl_db_1:true:reserved,devctl_db_2:false:lost\n",
        )
        .unwrap();
        assert_eq!(
            p.streaming_replicas,
            Some(vec!["db-1".to_string(), "db-2".to_string()])
        );
        let slot = |name: &str, active, lost| Slot {
            name: name.into(),
            active,
            lost,
        };
        assert_eq!(
            p.slots,
            vec![
                slot("devctl_db_1", true, false),
                slot("devctl_db_2", false, true)
            ]
        );
        let r = parse_postgres_probe("t|7|2|15.18|0/3000060|0/3000000|96|streaming||\n").unwrap();
        assert_eq!(r.role, ROLE_REPLICA);
        assert_eq!(r.lag_bytes, Some(96));
        assert!(r.is_streaming());
        assert_eq!(r.streaming_replicas, None);
        let r = parse_postgres_probe("t|7|2|15.18|0/3000060|0/3000000|96|||\n").unwrap();
        assert_eq!(r.wal_receiver, None);
        assert!(!r.is_streaming());
        assert!(parse_postgres_probe("garbage").is_err());
    }

    #[test]
    fn names_a_slot_per_pod_within_postgres_limits() {
        assert_eq!(slot_name("db-1"), "devctl_db_1");
        assert_eq!(slot_name("my.db-10"), "devctl_my_db_10");
        let long = format!("{}-1", "a".repeat(61));
        let other = format!("{}-2", "a".repeat(61));
        assert_eq!(slot_name(&long).len(), 63);
        assert_ne!(slot_name(&long), slot_name(&other));
        assert!(slot_name(&long).starts_with(SLOT_PREFIX));
    }
}
