//! The DatabaseCluster controller.

pub mod backup;
pub mod backup_lifecycle;
pub mod claims;
pub mod controller;
pub mod failover;
pub mod failover_liveness;
pub mod instances;
pub mod pods;
pub mod primary;
pub mod reasons;
pub mod resources;
pub mod schedule;
pub mod status;
pub mod store;
pub mod switchover;

pub use controller::{controller, labelled_owner};
pub use instances::trim_pod;
