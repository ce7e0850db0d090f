//! The Anthropic Messages routes through the router on the real SmolLM2 (CPU): blocking and
//! streamed answers carry the same text, the stream has the event sequence Anthropic's SDKs
//! read, a forced tool call comes back as a `tool_use` block (blocking and streamed), a
//! tool-result round trip is taken, `count_tokens` counts the prompt the answer reports, and
//! refusals and the key check answer in Anthropic's error shape.
mod common;

use axle_server::AppState;
use axum::http::StatusCode;
use common::{native, post};
use serde_json::{json, Value};

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
    common::sse_events(&bytes)
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
        (json!({"thinking": {"type": "sometimes"}}), "thinking"),
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
