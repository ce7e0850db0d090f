//! The handlers. Every generation route does the same four things, whoever generates: map the
//! body onto a [`GenerateRequest`] ([`crate::openai`]), start it on the [`Generator`] (which
//! checks it and refuses what its route cannot honour), then either stream the events as SSE or
//! collect them, and render OpenAI's shapes. A client that goes away drops the event streams,
//! which cancels the request (frees its KV, or closes the upstream connection).
use crate::openai::{
    names, AssistantMessage, ChatChoice, ChatCompletionRequest, ChatLogprobs, ChunkChoice,
    Completion as WireCompletion, CompletionRequest, Delta, DetokenizeRequest, GenerationFields,
    LogprobEntry, ModelCard, ModelList, Text, TextChoice, TextLogprobs, TokenChoice, TokenChunk,
    TokenCompletion, TokenGenerationRequest, TokenizeRequest, Tokens, ToolCallBody, ToolCallDelta,
    TopLogprob, UsageBody, WireError,
};
use crate::{ApiError, AppState};
use axle_sdk::{
    defaults, Completion, Delivery, EventStream, Field, GenerateRequest, Generator, Rejection,
    StreamEvent, TokenLogprob, Tokenizer,
};
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

type Body<T> = crate::json_body::JsonBody<T>;

pub(crate) static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The three generation routes: what their prompt field is called, and how their choices look.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Flavor {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Text,
    /// `/v1/generate` (token ids).
    Tokens,
}

impl Flavor {
    /// The wire name of a request field, for error `param`s: the prompt is `messages`, `prompt`
    /// or `tokens`; completions count alternatives in `logprobs` itself.
    fn param(self, field: Field) -> &'static str {
        match (self, field) {
            (Flavor::Chat, Field::Prompt) => "messages",
            (Flavor::Text, Field::Prompt) => "prompt",
            (Flavor::Tokens, Field::Prompt) => "tokens",
            (Flavor::Text, Field::TopLogprobs) => "logprobs",
            (_, f) => f.name(),
        }
    }

    fn id(self) -> String {
        let prefix = match self {
            Flavor::Chat => names::CHAT_ID,
            Flavor::Text | Flavor::Tokens => names::TEXT_ID,
        };
        format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
    }

    fn error(self, e: axle_sdk::SdkError) -> ApiError {
        ApiError::sdk(e, |f| self.param(f))
    }
}

pub(crate) fn check_auth(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else {
        return Ok(());
    };
    // The bearer key, or Anthropic's `x-api-key` header carrying it.
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    if bearer == Some(key.as_str()) || x_api_key == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

/// The app state, for a request whose bearer key [`check_auth`] accepted: the first extractor of
/// every route that requires the key.
pub(crate) struct Authorized(pub(crate) AppState);

impl FromRequestParts<AppState> for Authorized {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        check_auth(state, &parts.headers)?;
        Ok(Authorized(state.clone()))
    }
}

pub(crate) fn check_model(state: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if !m.is_empty() && *m != state.model_name => Err(ApiError::unknown_model(m)),
        _ => Ok(()),
    }
}

/// One generation request, as a route received it.
struct Job {
    flavor: Flavor,
    requests: Vec<GenerateRequest>,
    stream: bool,
    include_usage: bool,
}

/// Counts the request, applies the server's `--max-tokens-limit` (refusing more, capping the
/// default) and refuses work when the queue is full (`param` names the route's fields).
pub(crate) fn admit(
    state: &AppState,
    requests: &mut [GenerateRequest],
    param: impl Fn(Field) -> &'static str,
) -> Result<(), ApiError> {
    state.metrics.request();
    if let Some(limit) = state.max_tokens_limit {
        for r in requests.iter_mut() {
            match r.max_tokens {
                Some(n) if n > limit => {
                    state.metrics.error();
                    let reason = format!("at most {limit} here (the server's --max-tokens-limit)");
                    let e = Rejection::invalid(Field::MaxTokens, reason);
                    return Err(ApiError::sdk(e.into(), param));
                }
                Some(_) => {}
                None => r.max_tokens = Some(limit.min(defaults::MAX_TOKENS)),
            }
        }
    }
    let waiting = state.generator.stats().waiting;
    if waiting >= state.max_queue {
        state.metrics.error();
        return Err(ApiError::overloaded(waiting));
    }
    Ok(())
}

/// Starts an admitted request, its choices read as `streamed` says: one stream per choice.
/// `param` names the route's fields in a refusal.
pub(crate) async fn start(
    state: &AppState,
    req: &GenerateRequest,
    streamed: bool,
    param: impl Fn(Field) -> &'static str,
) -> Result<Vec<EventStream>, ApiError> {
    let delivery = if streamed {
        Delivery::Streamed
    } else {
        Delivery::Whole
    };
    state.generator.start_for(req, delivery).await.map_err(|e| {
        state.metrics.error();
        ApiError::sdk(e, param)
    })
}

/// [`start`] for a request of one choice.
pub(crate) async fn start_one(
    state: &AppState,
    req: &GenerateRequest,
    streamed: bool,
    param: impl Fn(Field) -> &'static str,
) -> Result<EventStream, ApiError> {
    start(state, req, streamed, param)
        .await?
        .pop()
        .ok_or_else(|| ApiError::internal("the request started no stream"))
}

/// Starts every request of the job (after the queue check) and answers it.
async fn run(state: &AppState, mut job: Job) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let flavor = job.flavor;
    admit(state, &mut job.requests, |f| flavor.param(f))?;
    let logprobs = job.requests.iter().any(|r| r.logprobs.is_some());
    let mut streams = Vec::new();
    for r in &job.requests {
        streams.extend(start(state, r, job.stream, |f| flavor.param(f)).await?);
    }
    let view = View {
        flavor: job.flavor,
        id: job.flavor.id(),
        created: now(),
        state: state.clone(),
        logprobs,
    };
    if job.stream {
        return Ok(sse(view, streams, job.include_usage, t0));
    }
    // Collected side by side; dropping the set (the client went away: hyper drops this handler)
    // cancels every choice and frees its KV.
    let mut set = tokio::task::JoinSet::new();
    for (i, s) in streams.into_iter().enumerate() {
        let state = state.clone();
        set.spawn(async move { (i, timed(&state, s, t0).await) });
    }
    let mut done: Vec<Option<Completion>> = vec![None; set.len()];
    while let Some(r) = set.join_next().await {
        let (i, c) = r.map_err(|e| ApiError::internal(e.to_string()))?;
        match c {
            Ok(c) => done[i] = Some(c),
            Err(e) => return Err(job.flavor.error(e)),
        }
    }
    let done: Vec<Completion> = done.into_iter().flatten().collect();
    // Prompt tokens count once per prompt (choices of one prompt share it).
    let per_prompt = done.len() / job.requests.len().max(1);
    let prompt: usize = done
        .iter()
        .step_by(per_prompt.max(1))
        .map(|c| c.finish.usage.map_or(0, |u| u.prompt_tokens))
        .sum();
    let completion: usize = done
        .iter()
        .map(|c| c.finish.usage.map_or(0, |u| u.completion_tokens))
        .sum();
    let reasoning: usize = done
        .iter()
        .map(|c| c.finish.usage.map_or(0, |u| u.reasoning_tokens))
        .sum();
    Ok(view.complete(&done, UsageBody::new(prompt, completion, reasoning)))
}

/// Records a choice's time to first token, inter-token gaps and finished counts.
pub(crate) struct Timing<'a> {
    state: &'a AppState,
    t0: Instant,
    last: Option<Instant>,
}

impl Timing<'_> {
    /// Timing from `t0`, when the request arrived (before it was started: a delegated blocking
    /// request does all its work there).
    pub(crate) fn new(state: &AppState, t0: Instant) -> Timing<'_> {
        Timing {
            state,
            t0,
            last: None,
        }
    }

    pub(crate) fn observe(&mut self, ev: &StreamEvent) {
        let m = &self.state.metrics;
        match ev {
            StreamEvent::Token { .. } => {
                let now = Instant::now();
                match self.last {
                    None => {
                        m.ttft((now - self.t0).as_secs_f64());
                        m.observe_running(self.state.generator.stats().running);
                    }
                    Some(l) => m.inter_token((now - l).as_secs_f64()),
                }
                self.last = Some(now);
            }
            StreamEvent::Done { finish, .. } => {
                let u = finish.usage.unwrap_or_default();
                m.finished(
                    u.prompt_tokens,
                    u.completion_tokens,
                    &finish.speculation.by_source,
                );
            }
            StreamEvent::Error(_) => m.error(),
        }
    }
}

/// Reads one choice to its end.
pub(crate) async fn timed(
    state: &AppState,
    mut s: EventStream,
    t0: Instant,
) -> Result<Completion, axle_sdk::SdkError> {
    let mut timing = Timing::new(state, t0);
    let mut c = Completion::empty();
    while let Some(ev) = s.next().await {
        timing.observe(&ev);
        if c.absorb(ev)? {
            return Ok(c);
        }
    }
    Err(axle_sdk::SdkError::EngineStopped)
}

/// What every rendered response shares.
#[derive(Clone)]
struct View {
    flavor: Flavor,
    id: String,
    created: u64,
    state: AppState,
    logprobs: bool,
}

pub(crate) fn json(v: impl Serialize) -> Response {
    Json(v).into_response()
}

fn to_string(v: &impl Serialize) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

impl View {
    fn tokenizer(&self) -> Option<&Tokenizer> {
        self.state.generator.tokenizer().ok()
    }

    /// A token's text (control tokens rendered) and bytes.
    fn piece(tok: &Tokenizer, t: u32) -> (String, Vec<u8>) {
        let b = tok.piece(t, true);
        (String::from_utf8_lossy(&b).into_owned(), b)
    }

    fn chat_logprobs(&self, lps: &[TokenLogprob]) -> Option<ChatLogprobs> {
        let tok = self.tokenizer().filter(|_| self.logprobs)?;
        let top = |t: u32, logprob: f32| {
            let (token, bytes) = Self::piece(tok, t);
            TopLogprob {
                token,
                logprob,
                bytes,
            }
        };
        Some(ChatLogprobs {
            content: lps
                .iter()
                .map(|l| LogprobEntry {
                    chosen: top(l.token, l.logprob),
                    top_logprobs: l.top.iter().map(|&(t, p)| top(t, p)).collect(),
                })
                .collect(),
        })
    }

    /// Completions-style log-probabilities, text offsets from `offset`.
    fn text_logprobs(&self, lps: &[TokenLogprob], mut offset: usize) -> Option<TextLogprobs> {
        let tok = self.tokenizer().filter(|_| self.logprobs)?;
        let mut out = TextLogprobs {
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
        };
        for l in lps {
            let (text, _) = Self::piece(tok, l.token);
            out.text_offset.push(offset);
            offset += text.len();
            out.tokens.push(text);
            out.token_logprobs.push(l.logprob);
            out.top_logprobs.push(
                l.top
                    .iter()
                    .map(|&(t, p)| (Self::piece(tok, t).0, p))
                    .collect(),
            );
        }
        Some(out)
    }

    fn model(&self) -> String {
        self.state.model_name.clone()
    }

    /// The wire form of a choice's tool calls, with ids unique to this completion.
    fn tool_calls(&self, choice: usize, calls: &[axle_sdk::ToolCall]) -> Vec<ToolCallBody> {
        let stem = self.id.rsplit('-').next().unwrap_or("0");
        calls
            .iter()
            .enumerate()
            .map(|(k, c)| ToolCallBody::of(c, format!("call_{stem}_{choice}_{k}")))
            .collect()
    }

    fn runtime(&self) -> Arc<axle_sdk::RuntimeReport> {
        self.state.runtime.clone()
    }

    /// The blocking response.
    fn complete(&self, done: &[Completion], usage: UsageBody) -> Response {
        match self.flavor {
            Flavor::Chat => self.blocking(names::CHAT, done, usage, |index, c| ChatChoice {
                index,
                message: AssistantMessage {
                    role: "assistant".into(),
                    content: (!c.text.is_empty() || c.finish.tool_calls.is_empty())
                        .then(|| c.text.clone()),
                    reasoning_content: (!c.reasoning.is_empty()).then(|| c.reasoning.clone()),
                    tool_calls: self.tool_calls(index, &c.finish.tool_calls),
                },
                logprobs: self.chat_logprobs(&c.logprobs),
                finish_reason: c.finish.openai_reason().into(),
            }),
            Flavor::Text => self.blocking(names::TEXT, done, usage, |index, c| TextChoice {
                index,
                text: c.text.clone(),
                logprobs: self.text_logprobs(&c.logprobs, 0),
                finish_reason: Some(c.finish.openai_reason().into()),
            }),
            Flavor::Tokens => json(TokenCompletion {
                model: self.model(),
                choices: done
                    .iter()
                    .enumerate()
                    .map(|(index, c)| TokenChoice {
                        index,
                        tokens: c.tokens.clone(),
                        finish_reason: c.finish.openai_reason().into(),
                    })
                    .collect(),
                runtime: self.runtime(),
                usage,
            }),
        }
    }

    /// A blocking completion body of `object`, with usage and the runtime report: choice `i` is
    /// `choice(i, &done[i])`.
    fn blocking<C: Serialize>(
        &self,
        object: &str,
        done: &[Completion],
        usage: UsageBody,
        choice: impl Fn(usize, &Completion) -> C,
    ) -> Response {
        let choices = done.iter().enumerate().map(|(i, c)| choice(i, c));
        json(self.body(object, choices.collect(), Some(usage), true))
    }

    /// A completion body of `object` with `choices`, usage and (when asked) the runtime report.
    fn body<C>(
        &self,
        object: &str,
        choices: Vec<C>,
        usage: Option<UsageBody>,
        runtime: bool,
    ) -> WireCompletion<C> {
        WireCompletion {
            id: self.id.clone(),
            object: object.into(),
            created: self.created,
            model: self.model(),
            choices,
            usage,
            runtime: runtime.then(|| self.runtime()),
        }
    }

    /// The object name of this route's streamed chunks.
    fn chunk_object(&self) -> &'static str {
        match self.flavor {
            Flavor::Chat => names::CHAT_CHUNK,
            Flavor::Text | Flavor::Tokens => names::TEXT,
        }
    }

    fn chunk<C: Serialize>(&self, choice: Option<C>, runtime: bool) -> String {
        let choices = choice.into_iter().collect();
        to_string(&self.body(self.chunk_object(), choices, None, runtime))
    }

    /// The SSE data of one event of choice `index`; `offset` is the choice's text so far, for
    /// text log-probability offsets.
    fn event(&self, index: usize, ev: &StreamEvent, offset: usize) -> Vec<String> {
        let finish = |reason: &str| Some(reason.to_string());
        match (self.flavor, ev) {
            (_, StreamEvent::Error(e)) => {
                let flavor = self.flavor;
                let body = ApiError::sdk(clone_error(e), |f| flavor.param(f)).body();
                vec![to_string(&body)]
            }
            (Flavor::Tokens, StreamEvent::Token { token, logprob, .. }) => {
                vec![to_string(&TokenChunk {
                    index,
                    token: *token,
                    finish_reason: None,
                    logprob: logprob.as_ref().map(|l| l.logprob),
                })]
            }
            (Flavor::Tokens, StreamEvent::Done { finish: f, .. }) => vec![to_string(&TokenChunk {
                index,
                token: None,
                finish_reason: finish(f.openai_reason()),
                logprob: None,
            })],
            (
                _,
                StreamEvent::Token {
                    text,
                    reasoning,
                    logprob,
                    ..
                },
            ) => {
                let mut out = self.reasoning_chunk(index, reasoning);
                if text.is_empty() && logprob.is_none() {
                    return out;
                }
                let lps: Vec<TokenLogprob> = logprob.iter().cloned().collect();
                out.push(self.text_chunk(index, text, &lps, offset, None));
                out
            }
            (
                _,
                StreamEvent::Done {
                    text,
                    reasoning,
                    finish: f,
                },
            ) => {
                // The held-back thinking and text, the tool calls, then the finish.
                let mut out = self.reasoning_chunk(index, reasoning);
                if !text.is_empty() {
                    out.push(self.text_chunk(index, text, &[], offset, None));
                }
                if self.flavor == Flavor::Chat && !f.tool_calls.is_empty() {
                    let calls = self
                        .tool_calls(index, &f.tool_calls)
                        .into_iter()
                        .enumerate()
                        .map(|(i, call)| ToolCallDelta { index: i, call })
                        .collect();
                    out.push(self.chunk(
                        Some(ChunkChoice {
                            index,
                            delta: Delta {
                                tool_calls: Some(calls),
                                ..Delta::default()
                            },
                            logprobs: None,
                            finish_reason: None,
                        }),
                        false,
                    ));
                }
                out.push(self.text_chunk(index, "", &[], offset, finish(f.openai_reason())));
                out
            }
        }
    }

    /// A chat chunk of thinking, if there is any (text completions show none: their prompts
    /// are not rendered by the template that marks it).
    fn reasoning_chunk(&self, index: usize, reasoning: &str) -> Vec<String> {
        if reasoning.is_empty() || self.flavor != Flavor::Chat {
            return Vec::new();
        }
        vec![self.chunk(
            Some(ChunkChoice {
                index,
                delta: Delta {
                    reasoning_content: Some(reasoning.to_string()),
                    ..Delta::default()
                },
                logprobs: None,
                finish_reason: None,
            }),
            false,
        )]
    }

    /// A chat or text chunk with `text`; the finishing one carries the runtime report.
    fn text_chunk(
        &self,
        index: usize,
        text: &str,
        lps: &[TokenLogprob],
        offset: usize,
        finish_reason: Option<String>,
    ) -> String {
        let last = finish_reason.is_some();
        if self.flavor == Flavor::Chat {
            let content = (!last).then(|| text.to_string());
            self.chunk(
                Some(ChunkChoice {
                    index,
                    delta: Delta {
                        content,
                        ..Delta::default()
                    },
                    logprobs: if lps.is_empty() {
                        None
                    } else {
                        self.chat_logprobs(lps)
                    },
                    finish_reason,
                }),
                last,
            )
        } else {
            self.chunk(
                Some(TextChoice {
                    index,
                    text: text.to_string(),
                    logprobs: if lps.is_empty() {
                        None
                    } else {
                        self.text_logprobs(lps, offset)
                    },
                    finish_reason,
                }),
                last,
            )
        }
    }

    /// The closing usage chunk.
    fn usage_chunk(&self, usage: UsageBody) -> String {
        let body = self.body::<ChunkChoice>(self.chunk_object(), Vec::new(), Some(usage), true);
        to_string(&body)
    }
}

/// An SDK error as sent in a stream (the stream's copy is consumed by the collector).
pub(crate) fn clone_error(e: &axle_sdk::SdkError) -> axle_sdk::SdkError {
    use axle_sdk::SdkError as E;
    match e {
        E::Rejected(r) => E::Rejected(r.clone()),
        E::Upstream(u) => E::Upstream(u.clone()),
        E::EngineStopped => E::EngineStopped,
        other => E::Generation(other.to_string()),
    }
}

/// Streams the choices as SSE: one task per choice forwards its events; the last one to finish
/// adds the usage chunk (if asked and every choice's counts are known) and `[DONE]` (unless a
/// choice failed: its error event ends the stream).
fn sse(view: View, streams: Vec<EventStream>, include_usage: bool, t0: Instant) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(256);
    struct Tally {
        left: usize,
        usage: Option<UsageBody>,
        failed: bool,
    }
    let tally = Arc::new(Mutex::new(Tally {
        left: streams.len(),
        usage: Some(UsageBody::default()),
        failed: false,
    }));
    for (index, mut stream) in streams.into_iter().enumerate() {
        let (tx, view, tally) = (tx.clone(), view.clone(), tally.clone());
        tokio::spawn(async move {
            // A failed send means the client is gone: returning drops `stream`, which cancels
            // the choice.
            let send = |data: String| tx.send(Ok(Event::default().data(data)));
            if view.flavor == Flavor::Chat {
                let first = view.chunk(
                    Some(ChunkChoice {
                        index,
                        delta: Delta {
                            role: Some("assistant".into()),
                            content: Some(String::new()),
                            ..Delta::default()
                        },
                        logprobs: None,
                        finish_reason: None,
                    }),
                    false,
                );
                if send(first).await.is_err() {
                    return;
                }
            }
            let mut timing = Timing::new(&view.state, t0);
            let mut offset = 0usize;
            let mut c = Completion::empty();
            let mut result = Err(());
            let mut told = false;
            while let Some(ev) = stream.next().await {
                timing.observe(&ev);
                for data in view.event(index, &ev, offset) {
                    if send(data).await.is_err() {
                        return;
                    }
                }
                if let StreamEvent::Token { text, .. } = &ev {
                    offset += text.len();
                }
                match c.absorb(ev) {
                    Ok(false) => {}
                    Ok(true) => {
                        result = Ok(c.finish.usage);
                        break;
                    }
                    Err(_) => {
                        told = true;
                        break;
                    }
                }
            }
            // A stream cut before its choice finished (the engine or the upstream went away)
            // still ends with an error event, never silently.
            if result.is_err() && !told {
                let cut = StreamEvent::Error(axle_sdk::SdkError::Generation(
                    "the stream ended before the choice finished".into(),
                ));
                for data in view.event(index, &cut, offset) {
                    let _ = send(data).await;
                }
            }
            // Whether this choice is the last to end, and the usage chunk to send then.
            let last = {
                let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                match result {
                    Ok(Some(u)) => {
                        if let Some(total) = t.usage.as_mut() {
                            // Choices share the prompt: count it once.
                            *total = UsageBody::new(
                                u.prompt_tokens,
                                total.completion_tokens + u.completion_tokens,
                                total.completion_tokens_details.reasoning_tokens
                                    + u.reasoning_tokens,
                            );
                        }
                    }
                    Ok(None) => t.usage = None,
                    Err(()) => t.failed = true,
                }
                t.left -= 1;
                (t.left == 0 && !t.failed).then(|| {
                    t.usage
                        .filter(|_| include_usage && view.flavor != Flavor::Tokens)
                })
            };
            let Some(usage) = last else {
                return;
            };
            if let Some(u) = usage {
                let _ = send(view.usage_chunk(u)).await;
            }
            let _ = send("[DONE]".into()).await;
        });
    }
    drop(tx);
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A generation route's body: its flavor, shared fields and SDK requests.
pub(crate) trait GenerationBody: serde::de::DeserializeOwned {
    /// Which route.
    const FLAVOR: Flavor;
    /// The shared fields.
    fn fields(&self) -> &GenerationFields;
    /// One SDK request per prompt.
    fn requests(&self) -> Result<Vec<GenerateRequest>, WireError>;
}

/// Implements [`GenerationBody`] for a body type with a `fields` member.
macro_rules! generation_body {
    ($body:ty, $flavor:expr, |$r:ident| $requests:expr) => {
        impl GenerationBody for $body {
            const FLAVOR: Flavor = $flavor;
            fn fields(&self) -> &GenerationFields {
                &self.fields
            }
            fn requests(&self) -> Result<Vec<GenerateRequest>, WireError> {
                let $r = self;
                $requests
            }
        }
    };
}

generation_body!(ChatCompletionRequest, Flavor::Chat, |r| Ok(vec![
    r.to_request()?
]));
generation_body!(CompletionRequest, Flavor::Text, |r| r.to_requests());
generation_body!(TokenGenerationRequest, Flavor::Tokens, |r| Ok(vec![
    r.to_request()?
]));

/// `POST /v1/chat/completions`, `/v1/completions` and `/v1/generate`: the same steps for all.
pub(crate) async fn generation<B: GenerationBody>(
    Authorized(state): Authorized,
    body: Body<B>,
) -> Result<Response, ApiError> {
    let crate::json_body::JsonBody(req) = body;
    let fields = req.fields();
    check_model(&state, &fields.model)?;
    let requests = req
        .requests()
        .map_err(|e| ApiError::wire(e, |f| B::FLAVOR.param(f)))?;
    let job = Job {
        flavor: B::FLAVOR,
        requests,
        stream: fields.streams(),
        include_usage: fields.include_usage(),
    };
    run(&state, job).await
}

pub(crate) async fn tokenize(
    Authorized(state): Authorized,
    body: Body<TokenizeRequest>,
) -> Result<Response, ApiError> {
    let crate::json_body::JsonBody(req) = body;
    // Megabytes of text take a while: on the blocking pool, not on the async workers.
    let generator = state.generator.clone();
    let tokens = tokio::task::spawn_blocking(move || {
        generator.tokenize(&req.text, req.add_special.unwrap_or(true))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|r| ApiError::rejected(&r, |_| "text"))?;
    Ok(json(Tokens { tokens }))
}

pub(crate) async fn detokenize(
    Authorized(state): Authorized,
    body: Body<DetokenizeRequest>,
) -> Result<Response, ApiError> {
    let crate::json_body::JsonBody(req) = body;
    let text = state
        .generator
        .detokenize(&req.tokens)
        .map_err(|r| ApiError::rejected(&r, |_| "tokens"))?;
    Ok(json(Text { text }))
}

pub(crate) async fn models(Authorized(state): Authorized) -> Result<Response, ApiError> {
    let owned_by = match &state.generator {
        Generator::Native(_) => "axle".to_string(),
        Generator::Delegated(up) => format!("{} via axle", up.kind().name()),
    };
    Ok(json(ModelList {
        object: "list".into(),
        data: vec![ModelCard {
            id: state.model_name.clone(),
            object: "model".into(),
            created: 0,
            owned_by,
            runtime: state.runtime.clone(),
        }],
    }))
}

pub(crate) async fn runtime(Authorized(state): Authorized) -> Result<Response, ApiError> {
    Ok(json(&*state.runtime))
}

pub(crate) async fn health() -> Response {
    json(serde_json::json!({"status": "ok"}))
}

pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.metrics.render(&state.generator.stats());
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// Any path no route serves: 404 in OpenAI's shape.
pub(crate) async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

/// A route that exists, asked with another method: 405 in OpenAI's shape.
pub(crate) async fn method_not_allowed(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}
