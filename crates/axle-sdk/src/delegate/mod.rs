//! Delegated generation: text and chat requests sent to a server the user runs (llama.cpp's
//! server or any OpenAI-compatible one), blocking and streaming, with the sampling fields mapped
//! to what that kind of server reads and its failures turned into errors of ours.
//!
//! There is no token-id route here: a delegated model's vocabulary is the upstream's business.
use crate::events::{Completion, Finish, StreamEvent, Usage};
use crate::request::{Field, GenerateRequest, Prompt, Rejection};
use crate::route::{normalize_url, RuntimeKind};
use axle_core::FinishReason;
use axle_structured::tools::{ToolCall, ToolChoice};
use axle_structured::OutputConstraint;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// What can go wrong talking to an upstream. Every variant names the upstream.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DelegateError {
    /// Nothing answered (connection refused, DNS, reset before a response).
    #[error("upstream {url} is unreachable: {detail}")]
    Unreachable {
        /// The upstream.
        url: String,
        /// The transport's words.
        detail: String,
    },
    /// No response, or no next stream chunk, within the timeout.
    #[error("upstream {url} did not answer within {secs:.0} s")]
    Timeout {
        /// The upstream.
        url: String,
        /// The timeout.
        secs: f64,
    },
    /// The upstream refused the request (4xx): the request itself is at fault.
    #[error("upstream {url} rejected the request ({status}): {message}")]
    Rejected {
        /// The upstream.
        url: String,
        /// Its HTTP status.
        status: u16,
        /// Its error message.
        message: String,
    },
    /// The upstream failed (5xx, or an error event mid-stream).
    #[error("upstream {url} failed ({status}): {message}")]
    Failed {
        /// The upstream.
        url: String,
        /// Its HTTP status (0 for an error event inside a stream).
        status: u16,
        /// Its error message.
        message: String,
    },
    /// The upstream answered something that is not an OpenAI-shaped response.
    #[error("upstream {url} sent an unexpected response: {detail}")]
    Protocol {
        /// The upstream.
        url: String,
        /// What was wrong.
        detail: String,
    },
}

/// One event of an upstream's stream, as parsed.
#[derive(Clone, Debug, PartialEq)]
enum Chunk {
    /// Generated text.
    Text(String),
    /// Generated thinking (`reasoning_content`, or `reasoning`).
    Reasoning(String),
    /// The choice finished.
    Finish(String),
    /// A piece of a streamed tool call.
    ToolCall {
        /// Which call.
        index: u64,
        /// Its name (in the call's first piece).
        name: Option<String>,
        /// More of its arguments.
        arguments: String,
    },
    /// Token counts (when the upstream sends them).
    Usage(Usage),
}

/// OpenAI's finish reason as ours.
fn finish_reason(r: Option<&str>) -> FinishReason {
    match r {
        Some("length") => FinishReason::Length,
        _ => FinishReason::Stop,
    }
}

/// The upstream's token counts as our usage: prompt and generated tokens, and where it says so,
/// the prompt tokens its cache served and the generated ones inside the thinking.
fn usage(u: &Value) -> Option<Usage> {
    let count = |v: &Value| v.as_u64().unwrap_or(0) as usize;
    Some(Usage {
        prompt_tokens: u["prompt_tokens"].as_u64()? as usize,
        completion_tokens: u["completion_tokens"].as_u64()? as usize,
        cached_tokens: count(&u["prompt_tokens_details"]["cached_tokens"]),
        reasoning_tokens: count(&u["completion_tokens_details"]["reasoning_tokens"]),
    })
}

/// The thinking an upstream returns beside the answer: `reasoning_content` (llama.cpp's server,
/// vLLM, DeepSeek's API), or `reasoning` (vLLM's newer name, OpenRouter).
fn reasoning_of(message: &Value) -> Option<&str> {
    message["reasoning_content"]
        .as_str()
        .or_else(|| message["reasoning"].as_str())
}

/// A connection to one upstream server and one of its models.
#[derive(Clone, Debug)]
pub struct Upstream {
    kind: RuntimeKind,
    base: String,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
    http: reqwest::Client,
}

impl Upstream {
    /// Connects: lists the upstream's models (so an unreachable or wrong URL fails here, with the
    /// URL in the message) and picks `model` (or the first one served).
    pub async fn connect(
        kind: RuntimeKind,
        url: &str,
        model: Option<&str>,
        api_key: Option<String>,
        timeout: Duration,
    ) -> Result<Upstream, DelegateError> {
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| DelegateError::Unreachable {
                url: url.into(),
                detail: e.to_string(),
            })?;
        let mut up = Upstream {
            kind,
            base: normalize_url(url),
            model: String::new(),
            api_key,
            timeout,
            http,
        };
        let listed = up.models().await?;
        up.model = match model {
            Some(m) if listed.iter().any(|x| x == m) => m.to_string(),
            Some(m) => {
                return Err(DelegateError::Rejected {
                    url: up.base.clone(),
                    status: 404,
                    message: format!(
                        "model `{m}` is not served there (it serves: {})",
                        listed.join(", ")
                    ),
                })
            }
            None => listed
                .first()
                .cloned()
                .ok_or_else(|| DelegateError::Protocol {
                    url: up.base.clone(),
                    detail: "GET /v1/models listed no model".into(),
                })?,
        };
        Ok(up)
    }

    /// Whether a server at `url` identifies as llama.cpp's (`GET /props` with its generation
    /// settings); used by `--backend auto`. Any failure means "no".
    pub async fn probe_llama_cpp(url: &str, timeout: Duration) -> bool {
        let Ok(http) = reqwest::Client::builder().timeout(timeout).build() else {
            return false;
        };
        let Ok(r) = http
            .get(format!("{}/props", normalize_url(url)))
            .send()
            .await
        else {
            return false;
        };
        r.status().is_success()
            && r.json::<Value>()
                .await
                .is_ok_and(|v| v.get("default_generation_settings").is_some())
    }

    /// The backend kind.
    pub fn kind(&self) -> RuntimeKind {
        self.kind
    }

    /// The base URL (without `/v1`).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The upstream model id requests go to.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The model ids the upstream serves.
    pub async fn models(&self) -> Result<Vec<String>, DelegateError> {
        let req = self.auth(self.http.get(format!("{}/v1/models", self.base)));
        let v: Value = self.json_of(self.send(req).await?).await?;
        let ids = v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_string))
                    .collect::<Vec<_>>()
            })
            .ok_or_else(|| self.protocol("GET /v1/models has no `data` list"))?;
        Ok(ids)
    }

    /// Refuses what no delegated route can honour, naming the field: token ids (prompt, stop
    /// tokens, logit bias) and log-probabilities need our own vocabulary, several choices are not
    /// supported, `ignore_eos` is passed to llama.cpp only, and of the output formats only the
    /// JSON ones are OpenAI's (tools, `tool_choice` and JSON formats are passed on as they are:
    /// the upstream refuses what it cannot do).
    pub fn check(&self, req: &GenerateRequest) -> Result<(), Rejection> {
        let unsupported = |field, reason: &str| Err(Rejection::unsupported(field, reason));
        if matches!(req.prompt, Prompt::Tokens(_)) {
            return unsupported(
                Field::Prompt,
                "delegated backends have no token-id routes: they take text or messages",
            );
        }
        if req.reasoning_budget.is_some() {
            return unsupported(
                Field::ReasoningBudget,
                "budget_tokens is enforced on native routes only (an OpenAI-compatible upstream \
                 has no such bound)",
            );
        }
        if matches!(
            req.format,
            Some(OutputConstraint::Regex { .. } | OutputConstraint::Grammar { .. })
        ) {
            return unsupported(
                Field::ResponseFormat,
                "delegated backends take JSON formats (json_object, json_schema) only",
            );
        }
        if req.tools.is_some() && !matches!(req.prompt, Prompt::Chat(_)) {
            return unsupported(Field::Tools, "tools go with chat messages");
        }
        if req.n != 1 {
            return unsupported(Field::N, "delegated backends take n = 1");
        }
        if req.logprobs.is_some() {
            return unsupported(
                Field::Logprobs,
                "logprobs are only reported by the native backend",
            );
        }
        if !req.logit_bias.is_empty() {
            return unsupported(
                Field::Sampling(axle_core::SamplingField::LogitBias),
                "logit_bias names token ids, which only the native backend knows",
            );
        }
        if !req.stop_tokens.is_empty() {
            return unsupported(
                Field::StopTokens,
                "stop token ids are only known to the native backend",
            );
        }
        if req.ignore_eos && self.kind != RuntimeKind::LlamaCpp {
            return unsupported(
                Field::IgnoreEos,
                "ignore_eos is passed to llama.cpp servers only",
            );
        }
        Ok(())
    }

    /// The JSON body sent upstream. Sampling fields are renamed for llama.cpp
    /// (`repeat_penalty`); everything unset is left out, so the upstream's defaults apply.
    pub fn body(&self, req: &GenerateRequest, stream: bool) -> Value {
        let mut b = Map::new();
        b.insert("model".into(), json!(self.model));
        match &req.prompt {
            Prompt::Chat(msgs) => {
                let m: Vec<Value> = msgs.iter().map(wire_message).collect();
                b.insert("messages".into(), m.into());
            }
            Prompt::Text(p) => {
                b.insert("prompt".into(), json!(p));
            }
            Prompt::Tokens(t) => {
                b.insert("prompt".into(), json!(t)); // refused by `check` before it gets here
            }
        }
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                b.insert(k.into(), v);
            }
        };
        // llama-server, vLLM and Axle read the template's variables under this name.
        if !req.template_args.is_empty() {
            put("chat_template_kwargs", Some(json!(req.template_args)));
        }
        put("temperature", req.sampling.temperature.map(|x| json!(x)));
        put("top_p", req.sampling.top_p.map(|x| json!(x)));
        put("top_k", req.sampling.top_k.map(|x| json!(x)));
        put("min_p", req.sampling.min_p.map(|x| json!(x)));
        let rep = match self.kind {
            RuntimeKind::LlamaCpp => "repeat_penalty",
            _ => "repetition_penalty",
        };
        put(rep, req.sampling.repetition_penalty.map(|x| json!(x)));
        put(
            "presence_penalty",
            req.sampling.presence_penalty.map(|x| json!(x)),
        );
        put(
            "frequency_penalty",
            req.sampling.frequency_penalty.map(|x| json!(x)),
        );
        put("seed", req.sampling.seed.map(|x| json!(x)));
        put("max_tokens", req.max_tokens.map(|x| json!(x)));
        put(
            "stop",
            (!req.stop.is_empty()).then(|| json!(req.stop.clone())),
        );
        put("ignore_eos", req.ignore_eos.then_some(Value::Bool(true)));
        put(
            "response_format",
            req.format.as_ref().and_then(|f| match f {
                OutputConstraint::JsonObject => Some(json!({"type": "json_object"})),
                OutputConstraint::JsonSchema { schema } => Some(json!({"type": "json_schema",
                    "json_schema": {"name": "response", "schema": schema, "strict": true}})),
                _ => None, // refused by `check`
            }),
        );
        put("tools", req.tools.clone());
        put(
            "tool_choice",
            match &req.tool_choice {
                ToolChoice::Auto => None,
                ToolChoice::None => Some(json!("none")),
                ToolChoice::Required => Some(json!("required")),
                ToolChoice::Function(name) => {
                    Some(json!({"type": "function", "function": {"name": name}}))
                }
            },
        );
        put(
            "parallel_tool_calls",
            (req.tools.is_some() && !req.parallel_tool_calls).then_some(Value::Bool(false)),
        );
        if stream {
            put("stream", Some(json!(true)));
            put("stream_options", Some(json!({"include_usage": true})));
        }
        Value::Object(b)
    }

    fn route(req: &GenerateRequest) -> &'static str {
        match req.prompt {
            Prompt::Chat(_) => "/v1/chat/completions",
            _ => "/v1/completions",
        }
    }

    /// A blocking generation (after [`Upstream::check`]).
    pub async fn complete(&self, req: &GenerateRequest) -> Result<Completion, DelegateError> {
        let v = self.json_of(self.post(req, false).await?).await?;
        let choice = &v["choices"][0];
        let tool_calls = calls_of(&choice["message"]["tool_calls"]);
        let text = match req.prompt {
            Prompt::Chat(_) => choice["message"]["content"]
                .as_str()
                .or_else(|| (!tool_calls.is_empty()).then_some("")),
            _ => choice["text"].as_str(),
        }
        .ok_or_else(|| self.protocol("the response has no choices[0] text"))?;
        Ok(Completion {
            text: text.to_string(),
            reasoning: reasoning_of(&choice["message"])
                .unwrap_or_default()
                .to_string(),
            finish: Finish {
                reason: finish_reason(choice["finish_reason"].as_str()),
                usage: usage(&v["usage"]),
                speculation: Box::default(),
                upstream_reason: choice["finish_reason"].as_str().map(str::to_string),
                tool_calls,
                stop_string: None,
                constraint: Default::default(),
                timing: None,
            },
            ..Completion::empty()
        })
    }

    /// A streaming generation (after [`Upstream::check`]). Each chunk must arrive within the
    /// timeout.
    pub async fn stream(&self, req: &GenerateRequest) -> Result<DelegatedStream, DelegateError> {
        let resp = self.post(req, true).await?;
        Ok(DelegatedStream {
            up: self.clone(),
            resp,
            parser: SseParser::new(matches!(req.prompt, Prompt::Chat(_))),
            finish: None,
            usage: None,
            calls: Default::default(),
            over: false,
        })
    }

    /// Posts `req`'s body to its route, streamed or not.
    async fn post(
        &self,
        req: &GenerateRequest,
        stream: bool,
    ) -> Result<reqwest::Response, DelegateError> {
        let url = format!("{}{}", self.base, Self::route(req));
        let r = self.auth(self.http.post(url).json(&self.body(req, stream)));
        self.send(r).await
    }

    fn auth(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    fn protocol(&self, detail: impl Into<String>) -> DelegateError {
        DelegateError::Protocol {
            url: self.base.clone(),
            detail: detail.into(),
        }
    }

    fn timed_out(&self) -> DelegateError {
        DelegateError::Timeout {
            url: self.base.clone(),
            secs: self.timeout.as_secs_f64(),
        }
    }

    fn transport(&self, e: reqwest::Error) -> DelegateError {
        if e.is_timeout() {
            self.timed_out()
        } else {
            // The source chain carries the useful part ("Connection refused").
            let mut detail = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                detail = format!("{detail}: {s}");
                src = s.source();
            }
            DelegateError::Unreachable {
                url: self.base.clone(),
                detail,
            }
        }
    }

    /// `f` within the upstream timeout, its transport errors mapped to ours.
    async fn timed<T>(
        &self,
        f: impl std::future::Future<Output = reqwest::Result<T>>,
    ) -> Result<T, DelegateError> {
        match tokio::time::timeout(self.timeout, f).await {
            Err(_) => Err(self.timed_out()),
            Ok(r) => r.map_err(|e| self.transport(e)),
        }
    }

    /// Sends with the response-head timeout and maps a non-2xx status to an error of ours.
    async fn send(&self, r: reqwest::RequestBuilder) -> Result<reqwest::Response, DelegateError> {
        let resp = self.timed(r.send()).await?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = tokio::time::timeout(self.timeout, resp.text())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let message = error_message(&text);
        let (url, status) = (self.base.clone(), status.as_u16());
        Err(if (400..500).contains(&status) {
            DelegateError::Rejected {
                url,
                status,
                message,
            }
        } else {
            DelegateError::Failed {
                url,
                status,
                message,
            }
        })
    }

    async fn json_of(&self, resp: reqwest::Response) -> Result<Value, DelegateError> {
        let bytes = self.timed(resp.bytes()).await?;
        serde_json::from_slice(&bytes).map_err(|e| self.protocol(format!("not JSON: {e}")))
    }
}

/// A chat message in OpenAI's wire shape (tool-call arguments as JSON text).
fn wire_message(m: &axle_models::ChatMessage) -> Value {
    let mut v = json!({"role": m.role, "content": m.content});
    if let Some(Value::Array(calls)) = &m.tool_calls {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if let Some(a) = c.pointer_mut("/function/arguments") {
                    if !a.is_string() {
                        *a = Value::String(a.to_string());
                    }
                }
                c
            })
            .collect();
        v["tool_calls"] = Value::Array(calls);
        if m.content.is_empty() {
            v["content"] = Value::Null;
        }
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    if let Some(name) = &m.name {
        v["name"] = json!(name);
    }
    v
}

/// The calls of an OpenAI `tool_calls` list.
fn calls_of(v: &Value) -> Vec<ToolCall> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some(ToolCall {
                name: c["function"]["name"].as_str()?.to_string(),
                arguments: match &c["function"]["arguments"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                },
            })
        })
        .collect()
}

/// The message in an OpenAI-shaped (or llama.cpp-shaped) error body, else the body itself.
fn error_message(body: &str) -> String {
    let v: Option<Value> = serde_json::from_str(body).ok();
    let from_json = v.as_ref().and_then(|v| {
        v["error"]["message"]
            .as_str()
            .or_else(|| v["error"].as_str())
            .or_else(|| v["detail"].as_str())
            .or_else(|| v["message"].as_str())
            .map(str::to_string)
            .or_else(|| v.get("detail").map(Value::to_string))
    });
    from_json.unwrap_or_else(|| {
        let t = body.trim();
        if t.is_empty() {
            "(no message)".into()
        } else {
            t.chars().take(500).collect()
        }
    })
}

/// A delegated stream, as the same events as a native one. Dropping it closes the upstream
/// connection, which cancels the upstream's generation.
#[derive(Debug)]
pub struct DelegatedStream {
    up: Upstream,
    resp: reqwest::Response,
    parser: SseParser,
    /// The finish reason, held until the stream ends (usage may follow it).
    finish: Option<String>,
    usage: Option<Usage>,
    /// Streamed tool calls by index: name and arguments so far.
    calls: std::collections::BTreeMap<u64, (String, String)>,
    over: bool,
}

impl DelegatedStream {
    /// The next event (None after `Done` or `Error`).
    pub async fn next(&mut self) -> Option<StreamEvent> {
        if self.over {
            return None;
        }
        loop {
            match self.chunk().await {
                Some(Ok(Chunk::Text(text))) => {
                    return Some(StreamEvent::Token {
                        token: None,
                        text,
                        reasoning: String::new(),
                        logprob: None,
                    })
                }
                Some(Ok(Chunk::Reasoning(reasoning))) => {
                    return Some(StreamEvent::Token {
                        token: None,
                        text: String::new(),
                        reasoning,
                        logprob: None,
                    })
                }
                Some(Ok(Chunk::Finish(r))) => self.finish = Some(r),
                Some(Ok(Chunk::ToolCall {
                    index,
                    name,
                    arguments,
                })) => {
                    let call = self.calls.entry(index).or_default();
                    // The name comes whole (some upstreams repeat it in every piece).
                    if let Some(n) = name.filter(|_| call.0.is_empty()) {
                        call.0 = n;
                    }
                    call.1.push_str(&arguments);
                }
                Some(Ok(Chunk::Usage(u))) => self.usage = Some(u),
                Some(Err(e)) => {
                    self.over = true;
                    return Some(StreamEvent::Error(e.into()));
                }
                None => {
                    self.over = true;
                    return Some(StreamEvent::Done {
                        text: String::new(),
                        reasoning: String::new(),
                        finish: Finish {
                            reason: finish_reason(self.finish.as_deref()),
                            usage: self.usage.take(),
                            speculation: Box::default(),
                            upstream_reason: self.finish.clone(),
                            tool_calls: std::mem::take(&mut self.calls)
                                .into_values()
                                .map(|(name, arguments)| ToolCall { name, arguments })
                                .collect(),
                            stop_string: None,
                            constraint: Default::default(),
                            timing: None,
                        },
                    });
                }
            }
        }
    }

    /// The next parsed chunk; `None` after `[DONE]` (or the end of the body).
    async fn chunk(&mut self) -> Option<Result<Chunk, DelegateError>> {
        loop {
            match self.parser.next_event(&self.up.base) {
                Some(Ok(c)) => return Some(Ok(c)),
                Some(Err(e)) => return Some(Err(e)),
                None if self.parser.done => return None,
                None => {}
            }
            match self.up.timed(self.resp.chunk()).await {
                Err(e) => {
                    self.parser.done = true;
                    return Some(Err(e));
                }
                Ok(None) => self.parser.finish(&self.up.base),
                Ok(Some(bytes)) => self.parser.buf.extend_from_slice(&bytes),
            }
        }
    }
}

/// Turns an OpenAI-style SSE body, fed in arbitrary pieces, into chunks.
#[derive(Debug, Default)]
struct SseParser {
    chat: bool,
    buf: Vec<u8>,
    pending: std::collections::VecDeque<Result<Chunk, DelegateError>>,
    done: bool,
    ended: bool,
}

impl SseParser {
    fn new(chat: bool) -> SseParser {
        SseParser {
            chat,
            ..Default::default()
        }
    }

    /// The next parsed event from what has arrived; `None` when more bytes are needed (or the
    /// stream is over: check `done`).
    fn next_event(&mut self, url: &str) -> Option<Result<Chunk, DelegateError>> {
        loop {
            if let Some(c) = self.pending.pop_front() {
                if c.is_err() {
                    self.done = true;
                    self.pending.clear();
                }
                return Some(c);
            }
            if self.done {
                return None;
            }
            let pos = self.buf.iter().position(|&b| b == b'\n')?;
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            self.line(String::from_utf8_lossy(&line).trim_end(), url);
        }
    }

    /// The body ended: parse what is left; a stream that ends without `[DONE]` or a finish
    /// reason was cut off.
    fn finish(&mut self, url: &str) {
        let rest = std::mem::take(&mut self.buf);
        self.line(String::from_utf8_lossy(&rest).trim_end(), url);
        if !self.done && !self.ended {
            self.pending.push_back(Err(DelegateError::Protocol {
                url: url.into(),
                detail: "the stream ended before a finish reason".into(),
            }));
        }
        self.done = true;
    }

    /// Parses one SSE line into pending events.
    fn line(&mut self, line: &str, url: &str) {
        let Some(data) = line.strip_prefix("data:") else {
            return; // comments, `event:` lines and blank separators
        };
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return;
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                self.pending.push_back(Err(DelegateError::Protocol {
                    url: url.into(),
                    detail: format!("stream chunk is not JSON: {e}"),
                }));
                return;
            }
        };
        if let Some(err) = v.get("error") {
            let message = err["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| err.to_string());
            self.pending.push_back(Err(DelegateError::Failed {
                url: url.into(),
                status: 0,
                message,
            }));
            return;
        }
        if let Some(choice) = v["choices"].get(0) {
            let text = if self.chat {
                choice["delta"]["content"].as_str()
            } else {
                choice["text"].as_str()
            };
            let thinking = if self.chat {
                reasoning_of(&choice["delta"])
            } else {
                None
            };
            if let Some(t) = thinking.filter(|t| !t.is_empty()) {
                self.pending.push_back(Ok(Chunk::Reasoning(t.to_string())));
            }
            if let Some(t) = text.filter(|t| !t.is_empty()) {
                self.pending.push_back(Ok(Chunk::Text(t.to_string())));
            }
            for (k, c) in choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                self.pending.push_back(Ok(Chunk::ToolCall {
                    index: c["index"].as_u64().unwrap_or(k as u64),
                    name: c["function"]["name"].as_str().map(str::to_string),
                    arguments: c["function"]["arguments"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                }));
            }
            if let Some(r) = choice["finish_reason"].as_str() {
                self.ended = true;
                self.pending.push_back(Ok(Chunk::Finish(r.to_string())));
            }
        }
        if let Some(u) = usage(&v["usage"]) {
            self.pending.push_back(Ok(Chunk::Usage(u)));
        }
    }
}

#[cfg(test)]
mod tests;
