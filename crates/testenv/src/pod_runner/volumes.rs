//! A pod's volumes as local directories: claims (which outlive the pod), ConfigMap and
//! Secret volumes written out as files, and the claim directories left on disk.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::Api;

use super::lock;
use super::plan::Plan;
use super::supervisor::Ctx;
use crate::Error;

/// Creates `path` (and parents) with `mode`, owned by `owner` if given.
pub(super) fn make_dir(path: &Path, owner: Option<(u32, u32)>, mode: u32) -> Result<(), Error> {
    std::fs::create_dir_all(path)
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
        .and_then(|()| match owner {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid)),
            None => Ok(()),
        })
        .map_err(|e| Error::io(format!("create {}", path.display()), e))
}

/// A claim volume of a pod: its local directory.
pub(super) struct ClaimVolume {
    pub(super) volume: String,
    pub(super) uid: String,
    pub(super) dir: PathBuf,
}

pub(super) async fn resolve_claims(
    ctx: &Ctx,
    namespace: &str,
    plan: &Plan,
) -> Result<Vec<ClaimVolume>, String> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let mut resolved = Vec::new();
    for (volume, claim) in plan.claims() {
        let found = api
            .get_opt(&claim)
            .await
            .map_err(|e| format!("read claim {claim}: {e}"))?
            .ok_or_else(|| format!("claim {namespace}/{claim} does not exist (yet)"))?;
        if found.metadata.deletion_timestamp.is_some() {
            return Err(format!("claim {namespace}/{claim} is being deleted"));
        }
        let uid = found.uid().unwrap_or_default();
        let dir = ctx.claim_dir(namespace, &claim, &uid);
        let claims_dir = ctx.root.join("claims");
        for parent in [claims_dir.clone(), claims_dir.join(namespace)] {
            make_dir(&parent, None, 0o755).map_err(|e| e.to_string())?;
        }
        make_dir(&dir, plan.run_as.owner(), 0o755).map_err(|e| e.to_string())?;
        lock(&ctx.shared)
            .claims
            .insert((namespace.to_string(), claim.clone()), dir.clone());
        resolved.push(ClaimVolume { volume, uid, dir });
    }
    Ok(resolved)
}

/// Writes a ConfigMap's or Secret's keys as files into `dir` (emptied first), or only
/// `items` at their paths.
pub(super) fn write_volume(
    dir: &Path,
    mut files: BTreeMap<String, Vec<u8>>,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    owner: Option<(u32, u32)>,
    mode: u32,
) -> Result<(), String> {
    if let Some(items) = items {
        files = items
            .iter()
            .filter_map(|item| Some((item.path.clone(), files.get(&item.key)?.clone())))
            .collect();
    }
    let _ = std::fs::remove_dir_all(dir);
    make_dir(dir, None, 0o755).map_err(|e| e.to_string())?;
    for (path, content) in files {
        let file = dir.join(&path);
        if let Some(parent) = file.parent() {
            make_dir(parent, None, 0o755).map_err(|e| e.to_string())?;
        }
        std::fs::write(&file, content)
            .and_then(|()| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)))
            .and_then(|()| match owner {
                Some((uid, gid)) => std::os::unix::fs::chown(&file, Some(uid), Some(gid)),
                None => Ok(()),
            })
            .map_err(|e| format!("write {}: {e}", file.display()))?;
    }
    Ok(())
}

/// `(namespace, claim, uid)` of every claim directory under `claims`.
pub(super) fn claim_dirs(claims: &Path) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    let Ok(namespaces) = std::fs::read_dir(claims) else {
        return found;
    };
    for namespace in namespaces.flatten() {
        let Ok(dirs) = std::fs::read_dir(namespace.path()) else {
            continue;
        };
        for dir in dirs.flatten() {
            let name = dir.file_name().to_string_lossy().to_string();
            // `<claim>-<uid>`, a uid being 36 characters.
            if name.len() > 37 && name.is_char_boundary(name.len() - 37) {
                let (claim, uid) = name.split_at(name.len() - 37);
                found.push((
                    namespace.file_name().to_string_lossy().to_string(),
                    claim.to_string(),
                    uid[1..].to_string(),
                ));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_claim_directories() {
        let dir = tempfile::tempdir().unwrap();
        let uid = "0f6e3c1a-1111-2222-3333-444455556666";
        std::fs::create_dir_all(dir.path().join("ns").join(format!("data-my-pg-0-{uid}"))).unwrap();
        assert_eq!(
            claim_dirs(dir.path()),
            vec![("ns".into(), "data-my-pg-0".into(), uid.into())]
        );
    }
}
