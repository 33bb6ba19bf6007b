//! Installing over a cluster where an operator ran with `--webhook-url` (what `devctl dev up`
//! runs): the webhook configurations and the CRD's conversion hold a URL, and both
//! `devctl operator install` and `devctl operator manifests | kubectl apply -f -` must
//! replace it with the Service instead of failing on a client configuration with both.

mod support;

use std::io::Write;
use std::process::Stdio;

use devctl_operator::webhook::WebhookSettings;
use devctl_operator::webhook::configuration::{CRD_NAME, inject};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use support::*;

/// Points everything at a URL, as an operator started with `--webhook-url` does.
async fn as_dev_up_left_it(client: &kube::Client) {
    let settings = WebhookSettings {
        url: Some("https://127.0.0.1:9443".into()),
        ..WebhookSettings::default()
    };
    inject(client, &settings, "").await.unwrap();
    let (urls, services) = client_configs(client).await;
    assert_eq!(
        (urls, services),
        (3, 0),
        "the dev operator's URL is in place"
    );
}

/// How many of the three client configurations (validating, mutating, conversion) name a
/// URL, and how many a Service.
async fn client_configs(client: &kube::Client) -> (usize, usize) {
    let name = devctl_operator::names::NAME;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let configs = [
        serde_json::to_value(
            &validating.get(name).await.unwrap().webhooks.unwrap()[0].client_config,
        )
        .unwrap(),
        serde_json::to_value(&mutating.get(name).await.unwrap().webhooks.unwrap()[0].client_config)
            .unwrap(),
        serde_json::to_value(
            crds.get(CRD_NAME)
                .await
                .unwrap()
                .spec
                .conversion
                .unwrap()
                .webhook
                .unwrap()
                .client_config,
        )
        .unwrap(),
    ];
    let count = |key: &str| configs.iter().filter(|c| !c[key].is_null()).count();
    (count("url"), count("service"))
}

#[tokio::test]
async fn install_and_kubectl_apply_replace_a_dev_operators_webhook_url() {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();
    let client = cluster.client().await.unwrap();
    devctl_ok(&kubeconfig, &["operator", "install"]);

    as_dev_up_left_it(&client).await;
    let out = devctl(&kubeconfig, &["operator", "install"]);
    assert!(
        out.status.success(),
        "install over a dev operator failed: {}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(client_configs(&client).await, (0, 3));

    as_dev_up_left_it(&client).await;
    let manifests = devctl_ok(&kubeconfig, &["operator", "manifests"]);
    let mut apply = cluster
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    apply
        .stdin
        .take()
        .unwrap()
        .write_all(manifests.as_bytes())
        .unwrap();
    let applied = apply.wait_with_output().unwrap();
    assert!(
        applied.status.success(),
        "kubectl apply over a dev operator failed: {}{}",
        String::from_utf8_lossy(&applied.stdout),
        String::from_utf8_lossy(&applied.stderr)
    );
    assert_eq!(client_configs(&client).await, (0, 3));
}
