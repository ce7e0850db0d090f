//! Axle's OpenAI-compatible HTTP server. [`app`] builds the router over a [`Backend`] (a native
//! [`Session`] or a delegated [`Upstream`]), so tests call it without a socket; [`serve`] binds it
//! with graceful shutdown. Routes: `POST /v1/chat/completions`, `POST /v1/completions` (blocking
//! and SSE), `GET /v1/models`, `GET /v1/runtime` (the runtime report), `POST /v1/generate` (token
//! ids in and out, native only), `POST /tokenize`, `POST /detokenize`, `GET /health`, `GET
//! /metrics` (Prometheus text). Errors use OpenAI's JSON error shape. A client that goes away
//! mid-stream cancels its request, which frees its KV blocks (or closes the upstream stream).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod api;
mod delegated;
mod error;
mod metrics;

pub use error::ApiError;
pub use metrics::Metrics;

use axle_sdk::{RuntimeReport, Session, Upstream};
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

/// Who generates: our engine, or an upstream server requests are delegated to.
#[derive(Clone)]
pub enum Backend {
    /// The model and its engine.
    Native(Arc<Session>),
    /// The upstream (chat and text completions only; no token-id routes).
    Delegated(Arc<Upstream>),
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// Who generates.
    pub backend: Backend,
    /// The route, policy and model identity, attached to every response and served at
    /// `/v1/runtime`.
    pub runtime: Arc<RuntimeReport>,
    /// The model name clients use (`--model-alias`, else the file stem).
    pub model_name: String,
    /// Required bearer key, if any.
    pub api_key: Option<String>,
    /// Counters and histograms.
    pub metrics: Arc<Metrics>,
    /// Most requests queued before new ones get 503.
    pub max_queue: usize,
}

/// Largest request body accepted (bytes).
pub const MAX_BODY: usize = 4 << 20;

/// The router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/v1/completions", post(api::completions))
        .route("/v1/models", get(api::models))
        .route("/v1/runtime", get(api::runtime))
        .route("/v1/generate", post(api::generate_tokens))
        .route("/tokenize", post(api::tokenize))
        .route("/detokenize", post(api::detokenize))
        .route("/health", get(api::health))
        .route("/metrics", get(api::metrics))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::map_response_with_state(
            state.clone(),
            runtime_headers,
        ))
        .with_state(state)
}

/// Every response says which route served it.
async fn runtime_headers(
    axum::extract::State(state): axum::extract::State<AppState>,
    mut r: axum::response::Response,
) -> axum::response::Response {
    let h = r.headers_mut();
    let rt = &state.runtime;
    if let Ok(v) = rt.selected_backend.name().parse() {
        h.insert("x-axle-backend", v);
    }
    let tier = match rt.support_tier {
        axle_sdk::SupportTier::Native => "native",
        axle_sdk::SupportTier::Delegated => "delegated",
    };
    h.insert(
        "x-axle-support-tier",
        axum::http::HeaderValue::from_static(tier),
    );
    r
}

/// Serves `state` on `addr` until SIGINT/SIGTERM; in-flight requests are allowed to finish.
pub async fn serve(state: AppState, addr: std::net::SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_on(state, listener).await
}

/// Serves on an already bound listener (tests and benchmarks bind port 0).
pub async fn serve_on(state: AppState, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
