//! Every refused request names the right field in OpenAI's error shape, on native and on
//! delegated routes: one case per field, through the router (no socket for our side; the
//! delegated upstream is a stub that lists one model and must never be asked to generate). Also
//! the key check, and the shape of the blocking bodies those refusals stand beside.
use axle_models::{Model, ModelOptions};
use axle_sdk::{EngineConfig, Generator, RuntimeKind, RuntimeReport, Session, Upstream};
use axle_server::openai::ErrorBody;
use axle_server::{app, AppState, Metrics};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

fn state(generator: Generator, runtime: RuntimeReport) -> AppState {
    AppState {
        generator,
        runtime: Arc::new(runtime),
        model_name: "m".into(),
        api_key: None,
        metrics: Arc::new(Metrics::default()),
        max_queue: 8,
        max_tokens_limit: None,
        responses: Default::default(),
        embeddings: None,
    }
}

fn native() -> AppState {
    let p = axle_models::fetched::model_path(axle_models::fetched::SMOLLM2)
        .unwrap_or_else(|e| panic!("{e}"));
    let model = Arc::new(Model::load(&p, &ModelOptions::cpu(2)).expect("load"));
    let cfg = EngineConfig {
        kv_slots: 256,
        context: 128,
        draft_len: 0,
        ..Default::default()
    };
    let report = RuntimeReport::native(&model, None);
    let session = Session::new(model, cfg).expect("session");
    state(Generator::Native(Arc::new(session)), report)
}

/// A stub upstream: lists one model; any generation request is a test failure (500).
async fn delegated(kind: RuntimeKind) -> AppState {
    let stub = axum::Router::new()
        .route(
            "/v1/models",
            axum::routing::get(|| async { axum::Json(json!({"data": [{"id": "up"}]})) }),
        )
        .fallback(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "stub: not expected") });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, stub).await });
    let up = Upstream::connect(kind, &url, None, None, Duration::from_secs(5))
        .await
        .expect("connect");
    let p = axle_models::fetched::model_path(axle_models::fetched::SMOLLM2)
        .unwrap_or_else(|e| panic!("{e}"));
    let report =
        RuntimeReport::native(&Model::load(&p, &ModelOptions::cpu(1)).expect("load"), None);
    state(Generator::Delegated(Arc::new(up)), report)
}

/// Sends `req` through the router; returns the status and the error body (the response must be
/// one).
async fn error_of(state: &AppState, req: Request<Body>) -> (StatusCode, ErrorBody) {
    let what = format!("{} {}", req.method(), req.uri());
    let r = app(state.clone()).oneshot(req).await.expect("response");
    let status = r.status();
    let bytes = r.into_body().collect().await.expect("body").to_bytes();
    let err: ErrorBody = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{what}: not an error body ({e}): {bytes:?}"));
    (status, err)
}

/// POSTs `body` to `route`; returns the status and the error body (the response must be one).
async fn refuse(state: &AppState, route: &str, body: Value) -> (StatusCode, ErrorBody) {
    let req = Request::post(route)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    error_of(state, req).await
}

fn with(base: &Value, extra: Value) -> Value {
    let mut b = base.clone();
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

/// Asserts each case is a 400 naming its field (and the code, when given).
async fn expect_fields(state: &AppState, route: &str, base: Value, cases: &[(Value, &str)]) {
    for (extra, field) in cases {
        let body = with(&base, extra.clone());
        let (status, e) = refuse(state, route, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{route} {body}: {e:?}");
        assert_eq!(
            e.error.param.as_deref(),
            Some(*field),
            "{route} {body}: {e:?}"
        );
        assert_eq!(e.error.kind, "invalid_request_error");
        assert!(
            e.error.message.starts_with(field),
            "{route}: the message names the field: {}",
            e.error.message
        );
    }
}

/// Fields every route checks the same way, native or delegated.
fn common_cases() -> Vec<(Value, &'static str)> {
    vec![
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_completion_tokens": 0}), "max_tokens"),
        (json!({"temperature": -1.0}), "temperature"),
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"top_p": 0.0}), "top_p"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"repetition_penalty": 0.0}), "repetition_penalty"),
        (json!({"presence_penalty": 1e39}), "presence_penalty"),
        (json!({"frequency_penalty": -1e39}), "frequency_penalty"),
        // OpenAI's range is [-2, 2].
        (json!({"presence_penalty": 2.5}), "presence_penalty"),
        (json!({"frequency_penalty": -3}), "frequency_penalty"),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"stop": ""}), "stop"),
        (json!({"n": 0}), "n"),
        (json!({"n": 9}), "n"),
        (json!({"logprobs": "yes"}), "logprobs"),
        (json!({"logit_bias": {"x": 1}}), "logit_bias"),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format",
        ),
        (json!({"response_format": "json"}), "response_format"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tool_choice": {"type": "code"}}), "tool_choice"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_rejections_name_their_field() {
    let s = native();
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    let mut cases = common_cases();
    cases.extend([
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": [{"role": "robot", "content": "x"}]}),
            "messages",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages",
        ),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (json!({"logit_bias": {"1": 101}}), "logit_bias"),
        (json!({"logit_bias": {"999999": 1}}), "logit_bias"),
        // Constraints the grammar compiler refuses, tools that do not fit.
        (
            json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "strnig"}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "regex", "regex": "(a"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "grammar", "grammar": "start: nope"}}),
            "response_format",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (json!({"tools": [{"type": "function"}]}), "tools"),
        // Schemas that are no JSON schema, where the model may call the tool but need not.
        (
            json!({"tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "objcet"}}}], "tool_choice": "auto"}),
            "tools",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": 5, "required": "x"}}}]}),
            "tools",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ]);
    expect_fields(&s, "/v1/chat/completions", chat, &cases).await;

    let text = json!({"prompt": "hi"});
    let mut cases = common_cases();
    cases.extend([
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": vec!["a"; 17]}), "prompt"),
        (json!({"prompt": ["a", "b"], "stream": true}), "prompt"),
        (json!({"prompt": [1, 49152]}), "prompt"),
        (json!({"prompt": [[1, 2], []]}), "prompt"),
        (json!({"prompt": [[1], [2]], "stream": true}), "prompt"),
        (json!({"prompt": [1, "a"]}), "prompt"),
        (json!({"logprobs": 21}), "logprobs"),
        (json!({"tools": []}), "tools"),
    ]);
    expect_fields(&s, "/v1/completions", text, &cases).await;

    expect_fields(
        &s,
        "/v1/generate",
        json!({"tokens": [1, 2, 3]}),
        &[
            (json!({"tokens": [1, 49152]}), "tokens"),
            (json!({"tokens": []}), "tokens"),
            (json!({"n": 9}), "n"),
        ],
    )
    .await;

    // A prompt over the context: OpenAI's code for it, and the prompt field of each route.
    let long = "word ".repeat(400);
    for (route, body, field) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": long}]}),
            "messages",
        ),
        ("/v1/completions", json!({"prompt": long}), "prompt"),
        ("/v1/generate", json!({"tokens": vec![1; 200]}), "tokens"),
    ] {
        let (status, e) = refuse(&s, route, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(e.error.param.as_deref(), Some(field));
        assert_eq!(e.error.code.as_deref(), Some("context_length_exceeded"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegated_rejections_name_their_field() {
    let s = delegated(RuntimeKind::OpenaiCompatible).await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    let mut cases = common_cases();
    // What no upstream can be asked for is refused by name, before the upstream is called.
    let unsupported = [
        (json!({"logprobs": true}), "logprobs"),
        (json!({"n": 2}), "n"),
        (json!({"logit_bias": {"1": 1}}), "logit_bias"),
        (json!({"ignore_eos": true}), "ignore_eos"),
        (
            json!({"response_format": {"type": "regex", "regex": "a+"}}),
            "response_format",
        ),
    ];
    cases.extend(unsupported.iter().cloned());
    expect_fields(&s, "/v1/chat/completions", chat.clone(), &cases).await;
    for (extra, field) in &unsupported {
        let (_, e) = refuse(&s, "/v1/chat/completions", with(&chat, extra.clone())).await;
        assert_eq!(
            e.error.code.as_deref(),
            Some("unsupported_parameter"),
            "{field}"
        );
    }
    expect_fields(
        &s,
        "/v1/completions",
        json!({"prompt": "hi"}),
        &common_cases(),
    )
    .await;
    // Token ids need our vocabulary.
    expect_fields(
        &s,
        "/v1/generate",
        json!({"tokens": [1, 2, 3]}),
        &[(json!({}), "tokens")],
    )
    .await;
    let (status, e) = refuse(&s, "/detokenize", json!({"tokens": [1]})).await;
    assert_eq!(
        (status, e.error.param.as_deref()),
        (StatusCode::BAD_REQUEST, Some("tokens"))
    );
}

/// Unknown paths, wrong methods and bodies not declared as JSON get OpenAI-shaped errors (404,
/// 405, 415), not empty bodies.
#[tokio::test]
async fn unknown_paths_methods_and_content_types_answer_in_openai_shape() {
    let state = native();
    let cases = [
        (
            Request::get("/v1/nothing").body(Body::empty()),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Request::get("/v1/chat/completions").body(Body::empty()),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Request::post("/v1/completions")
                .header("content-type", "text/plain")
                .body(Body::from(r#"{"prompt": "hi"}"#)),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
    ];
    for (req, status, code) in cases {
        let (s, e) = error_of(&state, req.expect("request")).await;
        assert_eq!(s, status, "{e:?}");
        assert_eq!(e.error.code.as_deref(), Some(code), "{e:?}");
    }
}

/// `--max-tokens-limit`: a request asking for more is refused naming `max_tokens`.
#[tokio::test]
async fn max_tokens_over_the_server_limit_is_refused() {
    let state = AppState {
        max_tokens_limit: Some(64),
        responses: Default::default(),
        embeddings: None,
        ..native()
    };
    for (route, base) in [
        ("/v1/completions", json!({"prompt": "Hi"})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}]}),
        ),
    ] {
        let (status, e) = refuse(&state, route, with(&base, json!({"max_tokens": 65}))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{route}: {e:?}");
        assert_eq!(e.error.param.as_deref(), Some("max_tokens"), "{route}");
        assert!(e.error.message.contains("64"), "{}", e.error.message);
    }
}

/// With an API key set, every route but `/health` and `/metrics` refuses a request without it, or
/// with another, in OpenAI's shape (before looking at the body), and serves one that bears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_that_need_the_key_refuse_requests_without_it() {
    let s = AppState {
        api_key: Some("k".into()),
        ..native()
    };
    let send = |method: &str, route: &str, key: Option<&str>| {
        let mut req = Request::builder()
            .method(method)
            .uri(route)
            .header("content-type", "application/json");
        if let Some(key) = key {
            req = req.header("authorization", format!("Bearer {key}"));
        }
        let body = if method == "POST" {
            "{\"text\": \"hi\", \"tokens\": [1]}"
        } else {
            ""
        };
        app(s.clone()).oneshot(req.body(Body::from(body)).expect("request"))
    };
    let keyed = [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/generate"),
        ("GET", "/v1/models"),
        ("GET", "/v1/runtime"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
    ];
    for (method, route) in keyed {
        for key in [None, Some("other")] {
            let r = send(method, route, key).await.expect("response");
            assert_eq!(
                r.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {route} {key:?}"
            );
            let bytes = r.into_body().collect().await.expect("body").to_bytes();
            let e: ErrorBody = serde_json::from_slice(&bytes).expect("an error body");
            assert_eq!(e.error.kind, "authentication_error");
        }
    }
    for (method, route) in [
        ("GET", "/v1/models"),
        ("GET", "/v1/runtime"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("GET", "/health"),
    ] {
        let r = send(method, route, Some("k")).await.expect("response");
        assert_eq!(r.status(), StatusCode::OK, "{method} {route}");
    }
    let r = send("GET", "/metrics", None).await.expect("response");
    assert_eq!(r.status(), StatusCode::OK, "metrics need no key");
}

/// The blocking bodies of chat and text completions (the counterpart of the refusals above): one
/// choice per `n`, indexed in order, with usage and the runtime report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_completions_have_openai_shape() {
    let s = native();
    for (route, object, body) in [
        (
            "/v1/chat/completions",
            "chat.completion",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "/v1/completions",
            "text_completion",
            json!({"prompt": "hi"}),
        ),
    ] {
        let body = with(&body, json!({"max_tokens": 2, "n": 2, "logprobs": true}));
        let req = Request::post(route)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .expect("request");
        let r = app(s.clone()).oneshot(req).await.expect("response");
        assert_eq!(r.status(), StatusCode::OK, "{route}");
        let bytes = r.into_body().collect().await.expect("body").to_bytes();
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["object"], object, "{v}");
        assert!(v["usage"]["completion_tokens"].as_u64() > Some(0), "{v}");
        assert!(v["runtime"].is_object(), "{v}");
        let choices = v["choices"].as_array().expect("choices");
        assert_eq!(choices.len(), 2, "{v}");
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], i, "{v}");
            assert!(c["finish_reason"].is_string(), "{v}");
            assert!(c["logprobs"].is_object(), "{v}");
            if object == "chat.completion" {
                assert_eq!(c["message"]["role"], "assistant", "{v}");
            } else {
                assert!(c["text"].is_string(), "{v}");
            }
        }
    }
}
