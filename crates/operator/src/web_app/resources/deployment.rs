//! `<name>-deployment`: the application's pods.

use devctl_api::web_app::{ProbeSpec, ProbeType, WebApp};
use serde_json::{Value, json};

use super::{deployment_name, labels, metadata, selector};
use k8s_openapi::api::apps::v1::Deployment;

use crate::children::Child;
use crate::error::Result;
use crate::pod_security;

const PORT_NAME: &str = "http";

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
                    "securityContext": pod_security::restricted_pod(None),
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

    #[test]
    fn deployment_has_image_replicas_port_and_restricted_security() {
        let d = desired(&super::super::sample()).unwrap().body;
        assert_eq!(d["spec"]["replicas"], 5);
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "myregistry/myapp:v2.1.0");
        assert_eq!(c["ports"][0]["containerPort"], 8080);
        assert_eq!(c["readinessProbe"]["tcpSocket"]["port"], "http");
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert_eq!(
            d["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
            true
        );
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
    }
}
