//! Pure pieces of backups and WAL archiving: LSNs and WAL segment names, `backup_label`,
//! pg_basebackup's progress lines, the tar stream (watched on its way to the store and
//! unpacked on restore), object keys and the manifest (`backup.json`).

use devctl_api::instance::BackupReport;
use serde::{Deserialize, Serialize};

/// PostgreSQL's default (and `initdb`'s) WAL segment size.
pub const DEFAULT_SEGMENT_SIZE: u64 = 16 * 1024 * 1024;

/// `16/B374D848` → its 64-bit position.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.trim().split_once('/')?;
    let hex = |s: &str| {
        ((1..=8).contains(&s.len()) && s.chars().all(|c| c.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
    };
    Some((u64::from(hex(hi)?) << 32) | u64::from(hex(lo)?))
}

/// A position as PostgreSQL prints it (`%X/%X`).
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// The name of the WAL segment on `timeline` that holds the byte at `lsn`
/// (`XLogFileName` of `XLByteToSeg`).
pub fn segment_name(timeline: u32, lsn: u64, segment_size: u64) -> String {
    name_of_segment(timeline, lsn / segment_size, segment_size)
}

/// The segment that holds the last byte before `lsn` (`XLByteToPrevSeg`): where a backup
/// that ends at `lsn` needs WAL up to.
pub fn previous_segment_name(timeline: u32, lsn: u64, segment_size: u64) -> String {
    segment_name(timeline, lsn.saturating_sub(1), segment_size)
}

fn name_of_segment(timeline: u32, segment: u64, segment_size: u64) -> String {
    let per_id = 0x1_0000_0000u64 / segment_size;
    format!(
        "{timeline:08X}{:08X}{:08X}",
        segment / per_id,
        segment % per_id
    )
}

/// `(timeline, segment number)` of a segment name.
pub fn parse_segment_name(name: &str, segment_size: u64) -> Option<(u32, u64)> {
    if name.len() != 24 || !name.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let part = |range: std::ops::Range<usize>| u32::from_str_radix(&name[range], 16).ok();
    let per_id = 0x1_0000_0000u64 / segment_size;
    let (timeline, log, seg) = (part(0..8)?, part(8..16)?, part(16..24)?);
    if u64::from(seg) >= per_id {
        return None;
    }
    Some((timeline, u64::from(log) * per_id + u64::from(seg)))
}

/// Every segment name from `first` to `last` (same timeline), in order.
pub fn segment_range(first: &str, last: &str, segment_size: u64) -> Option<Vec<String>> {
    let (timeline, from) = parse_segment_name(first, segment_size)?;
    let (last_timeline, to) = parse_segment_name(last, segment_size)?;
    if timeline != last_timeline || to < from {
        return None;
    }
    Some(
        (from..=to)
            .map(|segment| name_of_segment(timeline, segment, segment_size))
            .collect(),
    )
}

/// A file name PostgreSQL archives or restores: a segment, a `.partial` segment, a
/// timeline history file or a backup history file (no path separators, nothing a shell or
/// a key would trip on).
pub fn is_wal_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().next().is_some_and(|c| c.is_ascii_hexdigit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-')
        && !name.contains("..")
}

/// What `backup_label` says about a base backup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupLabel {
    /// `START WAL LOCATION` and its segment.
    pub start_lsn: String,
    pub start_segment: Option<String>,
    pub checkpoint_lsn: Option<String>,
    pub timeline: Option<u32>,
    /// `BACKUP FROM`: `primary` or `standby`.
    pub from: Option<String>,
    pub start_time: Option<String>,
}

/// Parses `backup_label`:
/// `START WAL LOCATION: 0/2000028 (file 000000010000000000000002)`, `START TIMELINE: 1`, ...
pub fn parse_backup_label(text: &str) -> Option<BackupLabel> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    let start = field("START WAL LOCATION")?;
    let mut parts = start.split_whitespace();
    let start_lsn = parts.next()?.to_string();
    parse_lsn(&start_lsn)?;
    let start_segment = start
        .split_once("(file ")
        .and_then(|(_, rest)| rest.split(')').next())
        .map(|s| s.trim().to_string())
        .filter(|s| parse_segment_name(s, DEFAULT_SEGMENT_SIZE).is_some());
    Some(BackupLabel {
        start_lsn,
        start_segment,
        checkpoint_lsn: field("CHECKPOINT LOCATION").filter(|l| parse_lsn(l).is_some()),
        timeline: field("START TIMELINE").and_then(|t| t.parse().ok()),
        from: field("BACKUP FROM"),
        start_time: field("START TIME"),
    })
}

/// What `pg_basebackup -v` reports on stderr.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BaseBackupProgress {
    /// `write-ahead log start point: 0/2000028 on timeline 1`.
    pub start_lsn: Option<String>,
    pub timeline: Option<u32>,
    /// `write-ahead log end point: 0/2000100`.
    pub end_lsn: Option<String>,
    /// The server waits for the archiver (a primary's backup with `-X none`).
    pub waiting_for_archive: bool,
}

impl BaseBackupProgress {
    /// Takes in one line of pg_basebackup's stderr.
    pub fn take_line(&mut self, line: &str) {
        if let Some((_, rest)) = line.split_once("write-ahead log start point:") {
            let mut words = rest.split_whitespace();
            self.start_lsn = words
                .next()
                .filter(|l| parse_lsn(l).is_some())
                .map(str::to_string);
            if let Some((_, tli)) = rest.split_once("on timeline") {
                self.timeline = tli.trim().trim_end_matches('.').parse().ok();
            }
        } else if let Some((_, rest)) = line.split_once("write-ahead log end point:") {
            self.end_lsn = rest
                .split_whitespace()
                .next()
                .filter(|l| parse_lsn(l).is_some())
                .map(str::to_string);
        } else if line.contains("waiting for required WAL segments to be archived")
            || line.contains("still waiting for all required WAL segments to be archived")
        {
            self.waiting_for_archive = true;
        }
    }
}

/// One tar header's essentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TarEntry {
    pub name: String,
    pub size: u64,
    /// `b'0'`/`0` regular file, `b'5'` directory, `b'2'` symbolic link, ...
    pub kind: u8,
    pub mode: u32,
    pub link: String,
}

/// What [`TarStream::next`] found in the input.
#[derive(Debug, PartialEq, Eq)]
pub enum TarEvent<'a> {
    /// A new entry; its data follows as [`TarEvent::Data`] pieces.
    Entry(TarEntry),
    Data(&'a [u8]),
    /// The end-of-archive marker.
    End,
}

enum TarState {
    Header,
    Data {
        remaining: u64,
        padding: u64,
    },
    Padding {
        remaining: u64,
    },
    /// A GNU long name (`L`) being read.
    LongName {
        remaining: u64,
        padding: u64,
    },
    End,
}

/// A push parser of the ustar/GNU tar pg_basebackup writes: feed it chunks as they come
/// (from pg_basebackup's stdout, or ranges of `data.tar`), never more than one header
/// buffered.
pub struct TarStream {
    state: TarState,
    header: Vec<u8>,
    long_name: Option<Vec<u8>>,
    pending_long: Vec<u8>,
}

impl Default for TarStream {
    fn default() -> Self {
        TarStream {
            state: TarState::Header,
            header: Vec::with_capacity(512),
            long_name: None,
            pending_long: Vec::new(),
        }
    }
}

fn octal(field: &[u8]) -> Result<u64, String> {
    // GNU base-256 for big numbers.
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut value: u64 = u64::from(field[0] & 0x7F);
        for b in &field[1..] {
            value = value
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(*b)))
                .ok_or("tar number too large")?;
        }
        return Ok(value);
    }
    let text: String = field
        .iter()
        .take_while(|b| **b != 0)
        .map(|b| *b as char)
        .collect();
    let text = text.trim();
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8).map_err(|_| format!("malformed tar number {text:?}"))
}

fn c_string(field: &[u8]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn padding_of(size: u64) -> u64 {
    (512 - size % 512) % 512
}

impl TarStream {
    /// The next event from `input` (advanced past what was consumed); `Ok(None)` when
    /// `input` is used up without completing an event.
    pub fn next<'a>(&mut self, input: &mut &'a [u8]) -> Result<Option<TarEvent<'a>>, String> {
        loop {
            if input.is_empty() && !matches!(self.state, TarState::End) {
                return Ok(None);
            }
            match &mut self.state {
                TarState::End => {
                    // Trailing zero blocks (and anything after): ignored.
                    *input = &[];
                    return Ok(None);
                }
                TarState::Padding { remaining } => {
                    let n = (*remaining).min(input.len() as u64) as usize;
                    *input = &input[n..];
                    *remaining -= n as u64;
                    if *remaining == 0 {
                        self.state = TarState::Header;
                    }
                }
                TarState::Data { remaining, padding } => {
                    if *remaining == 0 {
                        let padding = *padding;
                        self.state = if padding == 0 {
                            TarState::Header
                        } else {
                            TarState::Padding { remaining: padding }
                        };
                        continue;
                    }
                    let n = (*remaining).min(input.len() as u64) as usize;
                    let (data, rest) = input.split_at(n);
                    *input = rest;
                    *remaining -= n as u64;
                    return Ok(Some(TarEvent::Data(data)));
                }
                TarState::LongName { remaining, padding } => {
                    let n = (*remaining).min(input.len() as u64) as usize;
                    self.pending_long.extend_from_slice(&input[..n]);
                    *input = &input[n..];
                    *remaining -= n as u64;
                    if *remaining == 0 {
                        self.long_name = Some(std::mem::take(&mut self.pending_long));
                        let padding = *padding;
                        self.state = if padding == 0 {
                            TarState::Header
                        } else {
                            TarState::Padding { remaining: padding }
                        };
                    }
                }
                TarState::Header => {
                    let want = 512 - self.header.len();
                    let n = want.min(input.len());
                    self.header.extend_from_slice(&input[..n]);
                    *input = &input[n..];
                    if self.header.len() < 512 {
                        return Ok(None);
                    }
                    let header = std::mem::take(&mut self.header);
                    if header.iter().all(|b| *b == 0) {
                        self.state = TarState::End;
                        return Ok(Some(TarEvent::End));
                    }
                    let computed: u64 = header
                        .iter()
                        .enumerate()
                        .map(|(i, b)| {
                            if (148..156).contains(&i) {
                                u64::from(b' ')
                            } else {
                                u64::from(*b)
                            }
                        })
                        .sum();
                    if octal(&header[148..156])? != computed {
                        return Err("tar header checksum mismatch (not a tar stream?)".into());
                    }
                    let size = octal(&header[124..136])?;
                    let kind = header[156];
                    if kind == b'L' {
                        if size > 64 * 1024 {
                            return Err("tar long name too long".into());
                        }
                        self.pending_long.clear();
                        self.state = TarState::LongName {
                            remaining: size,
                            padding: padding_of(size),
                        };
                        if size == 0 {
                            self.long_name = Some(Vec::new());
                            self.state = TarState::Header;
                        }
                        continue;
                    }
                    let mut name = c_string(&header[0..100]);
                    let ustar = &header[257..262] == b"ustar";
                    if ustar {
                        let prefix = c_string(&header[345..500]);
                        if !prefix.is_empty() {
                            name = format!("{prefix}/{name}");
                        }
                    }
                    if let Some(long) = self.long_name.take() {
                        name = c_string(&long);
                    }
                    let entry = TarEntry {
                        name,
                        size,
                        kind: if kind == 0 { b'0' } else { kind },
                        mode: u32::try_from(octal(&header[100..108])?).unwrap_or(0o600),
                        link: c_string(&header[157..257]),
                    };
                    // Links, devices, FIFOs and directories carry no data whatever their
                    // size field says; everything else (files, pax headers) does.
                    let data = if matches!(entry.kind, b'1'..=b'6') {
                        0
                    } else {
                        size
                    };
                    self.state = TarState::Data {
                        remaining: data,
                        padding: padding_of(data),
                    };
                    return Ok(Some(TarEvent::Entry(entry)));
                }
            }
        }
    }
}

/// A relative path inside the data directory for a tar entry name, or `None` when it would
/// escape it (absolute, `..`).
pub fn safe_relative_path(name: &str) -> Option<std::path::PathBuf> {
    let name = name.trim_start_matches("./");
    let mut path = std::path::PathBuf::new();
    for part in name.split('/') {
        match part {
            "" | "." => continue,
            ".." => return None,
            part => path.push(part),
        }
    }
    if name.starts_with('/') || path.as_os_str().is_empty() {
        return None;
    }
    Some(path)
}

/// The entries [`TarWatcher`] keeps an eye on.
pub const BACKUP_LABEL: &str = "backup_label";
pub const BACKUP_MANIFEST: &str = "backup_manifest";
/// How much of `backup_label` is kept (it is a few hundred bytes).
const LABEL_LIMIT: u64 = 64 * 1024;
/// How much of the end of `backup_manifest` is kept: its `WAL-Ranges` come last, after one
/// line per file.
const MANIFEST_TAIL: usize = 16 * 1024;

/// Watches pg_basebackup's tar stream as it goes by: keeps `backup_label` (where the
/// backup starts) and the tail of the `backup_manifest` pg_basebackup injects at the end
/// (where it ends), never the data.
#[derive(Default)]
pub struct TarWatcher {
    stream: TarStream,
    current: Option<&'static str>,
    buffer: Vec<u8>,
    pub label: Option<Vec<u8>>,
    pub manifest_tail: Option<Vec<u8>>,
    pub error: Option<String>,
    pub ended: bool,
}

impl TarWatcher {
    pub fn feed(&mut self, mut chunk: &[u8]) {
        if self.error.is_some() {
            return;
        }
        loop {
            match self.stream.next(&mut chunk) {
                Ok(None) => return,
                Ok(Some(TarEvent::Entry(entry))) => {
                    self.finish_capture();
                    let name = entry.name.trim_start_matches("./");
                    self.current = if !matches!(entry.kind, b'0' | b'7') {
                        None
                    } else if name == BACKUP_LABEL && entry.size <= LABEL_LIMIT {
                        Some(BACKUP_LABEL)
                    } else if name == BACKUP_MANIFEST {
                        Some(BACKUP_MANIFEST)
                    } else {
                        None
                    };
                }
                Ok(Some(TarEvent::Data(data))) => {
                    if self.current.is_some() {
                        self.buffer.extend_from_slice(data);
                        if self.current == Some(BACKUP_MANIFEST)
                            && self.buffer.len() > 2 * MANIFEST_TAIL
                        {
                            let cut = self.buffer.len() - MANIFEST_TAIL;
                            self.buffer.drain(..cut);
                        }
                    }
                }
                Ok(Some(TarEvent::End)) => {
                    self.finish_capture();
                    self.ended = true;
                }
                Err(e) => {
                    self.error = Some(e);
                    return;
                }
            }
        }
    }

    fn finish_capture(&mut self) {
        let content = std::mem::take(&mut self.buffer);
        match self.current.take() {
            Some(BACKUP_LABEL) => self.label = Some(content),
            Some(BACKUP_MANIFEST) => self.manifest_tail = Some(content),
            _ => {}
        }
    }
}

/// One `WAL-Ranges` entry of a `backup_manifest`: the WAL a backup needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalRange {
    pub timeline: u32,
    pub start_lsn: String,
    pub end_lsn: String,
}

/// The `WAL-Ranges` of (the tail of) a `backup_manifest`:
/// `"WAL-Ranges": [ { "Timeline": 1, "Start-LSN": "0/2000028", "End-LSN": "0/2000100" } ]`.
pub fn parse_manifest_wal_ranges(text: &str) -> Vec<WalRange> {
    let Some((_, rest)) = text.rsplit_once("\"WAL-Ranges\"") else {
        return Vec::new();
    };
    let rest = rest.split(']').next().unwrap_or_default();
    let lsn_field = |object: &str, key: &str| -> Option<String> {
        let (_, after) = object.split_once(&format!("\"{key}\""))?;
        let after = after.trim_start().strip_prefix(':')?.trim_start();
        let value = after.strip_prefix('"')?.split('"').next()?;
        parse_lsn(value).map(|_| value.to_string())
    };
    rest.split('{')
        .skip(1)
        .filter_map(|object| {
            let (_, after) = object.split_once("\"Timeline\"")?;
            let digits: String = after
                .trim_start()
                .strip_prefix(':')?
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            Some(WalRange {
                timeline: digits.parse().ok()?,
                start_lsn: lsn_field(object, "Start-LSN")?,
                end_lsn: lsn_field(object, "End-LSN")?,
            })
        })
        .collect()
}

/// Object keys under a cluster's prefix (`<path>/<namespace>/<name>/`).
pub fn owner_key(prefix: &str) -> String {
    format!("{prefix}owner.json")
}

/// `<prefix><systemIdentifier>/`.
pub fn system_prefix(prefix: &str, system_identifier: &str) -> String {
    format!("{prefix}{system_identifier}/")
}

pub fn wal_key(system_prefix: &str, name: &str) -> String {
    format!("{system_prefix}wal/{name}")
}

pub fn base_prefix(system_prefix: &str, backup_id: &str) -> String {
    format!("{system_prefix}base/{backup_id}/")
}

/// The data object of a backup of `engine`.
pub fn data_object(engine: &str) -> &'static str {
    match engine {
        "postgres" => "data.tar",
        "mariadb" => "data.xbstream",
        _ => "dump.sql",
    }
}

pub const MANIFEST: &str = "backup.json";

/// `owner.json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: String,
}

/// `backup.json`, written last: the completed report, plus what a restore needs to know
/// without asking the cluster that wrote it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Layout version of this file.
    pub format: u32,
    #[serde(flatten)]
    pub report: BackupReport,
    pub system_identifier: String,
    pub cluster: String,
    pub namespace: String,
    pub cluster_uid: String,
    /// The data object's name in the backup's directory (`data.tar` or `dump.sql`).
    pub file: String,
    /// PostgreSQL: the WAL segment size the names in `beginWAL`/`endWAL` assume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_segment_size: Option<u64>,
}

/// A backup id is `<%Y%m%dT%H%M%SZ>-<name>`: safe as one key segment.
pub fn is_backup_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 300
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        && !id.starts_with('.')
}

/// An RFC 3339 time as `recovery_target_time` takes it: UTC with a numeric offset
/// (`2026-11-30 12:34:56.5+00`), since PostgreSQL reads its configuration before it knows
/// time zone abbreviations such as `Z`.
pub fn postgres_target_time(text: &str) -> Result<String, String> {
    let timestamp: k8s_openapi::jiff::Timestamp = text
        .trim()
        .parse()
        .map_err(|e| format!("{text:?} is not an RFC 3339 time: {e}"))?;
    Ok(timestamp.strftime("%Y-%m-%d %H:%M:%S%.f+00").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_lsns() {
        assert_eq!(parse_lsn("0/3000060"), Some(0x3000060));
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
        assert_eq!(format_lsn(0), "0/0");
        assert_eq!(parse_lsn("0x1/2"), None);
        assert_eq!(parse_lsn("1/123456789"), None);
        assert_eq!(parse_lsn("0/1'; DROP"), None);
        assert_eq!(parse_lsn(""), None);
    }

    #[test]
    fn computes_segment_names_like_postgres() {
        let size = DEFAULT_SEGMENT_SIZE;
        // pg_walfile_name('0/3000060') on timeline 1.
        assert_eq!(segment_name(1, 0x3000060, size), "000000010000000000000003");
        // 16/B374D848: log id 0x16, segment 0xB3.
        assert_eq!(
            segment_name(2, 0x16_B374_D848, size),
            "0000000200000016000000B3"
        );
        // A backup ending exactly at a segment boundary needs the segment before it
        // (XLByteToPrevSeg), across a log id too.
        assert_eq!(
            previous_segment_name(1, 0x5000000, size),
            "000000010000000000000004"
        );
        assert_eq!(
            previous_segment_name(1, 0x1_0000_0000, size),
            "0000000100000000000000FF"
        );
        assert_eq!(
            previous_segment_name(1, 0x5000001, size),
            "000000010000000000000005"
        );
        // 64 MiB segments: 64 per log id.
        assert_eq!(
            segment_name(1, 0x1_0400_0000, 64 * 1024 * 1024),
            "000000010000000100000001"
        );
        assert_eq!(
            parse_segment_name("0000000200000016000000B3", size),
            Some((2, 0x16 * 256 + 0xB3))
        );
        assert_eq!(parse_segment_name("000000010000000000000100", size), None);
        assert_eq!(parse_segment_name("00000001.history", size), None);
    }

    #[test]
    fn enumerates_segment_ranges_across_log_ids() {
        let range = segment_range(
            "0000000100000000000000FE",
            "000000010000000100000001",
            DEFAULT_SEGMENT_SIZE,
        )
        .unwrap();
        assert_eq!(
            range,
            [
                "0000000100000000000000FE",
                "0000000100000000000000FF",
                "000000010000000100000000",
                "000000010000000100000001"
            ]
        );
        assert_eq!(
            segment_range(
                "000000010000000000000003",
                "000000010000000000000003",
                DEFAULT_SEGMENT_SIZE
            )
            .unwrap()
            .len(),
            1
        );
        assert!(
            segment_range(
                "000000010000000000000003",
                "000000020000000000000003",
                DEFAULT_SEGMENT_SIZE
            )
            .is_none()
        );
        assert!(
            segment_range(
                "000000010000000000000004",
                "000000010000000000000003",
                DEFAULT_SEGMENT_SIZE
            )
            .is_none()
        );
    }

    #[test]
    fn accepts_only_wal_file_names() {
        for ok in [
            "000000010000000000000003",
            "00000002.history",
            "000000010000000000000003.00000028.backup",
            "000000010000000000000003.partial",
        ] {
            assert!(is_wal_file_name(ok), "{ok}");
        }
        for bad in ["", "../x", "a/b", "RECOVERYXLOG", "x y", "0000..history"] {
            assert!(!is_wal_file_name(bad), "{bad}");
        }
    }

    #[test]
    fn parses_backup_label() {
        let text = "START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\n\
                    CHECKPOINT LOCATION: 0/2000060\n\
                    BACKUP METHOD: streamed\n\
                    BACKUP FROM: standby\n\
                    START TIME: 2026-11-30 12:00:00 UTC\n\
                    LABEL: pg_basebackup base backup\n\
                    START TIMELINE: 3\n";
        let label = parse_backup_label(text).unwrap();
        assert_eq!(label.start_lsn, "0/2000028");
        assert_eq!(
            label.start_segment.as_deref(),
            Some("000000010000000000000002")
        );
        assert_eq!(label.checkpoint_lsn.as_deref(), Some("0/2000060"));
        assert_eq!(label.timeline, Some(3));
        assert_eq!(label.from.as_deref(), Some("standby"));
        assert_eq!(label.start_time.as_deref(), Some("2026-11-30 12:00:00 UTC"));
        assert!(parse_backup_label("LABEL: x\n").is_none());
        assert!(parse_backup_label("START WAL LOCATION: nonsense\n").is_none());
    }

    #[test]
    fn reads_pg_basebackup_progress() {
        let mut p = BaseBackupProgress::default();
        for line in [
            "pg_basebackup: initiating base backup, waiting for checkpoint to complete",
            "pg_basebackup: checkpoint completed",
            "pg_basebackup: write-ahead log start point: 0/2000028 on timeline 1",
            "NOTICE:  base backup done, waiting for required WAL segments to be archived",
            "pg_basebackup: write-ahead log end point: 0/2000138",
            "pg_basebackup: base backup completed",
        ] {
            p.take_line(line);
        }
        assert_eq!(p.start_lsn.as_deref(), Some("0/2000028"));
        assert_eq!(p.timeline, Some(1));
        assert_eq!(p.end_lsn.as_deref(), Some("0/2000138"));
        assert!(p.waiting_for_archive);
    }

    /// A tar archive as pg_basebackup writes it (ustar, one header per entry).
    fn tar(entries: &[(&str, u8, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, kind, data) in entries {
            let mut header = [0u8; 512];
            header[..name.len()].copy_from_slice(name.as_bytes());
            header[100..107].copy_from_slice(b"0000600");
            header[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
            header[156] = *kind;
            header[257..263].copy_from_slice(b"ustar\0");
            header[263..265].copy_from_slice(b"00");
            header[148..156].copy_from_slice(b"        ");
            let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
            header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
            out.extend_from_slice(&header);
            out.extend_from_slice(data);
            out.resize(out.len() + padding_of(data.len() as u64) as usize, 0);
        }
        out.resize(out.len() + 1024, 0);
        out
    }

    #[test]
    fn parses_a_tar_stream_fed_in_odd_pieces() {
        let label =
            b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nSTART TIMELINE: 1\n";
        let big = vec![7u8; 1500];
        let manifest = br#"{ "PostgreSQL-Backup-Manifest-Version": 1, "Files": [],
"WAL-Ranges": [
{ "Timeline": 1, "Start-LSN": "0/2000028", "End-LSN": "0/2000100" }
],
"Manifest-Checksum": "x"}"#;
        let archive = tar(&[
            ("backup_label", b'0', label),
            ("base/", b'5', b""),
            ("base/1/1259", b'0', &big),
            ("PG_VERSION", b'0', b"15\n"),
            ("backup_manifest", b'0', manifest),
        ]);
        for piece in [1usize, 7, 511, 512, 513, 4096] {
            let mut stream = TarStream::default();
            let mut files: Vec<(String, Vec<u8>)> = Vec::new();
            let mut ended = false;
            for mut chunk in archive.chunks(piece) {
                while let Some(event) = stream.next(&mut chunk).unwrap() {
                    match event {
                        TarEvent::Entry(e) => files.push((e.name, Vec::new())),
                        TarEvent::Data(d) => files.last_mut().unwrap().1.extend_from_slice(d),
                        TarEvent::End => ended = true,
                    }
                }
            }
            assert!(ended, "piece {piece}");
            let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                [
                    "backup_label",
                    "base/",
                    "base/1/1259",
                    "PG_VERSION",
                    "backup_manifest"
                ]
            );
            assert_eq!(files[0].1, label);
            assert_eq!(files[2].1, big);
            assert_eq!(files[3].1, b"15\n");

            let mut watcher = TarWatcher::default();
            for chunk in archive.chunks(piece) {
                watcher.feed(chunk);
            }
            assert_eq!(watcher.label.as_deref(), Some(&label[..]));
            assert_eq!(watcher.manifest_tail.as_deref(), Some(&manifest[..]));
            assert!(watcher.ended && watcher.error.is_none());
        }
        let mut stream = TarStream::default();
        let mut junk: &[u8] = &[1u8; 512];
        assert!(stream.next(&mut junk).is_err());
    }

    #[test]
    fn reads_the_wal_ranges_of_a_manifest_tail() {
        let tail = r#"{ "Path": "global/pg_control", "Size": 8192 }
],
"WAL-Ranges": [
{ "Timeline": 1, "Start-LSN": "0/5000028", "End-LSN": "0/50FFFF8" },
{ "Timeline": 2, "Start-LSN": "0/50FFFF8", "End-LSN": "0/6000100" }
],
"Manifest-Checksum": "1ab2"}
"#;
        assert_eq!(
            parse_manifest_wal_ranges(tail),
            [
                WalRange {
                    timeline: 1,
                    start_lsn: "0/5000028".into(),
                    end_lsn: "0/50FFFF8".into()
                },
                WalRange {
                    timeline: 2,
                    start_lsn: "0/50FFFF8".into(),
                    end_lsn: "0/6000100".into()
                }
            ]
        );
        assert!(parse_manifest_wal_ranges("\"Files\": [").is_empty());
    }

    #[test]
    fn refuses_paths_that_escape() {
        assert_eq!(
            safe_relative_path("./base/1/1259"),
            Some(std::path::PathBuf::from("base/1/1259"))
        );
        assert_eq!(safe_relative_path("../etc/passwd"), None);
        assert_eq!(safe_relative_path("/etc/passwd"), None);
        assert_eq!(safe_relative_path("a/../../b"), None);
        assert_eq!(safe_relative_path("."), None);
    }

    #[test]
    fn serialises_the_manifest_with_the_report_keys() {
        let manifest = Manifest {
            format: 1,
            report: BackupReport {
                name: "nightly".into(),
                uid: "u-1".into(),
                backup_id: "20261130T120000Z-nightly".into(),
                phase: "Completed".into(),
                started_at: Some("2026-11-30T12:00:00Z".into()),
                stopped_at: Some("2026-11-30T12:00:09Z".into()),
                engine: Some("postgres".into()),
                version: Some("15.18".into()),
                size: Some(31_457_792),
                object_path: Some("s3://b/prod/ns/db/74/base/20261130T120000Z-nightly/".into()),
                prefix: Some("prod/ns/db/74/".into()),
                begin_lsn: Some("0/2000028".into()),
                end_lsn: Some("0/2000138".into()),
                timeline: Some(1),
                begin_wal: Some("000000010000000000000002".into()),
                end_wal: Some("000000010000000000000002".into()),
                gtid_position: None,
                error: None,
            },
            system_identifier: "74".into(),
            cluster: "db".into(),
            namespace: "ns".into(),
            cluster_uid: "c-1".into(),
            file: "data.tar".into(),
            wal_segment_size: Some(DEFAULT_SEGMENT_SIZE),
        };
        let json = serde_json::to_value(&manifest).unwrap();
        for key in [
            "format",
            "name",
            "uid",
            "backupId",
            "phase",
            "startedAt",
            "stoppedAt",
            "engine",
            "version",
            "size",
            "objectPath",
            "prefix",
            "beginLSN",
            "endLSN",
            "timeline",
            "beginWAL",
            "endWAL",
            "systemIdentifier",
            "cluster",
            "namespace",
            "clusterUid",
            "file",
            "walSegmentSize",
        ] {
            assert!(json.get(key).is_some(), "{key} missing in {json}");
        }
        assert!(json.get("error").is_none());
        let back: Manifest = serde_json::from_value(json).unwrap();
        assert_eq!(back, manifest);
    }

    #[test]
    fn checks_ids_and_times() {
        assert!(is_backup_id("20261130T120000Z-nightly-1"));
        assert!(!is_backup_id("../x"));
        assert!(!is_backup_id("a/b"));
        assert_eq!(
            postgres_target_time("2026-11-30T12:34:56Z").unwrap(),
            "2026-11-30 12:34:56+00"
        );
        assert_eq!(
            postgres_target_time("2026-11-30T12:34:56.5+02:00").unwrap(),
            "2026-11-30 10:34:56.5+00"
        );
        assert!(postgres_target_time("2026-11-30'; x").is_err());
        assert!(postgres_target_time("now").is_err());
    }
}
