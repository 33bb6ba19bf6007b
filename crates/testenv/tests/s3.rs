//! The object store speaks S3 over TLS to a real client (object_store, the crate the agent
//! uses), keeps its data across a stop and restart, and lists what it holds on disk.

use std::sync::Arc;
use std::time::Duration;

use devctl_testenv::S3Server;
use devctl_testenv::process::is_running;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{
    Certificate, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};

/// ring as rustls's process-wide provider, as the agent and the operator install it (the
/// store's HTTP client is built without one, next to kube's ring).
fn ring() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The client the agent would build: path-style requests to the endpoint, region us-east-1,
/// trusting only the test CA. Retries are off so a stopped store fails at once.
fn client(server: &S3Server) -> Arc<dyn ObjectStore> {
    ring();
    let options = ClientOptions::new()
        .with_root_certificate(Certificate::from_pem(server.ca_pem().as_bytes()).unwrap())
        .with_no_system_certificates(true)
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(30));
    let store = AmazonS3Builder::new()
        .with_endpoint(server.endpoint())
        .with_bucket_name(server.bucket())
        .with_region(server.region())
        .with_access_key_id(server.access_key_id())
        .with_secret_access_key(server.secret_access_key())
        .with_virtual_hosted_style_request(false)
        .with_client_options(options)
        .with_retry(RetryConfig {
            max_retries: 0,
            retry_timeout: Duration::from_secs(1),
            ..RetryConfig::default()
        })
        .build()
        .unwrap();
    Arc::new(store)
}

async fn keys(store: &dyn ObjectStore, prefix: &str) -> Vec<(String, u64)> {
    let mut listed: Vec<(String, u64)> = store
        .list(Some(&Path::from(prefix)))
        .map_ok(|meta| (meta.location.to_string(), meta.size))
        .try_collect()
        .await
        .unwrap();
    listed.sort();
    listed
}

#[tokio::test]
async fn put_get_list_delete_multipart_and_survive_a_restart() {
    let server = S3Server::start().await.unwrap();
    println!("{}", server.describe());
    let store = client(&server);

    // PUT, GET, LIST.
    let small = Path::from("cluster/wal/000000010000000000000001");
    store
        .put(&small, PutPayload::from_static(b"segment"))
        .await
        .unwrap();
    let body = store.get(&small).await.unwrap().bytes().await.unwrap();
    assert_eq!(&body[..], b"segment");
    assert_eq!(
        keys(store.as_ref(), "cluster").await,
        vec![("cluster/wal/000000010000000000000001".to_string(), 7)]
    );

    // Multipart: two 5 MiB parts and a 2 MiB one.
    let big = Path::from("cluster/base/20261130T120000Z-nightly/data.tar");
    let data: Vec<u8> = (0..12 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let mut upload = store.put_multipart(&big).await.unwrap();
    for part in data.chunks(5 * 1024 * 1024) {
        upload
            .put_part(PutPayload::from(part.to_vec()))
            .await
            .unwrap();
    }
    upload.complete().await.unwrap();
    let body = store.get(&big).await.unwrap().bytes().await.unwrap();
    assert_eq!(body.len(), data.len());
    assert!(
        body[..] == data[..],
        "the multipart object came back different"
    );
    assert_eq!(
        server.objects("cluster/"),
        vec![
            (
                "cluster/base/20261130T120000Z-nightly/data.tar".to_string(),
                data.len() as u64
            ),
            ("cluster/wal/000000010000000000000001".to_string(), 7),
        ]
    );
    assert_eq!(server.objects("cluster/wal/").len(), 1);
    assert!(server.objects("other/").is_empty());

    // DELETE.
    store.delete(&small).await.unwrap();
    assert!(matches!(
        store.get(&small).await,
        Err(object_store::Error::NotFound { .. })
    ));
    assert_eq!(
        keys(store.as_ref(), "cluster").await,
        vec![(big.to_string(), data.len() as u64)]
    );

    // The store goes down: requests fail. It comes back: the same client works again and the
    // data is still there.
    let pid = server.pid().unwrap();
    server.stop().await.unwrap();
    assert!(!is_running(pid));
    assert_eq!(server.pid(), None);
    let down = store.head(&big).await;
    assert!(
        matches!(down, Err(object_store::Error::Generic { .. })),
        "HEAD with the store stopped: {down:?}"
    );
    println!("while stopped: {down:?}");
    server.restart().await.unwrap();
    let meta = store.head(&big).await.unwrap();
    assert_eq!(meta.size, data.len() as u64);
    store
        .put(&small, PutPayload::from_static(b"again"))
        .await
        .unwrap();
    assert_eq!(
        server.objects("cluster/wal"),
        vec![("cluster/wal/000000010000000000000001".to_string(), 5)]
    );
    assert!(server.root().join("logs/versitygw.log.1").exists());

    let root = server.root().to_path_buf();
    let pid = server.pid().unwrap();
    drop(server);
    assert!(!is_running(pid), "versitygw still runs after drop");
    if std::env::var("DEVCTL_KEEP_TESTENV").is_ok_and(|v| v == "1") {
        std::fs::remove_dir_all(&root).unwrap();
    } else {
        assert!(!root.exists(), "{} was not removed", root.display());
    }
}

#[tokio::test]
async fn wrong_credentials_and_other_cas_are_refused() {
    let server = devctl_testenv::shared_s3().await.unwrap();

    // Another CA: the TLS handshake fails.
    let other = S3Server::start().await.unwrap();
    ring();
    let foreign = AmazonS3Builder::new()
        .with_endpoint(server.endpoint())
        .with_bucket_name(server.bucket())
        .with_region(server.region())
        .with_access_key_id(server.access_key_id())
        .with_secret_access_key(server.secret_access_key())
        .with_client_options(
            ClientOptions::new()
                .with_root_certificate(Certificate::from_pem(other.ca_pem().as_bytes()).unwrap())
                .with_no_system_certificates(true),
        )
        .with_retry(RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        })
        .build()
        .unwrap();
    let refused = foreign
        .put(&Path::from("refused/tls"), PutPayload::from_static(b"x"))
        .await;
    assert!(refused.is_err(), "a client trusting another CA got through");

    // The other server's credentials: access denied.
    let stranger = AmazonS3Builder::new()
        .with_endpoint(server.endpoint())
        .with_bucket_name(server.bucket())
        .with_region(server.region())
        .with_access_key_id(other.access_key_id())
        .with_secret_access_key(other.secret_access_key())
        .with_client_options(
            ClientOptions::new()
                .with_root_certificate(Certificate::from_pem(server.ca_pem().as_bytes()).unwrap())
                .with_no_system_certificates(true),
        )
        .with_retry(RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        })
        .build()
        .unwrap();
    let denied = stranger
        .put(&Path::from("refused/creds"), PutPayload::from_static(b"x"))
        .await;
    assert!(denied.is_err(), "wrong credentials got through");
    assert!(server.objects("refused/").is_empty());

    // And the right ones work on the shared server.
    let store = client(server);
    store
        .put(&Path::from("shared/ok"), PutPayload::from_static(b"ok"))
        .await
        .unwrap();
    assert_eq!(
        server.objects("shared/"),
        vec![("shared/ok".to_string(), 2)]
    );
}

/// Run by the next test in a child process, which is then killed with SIGKILL.
#[tokio::test]
#[ignore = "helper: run only as the child of killed_test_process_takes_its_object_store_with_it"]
async fn child_holds_an_object_store() {
    if std::env::var_os("DEVCTL_TESTENV_CHILD").is_none() {
        return;
    }
    let server = S3Server::start().await.unwrap();
    println!(
        "READY {} {}",
        server.root().display(),
        server.pid().unwrap()
    );
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn killed_test_process_takes_its_object_store_with_it() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holds_an_object_store",
            "--ignored",
            "--nocapture",
        ])
        .env("DEVCTL_TESTENV_CHILD", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("READY "))
    })
    .await
    .unwrap()
    .expect("the child never reported a running object store");
    let mut fields = line.split_whitespace().skip(1);
    let root = std::path::PathBuf::from(fields.next().unwrap());
    let pid: u32 = fields.next().unwrap().parse().unwrap();
    assert!(is_running(pid));

    child.kill().unwrap(); // SIGKILL: no destructor, no atexit hook runs.
    child.wait().unwrap();
    devctl_testenv::eventually(
        "the killed test's versitygw to die",
        Duration::from_secs(10),
        || async { (!is_running(pid)).then_some(()) },
    )
    .await
    .unwrap();
    // A SIGKILLed process cannot clean its directory; that is all it leaves.
    let _ = std::fs::remove_dir_all(root);
}
