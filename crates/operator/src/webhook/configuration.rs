//! Where the API server finds the webhooks: the ValidatingWebhookConfiguration, the
//! MutatingWebhookConfiguration and the CRD's conversion stanza (desired state is pure; the
//! injection writes only what differs).

use base64::Engine as _;
use devctl_api::database_cluster::CONVERSION_PATH;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::{WebhookError, WebhookSettings};

/// Path of the validating webhook.
pub const VALIDATE_PATH: &str = "/validate-db-devctl-io-v1beta1-databasecluster";
/// Path of the mutating webhook.
pub const MUTATE_PATH: &str = "/mutate-db-devctl-io-v1beta1-databasecluster";
/// Names of the webhooks inside their configurations (what the API server's errors quote).
pub const VALIDATING_WEBHOOK: &str = "validate.databaseclusters.db.devctl.io";
pub const MUTATING_WEBHOOK: &str = "default.databaseclusters.db.devctl.io";
/// The CRD the conversion webhook serves.
pub const CRD_NAME: &str = "databaseclusters.db.devctl.io";
/// Port the webhook Service listens on (it forwards to the operator's 9443).
pub const SERVICE_PORT: i32 = 443;

/// A webhook's client configuration: the URL (`--webhook-url`) or the Service, and the CA.
/// The other one is `null`: a client configuration holds exactly one, and `kubectl apply`
/// (like a JSON merge patch) removes a field set to `null`, so applying the install
/// manifests over an operator that ran with `--webhook-url` replaces its URL.
pub fn client_config(settings: &WebhookSettings, path: &str, ca_bundle: &str) -> Value {
    let mut config = match &settings.url {
        Some(base) => json!({
            "url": format!("{}{path}", base.trim_end_matches('/')),
            "service": null,
        }),
        None => json!({
            "service": {
                "namespace": settings.namespace, "name": settings.service_name,
                "path": path, "port": SERVICE_PORT,
            },
            "url": null,
        }),
    };
    if !ca_bundle.is_empty() {
        config["caBundle"] = json!(base64::engine::general_purpose::STANDARD.encode(ca_bundle));
    }
    config
}

/// One webhook entry: DatabaseCluster creates and updates, skipping updates that leave `spec`
/// alone (finalizer and status patches keep working while the operator is down).
fn webhook(settings: &WebhookSettings, name: &str, path: &str, ca_bundle: &str) -> Value {
    let mut webhook = json!({
        "name": name,
        "clientConfig": client_config(settings, path, ca_bundle),
        "rules": [{
            "apiGroups": ["db.devctl.io"], "apiVersions": ["v1beta1"],
            "resources": ["databaseclusters"], "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }],
        "matchPolicy": "Equivalent",
        "matchConditions": [{
            "name": "spec-changed",
            "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
        }],
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "timeoutSeconds": 5,
        "admissionReviewVersions": ["v1"],
    });
    if !settings.watch_namespaces.is_empty() {
        // An operator watching some namespaces judges only objects there.
        webhook["namespaceSelector"] = json!({ "matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In",
            "values": settings.watch_namespaces,
        }] });
    }
    webhook
}

fn labels() -> Value {
    json!({
        "app.kubernetes.io/name": crate::names::NAME,
        "app.kubernetes.io/component": "webhook",
        "app.kubernetes.io/part-of": "devctl",
        "app.kubernetes.io/managed-by": crate::names::FIELD_MANAGER,
    })
}

/// The ValidatingWebhookConfiguration.
pub fn validating(settings: &WebhookSettings, ca_bundle: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": { "name": settings.configuration_name, "labels": labels() },
        "webhooks": [webhook(settings, VALIDATING_WEBHOOK, VALIDATE_PATH, ca_bundle)],
    })
}

/// The MutatingWebhookConfiguration.
pub fn mutating(settings: &WebhookSettings, ca_bundle: &str) -> Value {
    let mut webhook = webhook(settings, MUTATING_WEBHOOK, MUTATE_PATH, ca_bundle);
    webhook["reinvocationPolicy"] = json!("Never");
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": { "name": settings.configuration_name, "labels": labels() },
        "webhooks": [webhook],
    })
}

/// The CRD's `spec.conversion`, as a JSON merge patch (`service: null` when a URL replaces it).
pub fn conversion_patch(settings: &WebhookSettings, ca_bundle: &str) -> Value {
    let client_config = client_config(settings, CONVERSION_PATH, ca_bundle);
    json!({ "spec": { "conversion": {
        "strategy": "Webhook",
        "webhook": { "conversionReviewVersions": ["v1"], "clientConfig": client_config },
    } } })
}

/// `value` without the object fields set to `null`: what a server-side apply is given (it
/// owns what it names; `null` says "absent" only to a merge patch or `kubectl apply`).
pub fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// The JSON merge patch to apply before a server-side apply of `desired` over `live` when
/// a client configuration switches between a URL and a Service (a webhook configuration's
/// webhooks, or a CRD's conversion webhook): applied as is, the new one would join the old
/// one, and a client configuration holds exactly one. `None` when nothing switches (pure).
pub fn client_config_switch(live: &Value, desired: &Value) -> Option<Value> {
    let switches = |live: &Value, wanted: &Value| {
        ["url", "service"]
            .iter()
            .any(|key| !live[key].is_null() && wanted[key].is_null())
    };
    if let Some(wanted) = desired["webhooks"].as_array() {
        let existing = live["webhooks"].as_array()?;
        let any = wanted.iter().any(|w| {
            existing
                .iter()
                .filter(|e| e["name"] == w["name"])
                .any(|e| switches(&e["clientConfig"], &w["clientConfig"]))
        });
        return any.then(|| json!({ "webhooks": desired["webhooks"] }));
    }
    let wanted = &desired["spec"]["conversion"]["webhook"]["clientConfig"];
    if !wanted.is_object()
        || !switches(
            &live["spec"]["conversion"]["webhook"]["clientConfig"],
            wanted,
        )
    {
        return None;
    }
    let mut config = wanted.clone();
    for key in ["url", "service"] {
        if config[key].is_null() {
            config[key] = Value::Null;
        }
    }
    Some(json!({ "spec": { "conversion": { "webhook": { "clientConfig": config } } } }))
}

/// Whether everything `desired` says is already in `actual` (`null` in `desired`: absent).
pub fn contains(actual: &Value, desired: &Value) -> bool {
    match (desired, actual) {
        (Value::Null, actual) => actual.is_null(),
        (Value::Object(desired), Value::Object(actual)) => desired
            .iter()
            .all(|(key, value)| contains(actual.get(key).unwrap_or(&Value::Null), value)),
        (Value::Array(desired), Value::Array(actual)) => {
            desired.len() == actual.len() && desired.iter().zip(actual).all(|(d, a)| contains(a, d))
        }
        (desired, actual) => desired == actual,
    }
}

/// Points the configurations and the CRD at this operator with `ca_bundle`; writes only what
/// differs. Returns whether anything was written.
///
/// Existing configurations get a JSON merge patch, which replaces the `webhooks` list whole:
/// a URL then replaces the Service reference of the install manifests instead of joining it
/// (a client configuration holds exactly one of them).
pub async fn inject(
    client: &kube::Client,
    settings: &WebhookSettings,
    ca_bundle: &str,
) -> Result<bool, WebhookError> {
    let validating_api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating_api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut wrote = false;
    // With the Service (an installed operator) the configurations come from the install and
    // are only kept current: creating them takes a right that cannot be limited by name.
    let create = settings.url.is_some();
    wrote |= ensure(
        &validating_api,
        &settings.configuration_name,
        validating(settings, ca_bundle),
        create,
    )
    .await?;
    wrote |= ensure(
        &mutating_api,
        &settings.configuration_name,
        mutating(settings, ca_bundle),
        create,
    )
    .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let patch = conversion_patch(settings, ca_bundle);
    match crds.get_opt(CRD_NAME).await? {
        None => return Err(WebhookError::CrdMissing),
        Some(crd) => {
            let actual = serde_json::to_value(crd).unwrap_or_default();
            if !contains(&actual, &patch) {
                crds.patch(CRD_NAME, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                wrote = true;
            }
        }
    }
    Ok(wrote)
}

/// Makes the configuration `name` say what `desired` says; whether it wrote.
async fn ensure<K>(
    api: &Api<K>,
    name: &str,
    desired: Value,
    create: bool,
) -> Result<bool, WebhookError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.get_opt(name).await? {
        Some(actual) => {
            let actual = serde_json::to_value(actual).unwrap_or_default();
            if contains(&actual, &desired) {
                return Ok(false);
            }
            let patch = json!({ "metadata": { "labels": desired["metadata"]["labels"] }, "webhooks": desired["webhooks"] });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        None if !create => {
            tracing::warn!(
                configuration = name,
                kind = desired["kind"].as_str().unwrap_or_default(),
                "webhook configuration missing: `devctl operator install` puts it back"
            );
            return Ok(false);
        }
        None => {
            let params = PatchParams::apply(crate::names::FIELD_MANAGER).force();
            api.patch(name, &params, &Patch::Apply(&without_nulls(&desired)))
                .await?;
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: Option<&str>) -> WebhookSettings {
        WebhookSettings {
            url: url.map(String::from),
            ..WebhookSettings::default()
        }
    }

    #[test]
    fn applying_the_service_over_a_url_replaces_it() {
        let with_url = validating(&settings(Some("https://10.0.0.1:9443")), "CA");
        let with_service = validating(&settings(None), "CA");
        // The install's Service over a dev operator's URL: the webhooks are replaced whole.
        let patch = client_config_switch(&with_url, &with_service).unwrap();
        assert_eq!(patch["webhooks"], with_service["webhooks"]);
        assert!(patch["webhooks"][0]["clientConfig"]["url"].is_null());
        assert_eq!(client_config_switch(&with_service, &with_service), None);
        // A server-side apply names only what it owns.
        let applied = without_nulls(&with_service);
        assert!(
            applied["webhooks"][0]["clientConfig"]
                .as_object()
                .unwrap()
                .get("url")
                .is_none()
        );
        // The CRD's conversion the same way, with the URL removed explicitly.
        let crd_live = json!({ "spec": { "conversion": { "webhook": { "clientConfig": {
            "url": "https://10.0.0.1:9443/convert", "caBundle": "Q0E=" } } } } });
        let crd_desired = json!({ "spec": { "conversion": { "webhook": { "clientConfig": {
            "service": { "name": "devctl-operator-webhook", "namespace": "devctl-system" } } } } } });
        let patch = client_config_switch(&crd_live, &crd_desired).unwrap();
        let config = &patch["spec"]["conversion"]["webhook"]["clientConfig"];
        assert!(config.as_object().unwrap().contains_key("url") && config["url"].is_null());
        assert_eq!(config["service"]["name"], "devctl-operator-webhook");
        assert_eq!(client_config_switch(&crd_desired, &crd_desired), None);
    }

    #[test]
    fn configurations_skip_unchanged_specs_and_fail_closed() {
        let validating = validating(&settings(None), "CA");
        let webhook = &validating["webhooks"][0];
        assert_eq!(webhook["failurePolicy"], "Fail");
        assert_eq!(webhook["sideEffects"], "None");
        assert_eq!(webhook["matchPolicy"], "Equivalent");
        assert_eq!(
            webhook["matchConditions"][0]["expression"],
            "request.operation == 'CREATE' || object.spec != oldObject.spec"
        );
        assert_eq!(
            webhook["clientConfig"]["service"]["name"],
            "devctl-operator-webhook"
        );
        assert!(webhook.get("namespaceSelector").is_none());
        let scoped = WebhookSettings {
            watch_namespaces: vec!["a".into()],
            ..settings(Some("https://127.0.0.1:9443"))
        };
        let mutating = mutating(&scoped, "");
        assert_eq!(
            mutating["webhooks"][0]["clientConfig"],
            json!({ "url": "https://127.0.0.1:9443/mutate-db-devctl-io-v1beta1-databasecluster",
                "service": null })
        );
        assert_eq!(
            mutating["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"],
            json!(["a"])
        );
    }

    #[test]
    fn the_conversion_patch_replaces_the_service_with_the_url() {
        let patch = conversion_patch(&settings(Some("https://10.0.0.1:9443/")), "CA");
        let config = &patch["spec"]["conversion"]["webhook"]["clientConfig"];
        assert_eq!(config["url"], "https://10.0.0.1:9443/convert");
        assert!(config["service"].is_null() && config.get("service").is_some());
        let installed = json!({ "spec": { "conversion": { "strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": { "url": "https://10.0.0.1:9443/convert", "caBundle": config["caBundle"] } } } } });
        assert!(contains(&installed, &patch));
        let mut with_service = installed.clone();
        with_service["spec"]["conversion"]["webhook"]["clientConfig"]["service"] =
            json!({ "name": "x" });
        assert!(!contains(&with_service, &patch));
    }
}
