//! The DatabaseCluster controller.

pub mod act;
pub mod backup;
pub mod backup_lifecycle;
pub mod claims;
pub mod controller;
pub mod converge;
pub mod deletion;
pub mod events;
pub mod failover;
pub mod failover_liveness;
pub mod instances;
pub mod major_upgrade;
pub mod observe;
pub mod plan;
pub mod pods;
pub mod primary;
pub mod primary_step;
pub mod reasons;
pub mod resources;
pub mod schedule;
pub mod status;
pub mod store;
pub mod switchover;
pub mod timers;
pub mod volumes;

pub use controller::{controller, labelled_owner};
pub use instances::trim_pod;
