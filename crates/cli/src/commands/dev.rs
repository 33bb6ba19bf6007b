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
        #[arg(long)]
        simulated: bool,
    },
}

pub async fn run(command: DevCommand) -> anyhow::Result<()> {
    match command {
        DevCommand::Up {
            nodes,
            audit,
            no_operator,
            simulated,
        } => up(nodes.into(), audit, !no_operator, simulated).await,
    }
}

async fn up(nodes: usize, audit: bool, run_operator: bool, simulated: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    // Each database pod runs `devctl-agent` with this machine's PostgreSQL/MariaDB.
    let pods = if simulated {
        PodBacking::Simulated
    } else {
        PodBacking::processes().context(
            "database pods run devctl-agent: build it next to devctl (`cargo build -p devctl-agent`) or pass --simulated",
        )?
    };
    eprintln!(
        "Starting a local cluster (etcd, kube-apiserver, controller-manager, scheduler, kwok with {nodes} nodes)..."
    );
    let cluster = Cluster::start_with(ClusterOptions {
        control_plane: Options {
            audit,
            ..Options::default()
        },
        nodes,
        pods,
    })
    .await
    .context("starting the local cluster")?;
    cluster
        .install_crds(&devctl_api::crds())
        .await
        .context("installing the devctl CRDs")?;
    let (stop_operator, operator_stopped) = tokio::sync::watch::channel(false);
    let operator = if run_operator {
        let client = cluster
            .client()
            .await
            .context("connecting to the local cluster")?;
        Some(tokio::spawn(async move {
            devctl_operator::run(
                client,
                &[],
                devctl_operator::Settings::default(),
                "devctl-dev",
                operator_stopped,
            )
            .await
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
    println!("  {} apply -f examples/postgres.yaml", kubectl.display());
    println!("  {} get dbc -w", kubectl.display());
    println!("  devctl db shell my-postgres -- -c 'select version()'");
    println!();
    println!("Logs: {}", cluster.log_dir().display());
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
