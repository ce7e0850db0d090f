//! The delegated routes: chat and text completions forwarded to the upstream server, answered in
//! the same OpenAI shapes as native ones, with the runtime report attached. Upstream failures
//! become errors of ours (502 unreachable or failed, 504 timeout, the upstream's 4xx passed on).
//! A client that goes away drops the upstream stream, which closes that connection.
use crate::api::{check_model, check_model_free_fields, now, Common, Stop, NEXT_ID};
use crate::{ApiError, AppState};
use axle_sdk::delegate::{DelegatedChunk, DelegatedCompletion};
use axle_sdk::{DelegateError, DelegatedInput, DelegatedRequest, Upstream};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Maps an upstream failure to our error shape and status.
pub(crate) fn upstream_error(e: DelegateError) -> ApiError {
    use axum::http::StatusCode;
    let (status, code) = match &e {
        DelegateError::Unreachable { .. } => (StatusCode::BAD_GATEWAY, "upstream_unreachable"),
        DelegateError::Timeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"),
        // A refused key is our configuration's fault, not the client's.
        DelegateError::Rejected { status, .. } if *status == 401 || *status == 403 => {
            (StatusCode::BAD_GATEWAY, "upstream_auth")
        }
        DelegateError::Rejected { status, .. } => (
            StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_REQUEST),
            "upstream_rejected",
        ),
        DelegateError::Failed { .. } | DelegateError::Protocol { .. } => {
            (StatusCode::BAD_GATEWAY, "upstream_error")
        }
    };
    let client_fault =
        matches!(e, DelegateError::Rejected { status, .. } if status != 401 && status != 403);
    ApiError {
        status,
        message: e.to_string(),
        kind: if client_fault {
            "invalid_request_error"
        } else {
            "server_error"
        },
        param: None,
        code: Some(code),
    }
}

/// The request fields as the upstream gets them; fields no delegated backend can honour are
/// refused rather than dropped.
fn delegated_request(c: &Common) -> Result<DelegatedRequest, ApiError> {
    check_model_free_fields(c)?;
    if c.n.unwrap_or(1) != 1 {
        return Err(ApiError::bad_request(
            "delegated backends take n = 1",
            Some("n"),
        ));
    }
    if !matches!(
        c.logprobs,
        None | Some(Value::Null) | Some(Value::Bool(false))
    ) {
        return Err(ApiError::bad_request(
            "logprobs are only reported by the native backend",
            Some("logprobs"),
        ));
    }
    if c.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(ApiError::bad_request(
            "logit_bias names token ids, which only the native backend knows",
            Some("logit_bias"),
        ));
    }
    Ok(DelegatedRequest {
        temperature: c.temperature,
        top_p: c.top_p,
        top_k: c.top_k,
        min_p: c.min_p,
        repetition_penalty: c.repetition_penalty,
        presence_penalty: c.presence_penalty,
        frequency_penalty: c.frequency_penalty,
        seed: c.seed,
        stop: match &c.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        },
        max_tokens: c.max_completion_tokens.or(c.max_tokens),
    })
}

/// Serves one chat or text request through the upstream.
pub(crate) async fn generate(
    state: &AppState,
    up: Arc<Upstream>,
    input: DelegatedInput,
    c: &Common,
) -> Result<Response, ApiError> {
    check_model(state, &c.model)?;
    let req = delegated_request(c)?;
    state.metrics.request();
    let chat = matches!(input, DelegatedInput::Chat(_));
    if c.stream == Some(true) {
        let usage = c
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let t0 = Instant::now();
        let stream = match up.stream(&input, &req).await {
            Ok(s) => s,
            Err(e) => {
                state.metrics.error();
                return Err(upstream_error(e));
            }
        };
        return Ok(sse(state, stream, chat, usage, t0));
    }
    let DelegatedCompletion {
        text,
        finish_reason,
        prompt_tokens,
        completion_tokens,
    } = up.complete(&input, &req).await.map_err(|e| {
        state.metrics.error();
        upstream_error(e)
    })?;
    let (p, n) = (prompt_tokens.unwrap_or(0), completion_tokens.unwrap_or(0));
    state.metrics.finished(p as usize, n as usize, 0, 0);
    let reason = finish_reason.unwrap_or_else(|| "stop".into());
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": reason})
    } else {
        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason})
    };
    let body = json!({
        "id": if chat { format!("chatcmpl-{id}") } else { format!("cmpl-{id}") },
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": now(),
        "model": state.model_name,
        "choices": [choice],
        "runtime": *state.runtime,
        "usage": {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n},
    });
    Ok(Json(body).into_response())
}

/// Re-emits an upstream stream as our SSE. An upstream failure mid-stream becomes an error event
/// (OpenAI clients raise it) and ends the stream.
fn sse(
    state: &AppState,
    mut stream: axle_sdk::delegate::DelegatedStream,
    chat: bool,
    include_usage: bool,
    t0: Instant,
) -> Response {
    let id = format!(
        "{}-{}",
        if chat { "chatcmpl" } else { "cmpl" },
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    );
    let (model, created, runtime, metrics) = (
        state.model_name.clone(),
        now(),
        state.runtime.clone(),
        state.metrics.clone(),
    );
    let object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let chunk = move |delta: Value, reason: Option<&str>| -> Value {
        let choice = if chat {
            json!({"index": 0, "delta": delta, "finish_reason": reason})
        } else {
            json!({"index": 0, "text": delta["content"].as_str().unwrap_or(""), "finish_reason": reason})
        };
        json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]})
    };
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(256);
    tokio::spawn(async move {
        let send = |v: Value| {
            let tx = tx.clone();
            async move {
                tx.send(Ok(Event::default().data(v.to_string())))
                    .await
                    .is_ok()
            }
        };
        if chat && !send(chunk(json!({"role": "assistant", "content": ""}), None)).await {
            return;
        }
        let (mut first, mut last) = (true, Instant::now());
        // The upstream's counts; some upstreams (llama-cpp-python) send none when streaming.
        let mut counts: Option<(u64, u64)> = None;
        let mut failed = false;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(DelegatedChunk::Text(t)) => {
                    let now = Instant::now();
                    if first {
                        metrics.ttft((now - t0).as_secs_f64());
                        first = false;
                    } else {
                        metrics.inter_token((now - last).as_secs_f64());
                    }
                    last = now;
                    if !send(chunk(json!({"content": t}), None)).await {
                        return; // client gone: dropping `stream` closes the upstream connection
                    }
                }
                Ok(DelegatedChunk::Finish(r)) => {
                    let mut v = chunk(json!({}), Some(&r));
                    v["runtime"] = json!(*runtime);
                    if !send(v).await {
                        return;
                    }
                }
                Ok(DelegatedChunk::Usage {
                    prompt_tokens: p,
                    completion_tokens: c,
                }) => counts = Some((p, c)),
                Err(e) => {
                    metrics.error();
                    failed = true;
                    let _ = send(upstream_error(e).body()).await;
                    break;
                }
            }
        }
        let (p, c) = counts.unwrap_or((0, 0));
        metrics.finished(p as usize, c as usize, 0, 0);
        if failed {
            return; // no [DONE]: the stream did not complete
        }
        // Without the upstream's counts there is no honest usage to report: the chunk is left out.
        if include_usage && counts.is_some() {
            let mut v = chunk(json!({}), None);
            v["choices"] = json!([]);
            v["usage"] = json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c});
            v["runtime"] = json!(*runtime);
            send(v).await;
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}
