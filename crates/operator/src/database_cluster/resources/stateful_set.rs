//! The StatefulSet running the engine.

use devctl_api::database_cluster::{DatabaseCluster, Engine};
use serde_json::{Value, json};

use super::{Inputs, Names, config_map, labels, metadata, selector, services};
use k8s_openapi::api::apps::v1::StatefulSet;

use crate::children::Child;
use crate::engine::{self, mysql, postgres};
use crate::error::Result;
use crate::pod_security;

/// Annotation on the pod template carrying the configuration hash.
pub const CONFIG_HASH_ANNOTATION: &str = "db.devctl.io/config-hash";

/// The UID/GID the official postgres and mysql images run as.
const DATABASE_UID: i64 = 999;

/// Name of the volume claim template (PVCs are `data-<name>-<ordinal>`).
pub const DATA_VOLUME: &str = "data";

fn claim_labels(db: &DatabaseCluster) -> std::collections::BTreeMap<String, String> {
    let mut labels = labels(db, "storage", "");
    labels.remove(devctl_api::labels::VERSION);
    labels
}

/// The image the StatefulSet's database container runs.
pub fn image_of(sts: &k8s_openapi::api::apps::v1::StatefulSet) -> Option<&str> {
    sts.spec
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .as_deref()
}

/// The image for `version`: `spec.image` when set, else the engine's official image.
pub fn image(db: &DatabaseCluster, version: &str) -> String {
    match &db.spec.image {
        Some(image) => image.clone(),
        None => format!("{}:{version}", db.spec.engine.as_str()),
    }
}

fn secret_env(name: &str, secret: &str, key: &str) -> Value {
    json!({ "name": name, "valueFrom": { "secretKeyRef": { "name": secret, "key": key } } })
}

pub fn desired(db: &DatabaseCluster, names: &Names, inputs: &Inputs<'_>) -> Result<Child> {
    let spec = &db.spec;
    let name = names.stateful_set();
    let secret_name = names.secret();
    let image = image(db, inputs.version);
    let port = spec.port();
    let port_name = services::port_name(db);

    let (config_dir, data_dir, run_dir, args, env, probe_command) = match spec.engine {
        Engine::Postgres => (
            postgres::CONFIG_DIR,
            postgres::DATA_DIR,
            "/var/run/postgresql",
            json!([
                "-c",
                format!("config_file={}/{}", postgres::CONFIG_DIR, postgres::CONF),
                "-c",
                format!("hba_file={}/{}", postgres::CONFIG_DIR, postgres::HBA),
            ]),
            json!([
                secret_env("POSTGRES_USER", &secret_name, "username"),
                secret_env("POSTGRES_PASSWORD", &secret_name, "password"),
                secret_env("POSTGRES_DB", &secret_name, "dbname"),
                // A subdirectory: the volume's root may hold lost+found, which initdb refuses.
                { "name": "PGDATA", "value": format!("{}/pgdata", postgres::DATA_DIR) },
            ]),
            json!(["pg_isready", "--host=127.0.0.1", format!("--port={port}")]),
        ),
        Engine::Mysql => (
            mysql::CONFIG_DIR,
            mysql::DATA_DIR,
            "/var/run/mysqld",
            json!([]),
            json!([
                secret_env("MYSQL_USER", &secret_name, "username"),
                secret_env("MYSQL_PASSWORD", &secret_name, "password"),
                secret_env("MYSQL_DATABASE", &secret_name, "dbname"),
                { "name": "MYSQL_RANDOM_ROOT_PASSWORD", "value": "yes" },
            ]),
            json!([
                "mysqladmin",
                "ping",
                "--host=127.0.0.1",
                format!("--port={port}")
            ]),
        ),
    };
    let probe = |initial_delay: i32, failure_threshold: i32| {
        json!({
            "exec": { "command": probe_command },
            "initialDelaySeconds": initial_delay,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": failure_threshold,
        })
    };
    let mut container = json!({
        "name": spec.engine.as_str(),
        "image": image,
        "ports": [{ "name": port_name, "containerPort": port, "protocol": "TCP" }],
        "env": env,
        "resources": engine::effective_resources(spec),
        "securityContext": pod_security::restricted_container(),
        "volumeMounts": [
            { "name": DATA_VOLUME, "mountPath": data_dir },
            { "name": "config", "mountPath": config_dir, "readOnly": true },
            { "name": "run", "mountPath": run_dir },
        ],
        "livenessProbe": probe(30, 6),
        "readinessProbe": probe(5, 3),
    });
    if args.as_array().is_some_and(|a| !a.is_empty()) {
        container["args"] = args;
    }

    let claim_size = inputs.existing_claim_size.unwrap_or(&spec.storage.size);
    let mut claim_spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": { "requests": { "storage": claim_size } },
    });
    if let Some(class) = &spec.storage.storage_class_name {
        claim_spec["storageClassName"] = json!(class);
    }

    Child::new::<StatefulSet>(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(db, names, &name, "database", inputs.version)?,
        "spec": {
            "replicas": spec.replicas,
            "serviceName": names.headless_service(),
            "selector": { "matchLabels": selector(db) },
            "podManagementPolicy": "OrderedReady",
            "updateStrategy": { "type": "RollingUpdate" },
            "template": {
                "metadata": {
                    "labels": labels(db, "database", inputs.version),
                    "annotations": { CONFIG_HASH_ANNOTATION: config_map::hash(db) },
                },
                "spec": {
                    "securityContext": pod_security::restricted_pod(Some(DATABASE_UID)),
                    "enableServiceLinks": false,
                    "terminationGracePeriodSeconds": 60,
                    "containers": [container],
                    "volumes": [
                        { "name": "config", "configMap": { "name": names.config_map() } },
                        { "name": "run", "emptyDir": {} },
                    ],
                }
            },
            "volumeClaimTemplates": [{
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": DATA_VOLUME,
                    // No version label: claim templates are immutable, versions are not.
                    "labels": claim_labels(db),
                },
                "spec": claim_spec,
            }],
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn statefulset_passes_restricted_and_wires_config_and_secret() {
        let db = sample();
        let names = Names::of(&db).unwrap();
        let sts = desired(&db, &names, &inputs()).unwrap().body;
        let spec = &sts["spec"];
        assert_eq!(spec["replicas"], 3);
        assert_eq!(spec["serviceName"], "my-postgres-headless");
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let container = &pod["containers"][0];
        assert_eq!(container["image"], "postgres:16.2");
        assert_eq!(
            container["securityContext"]["allowPrivilegeEscalation"],
            false
        );
        assert_eq!(
            container["securityContext"]["capabilities"]["drop"][0],
            "ALL"
        );
        assert_eq!(container["resources"]["requests"]["cpu"], "250m");
        assert_eq!(container["resources"]["requests"]["memory"], "512Mi");
        assert_eq!(
            container["readinessProbe"]["exec"]["command"][0],
            "pg_isready"
        );
        assert_eq!(
            spec["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
            "10Gi"
        );
        assert!(spec["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION].is_string());
        // Volumes allowed by `restricted` only.
        for volume in pod["volumes"].as_array().unwrap() {
            assert!(volume.get("configMap").is_some() || volume.get("emptyDir").is_some());
        }
    }

    #[test]
    fn claim_template_keeps_the_existing_size() {
        let mut db = sample();
        db.spec.storage.size = "20Gi".into();
        let names = Names::of(&db).unwrap();
        let mut inputs = inputs();
        inputs.existing_claim_size = Some("10Gi");
        let sts = desired(&db, &names, &inputs).unwrap().body;
        assert_eq!(
            sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
            "10Gi"
        );
    }

    #[test]
    fn config_changes_change_the_pod_template_hash() {
        let db = sample();
        let mut bigger = sample();
        bigger.spec.resources =
            Some(serde_json::from_value(json!({ "limits": { "memory": "8Gi" } })).unwrap());
        assert_ne!(config_map::hash(&db), config_map::hash(&bigger));
    }
}
