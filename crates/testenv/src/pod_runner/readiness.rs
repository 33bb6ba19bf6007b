//! The pod's `Ready` condition as a kubelet would keep it: false when its agent exits, true
//! again once the new agent's `/readyz` answers.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use tokio::net::TcpStream;

use super::note;
use super::supervisor::Ctx;

/// Sets the pod's `Ready` and `ContainersReady` conditions (the pod's uid as precondition: a
/// replacement of the same name is not touched). Returns whether it was written.
pub(super) async fn set_pod_ready(ctx: &Ctx, pod: &Pod, ready: bool, log: &Path) -> bool {
    let namespace = pod.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = if ready { "True" } else { "False" };
    let reason = if ready { None } else { Some("AgentExited") };
    let condition = |type_: &str| {
        serde_json::json!({
            "type": type_, "status": status, "lastTransitionTime": now, "reason": reason,
        })
    };
    let patch = serde_json::json!({
        "metadata": { "uid": pod.uid() },
        "status": { "conditions": [condition("Ready"), condition("ContainersReady")] },
    });
    match api
        .patch_status(
            &pod.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(patch),
        )
        .await
    {
        Ok(_) => {
            note(log, &format!("pod marked Ready={status}"));
            true
        }
        Err(e) => {
            note(log, &format!("cannot mark the pod Ready={status}: {e}"));
            false
        }
    }
}

/// Polls the agent's `/readyz` on `health_port` (as a kubelet's readiness probe would, every
/// half second) until it answers 200, then marks the pod Ready.
pub(super) async fn probe_until_ready(ctx: &Ctx, pod: &Pod, health_port: u16, log: &Path) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let answer = async {
            let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, health_port)).await?;
            stream
                .write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")
                .await?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head).await?;
            Ok::<_, std::io::Error>(head)
        };
        let ok = tokio::time::timeout(Duration::from_secs(1), answer)
            .await
            .is_ok_and(|r| r.is_ok_and(|head| head.ends_with(b" 200")));
        if ok && set_pod_ready(ctx, pod, true, log).await {
            return;
        }
    }
}
