//! The StatefulSet running the engine.

use devctl_api::database_cluster::{DatabaseCluster, Engine};
use serde_json::{Value, json};

use super::{Inputs, Names, config_map, labels, metadata, port_name, selector};
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
    crate::children::template_image(&sts.spec.template)
}

/// The image for `version`: `spec.image` when set, else the engine's official image.
pub fn image(db: &DatabaseCluster, version: &str) -> String {
    match &db.spec.image {
        Some(image) => image.clone(),
        None => format!("{}:{version}", db.spec.engine.as_str()),
    }
}

/// Where the agent binary lives in the database container (copied in by the init container).
pub const AGENT_DIR: &str = "/devctl/bin";
/// The agent's `/healthz` and `/readyz` port.
pub const AGENT_HEALTH_PORT: u16 = devctl_api::instance::DEFAULT_HEALTH_PORT;
/// Where the projected ServiceAccount token is mounted (kube clients look there).
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn field_env(name: &str, path: &str) -> Value {
    json!({ "name": name, "valueFrom": { "fieldRef": { "fieldPath": path } } })
}

fn value_env(name: &str, value: impl Into<String>) -> Value {
    json!({ "name": name, "value": value.into() })
}

/// The agent's environment (names in `devctl_api::instance::env`): who it is, where its
/// engine's files are, and the Secret whose passwords it keeps the roles in line with.
fn agent_env(
    db: &DatabaseCluster,
    names: &Names,
    data_dir: &str,
    config_dir: &str,
    run_dir: &str,
) -> Value {
    use devctl_api::instance::env;
    let listen = match db.spec.engine {
        Engine::Postgres => "*",
        Engine::Mysql | Engine::Mariadb => "0.0.0.0",
    };
    let mut vars = json!([
        value_env(env::ENGINE, db.spec.engine.as_str()),
        value_env(env::CLUSTER, names.name.clone()),
        value_env(env::CREDENTIALS_SECRET, names.secret()),
        value_env(env::REPLICATION_SECRET, names.replication_secret()),
        // Replicas find the primary through the `-rw` Service.
        value_env(env::PRIMARY_FROM, "service"),
        field_env(env::POD_NAME, "metadata.name"),
        field_env(env::POD_NAMESPACE, "metadata.namespace"),
        field_env(env::POD_UID, "metadata.uid"),
        field_env(env::POD_IP, "status.podIP"),
        // A subdirectory: the volume's root may hold lost+found, which initdb refuses.
        value_env(env::DATA_DIR, format!("{data_dir}/data")),
        value_env(env::CONFIG_DIR, config_dir),
        value_env(env::RUN_DIR, run_dir),
        value_env(env::PORT, db.spec.port().to_string()),
        value_env(env::LISTEN_ADDRESS, listen),
        value_env(env::HEALTH_PORT, AGENT_HEALTH_PORT.to_string()),
    ]);
    // A restored cluster's first instance waits for its restore instead of initialising.
    if db
        .spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.recovery.is_some())
        && let Some(vars) = vars.as_array_mut()
    {
        vars.push(value_env(env::BOOTSTRAP, "recovery"));
    }
    vars
}

/// The projected token the agent talks to the API server with: short-lived and rotated by
/// the kubelet, with the cluster CA and the namespace, at the path kube clients look at.
fn token_volume() -> Value {
    json!({
        "name": "agent-token",
        "projected": {
            "sources": [
                { "serviceAccountToken": { "path": "token", "expirationSeconds": 3600 } },
                { "configMap": { "name": "kube-root-ca.crt", "items": [{ "key": "ca.crt", "path": "ca.crt" }] } },
                { "downwardAPI": { "items": [{ "path": "namespace", "fieldRef": { "fieldPath": "metadata.namespace" } }] } },
            ]
        }
    })
}

/// Why `spec.replicas` cannot be honoured, if it cannot: `engine: mysql` runs one instance
/// (no MySQL server can be tested here; MariaDB replicates: docs/mariadb.md).
pub fn replication_refused(db: &DatabaseCluster) -> Option<String> {
    (db.spec.engine == Engine::Mysql && db.spec.replicas > 1).then(|| {
        format!(
            "spec.replicas {}: engine mysql runs one instance (no replication); use engine mariadb for replicas and failover; running 1 instance",
            db.spec.replicas
        )
    })
}

/// The ordinal of the recorded primary (`status.currentPrimary`) when `spec.replicas` would
/// remove it: a StatefulSet scales down from its highest ordinal, and after a failover or a
/// switchover the primary may be there.
fn primary_beyond_replicas(db: &DatabaseCluster) -> Option<(&str, i32)> {
    let status = db.status.as_ref()?;
    let name = db.metadata.name.as_deref()?;
    // The primary, and the pod becoming it (a switchover or an elected failover target): a
    // scale-down must not remove the one taking over either. Only this cluster's own pod
    // names within the schema's bound count, whatever the status says.
    let ordinal_of = |pod: &str| {
        pod.strip_prefix(name)?
            .strip_prefix('-')?
            .parse::<i32>()
            .ok()
            .filter(|o| (0..MAX_INSTANCES).contains(o))
    };
    let target = status
        .target_primary
        .as_deref()
        .filter(|t| *t != devctl_api::instance::TARGET_PENDING);
    [status.current_primary.as_deref(), target]
        .into_iter()
        .flatten()
        .filter_map(|pod| Some((pod, ordinal_of(pod)?)))
        .filter(|(_, ordinal)| *ordinal >= db.spec.replicas)
        .max_by_key(|(_, ordinal)| *ordinal)
        .filter(|_| replication_refused(db).is_none())
}

/// The most instances a cluster runs (`spec.replicas`' schema maximum).
const MAX_INSTANCES: i32 = 7;

/// Why a scale-down is not carried out, if it is not: it would remove the primary. The
/// instances up to the primary keep running (nothing is lost, writes go on) until a human
/// moves the primary to an instance that stays.
pub fn scale_down_refused(db: &DatabaseCluster) -> Option<String> {
    let (primary, ordinal) = primary_beyond_replicas(db)?;
    let name = db.metadata.name.as_deref().unwrap_or_default();
    Some(format!(
        "spec.replicas {}: scaling down would remove the primary {primary}; running {} instances until the primary is one that stays: `devctl db promote {name} {name}-0`, then the scale-down proceeds",
        db.spec.replicas,
        ordinal + 1
    ))
}

/// The instances to run: `spec.replicas`; 1 while replication is refused; up to the primary
/// while a scale-down would remove it.
pub fn instances(db: &DatabaseCluster) -> i32 {
    if replication_refused(db).is_some() {
        1
    } else if let Some((_, ordinal)) = primary_beyond_replicas(db) {
        ordinal + 1
    } else {
        db.spec.replicas
    }
}

/// PostgreSQL: the init container running the upgrade step of a major upgrade
/// (docs/major-upgrade.md). It exits at once unless `status.majorUpgrade` names its instance;
/// it runs in `spec.upgrade.image` when set (which must carry both majors' binaries), else in
/// the engine's `image`, so the template does not change when an upgrade begins or ends.
fn upgrade_step(
    db: &DatabaseCluster,
    names: &Names,
    image: &str,
    (data_dir, run_dir): (&str, &str),
) -> Value {
    let upgrade_image = db
        .spec
        .upgrade
        .as_ref()
        .and_then(|u| u.image.clone())
        .unwrap_or_else(|| image.to_string());
    json!({
        "name": "major-upgrade",
        "image": upgrade_image,
        "command": [format!("{AGENT_DIR}/devctl-agent")],
        "args": ["major-upgrade"],
        "env": agent_env(db, names, data_dir, postgres::CONFIG_DIR, run_dir),
        "resources": engine::effective_resources(&db.spec),
        "securityContext": pod_security::restricted_container(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            { "name": DATA_VOLUME, "mountPath": data_dir },
            { "name": "run", "mountPath": run_dir },
            { "name": "agent", "mountPath": AGENT_DIR, "readOnly": true },
            { "name": "agent-token", "mountPath": TOKEN_DIR, "readOnly": true },
        ],
    })
}

pub fn desired(db: &DatabaseCluster, names: &Names, inputs: &Inputs<'_>) -> Result<Child> {
    let spec = &db.spec;
    let name = names.stateful_set();
    let image = image(db, inputs.version);
    let port = spec.port();
    let port_name = port_name(db);

    let (config_dir, data_dir, run_dir) = match spec.engine {
        Engine::Postgres => (
            postgres::CONFIG_DIR,
            postgres::DATA_DIR,
            "/var/run/postgresql",
        ),
        Engine::Mysql | Engine::Mariadb => (mysql::CONFIG_DIR, mysql::DATA_DIR, "/var/run/mysqld"),
    };
    // The agent answers for the engine: ready only once the engine accepts connections.
    let probe = |path: &str, initial_delay: i32, failure_threshold: i32| {
        json!({
            "httpGet": { "path": path, "port": "agent-health" },
            "initialDelaySeconds": initial_delay,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": failure_threshold,
        })
    };
    let container = json!({
        "name": spec.engine.as_str(),
        "image": image,
        "command": [format!("{AGENT_DIR}/devctl-agent")],
        "ports": [
            { "name": port_name, "containerPort": port, "protocol": "TCP" },
            { "name": "agent-health", "containerPort": AGENT_HEALTH_PORT, "protocol": "TCP" },
        ],
        "env": agent_env(db, names, data_dir, config_dir, run_dir),
        "resources": engine::effective_resources(spec),
        "securityContext": pod_security::restricted_container(),
        // The agent's one-line reason for exiting, for `kubectl describe` and the operator.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            { "name": DATA_VOLUME, "mountPath": data_dir },
            { "name": "config", "mountPath": config_dir, "readOnly": true },
            { "name": "run", "mountPath": run_dir },
            { "name": "agent", "mountPath": AGENT_DIR, "readOnly": true },
            { "name": "agent-token", "mountPath": TOKEN_DIR, "readOnly": true },
        ],
        "livenessProbe": probe("/healthz", 30, 6),
        "readinessProbe": probe("/readyz", 5, 3),
    });
    // The operator's image has no shell: the agent copies itself.
    let install_agent = json!({
        "name": "install-agent",
        "image": inputs.agent_image,
        "command": ["/devctl-agent", "install", AGENT_DIR],
        "securityContext": pod_security::restricted_container(),
        "resources": {
            "requests": { "cpu": "10m", "memory": "16Mi" },
            "limits": { "memory": "64Mi" },
        },
        "volumeMounts": [{ "name": "agent", "mountPath": AGENT_DIR }],
    });

    let mut init_containers = vec![install_agent];
    if spec.engine == Engine::Postgres {
        init_containers.push(upgrade_step(db, names, &image, (data_dir, run_dir)));
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
            "replicas": instances(db),
            "serviceName": names.headless_service(),
            "selector": { "matchLabels": selector(db) },
            "podManagementPolicy": "OrderedReady",
            // The operator replaces pods itself: replicas first, the primary last, one at a
            // time, each streaming again before the next.
            "updateStrategy": { "type": "OnDelete" },
            "template": {
                "metadata": {
                    "labels": labels(db, "database", inputs.version),
                    "annotations": { CONFIG_HASH_ANNOTATION: config_map::hash(db) },
                },
                "spec": {
                    "serviceAccountName": names.agent(),
                    "automountServiceAccountToken": false,
                    "securityContext": pod_security::restricted_pod(Some(DATABASE_UID)),
                    "enableServiceLinks": false,
                    "terminationGracePeriodSeconds": 60,
                    "initContainers": init_containers,
                    "containers": [container],
                    "volumes": [
                        { "name": "config", "configMap": { "name": names.config_map() } },
                        { "name": "run", "emptyDir": {} },
                        { "name": "agent", "emptyDir": {} },
                        token_volume(),
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
    fn a_scale_down_that_would_remove_the_primary_keeps_it_and_says_how_to_proceed() {
        let with_primary = |replicas: i32, primary: &str| {
            let mut db = sample();
            db.spec.replicas = replicas;
            db.status = Some(devctl_api::database_cluster::DatabaseClusterStatus {
                current_primary: Some(primary.into()),
                ..Default::default()
            });
            db
        };
        let db = with_primary(3, "my-postgres-4");
        assert_eq!(instances(&db), 5);
        let message = scale_down_refused(&db).unwrap();
        assert!(message.contains("spec.replicas 3"), "{message}");
        assert!(
            message.contains("devctl db promote my-postgres my-postgres-0"),
            "{message}"
        );
        let names = Names::of(&db).unwrap();
        let sts = desired(&db, &names, &inputs()).unwrap();
        assert_eq!(sts.body["spec"]["replicas"], 5);
        // Once the primary is an instance that stays, the scale-down goes ahead.
        let moved = with_primary(3, "my-postgres-0");
        assert_eq!((instances(&moved), scale_down_refused(&moved)), (3, None));
        assert_eq!(instances(&with_primary(5, "my-postgres-4")), 5);
        // A switchover under way to a high ordinal keeps it too.
        let mut switching = with_primary(3, "my-postgres-0");
        switching.status.as_mut().unwrap().target_primary = Some("my-postgres-5".into());
        assert_eq!(instances(&switching), 6);
        switching.status.as_mut().unwrap().target_primary = Some("pending".into());
        assert_eq!(instances(&switching), 3);
        // Only this cluster's pods within the schema's bound count.
        assert_eq!(instances(&with_primary(3, "other-6")), 3);
        assert_eq!(instances(&with_primary(3, "my-postgres-999")), 3);
    }

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
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(container["command"][0], "/devctl/bin/devctl-agent");
        assert_eq!(pod["initContainers"][0]["command"][0], "/devctl-agent");
        assert_eq!(pod["serviceAccountName"], "my-postgres-agent");
        assert_eq!(pod["automountServiceAccountToken"], false);
        // No password reaches the pod spec: the agent reads the Secret through the API.
        assert!(!sts.to_string().contains("s3cretpassword"));
        assert_eq!(
            spec["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
            "10Gi"
        );
        assert!(spec["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION].is_string());
        // Volumes allowed by `restricted` only.
        for volume in pod["volumes"].as_array().unwrap() {
            assert!(
                volume.get("configMap").is_some()
                    || volume.get("emptyDir").is_some()
                    || volume.get("projected").is_some()
            );
        }
    }

    #[test]
    fn the_upgrade_step_runs_in_spec_upgrade_image_else_the_engines() {
        let mut db = sample();
        let names = Names::of(&db).unwrap();
        let step = |db: &DatabaseCluster| {
            let sts = desired(db, &names, &inputs()).unwrap().body;
            sts["spec"]["template"]["spec"]["initContainers"][1].clone()
        };
        let default = step(&db);
        assert_eq!(default["name"], "major-upgrade");
        assert_eq!(default["args"][0], "major-upgrade");
        assert_eq!(
            default["image"],
            sts_image(&desired(&db, &names, &inputs()).unwrap().body)
        );
        db.spec.upgrade = Some(devctl_api::database_cluster::UpgradeSpec {
            image: Some("registry.example/postgres:17-with-15".into()),
            ..Default::default()
        });
        assert_eq!(step(&db)["image"], "registry.example/postgres:17-with-15");
    }

    fn sts_image(sts: &Value) -> Value {
        sts["spec"]["template"]["spec"]["containers"][0]["image"].clone()
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
