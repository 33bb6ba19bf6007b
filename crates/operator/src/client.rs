//! The operator's Kubernetes clients: a User-Agent that names the replica, request counting
//! (`rest_client_requests_total`), and the write fence of leader election.
//!
//! The fence is the last line against split brain: a leader that was paused (SIGSTOP, a long
//! GC-like stall, a partition) may wake up after another replica took over, with reconciles
//! half-way. Every write request of the controllers passes [`Fence::allows_writes`], which
//! compares the monotonic clock with the last successful lease renewal plus the renew
//! deadline; past it, the request fails before it leaves the process.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use http::{Method, Request, Response, Uri};
use tower::{Layer, Service};

use crate::metrics::Metrics;

/// Whether writes may leave the process now.
#[derive(Clone, Debug)]
pub struct Fence {
    state: Arc<FenceState>,
}

#[derive(Debug)]
struct FenceState {
    base: Instant,
    /// Nanoseconds after `base` until which writes are allowed (`u64::MAX`: always).
    open_until: AtomicU64,
}

impl Fence {
    /// A fence that never closes (no leader election).
    pub fn open() -> Self {
        Self::with(u64::MAX)
    }

    /// A fence closed until [`Fence::open_until`] is called (a replica that must win the
    /// lease before it writes).
    pub fn closed() -> Self {
        Self::with(0)
    }

    fn with(open_until: u64) -> Self {
        Self {
            state: Arc::new(FenceState {
                base: Instant::now(),
                open_until: AtomicU64::new(open_until),
            }),
        }
    }

    /// Allows writes until `deadline` (monotonic).
    pub fn open_until(&self, deadline: Instant) {
        let nanos = deadline
            .saturating_duration_since(self.state.base)
            .as_nanos();
        self.state
            .open_until
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// Refuses every write from now on.
    pub fn close(&self) {
        self.state.open_until.store(0, Ordering::SeqCst);
    }

    pub fn allows_writes(&self) -> bool {
        let now = Instant::now()
            .saturating_duration_since(self.state.base)
            .as_nanos();
        u64::try_from(now).unwrap_or(u64::MAX) < self.state.open_until.load(Ordering::SeqCst)
    }
}

/// A write refused by the fence.
#[derive(Debug, thiserror::Error)]
#[error(
    "write refused: this replica's leadership is not confirmed (lease not renewed within the renew deadline)"
)]
pub struct Fenced;

/// The tower layer of [`Fence`] and request counting.
#[derive(Clone)]
pub struct RequestLayer {
    fence: Fence,
    metrics: Arc<Metrics>,
}

impl RequestLayer {
    pub fn new(fence: Fence, metrics: Arc<Metrics>) -> Self {
        Self { fence, metrics }
    }
}

impl<S> Layer<S> for RequestLayer {
    type Service = RequestService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestService {
            inner,
            fence: self.fence.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RequestService<S> {
    inner: S,
    fence: Fence,
    metrics: Arc<Metrics>,
}

/// The verb a request's latency is filed under, as client-go names them: a watch is a GET
/// whose response streams for minutes, so only its opening is timed, as `WATCH`.
fn verb(method: &Method, uri: &Uri) -> &'static str {
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match *method {
        Method::GET if watch => "WATCH",
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        _ => "OTHER",
    }
}

fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RequestService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let method = request.method().clone();
        let host = request
            .uri()
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let metrics = self.metrics.clone();
        if is_write(&method) && !self.fence.allows_writes() {
            metrics.rest_request(&host, method.as_str(), "<fenced>");
            return Box::pin(async { Err(Box::new(Fenced) as tower::BoxError) });
        }
        // The fence is checked again at every poll until the response arrives: a write that
        // passed the check at `call` but still waits for a connection, a TLS handshake or its
        // turn on the runtime when the process is paused must not leave after it resumes.
        // (Cut off after it was sent, it is reported fenced; the replica stops either way.)
        let fence = is_write(&method).then(|| self.fence.clone());
        let verb = verb(&method, request.uri());
        let sent = Instant::now();
        let mut response = Box::pin(self.inner.call(request));
        Box::pin(async move {
            let result = futures::future::poll_fn(|cx| {
                if fence.as_ref().is_some_and(|f| !f.allows_writes()) {
                    return Poll::Ready(Err(Box::new(Fenced) as tower::BoxError));
                }
                response.as_mut().poll(cx).map_err(Into::into)
            })
            .await;
            let code = match &result {
                Ok(response) => {
                    metrics.rest_latency(&host, verb, sent.elapsed());
                    response.status().as_u16().to_string()
                }
                Err(e) if e.is::<Fenced>() => "<fenced>".to_string(),
                Err(_) => "<error>".to_string(),
            };
            metrics.rest_request(&host, method.as_str(), &code);
            result
        })
    }
}

/// A client for `config` with the replica's User-Agent, request counting and `fence`.
pub fn build(
    mut config: kube::Config,
    identity: &str,
    fence: Fence,
    metrics: Arc<Metrics>,
) -> Result<kube::Client, kube::Error> {
    let agent = format!("devctl-operator/{} {identity}", env!("CARGO_PKG_VERSION"));
    if let Ok(value) = http::HeaderValue::from_str(&agent) {
        config.headers.push((http::header::USER_AGENT, value));
    }
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&RequestLayer::new(fence, metrics))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_fence_closes_at_its_deadline() {
        let fence = Fence::closed();
        assert!(!fence.allows_writes());
        fence.open_until(Instant::now() + Duration::from_secs(60));
        assert!(fence.allows_writes());
        fence.open_until(Instant::now() - Duration::from_millis(1));
        assert!(!fence.allows_writes());
        assert!(Fence::open().allows_writes());
        let open = Fence::open();
        open.close();
        assert!(!open.allows_writes());
    }

    #[test]
    fn a_watch_is_timed_apart_from_the_gets() {
        let uri = |u: &str| u.parse::<Uri>().unwrap();
        let pods = "https://a:6443/api/v1/namespaces/n/pods";
        assert_eq!(verb(&Method::GET, &uri(pods)), "GET");
        assert_eq!(
            verb(
                &Method::GET,
                &uri(&format!(
                    "{pods}?labelSelector=x&watch=true&resourceVersion=5"
                ))
            ),
            "WATCH"
        );
        assert_eq!(
            verb(&Method::GET, &uri(&format!("{pods}?watch=false"))),
            "GET"
        );
        assert_eq!(verb(&Method::PATCH, &uri(pods)), "PATCH");
    }

    /// A service whose responses wait until `release` fires, as a request waiting for a
    /// connection does.
    fn held_until(
        release: tokio::sync::watch::Receiver<bool>,
    ) -> impl Service<
        Request<()>,
        Response = Response<()>,
        Error = std::convert::Infallible,
        Future = BoxFuture<'static, Result<Response<()>, std::convert::Infallible>>,
    > + Clone {
        tower::service_fn(move |_: Request<()>| {
            let mut release = release.clone();
            Box::pin(async move {
                let _ = release.wait_for(|go| *go).await;
                Ok(Response::new(()))
            }) as BoxFuture<'static, _>
        })
    }

    #[tokio::test]
    async fn a_write_waiting_when_the_fence_closes_never_leaves() {
        let (release, held) = tokio::sync::watch::channel(false);
        let fence = Fence::open();
        let metrics = Arc::new(Metrics::default());
        let mut service = RequestLayer::new(fence.clone(), metrics).layer(held_until(held));
        let request = |method: Method| {
            Request::builder()
                .method(method)
                .uri("https://api.example/apis")
                .body(())
                .unwrap()
        };
        let write = tokio::spawn(service.call(request(Method::PATCH)));
        let read = tokio::spawn(service.call(request(Method::GET)));
        tokio::task::yield_now().await;
        // The process "resumes" past its deadline: the fence is closed before the
        // connection is ready.
        fence.close();
        release.send(true).unwrap();
        let refused = write.await.unwrap().unwrap_err();
        assert!(refused.is::<Fenced>(), "{refused}");
        assert!(read.await.unwrap().is_ok(), "reads still pass");
    }
}
