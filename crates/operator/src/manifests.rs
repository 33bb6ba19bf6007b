//! Everything `devctl operator install` puts into a cluster, generated from Rust: the CRDs
//! (from the API types), the RBAC rules (the one list of what the operator may do) and the
//! Deployment. `deploy/operator.yaml` is this output, kept in sync by a test.

use serde_json::{Value, json};

/// Namespace the operator runs in.
pub const NAMESPACE: &str = "devctl-system";
/// Name of the ServiceAccount, ClusterRole, ClusterRoleBinding and Deployment.
pub const NAME: &str = "devctl-operator";
/// Field manager of `devctl operator install`.
pub const INSTALL_FIELD_MANAGER: &str = "devctl-install";
/// The operator image built from this version.
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/devctl/devctl-operator:v",
    env!("CARGO_PKG_VERSION")
);

/// One RBAC rule: API group, resources, verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

const READ: &[&str] = &["get", "list", "watch"];
const OWN: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

/// Exactly what the operator does, and nothing with `*`:
/// - its own resources: watch them, patch finalizers (kube-runtime's finalizer helper),
///   patch status (server-side apply), update `finalizers` (needed to set
///   `blockOwnerDeletion` on children when OwnerReferencesPermissionEnforcement is on);
/// - children: watch (label-selected caches), create+patch (server-side apply creates),
///   delete (orphans such as the `-ro` Service after scaling to 1), get (the credentials
///   Secret is read before a password is ever generated);
/// - PersistentVolumeClaims: watch and patch (volume expansion), never create or delete;
/// - events.k8s.io events: create and patch (the recorder folds repeats into series).
pub const RULES: &[Rule] = &[
    Rule {
        group: "db.devctl.io",
        resources: &["databaseclusters"],
        verbs: &["get", "list", "watch", "patch"],
    },
    Rule {
        group: "db.devctl.io",
        resources: &["databaseclusters/status"],
        verbs: &["patch"],
    },
    Rule {
        group: "db.devctl.io",
        resources: &["databaseclusters/finalizers"],
        verbs: &["update"],
    },
    Rule {
        group: "apps.devctl.io",
        resources: &["webapps"],
        verbs: READ,
    },
    Rule {
        group: "apps.devctl.io",
        resources: &["webapps/status"],
        verbs: &["patch"],
    },
    Rule {
        group: "apps.devctl.io",
        resources: &["webapps/finalizers"],
        verbs: &["update"],
    },
    Rule {
        group: "",
        resources: &["configmaps", "secrets", "services"],
        verbs: OWN,
    },
    Rule {
        group: "apps",
        resources: &["statefulsets", "deployments"],
        verbs: OWN,
    },
    Rule {
        group: "policy",
        resources: &["poddisruptionbudgets"],
        verbs: OWN,
    },
    Rule {
        group: "",
        resources: &["persistentvolumeclaims"],
        verbs: &["get", "list", "watch", "patch"],
    },
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
    },
];

/// The leader-election Role, in the operator's namespace only: read and renew its one Lease
/// (server-side apply is a patch), create it the first time (create cannot be limited by name).
pub const LEADER_ELECTION_RULES: &[(&[&str], Option<&str>)] = &[
    (&["create"], None),
    (&["get", "patch"], Some(crate::leader_election::LEASE_NAME)),
];

/// Name of the leader-election Role and RoleBinding.
pub const LEADER_ELECTION_NAME: &str = "devctl-operator-leader-election";

/// Port of /metrics, /healthz and /readyz.
pub const METRICS_PORT: i32 = 8080;

/// Options of `devctl operator install`.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    pub image: String,
    pub replicas: i32,
}

impl Default for InstallOptions {
    fn default() -> Self {
        Self {
            image: DEFAULT_IMAGE.into(),
            replicas: 1,
        }
    }
}

fn labels() -> Value {
    json!({
        "app.kubernetes.io/name": NAME,
        "app.kubernetes.io/instance": NAME,
        "app.kubernetes.io/component": "operator",
        "app.kubernetes.io/part-of": "devctl",
        "app.kubernetes.io/managed-by": INSTALL_FIELD_MANAGER,
        "app.kubernetes.io/version": env!("CARGO_PKG_VERSION"),
    })
}

/// The ClusterRole's rules as Kubernetes PolicyRules.
pub fn policy_rules(rules: &[Rule]) -> Value {
    Value::Array(
        rules
            .iter()
            .map(|r| json!({ "apiGroups": [r.group], "resources": r.resources, "verbs": r.verbs }))
            .collect(),
    )
}

/// The ClusterRole granting `rules` (tests install variants with a rule removed).
pub fn cluster_role(rules: &[Rule]) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": { "name": NAME, "labels": labels() },
        "rules": policy_rules(rules),
    })
}

/// Every object to install, in apply order (CRDs and namespace first, the Deployment last).
pub fn manifests(options: &InstallOptions) -> Vec<Value> {
    let mut objects: Vec<Value> = devctl_api::crds()
        .into_iter()
        .map(|crd| serde_json::to_value(crd).unwrap_or(Value::Null))
        .collect();
    let restricted = json!({ "pod-security.kubernetes.io/enforce": "restricted" });
    let mut namespace_labels = labels();
    if let (Some(map), Some(extra)) = (namespace_labels.as_object_mut(), restricted.as_object()) {
        map.extend(extra.clone());
    }
    objects.extend([
        json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": { "name": NAMESPACE, "labels": namespace_labels },
        }),
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": { "name": NAME, "namespace": NAMESPACE, "labels": labels() },
        }),
        cluster_role(RULES),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": NAME, "labels": labels() },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME },
            "subjects": [{ "kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE }],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": LEADER_ELECTION_NAME, "namespace": NAMESPACE, "labels": labels() },
            "rules": LEADER_ELECTION_RULES.iter().map(|(verbs, name)| {
                let mut rule = json!({ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": verbs });
                if let Some(name) = name {
                    rule["resourceNames"] = json!([name]);
                }
                rule
            }).collect::<Vec<_>>(),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": LEADER_ELECTION_NAME, "namespace": NAMESPACE, "labels": labels() },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEADER_ELECTION_NAME },
            "subjects": [{ "kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE }],
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": format!("{NAME}-metrics"), "namespace": NAMESPACE, "labels": labels() },
            "spec": {
                "selector": { "app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": NAME },
                "ports": [{ "name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP" }],
            }
        }),
        deployment(options),
    ]);
    objects
}

fn deployment(options: &InstallOptions) -> Value {
    let selector = json!({ "app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": NAME });
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": NAME, "namespace": NAMESPACE, "labels": labels() },
        "spec": {
            "replicas": options.replicas,
            "selector": { "matchLabels": selector },
            "template": {
                "metadata": { "labels": labels() },
                "spec": {
                    "serviceAccountName": NAME,
                    "securityContext": crate::pod_security::restricted_pod(Some(65532)),
                    "containers": [{
                        "name": "operator",
                        "image": options.image,
                        "args": ["--log-format=json", "--leader-elect", format!("--metrics-bind-address=0.0.0.0:{METRICS_PORT}")],
                        "ports": [{ "name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP" }],
                        "livenessProbe": { "httpGet": { "path": "/healthz", "port": "metrics" }, "periodSeconds": 10 },
                        "readinessProbe": { "httpGet": { "path": "/readyz", "port": "metrics" }, "periodSeconds": 5 },
                        "env": [
                            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                            { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                        ],
                        "resources": {
                            "requests": { "cpu": "50m", "memory": "64Mi" },
                            "limits": { "memory": "256Mi" },
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "capabilities": { "drop": ["ALL"] },
                            "runAsNonRoot": true,
                            "readOnlyRootFilesystem": true,
                            "seccompProfile": { "type": "RuntimeDefault" },
                        },
                    }],
                }
            }
        }
    })
}

/// The manifests as one multi-document YAML stream.
pub fn to_yaml(objects: &[Value]) -> Result<String, devctl_api::YamlError> {
    let mut out = String::new();
    for object in objects {
        out.push_str("---\n");
        out.push_str(&devctl_api::to_yaml(object)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_wildcards_and_events_can_be_folded() {
        for rule in RULES {
            assert!(!rule.group.contains('*'));
            assert!(
                rule.resources
                    .iter()
                    .chain(rule.verbs)
                    .all(|s| !s.contains('*')),
                "{rule:?}"
            );
        }
        assert!(
            RULES
                .iter()
                .any(|r| r.group == "events.k8s.io" && r.verbs == ["create", "patch"])
        );
    }

    #[test]
    fn manifests_start_with_crds_and_end_with_the_deployment() {
        let objects = manifests(&InstallOptions::default());
        assert_eq!(objects[0]["kind"], "CustomResourceDefinition");
        assert_eq!(objects.last().unwrap()["kind"], "Deployment");
        assert!(objects.iter().all(|o| o["metadata"]["name"].is_string()));
    }
}
