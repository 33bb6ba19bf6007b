//! A real Kubernetes control plane for tests and local development.
//!
//! - [`ControlPlane`]: etcd + kube-apiserver (RBAC, admission, CEL, watches, subresources).
//! - [`Cluster`]: the same plus kube-controller-manager, kube-scheduler and kwok with
//!   simulated nodes, so Deployments and StatefulSets become ready and garbage collection runs.
//!
//! The binaries are built from the pinned Kubernetes release's Go modules by
//! `tools/control-plane/build.sh` (on first use if missing). Processes never outlive the
//! test process (see [`process`]).
//!
//! # Sharing one control plane in a test binary
//! Starting a control plane takes seconds; [`shared_control_plane`] and [`shared_cluster`]
//! start one per test binary on first use and hand the same one to every test. Tests isolate
//! themselves with [`ControlPlane::create_namespace`] and make their own client with
//! [`ControlPlane::client`] (a client is bound to the tokio runtime that made it, and every
//! `#[tokio::test]` has its own runtime). The shared processes are killed and their directory
//! removed when the test binary exits.
//!
//! # Database pods
//! kwok runs nothing. A [`Cluster`]'s [`PodRunner`] backs the operator's database pods: by
//! default with simulated ready reports ([`PodBacking::Simulated`], what [`shared_cluster`]
//! does), or with real `devctl-agent` processes ([`PodBacking::Processes`],
//! [`shared_process_cluster`]). See [`pod_runner`]. For failover tests, the runner can also
//! freeze, kill and hold, or cut off from the API server one pod's agent and its engine
//! ([`PodRunner::freeze`], [`PodRunner::kill_and_hold`], [`PodRunner::partition`]).
//!
//! # Waiting for a state that may not last
//! [`watch::Since`] reads an object's version before an action and then looks at every
//! version after it, so a test sees a state the system moves past within a second (a
//! condition during one failover step) however loaded the machine is; `await_condition` and
//! polls start looking only when called.
//!
//! # Object store
//! [`S3Server`] runs versitygw (an S3-compatible store, built from its pinned Go module by
//! `tools/versitygw/build.sh`) over HTTPS on loopback with one bucket, its own CA and random
//! root credentials, for backup tests; [`shared_s3`] starts one per test binary. See [`s3`].

pub mod audit;
pub mod binaries;
pub mod campaign;
pub mod cluster;
pub mod control_plane;
pub mod kstatus;
pub mod kubeconfig;
pub mod pki;
pub mod pod_runner;
pub mod process;
pub mod real_node;
pub mod s3;
pub mod watch;
pub mod workload;

use std::time::Duration;

pub use audit::{AuditLog, AuditMark};
pub use cluster::{Cluster, ClusterOptions};
pub use control_plane::{ControlPlane, Options};
pub use pod_runner::{PodBacking, PodRunner};
pub use s3::S3Server;

/// The field manager the harness uses for what it applies itself (CRDs, nodes, storage class).
pub const FIELD_MANAGER: &str = "devctl-testenv";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("certificates: {0}")]
    Pki(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Process(String),
    #[error("pinned binaries: {0}")]
    Binaries(String),
    #[error("object store: {0}")]
    S3(String),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
}

impl Error {
    pub(crate) fn pki(e: rcgen::Error) -> Self {
        Self::Pki(e.to_string())
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

static SHARED_CONTROL_PLANE: tokio::sync::OnceCell<ControlPlane> =
    tokio::sync::OnceCell::const_new();
static SHARED_CLUSTER: tokio::sync::OnceCell<Cluster> = tokio::sync::OnceCell::const_new();
static SHARED_PROCESS_CLUSTER: tokio::sync::OnceCell<Cluster> = tokio::sync::OnceCell::const_new();
static SHARED_S3: tokio::sync::OnceCell<S3Server> = tokio::sync::OnceCell::const_new();

/// The control plane shared by every test in this test binary (audit log on).
///
/// Prints where the logs are; the test harness shows it only for failing tests.
pub async fn shared_control_plane() -> Result<&'static ControlPlane, Error> {
    let cp = SHARED_CONTROL_PLANE
        .get_or_try_init(|| {
            ControlPlane::start_with(Options {
                audit: true,
                ..Options::default()
            })
        })
        .await?;
    println!("{}", cp.describe());
    Ok(cp)
}

/// The cluster shared by every test in this test binary (audit log on, 3 nodes).
pub async fn shared_cluster() -> Result<&'static Cluster, Error> {
    let cluster = SHARED_CLUSTER
        .get_or_try_init(|| {
            Cluster::start_with(ClusterOptions {
                control_plane: Options {
                    audit: true,
                    ..Options::default()
                },
                ..ClusterOptions::default()
            })
        })
        .await?;
    println!("{}", cluster.describe());
    Ok(cluster)
}

/// A second shared cluster (audit log on, 3 nodes) whose database pods run `devctl-agent`
/// processes ([`PodBacking::Processes`], the agent found by [`pod_runner::find_agent`]), for
/// tests of the data path. Fails with what to build when there is no agent binary.
pub async fn shared_process_cluster() -> Result<&'static Cluster, Error> {
    let cluster = SHARED_PROCESS_CLUSTER
        .get_or_try_init(|| async {
            Cluster::start_with(ClusterOptions {
                control_plane: Options {
                    audit: true,
                    ..Options::default()
                },
                pods: PodBacking::processes()?,
                ..ClusterOptions::default()
            })
            .await
        })
        .await?;
    println!("{}", cluster.describe());
    if let Some(runner) = cluster.pod_runner() {
        println!("agent logs: {}", runner.logs_dir().display());
    }
    Ok(cluster)
}

/// The object store shared by every test in this test binary (bucket [`s3::BUCKET`]).
///
/// Tests keep to their own key prefixes. A test that stops or restarts the store starts its
/// own [`S3Server`] instead, so that the others never see it down.
pub async fn shared_s3() -> Result<&'static S3Server, Error> {
    let server = SHARED_S3.get_or_try_init(S3Server::start).await?;
    println!("{}", server.describe());
    Ok(server)
}

/// Polls `check` every 100 ms until it returns `Some`, failing after `timeout` with a
/// message that says what was awaited. For state that no single watch expresses well.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
