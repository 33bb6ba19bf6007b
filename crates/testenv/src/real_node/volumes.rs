//! The real node's volume provisioner, as kind's local-path provisioner works: a claim in the
//! `local-path` class gets a directory on the node (mode 0777, so any pod user can write it;
//! a hostPath volume is not chowned to the pod's fsGroup) and a `hostPath` PersistentVolume
//! pinned to the node, pre-bound to the claim; kube-controller-manager's binder binds them.
//! A released volume's directory and PersistentVolume are deleted (reclaim policy `Delete`).
//!
//! It polls (every [`POLL`]) on a thread of its own with its own runtime, so a node held in a
//! static outlives the test runtimes that use it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::Error;

/// The StorageClass the provisioner serves (the real node's default class).
pub const STORAGE_CLASS: &str = "local-path";

/// The provisioner's name in the class and on the volumes it makes.
pub const PROVISIONER: &str = "devctl.io/local-path";

const POLL: Duration = Duration::from_millis(500);

/// The provisioner's thread; stops when dropped.
pub struct Provisioner {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Provisioner {
    pub fn start(
        kubeconfig: kube::config::Kubeconfig,
        node: &str,
        root: &Path,
    ) -> Result<Self, Error> {
        std::fs::create_dir_all(root)
            .map_err(|e| Error::io(format!("create {}", root.display()), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let node = node.to_string();
        let root = root.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("real-node-volumes".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(error = %e, "real node: no runtime for the volume provisioner");
                        return;
                    }
                };
                runtime.block_on(run(kubeconfig, node, root, stopping));
            })
            .map_err(|e| Error::io("start the volume provisioner thread", e))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn run(
    kubeconfig: kube::config::Kubeconfig,
    node: String,
    root: PathBuf,
    stop: Arc<AtomicBool>,
) {
    let client = match kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| e.to_string())
        .and_then(|c| kube::Client::try_from(c).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "real node: the volume provisioner has no client");
            return;
        }
    };
    while !stop.load(Ordering::SeqCst) {
        if let Err(e) = provision_once(&client, &node, &root).await {
            tracing::debug!(error = %e, "real node: volume provisioning pass failed; retrying");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The directory of the volume for claim `uid`.
pub fn volume_dir(root: &Path, uid: &str) -> PathBuf {
    root.join(format!("pvc-{uid}"))
}

async fn provision_once(client: &kube::Client, node: &str, root: &Path) -> Result<(), kube::Error> {
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let existing = volumes.list(&ListParams::default()).await?;
    for claim in claims.list(&ListParams::default()).await? {
        let spec = claim.spec.clone().unwrap_or_default();
        let pending = claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound");
        if spec.storage_class_name.as_deref() != Some(STORAGE_CLASS)
            || spec.volume_name.is_some()
            || !pending
            || claim.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let (Some(uid), Some(name), Some(namespace)) = (
            claim.metadata.uid.clone(),
            claim.metadata.name.clone(),
            claim.metadata.namespace.clone(),
        ) else {
            continue;
        };
        let volume_name = format!("pvc-{uid}");
        if existing
            .items
            .iter()
            .any(|v| v.metadata.name.as_deref() == Some(&volume_name))
        {
            continue;
        }
        let dir = volume_dir(root, &uid);
        if let Err(e) = make_world_writable_dir(&dir) {
            tracing::warn!(error = %e, dir = %dir.display(), "real node: cannot make a volume directory");
            continue;
        }
        let size = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone())
            .unwrap_or_else(|| "1Gi".into());
        let volume: PersistentVolume = match serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": volume_name,
                "annotations": { "pv.kubernetes.io/provisioned-by": PROVISIONER },
            },
            "spec": {
                "capacity": { "storage": size },
                "accessModes": spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": STORAGE_CLASS,
                "volumeMode": "Filesystem",
                "hostPath": { "path": dir.display().to_string(), "type": "Directory" },
                "claimRef": {
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "namespace": namespace, "name": name, "uid": uid,
                },
                "nodeAffinity": { "required": { "nodeSelectorTerms": [{ "matchExpressions": [{
                    "key": "kubernetes.io/hostname", "operator": "In", "values": [node],
                }]}]}},
            }
        })) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "real node: cannot build a PersistentVolume");
                continue;
            }
        };
        match volumes.create(&PostParams::default(), &volume).await {
            Ok(_) => {
                tracing::info!(claim = %format!("{namespace}/{name}"), dir = %dir.display(), "real node: volume provisioned")
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    for volume in existing {
        let ours = volume
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
            .map(String::as_str)
            == Some(PROVISIONER);
        let released = matches!(
            volume.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Released" | "Failed")
        );
        if !ours || !released || volume.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(name) = volume.metadata.name.clone() else {
            continue;
        };
        if let Some(path) = volume
            .spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .map(|h| PathBuf::from(&h.path))
            && path.starts_with(root)
        {
            let _ = std::fs::remove_dir_all(&path);
        }
        match volumes.delete(&name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(volume = %name, "real node: released volume deleted"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn make_world_writable_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    // Not the umask's: a pod running as any user writes here, as with kind's provisioner.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}
