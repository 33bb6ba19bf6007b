//! `devctl-operator`: runs the controllers against a kubeconfig or the in-cluster config.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use devctl_operator::client::Fence;
use devctl_operator::leader_election;
use devctl_operator::reconciler::log_results;
use devctl_operator::{Operator, Settings};
use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(Parser)]
#[command(
    name = "devctl-operator",
    version,
    about = "The devctl Kubernetes operator"
)]
struct Args {
    /// Kubeconfig file; without it: $KUBECONFIG, ~/.kube/config, then the in-cluster config.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use.
    #[arg(long)]
    context: Option<String>,
    /// Namespace to watch; repeat for several. Every namespace when not given.
    #[arg(
        long = "namespace",
        short = 'n',
        visible_alias = "watch-namespace",
        env = "DEVCTL_WATCH_NAMESPACES",
        value_delimiter = ','
    )]
    namespaces: Vec<String>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "DEVCTL_LOG_FORMAT")]
    log_format: LogFormat,
    /// DNS suffix of the cluster (endpoints in status and in the credentials Secret).
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Run controllers only while holding the leader Lease (for more than one replica).
    #[arg(long)]
    leader_elect: bool,
    /// How long a leader's Lease is valid without renewal (e.g. 15s).
    #[arg(long, default_value = "15s", value_parser = devctl_api::duration::parse)]
    leader_elect_lease_duration: Duration,
    /// A leader that has not renewed within this stops every write and its controllers;
    /// must be below half the lease duration.
    #[arg(long, default_value = "7s", value_parser = devctl_api::duration::parse)]
    leader_elect_renew_deadline: Duration,
    /// How often the leader renews and followers try to take the Lease.
    #[arg(long, default_value = "2s", value_parser = devctl_api::duration::parse)]
    leader_elect_retry_period: Duration,
    /// Namespace of the leader Lease (default: $POD_NAMESPACE, else devctl-system).
    #[arg(long, env = "POD_NAMESPACE", default_value = devctl_operator::manifests::NAMESPACE)]
    leader_election_namespace: String,
    /// Address of the /metrics, /healthz and /readyz endpoints; `off` disables them.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_bind_address: String,
    /// Most reconciles each controller runs at once (one object is never reconciled twice at
    /// once); controller-runtime's MaxConcurrentReconciles.
    #[arg(long, default_value_t = devctl_operator::context::DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// Milliseconds an owner's children must be quiet before a burst of their events
    /// reconciles it once (at most 4× this after the first event; 0: at once).
    #[arg(long, default_value_t = devctl_operator::context::DEFAULT_CHILD_EVENT_WINDOW.as_millis() as u64, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    child_event_window_ms: u64,
    /// Image the database pods copy `devctl-agent` from: the operator's own image (it holds
    /// both binaries).
    #[arg(long, env = "DEVCTL_AGENT_IMAGE", default_value = devctl_operator::manifests::DEFAULT_IMAGE)]
    agent_image: String,
    /// Threads that run reconciles and watches. 1 (the default) runs everything on one
    /// thread: reconciles mostly wait on the API server, and one thread measured 23 % less
    /// CPU at 300 clusters than a worker per core (no cross-thread wake-ups).
    #[arg(long, env = "DEVCTL_WORKER_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    worker_threads: u16,
    /// Seconds between health checks of an unchanged, healthy object.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..))]
    health_requeue_seconds: u64,
    /// The default backup destination for clusters that declare none: a Secret in the
    /// operator's namespace (`NAMESPACE/NAME` for another) with `endpoint`, `bucket`,
    /// optional `path`, `region`, `ca.crt`, and `accessKeyId`, `secretAccessKey`.
    #[arg(long, env = "DEVCTL_DEFAULT_BACKUP_SECRET")]
    default_backup_secret: Option<String>,
    /// Address of the HTTPS admission and conversion webhooks; `off` disables them (then
    /// nothing validates beyond the CRD schema and v1alpha1 cannot be read). Default: the
    /// port of --webhook-url when given (9443 if it names none), else 0.0.0.0:9443 in a
    /// cluster, else off (the configurations name the in-cluster Service, which an operator
    /// outside the cluster is not behind).
    #[arg(long, env = "DEVCTL_WEBHOOK_BIND_ADDRESS")]
    webhook_bind_address: Option<String>,
    /// URL the API server calls the webhooks at (e.g. https://127.0.0.1:9443) instead of the
    /// Service `devctl-operator-webhook`: for an operator running outside the cluster.
    #[arg(long)]
    webhook_url: Option<String>,
    /// Serve the certificate in this directory (`tls.crt`, `tls.key`; `ca.crt` is injected
    /// when present), e.g. a cert-manager Secret mount, reloaded when the files change;
    /// without it the operator makes and renews its own.
    #[arg(long)]
    webhook_cert_dir: Option<PathBuf>,
    /// Validity of self-managed webhook certificates (renewed 7 days, or a third of the
    /// validity, before they expire).
    #[arg(long, default_value = "90d", value_parser = devctl_api::duration::parse)]
    webhook_cert_validity: Duration,
    /// The smallest `spec.storage.size` the validating webhook admits.
    #[arg(long, default_value = devctl_api::database_cluster::admission::DEFAULT_MIN_STORAGE)]
    webhook_min_storage: String,
    /// Name of the Validating- and MutatingWebhookConfiguration the operator keeps current.
    #[arg(long, default_value = devctl_operator::manifests::NAME)]
    webhook_configuration_name: String,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DEVCTL_LOG")
        .unwrap_or_else(|_| "info,kube=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn kube_config(args: &Args) -> anyhow::Result<kube::Config> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .context("loading kubeconfig")?,
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not running in a cluster")?,
    };
    Ok(config)
}

/// The port the API server calls a `--webhook-url` at: the URL's own, or the webhook port
/// when it names none (a proxy in front, or a malformed URL that the check below refuses).
fn webhook_url_port(url: &str) -> u16 {
    url.parse::<http::Uri>()
        .ok()
        .and_then(|uri| uri.port_u16())
        .unwrap_or(devctl_operator::webhook::PORT)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = terminate.recv() => {},
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Before the runtime's threads exist: they would each get an arena.
    devctl_operator::memory::limit_arenas();
    let mut runtime = if args.worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(usize::from(args.worker_threads));
        builder
    };
    runtime
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run(args))
}

/// Starts the webhook server when this process serves the webhooks (`--webhook-url`, in a
/// cluster, or `--webhook-bind-address`); refuses a bad flag like a usage error.
async fn start_webhooks(
    args: &Args,
    election_client: &kube::Client,
) -> anyhow::Result<Option<devctl_operator::webhook::Webhooks>> {
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let webhook_bind_address = args.webhook_bind_address.clone().unwrap_or_else(|| {
        match &args.webhook_url {
            // The API server calls the URL: listen on its port.
            Some(url) => format!("0.0.0.0:{}", webhook_url_port(url)),
            None if in_cluster => format!("0.0.0.0:{}", devctl_operator::webhook::PORT),
            None => "off".into(),
        }
    });
    Ok(if webhook_bind_address == "off" {
        None
    } else {
        if let Some(url) = &args.webhook_url
            && !url.starts_with("https://")
        {
            eprintln!("error: --webhook-url {url:?} must start with https://");
            std::process::exit(2);
        }
        if devctl_api::quantity::to_bytes(&args.webhook_min_storage).is_none() {
            eprintln!(
                "error: --webhook-min-storage {:?} is not a quantity such as 1Gi",
                args.webhook_min_storage
            );
            std::process::exit(2);
        }
        let listener = tokio::net::TcpListener::bind(&webhook_bind_address)
            .await
            .with_context(|| format!("binding the webhook address {webhook_bind_address}"))?;
        let settings = devctl_operator::webhook::WebhookSettings {
            url: args.webhook_url.clone(),
            cert_dir: args.webhook_cert_dir.clone(),
            cert_validity: args.webhook_cert_validity,
            namespace: args.leader_election_namespace.clone(),
            configuration_name: args.webhook_configuration_name.clone(),
            watch_namespaces: args.namespaces.clone(),
            admission: devctl_api::database_cluster::admission::AdmissionSettings {
                min_storage: args.webhook_min_storage.clone(),
            },
            ..Default::default()
        };
        Some(
            devctl_operator::webhook::start(election_client.clone(), settings, listener)
                .await
                .context("starting the webhooks")?,
        )
    })
}

async fn run(args: Args) -> anyhow::Result<()> {
    let timings = leader_election::Timings {
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    };
    if let Err(reason) = timings.validate() {
        // Like a usage error: one line, exit code 2, before anything starts.
        eprintln!("error: {reason}");
        std::process::exit(2);
    }
    init_logging(args.log_format);
    let instance = std::env::var("POD_NAME").unwrap_or_else(|_| local_identity());
    let config = kube_config(&args).await?;
    let metrics = std::sync::Arc::new(devctl_operator::metrics::Metrics::default());
    // The controllers' client refuses writes unless leadership is confirmed; the election's
    // own client (the Lease) is never fenced.
    let fence = if args.leader_elect {
        Fence::closed()
    } else {
        Fence::open()
    };
    let client =
        devctl_operator::client::build(config.clone(), &instance, fence.clone(), metrics.clone())
            .context("creating the Kubernetes client")?;
    let election_client =
        devctl_operator::client::build(config, &instance, Fence::open(), metrics.clone())
            .context("creating the Kubernetes client")?;
    let settings = Settings {
        cluster_domain: args.cluster_domain.clone(),
        health_requeue: Duration::from_secs(args.health_requeue_seconds),
        metrics: metrics.clone(),
        concurrency: args.concurrency,
        child_event_window: Duration::from_millis(args.child_event_window_ms),
        agent_image: args.agent_image.clone(),
        default_backup_secret: args.default_backup_secret.as_deref().map(|s| {
            match s.split_once('/') {
                Some((namespace, name)) => (namespace.to_string(), name.to_string()),
                None => (args.leader_election_namespace.clone(), s.to_string()),
            }
        }),
        workers: Default::default(),
    };
    let (server_stop, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = if args.metrics_bind_address == "off" {
        None
    } else {
        let listener = tokio::net::TcpListener::bind(&args.metrics_bind_address)
            .await
            .with_context(|| {
                format!("binding the metrics address {}", args.metrics_bind_address)
            })?;
        tracing::info!(address = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
        Some(tokio::spawn(devctl_operator::metrics::serve(
            listener,
            metrics.clone(),
            async {
                let _ = server_stopped.await;
            },
        )))
    };
    tracing::info!(namespaces = ?args.namespaces, "starting");

    // Every replica serves the webhooks, leader or not, from the start.
    let _webhooks = start_webhooks(&args, &election_client).await?;

    // Caches run whether or not this replica leads: /readyz means "caches synced", and a
    // follower takes over with warm caches.
    let (operator, watches) = Operator::start(client.clone(), &args.namespaces, settings);
    let watches = tokio::spawn(watches);

    if args.leader_elect {
        let result = leader_election::run_as_leader(
            election_client,
            &args.leader_election_namespace,
            &instance,
            timings,
            &fence,
            &metrics,
            |stop| log_results(operator.controllers(&instance, devctl_operator::stopped(stop))),
            shutdown_signal(),
        )
        .await;
        watches.abort();
        stop_server(server_stop, server).await;
        result?;
        return Ok(());
    }

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let run = log_results(operator.controllers(&instance, devctl_operator::stopped(stopped)));
    tokio::pin!(run);
    tokio::select! {
        _ = &mut run => {},
        _ = shutdown_signal() => {
            let _ = stop.send(true);
            if tokio::time::timeout(leader_election::SHUTDOWN_GRACE, run).await.is_err() {
                tracing::warn!(grace = ?leader_election::SHUTDOWN_GRACE, "reconciles still running after the shutdown grace; leaving them");
            }
        }
    }
    watches.abort();
    stop_server(server_stop, server).await;
    Ok(())
}

async fn stop_server(
    stop: tokio::sync::oneshot::Sender<()>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
) {
    let _ = stop.send(());
    if let Some(server) = server {
        let _ = server.await;
    }
}

/// The leader-election identity of a replica outside a pod: the host's name and a random
/// suffix, as client-go does — two replicas on one machine must never share an identity, or
/// both would take the Lease as theirs.
fn local_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "devctl-operator".into());
    format!("{host}_{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhooks_listen_where_their_url_points() {
        assert_eq!(webhook_url_port("https://127.0.0.1:19443"), 19443);
        assert_eq!(webhook_url_port("https://127.0.0.1:19443/"), 19443);
        assert_eq!(
            webhook_url_port("https://webhooks.example"),
            devctl_operator::webhook::PORT
        );
    }
}
