//! The WebApp controller: a Deployment and a Service per WebApp.

pub mod controller;
pub mod resources;
pub mod status;

pub use controller::controller;
