//! The API server's audit log (metadata level), read back to count requests.
//!
//! This is how later tests prove "zero writes in steady state" and "requests per reconcile":
//! take a [`AuditMark`], let the operator run, then count what happened after the mark.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Error;

/// Metadata level for every request; `RequestReceived` is omitted so that a request yields
/// one `ResponseComplete` event (long-running watches also log `ResponseStarted`).
pub(crate) const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
"#;

/// Verbs that change state.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// One request, as the audit log recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub verb: String,
    pub user: String,
    pub user_agent: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub code: Option<u16>,
    /// When the API server received the request (RFC 3339, microseconds).
    pub received: Option<String>,
}

impl Request {
    pub fn is_write(&self) -> bool {
        WRITE_VERBS.contains(&self.verb.as_str())
    }

    /// `resource` or `resource/subresource`.
    pub fn full_resource(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    stage: String,
    verb: String,
    #[serde(default)]
    user: RawUser,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    object_ref: Option<RawObjectRef>,
    #[serde(default)]
    response_status: Option<RawStatus>,
    #[serde(default)]
    request_received_timestamp: Option<String>,
}

#[derive(Deserialize, Default)]
struct RawUser {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
struct RawObjectRef {
    #[serde(default)]
    resource: String,
    subresource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct RawStatus {
    code: Option<u16>,
}

/// A position in the audit log; only requests logged after it are counted.
#[derive(Debug, Clone, Copy)]
pub struct AuditMark(u64);

/// The audit log file of one API server.
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
}

impl AuditLog {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current end of the log.
    pub fn mark(&self) -> AuditMark {
        AuditMark(std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0))
    }

    /// Every completed request logged after `mark`.
    pub fn requests_since(&self, mark: AuditMark) -> Result<Vec<Request>, Error> {
        let bytes = std::fs::read(&self.path)
            .map_err(|e| Error::io(format!("read {}", self.path.display()), e))?;
        let start = (mark.0 as usize).min(bytes.len());
        let text = String::from_utf8_lossy(&bytes[start..]);
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str::<RawEvent>(line).ok())
            .filter(|e| e.stage == "ResponseComplete")
            .map(|e| {
                let object = e.object_ref;
                Request {
                    verb: e.verb,
                    user: e.user.username,
                    user_agent: e.user_agent,
                    resource: object
                        .as_ref()
                        .map(|o| o.resource.clone())
                        .unwrap_or_default(),
                    subresource: object.as_ref().and_then(|o| o.subresource.clone()),
                    namespace: object.as_ref().and_then(|o| o.namespace.clone()),
                    name: object.and_then(|o| o.name),
                    code: e.response_status.and_then(|s| s.code),
                    received: e.request_received_timestamp,
                }
            })
            .collect())
    }
}

/// Counts requests by (verb, resource[/subresource], user).
pub fn count_by_verb_resource_user(
    requests: &[Request],
) -> BTreeMap<(String, String, String), usize> {
    let mut counts = BTreeMap::new();
    for r in requests {
        *counts
            .entry((r.verb.clone(), r.full_resource(), r.user.clone()))
            .or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_complete_events_after_the_mark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let line = |verb: &str, stage: &str| {
            format!(
                r#"{{"stage":"{stage}","verb":"{verb}","user":{{"username":"alice"}},"userAgent":"ua","objectRef":{{"resource":"configmaps","namespace":"ns","name":"x"}},"responseStatus":{{"code":200}}}}"#
            ) + "\n"
        };
        std::fs::write(&path, line("get", "ResponseComplete")).unwrap();
        let log = AuditLog::new(path.clone());
        let mark = log.mark();
        let mut more = line("patch", "ResponseComplete");
        more += &line("watch", "ResponseStarted");
        std::fs::write(&path, line("get", "ResponseComplete") + &more).unwrap();
        let requests = log.requests_since(mark).unwrap();
        assert_eq!(requests.len(), 1);
        assert!(requests[0].is_write());
        let counts = count_by_verb_resource_user(&requests);
        assert_eq!(
            counts[&("patch".into(), "configmaps".into(), "alice".into())],
            1
        );
    }
}
