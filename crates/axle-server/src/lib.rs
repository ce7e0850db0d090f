//! Axle's OpenAI-compatible HTTP server. [`app`] builds the router over a [`Generator`] (a native
//! session or a delegated upstream, the same to every handler), so tests call it without a
//! socket; [`serve`] binds it with graceful shutdown. Routes: `POST /v1/chat/completions`,
//! `POST /v1/completions` (blocking and SSE), `POST /v1/responses`, `POST /v1/messages`,
//! `POST /v1/embeddings` (with an embedding model), `GET /v1/models`, `GET /v1/runtime` (the
//! runtime report), `POST /v1/generate` (token ids in and out, native only), `POST /tokenize`,
//! `POST /detokenize`, `GET /health`, `GET /metrics` (Prometheus text), `GET /` (a chat page).
//! Errors use OpenAI's JSON error shape. A client that goes away mid-stream cancels its request,
//! which frees its KV blocks (or closes the upstream stream).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod anthropic;
mod api;
mod body_deadline;
mod chat_page;
pub mod embeddings;
mod error;
mod json_body;
mod listen;
mod messages;
mod metrics;
pub mod openai;
pub mod responses;
mod responses_routes;

pub use error::ApiError;
pub use listen::ServeOptions;
pub use metrics::Metrics;

pub use axle_sdk::Generator;
use axle_sdk::RuntimeReport;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

/// What every handler shares.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Who generates: our engine, or an upstream server requests are delegated to (chat and
    /// text completions only; no token-id routes).
    pub generator: Generator,
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
    /// Most tokens one request may ask for (`max_tokens` above it is refused; unset, it is the
    /// default capped by this).
    pub max_tokens_limit: Option<usize>,
    /// Responses kept for `previous_response_id` (`/v1/responses`).
    pub responses: Arc<responses::ResponseStore>,
    /// The embedding model behind `/v1/embeddings` (`None`: the route answers that there is
    /// none).
    pub embeddings: Option<Arc<axle_sdk::Embeddings>>,
}

/// Largest request body accepted (bytes).
pub const MAX_BODY: usize = 4 << 20;

/// The router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(api::generation::<openai::ChatCompletionRequest>),
        )
        .route(
            "/v1/completions",
            post(api::generation::<openai::CompletionRequest>),
        )
        .route("/v1/responses", post(responses_routes::responses))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/models", get(api::models))
        .route("/v1/runtime", get(api::runtime))
        .route(
            "/v1/generate",
            post(api::generation::<openai::TokenGenerationRequest>),
        )
        .route("/tokenize", post(api::tokenize))
        .route("/detokenize", post(api::detokenize))
        .route("/", get(chat_page::chat_page))
        .route("/health", get(api::health))
        .route("/metrics", get(api::metrics))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(reject_oversized))
        .layer(axum::middleware::map_response_with_state(
            state.clone(),
            runtime_headers,
        ))
        .with_state(state)
}

/// Bodies declared larger than this are refused without reading them at all.
const DRAIN_MAX: u64 = 64 << 20;

/// Refuses a body whose declared length exceeds `MAX_BODY` with a 413 before any handler runs.
/// The body is read and dropped first (up to `DRAIN_MAX`): answering while the client is still
/// sending would close the connection on unread data, and the client would see a reset or a
/// broken pipe instead of the 413. Bodies without a length are limited by `DefaultBodyLimit`.
async fn reject_oversized(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use http_body_util::BodyExt;
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let Some(len) = declared.filter(|&n| n > MAX_BODY as u64) else {
        return next.run(req).await;
    };
    if len <= DRAIN_MAX {
        let mut body = req.into_body();
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                break;
            }
        }
    }
    ApiError::too_large().into_response()
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

/// Serves `state` on `addr` until SIGINT/SIGTERM (see [`ServeOptions`] for the connection
/// limits and the shutdown grace period).
pub async fn serve(
    state: AppState,
    addr: std::net::SocketAddr,
    opts: ServeOptions,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_on(state, listener, opts).await
}

/// Serves on an already bound listener (tests and benchmarks bind port 0).
pub async fn serve_on(
    state: AppState,
    listener: tokio::net::TcpListener,
    opts: ServeOptions,
) -> std::io::Result<()> {
    serve_until(state, listener, opts, shutdown_signal()).await
}

/// Serves on `listener` until `shutdown` resolves (instead of a signal), then shuts down as on
/// SIGTERM: benchmarks that stop and restart a server in one process.
pub async fn serve_until(
    state: AppState,
    listener: tokio::net::TcpListener,
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    listen::serve(app(state), listener, opts, shutdown).await
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn echo() -> Router {
        Router::new()
            .route(
                "/",
                post(|body: String| async move { body.len().to_string() }),
            )
            .layer(axum::middleware::from_fn(reject_oversized))
    }

    fn post_bytes(n: usize) -> Request<Body> {
        Request::post("/")
            .header("content-length", n)
            .body(Body::from(vec![b'a'; n]))
            .expect("request")
    }

    #[tokio::test]
    async fn oversized_bodies_get_a_413_in_openai_shape() {
        let r = echo()
            .oneshot(post_bytes(MAX_BODY + 1))
            .await
            .expect("response");
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let body = r.into_body().collect().await.expect("body").to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("too large"), "{v}");
    }

    #[tokio::test]
    async fn bodies_within_the_limit_reach_the_handler() {
        let r = echo().oneshot(post_bytes(1000)).await.expect("response");
        assert_eq!(r.status(), StatusCode::OK);
        let body = r.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"1000");
    }
}
