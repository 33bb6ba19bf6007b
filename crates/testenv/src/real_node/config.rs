//! The real node's configuration files: pure functions of the node's directory and
//! addresses, so what each component is told is readable (and tested) in one place.

use std::net::Ipv4Addr;
use std::path::Path;

/// The pod network: one bridge on the host, one /24 for the node's pods.
pub const POD_SUBNET: &str = "10.244.0.0/24";

/// The host's address on the bridge (the pods' gateway), made before the first pod so that
/// cluster DNS can listen there: reachable from pods and the host only, not from the host's
/// other networks.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);

/// The gateway's prefix length on the bridge.
pub const GATEWAY_PREFIX: u8 = 24;

/// The CNI network's name (its plugins' result cache is named after it).
pub const NETWORK: &str = "devctl";

/// The bridge the CNI plugin creates (and teardown deletes).
pub const BRIDGE: &str = "devctl0";

/// The image containerd runs pod sandboxes from (built from source: tools/node/images.sh).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.2";

/// The DNS domain of the cluster's Services.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// The cgroup (in every hierarchy) the kubelet's pods go under (its `cgroupRoot`), not the
/// host's root: teardown kills what is left in it and removes it, and never touches the pods of
/// a kubelet the host may run itself.
pub const CGROUP_ROOT: &str = "devctl-real-node";

/// containerd 2.x (config version 3): its own root, state and socket under `dir`, runc as the
/// runtime with cgroupfs (the host has no systemd), the CNI bridge, and network namespaces
/// under the state directory so that teardown finds them. `restrict_oom_score_adj`: the
/// kubelet asks for negative OOM scores (-998 for sandboxes), which need CAP_SYS_RESOURCE;
/// root on the test VMs lacks it ("nsexec: failed to update /proc/self/oom_score_adj:
/// Permission denied"), so scores are raised to containerd's own, as for rootless nodes.
pub fn containerd(dir: &Path, runc: &Path, cni_bin: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 3
root = "{d}/containerd/root"
state = "{d}/containerd/state"

[grpc]
  address = "{d}/containerd/containerd.sock"

# Nothing of containerd's in the host's shared places: NRI's socket, the opt plugin's
# directory, runc's state (below).
[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/containerd/opt"

[ttrpc]
  address = "{d}/containerd/containerd.sock.ttrpc"

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{d}/containerd/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni}"]
    conf_dir = "{d}/cni/net.d"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
"#,
        runc = runc.display(),
        cni = cni_bin.display(),
    )
}

/// The CNI network: a bridge with the host as gateway and host-local addresses. No IP
/// masquerading: pods only talk to each other and to the host (the API server, the object
/// store, DNS), so no per-pod NAT rule is needed (nor left behind).
pub fn cni_network(dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            // A pod reaching itself through a Service comes back over its own port.
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": POD_SUBNET }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": dir.join("cni/ipam").display().to_string(),
            }
        }]
    })
    .to_string()
}

/// Ports the node's components listen on.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub kubelet: u16,
    pub kubelet_healthz: u16,
    pub proxy_healthz: u16,
    pub proxy_metrics: u16,
    pub dns_health: u16,
    pub dns_ready: u16,
}

/// The kubelet's configuration. `failCgroupV1: false`: kubelets from 1.35 on refuse to start
/// on cgroup v1, and this machine has only v1 (hybrid) hierarchies for its controllers.
/// Eviction thresholds are nearly off (a shared test machine's disk is not the node's to
/// keep free) and image garbage collection is off (the images were imported, and cannot be
/// pulled back).
pub fn kubelet(dir: &Path, address: Ipv4Addr, client_ca: &Path, ports: Ports) -> String {
    serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": false,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{CGROUP_ROOT}"),
        // Not /var/log/pods (the kubelet's symlinks in /var/log/containers are removed by
        // teardown).
        "podLogsDir": dir.join("pod-logs").display().to_string(),
        "containerRuntimeEndpoint": format!("unix://{}", dir.join("containerd/containerd.sock").display()),
        "address": address.to_string(),
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "authentication": {
            "anonymous": { "enabled": false },
            "webhook": { "enabled": true },
            "x509": { "clientCAFile": client_ca.display().to_string() },
        },
        "authorization": { "mode": "Webhook" },
        "clusterDNS": [GATEWAY.to_string()],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "/etc/resolv.conf",
        "failSwapOn": false,
        "staticPodPath": "",
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": false,
        "shutdownGracePeriod": "0s",
        "registerNode": true,
    })
    .to_string()
}

/// CoreDNS: the cluster's names from the API server (Services and their endpoints), the rest
/// forwarded to the host's resolver, on the bridge's gateway address where the kubelet points
/// pods (not the host's address: it would be an open resolver on the host's network).
pub fn corefile(kubeconfig: &Path, ports: Ports) -> String {
    let address = GATEWAY;
    format!(
        r#"{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {address}
    errors
    ready 127.0.0.1:{ready}
    health 127.0.0.1:{health}
    cache 5
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 5
    }}
}}
.:53 {{
    bind {address}
    errors
    cache 30
    forward . /etc/resolv.conf
}}
"#,
        ready = ports.dns_ready,
        health = ports.dns_health,
        kubeconfig = kubeconfig.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports() -> Ports {
        Ports {
            kubelet: 1,
            kubelet_healthz: 2,
            proxy_healthz: 3,
            proxy_metrics: 4,
            dns_health: 5,
            dns_ready: 6,
        }
    }

    #[test]
    fn the_kubelet_accepts_cgroup_v1_and_uses_the_nodes_dns() {
        let text = kubelet(
            Path::new("/n"),
            Ipv4Addr::new(192, 0, 2, 2),
            Path::new("/ca"),
            ports(),
        );
        let config: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(config["failCgroupV1"], false);
        assert_eq!(config["clusterDNS"][0], "10.244.0.1");
        assert_eq!(config["cgroupRoot"], "/devctl-real-node");
        assert_eq!(config["podLogsDir"], "/n/pod-logs");
        assert_eq!(
            config["containerRuntimeEndpoint"],
            "unix:///n/containerd/containerd.sock"
        );
        assert_eq!(config["authentication"]["anonymous"]["enabled"], false);
    }

    #[test]
    fn containerd_keeps_its_state_and_network_namespaces_under_the_node() {
        let text = containerd(
            Path::new("/n"),
            Path::new("/usr/sbin/runc"),
            Path::new("/cni"),
        );
        assert!(text.contains(r#"root = "/n/containerd/root""#), "{text}");
        assert!(
            text.contains("netns_mounts_under_state_dir = true"),
            "{text}"
        );
        assert!(
            text.contains(r#"sandbox = "registry.k8s.io/pause:3.10.2""#),
            "{text}"
        );
    }

    #[test]
    fn the_pod_network_needs_no_nat_rules() {
        let network: serde_json::Value =
            serde_json::from_str(&cni_network(Path::new("/n"))).unwrap();
        assert_eq!(network["plugins"][0]["ipMasq"], false);
        assert_eq!(network["plugins"][0]["bridge"], BRIDGE);
    }
}
