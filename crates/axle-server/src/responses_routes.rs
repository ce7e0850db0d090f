//! `POST /v1/responses`: OpenAI's Responses API on the same generator as the other routes, blocking
//! or streamed as typed events (`response.created`, `response.output_item.added`,
//! `response.output_text.delta`, `response.function_call_arguments.delta`, ...,
//! `response.completed`). Stored responses keep their conversation for `previous_response_id`.
use crate::api::{self, Authorized, Timing};
use crate::json_body::JsonBody;
use crate::openai::{call_arguments, template_call};
use crate::responses::{self, ResponsesRequest};
use crate::{ApiError, AppState};
use axle_models::ChatMessage;
use axle_sdk::{EventStream, Finish, FinishReason, StreamEvent};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// `POST /v1/responses`.
pub(crate) async fn responses(
    Authorized(state): Authorized,
    JsonBody(body): JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    api::check_model(&state, &body.model)?;
    let history = match &body.previous_response_id {
        None => Vec::new(),
        Some(id) => state.responses.get(id).ok_or_else(|| {
            ApiError::bad_request(
                format!(
                    "previous_response_id: no stored response `{id}` (not stored, or evicted: \
                     the server keeps the newest {})",
                    responses::DEFAULT_STORED
                ),
                Some("previous_response_id"),
            )
        })?,
    };
    let (mut req, conversation) = body
        .to_request(history)
        .map_err(|e| ApiError::wire(e, responses::param))?;
    api::admit(&state, std::slice::from_mut(&mut req), responses::param)?;
    let stream = api::start_one(&state, &req, body.streams(), responses::param).await?;
    let n = api::NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let view = View {
        stem: n,
        created: api::now(),
        model: state.model_name.clone(),
        echo: json!({
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": body.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": body.previous_response_id,
            "store": body.stores(),
            "temperature": body.temperature,
            "top_p": body.top_p,
            "tool_choice": body.tool_choice.clone().unwrap_or(json!("auto")),
            "tools": body.tools.clone().unwrap_or_default(),
            "text": body.text.clone().unwrap_or(json!({"format": {"type": "text"}})),
            "truncation": "disabled",
            "metadata": body.other.get("metadata").cloned().unwrap_or(json!({})),
        }),
        store: body.stores().then_some(conversation),
    };
    if body.streams() {
        return Ok(sse(state, view, stream, t0));
    }
    let c = api::timed(&state, stream, t0)
        .await
        .map_err(|e| ApiError::sdk(e, responses::param))?;
    view.keep(&state, &c.text, &c.finish);
    Ok(Json(view.response(
        "completed",
        view.output(&c.text, &c.finish),
        Some(&c.finish),
    ))
    .into_response())
}

/// What a response's pieces share.
struct View {
    /// The number in the response's ids (`resp_`, `msg_`, `fc_`, `call_`).
    stem: u64,
    created: u64,
    model: String,
    /// The request's settings, echoed in every response object.
    echo: Value,
    /// The conversation so far, when the response is stored.
    store: Option<Vec<ChatMessage>>,
}

impl View {
    fn id(&self) -> String {
        format!("resp_{:024}", self.stem)
    }

    fn message_id(&self) -> String {
        format!("msg_{:024}", self.stem)
    }

    fn call_ids(&self, k: usize) -> (String, String) {
        (
            format!("fc_{}_{k}", self.stem),
            format!("call_{}_{k}", self.stem),
        )
    }

    fn message_item(&self, text: &str, status: &str) -> Value {
        let content = if status == "completed" {
            json!([{"type": "output_text", "text": text, "annotations": []}])
        } else {
            json!([])
        };
        json!({"type": "message", "id": self.message_id(), "status": status,
            "role": "assistant", "content": content})
    }

    fn call_item(
        &self,
        k: usize,
        call: &axle_sdk::ToolCall,
        arguments: &str,
        status: &str,
    ) -> Value {
        let (id, call_id) = self.call_ids(k);
        json!({"type": "function_call", "id": id, "call_id": call_id, "name": call.name,
            "arguments": arguments, "status": status})
    }

    /// The output items of a finished answer: its text (if any, or if there is nothing else),
    /// then a `function_call` per call.
    fn output(&self, text: &str, f: &Finish) -> Vec<Value> {
        let mut out = Vec::new();
        if !text.is_empty() || f.tool_calls.is_empty() {
            out.push(self.message_item(text, "completed"));
        }
        for (k, call) in f.tool_calls.iter().enumerate() {
            out.push(self.call_item(k, call, &call.arguments, "completed"));
        }
        out
    }

    fn usage(f: &Finish) -> Value {
        let u = f.usage.unwrap_or_default();
        json!({"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens})
    }

    /// The response object; `finish` None while it is in progress.
    fn response(&self, status: &str, output: Vec<Value>, finish: Option<&Finish>) -> Value {
        let cut = finish.is_some_and(|f| {
            f.tool_calls.is_empty()
                && (matches!(f.reason, FinishReason::Length | FinishReason::ContextLimit)
                    || f.upstream_reason.as_deref() == Some("length"))
        });
        let status = if cut { "incomplete" } else { status };
        let mut r = json!({
            "id": self.id(), "object": "response", "created_at": self.created,
            "status": status, "model": self.model, "output": output, "error": null,
            "incomplete_details": if cut { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "usage": finish.map(Self::usage),
        });
        if let (Some(r), Some(e)) = (r.as_object_mut(), self.echo.as_object()) {
            r.extend(e.clone());
        }
        r
    }

    /// Stores the conversation with this answer, when asked.
    fn keep(&self, state: &AppState, text: &str, f: &Finish) {
        let Some(conversation) = &self.store else {
            return;
        };
        let mut conversation = conversation.clone();
        let mut m = ChatMessage::new("assistant", text);
        if !f.tool_calls.is_empty() {
            let calls: Vec<Value> = f
                .tool_calls
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    template_call(
                        json!(self.call_ids(k).1),
                        &c.name,
                        call_arguments(&c.arguments),
                    )
                })
                .collect();
            m.tool_calls = Some(Value::Array(calls));
        }
        conversation.push(m);
        state.responses.put(self.id(), conversation);
    }
}

/// Typed events, numbered in order.
struct Events {
    tx: mpsc::Sender<Result<Event, Infallible>>,
    seq: u64,
}

impl Events {
    /// Sends one event; false when the client is gone.
    async fn send(&mut self, kind: &str, mut data: Value) -> bool {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let e = Event::default().event(kind).data(data.to_string());
        self.tx.send(Ok(e)).await.is_ok()
    }
}

fn sse(state: AppState, view: View, mut stream: EventStream, t0: Instant) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(256);
    tokio::spawn(async move {
        // Returning drops `stream` (the client is gone, or the answer ended), which cancels it.
        let mut ev = Events { tx, seq: 0 };
        let opening = view.response("in_progress", Vec::new(), None);
        if !ev
            .send("response.created", json!({"response": opening}))
            .await
            || !ev
                .send("response.in_progress", json!({"response": opening}))
                .await
        {
            return;
        }
        let mut timing = Timing::new(&state, t0);
        let mut text = String::new();
        let mut open = false;
        let item_id = view.message_id();
        while let Some(e) = stream.next().await {
            timing.observe(&e);
            let (piece, finish) = match e {
                StreamEvent::Token { text, .. } => (text, None),
                // Reasoning items are not offered yet (`reasoning` is refused): thinking is left out.
                StreamEvent::Done { text, finish, .. } => (text, Some(finish)),
                StreamEvent::Error(e) => {
                    let e = ApiError::sdk(api::clone_error(&e), responses::param);
                    let body = json!({"code": e.code, "message": e.message, "param": e.param});
                    ev.send("error", body).await;
                    return;
                }
            };
            let needs_text = !piece.is_empty()
                || finish
                    .as_ref()
                    .is_some_and(|f| f.tool_calls.is_empty() && !open);
            if needs_text && !open {
                open = true;
                let item = view.message_item("", "in_progress");
                let part = json!({"type": "output_text", "text": "", "annotations": []});
                if !ev
                    .send(
                        "response.output_item.added",
                        json!({"output_index": 0, "item": item}),
                    )
                    .await
                    || !ev
                        .send(
                            "response.content_part.added",
                            json!({"item_id": item_id,
                        "output_index": 0, "content_index": 0, "part": part}),
                        )
                        .await
                {
                    return;
                }
            }
            if !piece.is_empty() {
                text.push_str(&piece);
                let delta = json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                    "delta": piece, "logprobs": []});
                if !ev.send("response.output_text.delta", delta).await {
                    return;
                }
            }
            let Some(finish) = finish else {
                continue;
            };
            let mut index = 0;
            if open {
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                let done = [
                    (
                        "response.output_text.done",
                        json!({"item_id": item_id, "output_index": 0,
                        "content_index": 0, "text": text, "logprobs": []}),
                    ),
                    (
                        "response.content_part.done",
                        json!({"item_id": item_id, "output_index": 0,
                        "content_index": 0, "part": part}),
                    ),
                    (
                        "response.output_item.done",
                        json!({"output_index": 0,
                        "item": view.message_item(&text, "completed")}),
                    ),
                ];
                for (kind, data) in done {
                    if !ev.send(kind, data).await {
                        return;
                    }
                }
                index = 1;
            }
            for (k, call) in finish.tool_calls.iter().enumerate() {
                let at = index + k;
                let (id, _) = view.call_ids(k);
                let steps = [
                    (
                        "response.output_item.added",
                        json!({"output_index": at,
                        "item": view.call_item(k, call, "", "in_progress")}),
                    ),
                    (
                        "response.function_call_arguments.delta",
                        json!({"item_id": id,
                        "output_index": at, "delta": call.arguments}),
                    ),
                    (
                        "response.function_call_arguments.done",
                        json!({"item_id": id,
                        "output_index": at, "arguments": call.arguments}),
                    ),
                    (
                        "response.output_item.done",
                        json!({"output_index": at,
                        "item": view.call_item(k, call, &call.arguments, "completed")}),
                    ),
                ];
                for (kind, data) in steps {
                    if !ev.send(kind, data).await {
                        return;
                    }
                }
            }
            view.keep(&state, &text, &finish);
            let done = view.response("completed", view.output(&text, &finish), Some(&finish));
            let kind = if done["status"] == "incomplete" {
                "response.incomplete"
            } else {
                "response.completed"
            };
            ev.send(kind, json!({"response": done})).await;
            return;
        }
        // Cut before the answer finished: never silent.
        let body = json!({"code": "server_error", "param": null,
            "message": "the stream ended before the answer finished"});
        ev.send("error", body).await;
    });
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}
