//! The webhook server's limits and handlers, served over real TLS on a local port.

use super::*;
use std::pin::pin;
use std::time::Instant;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

#[test]
fn certificate_hosts_follow_the_url_or_the_service() {
    let url = |u: &str| WebhookSettings {
        url: Some(u.into()),
        ..WebhookSettings::default()
    };
    assert_eq!(url("https://127.0.0.1:9443").hosts(), ["127.0.0.1"]);
    assert_eq!(url("https://[::1]:9443/x").hosts(), ["::1"]);
    assert_eq!(
        url("https://webhooks.example.com").hosts(),
        ["webhooks.example.com"]
    );
    assert_eq!(
        WebhookSettings::default().hosts(),
        [
            "devctl-operator-webhook.devctl-system.svc",
            "devctl-operator-webhook.devctl-system.svc.cluster.local",
            "devctl-operator-webhook.devctl-system"
        ]
    );
}

/// [`serve`] on a local port with a certificate for 127.0.0.1.
struct TestServer {
    client: Client,
    task: tokio::task::JoinHandle<()>,
    _stop: tokio::sync::watch::Sender<bool>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    async fn start(app: Router, limits: Limits) -> Self {
        let hosts = ["127.0.0.1".to_string()];
        let generated = certificates::generate(&hosts, Duration::from_secs(3600)).unwrap();
        let resolver = Arc::new(Resolver::default());
        resolver
            .set(&generated.cert_pem, &generated.key_pem)
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let acceptor = acceptor(resolver).unwrap();
        let task = tokio::spawn(serve(listener, acceptor, app, limits, stopped));
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(generated.ca_pem.as_bytes()) {
            roots.add(ca.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        Self {
            client: Client { address, connector },
            task,
            _stop: stop,
        }
    }

    async fn webhooks(limits: Limits) -> Self {
        Self::start(router(AdmissionSettings::default()), limits).await
    }
}

#[derive(Clone)]
struct Client {
    address: std::net::SocketAddr,
    connector: tokio_rustls::TlsConnector,
}

impl Client {
    /// A connection with its TLS handshake done.
    async fn connect(&self) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.address).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        self.connector.connect(name, tcp).await.unwrap()
    }
}

fn post_request(path: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// A POST whose length is not declared (`Transfer-Encoding: chunked`).
fn post_chunked(path: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for chunk in body.chunks(64 * 1024) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    request
}

/// Sends `request` while reading the answer: a server refusing a body answers before
/// reading it all and may close before it is all written. The status and the body.
async fn exchange(stream: &mut TlsStream<TcpStream>, request: &[u8]) -> (u16, Vec<u8>) {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let write = async move {
        if writer.write_all(request).await.is_ok() {
            let _ = writer.flush().await;
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        answer = read_response(&mut reader) => answer,
        () = write => unreachable!(),
    }
}

async fn read_response(stream: &mut (impl AsyncRead + Unpin)) -> (u16, Vec<u8>) {
    let mut received = Vec::new();
    let mut chunk = vec![0; 64 * 1024];
    let head_end = loop {
        if let Some(at) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let read = stream.read(&mut chunk).await.expect("a response");
        assert!(read > 0, "the connection closed without a response");
        received.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&received[..head_end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"));
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("a content-length: {head}"));
    let mut body = received.split_off(head_end);
    while body.len() < length {
        let read = stream.read(&mut chunk).await.expect("the response body");
        assert!(read > 0, "the connection closed within the response body");
        body.extend_from_slice(&chunk[..read]);
    }
    (status, body)
}

/// A ConversionReview of `objects` v1beta1 clusters, each with `padding` bytes of
/// annotation, to v1alpha1.
fn conversion_review(objects: usize, padding: usize) -> Vec<u8> {
    let objects: Vec<Value> = (0..objects)
        .map(|i| {
            json!({ "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
                    "metadata": { "name": format!("pg-{i}"), "namespace": "default",
                                  "annotations": { "example.com/padding": "x".repeat(padding) } },
                    "spec": { "version": "16.2", "replicas": 1, "storage": { "size": "1Gi" } } })
        })
        .collect();
    serde_json::to_vec(&json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": { "uid": "u1", "desiredAPIVersion": "db.devctl.io/v1alpha1", "objects": objects }
    }))
    .unwrap()
}

/// Every object of a [`conversion_review`] answer converted, in order.
fn assert_converted(answer: &Value, objects: usize) {
    assert_eq!(answer["response"]["uid"], "u1");
    assert_eq!(
        answer["response"]["result"]["status"], "Success",
        "{answer:.300}"
    );
    let converted = answer["response"]["convertedObjects"].as_array().unwrap();
    assert_eq!(converted.len(), objects);
    for (i, object) in converted.iter().enumerate() {
        assert_eq!(object["apiVersion"], "db.devctl.io/v1alpha1");
        assert_eq!(object["metadata"]["name"], format!("pg-{i}"));
    }
}

/// A CREATE review of a valid cluster with `padding` bytes of annotation.
fn admission_review(padding: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u2",
            "kind": { "group": "db.devctl.io", "version": "v1beta1", "kind": "DatabaseCluster" },
            "resource": { "group": "db.devctl.io", "version": "v1beta1", "resource": "databaseclusters" },
            "name": "pg", "namespace": "default", "operation": "CREATE",
            "userInfo": { "username": "admin" },
            "object": { "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
                        "metadata": { "name": "pg", "namespace": "default",
                                      "annotations": { "example.com/padding": "x".repeat(padding) } },
                        "spec": { "version": "16.2", "replicas": 1, "storage": { "size": "1Gi" } } },
            "oldObject": null, "dryRun": false,
        }
    }))
    .unwrap()
}

async fn json_of(response: Response) -> Value {
    assert_eq!(response.status(), StatusCode::OK);
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn a_connection_past_the_limit_waits_until_one_closes() {
    // The held connections stay idle longer than the test lasts.
    let limits = Limits {
        header_read_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let server = TestServer::webhooks(limits).await;
    let small = post_request(CONVERSION_PATH, &conversion_review(1, 0));
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        held.push(server.client.connect().await);
    }
    let waiting = tokio::spawn({
        let (client, small) = (server.client.clone(), small.clone());
        async move { exchange(&mut client.connect().await, &small).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "connection {} was served while {MAX_CONNECTIONS} were open",
        MAX_CONNECTIONS + 1
    );
    // A held connection is served, and closed by the server once answered (no
    // kept-alive idle connection holds a slot): the waiting one is served then.
    let mut last = held.pop().unwrap();
    assert_eq!(exchange(&mut last, &small).await.0, 200);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(2), last.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the server kept the answered connection open"
    );
    let (status, answer) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("served within 5 s of a connection closing")
        .unwrap();
    assert_eq!(status, 200);
    assert_converted(&serde_json::from_slice(&answer).unwrap(), 1);
}

#[tokio::test]
async fn a_client_that_sends_no_complete_header_is_disconnected_after_5_s() {
    let server = TestServer::webhooks(Limits::default()).await;
    let mut stream = server.client.connect().await;
    let opened = Instant::now();
    let (mut reader, mut writer) = tokio::io::split(&mut stream);
    // A request head begun, then trickled a byte every 250 ms, never ended.
    let trickle = async move {
        let begun = format!("POST {CONVERSION_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
        let mut next = begun.as_bytes();
        while writer.write_all(next).await.is_ok() && writer.flush().await.is_ok() {
            next = b"a";
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        std::future::pending::<()>().await;
    };
    let mut rest = Vec::new();
    let closed = tokio::select! {
        closed = tokio::time::timeout(2 * HEADER_READ_TIMEOUT, reader.read_to_end(&mut rest)) => closed,
        () = trickle => unreachable!(),
    };
    let elapsed = opened.elapsed();
    assert!(
        closed.is_ok(),
        "the connection was still open after {elapsed:?}"
    );
    assert!(
        elapsed >= HEADER_READ_TIMEOUT - Duration::from_millis(100),
        "closed after {elapsed:?}"
    );
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
}

#[tokio::test]
async fn a_request_not_answered_in_time_gets_503() {
    let app = Router::new()
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        )
        .route("/quick", post(|| async { "quick" }));
    let request_timeout = Duration::from_millis(200);
    let limits = Limits {
        request_timeout,
        ..Limits::default()
    };
    let server = TestServer::start(app, limits).await;
    let mut stream = server.client.connect().await;
    assert_eq!(
        exchange(&mut stream, &post_request("/quick", b"")).await,
        (200, b"quick".to_vec())
    );
    // One review per connection.
    let mut stream = server.client.connect().await;
    let sent = Instant::now();
    let (status, _) = tokio::time::timeout(
        Duration::from_secs(3),
        exchange(&mut stream, &post_request("/slow", b"")),
    )
    .await
    .expect("an answer within 3 s");
    assert_eq!(status, TIMEOUT_STATUS.as_u16());
    assert!(sent.elapsed() >= request_timeout);
}

#[tokio::test]
async fn bodies_over_3_mib_get_413_without_being_read_whole() {
    let server = TestServer::webhooks(Limits::default()).await;
    let client = &server.client;
    // Nearly at the limit: converted in full.
    let objects = 1400;
    let large = conversion_review(objects, 2000);
    assert!(
        large.len() > MAX_BODY - 100 * 1024 && large.len() <= MAX_BODY,
        "{}",
        large.len()
    );
    let (status, answer) = exchange(
        &mut client.connect().await,
        &post_request(CONVERSION_PATH, &large),
    )
    .await;
    assert_eq!(status, 200);
    assert_converted(&serde_json::from_slice(&answer).unwrap(), objects);
    // At the limit: read and answered (as a malformed review).
    let (status, answer) = exchange(
        &mut client.connect().await,
        &post_request(CONVERSION_PATH, &vec![b' '; MAX_BODY]),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    for request in [
        post_request(CONVERSION_PATH, &vec![b' '; MAX_BODY + 1]),
        post_chunked(configuration::VALIDATE_PATH, &vec![b' '; MAX_BODY + 1]),
    ] {
        let (status, answer) = exchange(&mut client.connect().await, &request).await;
        assert_eq!(status, 413, "{}", String::from_utf8_lossy(&answer));
    }
    // Declared over the limit, and never sent: refused without waiting for it.
    let declared = format!(
        "POST {CONVERSION_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{{",
        100 * MAX_BODY
    );
    let (status, _) = tokio::time::timeout(
        Duration::from_secs(2),
        exchange(&mut client.connect().await, declared.as_bytes()),
    )
    .await
    .expect("refused without reading the body");
    assert_eq!(status, 413);
}

/// Polls `handling` once while the runtime's only blocking thread is busy, then lets it
/// finish: whether it answered inline (at that first poll) and its answer. Handling
/// sent to the blocking pool cannot have finished by then, however the threads run.
async fn answered_inline(handling: impl Future<Output = Response>) -> (bool, Response) {
    let (started, running) = std::sync::mpsc::channel();
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let occupier = tokio::task::spawn_blocking(move || {
        let _ = started.send(());
        let _ = gate.recv();
    });
    running.recv().unwrap();
    let mut handling = pin!(handling);
    let first = futures::poll!(handling.as_mut());
    release.send(()).unwrap();
    occupier.await.unwrap();
    match first {
        std::task::Poll::Ready(response) => (true, response),
        std::task::Poll::Pending => (false, handling.await),
    }
}

#[test]
fn large_bodies_are_handled_off_the_runtime() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    runtime.block_on(async {
        let objects = 300;
        let large = conversion_review(objects, 1000);
        assert!(large.len() > OFFLOAD_ABOVE);
        let (inline, response) = answered_inline(convert(Bytes::from(large))).await;
        assert!(!inline, "a large conversion ran on the runtime's thread");
        let answer = json_of(response).await;
        assert_converted(&answer, objects);

        let state = AppState {
            admission: Arc::new(AdmissionSettings::default()),
        };
        let large = Bytes::from(admission_review(OFFLOAD_ABOVE));
        let (inline, response) = answered_inline(validate(State(state), large.clone())).await;
        assert!(!inline, "a large validation ran on the runtime's thread");
        let answer = json_of(response).await;
        assert_eq!(answer["response"]["uid"], "u2");
        assert_eq!(answer["response"]["allowed"], true, "{answer:.300}");

        let (inline, response) = answered_inline(mutate(large)).await;
        assert!(!inline, "a large mutation ran on the runtime's thread");
        let answer = json_of(response).await;
        assert_eq!(
            answer["response"]["patchType"], "JSONPatch",
            "{answer:.300}"
        );

        let small = conversion_review(1, 0);
        assert!(small.len() <= OFFLOAD_ABOVE);
        let (inline, response) = answered_inline(convert(Bytes::from(small))).await;
        assert!(inline, "a small conversion waited for the blocking pool");
        assert_converted(&json_of(response).await, 1);
    });
}
