//! `<name>-svc`: port 80 to the application's port.

use devctl_api::web_app::WebApp;
use serde_json::json;

use super::{metadata, selector, service_name};
use k8s_openapi::api::core::v1::Service;

use crate::children::Child;
use crate::error::Result;

pub const SERVICE_PORT: i32 = 80;

pub fn desired(app: &WebApp) -> Result<Child> {
    let name = service_name(app);
    Child::new::<Service>(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(app, &name, "service")?,
        "spec": {
            "type": "ClusterIP",
            "selector": selector(app),
            "ports": [{ "name": "http", "port": SERVICE_PORT, "targetPort": app.spec.port, "protocol": "TCP" }],
        }
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn exposes_port_80_to_the_app_port() {
        let svc = super::desired(&super::super::sample()).unwrap().body;
        assert_eq!(svc["spec"]["ports"][0]["port"], 80);
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080);
    }
}
