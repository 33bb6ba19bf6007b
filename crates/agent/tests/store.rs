//! The agent's S3 client against a real S3 server (versitygw from devctl-testenv): every
//! operation the agent uses, multipart uploads, ranged reads, the test CA from the Secret,
//! and errors that never carry the keys.

use bytes::Bytes;
use devctl_agent::store::{PART_SIZE, Store, StoreCredentials, StoreError};
use devctl_api::instance::StoreLocation;

fn location(s3: &devctl_testenv::S3Server, prefix: &str) -> StoreLocation {
    StoreLocation {
        endpoint: s3.endpoint(),
        bucket: s3.bucket().to_string(),
        prefix: prefix.to_string(),
        region: s3.region().to_string(),
    }
}

fn credentials(s3: &devctl_testenv::S3Server) -> StoreCredentials {
    StoreCredentials {
        access_key_id: s3.access_key_id().to_string(),
        secret_access_key: s3.secret_access_key().to_string(),
        ca_pem: Some(s3.ca_pem().into_bytes()),
        version: "1".into(),
    }
}

#[tokio::test]
async fn puts_streams_lists_reads_and_deletes() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let prefix = format!("store-test-{}/", std::process::id());
    let store = Store::new(location(s3, &prefix), &credentials(s3)).unwrap();

    let small = format!("{prefix}small.json");
    store
        .put(&small, Bytes::from_static(b"{\"uid\":\"u\"}"))
        .await
        .unwrap();
    assert_eq!(store.get(&small).await.unwrap(), &b"{\"uid\":\"u\"}"[..]);
    assert_eq!(store.head(&small).await.unwrap(), Some(11));
    let missing = format!("{prefix}missing");
    assert_eq!(store.head(&missing).await.unwrap(), None);
    assert!(matches!(
        store.get(&missing).await,
        Err(StoreError::NotFound(_))
    ));

    // More than two parts, streamed: a multipart upload; read back in ranges.
    let size = 2 * PART_SIZE + 12345;
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let big = format!("{prefix}big.tar");
    let mut seen = 0usize;
    let written = store
        .put_stream(&big, &mut &data[..], |chunk| seen += chunk.len())
        .await
        .unwrap();
    assert_eq!((written as usize, seen), (size, size));
    let on_disk = s3.objects(&big);
    assert_eq!(on_disk, [(big.clone(), size as u64)]);
    let mut ranges = store.open_ranges(&big).await.unwrap();
    let mut back = Vec::new();
    while let Some(bytes) = ranges.next().await.unwrap() {
        back.extend_from_slice(&bytes);
    }
    assert!(back == data, "the ranges differ from what was written");

    assert_eq!(
        store.list(&prefix).await.unwrap(),
        [big.clone(), small.clone()]
    );
    store.delete(&small).await.unwrap();
    store.delete(&big).await.unwrap();
    assert!(store.list(&prefix).await.unwrap().is_empty());
}

#[tokio::test]
async fn errors_name_the_object_but_never_the_keys() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let mut wrong = credentials(s3);
    wrong.secret_access_key = "not-the-Secret-Key-0123456789".into();
    let store = Store::new(location(s3, "errors/"), &wrong).unwrap();
    let e = store.get("errors/x").await.unwrap_err().to_string();
    assert!(e.contains("errors/x"), "{e}");
    for secret in [
        s3.secret_access_key(),
        s3.access_key_id(),
        "not-the-Secret-Key",
    ] {
        assert!(!e.contains(secret), "{e}");
    }

    // Without the Secret's CA the server's certificate is not trusted.
    let mut no_ca = credentials(s3);
    no_ca.ca_pem = None;
    let store = Store::new(location(s3, "errors/"), &no_ca).unwrap();
    assert!(store.head("errors/x").await.is_err());
}

/// A standby backup whose range ends in a segment the old primary archived only as
/// `.partial` (a failover while it ran): finished when the range goes on on the new
/// timeline, failed at once with the reason otherwise — never the whole ten-minute wait.
#[tokio::test]
async fn a_backup_spanning_a_failover_finishes_on_the_new_timeline_or_fails_at_once() {
    use devctl_agent::backup::wait_for_wal;
    use devctl_agent::wal::wal_key;
    use std::time::Duration;
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let prefix = format!("span-test-{}/", std::process::id());
    let store = Store::new(location(s3, &prefix), &credentials(s3)).unwrap();
    let put = |name: &'static str| {
        let key = wal_key(&prefix, name);
        let store = &store;
        async move { store.put(&key, Bytes::from_static(b"wal")).await.unwrap() }
    };
    put("000000010000000000000004").await;
    put("000000010000000000000005.partial").await;
    let old_timeline = || {
        vec![
            "000000010000000000000004".to_string(),
            "000000010000000000000005".to_string(),
        ]
    };
    let failed = tokio::time::timeout(
        Duration::from_secs(30),
        wait_for_wal(&store, &prefix, old_timeline()),
    )
    .await
    .expect("the wait fails at once, not after the whole bound")
    .unwrap_err();
    assert!(
        failed.contains("spans a failover") && failed.contains("000000010000000000000005"),
        "{failed}"
    );
    // The range goes on on timeline 2: its segment 5 holds the rest, and is archived.
    put("000000020000000000000005").await;
    let mut spanning = old_timeline();
    spanning.push("000000020000000000000005".into());
    tokio::time::timeout(
        Duration::from_secs(30),
        wait_for_wal(&store, &prefix, spanning),
    )
    .await
    .expect("the wait ends at once")
    .unwrap();
}
