//! Connecting to a cluster the way kubectl does: `--kubeconfig`, `--context`, `-n`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::output::Format;

#[derive(Args, Debug, Clone)]
pub struct GlobalArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Namespace (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Output format for commands that print data.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// A client and the namespace to work in.
pub struct Connection {
    pub client: kube::Client,
    pub namespace: String,
    pub server: String,
}

pub async fn connect(global: &GlobalArgs) -> anyhow::Result<Connection> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        ..Default::default()
    };
    let config = match &global.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await
        }
        None => kube::Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| match &global.context {
        Some(context) => anyhow::anyhow!("cannot use kubeconfig context {context:?}: {e}"),
        None => anyhow::anyhow!("cannot load a kubeconfig: {e}"),
    })?;
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).context("creating the Kubernetes client")?;
    Ok(Connection {
        client,
        namespace,
        server,
    })
}

/// A one-line explanation of an API error, naming what was attempted.
pub fn explain(error: kube::Error, doing: &str, server: &str) -> anyhow::Error {
    match error {
        kube::Error::Api(status) if status.code == 403 => {
            anyhow::anyhow!("{doing}: forbidden ({})", status.message)
        }
        kube::Error::Api(status) if status.code == 401 => {
            anyhow::anyhow!("{doing}: the cluster rejected the credentials (401 Unauthorized)")
        }
        kube::Error::Api(status) => anyhow::anyhow!("{doing}: {}", status.message),
        other => anyhow::anyhow!("{doing}: cannot reach the cluster at {server}: {other}"),
    }
}
