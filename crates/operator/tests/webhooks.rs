//! The admission and conversion webhooks as the real API server calls them, over TLS, with
//! kubectl and kube-rs as clients: both API versions and back, field-level refusals,
//! defaults, the deprecation warning, the operator being down, certificate rotation and
//! mounted certificates.
//!
//! The CRD's conversion webhook is one per cluster, so these tests take turns ([`SERIAL`]);
//! each has its own namespace, certificate Secret and webhook configurations (selecting
//! only its namespace).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::database_cluster::conversion::PRESERVED_ANNOTATION;
use devctl_operator::webhook::{self, WebhookSettings, Webhooks, certificates};
use devctl_testenv::ControlPlane;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::json;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// The CRDs are applied once: applying them again would put back the Service reference the
/// webhooks replaced with their URL (a CRD cannot have both).
static CRDS: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

struct Fixture {
    cp: &'static ControlPlane,
    client: kube::Client,
    namespace: String,
    settings: WebhookSettings,
    webhooks: Option<Webhooks>,
}

impl Fixture {
    async fn start(prefix: &str, configure: impl FnOnce(&mut WebhookSettings)) -> Self {
        let cp = devctl_testenv::shared_control_plane().await.unwrap();
        CRDS.get_or_init(|| async { cp.install_crds(&devctl_api::crds()).await.unwrap() })
            .await;
        let namespace = cp.create_namespace(prefix).await.unwrap();
        let client = cp.client().await.unwrap();
        let mut settings = WebhookSettings {
            namespace: namespace.clone(),
            configuration_name: format!("devctl-test-{namespace}"),
            watch_namespaces: vec![namespace.clone()],
            ..WebhookSettings::default()
        };
        configure(&mut settings);
        let mut fixture = Self {
            cp,
            client,
            namespace,
            settings,
            webhooks: None,
        };
        fixture.serve().await;
        fixture
    }

    async fn serve(&mut self) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        self.settings.url = Some(format!("https://127.0.0.1:{port}"));
        let webhooks = webhook::start(self.client.clone(), self.settings.clone(), listener)
            .await
            .unwrap();
        self.webhooks = Some(webhooks);
        // The API server learns of new webhook configurations through its informers.
        self.wait_admitting().await;
    }

    /// Waits until a server-side dry-run create passes through the webhooks (the API server
    /// has picked up the configurations and trusts the CA).
    async fn wait_admitting(&self) {
        let dbs = self.dbs();
        let probe = db(
            "probe",
            json!({ "engine": "postgres", "version": "16.2", "replicas": 1, "storage": { "size": "1Gi" } }),
        );
        devctl_testenv::eventually(
            "the webhooks to admit a dry-run create",
            Duration::from_secs(30),
            || {
                let dbs = dbs.clone();
                let probe = probe.clone();
                async move {
                    let created = dbs
                        .create(
                            &PostParams {
                                dry_run: true,
                                ..Default::default()
                            },
                            &probe,
                        )
                        .await
                        .ok()?;
                    // The mutating webhook ran: it filled in the requests.
                    created.spec.resources.is_some().then_some(())
                }
            },
        )
        .await
        .unwrap();
    }

    fn dbs(&self) -> Api<DatabaseCluster> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn alpha(&self) -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("db.devctl.io", "v1alpha1", "DatabaseCluster"),
            "databaseclusters",
        );
        Api::namespaced_with(self.client.clone(), &self.namespace, &resource)
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut command: Command = self.cp.kubectl();
        command.arg("-n").arg(&self.namespace).args(args);
        command.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        child.wait_with_output().unwrap()
    }
}

fn db(name: &str, spec: serde_json::Value) -> DatabaseCluster {
    serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": name }, "spec": spec,
    }))
    .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

const WARNING: &str = "Warning: db.devctl.io/v1alpha1 DatabaseCluster is deprecated";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_versions_round_trip_through_the_conversion_webhook() {
    let _turn = SERIAL.lock().await;
    let fx = Fixture::start("webhook-convert", |_| {}).await;

    // A v1alpha1 object from a manifest, read as v1beta1 and back.
    let alpha_yaml = r#"
apiVersion: db.devctl.io/v1alpha1
kind: DatabaseCluster
metadata:
  name: legacy
spec:
  engine: postgres
  replicas: 1
  version: "16.2"
  storage:
    size: 2Gi
  resources:
    cpu: 500m
    memory: 1Gi
  backupsEnabled: true
"#;
    let applied = fx.kubectl(&["apply", "-f", "-"], Some(alpha_yaml));
    assert!(applied.status.success(), "{}", stderr(&applied));
    assert!(
        stderr(&applied).contains(WARNING),
        "no deprecation warning: {}",
        stderr(&applied)
    );
    let beta = fx.dbs().get("legacy").await.unwrap();
    let requests = beta
        .spec
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert_eq!(requests["cpu"].0, "500m");
    assert_eq!(requests["memory"].0, "1Gi");
    assert!(beta.spec.backup.as_ref().unwrap().enabled);
    let via_kubectl = fx.kubectl(
        &[
            "get",
            "databaseclusters.v1beta1.db.devctl.io",
            "legacy",
            "-o",
            "json",
        ],
        None,
    );
    let via_kubectl: serde_json::Value = serde_json::from_slice(&via_kubectl.stdout).unwrap();
    assert_eq!(via_kubectl["spec"]["resources"]["requests"]["cpu"], "500m");
    let back = fx.kubectl(
        &[
            "get",
            "databaseclusters.v1alpha1.db.devctl.io",
            "legacy",
            "-o",
            "json",
        ],
        None,
    );
    assert!(stderr(&back).contains(WARNING), "{}", stderr(&back));
    let back: serde_json::Value = serde_json::from_slice(&back.stdout).unwrap();
    assert_eq!(
        back["spec"],
        json!({ "engine": "postgres", "replicas": 1, "version": "16.2", "storage": { "size": "2Gi" },
                "resources": { "cpu": "500m", "memory": "1Gi" }, "backupsEnabled": true })
    );
    let kube_alpha = fx.alpha().get("legacy").await.unwrap();
    assert_eq!(kube_alpha.data["spec"], back["spec"]);

    // A v1beta1 object with what v1alpha1 cannot say, written back through v1alpha1.
    let spec = json!({
        "engine": "postgres", "version": "16.2", "replicas": 3, "image": "registry.example/postgres:16.2",
        "storage": { "size": "5Gi" },
        "resources": { "requests": { "cpu": "1", "memory": "2Gi" }, "limits": { "memory": "4Gi" } },
        "backup": { "enabled": true, "schedule": "30 1 * * *", "retention": 14, "keepLast": 3 },
        "highAvailability": { "enabled": true, "failoverTimeout": "20s" },
        "replication": { "synchronous": { "method": "any", "number": 1 } },
    });
    let created = fx
        .dbs()
        .create(&PostParams::default(), &db("modern", spec))
        .await
        .unwrap();
    let alpha = fx.alpha().get("modern").await.unwrap();
    assert_eq!(
        alpha.data["spec"]["resources"],
        json!({ "cpu": "1", "memory": "2Gi" })
    );
    assert_eq!(alpha.data["spec"]["backupsEnabled"], json!(true));
    assert!(alpha.data["spec"].get("highAvailability").is_none());
    assert!(
        alpha
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(PRESERVED_ANNOTATION)
    );
    fx.alpha()
        .replace("modern", &PostParams::default(), &alpha)
        .await
        .unwrap();
    let reread = fx.dbs().get("modern").await.unwrap();
    assert_eq!(reread.spec, created.spec, "nothing lost through v1alpha1");
    assert!(
        !reread
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(PRESERVED_ANNOTATION),
        "the annotation exists only in the v1alpha1 view"
    );
    // kubectl the same way: get as v1alpha1, replace, read as v1beta1.
    let yaml = fx.kubectl(
        &[
            "get",
            "databaseclusters.v1alpha1.db.devctl.io",
            "modern",
            "-o",
            "yaml",
        ],
        None,
    );
    let replaced = fx.kubectl(&["replace", "-f", "-"], Some(&stdout(&yaml)));
    assert!(replaced.status.success(), "{}", stderr(&replaced));
    assert_eq!(fx.dbs().get("modern").await.unwrap().spec, created.spec);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_objects_are_refused_with_the_field_and_the_rule() {
    let _turn = SERIAL.lock().await;
    let fx = Fixture::start("webhook-validate", |_| {}).await;
    let manifest = |name: &str, replicas: i32, version: &str, size: &str, ha: bool| {
        format!(
            "apiVersion: db.devctl.io/v1beta1\nkind: DatabaseCluster\nmetadata:\n  name: {name}\nspec:\n  engine: postgres\n  version: \"{version}\"\n  replicas: {replicas}\n  storage:\n    size: {size}\n  highAvailability:\n    enabled: {ha}\n"
        )
    };
    let refused = |output: Output, expected: &str| {
        assert!(!output.status.success(), "admitted; expected {expected}");
        let message = stderr(&output);
        assert!(
            message.contains(expected),
            "expected {expected:?} in: {message}"
        );
    };
    refused(
        fx.kubectl(
            &["apply", "-f", "-"],
            Some(&manifest("even", 2, "16.2", "1Gi", true)),
        ),
        "spec.replicas must be odd and at least 3 when spec.highAvailability.enabled is true",
    );
    refused(
        fx.kubectl(
            &["apply", "-f", "-"],
            Some(&manifest("tiny", 1, "16.2", "512Mi", false)),
        ),
        "admission webhook \"validate.databaseclusters.db.devctl.io\" denied the request: spec.storage.size: 512Mi is below the minimum of 1Gi",
    );
    let ok = fx.kubectl(
        &["apply", "-f", "-"],
        Some(&manifest("pg", 3, "16.4", "1Gi", true)),
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    refused(
        fx.kubectl(
            &["apply", "-f", "-"],
            Some(&manifest("pg", 3, "16.2", "1Gi", true)),
        ),
        "spec.version: downgrade from 16.4 to 16.2 is not supported",
    );
    // A major upgrade is admitted (pg_upgrade in place, docs/major-upgrade.md) — judged by a
    // server-side dry run, so nothing starts here — but not with a change of the replica
    // count at once.
    let major = fx.kubectl(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&manifest("pg", 3, "18.1", "1Gi", true)),
    );
    assert!(major.status.success(), "{}", stderr(&major));
    refused(
        fx.kubectl(
            &["apply", "-f", "-"],
            Some(&manifest("pg", 5, "17.0", "1Gi", true)),
        ),
        "spec.replicas: a major version upgrade (16 to 17) and a change of spec.replicas (3 to 5) at once: one at a time",
    );
    // The scale subresource bypasses webhooks on the main resource; the CEL rule holds there.
    refused(
        fx.kubectl(&["scale", "databasecluster/pg", "--replicas=4"], None),
        "spec.replicas must be odd",
    );
    // Nothing refused was stored or changed.
    let stored = fx.dbs().get("pg").await.unwrap();
    assert_eq!(
        (stored.spec.version.as_str(), stored.spec.replicas),
        ("16.4", 3)
    );
    assert!(fx.dbs().get_opt("tiny").await.unwrap().is_none());
    // A minor upgrade passes.
    let ok = fx.kubectl(
        &["apply", "-f", "-"],
        Some(&manifest("pg", 3, "16.6", "1Gi", true)),
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_from_the_engine_are_written_into_admitted_objects() {
    let _turn = SERIAL.lock().await;
    let fx = Fixture::start("webhook-defaults", |_| {}).await;
    let created = fx
        .dbs()
        .create(
            &PostParams::default(),
            &db(
                "mysql",
                json!({ "engine": "mysql", "version": "8.0", "storage": { "size": "1Gi" },
            "resources": { "requests": { "memory": "1Gi" } } }),
            ),
        )
        .await
        .unwrap();
    // Admitted with the finalizer: no operator runs here, so the webhook put it there.
    assert_eq!(
        created.metadata.finalizers.as_deref(),
        Some(&[devctl_api::database_cluster::FINALIZER.to_string()][..]),
        "the finalizer added at admission"
    );
    let requests = created.spec.resources.unwrap().requests.unwrap();
    assert_eq!(requests["cpu"].0, "250m", "cpu defaulted");
    assert_eq!(requests["memory"].0, "1Gi", "what the user set is kept");
    // A v1alpha1 read warns every time, with kubectl get as with apply.
    let get = fx.kubectl(&["get", "databaseclusters.v1alpha1.db.devctl.io"], None);
    assert!(get.status.success(), "{}", stderr(&get));
    assert!(stderr(&get).contains(WARNING), "{}", stderr(&get));
    let beta = fx.kubectl(&["get", "databaseclusters.v1beta1.db.devctl.io"], None);
    assert!(!stderr(&beta).contains("deprecated"), "{}", stderr(&beta));
}

/// GitOps tools create and re-apply with server-side apply; the finalizer the webhook added
/// to the create must survive their next apply of the same manifest (which does not list it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_finalizer_survives_a_server_side_re_apply() {
    let _turn = SERIAL.lock().await;
    let fx = Fixture::start("webhook-ssa", |_| {}).await;
    let manifest = json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "gitops" },
        "spec": { "engine": "postgres", "version": "16.2", "storage": { "size": "1Gi" } },
    });
    let apply = PatchParams::apply("gitops-tool");
    for round in ["create", "re-apply", "re-apply with a spec change"] {
        let mut manifest = manifest.clone();
        if round == "re-apply with a spec change" {
            manifest["spec"]["storage"]["size"] = json!("2Gi");
        }
        let applied = fx
            .dbs()
            .patch("gitops", &apply, &Patch::Apply(&manifest))
            .await
            .unwrap();
        assert_eq!(
            applied.finalizers(),
            [devctl_api::database_cluster::FINALIZER],
            "after the {round}: {:?}",
            applied.metadata.managed_fields
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_webhooks_down_creates_fail_and_finalizer_patches_pass() {
    let _turn = SERIAL.lock().await;
    let mut fx = Fixture::start("webhook-down", |_| {}).await;
    let mut kept = db(
        "kept",
        json!({ "engine": "postgres", "version": "16.2", "storage": { "size": "1Gi" } }),
    );
    kept.metadata.finalizers = Some(vec![devctl_api::database_cluster::FINALIZER.into()]);
    fx.dbs()
        .create(&PostParams::default(), &kept)
        .await
        .unwrap();
    fx.webhooks.take().unwrap().stop();

    let refused = fx.kubectl(
        &["apply", "-f", "-"],
        Some("apiVersion: db.devctl.io/v1beta1\nkind: DatabaseCluster\nmetadata:\n  name: new\nspec:\n  version: \"16.2\"\n  storage:\n    size: 1Gi\n"),
    );
    assert!(!refused.status.success());
    let message = stderr(&refused);
    assert!(
        message.contains("failed calling webhook \"default.databaseclusters.db.devctl.io\"")
            && message.contains("connection refused"),
        "{message}"
    );
    // Finalizer and status patches leave spec alone: the match conditions skip the webhooks.
    fx.dbs()
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    fx.dbs().delete("kept", &Default::default()).await.unwrap();
    devctl_testenv::eventually("kept to be gone", Duration::from_secs(10), || {
        let dbs = fx.dbs();
        async move { dbs.get_opt("kept").await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
    // Back up: admitted again.
    fx.serve().await;
}

fn bundle_of(config: &serde_json::Value) -> String {
    use base64::Engine as _;
    let encoded = config["caBundle"].as_str().unwrap_or_default();
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_near_expiry_is_renewed_without_failing_a_request() {
    let _turn = SERIAL.lock().await;
    // 30 s certificates are renewed 10 s before they expire: about 20 s from now.
    let fx = Fixture::start("webhook-rotate", |s| {
        s.cert_validity = Duration::from_secs(30)
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(fx.client.clone(), &fx.namespace);
    let cert_of = |secret: &Secret| {
        String::from_utf8(secret.data.as_ref().unwrap()["tls.crt"].0.clone()).unwrap()
    };
    let first = cert_of(&secrets.get(webhook::CERT_SECRET).await.unwrap());
    let dbs = fx.dbs();
    let alpha = fx.alpha();
    fx.dbs()
        .create(
            &PostParams::default(),
            &db(
                "seen",
                json!({ "version": "16.2", "storage": { "size": "1Gi" } }),
            ),
        )
        .await
        .unwrap();
    let probe = db(
        "probe",
        json!({ "engine": "postgres", "version": "16.2", "storage": { "size": "1Gi" } }),
    );
    let started = Instant::now();
    let mut renewed_at = None;
    let mut requests = 0;
    // Admission (dry-run creates) and conversion (v1alpha1 reads) keep succeeding until
    // well after the switch.
    while renewed_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_secs(5)) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no renewal within 60 s"
        );
        dbs.create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &probe,
        )
        .await
        .unwrap_or_else(|e| panic!("admission failed after {:?}: {e}", started.elapsed()));
        alpha
            .get("seen")
            .await
            .unwrap_or_else(|e| panic!("conversion failed after {:?}: {e}", started.elapsed()));
        requests += 2;
        if renewed_at.is_none()
            && cert_of(&secrets.get(webhook::CERT_SECRET).await.unwrap()) != first
        {
            renewed_at = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "renewed after {:?}; {requests} requests, none failed",
        started.elapsed()
    );
    let secret = secrets.get(webhook::CERT_SECRET).await.unwrap();
    let new_ca = String::from_utf8(secret.data.as_ref().unwrap()["ca.crt"].0.clone()).unwrap();
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(fx.client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(fx.client.clone());
    let crds: Api<CustomResourceDefinition> = Api::all(fx.client.clone());
    let name = &fx.settings.configuration_name;
    let v = serde_json::to_value(validating.get(name).await.unwrap()).unwrap();
    let m = serde_json::to_value(mutating.get(name).await.unwrap()).unwrap();
    let c = serde_json::to_value(crds.get("databaseclusters.db.devctl.io").await.unwrap()).unwrap();
    for (what, config) in [
        ("validating", &v["webhooks"][0]["clientConfig"]),
        ("mutating", &m["webhooks"][0]["clientConfig"]),
        (
            "conversion",
            &c["spec"]["conversion"]["webhook"]["clientConfig"],
        ),
    ] {
        assert!(
            bundle_of(config).contains(new_ca.trim()),
            "{what} caBundle lacks the new CA"
        );
    }
}

async fn handshake(address: std::net::SocketAddr, ca_pem: &str) -> bool {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let Ok(tcp) = tokio::net::TcpStream::connect(address).await else {
        return false;
    };
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(name, tcp).await.is_ok()
}

fn write_pair(dir: &Path, generated: &certificates::Generated) {
    // The key last: a reader that sees the new key sees the new certificate too.
    std::fs::write(dir.join("ca.crt"), &generated.ca_pem).unwrap();
    std::fs::write(dir.join("tls.crt"), &generated.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &generated.key_pem).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounted_certificate_is_served_and_reloaded_when_the_files_change() {
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let hosts = vec!["127.0.0.1".to_string()];
    let first = certificates::generate(&hosts, Duration::from_secs(3600)).unwrap();
    write_pair(dir.path(), &first);
    let path = dir.path().to_path_buf();
    let fx = Fixture::start("webhook-certdir", |s| s.cert_dir = Some(path)).await;
    let address = fx.webhooks.as_ref().unwrap().local_addr;
    assert!(handshake(address, &first.ca_pem).await);
    let secrets: Api<Secret> = Api::namespaced(fx.client.clone(), &fx.namespace);
    assert!(
        secrets
            .get_opt(webhook::CERT_SECRET)
            .await
            .unwrap()
            .is_none(),
        "a mounted certificate is never replaced by a self-managed one"
    );

    let second = certificates::generate(&hosts, Duration::from_secs(3600)).unwrap();
    write_pair(dir.path(), &second);
    devctl_testenv::eventually(
        "the new certificate to be served",
        Duration::from_secs(15),
        || {
            let ca = second.ca_pem.clone();
            async move { handshake(address, &ca).await.then_some(()) }
        },
    )
    .await
    .unwrap();
    assert!(
        !handshake(address, &first.ca_pem).await,
        "the old certificate is no longer served"
    );
    // The API server trusts it too (ca.crt was injected).
    fx.wait_admitting().await;
}
