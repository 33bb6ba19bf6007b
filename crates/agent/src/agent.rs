//! The agent proper: wait for credentials, bootstrap, run and supervise the engine, keep
//! the application role in line with the Secret, and report.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use devctl_api::instance::{InstanceStatus, env};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::process::Child;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use crate::config::{Config, PodRef};
use crate::credentials::Credentials;
use crate::engine::{Engine, Probe, prepare_dir};
use crate::error::{Error, Result, is_forbidden, one_line};
use crate::health::{self, Health};
use crate::process;
use crate::report::{Reporter, WriteError};

/// Probe period once the engine is ready (faster while it starts).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);
const STARTING_PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// How long a stopping engine gets before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(50);
/// Restart backoff: 1 s doubling to 30 s; giving up after this many consecutive failures
/// (an engine that ran longer than [`STABLE_UPTIME`] resets the count).
pub const MAX_FAILURES: u32 = 5;
const MAX_BACKOFF: Duration = Duration::from_secs(30);
const STABLE_UPTIME: Duration = Duration::from_secs(60);

/// How the agent ended without an error (both exit 0).
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// SIGTERM/SIGINT; the engine stopped cleanly.
    Stopped,
    /// The pod was deleted or replaced by a newer one of the same name.
    Stale(String),
}

/// What the credentials watch has seen.
#[derive(Clone, Debug, Default)]
struct SecretView {
    /// The initial list completed.
    listed: bool,
    secret: Option<Secret>,
    /// The last watch error (message, forbidden) since the last successful event.
    error: Option<(String, bool)>,
}

/// Watches the one Secret (field selector on its name: the agent's Role allows only that
/// name, so it never lists all Secrets).
fn watch_secret(client: kube::Client, config: &Config) -> watch::Receiver<SecretView> {
    let (tx, rx) = watch::channel(SecretView::default());
    let api: Api<Secret> = Api::namespaced(client, &config.pod_namespace);
    let fields = format!("metadata.name={}", config.credentials_secret);
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default().fields(&fields))
            .default_backoff()
            .boxed();
        let mut buffer = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => buffer = None,
                Ok(watcher::Event::InitApply(s)) => buffer = Some(s),
                Ok(watcher::Event::InitDone) => tx.send_modify(|v| {
                    v.listed = true;
                    v.secret = buffer.take();
                    v.error = None;
                }),
                Ok(watcher::Event::Apply(s)) => tx.send_modify(|v| {
                    v.listed = true;
                    v.secret = Some(s);
                    v.error = None;
                }),
                Ok(watcher::Event::Delete(_)) => tx.send_modify(|v| {
                    v.listed = true;
                    v.secret = None;
                    v.error = None;
                }),
                Err(e) => {
                    let forbidden = match &e {
                        watcher::Error::InitialListFailed(k)
                        | watcher::Error::WatchStartFailed(k)
                        | watcher::Error::WatchFailed(k) => is_forbidden(k),
                        watcher::Error::WatchError(s) => s.code == 403,
                        watcher::Error::NoResourceVersion => false,
                    };
                    let message = one_line(&e.to_string());
                    tracing::warn!("watching the credentials Secret: {message}");
                    tx.send_modify(|v| v.error = Some((message, forbidden)));
                }
            }
        }
    });
    rx
}

enum Exit {
    Crashed(ExitStatus),
    Signalled,
    Stale(String),
}

struct Agent {
    config: Config,
    engine: Engine,
    reporter: Reporter,
    reported_once: bool,
    health: Arc<Health>,
    secrets: watch::Receiver<SecretView>,
    sigterm: Signal,
    sigint: Signal,
    /// The Secret version last looked at, and the last valid credentials.
    seen_version: Option<String>,
    desired: Option<Credentials>,
    /// The Secret version the roles have.
    applied: Option<String>,
    /// The Secret is missing or cannot be watched.
    secret_problem: Option<String>,
    /// The Secret's latest version is invalid (the previous password stays).
    invalid_error: Option<String>,
    apply_error: Option<String>,
    engine_error: Option<String>,
    probe: Option<Probe>,
    ready: bool,
}

/// Runs the instance described by `config` until SIGTERM/SIGINT, a replaced pod, or an
/// error.
pub async fn run(config: Config) -> Result<Outcome> {
    let signal_error =
        |e: std::io::Error| Error::Internal(format!("installing signal handlers: {e}"));
    let sigterm = signal(SignalKind::terminate()).map_err(signal_error)?;
    let sigint = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let engine = Engine::locate(&config)?;
    prepare_dir(&config.data_dir, "data directory", env::DATA_DIR)?;
    prepare_dir(&config.run_dir, "run directory", env::RUN_DIR)?;
    let client = kube_client().await?;
    let health = Arc::new(Health::default());
    health::serve(config.health_port, health.clone()).await?;
    let pod = PodRef {
        name: config.pod_name.clone(),
        namespace: config.pod_namespace.clone(),
        uid: Some(config.pod_uid.clone()),
    };
    let mut agent = Agent {
        secrets: watch_secret(client.clone(), &config),
        reporter: Reporter::new(client, pod),
        reported_once: false,
        config,
        engine,
        health,
        sigterm,
        sigint,
        seen_version: None,
        desired: None,
        applied: None,
        secret_problem: None,
        invalid_error: None,
        apply_error: None,
        engine_error: None,
        probe: None,
        ready: false,
    };
    agent.main().await
}

/// A client from the environment: `KUBECONFIG`, else the in-cluster service account.
pub async fn kube_client() -> Result<kube::Client> {
    let config = kube::Config::infer().await.map_err(|e| {
        Error::Internal(format!(
            "Kubernetes client configuration: {}",
            one_line(&e.to_string())
        ))
    })?;
    kube::Client::try_from(config)
        .map_err(|e| Error::Internal(format!("Kubernetes client: {}", one_line(&e.to_string()))))
}

impl Agent {
    async fn main(&mut self) -> Result<Outcome> {
        tracing::info!(
            engine = self.engine.name(),
            pod = %self.config.pod_name,
            data_dir = %self.config.data_dir.display(),
            "devctl-agent starting"
        );
        let credentials = match self.wait_for_credentials().await? {
            Ok(c) => c,
            Err(outcome) => return Ok(outcome),
        };
        self.secret_problem = None;
        self.seen_version = Some(credentials.version.clone());
        self.desired = Some(credentials);
        let fresh = !self.engine.is_bootstrapped();
        if fresh {
            self.engine.bootstrap().await?;
        }
        self.supervise(fresh).await
    }

    /// Waits until the credentials Secret exists and is valid (exit 65 when it is not,
    /// 77 when watching it is forbidden), reporting while it is missing.
    async fn wait_for_credentials(&mut self) -> Result<Result<Credentials, Outcome>> {
        let name = self.config.credentials_secret.clone();
        loop {
            let view = self.secrets.borrow_and_update().clone();
            let problem = if let Some((message, forbidden)) = view.error {
                if forbidden {
                    return Err(Error::Forbidden(format!(
                        "watching credentials Secret {name}: {message}"
                    )));
                }
                Some(format!("watching credentials Secret {name}: {message}"))
            } else if view.listed {
                match view.secret {
                    Some(secret) => return Credentials::from_secret(&secret).map(Ok),
                    None => Some(format!("credentials Secret {name} not found")),
                }
            } else {
                None
            };
            if let Some(problem) = problem {
                tracing::warn!("{problem}; waiting");
                self.secret_problem = Some(problem);
                if let Some(outcome) = self.report().await? {
                    return Ok(Err(outcome));
                }
            }
            tokio::select! {
                changed = self.secrets.changed() => {
                    if changed.is_err() {
                        return Err(Error::Internal("the credentials watch ended".into()));
                    }
                }
                _ = self.sigterm.recv() => return Ok(Err(Outcome::Stopped)),
                _ = self.sigint.recv() => return Ok(Err(Outcome::Stopped)),
            }
        }
    }

    fn start_engine(&self) -> Result<Child> {
        let mut command = self.engine.server_command();
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        process::die_with_parent(&mut command);
        let mut child = process::spawn(&mut command)
            .map_err(|e| Error::Engine(format!("cannot start {}: {e}", self.engine.name())))?;
        let prefix = match self.engine.name() {
            "postgres" => "[postgres] ",
            "mariadbd" => "[mariadbd] ",
            _ => "[mysqld] ",
        };
        if let Some(out) = child.stdout.take() {
            process::forward(out, prefix);
        }
        if let Some(err) = child.stderr.take() {
            process::forward(err, prefix);
        }
        tracing::info!(pid = child.id(), "{} started", self.engine.name());
        Ok(child)
    }

    async fn supervise(&mut self, mut fresh: bool) -> Result<Outcome> {
        let mut failures = 0u32;
        let mut backoff = Duration::from_secs(1);
        loop {
            let mut child = self.start_engine()?;
            let started = Instant::now();
            let exit = self.watch_engine(&mut child, &mut fresh).await;
            let exit = match exit {
                Ok(exit) => exit,
                Err(e) => {
                    self.stop(&mut child).await;
                    return Err(e);
                }
            };
            match exit {
                Exit::Signalled => {
                    tracing::info!("stopping on signal");
                    let clean = self.stop(&mut child).await;
                    self.ready = false;
                    self.health.set_ready(false);
                    let _ = tokio::time::timeout(Duration::from_secs(5), self.report()).await;
                    return if clean {
                        tracing::info!("{} stopped cleanly", self.engine.name());
                        Ok(Outcome::Stopped)
                    } else {
                        Err(Error::Engine(format!(
                            "{} did not stop cleanly",
                            self.engine.name()
                        )))
                    };
                }
                Exit::Stale(why) => {
                    tracing::warn!("{why}: this agent is stale; stopping the engine and exiting");
                    self.stop(&mut child).await;
                    return Ok(Outcome::Stale(why));
                }
                Exit::Crashed(status) => {
                    process::release(child.id());
                    if started.elapsed() > STABLE_UPTIME {
                        failures = 0;
                        backoff = Duration::from_secs(1);
                    }
                    failures += 1;
                    self.ready = false;
                    self.health.set_ready(false);
                    self.health.set_failed(true);
                    let name = self.engine.name();
                    if failures >= MAX_FAILURES {
                        return Err(Error::Engine(format!(
                            "{name} exited {failures} times in a row (last: {status}); giving up"
                        )));
                    }
                    let message = format!(
                        "{name} exited ({status}); restarting in {}s",
                        backoff.as_secs()
                    );
                    tracing::error!("{message}");
                    self.engine_error = Some(message);
                    if let Some(outcome) = self.report().await? {
                        return Ok(outcome);
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.sigterm.recv() => return Ok(Outcome::Stopped),
                        _ = self.sigint.recv() => return Ok(Outcome::Stopped),
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Stops the engine: its fast-shutdown signal, then SIGKILL after [`STOP_TIMEOUT`].
    /// Returns whether it exited cleanly.
    async fn stop(&self, child: &mut Child) -> bool {
        let pid = child.id();
        let clean = if let Some(pid) = pid {
            process::signal(pid, self.engine.stop_signal());
            match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
                Ok(Ok(status)) => {
                    tracing::info!("{} exited ({status})", self.engine.name());
                    status.success()
                }
                Ok(Err(e)) => {
                    tracing::error!("waiting for {}: {e}", self.engine.name());
                    false
                }
                Err(_) => {
                    tracing::error!(
                        "{} did not stop within {STOP_TIMEOUT:?}; killing it",
                        self.engine.name()
                    );
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    false
                }
            }
        } else {
            true // already reaped
        };
        process::release(pid);
        clean
    }

    async fn watch_engine(&mut self, child: &mut Child, fresh: &mut bool) -> Result<Exit> {
        let mut next_probe = tokio::time::Instant::now() + STARTING_PROBE_INTERVAL;
        let mut reaper = tokio::time::interval(Duration::from_secs(1));
        let mut was_ready = false;
        loop {
            tokio::select! {
                status = child.wait() => {
                    return match status {
                        Ok(status) => Ok(Exit::Crashed(status)),
                        Err(e) => Err(Error::Internal(format!("waiting for the engine: {e}"))),
                    };
                }
                _ = self.sigterm.recv() => return Ok(Exit::Signalled),
                _ = self.sigint.recv() => return Ok(Exit::Signalled),
                changed = self.secrets.changed() => {
                    if changed.is_err() {
                        return Err(Error::Internal("the credentials watch ended".into()));
                    }
                    next_probe = tokio::time::Instant::now();
                }
                _ = reaper.tick() => process::reap_orphans(),
                _ = tokio::time::sleep_until(next_probe) => {
                    self.tick(fresh, &mut was_ready).await;
                    if let Some(Outcome::Stale(why)) = self.report().await? {
                        return Ok(Exit::Stale(why));
                    }
                    let interval = if self.ready { PROBE_INTERVAL } else { STARTING_PROBE_INTERVAL };
                    next_probe = tokio::time::Instant::now() + interval;
                }
            }
        }
    }

    /// Takes in the Secret's latest state, probes the engine and applies credentials.
    async fn tick(&mut self, fresh: &mut bool, was_ready: &mut bool) {
        let name = self.config.credentials_secret.clone();
        let view = self.secrets.borrow_and_update().clone();
        self.secret_problem = if let Some((message, _)) = &view.error {
            Some(format!("watching credentials Secret {name}: {message}"))
        } else if view.listed && view.secret.is_none() {
            Some(format!("credentials Secret {name} not found"))
        } else {
            None
        };
        if let Some(secret) = &view.secret {
            let version = secret.metadata.resource_version.clone();
            if version != self.seen_version {
                self.seen_version = version;
                match Credentials::from_secret(secret) {
                    Ok(c) => {
                        self.desired = Some(c);
                        self.invalid_error = None;
                    }
                    Err(e) => {
                        let message = format!("{}; keeping the previous password", e.one_line());
                        tracing::error!("{message}");
                        self.invalid_error = Some(message);
                    }
                }
            }
        }

        match self.engine.probe().await {
            Ok(probe) => {
                *was_ready = true;
                self.engine_error = None;
                self.health.set_failed(false);
                if *fresh {
                    if let Err(e) = self.engine.secure_root().await {
                        tracing::warn!("restricting root to the socket: {e}");
                    }
                    *fresh = false;
                }
                let primary = probe.role == devctl_api::instance::ROLE_PRIMARY;
                if primary
                    && let Some(desired) = self.desired.clone()
                    && self.applied.as_deref() != Some(desired.version.as_str())
                {
                    match self.engine.apply_credentials(&desired).await {
                        Ok(()) => {
                            tracing::info!(
                                version = %desired.version,
                                user = %desired.username,
                                database = %desired.dbname,
                                "applied the credentials Secret"
                            );
                            self.applied = Some(desired.version.clone());
                            self.apply_error = None;
                        }
                        Err(e) => {
                            let message = format!("applying credentials: {e}");
                            tracing::error!("{message}");
                            self.apply_error = Some(message);
                        }
                    }
                }
                self.ready = self.applied.is_some() || !primary;
                self.probe = Some(probe);
            }
            Err(e) => {
                self.ready = false;
                if *was_ready {
                    let message =
                        format!("{} is not accepting connections: {e}", self.engine.name());
                    tracing::warn!("{message}");
                    self.engine_error = Some(message);
                }
            }
        }
        self.health.set_ready(self.ready);
    }

    fn status(&self) -> InstanceStatus {
        let probe = self.probe.clone().unwrap_or_default();
        InstanceStatus {
            role: (!probe.role.is_empty()).then_some(probe.role),
            ready: self.ready,
            system_identifier: probe.system_identifier,
            timeline: probe.timeline,
            received_lsn: probe.received_lsn,
            replayed_lsn: probe.replayed_lsn,
            lag_bytes: probe.lag_bytes,
            engine_version: probe.engine_version,
            address: Some(self.config.address()),
            heartbeat: None,
            last_error: self
                .secret_problem
                .clone()
                .or_else(|| self.invalid_error.clone())
                .or_else(|| self.apply_error.clone())
                .or_else(|| self.engine_error.clone()),
            credentials_version: self.applied.clone(),
        }
    }

    /// Writes the report if it changed (or the heartbeat is due). `Some(Stale)` when the pod
    /// was replaced; forbidden before any successful write is fatal (exit 77).
    async fn report(&mut self) -> Result<Option<Outcome>> {
        match self.reporter.report(self.status()).await {
            Ok(_) => {
                self.reported_once = true;
                Ok(None)
            }
            Err(WriteError::Stale(why)) => Ok(Some(Outcome::Stale(why))),
            Err(WriteError::Forbidden(e)) if !self.reported_once => {
                Err(Error::Forbidden(format!("reporting on the pod: {e}")))
            }
            Err(e) => {
                tracing::warn!("cannot write the report: {e}");
                Ok(None)
            }
        }
    }
}
