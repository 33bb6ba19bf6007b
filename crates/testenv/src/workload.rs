//! A client's view of a process-backed PostgreSQL cluster, for failover tests and benches:
//! where the `-rw` Service sends a client, and a writer that commits one row at a time
//! through it, recording which commits were acknowledged, by whom and when.
//!
//! The writer resolves `-rw` for every row as a client resolving the Service would: the
//! EndpointSlices' ready endpoints (kept by kube-controller-manager from the role labels),
//! then the address that pod's agent reports (the runner's pods have no routable IP); while
//! the API server does not answer it keeps its last answer, as a client's DNS and kube-proxy
//! do. Each
//! row is a new `psql` connection with a hard limit: the client is killed rather than told
//! to cancel, so a commit waiting for a synchronous standby is never acknowledged by a
//! timeout.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use devctl_api::instance::InstanceStatus;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;

/// How long one statement may take before the client is killed.
pub const STATEMENT_LIMIT: Duration = Duration::from_secs(4);

/// The ready pods behind the `<cluster>-rw` Service (none when the API server does not answer).
pub async fn rw_pods(client: &kube::Client, namespace: &str, cluster: &str) -> BTreeSet<String> {
    try_rw_pods(client, namespace, cluster)
        .await
        .unwrap_or_default()
}

/// [`rw_pods`], telling an API server that does not answer from a Service without endpoints.
pub async fn try_rw_pods(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
) -> Result<BTreeSet<String>, kube::Error> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let selector = format!("kubernetes.io/service-name={cluster}-rw");
    let slices = api.list(&ListParams::default().labels(&selector)).await?;
    Ok(slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|e| e.target_ref.as_ref()?.name.clone())
        .collect())
}

/// `(host, port)` from the report of `pod`'s agent.
pub async fn reported_address(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
) -> Option<(String, String)> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = api.get_opt(pod).await.ok()??;
    let report = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())?;
    let address = report.address?;
    let (host, port) = address.rsplit_once(':')?;
    Some((
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port.to_string(),
    ))
}

/// Writes a password file for `app` on any host (mode 0600) into `dir`.
pub fn app_passfile(dir: &Path, password: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("pgpass");
    std::fs::write(&path, format!("*:*:app:app:{password}\n"))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(path)
}

/// Runs one statement as `app` on database `app` at `address`, within [`STATEMENT_LIMIT`];
/// the unaligned output or the error.
pub async fn psql_at(
    passfile: &Path,
    address: &(String, String),
    sql: &str,
) -> Result<String, String> {
    let mut command = tokio::process::Command::new("psql");
    command
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGHOST", &address.0)
        .env("PGPORT", &address.1)
        .env("PGUSER", "app")
        .env("PGDATABASE", "app")
        .env("PGPASSFILE", passfile)
        .env("PGCONNECT_TIMEOUT", "2")
        .env_remove("PGPASSWORD")
        .kill_on_drop(true);
    limited(command).await
}

/// How a client logs in as `app` to database `app`: PostgreSQL with a password file
/// ([`app_passfile`]), MariaDB with the password (passed to the client in `MYSQL_PWD`).
#[derive(Clone, Debug)]
pub enum Access {
    Postgres(PathBuf),
    Mariadb(String),
}

/// [`psql_at`] for either engine: one statement as `app` at `address`, batch output.
pub async fn sql_at(
    access: &Access,
    address: &(String, String),
    sql: &str,
) -> Result<String, String> {
    let password = match access {
        Access::Postgres(passfile) => return psql_at(passfile, address, sql).await,
        Access::Mariadb(password) => password,
    };
    let mut command = tokio::process::Command::new("mariadb");
    command
        .args([
            "--no-defaults",
            "--protocol=TCP",
            "-N",
            "-B",
            "--connect-timeout=2",
        ])
        .args([
            "-h", &address.0, "-P", &address.1, "-u", "app", "-D", "app", "-e", sql,
        ])
        .env("MYSQL_PWD", password)
        .kill_on_drop(true);
    limited(command).await
}

/// Runs a client within [`STATEMENT_LIMIT`] (killed after it): its trimmed output, or its
/// error.
async fn limited(mut command: tokio::process::Command) -> Result<String, String> {
    match tokio::time::timeout(STATEMENT_LIMIT, command.output()).await {
        Ok(Ok(out)) if out.status.success() => {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
        Ok(Ok(out)) => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {STATEMENT_LIMIT:?}")),
    }
}

/// Whether the instance at `address` accepts writes now (asked directly, not through the
/// API server).
pub async fn writable(passfile: &Path, address: &(String, String)) -> bool {
    psql_at(passfile, address, "select pg_is_in_recovery()")
        .await
        .is_ok_and(|out| out == "f")
}

/// How long a probe commit may take before its instance counts as not writable (and its
/// session is replaced).
pub const PROBE_LIMIT: Duration = Duration::from_secs(1);

/// Asks one instance, over a session of its own that stays open between probes, whether it
/// acknowledges a commit: `select txid_current()` assigns a transaction id, so its commit
/// writes a commit record (and waits for synchronous standbys like any write). A standby
/// refuses it; a fenced or stopped primary does not answer. A session that fails or does not
/// answer within [`PROBE_LIMIT`] is dropped and the next probe opens a new one.
///
/// MariaDB has no transaction id to take: the probe replaces its own row of
/// [`MARIADB_PROBE_TABLE`] (made beforehand), which a read-only replica refuses.
pub struct WriteProbe {
    access: Access,
    /// The row a MariaDB probe writes.
    row: u32,
    address: (String, String),
    session: Option<ProbeSession>,
}

/// The table a MariaDB write probe writes its row to: `CREATE TABLE devctl_probe (id INT
/// PRIMARY KEY, at BIGINT)` on the primary before probing.
pub const MARIADB_PROBE_TABLE: &str = "devctl_probe";

struct ProbeSession {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl WriteProbe {
    pub fn new(passfile: &Path, address: &(String, String)) -> Self {
        Self::with(Access::Postgres(passfile.to_path_buf()), 0, address)
    }

    /// A probe of either engine (`row`: the MariaDB probe's own row).
    pub fn with(access: Access, row: u32, address: &(String, String)) -> Self {
        Self {
            access,
            row,
            address: address.clone(),
            session: None,
        }
    }

    fn open(&self) -> std::io::Result<ProbeSession> {
        use tokio::io::AsyncBufReadExt;
        let mut command = match &self.access {
            Access::Postgres(passfile) => {
                let mut command = tokio::process::Command::new("psql");
                command
                    .args(["-X", "-A", "-t", "-q"])
                    .env("PGHOST", &self.address.0)
                    .env("PGPORT", &self.address.1)
                    .env("PGUSER", "app")
                    .env("PGDATABASE", "app")
                    .env("PGPASSFILE", passfile)
                    .env("PGCONNECT_TIMEOUT", "1")
                    .env_remove("PGPASSWORD");
                command
            }
            Access::Mariadb(password) => {
                let mut command = tokio::process::Command::new("mariadb");
                command
                    .args(["--no-defaults", "--protocol=TCP", "-N", "-B", "--force"])
                    .args(["--connect-timeout=1", "-u", "app", "-D", "app"])
                    .args(["-h", &self.address.0, "-P", &self.address.1])
                    .env("MYSQL_PWD", password);
                command
            }
        };
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other("psql without pipes"));
        };
        Ok(ProbeSession {
            child,
            stdin,
            stdout: tokio::io::BufReader::new(stdout).lines(),
        })
    }

    /// Whether a probe commit is acknowledged now, within [`PROBE_LIMIT`].
    pub async fn writable(&mut self) -> bool {
        use tokio::io::AsyncWriteExt;
        if self.session.is_none() {
            self.session = self.open().ok();
        }
        let Some(session) = self.session.as_mut() else {
            return false;
        };
        let asked = async {
            let ask = match &self.access {
                Access::Postgres(_) => {
                    "select txid_current();\n\\echo devctl-probe-done\n".to_string()
                }
                Access::Mariadb(_) => format!(
                    "REPLACE INTO {MARIADB_PROBE_TABLE} VALUES ({}, UNIX_TIMESTAMP(NOW(6)) * 1000000);\nSELECT ROW_COUNT();\nSELECT 'devctl-probe-done';\n",
                    self.row
                ),
            };
            session.stdin.write_all(ask.as_bytes()).await?;
            session.stdin.flush().await?;
            let mut committed = false;
            while let Some(line) = session.stdout.next_line().await? {
                let line = line.trim();
                if line == "devctl-probe-done" {
                    return Ok::<_, std::io::Error>(committed);
                }
                // A transaction id (PostgreSQL), or rows written (MariaDB; -1 when refused).
                committed |= line.parse::<i64>().is_ok_and(|n| n >= 1);
            }
            Err(std::io::Error::other("the session ended"))
        };
        match tokio::time::timeout(PROBE_LIMIT, asked).await {
            Ok(Ok(committed)) => committed,
            _ => {
                if let Some(mut session) = self.session.take() {
                    let _ = session.child.start_kill();
                }
                false
            }
        }
    }
}

/// One acknowledged row: its value, the pod that acknowledged it and when (wall clock).
#[derive(Clone, Debug)]
pub struct Ack {
    pub value: i64,
    pub pod: String,
    pub at: SystemTime,
}

/// Commits rows `(v, pod)` into the table `t` one at a time through `-rw`, every `pause`.
pub struct Writer {
    stop: tokio::sync::watch::Sender<bool>,
    acks: Arc<Mutex<Vec<Ack>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    /// Starts writing (values from `first`) into the PostgreSQL cluster `cluster`'s table `t`.
    pub fn start(
        client: kube::Client,
        namespace: &str,
        cluster: &str,
        passfile: PathBuf,
        first: i64,
        pause: Duration,
    ) -> Self {
        Self::start_with(
            client,
            namespace,
            cluster,
            Access::Postgres(passfile),
            first,
            pause,
        )
    }

    /// Starts writing (values from `first`) into the cluster `cluster`'s table `t`.
    pub fn start_with(
        client: kube::Client,
        namespace: &str,
        cluster: &str,
        access: Access,
        first: i64,
        pause: Duration,
    ) -> Self {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let acks = Arc::new(Mutex::new(Vec::new()));
        let (namespace, cluster) = (namespace.to_string(), cluster.to_string());
        let recorded = acks.clone();
        let task = tokio::spawn(async move {
            let mut value = first;
            // A client resolving the Service keeps its last answer while the API server is
            // away (kube-proxy's rules and DNS outlive it), so the writer does too.
            let mut target: Option<String> = None;
            let mut addresses = std::collections::HashMap::<String, (String, String)>::new();
            while !*stopped.borrow() {
                if let Ok(mut pods) = try_rw_pods(&client, &namespace, &cluster).await {
                    target = pods.pop_first();
                }
                if let Some(pod) = target.clone()
                    && let Some(address) = match reported_address(&client, &namespace, &pod).await {
                        Some(address) => {
                            addresses.insert(pod.clone(), address.clone());
                            Some(address)
                        }
                        None => addresses.get(&pod).cloned(),
                    }
                {
                    let sql = format!("insert into t (v, pod) values ({value}, '{pod}')");
                    if sql_at(&access, &address, &sql).await.is_ok()
                        && let Ok(mut acks) = recorded.lock()
                    {
                        acks.push(Ack {
                            value,
                            pod,
                            at: SystemTime::now(),
                        });
                    }
                    value += 1;
                }
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stopped.changed() => {}
                }
            }
        });
        Self { stop, acks, task }
    }

    /// The rows acknowledged so far.
    pub fn acks(&self) -> Vec<Ack> {
        self.acks.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// Stops writing and returns every acknowledged row.
    pub async fn finish(self) -> Vec<Ack> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.acks.lock().map(|a| a.clone()).unwrap_or_default()
    }
}
