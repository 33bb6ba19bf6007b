//! `devctl-agent`: the entrypoint of every devctl database pod.
//!
//! It bootstraps an empty data directory, runs the engine (PostgreSQL, or MariaDB/MySQL) as
//! its direct child, keeps the application role in line with the credentials Secret, and
//! reports on its own pod (the `db.devctl.io/instance-status` annotation, see
//! [`devctl_api::instance`]). It talks only to the Kubernetes API server and its own
//! database, and serves `/healthz` and `/readyz` on `DEVCTL_HEALTH_PORT`.
//!
//! # Commands
//! - `devctl-agent` or `devctl-agent run`: run the instance described by the environment
//!   ([`devctl_api::instance::env`]).
//! - `devctl-agent install <DIR>`: copy this executable to `<DIR>/devctl-agent` (mode 0755)
//!   and exit; an init container uses it to put the agent into the database image.
//! - `devctl-agent wal-push <PATH>`: PostgreSQL's `archive_command`; asks the running agent
//!   (socket `$DEVCTL_RUN_DIR/agent.sock`) to archive the file. Exit 0 once stored, or when
//!   the pod has no backup destination (acknowledged without upload); 1 otherwise.
//! - `devctl-agent wal-fetch <NAME> <PATH>`: PostgreSQL's `restore_command` during a
//!   restore; the agent downloads the archived file. Exit 0 when in place, 1 when the
//!   archive has no such file (how recovery finds its end), 126 when the archive cannot be
//!   read (PostgreSQL then aborts recovery instead of promoting early; the agent restarts
//!   it).
//!
//! - `devctl-agent upgrade --old-bindir D --new-bindir D --data D --socket-dir D [--method
//!   copy|link] [--check] [--port N] [--setting NAME=VALUE]…`: a PostgreSQL major upgrade of a
//!   stopped data directory with `pg_upgrade` ([`major_upgrade`]); one JSON line on stdout,
//!   exit 0 when checked or upgraded, 1 when refused or failed.
//!
//! # Exit codes
//! | code | meaning |
//! |------|---------|
//! | 0  | clean shutdown on SIGTERM/SIGINT, or the pod was deleted/replaced by a newer one of the same name (this process is stale; the engine is stopped) |
//! | 64 | missing or malformed environment variable or argument (also: a replica to clone without `DEVCTL_REPLICATION_SECRET`; `DEVCTL_BOOTSTRAP` other than `recovery`) |
//! | 65 | unusable credentials Secret at startup (password missing, empty, not UTF-8, control characters or NUL, longer than 1024 bytes; malformed `username`/`dbname`) |
//! | 69 | engine binaries not found, bootstrap failed, the engine would not stop, or it exited 5 times in a row |
//! | 70 | internal error (e.g. no Kubernetes client configuration, health port in use) |
//! | 73 | data or run directory cannot be created or written (or the agent socket cannot be served there) |
//! | 77 | forbidden by the API server (watching a Secret or the DatabaseCluster before the engine runs, or the first report) |
//! | 78 | a rendered configuration file is missing from `DEVCTL_CONFIG_DIR` |
//!
//! On any of these errors the agent prints one line `devctl-agent: <reason>` on stderr and,
//! when `POD_NAME`/`POD_NAMESPACE` are set and the API server is reachable, writes the report
//! with `ready: false` and `lastError: <reason>`; when that is forbidden it creates a Warning
//! Event `AgentFailed` on the pod instead.
//!
//! # Output
//! The agent's own log (`tracing`, human format, `RUST_LOG` filter, default `info`) goes to
//! stdout; the engine's stdout and stderr go to the agent's stderr, each line prefixed with
//! `[postgres] ` / `[mariadbd] `; the fatal line above is the agent's only own stderr
//! output. Passwords never appear in argv, logs, reports or events.
//!
//! # Engines
//! - PostgreSQL: `initdb -D $DATA_DIR --username=postgres --auth-local=peer
//!   --auth-host=scram-sha-256 --data-checksums --encoding=UTF8 --no-instructions`, then
//!   `postgres -D $DATA_DIR -c config_file=… -c hba_file=… -c ident_file=… -c port=…
//!   -c listen_addresses=… -c unix_socket_directories=$RUN_DIR -c
//!   unix_socket_permissions=0700`. The superuser has no password and is reachable only by
//!   peer authentication over the private socket. The role `app` gets a SCRAM-SHA-256
//!   verifier computed here. Fast shutdown with SIGINT. PostgreSQL refuses root: the agent
//!   must run as a named non-root user.
//! - MariaDB: `mariadb-install-db --defaults-file=$CONFIG_DIR/my.cnf --datadir=$DATA_DIR
//!   --auth-root-authentication-method=socket --auth-root-socket-user=<agent's user>
//!   --skip-test-db [--user=root]`, then `mariadbd --defaults-file=$CONFIG_DIR/my.cnf
//!   --datadir=… --socket=$RUN_DIR/mysqld.sock --pid-file=$RUN_DIR/mysqld.pid --port=…
//!   --bind-address=… [--user=root]`. The agent administers as the unix_socket account named
//!   after its OS user. `'app'@'%'` gets a `mysql_native_password` hash and all privileges
//!   on `app.*`. Stops with SIGTERM.
//! - MySQL 8 (no `mariadb-install-db`): `mysqld --initialize-insecure`, then root is
//!   switched to `auth_socket` on first start and `app` uses `IDENTIFIED WITH
//!   mysql_native_password AS '<hash>'`. Best effort: untested here (MySQL 8.4 disables
//!   `mysql_native_password` by default).
//!
//! # PostgreSQL streaming replication
//! A PostgreSQL agent takes its role from `status.currentPrimary` of its DatabaseCluster
//! (watched by name, read as plain JSON), never from what a pod says of itself:
//! - unset: it waits (`lastError: waiting for status.currentPrimary`), initialising nothing;
//! - this pod: bootstrap as above, run as the primary, and keep the replication role of
//!   `DEVCTL_REPLICATION_SECRET` (`username`, default `streaming_replica`; `password`) in
//!   line like `app` (`CREATE ROLE … WITH REPLICATION LOGIN`, `ALTER ROLE … PASSWORD
//!   '<SCRAM verifier>'`), with `REVOKE CONNECT, TEMPORARY ON DATABASE <each> FROM PUBLIC`
//!   and `GRANT CONNECT, TEMPORARY ON DATABASE app TO app`: the replication role streams but
//!   reads no database;
//! - another pod, empty data directory: once the primary's report says `ready`, clone it
//!   with `pg_basebackup -D <sibling .data.clone> -h <host> -p <port> -U streaming_replica
//!   -X stream --checkpoint=fast --no-password`, the password in `$RUN_DIR/replication.pgpass`
//!   (0600, through `PGPASSFILE`), then `standby.signal` and a rename into place; failures
//!   are retried with backoff (1 s to 30 s), never a crash loop;
//! - another pod, standby data: run as a replica (no re-clone); `primary_conninfo` (`host
//!   port user passfile application_name=<POD_NAME>`) and `recovery_target_timeline =
//!   'latest'` are written to `postgresql.auto.conf` before each start, and a changed
//!   primary address is applied with `ALTER SYSTEM` and `pg_reload_conf()`.
//!
//! The primary's address is the `-rw` Service's (`DEVCTL_PRIMARY_FROM=service`, default;
//! host `DEVCTL_PRIMARY_SERVICE_HOST` or `<cluster>-rw.<namespace>.svc`, port
//! `DEVCTL_PORT`) or the `address` of the primary pod's report (`annotation`, the test
//! runner). A replica is `ready` only while `pg_stat_wal_receiver.status` is `streaming`;
//! it reports `receivedLSN`, `replayedLSN`, `lagBytes` (how far replay is behind the primary:
//! the end of the primary's WAL as its last message to this standby said —
//! `pg_stat_wal_receiver.latest_end_lsn` — or what was received, whichever is further, minus
//! what was replayed) and `timeline` (`received_tli`), applies no credentials (the roles
//! replicate) and reports the credentials Secret version it has seen.
//!
//! # Planned switchover (`status.targetPrimary`)
//! 1. The primary (`currentPrimary` = this pod) sees `targetPrimary` name another pod: it
//!    reports `ready: false`, runs `CHECKPOINT`, fast-shuts the engine down (SIGINT; the
//!    walsenders send all WAL, the shutdown checkpoint included, to connected standbys) and
//!    does not restart it. It reads `pg_controldata -D <data>` (`LC_ALL=C`): on `Database
//!    cluster state: shut down` it reports `role: primary`, `ready: false`, `finalLSN:
//!    <Latest checkpoint location>`, `lastError: stopped for a switchover to <target>`. A
//!    restarted agent in that state does the same without starting the engine; data not
//!    shut down cleanly is started as the primary and then stopped as above.
//! 2. The target (`targetPrimary` = this pod, a streaming replica) polls the old primary's
//!    report (every 0.5 s): once it is not ready and has `finalLSN`, and
//!    `pg_wal_lsn_diff(pg_last_wal_receive_lsn(), finalLSN) >= 0` and
//!    `pg_wal_lsn_diff(pg_last_wal_replay_lsn(), finalLSN) > 0` (the shutdown checkpoint
//!    record itself was replayed), it runs `SELECT pg_promote(true, 60)` then `CHECKPOINT`
//!    (so the control file, and the reported `timeline`, are the new timeline's). It never
//!    promotes otherwise and reports why (`lastError: switchover to this pod: ...`), waiting
//!    indefinitely (the operator owns timeouts). Then it runs as the primary (app and
//!    replication roles kept in line) although `currentPrimary` still names the old pod;
//!    PostgreSQL removed `standby.signal`, so a restart comes back as the primary
//!    (`targetPrimary` names it and its data is a primary's).
//! 3. Once `currentPrimary` names another pod, the old primary (a primary's data, no
//!    `standby.signal`) waits for that pod to report `ready` as `primary` with a timeline past
//!    its own, rewinds with `pg_rewind` to the new primary's history, writes
//!    `standby.signal`, `primary_conninfo` and `recovery_target_timeline = 'latest'` and
//!    starts as its standby. If the rewind fails, or it does not stream within 30 s (or the
//!    engine exits twice), its data is moved aside to `<data>.old-<unix time>` and the
//!    primary cloned with `pg_basebackup` like a new replica (event `Rejoined` says which).
//! 4. Other replicas resolve the new `currentPrimary`'s address, apply it with `ALTER
//!    SYSTEM SET primary_conninfo` and `pg_reload_conf()`, and follow the new timeline.
//!
//! Failover, fencing and the primary lock: docs/failover.md. The instance's role is one
//! state machine (`agent::role`, docs/agent.md "Roles"). MariaDB/MySQL ignore
//! `status.currentPrimary`.
//!
//! # Backups, WAL archiving and restore (docs/backup.md)
//! The agent watches its own pod (field selector on its name) for the operator's
//! annotations `db.devctl.io/backup-destination` (JSON `StoreLocation`),
//! `db.devctl.io/backup-request` (`BackupRequest`) and `db.devctl.io/restore`
//! (`RestoreRequest`), and — from the first use — the Secrets `<cluster>-backup-store` and
//! `<cluster>-restore-store` (`accessKeyId`, `secretAccessKey`, optional `ca.crt`, which is
//! then the only CA trusted). The store is S3 (`object_store`, path-style, region default
//! `us-east-1`); transient errors are retried per request (1 s doubling, 5 attempts). Keys
//! never appear in logs, reports or errors. Layout under `<prefix>`: `owner.json` (the
//! cluster's uid, written before the first upload; another uid there refuses every write),
//! `<systemIdentifier>/wal/<file>`, `<systemIdentifier>/base/<backupId>/{data.tar|dump.sql,
//! backup.json}`.
//! - WAL (PostgreSQL): the server runs with `archive_mode=on`, `archive_command='<agent>'
//!   wal-push %p`, `archive_timeout=60`. The primary reports `walArchive` (`lastArchived`,
//!   `lastArchivedAt`, `failing`, `error`) while the pod has a destination.
//! - Backup (on the pod the request names, primary or replica; one at a time; a request
//!   whose uid already finished — as the last report says, read from the pod at start — is
//!   not rerun): PostgreSQL streams `pg_basebackup -D - -Ft -X none --checkpoint=fast -v`
//!   (superuser over the private socket: pg_hba.conf needs `local replication postgres peer
//!   map=devctl`) as a multipart upload into `data.tar`; the start comes from `backup_label`
//!   in the stream, the end from the `backup_manifest` pg_basebackup appends; it is
//!   `Completed` once every WAL segment from `beginWAL` to `endWAL` is archived (a replica
//!   asks the primary for `pg_switch_wal()` as the replication role, which the primary
//!   grants it; else `archive_timeout` bounds the wait; at most 10 minutes), then
//!   `backup.json` is written last. MySQL family: `mariadb-dump`/`mysqldump
//!   --single-transaction --all-databases --routines --events --triggers` into `dump.sql`.
//!   Progress in the report's `backup` (`Running`, `Completed`, `Failed` with `error`).
//! - Restore (`DEVCTL_BOOTSTRAP=recovery`): PostgreSQL's first instance (the one
//!   `status.currentPrimary` names, empty data directory) waits for the annotation and the
//!   Secret, reads `backup.json` (missing: refused, the backup is incomplete), unpacks
//!   `data.tar` into `.<data>.restore` and renames it into place with `recovery.signal`,
//!   `restore_command = '<agent>' wal-fetch %f %p`, `recovery_target_time` (when asked),
//!   `recovery_target_action = 'promote'`, `recovery_target_timeline = 'latest'`; it is not
//!   ready while it replays, and once promoted it removes those settings (`ALTER SYSTEM
//!   RESET`) and runs as the primary; its own WAL goes under its own prefix. MySQL family:
//!   the fresh server replays `dump.sql` (then `FLUSH PRIVILEGES`) before credentials are
//!   applied or it is ready; `.devctl-restored` in the data directory marks it done.
//!
//! The engine gets `PR_SET_PDEATHSIG` (SIGKILL) so it never outlives the agent; the binary
//! runs a current-thread runtime so the forking thread lives as long as the process. When
//! the agent is PID 1 it also reaps orphaned zombies.

pub mod agent;
pub mod archive;
pub mod archive_gap;
pub mod backup;
pub mod cluster;
pub mod config;
pub mod credentials;
pub mod engine;
pub mod error;
pub mod health;
pub mod lease;
pub mod major_upgrade;
pub mod mariadb;
pub mod process;
pub mod report;
pub mod store;
pub mod test_hooks;
pub mod upgrade_step;
pub mod wal;

use std::time::Duration;

use devctl_api::instance::InstanceStatus;

use crate::config::{Config, PodRef};
use crate::error::Error;

/// Runs the agent from the process environment and returns the exit code.
pub async fn run_from_env() -> i32 {
    let result = match Config::from_env() {
        Ok(config) => agent::run(config).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(agent::Outcome::Stopped) => 0,
        Ok(agent::Outcome::Stale(why)) => {
            tracing::warn!("exiting: {why}");
            0
        }
        Err(e) => fail(&e).await,
    }
}

/// Prints the one-line reason, reports it on the pod when possible, and returns the exit
/// code.
async fn fail(error: &Error) -> i32 {
    let line = error.one_line();
    eprintln!("devctl-agent: {line}");
    let lookup = |name: &str| std::env::var(name).ok();
    if let Some(pod) = PodRef::from_lookup(lookup) {
        let address = match (
            lookup(devctl_api::instance::env::POD_IP),
            lookup(devctl_api::instance::env::PORT),
        ) {
            (Some(ip), Some(port)) if !ip.is_empty() && !port.is_empty() => {
                Some(format!("{ip}:{port}"))
            }
            _ => None,
        };
        let status = InstanceStatus {
            ready: false,
            address,
            heartbeat: Some(report::now_rfc3339()),
            last_error: Some(line),
            ..InstanceStatus::default()
        };
        let attempt = async {
            match agent::kube_client().await {
                Ok(client) => report::report_failure(client, &pod, status).await,
                Err(e) => tracing::warn!("cannot report the failure: {e}"),
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), attempt)
            .await
            .is_err()
        {
            tracing::warn!("reporting the failure timed out");
        }
    }
    error.exit_code()
}

/// `devctl-agent install <DIR>`: copies the running executable to `<DIR>/devctl-agent`
/// with mode 0755 (via a temporary file and a rename, so a half-written copy is never run).
pub fn install(dir: &std::path::Path) -> Result<std::path::PathBuf, Error> {
    use std::os::unix::fs::PermissionsExt;
    let source = std::env::current_exe()
        .map_err(|e| Error::Internal(format!("cannot find the agent's own executable: {e}")))?;
    let target = dir.join("devctl-agent");
    let temporary = dir.join(".devctl-agent.tmp");
    let cannot =
        |e: std::io::Error| Error::DataDir(format!("cannot install into {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(cannot)?;
    std::fs::copy(&source, &temporary).map_err(cannot)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o755)).map_err(cannot)?;
    std::fs::rename(&temporary, &target).map_err(cannot)?;
    Ok(target)
}
