//! The configuration the operator renders starts real database servers (Debian's PostgreSQL
//! and MariaDB, installed by tools/install-prerequisites.sh), and PostgreSQL accepts password
//! logins over TCP with scram-sha-256 only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use devctl_api::database_cluster::DatabaseClusterSpec;
use devctl_operator::engine::{self, mysql, postgres};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

fn spec(engine: &str) -> DatabaseClusterSpec {
    serde_json::from_value(json!({
        "engine": engine, "version": "16.2", "replicas": 1, "storage": { "size": "1Gi" },
        "resources": { "requests": { "memory": "512Mi" } }
    }))
    .unwrap()
}

fn free_port() -> u16 {
    devctl_testenv::process::free_port().unwrap()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `command` run as the `postgres` system user when we are root (PostgreSQL refuses root).
fn as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn chown_to(path: &Path, user: &str) {
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", user])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "chown {} to {user}", path.display());
    }
}

fn postgres_bin_dir() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed: run tools/install-prerequisites.sh")
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("postgres").exists())
        .collect();
    dirs.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
        .expect("no /usr/lib/postgresql/<version>/bin/postgres")
}

/// Kills the server when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(what: &str, log: &Path, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {TIMEOUT:?} waiting for {what}; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn rendered_postgres_config_serves_scram_password_logins() {
    let bin = postgres_bin_dir();
    let dir = tempfile::tempdir().unwrap();
    let (data, conf, socket) = (
        dir.path().join("data"),
        dir.path().join("conf"),
        dir.path().join("socket"),
    );
    for d in [&data, &conf, &socket] {
        std::fs::create_dir_all(d).unwrap();
    }
    for (file, content) in engine::render(&spec("postgres")) {
        std::fs::write(conf.join(file), content).unwrap();
    }
    let password = "correct-horse-battery";
    std::fs::write(dir.path().join("pwfile"), password).unwrap();
    chown_to(dir.path(), "postgres");

    let init = as_postgres(&bin.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["--username=postgres", "--auth=scram-sha-256"])
        .arg(format!("--pwfile={}", dir.path().join("pwfile").display()))
        .output()
        .unwrap();
    assert!(init.status.success(), "initdb failed: {}", text(&init));

    let port = free_port();
    let log = dir.path().join("postgres.log");
    let log_file = std::fs::File::create(&log).unwrap();
    chown_to(&log, "postgres");
    let _server = Server(
        as_postgres(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .arg("-c")
            .arg(format!(
                "config_file={}",
                conf.join(postgres::CONF).display()
            ))
            .arg("-c")
            .arg(format!("hba_file={}", conf.join(postgres::HBA).display()))
            .arg("-c")
            .arg(format!(
                "ident_file={}",
                conf.join(postgres::IDENT).display()
            ))
            // Only what a test on a shared machine must change: where to listen.
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                &format!("port={port}"),
            ])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", socket.display()))
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap(),
    );
    wait_until("PostgreSQL to accept connections", &log, || {
        Command::new(bin.join("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .output()
            .is_ok_and(|o| o.status.success())
    });

    let psql = |password: &str, sql: &str| {
        Command::new(bin.join("psql"))
            .arg(format!(
                "host=127.0.0.1 port={port} user=postgres dbname=postgres"
            ))
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .env("PGPASSWORD", password)
            .output()
            .unwrap()
    };
    let ok = psql(password, "SHOW password_encryption");
    assert!(
        ok.status.success(),
        "login with the right password failed: {}",
        text(&ok)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "scram-sha-256");
    let buffers = psql(password, "SHOW shared_buffers");
    assert_eq!(
        String::from_utf8_lossy(&buffers.stdout).trim(),
        "128MB",
        "the rendered config was not used"
    );
    // Over the network only scram-sha-256; peer only for the superuser on the local socket
    // (for its sessions and for the agent's base backups, a replication connection).
    let methods = psql(
        password,
        "SELECT type, user_name, auth_method FROM pg_hba_file_rules WHERE error IS NULL ORDER BY line_number",
    );
    assert_eq!(
        String::from_utf8_lossy(&methods.stdout).trim(),
        "local|{postgres}|peer\nlocal|{postgres}|peer\nlocal|{all}|scram-sha-256\nhost|{all}|scram-sha-256\nhost|{all}|scram-sha-256\nhost|{all}|scram-sha-256\nhost|{all}|scram-sha-256",
        "{}",
        text(&methods)
    );
    let ident_errors = psql(
        password,
        "SELECT count(*) FROM pg_ident_file_mappings WHERE error IS NOT NULL OR map_name <> 'devctl'",
    );
    assert_eq!(String::from_utf8_lossy(&ident_errors.stdout).trim(), "0");
    // The superuser logs in without a password over the socket, as the agent does.
    let peer = as_postgres(&bin.join("psql"))
        .args(["-h"])
        .arg(&socket)
        .args(["-p", &port.to_string(), "-U", "postgres", "-d", "postgres"])
        .args(["-X", "-A", "-t", "-c", "SELECT current_user"])
        .env_remove("PGPASSWORD")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&peer.stdout).trim(),
        "postgres",
        "{}",
        text(&peer)
    );
    let rule_errors = psql(
        password,
        "SELECT count(*) FROM pg_hba_file_rules WHERE error IS NOT NULL",
    );
    assert_eq!(String::from_utf8_lossy(&rule_errors.stdout).trim(), "0");

    let wrong = psql("not-the-password", "SELECT 1");
    assert!(!wrong.status.success(), "a wrong password was accepted");
    assert!(
        text(&wrong).contains("password authentication failed"),
        "{}",
        text(&wrong)
    );
}

#[test]
fn rendered_my_cnf_starts_mariadb() {
    let dir = tempfile::tempdir().unwrap();
    let (data, conf) = (dir.path().join("data"), dir.path().join("conf"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    for (file, content) in engine::render(&spec("mysql")) {
        std::fs::write(conf.join(file), content).unwrap();
    }
    let cnf = conf.join(mysql::CONF);
    let socket = dir.path().join("mysqld.sock");
    // mariadbd only runs as root when told to; otherwise it runs as the invoking user.
    let user: &[&str] = if is_root() { &["--user=root"] } else { &[] };

    let install = Command::new("mariadb-install-db")
        .arg(format!("--defaults-file={}", cnf.display()))
        .arg(format!("--datadir={}", data.display()))
        .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
        .args(user)
        .output()
        .expect("MariaDB is not installed: run tools/install-prerequisites.sh");
    assert!(
        install.status.success(),
        "mariadb-install-db failed: {}",
        text(&install)
    );

    let port = free_port();
    let log = dir.path().join("mariadb.log");
    let _server = Server(
        Command::new("mariadbd")
            .arg(format!("--defaults-file={}", cnf.display()))
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!(
                "--pid-file={}",
                dir.path().join("mariadb.pid").display()
            ))
            .arg(format!("--log-error={}", log.display()))
            .args(["--bind-address=127.0.0.1", &format!("--port={port}")])
            .args(user)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = |sql: &str| {
        Command::new("mariadb")
            .args(["--no-defaults", "-uroot", "-N", "-B"])
            .arg(format!("--socket={}", socket.display()))
            .args(["-e", sql])
            .output()
            .unwrap()
    };
    wait_until("MariaDB to accept connections", &log, || {
        client("SELECT 1").status.success()
    });
    let settings = client(
        "SELECT @@innodb_buffer_pool_size, @@max_connections, @@character_set_server, @@log_bin",
    );
    assert!(settings.status.success(), "{}", text(&settings));
    let values = String::from_utf8_lossy(&settings.stdout);
    let values: Vec<&str> = values.split_whitespace().collect();
    assert_eq!(
        values,
        [
            (256 * 1024 * 1024).to_string().as_str(),
            "100",
            "utf8mb4",
            "1"
        ],
        "the rendered my.cnf was not used"
    );
}
