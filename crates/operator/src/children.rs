//! The one place that applies children and deletes orphans.
//!
//! A reconciler renders the children it wants as [`Child`] values (pure); [`Children::sync`]
//! compares each with the cached live object, applies only what differs with server-side
//! apply under one field manager, and deletes owned children that are no longer wanted. A
//! converged object therefore costs zero write requests.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::subset::first_difference;

/// The field manager of everything the operator writes (children and status).
pub const FIELD_MANAGER: &str = "devctl-operator";

/// The kinds of children the operator creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    ConfigMap,
    Secret,
    Service,
    StatefulSet,
    Deployment,
    PodDisruptionBudget,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
            Kind::Service => "Service",
            Kind::StatefulSet => "StatefulSet",
            Kind::Deployment => "Deployment",
            Kind::PodDisruptionBudget => "PodDisruptionBudget",
        }
    }

    fn api_resource(self) -> ApiResource {
        match self {
            Kind::ConfigMap => ApiResource::erase::<ConfigMap>(&()),
            Kind::Secret => ApiResource::erase::<Secret>(&()),
            Kind::Service => ApiResource::erase::<Service>(&()),
            Kind::StatefulSet => ApiResource::erase::<StatefulSet>(&()),
            Kind::Deployment => ApiResource::erase::<Deployment>(&()),
            Kind::PodDisruptionBudget => ApiResource::erase::<PodDisruptionBudget>(&()),
        }
    }
}

/// A child as the reconciler wants it: the full server-side apply body.
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    pub kind: Kind,
    pub name: String,
    pub body: Value,
}

/// What a sync changed, for events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created(Kind, String),
    Updated(Kind, String),
    Deleted(Kind, String),
}

/// Caches of the children, fed by label-selected watches (only objects devctl manages). A
/// controller fills the caches of the kinds it owns; the others stay empty.
#[derive(Clone)]
pub struct Stores {
    pub config_maps: Store<ConfigMap>,
    pub secrets: Store<Secret>,
    pub services: Store<Service>,
    pub stateful_sets: Store<StatefulSet>,
    pub deployments: Store<Deployment>,
    pub pod_disruption_budgets: Store<PodDisruptionBudget>,
    pub persistent_volume_claims: Store<PersistentVolumeClaim>,
}

impl Default for Stores {
    /// Empty caches (no watch feeds them).
    fn default() -> Self {
        fn empty<K: kube::runtime::reflector::Lookup<DynamicType = ()> + Clone + 'static>()
        -> Store<K> {
            kube::runtime::reflector::store::<K>().0
        }
        Self {
            config_maps: empty(),
            secrets: empty(),
            services: empty(),
            stateful_sets: empty(),
            deployments: empty(),
            pod_disruption_budgets: empty(),
            persistent_volume_claims: empty(),
        }
    }
}

fn to_value<K: serde::Serialize>(object: &Arc<K>) -> Option<Value> {
    serde_json::to_value(object.as_ref()).ok()
}

fn find<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

/// Names of the cached objects of `kind` controlled by the owner with `owner_uid`.
fn owned_names<K>(store: &Store<K>, namespace: &str, owner_uid: &str) -> Vec<String>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .iter()
        .filter(|o| o.namespace().as_deref() == Some(namespace))
        .filter(|o| {
            o.owner_references()
                .iter()
                .any(|r| r.controller == Some(true) && r.uid == owner_uid)
        })
        .map(|o| o.name_any())
        .collect()
}

impl Stores {
    /// The cached live object of `kind`/`name` as JSON.
    pub fn observed(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        match kind {
            Kind::ConfigMap => find(&self.config_maps, namespace, name).and_then(|o| to_value(&o)),
            Kind::Secret => find(&self.secrets, namespace, name).and_then(|o| to_value(&o)),
            Kind::Service => find(&self.services, namespace, name).and_then(|o| to_value(&o)),
            Kind::StatefulSet => {
                find(&self.stateful_sets, namespace, name).and_then(|o| to_value(&o))
            }
            Kind::Deployment => find(&self.deployments, namespace, name).and_then(|o| to_value(&o)),
            Kind::PodDisruptionBudget => {
                find(&self.pod_disruption_budgets, namespace, name).and_then(|o| to_value(&o))
            }
        }
    }

    fn owned(&self, kind: Kind, namespace: &str, owner_uid: &str) -> Vec<String> {
        match kind {
            Kind::ConfigMap => owned_names(&self.config_maps, namespace, owner_uid),
            Kind::Secret => owned_names(&self.secrets, namespace, owner_uid),
            Kind::Service => owned_names(&self.services, namespace, owner_uid),
            Kind::StatefulSet => owned_names(&self.stateful_sets, namespace, owner_uid),
            Kind::Deployment => owned_names(&self.deployments, namespace, owner_uid),
            Kind::PodDisruptionBudget => {
                owned_names(&self.pod_disruption_budgets, namespace, owner_uid)
            }
        }
    }

    pub fn stateful_set(&self, namespace: &str, name: &str) -> Option<Arc<StatefulSet>> {
        find(&self.stateful_sets, namespace, name)
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        find(&self.secrets, namespace, name)
    }

    pub fn deployment(&self, namespace: &str, name: &str) -> Option<Arc<Deployment>> {
        find(&self.deployments, namespace, name)
    }
}

/// Applies children for one owner and deletes the ones it no longer wants.
pub struct Children<'a> {
    pub client: &'a Client,
    pub stores: &'a Stores,
    pub namespace: &'a str,
    pub owner_uid: &'a str,
}

impl Children<'_> {
    /// Applies every child that differs from its cached live object, then deletes owned
    /// children of `kinds` that are not in `desired`. Returns what changed.
    pub async fn sync(&self, desired: &[Child], kinds: &[Kind]) -> Result<Vec<Change>> {
        let mut changes = Vec::new();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for child in desired {
            let observed = self
                .stores
                .observed(child.kind, self.namespace, &child.name);
            if let Some(observed) = &observed {
                match first_difference(&child.body, observed, "") {
                    None => continue,
                    Some(difference) => {
                        tracing::debug!(kind = child.kind.as_str(), name = %child.name, %difference, "child differs")
                    }
                }
            }
            let api: Api<DynamicObject> = Api::namespaced_with(
                self.client.clone(),
                self.namespace,
                &child.kind.api_resource(),
            );
            api.patch(&child.name, &params, &Patch::Apply(&child.body))
                .await
                .map_err(|source| Error::Child {
                    action: "apply",
                    kind: child.kind.as_str(),
                    name: child.name.clone(),
                    source,
                })?;
            changes.push(match observed {
                None => Change::Created(child.kind, child.name.clone()),
                Some(_) => Change::Updated(child.kind, child.name.clone()),
            });
        }

        let wanted: BTreeSet<(Kind, &str)> =
            desired.iter().map(|c| (c.kind, c.name.as_str())).collect();
        for &kind in kinds {
            for name in self.stores.owned(kind, self.namespace, self.owner_uid) {
                if wanted.contains(&(kind, name.as_str())) {
                    continue;
                }
                let api: Api<DynamicObject> =
                    Api::namespaced_with(self.client.clone(), self.namespace, &kind.api_resource());
                match api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => changes.push(Change::Deleted(kind, name)),
                    // Already gone: the cache lagged behind.
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(source) => {
                        return Err(Error::Child {
                            action: "delete",
                            kind: kind.as_str(),
                            name,
                            source,
                        });
                    }
                }
            }
        }
        Ok(changes)
    }
}
