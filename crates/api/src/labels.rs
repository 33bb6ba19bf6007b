//! The standard `app.kubernetes.io/*` labels on everything the operator creates.

use std::collections::BTreeMap;

pub const NAME: &str = "app.kubernetes.io/name";
pub const INSTANCE: &str = "app.kubernetes.io/instance";
pub const COMPONENT: &str = "app.kubernetes.io/component";
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const VERSION: &str = "app.kubernetes.io/version";

/// The value of `app.kubernetes.io/managed-by`; children are watched by this label, so the
/// operator's caches hold only what it owns.
pub const MANAGER: &str = "devctl-operator";

/// `app.kubernetes.io/managed-by=devctl-operator`, the selector of every child watch.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY}={MANAGER}")
}

/// Labels that identify the pods of one instance (`name` + `instance`): the selector of a
/// StatefulSet or Deployment, which must never change after creation.
pub fn selector(name: &str, instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME.to_string(), name.to_string()),
        (INSTANCE.to_string(), instance.to_string()),
    ])
}

/// The full set of standard labels.
pub fn standard(
    name: &str,
    instance: &str,
    component: &str,
    version: &str,
) -> BTreeMap<String, String> {
    let mut labels = selector(name, instance);
    labels.insert(COMPONENT.to_string(), component.to_string());
    labels.insert(MANAGED_BY.to_string(), MANAGER.to_string());
    // Label values allow [A-Za-z0-9._-] only, at most 63 characters.
    let version: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    labels.insert(VERSION.to_string(), version);
    labels
}

/// `k=v,k2=v2` form of a label map (for status.selector and list calls).
pub fn to_selector_string(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
