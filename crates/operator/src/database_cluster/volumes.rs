//! Volume growth, decided from the claims (pure): claim templates are immutable, so a larger
//! `spec.storage.size` grows each claim in place.

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::quantity;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

/// What the volumes need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Growth {
    /// Claims that request less than `spec.storage.size`: each is patched to it.
    pub expand: Vec<String>,
    /// `(expanded, total)` while some volume has not reached the size.
    pub pending: Option<(usize, usize)>,
}

fn bytes(q: Option<&Quantity>) -> u64 {
    q.and_then(|q| quantity::to_bytes(&q.0)).unwrap_or(0)
}

/// The claims to grow and how far the growth has come.
pub fn growth<'a>(
    db: &DatabaseCluster,
    claims: impl ExactSizeIterator<Item = &'a PersistentVolumeClaim>,
) -> Growth {
    let Some(want) = quantity::to_bytes(&db.spec.storage.size) else {
        return Growth::default();
    };
    let total = claims.len();
    let mut growth = Growth::default();
    let mut expanded = 0;
    for claim in claims {
        let requested = bytes(
            claim
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage")),
        );
        let capacity = bytes(
            claim
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage")),
        );
        if requested < want {
            growth.expand.push(claim.name_any());
        }
        if capacity >= want {
            expanded += 1;
        }
    }
    growth.pending = (expanded < total).then_some((expanded, total));
    growth
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(name: &str, requested: &str, capacity: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "resources": { "requests": { "storage": requested } } },
            "status": capacity.map(|c| json!({ "capacity": { "storage": c } })),
        }))
        .unwrap()
    }

    fn cluster(size: &str) -> DatabaseCluster {
        serde_json::from_value(json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
            "metadata": { "name": "db", "namespace": "ns" },
            "spec": { "engine": "postgres", "version": "15", "storage": { "size": size } },
        }))
        .unwrap()
    }

    #[test]
    fn smaller_claims_grow_and_the_growth_counts_capacity_not_requests() {
        let claims = [
            claim("data-db-0", "1Gi", Some("2Gi")),
            claim("data-db-1", "2Gi", Some("1Gi")),
            claim("data-db-2", "1Gi", None),
        ];
        let growth = growth(&cluster("2Gi"), claims.iter());
        assert_eq!(growth.expand, ["data-db-0", "data-db-2"]);
        assert_eq!(growth.pending, Some((1, 3)));
        let done = [claim("data-db-0", "2Gi", Some("2Gi"))];
        assert_eq!(
            super::growth(&cluster("2Gi"), done.iter()),
            Growth::default()
        );
    }
}
