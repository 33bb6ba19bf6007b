//! Conversion between `v1alpha1` and `v1beta1` `DatabaseCluster`s (pure; the operator's
//! `/convert` webhook calls [`convert`]).
//!
//! - `resources.cpu`/`resources.memory` ↔ `resources.requests.cpu`/`.memory`;
//!   `backupsEnabled` ↔ `backup.enabled`; engine, version, replicas and storage are the same.
//! - What `v1alpha1` cannot express (image, limits, backup schedule and retention, high
//!   availability, replication, bootstrap) travels in the annotation [`PRESERVED_ANNOTATION`]
//!   while an object is seen as `v1alpha1`, so `v1beta1 → v1alpha1 → v1beta1` gives back the
//!   object unchanged. The `v1alpha1` fields win over the annotation: a `v1alpha1` client that
//!   edits `replicas` or `backupsEnabled` changes them.
//! - `metadata` is passed through untouched except for that one annotation (the API server
//!   refuses a conversion that changes anything else there), and `status` is identical in both
//!   versions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{v1alpha1, v1beta1};

/// `apiVersion` of the storage version.
pub const V1BETA1: &str = "db.devctl.io/v1beta1";
/// `apiVersion` of the deprecated version.
pub const V1ALPHA1: &str = "db.devctl.io/v1alpha1";

/// Holds, on an object seen as `v1alpha1`, the `v1beta1` fields `v1alpha1` cannot express
/// (JSON). Removed again when the object is converted back.
pub const PRESERVED_ANNOTATION: &str = "db.devctl.io/v1beta1-fields";

/// Why an object could not be converted; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversionError {
    #[error("{0}: the object is not a JSON object")]
    NotAnObject(&'static str),
    #[error(
        "apiVersion {0:?} is not a served version of DatabaseCluster (db.devctl.io/v1alpha1, db.devctl.io/v1beta1)"
    )]
    UnknownVersion(String),
    #[error("spec: {0}")]
    InvalidSpec(String),
    #[error("metadata.annotations[{PRESERVED_ANNOTATION:?}]: {0}")]
    InvalidPreserved(String),
}

/// The `v1beta1` fields a `v1alpha1` object cannot express, as they were.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Preserved {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    /// The whole `resources`, when it is more than requests of cpu and memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resources: Option<ResourceRequirements>,
    /// The whole `backup`, when it is more than `{enabled: true}` with the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backup: Option<v1beta1::BackupSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    high_availability: Option<v1beta1::HighAvailabilitySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replication: Option<v1beta1::ReplicationSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bootstrap: Option<v1beta1::BootstrapSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    upgrade: Option<v1beta1::UpgradeSpec>,
}

impl Preserved {
    fn is_empty(&self) -> bool {
        *self == Preserved::default()
    }
}

/// Converts one `DatabaseCluster` (as JSON, in either served version) to `desired_api_version`.
pub fn convert(mut object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let from = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    for version in [&from, &desired_api_version.to_string()] {
        if version != V1ALPHA1 && version != V1BETA1 {
            return Err(ConversionError::UnknownVersion(version.clone()));
        }
    }
    if from == desired_api_version {
        return Ok(object);
    }
    let root = object
        .as_object_mut()
        .ok_or(ConversionError::NotAnObject("object"))?;
    let spec = root.remove("spec").unwrap_or(Value::Null);
    let metadata = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let metadata = metadata
        .as_object_mut()
        .ok_or(ConversionError::NotAnObject("metadata"))?;
    let annotations = match metadata.get_mut("annotations") {
        Some(Value::Object(annotations)) => Some(annotations),
        Some(Value::Null) | None => None,
        Some(_) => return Err(ConversionError::NotAnObject("metadata.annotations")),
    };
    let new_spec = if desired_api_version == V1BETA1 {
        let alpha: v1alpha1::DatabaseClusterSpec = serde_json::from_value(spec)
            .map_err(|e| ConversionError::InvalidSpec(e.to_string()))?;
        let preserved = match annotations {
            Some(annotations) => match annotations.remove(PRESERVED_ANNOTATION) {
                Some(Value::String(json)) => serde_json::from_str(&json)
                    .map_err(|e| ConversionError::InvalidPreserved(e.to_string()))?,
                Some(_) => {
                    return Err(ConversionError::InvalidPreserved("not a string".into()));
                }
                None => Preserved::default(),
            },
            None => Preserved::default(),
        };
        remove_empty_annotations(metadata);
        serde_json::to_value(spec_to_v1beta1(alpha, preserved))
    } else {
        let beta: v1beta1::DatabaseClusterSpec = serde_json::from_value(spec)
            .map_err(|e| ConversionError::InvalidSpec(e.to_string()))?;
        let (alpha, preserved) = spec_to_v1alpha1(beta);
        if preserved.is_empty() {
            if let Some(annotations) = annotations {
                annotations.remove(PRESERVED_ANNOTATION);
            }
            remove_empty_annotations(metadata);
        } else {
            let json = serde_json::to_string(&preserved)
                .map_err(|e| ConversionError::InvalidSpec(e.to_string()))?;
            let annotations = metadata
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(annotations) = annotations {
                annotations.insert(PRESERVED_ANNOTATION.into(), Value::String(json));
            } else {
                *annotations = serde_json::json!({ PRESERVED_ANNOTATION: json });
            }
        }
        serde_json::to_value(alpha)
    }
    .map_err(|e| ConversionError::InvalidSpec(e.to_string()))?;
    root.insert("spec".into(), new_spec);
    root.insert(
        "apiVersion".into(),
        Value::String(desired_api_version.to_string()),
    );
    Ok(object)
}

fn remove_empty_annotations(metadata: &mut Map<String, Value>) {
    if matches!(metadata.get("annotations"), Some(Value::Object(a)) if a.is_empty()) {
        metadata.remove("annotations");
    }
}

/// The `backup` a `v1alpha1` `backupsEnabled: true` stands for: every default.
pub fn default_enabled_backup() -> v1beta1::BackupSpec {
    v1beta1::BackupSpec::enabled_with_defaults()
}

/// The part of a `v1beta1` spec `v1alpha1` cannot show, as JSON (empty object when there is
/// none), normalised so that edits of what `v1alpha1` shows (`backupsEnabled`, the cpu and
/// memory requests) do not count.
pub fn hidden_in_v1alpha1(spec: &v1beta1::DatabaseClusterSpec) -> Value {
    let resources = spec.resources.clone().and_then(|mut r| {
        if let Some(requests) = r.requests.as_mut() {
            for key in REQUEST_KEYS {
                requests.remove(key);
            }
            if requests.is_empty() {
                r.requests = None;
            }
        }
        (r != ResourceRequirements::default()).then_some(r)
    });
    let backup = spec.backup.clone().and_then(|mut b| {
        b.enabled = true;
        // `retention: 7` without `keepLast` means what no retention means, and clusters
        // created while the schema defaulted it have it stored: a v1alpha1 write that
        // leaves it out changes nothing.
        if b.keep_last.is_none() && b.retention == Some(v1beta1::DEFAULT_RETENTION_DAYS) {
            b.retention = None;
        }
        (b != default_enabled_backup()).then_some(b)
    });
    let hidden = Preserved {
        image: spec.image.clone(),
        resources,
        backup,
        high_availability: spec.high_availability.clone(),
        replication: spec.replication.clone(),
        bootstrap: spec.bootstrap.clone(),
        upgrade: spec.upgrade.clone(),
    };
    serde_json::to_value(hidden).unwrap_or_else(|_| Value::Object(Map::new()))
}

const REQUEST_KEYS: [&str; 2] = ["cpu", "memory"];

/// `v1beta1` resources that `v1alpha1` expresses exactly: requests of cpu and memory only.
fn alpha_resources(resources: &ResourceRequirements) -> Option<v1alpha1::ResourceSpec> {
    let requests = resources.requests.as_ref()?;
    let exact = resources.limits.is_none()
        && resources.claims.is_none()
        && requests.keys().all(|k| REQUEST_KEYS.contains(&k.as_str()));
    exact.then(|| v1alpha1::ResourceSpec {
        cpu: requests.get("cpu").map(|q| q.0.clone()),
        memory: requests.get("memory").map(|q| q.0.clone()),
    })
}

/// Splits a `v1beta1` spec into what `v1alpha1` shows and what it cannot.
fn spec_to_v1alpha1(
    spec: v1beta1::DatabaseClusterSpec,
) -> (v1alpha1::DatabaseClusterSpec, Preserved) {
    let mut preserved = Preserved {
        image: spec.image,
        high_availability: spec.high_availability,
        replication: spec.replication,
        bootstrap: spec.bootstrap,
        upgrade: spec.upgrade,
        ..Preserved::default()
    };
    let resources = match &spec.resources {
        None => None,
        Some(resources) => match alpha_resources(resources) {
            Some(exact) => Some(exact),
            None => {
                // Shown as far as v1alpha1 can; the whole of it is preserved.
                let requests = resources.requests.as_ref();
                let shown = v1alpha1::ResourceSpec {
                    cpu: requests.and_then(|r| r.get("cpu")).map(|q| q.0.clone()),
                    memory: requests.and_then(|r| r.get("memory")).map(|q| q.0.clone()),
                };
                preserved.resources = Some(resources.clone());
                (shown != v1alpha1::ResourceSpec::default()).then_some(shown)
            }
        },
    };
    let backups_enabled = match spec.backup {
        None => false,
        Some(backup) => {
            let enabled = backup.enabled;
            if backup != default_enabled_backup() {
                preserved.backup = Some(backup);
            }
            enabled
        }
    };
    let alpha = v1alpha1::DatabaseClusterSpec {
        engine: spec.engine,
        replicas: spec.replicas,
        version: spec.version,
        storage: spec.storage,
        resources,
        backups_enabled,
    };
    (alpha, preserved)
}

/// Joins a `v1alpha1` spec and the preserved fields; the `v1alpha1` fields win.
fn spec_to_v1beta1(
    spec: v1alpha1::DatabaseClusterSpec,
    preserved: Preserved,
) -> v1beta1::DatabaseClusterSpec {
    let resources = match preserved.resources {
        Some(mut resources) => {
            let shown = spec.resources.clone().unwrap_or_default();
            // Requests the preserved object did not have stay absent unless v1alpha1 sets one.
            if resources.requests.is_some() || shown != v1alpha1::ResourceSpec::default() {
                let requests = resources.requests.get_or_insert_with(BTreeMap::new);
                for (key, value) in [("cpu", shown.cpu), ("memory", shown.memory)] {
                    match value {
                        Some(value) => {
                            requests.insert(key.into(), Quantity(value));
                        }
                        None => {
                            requests.remove(key);
                        }
                    }
                }
            }
            Some(resources)
        }
        None => spec.resources.map(|shown| {
            let mut requests = BTreeMap::new();
            if let Some(cpu) = shown.cpu {
                requests.insert("cpu".to_string(), Quantity(cpu));
            }
            if let Some(memory) = shown.memory {
                requests.insert("memory".to_string(), Quantity(memory));
            }
            ResourceRequirements {
                requests: Some(requests),
                ..ResourceRequirements::default()
            }
        }),
    };
    let backup = match preserved.backup {
        Some(mut backup) => {
            backup.enabled = spec.backups_enabled;
            Some(backup)
        }
        None => spec.backups_enabled.then(default_enabled_backup),
    };
    v1beta1::DatabaseClusterSpec {
        engine: spec.engine,
        version: spec.version,
        image: preserved.image,
        replicas: spec.replicas,
        storage: spec.storage,
        resources,
        backup,
        high_availability: preserved.high_availability,
        replication: preserved.replication,
        bootstrap: preserved.bootstrap,
        upgrade: preserved.upgrade,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceClaim;
    use proptest::collection::{btree_map, vec};
    use proptest::option;
    use proptest::prelude::*;
    use serde_json::json;

    fn quantity() -> impl Strategy<Value = Quantity> {
        prop_oneof![
            "[1-9][0-9]{0,3}m".prop_map(Quantity),
            "[1-9][0-9]{0,2}(Mi|Gi)".prop_map(Quantity),
            "[1-9]".prop_map(Quantity),
        ]
    }

    fn resource_map() -> impl Strategy<Value = BTreeMap<String, Quantity>> {
        btree_map(
            prop_oneof![Just("cpu"), Just("memory"), Just("ephemeral-storage")]
                .prop_map(String::from),
            quantity(),
            0..3,
        )
    }

    fn resources() -> impl Strategy<Value = ResourceRequirements> {
        (
            option::of(resource_map()),
            option::of(resource_map()),
            option::of(vec("[a-z]{1,8}", 0..2)),
        )
            .prop_map(|(requests, limits, claims)| ResourceRequirements {
                requests,
                limits,
                claims: claims.map(|names| {
                    names
                        .into_iter()
                        .map(|name| ResourceClaim {
                            name,
                            ..ResourceClaim::default()
                        })
                        .collect()
                }),
            })
    }

    fn destination() -> impl Strategy<Value = v1beta1::BackupDestination> {
        (
            "https://[a-z]{1,8}(:[0-9]{2,4})?",
            "[a-z]{3,12}",
            "([a-z]{1,5}(/[a-z]{1,5}){0,2})?",
            "[a-z]{2}-[a-z]{4}-[1-3]",
            "[a-z]{1,10}",
            option::of("[a-z]{1,10}"),
        )
            .prop_map(
                |(endpoint, bucket, path, region, credentials_secret, ca_secret)| {
                    v1beta1::BackupDestination {
                        endpoint,
                        bucket,
                        path,
                        region,
                        credentials_secret,
                        ca_secret,
                    }
                },
            )
    }

    fn backup() -> impl Strategy<Value = v1beta1::BackupSpec> {
        (
            any::<bool>(),
            prop_oneof![
                Just("0 2 * * *".to_string()),
                "[0-5]?[0-9] [0-9] \\* \\* \\*"
            ],
            option::of(prop_oneof![Just(7), 1..3650i32]),
            option::of(1..1000i32),
            any::<bool>(),
            any::<bool>(),
            prop_oneof![Just("10m".to_string()), "[1-9][0-9]?(s|m)"],
            option::of(destination()),
        )
            .prop_map(
                |(
                    enabled,
                    schedule,
                    retention,
                    keep_last,
                    keep_backups_on_delete,
                    final_backup,
                    final_backup_timeout,
                    destination,
                )| v1beta1::BackupSpec {
                    enabled,
                    schedule,
                    retention,
                    keep_last,
                    keep_backups_on_delete,
                    final_backup,
                    final_backup_timeout,
                    destination,
                },
            )
    }

    fn high_availability() -> impl Strategy<Value = v1beta1::HighAvailabilitySpec> {
        (any::<bool>(), any::<bool>(), "[1-9][0-9]?(s|m)").prop_map(
            |(enabled, auto_failover, failover_timeout)| v1beta1::HighAvailabilitySpec {
                enabled,
                auto_failover,
                failover_timeout,
            },
        )
    }

    fn replication() -> impl Strategy<Value = v1beta1::ReplicationSpec> {
        option::of((any::<bool>(), 1..6i32)).prop_map(|synchronous| v1beta1::ReplicationSpec {
            synchronous: synchronous.map(|(first, number)| v1beta1::SynchronousSpec {
                method: if first {
                    v1beta1::SynchronousMethod::First
                } else {
                    v1beta1::SynchronousMethod::Any
                },
                number,
            }),
        })
    }

    fn bootstrap() -> impl Strategy<Value = v1beta1::BootstrapSpec> {
        let source = (
            destination(),
            "[a-z]{1,8}",
            "[a-z]{1,8}",
            "[0-9]{5,19}",
            "[0-9a-z-]{5,20}",
        )
            .prop_map(
                |(destination, namespace, cluster, system_identifier, backup_id)| {
                    v1beta1::RecoverySource {
                        destination,
                        namespace: Some(namespace),
                        cluster: Some(cluster),
                        system_identifier: Some(system_identifier),
                        backup_id,
                    }
                },
            );
        let recovery = (
            prop_oneof![
                "[a-z]{1,10}".prop_map(|b| (Some(b), None)),
                source.prop_map(|s| (None, Some(s))),
            ],
            option::of(Just("2026-11-30T12:00:00Z".to_string())),
        )
            .prop_map(|((backup, source), target_time)| v1beta1::RecoverySpec {
                backup,
                source,
                target_time,
            });
        option::of(recovery).prop_map(|recovery| v1beta1::BootstrapSpec { recovery })
    }

    fn engine() -> impl Strategy<Value = v1beta1::Engine> {
        prop_oneof![
            Just(v1beta1::Engine::Postgres),
            Just(v1beta1::Engine::Mysql),
            Just(v1beta1::Engine::Mariadb)
        ]
    }

    fn storage() -> impl Strategy<Value = v1beta1::StorageSpec> {
        ("[1-9][0-9]{0,2}(Mi|Gi|Ti)", option::of("[a-z-]{1,12}")).prop_map(
            |(size, storage_class_name)| v1beta1::StorageSpec {
                size,
                storage_class_name,
            },
        )
    }

    prop_compose! {
        fn upgrade()(
            link in any::<bool>(),
            image in option::of("[a-z./:0-9-]{1,30}"),
        ) -> v1beta1::UpgradeSpec {
            v1beta1::UpgradeSpec {
                method: if link { v1beta1::UpgradeMethod::Link } else { v1beta1::UpgradeMethod::Copy },
                image,
            }
        }
    }

    prop_compose! {
        fn beta_spec()(
            (engine, version, image, replicas, storage) in (engine(), "[0-9]{1,2}\\.[0-9]{1,2}", option::of("[a-z./:0-9-]{1,30}"), 1..=7i32, storage()),
            resources in option::of(resources()),
            backup in option::of(backup()),
            high_availability in option::of(high_availability()),
            replication in option::of(replication()),
            bootstrap in option::of(bootstrap()),
            upgrade in option::of(upgrade()),
        ) -> v1beta1::DatabaseClusterSpec {
            v1beta1::DatabaseClusterSpec {
                engine, version, image, replicas, storage, resources, backup,
                high_availability, replication, bootstrap, upgrade,
            }
        }
    }

    prop_compose! {
        fn alpha_spec()(
            engine in engine(),
            replicas in 1..=7i32,
            version in "[0-9]{1,2}\\.[0-9]{1,2}",
            storage in storage(),
            resources in option::of((option::of("[1-9][0-9]{0,3}m"), option::of("[1-9][0-9]{0,2}(Mi|Gi)"))),
            backups_enabled in any::<bool>(),
        ) -> v1alpha1::DatabaseClusterSpec {
            v1alpha1::DatabaseClusterSpec {
                engine, replicas, version, storage,
                resources: resources.map(|(cpu, memory)| v1alpha1::ResourceSpec { cpu, memory }),
                backups_enabled,
            }
        }
    }

    /// Metadata as the API server sends it: user labels and annotations (never ours; never
    /// an empty map, which the API server omits).
    fn metadata() -> impl Strategy<Value = Value> {
        (
            "[a-z]([a-z0-9-]{0,20}[a-z0-9])?",
            option::of(btree_map("[a-z]{1,8}(/[a-z]{1,8})?", "[ -~]{0,20}", 1..3)),
            option::of(btree_map("[a-z]{1,8}", "[a-z0-9]{0,8}", 1..3)),
            1..100i64,
        )
            .prop_map(|(name, annotations, labels, generation)| {
                let mut metadata = json!({
                    "name": name, "namespace": "default", "uid": "0b8e8c3a-0000-4000-8000-000000000001",
                    "generation": generation, "resourceVersion": "42",
                    "creationTimestamp": "2026-11-30T12:00:00Z",
                });
                if let Some(annotations) = annotations {
                    metadata["annotations"] = json!(annotations);
                }
                if let Some(labels) = labels {
                    metadata["labels"] = json!(labels);
                }
                metadata
            })
    }

    fn status() -> impl Strategy<Value = Value> {
        option::of((0..7i32, "[a-z]{1,8}-[0-9]", 0..5i64)).prop_map(|status| match status {
            None => Value::Null,
            Some((ready, primary, epoch)) => json!({
                "phase": "Running", "readyReplicas": ready, "replicas": ready,
                "observedGeneration": 3, "currentPrimary": primary, "failoverEpoch": epoch,
                "conditions": [{"type": "Ready", "status": "True", "reason": "InstancesReady",
                    "message": "ok", "lastTransitionTime": "2026-11-30T12:00:00Z", "observedGeneration": 3}],
            }),
        })
    }

    fn object(api_version: &str, metadata: Value, spec: Value, status: Value) -> Value {
        let mut object = json!({
            "apiVersion": api_version, "kind": "DatabaseCluster",
            "metadata": metadata, "spec": spec,
        });
        if !status.is_null() {
            object["status"] = status;
        }
        object
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn every_v1beta1_object_round_trips_unchanged(
            spec in beta_spec(), metadata in metadata(), status in status(),
        ) {
            let original = object(V1BETA1, metadata, serde_json::to_value(&spec).unwrap(), status);
            let alpha = convert(original.clone(), V1ALPHA1).unwrap();
            prop_assert_eq!(alpha["apiVersion"].as_str(), Some(V1ALPHA1));
            // What v1alpha1 shows is a valid v1alpha1 spec.
            let _: v1alpha1::DatabaseClusterSpec = serde_json::from_value(alpha["spec"].clone()).unwrap();
            let back = convert(alpha, V1BETA1).unwrap();
            prop_assert_eq!(back, original);
        }

        #[test]
        fn every_v1alpha1_object_round_trips_unchanged(
            spec in alpha_spec(), metadata in metadata(), status in status(),
        ) {
            let original = object(V1ALPHA1, metadata, serde_json::to_value(&spec).unwrap(), status);
            let beta = convert(original.clone(), V1BETA1).unwrap();
            let beta_spec: v1beta1::DatabaseClusterSpec = serde_json::from_value(beta["spec"].clone()).unwrap();
            // Nothing v1alpha1 says needs the annotation in v1beta1.
            prop_assert!(beta["metadata"]["annotations"].get(PRESERVED_ANNOTATION).is_none());
            prop_assert_eq!(beta_spec.backup.as_ref().map(|b| b.enabled), spec.backups_enabled.then_some(true));
            let back = convert(beta, V1ALPHA1).unwrap();
            prop_assert_eq!(back, original);
        }

        #[test]
        fn arbitrary_json_never_panics(value in arbitrary_json(), to_alpha in any::<bool>()) {
            let _ = convert(value, if to_alpha { V1ALPHA1 } else { V1BETA1 });
        }
    }

    fn arbitrary_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[ -~]{0,12}".prop_map(Value::String),
            prop_oneof![Just(V1ALPHA1), Just(V1BETA1), Just(PRESERVED_ANNOTATION)]
                .prop_map(|s| Value::String(s.into())),
        ];
        leaf.prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::Array),
                btree_map(
                    prop_oneof![
                        Just("apiVersion".to_string()),
                        Just("spec".to_string()),
                        Just("metadata".to_string()),
                        Just("annotations".to_string()),
                        Just("version".to_string()),
                        Just("storage".to_string()),
                        "[a-z]{1,6}",
                    ],
                    inner,
                    0..5
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn v1alpha1_fields_map_to_their_v1beta1_places() {
        let alpha = json!({
            "apiVersion": V1ALPHA1, "kind": "DatabaseCluster",
            "metadata": { "name": "orders", "namespace": "shop" },
            "spec": {
                "engine": "postgres", "replicas": 3, "version": "16.2",
                "storage": { "size": "10Gi" },
                "resources": { "cpu": "500m", "memory": "1Gi" },
                "backupsEnabled": true,
            },
        });
        let beta = convert(alpha, V1BETA1).unwrap();
        assert_eq!(
            beta["spec"]["resources"],
            json!({ "requests": { "cpu": "500m", "memory": "1Gi" } })
        );
        assert_eq!(beta["spec"]["backup"]["enabled"], json!(true));
        assert_eq!(beta["spec"]["backup"]["schedule"], json!("0 2 * * *"));
        assert!(beta["metadata"].get("annotations").is_none());
    }

    #[test]
    fn a_v1alpha1_edit_wins_over_the_preserved_fields() {
        let beta = json!({
            "apiVersion": V1BETA1, "kind": "DatabaseCluster",
            "metadata": { "name": "orders" },
            "spec": {
                "engine": "postgres", "replicas": 3, "version": "16.2",
                "storage": { "size": "10Gi" },
                "resources": { "requests": { "cpu": "1" }, "limits": { "memory": "2Gi" } },
                "backup": { "enabled": true, "schedule": "0 3 * * *" },
                "highAvailability": { "enabled": true },
            },
        });
        let mut alpha = convert(beta, V1ALPHA1).unwrap();
        assert_eq!(alpha["spec"]["resources"], json!({ "cpu": "1" }));
        assert!(alpha["metadata"]["annotations"][PRESERVED_ANNOTATION].is_string());
        alpha["spec"]["replicas"] = json!(5);
        alpha["spec"]["backupsEnabled"] = json!(false);
        alpha["spec"]["resources"] = json!({ "cpu": "2", "memory": "1Gi" });
        let beta = convert(alpha, V1BETA1).unwrap();
        assert_eq!(beta["spec"]["replicas"], json!(5));
        assert_eq!(beta["spec"]["backup"]["enabled"], json!(false));
        assert_eq!(beta["spec"]["backup"]["schedule"], json!("0 3 * * *"));
        assert_eq!(
            beta["spec"]["resources"],
            json!({ "requests": { "cpu": "2", "memory": "1Gi" }, "limits": { "memory": "2Gi" } })
        );
        assert_eq!(beta["spec"]["highAvailability"]["enabled"], json!(true));
    }

    #[test]
    fn errors_name_the_field() {
        let bad = json!({ "apiVersion": V1ALPHA1, "metadata": { "annotations": { PRESERVED_ANNOTATION: "{" } },
            "spec": { "version": "16.2", "storage": { "size": "1Gi" } } });
        let error = convert(bad, V1BETA1).unwrap_err().to_string();
        assert!(
            error.starts_with("metadata.annotations[\"db.devctl.io/v1beta1-fields\"]"),
            "{error}"
        );
        let error = convert(json!({ "apiVersion": "db.devctl.io/v2" }), V1BETA1).unwrap_err();
        assert!(matches!(error, ConversionError::UnknownVersion(_)));
        let error = convert(
            json!({ "apiVersion": V1BETA1, "spec": { "replicas": "x" } }),
            V1ALPHA1,
        )
        .unwrap_err();
        assert!(error.to_string().starts_with("spec: "), "{error}");
    }
}
