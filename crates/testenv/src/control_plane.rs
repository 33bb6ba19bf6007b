//! etcd + kube-apiserver as local processes: the API server's real validation, defaulting,
//! CEL, subresources, RBAC, watches and admission, without nodes or controllers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;

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
}

/// A running etcd + kube-apiserver pair with its own PKI and kubeconfig.
pub struct ControlPlane {
    // Dropped first: the processes stop before their directory disappears.
    processes: Vec<ManagedProcess>,
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
        let serving = server_ca.issue_server(&["localhost", "127.0.0.1"])?;
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
        let mut args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            // The `kubernetes` Service's endpoints may not be loopback addresses; nothing in
            // a local control plane needs them.
            "--endpoint-reconciler-type=none".into(),
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
            "--authorization-mode=RBAC".into(),
            // Without this an unauthenticated client is `system:anonymous` and gets 403; real
            // clusters (and our tests) expect 401 for a missing credential.
            "--anonymous-auth=false".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
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
        processes.push(ManagedProcess::start(
            "kube-apiserver",
            &binaries.path("kube-apiserver"),
            &args,
            &logs.join("kube-apiserver.log"),
        )?);

        let kubeconfig_path = dir.join("kubeconfig");
        let mut control_plane = Self {
            processes,
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
        control_plane.wait_ready(Duration::from_secs(90)).await?;
        tracing::info!(elapsed = ?started.elapsed(), dir = %control_plane.dir.display(), "control plane ready");
        Ok(control_plane)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), Error> {
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
                        "kube-apiserver /readyz (last answer: {last_error}); logs in {}",
                        self.log_dir().display()
                    ),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `Err` naming the process and the end of its log if any process has exited.
    pub fn check_processes(&mut self) -> Result<(), Error> {
        self.processes
            .iter_mut()
            .try_for_each(ManagedProcess::check_running)
    }

    /// The running processes' names and pids.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.processes
            .iter()
            .map(|p| (p.name().to_string(), p.pid()))
            .collect()
    }

    pub(crate) fn push_process(&mut self, process: ManagedProcess) {
        self.processes.push(process);
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
            .processes
            .iter()
            .map(|p| format!("{} (pid {}): {}", p.name(), p.pid(), p.log_path().display()))
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
        // Stop in reverse start order (kwok and controllers before the API server, etcd last).
        while let Some(process) = self.processes.pop() {
            drop(process);
        }
        if self.keep_dir {
            eprintln!(
                "devctl-testenv: kept {} (DEVCTL_KEEP_TESTENV=1)",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
            process::forget_dir_at_exit(&self.dir);
        }
    }
}
