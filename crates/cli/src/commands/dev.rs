//! `devctl dev up`: a simulated cluster (real API server, controllers, scheduler, kwok nodes)
//! in the foreground until Ctrl-C.

use std::time::Instant;

use anyhow::Context;
use clap::Subcommand;
use devctl_testenv::{Cluster, ClusterOptions, Options};

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
    },
}

pub async fn run(command: DevCommand) -> anyhow::Result<()> {
    match command {
        DevCommand::Up { nodes, audit } => up(nodes.into(), audit).await,
    }
}

async fn up(nodes: usize, audit: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    eprintln!(
        "Starting a local cluster (etcd, kube-apiserver, controller-manager, scheduler, kwok with {nodes} nodes)..."
    );
    let cluster = Cluster::start_with(ClusterOptions {
        control_plane: Options {
            audit,
            ..Options::default()
        },
        nodes,
    })
    .await
    .context("starting the local cluster")?;
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
    println!("Logs: {}", cluster.log_dir().display());
    println!("Press Ctrl-C to stop and remove everything.");

    wait_for_shutdown_signal().await?;
    eprintln!("Stopping the local cluster...");
    drop(cluster);
    eprintln!("Stopped.");
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
