//! MariaDB backups (docs/mariadb.md, "Backups"): a physical copy with
//! `mariadb-backup --backup --stream=xbstream` streamed to the store (a replica's by
//! preference), restored into a new cluster's empty data directory, then the archived binary
//! logs replayed after the copy's GTID position up to the target time (or the end of the
//! archive).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use devctl_api::instance::{BackupReport, BackupRequest};
use tokio::io::AsyncWriteExt;

use super::archive::{ArchivedTerm, binlog_prefix, list_terms};
use crate::backup::{
    COMPLETED, RestoreError, Shared, Tail, backup_target, create_private_dir, finish, lock,
    read_manifest, restore_dir, spawn_streaming, stream_to_store, write_manifest,
};
use crate::process;
use crate::report::now_rfc3339;
use crate::store::Store;
use crate::wal::data_object;

/// A PITR marker in the restored data directory: JSON [`Pending`], until the binary logs
/// are replayed.
pub const PITR_PENDING: &str = ".devctl-binlog-replay";
/// How long a restore to a target time waits for the archive to hold a transaction past it
/// (the source rotates and archives its log at least every archive timeout).
const TARGET_WAIT: Duration = Duration::from_secs(300);

/// What the replay after a restore starts from.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    pub backup_id: String,
    /// The copy's GTID position.
    pub position: String,
    /// RFC 3339; the end of the archive when unset.
    pub target_time: Option<String>,
    /// When the replay began to wait for the archive (unix seconds).
    #[serde(default)]
    pub waiting_since: Option<u64>,
    /// The restored server's binary log was reset to the copy's position (its GTID state
    /// then starts where the copy ends, and a replay resumes from its own binary log).
    #[serde(default)]
    pub gtid_state_set: bool,
}

/// The GTID position in `mariadb-backup`'s closing lines (`… GTID of the last change
/// '0-1-3'`), if this line has it.
pub fn gtid_in_log_line(line: &str) -> Option<String> {
    let (_, rest) = line.split_once("GTID of the last change '")?;
    let (gtid, _) = rest.split_once('\'')?;
    Some(gtid.to_string())
}

/// Takes a physical backup of this instance into the store.
pub async fn take(
    shared: &Shared,
    request: &BackupRequest,
    report: &mut BackupReport,
) -> Result<(), String> {
    let (store, sysid, _sys_prefix, base) = backup_target(shared, request, report).await?;
    let command = super::clone::backup_command(&shared.engine, "backup")?;
    let position = Arc::new(Mutex::new(None::<String>));
    let key = format!("{base}{}", data_object("mariadb"));
    let size = {
        let position = position.clone();
        stream_to_store(&store, &key, command, "mariadb-backup", move |line| {
            if let Some(gtid) = gtid_in_log_line(line) {
                *lock(&position) = Some(gtid);
            }
        })
        .await?
    };
    report.size = i64::try_from(size).ok();
    // Without it a restore would not know where the binary logs continue: never guessed.
    let Some(position) = lock(&position).clone() else {
        let _ = store.delete(&key).await;
        return Err(
            "mariadb-backup did not say the copy's GTID position (\"GTID of the last change\")"
                .into(),
        );
    };
    report.gtid_position = Some(position);
    report.phase = COMPLETED.into();
    report.stopped_at = Some(now_rfc3339());
    write_manifest(shared, &store, &base, &sysid, report, None).await
}

/// Restores the requested backup into the empty data directory (stopped engine): unpacked,
/// prepared and moved into place with [`PITR_PENDING`], so the binary logs are replayed once
/// the engine runs ([`replay`]).
pub async fn restore(shared: &Shared) -> Result<String, RestoreError> {
    let (store, request) = shared.restore_source().await.map_err(RestoreError::Wait)?;
    let (base, manifest) = read_manifest(&store, &request, "mariadb").await?;
    let data = shared.config.data_dir.clone();
    let temporary = restore_dir(&data);
    let failed = |why: String| {
        let _ = std::fs::remove_dir_all(&temporary);
        RestoreError::Failed(why)
    };
    if temporary.exists() {
        std::fs::remove_dir_all(&temporary).map_err(|e| {
            RestoreError::Failed(format!("cannot remove {}: {e}", temporary.display()))
        })?;
    }
    create_private_dir(&temporary).map_err(RestoreError::Failed)?;
    let key = format!("{base}{}", manifest.file);
    tracing::info!(from = %store.url(&key), target_time = ?request.target_time, "restoring the physical backup");
    let size = unpack(shared, &store, &key, &temporary)
        .await
        .map_err(&failed)?;
    let pending = Pending {
        backup_id: request.backup_id.clone(),
        position: manifest.report.gtid_position.clone().unwrap_or_default(),
        target_time: request.target_time.clone(),
        waiting_since: None,
        gtid_state_set: false,
    };
    let settle = || -> Result<(), String> {
        let json = serde_json::to_vec(&pending).map_err(|e| e.to_string())?;
        crate::engine::write_private(&temporary.join(PITR_PENDING), &json)?;
        std::fs::rename(&temporary, &data).map_err(|e| {
            format!(
                "cannot move the restore into {} (is it empty?): {e}",
                data.display()
            )
        })
    };
    settle().map_err(&failed)?;
    Ok(format!(
        "restored the physical backup {} ({size} bytes, GTID {}) from {}; replaying binary logs to {}",
        request.backup_id,
        pending.position,
        store.url(&base),
        request
            .target_time
            .as_deref()
            .unwrap_or("the end of the archive")
    ))
}

/// Streams the copy into `mbstream -x` and prepares it.
async fn unpack(shared: &Shared, store: &Store, key: &str, target: &Path) -> Result<u64, String> {
    let engine = &shared.engine;
    let mut command = tokio::process::Command::new(engine.mysql_tool("mbstream")?);
    command.arg("-x").arg("-C").arg(target).current_dir(target);
    let tail = Arc::new(Mutex::new(Tail::default()));
    let (mut child, stderr_task) = {
        let tail = tail.clone();
        spawn_streaming(command, "mbstream", true, move |line| {
            lock(&tail).push(line)
        })?
    };
    let Some(mut stdin) = child.stdin.take() else {
        finish(&mut child, true).await;
        return Err("mbstream has no stdin".into());
    };
    let fed: Result<u64, String> = async {
        let mut ranges = store.open_ranges(key).await.map_err(|e| e.to_string())?;
        while let Some(bytes) = ranges.next().await? {
            stdin
                .write_all(&bytes)
                .await
                .map_err(|e| format!("feeding mbstream: {e}"))?;
        }
        Ok(ranges.size)
    }
    .await;
    drop(stdin);
    let status = finish(&mut child, fed.is_err()).await;
    let _ = stderr_task.await;
    let size = fed?;
    if !status.is_some_and(|s| s.success()) {
        return Err(format!("mbstream failed: {}", lock(&tail).text()));
    }
    let prepare = engine.mysql_tool("mariadb-backup")?;
    let args = vec![
        "--prepare".to_string(),
        format!("--target-dir={}", target.display()),
    ];
    let output = process::run(
        &prepare,
        &args,
        &[],
        target,
        b"",
        Duration::from_secs(6 * 3600),
    )
    .await?;
    if !output.status.success() {
        return Err(format!(
            "mariadb-backup --prepare failed: {}",
            output.error_line()
        ));
    }
    Ok(size)
}

/// The replay still owed after a restore, if any.
pub fn pending(data: &Path) -> Option<Pending> {
    let bytes = std::fs::read(data.join(PITR_PENDING)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// `target_time` as `mariadb-binlog --stop-datetime` reads it (UTC, the agent runs it with
/// `TZ=UTC`), and as unix seconds.
pub fn stop_datetime(target_time: &str) -> Result<(String, i64), String> {
    let at: k8s_openapi::jiff::Timestamp = target_time
        .parse()
        .map_err(|e| format!("targetTime {target_time:?} is not an RFC 3339 time: {e}"))?;
    Ok((at.strftime("%Y-%m-%d %H:%M:%S").to_string(), at.as_second()))
}

/// Which archived files a replay from `position` runs over, term by term (pure): a term is
/// replayed up to the next term's start (its primary's later transactions were never the
/// cluster's); terms that end before `position` are skipped.
pub fn replay_plan(
    terms: &[ArchivedTerm],
    position: &str,
) -> Result<Vec<(usize, Option<String>)>, String> {
    let start: devctl_api::gtid::Position = position.parse()?;
    let mut plan = Vec::new();
    for (i, term) in terms.iter().enumerate() {
        let stop = terms.get(i + 1).map(|next| next.term.start.clone());
        if let Some(stop) = &stop
            && !stop.is_empty()
            && start.contains(&stop.parse()?)
        {
            continue;
        }
        if term.files.is_empty() {
            continue;
        }
        plan.push((i, stop.filter(|s| !s.is_empty())));
    }
    Ok(plan)
}

/// Whether a term's archived files reach back to `position` (pure): its first file starts at
/// or before it. Otherwise transactions between the two are in no archived file — a gap a
/// replay must not step over (mariadb-binlog's `--start-position` would only skip to the next
/// transaction it finds).
pub fn reaches_back(term: &ArchivedTerm, position: &str) -> Result<bool, String> {
    let Some((_, first)) = term.files.first() else {
        return Ok(false);
    };
    let position: devctl_api::gtid::Position = position.parse()?;
    Ok(position.contains(&first.gtid_list.parse()?))
}

/// Replays the archived binary logs after a restore (the engine runs, read-only to
/// everyone but the agent): `Ok(message)` once done, `Wait` while the archive has no
/// transaction past the target time yet (up to [`TARGET_WAIT`], then what there is).
pub async fn replay(shared: &Shared) -> Result<String, RestoreError> {
    let data = shared.config.data_dir.clone();
    let Some(mut pending) = pending(&data) else {
        return Ok("nothing to replay".into());
    };
    let (store, request) = shared.restore_source().await.map_err(RestoreError::Wait)?;
    let prefix = binlog_prefix(&request.location.prefix);
    let terms = list_terms(&store, &prefix)
        .await
        .map_err(RestoreError::Failed)?;
    let target = pending
        .target_time
        .as_deref()
        .map(stop_datetime)
        .transpose()
        .map_err(RestoreError::Failed)?;
    if let Some((_, target_seconds)) = &target {
        let newest = terms
            .iter()
            .flat_map(|t| t.files.iter())
            .map(|(_, s)| s.last_transaction)
            .max()
            .unwrap_or(0);
        if newest <= *target_seconds {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default();
            let since = *pending.waiting_since.get_or_insert(now);
            let _ = crate::engine::write_private(
                &data.join(PITR_PENDING),
                &serde_json::to_vec(&pending).unwrap_or_default(),
            );
            if now.saturating_sub(since) < TARGET_WAIT.as_secs() {
                return Err(RestoreError::Wait(format!(
                    "restoring to {}: waiting for the archive to hold a transaction past it (the newest archived is from {})",
                    pending.target_time.as_deref().unwrap_or_default(),
                    k8s_openapi::jiff::Timestamp::from_second(newest)
                        .map(|t| t.to_string())
                        .unwrap_or_else(|_| "never".into())
                )));
            }
            tracing::warn!(
                "the archive holds no transaction past the target time after {}s: replaying what it has",
                TARGET_WAIT.as_secs()
            );
        }
    }
    let engine = &shared.engine;
    if !pending.gtid_state_set {
        // The copy has no binary log: its GTID state starts where the copy ends, so the
        // replayed transactions follow it in order (strict mode) and a replay that stopped
        // resumes from this server's own binary log.
        let mut sql = String::from("RESET MASTER;\n");
        if !pending.position.is_empty() {
            sql.push_str(&format!(
                "SET GLOBAL gtid_binlog_state = {};\n",
                super::literal(&pending.position)
            ));
        }
        engine
            .admin_sql(&sql)
            .await
            .map_err(|e| RestoreError::Failed(format!("setting the copy's GTID state: {e}")))?;
        pending.gtid_state_set = true;
        crate::engine::write_private(
            &data.join(PITR_PENDING),
            &serde_json::to_vec(&pending).unwrap_or_default(),
        )
        .map_err(RestoreError::Failed)?;
    }
    let mut position = super::ops::binlog_position(engine)
        .await
        .map_err(RestoreError::Failed)?;
    if position.is_empty() {
        position = pending.position.clone();
    }
    let plan = replay_plan(&terms, &position).map_err(RestoreError::Failed)?;
    let scratch = restore_dir(&data).with_extension("binlogs");
    let _ = std::fs::remove_dir_all(&scratch);
    create_private_dir(&scratch).map_err(RestoreError::Failed)?;
    let mut replayed_terms = 0;
    for (index, stop) in plan {
        let term = &terms[index];
        if !position.is_empty() && !reaches_back(term, &position).map_err(RestoreError::Failed)? {
            return Err(RestoreError::Failed(format!(
                "the binary log archive has a gap: term {} begins after {position}, where the replay stands (its first archived file starts after {}); the transactions between are in no archived file",
                term.term.id,
                term.files
                    .first()
                    .map(|(_, s)| s.gtid_list.as_str())
                    .unwrap_or_default()
            )));
        }
        let mut files = Vec::new();
        for (key, _) in &term.files {
            let name = key.rsplit('/').next().unwrap_or("binlog");
            let path = scratch.join(name);
            let bytes = store
                .get(key)
                .await
                .map_err(|e| RestoreError::Failed(e.to_string()))?;
            std::fs::write(&path, &bytes)
                .map_err(|e| RestoreError::Failed(format!("{}: {e}", path.display())))?;
            files.push(path);
        }
        replay_files(
            shared,
            &files,
            &position,
            stop.as_deref(),
            target.as_ref().map(|t| t.0.as_str()),
        )
        .await
        .map_err(|e| RestoreError::Failed(format!("term {}: {e}", term.term.id)))?;
        for file in &files {
            let _ = std::fs::remove_file(file);
        }
        let now = super::ops::binlog_position(&shared.engine)
            .await
            .map_err(RestoreError::Failed)?;
        if !now.is_empty() {
            position = now;
        }
        replayed_terms += 1;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    // Replication from this server (its clones) starts from what it holds.
    engine
        .admin_sql("SET GLOBAL gtid_slave_pos = @@gtid_binlog_pos;\n")
        .await
        .map_err(RestoreError::Failed)?;
    let _ = std::fs::remove_file(data.join(PITR_PENDING));
    Ok(format!(
        "replayed the archived binary logs of {replayed_terms} term(s) after backup {} (GTID {}) to {}: at {position}",
        pending.backup_id,
        pending.position,
        pending
            .target_time
            .as_deref()
            .unwrap_or("the end of the archive")
    ))
}

/// `mariadb-binlog --start-position=<from> [--stop-position] [--stop-datetime] files | mariadb`.
async fn replay_files(
    shared: &Shared,
    files: &[std::path::PathBuf],
    from: &str,
    stop: Option<&str>,
    stop_datetime: Option<&str>,
) -> Result<(), String> {
    let engine = &shared.engine;
    // An empty position (nothing ever written): from the first transaction.
    let mut args: Vec<String> = (!from.is_empty())
        .then(|| format!("--start-position={from}"))
        .into_iter()
        .collect();
    if let Some(stop) = stop {
        args.push(format!("--stop-position={stop}"));
    }
    if let Some(at) = stop_datetime {
        args.push(format!("--stop-datetime={at}"));
    }
    args.extend(files.iter().map(|f| f.display().to_string()));
    let mut decode = tokio::process::Command::new(engine.mysql_tool("mariadb-binlog")?);
    decode.args(&args).env("TZ", "UTC");
    let tail = Arc::new(Mutex::new(Tail::default()));
    let (mut decoder, decode_log) = {
        let tail = tail.clone();
        spawn_streaming(decode, "mariadb-binlog", false, move |line| {
            lock(&tail).push(line)
        })?
    };
    let Some(mut events) = decoder.stdout.take() else {
        finish(&mut decoder, true).await;
        return Err("mariadb-binlog has no stdout".into());
    };
    let output = engine
        .admin_sql_from(&mut events)
        .await
        .map_err(|e| format!("applying the binary logs: {e}"));
    let status = finish(&mut decoder, output.is_err()).await;
    let _ = decode_log.await;
    output?;
    if !status.is_some_and(|s| s.success()) {
        let why = lock(&tail).text();
        // A start position past every event of the files: nothing to replay from them.
        if !why.contains("never reached expected GTID state") {
            return Err(format!("mariadb-binlog failed: {why}"));
        }
    }
    Ok(())
}
