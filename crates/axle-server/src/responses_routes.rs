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
use axle_sdk::{EventStream, Finish, FinishReason};
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
        view.output(&c.reasoning, &c.text, &c.finish),
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

    fn reasoning_id(&self) -> String {
        format!("rs_{:024}", self.stem)
    }

    /// The thinking, as a reasoning item with its text (no summary is written).
    fn reasoning_item(&self, text: &str, status: &str) -> Value {
        let content = if status == "completed" {
            json!([{"type": "reasoning_text", "text": text}])
        } else {
            json!([])
        };
        json!({"type": "reasoning", "id": self.reasoning_id(), "status": status,
            "summary": [], "content": content})
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

    /// The output items of a finished answer: its thinking (if any), its text (if any, or if
    /// there is nothing else), then a `function_call` per call.
    fn output(&self, reasoning: &str, text: &str, f: &Finish) -> Vec<Value> {
        let mut out = Vec::new();
        if !reasoning.is_empty() {
            out.push(self.reasoning_item(reasoning, "completed"));
        }
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
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
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
    /// The index of the item in `slot`, opening it first (the next index, with its one content
    /// part) if it is not open; None when the client is gone.
    async fn open(
        &mut self,
        slot: &mut Option<usize>,
        next: &mut usize,
        item: impl FnOnce() -> Value,
        id: &str,
        part: impl FnOnce() -> Value,
    ) -> Option<usize> {
        if let Some(at) = *slot {
            return Some(at);
        }
        let at = *next;
        *next += 1;
        *slot = Some(at);
        let sent = self
            .send(
                "response.output_item.added",
                json!({"output_index": at, "item": item()}),
            )
            .await
            && self
                .send(
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": at, "content_index": 0, "part": part()}),
                )
                .await;
        sent.then_some(at)
    }

    /// Closes output item `at`: its text's last event (`done`: the kind, and its fields besides
    /// the item's place), its content part, the item.
    async fn close(
        &mut self,
        at: usize,
        id: &str,
        done: (&str, Value),
        part: Value,
        item: Value,
    ) -> bool {
        let (kind, mut text) = done;
        text["item_id"] = json!(id);
        text["output_index"] = json!(at);
        text["content_index"] = json!(0);
        self.send(kind, text).await
            && self
                .send(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": at, "content_index": 0, "part": part}),
                )
                .await
            && self
                .send(
                    "response.output_item.done",
                    json!({"output_index": at, "item": item}),
                )
                .await
    }

    /// Sends one event; false when the client is gone.
    async fn send(&mut self, kind: &str, mut data: Value) -> bool {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let e = Event::default().event(kind).data(data.to_string());
        self.tx.send(Ok(e)).await.is_ok()
    }
}

/// The streamed output items so far: the reasoning item, then the message, each open while its
/// text arrives (their output indices in the order they opened).
#[derive(Default)]
struct Output {
    /// The thinking so far, and the reasoning item's index while it is open.
    thought: String,
    reasoning: Option<usize>,
    /// The answer so far, and the message's index while it is open.
    answer: String,
    message: Option<usize>,
    /// The next item's index.
    next: usize,
}

impl Output {
    /// Appends thinking, opening the reasoning item first; false when the client is gone.
    async fn reasoning(&mut self, ev: &mut Events, view: &View, piece: &str) -> bool {
        if piece.is_empty() {
            return true;
        }
        let id = view.reasoning_id();
        let item = || view.reasoning_item("", "in_progress");
        let part = || json!({"type": "reasoning_text", "text": ""});
        let opened = ev.open(&mut self.reasoning, &mut self.next, item, &id, part);
        let Some(at) = opened.await else {
            return false;
        };
        self.thought.push_str(piece);
        ev.send(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": at, "content_index": 0, "delta": piece}),
        )
        .await
    }

    /// Appends answer text, closing the reasoning item and opening the message first.
    async fn text(&mut self, ev: &mut Events, view: &View, piece: &str) -> bool {
        if !self.close_reasoning(ev, view).await {
            return false;
        }
        let id = view.message_id();
        let item = || view.message_item("", "in_progress");
        let part = || json!({"type": "output_text", "text": "", "annotations": []});
        let opened = ev.open(&mut self.message, &mut self.next, item, &id, part);
        let Some(at) = opened.await else {
            return false;
        };
        if piece.is_empty() {
            return true;
        }
        self.answer.push_str(piece);
        ev.send(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": at, "content_index": 0, "delta": piece,
                "logprobs": []}),
        )
        .await
    }

    async fn close_reasoning(&mut self, ev: &mut Events, view: &View) -> bool {
        let Some(at) = self.reasoning.take() else {
            return true;
        };
        let text = &self.thought;
        let done = json!({"text": text});
        let part = json!({"type": "reasoning_text", "text": text});
        let item = view.reasoning_item(text, "completed");
        ev.close(
            at,
            &view.reasoning_id(),
            ("response.reasoning_text.done", done),
            part,
            item,
        )
        .await
    }

    /// Closes what is open, at the end of the answer.
    async fn close(&mut self, ev: &mut Events, view: &View) -> bool {
        if !self.close_reasoning(ev, view).await {
            return false;
        }
        let Some(at) = self.message.take() else {
            return true;
        };
        let text = &self.answer;
        let done = json!({"text": text, "logprobs": []});
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        let item = view.message_item(text, "completed");
        ev.close(
            at,
            &view.message_id(),
            ("response.output_text.done", done),
            part,
            item,
        )
        .await
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
        let mut out = Output::default();
        while let Some(e) = stream.next().await {
            timing.observe(&e);
            let (reasoning, piece, finish) = match e.into_pieces() {
                Ok(pieces) => pieces,
                Err(e) => {
                    let e = ApiError::sdk(api::clone_error(&e), responses::param);
                    let body = json!({"code": e.code, "message": e.message, "param": e.param});
                    ev.send("error", body).await;
                    return;
                }
            };
            if !out.reasoning(&mut ev, &view, &reasoning).await {
                return;
            }
            let needs_text = !piece.is_empty()
                || finish
                    .as_ref()
                    .is_some_and(|f| f.tool_calls.is_empty() && out.message.is_none());
            if needs_text && !out.text(&mut ev, &view, &piece).await {
                return;
            }
            let Some(finish) = finish else {
                continue;
            };
            if !out.close(&mut ev, &view).await {
                return;
            }
            for (k, call) in finish.tool_calls.iter().enumerate() {
                let at = out.next;
                out.next += 1;
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
            view.keep(&state, &out.answer, &finish);
            let items = view.output(&out.thought, &out.answer, &finish);
            let done = view.response("completed", items, Some(&finish));
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
