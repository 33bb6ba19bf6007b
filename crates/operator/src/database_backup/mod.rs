//! The DatabaseBackup controller (docs/backup.md): picks the instance, asks its agent through
//! a pod annotation, and turns the agent's report into the backup's status.

pub mod controller;

pub use controller::controller;
