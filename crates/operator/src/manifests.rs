//! Everything `devctl operator install` puts into a cluster, generated from Rust: the CRDs
//! (from the API types), the RBAC rules (the one list of what the operator may do) and the
//! Deployment. `deploy/operator.yaml` is this output, kept in sync by a test.
//!
//! Two scopes, one list of rules ([`RULES`]): watching every namespace, the rules are a
//! ClusterRole bound cluster-wide; watching some namespaces
//! ([`InstallOptions::watch_namespaces`]), they are a Role and RoleBinding in each of them and
//! nothing of the operator's is cluster-wide (it reads nothing cluster-scoped: CRDs are
//! installed by the CLI, not the operator). Either way users get the aggregated ClusterRoles
//! [`USER_EDIT_NAME`] and [`USER_VIEW_NAME`].

use serde_json::{Value, json};

pub use crate::names::{DEFAULT_IMAGE, INSTALL_FIELD_MANAGER, NAME, NAMESPACE};

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
/// - PersistentVolumeClaims: watch and patch (volume expansion), delete (a deleted cluster's
///   data claims, unless kept), never create;
/// - pods: watch (the agents' reports are annotations on their pods), patch (role labels) and
///   delete (ordered replacement after a template change: the StatefulSet uses `OnDelete`);
/// - the agents' ServiceAccount, Role and RoleBinding per cluster: owned like other
///   children (the operator holds every right those Roles grant);
/// - Leases: a cluster's primary lock is a child like the others (watched to notice a
///   primary that stops renewing it), plus `update`, which the operator never uses but
///   grants the agents (they take and renew the lock with it);
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
        group: "db.devctl.io",
        resources: &["databasebackups"],
        // patch: the label with the uid of the cluster a backup was made of.
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
    Rule {
        group: "db.devctl.io",
        resources: &["databasebackups/status"],
        verbs: &["patch"],
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
        verbs: &["get", "list", "watch", "patch", "delete"],
    },
    Rule {
        group: "",
        resources: &["pods"],
        verbs: &["get", "list", "watch", "patch", "delete"],
    },
    Rule {
        group: "",
        resources: &["serviceaccounts"],
        verbs: OWN,
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resources: &["roles", "rolebindings"],
        verbs: OWN,
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &[
            "get", "list", "watch", "create", "patch", "delete", "update",
        ],
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

/// [`LEADER_ELECTION_RULES`] as the `rules` of a Role.
pub fn leader_election_policy_rules() -> Value {
    LEADER_ELECTION_RULES
        .iter()
        .map(|(verbs, name)| {
            let mut rule = json!({ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": verbs });
            if let Some(name) = name {
                rule["resourceNames"] = json!([name]);
            }
            rule
        })
        .collect()
}

/// Name of the leader-election Role and RoleBinding.
pub const LEADER_ELECTION_NAME: &str = "devctl-operator-leader-election";

/// Name of the ClusterRole aggregated into the built-in `edit` and `admin` ClusterRoles.
pub const USER_EDIT_NAME: &str = "devctl-edit";
/// Name of the ClusterRole aggregated into the built-in `view` ClusterRole.
pub const USER_VIEW_NAME: &str = "devctl-view";

/// What users bound to the built-in `edit` (and `admin`) ClusterRole may do with devctl's
/// resources: everything but writing status, which is the operator's.
pub const USER_EDIT_RULES: &[Rule] = &[
    Rule {
        group: "db.devctl.io",
        resources: &["databaseclusters", "databasebackups"],
        verbs: USER_EDIT_VERBS,
    },
    Rule {
        group: "apps.devctl.io",
        resources: &["webapps"],
        verbs: USER_EDIT_VERBS,
    },
];

const USER_EDIT_VERBS: &[&str] = &[
    "create", "update", "patch", "delete", "get", "list", "watch",
];

/// What users bound to the built-in `view` ClusterRole may read of devctl's resources.
pub const USER_VIEW_RULES: &[Rule] = &[
    Rule {
        group: "db.devctl.io",
        resources: &[
            "databaseclusters",
            "databaseclusters/status",
            "databasebackups",
            "databasebackups/status",
        ],
        verbs: READ,
    },
    Rule {
        group: "apps.devctl.io",
        resources: &["webapps", "webapps/status"],
        verbs: READ,
    },
];

/// Port of /metrics, /healthz and /readyz.
pub const METRICS_PORT: i32 = 8080;

/// Name of the webhooks' ClusterRole and ClusterRoleBinding, and of their Role and
/// RoleBinding in the operator's namespace (installed when the operator watches every
/// namespace: webhook configurations are cluster-wide).
pub const WEBHOOK_NAME: &str = "devctl-operator-webhook";

/// What the webhooks need cluster-wide, each rule limited to the objects by name: keep the
/// CA (and, with `--webhook-url`, the address) in the two webhook configurations and the
/// CRD's conversion stanza.
pub fn webhook_cluster_rules() -> Value {
    json!([
        { "apiGroups": ["admissionregistration.k8s.io"],
          "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
          "verbs": ["get", "patch"], "resourceNames": [NAME] },
        { "apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
          "verbs": ["get", "patch"],
          "resourceNames": [crate::webhook::configuration::CRD_NAME] },
    ])
}

/// What the webhooks need in the operator's namespace: the Secret with the self-managed
/// certificate (create cannot be limited by name).
pub fn webhook_namespace_rules() -> Value {
    json!([
        { "apiGroups": [""], "resources": ["secrets"], "verbs": ["create"] },
        { "apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "update"],
          "resourceNames": [crate::webhook::CERT_SECRET] },
    ])
}

/// The webhook objects of a cluster-wide install: RBAC, the Service the API server calls,
/// and the two configurations (the operator injects their CA when it starts).
fn webhook_objects() -> Vec<Value> {
    let subjects = json!([{ "kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE }]);
    let settings = crate::webhook::WebhookSettings::default();
    vec![
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": WEBHOOK_NAME, "labels": labels() },
            "rules": webhook_cluster_rules(),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": WEBHOOK_NAME, "labels": labels() },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": WEBHOOK_NAME },
            "subjects": subjects,
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": WEBHOOK_NAME, "namespace": NAMESPACE, "labels": labels() },
            "rules": webhook_namespace_rules(),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": WEBHOOK_NAME, "namespace": NAMESPACE, "labels": labels() },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": WEBHOOK_NAME },
            "subjects": subjects,
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": settings.service_name, "namespace": NAMESPACE, "labels": labels() },
            "spec": {
                "selector": { "app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": NAME },
                "ports": [{ "name": "webhook", "port": crate::webhook::configuration::SERVICE_PORT, "targetPort": crate::webhook::PORT, "protocol": "TCP" }],
            }
        }),
        crate::webhook::configuration::validating(&settings, ""),
        crate::webhook::configuration::mutating(&settings, ""),
    ]
}

/// Options of `devctl operator install`.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    pub image: String,
    pub replicas: i32,
    /// Namespaces the operator watches. Empty: every namespace, with [`RULES`] granted by a
    /// ClusterRole; otherwise a Role and RoleBinding per namespace and the Deployment runs
    /// with `--watch-namespace` for each.
    pub watch_namespaces: Vec<String>,
}

impl Default for InstallOptions {
    fn default() -> Self {
        Self {
            image: DEFAULT_IMAGE.into(),
            replicas: 1,
            watch_namespaces: Vec::new(),
        }
    }
}

impl InstallOptions {
    /// The watched namespaces sorted and without duplicates (the rendering order, so the
    /// output does not depend on the order of the flags).
    pub fn watched(&self) -> Vec<String> {
        let set: std::collections::BTreeSet<&String> = self.watch_namespaces.iter().collect();
        set.into_iter().cloned().collect()
    }
}

/// Checks a `--watch-namespace` value: a namespace name is a DNS-1123 label (lowercase
/// letters, digits and `-`, starting and ending with a letter or digit, at most 63 characters).
pub fn validate_namespace(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a namespace name (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)"
        ))
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

/// Rules as Kubernetes PolicyRules.
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

/// The Role granting `rules` in `namespace` (watching some namespaces: one per namespace).
pub fn role(namespace: &str, rules: &[Rule]) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": { "name": NAME, "namespace": namespace, "labels": labels() },
        "rules": policy_rules(rules),
    })
}

/// The RoleBinding of [`role`] to the operator's ServiceAccount.
pub fn role_binding(namespace: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": NAME, "namespace": namespace, "labels": labels() },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME },
        "subjects": [{ "kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE }],
    })
}

/// The operator's grant of [`RULES`]: a ClusterRole and ClusterRoleBinding when it watches
/// every namespace, else a Role and RoleBinding in each watched namespace.
fn operator_grant(watched: &[String]) -> Vec<Value> {
    if watched.is_empty() {
        return vec![
            cluster_role(RULES),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": { "name": NAME, "labels": labels() },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME },
                "subjects": [{ "kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE }],
            }),
        ];
    }
    watched
        .iter()
        .flat_map(|namespace| [role(namespace, RULES), role_binding(namespace)])
        .collect()
}

/// A ClusterRole for users, aggregated into the built-in ClusterRoles named by `aggregate_to`
/// (kube-controller-manager's aggregation controller copies its rules into them).
fn user_cluster_role(name: &str, aggregate_to: &[&str], rules: &[Rule]) -> Value {
    let mut role_labels = labels();
    for to in aggregate_to {
        role_labels[format!("rbac.authorization.k8s.io/aggregate-to-{to}")] = json!("true");
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": { "name": name, "labels": role_labels },
        "rules": policy_rules(rules),
    })
}

/// Every object to install, in apply order (CRDs and namespace first, the Deployment last).
pub fn manifests(options: &InstallOptions) -> Vec<Value> {
    let watched = options.watched();
    let mut objects: Vec<Value> = devctl_api::crds()
        .into_iter()
        .map(|crd| serde_json::to_value(crd).unwrap_or(Value::Null))
        .map(|mut crd| {
            // The Service, and no URL: `kubectl apply` over an operator that ran with
            // `--webhook-url` removes its URL (install replaces it the same way).
            if let Some(config) = crd
                .pointer_mut("/spec/conversion/webhook/clientConfig")
                .and_then(Value::as_object_mut)
                && config.contains_key("service")
            {
                config.insert("url".into(), Value::Null);
            }
            crd
        })
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
    ]);
    objects.extend(operator_grant(&watched));
    objects.extend([
        user_cluster_role(USER_EDIT_NAME, &["edit", "admin"], USER_EDIT_RULES),
        user_cluster_role(USER_VIEW_NAME, &["view"], USER_VIEW_RULES),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": LEADER_ELECTION_NAME, "namespace": NAMESPACE, "labels": labels() },
            "rules": leader_election_policy_rules(),
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
    ]);
    if watched.is_empty() {
        objects.extend(webhook_objects());
    }
    objects.push(deployment(options, &watched));
    objects
}

fn deployment(options: &InstallOptions, watched: &[String]) -> Value {
    let mut args = vec![
        "--log-format=json".to_string(),
        "--leader-elect".to_string(),
        format!("--metrics-bind-address=0.0.0.0:{METRICS_PORT}"),
        // The image holds devctl-agent too; database pods copy it from there.
        format!("--agent-image={}", options.image),
    ];
    // Webhook configurations are cluster-wide: an operator confined to some namespaces has
    // no right to keep them, so it serves none (docs/webhooks.md).
    if watched.is_empty() {
        args.push(format!(
            "--webhook-bind-address=0.0.0.0:{}",
            crate::webhook::PORT
        ));
    } else {
        args.push("--webhook-bind-address=off".to_string());
    }
    args.extend(
        watched
            .iter()
            .map(|namespace| format!("--watch-namespace={namespace}")),
    );
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
                        "args": args,
                        "ports": [
                            { "name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP" },
                            { "name": "webhook", "containerPort": crate::webhook::PORT, "protocol": "TCP" },
                        ],
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
        for watch_namespaces in [vec![], vec!["a".to_string()]] {
            let objects = manifests(&InstallOptions {
                watch_namespaces,
                ..InstallOptions::default()
            });
            assert_eq!(objects[0]["kind"], "CustomResourceDefinition");
            assert_eq!(objects.last().unwrap()["kind"], "Deployment");
            assert!(objects.iter().all(|o| o["metadata"]["name"].is_string()));
            let namespace_at = objects.iter().position(|o| o["kind"] == "Namespace");
            let first_role = objects.iter().position(|o| o["kind"] == "Role");
            assert!(namespace_at < first_role, "the namespace is applied first");
        }
    }

    fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
        objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn resources_of(object: &Value) -> Vec<String> {
        object["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| r["resources"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| r.as_str().map(str::to_string))
            .collect()
    }

    #[test]
    fn cluster_wide_by_default() {
        let objects = manifests(&InstallOptions::default());
        let cluster_roles = of_kind(&objects, "ClusterRole");
        assert_eq!(cluster_roles[0], &cluster_role(RULES));
        let bindings = of_kind(&objects, "ClusterRoleBinding");
        assert_eq!(bindings.len(), 2);
        assert_eq!(bindings[0]["roleRef"]["name"], NAME);
        // The webhooks' cluster-wide rights name their objects.
        assert_eq!(bindings[1]["roleRef"]["name"], WEBHOOK_NAME);
        for rule in webhook_cluster_rules().as_array().unwrap() {
            assert!(
                rule["resourceNames"]
                    .as_array()
                    .is_some_and(|n| !n.is_empty()),
                "{rule}"
            );
        }
        let roles = of_kind(&objects, "Role");
        let names: Vec<&str> = roles
            .iter()
            .filter_map(|r| r["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, [LEADER_ELECTION_NAME, WEBHOOK_NAME]);
        assert_eq!(of_kind(&objects, "ValidatingWebhookConfiguration").len(), 1);
        assert_eq!(of_kind(&objects, "MutatingWebhookConfiguration").len(), 1);
        let args = &objects.last().unwrap()["spec"]["template"]["spec"]["containers"][0]["args"];
        assert!(
            !args.to_string().contains("namespace="),
            "watches every namespace: {args}"
        );
    }

    #[test]
    fn watching_namespaces_grants_nothing_namespaced_cluster_wide() {
        let objects = manifests(&InstallOptions {
            watch_namespaces: vec!["b".into(), "a".into(), "b".into()],
            ..InstallOptions::default()
        });
        assert!(of_kind(&objects, "ClusterRoleBinding").is_empty());
        let cluster_roles = of_kind(&objects, "ClusterRole");
        let names: Vec<&str> = cluster_roles
            .iter()
            .filter_map(|r| r["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, [USER_EDIT_NAME, USER_VIEW_NAME]);
        // No cluster-scoped rule names a child kind (Secrets, ...): those are the operator's.
        let children: Vec<&str> = RULES
            .iter()
            .filter(|r| !r.group.ends_with("devctl.io"))
            .flat_map(|r| r.resources.iter().copied())
            .collect();
        assert!(children.contains(&"secrets"));
        for role in &cluster_roles {
            for resource in resources_of(role) {
                assert!(
                    !children.contains(&resource.as_str()),
                    "{resource} in {role}"
                );
            }
        }
        // One Role and RoleBinding per namespace (sorted, no duplicates), from RULES.
        let grants: Vec<(&str, &str)> = objects
            .iter()
            .filter(|o| o["metadata"]["name"] == NAME && o["metadata"]["namespace"] != NAMESPACE)
            .filter_map(|o| Some((o["kind"].as_str()?, o["metadata"]["namespace"].as_str()?)))
            .collect();
        assert_eq!(
            grants,
            [
                ("Role", "a"),
                ("RoleBinding", "a"),
                ("Role", "b"),
                ("RoleBinding", "b")
            ]
        );
        for namespace in ["a", "b"] {
            let role = objects
                .iter()
                .find(|o| o["kind"] == "Role" && o["metadata"]["namespace"] == namespace)
                .unwrap();
            assert_eq!(role["rules"], policy_rules(RULES));
            assert_eq!(role, &super::role(namespace, RULES));
            let binding = objects
                .iter()
                .find(|o| o["kind"] == "RoleBinding" && o["metadata"]["namespace"] == namespace)
                .unwrap();
            assert_eq!(binding["roleRef"]["kind"], "Role");
            assert_eq!(binding["subjects"][0]["name"], NAME);
            assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
        }
        // The leader-election Role is unchanged.
        let defaults = manifests(&InstallOptions::default());
        let leader = |objects: &[Value]| {
            objects
                .iter()
                .find(|o| o["metadata"]["name"] == LEADER_ELECTION_NAME && o["kind"] == "Role")
                .cloned()
        };
        assert_eq!(leader(&objects), leader(&defaults));
        let args = &objects.last().unwrap()["spec"]["template"]["spec"]["containers"][0]["args"];
        let args: Vec<&str> = args
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        assert_eq!(
            args[args.len() - 2..],
            ["--watch-namespace=a", "--watch-namespace=b"]
        );
        // Webhook configurations are cluster-wide: a confined operator serves none.
        assert!(args.contains(&"--webhook-bind-address=off"));
        assert!(of_kind(&objects, "ValidatingWebhookConfiguration").is_empty());
    }

    #[test]
    fn user_roles_cover_every_custom_resource_and_aggregate() {
        let objects = manifests(&InstallOptions::default());
        let find = |name: &str| {
            objects
                .iter()
                .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == name)
                .unwrap()
                .clone()
        };
        let edit = find(USER_EDIT_NAME);
        let view = find(USER_VIEW_NAME);
        let label = |role: &Value, to: &str| {
            role["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{to}")]
                .clone()
        };
        assert_eq!(label(&edit, "edit"), "true");
        assert_eq!(label(&edit, "admin"), "true");
        assert_eq!(label(&edit, "view"), Value::Null);
        assert_eq!(label(&view, "view"), "true");
        assert_eq!(label(&view, "edit"), Value::Null);
        let grants = |rules: &[Rule], group: &str, resource: &str, verb: &str| {
            rules.iter().any(|r| {
                r.group == group && r.resources.contains(&resource) && r.verbs.contains(&verb)
            })
        };
        for crd in devctl_api::crds() {
            let group = crd.spec.group.as_str();
            let plural = crd.spec.names.plural.as_str();
            for verb in [
                "create", "update", "patch", "delete", "get", "list", "watch",
            ] {
                assert!(
                    grants(USER_EDIT_RULES, group, plural, verb),
                    "edit {verb} {plural}"
                );
            }
            for verb in ["get", "list", "watch"] {
                assert!(
                    grants(USER_VIEW_RULES, group, plural, verb),
                    "view {verb} {plural}"
                );
                let status = format!("{plural}/status");
                assert!(
                    grants(USER_VIEW_RULES, group, &status, verb),
                    "view {verb} {status}"
                );
            }
        }
        for rule in USER_EDIT_RULES.iter().chain(USER_VIEW_RULES) {
            assert!(
                rule.resources
                    .iter()
                    .chain(rule.verbs)
                    .all(|s| !s.contains('*')),
                "{rule:?}"
            );
        }
        assert!(
            USER_VIEW_RULES
                .iter()
                .flat_map(|r| r.verbs.iter())
                .all(|v| READ.contains(v)),
            "view is read-only"
        );
    }

    #[test]
    fn namespace_names_are_validated() {
        for good in ["a", "team-1", "0a", &"x".repeat(63)] {
            assert_eq!(validate_namespace(good), Ok(()), "{good}");
        }
        for bad in ["", "A", "-a", "a-", "a_b", "a.b", &"x".repeat(64)] {
            assert!(validate_namespace(bad).is_err(), "{bad:?}");
        }
    }
}
