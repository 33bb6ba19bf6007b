//! Kubeconfigs for the local control plane: one per identity, credentials inlined.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

use crate::Error;
use crate::pki::CertPair;

/// The context (and cluster) name written into every kubeconfig.
pub const CONTEXT: &str = "devctl-testenv";

/// How a client proves who it is.
pub enum Credentials<'a> {
    /// No credentials at all: the API server answers 401.
    None,
    /// A client certificate (CN = user, O = groups).
    Certificate(&'a CertPair),
    /// A bearer token (e.g. a ServiceAccount token from the TokenRequest API).
    Token(&'a str),
}

/// A kubeconfig for `server`, trusting `server_ca_pem`, authenticating as `credentials`.
pub fn build(
    server: &str,
    server_ca_pem: &str,
    user: &str,
    credentials: Credentials<'_>,
) -> Result<Kubeconfig, Error> {
    let auth = match credentials {
        Credentials::None => json!({}),
        Credentials::Certificate(pair) => json!({
            "client-certificate-data": STANDARD.encode(&pair.cert_pem),
            "client-key-data": STANDARD.encode(&pair.key_pem),
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let value = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": CONTEXT,
            "cluster": {
                "server": server,
                "certificate-authority-data": STANDARD.encode(server_ca_pem),
            }
        }],
        "users": [{ "name": user, "user": auth }],
        "contexts": [{
            "name": CONTEXT,
            "context": { "cluster": CONTEXT, "user": user, "namespace": "default" }
        }],
        "current-context": CONTEXT,
    });
    serde_json::from_value(value).map_err(|e| Error::Kubeconfig(e.to_string()))
}

/// A client for `kubeconfig`, bound to the current tokio runtime.
///
/// A `kube::Client` spawns its connection tasks on the runtime that created it, so every
/// `#[tokio::test]` (each with its own runtime) must make its own client.
pub async fn client(kubeconfig: Kubeconfig) -> Result<kube::Client, Error> {
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    kube::Client::try_from(config).map_err(Error::Kube)
}

/// Writes `kubeconfig` as YAML with owner-only permissions (it holds a private key).
pub fn write(kubeconfig: &Kubeconfig, path: &std::path::Path) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let yaml = serde_saphyr::to_string(kubeconfig).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    file.write_all(yaml.as_bytes())
        .map_err(|e| Error::io(format!("write {}", path.display()), e))
}
