//! The fault campaign (docs/reliability.md, once it runs): seeded episodes of faults against
//! a live cluster under write load, and the checkers that fail a run on any lost acknowledged
//! write, any instant with two writable instances, or a cluster that does not recover.
//!
//! What is here so far is the pure part, the one a failing run must reproduce exactly: the
//! episodes a seed makes ([`plan`]) and the checkers over what the writer and the probers
//! recorded ([`checks`]). The runner that carries the episodes out against a cluster comes
//! next.

pub mod checks;
pub mod plan;
