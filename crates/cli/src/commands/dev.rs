//! `devctl dev up`: a simulated cluster (real API server, controllers, scheduler, kwok nodes)
//! in the foreground until Ctrl-C.

use std::time::Instant;

use anyhow::Context;
use clap::Subcommand;
use devctl_testenv::{Cluster, ClusterOptions, Options, PodBacking};

#[derive(Subcommand)]
pub enum DevCommand {
    /// Start a local simulated cluster and keep it running until Ctrl-C.
    Up {
        /// Number of simulated nodes.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=100))]
        nodes: u16,
        /// Write the API server's audit log (metadata level) next to the other logs.
        #[arg(long)]
        audit: bool,
        /// Install the CRDs but do not run the operator (run `devctl-operator` yourself).
        #[arg(long)]
        no_operator: bool,
        /// Do not run databases: database pods get simulated ready reports instead of a
        /// `devctl-agent` with a real PostgreSQL/MariaDB (fast, no data path).
        #[arg(long, conflicts_with = "real_node")]
        simulated: bool,
        /// Run database pods in real containers on a real node of this machine (containerd,
        /// runc, a kubelet; needs root) instead of kwok nodes: see docs/testenv.md.
        #[arg(long)]
        real_node: bool,
    },
}

pub async fn run(command: DevCommand) -> anyhow::Result<()> {
    match command {
        DevCommand::Up {
            nodes,
            audit,
            no_operator,
            simulated,
            real_node,
        } => {
            let backing = if real_node {
                Backing::RealNode
            } else if simulated {
                Backing::Simulated
            } else {
                Backing::Processes
            };
            up(nodes.into(), audit, !no_operator, backing).await
        }
    }
}

/// What runs the database pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// Simulated ready reports, no database.
    Simulated,
    /// `devctl-agent` processes with this machine's PostgreSQL/MariaDB (kwok nodes).
    Processes,
    /// Containers on a real node (no kwok nodes).
    RealNode,
}

async fn up(nodes: usize, audit: bool, run_operator: bool, backing: Backing) -> anyhow::Result<()> {
    let started = Instant::now();
    let simulated = backing == Backing::Simulated;
    let real_node = backing == Backing::RealNode;
    // Each database pod runs `devctl-agent` with this machine's PostgreSQL/MariaDB.
    let pods = match backing {
        Backing::Simulated => PodBacking::Simulated,
        Backing::RealNode => PodBacking::None,
        Backing::Processes => PodBacking::processes().context(
            "database pods run devctl-agent: build it next to devctl (`cargo build -p devctl-agent`) or pass --simulated",
        )?,
    };
    let nodes = if real_node { 0 } else { nodes };
    if real_node {
        eprintln!(
            "Starting a local cluster (etcd, kube-apiserver, controller-manager, scheduler) and a real node (containerd, runc, kubelet, kube-proxy, CoreDNS; the first start builds them and the images)..."
        );
    } else {
        eprintln!(
            "Starting a local cluster (etcd, kube-apiserver, controller-manager, scheduler, kwok with {nodes} nodes)..."
        );
    }
    let cluster = Cluster::start_with(ClusterOptions {
        control_plane: Options {
            audit,
            ..Options::default()
        },
        nodes,
        pods,
        real_node,
    })
    .await
    .context("starting the local cluster")?;
    cluster
        .install_crds(&devctl_api::crds())
        .await
        .context("installing the devctl CRDs")?;
    // Backups work out of the box: a local S3 store and the operator's default destination.
    let store = if simulated {
        None
    } else {
        eprintln!("Starting a local S3 store (versitygw) for backups...");
        // On a real node, pods reach it at the host's address.
        let address = cluster
            .real_node()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |n| n.address());
        let store = devctl_testenv::s3::S3Server::start_on(address)
            .await
            .context("starting the local object store (versitygw)")?;
        let client = cluster
            .client()
            .await
            .context("connecting to the local cluster")?;
        default_backup_destination(&client, &store)
            .await
            .context("creating the default backup destination Secret")?;
        Some(store)
    };
    let (stop_operator, operator_stopped) = tokio::sync::watch::channel(false);
    let mut webhooks = None;
    let operator = if run_operator {
        let client = cluster
            .client()
            .await
            .context("connecting to the local cluster")?;
        // The API server runs on this machine: it calls the webhooks on loopback (Service
        // IPs route nowhere on the simulated cluster).
        ensure_namespace(&client, DEV_NAMESPACE)
            .await
            .context("creating the operator's namespace")?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the webhook port")?;
        let port = listener.local_addr()?.port();
        let settings = devctl_operator::webhook::WebhookSettings {
            url: Some(format!("https://127.0.0.1:{port}")),
            namespace: DEV_NAMESPACE.into(),
            ..Default::default()
        };
        webhooks = Some(
            devctl_operator::webhook::start(client.clone(), settings, listener)
                .await
                .context("starting the admission and conversion webhooks")?,
        );
        let settings = devctl_operator::Settings {
            default_backup_secret: store
                .is_some()
                .then(|| (DEV_NAMESPACE.to_string(), DEV_BACKUP_SECRET.to_string())),
            ..devctl_operator::Settings::default()
        };
        Some(tokio::spawn(async move {
            devctl_operator::run(client, &[], settings, "devctl-dev", operator_stopped).await
        }))
    } else {
        None
    };
    let kubeconfig = cluster.kubeconfig_path().display().to_string();
    let kubectl = cluster.binaries().path("kubectl");
    println!(
        "Local cluster ready in {:.1} s ({}).",
        started.elapsed().as_secs_f64(),
        cluster.kubernetes_version()
    );
    println!();
    println!("  export KUBECONFIG={kubeconfig}");
    println!("  {} get nodes", kubectl.display());
    println!();
    match operator {
        Some(_) => println!(
            "The devctl operator runs in this process (DEVCTL_LOG=info shows its logs). Try:"
        ),
        None => println!(
            "CRDs installed; start the operator with: cargo run -p devctl-operator -- --kubeconfig {kubeconfig}"
        ),
    }
    if let Some(node) = cluster.real_node() {
        println!(
            "Database pods run in containers on node {} ({}); its images were imported without a registry: for PostgreSQL 15 set spec.image: {}",
            devctl_testenv::real_node::NODE_NAME,
            node.address(),
            devctl_testenv::real_node::POSTGRES_IMAGE
        );
    }
    println!("  {} apply -f examples/postgres.yaml", kubectl.display());
    println!("  {} get dbc -w", kubectl.display());
    println!("  devctl db shell my-postgres -- -c 'select version()'");
    println!();
    println!("Logs: {}", cluster.log_dir().display());
    if let Some(store) = &store {
        println!(
            "Backups go to {} bucket {} (files under {}); default destination: secret {DEV_NAMESPACE}/{DEV_BACKUP_SECRET}.",
            store.endpoint(),
            store.bucket(),
            store.bucket_dir().display()
        );
    }
    if let Some(runner) = cluster.pod_runner().filter(|r| r.runs_processes()) {
        println!("Database agents' logs: {}", runner.logs_dir().display());
    }
    println!("Press Ctrl-C to stop and remove everything.");

    wait_for_shutdown_signal().await?;
    eprintln!("Stopping the operator and the local cluster...");
    let _ = stop_operator.send(true);
    if let Some(operator) = operator {
        let _ = operator.await;
    }
    drop(webhooks);
    drop(store);
    drop(cluster);
    eprintln!("Stopped.");
    Ok(())
}

/// Where `devctl dev up` puts the default backup destination's Secret.
const DEV_NAMESPACE: &str = "devctl-system";
const DEV_BACKUP_SECRET: &str = "devctl-default-backup";

async fn ensure_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, Patch, PatchParams};
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            name,
            &PatchParams::apply("devctl-dev").force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name }
            })),
        )
        .await?;
    Ok(())
}

/// The operator's default backup destination (docs/backup.md) for the local store.
async fn default_backup_destination(
    client: &kube::Client,
    store: &devctl_testenv::s3::S3Server,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, Patch, PatchParams};
    let params = PatchParams::apply("devctl-dev").force();
    ensure_namespace(client, DEV_NAMESPACE).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), DEV_NAMESPACE);
    secrets
        .patch(
            DEV_BACKUP_SECRET,
            &params,
            &Patch::Apply(serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": { "name": DEV_BACKUP_SECRET },
                "stringData": {
                    "endpoint": store.endpoint(),
                    "bucket": store.bucket(),
                    "region": store.region(),
                    "accessKeyId": store.access_key_id(),
                    "secretAccessKey": store.secret_access_key(),
                    "ca.crt": store.ca_pem(),
                },
            })),
        )
        .await?;
    Ok(())
}

async fn wait_for_shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for Ctrl-C"),
        _ = terminate.recv() => Ok(()),
    }
}
