//! Cloning a MariaDB primary: its agent streams `mariadb-backup --backup --stream=xbstream`
//! over HTTP (`GET /clone` on the agent's port, HTTP Basic with the replication user and
//! password), and the replica's agent unpacks it with `mbstream`, prepares it with
//! `mariadb-backup --prepare` and moves it into place with the position replication starts
//! from. No dump: the copy is physical, taken while the primary serves.
//!
//! A copy that breaks off (the backup failed, the connection dropped) ends the response
//! without its last chunk, so the replica sees an error, never a short copy that looks whole.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{Marker, REPLICA_MARKER};
use crate::engine::{Engine, clone_dir};
use crate::process;

/// The clone endpoint's path.
pub const CLONE_PATH: &str = "/clone";
/// How long a clone may take in all.
const CLONE_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
/// The file `mariadb-backup` writes the binary log position (and GTID) of the copy to.
const BINLOG_INFO: [&str; 2] = ["xtrabackup_binlog_info", "mariadb_backup_binlog_info"];

/// What the primary's agent serves clones from.
pub struct CloneSource {
    engine: Engine,
    /// The replication user and password (from the replication Secret).
    auth: RwLock<Option<(String, String)>>,
    /// Only the primary serves (a replica's copy could be behind, or another history).
    serving: AtomicBool,
    /// One copy at a time: each reads the whole data directory.
    busy: Arc<tokio::sync::Semaphore>,
}

impl CloneSource {
    pub fn new(engine: Engine) -> Arc<Self> {
        Arc::new(Self {
            engine,
            auth: RwLock::new(None),
            serving: AtomicBool::new(false),
            busy: Arc::new(tokio::sync::Semaphore::new(1)),
        })
    }

    pub fn set_auth(&self, user: &str, password: &str) {
        if let Ok(mut auth) = self.auth.write() {
            *auth = Some((user.to_string(), password.to_string()));
        }
    }

    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Relaxed);
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(given) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|v| {
                base64::engine::general_purpose::STANDARD
                    .decode(v.trim())
                    .ok()
            })
        else {
            return false;
        };
        let Ok(auth) = self.auth.read() else {
            return false;
        };
        let Some((user, password)) = auth.as_ref() else {
            return false;
        };
        constant_time_eq(&given, format!("{user}:{password}").as_bytes())
    }
}

/// Compares without an early exit on the first difference (the password's bytes).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The route, to be served beside the health probes.
pub fn router(source: Arc<CloneSource>) -> Router {
    Router::new()
        .route(CLONE_PATH, get(serve_clone))
        .with_state(source)
}

async fn serve_clone(State(source): State<Arc<CloneSource>>, headers: HeaderMap) -> Response {
    if !source.authorized(&headers) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"devctl clone\"")],
            "the replication user and password are required\n",
        )
            .into_response();
    }
    if !source.serving.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "this instance is not the primary\n",
        )
            .into_response();
    }
    let Ok(permit) = source.busy.clone().try_acquire_owned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "a copy is being taken\n").into_response();
    };
    let mut command = match backup_command(&source.engine, "clone") {
        Ok(command) => command,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    };
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    process::die_with_parent(&mut command);
    let mut child = match process::spawn(&mut command) {
        Ok(child) => child,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot start mariadb-backup: {e}\n"),
            )
                .into_response();
        }
    };
    tracing::info!("streaming a copy of the data to a replica (mariadb-backup)");
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no output pipes\n").into_response();
    };
    let last_error = process::LastError::default();
    let log = process::forward(stderr, "[mariadb-backup] ", Some(last_error.clone()));
    let state = Some((stdout, child, permit, log, last_error));
    let stream = futures::stream::unfold(state, |state| async move {
        let (mut stdout, mut child, permit, log, last_error) = state?;
        let mut buffer = vec![0u8; 256 * 1024];
        match stdout.read(&mut buffer).await {
            Ok(0) => {
                let status = child.wait().await;
                let _ = tokio::time::timeout(Duration::from_secs(1), log).await;
                drop(permit);
                process::release(child.id());
                match status {
                    Ok(status) if status.success() => {
                        tracing::info!("the copy for a replica is complete");
                        None
                    }
                    other => {
                        let why = format!(
                            "mariadb-backup failed ({}): {}",
                            other.map_or_else(|e| e.to_string(), |s| s.to_string()),
                            last_error.take().unwrap_or_default()
                        );
                        tracing::error!("{why}");
                        Some((Err(std::io::Error::other(why)), None))
                    }
                }
            }
            Ok(n) => {
                buffer.truncate(n);
                Some((
                    Ok(Bytes::from(buffer)),
                    Some((stdout, child, permit, log, last_error)),
                ))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// `mariadb-backup --backup --stream=xbstream` of the running server, as the socket
/// administrator; its scratch files go beside the data directory (one directory per
/// `purpose`: a clone and a backup may run at once).
pub(crate) fn backup_command(engine: &Engine, purpose: &str) -> Result<Command, String> {
    let program = engine.mysql_tool("mariadb-backup")?;
    let config = engine.config();
    let scratch = scratch_dir(&config.data_dir, purpose);
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let mut command = Command::new(program);
    command
        .arg(format!(
            "--defaults-file={}",
            config.config_file(crate::engine::MY_CNF).display()
        ))
        .arg("--backup")
        .arg("--stream=xbstream")
        .arg(format!("--target-dir={}", scratch.display()))
        .arg(format!("--datadir={}", config.data_dir.display()))
        .arg(format!("--socket={}", engine.mysql_socket().display()))
        .arg(format!("--user={}", engine.os_user()))
        .current_dir(&scratch)
        .env_remove("MYSQL_PWD");
    Ok(command)
}

/// Where `mariadb-backup` keeps its scratch files while streaming.
fn scratch_dir(data: &Path, purpose: &str) -> PathBuf {
    let name = data
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "data".into());
    data.with_file_name(format!("{name}.{purpose}-source"))
}

/// Clones the primary whose agent serves at `address` into the empty data directory:
/// streamed into a sibling directory, prepared, marked with the position replication starts
/// from, and renamed into place, so an interrupted clone never looks like data. Returns that
/// position.
pub async fn clone_from(
    engine: &Engine,
    address: &str,
    user: &str,
    password: &str,
) -> Result<String, String> {
    let data = engine.data_dir().to_path_buf();
    let temporary = clone_dir(&data);
    if temporary.exists() {
        tracing::info!(dir = %temporary.display(), "removing an interrupted clone");
        std::fs::remove_dir_all(&temporary)
            .map_err(|e| format!("cannot remove {}: {e}", temporary.display()))?;
    }
    std::fs::create_dir_all(&temporary)
        .map_err(|e| format!("cannot create {}: {e}", temporary.display()))?;
    let result = tokio::time::timeout(
        CLONE_TIMEOUT,
        fetch_and_prepare(engine, address, user, password, &temporary),
    )
    .await
    .unwrap_or_else(|_| Err(format!("not done within {}s", CLONE_TIMEOUT.as_secs())));
    let finish = |gtid: String| -> Result<String, String> {
        std::fs::write(
            temporary.join(REPLICA_MARKER),
            Marker::Cloned(gtid.clone()).render(),
        )
        .map_err(|e| format!("cannot write {REPLICA_MARKER}: {e}"))?;
        // The data directory exists (empty); rename(2) replaces an empty one.
        std::fs::rename(&temporary, &data).map_err(|e| {
            format!(
                "cannot move the clone into {} (is it empty?): {e}",
                data.display()
            )
        })?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700));
        Ok(gtid)
    };
    match result.and_then(finish) {
        Ok(gtid) => Ok(gtid),
        Err(why) => {
            let _ = std::fs::remove_dir_all(&temporary);
            Err(format!("cloning the primary from {address}: {why}"))
        }
    }
}

async fn fetch_and_prepare(
    engine: &Engine,
    address: &str,
    user: &str,
    password: &str,
    target: &Path,
) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        // A copy that stalls this long is broken off (and retried).
        .read_timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| format!("HTTP client: {e}"))?;
    let mut response = client
        .get(format!("http://{address}{CLONE_PATH}"))
        .basic_auth(user, Some(password))
        .send()
        .await
        .map_err(|e| format!("requesting the copy: {e}"))?;
    if !response.status().is_success() {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        return Err(format!(
            "the primary's agent answered {status}: {}",
            body.trim()
        ));
    }
    let mut unpack = Command::new(engine.mysql_tool("mbstream")?);
    unpack
        .arg("-x")
        .arg("-C")
        .arg(target)
        .current_dir(target)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    process::die_with_parent(&mut unpack);
    let mut child =
        process::spawn(&mut unpack).map_err(|e| format!("cannot start mbstream: {e}"))?;
    let pid = child.id();
    let mut stdin = child.stdin.take().ok_or("mbstream has no stdin")?;
    let mut received: u64 = 0;
    let copied: Result<(), String> = async {
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("the copy broke off after {received} bytes: {e}"))?
        {
            received += chunk.len() as u64;
            stdin
                .write_all(&chunk)
                .await
                .map_err(|e| format!("writing to mbstream: {e}"))?;
        }
        Ok(())
    }
    .await;
    drop(stdin);
    let output = child.wait_with_output().await;
    process::release(pid);
    copied?;
    let output = output.map_err(|e| format!("mbstream: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "mbstream failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    tracing::info!(
        bytes = received,
        "received the primary's copy; preparing it"
    );
    let prepare = engine.mysql_tool("mariadb-backup")?;
    let args = vec![
        "--prepare".to_string(),
        format!("--target-dir={}", target.display()),
    ];
    let output = process::run(&prepare, &args, &[], target, b"", CLONE_TIMEOUT).await?;
    if !output.status.success() {
        return Err(format!(
            "mariadb-backup --prepare failed: {}",
            output.error_line()
        ));
    }
    // Without it the replica would not know where to start: never guessed.
    let gtid = BINLOG_INFO
        .iter()
        .find_map(|name| std::fs::read_to_string(target.join(name)).ok())
        .map(|text| binlog_info_gtid(&text))
        .ok_or("the copy has no binary log position (xtrabackup_binlog_info)")?;
    Ok(gtid)
}

/// The GTID position in `xtrabackup_binlog_info` (`file<TAB>position<TAB>gtid`): empty when
/// the primary had written nothing to its binary log yet.
pub fn binlog_info_gtid(text: &str) -> String {
    text.lines()
        .next()
        .and_then(|line| line.split('\t').nth(2))
        .map(|gtid| gtid.trim().to_string())
        .unwrap_or_default()
}
