//! The types and reasons of a DatabaseCluster's conditions beyond the standard ones: one
//! list, imported by the steps that find a problem and by the status that reports it.

/// Reasons of `Degraded` for backups, and the types of the conditions that say the same of
/// each on its own: `True` while it fails (docs/backup.md).
pub const BACKUP_FAILING: &str = "BackupFailing";
pub const WAL_ARCHIVING_FAILING: &str = "WALArchivingFailing";
/// Reason of `Degraded` while a restored cluster cannot find its backup.
pub const RESTORE_SOURCE_UNAVAILABLE: &str = "RestoreSourceUnavailable";

/// Reason of `Degraded` while a regenerated password has not reached the database. It stays
/// until the instances report the new password applied (the agent does that).
pub const CREDENTIALS_REGENERATED: &str = "CredentialsRegenerated";

/// Reason of `Degraded` while the primary does not accept connections, or is lost and
/// nothing fails over on its own.
pub const PRIMARY_UNAVAILABLE: &str = "PrimaryUnavailable";

/// Reason of `Degraded` while a failover elects nobody: the replicas it elected did not
/// promote (docs/failover.md).
pub const FAILOVER_STUCK: &str = "FailoverStuck";

/// Reason of `Degraded` while fewer instances are ready than `spec.replicas` and nothing
/// more specific explains it.
pub const INSTANCES_UNAVAILABLE: &str = "InstancesUnavailable";

/// Reason of `Progressing` (and `Ready` false) while a failover is under way.
pub const FAILING_OVER: &str = "FailingOver";

/// Reason of `Degraded`/`Stalled` while a scale-down would remove the primary.
pub const SCALE_DOWN_REFUSED: &str = "ScaleDownRefused";

/// Reason of `Degraded` while synchronous replication is asked for but a MariaDB primary
/// fell back to asynchronous (docs/mariadb.md).
pub const SYNCHRONOUS_REPLICATION_DEGRADED: &str = "SynchronousReplicationDegraded";

/// Reason of `Degraded`/`Stalled` while a MySQL cluster asks for more than one instance.
pub const REPLICATION_UNSUPPORTED: &str = "ReplicationUnsupported";

/// Reason of `BackupFailing=False` once the store a backup failed on is back.
pub const STORE_RETURNED: &str = "StoreReturned";
