//! Request and response shapes (OpenAI's) and the handlers. Generation runs on the engine thread;
//! handlers bridge its blocking event streams to async with `spawn_blocking`, and SSE streams are
//! fed through a channel whose closing (client gone) drops the engine stream, which cancels the
//! request and frees its KV.
use crate::{ApiError, AppState, Backend};
use axle_core::FinishReason;
use axle_models::Tokenizer;
use axle_sdk::{
    ChatMessage, DelegatedInput, GenerateRequest, Prompt, RequestOptions, SamplingParams, SdkError,
    Session, StreamEvent, TokenLogprob, TokenStream,
};
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

type Body<T> = Result<Json<T>, JsonRejection>;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct StreamOptions {
    pub(crate) include_usage: Option<bool>,
}

/// Sampling and length fields shared by the generation routes.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Common {
    pub(crate) model: Option<String>,
    pub(crate) max_tokens: Option<usize>,
    pub(crate) max_completion_tokens: Option<usize>,
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    pub(crate) top_k: Option<usize>,
    pub(crate) min_p: Option<f32>,
    pub(crate) repetition_penalty: Option<f32>,
    pub(crate) presence_penalty: Option<f32>,
    pub(crate) frequency_penalty: Option<f32>,
    pub(crate) seed: Option<u64>,
    pub(crate) stop: Option<Stop>,
    pub(crate) n: Option<usize>,
    /// Chat: a bool (with `top_logprobs`); completions: the number of alternatives.
    pub(crate) logprobs: Option<Value>,
    pub(crate) top_logprobs: Option<usize>,
    pub(crate) logit_bias: Option<HashMap<String, f32>>,
    #[allow(dead_code)]
    pub(crate) user: Option<String>,
    pub(crate) stream: Option<bool>,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) ignore_eos: Option<bool>,
    pub(crate) ngram: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    messages: Vec<Message>,
    tools: Option<Value>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub(crate) struct CompletionRequest {
    prompt: PromptField,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TokenRequest {
    tokens: Vec<u32>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TokenizeRequest {
    text: String,
    add_special: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct DetokenizeRequest {
    tokens: Vec<u32>,
}

pub(crate) static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn finish_reason(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::Length | FinishReason::ContextLimit => "length",
        _ => "stop",
    }
}

fn check_auth(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else {
        return Ok(());
    };
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

/// The native session, or a clear error on a delegated server (token-id routes need our own
/// tokenizer and engine).
pub(crate) fn native(state: &AppState) -> Result<&Arc<Session>, ApiError> {
    match &state.backend {
        Backend::Native(s) => Ok(s),
        Backend::Delegated(up) => Err(ApiError::bad_request(
            format!(
                "this route needs the native backend; this server delegates `{}` to {} at {} \
                 and delegated backends have no token-id routes",
                state.model_name,
                up.kind().name(),
                up.url()
            ),
            None,
        )),
    }
}

/// Every id must be in the model's vocabulary.
fn check_tokens(state: &AppState, tokens: &[u32]) -> Result<(), ApiError> {
    let vocab = native(state)?.model().tokenizer.len();
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(&bad) => Err(ApiError::bad_request(
            format!("token {bad} is outside the vocabulary ({vocab})"),
            Some("tokens"),
        )),
        None => Ok(()),
    }
}

pub(crate) fn check_model(state: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if !m.is_empty() && *m != state.model_name => Err(ApiError::unknown_model(m)),
        _ => Ok(()),
    }
}

/// The checks of the common fields that need no model (delegated routes make them too): sampling
/// ranges, a positive token limit, at most 4 stop strings.
pub(crate) fn check_model_free_fields(c: &Common) -> Result<(), ApiError> {
    SamplingParams {
        temperature: c.temperature.unwrap_or(1.0),
        top_p: c.top_p.unwrap_or(1.0),
        top_k: c.top_k.unwrap_or(0),
        min_p: c.min_p.unwrap_or(0.0),
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        ..Default::default()
    }
    .validate()
    .map_err(|e| ApiError::bad_request(e, None))?;
    if c.max_completion_tokens.or(c.max_tokens) == Some(0) {
        return Err(ApiError::bad_request(
            "max_tokens must be at least 1",
            Some("max_tokens"),
        ));
    }
    if matches!(&c.stop, Some(Stop::Many(v)) if v.len() > 4) {
        return Err(ApiError::bad_request(
            "at most 4 stop sequences",
            Some("stop"),
        ));
    }
    Ok(())
}

/// Validates the common fields and turns them into request options and a choice count.
fn options(state: &AppState, c: &Common) -> Result<(RequestOptions, usize), ApiError> {
    check_model(state, &c.model)?;
    let logprobs = match &c.logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(c.top_logprobs.unwrap_or(0)),
        Some(Value::Number(n)) => n.as_u64().map(|n| n as usize),
        Some(_) => {
            return Err(ApiError::bad_request(
                "logprobs must be a boolean or a count",
                Some("logprobs"),
            ))
        }
    };
    if logprobs.is_some_and(|k| k > 20) {
        return Err(ApiError::bad_request(
            "at most 20 top log-probabilities",
            Some("top_logprobs"),
        ));
    }
    let n = c.n.unwrap_or(1);
    if !(1..=8).contains(&n) {
        return Err(ApiError::bad_request(
            format!("n must be between 1 and 8, got {n}"),
            Some("n"),
        ));
    }
    let vocab = native(state)?.model().tokenizer.len();
    let mut logit_bias = Vec::new();
    for (k, &v) in c.logit_bias.iter().flatten() {
        let id: u32 = k.parse().map_err(|_| {
            ApiError::bad_request(
                format!("logit_bias key `{k}` is not a token id"),
                Some("logit_bias"),
            )
        })?;
        if id as usize >= vocab {
            return Err(ApiError::bad_request(
                format!("logit_bias token {id} is outside the vocabulary ({vocab})"),
                Some("logit_bias"),
            ));
        }
        if !(-100.0..=100.0).contains(&v) {
            return Err(ApiError::bad_request(
                "logit_bias values must be in [-100, 100]",
                Some("logit_bias"),
            ));
        }
        logit_bias.push((id, if v <= -100.0 { f32::NEG_INFINITY } else { v }));
    }
    let sampling = SamplingParams {
        temperature: c.temperature.unwrap_or(1.0),
        top_p: c.top_p.unwrap_or(1.0),
        top_k: c.top_k.unwrap_or(0),
        min_p: c.min_p.unwrap_or(0.0),
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        logit_bias,
        seed: c
            .seed
            .unwrap_or_else(|| NEXT_ID.fetch_add(1, Ordering::Relaxed)),
        logprobs,
        ..Default::default()
    };
    sampling
        .validate()
        .map_err(|e| ApiError::bad_request(e, None))?;
    check_model_free_fields(c)?;
    let max_tokens = c.max_completion_tokens.or(c.max_tokens).unwrap_or(512);
    let stop_strings = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    let opts = RequestOptions {
        sampling,
        max_tokens,
        stop_strings,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        speculate: c.ngram.unwrap_or(true),
        ..Default::default()
    };
    Ok((opts, n))
}

fn sdk_error(e: SdkError) -> ApiError {
    match e {
        SdkError::Rejected(m) => ApiError::bad_request(m, Some("messages")),
        SdkError::Model(m) => ApiError::bad_request(m.to_string(), None),
        SdkError::EngineStopped => ApiError::internal("the engine has stopped"),
    }
}

/// Starts `n` streams (seeds seed, seed+1, ...) after the admission checks.
async fn start(
    state: &AppState,
    prompt: Prompt,
    opts: RequestOptions,
    n: usize,
) -> Result<Vec<TokenStream>, ApiError> {
    state.metrics.request();
    let session = native(state)?.clone();
    let stats = session.stats();
    if stats.waiting >= state.max_queue {
        state.metrics.error();
        return Err(ApiError::overloaded(stats.waiting));
    }
    let r = tokio::task::spawn_blocking(move || {
        (0..n)
            .map(|i| {
                let mut o = opts.clone();
                o.sampling.seed = o.sampling.seed.wrapping_add(i as u64);
                session.stream(GenerateRequest {
                    prompt: prompt.clone(),
                    options: o,
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    r.map_err(|e| {
        state.metrics.error();
        sdk_error(e)
    })
}

/// One finished choice.
struct Choice {
    text: String,
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    reason: FinishReason,
    prompt_tokens: usize,
    completion_tokens: usize,
}

/// Runs streams to completion (blocking requests).
async fn collect(state: &AppState, streams: Vec<TokenStream>) -> Result<Vec<Choice>, ApiError> {
    let metrics = state.metrics.clone();
    let running = native(state)?.clone();
    let out = tokio::task::spawn_blocking(move || {
        streams
            .into_iter()
            .map(|s| {
                let t0 = Instant::now();
                let mut c = Choice {
                    text: String::new(),
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    reason: FinishReason::Stop,
                    prompt_tokens: 0,
                    completion_tokens: 0,
                };
                for ev in s {
                    match ev {
                        StreamEvent::Token {
                            token,
                            text,
                            logprob,
                        } => {
                            if c.tokens.is_empty() {
                                metrics.ttft(t0.elapsed().as_secs_f64());
                                metrics.observe_running(running.stats().running);
                            }
                            c.tokens.push(token);
                            c.text.push_str(&text);
                            c.logprobs.extend(logprob);
                        }
                        StreamEvent::Done {
                            text,
                            reason,
                            prompt_tokens,
                            completion_tokens,
                            drafted,
                            accepted,
                            ..
                        } => {
                            c.text.push_str(&text);
                            metrics.finished(prompt_tokens, completion_tokens, drafted, accepted);
                            (c.reason, c.prompt_tokens, c.completion_tokens) =
                                (reason, prompt_tokens, completion_tokens);
                        }
                    }
                }
                c
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    if let Some(Choice {
        reason: FinishReason::Error(e),
        ..
    }) = out
        .iter()
        .find(|c| matches!(c.reason, FinishReason::Error(_)))
    {
        state.metrics.error();
        return Err(ApiError::internal(e.clone()));
    }
    Ok(out)
}

/// A token's text (control tokens rendered) and bytes.
fn piece(tok: &Tokenizer, t: u32) -> (String, Vec<u8>) {
    let b = tok.piece(t, true);
    (String::from_utf8_lossy(&b).into_owned(), b)
}

/// Chat-style log-probability entries (`choices[].logprobs.content`).
fn chat_logprobs(tok: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let entry = |t: u32, lp: f32| {
        let (text, bytes) = piece(tok, t);
        json!({"token": text, "logprob": lp, "bytes": bytes})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut e = entry(l.token, l.logprob);
            e["top_logprobs"] = l
                .top
                .iter()
                .map(|&(t, p)| entry(t, p))
                .collect::<Vec<_>>()
                .into();
            e
        })
        .collect();
    json!({ "content": content })
}

/// Completions-style log-probabilities (`choices[].logprobs`), text offsets from `offset`.
fn text_logprobs(tok: &Tokenizer, lps: &[TokenLogprob], mut offset: usize) -> Value {
    let (mut tokens, mut token_logprobs, mut top, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for l in lps {
        let (text, _) = piece(tok, l.token);
        offsets.push(offset);
        offset += text.len();
        tokens.push(text);
        token_logprobs.push(l.logprob);
        let m: serde_json::Map<String, Value> = l
            .top
            .iter()
            .map(|&(t, p)| (piece(tok, t).0, json!(p)))
            .collect();
        top.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

fn usage(choices: &[Choice]) -> Value {
    let p = choices.first().map_or(0, |c| c.prompt_tokens);
    let c: usize = choices.iter().map(|c| c.completion_tokens).sum();
    json!({ "prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c })
}

/// What a streamed chunk looks like for each route.
#[derive(Clone, Copy, PartialEq)]
enum Flavor {
    Chat,
    Text,
    Tokens,
}

/// Streams choices as SSE: one task per choice forwards its events; the last one to finish adds
/// the usage chunk (if asked) and `[DONE]`.
fn sse(
    state: &AppState,
    streams: Vec<TokenStream>,
    flavor: Flavor,
    include_usage: bool,
) -> Result<Response, ApiError> {
    let native_session = native(state)?.clone();
    let id = format!(
        "{}-{}",
        if flavor == Flavor::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    );
    let (model, created) = (state.model_name.clone(), now());
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(256);
    let left = Arc::new(AtomicUsize::new(streams.len()));
    let totals = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    for (index, stream) in streams.into_iter().enumerate() {
        let (tx, left, totals, metrics, id, model) = (
            tx.clone(),
            left.clone(),
            totals.clone(),
            state.metrics.clone(),
            id.clone(),
            model.clone(),
        );
        let session = native_session.clone();
        let runtime = state.runtime.clone();
        tokio::task::spawn_blocking(move || {
            let chunk = |delta: Value, reason: Option<&str>| -> Value {
                match flavor {
                    Flavor::Chat => {
                        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [{"index": index, "delta": delta, "finish_reason": reason}]})
                    }
                    Flavor::Text => {
                        json!({"id": id, "object": "text_completion", "created": created, "model": model,
                        "choices": [{"index": index, "text": delta["content"].as_str().unwrap_or(""), "finish_reason": reason}]})
                    }
                    Flavor::Tokens => {
                        json!({"index": index, "token": delta["token"], "finish_reason": reason})
                    }
                }
            };
            let send = |v: Value| {
                tx.blocking_send(Ok(Event::default().data(v.to_string())))
                    .is_ok()
            };
            if flavor == Flavor::Chat
                && !send(chunk(json!({"role": "assistant", "content": ""}), None))
            {
                return; // client gone: dropping `stream` cancels the request
            }
            let t0 = Instant::now();
            let mut last = t0;
            let mut first = true;
            let weights = session.model().clone();
            let mut offset = 0usize;
            for ev in stream {
                match ev {
                    StreamEvent::Token {
                        token,
                        text,
                        logprob,
                    } => {
                        let now = Instant::now();
                        if first {
                            metrics.ttft((now - t0).as_secs_f64());
                            metrics.observe_running(session.stats().running);
                            first = false;
                        } else {
                            metrics.inter_token((now - last).as_secs_f64());
                        }
                        last = now;
                        let delta = if flavor == Flavor::Tokens {
                            json!({"token": token})
                        } else {
                            json!({"content": text})
                        };
                        let mut v = chunk(delta, None);
                        if let Some(lp) = &logprob {
                            let one = std::slice::from_ref(lp);
                            v["choices"][0]["logprobs"] = match flavor {
                                Flavor::Chat => chat_logprobs(&weights.tokenizer, one),
                                Flavor::Text => text_logprobs(&weights.tokenizer, one, offset),
                                Flavor::Tokens => Value::Null,
                            };
                            if flavor == Flavor::Tokens {
                                v["logprob"] = json!(lp.logprob);
                            }
                        }
                        offset += text.len();
                        if (flavor == Flavor::Tokens || !text.is_empty() || logprob.is_some())
                            && !send(v)
                        {
                            return;
                        }
                    }
                    StreamEvent::Done {
                        text,
                        reason,
                        prompt_tokens,
                        completion_tokens,
                        drafted,
                        accepted,
                        ..
                    } => {
                        metrics.finished(prompt_tokens, completion_tokens, drafted, accepted);
                        if let FinishReason::Error(e) = &reason {
                            metrics.error();
                            let _ = send(ApiError::internal(e.clone()).body());
                        } else {
                            if !text.is_empty() && flavor != Flavor::Tokens {
                                send(chunk(json!({"content": text}), None));
                            }
                            let delta = if flavor == Flavor::Tokens {
                                json!({"token": null})
                            } else {
                                json!({})
                            };
                            let mut last = chunk(delta, Some(finish_reason(&reason)));
                            if flavor != Flavor::Tokens {
                                last["runtime"] = json!(*runtime);
                            }
                            send(last);
                        }
                        totals.0.store(prompt_tokens, Ordering::Relaxed);
                        totals.1.fetch_add(completion_tokens, Ordering::Relaxed);
                    }
                }
            }
            if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                if include_usage {
                    let (p, c) = (
                        totals.0.load(Ordering::Relaxed),
                        totals.1.load(Ordering::Relaxed),
                    );
                    let object = if flavor == Flavor::Chat {
                        "chat.completion.chunk"
                    } else {
                        "text_completion"
                    };
                    send(
                        json!({"id": id, "object": object, "created": created, "model": model, "choices": [],
                        "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
                        "runtime": *runtime}),
                    );
                }
                let _ = tx.blocking_send(Ok(Event::default().data("[DONE]")));
            }
        });
    }
    drop(tx);
    Ok(Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response())
}

fn text_of(m: &Message) -> Result<String, ApiError> {
    Ok(match &m.content {
        None => String::new(),
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => {
            let mut s = String::new();
            for p in parts {
                if p.kind != "text" {
                    return Err(ApiError::bad_request(
                        format!("content part type `{}` is not supported", p.kind),
                        Some("messages"),
                    ));
                }
                s.push_str(p.text.as_deref().unwrap_or(""));
            }
            s
        }
    })
}

/// The request's messages, checked (roles, text-only content, not empty).
fn chat_messages(req: &ChatRequest) -> Result<Vec<ChatMessage>, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let mut msgs = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "tool" | "developer"
        ) {
            return Err(ApiError::bad_request(
                format!("unknown role `{}`", m.role),
                Some("messages"),
            ));
        }
        msgs.push(ChatMessage::new(&m.role, &text_of(m)?));
    }
    Ok(msgs)
}

pub(crate) async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body<ChatRequest>,
) -> Result<Response, ApiError> {
    check_auth(&state, &headers)?;
    let Json(req) = body?;
    if let Backend::Delegated(up) = &state.backend {
        let msgs = chat_messages(&req)?;
        if req.tools.is_some() {
            return Err(ApiError::bad_request(
                "tools are not passed to delegated backends",
                Some("tools"),
            ));
        }
        return crate::delegated::generate(
            &state,
            up.clone(),
            DelegatedInput::Chat(msgs),
            &req.common,
        )
        .await;
    }
    let (opts, n) = options(&state, &req.common)?;
    let opts_logprobs = opts.sampling.logprobs.is_some();
    let msgs = chat_messages(&req)?;
    let prompt = match &req.tools {
        Some(tools) => {
            let text = native(&state)?
                .model()
                .chat_template()
                .and_then(|t| t.render(&msgs, true, Some(tools)))
                .map_err(|e| ApiError::bad_request(e.to_string(), Some("tools")))?;
            Prompt::Tokens(native(&state)?.model().tokenizer.encode(&text, false, true))
        }
        None => Prompt::Chat(msgs),
    };
    let streams = start(&state, prompt, opts, n).await?;
    if req.common.stream == Some(true) {
        let usage = req
            .common
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        return sse(&state, streams, Flavor::Chat, usage);
    }
    let choices = collect(&state, streams).await?;
    let weights = native(&state)?.model().clone();
    let body = json!({
        "id": format!("chatcmpl-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
        "object": "chat.completion",
        "created": now(),
        "model": state.model_name,
        "choices": choices.iter().enumerate().map(|(i, c)| json!({
            "index": i, "message": {"role": "assistant", "content": c.text},
            "logprobs": if opts_logprobs { chat_logprobs(&weights.tokenizer, &c.logprobs) } else { Value::Null },
            "finish_reason": finish_reason(&c.reason)
        })).collect::<Vec<_>>(),
        "runtime": *state.runtime,
        "usage": usage(&choices),
    });
    Ok(Json(body).into_response())
}

pub(crate) async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body<CompletionRequest>,
) -> Result<Response, ApiError> {
    check_auth(&state, &headers)?;
    let Json(req) = body?;
    if let Backend::Delegated(up) = &state.backend {
        let PromptField::One(prompt) = req.prompt else {
            return Err(ApiError::bad_request(
                "delegated backends take a single prompt string",
                Some("prompt"),
            ));
        };
        return crate::delegated::generate(
            &state,
            up.clone(),
            DelegatedInput::Text(prompt),
            &req.common,
        )
        .await;
    }
    let (opts, n) = options(&state, &req.common)?;
    let opts_logprobs = opts.sampling.logprobs.is_some();
    let prompts = match req.prompt {
        PromptField::One(p) => vec![p],
        PromptField::Many(v) if !v.is_empty() && v.len() * n <= 16 => v,
        PromptField::Many(_) => {
            return Err(ApiError::bad_request(
                "prompt must be a string or a list of 1 to 16 strings",
                Some("prompt"),
            ))
        }
    };
    let stream = req.common.stream == Some(true);
    if stream && prompts.len() > 1 {
        return Err(ApiError::bad_request(
            "streaming takes a single prompt",
            Some("prompt"),
        ));
    }
    let mut streams = Vec::new();
    for p in prompts {
        streams.extend(start(&state, Prompt::Text(p), opts.clone(), n).await?);
    }
    if stream {
        let usage = req
            .common
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        return sse(&state, streams, Flavor::Text, usage);
    }
    let choices = collect(&state, streams).await?;
    let weights = native(&state)?.model().clone();
    let prompt_tokens: usize = choices.iter().step_by(n).map(|c| c.prompt_tokens).sum();
    let completion_tokens: usize = choices.iter().map(|c| c.completion_tokens).sum();
    let body = json!({
        "id": format!("cmpl-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
        "object": "text_completion",
        "created": now(),
        "model": state.model_name,
        "choices": choices.iter().enumerate().map(|(i, c)| json!({
            "index": i, "text": c.text,
            "logprobs": if opts_logprobs { text_logprobs(&weights.tokenizer, &c.logprobs, 0) } else { Value::Null },
            "finish_reason": finish_reason(&c.reason)
        })).collect::<Vec<_>>(),
        "runtime": *state.runtime,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    });
    Ok(Json(body).into_response())
}

pub(crate) async fn generate_tokens(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body<TokenRequest>,
) -> Result<Response, ApiError> {
    check_auth(&state, &headers)?;
    let Json(req) = body?;
    let (opts, n) = options(&state, &req.common)?;
    check_tokens(&state, &req.tokens)?;
    let streams = start(&state, Prompt::Tokens(req.tokens), opts, n).await?;
    if req.common.stream == Some(true) {
        return sse(&state, streams, Flavor::Tokens, false);
    }
    let choices = collect(&state, streams).await?;
    let body = json!({
        "model": state.model_name,
        "choices": choices.iter().enumerate().map(|(i, c)| json!({"index": i, "tokens": c.tokens, "finish_reason": finish_reason(&c.reason)})).collect::<Vec<_>>(),
        "runtime": *state.runtime,
        "usage": usage(&choices),
    });
    Ok(Json(body).into_response())
}

pub(crate) async fn tokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body<TokenizeRequest>,
) -> Result<Response, ApiError> {
    check_auth(&state, &headers)?;
    let Json(req) = body?;
    let tokens =
        native(&state)?
            .model()
            .tokenizer
            .encode(&req.text, req.add_special.unwrap_or(true), true);
    Ok(Json(json!({ "tokens": tokens })).into_response())
}

pub(crate) async fn detokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body<DetokenizeRequest>,
) -> Result<Response, ApiError> {
    check_auth(&state, &headers)?;
    let Json(req) = body?;
    check_tokens(&state, &req.tokens)?;
    let tok = &native(&state)?.model().tokenizer;
    Ok(Json(json!({ "text": tok.decode(&req.tokens, false) })).into_response())
}

pub(crate) async fn models(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    check_auth(&state, &headers)?;
    let owned_by = match &state.backend {
        Backend::Native(_) => "axle".to_string(),
        Backend::Delegated(up) => format!("{} via axle", up.kind().name()),
    };
    Ok(Json(json!({"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0, "owned_by": owned_by, "runtime": *state.runtime}]})).into_response())
}

pub(crate) async fn runtime(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    check_auth(&state, &headers)?;
    Ok(Json(json!(*state.runtime)).into_response())
}

pub(crate) async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    let stats = match &state.backend {
        Backend::Native(s) => s.stats(),
        Backend::Delegated(_) => Default::default(),
    };
    let text = state.metrics.render(&stats);
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}
