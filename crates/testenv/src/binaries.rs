//! Where the pinned control-plane binaries live, and building them on first use.

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
    if let Some(dir) = std::env::var_os("DEVCTL_CONTROL_PLANE_DIR") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("devctl").join("control-plane")
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
}
