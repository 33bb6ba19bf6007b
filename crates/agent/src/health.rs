//! `/healthz` and `/readyz` on `DEVCTL_HEALTH_PORT`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::error::{Error, Result};

/// What the probes answer from; the supervisor updates it.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    failed: AtomicBool,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The engine died and is waiting to be restarted (or the agent gave up).
    pub fn set_failed(&self, failed: bool) {
        self.failed.store(failed, Ordering::Relaxed);
    }
}

async fn healthz(State(health): State<Arc<Health>>) -> (StatusCode, &'static str) {
    if health.failed.load(Ordering::Relaxed) {
        (StatusCode::INTERNAL_SERVER_ERROR, "engine failed\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

async fn readyz(State(health): State<Arc<Health>>) -> (StatusCode, &'static str) {
    if health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// Binds `0.0.0.0:port` and serves the probes in the background, and `extra` beside them
/// (MariaDB's clone endpoint).
pub async fn serve(port: u16, health: Arc<Health>, extra: Option<Router>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port))
        .await
        .map_err(|e| {
            Error::Internal(format!(
                "cannot listen on 0.0.0.0:{port} ({}): {e}",
                devctl_api::instance::env::HEALTH_PORT
            ))
        })?;
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health);
    if let Some(extra) = extra {
        app = app.merge(extra);
    }
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("health server stopped: {e}");
        }
    });
    Ok(())
}
