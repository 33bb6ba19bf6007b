//! An S3-compatible object store for backup tests and `devctl dev up`: versitygw (built from
//! its pinned Go module by `tools/versitygw/build.sh`) with its posix backend, serving HTTPS
//! on loopback.
//!
//! Layout of [`S3Server::root`] (a fresh directory under the system temp dir):
//!
//! | path | what |
//! |---|---|
//! | `data/` | the gateway's root: every top-level directory is a bucket |
//! | `data/devctl-backups/<key>` | an object, stored as a plain file (`/` in keys become directories) |
//! | `pki/` | the test CA and the server certificate for `127.0.0.1` and `localhost` |
//! | `logs/versitygw.log` | the server's output (`.log.<run>` for runs before a restart) |
//!
//! The only account is the root account (random access key id and secret per server), which
//! may do everything: PUT, GET, LIST, DELETE, multipart uploads. Metadata (ETags, content
//! types) lives in extended attributes of the files, which the temp dir's file system must
//! support (ext4, xfs, btrfs, tmpfs do); versitygw checks that at start and says so if not.
//!
//! The process dies with the test process like every testenv process (see [`crate::process`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Error;
use crate::binaries;
use crate::pki::Authority;
use crate::process::{self, ManagedProcess, free_port};

/// The bucket every [`S3Server`] starts with.
pub const BUCKET: &str = "devctl-backups";

/// The region the server answers for (versitygw's default; clients must sign for it).
pub const REGION: &str = "us-east-1";

/// How long a starting (or restarted) server may take to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The grace [`S3Server::stop`] gives versitygw after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The path of versitygw's unauthenticated health endpoint (`--health`), used for readiness.
const HEALTH_PATH: &str = "/health";

/// The process name (`comm`) of the server, as `pgrep -x` sees it.
pub const PROCESS_NAME: &str = "versitygw";

/// A running versitygw with one bucket ([`BUCKET`]), its own CA and random root credentials.
pub struct S3Server {
    /// `None` while stopped. Behind a mutex so that a shared (`&'static`) server can be
    /// stopped and restarted.
    process: Mutex<Option<ManagedProcess>>,
    /// Serialises [`Self::stop`] and [`Self::restart`]; counts the runs (names old logs).
    runs: tokio::sync::Mutex<u32>,
    program: PathBuf,
    args: Vec<String>,
    root: PathBuf,
    keep_dir: bool,
    address: std::net::Ipv4Addr,
    port: u16,
    access_key_id: String,
    secret_access_key: String,
    ca_pem: String,
    tls: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for S3Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret, even in test output.
        f.debug_struct("S3Server")
            .field("endpoint", &self.endpoint())
            .field("bucket", &BUCKET)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl S3Server {
    /// Starts a server on a free loopback port and waits until it answers (at most
    /// [`START_TIMEOUT`]). Builds versitygw first if it is not in the cache (minutes).
    pub async fn start() -> Result<Self, Error> {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST).await
    }

    /// Like [`Self::start`], listening on `address` (the host's, for a real node's pods:
    /// [`crate::real_node::RealNode::address`]); the certificate names it too.
    pub async fn start_on(address: std::net::Ipv4Addr) -> Result<Self, Error> {
        let started = Instant::now();
        let program = tokio::task::spawn_blocking(binaries::versitygw)
            .await
            .map_err(|e| Error::Process(format!("versitygw binary check panicked: {e}")))??;

        let root = tempfile::Builder::new()
            .prefix("devctl-testenv-s3-")
            .tempdir()
            .map_err(|e| Error::io("create the object store directory", e))?
            .keep();
        let keep_dir = std::env::var("DEVCTL_KEEP_TESTENV").is_ok_and(|v| v == "1");
        if !keep_dir {
            process::remove_dir_at_exit(&root);
        }
        let data = root.join("data");
        let pki = root.join("pki");
        let logs = root.join("logs");
        for dir in [&data.join(BUCKET), &pki, &logs] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        }

        let ca = Authority::new("devctl-testenv-s3-ca")?;
        let listen = address.to_string();
        let serving = ca.issue_server(&[listen.as_str(), "127.0.0.1", "localhost"])?;
        let write = |name: &str, content: &str| -> Result<PathBuf, Error> {
            let path = pki.join(name);
            std::fs::write(&path, content)
                .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
            Ok(path)
        };
        write("ca.crt", ca.cert_pem())?;
        let cert = write("server.crt", &serving.cert_pem)?;
        let key = write("server.key", &serving.key_pem)?;

        let port = free_port()?;
        let access_key_id = random_token(20, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")?;
        let secret_access_key = random_token(
            40,
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
        )?;
        let args = vec![
            format!("--port={address}:{port}"),
            format!("--access={access_key_id}"),
            format!("--secret={secret_access_key}"),
            format!("--region={REGION}"),
            format!("--cert={}", cert.display()),
            format!("--key={}", key.display()),
            format!("--health={HEALTH_PATH}"),
            // No per-request lines in the log; errors still go there.
            "--quiet".into(),
            "posix".into(),
            data.display().to_string(),
        ];

        let server = Self {
            process: Mutex::new(None),
            runs: tokio::sync::Mutex::new(0),
            program,
            args,
            root,
            keep_dir,
            address,
            port,
            access_key_id,
            secret_access_key,
            ca_pem: ca.cert_pem().to_string(),
            tls: tls_connector(ca.cert_pem())?,
        };
        {
            let mut runs = server.runs.lock().await;
            server.spawn(&mut runs)?;
        }
        server.wait_ready("versitygw to answer").await?;
        tracing::info!(elapsed = ?started.elapsed(), endpoint = %server.endpoint(), root = %server.root.display(), "object store ready");
        Ok(server)
    }

    /// `https://<address>:<port>` (`127.0.0.1` unless started with [`Self::start_on`]); the
    /// same across [`Self::restart`].
    pub fn endpoint(&self) -> String {
        format!("https://{}:{}", self.address, self.port)
    }

    /// The bucket that exists from the start ([`BUCKET`]).
    pub fn bucket(&self) -> &str {
        BUCKET
    }

    /// The region to sign requests for ([`REGION`]).
    pub fn region(&self) -> &str {
        REGION
    }

    /// The root account's access key id.
    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }

    /// The root account's secret access key.
    pub fn secret_access_key(&self) -> &str {
        &self.secret_access_key
    }

    /// The PEM certificate of the CA that signed the server certificate (the only one a client
    /// needs to trust).
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// The server's directory (see the module documentation for its layout).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of [`BUCKET`]: one file per object.
    pub fn bucket_dir(&self) -> PathBuf {
        self.root.join("data").join(BUCKET)
    }

    /// The current run's log file.
    pub fn log_path(&self) -> PathBuf {
        self.root.join("logs").join("versitygw.log")
    }

    /// The server's pid, `None` while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.process().as_ref().map(ManagedProcess::pid)
    }

    /// Endpoint, bucket, directory and log, for failure messages (no credentials).
    pub fn describe(&self) -> String {
        format!(
            "versitygw at {} (bucket {BUCKET}, pid {}); data in {}; log: {}",
            self.endpoint(),
            self.pid()
                .map_or_else(|| "none: stopped".to_string(), |p| p.to_string()),
            self.bucket_dir().display(),
            self.log_path().display()
        )
    }

    /// The objects in [`BUCKET`] whose key starts with `prefix`, with their sizes, sorted by
    /// key, read from the bucket directory (not through S3). Multipart uploads in progress and
    /// the gateway's own temporary files are not objects.
    pub fn objects(&self, prefix: &str) -> Vec<(String, u64)> {
        let mut found = Vec::new();
        let mut pending = vec![(self.bucket_dir(), String::new())];
        while let Some((dir, key_prefix)) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                // versitygw's temporary and multipart-upload files, at the bucket's top level.
                if key_prefix.is_empty() && name == ".sgwtmp" {
                    continue;
                }
                let key = format!("{key_prefix}{name}");
                let Ok(file_type) = entry.file_type() else {
                    continue;
                };
                if file_type.is_dir() {
                    // Descend only where keys below can still match the prefix.
                    let below = format!("{key}/");
                    if below.starts_with(prefix) || prefix.starts_with(&below) {
                        pending.push((entry.path(), below));
                    }
                } else if file_type.is_file() && key.starts_with(prefix) {
                    let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
                    found.push((key, size));
                }
            }
        }
        found.sort();
        found
    }

    /// Stops the server (SIGTERM, SIGKILL after [`STOP_GRACE`]) and waits until it has
    /// exited: requests fail (connection refused) until [`Self::restart`]. The data stays.
    /// Stopping a stopped server does nothing.
    pub async fn stop(&self) -> Result<(), Error> {
        let _runs = self.runs.lock().await;
        self.stop_locked().await;
        Ok(())
    }

    /// Starts the server again on the same port with the same data, certificate and
    /// credentials (stopping it first if it runs), and waits until it answers: the store
    /// coming back after an outage. Clients made before keep working.
    pub async fn restart(&self) -> Result<(), Error> {
        {
            let mut runs = self.runs.lock().await;
            self.stop_locked().await;
            // Keep the previous run's log next to the new one.
            let log = self.log_path();
            if log.exists() {
                let previous = log.with_file_name(format!("versitygw.log.{}", *runs));
                std::fs::rename(&log, &previous).map_err(|e| {
                    Error::io(
                        format!("move {} to {}", log.display(), previous.display()),
                        e,
                    )
                })?;
            }
            self.spawn(&mut runs)?;
        }
        self.wait_ready("the restarted versitygw to answer").await
    }

    fn process(&self) -> MutexGuard<'_, Option<ManagedProcess>> {
        // Every change is a single assignment: a poisoned lock holds a consistent value.
        self.process
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn spawn(&self, runs: &mut u32) -> Result<(), Error> {
        let process =
            ManagedProcess::start(PROCESS_NAME, &self.program, &self.args, &self.log_path())?;
        *self.process() = Some(process);
        *runs += 1;
        Ok(())
    }

    /// SIGTERM, wait (without blocking the runtime) up to [`STOP_GRACE`], then SIGKILL and reap.
    async fn stop_locked(&self) {
        {
            let mut guard = self.process();
            let Some(process) = guard.as_mut() else {
                return;
            };
            // `check_running` reaps an exited server; while the lock is held nothing else can
            // reap it, so the pid still names our child.
            if process.check_running().is_ok() {
                // SAFETY: kill(2) on our own child, which has not been reaped (see above).
                unsafe {
                    libc::kill(process.pid() as libc::pid_t, libc::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            let exited = self
                .process()
                .as_mut()
                .is_none_or(|p| p.check_running().is_err());
            if exited || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // SIGKILL if the grace ran out; reaps it and unregisters it from the exit hook.
        if let Some(mut process) = self.process().take() {
            process.stop(Duration::ZERO);
        }
    }

    /// Polls the health endpoint over TLS (trusting only the test CA) until it answers 200.
    async fn wait_ready(&self, what: &str) -> Result<(), Error> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(process) = self.process().as_mut() {
                process.check_running()?;
            }
            let last_error = match self.health().await {
                Ok(200) => return Ok(()),
                Ok(status) => format!("HTTP {status}"),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "{what} on {}{HEALTH_PATH} (last error: {last_error}); log: {}",
                        self.endpoint(),
                        self.log_path().display()
                    ),
                    after: START_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET /health` over TLS; the status code.
    async fn health(&self) -> Result<u16, Error> {
        let what = format!("GET {}{HEALTH_PATH}", self.endpoint());
        let exchange = async {
            let tcp = tokio::net::TcpStream::connect((self.address, self.port))
                .await
                .map_err(|e| Error::io(format!("{what}: connect"), e))?;
            let name = rustls::pki_types::ServerName::IpAddress(self.address.into());
            let mut tls = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|e| Error::io(format!("{what}: TLS handshake"), e))?;
            let request = format!(
                "GET {HEALTH_PATH} HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\n\r\n",
                self.address, self.port
            );
            tls.write_all(request.as_bytes())
                .await
                .map_err(|e| Error::io(format!("{what}: send"), e))?;
            let mut response = Vec::new();
            // A server may close without close_notify; what arrived before counts.
            let read = tls.read_to_end(&mut response).await;
            if response.is_empty() {
                read.map_err(|e| Error::io(format!("{what}: read the answer"), e))?;
            }
            Ok::<_, Error>(response)
        };
        let response = tokio::time::timeout(Duration::from_secs(5), exchange)
            .await
            .map_err(|_| Error::Timeout {
                what: what.clone(),
                after: Duration::from_secs(5),
            })??;
        let status_line = response.split(|b| *b == b'\n').next().unwrap_or_default();
        String::from_utf8_lossy(status_line)
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| {
                Error::S3(format!(
                    "{what}: not an HTTP answer: {}",
                    String::from_utf8_lossy(&response)
                ))
            })
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        // Kill first (no grace: test data is disposable), then remove the directory.
        drop(
            self.process
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        process::dispose_dir(&self.root, self.keep_dir);
    }
}

/// A TLS client that trusts only `ca_pem` (with ring, the provider kube's TLS stack uses; no
/// process-wide default provider is assumed).
fn tls_connector(ca_pem: &str) -> Result<tokio_rustls::TlsConnector, Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| Error::Pki(format!("read the test CA: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| Error::Pki(format!("trust the test CA: {e}")))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Pki(format!("TLS client configuration: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `len` characters from `alphabet`, from the OS CSPRNG (`/dev/urandom`).
fn random_token(len: usize, alphabet: &[u8]) -> Result<String, Error> {
    let mut bytes = vec![0u8; len];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::io("read /dev/urandom", e))?;
    // 256 is not a multiple of the alphabet's size; the slight bias does not matter for
    // throwaway test credentials.
    Ok(bytes
        .iter()
        .map(|b| char::from(alphabet[usize::from(*b) % alphabet.len()]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tokens_use_the_alphabet() {
        let token = random_token(40, b"ab").unwrap();
        assert_eq!(token.len(), 40);
        assert!(token.chars().all(|c| c == 'a' || c == 'b'));
        assert_ne!(
            random_token(20, b"0123456789").unwrap(),
            random_token(20, b"0123456789").unwrap()
        );
    }
}
