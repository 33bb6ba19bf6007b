//! A container's environment as the kubelet would set it: `envFrom`, `env` with `$(VAR)`
//! expansion, Secret and ConfigMap references, and downward-API fields.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::api::Api;
use kube::{Resource, ResourceExt};

use super::supervisor::Ctx;

/// The container's environment as the kubelet would set it (`envFrom`, then `env` in order
/// with `$(VAR)` references expanded; the pod's IP is loopback).
pub(super) async fn resolve_env(
    ctx: &Ctx,
    pod: &Pod,
    container: &Container,
) -> Result<BTreeMap<String, String>, String> {
    let namespace = pod.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut env = BTreeMap::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(source) = &from.config_map_ref {
            match config_maps
                .get_opt(&source.name)
                .await
                .map_err(|e| format!("read ConfigMap {}: {e}", source.name))?
            {
                Some(cm) => env.extend(
                    cm.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (format!("{prefix}{k}"), v)),
                ),
                None if source.optional == Some(true) => {}
                None => {
                    return Err(format!(
                        "ConfigMap {namespace}/{} does not exist (yet)",
                        source.name
                    ));
                }
            }
        }
        if let Some(source) = &from.secret_ref {
            match secrets
                .get_opt(&source.name)
                .await
                .map_err(|e| format!("read Secret {}: {e}", source.name))?
            {
                Some(secret) => {
                    env.extend(secret.data.unwrap_or_default().into_iter().map(|(k, v)| {
                        (
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v.0).into_owned(),
                        )
                    }))
                }
                None if source.optional == Some(true) => {}
                None => {
                    return Err(format!(
                        "Secret {namespace}/{} does not exist (yet)",
                        source.name
                    ));
                }
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = if let Some(value) = &var.value {
            expand(value, &env)
        } else if let Some(from) = &var.value_from {
            if let Some(field) = &from.field_ref {
                field_value(pod, &field.field_path).ok_or_else(|| {
                    format!(
                        "env {}: unsupported fieldRef {}",
                        var.name, field.field_path
                    )
                })?
            } else if let Some(key) = &from.secret_key_ref {
                let found = secrets
                    .get_opt(&key.name)
                    .await
                    .map_err(|e| format!("read Secret {}: {e}", key.name))?;
                match found.and_then(|s| s.data?.remove(&key.key)) {
                    Some(value) => String::from_utf8_lossy(&value.0).into_owned(),
                    None if key.optional == Some(true) => continue,
                    None => {
                        return Err(format!(
                            "env {}: key {} of Secret {namespace}/{} does not exist (yet)",
                            var.name, key.key, key.name
                        ));
                    }
                }
            } else if let Some(key) = &from.config_map_key_ref {
                let found = config_maps
                    .get_opt(&key.name)
                    .await
                    .map_err(|e| format!("read ConfigMap {}: {e}", key.name))?;
                match found.and_then(|c| c.data?.remove(&key.key)) {
                    Some(value) => value,
                    None if key.optional == Some(true) => continue,
                    None => {
                        return Err(format!(
                            "env {}: key {} of ConfigMap {namespace}/{} does not exist (yet)",
                            var.name, key.key, key.name
                        ));
                    }
                }
            } else {
                tracing::debug!(var = %var.name, "pod runner: unsupported valueFrom, left out");
                continue;
            }
        } else {
            String::new()
        };
        env.insert(var.name.clone(), value);
    }
    Ok(env)
}

/// A downward-API field of the pod, as the runner's process sees it.
fn field_value(pod: &Pod, path: &str) -> Option<String> {
    let meta = pod.meta();
    let spec = pod.spec.as_ref();
    let keyed = |prefix: &str, map: Option<&BTreeMap<String, String>>| -> Option<Option<String>> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key).cloned()))
    };
    if let Some(value) = keyed("metadata.labels['", meta.labels.as_ref()) {
        return Some(value.unwrap_or_default());
    }
    if let Some(value) = keyed("metadata.annotations['", meta.annotations.as_ref()) {
        return Some(value.unwrap_or_default());
    }
    Some(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "status.podIP" | "status.podIPs" | "status.hostIP" | "status.hostIPs" => "127.0.0.1".into(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        _ => return None,
    })
}

/// Kubernetes' `$(VAR)` expansion: defined variables are replaced, `$$` is a literal `$`,
/// anything else stays as written.
pub(super) fn expand(value: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
            && let Some(found) = env.get(&inner[..end])
        {
            out.push_str(found);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_references_like_the_kubelet() {
        let env: BTreeMap<String, String> = [("A".to_string(), "x".to_string())].into();
        assert_eq!(expand("$(A)/b", &env), "x/b");
        assert_eq!(expand("$$(A) $(B) $", &env), "$(A) $(B) $");
    }
}
