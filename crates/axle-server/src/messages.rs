//! The Anthropic Messages routes: `POST /v1/messages` (blocking, or streamed as the named SSE
//! events Anthropic's SDKs read) and `POST /v1/messages/count_tokens`. The same generator as the
//! OpenAI routes does the work; this file maps its events onto Anthropic's shapes, and every
//! error onto Anthropic's error body. The key is taken as a bearer token or as `x-api-key`.
use crate::anthropic::{self, ErrorBody, ErrorDetail, Message, MessagesRequest, TokenCount, Usage};
use crate::api::{self, Timing};
use crate::json_body::JsonBody;
use crate::{ApiError, AppState};
use axle_sdk::{Completion, EventStream, Finish, FinishReason, ToolCall};
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// An [`ApiError`] in Anthropic's error shape.
pub(crate) struct AnthropicError(ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> AnthropicError {
        AnthropicError(e)
    }
}

/// Anthropic's error type for a status.
fn error_kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

fn error_body(e: &ApiError) -> ErrorBody {
    ErrorBody {
        kind: "error".into(),
        error: ErrorDetail {
            kind: error_kind(e.status).into(),
            message: e.message.clone(),
            param: e.param.clone(),
        },
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        (self.0.status, Json(error_body(&self.0))).into_response()
    }
}

/// The request body, refused in Anthropic's shape.
pub(crate) struct Body(MessagesRequest);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = AnthropicError;

    async fn from_request(req: Request, state: &S) -> Result<Self, AnthropicError> {
        let JsonBody(b) = JsonBody::<MessagesRequest>::from_request(req, state).await?;
        Ok(Body(b))
    }
}

/// The checks both routes make, then the SDK request.
fn request(
    state: &AppState,
    headers: &HeaderMap,
    body: &MessagesRequest,
) -> Result<axle_sdk::GenerateRequest, ApiError> {
    api::check_auth(state, headers)?;
    api::check_model(state, &body.model)?;
    body.to_request()
        .map_err(|e| ApiError::wire(e, anthropic::param))
}

/// `POST /v1/messages/count_tokens`.
pub(crate) async fn count_tokens(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, AnthropicError> {
    let req = request(&state, &headers, &body)?;
    let n = state
        .generator
        .count_prompt_tokens(&req)
        .await
        .map_err(|e| ApiError::sdk(e, anthropic::param))?;
    Ok(Json(TokenCount { input_tokens: n }).into_response())
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, AnthropicError> {
    let t0 = Instant::now();
    let mut req = request(&state, &headers, &body)?;
    api::admit(&state, std::slice::from_mut(&mut req), anthropic::param)?;
    let stream = api::start_one(&state, &req, body.streams(), anthropic::param).await?;
    let view = View {
        id: format!("msg_{:024}", api::NEXT_ID.fetch_add(1, Ordering::Relaxed)),
        model: state.model_name.clone(),
        stops: req.stop.clone(),
        thinking: body.thinks(),
    };
    if body.streams() {
        return Ok(sse(state, view, stream, t0));
    }
    // Dropping this future (the client went away) drops the stream, which cancels the request.
    let c = api::timed(&state, stream, t0)
        .await
        .map_err(|e| ApiError::sdk(e, anthropic::param))?;
    Ok(Json(view.message(&c)).into_response())
}

/// What a response's pieces share.
#[derive(Clone)]
struct View {
    id: String,
    model: String,
    /// The request's stop sequences (the one that ended the answer is named when there is one).
    stops: Vec<String>,
    /// Thinking was asked for: the model's thinking comes back as `thinking` blocks.
    thinking: bool,
}

impl View {
    /// A `tool_use` block's id.
    fn call_id(&self, k: usize) -> String {
        format!("toolu_{}_{k}", self.id.trim_start_matches("msg_"))
    }

    fn tool_use(&self, k: usize, call: &ToolCall) -> Value {
        json!({"type": "tool_use", "id": self.call_id(k), "name": call.name,
            "input": serde_json::from_str::<Value>(&call.arguments).unwrap_or(json!({}))})
    }

    /// Why the answer ended, and the stop sequence that ended it where it is known.
    fn stop(&self, f: &Finish) -> (String, Option<String>) {
        if !f.tool_calls.is_empty() {
            return ("tool_use".into(), None);
        }
        let reason = match (f.upstream_reason.as_deref(), &f.reason) {
            (Some("length"), _) => "max_tokens",
            (Some("tool_calls"), _) => "tool_use",
            (Some(_), _) => "end_turn",
            (None, FinishReason::Length | FinishReason::ContextLimit) => "max_tokens",
            (None, FinishReason::StopString) => "stop_sequence",
            (None, _) => "end_turn",
        };
        // The engine names the stop string that matched; delegated routes do not, so there it is
        // named only when the request gave one.
        let seq = (reason == "stop_sequence")
            .then(|| {
                f.stop_string
                    .clone()
                    .or_else(|| (self.stops.len() == 1).then(|| self.stops[0].clone()))
            })
            .flatten();
        (reason.into(), seq)
    }

    fn usage(f: &Finish) -> Usage {
        let u = f.usage.unwrap_or_default();
        Usage {
            input_tokens: u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
            output_tokens: u.completion_tokens,
            cache_read_input_tokens: u.cached_tokens,
            cache_creation_input_tokens: 0,
        }
    }

    /// The blocking response.
    fn message(&self, c: &Completion) -> Message {
        let mut content = Vec::new();
        if self.thinking && !c.reasoning.is_empty() {
            content.push(json!({"type": "thinking", "thinking": c.reasoning, "signature": ""}));
        }
        if !c.text.is_empty() || c.finish.tool_calls.is_empty() {
            content.push(json!({"type": "text", "text": c.text}));
        }
        for (k, call) in c.finish.tool_calls.iter().enumerate() {
            content.push(self.tool_use(k, call));
        }
        let (stop_reason, stop_sequence) = self.stop(&c.finish);
        Message {
            content,
            stop_reason: Some(stop_reason),
            stop_sequence,
            usage: Self::usage(&c.finish),
            ..self.opening()
        }
    }

    /// The message as `message_start` opens it.
    fn opening(&self) -> Message {
        Message {
            id: self.id.clone(),
            kind: "message".into(),
            role: "assistant".into(),
            model: self.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: Usage::default(),
        }
    }
}

fn event(name: &str, data: Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// The stream of events: `message_start`, `ping`, a text block as text comes, then a
/// `tool_use` block per call, `message_delta` with the stop reason and usage, `message_stop`.
/// A failure part-way ends it with an `error` event.
fn sse(state: AppState, view: View, mut stream: EventStream, t0: Instant) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(256);
    tokio::spawn(async move {
        // A failed send means the client is gone: returning drops `stream`, which cancels it.
        let send = |e: Event| tx.send(Ok(e));
        let start = json!({"type": "message_start", "message": view.opening()});
        if send(event("message_start", start)).await.is_err()
            || send(event("ping", json!({"type": "ping"}))).await.is_err()
        {
            return;
        }
        let mut timing = Timing::new(&state, t0);
        let block_start = |index: usize, block: Value| {
            event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": block}),
            )
        };
        let block_delta = |index: usize, delta: Value| {
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            )
        };
        let block_stop = |index: usize| {
            event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            )
        };
        // The open block's index, and whether a thinking or a text block is open.
        let mut index = 0usize;
        let (mut thinking_open, mut text_open) = (false, false);
        while let Some(ev) = stream.next().await {
            timing.observe(&ev);
            let (reasoning, text, finish) = match ev.into_pieces() {
                Ok(pieces) => pieces,
                Err(e) => {
                    let e = ApiError::sdk(api::clone_error(&e), anthropic::param);
                    let _ = send(event("error", json!(error_body(&e)))).await;
                    return;
                }
            };
            let mut out = Vec::new();
            if view.thinking && !reasoning.is_empty() {
                if !thinking_open {
                    let block = json!({"type": "thinking", "thinking": "", "signature": ""});
                    out.push(block_start(index, block));
                    thinking_open = true;
                }
                let delta = json!({"type": "thinking_delta", "thinking": reasoning});
                out.push(block_delta(index, delta));
            }
            // The thinking ends where the answer (or the end) begins.
            if thinking_open && (!text.is_empty() || finish.is_some()) {
                out.push(block_delta(
                    index,
                    json!({"type": "signature_delta", "signature": ""}),
                ));
                out.push(block_stop(index));
                index += 1;
                thinking_open = false;
            }
            let ends = finish.as_ref().is_some_and(|f| f.tool_calls.is_empty());
            if !text.is_empty() || (ends && !text_open) {
                if !text_open {
                    out.push(block_start(index, json!({"type": "text", "text": ""})));
                    text_open = true;
                }
                if !text.is_empty() {
                    out.push(block_delta(
                        index,
                        json!({"type": "text_delta", "text": text}),
                    ));
                }
            }
            let done = finish.is_some();
            if let Some(finish) = finish {
                if text_open {
                    out.push(block_stop(index));
                    index += 1;
                }
                for (k, call) in finish.tool_calls.iter().enumerate() {
                    let mut block = view.tool_use(k, call);
                    block["input"] = json!({});
                    out.push(block_start(index, block));
                    let delta = json!({"type": "input_json_delta", "partial_json": call.arguments});
                    out.push(block_delta(index, delta));
                    out.push(block_stop(index));
                    index += 1;
                }
                let (stop_reason, stop_sequence) = view.stop(&finish);
                out.push(event(
                    "message_delta",
                    json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                        "usage": View::usage(&finish)}),
                ));
                out.push(event("message_stop", json!({"type": "message_stop"})));
            }
            for e in out {
                if send(e).await.is_err() {
                    return;
                }
            }
            if done {
                return;
            }
        }
        // Cut before the answer finished (the engine or the upstream went away): never silent.
        let e = ApiError::internal("the stream ended before the answer finished");
        let _ = send(event("error", json!(error_body(&e)))).await;
    });
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}
