//! The checked-in CRDs under deploy/ are exactly what the Rust types generate.
//! Regenerate with `DEVCTL_UPDATE_MANIFESTS=1 cargo test -p devctl-api --test deploy_in_sync`.

use std::path::PathBuf;

#[test]
fn checked_in_crds_match_the_rust_types() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    let update = std::env::var("DEVCTL_UPDATE_MANIFESTS").is_ok_and(|v| v == "1");
    for crd in devctl_api::crds() {
        let name = crd.metadata.name.clone().unwrap();
        let path = dir.join(format!("{name}.yaml"));
        let generated = devctl_api::to_yaml(&crd).unwrap();
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &generated).unwrap();
            continue;
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "{} is out of date with the Rust types; regenerate it with\n  DEVCTL_UPDATE_MANIFESTS=1 cargo test -p devctl-api --test deploy_in_sync",
            path.display()
        );
    }
}
