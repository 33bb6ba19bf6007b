//! The desired children of a WebApp (pure), one file per child.

pub mod deployment;
pub mod service;

use std::collections::BTreeMap;

use devctl_api::labels;
use devctl_api::web_app::WebApp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use k8s_openapi::Resource as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;

use crate::children::Child;
use crate::error::{Error, Result};

/// Every kind a WebApp may own.
pub const KINDS: &[&str] = &[Deployment::KIND, Service::KIND];

/// `app.kubernetes.io/name` of everything a WebApp owns.
pub const APP_NAME: &str = "webapp";

pub fn deployment_name(app: &WebApp) -> String {
    format!("{}-deployment", app.name_any())
}

pub fn service_name(app: &WebApp) -> String {
    format!("{}-svc", app.name_any())
}

/// Pod selector: never changes after creation.
pub fn selector(app: &WebApp) -> BTreeMap<String, String> {
    labels::selector(APP_NAME, &app.name_any())
}

/// The image tag (after the last `:` of the last path segment), for the version label.
pub fn image_tag(image: &str) -> &str {
    let last = image.rsplit('/').next().unwrap_or(image);
    let without_digest = last.split('@').next().unwrap_or(last);
    without_digest
        .split_once(':')
        .map(|(_, tag)| tag)
        .unwrap_or("latest")
}

pub fn labels(app: &WebApp, component: &str) -> BTreeMap<String, String> {
    labels::standard(
        APP_NAME,
        &app.name_any(),
        component,
        image_tag(&app.spec.image),
    )
}

fn metadata(app: &WebApp, name: &str, component: &str) -> Result<Value> {
    let owner: OwnerReference = app
        .controller_owner_ref(&())
        .ok_or(Error::MissingField("metadata.uid"))?;
    Ok(json!({
        "name": name,
        "namespace": app.namespace().ok_or(Error::MissingField("metadata.namespace"))?,
        "labels": labels(app, component),
        "ownerReferences": [owner],
    }))
}

pub fn desired(app: &WebApp) -> Result<Vec<Child>> {
    Ok(vec![deployment::desired(app)?, service::desired(app)?])
}

#[cfg(test)]
pub(crate) fn sample() -> WebApp {
    serde_json::from_value(json!({
        "apiVersion": "apps.devctl.io/v1", "kind": "WebApp",
        "metadata": { "name": "my-service", "namespace": "prod", "uid": "42", "generation": 1 },
        "spec": { "image": "myregistry/myapp:v2.1.0", "replicas": 5, "port": 8080 }
    }))
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_tags() {
        assert_eq!(image_tag("myregistry/myapp:v2.1.0"), "v2.1.0");
        assert_eq!(image_tag("registry:5000/app"), "latest");
        assert_eq!(image_tag("nginx@sha256:abc"), "latest");
    }

    #[test]
    fn sample_renders_a_deployment_and_a_service() {
        let children = desired(&sample()).unwrap();
        let names: Vec<_> = children.iter().map(|c| (c.kind, c.name.as_str())).collect();
        assert_eq!(
            names,
            [
                ("Deployment", "my-service-deployment"),
                ("Service", "my-service-svc")
            ]
        );
        for child in &children {
            assert_eq!(child.body["metadata"]["ownerReferences"][0]["uid"], "42");
            assert_eq!(
                child.body["metadata"]["labels"]["app.kubernetes.io/version"],
                "v2.1.0"
            );
        }
    }
}
