//! Continuous archiving of the primary's binary logs (docs/mariadb.md, "Backups").
//!
//! The primary's agent uploads every closed binary log file to
//! `<prefix><systemIdentifier>/binlog/<term>/<file>` with a summary beside it
//! (`<file>.json`, [`super::binlog::Summary`]: written after the file, so a summary names a
//! complete upload), and rotates the log when it holds transactions older than the archive
//! timeout (60 s), which bounds what a lost primary takes with it.
//!
//! A **term** is one instance's tenure as the primary, from its bootstrap or promotion
//! (`term.json`: its id, sortable by time, and the GTID position it was promoted at). Its
//! files hold everything that instance logged, what it replicated before included; a restore
//! replays each term's files from where the previous stopped, and an old term only up to
//! the next term's start — the transactions its primary wrote after the fork (errant ones)
//! are never replayed.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::binlog::{Summary, indexed_files, summarize};
use crate::backup::Shared;
use crate::engine::write_private;
use crate::wal::system_prefix;

/// This instance's current term (JSON [`Term`]) in its data directory.
pub const TERM_MARKER: &str = ".devctl-term";
/// The binary log index in the data directory.
const INDEX: &str = "mysql-bin.index";

/// One tenure as the primary.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Term {
    /// `<unix milliseconds, 20 digits>-<server id>`: sorts by when it began.
    pub id: String,
    /// The GTID position it was promoted at (empty: it bootstrapped).
    pub start: String,
}

/// Begins a term now (a promotion at `start`, or a bootstrap with `start` empty).
pub fn begin_term(data: &Path, server_id: u32, start: &str) -> Result<Term, String> {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let term = Term {
        id: format!("{millis:020}-{server_id}"),
        start: start.to_string(),
    };
    let json = serde_json::to_vec(&term).map_err(|e| e.to_string())?;
    write_private(&data.join(TERM_MARKER), &json)?;
    Ok(term)
}

/// The term this instance is in, if it has begun one.
pub fn current_term(data: &Path) -> Option<Term> {
    let text = std::fs::read(data.join(TERM_MARKER)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// `<systemPrefix>binlog/`.
pub fn binlog_prefix(system_prefix: &str) -> String {
    format!("{system_prefix}binlog/")
}

/// What the archiver remembers between rounds.
#[derive(Default)]
pub struct Archiver {
    /// Object keys known to be in the store.
    archived: std::collections::BTreeSet<String>,
    term_stored: Option<String>,
    /// When the log was last rotated, and the position then.
    rotated: Option<(Instant, String)>,
}

/// One round on the primary: rotate the log when it holds transactions older than
/// `timeout`, then upload the closed files the store lacks. Records the outcome in the
/// report's `walArchive`.
pub async fn archive_round(shared: &Shared, state: &mut Archiver, timeout: Duration) {
    match round(shared, state, timeout).await {
        Ok(None) => {}
        Ok(Some(name)) => shared.record_archive(Ok(&name)),
        Err(why) => {
            tracing::warn!("archiving binary logs: {why}");
            shared.record_archive(Err(&why));
        }
    }
}

async fn round(
    shared: &Shared,
    state: &mut Archiver,
    timeout: Duration,
) -> Result<Option<String>, String> {
    let Some(store) = shared.store().await? else {
        shared.clear_archive();
        return Ok(None);
    };
    let engine = &shared.engine;
    let data = engine.data_dir();
    let sysid = shared.system_identifier().await?;
    let prefix = binlog_prefix(&system_prefix(&store.location.prefix, &sysid));
    shared.ensure_owner(&store).await?;
    let term = match current_term(data) {
        Some(term) => term,
        None => begin_term(data, super::server_id(&shared.config.pod_name), "")?,
    };
    let term_prefix = format!("{prefix}{}/", term.id);
    if state.term_stored.as_deref() != Some(term.id.as_str()) {
        let json = serde_json::to_vec(&term).map_err(|e| e.to_string())?;
        store
            .put(&format!("{term_prefix}term.json"), Bytes::from(json))
            .await
            .map_err(|e| e.to_string())?;
        state.term_stored = Some(term.id.clone());
    }
    // Rotate once the open file holds transactions `timeout` old.
    let position = super::ops::binlog_position(engine).await?;
    match &state.rotated {
        None => state.rotated = Some((Instant::now(), position.clone())),
        Some((at, before)) if *before != position && at.elapsed() >= timeout => {
            engine.admin_sql("FLUSH BINARY LOGS;\n").await?;
            state.rotated = Some((Instant::now(), position));
        }
        Some((_, before)) if *before == position => {
            // Nothing new: the clock starts with the next transaction.
            state.rotated = Some((Instant::now(), position));
        }
        Some(_) => {}
    }
    // The file being written, from the server (the index may be mid-rewrite by a purge):
    // only files before it are closed.
    let open = engine
        .admin_sql("SHOW MASTER STATUS;\n")
        .await?
        .split('\t')
        .next()
        .map(|f| f.trim().to_string())
        .filter(|f| super::binlog::is_binlog_name(f))
        .ok_or("SHOW MASTER STATUS names no binary log file")?;
    let index =
        std::fs::read_to_string(data.join(INDEX)).map_err(|e| format!("reading {INDEX}: {e}"))?;
    let files = indexed_files(&index);
    let mut last = None;
    // Numbered names (`mysql-bin.` and digits): shorter is older, then by text.
    let before_open = |f: &&String| (f.len(), f.as_str()) < (open.len(), open.as_str());
    for name in files.iter().filter(before_open) {
        let key = format!("{term_prefix}{name}");
        let summary_key = format!("{key}.json");
        if state.archived.contains(&summary_key) {
            continue;
        }
        if store
            .head(&summary_key)
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            state.archived.insert(summary_key);
            continue;
        }
        let path = data.join(name);
        let summary = summarize(std::fs::File::open(&path).map_err(|e| format!("{name}: {e}"))?)
            .map_err(|e| format!("{name}: {e}"))?;
        if !summary.closed {
            tracing::warn!(
                file = %name,
                complete = summary.length,
                "the binary log does not end with the server's closing event (a crash cut it short): archiving its complete events"
            );
        }
        // Its complete events only (a crash may have left a partial one at the end).
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        let mut file = tokio::io::AsyncReadExt::take(file, summary.length);
        store
            .put_stream(&key, &mut file, |_| {})
            .await
            .map_err(|e| e.to_string())?;
        let json = serde_json::to_vec(&summary).map_err(|e| e.to_string())?;
        store
            .put(&summary_key, Bytes::from(json))
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(file = %name, term = %term.id, last_gtid = %summary.last_gtid, "archived a binary log");
        state.archived.insert(summary_key);
        last = Some(format!("{}/{name}", term.id));
    }
    Ok(last)
}

/// An archived term as a restore reads it.
#[derive(Debug, Clone)]
pub struct ArchivedTerm {
    pub term: Term,
    /// `(object key, summary)` of each complete file, in order.
    pub files: Vec<(String, Summary)>,
}

/// Every term under `prefix` (`…/binlog/`), oldest first.
pub async fn list_terms(
    store: &crate::store::Store,
    prefix: &str,
) -> Result<Vec<ArchivedTerm>, String> {
    let keys = store.list(prefix).await.map_err(|e| e.to_string())?;
    let mut terms: std::collections::BTreeMap<String, ArchivedTerm> = Default::default();
    for key in keys.iter().filter(|k| k.ends_with("/term.json")) {
        let bytes = store.get(key).await.map_err(|e| e.to_string())?;
        let term: Term =
            serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", store.url(key)))?;
        terms.insert(
            term.id.clone(),
            ArchivedTerm {
                term,
                files: Vec::new(),
            },
        );
    }
    let mut summaries: Vec<&String> = keys
        .iter()
        .filter(|k| k.ends_with(".json") && !k.ends_with("/term.json"))
        .collect();
    summaries.sort();
    for key in summaries {
        let Some(rest) = key.strip_prefix(prefix) else {
            continue;
        };
        let Some((term, file)) = rest.split_once('/') else {
            continue;
        };
        let Some(name) = file.strip_suffix(".json") else {
            continue;
        };
        if !super::binlog::is_binlog_name(name) {
            continue;
        }
        let Some(archived) = terms.get_mut(term) else {
            continue;
        };
        let bytes = store.get(key).await.map_err(|e| e.to_string())?;
        let summary: Summary =
            serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", store.url(key)))?;
        archived
            .files
            .push((format!("{prefix}{term}/{name}"), summary));
    }
    Ok(terms.into_values().collect())
}

/// Shared between the agent's rounds.
pub type SharedArchiver = Arc<tokio::sync::Mutex<Archiver>>;
