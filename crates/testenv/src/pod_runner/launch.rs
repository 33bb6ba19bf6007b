//! One start of an agent, prepared: volumes in place, mount paths rewritten to them, the
//! container's environment resolved, and a kubeconfig with a fresh ServiceAccount token.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use devctl_api::instance::env;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, PostParams};

use super::engines;
use super::environment::{expand, resolve_env};
use super::plan::{Plan, image_name_and_tag};
use super::supervisor::Ctx;
use super::volumes::{ClaimVolume, make_dir, write_volume};
use super::{AGENT_TEST_HOOKS_ENV, hooks_path};
use crate::kubeconfig::{self, Credentials};

/// `PATH` for agents: Debian's MariaDB (`mariadbd`) is in `/usr/sbin`.
const AGENT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything one start of an agent needs.
pub(super) struct Launch {
    pub(super) args: Vec<String>,
    pub(super) env: BTreeMap<String, String>,
    pub(super) home: PathBuf,
}

/// Prepares one start: volumes, environment, a fresh token.
pub(super) async fn prepare(
    ctx: &Ctx,
    pod: &Pod,
    plan: &Plan,
    claims: &[ClaimVolume],
    pod_dir: &Path,
    (port, health_port): (u16, u16),
    server: &str,
) -> Result<Launch, String> {
    let namespace = pod.namespace().unwrap_or_default();
    let owner = plan.run_as.owner();
    let pods_dir = ctx.root.join("pods");
    for dir in [pods_dir.clone(), pod_dir.to_path_buf()] {
        make_dir(&dir, None, 0o755).map_err(|e| e.to_string())?;
    }

    // Volumes → local directories.
    let mut volumes: HashMap<String, PathBuf> = claims
        .iter()
        .map(|c| (c.volume.clone(), c.dir.clone()))
        .collect();
    for volume in &plan.volumes {
        let dir = pod_dir.join(&volume.name);
        if volume.empty_dir.is_some() {
            make_dir(&dir, owner, 0o755).map_err(|e| e.to_string())?;
        } else if let Some(source) = &volume.config_map {
            let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
            let found = api
                .get_opt(&source.name)
                .await
                .map_err(|e| format!("read ConfigMap {}: {e}", source.name))?;
            let files = match found {
                Some(cm) => {
                    let mut files: BTreeMap<String, Vec<u8>> = cm
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect();
                    files.extend(
                        cm.binary_data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0)),
                    );
                    files
                }
                None if source.optional == Some(true) => BTreeMap::new(),
                None => {
                    return Err(format!(
                        "ConfigMap {namespace}/{} (volume {}) does not exist (yet)",
                        source.name, volume.name
                    ));
                }
            };
            write_volume(&dir, files, source.items.as_deref(), None, 0o644)?;
        } else if let Some(source) = &volume.secret {
            let secret_name = source.secret_name.clone().unwrap_or_default();
            let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
            let found = api
                .get_opt(&secret_name)
                .await
                .map_err(|e| format!("read Secret {secret_name}: {e}"))?;
            let files = match found {
                Some(secret) => secret
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect(),
                None if source.optional == Some(true) => BTreeMap::new(),
                None => {
                    return Err(format!(
                        "Secret {namespace}/{secret_name} (volume {}) does not exist (yet)",
                        volume.name
                    ));
                }
            };
            write_volume(&dir, files, source.items.as_deref(), owner, 0o600)?;
        } else {
            continue;
        }
        volumes.insert(volume.name.clone(), dir);
    }
    // Mount paths → local directories, longest first.
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for mount in plan.container.volume_mounts.iter().flatten() {
        let Some(dir) = volumes.get(&mount.name) else {
            continue;
        };
        let dir = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => {
                let dir = dir.join(sub);
                make_dir(&dir, owner, 0o755).map_err(|e| e.to_string())?;
                dir
            }
            None => dir.clone(),
        };
        mounts.push((mount.mount_path.trim_end_matches('/').to_string(), dir));
    }
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    let rewrite = |value: &str| -> String {
        for (path, dir) in &mounts {
            if let Some(rest) = value.strip_prefix(path.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{}{rest}", dir.display());
            }
        }
        value.to_string()
    };

    let mut env = resolve_env(ctx, pod, &plan.container).await?;
    for value in env.values_mut() {
        *value = rewrite(value);
    }
    let expand_all = |list: &Option<Vec<String>>| -> Vec<String> {
        list.iter()
            .flatten()
            .map(|a| rewrite(&expand(a, &env)))
            .collect()
    };
    let args = expand_all(&plan.container.args);

    // What differs from a container.
    let home = pod_dir.join("home");
    make_dir(&home, owner, 0o700).map_err(|e| e.to_string())?;
    let kubeconfig = pod_dir.join("kubeconfig");
    let token = service_account_token(ctx, pod, &plan.service_account).await?;
    let user = format!("system:serviceaccount:{namespace}:{}", plan.service_account);
    // Through the pod's API proxy (see `PodRunner::partition`).
    let mut config = kubeconfig::build(
        server,
        &ctx.server_ca_pem,
        &user,
        Credentials::Token(&token),
    )
    .map_err(|e| e.to_string())?;
    for context in &mut config.contexts {
        if let Some(context) = &mut context.context {
            context.namespace = Some(namespace.clone());
        }
    }
    kubeconfig::write(&config, &kubeconfig).map_err(|e| e.to_string())?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&kubeconfig, Some(uid), Some(gid))
            .map_err(|e| format!("chown {}: {e}", kubeconfig.display()))?;
    }
    let loopback = "127.0.0.1".to_string();
    env.insert(env::PORT.into(), port.to_string());
    env.insert(env::HEALTH_PORT.into(), health_port.to_string());
    env.insert(env::LISTEN_ADDRESS.into(), loopback.clone());
    env.insert(env::POD_IP.into(), loopback);
    // Service names do not resolve here: replicas take the primary's address from its
    // report.
    env.insert(env::PRIMARY_FROM.into(), "annotation".into());
    if plan.engine == "postgres" {
        // The declared major's binaries (the image's own, on a real node).
        let (_, tag) = image_name_and_tag(plan.container.image.as_deref().unwrap_or_default());
        let bin = engines::postgres_bin_dir(tag.as_deref())?;
        env.insert(env::ENGINE_BIN_DIR.into(), bin.display().to_string());
        // An image here carries every installed major (the upgrade step looks for the old
        // one's binaries as `<root>/<major>/bin`).
        env.insert(
            env::POSTGRES_BIN_ROOTS.into(),
            format!(
                "{}:{}",
                engines::DEBIAN,
                engines::installed_majors_dir().display()
            ),
        );
    } else {
        env.remove(env::ENGINE_BIN_DIR);
    }
    env.insert("PATH".into(), AGENT_PATH.into());
    env.insert("HOME".into(), home.display().to_string());
    env.insert("USER".into(), plan.run_as.user.clone());
    env.insert("LOGNAME".into(), plan.run_as.user.clone());
    env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
    env.insert(
        AGENT_TEST_HOOKS_ENV.into(),
        hooks_path(&ctx.root, &namespace, &pod.name_any())
            .display()
            .to_string(),
    );
    env.entry("LANG".into()).or_insert_with(|| "C.UTF-8".into());
    for passed in ["RUST_LOG", "RUST_BACKTRACE"] {
        if let Ok(value) = std::env::var(passed) {
            env.entry(passed.into()).or_insert(value);
        }
    }
    Ok(Launch { args, env, home })
}

/// A token for the pod's ServiceAccount (TokenRequest, bound to the pod, 1 h).
async fn service_account_token(
    ctx: &Ctx,
    pod: &Pod,
    service_account: &str,
) -> Result<String, String> {
    let namespace = pod.namespace().unwrap_or_default();
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                uid: pod.uid(),
            }),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    match api
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
    {
        Ok(answer) => answer
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                format!("TokenRequest for {namespace}/{service_account} returned no token")
            }),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(format!(
            "ServiceAccount {namespace}/{service_account} does not exist (yet): {}",
            status.message
        )),
        Err(e) => Err(format!(
            "TokenRequest for ServiceAccount {namespace}/{service_account}: {e}"
        )),
    }
}
