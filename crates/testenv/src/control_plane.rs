//! etcd + kube-apiserver as local processes: the API server's real validation, defaulting,
//! CEL, subresources, RBAC, watches and admission, without nodes or controllers.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::audit::{self, AuditLog};
use crate::binaries::{self, Binaries};
use crate::kubeconfig::{self, Credentials};
use crate::pki::{Authority, CertPair, ServiceAccountKeys};
use crate::process::{self, ManagedProcess, free_port};
use crate::{Error, FIELD_MANAGER};

/// How to start a [`ControlPlane`].
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Write a metadata-level audit log (see [`ControlPlane::audit_log`]).
    pub audit: bool,
    /// Keep the ServiceAccount admission plugin on. Pods then need their namespace's
    /// `default` ServiceAccount, which only kube-controller-manager creates, so it is on in
    /// [`crate::Cluster`] and off for a bare control plane (as envtest does).
    pub service_account_admission: bool,
    /// Extra `--flag=value` arguments for kube-apiserver.
    pub extra_apiserver_args: Vec<String>,
    /// Serve a real node too (see [`crate::real_node`]): kube-apiserver listens on every
    /// address and advertises this one (the host's, which pods reach through the
    /// `kubernetes` Service), its certificate names the Service's addresses, kubelets are
    /// authorised by the Node authorizer, and it reaches kubelets with a client certificate.
    pub node_address: Option<std::net::Ipv4Addr>,
}

/// The `kubernetes` Service's cluster IP: the first address of `--service-cluster-ip-range`.
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

/// The name kube-apiserver's client certificate for kubelets carries.
const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

/// How [`ControlPlane::restart_api_server_with`] stops the running kube-apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiServerStop {
    /// SIGTERM, then SIGKILL if it is still running after `grace`: the server stops
    /// listening, ends open watches and finishes the requests in flight (a rolling restart).
    Graceful { grace: Duration },
    /// SIGKILL: a crash. Open connections are cut; requests in flight fail.
    Kill,
}

/// The grace [`ControlPlane::restart_api_server`] gives kube-apiserver after SIGTERM.
pub const API_SERVER_STOP_GRACE: Duration = Duration::from_secs(10);

/// How long a restarted kube-apiserver may take until `/readyz` answers `ok`.
pub const API_SERVER_RESTART_TIMEOUT: Duration = Duration::from_secs(60);

/// Bound on each request to etcd's JSON gateway.
const ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

const API_SERVER: &str = "kube-apiserver";

/// Exactly how kube-apiserver was started, so that a restart repeats it.
struct ApiServerCommand {
    program: PathBuf,
    args: Vec<String>,
    log_path: PathBuf,
}

/// A running etcd + kube-apiserver pair with its own PKI and kubeconfig.
pub struct ControlPlane {
    // Dropped first: the processes stop before their directory disappears. Behind a mutex so
    // that the API server can be restarted through a shared (`&'static`) reference.
    processes: Arc<Mutex<Vec<ManagedProcess>>>,
    /// Set once it is being dropped: the supervisor restarts nothing after.
    stopping: Arc<AtomicBool>,
    /// Serialises restarts; counts the API server's previous runs (names their logs).
    api_server_runs: tokio::sync::Mutex<u32>,
    api_server: ApiServerCommand,
    /// `host:port` of etcd's client listener (plain HTTP on loopback).
    etcd_address: String,
    dir: PathBuf,
    keep_dir: bool,
    binaries: Binaries,
    server: String,
    server_ca_pem: String,
    client_ca: Authority,
    admin: CertPair,
    kubeconfig_path: PathBuf,
    audit: Option<AuditLog>,
    pub(crate) sa_private_key_path: PathBuf,
    pub(crate) server_ca_path: PathBuf,
}

/// The user name of the admin identity (group `system:masters`).
pub const ADMIN_USER: &str = "devctl-testenv-admin";

impl ControlPlane {
    /// Starts a control plane with default options.
    pub async fn start() -> Result<Self, Error> {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> Result<Self, Error> {
        let started = Instant::now();
        let binaries = tokio::task::spawn_blocking(Binaries::ensure)
            .await
            .map_err(|e| Error::Process(format!("binary check panicked: {e}")))??;

        let dir = tempfile::Builder::new()
            .prefix("devctl-testenv-")
            .tempdir()
            .map_err(|e| Error::io("create the test environment directory", e))?
            .keep();
        let keep_dir = std::env::var("DEVCTL_KEEP_TESTENV").is_ok_and(|v| v == "1");
        if !keep_dir {
            process::remove_dir_at_exit(&dir);
        }
        let logs = dir.join("logs");
        let pki = dir.join("pki");
        for d in [&logs, &pki] {
            std::fs::create_dir_all(d)
                .map_err(|e| Error::io(format!("create {}", d.display()), e))?;
        }

        // Certificates.
        let server_ca = Authority::new("devctl-testenv-server-ca")?;
        let client_ca = Authority::new("devctl-testenv-client-ca")?;
        let node_address = options.node_address.map(|a| a.to_string());
        let mut serving_names = vec!["localhost", "127.0.0.1"];
        if let Some(address) = &node_address {
            // In-cluster clients use the Service's name or its cluster IP.
            serving_names.extend([
                address.as_str(),
                KUBERNETES_SERVICE_IP,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]);
        }
        let serving = server_ca.issue_server(&serving_names)?;
        let admin = client_ca.issue_client(ADMIN_USER, &["system:masters"])?;
        let sa_keys = ServiceAccountKeys::generate()?;
        let write = |name: &str, content: &str| -> Result<PathBuf, Error> {
            let path = pki.join(name);
            std::fs::write(&path, content)
                .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
            Ok(path)
        };
        let server_ca_path = write("server-ca.crt", server_ca.cert_pem())?;
        let client_ca_path = write("client-ca.crt", client_ca.cert_pem())?;
        let serving_cert = write("apiserver.crt", &serving.cert_pem)?;
        let serving_key = write("apiserver.key", &serving.key_pem)?;
        let sa_private_key_path = write("sa.key", &sa_keys.private_pem)?;
        let sa_public = write("sa.pub", &sa_keys.public_pem)?;

        let mut processes = Vec::new();

        // etcd: single member, no fsync (test data is disposable).
        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        let etcd_args = vec![
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        processes.push(ManagedProcess::start(
            "etcd",
            &binaries.path("etcd"),
            &etcd_args,
            &logs.join("etcd.log"),
        )?);

        // kube-apiserver.
        let port = free_port()?;
        let server = format!("https://127.0.0.1:{port}");
        let mut args = vec![format!("--etcd-servers={etcd_url}")];
        match &node_address {
            None => args.extend([
                "--bind-address=127.0.0.1".to_string(),
                "--advertise-address=127.0.0.1".into(),
                // The `kubernetes` Service's endpoints may not be loopback addresses; nothing
                // in a local control plane needs them.
                "--endpoint-reconciler-type=none".into(),
                "--authorization-mode=RBAC".into(),
            ]),
            Some(address) => {
                let kubelet_client =
                    client_ca.issue_client(KUBELET_CLIENT_USER, &["system:masters"])?;
                let cert = write("kubelet-client.crt", &kubelet_client.cert_pem)?;
                let key = write("kubelet-client.key", &kubelet_client.key_pem)?;
                args.extend([
                    "--bind-address=0.0.0.0".to_string(),
                    format!("--advertise-address={address}"),
                    // A kubelet reads only what its own pods need.
                    "--authorization-mode=Node,RBAC".into(),
                    format!("--kubelet-client-certificate={}", cert.display()),
                    format!("--kubelet-client-key={}", key.display()),
                    "--kubelet-preferred-address-types=InternalIP".into(),
                ]);
            }
        }
        args.extend([
            format!("--secure-port={port}"),
            format!("--cert-dir={}", pki.display()),
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", client_ca_path.display()),
            format!("--service-account-issuer={server}"),
            format!("--service-account-key-file={}", sa_public.display()),
            format!(
                "--service-account-signing-key-file={}",
                sa_private_key_path.display()
            ),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            // Without this an unauthenticated client is `system:anonymous` and gets 403; real
            // clusters (and our tests) expect 401 for a missing credential.
            "--anonymous-auth=false".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            // On SIGTERM (`restart_api_server`), end open watches instead of waiting for
            // them until the 60 s shutdown timeout; clients see the stream end and re-watch.
            "--shutdown-watch-termination-grace-period=2s".into(),
            "--v=1".into(),
        ]);
        if !options.service_account_admission {
            args.push("--disable-admission-plugins=ServiceAccount".into());
        }
        let audit = if options.audit {
            let policy = write("audit-policy.yaml", audit::POLICY)?;
            let path = logs.join("audit.log");
            args.push(format!("--audit-policy-file={}", policy.display()));
            args.push(format!("--audit-log-path={}", path.display()));
            args.push("--audit-log-mode=blocking".into());
            args.push("--audit-log-maxsize=0".into());
            Some(AuditLog::new(path))
        } else {
            None
        };
        args.extend(options.extra_apiserver_args.iter().cloned());
        let api_server = ApiServerCommand {
            program: binaries.path(API_SERVER),
            args,
            log_path: logs.join(format!("{API_SERVER}.log")),
        };
        processes.push(ManagedProcess::start(
            API_SERVER,
            &api_server.program,
            &api_server.args,
            &api_server.log_path,
        )?);

        let kubeconfig_path = dir.join("kubeconfig");
        let control_plane = Self {
            processes: Arc::new(Mutex::new(processes)),
            stopping: Arc::new(AtomicBool::new(false)),
            api_server_runs: tokio::sync::Mutex::new(1),
            api_server,
            etcd_address: format!("127.0.0.1:{etcd_port}"),
            dir,
            keep_dir,
            binaries,
            server_ca_pem: server_ca.cert_pem().to_string(),
            server,
            client_ca,
            admin,
            kubeconfig_path,
            audit,
            sa_private_key_path,
            server_ca_path,
        };
        kubeconfig::write(
            &control_plane.admin_kubeconfig()?,
            &control_plane.kubeconfig_path,
        )?;
        control_plane
            .wait_ready("kube-apiserver /readyz", Duration::from_secs(90))
            .await?;
        tracing::info!(elapsed = ?started.elapsed(), dir = %control_plane.dir.display(), "control plane ready");
        Ok(control_plane)
    }

    async fn wait_ready(&self, what: &str, timeout: Duration) -> Result<(), Error> {
        let client = self.client().await?;
        let deadline = Instant::now() + timeout;
        loop {
            self.check_processes()?;
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::Process(e.to_string()))?;
            let last_error = match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "{what} (last answer: {last_error}); logs in {}",
                        self.log_dir().display()
                    ),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The process list. A panic while it was locked leaves it consistent (every change is
    /// a single push, remove or insert), so a poisoned lock is used as is.
    fn processes(&self) -> MutexGuard<'_, Vec<ManagedProcess>> {
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `Err` naming the process and the end of its log if any process has exited (one the
    /// supervisor restarts does not count: see [`Self::supervise`]).
    pub fn check_processes(&self) -> Result<(), Error> {
        self.processes()
            .iter_mut()
            .filter(|p| !p.restarts_on_exit())
            .try_for_each(ManagedProcess::check_running)
    }

    /// From now on the processes named `names` are started again whenever they exit, as a
    /// kubelet restarts the static pods of a real control plane. kube-scheduler exits on
    /// purpose when it finds its cache corrupted (a pod seen on another node than the one it
    /// had; it happens after an API server restart hides a delete from it), and on a real
    /// cluster the kubelet brings it back: without this, a test environment would keep new
    /// pods Pending for good after such a fault.
    pub fn supervise(&self, names: &[&str]) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut supervised_before = false;
        for process in self.processes().iter_mut() {
            supervised_before |= process.restarts_on_exit();
            if names.iter().any(|n| n == process.name()) {
                process.set_restart_on_exit();
            }
        }
        // One supervisor thread looks after every marked process.
        if supervised_before {
            return;
        }
        let processes = Arc::downgrade(&self.processes);
        let stopping = self.stopping.clone();
        let spawned = std::thread::Builder::new()
            .name("testenv-supervisor".into())
            .spawn(move || supervise(&processes, &stopping));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the control plane's supervisor thread");
        }
    }

    /// How many times each supervised process was started again.
    pub fn restarts(&self) -> Vec<(String, u32)> {
        self.processes()
            .iter()
            .filter(|p| p.restarts_on_exit())
            .map(|p| (p.name().to_string(), p.restarts()))
            .collect()
    }

    /// The running processes' names and pids (kube-apiserver's changes when it restarts).
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.processes()
            .iter()
            .map(|p| (p.name().to_string(), p.pid()))
            .collect()
    }

    pub(crate) fn push_process(&mut self, process: ManagedProcess) {
        self.processes().push(process);
    }

    /// Restarts kube-apiserver gracefully: SIGTERM, SIGKILL after [`API_SERVER_STOP_GRACE`]
    /// if it is still running, then the same command again (same port, certificates, flags
    /// and audit log, which it appends to), and waits until `/readyz` answers `ok` (at most
    /// [`API_SERVER_RESTART_TIMEOUT`]). Clients made before keep working: the address and
    /// credentials do not change. etcd keeps running, so every object survives; the new
    /// server starts with an empty watch cache.
    pub async fn restart_api_server(&self) -> Result<(), Error> {
        self.restart_api_server_with(ApiServerStop::Graceful {
            grace: API_SERVER_STOP_GRACE,
        })
        .await
    }

    /// Like [`Self::restart_api_server`], but the server is SIGKILLed (a crash).
    pub async fn kill_api_server_and_restart(&self) -> Result<(), Error> {
        self.restart_api_server_with(ApiServerStop::Kill).await
    }

    /// Stops kube-apiserver as `stop` says, starts it again with exactly the same command and
    /// waits until `/readyz` answers `ok`. Concurrent calls run one after the other.
    ///
    /// The previous run's log is kept as `kube-apiserver.log.<run>` (`.1` for the server
    /// [`Self::start`] started) next to the new `kube-apiserver.log`.
    pub async fn restart_api_server_with(&self, stop: ApiServerStop) -> Result<(), Error> {
        self.restart_api_server_compacting(stop, false)
            .await
            .map(|_| ())
    }

    /// Kills kube-apiserver, compacts etcd while no server is up ([`Self::compact_etcd`]),
    /// starts the server again and returns the revision compacted at. With the server down
    /// nothing can be written between the compaction and the restart, so every
    /// resourceVersion any client holds is too old afterwards: each watch must LIST again.
    /// (Compacting first and then restarting leaves a window in which a client's write or a
    /// bookmark hands out a version from after the compaction, whose watch then resumes.)
    pub async fn kill_api_server_compact_etcd_and_restart(&self) -> Result<i64, Error> {
        self.restart_api_server_compacting(ApiServerStop::Kill, true)
            .await?
            .ok_or_else(|| Error::Process("etcd was not compacted".into()))
    }

    async fn restart_api_server_compacting(
        &self,
        stop: ApiServerStop,
        compact: bool,
    ) -> Result<Option<i64>, Error> {
        let started = Instant::now();
        let mut runs = self.api_server_runs.lock().await;
        let (signal, grace) = match stop {
            ApiServerStop::Graceful { grace } => (libc::SIGTERM, grace),
            // Dies at once; waited for here rather than in a blocking wait(2).
            ApiServerStop::Kill => (libc::SIGKILL, Duration::from_secs(5)),
        };
        {
            let mut processes = self.processes();
            let api_server = api_server_mut(&mut processes)?;
            // `check_running` reaps the server if it has exited already; while the lock is
            // held nothing else can reap it, so the pid still names our child.
            if api_server.check_running().is_ok() {
                // SAFETY: kill(2) on our own child, which has not been reaped (see above).
                unsafe {
                    libc::kill(api_server.pid() as libc::pid_t, signal);
                }
            }
        }
        // Wait for it to exit without blocking the runtime (stop() would sleep).
        let deadline = Instant::now() + grace;
        loop {
            let exited = api_server_mut(&mut self.processes())?
                .check_running()
                .is_err();
            if exited || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stopped_after = started.elapsed();
        let compacted = if compact {
            Some(self.compact_etcd().await?)
        } else {
            None
        };

        {
            let mut processes = self.processes();
            // SIGKILL if the grace ran out; reaps it. A dead server stays in the list (and
            // `check_processes` reports it) until its replacement has started.
            api_server_mut(&mut processes)?.stop(Duration::ZERO);
            if let Some(audit) = &self.audit {
                end_with_newline(audit.path())?;
            }
            let previous_log = self.log_dir().join(format!("{API_SERVER}.log.{}", *runs));
            std::fs::rename(&self.api_server.log_path, &previous_log).map_err(|e| {
                Error::io(
                    format!(
                        "move {} to {}",
                        self.api_server.log_path.display(),
                        previous_log.display()
                    ),
                    e,
                )
            })?;
            let index = processes
                .iter()
                .position(|p| p.name() == API_SERVER)
                .ok_or_else(|| Error::Process(format!("{API_SERVER} is not running")))?;
            // Dropped (and unregistered) before its replacement starts and registers.
            drop(processes.remove(index));
            let restarted = ManagedProcess::start(
                API_SERVER,
                &self.api_server.program,
                &self.api_server.args,
                &self.api_server.log_path,
            )
            .map_err(|e| Error::Process(format!("restart {API_SERVER}: {e}")))?;
            processes.insert(index, restarted);
            *runs += 1;
        }
        self.wait_ready(
            "the restarted kube-apiserver's /readyz",
            API_SERVER_RESTART_TIMEOUT,
        )
        .await?;
        tracing::info!(
            ?stop,
            ?stopped_after,
            elapsed = ?started.elapsed(),
            "kube-apiserver restarted"
        );
        Ok(compacted)
    }

    /// Compacts etcd so that every resourceVersion handed out before the call is too old,
    /// and returns the revision compacted at.
    ///
    /// A watch from resourceVersion `rv` asks etcd for the changes from revision `rv + 1` on,
    /// and etcd still serves a start revision equal to the compaction revision. So compacting
    /// at the current revision `r` would leave a watch from `r - 1` or `r` working. Instead two
    /// writes to a harness key outside `/registry` (which the API server never reads) move the
    /// store to `r + 2`, and etcd is compacted there, physically: the call returns once the old
    /// revisions are gone.
    ///
    /// Afterwards a watch the API server sends to etcd from any earlier resourceVersion fails
    /// with `410 Gone` ("too old resource version"), and a client must LIST again. The API
    /// server's watch cache answers watches itself, from the history it holds; restart the API
    /// server ([`Self::restart_api_server`]) to empty it, or start with `--watch-cache=false`
    /// in [`Options::extra_apiserver_args`] (see docs/testenv.md).
    pub async fn compact_etcd(&self) -> Result<i64, Error> {
        let encode =
            |text: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, text);
        let key = encode("/devctl-testenv/compaction");
        let mut revision = 0;
        for step in ["1", "2"] {
            let (status, put) = self
                .etcd_post("/v3/kv/put", &json!({ "key": key, "value": encode(step) }))
                .await?;
            revision = json_i64(&put["header"]["revision"])
                .filter(|_| status == 200)
                .ok_or_else(|| {
                    Error::Process(format!(
                        "etcd /v3/kv/put (to move past the current revision) answered HTTP \
                         {status}: {put}"
                    ))
                })?;
        }
        let (status, compaction) = self
            .etcd_post(
                "/v3/kv/compaction",
                &json!({ "revision": revision.to_string(), "physical": true }),
            )
            .await?;
        if status != 200 {
            return Err(Error::Process(format!(
                "etcd /v3/kv/compaction at revision {revision} answered HTTP {status}: {compaction}"
            )));
        }
        tracing::info!(revision, "etcd compacted");
        Ok(revision)
    }

    /// `POST path` with a JSON body to etcd's gRPC-JSON gateway; the status code and the
    /// JSON answer.
    async fn etcd_post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<(u16, serde_json::Value), Error> {
        let (status, body) = http_request(
            &self.etcd_address,
            "POST",
            path,
            Some(&body.to_string()),
            ETCD_REQUEST_TIMEOUT,
        )
        .await?;
        let json = serde_json::from_slice(&body).map_err(|e| {
            Error::Process(format!(
                "etcd POST {path}: HTTP {status} with a body that is not JSON ({e}): {}",
                String::from_utf8_lossy(&body)
            ))
        })?;
        Ok((status, json))
    }

    /// etcd's client URL (`http://127.0.0.1:<port>`, no TLS, no auth).
    pub fn etcd_url(&self) -> String {
        format!("http://{}", self.etcd_address)
    }

    /// The API server URL, e.g. `https://127.0.0.1:41234`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The directory holding the PKI, etcd data, kubeconfig and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where each process writes its log (`<name>.log`).
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// Process names with their log files, for failure messages.
    pub fn describe(&self) -> String {
        let logs: Vec<String> = self
            .processes()
            .iter()
            .map(|p| match p.restarts() {
                0 => format!("{} (pid {}): {}", p.name(), p.pid(), p.log_path().display()),
                n => format!(
                    "{} (pid {}, started again {n} times): {}",
                    p.name(),
                    p.pid(),
                    p.log_path().display()
                ),
            })
            .collect();
        format!(
            "devctl-testenv at {}; logs:\n  {}",
            self.server,
            logs.join("\n  ")
        )
    }

    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// The admin kubeconfig file (user in `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    pub fn admin_kubeconfig(&self) -> Result<Kubeconfig, Error> {
        kubeconfig::build(
            &self.server,
            &self.server_ca_pem,
            ADMIN_USER,
            Credentials::Certificate(&self.admin),
        )
    }

    /// A kubeconfig for `user` in `groups`, with a fresh client certificate.
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<Kubeconfig, Error> {
        let pair = self.client_ca.issue_client(user, groups)?;
        kubeconfig::build(
            &self.server,
            &self.server_ca_pem,
            user,
            Credentials::Certificate(&pair),
        )
    }

    /// A kubeconfig that authenticates with a bearer token (e.g. from TokenRequest).
    pub fn kubeconfig_with_token(&self, user: &str, token: &str) -> Result<Kubeconfig, Error> {
        kubeconfig::build(
            &self.server,
            &self.server_ca_pem,
            user,
            Credentials::Token(token),
        )
    }

    /// An admin client (bound to the current tokio runtime; make one per test).
    pub async fn client(&self) -> Result<kube::Client, Error> {
        kubeconfig::client(self.admin_kubeconfig()?).await
    }

    /// A client for `user` in `groups` (no RBAC permissions unless a test grants them).
    pub async fn client_for(&self, user: &str, groups: &[&str]) -> Result<kube::Client, Error> {
        kubeconfig::client(self.kubeconfig_for(user, groups)?).await
    }

    /// Grants `user` exactly the rules of `cluster_role` (a ClusterRole's JSON; its name is set
    /// to `user`) through a ClusterRoleBinding of the same name, and returns a client acting as
    /// `user`: how tests run the operator with the rights its install grants, not as an admin.
    pub async fn client_with_rules(
        &self,
        user: &str,
        mut cluster_role: serde_json::Value,
    ) -> Result<kube::Client, Error> {
        use kube::api::DynamicObject;
        use kube::core::{ApiResource, GroupVersionKind};
        cluster_role["metadata"]["name"] = serde_json::json!(user);
        let binding = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": { "name": user },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
        });
        let client = self.client().await?;
        for (kind, plural, body) in [
            ("ClusterRole", "clusterroles", &cluster_role),
            ("ClusterRoleBinding", "clusterrolebindings", &binding),
        ] {
            let api = Api::<DynamicObject>::all_with(
                client.clone(),
                &ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
                    plural,
                ),
            );
            api.patch(
                user,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(body),
            )
            .await?;
        }
        self.client_for(user, &[]).await
    }

    /// A client that sends no credentials.
    pub async fn anonymous_client(&self) -> Result<kube::Client, Error> {
        let config = kubeconfig::build(
            &self.server,
            &self.server_ca_pem,
            "anonymous",
            Credentials::None,
        )?;
        kubeconfig::client(config).await
    }

    /// The audit log, when started with [`Options::audit`].
    pub fn audit_log(&self) -> Option<&AuditLog> {
        self.audit.as_ref()
    }

    /// Server-side applies `crds` and waits until every one is `Established`.
    pub async fn install_crds(&self, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
        let client = self.client().await?;
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.patch(&name, &params, &Patch::Apply(crd)).await?;
        }
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let established = kube::runtime::wait::await_condition(
                api.clone(),
                &name,
                kube::runtime::wait::conditions::is_crd_established(),
            );
            tokio::time::timeout(Duration::from_secs(30), established)
                .await
                .map_err(|_| Error::Timeout {
                    what: format!("CRD {name} to become Established"),
                    after: Duration::from_secs(30),
                })?
                .map_err(|e| Error::Process(format!("watching CRD {name}: {e}")))?;
        }
        Ok(())
    }

    /// Creates a fresh namespace `<prefix>-<random>` and returns its name. Tests that share
    /// one control plane isolate themselves this way.
    pub async fn create_namespace(&self, prefix: &str) -> Result<String, Error> {
        let api: Api<Namespace> = Api::all(self.client().await?);
        let namespace = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                ..Default::default()
            },
            ..Default::default()
        };
        let created = api.create(&PostParams::default(), &namespace).await?;
        Ok(created.metadata.name.unwrap_or_default())
    }

    /// A `kubectl` command (the pinned build) pointed at this control plane.
    pub fn kubectl(&self) -> std::process::Command {
        let mut command = std::process::Command::new(self.binaries.path("kubectl"));
        command.env("KUBECONFIG", &self.kubeconfig_path);
        command
    }

    /// The version of the pinned Kubernetes release.
    pub fn kubernetes_version(&self) -> &'static str {
        binaries::kubernetes_version()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Stop in reverse start order (kwok and controllers before the API server, etcd last).
        let mut processes = self.processes();
        while let Some(process) = processes.pop() {
            drop(process);
        }
        process::dispose_dir(&self.dir, self.keep_dir);
    }
}

/// One plain-HTTP/1.1 request (`Connection: close`) to `address` (`host:port`), bounded by
/// `timeout`; the status code and the body. For etcd's JSON gateway and kwok's health check.
pub(crate) async fn http_request(
    address: &str,
    method: &str,
    path: &str,
    json_body: Option<&str>,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), Error> {
    let what = format!("{method} http://{address}{path}");
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| Error::io(format!("{what}: connect"), e))?;
        let mut request =
            format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
        if let Some(body) = json_body {
            request += &format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        } else {
            request += "\r\n";
        }
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| Error::io(format!("{what}: send"), e))?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .map_err(|e| Error::io(format!("{what}: read the answer"), e))?;
        Ok::<_, Error>(response)
    };
    let response = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| Error::Timeout {
            what: what.clone(),
            after: timeout,
        })??;
    parse_http_response(&response).map_err(|e| Error::Process(format!("{what}: {e}")))
}

/// How often the supervisor looks for an exited process.
const SUPERVISE_EVERY: Duration = Duration::from_millis(500);

/// The supervisor thread's loop: restarts every exited process marked to be, until the
/// control plane is dropped.
fn supervise(processes: &Weak<Mutex<Vec<ManagedProcess>>>, stopping: &AtomicBool) {
    loop {
        std::thread::sleep(SUPERVISE_EVERY);
        let Some(processes) = processes.upgrade() else {
            return;
        };
        let mut processes = processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        for process in processes.iter_mut().filter(|p| p.restarts_on_exit()) {
            match process.restart() {
                Ok(None) => {}
                Ok(Some(status)) => tracing::warn!(
                    name = process.name(),
                    %status,
                    pid = process.pid(),
                    restarts = process.restarts(),
                    "exited; started again (as a kubelet restarts a static pod)"
                ),
                Err(e) => tracing::warn!(name = process.name(), error = %e, "cannot start again"),
            }
        }
    }
}

fn api_server_mut(processes: &mut [ManagedProcess]) -> Result<&mut ManagedProcess, Error> {
    processes
        .iter_mut()
        .find(|p| p.name() == API_SERVER)
        .ok_or_else(|| Error::Process(format!("{API_SERVER} is not running")))
}

/// A server killed mid-write may leave half a line; the next one must start a fresh line, or
/// its first event would be glued to the fragment and unreadable.
fn end_with_newline(path: &Path) -> Result<(), Error> {
    let context = || format!("check the end of {}", path.display());
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(context(), e)),
    };
    let len = file.metadata().map_err(|e| Error::io(context(), e))?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))
        .and_then(|_| file.read_exact(&mut last))
        .map_err(|e| Error::io(context(), e))?;
    if last[0] != b'\n' {
        file.write_all(b"\n").map_err(|e| Error::io(context(), e))?;
    }
    Ok(())
}

/// A JSON integer that the gRPC gateway may send as a string (int64 fields are strings).
fn json_i64(value: &serde_json::Value) -> Option<i64> {
    match value {
        serde_json::Value::String(s) => s.parse().ok(),
        other => other.as_i64(),
    }
}

/// The status code and body of a complete HTTP/1.1 response (`Content-Length`, chunked, or
/// delimited by the closed connection).
fn parse_http_response(response: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            format!(
                "incomplete HTTP answer: {}",
                String::from_utf8_lossy(response)
            )
        })?;
    let head = String::from_utf8_lossy(&response[..split]);
    let body = &response[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("bad HTTP status line {status_line:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<usize>().ok();
        }
    }
    if chunked {
        return decode_chunked(body).map(|body| (status, body));
    }
    match length {
        Some(length) if length <= body.len() => Ok((status, body[..length].to_vec())),
        Some(length) => Err(format!(
            "HTTP body cut short: {} of {length} bytes",
            body.len()
        )),
        None => Ok((status, body.to_vec())),
    }
}

fn decode_chunked(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunked HTTP body cut short")?;
        let size_field = String::from_utf8_lossy(&rest[..line_end]);
        let size_hex = size_field.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| format!("bad HTTP chunk size {size_hex:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).ok_or("chunked HTTP body cut short")?;
        body.extend_from_slice(chunk);
        rest = rest.get(size + 2..).ok_or("chunked HTTP body cut short")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_http_answers() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}";
        assert_eq!(
            parse_http_response(plain).unwrap(),
            (200, b"{\"a\":1}".to_vec())
        );
        let chunked = b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3;x=y\r\n:1}\r\n0\r\n\r\n";
        assert_eq!(
            parse_http_response(chunked).unwrap(),
            (400, b"{\"a\":1}".to_vec())
        );
        let until_close = b"HTTP/1.0 200 OK\r\n\r\n{}";
        assert_eq!(
            parse_http_response(until_close).unwrap(),
            (200, b"{}".to_vec())
        );
        assert!(parse_http_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
        assert!(parse_http_response(b"HTTP/1.1 200").is_err());
    }

    #[test]
    fn reads_int64_fields_sent_as_strings_or_numbers() {
        assert_eq!(json_i64(&json!("42")), Some(42));
        assert_eq!(json_i64(&json!(42)), Some(42));
        assert_eq!(json_i64(&json!(null)), None);
    }

    #[test]
    fn a_cut_off_line_is_ended_before_the_next_server_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        end_with_newline(&path).unwrap();
        assert!(!path.exists());
        std::fs::write(&path, "{\"a\":1}\n{\"b\"").unwrap();
        end_with_newline(&path).unwrap();
        end_with_newline(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"a\":1}\n{\"b\"\n"
        );
    }
}
