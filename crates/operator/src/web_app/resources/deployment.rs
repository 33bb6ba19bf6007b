//! `<name>-deployment`: the application's pods.

use devctl_api::web_app::{ProbeSpec, ProbeType, WebApp};
use serde_json::{Value, json};

use super::{deployment_name, labels, metadata, selector};
use k8s_openapi::api::apps::v1::Deployment;

use crate::children::Child;
use crate::error::Result;
use crate::pod_security;

const PORT_NAME: &str = "http";

/// UID (and GID) of the pods when `spec.securityContext` does not choose one. Pod Security
/// Standards `restricted` requires a non-root user, and an image's `USER` may be root or a
/// name the kubelet cannot check, so devctl always sets a numeric one. 65532 is the common
/// "nonroot" ID (distroless, Chainguard and ko images run as it): no system or login account
/// of a typical base image has it, so it owns none of the image's files by accident.
pub const DEFAULT_UID: i64 = 65532;

fn probe(spec: Option<&ProbeSpec>, default_initial_delay: i32) -> Value {
    let (type_, path, initial_delay, period, failures) = match spec {
        Some(p) => (
            p.type_,
            p.path.as_str(),
            p.initial_delay_seconds,
            p.period_seconds,
            p.failure_threshold,
        ),
        None => (ProbeType::Tcp, "/", default_initial_delay, 10, 3),
    };
    let mut probe = json!({
        "initialDelaySeconds": initial_delay,
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 1,
    });
    match type_ {
        ProbeType::Tcp => probe["tcpSocket"] = json!({ "port": PORT_NAME }),
        ProbeType::Http => {
            probe["httpGet"] = json!({ "path": path, "port": PORT_NAME, "scheme": "HTTP" })
        }
    }
    probe
}

/// The pod's security context: `restricted` (non-root, seccomp RuntimeDefault) with the
/// user and group from `spec.securityContext`, else [`DEFAULT_UID`]; the group defaults to
/// the user. No fsGroup: a WebApp has no volumes.
fn pod_security_context(app: &WebApp) -> Value {
    let chosen = app.spec.security_context.as_ref();
    let user = chosen.and_then(|c| c.run_as_user).unwrap_or(DEFAULT_UID);
    let group = chosen.and_then(|c| c.run_as_group).unwrap_or(user);
    let mut context = pod_security::restricted_pod(None);
    context["runAsUser"] = json!(user);
    context["runAsGroup"] = json!(group);
    context
}

pub fn desired(app: &WebApp) -> Result<Child> {
    let spec = &app.spec;
    let name = deployment_name(app);
    let mut container = json!({
        "name": "app",
        "image": spec.image,
        "ports": [{ "name": PORT_NAME, "containerPort": spec.port, "protocol": "TCP" }],
        "securityContext": pod_security::restricted_container(),
        "readinessProbe": probe(spec.readiness_probe.as_ref(), 0),
        "livenessProbe": probe(spec.liveness_probe.as_ref(), 10),
    });
    if !spec.env.is_empty() {
        container["env"] = json!(spec.env);
    }
    if let Some(resources) = &spec.resources {
        container["resources"] = json!(resources);
    }
    Child::new::<Deployment>(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(app, &name, "server")?,
        "spec": {
            "replicas": spec.replicas,
            "selector": { "matchLabels": selector(app) },
            "strategy": { "type": "RollingUpdate" },
            "template": {
                "metadata": { "labels": labels(app, "server") },
                "spec": {
                    "securityContext": pod_security_context(app),
                    // The application does not talk to the Kubernetes API: no token to steal.
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "containers": [container],
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why `pod` (a pod spec) fails Pod Security Standards `restricted` (the checks of the
    /// `restricted` and `baseline` profiles at the latest version), empty when it passes.
    /// The project has no shared checker yet; the integration test asks the real admission
    /// plugin as well.
    fn restricted_violations(pod: &Value) -> Vec<String> {
        const VOLUME_TYPES: &[&str] = &[
            "configMap",
            "csi",
            "downwardAPI",
            "emptyDir",
            "ephemeral",
            "persistentVolumeClaim",
            "projected",
            "secret",
        ];
        const SELINUX_TYPES: &[&str] = &[
            "",
            "container_t",
            "container_init_t",
            "container_kvm_t",
            "container_engine_t",
        ];
        let mut errors = Vec::new();
        let pod_context = &pod["securityContext"];
        for field in ["hostNetwork", "hostPID", "hostIPC"] {
            if pod[field] == true {
                errors.push(format!("{field} is true"));
            }
        }
        if let Some(sysctls) = pod_context["sysctls"].as_array().filter(|s| !s.is_empty()) {
            errors.push(format!("sysctls are set: {sysctls:?}"));
        }
        for volume in pod["volumes"].as_array().into_iter().flatten() {
            let allowed = volume
                .as_object()
                .into_iter()
                .flatten()
                .any(|(key, _)| key == "name" || VOLUME_TYPES.contains(&key.as_str()));
            if !allowed || volume.get("hostPath").is_some() {
                errors.push(format!("volume type not allowed: {volume}"));
            }
        }
        let containers: Vec<&Value> = ["initContainers", "containers", "ephemeralContainers"]
            .iter()
            .flat_map(|list| pod[*list].as_array().into_iter().flatten())
            .collect();
        if containers.is_empty() {
            errors.push("no containers".into());
        }
        let contexts = std::iter::once(("pod", pod_context)).chain(
            containers
                .iter()
                .map(|c| (c["name"].as_str().unwrap_or("?"), &c["securityContext"])),
        );
        for (name, context) in contexts {
            if context["windowsOptions"]["hostProcess"] == true {
                errors.push(format!("{name}: hostProcess"));
            }
            if context["runAsUser"] == 0 {
                errors.push(format!("{name}: runAsUser 0"));
            }
            if context["runAsNonRoot"] == false {
                errors.push(format!("{name}: runAsNonRoot false"));
            }
            if context["seccompProfile"]["type"] == "Unconfined" {
                errors.push(format!("{name}: seccomp Unconfined"));
            }
            if let Some(kind) = context["appArmorProfile"]["type"].as_str()
                && kind != "RuntimeDefault"
                && kind != "Localhost"
            {
                errors.push(format!("{name}: AppArmor {kind}"));
            }
            let selinux = &context["seLinuxOptions"];
            if !SELINUX_TYPES.contains(&selinux["type"].as_str().unwrap_or_default())
                || !selinux["user"].is_null()
                || !selinux["role"].is_null()
            {
                errors.push(format!("{name}: seLinuxOptions {selinux}"));
            }
        }
        let pod_non_root = pod_context["runAsNonRoot"] == true;
        let pod_seccomp = pod_context["seccompProfile"]["type"].as_str();
        for container in containers {
            let name = container["name"].as_str().unwrap_or("?");
            let context = &container["securityContext"];
            if context["privileged"] == true {
                errors.push(format!("{name}: privileged"));
            }
            if context["allowPrivilegeEscalation"] != false {
                errors.push(format!("{name}: allowPrivilegeEscalation is not false"));
            }
            if !pod_non_root && context["runAsNonRoot"] != true {
                errors.push(format!("{name}: runAsNonRoot is not true"));
            }
            let seccomp = context["seccompProfile"]["type"].as_str().or(pod_seccomp);
            if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
                errors.push(format!("{name}: seccomp profile {seccomp:?}"));
            }
            if context["procMount"]
                .as_str()
                .is_some_and(|m| m != "Default")
            {
                errors.push(format!("{name}: procMount"));
            }
            let capabilities = &context["capabilities"];
            let drops_all = capabilities["drop"]
                .as_array()
                .is_some_and(|d| d.iter().any(|c| c == "ALL"));
            if !drops_all {
                errors.push(format!("{name}: capabilities.drop lacks ALL"));
            }
            for added in capabilities["add"].as_array().into_iter().flatten() {
                let added = added.as_str().unwrap_or_default();
                // `restricted` narrows baseline's list of addable capabilities to this one.
                if added != "NET_BIND_SERVICE" {
                    errors.push(format!("{name}: capability {added} added"));
                }
            }
            for port in container["ports"].as_array().into_iter().flatten() {
                if port["hostPort"].as_i64().unwrap_or(0) != 0 {
                    errors.push(format!("{name}: hostPort"));
                }
            }
            let handlers = ["livenessProbe", "readinessProbe", "startupProbe"]
                .map(|p| &container[p])
                .into_iter()
                .chain(["postStart", "preStop"].map(|h| &container["lifecycle"][h]));
            for handler in handlers {
                for action in ["httpGet", "tcpSocket"] {
                    if handler[action]["host"]
                        .as_str()
                        .is_some_and(|h| !h.is_empty())
                    {
                        errors.push(format!("{name}: {action}.host is set"));
                    }
                }
            }
        }
        errors
    }

    fn pod_spec(app: &WebApp) -> Value {
        desired(app).unwrap().body["spec"]["template"]["spec"].clone()
    }

    #[test]
    fn the_checker_finds_what_restricted_forbids() {
        let pod = json!({
            "hostNetwork": true,
            "securityContext": { "runAsUser": 0 },
            "volumes": [{ "name": "root", "hostPath": { "path": "/" } }],
            "containers": [{
                "name": "app",
                "ports": [{ "containerPort": 80, "hostPort": 80 }],
                "securityContext": { "capabilities": { "add": ["SYS_ADMIN"] } },
            }],
        });
        let errors = restricted_violations(&pod);
        for expected in [
            "hostNetwork",
            "pod: runAsUser 0",
            "volume type",
            "allowPrivilegeEscalation",
            "runAsNonRoot",
            "seccomp",
            "drop lacks ALL",
            "SYS_ADMIN",
            "hostPort",
        ] {
            assert!(
                errors.iter().any(|e| e.contains(expected)),
                "{expected}: {errors:?}"
            );
        }
    }

    #[test]
    fn deployment_has_image_replicas_port_and_restricted_security() {
        let d = desired(&super::super::sample()).unwrap().body;
        assert_eq!(d["spec"]["replicas"], 5);
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "myregistry/myapp:v2.1.0");
        assert_eq!(c["ports"][0]["containerPort"], 8080);
        assert_eq!(c["readinessProbe"]["tcpSocket"]["port"], "http");
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(
            d["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
            true
        );
    }

    #[test]
    fn pods_run_as_the_default_non_root_user_without_a_token() {
        let pod = pod_spec(&super::super::sample());
        let context = &pod["securityContext"];
        assert_eq!(context["runAsUser"], DEFAULT_UID);
        assert_eq!(context["runAsGroup"], DEFAULT_UID);
        assert_eq!(context["runAsNonRoot"], true);
        assert_eq!(context["seccompProfile"]["type"], "RuntimeDefault");
        assert!(context.get("fsGroup").is_none(), "{context}");
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(restricted_violations(&pod), Vec::<String>::new());
    }

    #[test]
    fn the_spec_chooses_user_and_group() {
        let mut app = super::super::sample();
        app.spec.security_context =
            Some(serde_json::from_value(json!({ "runAsUser": 1000, "runAsGroup": 3000 })).unwrap());
        let pod = pod_spec(&app);
        assert_eq!(pod["securityContext"]["runAsUser"], 1000);
        assert_eq!(pod["securityContext"]["runAsGroup"], 3000);
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(restricted_violations(&pod), Vec::<String>::new());

        // The group follows the user unless set; an empty block is the default.
        app.spec.security_context =
            Some(serde_json::from_value(json!({ "runAsUser": 1000 })).unwrap());
        let pod = pod_spec(&app);
        assert_eq!(pod["securityContext"]["runAsUser"], 1000);
        assert_eq!(pod["securityContext"]["runAsGroup"], 1000);
        app.spec.security_context =
            Some(serde_json::from_value(json!({ "runAsGroup": 3000 })).unwrap());
        let pod = pod_spec(&app);
        assert_eq!(pod["securityContext"]["runAsUser"], DEFAULT_UID);
        assert_eq!(pod["securityContext"]["runAsGroup"], 3000);
        app.spec.security_context = Some(Default::default());
        assert_eq!(pod_spec(&app), pod_spec(&super::super::sample()));
    }

    #[test]
    fn http_probes_use_the_path() {
        let mut app = super::super::sample();
        app.spec.readiness_probe =
            Some(serde_json::from_value(json!({ "type": "http", "path": "/healthz" })).unwrap());
        let d = desired(&app).unwrap().body;
        let probe = &d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"];
        assert_eq!(probe["httpGet"]["path"], "/healthz");
        assert_eq!(probe["periodSeconds"], 10);
        assert_eq!(
            restricted_violations(&d["spec"]["template"]["spec"]),
            Vec::<String>::new()
        );
    }
}
