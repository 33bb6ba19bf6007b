//! Status as GitOps tools read it: every version of a DatabaseCluster or WebApp the API
//! server stored during a create, scale, upgrade, resize, replica or image change, run
//! through kstatus's rules (`devctl_testenv::kstatus`, a port of
//! `sigs.k8s.io/cli-utils/pkg/kstatus`). From the status write that records a new
//! generation until the work is done kstatus must say `InProgress`, then `Current` — never
//! `Current` before the declared state is reached.

mod support;

use std::sync::{Arc, Mutex};

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::web_app::WebApp;
use devctl_testenv::kstatus::{self, Status};
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{TIMEOUT, is_ready};

/// Every stored version of the objects an `Api` sees, as JSON, in order.
struct Recorder {
    seen: Arc<Mutex<Vec<Value>>>,
    /// Set when the watch had to list again (its version expired): the versions stored in
    /// between were never delivered, so the history has a hole and proves nothing.
    relisted: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    /// Starts watching and returns once the watch has listed what exists.
    async fn start<K>(api: Api<K>) -> Self
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug
            + Send
            + 'static,
    {
        use kube::runtime::watcher::Event;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let relisted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (listed, is_listed) = tokio::sync::oneshot::channel();
        let task = {
            let seen = seen.clone();
            let relisted = relisted.clone();
            tokio::spawn(async move {
                let mut listed = Some(listed);
                let mut stream = std::pin::pin!(kube::runtime::watcher(api, Default::default()));
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(Event::Apply(object) | Event::InitApply(object)) => {
                            if let Ok(value) = serde_json::to_value(&object) {
                                seen.lock().unwrap().push(value);
                            }
                        }
                        Ok(Event::InitDone) => {
                            if let Some(listed) = listed.take() {
                                let _ = listed.send(());
                            }
                        }
                        // A second list after the first: the watch lost its place.
                        Ok(Event::Init) if listed.is_none() => {
                            relisted.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                        _ => {}
                    }
                }
            })
        };
        tokio::time::timeout(TIMEOUT, is_listed)
            .await
            .expect("the recorder's watch did not list within the timeout")
            .unwrap();
        Self {
            seen,
            relisted,
            task,
        }
    }

    /// The versions recorded since `from` (an index into the history).
    fn since(&self, from: usize) -> Vec<Value> {
        assert!(
            !self.relisted.load(std::sync::atomic::Ordering::SeqCst),
            "the recorder's watch listed again (its resourceVersion expired): versions stored \
             meanwhile were not delivered, so the history cannot show every version"
        );
        self.seen.lock().unwrap()[from..].to_vec()
    }

    fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Waits until the watch has delivered a `Current` version of `generation` (the watch may
    /// lag behind the GET that saw it first).
    async fn wait_current(&self, generation_of_change: i64) {
        let what = format!("the recorder to see generation {generation_of_change} Current");
        devctl_testenv::eventually(&what, TIMEOUT, || async {
            self.seen
                .lock()
                .unwrap()
                .iter()
                .any(|o| {
                    generation(o) == generation_of_change
                        && kstatus::compute(o).status == Status::Current
                })
                .then_some(())
        })
        .await
        .unwrap();
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn generation(object: &Value) -> i64 {
    object["metadata"]["generation"].as_i64().unwrap_or(0)
}

fn observed_generation(object: &Value) -> i64 {
    object["status"]["observedGeneration"].as_i64().unwrap_or(0)
}

/// Checks the kstatus story of one change to `generation`: the first status write that
/// records it is `InProgress`, `Current` comes only after it, never goes back, and every
/// `Current` version satisfies `reached` (the declared state as the status says it).
fn assert_in_progress_until_done(
    what: &str,
    history: &[Value],
    generation_of_change: i64,
    reached: impl Fn(&Value) -> bool,
) {
    let versions: Vec<(&Value, kstatus::Result)> = history
        .iter()
        .filter(|o| generation(o) == generation_of_change)
        .map(|o| (o, kstatus::compute(o)))
        .collect();
    let story: Vec<String> = versions
        .iter()
        .map(|(o, r)| {
            format!(
                "observedGeneration {} -> {:?} ({})",
                observed_generation(o),
                r.status,
                r.message
            )
        })
        .collect();
    let recorded = versions
        .iter()
        .position(|(o, _)| observed_generation(o) == generation_of_change)
        .unwrap_or_else(|| panic!("{what}: no status recorded the change: {story:#?}"));
    assert_eq!(
        versions[recorded].1.status,
        Status::InProgress,
        "{what}: the status write that records the new generation: {story:#?}"
    );
    let mut current = false;
    for (object, result) in &versions[recorded..] {
        match result.status {
            Status::Current => {
                assert!(
                    reached(object),
                    "{what}: Current before the declared state: {object:#}\n{story:#?}"
                );
                current = true;
            }
            other => assert!(!current, "{what}: {other:?} after Current: {story:#?}"),
        }
    }
    let last = &versions.last().unwrap().1;
    assert_eq!(last.status, Status::Current, "{what}: {story:#?}");
}

/// The declared state of a DatabaseCluster, as its status reports it.
fn database_reached(db: &Value) -> bool {
    let (spec, status) = (&db["spec"], &db["status"]);
    status["readyReplicas"] == spec["replicas"]
        && status["currentVersion"] == spec["version"]
        && status["storageSize"] == spec["storage"]["size"]
}

async fn wait_current<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let what = format!("kstatus Current for {name}");
    devctl_testenv::eventually(&what, TIMEOUT, || async {
        let object = serde_json::to_value(api.get(name).await.ok()?).ok()?;
        (kstatus::compute(&object).status == Status::Current).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn database_changes_are_in_progress_until_done() {
    let env = support::start("kstatus-db").await;
    let dbs = env.dbs();
    let recorder = Recorder::start(dbs.clone()).await;
    let db: DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "gitops" },
        "spec": { "version": "16.2", "replicas": 3, "storage": { "size": "1Gi" } }
    }))
    .unwrap();
    dbs.create(&PostParams::default(), &db).await.unwrap();
    wait_current(&dbs, "gitops").await;
    recorder.wait_current(1).await;
    assert_in_progress_until_done("create", &recorder.since(0), 1, database_reached);

    // `kubectl scale` then `kubectl wait --for=condition=Ready`, as a pipeline would.
    let from = recorder.len();
    // kubectl runs beside the in-process operator, so never as a blocking call.
    let kubectl = |args: &[&str]| {
        let mut command = env.cluster.kubectl();
        command.args(args).args(["-n", &env.namespace]);
        tokio::process::Command::from(command).output()
    };
    let scaled = kubectl(&["scale", "databasecluster/gitops", "--replicas=5"])
        .await
        .unwrap();
    assert!(
        scaled.status.success(),
        "{}",
        String::from_utf8_lossy(&scaled.stderr)
    );
    let waited = kubectl(&[
        "wait",
        "--for=condition=Ready",
        "databasecluster/gitops",
        "--timeout=60s",
    ])
    .await
    .unwrap();
    if !waited.status.success() {
        let status = dbs.get("gitops").await.unwrap().status;
        panic!(
            "kubectl wait: {}\nstatus: {status:#?}",
            String::from_utf8_lossy(&waited.stderr)
        );
    }
    let now = dbs.get("gitops").await.unwrap();
    assert_eq!(
        now.status.as_ref().map(|s| s.ready_replicas),
        Some(5),
        "kubectl wait returned before 5 instances were ready"
    );
    wait_current(&dbs, "gitops").await;
    recorder.wait_current(2).await;
    assert_in_progress_until_done("scale 3 -> 5", &recorder.since(from), 2, database_reached);

    for (what, patch, generation) in [
        ("minor upgrade", json!({ "spec": { "version": "16.4" } }), 3),
        (
            "storage resize",
            json!({ "spec": { "storage": { "size": "2Gi" } } }),
            4,
        ),
    ] {
        let from = recorder.len();
        dbs.patch("gitops", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        wait_current(&dbs, "gitops").await;
        recorder.wait_current(generation).await;
        assert_in_progress_until_done(what, &recorder.since(from), generation, database_reached);
    }
    let db = dbs.get("gitops").await.unwrap();
    assert!(is_ready(&db, 5));
}

#[tokio::test]
async fn web_app_changes_are_in_progress_until_done() {
    let env = support::start("kstatus-web").await;
    let apps = env.web_apps();
    let recorder = Recorder::start(apps.clone()).await;
    let app: WebApp = serde_json::from_value(json!({
        "apiVersion": "apps.devctl.io/v1", "kind": "WebApp", "metadata": { "name": "shop" },
        "spec": { "image": "nginx:1.27", "replicas": 2, "port": 8080 }
    }))
    .unwrap();
    apps.create(&PostParams::default(), &app).await.unwrap();
    wait_current(&apps, "shop").await;
    recorder.wait_current(1).await;
    let web_reached = |o: &Value| o["status"]["readyReplicas"] == o["spec"]["replicas"];
    assert_in_progress_until_done("create", &recorder.since(0), 1, web_reached);

    for (what, patch, generation) in [
        ("replicas 2 -> 4", json!({ "spec": { "replicas": 4 } }), 2),
        (
            "image change",
            json!({ "spec": { "image": "nginx:1.28" } }),
            3,
        ),
    ] {
        let from = recorder.len();
        apps.patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        wait_current(&apps, "shop").await;
        recorder.wait_current(generation).await;
        assert_in_progress_until_done(what, &recorder.since(from), generation, web_reached);
    }
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        env.api().get("shop-deployment").await.unwrap();
    assert_eq!(
        deployment.spec.template.spec.unwrap().containers[0]
            .image
            .as_deref(),
        Some("nginx:1.28")
    );
}
