//! `DatabaseCluster` `db.devctl.io/v1beta1`, the storage version.

// `printcolumn(...)` repeats `type_ = "string"` by design; clippy reads that as duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A replicated PostgreSQL or MySQL database run by the devctl operator: a StatefulSet with
/// persistent storage, Services for the primary and the replicas, generated credentials
/// and engine configuration tuned from the requested resources.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "db.devctl.io",
    version = "v1beta1",
    kind = "DatabaseCluster",
    plural = "databaseclusters",
    singular = "databasecluster",
    namespaced,
    status = "DatabaseClusterStatus",
    derive = "PartialEq",
    shortname = "dbc",
    shortname = "db",
    category = "all",
    category = "devctl",
    validation = Rule::new("size(self.metadata.name) <= 50").message("metadata.name must be at most 50 characters: the names devctl derives from it (pods, claims, Services) must stay within 63"),
    validation = Rule::new("!has(self.spec.replication) || !has(self.spec.replication.synchronous) || self.spec.replication.synchronous.number < self.spec.replicas").message("spec.replication.synchronous.number must be less than spec.replicas: the primary waits for that many standbys").field_path(".spec.replication.synchronous.number"),
    validation = Rule::new("!has(self.spec.replication) || !has(self.spec.replication.synchronous) || self.spec.engine != 'mysql'").message("spec.replication.synchronous is supported for PostgreSQL and MariaDB only").field_path(".spec.replication.synchronous"),
    validation = Rule::new("!has(self.spec.highAvailability) || !self.spec.highAvailability.enabled || self.spec.engine != 'mysql'").message("spec.highAvailability.enabled: failover is supported for PostgreSQL and MariaDB only (engine mysql runs one instance)").field_path(".spec.highAvailability.enabled"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter and ending with a letter or digit (no dots)"),
    doc = "A replicated PostgreSQL or MySQL database managed by the devctl operator.",
    printcolumn(name = "Engine", type_ = "string", json_path = ".spec.engine"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    )
)]
#[serde(rename_all = "camelCase")]
// On `spec`, not the object: CRD validation ratcheting skips a rule whose subtree is
// unchanged, so status and finalizer writes of an object admitted before the rule existed
// still pass. The scale subresource changes `spec.replicas`, so `kubectl scale` is judged.
#[x_kube(
    validation = Rule::new("!has(self.highAvailability) || !self.highAvailability.enabled || (self.replicas >= 3 && self.replicas % 2 == 1)").message("spec.replicas must be odd and at least 3 when spec.highAvailability.enabled is true: a majority of the instances must survive a failure").field_path(".replicas"),
    // On create only (`oldSelf` is empty then): a cluster admitted before the rule existed
    // must stay editable, and spec.bootstrap cannot change afterwards anyway.
    validation = Rule::new("oldSelf.hasValue() || !has(self.bootstrap) || !has(self.bootstrap.recovery) || !has(self.bootstrap.recovery.targetTime) || self.engine != 'mysql'").optional_old_self(true).message("spec.bootstrap.recovery.targetTime: point-in-time recovery is supported for PostgreSQL and MariaDB only (a MySQL restore brings back the whole backup)").field_path(".bootstrap.recovery.targetTime"),
    // The rule on the field itself runs only when the old object had one: adding one later
    // is caught here.
    validation = Rule::new("has(self.bootstrap) == has(oldSelf.bootstrap)").message("spec.bootstrap is immutable: it cannot be added to or removed from an existing cluster; restore into a new cluster").field_path(".bootstrap"),
)]
pub struct DatabaseClusterSpec {
    /// Database engine: `postgres`, `mariadb` or `mysql` (one instance). Cannot be changed
    /// after creation.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("engine is immutable: create a new cluster to change engines"))]
    pub engine: Engine,

    /// Engine version as `major.minor`, e.g. `"16.2"`. Minor upgrades roll the pods; downgrades
    /// and major-version changes are refused.
    #[schemars(regex(pattern = r"^\d+\.\d+$"))]
    pub version: String,

    /// Container image; defaults to `postgres:<version>`, `mariadb:<version>` or
    /// `mysql:<version>`. Set it to use a
    /// private registry or mirror.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,

    /// Number of database instances (1-7): one primary, the rest replicas.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 7))]
    pub replicas: i32,

    /// Persistent storage for each instance.
    pub storage: StorageSpec,

    /// CPU and memory for the database container. Requests default to 250m CPU and 512Mi
    /// memory; the engine configuration (buffers, connections) is tuned from these values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Scheduled backups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,

    /// High availability: a primary lock (a Lease), self-fencing and automatic failover to
    /// the most advanced replica (PostgreSQL, MariaDB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_availability: Option<HighAvailabilitySpec>,

    /// Replication settings (PostgreSQL streaming, MariaDB GTID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationSpec>,

    /// How the data begins: a restore from a backup. Cannot be changed after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.bootstrap is immutable: restore into a new cluster"))]
    pub bootstrap: Option<BootstrapSpec>,

    /// How a major version upgrade (`spec.version` to a higher major) runs (PostgreSQL;
    /// docs/major-upgrade.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeSpec>,
}

/// How a PostgreSQL major version upgrade runs: `pg_upgrade` on the primary's volume while
/// the instances are stopped, then the replicas cloned again.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeSpec {
    /// `copy` (default): the data files are copied and the old data directory stays whole
    /// until the upgrade completes, the way back should it fail. `link`: hard links, seconds
    /// whatever the size, but once the new major has run the way back is the backup taken
    /// before the upgrade.
    #[serde(default)]
    pub method: UpgradeMethod,
    /// The image the upgrade step runs in: it must carry the old major's binaries under
    /// `/usr/lib/postgresql/<old>/bin` beside the new one's (default: the new version's
    /// image, which then must carry both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
}

/// How `pg_upgrade` moves the data files.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum UpgradeMethod {
    #[default]
    Copy,
    Link,
}

impl UpgradeMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeMethod::Copy => "copy",
            UpgradeMethod::Link => "link",
        }
    }
}

/// Where a major version upgrade is (`status.majorUpgrade`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum MajorUpgradeStep {
    /// Waiting for every instance to be ready.
    Pending,
    /// Taking the backup `<name>-pre-upgrade-<from>-<to>` and waiting for it.
    BackingUp,
    /// The primary stopped; `pg_upgrade` runs on its volume, then it starts on the new major.
    Upgrading,
    /// The primary runs the new major; the replicas are cloned from it again.
    Recloning,
    /// `pg_upgrade --check` (or a precondition) refused: nothing changed. Not tried again
    /// until `spec.version` changes.
    Refused,
    /// The upgrade failed after the primary stopped; in copy mode the old data runs again.
    /// Not tried again until `spec.version` changes.
    Failed,
}

impl MajorUpgradeStep {
    /// Refused or failed: over, on the old major.
    pub fn is_final(self) -> bool {
        matches!(self, MajorUpgradeStep::Refused | MajorUpgradeStep::Failed)
    }
}

/// A major version upgrade under way, or the last one that was refused or failed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MajorUpgradeStatus {
    /// The version upgraded from (`status.currentVersion` when it began).
    pub from: String,
    /// The version upgraded to (`spec.version`).
    pub to: String,
    pub step: MajorUpgradeStep,
    pub method: UpgradeMethod,
    /// The instance whose volume is upgraded (the primary when it began).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// The backup taken before (when backups are on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    /// When it began (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// What the step waits for, or why it was refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Streaming replication settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationSpec {
    /// Synchronous replication: a commit is acknowledged only once `number` standbys have
    /// flushed it, so a failover loses no acknowledged transaction. Asynchronous when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronous: Option<SynchronousSpec>,
}

/// Rendered as `synchronous_standby_names = '<METHOD> <number> (<the other instances>)'`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SynchronousSpec {
    /// `any` (quorum: any `number` standbys) or `first` (the first `number` by ordinal).
    #[serde(default)]
    pub method: SynchronousMethod,
    /// How many standbys must confirm each commit (at least 1, less than `spec.replicas`).
    #[serde(default = "default_synchronous_number")]
    #[schemars(range(min = 1, max = 6))]
    pub number: i32,
}

fn default_synchronous_number() -> i32 {
    1
}

/// How synchronous standbys are chosen.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SynchronousMethod {
    /// Quorum commit: any `number` of the standbys.
    #[default]
    Any,
    /// Priority: the first `number` standbys in ordinal order.
    First,
}

impl SynchronousMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            SynchronousMethod::Any => "ANY",
            SynchronousMethod::First => "FIRST",
        }
    }
}

fn default_replicas() -> i32 {
    1
}

/// Database engine.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// PostgreSQL.
    #[default]
    Postgres,
    /// MySQL: one instance, logical backups (docs/mariadb.md says why).
    Mysql,
    /// MariaDB: replicated (GTID), failover, physical backups (docs/mariadb.md).
    Mariadb,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Postgres => "postgres",
            Engine::Mysql => "mysql",
            Engine::Mariadb => "mariadb",
        }
    }

    /// Whether the engine runs replicas, a primary lock and failover (PostgreSQL, MariaDB).
    pub fn replicated(self) -> bool {
        matches!(self, Engine::Postgres | Engine::Mariadb)
    }

    /// MySQL or MariaDB: the same files, ports and clients.
    pub fn mysql_family(self) -> bool {
        matches!(self, Engine::Mysql | Engine::Mariadb)
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Persistent storage of each instance.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
// On the parent, so adding or removing the class is caught too (a rule on an optional field
// runs only when the old object had it).
#[x_kube(validation = Rule::new(
    "has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)"
).message("storage.storageClassName is immutable: it cannot be set, changed or removed after creation"))]
pub struct StorageSpec {
    /// Volume size with a binary suffix, e.g. `10Gi`. It can grow (the volumes are expanded in
    /// place when the storage class allows it) but never shrink.
    #[schemars(regex(pattern = r"^\d+(Ki|Mi|Gi|Ti)$"))]
    #[x_kube(validation = Rule::new(
        "!isQuantity(self) || !isQuantity(oldSelf) || quantity(self).compareTo(quantity(oldSelf)) >= 0"
    ).message("storage.size cannot shrink: volumes can only grow"))]
    pub size: String,

    /// Storage class of the volumes; the cluster's default class when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// Scheduled backups.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// Whether scheduled backups run (default true when the block is present).
    #[serde(default = "default_true")]
    pub enabled: bool,

    /// Cron schedule (five fields, UTC), default `0 2 * * *`.
    #[serde(default = "default_backup_schedule")]
    #[schemars(regex(pattern = r"^\s*\S+(\s+\S+){4}\s*$"))]
    pub schedule: String,

    /// Days to keep backups (1-3650). When neither this nor `keepLast` is set, 7; with
    /// `keepLast` alone, backups are kept by count only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3650))]
    pub retention: Option<i32>,

    /// Keep at most this many completed backups of the cluster, scheduled or on demand (the
    /// newest; failed ones older than the last kept go too); with `retention`, a backup goes
    /// when either rule says so — never the newest completed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub keep_last: Option<i32>,

    /// Keep the scheduled `DatabaseBackup`s (and their files) when the cluster is deleted;
    /// by default they are owned by the cluster and go with it.
    #[serde(default)]
    pub keep_backups_on_delete: bool,

    /// Take a last backup when the cluster is deleted (kept after the cluster is gone).
    #[serde(default)]
    pub final_backup: bool,

    /// How long deletion waits for the final backup, e.g. `10m` (default), `90s`, `2h` or
    /// `1h30m`; then a Warning event `FinalBackupSkipped` and the deletion goes on.
    #[serde(default = "default_final_backup_timeout")]
    #[schemars(regex(
        pattern = r"^([0-9]{1,6}h([0-9]{1,6}m)?([0-9]{1,6}s)?|[0-9]{1,6}m([0-9]{1,6}s)?|[0-9]{1,6}s)$"
    ))]
    pub final_backup_timeout: String,

    /// Where backups and archived WAL go; the operator's default destination when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<BackupDestination>,
}

impl BackupSpec {
    /// Days backups are kept: `retention`, or [`DEFAULT_RETENTION_DAYS`] when `keepLast` is
    /// unset too; `None` when only the count limits them.
    pub fn retention_days(&self) -> Option<i32> {
        self.retention
            .or(self.keep_last.is_none().then_some(DEFAULT_RETENTION_DAYS))
    }

    /// `backup: {}`: scheduled backups on, every other field at its default.
    pub fn enabled_with_defaults() -> Self {
        Self {
            enabled: true,
            schedule: default_backup_schedule(),
            retention: None,
            keep_last: None,
            keep_backups_on_delete: false,
            final_backup: false,
            final_backup_timeout: default_final_backup_timeout(),
            destination: None,
        }
    }
}

fn default_final_backup_timeout() -> String {
    "10m".into()
}

/// An S3-compatible object store location.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupDestination {
    /// `https://host[:port]` of the S3 API.
    #[schemars(regex(pattern = r"^https://[^\s/]+(/.*)?$"))]
    pub endpoint: String,
    /// Bucket name.
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,
    /// Key prefix inside the bucket (no leading or trailing `/`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^([^/\s]+(/[^/\s]+)*)?$"))]
    pub path: String,
    /// Region of the bucket, default `us-east-1`.
    #[serde(default = "default_region")]
    pub region: String,
    /// Secret in the cluster's namespace with keys `accessKeyId` and `secretAccessKey`.
    #[schemars(length(min = 1))]
    pub credentials_secret: String,
    /// Secret with `ca.crt`, the CA that signed the store's certificate (a public CA when
    /// unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<String>,
}

fn default_region() -> String {
    "us-east-1".into()
}

/// How a new cluster's data begins.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Restore from a backup instead of initialising an empty database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoverySpec>,
}

/// A restore: from a `DatabaseBackup` in this namespace, or from a backup in a store.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.backup) != has(self.source)").message("spec.bootstrap.recovery: set exactly one of backup and source"))]
pub struct RecoverySpec {
    /// A `DatabaseBackup` (in this namespace) that completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    /// A backup in a store, for when its cluster and DatabaseBackup are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<RecoverySource>,
    /// Point-in-time recovery (PostgreSQL): replay archived WAL up to this time (RFC 3339);
    /// the end of the archive when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\\\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$')").message("spec.bootstrap.recovery.targetTime must be an RFC 3339 time, e.g. 2026-11-30T12:00:00Z"))]
    pub target_time: Option<String>,
}

/// A backup found by its location.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySource {
    /// The store the source cluster wrote to (its `path` as configured there).
    pub destination: BackupDestination,
    /// The backup's id (`<time>-<name>`), as in the source DatabaseBackup's `status.backupId`.
    #[schemars(length(min = 1))]
    pub backup_id: String,
    /// Namespace of the source cluster in the store's layout. Optional, like `cluster` and
    /// `systemIdentifier`: the operator finds the backup by its id and fills in what is left
    /// out; give them when two clusters' backups share an id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the source cluster in the store's layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The source's PostgreSQL system identifier (or MySQL server uuid) in the layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_identifier: Option<String>,
}

fn default_true() -> bool {
    true
}

fn default_backup_schedule() -> String {
    "0 2 * * *".into()
}

/// Days backups are kept when the spec sets neither `retention` nor `keepLast`.
pub const DEFAULT_RETENTION_DAYS: i32 = 7;

/// High availability settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct HighAvailabilitySpec {
    /// Whether high availability is on.
    #[serde(default)]
    pub enabled: bool,

    /// Promote a replica automatically when the primary fails (default true).
    #[serde(default = "default_true")]
    pub auto_failover: bool,

    /// How long the primary may be unavailable before failover, e.g. `30s`, `2m` or `1m30s`
    /// (default 30s, 5s to 10m): the duration of the primary lock. The primary fences itself
    /// when it cannot renew the lock within 40% of it.
    #[serde(default = "default_failover_timeout")]
    #[schemars(regex(
        pattern = r"^([0-9]{1,6}h([0-9]{1,6}m)?([0-9]{1,6}s)?|[0-9]{1,6}m([0-9]{1,6}s)?|[0-9]{1,6}s)$"
    ))]
    #[x_kube(validation = Rule::new(
        "!self.matches('^([0-9]{1,6}h([0-9]{1,6}m)?([0-9]{1,6}s)?|[0-9]{1,6}m([0-9]{1,6}s)?|[0-9]{1,6}s)$') || (duration(self) >= duration('5s') && duration(self) <= duration('10m'))"
    ).message("spec.highAvailability.failoverTimeout must be between 5s and 10m"))]
    pub failover_timeout: String,
}

impl HighAvailabilitySpec {
    /// `failover_timeout` as a duration (the schema guarantees the shape).
    pub fn failover_timeout(&self) -> Option<std::time::Duration> {
        parse_duration(&self.failover_timeout)
    }
}

/// A duration as the spec's duration fields take it (`30s`, `10m`, `2h`, `1m30s`): hours,
/// minutes and seconds, each at most once and in that order — the subset of Go's durations
/// (`kubectl --timeout`, `metav1.Duration`) a timeout needs. `None` for anything else.
pub fn parse_duration(value: &str) -> Option<std::time::Duration> {
    let mut rest = value.trim();
    if rest.is_empty() {
        return None;
    }
    let mut seconds: u64 = 0;
    let mut previous_unit = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let number: u64 = rest.get(..digits)?.parse().ok()?;
        let (unit, unit_seconds) = match rest.as_bytes().get(digits)? {
            b'h' => (1, 3600),
            b'm' => (2, 60),
            b's' => (3, 1),
            _ => return None,
        };
        if unit <= previous_unit {
            return None;
        }
        previous_unit = unit;
        seconds = seconds.checked_add(number.checked_mul(unit_seconds)?)?;
        rest = rest.get(digits + 1..)?;
    }
    Some(std::time::Duration::from_secs(seconds))
}

fn default_failover_timeout() -> String {
    "30s".into()
}

/// Lifecycle phase (kept for `kubectl get`; conditions are the API).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum Phase {
    Pending,
    Creating,
    Running,
    Failed,
    Upgrading,
    Deleting,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Creating => "Creating",
            Phase::Running => "Running",
            Phase::Failed => "Failed",
            Phase::Upgrading => "Upgrading",
            Phase::Deleting => "Deleting",
        }
    }
}

/// Observed state, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseClusterStatus {
    /// Lifecycle phase: Pending, Creating, Running, Failed, Upgrading or Deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// Instances whose readiness probe passes.
    #[serde(default)]
    pub ready_replicas: i32,

    /// Instances that exist (for the scale subresource).
    #[serde(default)]
    pub replicas: i32,

    /// Label selector of the instances' pods (for the scale subresource and HPAs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`, `Progressing` and `Degraded`, following metav1.Condition conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// DNS name of the read-write (primary) service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_endpoint: Option<String>,

    /// DNS name of the read-only service (replicas), when replicas > 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_endpoint: Option<String>,

    /// Name of the Secret with `username`, `password`, `host`, `port`, `dbname` and `uri`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_secret_name: Option<String>,

    /// Version (image tag) every instance runs, once a rollout has finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,

    /// Size every volume has been expanded to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_size: Option<String>,

    /// Completion time of the last successful backup (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup: Option<String>,

    /// The name of the last `DatabaseBackup` that completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_name: Option<String>,

    /// The scheduled time of the last backup the schedule created (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scheduled_backup: Option<String>,

    /// When the schedule runs next (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_scheduled_backup: Option<String>,

    /// The pod of the primary instance: the first instance at bootstrap. Agents take their
    /// role from this field, never from what a pod says of itself; only the operator writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_primary: Option<String>,

    /// The pod becoming primary during a switchover (`devctl db promote`) or a failover
    /// (`pending` while the replicas report their final positions); cleared when it has
    /// promoted and `currentPrimary` names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_primary: Option<String>,

    /// Raised by one for each failover: replicas stop streaming when they see it rise, and a
    /// primary that sees it rise while it runs fences itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_epoch: Option<i64>,

    /// The primary a failover under way replaces (cleared when it is done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_primary: Option<String>,

    /// When the last failover started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover_time: Option<String>,

    /// When the switchover under way (or the last one) started (RFC 3339). One that has not
    /// completed two lock durations later (a minute without high availability) is aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_switchover_time: Option<String>,

    /// The replicas elected in the failover under way that did not promote (none took the
    /// primary lock): not elected again in it; after 3, or none left, the failover is stuck
    /// (`Degraded` reason `FailoverStuck`) until a human picks one. Cleared when it is done.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_targets: Vec<String>,

    /// The flight record of the last failover or switchover: when each of its steps happened,
    /// on the operator's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<FailoverRecord>,

    /// A major version upgrade under way, or the last one refused or failed (cleared once
    /// one completes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_upgrade: Option<MajorUpgradeStatus>,

    /// Each instance as its agent reports it, by pod name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub instances: Vec<InstanceSummary>,
}

/// Why the primary moved.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum FailoverReason {
    /// The primary lost its lock and the operator failed over on its own.
    PrimaryLost,
    /// A planned switchover (`devctl db promote` on a healthy primary).
    Switchover,
    /// A human picked the new primary of a lost one (`devctl db promote`).
    Manual,
}

/// The steps of one failover or switchover, each an RFC 3339 time with milliseconds on the
/// operator's clock, set as the step happens (a step not reached yet is absent).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverRecord {
    pub reason: FailoverReason,
    /// The primary that was replaced.
    pub failed_primary: String,
    /// The instance elected (and, once `promotedAt` is set, promoted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_primary: Option<String>,
    /// When the operator last saw the lost primary's lock renewed, on its own clock
    /// (`detectedAt` minus how long its watch had seen the lock unchanged): the detect step
    /// runs from here to `detectedAt`. Failovers the lock decided only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_last_seen_at: Option<String>,
    /// When the operator decided the primary was lost, or the switchover started.
    pub detected_at: String,
    /// When the new primary was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elected_at: Option<String>,
    /// When the operator saw the new primary run as primary with the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_at: Option<String>,
    /// When the operator's relabel of the new primary (what the `-rw` Service selects) was
    /// written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_switched_at: Option<String>,
}

/// One instance (pod) of the cluster, from its agent's report.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSummary {
    /// The pod's name.
    pub name: String,
    /// `primary` or `replica`, as the engine reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The engine accepts connections and the pod is Ready.
    #[serde(default)]
    pub ready: bool,
    /// The engine's timeline (PostgreSQL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    /// Replication lag in bytes (PostgreSQL replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<i64>,
    /// Replication lag in seconds (MariaDB replicas: `Seconds_Behind_Master`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<i64>,
    /// The GTIDs the instance has applied (MariaDB `gtid_current_pos`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid_position: Option<String>,
    /// Why the instance is not ready, or the agent's last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How often the agent restarted the engine after it exited on its own, since the agent
    /// started (each time also a Warning event `EngineRestarted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<i32>,
    /// When the engine last exited on its own (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_time: Option<String>,
    /// How it exited then, one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_read_hours_minutes_and_seconds_in_that_order() {
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(parse_duration("30s"), secs(30));
        assert_eq!(parse_duration("10m"), secs(600));
        assert_eq!(parse_duration("2h"), secs(7200));
        assert_eq!(parse_duration("1m30s"), secs(90));
        assert_eq!(parse_duration("1h0m5s"), secs(3605));
        for invalid in [
            "", "30", "30x", "1m30", "30s1m", "1s1s", "m", "-5s", "1.5m", "1 m",
        ] {
            assert_eq!(parse_duration(invalid), None, "{invalid:?}");
        }
        assert_eq!(parse_duration("99999999999999999999h"), None);
    }
}
