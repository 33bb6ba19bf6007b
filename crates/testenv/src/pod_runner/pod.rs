//! One pod's supervision: waits for its claims to be free, starts its agent, restarts it with
//! back-off like `restartPolicy: Always`, honours a hold, and cleans up when stopped.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::sync::watch;

use super::agent::Agent;
use super::faults::{held, wait_released};
use super::launch::prepare;
use super::plan::Plan;
use super::proxy::ApiProxy;
use super::readiness::{probe_until_ready, set_pod_ready};
use super::supervisor::Ctx;
use super::volumes::resolve_claims;
use super::{PodRecord, lock, note};
use crate::process::free_port;

const RESTART_BACKOFF_MIN: Duration = Duration::from_secs(1);
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// An agent that ran this long restarts after [`RESTART_BACKOFF_MIN`] again.
const RESTART_BACKOFF_RESET: Duration = Duration::from_secs(60);
/// Back-off while a pod cannot be started yet (no ServiceAccount, claim, ConfigMap...).
const PREPARE_BACKOFF_MIN: Duration = Duration::from_millis(250);
const PREPARE_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Waits until a stop is requested; the grace it asks for.
pub(super) async fn stop_requested(stop: &mut watch::Receiver<Option<Duration>>) -> Duration {
    loop {
        if let Some(grace) = *stop.borrow_and_update() {
            return grace;
        }
        if stop.changed().await.is_err() {
            return Duration::ZERO;
        }
    }
}

/// Sleeps `delay`; `true` if a stop was requested meanwhile.
async fn stopped_within(stop: &mut watch::Receiver<Option<Duration>>, delay: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => false,
        _ = stop_requested(stop) => true,
    }
}

/// Runs `attempt` until it succeeds, with back-off, noting each new reason in the pod's log;
/// `None` if the pod is stopped meanwhile.
async fn retrying<T, F, Fut>(
    stop: &mut watch::Receiver<Option<Duration>>,
    log: &Path,
    what: &str,
    mut attempt: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut backoff = PREPARE_BACKOFF_MIN;
    let mut last: Option<String> = None;
    loop {
        if stop.borrow().is_some() {
            return None;
        }
        match attempt().await {
            Ok(value) => return Some(value),
            Err(why) => {
                if last.as_ref() != Some(&why) {
                    note(log, &format!("cannot {what} yet (retrying): {why}"));
                    tracing::info!(log = %log.display(), "pod runner: cannot {what} yet: {why}");
                    last = Some(why);
                }
                if stopped_within(stop, backoff).await {
                    return None;
                }
                backoff = (backoff * 2).min(PREPARE_BACKOFF_MAX);
            }
        }
    }
}

/// Supervises one pod: waits for its claims to be free, then runs its agent until stopped.
pub(super) async fn run_pod(
    ctx: Arc<Ctx>,
    pod: Pod,
    claim_uids: Arc<Mutex<Vec<String>>>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let uid = pod.uid().unwrap_or_default();
    let log = ctx
        .root
        .join("logs")
        .join(format!("{namespace}_{name}_{uid}.log"));
    lock(&ctx.shared).pods.insert(
        (namespace.clone(), name.clone()),
        PodRecord {
            uid: uid.clone(),
            log: log.clone(),
        },
    );
    let plan = match Plan::new(&pod) {
        Ok(plan) => plan,
        Err(why) => {
            note(&log, &why);
            tracing::warn!(%namespace, pod = %name, "pod runner: {why}");
            return;
        }
    };
    // By uid alone: engines put Unix sockets in these directories, and a socket's path must
    // fit in 107 bytes.
    let pod_dir = ctx.root.join("pods").join(&uid);

    let claims = {
        let (ctx, plan, namespace) = (&ctx, &plan, &namespace);
        match retrying(&mut stop, &log, "find its claims", || {
            resolve_claims(ctx, namespace, plan)
        })
        .await
        {
            Some(claims) => claims,
            None => return,
        }
    };
    let mut uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
    uids.sort();
    uids.dedup();
    *claim_uids
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = uids.clone();
    // At most one agent per claim: wait for the previous pod's agent to be gone.
    let mut guards = Vec::new();
    for claim_uid in &uids {
        let claim_lock = ctx.claim_lock(claim_uid);
        let guard = match claim_lock.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                note(
                    &log,
                    &format!("waiting for the previous agent on claim {claim_uid} to exit"),
                );
                tokio::select! {
                    guard = claim_lock.lock_owned() => guard,
                    _ = stop_requested(&mut stop) => return,
                }
            }
        };
        guards.push(guard);
    }
    let ports = match free_port().and_then(|p| Ok((p, free_port()?))) {
        Ok(ports) => ports,
        Err(e) => {
            note(&log, &format!("no free port: {e}"));
            return;
        }
    };
    // The agent's way to the API server, which `partition` cuts.
    let proxy = match ApiProxy::start(&ctx, &namespace, &name, &uid, &log).await {
        Ok(proxy) => proxy,
        Err(why) => {
            note(&log, &format!("no API proxy: {why}"));
            return;
        }
    };
    let key = (namespace.clone(), name.clone());

    // Init containers first, each to a successful exit (retried with back-off, as a
    // kubelet does).
    let (inits, skipped) = Plan::init_containers(&pod, &plan);
    for skipped in skipped {
        note(
            &log,
            &format!("init container {skipped:?} does not run devctl-agent: not run"),
        );
    }
    let mut backoff = RESTART_BACKOFF_MIN;
    for init in &inits {
        loop {
            let launch = {
                let (ctx, pod, claims, pod_dir) = (&ctx, &pod, &claims, &pod_dir);
                let server = proxy.url.as_str();
                match retrying(&mut stop, &log, "start an init container", || {
                    prepare(ctx, pod, init, claims, pod_dir, ports, server)
                })
                .await
                {
                    Some(launch) => launch,
                    None => return,
                }
            };
            note(&log, &format!("init container {:?}", init.container.name));
            let exit = match Agent::spawn(&ctx, &namespace, &name, &uid, init, launch, &log, 1) {
                Ok(agent) => agent.supervise(&mut stop).await,
                Err(why) => {
                    note(&log, &format!("cannot start the init container: {why}"));
                    if stopped_within(&mut stop, backoff).await {
                        return;
                    }
                    backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
                    continue;
                }
            };
            if exit.requested {
                return;
            }
            if exit.code == Some(0) {
                break;
            }
            note(
                &log,
                &format!(
                    "init container {:?} exited with {:?}; again in {backoff:?}",
                    init.container.name, exit.code
                ),
            );
            if stopped_within(&mut stop, backoff).await {
                return;
            }
            backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
        }
    }
    let mut backoff = RESTART_BACKOFF_MIN;
    let mut starts = 0u32;
    // The pod's Ready condition was set False after an agent exit.
    let mut marked_unready = false;
    loop {
        if held(&ctx, &key) && wait_released(&ctx, &key, &log, &mut stop).await {
            break;
        }
        let launch = {
            let (ctx, pod, plan, claims, pod_dir) = (&ctx, &pod, &plan, &claims, &pod_dir);
            let server = proxy.url.as_str();
            match retrying(&mut stop, &log, "start", || {
                prepare(ctx, pod, plan, claims, pod_dir, ports, server)
            })
            .await
            {
                Some(launch) => launch,
                None => break,
            }
        };
        // Started and listed as running under the lock `kill_and_hold` sets the hold under:
        // no agent starts once it returned.
        let spawned = {
            let mut shared = lock(&ctx.shared);
            if shared.held.contains(&key) {
                None
            } else {
                let spawned = Agent::spawn(
                    &ctx,
                    &namespace,
                    &name,
                    &uid,
                    &plan,
                    launch,
                    &log,
                    starts + 1,
                );
                if let Ok(agent) = &spawned {
                    shared.running.insert(uid.clone(), agent.pid);
                }
                Some(spawned)
            }
        };
        let agent = match spawned {
            None => continue,
            Some(Ok(agent)) => agent,
            Some(Err(why)) => {
                starts += 1;
                note(&log, &format!("cannot start the agent: {why}"));
                if stopped_within(&mut stop, backoff).await {
                    break;
                }
                backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
                continue;
            }
        };
        starts += 1;
        // Taken off `running` (under the lock) before it is reaped. A pod marked not ready
        // when its last agent went is Ready again once the new one's readiness probe passes.
        let exit = {
            let mut supervise = std::pin::pin!(agent.supervise(&mut stop));
            let mut probe = std::pin::pin!(probe_until_ready(&ctx, &pod, ports.1, &log));
            let mut probing = marked_unready;
            loop {
                tokio::select! {
                    exit = &mut supervise => break exit,
                    _ = &mut probe, if probing => {
                        probing = false;
                        marked_unready = false;
                    }
                }
            }
        };
        lock(&ctx.shared)
            .exits
            .entry(key.clone())
            .or_default()
            .push(exit.clone());
        let how = match (exit.code, exit.signal) {
            (Some(code), _) => format!("exited with code {code}"),
            (_, Some(signal)) => format!("was killed by signal {signal}"),
            _ => "ended".to_string(),
        };
        note(
            &log,
            &format!("agent (pid {}) {how} after {:?}", exit.pid, exit.uptime),
        );
        if exit.requested {
            break;
        }
        // What a kubelet's failing readiness probe would show: the operator must not count
        // an instance whose agent is gone by its last report.
        for _ in 0..3 {
            if set_pod_ready(&ctx, &pod, false, &log).await {
                marked_unready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if held(&ctx, &key) {
            // Released: started again at once, the hold standing in for the back-off.
            if wait_released(&ctx, &key, &log, &mut stop).await {
                break;
            }
            continue;
        }
        tracing::info!(%namespace, pod = %name, pid = exit.pid, "pod runner: agent {how}; restarting in {backoff:?}");
        if exit.uptime >= RESTART_BACKOFF_RESET {
            backoff = RESTART_BACKOFF_MIN;
        }
        note(&log, &format!("restarting in {backoff:?}"));
        if stopped_within(&mut stop, backoff).await {
            break;
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
    }
    drop(proxy);
    // The pod's volumes go with it (claims stay).
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(pod_dir)).await;
    drop(guards);
}
