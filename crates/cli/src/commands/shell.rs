//! `devctl db shell`: the engine's own client (`psql`, `mariadb`/`mysql`), logged in as the
//! app user, against the primary or a named instance.
//!
//! The password goes through a private file the client reads (`PGPASSFILE`, MySQL's
//! `--defaults-extra-file`), never through argv or the environment. The address is the one the
//! instance's agent reports when this machine reaches it (the local process runner of
//! `devctl dev up`), else a port-forward through the API server (a real cluster).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use devctl_api::database_cluster::{DatabaseCluster, Engine};
use devctl_api::instance::{InstanceStatus, ROLE_PRIMARY};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use tokio::net::TcpListener;

use crate::cluster::{self, Connection};

/// How the client reaches the instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The instance's reported address when this machine reaches it, else a port-forward.
    Nearest,
    /// Always a port-forward through the API server (`--port-forward`).
    PortForward,
}

/// What to connect to and as whom.
struct Target {
    host: String,
    port: u16,
    user: String,
    password: String,
    database: String,
}

pub async fn shell(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
    instance: Option<&str>,
    route: Route,
    args: &[String],
) -> anyhow::Result<i32> {
    let db = api.get(name).await.map_err(|e| {
        cluster::explain(
            e,
            &format!("reading databasecluster {name}"),
            &connection.server,
        )
    })?;
    let pod_name = match instance {
        Some(pod) => pod.to_string(),
        None => primary(&db).ok_or_else(|| {
            anyhow::anyhow!(
                "databasecluster {name} has no primary instance yet (see `devctl db status {name}`)"
            )
        })?,
    };
    let pods: Api<Pod> = Api::namespaced(connection.client.clone(), &connection.namespace);
    let pod = pods
        .get(&pod_name)
        .await
        .map_err(|e| cluster::explain(e, &format!("reading pod {pod_name}"), &connection.server))?;
    if instance.is_some() && !belongs_to(&pod, name) {
        anyhow::bail!("pod {pod_name} is not an instance of databasecluster {name}");
    }
    let secret_name = db
        .status
        .as_ref()
        .and_then(|s| s.connection_secret_name.clone())
        .unwrap_or_else(|| format!("{name}-credentials"));
    let secrets: Api<Secret> = Api::namespaced(connection.client.clone(), &connection.namespace);
    let secret = secrets.get(&secret_name).await.map_err(|e| {
        cluster::explain(
            e,
            &format!("reading secret {secret_name}"),
            &connection.server,
        )
    })?;
    let field = |key: &str| -> anyhow::Result<String> {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).to_string())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| anyhow::anyhow!("secret {secret_name} has no {key:?}"))
    };
    let engine_port = u16::try_from(db.spec.port())
        .with_context(|| format!("databasecluster {name} has an invalid port"))?;
    let reported = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())
        .filter(|_| route == Route::Nearest)
        .and_then(|r| r.address)
        .and_then(|a| {
            let (host, port) = a.rsplit_once(':')?;
            Some((host.to_string(), port.parse::<u16>().ok()?))
        });
    let (host, port, _forward) = match reported {
        Some((host, port)) if reachable(&host, port).await => (host, port, None),
        _ => {
            let (port, forward) = port_forward(pods, pod_name.clone(), engine_port).await?;
            ("127.0.0.1".to_string(), port, Some(forward))
        }
    };
    let target = Target {
        host,
        port,
        user: field("username")?,
        password: field("password")?,
        database: field("dbname")?,
    };
    let dir = tempfile_dir()?;
    let status = match db.spec.engine {
        Engine::Postgres => run_psql(&target, dir.path(), args).await?,
        Engine::Mysql | Engine::Mariadb => run_mysql(&target, dir.path(), args).await?,
    };
    Ok(status.code().unwrap_or(1))
}

/// The primary's pod: `status.currentPrimary` (the operator's word, as for the `-rw`
/// Service), else the instance whose agent reports the primary role.
fn primary(db: &DatabaseCluster) -> Option<String> {
    let status = db.status.as_ref()?;
    status.current_primary.clone().or_else(|| {
        status
            .instances
            .iter()
            .find(|i| i.role.as_deref() == Some(ROLE_PRIMARY))
            .map(|i| i.name.clone())
    })
}

fn belongs_to(pod: &Pod, cluster: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(devctl_api::labels::INSTANCE))
        .is_some_and(|i| i == cluster)
}

async fn reachable(host: &str, port: u16) -> bool {
    matches!(
        tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect((host, port))
        )
        .await,
        Ok(Ok(_))
    )
}

/// Forwards a local port to `port` of the pod through the API server, one stream per
/// connection, for as long as the returned task runs.
async fn port_forward(
    pods: Api<Pod>,
    pod: String,
    port: u16,
) -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding a local port for the port-forward")?;
    let local = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let pods = pods.clone();
            let pod = pod.clone();
            tokio::spawn(async move {
                let mut forwarder = match pods.portforward(&pod, &[port]).await {
                    Ok(f) => f,
                    Err(error) => {
                        eprintln!("error: port-forward to pod {pod}: {error}");
                        return;
                    }
                };
                if let Some(mut upstream) = forwarder.take_stream(port) {
                    let _ = tokio::io::copy_bidirectional(&mut socket, &mut upstream).await;
                }
            });
        }
    });
    Ok((local, task))
}

fn tempfile_dir() -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("devctl-shell-")
        .tempdir()
        .context("creating a private directory for the client's password file")
}

/// Writes `content` to a file only the current user can read.
fn private_file(path: &Path, content: &str) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(content.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// A `.pgpass` field: `:` and `\` escaped.
fn pgpass_field(value: &str) -> String {
    value.replace('\\', "\\\\").replace(':', "\\:")
}

async fn run_psql(
    target: &Target,
    dir: &Path,
    args: &[String],
) -> anyhow::Result<std::process::ExitStatus> {
    let passfile = dir.join("pgpass");
    private_file(
        &passfile,
        &format!(
            "{}:{}:{}:{}:{}\n",
            pgpass_field(&target.host),
            target.port,
            pgpass_field(&target.database),
            pgpass_field(&target.user),
            pgpass_field(&target.password)
        ),
    )?;
    let mut command = tokio::process::Command::new("psql");
    command
        .env("PGHOST", &target.host)
        .env("PGPORT", target.port.to_string())
        .env("PGUSER", &target.user)
        .env("PGDATABASE", &target.database)
        .env("PGPASSFILE", &passfile)
        .env_remove("PGPASSWORD")
        .args(args);
    command
        .status()
        .await
        .context("running psql (is the PostgreSQL client installed?)")
}

/// `psql`'s `-c SQL` / `--command=SQL` spelled the way MySQL's clients take it (`-e`), so
/// `devctl db shell NAME -- -c 'select 1'` works whatever the engine.
fn mysql_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "-c" || arg == "--command" {
            out.push("-e".to_string());
            if let Some(sql) = iter.next() {
                out.push(sql.clone());
            }
        } else if let Some(sql) = arg.strip_prefix("--command=") {
            out.push(format!("--execute={sql}"));
        } else {
            out.push(arg.clone());
        }
    }
    out
}

/// A MySQL option-file value in double quotes, with `\` and `"` escaped.
fn option_value(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

async fn run_mysql(
    target: &Target,
    dir: &Path,
    args: &[String],
) -> anyhow::Result<std::process::ExitStatus> {
    let options = dir.join("client.cnf");
    private_file(
        &options,
        &format!(
            "[client]\nhost={}\nport={}\nuser={}\npassword={}\ndatabase={}\nprotocol=TCP\n",
            option_value(&target.host),
            target.port,
            option_value(&target.user),
            option_value(&target.password),
            option_value(&target.database)
        ),
    )?;
    let client = ["mariadb", "mysql"]
        .into_iter()
        .find(|c| on_path(c))
        .ok_or_else(|| anyhow::anyhow!("neither `mariadb` nor `mysql` client is installed"))?;
    let mut command = tokio::process::Command::new(client);
    // `--defaults-extra-file` must come first.
    command
        .arg(format!("--defaults-extra-file={}", options.display()))
        .args(mysql_args(args))
        .env_remove("MYSQL_PWD");
    command
        .status()
        .await
        .with_context(|| format!("running {client}"))
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psql_command_flags_become_mysql_execute_flags() {
        let args: Vec<String> = ["-c", "select 1", "--command=select 2", "-N"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            mysql_args(&args),
            ["-e", "select 1", "--execute=select 2", "-N"]
        );
    }

    #[test]
    fn passfile_fields_are_escaped() {
        assert_eq!(pgpass_field(r"a:b\c"), r"a\:b\\c");
        assert_eq!(option_value(r#"p"w\"#), r#""p\"w\\""#);
    }
}
