//! The cluster's data volumes: the claims its StatefulSet makes (`data-<statefulset>-<n>`),
//! from the cache or listed live.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::{Api, ResourceExt};

use super::resources::{self, Names};
use crate::context::Context;
use devctl_api::labels;

/// This cluster's data claims (`data-<statefulset>-<ordinal>`, made by its StatefulSet), as
/// the cache shows them.
pub fn data_claims(ctx: &Context, names: &Names) -> Vec<Arc<PersistentVolumeClaim>> {
    let prefix = data_claim_prefix(names);
    let mut claims = ctx
        .caches
        .of_instance::<PersistentVolumeClaim>(&names.namespace, &names.name);
    claims.retain(|pvc| {
        pvc.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(&prefix))
    });
    claims
}

fn data_claim_prefix(names: &Names) -> String {
    format!(
        "{}-{}-",
        resources::stateful_set::DATA_VOLUME,
        names.stateful_set()
    )
}

/// The cluster's data claims as the API has them now (listed live: a claim the StatefulSet
/// made a moment ago may not be cached yet).
pub async fn live_data_claims(
    ctx: &Context,
    names: &Names,
) -> kube::Result<Vec<PersistentVolumeClaim>> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let selector = format!(
        "{}={},{}={}",
        labels::NAME,
        resources::APP_NAME,
        labels::INSTANCE,
        names.name
    );
    let prefix = data_claim_prefix(names);
    Ok(api
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter(|c| c.name_any().starts_with(&prefix))
        .collect())
}
