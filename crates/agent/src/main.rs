//! `devctl-agent`; see the library docs for commands and exit codes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use devctl_agent::error::{EXIT_INTERNAL, EXIT_USAGE};

/// The entrypoint of every devctl database pod: bootstraps, runs, supervises and reports on
/// the database engine. Configured by environment variables (DEVCTL_ENGINE, ...).
#[derive(Parser, Debug)]
#[command(name = "devctl-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the instance described by the environment (the default).
    Run,
    /// Copy this executable to <DIR>/devctl-agent (mode 0755) and exit.
    Install {
        /// Target directory (created if missing).
        dir: PathBuf,
    },
    /// PostgreSQL's archive_command: have the running agent archive a WAL file (exit 0
    /// once stored, or when archiving is off; 1 otherwise).
    WalPush {
        /// The file (%p), relative to the working directory or absolute.
        path: String,
    },
    /// PostgreSQL major upgrade of a stopped data directory with pg_upgrade (the step the
    /// operator runs on the primary's volume). Prints one JSON line: {"result": "Checked" |
    /// "Upgraded" | "AlreadyDone" | "Refused" | "Failed", "message", "oldIntact"}; exit 0
    /// when it checked or upgraded, 1 otherwise.
    Upgrade(devctl_agent::major_upgrade::Request),
    /// The init container of a PostgreSQL pod: during a major upgrade (status.majorUpgrade)
    /// upgrades the named instance's data directory and records the result on its pod;
    /// elsewhere exits at once. Configured by the environment, like `run`.
    MajorUpgrade,
    /// PostgreSQL's restore_command during a restore: have the running agent fetch an
    /// archived file (exit 0 when in place, 1 when the archive has no such file, 126 when
    /// the archive cannot be read).
    WalFetch {
        /// A standby's fallback (its `restore_command`): fetch from the cluster's own
        /// archive, and answer 1 — try streaming again — whenever the archive cannot help.
        #[arg(long)]
        standby: bool,
        /// The archived file's name (%f).
        name: String,
        /// Where to put it (%p).
        path: String,
    },
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// A single-threaded runtime, or `None` (said on stderr).
fn current_thread_runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime),
        Err(e) => {
            eprintln!("devctl-agent: cannot start the async runtime: {e}");
            None
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help / --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.to_string();
            let line = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("devctl-agent: {}", line.trim_start_matches("error: "));
            return exit(EXIT_USAGE);
        }
    };
    match cli.command.unwrap_or(Command::Run) {
        // Run by PostgreSQL: no log setup (stderr goes to the server's log), no runtime.
        Command::WalPush { path } => exit(devctl_agent::archive::wal_push(&path)),
        Command::WalFetch {
            standby,
            name,
            path,
        } => exit(devctl_agent::archive::wal_fetch(&name, &path, standby)),
        Command::Upgrade(request) => {
            let Some(runtime) = current_thread_runtime() else {
                return exit(EXIT_INTERNAL);
            };
            let (code, line) = runtime.block_on(devctl_agent::major_upgrade::run_command(request));
            println!("{line}");
            exit(code)
        }
        Command::MajorUpgrade => {
            let Some(runtime) = current_thread_runtime() else {
                return exit(EXIT_INTERNAL);
            };
            exit(runtime.block_on(devctl_agent::upgrade_step::run_from_env()))
        }
        Command::Install { dir } => match devctl_agent::install(&dir) {
            Ok(target) => {
                println!("installed {}", target.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("devctl-agent: {}", e.one_line());
                exit(e.exit_code())
            }
        },
        Command::Run => {
            devctl_agent::store::install_crypto_provider();
            tracing_subscriber::fmt()
                .with_writer(std::io::stdout)
                .with_ansi(false)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            // One thread: the engine's PR_SET_PDEATHSIG is tied to the thread that forked it,
            // which must live as long as the agent.
            let Some(runtime) = current_thread_runtime() else {
                return exit(EXIT_INTERNAL);
            };
            exit(runtime.block_on(devctl_agent::run_from_env()))
        }
    }
}
