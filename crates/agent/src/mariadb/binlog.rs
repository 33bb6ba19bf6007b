//! What a closed MariaDB binary log file holds, read from its event headers (pure): when its
//! first and last transactions were written, the GTID position it starts after (its
//! `Gtid_list` event) and its last GTID. The archive keeps this beside each file, so a
//! point-in-time restore knows which files reach past its target without reading them.
//!
//! The format (MariaDB's binary log version 4): the magic `\xfebin`, then events, each with
//! a 19-byte header — timestamp (4, little-endian seconds), type (1), server id (4), event
//! size (4, header and checksum included), next position (4), flags (2).

use std::io::{Read, Seek, SeekFrom};

use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 4] = b"\xfebin";
const HEADER: usize = 19;
/// `GTID_EVENT`: the start of a transaction (payload: sequence number (8), domain (4)).
const GTID_EVENT: u8 = 162;
/// `STOP_EVENT` and `ROTATE_EVENT`: the last event of a file the server closed.
const STOP_EVENT: u8 = 3;
const ROTATE_EVENT: u8 = 4;
/// `GTID_LIST_EVENT`: the position the file starts after (payload: count (4; low 28 bits),
/// then per domain: domain (4), server (4), sequence (8)).
const GTID_LIST_EVENT: u8 = 163;

/// The archive's sidecar of one binary log file (`<file>.json`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// The GTID position the file starts after.
    pub gtid_list: String,
    /// The last transaction's GTID (empty: none).
    pub last_gtid: String,
    /// Unix seconds of the first and last transaction (0: none).
    pub first_transaction: i64,
    pub last_transaction: i64,
    /// The file ends with the server's closing event (a rotation or a shutdown) exactly at
    /// its end. A file a crash cut short has neither; its complete events end at `length`.
    #[serde(default)]
    pub closed: bool,
    /// Bytes up to the end of the last complete event (what is archived).
    #[serde(default)]
    pub length: u64,
}

fn u32_le(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

fn u64_le(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(b)
}

/// Reads the summary of a binary log (seeking over event bodies).
pub fn summarize(mut file: impl Read + Seek) -> Result<Summary, String> {
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic)
        .map_err(|e| format!("reading the magic number: {e}"))?;
    if &magic != MAGIC {
        return Err("not a binary log (bad magic number)".into());
    }
    let mut summary = Summary::default();
    let mut position: u64 = 4;
    let mut header = [0u8; HEADER];
    let length = file.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
    file.seek(SeekFrom::Start(4)).map_err(|e| e.to_string())?;
    let mut last_kind = None;
    loop {
        match file.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("reading an event header at {position}: {e}")),
        }
        let timestamp = i64::from(u32_le(&header[0..4]));
        let kind = header[4];
        let server = u32_le(&header[5..9]);
        let size = u64::from(u32_le(&header[9..13]));
        if size < HEADER as u64 {
            return Err(format!("an event of {size} bytes at {position}"));
        }
        if position + size > length {
            // Cut short (a crash while writing it): not part of the file's complete events.
            break;
        }
        let body = size - HEADER as u64;
        last_kind = Some(kind);
        match kind {
            GTID_EVENT if body >= 12 => {
                let mut payload = [0u8; 12];
                file.read_exact(&mut payload)
                    .map_err(|e| format!("reading a GTID event at {position}: {e}"))?;
                let sequence = u64_le(&payload[0..8]);
                let domain = u32_le(&payload[8..12]);
                summary.last_gtid = format!("{domain}-{server}-{sequence}");
                if summary.first_transaction == 0 {
                    summary.first_transaction = timestamp;
                }
                summary.last_transaction = timestamp;
                file.seek(SeekFrom::Current((body - 12) as i64))
                    .map_err(|e| e.to_string())?;
            }
            GTID_LIST_EVENT if body >= 4 && summary.gtid_list.is_empty() => {
                let mut payload = vec![0u8; body as usize];
                file.read_exact(&mut payload)
                    .map_err(|e| format!("reading the GTID list at {position}: {e}"))?;
                let count = (u32_le(&payload[0..4]) & 0x0fff_ffff) as usize;
                let entries: Vec<String> = (0..count)
                    .filter_map(|i| {
                        let at = 4 + i * 16;
                        let entry = payload.get(at..at + 16)?;
                        Some(format!(
                            "{}-{}-{}",
                            u32_le(&entry[0..4]),
                            u32_le(&entry[4..8]),
                            u64_le(&entry[8..16])
                        ))
                    })
                    .collect();
                summary.gtid_list = entries.join(",");
            }
            _ => {
                file.seek(SeekFrom::Current(body as i64))
                    .map_err(|e| e.to_string())?;
            }
        }
        position += size;
    }
    summary.closed = position == length && matches!(last_kind, Some(STOP_EVENT | ROTATE_EVENT));
    summary.length = position;
    Ok(summary)
}

/// The binary log files named in `mysql-bin.index` (its lines are paths, `./mysql-bin.000001`),
/// in order.
pub fn indexed_files(index: &str) -> Vec<String> {
    index
        .lines()
        .filter_map(|line| {
            let name = line.trim().rsplit('/').next()?.to_string();
            is_binlog_name(&name).then_some(name)
        })
        .collect()
}

/// `mysql-bin.` and digits: a name safe as one object key segment.
pub fn is_binlog_name(name: &str) -> bool {
    name.strip_prefix("mysql-bin.")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}
