//! The contract between `devctl-agent` (inside every database pod), the operator, the CLI
//! and the test runner: the environment an agent is started with and the report it writes
//! on its own pod.
//!
//! The agent talks only to the API server: it reports by patching the annotation
//! [`STATUS_ANNOTATION`] of its own pod (annotations, not pod conditions, because kwok
//! overwrites pod conditions), and the operator turns those reports into
//! `status.instances`. Only the operator writes any `status`.

use serde::{Deserialize, Serialize};

/// Annotation on a database pod holding the agent's [`InstanceStatus`] as JSON.
pub const STATUS_ANNOTATION: &str = "db.devctl.io/instance-status";

/// Environment variables the operator sets on the database container and the agent reads.
/// Paths are the container's mount paths; the process runner of `devctl-testenv` maps every
/// value under a volume's mount path to that volume's local directory.
pub mod env {
    /// `postgres` or `mysql`.
    pub const ENGINE: &str = "DEVCTL_ENGINE";
    /// Name of the DatabaseCluster the pod belongs to.
    pub const CLUSTER: &str = "DEVCTL_CLUSTER";
    /// The credentials Secret (`username`, `password`, `dbname`) the agent keeps roles in
    /// line with.
    pub const CREDENTIALS_SECRET: &str = "DEVCTL_CREDENTIALS_SECRET";
    /// The pod's name, namespace, UID and IP (downward API).
    pub const POD_NAME: &str = "POD_NAME";
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    pub const POD_UID: &str = "POD_UID";
    pub const POD_IP: &str = "POD_IP";
    /// Where the data directory lives (a subdirectory of the claim's mount: a volume's root
    /// may hold `lost+found`, which `initdb` refuses).
    pub const DATA_DIR: &str = "DEVCTL_DATA_DIR";
    /// The operator's rendered configuration (the ConfigMap's mount).
    pub const CONFIG_DIR: &str = "DEVCTL_CONFIG_DIR";
    /// A private, writable directory for sockets, the pid file and passfiles.
    pub const RUN_DIR: &str = "DEVCTL_RUN_DIR";
    /// The engine's TCP port and listen address.
    pub const PORT: &str = "DEVCTL_PORT";
    pub const LISTEN_ADDRESS: &str = "DEVCTL_LISTEN_ADDRESS";
    /// Port of the agent's `/healthz` and `/readyz`.
    pub const HEALTH_PORT: &str = "DEVCTL_HEALTH_PORT";
    /// The Secret (`username`, `password`) of the replication role.
    pub const REPLICATION_SECRET: &str = "DEVCTL_REPLICATION_SECRET";
    /// How a replica finds the primary's address: `service` (the `-rw` Service's DNS name,
    /// on a real cluster) or `annotation` (the `address` in the primary pod's report, under
    /// the test runner, where Service names do not resolve).
    pub const PRIMARY_FROM: &str = "DEVCTL_PRIMARY_FROM";
    /// Optional, with `service`: the primary's host name; default
    /// `<DEVCTL_CLUSTER>-rw.<POD_NAMESPACE>.svc`.
    pub const PRIMARY_SERVICE_HOST: &str = "DEVCTL_PRIMARY_SERVICE_HOST";
    /// Optional: the directory holding the engine's binaries (`postgres`, `initdb`, ...;
    /// `mariadbd`/`mysqld`, ...). Without it the agent searches `PATH`, then Debian's
    /// `/usr/lib/postgresql/*/bin`.
    pub const ENGINE_BIN_DIR: &str = "DEVCTL_ENGINE_BIN_DIR";
    /// Optional, PostgreSQL's upgrade step: colon-separated roots under which an older
    /// major's binaries are `<root>/<major>/bin` (default `/usr/lib/postgresql`).
    pub const POSTGRES_BIN_ROOTS: &str = "DEVCTL_POSTGRES_BIN_ROOTS";
    /// `recovery`: the first instance restores from a backup (docs/backup.md) instead of
    /// initialising, and waits for [`super::RESTORE_ANNOTATION`].
    pub const BOOTSTRAP: &str = "DEVCTL_BOOTSTRAP";
}

/// The health port's default and the engines' default ports.
pub const DEFAULT_HEALTH_PORT: u16 = 8008;

/// What the agent observed of its instance, written to [`STATUS_ANNOTATION`] on its pod. The
/// report's documented keys (`role` to `lastError`) are always written, `null` when unknown or
/// not applicable (a primary has no received or replayed position, MariaDB no timeline), so a
/// reader can tell "not known" from a report of another version; the later keys only when set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// `primary` or `replica` as the engine itself reports it (`pg_is_in_recovery()`).
    #[serde(default)]
    pub role: Option<String>,
    /// The engine accepts connections (and, for the app role, logins).
    #[serde(default)]
    pub ready: bool,
    /// PostgreSQL's database system identifier (stays the same across restarts on the same
    /// data); MySQL reports its `server_uuid`, MariaDB (which has none) the identifier the agent
    /// keeps in its data directory (`.devctl-system-identifier`, what its backups are filed under).
    #[serde(default)]
    pub system_identifier: Option<String>,
    #[serde(default)]
    pub timeline: Option<i64>,
    #[serde(default, rename = "receivedLSN")]
    pub received_lsn: Option<String>,
    #[serde(default, rename = "replayedLSN")]
    pub replayed_lsn: Option<String>,
    #[serde(default)]
    pub lag_bytes: Option<i64>,
    /// MariaDB: the GTIDs applied (`gtid_current_pos`); a failover elects the replica with
    /// the highest ([`crate::gtid::Position`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid_position: Option<String>,
    /// A MariaDB primary that was promoted: its `gtid_current_pos` then. A returning former
    /// primary's transactions past it are errant (the new primary never had them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promotion_position: Option<String>,
    /// MariaDB replicas: `Seconds_Behind_Master` (null while the replication threads stop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<i64>,
    /// A MariaDB primary: `host:port` where its agent streams a copy of its data
    /// (`mariadb-backup`) to a replica that clones it, authenticated with the replication
    /// password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_address: Option<String>,
    /// A MariaDB primary with semi-synchronous replication on: `false` once the engine fell
    /// back to asynchronous (`Rpl_semi_sync_master_status` OFF).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semi_sync_active: Option<bool>,
    /// The running engine's version (`server_version`), e.g. `15.18`.
    #[serde(default)]
    pub engine_version: Option<String>,
    /// `host:port` where the engine listens.
    #[serde(default)]
    pub address: Option<String>,
    /// When the agent wrote this report (RFC 3339, UTC).
    #[serde(default)]
    pub heartbeat: Option<String>,
    /// The last error, one line, never holding a secret; null when healthy.
    #[serde(default)]
    pub last_error: Option<String>,
    /// The shutdown checkpoint of a primary stopped for a switchover: the target promotes only
    /// once it has received WAL up to here, so nothing written is lost.
    #[serde(default, rename = "finalLSN", skip_serializing_if = "Option::is_none")]
    pub final_lsn: Option<String>,
    /// `resourceVersion` of the credentials Secret whose passwords the roles now have; the
    /// operator clears `CredentialsRegenerated` once every instance reports the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_version: Option<String>,
    /// Failover: the `status.failoverEpoch` for which this replica has stopped its WAL
    /// receiver; its `timeline`, `receivedLSN` and `replayedLSN` are then final, and the
    /// operator elects the most advanced replica from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_epoch: Option<i64>,
    /// The copy of this instance's earlier data a failed rejoin moved aside (a path on its
    /// volume; at most one is kept): it may hold commits the primary never received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_aside: Option<String>,
    /// The backup this instance runs or ran last (docs/backup.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupReport>,
    /// The primary's WAL archiving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_archive: Option<WalArchiveReport>,
    /// A PostgreSQL primary: the pods whose replicas stream from it now (empty when none
    /// does). The operator counts a replica ready only while the current primary lists it,
    /// so a replica's report from before the primary restarted cannot make the cluster Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming_replicas: Option<Vec<String>>,
    /// A PostgreSQL primary: the physical replication slots it keeps for its replicas
    /// (`devctl_<pod>`, docs/replication.md). A replica streams through its slot only once
    /// the primary lists it, so a primary run by an older agent is never asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_slots: Option<Vec<String>>,
    /// How often the agent restarted the engine after it exited on its own (crashed, was
    /// killed) since the agent started; absent before the first time. A crash the agent
    /// heals within a second stays visible here after `lastError` is clear again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<i32>,
    /// When the engine last exited on its own (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_time: Option<String>,
    /// How it exited then, one line (e.g. `postgres exited (signal: 9 (SIGKILL))`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
}

/// Annotation on every instance pod (operator-written): where backups and WAL go, JSON
/// [`StoreLocation`] without the system identifier (the agent appends it), or
/// [`BACKUP_DESTINATION_OFF`].
pub const BACKUP_DESTINATION_ANNOTATION: &str = "db.devctl.io/backup-destination";
/// The value of [`BACKUP_DESTINATION_ANNOTATION`] while backups are off: WAL is acknowledged
/// without upload. Without the annotation (a new pod the operator has not annotated yet) the
/// agent refuses to archive, so PostgreSQL keeps the WAL and retries: no silent hole.
pub const BACKUP_DESTINATION_OFF: &str = "off";
/// Annotation on the instance that takes a backup (operator-written): JSON [`BackupRequest`].
pub const BACKUP_REQUEST_ANNOTATION: &str = "db.devctl.io/backup-request";
/// Annotation on the first instance of a cluster restored from a backup (operator-written):
/// JSON [`RestoreRequest`].
pub const RESTORE_ANNOTATION: &str = "db.devctl.io/restore";

/// Annotation on the instance whose volume a major upgrade upgrades, written by its upgrade
/// step (the init container `major-upgrade`): JSON [`UpgradeResult`].
pub const MAJOR_UPGRADE_RESULT_ANNOTATION: &str = "db.devctl.io/major-upgrade-result";

/// What the upgrade step of a major upgrade came to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeResult {
    /// The version upgraded to (`status.majorUpgrade.to`): a result of another attempt is
    /// not this one's.
    pub to: String,
    /// `Upgraded`, `AlreadyDone`, `Refused`, `Failed` or `RolledBack`.
    pub result: String,
    #[serde(default)]
    pub message: String,
    /// The old data directory is whole and starts on the old major.
    #[serde(default)]
    pub old_intact: bool,
    /// When the step ended (RFC 3339, the pod's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// Suffix of the Secret with the cluster's own store credentials (`accessKeyId`,
/// `secretAccessKey`, optional `ca.crt`), and of the source store's for a restore.
pub const BACKUP_STORE_SECRET_SUFFIX: &str = "-backup-store";
pub const RESTORE_STORE_SECRET_SUFFIX: &str = "-restore-store";
pub const ACCESS_KEY_ID: &str = "accessKeyId";
pub const SECRET_ACCESS_KEY: &str = "secretAccessKey";
pub const CA_CERT: &str = "ca.crt";

/// A place in an S3-compatible store. `prefix` is empty or ends with `/`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StoreLocation {
    pub endpoint: String,
    pub bucket: String,
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub region: String,
}

/// A backup for one agent to take.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackupRequest {
    /// The DatabaseBackup's name and uid.
    pub name: String,
    pub uid: String,
    pub backup_id: String,
}

/// What the first instance of a restored cluster restores: `location.prefix` is the source
/// cluster's full prefix, system identifier included.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RestoreRequest {
    #[serde(flatten)]
    pub location: StoreLocation,
    pub backup_id: String,
    /// RFC 3339; the end of the archive when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_time: Option<String>,
}

/// An agent's account of a backup.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackupReport {
    pub name: String,
    pub uid: String,
    pub backup_id: String,
    /// `Running`, `Completed` or `Failed`.
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// `s3://<bucket>/<prefix><systemIdentifier>/base/<backupId>/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_path: Option<String>,
    /// The cluster prefix with the system identifier (`…/<systemIdentifier>/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// MariaDB: the GTID position the backup holds (what a restore replays binary logs
    /// after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid_position: Option<String>,
    #[serde(default, rename = "beginLSN", skip_serializing_if = "Option::is_none")]
    pub begin_lsn: Option<String>,
    #[serde(default, rename = "endLSN", skip_serializing_if = "Option::is_none")]
    pub end_lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    #[serde(default, rename = "beginWAL", skip_serializing_if = "Option::is_none")]
    pub begin_wal: Option<String>,
    #[serde(default, rename = "endWAL", skip_serializing_if = "Option::is_none")]
    pub end_wal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The primary's WAL archiving.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WalArchiveReport {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_archived: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_archived_at: Option<String>,
    #[serde(default)]
    pub failing: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl InstanceStatus {
    /// The report in a pod's annotations, if any and well-formed.
    pub fn from_annotations(
        annotations: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Option<Self> {
        serde_json::from_str(annotations?.get(STATUS_ANNOTATION)?).ok()
    }
}

/// Annotation on a DatabaseCluster asking for a switchover to the named pod (set by
/// `devctl db promote`; the operator removes it when the switchover is done or refused).
pub const SWITCHOVER_ANNOTATION: &str = "db.devctl.io/switchover-to";

/// Annotation (`"true"`) next to [`SWITCHOVER_ANNOTATION`] allowing a failover to the named
/// pod when the primary does not serve and no primary lock proves it lost (`devctl db
/// promote --force`): what the primary had not sent to the pod is lost, so only on request.
/// Removed with the request.
pub const FORCE_FAILOVER_ANNOTATION: &str = "db.devctl.io/force-failover";

/// Label the operator (its only writer) puts on every database pod: [`ROLE_PRIMARY`] on the pod
/// named in `status.currentPrimary`, [`ROLE_REPLICA`] on the others. The `-rw` Service
/// selects the primary by it, `-ro` the replicas.
pub const ROLE_LABEL: &str = "db.devctl.io/role";

/// Roles reported in [`InstanceStatus::role`] and set in [`ROLE_LABEL`].
pub const ROLE_PRIMARY: &str = "primary";

/// Suffix of the primary lock: the `coordination.k8s.io/v1` Lease `<cluster>-primary`
/// (created by the operator when `spec.highAvailability.enabled`; holder = the primary's pod).
/// Only its holder may run as the primary; see docs/failover.md.
pub const PRIMARY_LEASE_SUFFIX: &str = "-primary";

/// The name of a cluster's primary lock.
pub fn primary_lease_name(cluster: &str) -> String {
    format!("{cluster}{PRIMARY_LEASE_SUFFIX}")
}

/// `status.targetPrimary` while a failover waits for the replicas' final positions, before
/// the operator has elected the new primary.
pub const TARGET_PENDING: &str = "pending";
pub const ROLE_REPLICA: &str = "replica";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uses_the_documented_keys() {
        let status = InstanceStatus {
            role: Some(ROLE_PRIMARY.into()),
            ready: true,
            system_identifier: Some("7400000000000000000".into()),
            timeline: Some(1),
            received_lsn: Some("0/3000060".into()),
            replayed_lsn: Some("0/3000060".into()),
            lag_bytes: Some(0),
            engine_version: Some("15.18".into()),
            address: Some("127.0.0.1:5432".into()),
            heartbeat: Some("2026-11-30T17:00:00Z".into()),
            last_error: Some("x".into()),
            credentials_version: Some("42".into()),
            final_lsn: Some("0/3000060".into()),
            failover_epoch: Some(2),
            moved_aside: Some("/data/pgdata.old-1".into()),
            backup: None,
            wal_archive: None,
            streaming_replicas: Some(vec!["db-1".into()]),
            replication_slots: Some(vec!["devctl_db_1".into()]),
            restarts: Some(1),
            last_restart_time: Some("2026-11-30T16:59:00Z".into()),
            last_exit: Some("postgres exited (signal: 9 (SIGKILL))".into()),
            gtid_position: Some("0-1-5".into()),
            lag_seconds: Some(0),
            clone_address: Some("127.0.0.1:8008".into()),
            promotion_position: Some("0-1-3".into()),
            semi_sync_active: Some(true),
        };
        let json = serde_json::to_value(&status).unwrap();
        let mut keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "address",
                "cloneAddress",
                "credentialsVersion",
                "engineVersion",
                "failoverEpoch",
                "finalLSN",
                "gtidPosition",
                "heartbeat",
                "lagBytes",
                "lagSeconds",
                "lastError",
                "lastExit",
                "lastRestartTime",
                "movedAside",
                "promotionPosition",
                "ready",
                "receivedLSN",
                "replayedLSN",
                "replicationSlots",
                "restarts",
                "role",
                "semiSyncActive",
                "streamingReplicas",
                "systemIdentifier",
                "timeline"
            ]
        );
        let back: InstanceStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, status);
    }
}
