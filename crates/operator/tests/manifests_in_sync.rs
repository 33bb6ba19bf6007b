//! deploy/operator.yaml is exactly `devctl operator manifests` with default options.
//! Regenerate with `DEVCTL_UPDATE_MANIFESTS=1 cargo test -p devctl-operator --test manifests_in_sync`.

use devctl_operator::manifests::{InstallOptions, manifests, to_yaml};

#[test]
fn checked_in_install_manifests_match_the_rust_source() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/operator.yaml");
    let generated = to_yaml(&manifests(&InstallOptions::default())).unwrap();
    if std::env::var("DEVCTL_UPDATE_MANIFESTS").is_ok_and(|v| v == "1") {
        std::fs::write(path, &generated).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{path} is out of date; regenerate it with\n  DEVCTL_UPDATE_MANIFESTS=1 cargo test -p devctl-operator --test manifests_in_sync"
    );
}
