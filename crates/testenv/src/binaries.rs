//! Where the pinned control-plane binaries (and versitygw, the S3-compatible object store)
//! live, and building them on first use.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// `tools/control-plane/versions.env`, compiled in so the harness and the build script can
/// never disagree about the version (and therefore the cache directory).
const VERSIONS_ENV: &str = include_str!("../../../tools/control-plane/versions.env");
const BUILD_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tools/control-plane/build.sh"
);

/// Every binary the harness runs.
pub const ALL: [&str; 6] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
];

fn version_value(key: &str) -> Option<&'static str> {
    VERSIONS_ENV
        .lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
}

/// The pinned Kubernetes version, e.g. `v1.37.2`.
pub fn kubernetes_version() -> &'static str {
    version_value("KUBERNETES_VERSION").unwrap_or("unknown")
}

/// The cache root, as `build.sh` computes it.
fn cache_root() -> PathBuf {
    tool_cache_root("DEVCTL_CONTROL_PLANE_DIR", "control-plane")
}

/// Where a tools/ build script caches its tool: `$<variable>` if set, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/devctl/<name>` (what the scripts compute).
pub fn tool_cache_root(variable: &str, name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os(variable) {
        return PathBuf::from(dir);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("devctl")
        .join(name)
}

/// The pinned binaries and kwok's stage files.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub bin_dir: PathBuf,
    pub kwok_stages_dir: PathBuf,
}

impl Binaries {
    pub fn path(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    fn complete(&self) -> bool {
        ALL.iter().all(|b| is_executable(&self.path(b)))
            && self.kwok_stages_dir.join(".complete").exists()
    }

    /// The binaries, built with `tools/control-plane/build.sh` if any is missing.
    ///
    /// The build script takes a file lock, so concurrent test binaries wait for one build.
    /// Blocking: call it from `spawn_blocking` in async code.
    pub fn ensure() -> Result<Self, Error> {
        let root = cache_root().join(kubernetes_version());
        let found = Self {
            bin_dir: root.join("bin"),
            kwok_stages_dir: root.join("kwok-stages"),
        };
        if found.complete() {
            return Ok(found);
        }
        eprintln!(
            "devctl-testenv: control-plane binaries missing in {}; building them with {BUILD_SCRIPT} (tens of minutes on first use)",
            found.bin_dir.display()
        );
        let status = Command::new("bash")
            .arg(BUILD_SCRIPT)
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(|e| Error::io(format!("run {BUILD_SCRIPT}"), e))?;
        if !status.success() || !found.complete() {
            return Err(Error::Binaries(format!(
                "{BUILD_SCRIPT} failed ({status}); run it by hand to see why (it needs Go >= 1.26 and the Go module proxy)"
            )));
        }
        Ok(found)
    }
}

/// `tools/versitygw/versions.env`, compiled in like [`VERSIONS_ENV`].
const VERSITYGW_VERSIONS_ENV: &str = include_str!("../../../tools/versitygw/versions.env");
const VERSITYGW_BUILD_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tools/versitygw/build.sh"
);

/// Names a versitygw binary to use instead of the cached build (`tools/test.sh` exports it).
pub const VERSITYGW_ENV: &str = "DEVCTL_VERSITYGW";

/// The pinned versitygw version, e.g. `v1.8.0`.
pub fn versitygw_version() -> &'static str {
    VERSITYGW_VERSIONS_ENV
        .lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == "VERSITYGW_VERSION")
        .map(|(_, v)| v.trim())
        .unwrap_or("unknown")
}

/// Where `tools/versitygw/build.sh` puts the binary:
/// `${DEVCTL_VERSITYGW_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/devctl/versitygw}/<version>/bin/versitygw`.
pub fn versitygw_cache_path() -> PathBuf {
    tool_cache_root("DEVCTL_VERSITYGW_DIR", "versitygw")
        .join(versitygw_version())
        .join("bin")
        .join("versitygw")
}

/// The versitygw binary: `$DEVCTL_VERSITYGW` if set, else the cached build, built with
/// `tools/versitygw/build.sh` if missing (about 2 minutes on 2 cores; the script takes a file
/// lock, so concurrent test binaries wait for one build).
///
/// Blocking: call it from `spawn_blocking` in async code.
pub fn versitygw() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os(VERSITYGW_ENV) {
        let path = PathBuf::from(path);
        if is_executable(&path) {
            return Ok(path);
        }
        return Err(Error::Binaries(format!(
            "${VERSITYGW_ENV} names {}, which is not an executable file",
            path.display()
        )));
    }
    let path = versitygw_cache_path();
    if is_executable(&path) {
        return Ok(path);
    }
    eprintln!(
        "devctl-testenv: versitygw missing at {}; building it with {VERSITYGW_BUILD_SCRIPT} (minutes on first use)",
        path.display()
    );
    let status = Command::new("bash")
        .arg(VERSITYGW_BUILD_SCRIPT)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| Error::io(format!("run {VERSITYGW_BUILD_SCRIPT}"), e))?;
    if !status.success() || !is_executable(&path) {
        return Err(Error::Binaries(format!(
            "{VERSITYGW_BUILD_SCRIPT} failed ({status}) or did not produce {}; run it by hand to see why (it needs Go >= 1.26 and the Go module proxy)",
            path.display()
        )));
    }
    Ok(path)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_comes_from_versions_env() {
        assert!(super::kubernetes_version().starts_with("v1."));
    }

    #[test]
    fn versitygw_version_comes_from_its_versions_env() {
        let version = super::versitygw_version();
        assert!(version.starts_with('v'), "{version}");
        assert!(
            super::versitygw_cache_path().ends_with(format!("{version}/bin/versitygw")),
            "{}",
            super::versitygw_cache_path().display()
        );
    }
}
