//! Smoke (work in progress).
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn smoke() {
    let cluster = devctl_testenv::Cluster::start_with(devctl_testenv::ClusterOptions {
        nodes: 0,
        pods: devctl_testenv::PodBacking::None,
        real_node: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let ns = cluster.create_namespace("smoke").await.unwrap();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pg", "namespace": ns},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "pg", "image": "localhost/devctl/postgres:15", "command": ["postgres", "-V"]}]}
    });
    let client = cluster.client().await.unwrap();
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, &ns);
    api.create(&Default::default(), &serde_json::from_value(pod).unwrap())
        .await
        .unwrap();
    for _ in 0..120 {
        let p = api.get("pg").await.unwrap();
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        eprintln!("phase {phase:?}");
        if phase.as_deref() == Some("Succeeded") || phase.as_deref() == Some("Failed") {
            eprintln!("{:?}", p.status);
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("{}", cluster.real_node().unwrap().describe());
    std::thread::sleep(Duration::from_secs(1));
}
