//! The agent's view of its DatabaseCluster (`status.currentPrimary`, read as plain JSON so
//! the agent does not depend on the typed status) and where the primary is.

use devctl_api::instance::InstanceStatus;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use crate::config::{Config, PrimaryFrom};
use crate::error::{is_forbidden, one_line};

/// What the DatabaseCluster watch has seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// The initial list completed.
    pub listed: bool,
    /// The cluster exists.
    pub exists: bool,
    /// `status.currentPrimary`, when set and non-empty.
    pub current_primary: Option<String>,
    /// `status.targetPrimary` (a switchover's or failover's target, or `pending`), when set
    /// and non-empty.
    pub target_primary: Option<String>,
    /// `status.failedPrimary`: the primary a failover under way replaces.
    pub failed_primary: Option<String>,
    /// `status.failoverEpoch` (0 before the first failover).
    pub failover_epoch: i64,
    /// `spec.highAvailability`: the primary lock's duration, when enabled.
    pub lock_duration: Option<std::time::Duration>,
    /// `spec.replicas`.
    pub replicas: i32,
    /// `spec.replication.synchronous` as (`ANY`/`FIRST`, number).
    pub synchronous: Option<(String, i32)>,
    /// `status.currentVersion` is set: the cluster has been ready, so its primary has data
    /// that an empty volume must never replace.
    pub initialized: bool,
    /// `metadata.uid` (for events about the cluster).
    pub uid: Option<String>,
    /// The last watch error (message, forbidden) since the last successful event.
    pub error: Option<(String, bool)>,
    /// `status.majorUpgrade.step` while one is under way (not refused or failed), and the
    /// instance it upgrades.
    pub major_upgrade: Option<(String, Option<String>)>,
    /// `status.currentVersion`'s major.
    pub current_major: Option<u32>,
}

/// `db.devctl.io/v1beta1` `DatabaseCluster` (plural `databaseclusters`).
pub fn database_cluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("db.devctl.io", "v1beta1", "DatabaseCluster"),
        "databaseclusters",
    )
}

/// `status.currentPrimary` of a DatabaseCluster object.
pub fn current_primary(object: &DynamicObject) -> Option<String> {
    status_string(object, "currentPrimary")
}

/// Whether a DatabaseCluster has been ready (`status.currentVersion` is set): its primary has
/// data that an empty volume must never replace.
pub fn has_run(object: &DynamicObject) -> bool {
    status_string(object, "currentVersion").is_some()
}

/// `status.targetPrimary` of a DatabaseCluster object.
pub fn target_primary(object: &DynamicObject) -> Option<String> {
    status_string(object, "targetPrimary")
}

/// The primary lock's duration when `spec.highAvailability.enabled`.
pub fn lock_duration(object: &DynamicObject) -> Option<std::time::Duration> {
    let ha = object.data.get("spec")?.get("highAvailability")?;
    if !ha.get("enabled")?.as_bool()? {
        return None;
    }
    let timeout = ha
        .get("failoverTimeout")
        .and_then(|t| t.as_str())
        .unwrap_or("30s");
    devctl_api::database_cluster::parse_duration(timeout)
}

/// `spec.replication.synchronous` as (`ANY`/`FIRST`, number).
pub fn synchronous(object: &DynamicObject) -> Option<(String, i32)> {
    let sync = object
        .data
        .get("spec")?
        .get("replication")?
        .get("synchronous")?;
    let method = match sync.get("method").and_then(|m| m.as_str()) {
        Some("first") => "FIRST",
        _ => "ANY",
    };
    let number = sync.get("number").and_then(|n| n.as_i64()).unwrap_or(1);
    Some((method.to_string(), i32::try_from(number).ok()?))
}

/// `status.majorUpgrade`'s step and instance while it is under way (not `Refused` or
/// `Failed`).
pub fn major_upgrade(object: &DynamicObject) -> Option<(String, Option<String>)> {
    let upgrade = object.data.get("status")?.get("majorUpgrade")?;
    let step = upgrade.get("step")?.as_str()?;
    if matches!(step, "Refused" | "Failed") {
        return None;
    }
    let primary = upgrade
        .get("primary")
        .and_then(|p| p.as_str())
        .map(str::to_string);
    Some((step.to_string(), primary))
}

fn status_string(object: &DynamicObject, field: &str) -> Option<String> {
    object
        .data
        .get("status")?
        .get(field)?
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Watches the one DatabaseCluster (field selector on its name: the agent's Role allows only
/// that name).
pub fn watch_cluster(client: kube::Client, config: &Config) -> watch::Receiver<ClusterView> {
    let (tx, rx) = watch::channel(ClusterView::default());
    let resource = database_cluster_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client, &config.pod_namespace, &resource);
    let fields = format!("metadata.name={}", config.cluster);
    let set = move |view: &mut ClusterView, object: Option<&DynamicObject>| {
        view.listed = true;
        view.exists = object.is_some();
        view.current_primary = object.and_then(current_primary);
        view.target_primary = object.and_then(target_primary);
        view.failed_primary = object.and_then(|o| status_string(o, "failedPrimary"));
        view.failover_epoch = object
            .and_then(|o| o.data.get("status")?.get("failoverEpoch")?.as_i64())
            .unwrap_or(0);
        view.lock_duration = object.and_then(lock_duration);
        view.replicas = object
            .and_then(|o| o.data.get("spec")?.get("replicas")?.as_i64())
            .and_then(|r| i32::try_from(r).ok())
            .unwrap_or(1);
        view.synchronous = object.and_then(synchronous);
        view.initialized = object.is_some_and(has_run);
        view.uid = object.and_then(|o| o.metadata.uid.clone());
        view.major_upgrade = object.and_then(major_upgrade);
        view.current_major = object
            .and_then(|o| status_string(o, "currentVersion"))
            .and_then(|v| v.split('.').next()?.parse().ok());
        view.error = None;
    };
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default().fields(&fields))
            .default_backoff()
            .boxed();
        let mut buffer: Option<DynamicObject> = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => buffer = None,
                Ok(watcher::Event::InitApply(o)) => buffer = Some(o),
                Ok(watcher::Event::InitDone) => {
                    let object = buffer.take();
                    tx.send_if_modified(|v| {
                        let before = v.clone();
                        set(v, object.as_ref());
                        *v != before
                    });
                }
                Ok(watcher::Event::Apply(o)) => {
                    tx.send_if_modified(|v| {
                        let before = v.clone();
                        set(v, Some(&o));
                        *v != before
                    });
                }
                Ok(watcher::Event::Delete(_)) => tx.send_modify(|v| set(v, None)),
                Err(e) => {
                    let forbidden = watch_error_is_forbidden(&e);
                    let message = one_line(&e.to_string());
                    tracing::warn!("watching the DatabaseCluster: {message}");
                    tx.send_modify(|v| v.error = Some((message, forbidden)));
                }
            }
        }
    });
    rx
}

/// Whether a watch error is the API server's 403.
pub fn watch_error_is_forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(k)
        | watcher::Error::WatchStartFailed(k)
        | watcher::Error::WatchFailed(k) => is_forbidden(k),
        watcher::Error::WatchError(s) => s.code == 403,
        watcher::Error::NoResourceVersion => false,
    }
}

/// Where a replica streams from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrimaryAddress {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for PrimaryAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// `host:port` or `[v6]:port` as in a report's `address`.
pub fn parse_address(address: &str) -> Option<PrimaryAddress> {
    let (host, port) = address.trim().rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    if host.is_empty()
        || host
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\')
    {
        return None;
    }
    Some(PrimaryAddress {
        host: host.to_string(),
        port,
    })
}

/// The primary's address, or why it is not known yet (one line, for `lastError`).
///
/// Both modes wait for the primary pod's report to say `ready` (the pod may be read by
/// name); with [`PrimaryFrom::Service`] the address is the `-rw` Service's, with
/// [`PrimaryFrom::Annotation`] the report's `address` (that is the only difference).
pub async fn resolve_primary(
    pods: &Api<Pod>,
    config: &Config,
    primary: &str,
) -> Result<PrimaryAddress, String> {
    resolve_primary_report(pods, config, primary)
        .await
        .map(|(address, _)| address)
}

/// [`resolve_primary`] with the primary's report it was read from.
pub async fn resolve_primary_report(
    pods: &Api<Pod>,
    config: &Config,
    primary: &str,
) -> Result<(PrimaryAddress, InstanceStatus), String> {
    let pod = match pods.get_opt(primary).await {
        Ok(Some(pod)) => pod,
        Ok(None) => return Err(format!("waiting for the primary pod {primary} (not found)")),
        Err(e) => {
            return Err(format!(
                "reading the primary pod {primary}: {}",
                one_line(&e.to_string())
            ));
        }
    };
    let report = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref());
    let Some(report) = report.filter(|r| r.ready) else {
        return Err(format!("waiting for the primary {primary} to report ready"));
    };
    let address = match &config.primary_from {
        PrimaryFrom::Service { host } => PrimaryAddress {
            host: host.clone(),
            port: config.port,
        },
        PrimaryFrom::Annotation => report
            .address
            .as_deref()
            .and_then(parse_address)
            .ok_or_else(|| {
                format!(
                    "the primary {primary} reports no usable address ({:?})",
                    report.address
                )
            })?,
    };
    Ok((address, report))
}

/// The report of the pod `name`, or why it cannot be read.
pub async fn read_report(pods: &Api<Pod>, name: &str) -> Result<Option<InstanceStatus>, String> {
    match pods.get_opt(name).await {
        Ok(Some(pod)) => Ok(InstanceStatus::from_annotations(
            pod.metadata.annotations.as_ref(),
        )),
        Ok(None) => Err(format!("the pod {name} was not found")),
        Err(e) => Err(format!(
            "reading the pod {name}: {}",
            one_line(&e.to_string())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_current_primary_from_json() {
        let mut object = DynamicObject::new("db", &database_cluster_resource());
        assert_eq!(current_primary(&object), None);
        object.data = serde_json::json!({ "status": { "currentPrimary": "db-0" } });
        assert_eq!(current_primary(&object).as_deref(), Some("db-0"));
        object.data = serde_json::json!({ "status": { "currentPrimary": "" } });
        assert_eq!(current_primary(&object), None);
        object.data =
            serde_json::json!({ "status": { "currentPrimary": "db-0", "targetPrimary": "db-1" } });
        assert_eq!(target_primary(&object).as_deref(), Some("db-1"));
    }

    #[test]
    fn reads_high_availability_and_synchronous_replication() {
        let mut object = DynamicObject::new("db", &database_cluster_resource());
        object.data = serde_json::json!({ "spec": { "highAvailability": { "enabled": false } } });
        assert_eq!(lock_duration(&object), None);
        object.data = serde_json::json!({ "spec": {
            "highAvailability": { "enabled": true, "failoverTimeout": "2m" },
            "replication": { "synchronous": { "method": "first", "number": 2 } }
        } });
        assert_eq!(
            lock_duration(&object),
            Some(std::time::Duration::from_secs(120))
        );
        assert_eq!(synchronous(&object), Some(("FIRST".to_string(), 2)));
    }

    #[test]
    fn parses_report_addresses() {
        let a = parse_address("127.0.0.1:5433").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 5433));
        assert_eq!(a.to_string(), "127.0.0.1:5433");
        let a = parse_address("[fd00::1]:5432").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("fd00::1", 5432));
        assert_eq!(a.to_string(), "[fd00::1]:5432");
        assert_eq!(parse_address("nohost"), None);
        assert_eq!(parse_address("h:0"), None);
        assert_eq!(parse_address("a b:1"), None);
    }
}
