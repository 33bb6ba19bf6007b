//! The invalid-input corpus in `tests/invalid_input/`: manifests a user might write that the
//! real API server must refuse, applied with kubectl exactly as a user would
//! (`kubectl apply -n NS -f FILE`, kubectl's default `--validate=strict`), without the
//! operator: every rule lives in the CRDs.
//!
//! Each case is one `.yaml` file holding one manifest, named `<category>-<kind>-<what>.yaml`
//! (the category is only for reading and counting). A header of comments says what must
//! happen:
//!
//! ```yaml
//! # expect: spec.replicas in body should be less than or equal to 7
//! # base: db.yaml
//! ```
//!
//! - `# expect:` (one or more): substrings of kubectl's error output, all required. At least
//!   one names the field (`spec...` or `metadata...`).
//! - `# base:` (optional): the case is an update of the object in `bases/<file>`, which is
//!   applied first; without it the case is a create. Before any case runs the test checks
//!   that each update names its base object and that no create names an existing object, so
//!   a case cannot silently test the other operation.
//!
//! Any other comment line is a free description. At the end only the bases may exist, and
//! they must be exactly as they were applied.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/invalid_input");
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(30);

struct Case {
    /// File name within the corpus directory.
    file: String,
    path: PathBuf,
    expect: Vec<String>,
    base: Option<String>,
}

impl Case {
    fn category(&self) -> &str {
        self.file.split('-').next().unwrap_or_default()
    }
}

/// The header of `path`: its leading comment lines.
fn parse_case(path: &Path) -> Result<Case, String> {
    let file = path.file_name().unwrap().to_string_lossy().into_owned();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{file}: {e}"))?;
    let mut expect = Vec::new();
    let mut base = None;
    for line in text.lines().take_while(|l| l.starts_with('#')) {
        let line = line.trim_start_matches('#').trim();
        if let Some(value) = line.strip_prefix("expect:") {
            expect.push(value.trim().to_string());
        } else if let Some(value) = line.strip_prefix("base:") {
            let value = value.trim().to_string();
            if !Path::new(CORPUS).join("bases").join(&value).is_file() {
                return Err(format!("{file}: base {value} is not a file in bases/"));
            }
            base = Some(value);
        }
    }
    if expect.iter().any(|e| e.is_empty()) {
        return Err(format!("{file}: an empty `# expect:`"));
    }
    if !expect
        .iter()
        .any(|e| e.contains("spec") || e.contains("metadata"))
    {
        return Err(format!(
            "{file}: no `# expect:` line names the field (spec... or metadata...)"
        ));
    }
    if text.lines().any(|l| l.trim() == "---") {
        return Err(format!("{file}: one manifest per file"));
    }
    Ok(Case {
        file,
        path: path.to_path_buf(),
        expect,
        base,
    })
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Runs kubectl with `args`; `(success, stdout, stderr)`.
async fn kubectl(
    cluster: &devctl_testenv::Cluster,
    args: &[&std::ffi::OsStr],
) -> (bool, String, String) {
    let mut command = tokio::process::Command::from(cluster.kubectl());
    command.args(args).kill_on_drop(true);
    let output = tokio::time::timeout(KUBECTL_TIMEOUT, command.output())
        .await
        .unwrap_or_else(|_| panic!("kubectl {args:?} took more than {KUBECTL_TIMEOUT:?}"))
        .expect("run kubectl");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The parts of a base object that a rejected update must leave alone.
async fn snapshot(cluster: &devctl_testenv::Cluster, namespace: &str, file: &Path) -> Value {
    let (ok, stdout, stderr) = kubectl(
        cluster,
        &[
            "get".as_ref(),
            "-n".as_ref(),
            namespace.as_ref(),
            "-f".as_ref(),
            file.as_os_str(),
            "-o".as_ref(),
            "json".as_ref(),
        ],
    )
    .await;
    assert!(ok, "kubectl get -f {}: {stderr}", file.display());
    let object: Value = serde_json::from_str(&stdout).unwrap();
    serde_json::json!({
        "spec": object["spec"],
        "generation": object["metadata"]["generation"],
        "resourceVersion": object["metadata"]["resourceVersion"],
        "lastApplied": object["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
    })
}

#[tokio::test]
async fn the_api_server_rejects_every_invalid_manifest_naming_the_field() {
    let started = Instant::now();
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("invalid-input").await.unwrap();
    let ready = started.elapsed();

    let corpus = Path::new(CORPUS);
    let cases: Vec<Case> = yaml_files(corpus)
        .iter()
        .map(|path| parse_case(path))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("the corpus is malformed: {e}"));
    assert!(
        cases.len() >= 50,
        "the corpus has only {} cases",
        cases.len()
    );

    // The objects the update cases change; each must apply cleanly.
    let mut bases = BTreeMap::new();
    for path in yaml_files(&corpus.join("bases")) {
        let (ok, stdout, stderr) = kubectl(
            cluster,
            &[
                "apply".as_ref(),
                "-n".as_ref(),
                namespace.as_ref(),
                "-f".as_ref(),
                path.as_os_str(),
                "-o".as_ref(),
                "name".as_ref(),
            ],
        )
        .await;
        assert!(ok, "base {} was refused: {stderr}", path.display());
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let object = stdout.trim().to_string();
        let before = snapshot(cluster, &namespace, &path).await;
        bases.insert(file, (object, path, before));
    }

    // Each update targets its base, and no create targets an existing object.
    let mut failures = Vec::new();
    let mut creates: Vec<&std::ffi::OsStr> = vec![
        "get".as_ref(),
        "-n".as_ref(),
        namespace.as_ref(),
        "--ignore-not-found".as_ref(),
        "-o".as_ref(),
        "name".as_ref(),
    ];
    for case in &cases {
        let Some(base) = &case.base else {
            creates.extend(["-f".as_ref(), case.path.as_os_str()]);
            continue;
        };
        let (ok, stdout, stderr) = kubectl(
            cluster,
            &[
                "get".as_ref(),
                "-n".as_ref(),
                namespace.as_ref(),
                "-f".as_ref(),
                case.path.as_os_str(),
                "--ignore-not-found".as_ref(),
                "-o".as_ref(),
                "name".as_ref(),
            ],
        )
        .await;
        let target = stdout.trim();
        if !ok {
            failures.push(format!("{}: kubectl get -f: {stderr}", case.file));
        } else if bases.get(base).is_none_or(|(object, ..)| object != target) {
            failures.push(format!(
                "{}: names {target:?}, not its base {base}",
                case.file
            ));
        }
    }
    let (ok, stdout, stderr) = kubectl(cluster, &creates).await;
    if !ok {
        failures.push(format!("kubectl get -f <every create>: {stderr}"));
    }
    for existing in stdout.lines() {
        failures.push(format!("a create case names the existing {existing}"));
    }
    assert!(
        failures.is_empty(),
        "the corpus is inconsistent:\n{}",
        failures.join("\n")
    );

    for case in &cases {
        let (ok, stdout, stderr) = kubectl(
            cluster,
            &[
                "apply".as_ref(),
                "-n".as_ref(),
                namespace.as_ref(),
                "-f".as_ref(),
                case.path.as_os_str(),
            ],
        )
        .await;
        if ok {
            failures.push(format!("{}: ACCEPTED: {}", case.file, stdout.trim()));
            continue;
        }
        let missing: Vec<&str> = case
            .expect
            .iter()
            .map(String::as_str)
            .filter(|e| !stderr.contains(e))
            .collect();
        if !missing.is_empty() {
            failures.push(format!(
                "{}: rejected, but the error lacks {missing:?}:\n    {}",
                case.file,
                stderr.trim().replace('\n', "\n    ")
            ));
        }
    }

    let (ok, stdout, stderr) = kubectl(
        cluster,
        &[
            "get".as_ref(),
            "databaseclusters,webapps".as_ref(),
            "-n".as_ref(),
            namespace.as_ref(),
            "-o".as_ref(),
            "name".as_ref(),
        ],
    )
    .await;
    assert!(ok, "kubectl get: {stderr}");
    let existing: BTreeSet<&str> = stdout.lines().map(str::trim).collect();
    let expected: BTreeSet<&str> = bases.values().map(|(object, ..)| object.as_str()).collect();
    for created in existing.difference(&expected) {
        failures.push(format!(
            "{created} exists after the run: some case created it"
        ));
    }
    for (object, path, before) in bases.values() {
        if !existing.contains(object.as_str()) {
            failures.push(format!("base {object} is gone"));
            continue;
        }
        let after = snapshot(cluster, &namespace, path).await;
        if &after != before {
            failures.push(format!(
                "base {object} changed:\n    before: {before}\n    after:  {after}"
            ));
        }
    }

    let mut per_category = BTreeMap::<&str, (usize, usize)>::new();
    for case in &cases {
        let counts = per_category.entry(case.category()).or_default();
        counts.0 += 1;
        counts.1 += usize::from(case.base.is_some());
    }
    println!(
        "{} cases ({} updates of {} bases) in {:.1?} after {:.1?} of set-up",
        cases.len(),
        cases.iter().filter(|c| c.base.is_some()).count(),
        bases.len(),
        started.elapsed() - ready,
        ready
    );
    for (category, (total, updates)) in &per_category {
        println!("  {category:<10} {total:>3} ({updates} updates)");
    }
    assert!(
        failures.is_empty(),
        "{} of {} invalid inputs were not handled as expected (namespace {namespace}):\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
