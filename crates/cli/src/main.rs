//! `devctl`: installs the devctl operator into a cluster, drives its resources, and runs a
//! local simulated cluster for development.

mod cluster;
mod commands;
mod output;
mod wait;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::cluster::GlobalArgs;

#[derive(Parser)]
#[command(
    name = "devctl",
    version,
    about = "Run databases and web apps on Kubernetes with the devctl operator"
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install, inspect and remove the operator.
    #[command(subcommand)]
    Operator(commands::operator::OperatorCommand),
    /// Create and inspect databases (DatabaseCluster resources).
    #[command(subcommand)]
    Db(commands::db::DbCommand),
    /// Create and inspect web apps (WebApp resources).
    #[command(subcommand)]
    Webapp(commands::webapp::WebappCommand),
    /// Local development: a simulated cluster on this machine.
    #[command(subcommand)]
    Dev(commands::dev::DevCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The file name kubectl looks for on PATH to run `kubectl devctl ...` (its plugin mechanism:
/// `kubectl-<name>` executables; kubectl passes the remaining arguments unchanged).
const KUBECTL_PLUGIN_NAME: &str = "kubectl-devctl";

/// True when this binary runs as `kubectl-devctl` (a copy or symlink of `devctl` on PATH).
fn invoked_as_kubectl_plugin() -> bool {
    std::env::args_os().next().is_some_and(|arg0| {
        // `file_stem`, not `file_name`: `kubectl-devctl.exe` on Windows.
        std::path::Path::new(&arg0)
            .file_stem()
            .is_some_and(|stem| stem == KUBECTL_PLUGIN_NAME)
    })
}

/// `Cli::parse()`, except that help and usage say `kubectl devctl` when run as the kubectl
/// plugin (clap would otherwise show argv[0]'s file name, `kubectl-devctl`), and that a usage
/// error (unknown flag, invalid value, missing argument) is one line on stderr, like every other
/// error of devctl, with clap's exit code (2).
fn parse_args() -> Cli {
    let mut command = Cli::command();
    if invoked_as_kubectl_plugin() {
        command = command.bin_name("kubectl devctl");
    }
    let parsed = command
        .clone()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches));
    match parsed {
        Ok(cli) => cli,
        Err(error) => {
            let error = error.format(&mut command);
            if matches!(
                error.kind(),
                clap::error::ErrorKind::DisplayHelp
                    | clap::error::ErrorKind::DisplayVersion
                    | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                error.exit()
            }
            eprintln!("{}", one_line(&error.render().to_string()));
            std::process::exit(error.exit_code())
        }
    }
}

/// clap's error message as one line: its first paragraph (the error and what it names) and its
/// tips, without the usage block and the "For more information" hint.
fn one_line(rendered: &str) -> String {
    let mut paragraphs = rendered.split("\n\n").map(|paragraph| {
        paragraph
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    });
    let mut line = paragraphs.next().unwrap_or_default();
    for tip in paragraphs.filter(|p| p.starts_with("tip:")) {
        line.push_str(&format!(" ({tip})"));
    }
    line
}

#[tokio::main]
async fn main() -> ExitCode {
    // Output piped into `head` and closed early ends the process quietly, as it does for
    // other command-line tools, instead of a panic in println!.
    // SAFETY: signal(2) only resets the process-wide disposition of SIGPIPE; devctl installs
    // no handler of its own for it.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Silent by default: errors reach the user as one line from main (DEVCTL_LOG=debug for more).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DEVCTL_LOG")
                .unwrap_or_else(|_| "off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = parse_args();
    let global = cli.global;
    let result = match cli.command {
        Command::Operator(command) => commands::operator::run(&global, command).await,
        Command::Db(command) => commands::db::run(&global, command).await,
        Command::Webapp(command) => commands::webapp::run(&global, command).await,
        Command::Dev(command) => commands::dev::run(command).await,
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "devctl", &mut std::io::stdout());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line a user can act on: the error and its causes, outermost first.
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
