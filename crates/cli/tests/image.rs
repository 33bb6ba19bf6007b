//! The operator image `tools/image/build.sh` builds: an OCI layout whose one layer holds the
//! two binaries, the libraries they link and nothing to run a shell with. `tools/test.sh`
//! builds it and names the layout in `DEVCTL_IMAGE_LAYOUT`; without it the tests build it.
//! Needs umoci, skopeo and tar (tools/install-prerequisites.sh installs the first two).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The compressed size the image must stay under (layers + config, as a registry stores it).
const MAX_COMPRESSED_BYTES: u64 = 40 * 1000 * 1000;
const LABELS: [&str; 7] = [
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.version",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.source",
    "org.opencontainers.image.licenses",
    "org.opencontainers.image.created",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tag() -> String {
    format!("v{VERSION}")
}

/// The layout: `DEVCTL_IMAGE_LAYOUT` when set (tools/test.sh), else built once per test
/// binary into target/image/oci.
fn layout() -> &'static Path {
    static LAYOUT: OnceLock<PathBuf> = OnceLock::new();
    LAYOUT.get_or_init(|| {
        if let Some(layout) = std::env::var_os("DEVCTL_IMAGE_LAYOUT") {
            let layout = PathBuf::from(layout);
            assert!(
                layout.join("index.json").is_file(),
                "DEVCTL_IMAGE_LAYOUT={} is not an OCI layout; run tools/image/build.sh",
                layout.display()
            );
            return layout;
        }
        let layout = repo_root().join("target/image/oci");
        let out = Command::new(repo_root().join("tools/image/build.sh"))
            .arg(&layout)
            .output()
            .expect("run tools/image/build.sh");
        assert!(
            out.status.success(),
            "tools/image/build.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let last = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        assert_eq!(
            last,
            format!("oci:{}:{}", layout.display(), tag()),
            "the script prints the image reference last"
        );
        layout
    })
}

fn reference() -> String {
    format!("oci:{}:{}", layout().display(), tag())
}

fn ok(mut command: Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e} (is it installed?)"));
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    })
}

fn blob(digest: &str) -> PathBuf {
    let (algorithm, hex) = digest.split_once(':').expect("digest is algorithm:hex");
    layout().join("blobs").join(algorithm).join(hex)
}

/// The image manifest the tag names, read from the layout itself.
fn manifest() -> Value {
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout().join("index.json")).unwrap()).unwrap();
    let tag = tag();
    let descriptor = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag.as_str())
        .unwrap_or_else(|| panic!("no manifest tagged {tag} in {index:#}"));
    serde_json::from_slice(&std::fs::read(blob(descriptor["digest"].as_str().unwrap())).unwrap())
        .unwrap()
}

#[test]
fn skopeo_and_umoci_see_the_labels_the_user_and_the_operator_entrypoint() {
    let mut inspect = Command::new("skopeo");
    inspect.args(["inspect", &reference()]);
    let image = json(&ok(inspect));
    let labels = &image["Labels"];
    for label in LABELS {
        assert!(
            labels[label].as_str().is_some_and(|v| !v.is_empty()),
            "label {label} missing: {labels:#}"
        );
    }
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert_eq!(labels["org.opencontainers.image.title"], "devctl-operator");
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap();
    assert!(
        revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit()),
        "a commit: {revision}"
    );
    assert_eq!(image["Os"], "linux");
    assert_eq!(
        image["Layers"].as_array().map(Vec::len),
        Some(1),
        "{image:#}"
    );

    let mut inspect = Command::new("skopeo");
    inspect.args(["inspect", "--config", &reference()]);
    let config = json(&ok(inspect));
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/devctl-operator"])
    );
    assert!(config["config"]["Cmd"].is_null(), "{config:#}");
    // The manifest carries the same keys as annotations (what registries display).
    let manifest = manifest();
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.revision"],
        revision
    );

    let mut stat = Command::new("umoci");
    stat.args(["stat", "--json", "--image"])
        .arg(format!("{}:{}", layout().display(), tag()));
    let stat = json(&ok(stat));
    let history = stat["history"]
        .as_array()
        .expect("umoci stat shows history");
    assert!(
        history
            .iter()
            .any(|h| h["created_by"] == "tools/image/build.sh"),
        "{stat:#}"
    );
}

#[test]
fn the_layer_is_owned_by_root_and_has_no_shell() {
    let manifest = manifest();
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let mut list = Command::new("tar");
    list.arg("-tvzf")
        .arg(blob(&layer))
        .args(["--numeric-owner"]);
    let listing = String::from_utf8(ok(list).stdout).unwrap();
    let mut paths = Vec::new();
    for line in listing.lines() {
        // -rwxr-xr-x 0/0 12345 2026-01-01 00:00 usr/local/bin/devctl-operator
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(fields.len() >= 6, "{line}");
        assert_eq!(
            fields[1], "0/0",
            "user 65532 must not own (and so rewrite) anything: {line}"
        );
        if fields[0].starts_with('-') {
            assert!(!fields[0][4..].contains('w'), "only root may write: {line}");
        }
        paths.push(
            fields[5]
                .trim_start_matches("./")
                .trim_end_matches('/')
                .to_string(),
        );
    }
    for expected in [
        "usr/local/bin/devctl-operator",
        "usr/local/bin/devctl-agent",
        "devctl-agent",
        "etc/passwd",
        "etc/ssl/certs/ca-certificates.crt",
    ] {
        assert!(
            paths.iter().any(|p| p == expected),
            "{expected} missing:\n{listing}"
        );
    }
    for shell in [
        "bin/sh",
        "bin/bash",
        "bin/dash",
        "usr/bin/sh",
        "bin/busybox",
    ] {
        assert!(!paths.iter().any(|p| p == shell), "{shell} in the image");
    }
    assert!(
        !paths
            .iter()
            .any(|p| p.contains("apt") || p.contains("dpkg")),
        "a package manager in the image:\n{listing}"
    );
}

/// The rootfs of the image, unpacked into a fresh directory.
fn unpack(into: &Path) -> PathBuf {
    let bundle = into.join("bundle");
    let mut unpack = Command::new("umoci");
    unpack
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:{}", layout().display(), tag()))
        .arg(&bundle);
    ok(unpack);
    bundle.join("rootfs")
}

/// The loader and library paths of the rootfs (the x86_64 or aarch64 glibc layout).
fn loader(rootfs: &Path) -> (PathBuf, String) {
    let (loader, triple) = if cfg!(target_arch = "aarch64") {
        ("lib/ld-linux-aarch64.so.1", "aarch64-linux-gnu")
    } else {
        ("lib64/ld-linux-x86-64.so.2", "x86_64-linux-gnu")
    };
    let library_path = [format!("lib/{triple}"), format!("usr/lib/{triple}")]
        .iter()
        .map(|d| rootfs.join(d).display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    (rootfs.join(loader), library_path)
}

/// Runs `binary` (a path inside the rootfs) with the rootfs's own loader and libraries only:
/// no ld.so.cache, no environment.
fn run_in_rootfs(rootfs: &Path, binary: &str, args: &[&str], trace: bool) -> Output {
    let (loader, library_path) = loader(rootfs);
    assert!(loader.is_file(), "no loader at {}", loader.display());
    let mut command = Command::new(&loader);
    command
        .args(["--inhibit-cache", "--library-path", &library_path])
        .arg(rootfs.join(binary.trim_start_matches('/')))
        .args(args)
        .env_clear();
    if trace {
        command.env("LD_TRACE_LOADED_OBJECTS", "1");
    }
    ok(command)
}

/// ELF program header type of the program interpreter (the dynamic loader).
const PT_INTERP: u32 = 3;

/// The program header types of a 64-bit little-endian ELF executable.
fn program_header_types(path: &Path) -> Vec<u32> {
    let elf = std::fs::read(path).unwrap();
    assert!(
        elf.starts_with(b"\x7fELF") && elf[4] == 2 && elf[5] == 1,
        "{} is not a 64-bit little-endian ELF file",
        path.display()
    );
    let u16_at = |at: usize| usize::from(u16::from_le_bytes([elf[at], elf[at + 1]]));
    let offset = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count)
        .map(|i| {
            let at = offset + i * size;
            u32::from_le_bytes(elf[at..at + 4].try_into().unwrap())
        })
        .collect()
}

fn assert_prints_version(binary: &str, out: &Output) {
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.trim_end().ends_with(&format!(" {VERSION}")),
        "{binary} --version: {version}"
    );
}

#[test]
fn the_operator_runs_on_the_rootfs_libraries_and_the_agent_is_static() {
    let dir = tempfile::tempdir().unwrap();
    let rootfs = unpack(dir.path());
    let rootfs = rootfs.canonicalize().unwrap();

    // The agent is copied into the engine's image, which has another libc or none: it must
    // need no loader at all, and run with nothing from this machine or the environment.
    for binary in ["/usr/local/bin/devctl-agent", "/devctl-agent"] {
        let path = rootfs.join(binary.trim_start_matches('/'));
        assert!(
            !program_header_types(&path).contains(&PT_INTERP),
            "{binary} names a program interpreter: it is not static"
        );
        let mut command = Command::new(&path);
        command.arg("--version").env_clear();
        assert_prints_version(binary, &ok(command));
    }

    let binary = "/usr/local/bin/devctl-operator";
    let path = rootfs.join(binary.trim_start_matches('/'));
    assert!(
        program_header_types(&path).contains(&PT_INTERP),
        "{binary} is dynamic (the image carries its libraries)"
    );
    let out = run_in_rootfs(&rootfs, binary, &["--version"], false);
    assert_prints_version(binary, &out);

    let out = run_in_rootfs(&rootfs, binary, &[], true);
    let trace = String::from_utf8_lossy(&out.stdout).to_string();
    let mut resolved = 0;
    for line in trace.lines() {
        assert!(!line.contains("not found"), "{binary}: {trace}");
        // libc.so.6 => /tmp/.../rootfs/lib/x86_64-linux-gnu/libc.so.6 (0x...)
        if let Some((_, target)) = line.split_once("=>") {
            let path = target.split_whitespace().next().unwrap_or_default();
            assert!(
                Path::new(path).starts_with(&rootfs),
                "{binary} loads {path} from outside the image:\n{trace}"
            );
            resolved += 1;
        }
    }
    assert!(resolved >= 1, "{binary} links libc at least:\n{trace}");
    for shell in ["bin/sh", "usr/bin/sh", "bin/bash"] {
        assert!(
            !rootfs.join(shell).exists(),
            "{shell} in the unpacked image"
        );
    }
}

#[test]
fn the_compressed_image_is_under_40_mb() {
    let manifest = manifest();
    let mut size = manifest["config"]["size"].as_u64().unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        let layer_size = layer["size"].as_u64().unwrap();
        let digest = layer["digest"].as_str().unwrap();
        assert_eq!(
            std::fs::metadata(blob(digest)).unwrap().len(),
            layer_size,
            "the manifest's size of {digest} is the blob's"
        );
        size += layer_size;
    }
    println!(
        "compressed image size: {size} bytes ({:.1} MB)",
        size as f64 / 1e6
    );
    assert!(
        size < MAX_COMPRESSED_BYTES,
        "the image is {size} bytes compressed, over {MAX_COMPRESSED_BYTES}"
    );
}
