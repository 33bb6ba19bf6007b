//! Status writes the cache has not caught up with yet.
//!
//! A reconcile decides whether to write an object's status by comparing the status it
//! computes with the cached object's. A reconcile that starts right after a status write, before
//! the watch delivered that write's echo, compares with the status from *before* the write and
//! would write the same status again (at 30 clusters, one write in fifty was such a repeat).
//! So each write is remembered — the resourceVersion the cache showed when it was made and a
//! hash of the status — until the cache shows anything but the version the write was based on.
//!
//! Sound because devctl's server-side apply of the status owns every status field (`force`):
//! while the cache still shows the version a write was based on, the server holds that write or
//! something newer, and anything newer arrives as a watch event that moves the cache (and
//! wakes the object) — whereupon the entry is dropped and the cache compared as usual. Entries
//! live only while a write's echo is on its way, so the map stays as small as the writes in
//! flight and nothing is left behind for deleted objects.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

use crate::children::slim::fingerprint;

#[derive(Debug)]
struct Written {
    /// The object's resourceVersion in the cache when the status was written.
    based_on: String,
    /// Hash of the status written.
    status: u64,
}

/// By object key (`kind/namespace/name`).
#[derive(Debug, Default)]
pub struct StatusWrites {
    written: Mutex<HashMap<String, Written>>,
}

impl StatusWrites {
    /// Whether `status` was the last one written to the object at `key` while the cache still
    /// shows `cached_version`, the version that write was based on — so writing it again would
    /// change nothing. Any other cached version means the echo (or someone else's change)
    /// arrived: the entry is dropped and the caller's comparison with the cache stands.
    pub fn already_written(&self, key: &str, cached_version: Option<&str>, status: &Value) -> bool {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        match written.get(key) {
            Some(w) if Some(w.based_on.as_str()) == cached_version => {
                w.status == fingerprint(status)
            }
            Some(_) => {
                written.remove(key);
                false
            }
            None => false,
        }
    }

    /// Records that `status` was written to the object at `key`, whose cached copy was at
    /// `cached_version`.
    pub fn record(&self, key: &str, cached_version: Option<&str>, status: &Value) {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        match cached_version {
            Some(version) => {
                written.insert(
                    key.to_string(),
                    Written {
                        based_on: version.to_string(),
                        status: fingerprint(status),
                    },
                );
            }
            None => {
                written.remove(key);
            }
        }
    }

    /// Forgets the object at `key`: a status was written some other way.
    pub fn forget(&self, key: &str) {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Writes waiting for their echo.
    pub fn len(&self) -> usize {
        self.written.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_status_written_is_not_written_again_before_its_echo() {
        let writes = StatusWrites::default();
        let creating = json!({ "phase": "Creating" });
        writes.record("DatabaseCluster/ns/db", Some("10"), &creating);
        // The cache still shows version 10: the server has the write.
        assert!(writes.already_written("DatabaseCluster/ns/db", Some("10"), &creating));
        // Another status is written even so, and becomes the one remembered.
        let ready = json!({ "phase": "Running" });
        assert!(!writes.already_written("DatabaseCluster/ns/db", Some("10"), &ready));
        writes.record("DatabaseCluster/ns/db", Some("10"), &ready);
        assert!(writes.already_written("DatabaseCluster/ns/db", Some("10"), &ready));
        assert!(!writes.already_written("DatabaseCluster/ns/db", Some("10"), &creating));
        // Other objects are not affected.
        assert!(!writes.already_written("WebApp/ns/db", Some("10"), &ready));
    }

    #[test]
    fn once_the_cache_moves_on_it_decides_and_the_entry_goes() {
        let writes = StatusWrites::default();
        let status = json!({ "phase": "Running" });
        writes.record("DatabaseCluster/ns/db", Some("10"), &status);
        // The echo (11) or someone else's write (12): the cache is compared as usual, so a
        // status someone else changed is written back.
        assert!(!writes.already_written("DatabaseCluster/ns/db", Some("12"), &status));
        assert!(writes.is_empty());
        // Gone for good: an older cached version does not bring it back.
        assert!(!writes.already_written("DatabaseCluster/ns/db", Some("10"), &status));
        // No cached version to base it on: nothing remembered.
        writes.record("DatabaseCluster/ns/db", None, &status);
        assert!(!writes.already_written("DatabaseCluster/ns/db", None, &status));
        assert!(writes.is_empty());
        // A status written some other way (a deletion's): the next write is not skipped.
        writes.record("DatabaseCluster/ns/db", Some("13"), &status);
        writes.forget("DatabaseCluster/ns/db");
        assert!(!writes.already_written("DatabaseCluster/ns/db", Some("13"), &status));
    }
}
