//! `<name>-primary`: the primary lock (a `coordination.k8s.io/v1` Lease), only with
//! `spec.highAvailability.enabled` (PostgreSQL). See docs/failover.md.
//!
//! The operator owns the object and its duration; the agents own the holder. They write
//! `holderIdentity`, `renewTime`, `acquireTime` and `leaseTransitions` with `update` and a
//! `resourceVersion` precondition, so none of those is ever part of the desired body: the
//! applier compares only the fields rendered here, and a renewal is neither drift nor a
//! reason to apply.

use std::hash::{Hash, Hasher};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::primary_lease_name;
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::json;

use super::{Inputs, Names, metadata};
use crate::children::Child;
use crate::error::Result;

/// The lock's duration when high availability is on (PostgreSQL only; the API refuses it
/// for MySQL, and a cluster that slipped through gets no lock rather than a useless one).
pub fn failover_timeout(db: &DatabaseCluster) -> Option<std::time::Duration> {
    let ha = db.spec.high_availability.as_ref()?;
    (ha.enabled && db.spec.engine.replicated())
        .then(|| ha.failover_timeout())
        .flatten()
}

pub fn desired(db: &DatabaseCluster, names: &Names, inputs: &Inputs<'_>) -> Result<Option<Child>> {
    let Some(timeout) = failover_timeout(db) else {
        return Ok(None);
    };
    let name = primary_lease_name(&names.name);
    // The schema bounds the timeout to 5s..10m.
    let seconds = i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX);
    Ok(Some(Child::new::<Lease>(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata(db, names, &name, "primary-lock", inputs.version)?,
        "spec": { "leaseDurationSeconds": seconds },
    }))?))
}

/// What of a Lease is news for its cluster: who holds it. Renewals (every second or so)
/// change only `renewTime` and must not trigger a reconcile each.
pub fn significant(lease: &Lease) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    holder(lease).hash(&mut hasher);
    hasher.finish()
}

/// The holder, if any (an empty `holderIdentity` is a released lock).
pub fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}

/// Whether anyone ever took the lock: a freshly created one has none of these, a released
/// one keeps at least its transition count or times.
pub fn ever_held(lease: &Lease) -> bool {
    lease.spec.as_ref().is_some_and(|s| {
        holder(lease).is_some()
            || s.acquire_time.is_some()
            || s.renew_time.is_some()
            || s.lease_transitions.is_some()
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use devctl_api::database_cluster::HighAvailabilitySpec;

    fn with_ha(enabled: bool, timeout: &str) -> DatabaseCluster {
        let mut db = sample();
        db.spec.high_availability = Some(HighAvailabilitySpec {
            enabled,
            auto_failover: true,
            failover_timeout: timeout.into(),
        });
        db
    }

    #[test]
    fn only_with_high_availability_and_only_the_duration_in_spec() {
        let names = Names::of(&sample()).unwrap();
        assert!(desired(&sample(), &names, &inputs()).unwrap().is_none());
        assert!(
            desired(&with_ha(false, "30s"), &names, &inputs())
                .unwrap()
                .is_none()
        );
        let child = desired(&with_ha(true, "2m"), &names, &inputs())
            .unwrap()
            .unwrap();
        assert_eq!(child.kind, "Lease");
        assert_eq!(child.name, "my-postgres-primary");
        assert_eq!(child.body["spec"], json!({ "leaseDurationSeconds": 120 }));
        let compound = desired(&with_ha(true, "1m30s"), &names, &inputs())
            .unwrap()
            .unwrap();
        assert_eq!(compound.body["spec"], json!({ "leaseDurationSeconds": 90 }));
        assert_eq!(
            child.body["metadata"]["ownerReferences"][0]["controller"],
            true
        );
    }

    #[test]
    fn a_renewal_is_not_significant_a_new_holder_is() {
        let lease = |holder: &str, renewed: &str| -> Lease {
            serde_json::from_value(json!({
                "metadata": { "name": "x" },
                "spec": { "holderIdentity": holder, "renewTime": renewed, "leaseDurationSeconds": 30 }
            }))
            .unwrap()
        };
        let a = lease("db-0", "2025-01-01T00:00:00.000000Z");
        let renewed = lease("db-0", "2025-01-01T00:00:03.000000Z");
        assert_eq!(significant(&a), significant(&renewed));
        assert_ne!(
            significant(&a),
            significant(&lease("db-1", "2025-01-01T00:00:03.000000Z"))
        );
        let released = lease("", "2025-01-01T00:00:03.000000Z");
        assert_eq!(holder(&released), None);
        assert!(ever_held(&released));
        let fresh: Lease = serde_json::from_value(json!({
            "metadata": { "name": "x" }, "spec": { "leaseDurationSeconds": 30 }
        }))
        .unwrap();
        assert!(!ever_held(&fresh));
    }
}
