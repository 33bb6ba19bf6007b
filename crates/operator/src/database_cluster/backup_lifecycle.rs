//! The async shell around [`super::schedule`]: creates scheduled `DatabaseBackup`s, prunes
//! expired ones (their files in the store first, then the objects), and takes the final
//! backup when a cluster is deleted (docs/backup.md).

use std::time::Duration;

use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use devctl_api::database_cluster::DatabaseCluster;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::json;

use super::backup;
use super::resources::Names;
use super::schedule;
use super::store::{Store, client, scrub};
use crate::context::Context;
use crate::reconciler::publish;

/// Label on the DatabaseBackups a cluster's schedule (or its deletion) creates.
pub const CLUSTER_LABEL: &str = "db.devctl.io/cluster";
/// Label with the uid of the cluster a DatabaseBackup was made of (also
/// `status.clusterUID`): a later cluster of the same name never takes it for its own.
pub const CLUSTER_UID_LABEL: &str = "db.devctl.io/cluster-uid";
/// Label `"true"` on a DatabaseBackup no retention rule removes (the backup a major upgrade
/// takes first): it stays until a user deletes it.
pub const KEEP_LABEL: &str = "db.devctl.io/keep";

/// Whether retention keeps `backup` whatever its rules say ([`KEEP_LABEL`]).
pub fn kept_until_deleted(backup: &DatabaseBackup) -> bool {
    backup.labels().get(KEEP_LABEL).is_some_and(|v| v == "true")
}

/// Creates the backup a major upgrade takes first (unless it exists): not owned by the
/// cluster and labelled [`KEEP_LABEL`], so neither retention nor the cluster's deletion
/// removes it.
pub async fn create_pre_upgrade_backup(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
    name: &str,
) -> Result<(), String> {
    let Some(mut object) = backup_object(db, name, false) else {
        return Err(format!("DatabaseBackup {name}: the cluster has no uid yet"));
    };
    object
        .labels_mut()
        .insert(KEEP_LABEL.to_string(), "true".to_string());
    create_once(ctx, &names.namespace, &object)
        .await
        .map(|_| ())
}

/// The uid of the cluster `backup` was made of, as recorded (status, else label).
pub fn recorded_cluster_uid(backup: &DatabaseBackup) -> Option<&str> {
    backup
        .status
        .as_ref()
        .and_then(|s| s.cluster_uid.as_deref())
        .or_else(|| {
            backup
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CLUSTER_UID_LABEL))
                .map(String::as_str)
        })
}

/// Whether `backup` is the cluster `uid`'s own for retention: recorded as made of it; one
/// made before uids were recorded, when the store's `owner.json` at the cluster's prefix
/// (`legacy_owner`) names this cluster. Any other is kept, whatever its age (pure).
pub fn belongs_to(backup: &DatabaseBackup, uid: &str, legacy_owner: Option<&str>) -> bool {
    match recorded_cluster_uid(backup) {
        Some(recorded) => recorded == uid,
        None => legacy_owner == Some(uid),
    }
}

/// What the schedule did in this reconcile.
#[derive(Debug, Clone, Default)]
pub struct Scheduled {
    pub last: Option<String>,
    pub next: Option<String>,
    /// When to look again (the next scheduled time).
    pub wait: Option<Duration>,
    pub problem: Option<(&'static str, String)>,
}

fn backup_object(db: &DatabaseCluster, name: &str, owned: bool) -> Option<DatabaseBackup> {
    let mut metadata = json!({
        "name": name,
        "labels": { CLUSTER_LABEL: db.name_any(), CLUSTER_UID_LABEL: db.uid()? },
    });
    if owned {
        metadata["ownerReferences"] = json!([db.controller_owner_ref(&())?]);
    }
    serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseBackup",
        "metadata": metadata,
        "spec": { "cluster": { "name": db.name_any() } },
    }))
    .ok()
}

/// Creates the backup `name` unless it exists; whether it was created.
async fn create_once(
    ctx: &Context,
    namespace: &str,
    backup: &DatabaseBackup,
) -> Result<bool, String> {
    let api: Api<DatabaseBackup> = Api::namespaced(ctx.client.clone(), namespace);
    match api.create(&PostParams::default(), backup).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(format!(
            "creating DatabaseBackup {}: {e}",
            backup.name_any()
        )),
    }
}

/// One schedule step: at most one backup for the latest scheduled time that has passed.
pub async fn schedule_step(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
    store: &backup::Resolved,
) -> Scheduled {
    let previous = db.status.clone().unwrap_or_default();
    let mut scheduled = Scheduled {
        last: previous.last_scheduled_backup.clone(),
        ..Scheduled::default()
    };
    let Some(spec) = db.spec.backup.as_ref().filter(|b| b.enabled) else {
        return scheduled; // paused: no next run
    };
    if store.destination.is_none() {
        return scheduled;
    }
    let cron = match schedule::parse(&spec.schedule) {
        Ok(cron) => cron,
        Err(why) => {
            scheduled.problem = Some((super::reasons::BACKUP_FAILING, why));
            return scheduled;
        }
    };
    let now = Timestamp::now();
    let created = db
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(now);
    let last = previous
        .last_scheduled_backup
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .unwrap_or(created);
    let due = schedule::due(&cron, last, now);
    if let Some(run) = due.run {
        let name = schedule::backup_name(&names.name, run);
        match backup_object(db, &name, !spec.keep_backups_on_delete) {
            Some(object) => match create_once(ctx, &names.namespace, &object).await {
                Ok(created) => {
                    if created {
                        publish(
                            ctx,
                            db,
                            EventType::Normal,
                            "ScheduledBackup",
                            // One event per backup: the recorder folds one action's repeats.
                            &format!("Schedule {name}"),
                            format!("Created DatabaseBackup {name} for the scheduled time {run}"),
                        )
                        .await;
                    }
                    scheduled.last = Some(run.to_string());
                }
                Err(why) => scheduled.problem = Some((super::reasons::BACKUP_FAILING, why)),
            },
            None => {
                scheduled.problem = Some((
                    super::reasons::BACKUP_FAILING,
                    "the cluster has no uid yet".into(),
                ))
            }
        }
    }
    if let Some(next) = due.next {
        scheduled.next = Some(next.to_string());
        scheduled.wait = Some(
            Duration::try_from(next.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO),
        );
    }
    scheduled
}

/// The oldest WAL a kept completed backup needs, per store prefix — any backup of this
/// name, this cluster's or not: WAL under a prefix one of them needs stays (pure).
fn oldest_wal_kept(
    named: &[DatabaseBackup],
    expired_names: &[String],
    location: &devctl_api::instance::StoreLocation,
) -> std::collections::BTreeMap<String, String> {
    named
        .iter()
        .filter(|b| !expired_names.contains(&b.name_any()))
        .filter_map(|b| b.status.as_ref())
        .filter(|s| s.phase == Some(BackupPhase::Completed))
        .filter_map(|s| {
            Some((
                deletable_prefix(s, location)?.to_string(),
                s.begin_wal.clone()?,
            ))
        })
        .fold(
            std::collections::BTreeMap::<String, String>::new(),
            |mut m, (p, w)| {
                let e = m.entry(p).or_insert(w.clone());
                if w < *e {
                    *e = w;
                }
                m
            },
        )
}

/// Deletes one expired backup: its files (a completed one recorded under the cluster's
/// destination), then the object, then says so (event `BackupExpired`).
async fn expire(
    db: &DatabaseCluster,
    ctx: &Context,
    api: &Api<DatabaseBackup>,
    s3: &dyn ObjectStore,
    destination: &Store,
    backup: &DatabaseBackup,
) -> Result<(), String> {
    let Some(spec) = db.spec.backup.as_ref() else {
        return Ok(());
    };
    let status = backup.status.clone().unwrap_or_default();
    if status.phase == Some(BackupPhase::Completed)
        && deletable_prefix(&status, &destination.location).is_none()
    {
        // Recorded at another store or prefix (the destination changed since): its files
        // are not this client's to delete, and the object is their only record — kept.
        tracing::warn!(
            backup = %backup.name_any(),
            "expired, but recorded outside the cluster's destination: kept with its files"
        );
        return Ok(());
    }
    if let (Some(prefix), Some(id)) = (
        deletable_prefix(&status, &destination.location),
        &status.backup_id,
    ) && status.phase == Some(BackupPhase::Completed)
        && let Err(why) = delete_under(s3, &format!("{prefix}base/{id}/"), |_| false).await
    {
        return Err(scrub(why, destination));
    }
    match api
        .delete(&backup.name_any(), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            return Err(format!(
                "deleting DatabaseBackup {}: {e}",
                backup.name_any()
            ));
        }
    }
    publish(
        ctx,
        db,
        EventType::Normal,
        "BackupExpired",
        &format!("Expire {}", backup.name_any()),
        format!(
            "Deleted backup {} (retention: {})",
            backup.name_any(),
            schedule::policy(spec.keep_last, spec.retention_days())
        ),
    )
    .await;
    Ok(())
}

/// The uid the store's `owner.json` at the cluster prefix `prefix` names (written by the
/// first cluster of this name to back up there), if any.
async fn legacy_owner(s3: &dyn ObjectStore, prefix: &str) -> Result<Option<String>, String> {
    let path = StorePath::from(format!("{prefix}owner.json").as_str());
    match s3.get(&path).await {
        Ok(result) => {
            let bytes = result
                .bytes()
                .await
                .map_err(|e| format!("reading {path}: {e}"))?;
            #[derive(serde::Deserialize)]
            struct Owner {
                uid: String,
            }
            Ok(serde_json::from_slice::<Owner>(&bytes).ok().map(|o| o.uid))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(format!("reading {path}: {e}")),
    }
}

/// Deletes every object under `prefix` for which `keep(name)` is false.
async fn delete_under(
    s3: &dyn ObjectStore,
    prefix: &str,
    keep: impl Fn(&str) -> bool,
) -> Result<usize, String> {
    let path = StorePath::from(prefix.trim_end_matches('/'));
    let mut listing = s3.list(Some(&path));
    let mut deleted = 0;
    while let Some(entry) = listing.next().await {
        let entry = entry.map_err(|e| format!("listing {prefix}: {e}"))?;
        let name = entry.location.filename().unwrap_or_default().to_string();
        if keep(&name) {
            continue;
        }
        s3.delete(&entry.location)
            .await
            .map_err(|e| format!("deleting {}: {e}", entry.location))?;
        deleted += 1;
    }
    Ok(deleted)
}

/// The store prefix under which retention may delete a backup's files with the client of
/// `destination`: the one its status records, only when that is at the same endpoint and
/// bucket and is the destination's cluster prefix plus a digits-only system identifier
/// (never where a pod's report pointed elsewhere, never another cluster's) (pure).
pub fn deletable_prefix<'b>(
    status: &'b devctl_api::database_backup::DatabaseBackupStatus,
    destination: &devctl_api::instance::StoreLocation,
) -> Option<&'b str> {
    let prefix = status.prefix.as_deref()?;
    let same_store = status.endpoint.as_deref() == Some(destination.endpoint.as_str())
        && status.bucket.as_deref() == Some(destination.bucket.as_str());
    let under = prefix
        .strip_prefix(destination.prefix.as_str())
        .and_then(|rest| rest.strip_suffix('/'))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()));
    (same_store && under).then_some(prefix)
}

/// The DatabaseBackups of `namespace` from the DatabaseBackup controller's store, once it
/// has listed them all (`None` before, or when that controller does not run here). A
/// cache that lags is safe for retention: what it may miss are the newest backups, which
/// neither expire first nor begin before the WAL a kept backup needs.
fn backups_in(ctx: &Context, namespace: &str) -> Option<Vec<DatabaseBackup>> {
    let store = ctx.caches.shared_store::<DatabaseBackup>()?;
    Some(
        store
            .state()
            .iter()
            .filter(|b| b.metadata.namespace.as_deref() == Some(namespace))
            .map(|b| DatabaseBackup::clone(b))
            .collect(),
    )
}

/// Retention: removes expired backups — their files, the WAL no kept backup needs, then the
/// objects. Problems are reported, never fatal to the reconcile.
pub async fn prune(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
    store: &backup::Resolved,
) -> Option<String> {
    let spec = db.spec.backup.as_ref().filter(|b| b.enabled)?;
    let destination = store.destination.as_ref()?;
    let api: Api<DatabaseBackup> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let all = match backups_in(ctx, &names.namespace) {
        Some(cached) => cached,
        None => match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => return Some(format!("listing DatabaseBackups: {e}")),
        },
    };
    let uid = db.uid().unwrap_or_default();
    let named: Vec<DatabaseBackup> = all
        .into_iter()
        .filter(|b| b.spec.cluster.name == names.name)
        .collect();
    let s3 = match client(destination) {
        Ok(s3) => s3,
        Err(why) => return Some(scrub(why, destination)),
    };
    // Backups from before uids were recorded: the cluster whose owner.json the store has at
    // this cluster's prefix made them (read only when there are any).
    let legacy_owner = if named.iter().any(|b| recorded_cluster_uid(b).is_none()) {
        match legacy_owner(s3.as_ref(), &destination.location.prefix).await {
            Ok(owner) => owner,
            Err(why) => return Some(scrub(why, destination)),
        }
    } else {
        None
    };
    let mine: Vec<DatabaseBackup> = named
        .iter()
        .filter(|b| belongs_to(b, &uid, legacy_owner.as_deref()))
        .filter(|b| !kept_until_deleted(b))
        .cloned()
        .collect();
    let expired = schedule::expired(
        &mine,
        spec.keep_last,
        spec.retention_days(),
        Timestamp::now(),
    );
    if expired.is_empty() {
        return None;
    }
    let expired_names: Vec<String> = expired.iter().map(|b| b.name_any()).collect();
    let kept_begin = oldest_wal_kept(&named, &expired_names, &destination.location);
    for backup in &expired {
        if let Err(why) = expire(db, ctx, &api, s3.as_ref(), destination, backup).await {
            return Some(why);
        }
    }
    // WAL older than what the oldest kept backup begins with (history files stay) — not
    // while a backup is under way: it may begin earlier than every completed one.
    let unfinished = named.iter().any(|b| {
        !b.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(BackupPhase::is_final)
    });
    if unfinished {
        return None;
    }
    // Only under this cluster's own prefixes (where a backup of its uid lives): a
    // predecessor's WAL is never pruned by its successor.
    let my_prefixes: std::collections::BTreeSet<String> = mine
        .iter()
        .filter_map(|b| deletable_prefix(b.status.as_ref()?, &destination.location))
        .map(str::to_string)
        .collect();
    for (prefix, begin) in kept_begin
        .into_iter()
        .filter(|(prefix, _)| my_prefixes.contains(prefix))
    {
        let keep = |name: &str| {
            name.ends_with(".history") || name.get(..24).is_none_or(|s| s >= begin.as_str())
        };
        if let Err(why) = delete_under(s3.as_ref(), &format!("{prefix}wal/"), keep).await {
            return Some(scrub(why, destination));
        }
    }
    None
}

/// Whether `backup` (the fixed-name final backup) was made for the deletion of `db` under way,
/// not left by an earlier cluster of the same name: made no earlier than the deletion (both
/// times are the API server's, to the second).
pub fn taken_for_this_deletion(backup: &DatabaseBackup, db: &DatabaseCluster) -> bool {
    match (
        backup.metadata.creation_timestamp.as_ref(),
        db.metadata.deletion_timestamp.as_ref(),
    ) {
        (Some(created), Some(deleted)) => created.0 >= deleted.0,
        _ => false,
    }
}

/// Deletion with `finalBackup: true`: takes the final backup (not owned by the cluster, so
/// it outlives it) and waits for it within `finalBackupTimeout` of the deletion. `None` when
/// deletion may go on; `Some(wait)` to look again.
pub async fn final_backup(db: &DatabaseCluster, ctx: &Context, names: &Names) -> Option<Duration> {
    let spec = db
        .spec
        .backup
        .as_ref()
        .filter(|b| b.enabled && b.final_backup)?;
    let timeout = devctl_api::database_cluster::parse_duration(&spec.final_backup_timeout)
        .unwrap_or(Duration::from_secs(600));
    let deleted_at = db.metadata.deletion_timestamp.as_ref()?.0;
    let elapsed =
        Duration::try_from(Timestamp::now().duration_since(deleted_at)).unwrap_or_default();
    let name = schedule::final_backup_name(&names.name);
    let api: Api<DatabaseBackup> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let skip = |why: String| async move {
        publish(
            ctx,
            db,
            EventType::Warning,
            "FinalBackupSkipped",
            "Delete",
            format!("No final backup: {why}; deleting the cluster"),
        )
        .await;
        None
    };
    let existing = match api.get_opt(&name).await {
        Ok(b) => b,
        Err(e) => return skip(format!("reading DatabaseBackup {name}: {e}")).await,
    };
    let existing = match existing {
        Some(b) => b,
        None => {
            // Deleted before it ever made a data volume (admitted with the finalizer and
            // deleted before its first reconcile, say): there is nothing to back up, and
            // waiting for a backup of a database that never ran would only hold the deletion.
            match super::claims::live_data_claims(ctx, names).await {
                Ok(claims) if claims.is_empty() => {
                    publish(
                        ctx,
                        db,
                        EventType::Normal,
                        "FinalBackupSkipped",
                        "Delete",
                        "No final backup: the cluster never made a data volume, so it holds no data; deleting the cluster".into(),
                    )
                    .await;
                    return None;
                }
                Ok(_) => {}
                Err(e) => return skip(format!("listing the cluster's data volumes: {e}")).await,
            }
            let Some(object) = backup_object(db, &name, false) else {
                return skip("the cluster has no uid".into()).await;
            };
            if let Err(why) = create_once(ctx, &names.namespace, &object).await {
                return skip(why).await;
            }
            publish(
                ctx,
                db,
                EventType::Normal,
                "FinalBackup",
                "Delete",
                format!(
                    "Taking the final backup {name} (at most {}s)",
                    timeout.as_secs()
                ),
            )
            .await;
            return Some(Duration::from_secs(2));
        }
    };
    if !taken_for_this_deletion(&existing, db) {
        // The name is fixed and the backup outlives its cluster: this one is an earlier
        // cluster's of the same name. It is left alone (it is that cluster's data), and no
        // final backup of this one can be taken under the name.
        return skip(format!(
            "DatabaseBackup {name} is an earlier cluster's final backup (created before this deletion)"
        ))
        .await;
    }
    match existing.status.as_ref().and_then(|s| s.phase) {
        Some(BackupPhase::Completed) => None,
        Some(BackupPhase::Failed) => {
            let why = existing
                .status
                .as_ref()
                .and_then(|s| s.message.clone())
                .unwrap_or_else(|| "it failed".into());
            skip(format!("the final backup {name} failed: {why}")).await
        }
        _ if elapsed >= timeout => {
            skip(format!(
                "the final backup {name} did not finish within spec.backup.finalBackupTimeout ({})",
                spec.final_backup_timeout
            ))
            .await
        }
        _ => Some(
            Duration::from_secs(2).min(
                timeout
                    .saturating_sub(elapsed)
                    .max(Duration::from_millis(200)),
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_counts_only_the_backups_of_this_cluster_uid() {
        let backup = |label: Option<&str>, status: Option<&str>| -> DatabaseBackup {
            let mut b: DatabaseBackup = serde_json::from_value(serde_json::json!({
                "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseBackup",
                "metadata": { "name": "db-x", "namespace": "ns" },
                "spec": { "cluster": { "name": "db" } }
            }))
            .unwrap();
            if let Some(uid) = label {
                b.metadata.labels = Some([(CLUSTER_UID_LABEL.to_string(), uid.to_string())].into());
            }
            if let Some(uid) = status {
                b.status = Some(devctl_api::database_backup::DatabaseBackupStatus {
                    cluster_uid: Some(uid.into()),
                    ..Default::default()
                });
            }
            b
        };
        assert!(belongs_to(&backup(Some("new"), None), "new", None));
        assert!(belongs_to(&backup(None, Some("new")), "new", Some("old")));
        // An earlier cluster of the same name (its -final backup): never.
        assert!(!belongs_to(
            &backup(Some("old"), Some("old")),
            "new",
            Some("new")
        ));
        // Made before uids were recorded: the owner.json decides; without one, kept.
        assert!(belongs_to(&backup(None, None), "new", Some("new")));
        assert!(!belongs_to(&backup(None, None), "new", Some("old")));
        assert!(!belongs_to(&backup(None, None), "new", None));
    }

    #[test]
    fn retention_deletes_only_under_the_destinations_cluster_prefix() {
        use devctl_api::database_backup::DatabaseBackupStatus;
        use devctl_api::instance::StoreLocation;
        let destination = StoreLocation {
            endpoint: "https://s3".into(),
            bucket: "b".into(),
            prefix: "devctl/ns/db/".into(),
            region: String::new(),
        };
        let status = |endpoint: &str, bucket: &str, prefix: &str| DatabaseBackupStatus {
            endpoint: Some(endpoint.into()),
            bucket: Some(bucket.into()),
            prefix: Some(prefix.into()),
            ..DatabaseBackupStatus::default()
        };
        let ok = status("https://s3", "b", "devctl/ns/db/7400000000000000001/");
        assert_eq!(
            deletable_prefix(&ok, &destination),
            Some("devctl/ns/db/7400000000000000001/")
        );
        for other in [
            status("https://s3", "b", "devctl/ns/other/7400000000000000001/"),
            status("https://s3", "b", "devctl/ns/db/../other/"),
            status("https://s3", "b", "devctl/ns/db/"),
            status(
                "https://elsewhere",
                "b",
                "devctl/ns/db/7400000000000000001/",
            ),
            status("https://s3", "c", "devctl/ns/db/7400000000000000001/"),
        ] {
            assert_eq!(deletable_prefix(&other, &destination), None, "{other:?}");
        }
    }

    #[test]
    fn a_final_backup_counts_only_when_made_for_this_deletion() {
        let at = |second: i64| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(second).unwrap(),
            )
        };
        let mut db: DatabaseCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
            "metadata": { "name": "db", "namespace": "ns" },
            "spec": { "engine": "postgres", "version": "16.2", "replicas": 1, "storage": { "size": "1Gi" } }
        }))
        .unwrap();
        let mut backup: DatabaseBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseBackup",
            "metadata": { "name": "db-final", "namespace": "ns" },
            "spec": { "cluster": { "name": "db" } }
        }))
        .unwrap();
        backup.metadata.creation_timestamp = Some(at(1_000));
        // Not being deleted: no deletion to have made it for.
        assert!(!taken_for_this_deletion(&backup, &db));
        db.metadata.deletion_timestamp = Some(at(1_000));
        assert!(taken_for_this_deletion(&backup, &db), "same second");
        db.metadata.deletion_timestamp = Some(at(999));
        assert!(taken_for_this_deletion(&backup, &db));
        // An earlier cluster of the same name left it.
        db.metadata.deletion_timestamp = Some(at(5_000));
        assert!(!taken_for_this_deletion(&backup, &db));
    }
}
