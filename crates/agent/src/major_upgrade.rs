//! A PostgreSQL major upgrade of one stopped data directory with `pg_upgrade`: the step the
//! operator runs on the primary's volume while every instance is stopped (on a real cluster
//! an init container running `devctl-agent upgrade` from an image that carries both majors'
//! binaries). Nothing here decides *whether* to upgrade; it only carries one out, safely
//! again after a crash at any point, and says whether the old data is still whole.
//!
//! On the volume, beside the data directory `<data>`:
//! - `<data>.upgrading-<new>`: the new cluster while `pg_upgrade` fills it (scratch: removed
//!   and made again by the next attempt);
//! - `<data>.pre-upgrade-<old>`: the old data directory once the new one took its place. In
//!   `copy` mode it is whole, the way back until the upgrade is confirmed ([`confirm`]); in
//!   `link` mode it shares its files with the new cluster and is no way back (the backup
//!   taken before is).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engine::{PG_SUPERUSER, control_data, initdb_args};
use crate::error::one_line;
use crate::process;

/// `pg_upgrade` copies every file by default: the time grows with the data, and the old
/// directory stays whole.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
const TOOL_TIMEOUT: Duration = Duration::from_secs(300);

/// How `pg_upgrade` moves the data files (`spec.upgrade.method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Method {
    /// Copies: the old data directory is kept whole until the upgrade is confirmed.
    Copy,
    /// Hard links: seconds whatever the size, but the old directory is not startable once
    /// the new cluster has run.
    Link,
}

/// Why an upgrade did not happen or did not finish.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeError {
    /// `pg_upgrade --check` (or a precondition) refused: nothing was changed.
    #[error("{0}")]
    Refused(String),
    /// It failed after it started. `old_intact`: the old data directory is where it was and
    /// starts on the old major (always so in `copy` mode).
    #[error("{message}")]
    Failed { message: String, old_intact: bool },
}

/// One upgrade of `data` from the major of `old_bin` to that of `new_bin`.
#[derive(Clone, Debug)]
pub struct Upgrade {
    pub old_bin: PathBuf,
    pub new_bin: PathBuf,
    /// The data directory (`PGDATA`), stopped cleanly.
    pub data: PathBuf,
    pub method: Method,
    /// The major the new binaries run.
    pub new_major: u32,
    /// Server settings both clusters start with while `pg_upgrade` runs them, e.g. the pod's
    /// `hba_file` and `ident_file` (peer authentication of the superuser over the socket).
    pub server_settings: Vec<(String, String)>,
    /// A private directory for the servers' sockets (short: socket paths are limited).
    pub socket_dir: PathBuf,
    /// The port the servers take on that socket (they listen on no TCP address).
    pub port: u16,
    /// A test's fault ([`crate::test_hooks::MAJOR_UPGRADE`]): fail once `pg_upgrade`
    /// finished, before the swap.
    pub fail_after_pg_upgrade: bool,
}

/// What [`Upgrade::run`] found or did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Only checked (`pg_upgrade --check` passed): nothing changed.
    Checked,
    /// The data directory now holds the new major; the old one is at `kept`.
    Upgraded { kept: PathBuf },
    /// An earlier run had finished (a restart after it): nothing to do.
    AlreadyDone,
}

/// `devctl-agent upgrade`'s arguments.
#[derive(Debug, clap::Args)]
pub struct Request {
    /// The old major's binaries.
    #[arg(long)]
    pub old_bindir: PathBuf,
    /// The new major's binaries.
    #[arg(long)]
    pub new_bindir: PathBuf,
    /// The data directory (PGDATA), stopped cleanly.
    #[arg(long)]
    pub data: PathBuf,
    /// copy (keeps the old data directory whole until confirmed) or link.
    #[arg(long, value_enum, default_value_t = Method::Copy)]
    pub method: Method,
    /// Only `pg_upgrade --check`: nothing changes.
    #[arg(long)]
    pub check: bool,
    /// The port the servers take on their socket (no TCP listener).
    #[arg(long, default_value_t = 50432)]
    pub port: u16,
    /// A private directory for the servers' sockets (pg_upgrade also runs there).
    #[arg(long)]
    pub socket_dir: PathBuf,
    /// A server setting both clusters start with, NAME=VALUE (e.g. hba_file=…), repeated;
    /// the value of letters, digits and _./:,- only.
    #[arg(long = "setting", value_parser = parse_setting)]
    pub settings: Vec<(String, String)>,
}

/// `NAME=VALUE` of `--setting`. pg_upgrade hands these to pg_ctl through a shell: nothing
/// that would need quoting.
fn parse_setting(setting: &str) -> Result<(String, String), String> {
    match setting.split_once('=') {
        Some((name, value))
            if !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !value.is_empty()
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_./:,-".contains(c)) =>
        {
            Ok((name.to_string(), value.to_string()))
        }
        _ => Err(format!(
            "--setting must be NAME=VALUE, the value of letters, digits and _./:,- only, got {setting:?}"
        )),
    }
}

/// `devctl-agent upgrade`: the exit code and the JSON line to print.
pub async fn run_command(request: Request) -> (i32, String) {
    let line = |result: &str, message: &str, old_intact: Option<bool>| {
        serde_json::json!({ "result": result, "message": message, "oldIntact": old_intact })
            .to_string()
    };
    let new_major = match binaries_major(&request.new_bindir).await {
        Ok(major) => major,
        Err(e) => return (1, line("Refused", &e, Some(true))),
    };
    let upgrade = Upgrade {
        old_bin: request.old_bindir,
        new_bin: request.new_bindir,
        data: request.data,
        method: request.method,
        new_major,
        server_settings: request.settings,
        socket_dir: request.socket_dir,
        port: request.port,
        fail_after_pg_upgrade: false,
    };
    match upgrade.run(request.check).await {
        Ok(Outcome::Checked) => (0, line("Checked", "pg_upgrade --check passed", Some(true))),
        Ok(Outcome::Upgraded { kept }) => (
            0,
            line(
                "Upgraded",
                &format!(
                    "upgraded to PostgreSQL {new_major}; the old data directory is at {}",
                    kept.display()
                ),
                None,
            ),
        ),
        Ok(Outcome::AlreadyDone) => (
            0,
            line(
                "AlreadyDone",
                &format!("the data directory already holds PostgreSQL {new_major}"),
                None,
            ),
        ),
        Err(UpgradeError::Refused(message)) => (1, line("Refused", &message, Some(true))),
        Err(UpgradeError::Failed {
            message,
            old_intact,
        }) => (1, line("Failed", &message, Some(old_intact))),
    }
}

/// The major of the PostgreSQL binaries in `bin` (`postgres --version`).
pub async fn binaries_major(bin: &Path) -> Result<u32, String> {
    let program = bin.join("postgres");
    let output = process::run(
        &program,
        &["--version".to_string()],
        &[],
        bin,
        b"",
        TOOL_TIMEOUT,
    )
    .await?;
    version_major(&output.stdout).ok_or_else(|| {
        format!(
            "{} --version said {:?}",
            program.display(),
            output.stdout.trim()
        )
    })
}

/// Pure: the major in `postgres --version`'s answer: `postgres (PostgreSQL) 17.11`, or
/// `postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)` from Debian and PGDG builds.
pub fn version_major(answer: &str) -> Option<u32> {
    let (_, rest) = answer.split_once("(PostgreSQL)")?;
    crate::engine::version_number(rest.trim())
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Whether an upgrade to `new_major` left anything beside `data` (a new cluster being made, or
/// a kept old one): a data directory missing then may be mid-swap.
pub fn upgrade_started(data: &Path, new_major: u32) -> bool {
    upgrading_dir(data, new_major).exists() || (1..new_major).any(|m| kept_dir(data, m).exists())
}

/// `<data>.upgrading-<major>`.
pub fn upgrading_dir(data: &Path, major: u32) -> PathBuf {
    sibling(data, &format!("upgrading-{major}"))
}

/// `<data>.pre-upgrade-<major>`.
pub fn kept_dir(data: &Path, major: u32) -> PathBuf {
    sibling(data, &format!("pre-upgrade-{major}"))
}

fn sibling(data: &Path, suffix: &str) -> PathBuf {
    let mut name = data.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}"));
    data.with_file_name(name)
}

/// The major a data directory holds (`PG_VERSION`), `None` when it holds none.
pub fn data_major(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("PG_VERSION"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Where an interrupted or finished upgrade stands, from the directories alone.
#[derive(Debug, PartialEq, Eq)]
pub enum Stage {
    /// `<data>` holds the new major: done.
    Done,
    /// `pg_upgrade` finished (the new cluster is marked) but `<data>` still holds `old`.
    SwapPending { old: u32 },
    /// `<data>` was moved to `kept` but the new cluster not yet into its place.
    SwapHalfDone,
    /// `<data>` holds `old` (lower than the new major): start (again) from the check.
    Pending { old: u32 },
}

/// Pure: the stage, given `<data>`'s major, whether a kept old directory exists, whether the
/// upgrading directory holds a finished new cluster (marked), and the new major. A data
/// directory on a newer major than the binaries, or with nothing at all, is refused.
pub fn stage(
    data_major: Option<u32>,
    kept_exists: bool,
    upgraded_exists: bool,
    new_major: u32,
) -> Result<Stage, UpgradeError> {
    match data_major {
        Some(m) if m == new_major => Ok(Stage::Done),
        // Finished but not moved yet (a crash after the marker): only the moves are left.
        Some(m) if m < new_major && upgraded_exists => Ok(Stage::SwapPending { old: m }),
        Some(m) if m < new_major => Ok(Stage::Pending { old: m }),
        Some(m) => Err(UpgradeError::Refused(format!(
            "the data directory holds PostgreSQL {m}, newer than {new_major}: a major version is never downgraded"
        ))),
        None if kept_exists && upgraded_exists => Ok(Stage::SwapHalfDone),
        None => Err(UpgradeError::Refused(
            "the data directory holds no PostgreSQL data to upgrade".into(),
        )),
    }
}

/// Pure: `initdb`'s checksum flag for the new cluster, which must match the old one's.
/// PostgreSQL 18's `initdb` enables checksums by default; earlier ones do not.
pub fn checksum_args(old_has_checksums: bool, new_major: u32) -> &'static [&'static str] {
    match (old_has_checksums, new_major >= 18) {
        (true, _) => &["--data-checksums"],
        (false, true) => &["--no-data-checksums"],
        (false, false) => &[],
    }
}

/// Pure: `pg_upgrade`'s reason for refusing, from its output: the failing check's line and
/// the explanation after it (without the progress lines before).
pub fn refusal_reason(output: &str) -> String {
    let lines: Vec<&str> = output.lines().collect();
    let start = lines
        .iter()
        .position(|l| {
            let lower = l.to_ascii_lowercase();
            lower.trim_end().ends_with("fatal")
                || lower.contains("failed check")
                || lower.contains("checks failed")
                || lower.contains("error")
        })
        .unwrap_or(0);
    let text = lines[start..]
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty() && !l.starts_with("Failure, exiting"))
        .collect::<Vec<_>>()
        .join(" ");
    let text = one_line(&text);
    if text.is_empty() {
        "pg_upgrade failed without saying why".into()
    } else {
        text
    }
}

impl Upgrade {
    /// The upgrade (or with `check_only` its check alone), resumed from wherever an earlier
    /// run stopped. A finished new cluster is never made again, and the old data directory
    /// is never removed.
    pub async fn run(&self, check_only: bool) -> Result<Outcome, UpgradeError> {
        let new = upgrading_dir(&self.data, self.new_major);
        let marked = data_major(&new) == Some(self.new_major) && new.join(UPGRADED).is_file();
        let kept_any = self.kept_any();
        let old_major = match stage(
            data_major(&self.data),
            kept_any.is_some(),
            marked,
            self.new_major,
        )? {
            Stage::Done => return Ok(Outcome::AlreadyDone),
            Stage::SwapHalfDone if check_only => {
                return Err(UpgradeError::Refused(
                    "an upgrade is half done (the data directory was moved aside): run it without --check to finish it".into(),
                ));
            }
            Stage::SwapHalfDone => {
                self.put_in_place(&new)?;
                return Ok(Outcome::Upgraded {
                    kept: kept_any.unwrap_or_default(),
                });
            }
            Stage::SwapPending { old } if !check_only => return self.swap(&new, old),
            Stage::SwapPending { .. } => return Ok(Outcome::Checked),
            Stage::Pending { old } => old,
        };
        let failed = |message: String, old_intact: bool| UpgradeError::Failed {
            message: format!(
                "upgrading from PostgreSQL {old_major} to {}: {message}",
                self.new_major
            ),
            old_intact,
        };
        if self.old_disabled() {
            // `--link` renamed the old pg_control and did not finish: the old data may
            // share files with a new cluster that ran. Nothing here touches it again.
            return Err(failed(
                "an earlier pg_upgrade --link disabled the old cluster (global/pg_control.old) and did not finish; the way back is the backup taken before the upgrade".into(),
                false,
            ));
        }
        // Check first, always, on a scratch new cluster: nothing on the old side changes.
        self.init_new(&new).await.map_err(UpgradeError::Refused)?;
        let checked = self.pg_upgrade(&new, true).await;
        self.discard(&new);
        if let Err(reason) = checked {
            return Err(UpgradeError::Refused(format!(
                "pg_upgrade --check from PostgreSQL {old_major} to {}: {reason}",
                self.new_major
            )));
        }
        if check_only {
            return Ok(Outcome::Checked);
        }
        if let Err(e) = self.init_new(&new).await {
            return Err(failed(e, true));
        }
        if let Err(reason) = self.pg_upgrade(&new, false).await {
            // `--link` disables the old cluster (renames its pg_control) once it starts
            // linking; before that, and always in copy mode, the old data is whole.
            let old_intact = !self.old_disabled();
            if old_intact {
                self.discard(&new);
            }
            return Err(failed(reason, old_intact));
        }
        if self.fail_after_pg_upgrade {
            self.discard(&new);
            return Err(failed(
                "failed after pg_upgrade (test hook major-upgrade=fail)".into(),
                true,
            ));
        }
        // Everything below only moves directories: marked first, so that a crash before or
        // between the moves is finished by the next run.
        if let Err(e) = std::fs::write(new.join(UPGRADED), b"").and_then(|()| sync_dir(&new)) {
            return Err(failed(
                format!("marking {}: {e}", new.display()),
                !self.old_disabled(),
            ));
        }
        self.swap(&new, old_major)
    }

    /// `<data>` → `<data>.pre-upgrade-<old>`, then the marked new cluster → `<data>`.
    fn swap(&self, new: &Path, old_major: u32) -> Result<Outcome, UpgradeError> {
        let kept = kept_dir(&self.data, old_major);
        if kept.exists() {
            // A kept directory from an earlier upgrade of the same major (rolled back, then
            // upgraded again): the data directory being upgraded is the newer truth.
            let stale = sibling(&self.data, &format!("pre-upgrade-{old_major}.stale"));
            remove_dir(&stale);
            std::fs::rename(&kept, &stale).map_err(|e| UpgradeError::Failed {
                message: format!("moving the earlier {} aside: {e}", kept.display()),
                old_intact: !self.old_disabled(),
            })?;
        }
        std::fs::rename(&self.data, &kept).map_err(|e| UpgradeError::Failed {
            message: format!("moving {} aside: {e}", self.data.display()),
            old_intact: !self.old_disabled(),
        })?;
        self.put_in_place(new)?;
        Ok(Outcome::Upgraded { kept })
    }

    /// `pg_upgrade --link` renamed the old cluster's `pg_control` (it must not start again).
    fn old_disabled(&self) -> bool {
        let global = self.data.join("global");
        global.join("pg_control.old").exists() && !global.join("pg_control").exists()
    }

    /// Removes a scratch or failed new cluster, keeping `pg_upgrade`'s logs beside the data
    /// (`<data>.upgrade-logs`: its failure message points into them).
    fn discard(&self, new: &Path) {
        let logs = new.join("pg_upgrade_output.d");
        if logs.is_dir() {
            let kept_logs = sibling(&self.data, "upgrade-logs");
            remove_dir(&kept_logs);
            if let Err(e) = std::fs::rename(&logs, &kept_logs) {
                tracing::warn!("keeping pg_upgrade's logs: {e}");
            }
        }
        remove_dir(new);
    }

    fn put_in_place(&self, new: &Path) -> Result<(), UpgradeError> {
        std::fs::rename(new, &self.data).map_err(|e| UpgradeError::Failed {
            message: format!(
                "moving the upgraded data {} to {}: {e}",
                new.display(),
                self.data.display()
            ),
            old_intact: false,
        })?;
        let _ = std::fs::remove_file(self.data.join(UPGRADED));
        if let Some(parent) = self.data.parent()
            && let Err(e) = sync_dir(parent)
        {
            tracing::warn!("syncing {}: {e}", parent.display());
        }
        Ok(())
    }

    /// A kept old data directory of any major below the new one.
    fn kept_any(&self) -> Option<PathBuf> {
        (1..self.new_major)
            .rev()
            .map(|m| kept_dir(&self.data, m))
            .find(|d| d.is_dir())
    }

    /// A fresh, empty new cluster at `new`, like the agent's own bootstrap, with the old
    /// cluster's checksum setting (the old cluster must have stopped cleanly).
    async fn init_new(&self, new: &Path) -> Result<(), String> {
        remove_dir(new);
        let control = control_data(&self.old_bin, &self.data).await?;
        if !control.is_clean_primary_shutdown() {
            return Err(format!(
                "the old cluster was not shut down cleanly (state: {}): start and stop it on PostgreSQL {} first",
                control.state,
                data_major(&self.data).unwrap_or_default()
            ));
        }
        let checksums = control
            .data_checksums
            .ok_or("pg_controldata does not say whether the old cluster has checksums")?;
        let output = process::run(
            &self.new_bin.join("initdb"),
            &initdb_args(new, checksum_args(checksums, self.new_major)),
            &[],
            &self.work_dir(),
            b"",
            TOOL_TIMEOUT,
        )
        .await?;
        if !output.status.success() {
            remove_dir(new);
            return Err(format!(
                "initdb of the new cluster failed: {}",
                output.error_line()
            ));
        }
        Ok(())
    }

    async fn pg_upgrade(&self, new: &Path, check_only: bool) -> Result<(), String> {
        let options = self
            .server_settings
            .iter()
            .map(|(name, value)| format!("-c {name}={value}"))
            .collect::<Vec<_>>()
            .join(" ");
        let mut args = vec![
            format!("--old-bindir={}", self.old_bin.display()),
            format!("--new-bindir={}", self.new_bin.display()),
            format!("--old-datadir={}", self.data.display()),
            format!("--new-datadir={}", new.display()),
            format!("--old-port={}", self.port),
            format!("--new-port={}", self.port),
            format!("--socketdir={}", self.socket_dir.display()),
            format!("--username={PG_SUPERUSER}"),
            match self.method {
                Method::Copy => "--copy".into(),
                Method::Link => "--link".into(),
            },
        ];
        if !options.is_empty() {
            args.push(format!("--old-options={options}"));
            args.push(format!("--new-options={options}"));
        }
        if check_only {
            args.push("--check".into());
        }
        // Run from the private socket directory: pg_upgrade writes `delete_old_cluster.sh`
        // (an `rm -rf` of the old path, which is the new data directory after the swap) into
        // its working directory, and that must not stay on the volume.
        let result = process::run(
            &self.new_bin.join("pg_upgrade"),
            &args,
            &[],
            &self.socket_dir,
            b"",
            UPGRADE_TIMEOUT,
        )
        .await;
        let _ = std::fs::remove_file(self.socket_dir.join("delete_old_cluster.sh"));
        let output = match result {
            Ok(output) => output,
            Err(e) => {
                // Killed on its timeout: the server it started would keep running.
                self.stop_server(&self.new_bin, new).await;
                self.stop_server(&self.old_bin, &self.data).await;
                return Err(e);
            }
        };
        if output.status.success() {
            return Ok(());
        }
        let mut reason = refusal_reason(&format!("{}\n{}", output.stdout, output.stderr));
        // The problem objects are listed in a file pg_upgrade names; the first lines say
        // which (e.g. `In database: app` / `public.t.c`).
        if let Some(listing) = named_file(&output.stdout)
            && let Ok(text) = std::fs::read_to_string(&listing)
        {
            let first: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .take(6)
                .collect();
            if !first.is_empty() {
                reason = format!("{reason} ({})", first.join("; "));
            }
        }
        Err(reason)
    }

    /// Best effort: `pg_ctl stop` of a server `pg_upgrade` left running in `dir`.
    async fn stop_server(&self, bin: &Path, dir: &Path) {
        if !dir.join("postmaster.pid").exists() {
            return;
        }
        let args = vec![
            "-D".to_string(),
            dir.display().to_string(),
            "-m".into(),
            "fast".into(),
            "-w".into(),
            "stop".into(),
        ];
        if let Err(e) = process::run(
            &bin.join("pg_ctl"),
            &args,
            &[],
            &self.work_dir(),
            b"",
            TOOL_TIMEOUT,
        )
        .await
        {
            tracing::warn!(
                "stopping the server pg_upgrade left in {}: {e}",
                dir.display()
            );
        }
    }

    /// Where the tools run: the volume, beside the data directory.
    fn work_dir(&self) -> PathBuf {
        self.data
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"))
    }
}

/// The copy-mode upgrade is confirmed (the new major runs and the cluster is Ready): the old
/// data directory kept beside it goes.
pub fn confirm(data: &Path, old_major: u32) {
    remove_dir(&kept_dir(data, old_major));
}

/// The way back in copy mode: the upgraded data directory goes aside
/// (`<data>.failed-upgrade-<new>`, for a look) and the kept old one returns. Refused when
/// there is no kept old directory.
pub fn roll_back(data: &Path, old_major: u32, new_major: u32) -> Result<(), String> {
    let kept = kept_dir(data, old_major);
    if !kept.is_dir() {
        return Err(format!(
            "{} is not there: the old data directory cannot be restored (confirmed already)",
            kept.display()
        ));
    }
    let global = kept.join("global");
    if data_major(&kept) != Some(old_major)
        || !global.join("pg_control").is_file()
        || global.join("pg_control.old").exists()
    {
        return Err(format!(
            "{} was disabled by pg_upgrade --link (its files are the new cluster's): the way back is the backup taken before the upgrade",
            kept.display()
        ));
    }
    if data_major(data) == Some(new_major) {
        let failed = sibling(data, &format!("failed-upgrade-{new_major}"));
        remove_dir(&failed);
        std::fs::rename(data, &failed)
            .map_err(|e| format!("moving {} aside: {e}", data.display()))?;
    }
    std::fs::rename(&kept, data).map_err(|e| format!("restoring {}: {e}", kept.display()))
}

/// Marks an upgrading directory that `pg_upgrade` finished.
pub const UPGRADED: &str = "devctl-upgraded";

/// The file `pg_upgrade` lists problem objects in (`... is in the file:` and a path on the
/// next line, or on the same line).
fn named_file(output: &str) -> Option<PathBuf> {
    let lines: Vec<&str> = output.lines().collect();
    lines.iter().enumerate().find_map(|(i, line)| {
        let (_, rest) = line.split_once("in the file:")?;
        let path = rest.trim();
        let path = if path.is_empty() {
            lines.get(i + 1)?.trim()
        } else {
            path
        };
        path.starts_with('/').then(|| PathBuf::from(path))
    })
}

/// fsync of a directory: its entries (a marker, a rename) survive a crash.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

fn remove_dir(dir: &Path) {
    if dir.exists()
        && let Err(e) = std::fs::remove_dir_all(dir)
    {
        tracing::warn!("removing {}: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_directories_beside_the_data() {
        let data = Path::new("/var/lib/postgresql/data/pgdata");
        assert_eq!(
            upgrading_dir(data, 17),
            PathBuf::from("/var/lib/postgresql/data/pgdata.upgrading-17")
        );
        assert_eq!(
            kept_dir(data, 15),
            PathBuf::from("/var/lib/postgresql/data/pgdata.pre-upgrade-15")
        );
    }

    #[test]
    fn an_upgrade_resumes_from_its_directories_and_never_goes_down() {
        assert_eq!(
            stage(Some(15), false, false, 17),
            Ok(Stage::Pending { old: 15 })
        );
        // pg_upgrade finished (marked), nothing moved yet: only the moves are left.
        assert_eq!(
            stage(Some(15), false, true, 17),
            Ok(Stage::SwapPending { old: 15 })
        );
        assert_eq!(stage(Some(17), true, false, 17), Ok(Stage::Done));
        // Between the two moves: finish the swap.
        assert_eq!(stage(None, true, true, 17), Ok(Stage::SwapHalfDone));
        assert!(
            matches!(stage(Some(18), false, false, 17), Err(UpgradeError::Refused(m)) if m.contains("never downgraded"))
        );
        assert!(matches!(
            stage(None, false, false, 17),
            Err(UpgradeError::Refused(_))
        ));
        assert!(matches!(
            stage(None, true, false, 17),
            Err(UpgradeError::Refused(_))
        ));
    }

    #[test]
    fn reads_the_version_of_every_build() {
        let major = version_major;
        assert_eq!(major("postgres (PostgreSQL) 17.11\n"), Some(17));
        assert_eq!(
            major("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)\n"),
            Some(15)
        );
    }

    #[test]
    fn the_new_cluster_keeps_the_old_ones_checksum_setting() {
        assert_eq!(checksum_args(true, 17), ["--data-checksums"]);
        assert_eq!(checksum_args(true, 18), ["--data-checksums"]);
        assert!(checksum_args(false, 17).is_empty());
        assert_eq!(checksum_args(false, 18), ["--no-data-checksums"]);
    }

    #[test]
    fn reads_pg_upgrades_reason_and_the_file_it_names() {
        let output = "Performing Consistency Checks on Old Live Server\n\
                      ------------------------------------------------\n\
                      Checking cluster versions                                     ok\n\
                      Checking for reg* data types in user tables                   fatal\n\
                      \n\
                      Your installation contains one of the reg* data types in user tables.\n\
                      A list of the problem columns is in the file:\n    \
                      /data/pgdata.upgrading-17/pg_upgrade_output.d/x/tables_using_reg.txt\n\
                      Failure, exiting\n";
        let reason = refusal_reason(output);
        assert!(
            reason.starts_with(
                "Checking for reg* data types in user tables fatal Your installation contains"
            ),
            "{reason}"
        );
        assert!(!reason.contains("cluster versions"), "{reason}");
        assert_eq!(
            named_file(output),
            Some(PathBuf::from(
                "/data/pgdata.upgrading-17/pg_upgrade_output.d/x/tables_using_reg.txt"
            ))
        );
    }
}
