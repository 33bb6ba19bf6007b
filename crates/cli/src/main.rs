//! `devctl`: installs the devctl operator into a cluster, drives its resources, and runs a
//! local simulated cluster for development.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "devctl",
    version,
    about = "Run databases and web apps on Kubernetes with the devctl operator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Local development: a simulated cluster on this machine.
    #[command(subcommand)]
    Dev(commands::dev::DevCommand),
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DEVCTL_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Dev(command) => commands::dev::run(command).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line a user can act on; the chain of causes follows on the same line.
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
