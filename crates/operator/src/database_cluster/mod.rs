//! The DatabaseCluster controller.

pub mod controller;
pub mod resources;
pub mod status;

pub use controller::{claim_owner, controller};
