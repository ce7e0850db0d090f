//! The Anthropic Messages routes through the router on the real SmolLM2 (CPU): blocking and
//! streamed answers carry the same text, the stream has the event sequence Anthropic's SDKs
//! read, a forced tool call comes back as a `tool_use` block (blocking and streamed), a
//! tool-result round trip is taken, `count_tokens` counts the prompt the answer reports, and
//! refusals and the key check answer in Anthropic's error shape.
use axle_models::{Model, ModelOptions};
use axle_sdk::{EngineConfig, Generator, RuntimeReport, Session};
use axle_server::{app, AppState, Metrics};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

fn native(api_key: Option<&str>) -> AppState {
    let p = axle_models::fetched::model_path(axle_models::fetched::SMOLLM2)
        .unwrap_or_else(|e| panic!("{e}"));
    let model = Arc::new(Model::load(&p, &ModelOptions::cpu(2)).expect("load"));
    let cfg = EngineConfig {
        kv_slots: 1024,
        context_len: 512,
        max_draft: 0,
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
    }
}

/// POSTs `body`; returns the status and the body's bytes.
async fn post(s: &AppState, route: &str, body: &Value, key: Option<&str>) -> (StatusCode, Vec<u8>) {
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

async fn message(s: &AppState, body: &Value) -> Value {
    let (status, bytes) = post(s, "/v1/messages", body, None).await;
    let v: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// The (event name, data) pairs of an SSE body.
async fn events(s: &AppState, body: &Value) -> Vec<(String, Value)> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (status, bytes) = post(s, "/v1/messages", &body, None).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(bytes).expect("utf-8");
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

fn base() -> Value {
    json!({"model": "m", "max_tokens": 12, "temperature": 0,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Name a colour."}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_and_streamed_messages_agree() {
    let s = native(None);
    let m = message(&s, &base()).await;
    assert_eq!(m["type"], "message", "{m}");
    assert_eq!(m["role"], "assistant", "{m}");
    assert!(
        m["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
        "{m}"
    );
    assert_eq!(m["content"][0]["type"], "text", "{m}");
    let text = m["content"][0]["text"].as_str().expect("text").to_string();
    assert!(!text.is_empty(), "{m}");
    let stop = m["stop_reason"].as_str().expect("stop reason");
    assert!(["end_turn", "max_tokens"].contains(&stop), "{m}");
    assert!(m["usage"]["output_tokens"].as_u64() > Some(0), "{m}");
    let prompt = m["usage"]["input_tokens"].as_u64().unwrap_or(0)
        + m["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0);

    let ev = events(&s, &base()).await;
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..3],
        ["message_start", "ping", "content_block_start"],
        "{names:?}"
    );
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(
        names[3..names.len() - 3]
            .iter()
            .all(|n| *n == "content_block_delta"),
        "{names:?}"
    );
    assert_eq!(ev[0].1["message"]["role"], "assistant");
    let streamed: String = ev
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, v)| v["delta"]["text"].as_str().expect("text delta").to_string())
        .collect();
    assert_eq!(streamed, text, "streamed and blocking text");
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], stop);
    assert_eq!(delta["usage"]["output_tokens"], m["usage"]["output_tokens"]);

    // count_tokens counts the prompt the answer reported.
    let (status, bytes) = post(&s, "/v1/messages/count_tokens", &base(), None).await;
    assert_eq!(status, StatusCode::OK);
    let c: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(c["input_tokens"].as_u64(), Some(prompt), "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_and_results_round_trip() {
    let s = native(None);
    let tools = json!([{"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}]);
    let mut body = base();
    body["max_tokens"] = json!(48);
    body["tools"] = tools.clone();
    body["tool_choice"] = json!({"type": "tool", "name": "get_weather"});
    body["messages"] = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let m = message(&s, &body).await;
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let call = m["content"]
        .as_array()
        .expect("content")
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use block: {m}"))
        .clone();
    assert_eq!(call["name"], "get_weather", "{m}");
    assert!(call["input"]["city"].is_string(), "{m}");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("toolu_")),
        "{m}"
    );

    // Streamed: a tool_use block whose input arrives as JSON deltas.
    let ev = events(&s, &body).await;
    let start = ev
        .iter()
        .find(|(n, v)| n == "content_block_start" && v["content_block"]["type"] == "tool_use")
        .expect("tool_use block");
    assert_eq!(start.1["content_block"]["name"], "get_weather");
    let partial: String = ev
        .iter()
        .filter(|(_, v)| v["delta"]["type"] == "input_json_delta")
        .map(|(_, v)| {
            v["delta"]["partial_json"]
                .as_str()
                .expect("json")
                .to_string()
        })
        .collect();
    let input: Value = serde_json::from_str(&partial).expect("input is JSON");
    assert_eq!(input, call["input"]);
    assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "tool_use");

    // The result goes back and the model answers.
    let mut next = base();
    next["tools"] = tools;
    next["messages"] = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
            "content": "18 C, sunny"}]},
    ]);
    let m = message(&s, &next).await;
    assert_eq!(m["content"][0]["type"], "text", "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_keys_answer_in_anthropic_shape() {
    let s = native(Some("k"));
    for (key, status, kind) in [
        (None, StatusCode::UNAUTHORIZED, "authentication_error"),
        (
            Some("wrong"),
            StatusCode::UNAUTHORIZED,
            "authentication_error",
        ),
    ] {
        let (got, bytes) = post(&s, "/v1/messages", &base(), key).await;
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(got, status, "{v}");
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
    }
    let cases = [
        (
            json!({"thinking": {"type": "enabled", "budget_tokens": 64}}),
            "thinking",
        ),
        (json!({"frobnicate": 1}), "frobnicate"),
        (json!({"max_tokens": -1}), "max_tokens"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image"}]}]}),
            "messages",
        ),
        (json!({"tool_choice": {"type": "sometimes"}}), "tool_choice"),
        (json!({"model": "other"}), "model"),
    ];
    for (extra, param) in cases {
        let mut body = base();
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (status, bytes) = post(&s, "/v1/messages", &body, Some("k")).await;
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert!(status.is_client_error(), "{extra}: {status} {v}");
        assert_eq!(v["type"], "error", "{v}");
        let want = if status == StatusCode::NOT_FOUND {
            "not_found_error"
        } else {
            "invalid_request_error"
        };
        assert_eq!(v["error"]["type"], want, "{v}");
        assert_eq!(v["error"]["param"], param, "{extra}: {v}");
    }
    // The right key, as x-api-key, is taken.
    let (status, _) = post(&s, "/v1/messages", &base(), Some("k")).await;
    assert_eq!(status, StatusCode::OK);
}
