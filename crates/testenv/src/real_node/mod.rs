//! A real node beside the kwok nodes: containerd with runc, the CNI bridge, a
//! kubelet and kube-proxy from the pinned Kubernetes release, and CoreDNS as the cluster's
//! DNS, all host processes of the harness like the control plane. Pods scheduled to it run in
//! real containers from images imported into containerd (no registry): the operator image
//! (`tools/image/build.sh`), a PostgreSQL 15 image and the pause image
//! (`tools/node/images.sh`).
//!
//! Needs root, cgroups and runc: [`RealNode::unavailable`] says why a machine cannot run
//! one. One real node runs on a host at a time (the bridge, iptables and the kubelet's
//! cgroups are the host's): a second waits for the first. See docs/testenv.md.

pub mod config;
pub mod teardown;
pub mod volumes;

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::control_plane::ControlPlane;
use crate::process::{ManagedProcess, free_port};
use crate::{Error, FIELD_MANAGER, kubeconfig};

/// The real node's name (and its `kubernetes.io/hostname` label).
pub const NODE_NAME: &str = "devctl-real-node";

/// The operator image's reference in containerd: the chart's default.
pub const OPERATOR_IMAGE_REPOSITORY: &str = "ghcr.io/devctl/devctl-operator";

/// The PostgreSQL 15 image tools/node/images.sh builds.
pub const POSTGRES_IMAGE: &str = "localhost/devctl/postgres:15";

/// Names the operator image's OCI layout (tools/test.sh builds it); without it the node
/// builds the image with tools/image/build.sh.
pub const IMAGE_LAYOUT_ENV: &str = "DEVCTL_IMAGE_LAYOUT";

const NODE_BUILD_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/node/build.sh");
const IMAGES_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/node/images.sh");
const IMAGE_BUILD_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/image/build.sh");

/// One real node per host at a time (in /run/lock: one per host, whatever a process's
/// private /tmp).
const HOST_LOCK: &str = "/run/lock/devctl-real-node.lock";

/// How long the node may take to register and become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running real node; stopping it (drop, or process exit for one in a static) removes its
/// containers, mounts, bridge, iptables rules and cgroups.
pub struct RealNode {
    // Dropped in this order: the provisioner, then the node's processes (the kubelet first,
    // so it restarts nothing), then teardown.
    provisioner: Option<volumes::Provisioner>,
    processes: Vec<ManagedProcess>,
    leftovers: teardown::Leftovers,
    address: Ipv4Addr,
    dir: PathBuf,
    ctr: Vec<String>,
    bin_dir: PathBuf,
    _host_lock: std::fs::File,
}

impl RealNode {
    /// Why this machine cannot run a real node, if it cannot: not root, no cgroups, no
    /// overlay filesystem.
    pub fn unavailable() -> Option<String> {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some(
                "the real node needs root (containerd, runc, the kubelet and iptables)".into(),
            );
        }
        if !Path::new("/sys/fs/cgroup").is_dir() {
            return Some("no /sys/fs/cgroup: containers need cgroups".into());
        }
        let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        if !filesystems.contains("overlay") {
            return Some("the kernel has no overlay filesystem (containerd's snapshotter)".into());
        }
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            return Some(
                "the host runs cgroup v2 (unified): the real node is configured for this project's cgroup v1 machines (docs/testenv.md)".into(),
            );
        }
        if let Some(pid) = foreign_kubelet() {
            return Some(format!(
                "this host runs a kubelet of its own (pid {pid}): the real node would share (and its teardown remove) its iptables chains"
            ));
        }
        None
    }

    /// Starts the node for `control_plane` (which must have been started with
    /// [`crate::Options::node_address`] = `address`) and waits until it is Ready.
    pub async fn start(control_plane: &ControlPlane, address: Ipv4Addr) -> Result<Self, Error> {
        if let Some(why) = Self::unavailable() {
            return Err(Error::Process(format!(
                "cannot run a real node here: {why}"
            )));
        }
        let started = Instant::now();
        let host_lock = tokio::task::spawn_blocking(lock_host)
            .await
            .map_err(|e| Error::Process(format!("host lock panicked: {e}")))??;
        let (bin_dir, images) = tokio::task::spawn_blocking(build_node)
            .await
            .map_err(|e| Error::Process(format!("node build panicked: {e}")))??;
        let leftovers = teardown::Leftovers {
            dir: None,
            bin_dir: bin_dir.clone(),
        };
        // What a killed harness could not remove.
        teardown::clean(&leftovers);
        // Before anything changes them (forwarding here, the rest by the kubelet).
        teardown::save_kernel_settings()
            .map_err(|e| Error::io("save the kernel settings the node changes", e))?;
        enable_ip_forwarding()?;
        teardown::make_bridge()
            .map_err(|e| Error::io(format!("make the bridge {}", config::BRIDGE), e))?;

        let dir = control_plane.dir().join("node");
        let logs = control_plane.log_dir();
        for d in ["containerd", "cni/net.d", "kubelet", "volumes"] {
            std::fs::create_dir_all(dir.join(d))
                .map_err(|e| Error::io(format!("create {}", dir.join(d).display()), e))?;
        }
        let mut node = Self {
            provisioner: None,
            processes: Vec::new(),
            leftovers: teardown::Leftovers {
                dir: Some(dir.clone()),
                bin_dir: bin_dir.clone(),
            },
            address,
            ctr: vec![
                "--address".into(),
                dir.join("containerd/containerd.sock").display().to_string(),
                "--namespace".into(),
                "k8s.io".into(),
            ],
            dir: dir.clone(),
            bin_dir: bin_dir.clone(),
            _host_lock: host_lock,
        };
        crate::process::clean_at_exit(&dir, node.leftovers.clone());

        let write = |name: &str, content: &str| -> Result<PathBuf, Error> {
            let path = dir.join(name);
            std::fs::write(&path, content)
                .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
            Ok(path)
        };
        let runc = bin_dir.join("runc");
        let containerd_config = write(
            "containerd/config.toml",
            &config::containerd(&dir, &runc, Path::new("/usr/lib/cni")),
        )?;
        write("cni/net.d/10-devctl.conflist", &config::cni_network(&dir))?;

        // containerd finds its shim on PATH.
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        node.processes.push(ManagedProcess::start_with_env(
            "containerd",
            &bin_dir.join("containerd"),
            &["--config".into(), containerd_config.display().to_string()],
            &[("PATH", path.as_str())],
            &logs.join("containerd.log"),
        )?);
        node.wait_for("containerd's socket", Duration::from_secs(30), || {
            let socket = dir.join("containerd/containerd.sock");
            async move {
                socket
                    .exists()
                    .then_some(())
                    .ok_or_else(|| "no socket yet".to_string())
            }
        })
        .await?;
        for (reference, archive) in &images {
            node.import(reference, archive).await?;
        }

        let ports = config::Ports {
            kubelet: free_port()?,
            kubelet_healthz: free_port()?,
            proxy_healthz: free_port()?,
            proxy_metrics: free_port()?,
            dns_health: free_port()?,
            dns_ready: free_port()?,
        };
        let client_ca = control_plane.dir().join("pki/client-ca.crt");
        let kubelet_config = write(
            "kubelet/config.json",
            &config::kubelet(&dir, address, &client_ca, ports),
        )?;
        teardown::make_cgroups()
            .map_err(|e| Error::io(format!("make the cgroup /{}", config::CGROUP_ROOT), e))?;
        let write_kubeconfig =
            |name: &str, user: &str, groups: &[&str]| -> Result<PathBuf, Error> {
                let path = dir.join(format!("{name}.kubeconfig"));
                kubeconfig::write(&control_plane.kubeconfig_for(user, groups)?, &path)?;
                Ok(path)
            };
        let kubelet_kubeconfig = write_kubeconfig(
            "kubelet",
            &format!("system:node:{NODE_NAME}"),
            &["system:nodes"],
        )?;
        node.processes.push(ManagedProcess::start(
            "kubelet",
            &bin_dir.join("kubelet"),
            &[
                format!("--config={}", kubelet_config.display()),
                format!("--kubeconfig={}", kubelet_kubeconfig.display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--cert-dir={}", dir.join("kubelet/pki").display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={address}"),
                "--v=1".into(),
            ],
            &logs.join("kubelet.log"),
        )?);

        let client = control_plane.client().await?;
        bind(
            &client,
            "devctl-testenv:node-proxier",
            "system:node-proxier",
            "system:kube-proxy",
        )
        .await?;
        let proxy_kubeconfig = write_kubeconfig("kube-proxy", "system:kube-proxy", &[])?;
        node.processes.push(ManagedProcess::start(
            "kube-proxy",
            &bin_dir.join("kube-proxy"),
            &[
                format!("--kubeconfig={}", proxy_kubeconfig.display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--cluster-cidr={}", config::POD_SUBNET),
                "--proxy-mode=iptables".into(),
                format!("--healthz-bind-address=127.0.0.1:{}", ports.proxy_healthz),
                format!("--metrics-bind-address=127.0.0.1:{}", ports.proxy_metrics),
                // The host's sysctls stay as they are: no conntrack table sizing or timeouts,
                // no route_localnet for NodePorts on loopback.
                "--conntrack-max-per-core=0".into(),
                "--conntrack-tcp-timeout-established=0".into(),
                "--conntrack-tcp-timeout-close-wait=0".into(),
                "--iptables-localhost-nodeports=false".into(),
                "--v=1".into(),
            ],
            &logs.join("kube-proxy.log"),
        )?);

        let dns_kubeconfig =
            write_kubeconfig("coredns", "devctl-testenv-coredns", &["system:masters"])?;
        let corefile = write("Corefile", &config::corefile(&dns_kubeconfig, ports))?;
        node.processes.push(ManagedProcess::start(
            "coredns",
            &bin_dir.join("coredns"),
            &["-conf".into(), corefile.display().to_string()],
            &logs.join("coredns.log"),
        )?);

        // The cluster's default class here (kwok's is not: crate::cluster).
        crate::cluster::apply_storage_class(
            &client,
            volumes::STORAGE_CLASS,
            volumes::PROVISIONER,
            true,
            false,
        )
        .await?;
        node.provisioner = Some(volumes::Provisioner::start(
            control_plane.kubeconfig_for("devctl-testenv-local-path", &["system:masters"])?,
            NODE_NAME,
            &dir.join("volumes"),
        )?);

        let nodes: Api<Node> = Api::all(client.clone());
        node.wait_for("the real node to be Ready", READY_TIMEOUT, || {
            let nodes = nodes.clone();
            async move {
                let found = nodes.get_opt(NODE_NAME).await.map_err(|e| e.to_string())?;
                let ready = found
                    .as_ref()
                    .and_then(|n| n.status.as_ref())
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
                match ready {
                    Some(c) if c.status == "True" => Ok(()),
                    Some(c) => Err(format!(
                        "Ready={} ({})",
                        c.status,
                        c.message.clone().unwrap_or_default()
                    )),
                    None => Err("not registered".into()),
                }
            }
        })
        .await?;
        for (what, port, path) in [
            ("kube-proxy", ports.proxy_healthz, "/healthz"),
            ("CoreDNS", ports.dns_ready, "/ready"),
        ] {
            let address = format!("127.0.0.1:{port}");
            node.wait_for(
                &format!("{what} to be ready"),
                Duration::from_secs(60),
                || {
                    let address = address.clone();
                    async move {
                        match crate::control_plane::http_request(
                            &address,
                            "GET",
                            path,
                            None,
                            Duration::from_secs(5),
                        )
                        .await
                        {
                            Ok((200, _)) => Ok(()),
                            Ok((status, body)) => {
                                Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)))
                            }
                            Err(e) => Err(e.to_string()),
                        }
                    }
                },
            )
            .await?;
        }
        tracing::info!(elapsed = ?started.elapsed(), %address, "real node ready");
        Ok(node)
    }

    /// The host's address: where pods reach the API server, DNS and the host's services.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// The node's directory (containerd's, the kubelet's, volumes).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `ctr` against this node's containerd, with `args` (e.g. `["images", "ls", "-q"]`).
    pub fn ctr(&self, args: &[&str]) -> Result<String, Error> {
        let output = Command::new(self.bin_dir.join("ctr"))
            .args(&self.ctr)
            .args(args)
            .output()
            .map_err(|e| Error::io("run ctr", e))?;
        if !output.status.success() {
            return Err(Error::Process(format!(
                "ctr {} failed ({}): {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `Err` naming the process and the end of its log if a node process has exited.
    pub fn check_processes(&mut self) -> Result<(), Error> {
        self.processes
            .iter_mut()
            .try_for_each(ManagedProcess::check_running)
    }

    /// The node processes' logs, for failure messages.
    pub fn describe(&self) -> String {
        let logs: Vec<String> = self
            .processes
            .iter()
            .map(|p| format!("{} (pid {}): {}", p.name(), p.pid(), p.log_path().display()))
            .collect();
        format!(
            "real node {NODE_NAME} at {}; logs:\n  {}",
            self.address,
            logs.join("\n  ")
        )
    }

    async fn import(&self, reference: &str, archive: &Path) -> Result<(), Error> {
        let started = Instant::now();
        let base = reference
            .rsplit_once(':')
            .map_or(reference, |(base, _)| base);
        self.ctr(&[
            "images",
            "import",
            "--base-name",
            base,
            &archive.display().to_string(),
        ])?;
        let listed = self.ctr(&["images", "ls", "-q"])?;
        if !listed.lines().any(|l| l.trim() == reference) {
            return Err(Error::Process(format!(
                "importing {} did not give containerd the image {reference} (it has: {})",
                archive.display(),
                listed.split_whitespace().collect::<Vec<_>>().join(", ")
            )));
        }
        tracing::info!(reference, elapsed = ?started.elapsed(), "image imported");
        Ok(())
    }

    async fn wait_for<F, Fut>(
        &mut self,
        what: &str,
        timeout: Duration,
        probe: F,
    ) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let waited = crate::process::poll_until(
            what,
            timeout,
            Duration::from_millis(200),
            || self.check_processes(),
            probe,
        )
        .await;
        waited.map_err(|e| crate::process::with_description(e, || self.describe()))
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.provisioner.take();
        // The last started first: the kubelet before containerd (it would start containers
        // again).
        for process in self.processes.iter_mut().rev() {
            process.stop(Duration::ZERO);
        }
        self.processes.clear();
        teardown::clean(&self.leftovers);
        crate::process::forget_clean_at_exit(&self.dir);
    }
}

/// A kubelet (or a distribution's all-in-one binary: k3s, k0s, microk8s' kubelite) running
/// in the host's network namespace that is not a real node's (whose binaries live in
/// devctl's node cache). One in another network namespace (kind's) shares no chains.
fn foreign_kubelet() -> Option<u32> {
    let own_net = std::fs::read_link("/proc/self/ns/net").ok()?;
    let cache = node_cache_root();
    crate::process::processes_where(|pid, exe| {
        let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let kubelet = matches!(name, "kubelet" | "kube-proxy" | "kubelite" | "k0s")
            || name.starts_with("k3s");
        kubelet
            && !exe.starts_with(&cache)
            && std::fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|net| net == own_net)
    })
    .into_iter()
    .next()
}

/// Where tools/node/build.sh caches the node's binaries:
/// `${DEVCTL_NODE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/devctl/node}`.
pub fn node_cache_root() -> PathBuf {
    let root = crate::binaries::tool_cache_root("DEVCTL_NODE_DIR", "node");
    std::fs::canonicalize(&root).unwrap_or(root)
}

/// The host's address on its default route (no packet is sent: a UDP socket's `connect` only
/// picks the route).
pub fn host_address() -> Result<Ipv4Addr, Error> {
    let socket =
        std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| Error::io("bind a UDP socket", e))?;
    socket
        .connect("192.0.2.255:9")
        .or_else(|_| socket.connect("10.255.255.255:9"))
        .map_err(|e| Error::io("find the host's address (no default route?)", e))?;
    match socket
        .local_addr()
        .map_err(|e| Error::io("read the UDP socket's address", e))?
        .ip()
    {
        std::net::IpAddr::V4(a) if !a.is_loopback() && !a.is_unspecified() => Ok(a),
        other => Err(Error::Process(format!(
            "the host's address {other} cannot serve pods"
        ))),
    }
}

fn lock_host() -> Result<std::fs::File, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        // A world-writable directory: never follow a link someone planted.
        .custom_flags(libc::O_NOFOLLOW)
        .open(HOST_LOCK)
        .map_err(|e| Error::io(format!("open {HOST_LOCK}"), e))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    } != 0
    {
        eprintln!(
            "devctl-testenv: another real node runs on this host ({HOST_LOCK}); waiting for it"
        );
        // SAFETY: as above, blocking.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) } != 0 {
            return Err(Error::io(
                format!("lock {HOST_LOCK}"),
                std::io::Error::last_os_error(),
            ));
        }
    }
    let mut file = file;
    let _ = writeln!(file, "{}", std::process::id());
    Ok(file)
}

/// The node's binaries (tools/node/build.sh) and its images' archives (tools/node/images.sh
/// plus the operator image), each `(reference, archive)`. Blocking.
fn build_node() -> Result<(PathBuf, Vec<(String, PathBuf)>), Error> {
    let bin_dir = PathBuf::from(last_line_of(NODE_BUILD_SCRIPT, &[])?);
    let cache = bin_dir
        .parent()
        .map(|p| p.join("images"))
        .ok_or_else(|| Error::Binaries(format!("{NODE_BUILD_SCRIPT} printed no bin dir")))?;
    let images_dir = PathBuf::from(last_line_of(
        IMAGES_SCRIPT,
        &[&cache.display().to_string()],
    )?);
    let listed = std::fs::read_to_string(images_dir.join("images.txt"))
        .map_err(|e| Error::io(format!("read {}/images.txt", images_dir.display()), e))?;
    let mut images: Vec<(String, PathBuf)> = listed
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(r, a)| (r.to_string(), PathBuf::from(a)))
        .collect();
    images.push(operator_image(&cache)?);
    Ok((bin_dir, images))
}

/// The operator image as an OCI archive: from `$DEVCTL_IMAGE_LAYOUT` (tools/test.sh builds
/// it), else built now with tools/image/build.sh (dev profile) into `target/image/oci`.
fn operator_image(cache: &Path) -> Result<(String, PathBuf), Error> {
    let layout = match std::env::var_os(IMAGE_LAYOUT_ENV) {
        Some(layout) => PathBuf::from(layout),
        None => {
            let layout = PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/image/oci"
            ));
            eprintln!(
                "devctl-testenv: building the operator image with {IMAGE_BUILD_SCRIPT} (${IMAGE_LAYOUT_ENV} is not set)"
            );
            let status = Command::new("bash")
                .arg(IMAGE_BUILD_SCRIPT)
                .arg(&layout)
                .env("DEVCTL_IMAGE_PROFILE", "dev")
                .stdout(std::process::Stdio::null())
                .status()
                .map_err(|e| Error::io(format!("run {IMAGE_BUILD_SCRIPT}"), e))?;
            if !status.success() {
                return Err(Error::Binaries(format!(
                    "{IMAGE_BUILD_SCRIPT} failed ({status})"
                )));
            }
            layout
        }
    };
    let index = std::fs::read_to_string(layout.join("index.json")).map_err(|e| {
        Error::io(
            format!(
                "read {}/index.json (the operator image's layout)",
                layout.display()
            ),
            e,
        )
    })?;
    let index: serde_json::Value = serde_json::from_str(&index)
        .map_err(|e| Error::Process(format!("{}/index.json: {e}", layout.display())))?;
    let tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .ok_or_else(|| Error::Process(format!("{}/index.json names no tag", layout.display())))?
        .to_string();
    std::fs::create_dir_all(cache)
        .map_err(|e| Error::io(format!("create {}", cache.display()), e))?;
    let archive = cache.join("operator.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .map_err(|e| Error::io("run tar", e))?;
    if !status.success() {
        return Err(Error::Process(format!(
            "tar of {} failed ({status})",
            layout.display()
        )));
    }
    Ok((format!("{OPERATOR_IMAGE_REPOSITORY}:{tag}"), archive))
}

/// Runs `bash script args…` and returns the last line it printed (stderr passes through).
fn last_line_of(script: &str, args: &[&str]) -> Result<String, Error> {
    let output = Command::new("bash")
        .arg(script)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Error::io(format!("run {script}"), e))?;
    if !output.status.success() {
        return Err(Error::Binaries(format!(
            "{script} failed ({}); run it by hand to see why",
            output.status
        )));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .ok_or_else(|| Error::Binaries(format!("{script} printed nothing")))
}

/// Pods on the bridge reach Services (DNAT to another pod on the same bridge) through the
/// host's routing: forwarding must be on (teardown restores the saved value).
fn enable_ip_forwarding() -> Result<(), Error> {
    let path = "/proc/sys/net/ipv4/ip_forward";
    if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
        return Ok(());
    }
    std::fs::write(path, "1").map_err(|e| Error::io(format!("enable IP forwarding ({path})"), e))
}

async fn bind(client: &kube::Client, name: &str, role: &str, user: &str) -> Result<(), Error> {
    let api: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": { "name": name },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))
    .map_err(|e| Error::Process(e.to_string()))?;
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&binding),
    )
    .await?;
    Ok(())
}
