//! `POST /v1/responses` through the router on the real SmolLM2 (CPU): blocking and streamed
//! answers carry the same text, the stream's typed events come in order with rising sequence
//! numbers, a forced function call comes back as a `function_call` item, `previous_response_id`
//! continues a stored conversation (and an unknown id is refused by name), and fields the route
//! cannot honour are refused by name in OpenAI's error shape.
mod common;

use axle_server::AppState;
use axum::http::StatusCode;
use common::{native, post, sse_events};
use serde_json::{json, Value};

async fn respond(s: &AppState, body: &Value) -> Value {
    let (status, bytes) = post(s, "/v1/responses", body, None).await;
    let v: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

fn base() -> Value {
    json!({"model": "m", "max_output_tokens": 12, "temperature": 0,
        "instructions": "You are terse.", "input": "Name a colour."})
}

fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_streamed_and_continued_responses() {
    let s = native(None);
    let r = respond(&s, &base()).await;
    assert_eq!(r["object"], "response", "{r}");
    assert!(
        r["id"].as_str().is_some_and(|id| id.starts_with("resp_")),
        "{r}"
    );
    assert!(
        ["completed", "incomplete"].contains(&r["status"].as_str().unwrap_or("")),
        "{r}"
    );
    let text = output_text(&r);
    assert!(!text.is_empty(), "{r}");
    assert!(r["usage"]["output_tokens"].as_u64() > Some(0), "{r}");
    assert_eq!(r["instructions"], "You are terse.");

    let mut body = base();
    body["stream"] = json!(true);
    let (status, bytes) = post(&s, "/v1/responses", &body, None).await;
    assert_eq!(status, StatusCode::OK);
    let ev = sse_events(&bytes);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ],
        "{names:?}"
    );
    let last = names.last().copied().unwrap_or("");
    assert!(
        last == "response.completed" || last == "response.incomplete",
        "{names:?}"
    );
    for (i, (_, v)) in ev.iter().enumerate() {
        assert_eq!(v["sequence_number"], i, "{v}");
    }
    let streamed: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().expect("delta").to_string())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(output_text(&ev[ev.len() - 1].1["response"]), text);

    // A follow-up continues the stored conversation (instructions are not carried over: they
    // are given again).
    let follow = json!({"model": "m", "max_output_tokens": 8, "temperature": 0,
        "instructions": "You are terse.", "previous_response_id": r["id"],
        "input": "Another one."});
    let f = respond(&s, &follow).await;
    assert_eq!(f["previous_response_id"], r["id"]);
    let first_prompt = r["usage"]["input_tokens"].as_u64().expect("tokens");
    assert!(
        f["usage"]["input_tokens"].as_u64() > Some(first_prompt),
        "{f}"
    );
    // Part of the prompt came from the prefix cache (the stored turn renders the same).
    assert!(
        f["usage"]["input_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "{f}"
    );

    let mut gone = follow.clone();
    gone["previous_response_id"] = json!("resp_nope");
    let (status, bytes) = post(&s, "/v1/responses", &gone, None).await;
    let e: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    assert_eq!(e["error"]["param"], "previous_response_id", "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_calls_and_refusals() {
    let s = native(None);
    let mut body = base();
    body["max_output_tokens"] = json!(48);
    body["input"] = json!("Weather in Paris?");
    body["tools"] = json!([{"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}]);
    body["tool_choice"] = json!({"type": "function", "name": "get_weather"});
    let r = respond(&s, &body).await;
    let call = r["output"]
        .as_array()
        .expect("output")
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("no call: {r}"))
        .clone();
    assert_eq!(call["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["arguments"].as_str().expect("text")).expect("json");
    assert!(args["city"].is_string(), "{call}");

    // The call's output goes back as an item; the model answers in text.
    let mut next = base();
    next["previous_response_id"] = r["id"].clone();
    next["tools"] = body["tools"].clone();
    next["input"] = json!([{"type": "function_call_output", "call_id": call["call_id"],
        "output": "18 C and sunny"}]);
    let a = respond(&s, &next).await;
    assert!(!output_text(&a).is_empty(), "{a}");

    for (extra, param) in [
        (json!({"reasoning": {"effort": "extreme"}}), "reasoning"),
        (json!({"tools": [{"type": "web_search"}]}), "tools"),
        (json!({"max_output_tokens": -1}), "max_output_tokens"),
        (json!({"frobnicate": 1}), "frobnicate"),
        (json!({"input": [{"type": "input_image"}]}), "input"),
    ] {
        let mut b = base();
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        let (status, bytes) = post(&s, "/v1/responses", &b, None).await;
        let e: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {e}");
        assert_eq!(e["error"]["param"], param, "{extra}: {e}");
    }
}
