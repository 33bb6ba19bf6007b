//! Fault injection: kube-apiserver restarts and etcd compaction. Each test starts its own
//! control plane, because restarting the shared one would disturb every other test.

use std::time::{Duration, Instant};

use devctl_testenv::audit::Request;
use devctl_testenv::{Cluster, ClusterOptions, ControlPlane, Options, eventually};
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::mpsc;

const TIMEOUT: Duration = Duration::from_secs(60);

fn config_map(name: &str, color: &str) -> ConfigMap {
    serde_json::from_value(json!({ "metadata": { "name": name }, "data": { "color": color } }))
        .unwrap()
}

/// The first event of a raw watch on `api` from `resource_version`.
async fn first_watch_event(api: &Api<ConfigMap>, resource_version: &str) -> WatchEvent<ConfigMap> {
    let stream = api
        .watch(&WatchParams::default().timeout(10), resource_version)
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    tokio::time::timeout(TIMEOUT, stream.next())
        .await
        .expect("no watch event")
        .expect("the watch ended without an event")
        .unwrap()
}

/// What a kube-runtime watcher yields, as text (`Init`, `InitDone`, `Apply <name>`, errors).
fn record(
    events: impl Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Send + 'static,
) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let name = |cm: &ConfigMap| cm.metadata.name.clone().unwrap_or_default();
            let text = match event {
                Ok(watcher::Event::Init) => "Init".to_string(),
                Ok(watcher::Event::InitApply(cm)) => format!("InitApply {}", name(&cm)),
                Ok(watcher::Event::InitDone) => "InitDone".to_string(),
                Ok(watcher::Event::Apply(cm)) => format!("Apply {}", name(&cm)),
                Ok(watcher::Event::Delete(cm)) => format!("Delete {}", name(&cm)),
                Err(e) => format!("error: {e}"),
            };
            if tx.send(text).is_err() {
                return;
            }
        }
    });
    rx
}

/// Receives until `want` arrives; returns everything received.
async fn receive_until(events: &mut mpsc::UnboundedReceiver<String>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(TIMEOUT, async {
        while let Some(event) = events.recv().await {
            let done = event == want;
            seen.push(event);
            if done {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        found,
        Ok(true),
        "no {want:?} from the watcher; got {seen:?}"
    );
    seen
}

fn configmap_requests<'a>(
    requests: &'a [Request],
    ns: &'a str,
    verb: &'a str,
) -> impl Iterator<Item = &'a Request> + 'a {
    requests.iter().filter(move |r| {
        r.verb == verb && r.resource == "configmaps" && r.namespace.as_deref() == Some(ns)
    })
}

fn api_server_pid(cp: &ControlPlane) -> u32 {
    cp.pids()
        .into_iter()
        .find(|(name, _)| name == "kube-apiserver")
        .map(|(_, pid)| pid)
        .expect("no kube-apiserver in pids()")
}

#[tokio::test]
async fn compaction_and_restart_make_an_old_watch_410_and_the_watcher_relist() {
    let cp = ControlPlane::start_with(Options {
        audit: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let audit = cp.audit_log().unwrap();
    let first_mark = audit.mark();
    let ns = cp.create_namespace("faults").await.unwrap();
    // Made before the restart and used after it.
    let api: Api<ConfigMap> = Api::namespaced(cp.client().await.unwrap(), &ns);
    let created = api
        .create(&PostParams::default(), &config_map("settings", "blue"))
        .await
        .unwrap();
    let old_rv = created.metadata.resource_version.clone().unwrap();

    let mut events = record(
        watcher(
            api.clone(),
            watcher::Config::default().fields("metadata.name=settings"),
        )
        .default_backoff(),
    );
    receive_until(&mut events, "InitDone").await;

    // A write the watcher does not see moves etcd past the watcher's resourceVersion.
    let other = api
        .create(&PostParams::default(), &config_map("other", "red"))
        .await
        .unwrap();
    let other_rv: i64 = other.metadata.resource_version.unwrap().parse().unwrap();
    // Before compaction a watch from the old resourceVersion replays what followed it.
    match first_watch_event(&api, &old_rv).await {
        WatchEvent::Added(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("other")),
        event => panic!("expected ADDED other from {old_rv}, got {event:?}"),
    }

    let started = Instant::now();
    let revision = cp.compact_etcd().await.unwrap();
    println!("compact_etcd took {:?}", started.elapsed());
    assert!(
        revision >= other_rv + 2,
        "compacted at {revision}, {other_rv} is not too old"
    );
    // Each call compacts again, past everything before it.
    assert!(cp.compact_etcd().await.unwrap() >= revision + 2);
    // The running server's watch cache still holds that history and replays it: only a
    // watch that reaches etcd sees the compaction (see the next test).
    match first_watch_event(&api, &old_rv).await {
        WatchEvent::Added(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("other")),
        event => panic!("expected the watch cache to replay ADDED other, got {event:?}"),
    }

    let before_restart = audit.mark();
    let old_pid = api_server_pid(&cp);
    let started = Instant::now();
    cp.restart_api_server().await.unwrap();
    println!("graceful restart took {:?}", started.elapsed());
    assert_ne!(api_server_pid(&cp), old_pid);
    cp.check_processes().unwrap();
    assert!(cp.log_dir().join("kube-apiserver.log.1").is_file());

    // (a) The restarted server serves what was written before, to the old client.
    let settings = api.get("settings").await.unwrap();
    assert_eq!(settings.data.unwrap()["color"], "blue");
    assert_eq!(
        settings.metadata.resource_version.as_deref(),
        Some(&*old_rv)
    );

    // (b) A watch from before the compaction is gone...
    match first_watch_event(&api, &old_rv).await {
        WatchEvent::Error(status) => assert_eq!(status.code, 410, "{status:?}"),
        event => panic!("expected 410 Gone for a watch from {old_rv}, got {event:?}"),
    }
    // ...so the watcher, resuming from its resourceVersion, starts over with a LIST.
    let seen = receive_until(&mut events, "InitDone").await;
    assert!(seen.contains(&"Init".to_string()), "{seen:?}");
    assert!(seen.contains(&"InitApply settings".to_string()), "{seen:?}");
    let since_restart = eventually(
        "the watcher's re-LIST in the audit log",
        TIMEOUT,
        || async {
            let requests = audit.requests_since(before_restart).ok()?;
            (configmap_requests(&requests, &ns, "list").count() > 0
                && configmap_requests(&requests, &ns, "get").count() > 0)
                .then_some(requests)
        },
    )
    .await
    .unwrap();
    let relist: Vec<_> = configmap_requests(&since_restart, &ns, "list").collect();
    assert!(relist.iter().all(|r| r.code == Some(200)), "{relist:?}");

    // (c) The audit log kept its earlier events and marks: the restarted server appended.
    let all = audit.requests_since(first_mark).unwrap();
    let creates: Vec<_> = configmap_requests(&all, &ns, "create").collect();
    assert_eq!(creates.len(), 2, "{creates:?}");
    let gets: Vec<_> = configmap_requests(&since_restart, &ns, "get").collect();
    assert_eq!(gets.len(), 1, "{gets:?}");
    assert_eq!(gets[0].name.as_deref(), Some("settings"));
}

#[tokio::test]
async fn without_the_watch_cache_compaction_alone_makes_an_old_watch_410() {
    let cp = ControlPlane::start_with(Options {
        extra_apiserver_args: vec!["--watch-cache=false".into()],
        ..Options::default()
    })
    .await
    .unwrap();
    let ns = cp.create_namespace("compaction").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(cp.client().await.unwrap(), &ns);
    let created = api
        .create(&PostParams::default(), &config_map("settings", "blue"))
        .await
        .unwrap();
    let old_rv = created.metadata.resource_version.unwrap();
    let other = api
        .create(&PostParams::default(), &config_map("other", "red"))
        .await
        .unwrap();
    let latest_rv = other.metadata.resource_version.unwrap();
    match first_watch_event(&api, &old_rv).await {
        WatchEvent::Added(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("other")),
        event => panic!("expected ADDED other from {old_rv}, got {event:?}"),
    }
    cp.compact_etcd().await.unwrap();
    // Every resourceVersion from before the compaction is gone, the latest one included.
    for rv in [&old_rv, &latest_rv] {
        match first_watch_event(&api, rv).await {
            WatchEvent::Error(status) => assert_eq!(status.code, 410, "{status:?}"),
            event => panic!("expected 410 Gone for a watch from {rv}, got {event:?}"),
        }
    }
}

#[tokio::test]
async fn killed_api_server_comes_back_and_old_clients_reconnect() {
    let cp = ControlPlane::start_with(Options {
        audit: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let audit = cp.audit_log().unwrap();
    let ns = cp.create_namespace("killed").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(cp.client().await.unwrap(), &ns);
    api.create(&PostParams::default(), &config_map("before", "blue"))
        .await
        .unwrap();

    let mark = audit.mark();
    let pids = cp.pids();
    let started = Instant::now();
    cp.kill_api_server_and_restart().await.unwrap();
    println!("SIGKILL restart took {:?}", started.elapsed());
    let started = Instant::now();
    cp.restart_api_server().await.unwrap();
    println!("second (graceful) restart took {:?}", started.elapsed());
    cp.check_processes().unwrap();

    // etcd kept running; only kube-apiserver changed.
    let after = cp.pids();
    assert_eq!(after.len(), pids.len());
    for ((name, before), (_, now)) in pids.iter().zip(&after) {
        assert_eq!(before == now, name == "etcd", "{pids:?} -> {after:?}");
    }
    let logs = cp.log_dir();
    for log in [
        "kube-apiserver.log.1",
        "kube-apiserver.log.2",
        "kube-apiserver.log",
    ] {
        assert!(logs.join(log).is_file(), "{log} is missing");
    }

    assert_eq!(
        api.get("before").await.unwrap().data.unwrap()["color"],
        "blue"
    );
    api.create(&PostParams::default(), &config_map("after", "green"))
        .await
        .unwrap();
    // The audit log may trail the response.
    let requests = eventually(
        "the create in the audit log",
        Duration::from_secs(10),
        || async {
            let requests = audit.requests_since(mark).ok()?;
            (configmap_requests(&requests, &ns, "create").count() >= 1).then_some(requests)
        },
    )
    .await
    .unwrap();
    assert_eq!(configmap_requests(&requests, &ns, "create").count(), 1);
    assert_eq!(configmap_requests(&requests, &ns, "get").count(), 1);
}

#[tokio::test]
async fn a_cluster_keeps_working_across_an_api_server_restart() {
    let cluster = Cluster::start_with(ClusterOptions {
        nodes: 1,
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    // Tests hold the shared cluster as `&'static Cluster`: restarting needs only `&`.
    let cluster: &Cluster = &cluster;
    let started = Instant::now();
    cluster.kill_api_server_and_restart().await.unwrap();
    println!("cluster: SIGKILL restart took {:?}", started.elapsed());
    let started = Instant::now();
    cluster.restart_api_server().await.unwrap();
    println!("cluster: graceful restart took {:?}", started.elapsed());
    // kube-scheduler exits on purpose when its cache no longer matches the API server (it
    // did after a restart in the fault campaign); the controllers and kwok may die too. Like a
    // kubelet with static pods, the environment starts each again.
    let before = cluster.pids();
    for name in ["kube-scheduler", "kube-controller-manager", "kwok"] {
        let pid = before.iter().find(|(n, _)| n == name).unwrap().1;
        // SAFETY: kill(2) on the environment's own child process.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
    eventually("the killed components to run again", TIMEOUT, || async {
        let restarts = cluster.restarts();
        restarts
            .iter()
            .all(|(_, n)| *n == 1)
            .then_some(())
            .filter(|_| restarts.len() == 3)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", cluster.restarts(), cluster.describe()));

    // Controllers, scheduler and kwok reconnect: a new Deployment's pod runs.
    let ns = cluster.create_namespace("restart").await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(cluster.client().await.unwrap(), &ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{ "name": "main", "image": "registry.example/app:1" }] }
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    eventually(
        "the Deployment to have 1 ready replica",
        TIMEOUT,
        || async {
            let d = deployments.get("web").await.ok()?;
            (d.status?.ready_replicas? == 1).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.describe()));
    cluster.check_processes().unwrap();
}
