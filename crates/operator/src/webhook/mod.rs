//! Admission and conversion webhooks for `DatabaseCluster`, served over HTTPS by every
//! replica (outside the leader gate: a leader change never interrupts admission).
//!
//! - `handlers`: bytes in, bytes out — validation, defaults, conversion (docs/webhooks.md);
//! - `certificates`: the serving certificate, self-managed in a shared Secret or read from a
//!   directory (cert-manager), hot-swapped on renewal;
//! - `configuration`: the webhook configurations and the CRD's conversion stanza, with the CA
//!   injected.

pub mod certificates;
pub mod configuration;
pub mod handlers;

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use devctl_api::database_cluster::CONVERSION_PATH;
use devctl_api::database_cluster::admission::AdmissionSettings;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

use certificates::{Material, Resolver};

/// The Secret holding the self-managed certificate (in the operator's namespace).
pub const CERT_SECRET: &str = "devctl-operator-webhook-cert";
/// Port the webhook server listens on in the operator's pod.
pub const PORT: u16 = 9443;
/// Validity of self-managed certificates unless `--webhook-cert-validity` says otherwise.
pub const DEFAULT_CERT_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
/// How long the API server takes to use a new `caBundle` (its informer); a renewed
/// certificate is served only after this, while the previous CA stays trusted.
const CA_PROPAGATION: Duration = Duration::from_secs(2);
/// How often the certificate and the configurations are checked when nothing is due.
const RECHECK: Duration = Duration::from_secs(60);
/// How often mounted certificate files are looked at (`--webhook-cert-dir`).
const FILE_POLL: Duration = Duration::from_secs(2);

/// The port is meant for the API server (a few replicas, each keeping a few connections
/// alive), but anyone who reaches it can connect: the cap bounds the tasks, TLS sessions and
/// buffers such a client can make us hold. A connection past it is not refused but waits,
/// unanswered in the listen backlog, until another closes, so a burst from the API server is
/// served late rather than failed.
pub const MAX_CONNECTIONS: usize = 64;
/// The API server writes a request head at once; a client that has not sent a complete one
/// within this (silent, or trickling bytes) is disconnected so it cannot keep a connection
/// slot. Connections are not kept alive: hyper would time the idle wait for a next request
/// with this too, and a request the API server writes as that connection closes fails (its
/// client retries no POST it has written) — one TLS handshake per review costs less.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The API server waits `timeoutSeconds` (5) for admission and longer for conversion, while
/// our answers take milliseconds: a request still unanswered after this (a body trickled in,
/// a stuck handler) is answered [`TIMEOUT_STATUS`] so its connection's slot is not held.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// 503 rather than 408: 408 blames the client for being slow to send, while an answer that
/// is late is ours (a stuck handler, a saturated blocking pool). The API server counts any
/// status other than 200 as the webhook failing and logs it, so only the reading differs.
pub const TIMEOUT_STATUS: StatusCode = StatusCode::SERVICE_UNAVAILABLE;
/// The API server refuses requests over 3 MiB, so none of its reviews is bigger; a larger
/// body is not the API server's and would only cost memory to buffer.
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// Bodies larger than this are decoded, judged or converted on the blocking pool: a few
/// MiB of JSON take tens of milliseconds, a stall for every reconcile sharing the runtime's
/// worker threads; below it, the hop to another thread costs more than the work.
pub const OFFLOAD_ABOVE: usize = 256 * 1024;
/// A client that connects and never completes the TLS handshake gives its slot back.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connection and timing limits of [`serve`]: the constants above, except in tests that
/// need a timeout shorter than they can wait for.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_connections: usize,
    header_read_timeout: Duration,
    request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
        }
    }
}

/// Why the webhook server could not start or keep its certificate.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("certificate: {0}")]
    Certificate(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(
        "the CRD databaseclusters.db.devctl.io is not installed (devctl operator install installs it)"
    )]
    CrdMissing,
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("reading {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Settings of the webhook server (`--webhook-*` flags).
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// `https://host:port` the API server calls instead of the Service (`--webhook-url`).
    pub url: Option<String>,
    /// A directory with `tls.crt` and `tls.key` (and optionally `ca.crt`, which is then
    /// injected) managed by someone else (`--webhook-cert-dir`); self-managed when unset.
    pub cert_dir: Option<PathBuf>,
    /// Validity of self-managed certificates (`--webhook-cert-validity`).
    pub cert_validity: Duration,
    /// The operator's namespace: the certificate Secret and the webhook Service live there.
    pub namespace: String,
    /// The webhook Service (its DNS names go into the certificate).
    pub service_name: String,
    /// Name of the ValidatingWebhookConfiguration and MutatingWebhookConfiguration.
    pub configuration_name: String,
    /// Namespaces the operator watches (empty: all); the webhooks judge objects only there.
    pub watch_namespaces: Vec<String>,
    /// The admission rules' settings (`--webhook-min-storage`).
    pub admission: AdmissionSettings,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            url: None,
            cert_dir: None,
            cert_validity: DEFAULT_CERT_VALIDITY,
            namespace: crate::names::NAMESPACE.into(),
            service_name: devctl_api::database_cluster::CONVERSION_SERVICE_NAME.into(),
            configuration_name: crate::names::NAME.into(),
            watch_namespaces: Vec::new(),
            admission: AdmissionSettings::default(),
        }
    }
}

impl WebhookSettings {
    /// The names the serving certificate must be valid for.
    pub fn hosts(&self) -> Vec<String> {
        if let Some(url) = &self.url {
            let host = url
                .trim_start_matches("https://")
                .split(['/', '?'])
                .next()
                .unwrap_or_default();
            // `[::1]:9443`, `10.0.0.1:9443` or `host:9443`.
            let host = match host.strip_prefix('[') {
                Some(rest) => rest.split(']').next().unwrap_or_default(),
                None => host.rsplit_once(':').map_or(host, |(h, _)| h),
            };
            return vec![host.to_string()];
        }
        let service = format!("{}.{}", self.service_name, self.namespace);
        vec![
            format!("{service}.svc"),
            format!("{service}.svc.cluster.local"),
            service,
        ]
    }
}

#[derive(Clone)]
struct AppState {
    admission: Arc<AdmissionSettings>,
}

/// The webhook routes (plain HTTP; [`serve`] puts TLS in front).
pub fn router(admission: AdmissionSettings) -> Router {
    let state = AppState {
        admission: Arc::new(admission),
    };
    Router::new()
        .route(configuration::VALIDATE_PATH, post(validate))
        .route(configuration::MUTATE_PATH, post(mutate))
        .route(CONVERSION_PATH, post(convert))
        // A body without a declared length (chunked) is cut off once past the limit.
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn(refuse_declared_oversize))
        .with_state(state)
}

/// 413 for a body declared larger than [`MAX_BODY`], before reading any of it.
async fn refuse_declared_oversize(request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY as u64) {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over {MAX_BODY} bytes"),
        )
            .into_response();
    }
    next.run(request).await
}

async fn validate(State(state): State<AppState>, body: Bytes) -> Response {
    let admission = state.admission.clone();
    answer_json(body, move |body| handlers::validate(body, &admission)).await
}

async fn mutate(body: Bytes) -> Response {
    answer_json(body, handlers::mutate).await
}

async fn convert(body: Bytes) -> Response {
    answer_json(body, handlers::convert).await
}

/// `handle`'s answer to `body` as JSON, computed on the blocking pool when the body is over
/// [`OFFLOAD_ABOVE`].
async fn answer_json(
    body: Bytes,
    handle: impl FnOnce(&[u8]) -> Vec<u8> + Send + 'static,
) -> Response {
    let answer = if body.len() > OFFLOAD_ABOVE {
        match tokio::task::spawn_blocking(move || handle(&body)).await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::error!(%error, "a webhook request's handling failed");
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            }
        }
    } else {
        handle(&body)
    };
    ([(header::CONTENT_TYPE, "application/json")], answer).into_response()
}

/// A running webhook server.
pub struct Webhooks {
    pub local_addr: std::net::SocketAddr,
    pub resolver: Arc<Resolver>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Closes the open connections too (the API server keeps them alive between calls).
    stop: tokio::sync::watch::Sender<bool>,
}

impl Webhooks {
    /// Stops serving (closing open connections) and managing the certificate.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Webhooks {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Serves the webhooks on `listener` over TLS and keeps the certificate (and the
/// configurations that trust it) current. Returns once the first certificate is loaded, so
/// a caller that waits for this is ready to answer the API server.
pub async fn start(
    client: kube::Client,
    settings: WebhookSettings,
    listener: tokio::net::TcpListener,
) -> Result<Webhooks, WebhookError> {
    let local_addr = listener.local_addr().map_err(|source| WebhookError::File {
        path: "webhook listener".into(),
        source,
    })?;
    let resolver = Arc::new(Resolver::default());
    let mut tasks = Vec::new();
    // The first certificate before serving, so the first handshake already succeeds.
    match &settings.cert_dir {
        Some(dir) => {
            let mut watcher = CertDir::new(dir.clone());
            watcher.load(&client, &settings, &resolver).await?;
            let (client, settings, resolver) = (client.clone(), settings.clone(), resolver.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::time::sleep(FILE_POLL).await;
                    if let Err(error) = watcher.load(&client, &settings, &resolver).await {
                        tracing::warn!(%error, dir = %watcher.dir.display(), "webhook certificate files not reloaded; serving the previous certificate");
                    }
                }
            }));
        }
        None => {
            let first = self_managed_step(&client, &settings, &resolver).await?;
            let (client, settings, resolver) = (client.clone(), settings.clone(), resolver.clone());
            tasks.push(tokio::spawn(async move {
                let mut wait = first;
                loop {
                    tokio::time::sleep(wait).await;
                    wait = match self_managed_step(&client, &settings, &resolver).await {
                        Ok(wait) => wait,
                        Err(error) => {
                            tracing::warn!(%error, "webhook certificate not checked or renewed; retrying");
                            Duration::from_secs(5)
                        }
                    };
                }
            }));
        }
    }
    let acceptor = acceptor(resolver.clone())?;
    let app = router(settings.admission.clone());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tasks.push(tokio::spawn(serve(
        listener,
        acceptor,
        app,
        Limits::default(),
        stopped,
    )));
    tracing::info!(address = %local_addr, url = ?settings.url, "serving the admission and conversion webhooks");
    Ok(Webhooks {
        local_addr,
        resolver,
        tasks,
        stop,
    })
}

/// TLS (HTTP/1.1 only) with the certificate `resolver` holds at each handshake.
fn acceptor(resolver: Arc<Resolver>) -> Result<tokio_rustls::TlsAcceptor, WebhookError> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    limits: Limits,
    stopped: tokio::sync::watch::Receiver<bool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        // Taken before accepting: past the limit, a new connection waits in the listen
        // backlog (its handshake unanswered) until a served one closes.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return; // Never closed.
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accepting a webhook connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, app, stopped) = (acceptor.clone(), app.clone(), stopped.clone());
        tokio::spawn(async move {
            serve_connection(tcp, peer, acceptor, app, limits, stopped).await;
            drop(slot);
        });
    }
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    limits: Limits,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let stream = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            tracing::debug!(%error, %peer, "webhook TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let service = hyper::service::service_fn(move |request| {
        answer_in_time(app.clone(), request, limits.request_timeout)
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(false)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::select! {
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(%error, %peer, "webhook connection ended");
            }
        }
        _ = stopped.wait_for(|stop| *stop) => {}
    }
}

/// `app`'s answer to `request` (its body read included), or [`TIMEOUT_STATUS`] once
/// `timeout` has passed. Work moved to the blocking pool finishes unobserved.
async fn answer_in_time(
    app: Router,
    request: hyper::Request<hyper::body::Incoming>,
    timeout: Duration,
) -> Result<Response, Infallible> {
    use tower::ServiceExt as _;
    match tokio::time::timeout(timeout, app.oneshot(request)).await {
        Ok(answered) => answered,
        Err(_) => {
            tracing::warn!(?timeout, "a webhook request was not answered in time");
            Ok((
                TIMEOUT_STATUS,
                format!("not answered within {}s", timeout.as_secs_f64()),
            )
                .into_response())
        }
    }
}

/// One round of self-management: make sure the Secret holds a certificate for our hosts that
/// is not due for renewal (renewing it if needed), inject its CAs, then serve it. Returns how
/// long to wait before the next round.
async fn self_managed_step(
    client: &kube::Client,
    settings: &WebhookSettings,
    resolver: &Resolver,
) -> Result<Duration, WebhookError> {
    let material = ensure_secret(client, settings).await?;
    // Serving goes on when the configurations cannot be written (a missing right, the API
    // briefly down): the next round tries again.
    if let Err(error) = configuration::inject(client, settings, &material.ca_bundle).await {
        tracing::warn!(%error, "webhook configurations not updated; retrying within a minute");
    }
    if resolver.is_loaded() && !resolver.serves(&material.cert_pem) {
        // A renewed certificate (by this replica or another): the API server picks up the new
        // caBundle asynchronously, and the previous CA is still in it, so the certificate
        // served until now keeps working meanwhile.
        tokio::time::sleep(CA_PROPAGATION).await;
    }
    resolver.set(&material.cert_pem, &material.key_pem)?;
    let renew_at = certificates::inspect(&material.cert_pem)
        .map(|c| c.not_after - certificates::renew_before(settings.cert_validity))
        .unwrap_or_else(SystemTime::now);
    let until_renewal = renew_at
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    // Replicas renew at the same moment; a little jitter lets one win and the others read it.
    let jitter = Duration::from_millis(rand::random::<u64>() % 1000);
    Ok(until_renewal.min(RECHECK) + jitter)
}

fn data(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
}

/// The certificate from the shared Secret, made or renewed when missing, due, or not valid
/// for our hosts. Concurrent replicas: a create or replace that loses the race re-reads.
async fn ensure_secret(
    client: &kube::Client,
    settings: &WebhookSettings,
) -> Result<Material, WebhookError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let hosts = settings.hosts();
    for _ in 0..5 {
        let existing = secrets.get_opt(CERT_SECRET).await?;
        let now = SystemTime::now();
        if let Some(secret) = &existing
            && let (Some(cert_pem), Some(key_pem), Some(ca)) = (
                data(secret, "tls.crt"),
                data(secret, "tls.key"),
                data(secret, "ca.crt"),
            )
            && let Some(inspected) = certificates::inspect(&cert_pem)
            && hosts.iter().all(|h| inspected.hosts.contains(h))
            && now + certificates::renew_before(settings.cert_validity) < inspected.not_after
            // A pair that cannot be served (edited by hand, half-written) is renewed.
            && Resolver::default().set(&cert_pem, &key_pem).is_ok()
        {
            let previous = data(secret, "ca-previous.crt").unwrap_or_default();
            let ca_bundle = certificates::unexpired(&format!("{ca}{previous}"), now);
            return Ok(Material {
                cert_pem,
                key_pem,
                ca_bundle,
            });
        }
        let generated = certificates::generate(&hosts, settings.cert_validity)?;
        // The CA being replaced stays trusted until it expires, so the certificate it signed
        // keeps working on replicas that have not switched yet.
        let previous = existing
            .as_ref()
            .and_then(|s| data(s, "ca.crt"))
            .map(|ca| certificates::unexpired(&ca, now))
            .unwrap_or_default();
        let mut secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(CERT_SECRET.into()),
                namespace: Some(settings.namespace.clone()),
                labels: Some(
                    [
                        ("app.kubernetes.io/name", crate::names::NAME),
                        ("app.kubernetes.io/component", "webhook"),
                        ("app.kubernetes.io/part-of", "devctl"),
                        ("app.kubernetes.io/managed-by", crate::names::FIELD_MANAGER),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ),
                resource_version: existing
                    .as_ref()
                    .and_then(|s| s.metadata.resource_version.clone()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            ..Default::default()
        };
        let mut map = std::collections::BTreeMap::new();
        map.insert(
            "tls.crt".to_string(),
            ByteString(generated.cert_pem.clone().into_bytes()),
        );
        map.insert(
            "tls.key".to_string(),
            ByteString(generated.key_pem.clone().into_bytes()),
        );
        map.insert(
            "ca.crt".to_string(),
            ByteString(generated.ca_pem.clone().into_bytes()),
        );
        if !previous.is_empty() {
            map.insert(
                "ca-previous.crt".to_string(),
                ByteString(previous.clone().into_bytes()),
            );
        }
        secret.data = Some(map);
        let written = match &existing {
            None => secrets.create(&PostParams::default(), &secret).await,
            Some(_) => {
                secrets
                    .replace(CERT_SECRET, &PostParams::default(), &secret)
                    .await
            }
        };
        match written {
            Ok(_) => {
                tracing::info!(secret = CERT_SECRET, namespace = %settings.namespace, validity = ?settings.cert_validity, "made a new webhook certificate");
                return Ok(Material {
                    cert_pem: generated.cert_pem,
                    key_pem: generated.key_pem,
                    ca_bundle: format!("{}{previous}", generated.ca_pem),
                });
            }
            // Another replica wrote first: use what it wrote.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            // Deleted between our read and our replace: create it.
            Err(kube::Error::Api(status)) if status.code == 404 && existing.is_some() => {
                continue;
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Err(WebhookError::Certificate(format!(
                    "the namespace {} does not exist; the webhook certificate Secret is kept there (--leader-election-namespace, or $POD_NAMESPACE)",
                    settings.namespace
                )));
            }
            Err(error) => return Err(error.into()),
        }
    }
    Err(WebhookError::Certificate(format!(
        "the Secret {}/{CERT_SECRET} kept changing while it was being renewed",
        settings.namespace
    )))
}

/// Certificate files someone else renews (cert-manager): reloaded when they change.
struct CertDir {
    dir: PathBuf,
    seen: Option<Vec<Option<SystemTime>>>,
}

impl CertDir {
    fn new(dir: PathBuf) -> Self {
        Self { dir, seen: None }
    }

    async fn load(
        &mut self,
        client: &kube::Client,
        settings: &WebhookSettings,
        resolver: &Resolver,
    ) -> Result<(), WebhookError> {
        let names = ["tls.crt", "tls.key", "ca.crt"];
        let mut stamps = Vec::new();
        for name in names {
            let modified = tokio::fs::metadata(self.dir.join(name))
                .await
                .and_then(|m| m.modified())
                .ok();
            stamps.push(modified);
        }
        if self.seen.as_ref() == Some(&stamps) {
            return Ok(());
        }
        let read = |name: &str| {
            let path = self.dir.join(name);
            async move {
                tokio::fs::read_to_string(&path)
                    .await
                    .map_err(|source| WebhookError::File { path, source })
            }
        };
        let cert_pem = read("tls.crt").await?;
        let key_pem = read("tls.key").await?;
        if let Ok(ca) = read("ca.crt").await {
            configuration::inject(client, settings, &ca).await?;
        }
        resolver.set(&cert_pem, &key_pem)?;
        tracing::info!(dir = %self.dir.display(), "loaded the webhook certificate");
        self.seen = Some(stamps);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
