//! The DatabaseCluster controller.

pub mod controller;
pub mod instances;
pub mod pods;
pub mod resources;
pub mod status;
pub mod switchover;

pub use controller::{claim_owner, controller};
pub use instances::{pod_owner, trim_pod};
