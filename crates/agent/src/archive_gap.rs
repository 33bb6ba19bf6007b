//! After a promotion: the WAL of the old timeline that the dead primary had not archived yet.
//!
//! A standby's streamed segments are never archived by it (PostgreSQL marks them done), so
//! whatever the old primary wrote but had not archived when it died would be a hole in the
//! archive — a restore "to the end" would stop short of commits the new primary has. Once
//! promoted, the new primary uploads the complete segments of its ancestors' timelines that
//! are in its `pg_wal` and before each switch point (so never a recycled file past the fork),
//! each only when the archive does not have it ([`crate::store::Store::put_once`]); off the
//! failover's critical path, bounded in time.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;

use crate::backup::Shared;
use crate::engine::Engine;
use crate::store::PutOnce;
use crate::wal::{parse_lsn, parse_segment_name, system_prefix, wal_key};

/// How long filling may take in all (it retries nothing itself: a segment it cannot upload is
/// named in the `ArchiveGap` event).
pub const FILL_TIMEOUT: Duration = Duration::from_secs(300);

/// How long the new timeline's first segment may take to reach the archive.
pub const ARCHIVED_WITHIN: Duration = Duration::from_secs(120);

/// Whether `last_archived` (`pg_stat_archiver.last_archived_wal`) is `segment` or a later
/// segment of its timeline (pure).
pub fn archived_through(last_archived: &str, segment: &str) -> bool {
    let last = last_archived.get(..24).unwrap_or_default();
    segment.len() == 24
        && last.len() == 24
        && last[..8] == segment[..8]
        && last.bytes().all(|b| b.is_ascii_hexdigit())
        && last >= segment
}

/// On the new primary: switches WAL so the segment holding the old timeline's tail (copied
/// into the new timeline at the promotion) is archived now, not at `archive_timeout`, and
/// waits until it is. Returns that segment's name.
pub async fn archive_promotion_segment(engine: &Engine) -> Result<String, String> {
    let out = engine
        .admin_sql("SELECT pg_walfile_name(pg_switch_wal());\n")
        .await?;
    let segment = out.trim().to_string();
    if parse_segment_name(&segment, crate::wal::DEFAULT_SEGMENT_SIZE).is_none() {
        return Err(format!("unexpected pg_switch_wal answer {out:?}"));
    }
    let deadline = tokio::time::Instant::now() + ARCHIVED_WITHIN;
    loop {
        let last = engine
            .admin_sql("SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver;\n")
            .await?;
        if archived_through(last.trim(), &segment) {
            return Ok(segment);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "{segment} was not archived within {}s (last archived: {})",
                ARCHIVED_WITHIN.as_secs(),
                last.trim()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `<timeline>.history` → each ancestor timeline and the position the next one forked at.
pub fn parse_history(text: &str) -> Vec<(u32, u64)> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let timeline = fields.next()?.parse().ok()?;
            let switch = parse_lsn(fields.next()?)?;
            Some((timeline, switch))
        })
        .collect()
}

/// The segment files among `files` (names in `pg_wal`) that hold only WAL of an ancestor
/// timeline before its switch point: complete, and the same on every instance that has them
/// (pure). Sorted.
pub fn segments_to_fill(
    files: &[String],
    history: &[(u32, u64)],
    segment_size: u64,
) -> Vec<String> {
    let mut out: Vec<String> = files
        .iter()
        .filter(|name| {
            parse_segment_name(name, segment_size).is_some_and(|(timeline, segment)| {
                history.iter().any(|(ancestor, switch)| {
                    *ancestor == timeline && segment < switch / segment_size
                })
            })
        })
        .cloned()
        .collect();
    out.sort();
    out
}

/// Whether `data` is the segment `name`: its first page header (`XLogLongPageHeaderData`,
/// little-endian) names the segment's timeline and start address, and it is whole (pure).
pub fn holds_segment(data: &[u8], name: &str, segment_size: u64) -> bool {
    let Some((timeline, segment)) = parse_segment_name(name, segment_size) else {
        return false;
    };
    if data.len() as u64 != segment_size || data.len() < 16 {
        return false;
    }
    let tli = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
    let mut address = [0u8; 8];
    address.copy_from_slice(&data[8..16]);
    tli == timeline && u64::from_le_bytes(address) == segment * segment_size
}

/// What filling came to.
#[derive(Debug, Default)]
pub struct Filled {
    /// Uploaded now (the archive did not have them).
    pub uploaded: Vec<String>,
    /// Could not be uploaded, with why.
    pub failed: Vec<(String, String)>,
}

/// The newest timeline's history file among `files` (the promotion's).
pub fn newest_history(files: &[String]) -> Option<&String> {
    files
        .iter()
        .filter(|name| {
            name.strip_suffix(".history")
                .is_some_and(|t| t.len() == 8 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .max()
}

/// Uploads the segments [`segments_to_fill`] finds in `data_dir/pg_wal` for the newest
/// timeline there (the promotion's). `Ok(None)`: nothing to do (no destination).
pub async fn fill(
    shared: &Shared,
    data_dir: &Path,
    segment_size: u64,
) -> Result<Option<Filled>, String> {
    let Some(store) = shared.store().await? else {
        return Ok(None);
    };
    let pg_wal = data_dir.join("pg_wal");
    let mut files = Vec::new();
    let mut entries = tokio::fs::read_dir(&pg_wal)
        .await
        .map_err(|e| format!("listing {}: {e}", pg_wal.display()))?;
    while let Ok(Some(entry)) = entries.next_entry().await {
        if let Some(name) = entry.file_name().to_str() {
            files.push(name.to_string());
        }
    }
    let Some(history_name) = newest_history(&files) else {
        return Ok(Some(Filled::default()));
    };
    let history_path = pg_wal.join(history_name);
    let history = tokio::fs::read_to_string(&history_path)
        .await
        .map_err(|e| format!("reading {}: {e}", history_path.display()))?;
    let sysid = shared.system_identifier().await?;
    let prefix = system_prefix(&store.location.prefix, &sysid);
    let mut filled = Filled::default();
    for name in segments_to_fill(&files, &parse_history(&history), segment_size) {
        let path = pg_wal.join(&name);
        let key = wal_key(&prefix, &name);
        // The file no longer holds the segment: a gap only if the archive lacks it.
        let lost = |what: &str| {
            let (store, key, what) = (&store, &key, what.to_string());
            async move {
                match store.head(key).await {
                    Ok(Some(_)) => Ok(PutOnce::AlreadyStored),
                    Ok(None) => Err(format!("{what} pg_wal before it could be archived")),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        let result = match tokio::fs::read(&path).await {
            // Removed since the listing (the promotion's checkpoint).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => lost("removed from").await,
            Err(e) => Err(format!("reading {}: {e}", path.display())),
            // Recycled meanwhile: other WAL under this name, never archived.
            Ok(data) if !holds_segment(&data, &name, segment_size) => lost("recycled in").await,
            Ok(data) => store
                .put_once(&key, Bytes::from(data))
                .await
                .map_err(|e| e.to_string()),
        };
        match result {
            Ok(PutOnce::Stored) => {
                tracing::info!(segment = %name, "archived a segment the old primary had not");
                filled.uploaded.push(name);
            }
            Ok(PutOnce::AlreadyStored) => {}
            Err(why) => {
                tracing::warn!(segment = %name, "filling the archive: {why}");
                filled.failed.push((name, why));
            }
        }
    }
    Ok(Some(filled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::DEFAULT_SEGMENT_SIZE;

    #[test]
    fn only_a_file_whose_header_names_the_segment_is_archived() {
        let size = 64 * 1024;
        let segment = |tli: u32, address: u64| {
            let mut data = vec![0u8; size as usize];
            data[0..2].copy_from_slice(&0xD110u16.to_le_bytes());
            data[4..8].copy_from_slice(&tli.to_le_bytes());
            data[8..16].copy_from_slice(&address.to_le_bytes());
            data
        };
        let name = crate::wal::segment_name(1, 5 * size, size);
        assert!(holds_segment(&segment(1, 5 * size), &name, size));
        // Recycled: an older segment's header, or another timeline's.
        assert!(!holds_segment(&segment(1, 2 * size), &name, size));
        assert!(!holds_segment(&segment(2, 5 * size), &name, size));
        // Cut short.
        assert!(!holds_segment(&segment(1, 5 * size)[..100], &name, size));
    }

    #[test]
    fn fills_only_complete_segments_of_ancestors_before_their_switch_point() {
        let history = parse_history(
            "1\t0/5000060\tno recovery target specified\n\n# comment\n2\t0/7000000\tbefore 2026-12-06\n",
        );
        assert_eq!(history, [(1, 0x0500_0060), (2, 0x0700_0000)]);
        let files: Vec<String> = [
            "000000010000000000000003",
            "000000010000000000000004",
            // Holds the switch point: PostgreSQL renamed it .partial; a file of that name
            // would be the old timeline's tail past the fork.
            "000000010000000000000005",
            "000000010000000000000005.partial",
            // Recycled, past the fork: garbage.
            "000000010000000000000006",
            "000000020000000000000006",
            // Timeline 2 switched at a segment boundary: 6 is complete, 7 is not its.
            "000000020000000000000007",
            // The new timeline: PostgreSQL archives it itself.
            "000000030000000000000007",
            "00000003.history",
            "archive_status",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            segments_to_fill(&files, &history, DEFAULT_SEGMENT_SIZE),
            [
                "000000010000000000000003",
                "000000010000000000000004",
                "000000020000000000000006"
            ]
        );
        assert!(segments_to_fill(&files, &[], DEFAULT_SEGMENT_SIZE).is_empty());
        let seg = "000000020000000000000007";
        assert!(archived_through("000000020000000000000007", seg));
        assert!(archived_through("000000020000000000000008", seg));
        assert!(!archived_through("000000020000000000000006", seg));
        assert!(!archived_through("000000010000000000000009.partial", seg));
        assert!(!archived_through("00000002.history", seg));
        assert!(!archived_through("", seg));
        let histories: Vec<String> = ["00000002.history", "0000000A.history", "x.history"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            newest_history(&histories).map(String::as_str),
            Some("0000000A.history")
        );
    }
}
