//! devctl-operator: reconciles devctl's custom resources into Kubernetes objects.
//!
//! Layout: `children` applies children and deletes orphans for every controller;
//! `database_cluster` holds the DatabaseCluster controller, its desired state (`resources`,
//! one file per child) and status; `engine` renders PostgreSQL/MySQL configuration.

pub mod backoff;
pub mod children;
pub mod context;
pub mod database_cluster;
pub mod engine;
pub mod error;
pub mod subset;

pub use context::Settings;
pub use error::Error;
