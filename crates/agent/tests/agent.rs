//! The real `devctl-agent` binary against a real control plane (devctl-testenv) and real
//! engines (Debian's PostgreSQL and MariaDB, installed by tools/install-prerequisites.sh).
//! As root, the agent runs as the `postgres`/`mysql` system user, like in an image.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use devctl_api::database_cluster::{DatabaseCluster, DatabaseClusterSpec};
use devctl_api::instance::{InstanceStatus, STATUS_ANNOTATION, env};
use devctl_testenv::watch::Since;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

const TIMEOUT: Duration = Duration::from_secs(60);
const AGENT: &str = env!("CARGO_BIN_EXE_devctl-agent");

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// (uid, gid) of a system user.
fn user_ids(name: &str) -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let line = passwd
        .lines()
        .find(|l| l.split(':').next() == Some(name))
        .unwrap_or_else(|| panic!("no system user {name}: run tools/install-prerequisites.sh"));
    let fields: Vec<&str> = line.split(':').collect();
    (fields[2].parse().unwrap(), fields[3].parse().unwrap())
}

fn free_port() -> u16 {
    devctl_testenv::process::free_port().unwrap()
}

fn postgres_bin_dir() -> PathBuf {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed: run tools/install-prerequisites.sh")
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .collect();
    dirs.sort();
    dirs.pop().expect("no /usr/lib/postgresql/<version>/bin").1
}

/// A private file (mode 0600) holding a secret for a client.
fn private_file(path: &Path, content: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    file.write_all(content.as_bytes()).unwrap();
}

/// One instance's directories, ports and environment.
struct Instance {
    client: kube::Client,
    dir: tempfile::TempDir,
    engine: &'static str,
    user: Option<(u32, u32)>,
    namespace: String,
    pod: String,
    pod_uid: String,
    secret: String,
    port: u16,
    health_port: u16,
    runs: u32,
}

/// A namespace with the DatabaseCluster `db` (CRDs installed), whose
/// `status.currentPrimary` is `current_primary` when given.
async fn namespace_with_cluster(
    prefix: &str,
    current_primary: Option<&str>,
) -> (kube::Client, String) {
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let client = cluster.client().await.unwrap();
    let namespace = cluster.create_namespace(prefix).await.unwrap();
    let api: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let object: DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "db" },
        "spec": {
            "engine": "postgres", "version": "16.2", "replicas": 2,
            "storage": { "size": "1Gi" }
        }
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
    if let Some(primary) = current_primary {
        set_current_primary(&client, &namespace, primary).await;
    }
    (client, namespace)
}

/// Writes `status.currentPrimary` (what the operator does) and checks it was kept.
async fn set_current_primary(client: &kube::Client, namespace: &str, primary: &str) {
    let api: Api<DatabaseCluster> = Api::namespaced(client.clone(), namespace);
    let patched = api
        .patch_status(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "currentPrimary": primary } })),
        )
        .await
        .unwrap();
    let written = serde_json::to_value(&patched).unwrap();
    assert_eq!(
        written["status"]["currentPrimary"], primary,
        "the API server dropped status.currentPrimary (is the CRD current?)"
    );
}

impl Instance {
    /// Creates the namespace (with the DatabaseCluster `db` naming `db-0` its primary), the
    /// pod (without annotations unless `annotations`) and the directories; the Secret is up
    /// to the test.
    async fn new(engine: &'static str, annotations: Option<BTreeMap<String, String>>) -> Self {
        let (client, namespace) = namespace_with_cluster("agent", Some("db-0")).await;
        Self::in_namespace(client, namespace, "db-0", engine, annotations).await
    }

    /// The pod `pod` in `namespace` and the directories of its instance.
    async fn in_namespace(
        client: kube::Client,
        namespace: String,
        pod_name: &str,
        engine: &'static str,
        annotations: Option<BTreeMap<String, String>>,
    ) -> Self {
        let cluster = devctl_testenv::shared_cluster().await.unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": pod_name, "annotations": annotations },
            "spec": {
                "nodeName": cluster.nodes()[0],
                "containers": [{ "name": "database", "image": "devctl/database:test" }]
            }
        }))
        .unwrap();
        let pod = pods.create(&PostParams::default(), &pod).await.unwrap();

        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let user = is_root().then(|| {
            user_ids(if engine == "postgres" {
                "postgres"
            } else {
                "mysql"
            })
        });
        // The agent's own tree (it creates data/ and run/ itself).
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let conf = dir.path().join("conf");
        std::fs::create_dir(&conf).unwrap();
        let spec: DatabaseClusterSpec = serde_json::from_value(json!({
            "engine": engine, "version": "16.2", "replicas": 1, "storage": { "size": "1Gi" },
            "resources": { "requests": { "memory": "512Mi" } }
        }))
        .unwrap();
        for (file, content) in devctl_operator::engine::render(&spec) {
            std::fs::write(conf.join(file), content).unwrap();
        }
        let kubeconfig = home.join("kubeconfig");
        devctl_testenv::kubeconfig::write(&cluster.admin_kubeconfig().unwrap(), &kubeconfig)
            .unwrap();
        if let Some((uid, gid)) = user {
            for path in [&home, &kubeconfig] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
            }
        }
        Instance {
            client,
            dir,
            engine,
            user,
            namespace,
            pod: pod_name.into(),
            pod_uid: pod.metadata.uid.unwrap(),
            secret: "db-credentials".into(),
            port: free_port(),
            health_port: free_port(),
            runs: 0,
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn data_dir(&self) -> PathBuf {
        self.home().join("data")
    }

    fn env(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            (env::ENGINE, self.engine.to_string()),
            (env::CLUSTER, "db".to_string()),
            (env::CREDENTIALS_SECRET, self.secret.clone()),
            (env::POD_NAME, self.pod.clone()),
            (env::POD_NAMESPACE, self.namespace.clone()),
            (env::POD_UID, self.pod_uid.clone()),
            (env::POD_IP, "127.0.0.1".to_string()),
            (env::DATA_DIR, self.data_dir().display().to_string()),
            (
                env::CONFIG_DIR,
                self.dir.path().join("conf").display().to_string(),
            ),
            (env::RUN_DIR, self.home().join("run").display().to_string()),
            (env::PORT, self.port.to_string()),
            (env::LISTEN_ADDRESS, "127.0.0.1".to_string()),
            (env::HEALTH_PORT, self.health_port.to_string()),
        ])
    }

    /// Starts the agent with `env` (see [`Instance::env`]).
    fn start_with(&mut self, env: BTreeMap<&'static str, String>) -> Agent {
        self.runs += 1;
        let stdout = self.dir.path().join(format!("agent-{}.out", self.runs));
        let stderr = self.dir.path().join(format!("agent-{}.err", self.runs));
        let mut command = Command::new(AGENT);
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("KUBECONFIG", self.home().join("kubeconfig"))
            .env("HOME", self.home())
            .env("RUST_LOG", "info")
            .envs(env)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .kill_on_drop(true);
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        Agent {
            child: command.spawn().unwrap(),
            stdout,
            stderr,
        }
    }

    fn start(&mut self) -> Agent {
        let env = self.env();
        self.start_with(env)
    }

    async fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates or replaces the credentials Secret's password; returns its resourceVersion.
    async fn set_password(&self, password: &str) -> String {
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": self.secret },
            "stringData": { "username": "app", "password": password, "dbname": "app" }
        }))
        .unwrap();
        let params = PatchParams::apply("agent-test").force();
        let applied = self
            .secrets()
            .await
            .patch(&self.secret, &params, &Patch::Apply(&secret))
            .await
            .unwrap();
        applied.metadata.resource_version.unwrap()
    }

    /// The raw annotation, if any.
    async fn annotation(&self) -> Option<String> {
        let pod = self.pods().await.get(&self.pod).await.unwrap();
        pod.metadata.annotations?.get(STATUS_ANNOTATION).cloned()
    }

    /// Waits until a report satisfies `check`. Watches the pod from the version it read, so a
    /// report that stands only briefly (a crash the agent recovers from a second later) is
    /// seen however slow the test's own requests are.
    async fn wait_for_report(
        &self,
        what: &str,
        agent: &mut Agent,
        check: impl Fn(&InstanceStatus) -> bool,
    ) -> InstanceStatus {
        self.wait_for_report_within(TIMEOUT, what, agent, check)
            .await
    }

    /// [`Instance::wait_for_report`] with a given timeout.
    async fn wait_for_report_within(
        &self,
        timeout: Duration,
        what: &str,
        agent: &mut Agent,
        check: impl Fn(&InstanceStatus) -> bool,
    ) -> InstanceStatus {
        let report_of = |pod: &Pod| {
            pod.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(STATUS_ANNOTATION))
                .and_then(|r| serde_json::from_str::<InstanceStatus>(r).ok())
                .filter(|status| check(status))
        };
        let pods = self.pods().await;
        let pod = pods.get(&self.pod).await.unwrap();
        if let Some(status) = report_of(&pod) {
            return status;
        }
        let since = Since::after(&pods, &pod);
        let wait = since.until(what, timeout, |pod| report_of(pod).is_some());
        let mut wait = std::pin::pin!(wait);
        loop {
            tokio::select! {
                found = &mut wait => match found.map(|pod| report_of(&pod)) {
                    Ok(Some(status)) => return status,
                    other => panic!(
                        "{other:?}; report {:?}\n{}",
                        self.annotation().await,
                        agent.logs()
                    ),
                },
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    if let Ok(Some(code)) = agent.child.try_wait() {
                        panic!(
                            "agent exited ({code}) while waiting for {what}; report {:?}\n{}",
                            self.annotation().await,
                            agent.logs()
                        );
                    }
                }
            }
        }
    }

    /// A login as `app` over TCP with `password` (in a 0600 passfile/option file, never in
    /// argv or the environment); Ok(output) or Err(client error).
    async fn login(&self, password: &str) -> Result<String, String> {
        let n = self.runs + rand_suffix();
        let (program, args, envs): (PathBuf, Vec<String>, Vec<(&str, PathBuf)>) =
            if self.engine == "postgres" {
                let passfile = self.dir.path().join(format!("pgpass-{n}"));
                private_file(
                    &passfile,
                    &format!("127.0.0.1:{}:app:app:{password}\n", self.port),
                );
                (
                    postgres_bin_dir().join("psql"),
                    [
                        "-X",
                        "-w",
                        "-A",
                        "-t",
                        "-h",
                        "127.0.0.1",
                        "-U",
                        "app",
                        "-d",
                        "app",
                        "-c",
                        "SELECT current_user",
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .chain(["-p".to_string(), self.port.to_string()])
                    .collect(),
                    vec![("PGPASSFILE", passfile)],
                )
            } else {
                let options = self.dir.path().join(format!("my-{n}.cnf"));
                private_file(&options, &format!("[client]\npassword=\"{password}\"\n"));
                (
                    PathBuf::from("mariadb"),
                    vec![
                        format!("--defaults-extra-file={}", options.display()),
                        "--protocol=tcp".into(),
                        "-h".into(),
                        "127.0.0.1".into(),
                        format!("--port={}", self.port),
                        "-u".into(),
                        "app".into(),
                        "-D".into(),
                        "app".into(),
                        "-N".into(),
                        "-B".into(),
                        "-e".into(),
                        "SELECT SUBSTRING_INDEX(CURRENT_USER(), '@', 1)".into(),
                    ],
                    vec![],
                )
            };
        let output = Command::new(program)
            .args(args)
            .envs(envs)
            .env_remove("PGPASSWORD")
            .env("PGCONNECT_TIMEOUT", "5")
            .output()
            .await
            .unwrap();
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).to_string())
        }
    }

    /// Waits until `password` logs in and `old` (if any) does not.
    async fn wait_for_login(&self, password: &str, old: Option<&str>) {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let new = self.login(password).await;
            let refused = match old {
                Some(old) => self.login(old).await.is_err(),
                None => true,
            };
            if new.as_deref() == Ok("app") && refused {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {TIMEOUT:?} waiting for the new password to log in ({new:?}) and the old one to be refused ({refused})"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Processes whose command line mentions this instance's data directory.
    fn engine_processes(&self) -> Vec<u32> {
        let data = self.data_dir().display().to_string();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                (cmdline.contains(&data) && pid != std::process::id()).then_some(pid)
            })
            .collect()
    }
}

fn rand_suffix() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(1000);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A running agent, killed (with its engine, through PR_SET_PDEATHSIG) if the test fails.
struct Agent {
    child: tokio::process::Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Agent {
    fn logs(&self) -> String {
        format!(
            "--- agent stdout ---\n{}\n--- agent stderr ---\n{}",
            std::fs::read_to_string(&self.stdout).unwrap_or_default(),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for the agent to exit on its own.
    async fn exit_code(&mut self) -> i32 {
        match tokio::time::timeout(TIMEOUT, self.child.wait()).await {
            Ok(status) => status.unwrap().code().unwrap_or(-1),
            Err(_) => panic!("the agent did not exit within {TIMEOUT:?}\n{}", self.logs()),
        }
    }

    /// SIGTERM, then the exit code.
    async fn terminate(&mut self) -> i32 {
        let pid = self.child.id().expect("agent already reaped");
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        self.exit_code().await
    }

    /// Fails if any output or report holds one of `passwords`.
    fn assert_no_secrets(&self, passwords: &[&str]) {
        let logs = self.logs();
        for password in passwords {
            assert!(
                !logs.contains(password),
                "the agent's output holds a password:\n{logs}"
            );
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Status code of `GET path` on the agent's health port.
async fn http_status(port: u16, path: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse()
        .unwrap()
}

fn assert_no_password_in(report: &str, passwords: &[&str]) {
    for password in passwords {
        assert!(
            !report.contains(password),
            "the report holds a password: {report}"
        );
    }
}

#[tokio::test]
async fn postgres_bootstraps_serves_app_rotates_password_and_restarts_on_the_same_data() {
    let mut instance = Instance::new("postgres", None).await;
    let (first, second) = ("first-Password-1", "second-Password-2");
    let version = instance.set_password(first).await;

    let mut agent = instance.start();
    let status = instance
        .wait_for_report("PostgreSQL to be ready", &mut agent, |s| {
            s.ready && s.credentials_version.as_deref() == Some(version.as_str())
        })
        .await;
    let system_identifier = status
        .system_identifier
        .clone()
        .expect("a systemIdentifier");
    assert_eq!(status.role.as_deref(), Some("primary"));
    assert_eq!(status.timeline, Some(1));
    assert!(
        status
            .engine_version
            .as_deref()
            .is_some_and(|v| v.starts_with("15.")),
        "{status:?}"
    );
    assert_eq!(status.address, Some(format!("127.0.0.1:{}", instance.port)));
    assert_eq!(
        (status.received_lsn, status.lag_bytes, status.last_error),
        (None, None, None)
    );
    assert!(status.heartbeat.is_some());
    assert_eq!(http_status(instance.health_port, "/healthz").await, 200);
    assert_eq!(http_status(instance.health_port, "/readyz").await, 200);
    let mode = std::fs::metadata(instance.data_dir())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);

    assert_eq!(instance.login(first).await, Ok("app".to_string()));
    let wrong = instance.login("not-the-password").await.unwrap_err();
    assert!(wrong.contains("password authentication failed"), "{wrong}");

    // A new password in the Secret: the new one logs in, the old one no longer does.
    let version = instance.set_password(second).await;
    instance
        .wait_for_report("the new credentials to be applied", &mut agent, |s| {
            s.ready && s.credentials_version.as_deref() == Some(version.as_str())
        })
        .await;
    instance.wait_for_login(second, Some(first)).await;

    // An invalid password while running: reported, the old one stays.
    instance.set_password("").await;
    instance
        .wait_for_report("the empty password to be reported", &mut agent, |s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("key password is empty"))
        })
        .await;
    assert_eq!(instance.login(second).await, Ok("app".to_string()));

    // The engine dies while the Secret is still invalid: the crash is what is reported (it
    // outranks the older complaint), then it restarts, ready again on the same data.
    let postmaster: i32 = std::fs::read_to_string(instance.data_dir().join("postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(postmaster, libc::SIGKILL) };
    let crash = instance
        .wait_for_report("the crash to be reported", &mut agent, |s| {
            !s.ready
                && s.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("postgres exited"))
        })
        .await;
    // Killed, the engine logged nothing about why: the earlier failed logins are not the reason.
    let crash = crash.last_error.unwrap_or_default();
    assert!(crash.contains("SIGKILL"), "{crash}");
    assert!(!crash.contains("authentication"), "{crash}");
    let version = instance.set_password(second).await;
    let status = instance
        .wait_for_report(
            "PostgreSQL to be ready after the restart",
            &mut agent,
            |s| {
                s.ready
                    && s.last_error.is_none()
                    && s.credentials_version.as_deref() == Some(version.as_str())
            },
        )
        .await;
    assert_eq!(
        status.system_identifier.as_deref(),
        Some(system_identifier.as_str())
    );
    // Healed, but not forgotten: the report still counts the restart and says how it exited.
    assert_eq!(status.restarts, Some(1), "{status:?}");
    assert!(
        status
            .last_exit
            .as_deref()
            .is_some_and(|e| e.contains("SIGKILL")),
        "{status:?}"
    );
    assert!(status.last_restart_time.is_some(), "{status:?}");
    assert_eq!(instance.login(second).await, Ok("app".to_string()));

    assert!(!instance.engine_processes().is_empty());
    assert_eq!(
        instance.terminate_and_check(&mut agent).await,
        0,
        "{}",
        agent.logs()
    );
    agent.assert_no_secrets(&[first, second]);

    // Same data again: same system identifier, same password.
    let mut agent = instance.start();
    let status = instance
        .wait_for_report("PostgreSQL to be ready again", &mut agent, |s| {
            s.ready
                && s.heartbeat.is_some()
                && s.credentials_version.as_deref() == Some(version.as_str())
        })
        .await;
    assert_eq!(
        status.system_identifier.as_deref(),
        Some(system_identifier.as_str())
    );
    assert_eq!(instance.login(second).await, Ok("app".to_string()));
    assert!(!agent.stdout_contains("bootstrapping"), "{}", agent.logs());
    assert_eq!(
        instance.terminate_and_check(&mut agent).await,
        0,
        "{}",
        agent.logs()
    );
    agent.assert_no_secrets(&[first, second]);
    assert_no_password_in(&instance.annotation().await.unwrap(), &[first, second]);
}

impl Instance {
    /// SIGTERM; returns the exit code after checking no engine process is left.
    async fn terminate_and_check(&self, agent: &mut Agent) -> i32 {
        let code = agent.terminate().await;
        let left = self.engine_processes();
        assert!(
            left.is_empty(),
            "engine processes left after the agent exited: {left:?}"
        );
        let status: InstanceStatus =
            serde_json::from_str(&self.annotation().await.unwrap()).unwrap();
        assert!(!status.ready, "the last report still says ready");
        code
    }
}

impl Agent {
    fn stdout_contains(&self, text: &str) -> bool {
        std::fs::read_to_string(&self.stdout)
            .unwrap_or_default()
            .contains(text)
    }
}

/// The agent's one stderr line for a failure, after checking it is the only one.
fn single_line(agent: &Agent) -> String {
    let stderr = agent.stderr();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one stderr line\n{}", agent.logs());
    let line = lines[0];
    assert!(line.starts_with("devctl-agent: "), "{line}");
    line.trim_start_matches("devctl-agent: ").to_string()
}

#[tokio::test]
async fn bad_inputs_exit_with_documented_codes_and_are_reported() {
    let mut instance = Instance::new("postgres", None).await;
    let password = "bad-inputs-Password";
    instance.set_password(password).await;
    let last_error = async |instance: &Instance| -> Option<String> {
        let raw = instance.annotation().await?;
        assert_no_password_in(&raw, &[password]);
        let status: InstanceStatus = serde_json::from_str(&raw).unwrap();
        assert!(!status.ready);
        status.last_error
    };

    // Missing DEVCTL_ENGINE → 64.
    let mut env = instance.env();
    env.remove(env::ENGINE);
    let mut agent = instance.start_with(env);
    assert_eq!(agent.exit_code().await, 64, "{}", agent.logs());
    let line = single_line(&agent);
    assert_eq!(line, "missing environment variable DEVCTL_ENGINE");
    assert_eq!(last_error(&instance).await, Some(line));

    // A data directory the agent cannot create → 73.
    let locked = instance.dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    let mut env = instance.env();
    env.insert(env::DATA_DIR, locked.join("data").display().to_string());
    let mut agent = instance.start_with(env);
    assert_eq!(agent.exit_code().await, 73, "{}", agent.logs());
    let line = single_line(&agent);
    assert!(
        line.contains("DEVCTL_DATA_DIR") && line.contains("cannot be created"),
        "{line}"
    );
    assert_eq!(last_error(&instance).await, Some(line));

    // An empty password at startup → 65.
    instance.set_password("").await;
    let mut agent = instance.start();
    assert_eq!(agent.exit_code().await, 65, "{}", agent.logs());
    let line = single_line(&agent);
    assert!(
        line.contains("key password is empty") && line.contains("db-credentials"),
        "{line}"
    );
    assert_eq!(last_error(&instance).await, Some(line));
    agent.assert_no_secrets(&[password]);
    assert!(
        !instance.data_dir().join("PG_VERSION").exists(),
        "bootstrapped with a bad password"
    );

    // A missing rendered config file → 78.
    let mut env = instance.env();
    env.insert(
        env::CONFIG_DIR,
        instance.dir.path().join("nowhere").display().to_string(),
    );
    let mut agent = instance.start_with(env);
    assert_eq!(agent.exit_code().await, 78, "{}", agent.logs());
    assert!(single_line(&agent).contains("postgresql.conf"));
}

#[tokio::test]
async fn a_replaced_pod_gets_no_report_and_the_stale_agent_exits() {
    let mut instance = Instance::new("postgres", None).await;
    // No Secret: the agent wants to report "not found", but the pod has another uid.
    let mut env = instance.env();
    env.insert(env::POD_UID, "00000000-0000-0000-0000-000000000000".into());
    let mut agent = instance.start_with(env);
    assert_eq!(agent.exit_code().await, 0, "{}", agent.logs());
    assert!(
        agent.stdout_contains("stale") || agent.stdout_contains("now has uid"),
        "{}",
        agent.logs()
    );
    assert_eq!(
        instance.annotation().await,
        None,
        "a report landed on the newer pod"
    );
}

#[tokio::test]
async fn mariadb_waits_for_its_secret_then_serves_app() {
    let annotations = BTreeMap::from([("example.com/keep".to_string(), "me".to_string())]);
    let mut instance = Instance::new("mysql", Some(annotations)).await;
    let password = "maria-Password-1";

    let mut agent = instance.start();
    instance
        .wait_for_report("the missing Secret to be reported", &mut agent, |s| {
            !s.ready
                && s.last_error.as_deref() == Some("credentials Secret db-credentials not found")
        })
        .await;
    let version = instance.set_password(password).await;
    let status = instance
        .wait_for_report("MariaDB to be ready", &mut agent, |s| {
            s.ready && s.credentials_version.as_deref() == Some(version.as_str())
        })
        .await;
    assert_eq!(status.role.as_deref(), Some("primary"));
    assert!(
        status
            .engine_version
            .as_deref()
            .is_some_and(|v| v.starts_with("10.")),
        "{status:?}"
    );
    assert_eq!(status.last_error, None);
    assert_eq!(http_status(instance.health_port, "/readyz").await, 200);

    assert_eq!(instance.login(password).await, Ok("app".to_string()));
    let wrong = instance.login("not-the-password").await.unwrap_err();
    assert!(wrong.contains("Access denied"), "{wrong}");

    let pod = instance.pods().await.get(&instance.pod).await.unwrap();
    assert_eq!(pod.metadata.annotations.unwrap()["example.com/keep"], "me");
    assert_eq!(
        instance.terminate_and_check(&mut agent).await,
        0,
        "{}",
        agent.logs()
    );
    agent.assert_no_secrets(&[password]);
    assert_no_password_in(&instance.annotation().await.unwrap(), &[password]);
}

#[tokio::test]
async fn install_copies_the_executable() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("bin");
    let output = Command::new(AGENT)
        .arg("install")
        .arg(&target)
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let installed = target.join("devctl-agent");
    let mode = std::fs::metadata(&installed).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    let version = Command::new(&installed)
        .arg("--version")
        .output()
        .await
        .unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("devctl-agent"));

    let usage = Command::new(AGENT)
        .arg("frobnicate")
        .output()
        .await
        .unwrap();
    assert_eq!(usage.status.code(), Some(64));
    assert_eq!(String::from_utf8_lossy(&usage.stderr).lines().count(), 1);
}

#[tokio::test]
async fn the_api_server_refuses_a_report_for_another_pod_uid() {
    let annotations = BTreeMap::from([("example.com/keep".to_string(), "me".to_string())]);
    let instance = Instance::new("postgres", Some(annotations)).await;
    let pods = instance.pods().await;
    let report = InstanceStatus {
        ready: true,
        ..InstanceStatus::default()
    };

    // The raw JSON patch with a mismatching uid is refused by the server itself.
    let ops = json!([
        { "op": "test", "path": "/metadata/uid", "value": "00000000-0000-0000-0000-000000000000" },
        { "op": "add", "path": "/metadata/annotations/db.devctl.io~1instance-status", "value": "{}" }
    ]);
    let patch: json_patch::Patch = serde_json::from_value(ops).unwrap();
    let refused = pods
        .patch(
            &instance.pod,
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
        .unwrap_err();
    println!("refused: {refused}");
    assert_eq!(instance.annotation().await, None);

    // The agent's writer says so.
    let stale = devctl_agent::config::PodRef {
        name: instance.pod.clone(),
        namespace: instance.namespace.clone(),
        uid: Some("00000000-0000-0000-0000-000000000000".into()),
    };
    let err = devctl_agent::report::write(&pods, &stale, &report)
        .await
        .unwrap_err();
    assert!(
        matches!(err, devctl_agent::report::WriteError::Stale(_)),
        "{err}"
    );
    assert_eq!(instance.annotation().await, None);

    // With the right uid it lands, next to the other annotations.
    let current = devctl_agent::config::PodRef {
        uid: Some(instance.pod_uid.clone()),
        ..stale
    };
    devctl_agent::report::write(&pods, &current, &report)
        .await
        .unwrap();
    let pod = pods.get(&instance.pod).await.unwrap();
    let annotations = pod.metadata.annotations.unwrap();
    assert_eq!(annotations["example.com/keep"], "me");
    assert_eq!(
        InstanceStatus::from_annotations(Some(&annotations)),
        Some(report)
    );
}

const REPLICATION_SECRET: &str = "DEVCTL_REPLICATION_SECRET";
const PRIMARY_FROM: &str = "DEVCTL_PRIMARY_FROM";

impl Instance {
    /// `sql` as the superuser over the instance's private socket (peer authentication maps
    /// any OS user to `postgres`) on database `db`.
    async fn admin_sql(&self, db: &str, sql: &str) -> Result<String, String> {
        let output = Command::new(postgres_bin_dir().join("psql"))
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-U",
                "postgres",
            ])
            .arg("-h")
            .arg(self.home().join("run"))
            .args(["-p", &self.port.to_string(), "-d", db, "-c", sql])
            .env("PGCONNECT_TIMEOUT", "5")
            .output()
            .await
            .unwrap();
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).to_string())
        }
    }

    /// A TCP login as `user` on `db` (password in a 0600 passfile).
    async fn login_as(&self, user: &str, db: &str, password: &str) -> Result<String, String> {
        let passfile = self.dir.path().join(format!("pgpass-{}", rand_suffix()));
        private_file(
            &passfile,
            &format!("127.0.0.1:{}:{db}:{user}:{password}\n", self.port),
        );
        let output = Command::new(postgres_bin_dir().join("psql"))
            .args([
                "-X",
                "-w",
                "-A",
                "-t",
                "-h",
                "127.0.0.1",
                "-U",
                user,
                "-d",
                db,
            ])
            .args(["-p", &self.port.to_string(), "-c", "SELECT current_user"])
            .env("PGPASSFILE", &passfile)
            .env_remove("PGPASSWORD")
            .env("PGCONNECT_TIMEOUT", "5")
            .output()
            .await
            .unwrap();
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).to_string())
        }
    }

    /// Creates or replaces the replication Secret; returns its resourceVersion.
    async fn set_replication_password(&self, name: &str, password: &str) -> String {
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name },
            "stringData": { "username": "streaming_replica", "password": password }
        }))
        .unwrap();
        let params = PatchParams::apply("agent-test").force();
        let applied = self
            .secrets()
            .await
            .patch(name, &params, &Patch::Apply(&secret))
            .await
            .unwrap();
        applied.metadata.resource_version.unwrap()
    }

    fn replication_env(&self, secret: &str) -> BTreeMap<&'static str, String> {
        let mut env = self.env();
        env.insert(REPLICATION_SECRET, secret.to_string());
        env.insert(PRIMARY_FROM, "annotation".to_string());
        env
    }
}

/// Polls `check` every 200 ms until it returns `Some`, for at most [`TIMEOUT`].
async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {TIMEOUT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn postgres_replica_waits_for_current_primary_clones_streams_and_resumes() {
    use std::os::unix::fs::MetadataExt;
    let (client, namespace) = namespace_with_cluster("replication", None).await;
    let mut primary =
        Instance::in_namespace(client.clone(), namespace.clone(), "db-0", "postgres", None).await;
    let mut replica =
        Instance::in_namespace(client.clone(), namespace.clone(), "db-1", "postgres", None).await;
    let (app_password, replication_password) = ("app-Password-1", "replication-Password-1");
    let secrets = [app_password, replication_password];
    let version = primary.set_password(app_password).await;
    primary
        .set_replication_password("db-replication", replication_password)
        .await;

    // No status.currentPrimary yet: both wait and neither initialises anything.
    let env = primary.replication_env("db-replication");
    let mut primary_agent = primary.start_with(env);
    let env = replica.replication_env("db-replication");
    let mut replica_agent = replica.start_with(env);
    for (instance, agent) in [
        (&primary, &mut primary_agent),
        (&replica, &mut replica_agent),
    ] {
        instance
            .wait_for_report("the wait for status.currentPrimary", agent, |s| {
                !s.ready && s.last_error.as_deref() == Some("waiting for status.currentPrimary")
            })
            .await;
        assert!(!instance.data_dir().join("PG_VERSION").exists());
    }

    // db-0 is the primary: it bootstraps; db-1 clones it and streams.
    set_current_primary(&client, &namespace, "db-0").await;
    let status = primary
        .wait_for_report("the primary to be ready", &mut primary_agent, |s| {
            s.ready && s.credentials_version.as_deref() == Some(version.as_str())
        })
        .await;
    assert_eq!(status.role.as_deref(), Some("primary"));
    let system_identifier = status.system_identifier.unwrap();
    let status = replica
        .wait_for_report("the replica to stream", &mut replica_agent, |s| s.ready)
        .await;
    assert_eq!(status.role.as_deref(), Some("replica"));
    assert_eq!(
        status.system_identifier.as_deref(),
        Some(system_identifier.as_str())
    );
    assert_eq!(status.timeline, Some(1));
    assert!(
        status.received_lsn.is_some() && status.replayed_lsn.is_some(),
        "{status:?}"
    );
    assert!(status.lag_bytes.is_some_and(|l| l >= 0), "{status:?}");
    assert_eq!(status.last_error, None);
    // Replicas report the Secret version they have seen (the roles replicate).
    assert_eq!(
        status.credentials_version.as_deref(),
        Some(version.as_str())
    );
    assert!(replica_agent.stdout_contains("cloning the primary db-0"));
    assert!(replica.data_dir().join("standby.signal").is_file());
    assert!(!engine_clone_dir(&replica.data_dir()).exists());
    let passfile = replica.home().join("run/replication.pgpass");
    let mode = std::fs::metadata(&passfile).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // The replica is ready once its receiver streams; the primary's sender leaves catchup
    // on its own schedule.
    eventually("the primary's sender to db-1 to stream", || async {
        let senders = primary
            .admin_sql(
                "postgres",
                "SELECT application_name, state FROM pg_stat_replication",
            )
            .await
            .ok()?;
        (senders == "db-1|streaming").then_some(())
    })
    .await;

    // Rows written on the primary reach the replica; the replica refuses writes.
    primary
        .admin_sql(
            "app",
            "CREATE TABLE t (x int); INSERT INTO t SELECT generate_series(1, 100)",
        )
        .await
        .unwrap();
    eventually("the rows on the replica", || async {
        (replica
            .admin_sql("app", "SELECT count(*) FROM t")
            .await
            .ok()?
            == "100")
            .then_some(())
    })
    .await;
    let refused = replica
        .admin_sql("app", "INSERT INTO t VALUES (0)")
        .await
        .unwrap_err();
    assert!(refused.contains("read-only transaction"), "{refused}");

    // The replication role streams but cannot reach the application's database; it may
    // connect to the empty `postgres` database, for pg_rewind's file functions only.
    let e = primary
        .login_as("streaming_replica", "app", replication_password)
        .await
        .unwrap_err();
    assert!(e.contains("permission denied for database"), "app: {e}");
    assert_eq!(
        primary
            .login_as("streaming_replica", "postgres", replication_password)
            .await,
        Ok("streaming_replica".to_string())
    );
    assert_eq!(primary.login(app_password).await, Ok("app".to_string()));
    assert_eq!(replica.login(app_password).await, Ok("app".to_string()));

    // The replica restarted on its data resumes streaming: no new clone, same data.
    let inode = std::fs::metadata(replica.data_dir()).unwrap().ino();
    assert_eq!(
        replica.terminate_and_check(&mut replica_agent).await,
        0,
        "{}",
        replica_agent.logs()
    );
    replica_agent.assert_no_secrets(&secrets);
    let env = replica.replication_env("db-replication");
    let mut replica_agent = replica.start_with(env);
    let status = replica
        .wait_for_report("the restarted replica to stream", &mut replica_agent, |s| {
            s.ready && s.heartbeat.is_some()
        })
        .await;
    assert_eq!(
        status.system_identifier.as_deref(),
        Some(system_identifier.as_str())
    );
    assert!(
        !replica_agent.stdout_contains("cloning"),
        "{}",
        replica_agent.logs()
    );
    assert!(replica_agent.stdout_contains("resuming as a replica"));
    assert_eq!(std::fs::metadata(replica.data_dir()).unwrap().ino(), inode);
    primary
        .admin_sql("app", "INSERT INTO t VALUES (101)")
        .await
        .unwrap();
    eventually("the new row on the restarted replica", || async {
        (replica
            .admin_sql("app", "SELECT count(*) FROM t")
            .await
            .ok()?
            == "101")
            .then_some(())
    })
    .await;

    // Named the primary on a standby's data (no lock without high availability): it
    // promotes and takes writes; the old primary, no longer named, is fenced.
    set_current_primary(&client, &namespace, "db-1").await;
    replica
        .wait_for_report(
            "the named replica to wait for the operator's election",
            &mut replica_agent,
            |s| {
                s.ready
                    && s.last_error
                        .as_deref()
                        .is_some_and(|e| e.contains("promotes only once the operator elects it"))
            },
        )
        .await;
    patch_cluster_status(&client, &namespace, json!({ "targetPrimary": "db-1" })).await;
    replica
        .wait_for_report("the named replica to promote", &mut replica_agent, |s| {
            s.ready && s.role.as_deref() == Some("primary")
        })
        .await;
    replica
        .admin_sql("app", "INSERT INTO t VALUES (102)")
        .await
        .unwrap();
    primary
        .wait_for_report("the old primary to be fenced", &mut primary_agent, |s| {
            !s.ready
        })
        .await;
    assert!(
        primary_agent.stdout_contains("fencing: status.currentPrimary names db-1"),
        "{}",
        primary_agent.logs()
    );

    assert_eq!(
        replica.terminate_and_check(&mut replica_agent).await,
        0,
        "{}",
        replica_agent.logs()
    );
    assert_eq!(
        primary.terminate_and_check(&mut primary_agent).await,
        0,
        "{}",
        primary_agent.logs()
    );
    for (instance, agent) in [(&primary, &primary_agent), (&replica, &replica_agent)] {
        agent.assert_no_secrets(&secrets);
        assert_no_password_in(&instance.annotation().await.unwrap(), &secrets);
    }
}

/// Where the agent clones to before renaming into place.
fn engine_clone_dir(data: &Path) -> PathBuf {
    devctl_agent::engine::clone_dir(data)
}

/// Merge-patches `status` of the DatabaseCluster (what the operator does) and checks every
/// key was kept (`null` removes it).
async fn patch_cluster_status(client: &kube::Client, namespace: &str, status: serde_json::Value) {
    let api: Api<DatabaseCluster> = Api::namespaced(client.clone(), namespace);
    let patched = api
        .patch_status(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap();
    let written = serde_json::to_value(&patched).unwrap();
    for (key, value) in status.as_object().unwrap() {
        let kept = written["status"].get(key).cloned().unwrap_or_default();
        assert_eq!(
            &kept, value,
            "the API server did not keep status.{key} (is the CRD current?)"
        );
    }
}

/// `SELECT count(*) FROM t` on `instance` equals `expected`.
async fn rows_reach(instance: &Instance, what: &str, expected: &str) {
    eventually(what, || async {
        (instance
            .admin_sql("app", "SELECT count(*) FROM t")
            .await
            .ok()?
            == expected)
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn postgres_planned_switchover_promotes_the_target_and_the_old_primary_rejoins() {
    let (client, namespace) = namespace_with_cluster("switchover", Some("db-0")).await;
    let mut instances = Vec::new();
    for pod in ["db-0", "db-1", "db-2"] {
        instances.push(
            Instance::in_namespace(client.clone(), namespace.clone(), pod, "postgres", None).await,
        );
    }
    let (app_password, replication_password) = ("app-Password-9", "replication-Password-9");
    let secrets = [app_password, replication_password];
    let version = instances[0].set_password(app_password).await;
    instances[0]
        .set_replication_password("db-replication", replication_password)
        .await;
    let mut agents = Vec::new();
    for instance in &mut instances {
        let env = instance.replication_env("db-replication");
        agents.push(instance.start_with(env));
    }
    let [db0, db1, db2] = &instances[..] else {
        unreachable!()
    };
    let [a0, a1, a2] = &mut agents[..] else {
        unreachable!()
    };
    db0.wait_for_report("db-0 to be the ready primary", a0, |s| {
        s.ready && s.credentials_version.as_deref() == Some(version.as_str())
    })
    .await;
    db1.wait_for_report("db-1 to stream", a1, |s| s.ready).await;
    db2.wait_for_report("db-2 to stream", a2, |s| s.ready).await;
    db0.admin_sql(
        "app",
        "CREATE TABLE t (x int); INSERT INTO t SELECT generate_series(1, 1000)",
    )
    .await
    .unwrap();

    // The operator asks for db-1: db-0 checkpoints, shuts down and reports finalLSN.
    patch_cluster_status(&client, &namespace, json!({ "targetPrimary": "db-1" })).await;
    let old = db0
        .wait_for_report("db-0 to stop and report finalLSN", a0, |s| {
            s.final_lsn.is_some()
        })
        .await;
    assert_eq!(old.role.as_deref(), Some("primary"), "{old:?}");
    assert!(!old.ready, "{old:?}");
    assert_eq!(
        old.last_error.as_deref(),
        Some("stopped for a switchover to db-1")
    );
    eventually("db-0's engine to exit", || async {
        db0.engine_processes().is_empty().then_some(())
    })
    .await;

    // db-1 promotes once it has replayed past finalLSN, with every row.
    db1.wait_for_report("db-1 to promote", a1, |s| {
        s.ready && s.role.as_deref() == Some("primary")
    })
    .await;
    // The reported timeline is the control file's: the new one once the promotion's
    // checkpoint (in the background) is done.
    let new = db1
        .wait_for_report("db-1 to report its new timeline", a1, |s| {
            s.timeline == Some(2)
        })
        .await;
    assert!(
        new.ready && new.role.as_deref() == Some("primary"),
        "{new:?}"
    );
    assert!(a1.stdout_contains("promoting"), "{}", a1.logs());
    assert!(!db1.data_dir().join("standby.signal").exists());
    assert_eq!(
        db1.admin_sql("app", "SELECT count(*) FROM t")
            .await
            .unwrap(),
        "1000"
    );
    db1.admin_sql("app", "INSERT INTO t VALUES (1001)")
        .await
        .unwrap();
    // db-0 stays down while currentPrimary still names it.
    assert!(db0.engine_processes().is_empty());

    // The operator names db-1 and clears targetPrimary: db-0 rejoins as db-1's standby, db-2
    // follows db-1 onto timeline 2.
    patch_cluster_status(
        &client,
        &namespace,
        json!({ "currentPrimary": "db-1", "targetPrimary": null }),
    )
    .await;
    let rejoined = db0
        .wait_for_report("db-0 to stream from db-1", a0, |s| {
            s.ready && s.role.as_deref() == Some("replica")
        })
        .await;
    assert_eq!(rejoined.final_lsn, None);
    assert_eq!(rejoined.timeline, Some(2), "{rejoined:?}");
    assert_eq!(
        db0.admin_sql("postgres", "SELECT pg_is_in_recovery()")
            .await
            .unwrap(),
        "t"
    );
    assert!(db0.data_dir().join("standby.signal").is_file());
    let follower = db2
        .wait_for_report("db-2 to stream from db-1 on timeline 2", a2, |s| {
            s.ready && s.timeline == Some(2)
        })
        .await;
    assert_eq!(follower.role.as_deref(), Some("replica"));
    db1.admin_sql("app", "INSERT INTO t VALUES (1002)")
        .await
        .unwrap();
    rows_reach(db0, "the rows written on db-1 on db-0", "1002").await;
    rows_reach(db2, "the rows written on db-1 on db-2", "1002").await;
    let senders = db1
        .admin_sql(
            "postgres",
            "SELECT string_agg(application_name || '=' || state, ',' ORDER BY application_name) FROM pg_stat_replication",
        )
        .await
        .unwrap();
    assert_eq!(senders, "db-0=streaming,db-2=streaming");
    assert!(!a0.stdout_contains("moved the former primary's data aside"));

    for (instance, agent) in [(db2, &mut *a2), (db0, &mut *a0), (db1, &mut *a1)] {
        assert_eq!(
            instance.terminate_and_check(agent).await,
            0,
            "{}",
            agent.logs()
        );
        agent.assert_no_secrets(&secrets);
        assert_no_password_in(&instance.annotation().await.unwrap(), &secrets);
    }
}

// ---------------------------------------------------------------------------------------
// Backups, WAL archiving and restore (docs/backup.md) against a real S3 server (versitygw).

/// `status.backup`/`walArchive` waits: a base backup, WAL switches and a restore.
const BACKUP_TIMEOUT: Duration = Duration::from_secs(180);

impl Instance {
    /// The pod's annotations merged with `annotations` (`null` removes one).
    async fn annotate(&self, annotations: serde_json::Value) {
        self.pods()
            .await
            .patch(
                &self.pod,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "annotations": annotations } })),
            )
            .await
            .unwrap();
    }

    /// The store Secret `<cluster>-<suffix>` (keys and the test CA).
    async fn set_store_secret(&self, name: &str, s3: &devctl_testenv::S3Server) {
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name },
            "stringData": {
                "accessKeyId": s3.access_key_id(),
                "secretAccessKey": s3.secret_access_key(),
                "ca.crt": s3.ca_pem(),
            }
        }))
        .unwrap();
        let params = PatchParams::apply("agent-test").force();
        self.secrets()
            .await
            .patch(name, &params, &Patch::Apply(&secret))
            .await
            .unwrap();
    }

    /// pg_basebackup runs as the superuser over the private socket: a replication
    /// connection, which `local all` does not match.
    fn allow_local_replication(&self) {
        use std::io::Write;
        let mut hba = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("conf/pg_hba.conf"))
            .unwrap();
        hba.write_all(b"local   replication  postgres             peer map=devctl\n")
            .unwrap();
    }

    /// Like [`Instance::wait_for_report`] with [`BACKUP_TIMEOUT`].
    async fn wait_long(
        &self,
        what: &str,
        agent: &mut Agent,
        check: impl Fn(&InstanceStatus) -> bool,
    ) -> InstanceStatus {
        self.wait_for_report_within(BACKUP_TIMEOUT, what, agent, check)
            .await
    }
}

fn destination(s3: &devctl_testenv::S3Server, prefix: &str) -> String {
    json!({ "endpoint": s3.endpoint(), "bucket": s3.bucket(), "prefix": prefix, "region": s3.region() })
        .to_string()
}

/// A new cluster `db` in its own namespace whose first instance restores `backup_id` from
/// `source_prefix` (optionally to `target_time`), archiving into its own prefix; returns
/// the instance and its running agent, ready as the primary.
async fn restore_into_new_cluster(
    s3: &devctl_testenv::S3Server,
    source_prefix: &str,
    backup_id: &str,
    target_time: Option<&str>,
    password: &str,
) -> (Instance, Agent, String) {
    let (client, namespace) = namespace_with_cluster("restored", Some("db-0")).await;
    let own_prefix = format!("{namespace}/db/");
    let annotations = BTreeMap::from([(
        devctl_api::instance::BACKUP_DESTINATION_ANNOTATION.to_string(),
        destination(s3, &own_prefix),
    )]);
    let mut instance =
        Instance::in_namespace(client, namespace, "db-0", "postgres", Some(annotations)).await;
    instance.allow_local_replication();
    let version = instance.set_password(password).await;
    instance.set_store_secret("db-backup-store", s3).await;
    instance.set_store_secret("db-restore-store", s3).await;
    let mut env = instance.env();
    env.insert(env::BOOTSTRAP, "recovery".into());
    let mut agent = instance.start_with(env.clone());
    instance
        .wait_for_report("the wait for the restore annotation", &mut agent, |s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains(devctl_api::instance::RESTORE_ANNOTATION))
        })
        .await;
    assert!(!instance.data_dir().join("PG_VERSION").exists());
    let mut request = json!({
        "endpoint": s3.endpoint(), "bucket": s3.bucket(), "prefix": source_prefix,
        "region": s3.region(), "backupId": backup_id,
    });
    if let Some(time) = target_time {
        request["targetTime"] = json!(time);
    }
    instance
        .annotate(json!({ devctl_api::instance::RESTORE_ANNOTATION: request.to_string() }))
        .await;
    let status = instance
        .wait_long("the restored instance to be ready", &mut agent, |s| {
            s.ready && s.credentials_version.as_deref() == Some(version.as_str())
        })
        .await;
    assert_eq!(status.role.as_deref(), Some("primary"), "{status:?}");
    assert_eq!(status.last_error, None);
    // Promoted on a new timeline; the recovery settings are gone (a clone never inherits
    // them).
    assert!(status.timeline.is_some_and(|t| t >= 2), "{status:?}");
    assert!(!instance.data_dir().join("recovery.signal").exists());
    let auto_conf =
        std::fs::read_to_string(instance.data_dir().join("postgresql.auto.conf")).unwrap();
    assert!(
        !auto_conf.contains("restore_command") && !auto_conf.contains("recovery_target_time "),
        "{auto_conf}"
    );
    (instance, agent, own_prefix)
}

#[tokio::test]
async fn postgres_archives_wal_backs_up_to_s3_and_restores_into_new_clusters() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let store_secrets = [s3.access_key_id(), s3.secret_access_key()];
    let (client, namespace) = namespace_with_cluster("backup", Some("db-0")).await;
    let prefix = format!("{namespace}/db/");
    let annotations = BTreeMap::from([(
        devctl_api::instance::BACKUP_DESTINATION_ANNOTATION.to_string(),
        destination(s3, &prefix),
    )]);
    let mut source =
        Instance::in_namespace(client, namespace, "db-0", "postgres", Some(annotations)).await;
    source.allow_local_replication();
    let password = "backup-Password-1";
    let version = source.set_password(password).await;
    source.set_store_secret("db-backup-store", s3).await;
    let mut agent = source.start();
    let status = source
        .wait_for_report("the primary to be ready", &mut agent, |s| {
            s.ready && s.credentials_version.as_deref() == Some(version.as_str())
        })
        .await;
    let sysid = status.system_identifier.unwrap();
    let sys_prefix = format!("{prefix}{sysid}/");

    // WAL archiving: a switched segment reaches the store, owner.json first.
    source
        .admin_sql(
            "app",
            "CREATE TABLE t (x int); INSERT INTO t SELECT generate_series(1, 100)",
        )
        .await
        .unwrap();
    let switched = source
        .admin_sql("postgres", "SELECT pg_walfile_name(pg_switch_wal())")
        .await
        .unwrap();
    let status = source
        .wait_long("the switched segment to be archived", &mut agent, |s| {
            s.wal_archive
                .as_ref()
                .and_then(|w| w.last_archived.as_deref())
                .is_some_and(|l| l >= switched.as_str())
        })
        .await;
    let archive = status.wal_archive.unwrap();
    assert!(!archive.failing && archive.error.is_none(), "{archive:?}");
    assert!(archive.last_archived_at.is_some());
    let objects = s3.objects(&prefix);
    let keys: Vec<&str> = objects.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        keys.contains(&format!("{sys_prefix}owner.json").as_str()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&format!("{sys_prefix}wal/{switched}").as_str()),
        "{keys:?}"
    );
    let (_, size) = objects
        .iter()
        .find(|(k, _)| k.ends_with(&switched))
        .unwrap();
    assert_eq!(*size, 16 * 1024 * 1024);

    // A backup on request: data.tar, the WAL it needs, then backup.json.
    let backup_id = "20261130T120000Z-nightly";
    source
        .annotate(json!({
            devctl_api::instance::BACKUP_REQUEST_ANNOTATION:
                json!({ "name": "nightly", "uid": "uid-1", "backupId": backup_id }).to_string()
        }))
        .await;
    let status = source
        .wait_long("the backup to complete", &mut agent, |s| {
            s.backup
                .as_ref()
                .is_some_and(|b| b.phase == "Completed" || b.phase == "Failed")
        })
        .await;
    let backup = status.backup.unwrap();
    assert_eq!(backup.phase, "Completed", "{backup:?}\n{}", agent.logs());
    assert_eq!(backup.uid, "uid-1");
    assert_eq!(backup.engine.as_deref(), Some("postgres"));
    assert_eq!(backup.prefix.as_deref(), Some(sys_prefix.as_str()));
    assert_eq!(
        backup.object_path.as_deref(),
        Some(format!("s3://{}/{sys_prefix}base/{backup_id}/", s3.bucket()).as_str())
    );
    assert!(backup.size.is_some_and(|s| s > 1024 * 1024), "{backup:?}");
    assert_eq!(backup.timeline, Some(1));
    let (begin_wal, end_wal) = (
        backup.begin_wal.clone().unwrap(),
        backup.end_wal.clone().unwrap(),
    );
    assert!(begin_wal <= end_wal, "{backup:?}");
    assert!(backup.begin_lsn.is_some() && backup.end_lsn.is_some());
    assert!(backup.started_at.is_some() && backup.stopped_at.is_some());
    let base = format!("{sys_prefix}base/{backup_id}/");
    let objects = s3.objects(&base);
    let keys: Vec<&str> = objects.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [format!("{base}backup.json"), format!("{base}data.tar")],
        "{objects:?}"
    );
    assert_eq!(objects[1].1 as i64, backup.size.unwrap());
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(s3.bucket_dir().join(format!("{base}backup.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["phase"], "Completed");
    assert_eq!(manifest["beginWAL"], begin_wal.as_str());
    assert_eq!(manifest["systemIdentifier"], sysid.as_str());
    for segment in [&begin_wal, &end_wal] {
        let key = format!("{sys_prefix}wal/{segment}");
        assert!(
            s3.objects(&key).iter().any(|(k, _)| *k == key),
            "{segment} not archived"
        );
    }

    // Rows after the backup, committed after a point in time: PITR restores without them,
    // a restore to the end of the archive with them.
    let target_time = source
        .admin_sql(
            "postgres",
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    source
        .admin_sql("app", "INSERT INTO t SELECT generate_series(101, 150)")
        .await
        .unwrap();
    let switched = source
        .admin_sql("postgres", "SELECT pg_walfile_name(pg_switch_wal())")
        .await
        .unwrap();
    source
        .wait_long(
            "the rows after the backup to be archived",
            &mut agent,
            |s| {
                s.wal_archive
                    .as_ref()
                    .and_then(|w| w.last_archived.as_deref())
                    .is_some_and(|l| l >= switched.as_str())
            },
        )
        .await;

    // A restarted agent reports the finished backup and does not take it again.
    assert_eq!(
        source.terminate_and_check(&mut agent).await,
        0,
        "{}",
        agent.logs()
    );
    let mut agent = source.start();
    let status = source
        .wait_for_report("the restarted primary", &mut agent, |s| {
            s.ready && s.heartbeat.is_some()
        })
        .await;
    assert_eq!(
        status.backup.as_ref().map(|b| b.phase.as_str()),
        Some("Completed")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !agent.stdout_contains("taking a backup"),
        "{}",
        agent.logs()
    );

    // A new cluster restores to the end of the archive: every row, a new timeline, and
    // its own WAL under its own prefix.
    let password2 = "restored-Password-2";
    let (restored, mut restored_agent, own_prefix) =
        restore_into_new_cluster(s3, &sys_prefix, backup_id, None, password2).await;
    assert_eq!(
        restored.admin_sql("app", "SELECT count(*) FROM t").await,
        Ok("150".to_string())
    );
    assert_eq!(restored.login(password2).await, Ok("app".to_string()));
    let status = restored
        .wait_long(
            "the restored cluster's own archive",
            &mut restored_agent,
            |s| {
                s.wal_archive
                    .as_ref()
                    .is_some_and(|w| w.last_archived.is_some())
            },
        )
        .await;
    let restored_sysid = status.system_identifier.unwrap();
    assert_eq!(
        restored_sysid, sysid,
        "a restore keeps the system identifier"
    );
    assert!(
        !s3.objects(&format!("{own_prefix}{sysid}/wal/")).is_empty(),
        "{:?}",
        s3.objects(&own_prefix)
    );
    assert_eq!(
        restored.terminate_and_check(&mut restored_agent).await,
        0,
        "{}",
        restored_agent.logs()
    );

    // A restore to a point in time before those rows.
    let (pitr, mut pitr_agent, _) =
        restore_into_new_cluster(s3, &sys_prefix, backup_id, Some(&target_time), password2).await;
    assert_eq!(
        pitr.admin_sql("app", "SELECT count(*) FROM t").await,
        Ok("100".to_string())
    );
    assert_eq!(
        pitr.terminate_and_check(&mut pitr_agent).await,
        0,
        "{}",
        pitr_agent.logs()
    );

    assert_eq!(
        source.terminate_and_check(&mut agent).await,
        0,
        "{}",
        agent.logs()
    );
    for a in [&agent, &restored_agent, &pitr_agent] {
        a.assert_no_secrets(&store_secrets);
    }
    for instance in [&source, &restored, &pitr] {
        assert_no_password_in(&instance.annotation().await.unwrap(), &store_secrets);
    }
}

#[tokio::test]
async fn a_restore_refuses_an_incomplete_backup_and_a_recreated_cluster_archives_beside_its_predecessor()
 {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let (client, namespace) = namespace_with_cluster("refuse", Some("db-0")).await;
    // Another cluster's owner.json where this cluster would archive.
    let prefix = format!("{namespace}/db/");
    let owner = s3.bucket_dir().join(format!("{prefix}owner.json"));
    std::fs::create_dir_all(owner.parent().unwrap()).unwrap();
    std::fs::write(&owner, br#"{"uid":"another-cluster"}"#).unwrap();
    let annotations = BTreeMap::from([
        (
            devctl_api::instance::BACKUP_DESTINATION_ANNOTATION.to_string(),
            destination(s3, &prefix),
        ),
        (
            devctl_api::instance::RESTORE_ANNOTATION.to_string(),
            json!({
                "endpoint": s3.endpoint(), "bucket": s3.bucket(),
                "prefix": format!("{namespace}/nothing/7/"), "region": s3.region(),
                "backupId": "20261130T120000Z-missing",
            })
            .to_string(),
        ),
    ]);
    let mut instance =
        Instance::in_namespace(client, namespace, "db-0", "postgres", Some(annotations)).await;
    instance.set_password("refuse-Password-1").await;
    instance.set_store_secret("db-restore-store", s3).await;
    instance.set_store_secret("db-backup-store", s3).await;
    let mut env = instance.env();
    env.insert(env::BOOTSTRAP, "recovery".into());
    let mut agent = instance.start_with(env);
    let status = instance
        .wait_for_report("the incomplete backup to be refused", &mut agent, |s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("incomplete or does not exist"))
        })
        .await;
    assert!(
        status
            .last_error
            .as_deref()
            .unwrap()
            .contains("backup.json"),
        "{status:?}"
    );
    assert!(!instance.data_dir().join("PG_VERSION").exists());
    assert_eq!(
        instance.terminate_and_check(&mut agent).await,
        0,
        "{}",
        agent.logs()
    );

    // Without the restore, the same pod bootstraps. The owner.json at the name's level is an
    // earlier cluster's of this name: it archives beside it, under its own system identifier,
    // and leaves that file alone.
    instance
        .annotate(json!({ devctl_api::instance::RESTORE_ANNOTATION: null }))
        .await;
    let mut agent = instance.start();
    instance
        .wait_for_report("the primary", &mut agent, |s| s.ready)
        .await;
    instance
        .admin_sql(
            "postgres",
            "SELECT pg_switch_wal(); CHECKPOINT; SELECT pg_switch_wal()",
        )
        .await
        .unwrap();
    let status = instance
        .wait_long("archiving beside the earlier cluster", &mut agent, |s| {
            s.wal_archive
                .as_ref()
                .is_some_and(|w| !w.failing && w.last_archived.is_some())
        })
        .await;
    assert_eq!(
        std::fs::read_to_string(&owner).unwrap(),
        r#"{"uid":"another-cluster"}"#
    );
    let sysid = status.system_identifier.unwrap();
    let own = s3.bucket_dir().join(format!("{prefix}{sysid}/owner.json"));
    assert!(
        std::fs::read_to_string(&own).is_ok_and(|o| !o.contains("another-cluster")),
        "{}",
        own.display()
    );
    assert_eq!(
        instance.terminate_and_check(&mut agent).await,
        0,
        "{}",
        agent.logs()
    );
}

#[tokio::test]
async fn postgres_backup_on_a_replica_completes_with_the_primarys_archive() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let (client, namespace) = namespace_with_cluster("replica-backup", Some("db-0")).await;
    let prefix = format!("{namespace}/db/");
    let annotations = BTreeMap::from([(
        devctl_api::instance::BACKUP_DESTINATION_ANNOTATION.to_string(),
        destination(s3, &prefix),
    )]);
    let mut primary = Instance::in_namespace(
        client.clone(),
        namespace.clone(),
        "db-0",
        "postgres",
        Some(annotations.clone()),
    )
    .await;
    let mut replica =
        Instance::in_namespace(client, namespace, "db-1", "postgres", Some(annotations)).await;
    for instance in [&primary, &replica] {
        instance.allow_local_replication();
    }
    primary.set_password("replica-backup-Password-1").await;
    primary
        .set_replication_password("db-replication", "replication-Password-7")
        .await;
    primary.set_store_secret("db-backup-store", s3).await;
    let env = primary.replication_env("db-replication");
    let mut primary_agent = primary.start_with(env);
    let env = replica.replication_env("db-replication");
    let mut replica_agent = replica.start_with(env);
    let status = primary
        .wait_for_report("the primary", &mut primary_agent, |s| s.ready)
        .await;
    let sys_prefix = format!("{prefix}{}/", status.system_identifier.unwrap());
    replica
        .wait_for_report("the replica to stream", &mut replica_agent, |s| s.ready)
        .await;
    primary
        .admin_sql(
            "app",
            "CREATE TABLE t AS SELECT generate_series(1, 1000) AS x",
        )
        .await
        .unwrap();

    // A standby cannot switch WAL: the backup asks the primary (well before its
    // archive_timeout of 60 s would).
    let started = tokio::time::Instant::now();
    let backup_id = "20261130T130000Z-from-replica";
    replica
        .annotate(json!({
            devctl_api::instance::BACKUP_REQUEST_ANNOTATION:
                json!({ "name": "from-replica", "uid": "uid-r", "backupId": backup_id }).to_string()
        }))
        .await;
    let status = replica
        .wait_long("the replica's backup to finish", &mut replica_agent, |s| {
            s.backup
                .as_ref()
                .is_some_and(|b| b.phase == "Completed" || b.phase == "Failed")
        })
        .await;
    let backup = status.backup.unwrap();
    assert_eq!(
        backup.phase,
        "Completed",
        "{backup:?}\n{}",
        replica_agent.logs()
    );
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "took {:?}: the primary did not switch WAL\n{}",
        started.elapsed(),
        replica_agent.logs()
    );
    assert!(replica_agent.stdout_contains("the primary switched WAL for the backup"));
    let end_wal = backup.end_wal.unwrap();
    let key = format!("{sys_prefix}wal/{end_wal}");
    assert!(s3.objects(&key).iter().any(|(k, _)| *k == key));
    let base = format!("{sys_prefix}base/{backup_id}/");
    assert_eq!(s3.objects(&base).len(), 2, "{:?}", s3.objects(&base));
    // The replica reports no walArchive (it archives nothing); the primary does.
    assert_eq!(status.wal_archive, None);
    for (instance, agent) in [
        (&replica, &mut replica_agent),
        (&primary, &mut primary_agent),
    ] {
        assert_eq!(
            instance.terminate_and_check(agent).await,
            0,
            "{}",
            agent.logs()
        );
    }
}

impl Instance {
    /// MariaDB: `sql` as `app` over TCP (password in a 0600 option file).
    async fn mariadb_app_sql(&self, password: &str, sql: &str) -> Result<String, String> {
        let options = self.dir.path().join(format!("my-{}.cnf", rand_suffix()));
        private_file(&options, &format!("[client]\npassword=\"{password}\"\n"));
        let output = Command::new("mariadb")
            .arg(format!("--defaults-extra-file={}", options.display()))
            .args(["--protocol=tcp", "-h", "127.0.0.1"])
            .arg(format!("--port={}", self.port))
            .args(["-u", "app", "-D", "app", "-N", "-B", "-e", sql])
            .output()
            .await
            .unwrap();
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).to_string())
        }
    }
}

#[tokio::test]
async fn mariadb_dumps_to_s3_and_a_new_cluster_replays_the_dump() {
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let (client, namespace) = namespace_with_cluster("maria-backup", Some("db-0")).await;
    let prefix = format!("{namespace}/db/");
    let annotations = BTreeMap::from([(
        devctl_api::instance::BACKUP_DESTINATION_ANNOTATION.to_string(),
        destination(s3, &prefix),
    )]);
    let mut source =
        Instance::in_namespace(client, namespace, "db-0", "mysql", Some(annotations)).await;
    let password = "maria-backup-Password-1";
    let version = source.set_password(password).await;
    source.set_store_secret("db-backup-store", s3).await;
    let mut agent = source.start();
    source
        .wait_for_report("MariaDB to be ready", &mut agent, |s| {
            s.ready && s.credentials_version.as_deref() == Some(version.as_str())
        })
        .await;
    source
        .mariadb_app_sql(
            password,
            "CREATE TABLE t (x INT PRIMARY KEY); INSERT INTO t VALUES (1), (2), (3)",
        )
        .await
        .unwrap();
    let backup_id = "20261130T140000Z-maria";
    source
        .annotate(json!({
            devctl_api::instance::BACKUP_REQUEST_ANNOTATION:
                json!({ "name": "maria", "uid": "uid-m", "backupId": backup_id }).to_string()
        }))
        .await;
    let status = source
        .wait_long("the dump to finish", &mut agent, |s| {
            s.backup
                .as_ref()
                .is_some_and(|b| b.phase == "Completed" || b.phase == "Failed")
        })
        .await;
    let backup = status.backup.unwrap();
    assert_eq!(backup.phase, "Completed", "{backup:?}\n{}", agent.logs());
    assert_eq!(backup.engine.as_deref(), Some("mysql"));
    assert_eq!(status.wal_archive, None);
    let sys_prefix = backup.prefix.clone().unwrap();
    assert!(sys_prefix.starts_with(&prefix), "{sys_prefix}");
    let base = format!("{sys_prefix}base/{backup_id}/");
    let objects = s3.objects(&base);
    let keys: Vec<&str> = objects.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [format!("{base}backup.json"), format!("{base}dump.sql")],
        "{objects:?}"
    );
    assert_eq!(
        source.terminate_and_check(&mut agent).await,
        0,
        "{}",
        agent.logs()
    );

    // A new cluster: initialised, the dump replayed, then its own credentials.
    let (client, namespace) = namespace_with_cluster("maria-restored", Some("db-0")).await;
    let request = json!({
        "endpoint": s3.endpoint(), "bucket": s3.bucket(), "prefix": sys_prefix,
        "region": s3.region(), "backupId": backup_id,
    });
    let annotations = BTreeMap::from([(
        devctl_api::instance::RESTORE_ANNOTATION.to_string(),
        request.to_string(),
    )]);
    let mut restored =
        Instance::in_namespace(client, namespace, "db-0", "mysql", Some(annotations)).await;
    let password2 = "maria-restored-Password-2";
    let version = restored.set_password(password2).await;
    restored.set_store_secret("db-restore-store", s3).await;
    let mut env = restored.env();
    env.insert(env::BOOTSTRAP, "recovery".into());
    let mut restored_agent = restored.start_with(env.clone());
    let status = restored
        .wait_long(
            "the restored MariaDB to be ready",
            &mut restored_agent,
            |s| s.ready && s.credentials_version.as_deref() == Some(version.as_str()),
        )
        .await;
    assert_eq!(status.last_error, None);
    assert_eq!(
        restored
            .mariadb_app_sql(password2, "SELECT SUM(x) FROM t")
            .await,
        Ok("6".to_string())
    );
    assert!(restored.data_dir().join(".devctl-restored").is_file());
    // Restarted: not replayed again.
    assert_eq!(
        restored.terminate_and_check(&mut restored_agent).await,
        0,
        "{}",
        restored_agent.logs()
    );
    let mut restored_agent = restored.start_with(env);
    restored
        .wait_for_report("the restarted MariaDB", &mut restored_agent, |s| {
            s.ready && s.heartbeat.is_some()
        })
        .await;
    assert!(!restored_agent.stdout_contains("replaying the dump"));
    assert_eq!(
        restored.terminate_and_check(&mut restored_agent).await,
        0,
        "{}",
        restored_agent.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_never_overwrites_a_segment_with_other_content() {
    use bytes::Bytes;
    use devctl_agent::store::{PutOnce, Store, StoreCredentials};
    let s3 = devctl_testenv::shared_s3().await.unwrap();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let store = Store::new(
        devctl_api::instance::StoreLocation {
            endpoint: s3.endpoint(),
            bucket: s3.bucket().to_string(),
            prefix: format!("put-once-{stamp}/"),
            region: s3.region().to_string(),
        },
        &StoreCredentials {
            access_key_id: s3.access_key_id().to_string(),
            secret_access_key: s3.secret_access_key().to_string(),
            ca_pem: Some(s3.ca_pem().into_bytes()),
            version: "1".into(),
        },
    )
    .unwrap();
    let key = format!("put-once-{stamp}/7/wal/000000010000000000000001");
    let put = |data: &'static [u8]| {
        let (store, key) = (&store, key.clone());
        async move { store.put_once(&key, Bytes::from_static(data)).await }
    };
    assert_eq!(put(b"segment").await.unwrap(), PutOnce::Stored);
    // The same content again (PostgreSQL retries an archive_command it saw fail): success.
    assert_eq!(put(b"segment").await.unwrap(), PutOnce::AlreadyStored);
    // Another writer's segment of that name: refused, and the first stays.
    let refused = put(b"other").await.unwrap_err().to_string();
    assert!(refused.contains("different content"), "{refused}");
    assert_eq!(&store.get(&key).await.unwrap()[..], b"segment");
    // Archived before hashes were recorded: compared by its bytes.
    let old = format!("put-once-{stamp}/7/wal/000000010000000000000002");
    store.put(&old, Bytes::from_static(b"old")).await.unwrap();
    assert_eq!(
        store
            .put_once(&old, Bytes::from_static(b"old"))
            .await
            .unwrap(),
        PutOnce::AlreadyStored
    );
    assert!(
        store
            .put_once(&old, Bytes::from_static(b"new"))
            .await
            .is_err()
    );
}
