//! The S3-compatible object store backups and WAL go to (docs/backup.md): an `object_store`
//! `AmazonS3` client with the endpoint, bucket and region of an annotation and the keys of a
//! Secret, path-style requests, and TLS that trusts the Secret's `ca.crt` when present.
//!
//! Transient errors (5xx, 429, timeouts, refused connections) are retried by the client
//! itself, per request, with backoff from 1 s doubling (the crate adds jitter) for 5
//! attempts in all: a streamed multipart upload cannot be replayed from its start, but each
//! part can. Error messages never carry key material: the crate's messages hold URLs (no
//! signatures, which go in headers), and [`Store::scrub`] removes the keys should a server
//! echo them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use devctl_api::instance::{ACCESS_KEY_ID, CA_CERT, SECRET_ACCESS_KEY, StoreLocation};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::buffered::BufWriter;
use object_store::path::Path as ObjectPath;
use object_store::{
    Attribute, AttributeValue, Attributes, BackoffConfig, Certificate, ClientOptions, GetOptions,
    ObjectStore, ObjectStoreExt, PutOptions, RetryConfig,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::error::one_line;

/// Part size of multipart uploads (and the buffer below which an object is one `PUT`):
/// S3 allows 10,000 parts, so one object may reach 160 GiB; at most
/// [`UPLOAD_CONCURRENCY`] + 1 parts are in memory.
pub const PART_SIZE: usize = 16 * 1024 * 1024;
const UPLOAD_CONCURRENCY: usize = 2;
/// Downloads of big objects go in ranges of this size, each retried on its own.
pub const RANGE_SIZE: u64 = 32 * 1024 * 1024;
/// One request (a part, a range, a WAL segment) may take this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Makes ring rustls's process-wide provider (once; later calls do nothing). The store's
/// HTTP client takes the process default, and kube's client needs one too should another
/// crate in the same build enable a second provider.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The keys of a store Secret (`accessKeyId`, `secretAccessKey`, optional `ca.crt`).
/// `Debug` shows neither key.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub ca_pem: Option<Vec<u8>>,
    /// The Secret's resourceVersion.
    pub version: String,
}

impl std::fmt::Debug for StoreCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCredentials")
            .field("access_key_id", &"<redacted>")
            .field("secret_access_key", &"<redacted>")
            .field("ca_pem", &self.ca_pem.as_ref().map(|c| c.len()))
            .field("version", &self.version)
            .finish()
    }
}

impl StoreCredentials {
    /// The keys of `secret` (named `name` in messages), or why they are unusable.
    pub fn from_secret(secret: &Secret, name: &str) -> Result<Self, String> {
        let data = secret.data.as_ref();
        let text = |key: &str| -> Result<String, String> {
            let bytes = data
                .and_then(|d| d.get(key))
                .map(|b| b.0.clone())
                .unwrap_or_default();
            let value = String::from_utf8(bytes)
                .map_err(|_| format!("store Secret {name}: key {key} is not UTF-8"))?;
            let value = value.trim().to_string();
            if value.is_empty() {
                return Err(format!(
                    "store Secret {name}: key {key} is missing or empty"
                ));
            }
            if value.chars().any(|c| c.is_control()) {
                return Err(format!(
                    "store Secret {name}: key {key} has control characters"
                ));
            }
            Ok(value)
        };
        let ca_pem = data
            .and_then(|d| d.get(CA_CERT))
            .map(|b| b.0.clone())
            .filter(|b| !b.iter().all(u8::is_ascii_whitespace));
        Ok(StoreCredentials {
            access_key_id: text(ACCESS_KEY_ID)?,
            secret_access_key: text(SECRET_ACCESS_KEY)?,
            ca_pem,
            version: secret.metadata.resource_version.clone().unwrap_or_default(),
        })
    }
}

/// User metadata on archived WAL: the SHA-256 of the segment's plain bytes (hex), so an
/// object is compared by what it holds whatever its stored form.
pub const CONTENT_HASH: &str = "devctl-sha256";

/// The SHA-256 of `data`, hex.
pub fn content_hash(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What [`Store::put_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOnce {
    Stored,
    /// The same content was there already.
    AlreadyStored,
}

/// What went wrong with a store request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The object does not exist.
    NotFound(String),
    /// Anything else (after the retries), one line, without key material.
    Failed(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::NotFound(key) => write!(f, "{key} does not exist in the store"),
            StoreError::Failed(message) => f.write_str(message),
        }
    }
}

/// A validated [`StoreLocation`]: `prefix` is empty or ends with `/`, the region defaults
/// to `us-east-1`.
pub fn normalise_location(mut location: StoreLocation) -> Result<StoreLocation, String> {
    location.endpoint = location.endpoint.trim().trim_end_matches('/').to_string();
    location.bucket = location.bucket.trim().to_string();
    location.region = location.region.trim().to_string();
    if location.region.is_empty() {
        location.region = "us-east-1".into();
    }
    if !(location.endpoint.starts_with("https://") || location.endpoint.starts_with("http://")) {
        return Err(format!(
            "store endpoint {:?} is not an http(s) URL",
            location.endpoint
        ));
    }
    if location.bucket.is_empty()
        || location
            .bucket
            .chars()
            .any(|c| c.is_whitespace() || c == '/' || c.is_control())
    {
        return Err(format!("store bucket {:?} is not valid", location.bucket));
    }
    let prefix = location.prefix.trim().trim_start_matches('/').to_string();
    if prefix.split('/').any(|p| p == "." || p == "..") || prefix.contains("//") {
        return Err(format!("store prefix {:?} is not valid", location.prefix));
    }
    location.prefix = if prefix.is_empty() || prefix.ends_with('/') {
        prefix
    } else {
        format!("{prefix}/")
    };
    Ok(location)
}

/// One bucket of one store, with one set of keys.
pub struct Store {
    s3: Arc<AmazonS3>,
    pub location: StoreLocation,
    /// Strings to scrub from error messages.
    secrets: Vec<String>,
}

impl Store {
    /// A client for `location` (see [`normalise_location`]) with `credentials`.
    pub fn new(location: StoreLocation, credentials: &StoreCredentials) -> Result<Self, String> {
        install_crypto_provider();
        let location = normalise_location(location)?;
        let mut options = ClientOptions::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_allow_http(location.endpoint.starts_with("http://"));
        if let Some(pem) = &credentials.ca_pem {
            let certificates = Certificate::from_pem_bundle(pem).map_err(|e| {
                format!(
                    "the store Secret's {CA_CERT} is not a PEM certificate: {}",
                    one_line(&e.to_string())
                )
            })?;
            if certificates.is_empty() {
                return Err(format!(
                    "the store Secret's {CA_CERT} holds no PEM certificate"
                ));
            }
            // Exactly that CA: the image's own trust store (if any) plays no part.
            options = options.with_no_system_certificates(true);
            for certificate in certificates {
                options = options.with_root_certificate(certificate);
            }
        }
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(16),
                base: 2.0,
            },
            max_retries: 4,
            retry_timeout: Duration::from_secs(600),
        };
        let s3 = AmazonS3Builder::new()
            .with_endpoint(&location.endpoint)
            .with_bucket_name(&location.bucket)
            .with_region(&location.region)
            .with_access_key_id(&credentials.access_key_id)
            .with_secret_access_key(&credentials.secret_access_key)
            .with_virtual_hosted_style_request(false)
            .with_client_options(options)
            .with_retry(retry)
            .build()
            .map_err(|e| format!("store client: {}", one_line(&e.to_string())))?;
        let store = Store {
            s3: Arc::new(s3),
            location,
            secrets: vec![
                credentials.access_key_id.clone(),
                credentials.secret_access_key.clone(),
            ],
        };
        Ok(store)
    }

    /// `text` without the keys, on one line.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = one_line(text);
        for secret in self.secrets.iter().filter(|s| s.len() >= 4) {
            text = text.replace(secret.as_str(), "<redacted>");
        }
        text
    }

    fn error(&self, key: &str, what: &str, e: object_store::Error) -> StoreError {
        match e {
            object_store::Error::NotFound { .. } => StoreError::NotFound(self.url(key)),
            e => StoreError::Failed(self.scrub(&format!("{what} {}: {e}", self.url(key)))),
        }
    }

    /// `s3://<bucket>/<key>`.
    pub fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.location.bucket)
    }

    /// Writes `data` as one object.
    pub async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        self.s3
            .put(&ObjectPath::from(key), data.into())
            .await
            .map(|_| ())
            .map_err(|e| self.error(key, "writing", e))
    }

    /// Writes `data` as `key` unless the object exists: an existing object with the same
    /// content (its recorded [`CONTENT_HASH`], or its bytes when it has none) is success, as
    /// PostgreSQL's `archive_command` contract asks; different content is refused (two
    /// writers of one timeline must never overwrite each other's WAL).
    pub async fn put_once(&self, key: &str, data: Bytes) -> Result<PutOnce, StoreError> {
        let hash = content_hash(&data);
        let path = ObjectPath::from(key);
        let head = GetOptions {
            head: true,
            ..GetOptions::default()
        };
        match self.s3.get_opts(&path, head).await {
            Ok(existing) => {
                let recorded = existing
                    .attributes
                    .get(&Attribute::Metadata(CONTENT_HASH.into()))
                    .map(|v| v.to_string());
                let same = match recorded {
                    Some(recorded) => recorded == hash,
                    // Archived before hashes were recorded: compare the bytes.
                    None => content_hash(&self.get(key).await?) == hash,
                };
                if same {
                    Ok(PutOnce::AlreadyStored)
                } else {
                    Err(StoreError::Failed(format!(
                        "{} exists with different content: refusing to overwrite it",
                        self.url(key)
                    )))
                }
            }
            Err(object_store::Error::NotFound { .. }) => {
                let options = PutOptions {
                    attributes: Attributes::from_iter([(
                        Attribute::Metadata(CONTENT_HASH.into()),
                        AttributeValue::from(hash),
                    )]),
                    ..PutOptions::default()
                };
                self.s3
                    .put_opts(&path, data.into(), options)
                    .await
                    .map(|_| PutOnce::Stored)
                    .map_err(|e| self.error(key, "writing", e))
            }
            Err(e) => Err(self.error(key, "reading", e)),
        }
    }

    /// Up to `count` keys under `prefix` that sort after `key`, in order.
    pub async fn keys_after(
        &self,
        prefix: &str,
        key: &str,
        count: usize,
    ) -> Result<Vec<String>, StoreError> {
        let path = ObjectPath::from(prefix.trim_end_matches('/'));
        let mut stream = self
            .s3
            .list_with_offset(Some(&path), &ObjectPath::from(key));
        let mut keys = Vec::new();
        while keys.len() < count
            && let Some(entry) = stream.next().await
        {
            let entry = entry.map_err(|e| self.error(prefix, "listing", e))?;
            keys.push(entry.location.to_string());
        }
        keys.sort();
        Ok(keys)
    }

    /// Streams `reader` into one object (multipart above [`PART_SIZE`]), never holding more
    /// than a few parts; `observe` sees every chunk on its way. Returns the size written.
    /// On failure the multipart upload is aborted.
    pub async fn put_stream(
        &self,
        key: &str,
        reader: &mut (impl AsyncRead + Unpin),
        mut observe: impl FnMut(&[u8]),
    ) -> Result<u64, StoreError> {
        let s3: Arc<dyn ObjectStore> = self.s3.clone();
        let mut writer = BufWriter::with_capacity(s3, ObjectPath::from(key), PART_SIZE)
            .with_max_concurrency(UPLOAD_CONCURRENCY);
        let mut size = 0u64;
        let mut buffer = vec![0u8; 256 * 1024];
        let result: Result<(), StoreError> = async {
            loop {
                let n = reader.read(&mut buffer).await.map_err(|e| {
                    StoreError::Failed(format!("reading the stream for {}: {e}", self.url(key)))
                })?;
                if n == 0 {
                    break;
                }
                observe(&buffer[..n]);
                size += n as u64;
                writer
                    .put(Bytes::copy_from_slice(&buffer[..n]))
                    .await
                    .map_err(|e| self.error(key, "writing", e))?;
            }
            writer.shutdown().await.map_err(|e| {
                StoreError::Failed(self.scrub(&format!("writing {}: {e}", self.url(key))))
            })
        }
        .await;
        match result {
            Ok(()) => Ok(size),
            Err(e) => {
                if let Err(abort) = writer.abort().await {
                    tracing::warn!(
                        "aborting the upload of {}: {}",
                        self.url(key),
                        self.scrub(&abort.to_string())
                    );
                }
                Err(e)
            }
        }
    }

    /// The whole object (small objects: manifests, WAL segments).
    pub async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let path = ObjectPath::from(key);
        let result = self
            .s3
            .get(&path)
            .await
            .map_err(|e| self.error(key, "reading", e))?;
        result
            .bytes()
            .await
            .map_err(|e| self.error(key, "reading", e))
    }

    /// The object's size, or `None` when it does not exist.
    pub async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        match self.s3.head(&ObjectPath::from(key)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(key, "reading", e)),
        }
    }

    /// The keys under `prefix` (a "directory", ending with `/`).
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let path = ObjectPath::from(prefix.trim_end_matches('/'));
        let mut stream = self.s3.list(Some(&path));
        let mut keys = Vec::new();
        while let Some(item) = stream.next().await {
            let meta = item.map_err(|e| self.error(prefix, "listing", e))?;
            keys.push(meta.location.to_string());
        }
        keys.sort();
        Ok(keys)
    }

    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.s3
            .delete(&ObjectPath::from(key))
            .await
            .map_err(|e| self.error(key, "deleting", e))
    }

    /// Opens `key` for reading in ranges of [`RANGE_SIZE`] (each its own request, retried
    /// on its own): big objects are never held whole, and a dropped connection costs one
    /// range, not the whole download.
    pub async fn open_ranges(&self, key: &str) -> Result<Ranges<'_>, StoreError> {
        let size = self
            .head(key)
            .await?
            .ok_or_else(|| StoreError::NotFound(self.url(key)))?;
        Ok(Ranges {
            store: self,
            key: key.to_string(),
            size,
            offset: 0,
        })
    }
}

/// An object read range by range ([`Store::open_ranges`]).
pub struct Ranges<'a> {
    store: &'a Store,
    key: String,
    pub size: u64,
    offset: u64,
}

impl Ranges<'_> {
    /// The next range, `None` at the end.
    pub async fn next(&mut self) -> Result<Option<Bytes>, String> {
        if self.offset >= self.size {
            return Ok(None);
        }
        let end = (self.offset + RANGE_SIZE).min(self.size);
        let bytes = self
            .store
            .s3
            .get_range(&ObjectPath::from(self.key.as_str()), self.offset..end)
            .await
            .map_err(|e| self.store.error(&self.key, "reading", e).to_string())?;
        if bytes.len() as u64 != end - self.offset {
            return Err(format!(
                "reading {}: short range ({} of {} bytes at {})",
                self.store.url(&self.key),
                bytes.len(),
                end - self.offset,
                self.offset
            ));
        }
        self.offset = end;
        Ok(Some(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn secret(data: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn reads_the_keys_and_hides_them_in_debug() {
        let c = StoreCredentials::from_secret(
            &secret(&[
                (ACCESS_KEY_ID, "AKIDEXAMPLE"),
                (SECRET_ACCESS_KEY, "wJalrXUtnFEMI"),
            ]),
            "s",
        )
        .unwrap();
        assert_eq!(c.access_key_id, "AKIDEXAMPLE");
        assert_eq!(c.ca_pem, None);
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("AKIDEXAMPLE") && !debug.contains("wJalr"),
            "{debug}"
        );
        let e = StoreCredentials::from_secret(&secret(&[(ACCESS_KEY_ID, "a")]), "s").unwrap_err();
        assert!(e.contains(SECRET_ACCESS_KEY), "{e}");
    }

    #[test]
    fn normalises_locations() {
        let l = normalise_location(StoreLocation {
            endpoint: "https://s3.example.com:7070/".into(),
            bucket: "backups".into(),
            prefix: "prod/ns/db".into(),
            region: String::new(),
        })
        .unwrap();
        assert_eq!(l.endpoint, "https://s3.example.com:7070");
        assert_eq!(l.prefix, "prod/ns/db/");
        assert_eq!(l.region, "us-east-1");
        let bad = |endpoint: &str, bucket: &str, prefix: &str| {
            normalise_location(StoreLocation {
                endpoint: endpoint.into(),
                bucket: bucket.into(),
                prefix: prefix.into(),
                region: String::new(),
            })
            .is_err()
        };
        assert!(bad("s3.example.com", "b", ""));
        assert!(bad("https://s", "", ""));
        assert!(bad("https://s", "b", "a/../b/"));
        assert!(!bad("http://127.0.0.1:9000", "b", ""));
    }

    #[test]
    fn scrubs_the_keys_from_messages() {
        let credentials = StoreCredentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI".into(),
            ca_pem: None,
            version: "1".into(),
        };
        let store = Store::new(
            StoreLocation {
                endpoint: "http://127.0.0.1:1".into(),
                bucket: "b".into(),
                prefix: String::new(),
                region: String::new(),
            },
            &credentials,
        )
        .unwrap();
        assert_eq!(
            store.scrub("403: <AWSAccessKeyId>AKIDEXAMPLE</AWSAccessKeyId>\nwJalrXUtnFEMI"),
            "403: <AWSAccessKeyId><redacted></AWSAccessKeyId> <redacted>"
        );
    }
}
