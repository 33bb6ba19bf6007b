//! A pod's own TCP proxy to the API server, through which its agent talks to it: what
//! [`PodRunner::partition`](super::PodRunner::partition) cuts and `heal` restores.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::supervisor::Ctx;
use super::{ProxyRecord, SharedState, lock, note};

/// Connections a partitioned proxy holds at most (the oldest are closed beyond).
const MAX_HELD_CONNECTIONS: usize = 256;
/// How long the proxy tries to reach the API server for a connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A pod's API server proxy (see [`PodRunner::partition`](super::PodRunner::partition));
/// closed on drop.
pub(super) struct ApiProxy {
    uid: String,
    /// What the agent's kubeconfig names: `https://<API server address>:<proxy port>`.
    pub(super) url: String,
    shared: SharedState,
    task: tokio::task::JoinHandle<()>,
}

impl ApiProxy {
    /// Listens on the API server's address (loopback), another port: its serving
    /// certificate, for `localhost` and `127.0.0.1`, covers it.
    pub(super) async fn start(
        ctx: &Ctx,
        namespace: &str,
        name: &str,
        uid: &str,
        log: &Path,
    ) -> Result<Self, String> {
        let server: http::Uri = ctx
            .server
            .parse()
            .map_err(|e| format!("the API server URL {}: {e}", ctx.server))?;
        let host = server
            .host()
            .ok_or_else(|| format!("the API server URL {} has no host", ctx.server))?;
        let upstream = format!("{host}:{}", server.port_u16().unwrap_or(443));
        let ip = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .map_err(|e| format!("bind the API proxy on {ip}: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("the API proxy's address: {e}"))?;
        let key = (namespace.to_string(), name.to_string());
        let mut changes = ctx.faults.subscribe();
        let applied = Arc::new(AtomicU64::new(*changes.borrow_and_update()));
        let partitioned = {
            let mut shared = lock(&ctx.shared);
            shared.proxies.insert(
                uid.to_string(),
                ProxyRecord {
                    namespace: key.0.clone(),
                    name: key.1.clone(),
                    addr,
                    applied: applied.clone(),
                },
            );
            shared.partitioned.contains(&key)
        };
        if partitioned {
            note(
                log,
                &format!("API proxy {addr}: partitioned from the API server"),
            );
        }
        let proxy = Proxy {
            upstream: upstream.into(),
            key,
            shared: ctx.shared.clone(),
            log: log.to_path_buf(),
            applied,
        };
        let task = tokio::spawn(proxy.serve(listener, changes, partitioned));
        tracing::debug!(%namespace, pod = %name, %addr, "pod runner: API proxy started");
        Ok(Self {
            uid: uid.to_string(),
            url: format!("https://{addr}"),
            shared: ctx.shared.clone(),
            task,
        })
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        // Dropping the task's future drops its connections too.
        self.task.abort();
        lock(&self.shared).proxies.remove(&self.uid);
    }
}

struct Proxy {
    upstream: Arc<str>,
    /// `(namespace, pod)`: how partitions are keyed.
    key: (String, String),
    shared: SharedState,
    log: PathBuf,
    applied: Arc<AtomicU64>,
}

impl Proxy {
    async fn serve(
        self,
        listener: TcpListener,
        mut changes: watch::Receiver<u64>,
        mut partitioned: bool,
    ) {
        let mut forwarded = JoinSet::new();
        // Accepted while partitioned: neither read nor answered, like a dropped network.
        let mut held = std::collections::VecDeque::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) if partitioned => {
                        if held.len() >= MAX_HELD_CONNECTIONS {
                            held.pop_front();
                        }
                        held.push_back(stream);
                    }
                    Ok((stream, _)) => {
                        forwarded.spawn(forward(stream, self.upstream.clone()));
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "pod runner: API proxy accept");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let generation = *changes.borrow_and_update();
                    let now = lock(&self.shared).partitioned.contains(&self.key);
                    if now && !partitioned {
                        let open = forwarded.len();
                        forwarded.abort_all();
                        // Each aborted task's future, and so its sockets, is dropped by then.
                        while forwarded.join_next().await.is_some() {}
                        note(&self.log, &format!("API proxy: partitioned from the API server, {open} connection(s) closed"));
                    } else if !now && partitioned {
                        note(&self.log, &format!("API proxy: healed, {} held connection(s) forwarded", held.len()));
                        for stream in held.drain(..) {
                            forwarded.spawn(forward(stream, self.upstream.clone()));
                        }
                    }
                    partitioned = now;
                    self.applied.store(generation, Ordering::SeqCst);
                }
                Some(_) = forwarded.join_next(), if !forwarded.is_empty() => {}
            }
        }
    }
}

/// Copies bytes both ways between `client` and the API server until either end closes.
async fn forward(mut client: TcpStream, upstream: Arc<str>) {
    let connected =
        tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(&*upstream)).await;
    let Ok(Ok(mut server)) = connected else {
        tracing::debug!(%upstream, "pod runner: API proxy cannot reach the API server");
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}
