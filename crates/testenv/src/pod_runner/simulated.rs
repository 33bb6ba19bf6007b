//! Simulated mode: a ready report on every database pod, as if an agent had written it, and
//! again whenever its credentials Secret changes (no process, one patch per pod).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use devctl_api::instance::{InstanceStatus, ROLE_PRIMARY, ROLE_REPLICA, STATUS_ANNOTATION, env};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::sync::{Semaphore, watch};

use super::plan::image_name_and_tag;
use super::{DATABASE_POD_SELECTOR, DATABASE_SECRET_SELECTOR, now_rfc3339};
use crate::Error;

/// Patches in flight at once in Simulated mode.
const SIMULATED_CONCURRENCY: usize = 8;

struct SimulatedPod {
    namespace: String,
    name: String,
    uid: String,
    secret: Option<String>,
    report: InstanceStatus,
    /// The credentials version last patched (or seen) on the pod.
    sent: Option<Option<String>>,
}

pub(super) async fn simulate(client: kube::Client, mut shutdown: watch::Receiver<bool>) {
    let pods = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels(DATABASE_POD_SELECTOR),
    )
    .default_backoff();
    let secrets = watcher(
        Api::<Secret>::all(client.clone()),
        watcher::Config::default().labels(DATABASE_SECRET_SELECTOR),
    )
    .default_backoff();
    let mut pods = std::pin::pin!(pods);
    let mut secrets = std::pin::pin!(secrets);
    let limit = Arc::new(Semaphore::new(SIMULATED_CONCURRENCY));
    let mut versions: HashMap<(String, String), String> = HashMap::new();
    let mut known: HashMap<String, SimulatedPod> = HashMap::new();

    let send = |pod: &mut SimulatedPod, version: Option<String>, annotated: Option<String>| {
        pod.sent = Some(version.clone());
        let mut report = pod.report.clone();
        report.credentials_version = version;
        report.heartbeat = Some(now_rfc3339());
        let client = client.clone();
        let limit = limit.clone();
        let (namespace, name, uid) = (pod.namespace.clone(), pod.name.clone(), pod.uid.clone());
        tokio::spawn(async move {
            let Ok(_permit) = limit.acquire_owned().await else {
                return;
            };
            // The API server may be restarting (fault tests): retry until it answers, or
            // the report would never come and the pod stay unready forever.
            let mut delay = Duration::from_millis(250);
            for _ in 0..40 {
                match patch_report(&client, &namespace, &name, &uid, &report, annotated.clone())
                    .await
                {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(%namespace, pod = %name, error = %e, "pod runner: report failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
            tracing::warn!(%namespace, pod = %name, "pod runner: gave up reporting");
        });
    };

    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(event) = pods.next() => {
                let pod = match event {
                    Ok(Event::Apply(pod) | Event::InitApply(pod)) => pod,
                    Ok(Event::Delete(pod)) => {
                        known.remove(&pod.uid().unwrap_or_default());
                        continue;
                    }
                    Ok(Event::Init | Event::InitDone) => continue,
                    Err(e) => {
                        tracing::debug!(error = %e, "pod runner: pod watch");
                        continue;
                    }
                };
                let Some(uid) = pod.uid() else { continue };
                if pod.metadata.deletion_timestamp.is_some() {
                    known.remove(&uid);
                    continue;
                }
                if pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
                    continue;
                }
                let entry = known.entry(uid.clone()).or_insert_with(|| simulated_pod(&pod, uid));
                let desired = entry
                    .secret
                    .as_ref()
                    .and_then(|s| versions.get(&(entry.namespace.clone(), s.clone())))
                    .cloned();
                let current = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref());
                if current
                    .as_ref()
                    .is_some_and(|c| c.ready && c.credentials_version == desired)
                {
                    entry.sent = Some(desired);
                    continue;
                }
                if entry.sent.as_ref() == Some(&desired) {
                    continue;
                }
                let unannotated = pod
                    .metadata
                    .annotations
                    .is_none()
                    .then(|| pod.resource_version().unwrap_or_default());
                send(entry, desired, unannotated);
            }
            Some(event) = secrets.next() => {
                let secret = match event {
                    Ok(Event::Apply(s) | Event::InitApply(s)) => s,
                    Ok(Event::Delete(s)) => {
                        versions.remove(&(s.namespace().unwrap_or_default(), s.name_any()));
                        continue;
                    }
                    Ok(Event::Init | Event::InitDone) => continue,
                    Err(e) => {
                        tracing::debug!(error = %e, "pod runner: secret watch");
                        continue;
                    }
                };
                let key = (secret.namespace().unwrap_or_default(), secret.name_any());
                let version = secret.resource_version().unwrap_or_default();
                if versions.get(&key) == Some(&version) {
                    continue;
                }
                versions.insert(key.clone(), version.clone());
                for pod in known.values_mut() {
                    if pod.namespace == key.0
                        && pod.secret.as_deref() == Some(key.1.as_str())
                        && pod.sent.as_ref() != Some(&Some(version.clone()))
                    {
                        send(pod, Some(version.clone()), None);
                    }
                }
            }
        }
    }
}

fn simulated_pod(pod: &Pod, uid: String) -> SimulatedPod {
    let name = pod.name_any();
    let namespace = pod.namespace().unwrap_or_default();
    let container = pod.spec.as_ref().and_then(|s| s.containers.first());
    let plain_env = |key: &str| -> Option<String> {
        container?
            .env
            .as_ref()?
            .iter()
            .find(|e| e.name == key)?
            .value
            .clone()
    };
    let image = container.and_then(|c| c.image.clone()).unwrap_or_default();
    let (engine, tag) = image_name_and_tag(&image);
    let port = plain_env(env::PORT)
        .unwrap_or_else(|| if engine == "postgres" { "5432" } else { "3306" }.to_string());
    let cluster = pod
        .labels()
        .get("app.kubernetes.io/instance")
        .cloned()
        .unwrap_or_default();
    let role = if name.ends_with("-0") {
        ROLE_PRIMARY
    } else {
        ROLE_REPLICA
    };
    SimulatedPod {
        report: InstanceStatus {
            role: Some(role.into()),
            ready: true,
            system_identifier: Some(fake_system_identifier(&namespace, &cluster)),
            timeline: Some(1),
            engine_version: tag,
            address: Some(format!("127.0.0.1:{port}")),
            ..InstanceStatus::default()
        },
        secret: plain_env(env::CREDENTIALS_SECRET),
        namespace,
        name,
        uid,
        sent: None,
    }
}

/// A stable fake system identifier per database cluster (19 digits, like PostgreSQL's).
fn fake_system_identifier(namespace: &str, cluster: &str) -> String {
    // FNV-1a: stable across runs and Rust versions, unlike `DefaultHasher`.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in namespace.bytes().chain([b'/']).chain(cluster.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (7_000_000_000_000_000_000 + hash % 1_000_000_000_000_000_000).to_string()
}

/// Writes `report` into the pod's [`STATUS_ANNOTATION`] with a JSON patch that tests the
/// pod's uid first (a replaced pod of the same name is left alone). `unannotated_version`
/// is the resourceVersion at which the pod had no annotations at all (the patch then
/// creates the map, guarded by that version); on a conflict the pod is read again.
async fn patch_report(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
    report: &InstanceStatus,
    mut unannotated_version: Option<String>,
) -> Result<(), Error> {
    let value = serde_json::to_string(report).map_err(|e| Error::Process(e.to_string()))?;
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
    for attempt in 0..5 {
        if attempt > 0 {
            let Some(pod) = api.get_opt(name).await? else {
                return Ok(());
            };
            if pod.uid().as_deref() != Some(uid) {
                return Ok(());
            }
            unannotated_version = pod
                .metadata
                .annotations
                .is_none()
                .then(|| pod.resource_version().unwrap_or_default());
        }
        let mut ops =
            vec![serde_json::json!({ "op": "test", "path": "/metadata/uid", "value": uid })];
        match &unannotated_version {
            Some(version) => {
                ops.push(serde_json::json!({
                    "op": "test", "path": "/metadata/resourceVersion", "value": version
                }));
                ops.push(serde_json::json!({
                    "op": "add", "path": "/metadata/annotations",
                    "value": { STATUS_ANNOTATION: value }
                }));
            }
            None => ops.push(serde_json::json!({
                "op": "add",
                "path": format!("/metadata/annotations/{}", STATUS_ANNOTATION.replace('~', "~0").replace('/', "~1")),
                "value": value
            })),
        }
        let request = http::Request::patch(&path)
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .body(serde_json::to_vec(&ops).map_err(|e| Error::Process(e.to_string()))?)
            .map_err(|e| Error::Process(e.to_string()))?;
        match client.request::<Pod>(request).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            // A failed `test` (uid or version) or a conflict: look again.
            Err(kube::Error::Api(status)) if matches!(status.code, 400 | 409 | 422 | 500) => {
                tracing::debug!(%namespace, pod = %name, %status.message, "pod runner: report patch retried");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Process(format!(
        "report on pod {namespace}/{name}: gave up after 5 conflicts"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_system_identifiers_are_stable_and_per_cluster() {
        let a = fake_system_identifier("ns", "a");
        assert_eq!(a, fake_system_identifier("ns", "a"));
        assert_ne!(a, fake_system_identifier("ns", "b"));
        assert_eq!(a.len(), 19);
    }
}
