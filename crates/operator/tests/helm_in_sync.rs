//! deploy/helm/devctl is exactly what `devctl_operator::helm::chart()` generates from the
//! install manifests, file for file (no file missing, none extra).
//! Regenerate with `DEVCTL_UPDATE_MANIFESTS=1 cargo test -p devctl-operator --test helm_in_sync`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use devctl_operator::helm::{CHART_DIR, chart};

/// Every file under `dir`, relative to it.
fn files_under(dir: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if let Ok(relative) = path.strip_prefix(root) {
                out.insert(relative.to_string_lossy().into_owned());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn checked_in_chart_matches_the_rust_source() {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", "..", CHART_DIR]
        .iter()
        .collect();
    let generated = chart().unwrap();
    let wanted: BTreeSet<String> = generated.iter().map(|f| f.path.clone()).collect();
    if std::env::var("DEVCTL_UPDATE_MANIFESTS").is_ok_and(|v| v == "1") {
        for stale in files_under(&dir).difference(&wanted) {
            std::fs::remove_file(dir.join(stale)).unwrap();
        }
        for file in &generated {
            let path = dir.join(&file.path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &file.contents).unwrap();
        }
        return;
    }
    let regenerate = "regenerate it with\n  DEVCTL_UPDATE_MANIFESTS=1 cargo test -p devctl-operator --test helm_in_sync";
    let present = files_under(&dir);
    assert!(
        present == wanted,
        "{} has files {:?} but the generator makes {:?}; {regenerate}",
        dir.display(),
        present,
        wanted
    );
    for file in &generated {
        let path = dir.join(&file.path);
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == file.contents,
            "{} is out of date; {regenerate}",
            path.display()
        );
    }
}
