//! Leaving the host as the real node found it. Containers do not die with the harness:
//! containerd's shims double-fork out of its process tree and the containers are their
//! children, network namespaces and overlay mounts outlive every process, and the bridge and
//! kube-proxy's iptables rules are the host's. Teardown therefore kills by what is certain
//! (the pod cgroups the kubelet made, shims started from this node's binary), unmounts
//! everything under the node's directory, deletes the bridge and kube-proxy's rules, and
//! removes the cgroups. A host that runs a kubelet of its own gets no real node
//! ([`super::RealNode::unavailable`]): kube-proxy's and the kubelet's chains would be shared. It runs when the node is dropped, at process exit for a node in a
//! static, and before a node starts (what a killed harness could not clean).
//!
//! Synchronous and best effort: every step runs even when one before failed, and what fails
//! is logged, not returned (there is no caller left to handle it at exit).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::config::{BRIDGE, CGROUP_ROOT};

/// Everything teardown needs to know about a node.
#[derive(Debug, Clone)]
pub struct Leftovers {
    /// The node's directory (containerd's root and state, the kubelet's, volumes).
    pub dir: Option<PathBuf>,
    /// The node's binaries: shims started from here are this node's.
    pub bin_dir: PathBuf,
}

/// Removes what a real node leaves on the host. Without a directory (before a node starts),
/// every real node's directory left in the temporary directory (a killed harness's) is
/// cleaned: one real node runs at a time, and the caller holds the lock.
pub fn clean(leftovers: &Leftovers) {
    let bin_dir =
        std::fs::canonicalize(&leftovers.bin_dir).unwrap_or_else(|_| leftovers.bin_dir.clone());
    let shim = bin_dir.join("containerd-shim-runc-v2");
    for round in 0..3 {
        let mut pids = pods_processes();
        pids.extend(processes_running(&shim));
        // A killed harness's shims, from an older build of the node (another bin dir).
        pids.extend(node_shims());
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            break;
        }
        if round > 0 {
            tracing::debug!(?pids, "real node: processes still alive, killing again");
        }
        for pid in &pids {
            // SAFETY: kill(2) with SIGKILL on a pid read from the kubelet's cgroups or a
            // shim of ours; at worst ESRCH.
            unsafe {
                libc::kill(*pid as libc::pid_t, libc::SIGKILL);
            }
        }
        wait_gone(&pids, Duration::from_secs(5));
    }
    let dirs = match &leftovers.dir {
        Some(dir) => vec![dir.clone()],
        None => stale_node_dirs(),
    };
    for dir in &dirs {
        remove_outside_state(dir);
        unmount_under(dir);
    }
    remove_cgroups();
    restore_kernel_settings();
    delete_bridge();
    remove_kubelet_chains();
    let kube_proxy = leftovers.bin_dir.join("kube-proxy");
    if kube_proxy.exists() {
        // Removes the KUBE-* chains and rules of every mode.
        let status = Command::new(&kube_proxy)
            .arg("--cleanup")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            tracing::warn!(?status, "real node: kube-proxy --cleanup failed");
        }
    }
}

/// The node directories of earlier harnesses in the temporary directory.
fn stale_node_dirs() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("devctl-testenv-")
        })
        .map(|e| e.path().join("node"))
        .filter(|d| d.is_dir())
        .collect()
}

/// What containerd, the CNI plugins and the kubelet keep outside the node's directory: each
/// shim's socket (named in its task's bootstrap.json), the CNI plugins' result cache for the
/// node's sandboxes, and the kubelet's log symlinks in /var/log/containers.
fn remove_outside_state(dir: &Path) {
    let tasks = dir.join("containerd/state/io.containerd.runtime.v2.task/k8s.io");
    let ids: Vec<String> = std::fs::read_dir(&tasks)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for id in &ids {
        let Ok(text) = std::fs::read_to_string(tasks.join(id).join("bootstrap.json")) else {
            continue;
        };
        let address = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["address"].as_str().map(str::to_string));
        if let Some(socket) = address.as_deref().and_then(|a| a.strip_prefix("unix://"))
            && socket.starts_with("/run/containerd/s/")
        {
            let _ = std::fs::remove_file(socket);
        }
    }
    if let Ok(entries) = std::fs::read_dir("/var/lib/cni/results") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // `<network>-<sandbox id>-<interface>`: the node's network, or its sandboxes.
            if is_network_result(&name) || ids.iter().any(|id| name.contains(&format!("-{id}-"))) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    // The shared directories themselves once empty (a host's own containerd keeps its own).
    for shared in [
        "/run/containerd/s",
        "/run/containerd",
        "/var/lib/cni/results",
        "/var/lib/cni",
    ] {
        let _ = std::fs::remove_dir(shared);
    }
    let logs = dir.join("pod-logs");
    if let Ok(entries) = std::fs::read_dir("/var/log/containers") {
        for entry in entries.flatten() {
            if std::fs::read_link(entry.path()).is_ok_and(|target| target.starts_with(&logs)) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// A CNI result cache entry of the node's network: `devctl-<64 hex sandbox id>-<interface>`.
fn is_network_result(name: &str) -> bool {
    name.strip_prefix(&format!("{}-", super::config::NETWORK))
        .and_then(|rest| rest.split_once('-'))
        .is_some_and(|(id, _)| id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Where the kernel settings the kubelet changes are saved before it starts (outside any
/// test directory, so that a killed harness's are restored by the next node's clean).
const SAVED_KERNEL_SETTINGS: &str = "/run/devctl-real-node.sysctl";

/// The settings the node changes: IP forwarding, and what the kubelet sets at start
/// (`setupKernelTunables`: it panics the kernel on an oops and overcommits memory;
/// `protectKernelDefaults` would make it refuse to start instead).
const KERNEL_SETTINGS: &[&str] = &[
    // Not the kubelet's: the node switches forwarding on (and the CNI bridge plugin would).
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/vm/overcommit_memory",
    "/proc/sys/vm/panic_on_oom",
    "/proc/sys/kernel/panic",
    "/proc/sys/kernel/panic_on_oops",
    "/proc/sys/kernel/keys/root_maxkeys",
    "/proc/sys/kernel/keys/root_maxbytes",
];

/// Saves the settings the kubelet changes, unless a save not yet restored exists (it holds
/// the host's values from before an earlier node).
pub fn save_kernel_settings() -> std::io::Result<()> {
    if Path::new(SAVED_KERNEL_SETTINGS).exists() {
        return Ok(());
    }
    let mut saved = String::new();
    for path in KERNEL_SETTINGS {
        if let Ok(value) = std::fs::read_to_string(path) {
            saved.push_str(&format!("{path}={}\n", value.trim()));
        }
    }
    std::fs::write(SAVED_KERNEL_SETTINGS, saved)
}

fn restore_kernel_settings() {
    let Ok(saved) = std::fs::read_to_string(SAVED_KERNEL_SETTINGS) else {
        return;
    };
    for line in saved.lines() {
        if let Some((path, value)) = line.split_once('=')
            && KERNEL_SETTINGS.contains(&path)
            && let Err(e) = std::fs::write(path, value)
        {
            tracing::warn!(path, error = %e, "real node: cannot restore a kernel setting");
        }
    }
    let _ = std::fs::remove_file(SAVED_KERNEL_SETTINGS);
}

/// The cgroup v1 hierarchies' mount points (`/sys/fs/cgroup/<controllers>`), and the v2
/// one if mounted.
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    dirs.push(PathBuf::from("/sys/fs/cgroup"));
    dirs.into_iter()
        .filter(|d| d.join("cgroup.procs").exists())
        .collect()
}

/// Makes the node's cgroup in every hierarchy (the kubelet requires its `cgroupRoot` to
/// exist); a new cpuset cgroup gets its parent's CPUs and memory nodes, as it starts empty.
pub fn make_cgroups() -> std::io::Result<()> {
    for hierarchy in hierarchies() {
        let dir = hierarchy.join(CGROUP_ROOT);
        std::fs::create_dir_all(&dir)?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = dir.join(file);
            if own.exists() && std::fs::read_to_string(&own)?.trim().is_empty() {
                let parent = std::fs::read_to_string(hierarchy.join(file))?;
                std::fs::write(&own, parent.trim())?;
            }
        }
    }
    Ok(())
}

/// Every cgroup directory under `root`, deepest first.
fn cgroups_under(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
        found.push(dir);
    }
    found.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    found
}

/// The pids in the node's cgroups, in any hierarchy.
fn pods_processes() -> Vec<u32> {
    let mut pids = Vec::new();
    for hierarchy in hierarchies() {
        let root = hierarchy.join(CGROUP_ROOT);
        if !root.is_dir() {
            continue;
        }
        for cgroup in cgroups_under(&root) {
            if let Ok(text) = std::fs::read_to_string(cgroup.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Shims of any real node: `containerd-shim-runc-v2` serving a containerd whose socket is in
/// a test environment's node directory (`-address …/devctl-testenv-*/node/containerd/…`).
fn node_shims() -> Vec<u32> {
    crate::process::processes_where(|pid, exe| {
        if exe.file_name().and_then(|n| n.to_str()) != Some("containerd-shim-runc-v2") {
            return false;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            return false;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        args.windows(2).any(|w| {
            w[0] == "-address"
                && w[1].contains("/devctl-testenv-")
                && w[1].contains("/node/containerd/")
        })
    })
}

/// The pids whose executable is `program` (canonical).
fn processes_running(program: &Path) -> Vec<u32> {
    crate::process::processes_where(|_, exe| exe == program)
}

fn wait_gone(pids: &[u32], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline && pids.iter().any(|pid| crate::process::is_running(*pid)) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Unmounts every mount point under `dir` (overlay root filesystems, network namespaces,
/// the kubelet's secret and token volumes), deepest first, detached so a busy one goes too.
pub fn unmount_under(dir: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for point in points {
        let Ok(c_path) = std::ffi::CString::new(point.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: umount2(2) on a NUL-terminated path; failure is reported through errno.
        let rc = unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) };
        if rc != 0 {
            tracing::debug!(point = %point.display(), error = %std::io::Error::last_os_error(), "real node: umount failed");
        }
    }
}

/// The bridge with the gateway's address, before the first pod: cluster DNS listens there.
/// The CNI bridge plugin adopts it.
pub fn make_bridge() -> std::io::Result<()> {
    let address = format!(
        "{}/{}",
        super::config::GATEWAY,
        super::config::GATEWAY_PREFIX
    );
    for args in [
        &["link", "add", BRIDGE, "type", "bridge"][..],
        &["addr", "add", &address, "dev", BRIDGE][..],
        &["link", "set", BRIDGE, "up"][..],
    ] {
        let output = Command::new("ip").args(args).output()?;
        if !output.status.success() {
            return Err(std::io::Error::other(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
    }
    Ok(())
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_point(field: &str) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(value) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(value);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from(
        String::from_utf8_lossy(&out).into_owned(),
    ))
}

fn remove_cgroups() {
    for hierarchy in hierarchies() {
        let root = hierarchy.join(CGROUP_ROOT);
        if root.is_dir() {
            for cgroup in cgroups_under(&root) {
                let _ = std::fs::remove_dir(&cgroup);
            }
        }
    }
}

/// The chains the kubelet adds (kube-proxy --cleanup leaves them): its canaries, the hint
/// kube-proxy reads, and KUBE-FIREWALL, which drops connections to 127.0.0.0/8 from other
/// addresses, jumped to from INPUT and OUTPUT.
fn remove_kubelet_chains() {
    let steps: &[&[&str]] = &[
        &["-t", "filter", "-D", "INPUT", "-j", "KUBE-FIREWALL"],
        &["-t", "filter", "-D", "OUTPUT", "-j", "KUBE-FIREWALL"],
        &["-t", "filter", "-F", "KUBE-FIREWALL"],
        &["-t", "filter", "-X", "KUBE-FIREWALL"],
        &["-t", "filter", "-X", "KUBE-KUBELET-CANARY"],
        &["-t", "nat", "-X", "KUBE-KUBELET-CANARY"],
        &["-t", "mangle", "-X", "KUBE-KUBELET-CANARY"],
        &["-t", "mangle", "-X", "KUBE-IPTABLES-HINT"],
    ];
    for program in ["iptables", "ip6tables"] {
        for args in steps {
            // A missing chain or rule is what we want; its error is not interesting.
            let _ = Command::new(program)
                .args(*args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn delete_bridge() {
    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        let status = Command::new("ip")
            .args(["link", "delete", BRIDGE])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            tracing::warn!(?status, "real node: cannot delete the bridge {BRIDGE}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_nodes_network_results_are_its_own() {
        let id = "a".repeat(64);
        assert!(is_network_result(&format!("devctl-{id}-eth0")));
        assert!(!is_network_result("devctl-other-eth0"));
        assert!(!is_network_result(&format!("cni-loopback-{id}-lo")));
    }

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(
            unescape_mount_point(r"/tmp/a\040b/c"),
            PathBuf::from("/tmp/a b/c")
        );
        assert_eq!(unescape_mount_point("/plain"), PathBuf::from("/plain"));
    }
}
