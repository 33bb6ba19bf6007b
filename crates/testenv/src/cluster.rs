//! A [`ControlPlane`] plus the parts that make it behave like a cluster: kube-controller-manager
//! (garbage collection, workload controllers, service accounts), kube-scheduler, and kwok
//! simulating nodes, pod lifecycles and volume provisioning.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

use crate::control_plane::{ControlPlane, Options, http_request};
use crate::kubeconfig;
use crate::pod_runner::{Connection, PodBacking, PodRunner};
use crate::process::{ManagedProcess, free_port};
use crate::real_node::RealNode;
use crate::{Error, FIELD_MANAGER};

/// The controllers kube-controller-manager runs: what workloads, garbage collection,
/// namespaces, PDBs and PVC/PV protection need, and node lifecycle, which lifts the
/// `node.kubernetes.io/not-ready` taint new nodes are admitted with once kwok reports them Ready,
/// and ClusterRole aggregation (users bound to `edit`/`view` get what aggregates into them).
const CONTROLLERS: &[&str] = &[
    "clusterrole-aggregation-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "node-lifecycle-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "disruption-controller",
    "endpointslice-controller",
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
];

/// kwok's stages: nodes become Ready and keep their lease, pods run and become Ready (and
/// complete / go away), claims in the `standard` class are provisioned and bound.
const STAGES: &[&str] = &[
    "node-initialize",
    "node-heartbeat-with-lease",
    "pod-ready",
    "pod-complete",
    "pod-delete",
    "pvc-provision",
    "pv-bind",
    "pv-delete",
    "pvc-delete",
];

/// Our own stage: a claim whose requested size grew gets that capacity, as a CSI resizer
/// would report it, so volume expansion can be tested end to end.
const PVC_RESIZE_STAGE: &str = r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pvc-resize
spec:
  resourceRef:
    apiGroup: v1
    kind: PersistentVolumeClaim
  selector:
    matchExpressions:
    - cel:
        expression: >-
          self.status.phase == 'Bound'
    - cel:
        expression: >-
          string(self.status.capacity.storage) != string(self.spec.resources.requests.storage)
  steps:
  - patch:
      root: status
      subresource: status
      template: |
        capacity:
          storage: {{ .spec.resources.requests.storage }}
"#;

/// The user name the pod runner acts as (group `system:masters`); the agents it starts act as
/// their pods' ServiceAccounts.
pub const POD_RUNNER_USER: &str = "devctl-testenv-pod-runner";

/// The storage class kwok's volume stages provision (kwok's stages select it by name).
pub const STORAGE_CLASS: &str = "kwok-volume";

/// How to start a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub control_plane: Options,
    /// Number of simulated nodes.
    pub nodes: usize,
    /// What backs database pods (see [`crate::pod_runner`]); [`PodBacking::Simulated`] by
    /// default.
    pub pods: PodBacking,
    /// Start a real node too ([`crate::real_node`]): pods scheduled to it run in containers.
    pub real_node: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            control_plane: Options::default(),
            nodes: 3,
            pods: PodBacking::default(),
            real_node: false,
        }
    }
}

/// A control plane with controllers, a scheduler and simulated nodes.
pub struct Cluster {
    // Dropped first: containers stop while the API server still answers.
    real_node: Option<RealNode>,
    // Then agents, while the API server still answers.
    pod_runner: Option<PodRunner>,
    control_plane: ControlPlane,
    nodes: Vec<String>,
}

impl Cluster {
    pub async fn start() -> Result<Self, Error> {
        Self::start_with(ClusterOptions::default()).await
    }

    pub async fn start_with(mut options: ClusterOptions) -> Result<Self, Error> {
        let started = Instant::now();
        options.control_plane.service_account_admission = true;
        let node_address = if options.real_node {
            if let Some(why) = RealNode::unavailable() {
                return Err(Error::Process(format!(
                    "cannot run a real node here: {why}"
                )));
            }
            let address = crate::real_node::host_address()?;
            options.control_plane.node_address = Some(address);
            Some(address)
        } else {
            None
        };
        let mut controllers = CONTROLLERS.to_vec();
        if options.real_node {
            // The real node's claims are bound as on any cluster (kwok binds its own).
            controllers.push("persistentvolume-binder-controller");
        }
        let mut control_plane = ControlPlane::start_with(options.control_plane).await?;
        let dir = control_plane.dir().to_path_buf();
        let logs = control_plane.log_dir();

        // Each component gets its own identity, so RBAC and the audit log see who did what.
        let write_kubeconfig =
            |name: &str, user: &str, groups: &[&str]| -> Result<std::path::PathBuf, Error> {
                let path = dir.join(format!("{name}.kubeconfig"));
                kubeconfig::write(&control_plane.kubeconfig_for(user, groups)?, &path)?;
                Ok(path)
            };
        let kcm_kubeconfig = write_kubeconfig(
            "kube-controller-manager",
            "system:kube-controller-manager",
            &[],
        )?;
        let scheduler_kubeconfig =
            write_kubeconfig("kube-scheduler", "system:kube-scheduler", &[])?;
        // kwok patches node and pod status, creates PVs and leases: it needs broad rights.
        let kwok_kubeconfig = write_kubeconfig("kwok", "kwok", &["system:masters"])?;

        let binaries = control_plane.binaries().clone();
        let kcm_port = free_port()?;
        let kcm_args = vec![
            format!("--kubeconfig={}", kcm_kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kcm_kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kcm_kubeconfig.display()),
            "--leader-elect=false".into(),
            // As on a real cluster: each controller acts as its own ServiceAccount and gets the
            // bootstrap RBAC role written for it (system:controller:<name>).
            "--use-service-account-credentials=true".into(),
            format!("--controllers={}", controllers.join(",")),
            format!(
                "--service-account-private-key-file={}",
                control_plane.sa_private_key_path.display()
            ),
            format!("--root-ca-file={}", control_plane.server_ca_path.display()),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={kcm_port}"),
            // Fast feedback in tests: statefulsets and GC react within a second anyway.
            "--concurrent-gc-syncs=5".into(),
            "--v=1".into(),
        ];
        control_plane.push_process(ManagedProcess::start(
            "kube-controller-manager",
            &binaries.path("kube-controller-manager"),
            &kcm_args,
            &logs.join("kube-controller-manager.log"),
        )?);

        let scheduler_port = free_port()?;
        let scheduler_args = vec![
            format!("--kubeconfig={}", scheduler_kubeconfig.display()),
            format!(
                "--authentication-kubeconfig={}",
                scheduler_kubeconfig.display()
            ),
            format!(
                "--authorization-kubeconfig={}",
                scheduler_kubeconfig.display()
            ),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={scheduler_port}"),
            "--v=2".into(),
        ];
        control_plane.push_process(ManagedProcess::start(
            "kube-scheduler",
            &binaries.path("kube-scheduler"),
            &scheduler_args,
            &logs.join("kube-scheduler.log"),
        )?);

        let kwok_address = format!("127.0.0.1:{}", free_port()?);
        let mut kwok_args = vec![
            format!("--kubeconfig={}", kwok_kubeconfig.display()),
            format!("--server-address={kwok_address}"),
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
            "--cidr=10.244.0.1/16".into(),
            "--node-ip=127.0.0.1".into(),
            "--node-lease-duration-seconds=40".into(),
        ];
        for stage in STAGES {
            kwok_args.push(format!(
                "--config={}",
                binaries
                    .kwok_stages_dir
                    .join(format!("{stage}.yaml"))
                    .display()
            ));
        }
        let resize_stage = dir.join("pvc-resize.yaml");
        std::fs::write(&resize_stage, PVC_RESIZE_STAGE)
            .map_err(|e| Error::io("write the pvc-resize stage", e))?;
        kwok_args.push(format!("--config={}", resize_stage.display()));
        control_plane.push_process(ManagedProcess::start(
            "kwok",
            &binaries.path("kwok"),
            &kwok_args,
            &logs.join("kwok.log"),
        )?);

        let mut cluster = Self {
            real_node: None,
            pod_runner: None,
            control_plane,
            nodes: Vec::new(),
        };
        // kwok's class is the default unless a real node's local-path class is.
        apply_storage_class(
            &cluster.client().await?,
            STORAGE_CLASS,
            "kwok.x-k8s.io/volume",
            !options.real_node,
            true,
        )
        .await?;
        cluster.create_nodes(options.nodes).await?;
        cluster
            .wait_until_started(kcm_port, scheduler_port, &kwok_address)
            .await?;
        // Started: from now on they come back whenever they exit, like static pods.
        cluster
            .control_plane
            .supervise(&["kube-controller-manager", "kube-scheduler", "kwok"]);
        let server_ca_pem = std::fs::read_to_string(&cluster.server_ca_path)
            .map_err(|e| Error::io(format!("read {}", cluster.server_ca_path.display()), e))?;
        cluster.pod_runner = PodRunner::start(
            &options.pods,
            Connection {
                // Its own name, so the audit log tells its requests from the tests'.
                kubeconfig: cluster.kubeconfig_for(POD_RUNNER_USER, &["system:masters"])?,
                server: cluster.server().to_string(),
                server_ca_pem,
            },
        )?;
        if let Some(address) = node_address {
            cluster.real_node = Some(RealNode::start(&cluster.control_plane, address).await?);
        }
        tracing::info!(elapsed = ?started.elapsed(), "cluster ready");
        Ok(cluster)
    }

    async fn create_nodes(&mut self, count: usize) -> Result<(), Error> {
        let api: Api<Node> = Api::all(self.client().await?);
        for i in 0..count {
            let name = format!("kwok-node-{i}");
            let node: Node = serde_json::from_value(json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": { "kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0" },
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "topology.kubernetes.io/zone": format!("zone-{}", i % 3),
                    }
                },
                "spec": {},
                "status": {
                    "allocatable": { "cpu": "32", "memory": "256Gi", "pods": "110" },
                    "capacity": { "cpu": "32", "memory": "256Gi", "pods": "110" },
                    "nodeInfo": {
                        "architecture": "amd64", "operatingSystem": "linux",
                        "kubeletVersion": "fake", "kubeProxyVersion": "fake",
                        "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "",
                        "machineID": "", "osImage": "", "systemUUID": ""
                    }
                }
            }))
            .map_err(|e| Error::Process(e.to_string()))?;
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&node),
            )
            .await?;
            self.nodes.push(name);
        }
        let timeout = Duration::from_secs(60);
        for name in &self.nodes {
            let ready = await_condition(api.clone(), name, |node: Option<&Node>| {
                node.and_then(|n| n.status.as_ref())
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
            tokio::time::timeout(timeout, ready)
                .await
                .map_err(|_| Error::Timeout {
                    what: format!(
                        "node {name} to become Ready (is kwok running? {})",
                        self.describe()
                    ),
                    after: timeout,
                })?
                .map_err(|e| Error::Process(format!("watching node {name}: {e}")))?;
        }
        Ok(())
    }

    /// Waits until kube-controller-manager, kube-scheduler and kwok have finished starting.
    ///
    /// While starting, each of them treats a failing API server as fatal: kube-controller-manager
    /// (and kube-scheduler, same code) exits when reading its authentication ConfigMap gets a
    /// 403 from a restarted server whose RBAC cache is still empty, or when building a
    /// controller fails; kwok exits on a refused connection while it starts its stage
    /// controllers. A test restarting the API server right after [`Cluster::start`] would
    /// lose them. Once started, they retry. Costs about 1.5 s, mostly kube-controller-manager
    /// building its controllers.
    async fn wait_until_started(
        &self,
        kcm_port: u16,
        scheduler_port: u16,
        kwok_address: &str,
    ) -> Result<(), Error> {
        // The controllers' health checks are registered once every controller has been built.
        let kcm = secure_probe(kcm_port)?;
        self.poll_until_started("kube-controller-manager", || async {
            let body = get_text(&kcm, "/healthz?verbose").await?;
            let built = format!("[+]{} ok", CONTROLLERS[0]);
            body.contains(&built)
                .then_some(())
                .ok_or_else(|| format!("no {built:?} in {body:?}"))
        })
        .await?;
        // /readyz includes `sched-handler-sync`: the informers' handlers have synced.
        let scheduler = secure_probe(scheduler_port)?;
        self.poll_until_started("kube-scheduler", || async {
            let body = get_text(&scheduler, "/readyz").await?;
            (body.trim() == "ok").then_some(()).ok_or(body)
        })
        .await?;
        // kwok serves /healthz (on --server-address) once every stage controller runs.
        self.poll_until_started("kwok", || async {
            match http_request(kwok_address, "GET", "/healthz", None, PROBE_TIMEOUT).await {
                Ok((200, _)) => Ok(()),
                Ok((status, body)) => {
                    Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)))
                }
                Err(e) => Err(e.to_string()),
            }
        })
        .await
    }

    async fn poll_until_started<F, Fut>(&self, component: &str, probe: F) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        crate::process::poll_until(
            &format!("{component} to finish starting"),
            Duration::from_secs(60),
            Duration::from_millis(100),
            || self.check_processes(),
            probe,
        )
        .await
        .map_err(|e| crate::process::with_description(e, || self.describe()))
    }

    /// The simulated nodes' names.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The real node, when started with [`ClusterOptions::real_node`].
    pub fn real_node(&self) -> Option<&RealNode> {
        self.real_node.as_ref()
    }

    /// What runs database pods: `None` with [`PodBacking::None`].
    pub fn pod_runner(&self) -> Option<&PodRunner> {
        self.pod_runner.as_ref()
    }
}

/// Applies the StorageClass `name` of `provisioner` (reclaim `Delete`, bound at once),
/// the cluster's default when `default`.
pub(crate) async fn apply_storage_class(
    client: &kube::Client,
    name: &str,
    provisioner: &str,
    default: bool,
    expansion: bool,
) -> Result<(), Error> {
    let api: Api<StorageClass> = Api::all(client.clone());
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": name,
            "annotations": { "storageclass.kubernetes.io/is-default-class": default.to_string() }
        },
        "provisioner": provisioner,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": expansion,
    }))
    .map_err(|e| Error::Process(e.to_string()))?;
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&class),
    )
    .await?;
    Ok(())
}

/// Bound on one health probe of a component.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A client for a component's own HTTPS port (self-signed certificate, no credentials: the
/// health endpoints are always allowed).
fn secure_probe(port: u16) -> Result<kube::Client, Error> {
    let url = format!("https://127.0.0.1:{port}");
    let uri = url
        .parse::<http::Uri>()
        .map_err(|e| Error::Process(format!("bad URL {url}: {e}")))?;
    let mut config = kube::Config::new(uri);
    config.accept_invalid_certs = true;
    config.connect_timeout = Some(PROBE_TIMEOUT);
    config.read_timeout = Some(PROBE_TIMEOUT);
    kube::Client::try_from(config).map_err(Error::Kube)
}

async fn get_text(client: &kube::Client, path: &str) -> Result<String, String> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| e.to_string())
}

impl Deref for Cluster {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        &self.control_plane
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut ControlPlane {
        &mut self.control_plane
    }
}
