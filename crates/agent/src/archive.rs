//! PostgreSQL's `archive_command` and `restore_command` through the running agent: the
//! agent serves a Unix socket (`<run dir>/agent.sock`, mode 0600, in its private run
//! directory) and `devctl-agent wal-push %p` / `devctl-agent wal-fetch %f %p` — run by
//! PostgreSQL — hand it one file each. The store credentials stay in the agent.
//!
//! The protocol is one JSON line each way: `{"op":"push","path":…}` or
//! `{"op":"fetch","name":…,"path":…}`, answered by `{"result":"stored|skipped|fetched|
//! missing|error","message":…}`.

use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use devctl_api::instance::env;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::backup::Shared;
use crate::error::{Error, one_line};
use crate::store::StoreError;
use crate::wal::{is_wal_file_name, system_prefix, wal_key};

/// The socket's name in the run directory.
pub const SOCKET: &str = "agent.sock";

/// `wal-push`: stored (or archiving is off). `wal-fetch`: the file is in place.
pub const EXIT_OK: i32 = 0;
/// `wal-push`: not stored (PostgreSQL retries). `wal-fetch`: the archive has no such file
/// (what ends PostgreSQL's recovery).
pub const EXIT_NOT_DONE: i32 = 1;
/// `wal-fetch`: the archive could not be read. Above 125, so PostgreSQL aborts recovery
/// (the agent restarts it) instead of taking the error for the end of the archive and
/// promoting early.
pub const EXIT_ABORT_RECOVERY: i32 = 126;

/// How long the client waits for the agent's answer (uploads are retried inside).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(900);
/// How long the agent waits for a request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_REQUEST: u64 = 16 * 1024;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// Archive the file at `path` (absolute) under its file name.
    Push { path: String },
    /// Restore the archived file `name` to `path` (absolute): from the restore source, or
    /// with `standby` from the cluster's own archive (a replica's fallback when the primary
    /// no longer has the WAL it needs).
    Fetch {
        name: String,
        path: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        standby: bool,
    },
}

pub const STORED: &str = "stored";
pub const SKIPPED: &str = "skipped";
pub const FETCHED: &str = "fetched";
pub const MISSING: &str = "missing";
pub const ERROR: &str = "error";

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Response {
    fn new(result: &str, message: impl Into<Option<String>>) -> Self {
        Response {
            result: result.into(),
            message: message.into(),
        }
    }
}

/// Binds `<run dir>/agent.sock` (a stale one from a previous process is removed; mode
/// 0600) and serves it for the agent's lifetime.
pub fn serve(shared: Arc<Shared>) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let path = shared.config.run_dir.join(SOCKET);
    let cannot = |e: std::io::Error| {
        Error::DataDir(format!(
            "cannot serve the agent socket {}: {e}",
            path.display()
        ))
    };
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(cannot(e)),
    }
    let listener = UnixListener::bind(&path).map_err(cannot)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(cannot)?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let shared = shared.clone();
                    tokio::spawn(async move { handle(shared, stream).await });
                }
                Err(e) => {
                    tracing::warn!("accepting on the agent socket: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
    Ok(())
}

async fn handle(shared: Arc<Shared>, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST));
    let response = match tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await {
        Err(_) => Response::new(ERROR, "no request within 10s".to_string()),
        Ok(Err(e)) => Response::new(ERROR, format!("reading the request: {e}")),
        Ok(Ok(_)) => match serde_json::from_str::<Request>(line.trim()) {
            Err(e) => Response::new(ERROR, format!("malformed request: {e}")),
            Ok(Request::Push { path }) => push(&shared, &path).await,
            Ok(Request::Fetch {
                name,
                path,
                standby: false,
            }) => fetch(&shared, &name, &path).await,
            Ok(Request::Fetch {
                name,
                path,
                standby: true,
            }) => fetch_for_standby(&shared, &name, &path).await,
        },
    };
    let mut out =
        serde_json::to_vec(&response).unwrap_or_else(|_| b"{\"result\":\"error\"}".to_vec());
    out.push(b'\n');
    if let Err(e) = write.write_all(&out).await {
        tracing::warn!("answering on the agent socket: {e}");
    }
}

/// The file name of an absolute `path`, if it is one PostgreSQL archives.
fn wal_file(path: &str) -> Result<(PathBuf, String), String> {
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .filter(|n| is_wal_file_name(n))
        .ok_or_else(|| format!("{} is not a WAL file", path.display()))?;
    Ok((path, name))
}

/// Archives one file: `<prefix><systemIdentifier>/wal/<name>`, `owner.json` checked first;
/// acknowledged without upload while the pod has no destination.
async fn push(shared: &Shared, path: &str) -> Response {
    let (path, name) = match wal_file(path) {
        Ok(x) => x,
        Err(e) => return Response::new(ERROR, e),
    };
    if shared.standby_engine() {
        // A standby never archives (`archive_mode = on`): this engine left recovery without
        // its agent promoting it. Its timeline is not the cluster's, and once in the archive
        // its history file would lead every standby that restarts (and every restore to the
        // end of the archive) onto it, away from the primary.
        let message = format!(
            "not archiving {name}: the engine left recovery although its agent runs it as a standby (promoted behind the agent's back); its WAL stays out of the archive"
        );
        tracing::warn!("{message}");
        return Response::new(ERROR, message);
    }
    let store = match shared.store().await {
        Ok(None) => {
            shared.clear_archive();
            tracing::debug!(%name, "no backup destination: acknowledged without upload");
            return Response::new(
                SKIPPED,
                "no backup destination: acknowledged without upload".to_string(),
            );
        }
        Ok(Some(store)) => store,
        // Not a failure: PostgreSQL keeps the segment and retries once the pod is annotated.
        Err(e) if e == crate::backup::NOT_ANNOTATED => {
            tracing::debug!(%name, "{e}");
            return Response::new(ERROR, e);
        }
        Err(e) => {
            let message = format!("archiving {name}: {e}");
            tracing::warn!("{message}");
            shared.record_archive(Err(&message));
            return Response::new(ERROR, message);
        }
    };
    let result: Result<String, String> = async {
        let sysid = shared.system_identifier().await?;
        shared.ensure_owner(&store).await?;
        let data = tokio::fs::read(&path)
            .await
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let key = wal_key(&system_prefix(&store.location.prefix, &sysid), &name);
        // Never over another writer's segment: same content is success, different refused.
        let put = store
            .put_once(&key, Bytes::from(data))
            .await
            .map_err(|e| e.to_string())?;
        if put == crate::store::PutOnce::AlreadyStored {
            tracing::info!(url = %store.url(&key), "already archived with the same content");
        }
        Ok(store.url(&key))
    }
    .await;
    match result {
        Ok(url) => {
            tracing::debug!(%url, "archived");
            shared.record_archive(Ok(&name));
            Response::new(STORED, url)
        }
        Err(e) => {
            let message = format!("archiving {name}: {}", one_line(&e));
            tracing::warn!("{message}");
            shared.record_archive(Err(&message));
            Response::new(ERROR, message)
        }
    }
}

/// Restores one archived file of the restore source (`<source prefix>wal/<name>`) to
/// `path`, through a temporary file and a rename.
async fn fetch(shared: &Shared, name: &str, path: &str) -> Response {
    if !is_wal_file_name(name) {
        return Response::new(ERROR, format!("{name:?} is not a WAL file name"));
    }
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Response::new(ERROR, format!("{} is not an absolute path", path.display()));
    }
    let (store, request) = match shared.restore_source().await {
        Ok(x) => x,
        Err(e) => return Response::new(ERROR, format!("restoring {name}: {e}")),
    };
    let key = wal_key(&request.location.prefix, name);
    match store.get(&key).await {
        Ok(bytes) => match write_atomically(&path, &bytes).await {
            Ok(()) => {
                tracing::info!(url = %store.url(&key), "restored archived WAL");
                // A hole reported before (a store that answered "not found" for a moment)
                // is not one any more.
                shared.clear_restore_hole();
                Response::new(FETCHED, store.url(&key))
            }
            Err(e) => Response::new(ERROR, e),
        },
        Err(StoreError::NotFound(url)) => {
            // The end of the archive — or a hole in it: later WAL of the same timeline is
            // there. Recovery must not end (and promote) short of it.
            let wal = wal_key(&request.location.prefix, "");
            match store.keys_after(&wal, &key, 4).await {
                Ok(later) => {
                    if let Some(after) = later_segment_of_timeline(name, &later) {
                        let why = format!(
                            "the archive misses WAL segment {name} although it holds later WAL of that timeline ({after}): restoring past the hole would lose what it holds, so the restore stops here"
                        );
                        tracing::error!("{why}");
                        shared.set_restore_hole(why.clone());
                        return Response::new(ERROR, why);
                    }
                }
                Err(e) => {
                    // Cannot tell a hole from the end: not the end, then (retried).
                    tracing::warn!("looking past {name} in the archive: {e}");
                    return Response::new(ERROR, format!("looking past {name}: {e}"));
                }
            }
            tracing::info!(%url, "not in the archive");
            Response::new(MISSING, format!("{url} does not exist"))
        }
        Err(e) => {
            tracing::warn!("restoring {name}: {e}");
            Response::new(ERROR, format!("restoring {name}: {e}"))
        }
    }
}

/// A later segment of `name`'s timeline among `keys` (object keys), if `name` is a segment
/// (pure): what makes a missing segment a hole rather than the end of the archive.
fn later_segment_of_timeline<'k>(name: &str, keys: &'k [String]) -> Option<&'k str> {
    let size = crate::wal::DEFAULT_SEGMENT_SIZE;
    let (timeline, segment) = crate::wal::parse_segment_name(name, size)?;
    keys.iter().map(String::as_str).find(|key| {
        let file = key.rsplit('/').next().unwrap_or_default();
        file.get(..24)
            .filter(|_| file.len() == 24)
            .and_then(|n| crate::wal::parse_segment_name(n, size))
            .is_some_and(|(t, s)| t == timeline && s > segment)
    })
}

/// A standby's `restore_command`: the archived file `name` of this cluster
/// (`<prefix><systemIdentifier>/wal/<name>`, where its primaries archive) to `path`. Every
/// failure is [`MISSING`]: a standby never ends recovery on it, it streams again instead, and
/// an unreachable store must not stop it (as [`EXIT_ABORT_RECOVERY`] would).
async fn fetch_for_standby(shared: &Shared, name: &str, path: &str) -> Response {
    // PostgreSQL's startup process waits for this (also to promote): a store that hangs
    // must not hold the standby, so the archive gets a short turn.
    match tokio::time::timeout(
        STANDBY_FETCH_TIMEOUT,
        fetch_for_standby_now(shared, name, path),
    )
    .await
    {
        Ok(response) => response,
        Err(_) => Response::new(
            MISSING,
            format!(
                "fetching {name}: no answer from the store within {}s",
                STANDBY_FETCH_TIMEOUT.as_secs()
            ),
        ),
    }
}

/// How long a standby's fetch from the archive may take.
const STANDBY_FETCH_TIMEOUT: Duration = Duration::from_secs(15);

async fn fetch_for_standby_now(shared: &Shared, name: &str, path: &str) -> Response {
    let missing = |why: String| Response::new(MISSING, why);
    if !is_wal_file_name(name) {
        return missing(format!("{name:?} is not a WAL file name"));
    }
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return missing(format!("{} is not an absolute path", path.display()));
    }
    let store = match shared.store().await {
        Ok(Some(store)) => store,
        Ok(None) => return missing("no backup destination: no archive to fetch from".into()),
        Err(e) => return missing(format!("fetching {name}: {e}")),
    };
    let sysid = match shared.system_identifier().await {
        Ok(sysid) => sysid,
        Err(e) => return missing(format!("fetching {name}: {e}")),
    };
    let key = wal_key(&system_prefix(&store.location.prefix, &sysid), name);
    match store.get(&key).await {
        Ok(bytes) => match write_atomically(&path, &bytes).await {
            Ok(()) => {
                tracing::info!(url = %store.url(&key), "restored archived WAL (standby catching up from the archive)");
                Response::new(FETCHED, store.url(&key))
            }
            Err(e) => missing(e),
        },
        // Asked for every segment the stream has not delivered yet: not news.
        Err(StoreError::NotFound(url)) => missing(format!("{url} does not exist")),
        Err(e) => {
            tracing::warn!("fetching {name} for the standby: {e}");
            missing(format!("fetching {name}: {e}"))
        }
    }
}

async fn write_atomically(path: &Path, data: &[u8]) -> Result<(), String> {
    let temporary = path.with_extension("devctl-tmp");
    let result = async {
        let mut file = tokio::fs::File::create(&temporary).await?;
        file.write_all(data).await?;
        file.sync_all().await?;
        tokio::fs::rename(&temporary, path).await
    }
    .await;
    result.map_err(|e| {
        let _ = std::fs::remove_file(&temporary);
        format!("cannot write {}: {e}", path.display())
    })
}

/// The client side: one request to the agent at `$DEVCTL_RUN_DIR/agent.sock`.
fn call(request: &Request) -> Result<Response, String> {
    let run_dir = std::env::var_os(env::RUN_DIR)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("{} is not set", env::RUN_DIR))?;
    let socket = Path::new(&run_dir).join(SOCKET);
    let mut stream = std::os::unix::net::UnixStream::connect(&socket)
        .map_err(|e| format!("cannot reach the agent at {}: {e}", socket.display()))?;
    stream
        .set_read_timeout(Some(CLIENT_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(10))))
        .map_err(|e| format!("agent socket: {e}"))?;
    let mut line = serde_json::to_vec(request).map_err(|e| format!("encoding: {e}"))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| format!("writing to the agent: {e}"))?;
    let mut answer = String::new();
    std::io::BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(|e| format!("reading the agent's answer: {e}"))?;
    serde_json::from_str(answer.trim())
        .map_err(|e| format!("malformed answer from the agent ({e}): {answer:?}"))
}

/// `path` made absolute against the working directory (PostgreSQL runs the commands in
/// the data directory and passes `pg_wal/…`).
fn absolute(path: &str) -> Result<String, String> {
    let path = Path::new(path);
    if path.is_absolute() {
        return Ok(path.display().to_string());
    }
    let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    Ok(cwd.join(path).display().to_string())
}

/// `devctl-agent wal-push <path>`: 0 once the agent stored the file (or archiving is off),
/// 1 otherwise (PostgreSQL retries).
pub fn wal_push(path: &str) -> i32 {
    let result = absolute(path).and_then(|path| call(&Request::Push { path }));
    match result {
        Ok(r) if r.result == STORED || r.result == SKIPPED => EXIT_OK,
        Ok(r) => {
            eprintln!(
                "devctl-agent wal-push: {}",
                r.message.unwrap_or_else(|| r.result.clone())
            );
            EXIT_NOT_DONE
        }
        Err(e) => {
            eprintln!("devctl-agent wal-push: {e}");
            EXIT_NOT_DONE
        }
    }
}

/// `devctl-agent wal-fetch <name> <path>`: 0 once the file is in place, 1 when the
/// archive does not have it, 126 when the archive cannot be read.
pub fn wal_fetch(name: &str, path: &str, standby: bool) -> i32 {
    let result = absolute(path).and_then(|path| {
        call(&Request::Fetch {
            name: name.to_string(),
            path,
            standby,
        })
    });
    if standby {
        // Whatever went wrong, the standby goes back to streaming (never 126).
        return match result {
            Ok(r) if r.result == FETCHED => EXIT_OK,
            _ => EXIT_NOT_DONE,
        };
    }
    match result {
        Ok(r) if r.result == FETCHED => EXIT_OK,
        Ok(r) if r.result == MISSING => EXIT_NOT_DONE,
        Ok(r) => {
            eprintln!(
                "devctl-agent wal-fetch: {}",
                r.message.unwrap_or_else(|| r.result.clone())
            );
            EXIT_ABORT_RECOVERY
        }
        Err(e) => {
            eprintln!("devctl-agent wal-fetch: {e}");
            EXIT_ABORT_RECOVERY
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speaks_one_json_line_each_way() {
        let push = Request::Push {
            path: "/d/pg_wal/000000010000000000000001".into(),
        };
        assert_eq!(
            serde_json::to_string(&push).unwrap(),
            r#"{"op":"push","path":"/d/pg_wal/000000010000000000000001"}"#
        );
        let fetch: Request = serde_json::from_str(
            r#"{"op":"fetch","name":"00000002.history","path":"/d/pg_wal/RECOVERYHISTORY"}"#,
        )
        .unwrap();
        assert_eq!(
            fetch,
            Request::Fetch {
                name: "00000002.history".into(),
                path: "/d/pg_wal/RECOVERYHISTORY".into(),
                standby: false,
            }
        );
        let standby = Request::Fetch {
            name: "000000010000000000000003".into(),
            path: "/d/pg_wal/RECOVERYXLOG".into(),
            standby: true,
        };
        let line = serde_json::to_string(&standby).unwrap();
        assert!(line.contains(r#""standby":true"#), "{line}");
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), standby);
        assert_eq!(
            serde_json::to_string(&Response::new(MISSING, None)).unwrap(),
            r#"{"result":"missing"}"#
        );
    }

    #[test]
    fn a_missing_segment_is_a_hole_when_later_wal_of_its_timeline_is_archived() {
        let keys = |names: &[&str]| -> Vec<String> {
            names.iter().map(|n| format!("p/7/wal/{n}")).collect()
        };
        let missing = "000000010000000000000005";
        // The end of the archive: nothing later, or only the switch point's .partial and
        // the next timeline.
        assert_eq!(later_segment_of_timeline(missing, &keys(&[])), None);
        assert_eq!(
            later_segment_of_timeline(
                missing,
                &keys(&[
                    "000000010000000000000005.partial",
                    "00000002.history",
                    "000000020000000000000005"
                ])
            ),
            None
        );
        // A hole: segment 6 of timeline 1 is there.
        assert_eq!(
            later_segment_of_timeline(missing, &keys(&["000000010000000000000006"])),
            Some("p/7/wal/000000010000000000000006")
        );
        // History files are not segments.
        assert_eq!(
            later_segment_of_timeline("00000002.history", &keys(&["000000020000000000000006"])),
            None
        );
    }

    #[test]
    fn takes_only_wal_files_by_absolute_path() {
        assert_eq!(
            wal_file("/d/pg_wal/000000010000000000000001").unwrap().1,
            "000000010000000000000001"
        );
        assert!(wal_file("pg_wal/000000010000000000000001").is_err());
        assert!(wal_file("/etc/passwd").is_err());
        assert_eq!(absolute("/x").unwrap(), "/x");
    }
}
