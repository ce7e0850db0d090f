//! What the route tests share: the real SmolLM2 behind the router, and a POST helper.
use axle_models::{Model, ModelOptions};
use axle_sdk::{EngineConfig, Generator, RuntimeReport, Session};
use axle_server::{app, AppState, Metrics};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::Arc;
use tower::ServiceExt;

pub fn native(api_key: Option<&str>) -> AppState {
    let p = axle_models::fetched::model_path(axle_models::fetched::SMOLLM2)
        .unwrap_or_else(|e| panic!("{e}"));
    let model = Arc::new(Model::load(&p, &ModelOptions::cpu(2)).expect("load"));
    let cfg = EngineConfig {
        kv_slots: 1024,
        context: 512,
        draft_len: 0,
        ..Default::default()
    };
    let report = RuntimeReport::native(&model, None);
    let session = Session::new(model, cfg).expect("session");
    AppState {
        generator: Generator::Native(Arc::new(session)),
        runtime: Arc::new(report),
        model_name: "m".into(),
        api_key: api_key.map(str::to_string),
        metrics: Arc::new(Metrics::default()),
        max_queue: 8,
        max_tokens_limit: None,
        responses: Default::default(),
        embeddings: None,
    }
}

/// POSTs `body`; returns the status and the body's bytes.
pub async fn post(
    s: &AppState,
    route: &str,
    body: &Value,
    key: Option<&str>,
) -> (StatusCode, Vec<u8>) {
    let mut req = Request::post(route).header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    let req = req.body(Body::from(body.to_string())).expect("request");
    let r = app(s.clone()).oneshot(req).await.expect("response");
    let status = r.status();
    let bytes = r.into_body().collect().await.expect("body").to_bytes();
    (status, bytes.to_vec())
}

/// The (event name, data) pairs of an SSE body with named events; each data's `type` is the
/// event's name.
pub fn sse_events(bytes: &[u8]) -> Vec<(String, Value)> {
    let text = String::from_utf8(bytes.to_vec()).expect("utf-8");
    let mut out = Vec::new();
    for frame in text.split("\n\n").filter(|f| !f.trim().is_empty()) {
        let mut name = String::new();
        let mut data = String::new();
        for line in frame.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = n.to_string();
            } else if let Some(d) = line.strip_prefix("data: ") {
                data.push_str(d);
            }
        }
        if name.is_empty() {
            continue; // keep-alive comments
        }
        let v: Value = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{data}: {e}"));
        assert_eq!(v["type"], name.as_str(), "{frame}");
        out.push((name, v));
    }
    out
}
