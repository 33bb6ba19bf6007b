//! Where a cluster's backups go and what a restored cluster restores (docs/backup.md): the
//! store credentials copied into `<name>-backup-store` / `<name>-restore-store`, and the
//! non-secret locations the agents read from their pods' annotations.
//!
//! The agents never read a Secret they were not given by name: whatever the user's
//! destination Secret is called (or the operator's default destination, which lives in the
//! operator's namespace), the agent reads only its cluster's own copy.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use devctl_api::database_cluster::{BackupDestination, DatabaseCluster};
use devctl_api::instance::{
    ACCESS_KEY_ID, BACKUP_DESTINATION_ANNOTATION, BACKUP_STORE_SECRET_SUFFIX, CA_CERT,
    RESTORE_ANNOTATION, RESTORE_STORE_SECRET_SUFFIX, RestoreRequest, SECRET_ACCESS_KEY,
    StoreLocation,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;

use super::resources::{Names, metadata};
use crate::children::Child;
use crate::context::Context;
use crate::error::Result;

pub use super::store::Store;

/// The cluster's own prefix in a store whose configured path is `path`.
pub fn cluster_prefix(path: &str, namespace: &str, name: &str) -> String {
    let path = path.trim_matches('/');
    if path.is_empty() {
        format!("{namespace}/{name}/")
    } else {
        format!("{path}/{namespace}/{name}/")
    }
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let value = secret.data.as_ref()?.get(key)?;
    String::from_utf8(value.0.clone())
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

async fn read_secret(ctx: &Context, namespace: &str, name: &str) -> Result<Secret, String> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(format!("Secret {namespace}/{name} not found")),
        Err(e) => Err(format!("reading Secret {namespace}/{name}: {e}")),
    }
}

/// A destination declared in a spec, with its Secrets read from `namespace`.
async fn declared(
    ctx: &Context,
    namespace: &str,
    destination: &BackupDestination,
    prefix: String,
) -> Result<Store, String> {
    let secret = read_secret(ctx, namespace, &destination.credentials_secret).await?;
    let key = |k: &str| {
        text(&secret, k).ok_or_else(|| {
            format!(
                "Secret {namespace}/{} has no {k} (spec.backup.destination.credentialsSecret)",
                destination.credentials_secret
            )
        })
    };
    let (access_key_id, secret_access_key) = (key(ACCESS_KEY_ID)?, key(SECRET_ACCESS_KEY)?);
    let ca = match &destination.ca_secret {
        Some(name) => {
            let secret = read_secret(ctx, namespace, name).await?;
            Some(text(&secret, CA_CERT).ok_or_else(|| {
                format!(
                    "Secret {namespace}/{name} has no {CA_CERT} (spec.backup.destination.caSecret)"
                )
            })?)
        }
        None => None,
    };
    Ok(Store {
        location: StoreLocation {
            endpoint: destination.endpoint.clone(),
            bucket: destination.bucket.clone(),
            prefix,
            region: destination.region.clone(),
        },
        access_key_id,
        secret_access_key,
        ca,
    })
}

/// The operator's default destination (`--default-backup-secret`), with `prefix_of(path)`.
async fn default_store(
    ctx: &Context,
    prefix_of: impl Fn(&str) -> String,
) -> Result<Option<Store>, String> {
    let Some((namespace, name)) = ctx.settings.default_backup_secret.clone() else {
        return Ok(None);
    };
    let secret = read_secret(ctx, &namespace, &name).await?;
    let key = |k: &str| {
        text(&secret, k).ok_or_else(|| {
            format!("the default backup destination Secret {namespace}/{name} has no {k}")
        })
    };
    let path = text(&secret, "path").unwrap_or_default();
    Ok(Some(Store {
        location: StoreLocation {
            endpoint: key("endpoint")?,
            bucket: key("bucket")?,
            prefix: prefix_of(&path),
            region: text(&secret, "region").unwrap_or_else(|| "us-east-1".into()),
        },
        access_key_id: key(ACCESS_KEY_ID)?,
        secret_access_key: key(SECRET_ACCESS_KEY)?,
        ca: text(&secret, CA_CERT),
    }))
}

/// Where this cluster's backups and WAL go: `Ok(None)` while backups are disabled, `Err`
/// when they are enabled but no usable destination exists (why, naming the field).
pub async fn destination(
    ctx: &Context,
    db: &DatabaseCluster,
    names: &Names,
) -> Result<Option<Store>, String> {
    let backup = db.spec.backup.as_ref();
    if backup.is_some_and(|b| !b.enabled) {
        return Ok(None);
    }
    let prefix = |path: &str| cluster_prefix(path, &names.namespace, &names.name);
    if let Some(destination) = backup.and_then(|b| b.destination.as_ref()) {
        return declared(
            ctx,
            &names.namespace,
            destination,
            prefix(&destination.path),
        )
        .await
        .map(Some);
    }
    match default_store(ctx, prefix).await? {
        Some(store) => Ok(Some(store)),
        None if backup.is_some() => Err(
            "spec.backup.destination is not set and the operator has no default destination (--default-backup-secret)"
                .into(),
        ),
        // No backup block and no default: nothing was asked for.
        None => Ok(None),
    }
}

/// Where the restore request already on the first instance found backup `backup_id`.
fn requested_prefix(ctx: &Context, names: &Names, backup_id: &str) -> Option<String> {
    use kube::ResourceExt;
    let pod = ctx.caches.get::<k8s_openapi::api::core::v1::Pod>(
        &names.namespace,
        &format!("{}-0", names.stateful_set()),
    )?;
    let request: RestoreRequest =
        serde_json::from_str(pod.annotations().get(RESTORE_ANNOTATION)?).ok()?;
    (request.backup_id == backup_id).then_some(request.location.prefix)
}

/// What the first instance of a restored cluster restores, and with which credentials.
pub async fn restore_source(
    ctx: &Context,
    db: &DatabaseCluster,
    names: &Names,
) -> Result<Option<(RestoreRequest, Store)>, String> {
    let Some(recovery) = db.spec.bootstrap.as_ref().and_then(|b| b.recovery.as_ref()) else {
        return Ok(None);
    };
    if let Some(source) = &recovery.source {
        let prefix = match (
            &source.namespace,
            &source.cluster,
            &source.system_identifier,
        ) {
            (Some(namespace), Some(cluster), Some(id)) => format!(
                "{}{id}/",
                cluster_prefix(&source.destination.path, namespace, cluster)
            ),
            // Found by its id (only until the cluster has been restored: see `resolve`), once:
            // the restore request on the first instance keeps where it was found.
            _ => match requested_prefix(ctx, names, &source.backup_id) {
                Some(prefix) => prefix,
                None => {
                    let root =
                        declared(ctx, &names.namespace, &source.destination, String::new()).await?;
                    super::store::locate_backup(&root, source).await?
                }
            },
        };
        let store = declared(ctx, &names.namespace, &source.destination, prefix).await?;
        let request = RestoreRequest {
            location: store.location.clone(),
            backup_id: source.backup_id.clone(),
            target_time: recovery.target_time.clone(),
        };
        return Ok(Some((request, store)));
    }
    let Some(name) = &recovery.backup else {
        return Err("spec.bootstrap.recovery: set backup or source".into());
    };
    let api: Api<DatabaseBackup> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let backup = match api.get_opt(name).await {
        Ok(Some(b)) => b,
        Ok(None) => {
            return Err(format!(
                "spec.bootstrap.recovery.backup: DatabaseBackup {name} not found"
            ));
        }
        Err(e) => return Err(format!("reading DatabaseBackup {name}: {e}")),
    };
    let status = backup.status.clone().unwrap_or_default();
    if status.phase != Some(BackupPhase::Completed) {
        return Err(format!(
            "spec.bootstrap.recovery.backup: DatabaseBackup {name} has not completed"
        ));
    }
    let (Some(endpoint), Some(bucket), Some(prefix), Some(backup_id)) = (
        status.endpoint.clone(),
        status.bucket.clone(),
        status.prefix.clone(),
        status.backup_id.clone(),
    ) else {
        return Err(format!(
            "DatabaseBackup {name} does not say where it is stored"
        ));
    };
    // The credentials: the ones the backup was taken with (its cluster's destination named
    // them), else the ones this cluster would back up with, else the operator's default.
    let own = match &status.credentials_secret {
        Some(secret) => {
            let recorded = BackupDestination {
                endpoint: endpoint.clone(),
                bucket: bucket.clone(),
                path: String::new(),
                region: status.region.clone().unwrap_or_else(|| "us-east-1".into()),
                credentials_secret: secret.clone(),
                ca_secret: status.ca_secret.clone(),
            };
            Some(declared(ctx, &names.namespace, &recorded, prefix.clone()).await?)
        }
        None => destination(ctx, db, names).await.ok().flatten(),
    };
    let own = match own {
        Some(store) => Some(store),
        None => default_store(ctx, |_| String::new()).await?,
    };
    let Some(own) = own else {
        return Err(format!(
            "no credentials for the store of DatabaseBackup {name}: set spec.backup.destination"
        ));
    };
    let location = StoreLocation {
        endpoint,
        bucket,
        prefix,
        region: status.region.clone().unwrap_or(own.location.region.clone()),
    };
    let store = Store {
        location: location.clone(),
        ..own
    };
    let request = RestoreRequest {
        location,
        backup_id,
        target_time: recovery.target_time.clone(),
    };
    Ok(Some((request, store)))
}

/// The Secret `<name><suffix>` with a store's credentials.
pub fn store_secret(
    db: &DatabaseCluster,
    names: &Names,
    version: &str,
    suffix: &str,
    store: &Store,
) -> Result<Child> {
    let encode = |s: &str| STANDARD.encode(s);
    let mut data = json!({
        ACCESS_KEY_ID: encode(&store.access_key_id),
        SECRET_ACCESS_KEY: encode(&store.secret_access_key),
    });
    if let Some(ca) = &store.ca {
        data[CA_CERT] = json!(encode(ca));
    }
    let name = format!("{}{suffix}", names.name);
    Child::new::<Secret>(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(db, names, &name, "backup", version)?,
        "type": "Opaque",
        "data": data,
    }))
}

/// The names of the store Secrets (for the agents' Role).
pub fn secret_names(names: &Names) -> [String; 2] {
    [
        format!("{}{BACKUP_STORE_SECRET_SUFFIX}", names.name),
        format!("{}{RESTORE_STORE_SECRET_SUFFIX}", names.name),
    ]
}

/// Resolved once per reconcile, before the children are computed.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    pub destination: Option<Store>,
    /// Why backups cannot run although enabled.
    pub destination_problem: Option<String>,
    pub restore: Option<(RestoreRequest, Store)>,
    pub restore_problem: Option<String>,
}

pub async fn resolve(ctx: &Context, db: &Arc<DatabaseCluster>, names: &Names) -> Resolved {
    let mut resolved = Resolved::default();
    match destination(ctx, db, names).await {
        Ok(store) => resolved.destination = store,
        Err(why) => resolved.destination_problem = Some(why),
    }
    // Once the cluster has run (restored and ready), the restore is history: its source may
    // be deleted (retention, the source cluster going) without this cluster being degraded,
    // and the source store's credentials are no longer handed to it.
    let restored = db
        .status
        .as_ref()
        .is_some_and(|s| s.current_version.is_some());
    if !restored {
        match restore_source(ctx, db, names).await {
            Ok(restore) => resolved.restore = restore,
            Err(why) => resolved.restore_problem = Some(why),
        }
    }
    resolved
}

/// The backup annotations each pod lacks or has wrong (pure): the destination on every
/// instance, the restore on the first primary. Values `null` remove an annotation.
pub fn pod_annotations(
    pods: &[&k8s_openapi::api::core::v1::Pod],
    store: &Resolved,
    primary: &str,
) -> Vec<(String, serde_json::Value)> {
    use kube::ResourceExt;
    // Off only when backups are really off: a destination that cannot be read right now
    // leaves the annotation as it is (the agent must not acknowledge WAL it cannot store).
    let destination = match (&store.destination, &store.destination_problem) {
        (Some(s), _) => serde_json::to_string(&s.location).ok(),
        (None, None) => Some(devctl_api::instance::BACKUP_DESTINATION_OFF.to_string()),
        (None, Some(_)) => None,
    };
    let touch_destination = destination.is_some();
    let restore = store
        .restore
        .as_ref()
        .and_then(|(r, _)| serde_json::to_string(r).ok());
    let mut changes = Vec::new();
    for pod in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let name = pod.name_any();
        let current = pod.annotations();
        let mut patch = serde_json::Map::new();
        let mut want = |key: &str, value: Option<&String>| {
            if current.get(key) != value {
                patch.insert(key.to_string(), json!(value));
            }
        };
        if touch_destination {
            want(BACKUP_DESTINATION_ANNOTATION, destination.as_ref());
        }
        if name == primary {
            // Kept once set: it describes how this cluster began (the agent ignores it once
            // the data exists).
            if restore.is_some() {
                want(RESTORE_ANNOTATION, restore.as_ref());
            }
        }
        if !patch.is_empty() {
            changes.push((name, serde_json::Value::Object(patch)));
        }
    }
    changes
}

/// A `Degraded` reason and its message.
pub type Problem = (&'static str, String);

/// Whether backups and WAL archiving work, each on its own (`None`: they do), for the
/// `BackupFailing` and `WALArchivingFailing` conditions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    pub backup_failing: Option<String>,
    pub wal_archiving_failing: Option<String>,
    /// The newest backup failed, and the store has taken WAL since it failed. Whether that
    /// clears `BackupFailing` depends on whether the store was down when it failed, which
    /// only the status remembers ([`super::status`]).
    pub store_took_wal_since_the_failure: bool,
}

/// What the agents report about backups (pure): the problem to show on the cluster, if any,
/// the newest completed backup (stop time, name), and the health of backups and archiving
/// (`None` when the cluster has no backups configured).
pub fn observe(
    pods: &[&k8s_openapi::api::core::v1::Pod],
    store: &Resolved,
) -> (Option<Problem>, Option<(String, String)>, Option<Health>) {
    use super::reasons::{BACKUP_FAILING, RESTORE_SOURCE_UNAVAILABLE, WAL_ARCHIVING_FAILING};
    use devctl_api::instance::InstanceStatus;
    let reports: Vec<InstanceStatus> = pods
        .iter()
        .filter_map(|p| InstanceStatus::from_annotations(p.metadata.annotations.as_ref()))
        .collect();
    let last_completed = reports
        .iter()
        .filter_map(|r| r.backup.as_ref())
        .filter(|b| b.phase == "Completed")
        .filter_map(|b| Some((b.stopped_at.clone()?, b.name.clone())))
        .max();
    let newest = reports
        .iter()
        .filter_map(|r| r.backup.as_ref())
        .max_by(|a, b| a.started_at.cmp(&b.started_at));
    let archive_failing = reports
        .iter()
        .filter_map(|r| r.wal_archive.as_ref())
        .find(|w| w.failing);
    let archived_at = reports
        .iter()
        .filter_map(|r| r.wal_archive.as_ref())
        .filter(|w| !w.failing)
        .filter_map(|w| w.last_archived_at.clone())
        .max();
    // A failed backup counts until a newer backup is reported (or, see `Health`, the store
    // it failed on is back).
    let failed = newest.filter(|b| b.phase == "Failed");
    let store_took_wal_since_the_failure = store.destination_problem.is_none()
        && failed.is_some_and(|failed| {
            let ended = failed.stopped_at.as_ref().or(failed.started_at.as_ref());
            archived_at.as_ref().is_some_and(|at| Some(at) > ended)
        });
    let backup_failing = store.destination_problem.clone().or_else(|| {
        failed.map(|failed| {
            format!(
                "the last backup {} failed: {}",
                failed.name,
                failed.error.as_deref().unwrap_or("no reason given")
            )
        })
    });
    let wal_archiving_failing = archive_failing.map(|archive| {
        format!(
            "WAL archiving fails: {}",
            archive.error.as_deref().unwrap_or("no reason given")
        )
    });
    let problem = if let Some(why) = &store.destination_problem {
        Some((BACKUP_FAILING, why.clone()))
    } else if let Some(why) = &wal_archiving_failing {
        Some((WAL_ARCHIVING_FAILING, why.clone()))
    } else if let Some(why) = &backup_failing {
        Some((BACKUP_FAILING, why.clone()))
    } else {
        store
            .restore_problem
            .as_ref()
            .map(|why| (RESTORE_SOURCE_UNAVAILABLE, format!("cannot restore: {why}")))
    };
    let configured = store.destination.is_some() || store.destination_problem.is_some();
    let health = configured.then_some(Health {
        backup_failing,
        wal_archiving_failing,
        store_took_wal_since_the_failure,
    });
    (problem, last_completed, health)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_backup_and_failing_archiving_are_reported_each_on_its_own() {
        use devctl_api::instance::{
            BackupReport, InstanceStatus, STATUS_ANNOTATION, WalArchiveReport,
        };
        let pod = |archive: WalArchiveReport| {
            let report = InstanceStatus {
                backup: Some(BackupReport {
                    name: "b1".into(),
                    phase: "Failed".into(),
                    started_at: Some("2026-12-01T10:00:00Z".into()),
                    stopped_at: Some("2026-12-01T10:01:00Z".into()),
                    error: Some("store unreachable".into()),
                    ..Default::default()
                }),
                wal_archive: Some(archive),
                ..Default::default()
            };
            let mut pod = k8s_openapi::api::core::v1::Pod::default();
            pod.metadata.annotations = Some(
                [(
                    STATUS_ANNOTATION.to_string(),
                    serde_json::to_string(&report).unwrap(),
                )]
                .into(),
            );
            pod
        };
        let configured = Resolved {
            destination_problem: None,
            destination: Some(Store {
                location: Default::default(),
                access_key_id: String::new(),
                secret_access_key: String::new(),
                ca: None,
            }),
            ..Resolved::default()
        };
        let down = pod(WalArchiveReport {
            last_archived_at: Some("2026-12-01T09:59:00Z".into()),
            failing: true,
            error: Some("store unreachable".into()),
            ..Default::default()
        });
        let (problem, _, health) = observe(&[&down], &configured);
        let health = health.unwrap();
        assert!(!health.store_took_wal_since_the_failure);
        assert!(health.backup_failing.unwrap().contains("b1 failed"));
        assert!(health.wal_archiving_failing.is_some());
        assert_eq!(
            problem.unwrap().0,
            super::super::status::WAL_ARCHIVING_FAILING
        );
        let back = pod(WalArchiveReport {
            last_archived_at: Some("2026-12-01T10:05:00Z".into()),
            failing: false,
            ..Default::default()
        });
        // The failure still stands here: only the status knows whether the store was down
        // when it failed.
        let (problem, _, health) = observe(&[&back], &configured);
        let health = health.unwrap();
        assert!(health.store_took_wal_since_the_failure);
        assert!(health.backup_failing.is_some() && health.wal_archiving_failing.is_none());
        assert_eq!(problem.unwrap().0, super::super::status::BACKUP_FAILING);
        // Without backups configured there is nothing to say.
        assert_eq!(observe(&[&back], &Resolved::default()).2, None);
    }

    #[test]
    fn every_cluster_has_its_own_prefix() {
        assert_eq!(cluster_prefix("", "prod", "db"), "prod/db/");
        assert_eq!(cluster_prefix("/team/", "prod", "db"), "team/prod/db/");
    }

    #[test]
    fn debug_output_never_shows_keys() {
        let store = Store {
            location: StoreLocation::default(),
            access_key_id: "AKIDSECRET".into(),
            secret_access_key: "verysecret".into(),
            ca: None,
        };
        let shown = format!("{store:?}");
        assert!(!shown.contains("AKIDSECRET") && !shown.contains("verysecret"));
    }
}
