//! `devctl db create|list|status|shell|promote|backup|restore|credentials|delete`: the clap
//! definitions and their dispatch, one file per subcommand (`shell` is in `commands::shell`).

mod backup;
mod create;
mod credentials;
mod delete;
mod list;
mod pods_and_events;
mod promote;
mod restore;
mod status;

use std::time::Duration;

use clap::Subcommand;
use devctl_api::conditions;
use devctl_api::database_cluster::DatabaseCluster;
use kube::api::Api;

pub use self::pods_and_events::{pods_and_events, print_pods_and_events};
use crate::cluster::{self, Connection, GlobalArgs};

#[derive(Subcommand)]
pub enum DbCommand {
    /// Create a database cluster.
    Create {
        name: String,
        /// Database engine: postgres, mariadb (replicated), or mysql (one instance).
        #[arg(long, value_enum, default_value_t = EngineArg::Postgres)]
        engine: EngineArg,
        /// Engine version as major.minor, e.g. 16.2.
        #[arg(long)]
        version: String,
        /// Number of instances (1-7).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=7))]
        replicas: i32,
        /// Volume size per instance, e.g. 10Gi.
        #[arg(long, default_value = "10Gi")]
        storage: String,
        /// Storage class (the cluster's default when unset).
        #[arg(long)]
        storage_class: Option<String>,
        /// Wait until the cluster is Ready.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "5m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
    /// List database clusters.
    List {
        /// List across all namespaces.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Show a cluster's phase, conditions, endpoints, pods and recent events.
    Status { name: String },
    /// Open the engine's client (psql, mariadb) as the app user on the primary, or on the
    /// instance named by --instance. Arguments after `--` go to the client; `-c SQL` runs one
    /// statement with either engine.
    Shell {
        name: String,
        /// The pod of the instance to connect to (default: the primary).
        #[arg(long)]
        instance: Option<String>,
        /// Connect through a port-forward via the API server even when this machine reaches
        /// the instance's address (as `kubectl port-forward` does).
        #[arg(long)]
        port_forward: bool,
        /// Arguments for the client, after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Switch the primary to another instance (a planned switchover: the primary
    /// checkpoints and stops, the target promotes once it has all of its WAL, nothing is
    /// lost; the old primary rejoins as a standby). When the primary is lost, a failover to
    /// POD instead: at once when its lock expired with automatic failover off; with --force
    /// when no lock proves it (high availability off) and it does not serve.
    Promote {
        name: String,
        /// The pod of the replica to promote, e.g. NAME-1.
        pod: String,
        /// Allow a failover to POD when the primary does not serve and no primary lock proves
        /// it lost (without high availability): what the primary had not sent to POD is lost.
        #[arg(long)]
        force: bool,
        /// Wait until POD is the primary and the cluster is Ready.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "5m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
    /// Back a cluster up now: creates a DatabaseBackup NAME-<time> and, with --wait, follows
    /// it to Completed (exit 1 when it fails).
    Backup {
        name: String,
        /// Which instance: a streaming `replica` (the default when one streams) or the
        /// `primary`.
        #[arg(long, value_enum)]
        target: Option<TargetArg>,
        /// Wait until the backup completes or fails.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "30m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
    /// Restore a backup into a NEW cluster (never over a running one), optionally to a point
    /// in time (PostgreSQL). The new cluster copies the source cluster's spec when it exists.
    Restore {
        /// The new cluster's name.
        name: String,
        /// The DatabaseBackup to restore.
        #[arg(long)]
        from: String,
        /// Replay WAL up to this time (RFC 3339, e.g. 2026-11-30T12:00:00Z).
        #[arg(long)]
        to: Option<String>,
        /// Wait until the new cluster is Ready.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "30m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
    /// Show how to connect (password masked unless --show-password).
    Credentials {
        name: String,
        #[arg(long)]
        show_password: bool,
    },
    /// Delete a database cluster with its volumes (--keep-volumes keeps its data).
    Delete {
        name: String,
        /// Keep the cluster's PersistentVolumeClaims (its data) after it is gone: sets the
        /// db.devctl.io/keep-volumes annotation before deleting.
        #[arg(long)]
        keep_volumes: bool,
        /// Wait until it is gone.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "5m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum TargetArg {
    Replica,
    Primary,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum EngineArg {
    Postgres,
    Mariadb,
    Mysql,
}

pub async fn run(global: &GlobalArgs, command: DbCommand) -> anyhow::Result<()> {
    let connection = cluster::connect(global).await?;
    let api: Api<DatabaseCluster> =
        Api::namespaced(connection.client.clone(), &connection.namespace);
    match command {
        DbCommand::Create {
            name,
            engine,
            version,
            replicas,
            storage,
            storage_class,
            wait,
            timeout,
        } => {
            create::create(
                &connection,
                &api,
                name,
                engine,
                version,
                replicas,
                storage,
                storage_class,
                wait,
                timeout,
            )
            .await
        }
        DbCommand::List { all_namespaces } => list::list(global, &connection, all_namespaces).await,
        DbCommand::Status { name } => status::status(global, &connection, &api, &name).await,
        DbCommand::Shell {
            name,
            instance,
            port_forward,
            args,
        } => {
            let route = if port_forward {
                super::shell::Route::PortForward
            } else {
                super::shell::Route::Nearest
            };
            let code =
                super::shell::shell(&connection, &api, &name, instance.as_deref(), route, &args)
                    .await?;
            if code != 0 {
                // The client's own exit code, after its password file is gone.
                std::process::exit(code);
            }
            Ok(())
        }
        DbCommand::Promote {
            name,
            pod,
            force,
            wait,
            timeout,
        } => promote::promote(&connection, &api, &name, &pod, force, wait, timeout).await,
        DbCommand::Credentials {
            name,
            show_password,
        } => credentials::credentials(global, &connection, &api, &name, show_password).await,
        DbCommand::Backup {
            name,
            target,
            wait,
            timeout,
        } => backup::backup(&connection, &api, &name, target, wait, timeout).await,
        DbCommand::Restore {
            name,
            from,
            to,
            wait,
            timeout,
        } => {
            restore::restore(
                &connection,
                &api,
                &name,
                &from,
                to.as_deref(),
                wait,
                timeout,
            )
            .await
        }
        DbCommand::Delete {
            name,
            keep_volumes,
            wait,
            timeout,
        } => delete::delete(&connection, &api, name, keep_volumes, wait, timeout).await,
    }
}

fn progress(db: Option<&DatabaseCluster>) -> String {
    let Some(db) = db else {
        return "not found".into();
    };
    let status = db.status.clone().unwrap_or_default();
    let ready = conditions::find(&status.conditions, conditions::READY);
    format!(
        "phase {}, {}/{} ready{}",
        status.phase.map(|p| p.as_str()).unwrap_or("Pending"),
        status.ready_replicas,
        db.spec.replicas,
        ready
            .map(|c| format!(" — {}: {}", c.reason, c.message))
            .unwrap_or_default()
    )
}

fn is_ready(db: Option<&DatabaseCluster>) -> bool {
    db.and_then(|d| d.status.as_ref()).is_some_and(|s| {
        conditions::find(&s.conditions, conditions::READY)
            .is_some_and(|c| c.status == conditions::TRUE)
    }) && db.is_some_and(|d| {
        d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
    })
}

async fn get(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
) -> anyhow::Result<DatabaseCluster> {
    match api.get_opt(name).await {
        Ok(Some(db)) => Ok(db),
        Ok(None) => anyhow::bail!(
            "databasecluster {name} not found in namespace {}",
            connection.namespace
        ),
        Err(e) => Err(cluster::explain(
            e,
            &format!("reading databasecluster {name}"),
            &connection.server,
        )),
    }
}
