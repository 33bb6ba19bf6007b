//! Reporting: the [`InstanceStatus`] annotation on the agent's own pod, written with a JSON
//! patch whose first operation tests `metadata.uid`, so a report never lands on a newer pod
//! of the same name; and a Warning Event when even that is forbidden.

use std::time::{Duration, Instant};

use devctl_api::instance::{InstanceStatus, STATUS_ANNOTATION};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::config::PodRef;
use crate::error::{is_forbidden, one_line};

/// Reports are rewritten at least this often even when nothing changed (the heartbeat).
pub const HEARTBEAT: Duration = Duration::from_secs(60);

/// Why a report was not written.
#[derive(Debug)]
pub enum WriteError {
    /// The pod is gone or was replaced by a newer one of the same name: this process is
    /// stale.
    Stale(String),
    /// RBAC refused the patch.
    Forbidden(String),
    /// Anything else (transient; retried on the next probe).
    Other(String),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Stale(m) | WriteError::Forbidden(m) | WriteError::Other(m) => {
                f.write_str(m)
            }
        }
    }
}

/// Writes reports, skipping writes that would only move the heartbeat (at most one per
/// [`HEARTBEAT`] for a steady instance).
pub struct Reporter {
    api: Api<Pod>,
    pod: PodRef,
    last: Option<(InstanceStatus, Instant)>,
}

/// RFC 3339 UTC, whole seconds.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

impl Reporter {
    pub fn new(client: kube::Client, pod: PodRef) -> Self {
        Reporter {
            api: Api::namespaced(client, &pod.namespace),
            pod,
            last: None,
        }
    }

    /// Writes `status` (with a fresh heartbeat) unless only the heartbeat would change and
    /// the last write is younger than [`HEARTBEAT`]. Returns whether it wrote.
    pub async fn report(&mut self, mut status: InstanceStatus) -> Result<bool, WriteError> {
        status.heartbeat = None;
        if let Some((last, at)) = &self.last
            && *last == status
            && at.elapsed() < HEARTBEAT
        {
            return Ok(false);
        }
        let mut written = status.clone();
        written.heartbeat = Some(now_rfc3339());
        write(&self.api, &self.pod, &written).await?;
        self.last = Some((status, Instant::now()));
        Ok(true)
    }
}

async fn patch(api: &Api<Pod>, name: &str, ops: Value) -> Result<(), kube::Error> {
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map(|_| ())
}

/// Writes `status` into the pod's annotation, guarded by the pod's uid when known.
pub async fn write(
    api: &Api<Pod>,
    pod: &PodRef,
    status: &InstanceStatus,
) -> Result<(), WriteError> {
    let value = serde_json::to_string(status).map_err(|e| WriteError::Other(e.to_string()))?;
    let guard: Vec<Value> = pod
        .uid
        .iter()
        .map(|uid| json!({ "op": "test", "path": "/metadata/uid", "value": uid }))
        .collect();
    let with = |extra: Vec<Value>| Value::Array(guard.iter().cloned().chain(extra).collect());
    let add_key = with(vec![json!({
        "op": "add",
        "path": format!("/metadata/annotations/{}", escape_pointer(STATUS_ANNOTATION)),
        "value": value,
    })]);
    let classify = |e: &kube::Error| -> WriteError {
        let text = one_line(&e.to_string());
        if is_forbidden(e) {
            WriteError::Forbidden(format!("patching pod {}: {text}", pod.name))
        } else if matches!(e, kube::Error::Api(s) if s.code == 404) {
            WriteError::Stale(format!(
                "pod {}/{} no longer exists",
                pod.namespace, pod.name
            ))
        } else {
            WriteError::Other(format!("patching pod {}: {text}", pod.name))
        }
    };
    let first = match patch(api, &pod.name, add_key).await {
        Ok(()) => return Ok(()),
        Err(e) => classify(&e),
    };
    if !matches!(first, WriteError::Other(_)) {
        return Err(first);
    }
    // The patch failed: either the uid test (a newer pod) or a missing annotations map.
    let current = match api.get_opt(&pod.name).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            return Err(WriteError::Stale(format!(
                "pod {}/{} no longer exists",
                pod.namespace, pod.name
            )));
        }
        Err(e) => return Err(classify(&e)),
    };
    if let Some(uid) = &pod.uid
        && current.metadata.uid.as_deref() != Some(uid.as_str())
    {
        return Err(WriteError::Stale(format!(
            "pod {}/{} now has uid {} (this agent was started for uid {uid})",
            pod.namespace,
            pod.name,
            current.metadata.uid.as_deref().unwrap_or("?")
        )));
    }
    if current.metadata.annotations.is_some() {
        return Err(first);
    }
    // No annotations map yet: add the whole map, guarded against one appearing meanwhile.
    let add_map = with(vec![
        json!({ "op": "test", "path": "/metadata/annotations", "value": null }),
        json!({ "op": "add", "path": "/metadata/annotations", "value": { STATUS_ANNOTATION: value } }),
    ]);
    patch(api, &pod.name, add_map)
        .await
        .map_err(|e| classify(&e))
}

/// Before exiting on an error: reports `ready: false` with `message` on the pod and, if
/// that is forbidden, creates a Warning Event `AgentFailed`. Failures are only logged.
pub async fn report_failure(client: kube::Client, pod: &PodRef, status: InstanceStatus) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let message = status.last_error.clone().unwrap_or_default();
    match write(&api, pod, &status).await {
        Ok(()) => {}
        Err(WriteError::Forbidden(e)) => {
            tracing::warn!("cannot report the failure on the pod ({e}); creating an Event instead");
            if let Err(e) = create_event(client, pod, &message).await {
                tracing::warn!(
                    "cannot create an Event either: {}",
                    one_line(&e.to_string())
                );
            }
        }
        Err(e) => tracing::warn!("cannot report the failure on the pod: {e}"),
    }
}

/// The API server refuses an event whose note is longer than 1 KiB.
const NOTE_LIMIT: usize = 1024;

/// `message` cut to the note limit at a character boundary.
fn within_note_limit(message: &str) -> String {
    if message.len() <= NOTE_LIMIT {
        return message.to_string();
    }
    let mut end = NOTE_LIMIT - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// An `events.k8s.io/v1` Event, the API the agent's Role grants (core `v1` events are not).
async fn create_event(
    client: kube::Client,
    pod: &PodRef,
    message: &str,
) -> Result<(), kube::Error> {
    let api: Api<Event> = Api::namespaced(client, &pod.namespace);
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", pod.name)),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: pod.uid.clone(),
            ..ObjectReference::default()
        }),
        reason: Some("AgentFailed".into()),
        action: Some("Report".into()),
        note: Some(within_note_limit(message)),
        type_: Some("Warning".into()),
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        reporting_controller: Some("devctl.io/devctl-agent".into()),
        reporting_instance: Some(pod.name.clone()),
        ..Event::default()
    };
    api.create(&PostParams::default(), &event).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_failure_fits_an_event_note() {
        let long = "é".repeat(700);
        let note = within_note_limit(&long);
        assert!(note.len() <= NOTE_LIMIT, "{}", note.len());
        assert!(note.ends_with('…'));
        assert_eq!(within_note_limit("short"), "short");
    }
}
