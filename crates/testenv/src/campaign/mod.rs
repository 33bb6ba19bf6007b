//! The fault campaign (docs/reliability.md): seeded episodes of faults against a live
//! cluster under write load, and the checkers that fail a run on any lost acknowledged
//! write, any instant with two writable instances, or a cluster that does not recover.
//!
//! - [`plan`]: the episodes a seed makes (pure, so `--seed N` replays a run);
//! - [`checks`]: the checkers over what the writer and the probers recorded (pure);
//! - [`stats`]: write unavailability and recovery by fault kind (pure);
//! - [`runner`]: the campaign against a live cluster, carrying out each fault through
//!   [`inject`], probing through [`probe`], with the operator as a process of its own
//!   ([`operator`]) in a [`world`].

pub mod checks;
pub mod inject;
pub mod operator;
pub mod plan;
pub mod probe;
pub mod runner;
pub mod stats;
pub mod world;

pub use operator::OperatorProcess;
pub use runner::{Config, Outcome, Plant, run};
pub use world::World;
