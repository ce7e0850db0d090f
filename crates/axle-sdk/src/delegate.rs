//! Delegated generation: text and chat requests sent to a server the user runs (llama.cpp's
//! server or any OpenAI-compatible one), blocking and streaming, with the sampling fields mapped
//! to what that kind of server reads and its failures turned into errors of ours.
//!
//! There is no token-id route here: a delegated model's vocabulary is the upstream's business.
use crate::backend::BackendKind;
use axle_models::ChatMessage;
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

/// What to generate from.
#[derive(Clone, Debug)]
pub enum DelegatedInput {
    /// Chat messages (the upstream applies its template).
    Chat(Vec<ChatMessage>),
    /// A plain prompt.
    Text(String),
}

/// A delegated request. Unset fields are not sent, so the upstream's own defaults apply.
#[derive(Clone, Debug, Default)]
pub struct DelegatedRequest {
    /// Temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k.
    pub top_k: Option<usize>,
    /// Min-p.
    pub min_p: Option<f32>,
    /// Multiplicative repetition penalty (llama.cpp calls it `repeat_penalty`).
    pub repetition_penalty: Option<f32>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// RNG seed.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<usize>,
}

/// One finished delegated generation.
#[derive(Clone, Debug, PartialEq)]
pub struct DelegatedCompletion {
    /// The generated text.
    pub text: String,
    /// OpenAI's finish reason as the upstream gave it.
    pub finish_reason: Option<String>,
    /// Prompt tokens (the upstream's count), when reported.
    pub prompt_tokens: Option<u64>,
    /// Generated tokens (the upstream's count), when reported.
    pub completion_tokens: Option<u64>,
}

/// One event of a delegated stream.
#[derive(Clone, Debug, PartialEq)]
pub enum DelegatedChunk {
    /// Generated text.
    Text(String),
    /// The choice finished.
    Finish(String),
    /// Token counts (when the upstream sends them).
    Usage {
        /// Prompt tokens.
        prompt_tokens: u64,
        /// Generated tokens.
        completion_tokens: u64,
    },
}

/// A connection to one upstream server and one of its models.
#[derive(Clone, Debug)]
pub struct Upstream {
    kind: BackendKind,
    base: String,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
    http: reqwest::Client,
}

/// `http://h:p/v1/` and `http://h:p` name the same server.
pub fn normalize_url(url: &str) -> String {
    let u = url.trim().trim_end_matches('/');
    u.strip_suffix("/v1").unwrap_or(u).to_string()
}

impl Upstream {
    /// Connects: lists the upstream's models (so an unreachable or wrong URL fails here, with the
    /// URL in the message) and picks `model` (or the first one served).
    pub async fn connect(
        kind: BackendKind,
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
    pub fn kind(&self) -> BackendKind {
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

    /// The JSON body sent upstream. Sampling fields are renamed for llama.cpp
    /// (`repeat_penalty`); everything unset is left out.
    pub fn body(&self, input: &DelegatedInput, req: &DelegatedRequest, stream: bool) -> Value {
        let mut b = Map::new();
        b.insert("model".into(), json!(self.model));
        match input {
            DelegatedInput::Chat(msgs) => {
                let m: Vec<Value> = msgs
                    .iter()
                    .map(|m| json!({"role": m.role, "content": m.content}))
                    .collect();
                b.insert("messages".into(), m.into());
            }
            DelegatedInput::Text(p) => {
                b.insert("prompt".into(), json!(p));
            }
        }
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                b.insert(k.into(), v);
            }
        };
        put("temperature", req.temperature.map(|x| json!(x)));
        put("top_p", req.top_p.map(|x| json!(x)));
        put("top_k", req.top_k.map(|x| json!(x)));
        put("min_p", req.min_p.map(|x| json!(x)));
        let rep = match self.kind {
            BackendKind::LlamaCpp => "repeat_penalty",
            _ => "repetition_penalty",
        };
        put(rep, req.repetition_penalty.map(|x| json!(x)));
        put("presence_penalty", req.presence_penalty.map(|x| json!(x)));
        put("frequency_penalty", req.frequency_penalty.map(|x| json!(x)));
        put("seed", req.seed.map(|x| json!(x)));
        put("max_tokens", req.max_tokens.map(|x| json!(x)));
        put(
            "stop",
            (!req.stop.is_empty()).then(|| json!(req.stop.clone())),
        );
        if stream {
            put("stream", Some(json!(true)));
            put("stream_options", Some(json!({"include_usage": true})));
        }
        Value::Object(b)
    }

    fn route(input: &DelegatedInput) -> &'static str {
        match input {
            DelegatedInput::Chat(_) => "/v1/chat/completions",
            DelegatedInput::Text(_) => "/v1/completions",
        }
    }

    /// A blocking generation.
    pub async fn complete(
        &self,
        input: &DelegatedInput,
        req: &DelegatedRequest,
    ) -> Result<DelegatedCompletion, DelegateError> {
        let body = self.body(input, req, false);
        let r = self.auth(
            self.http
                .post(format!("{}{}", self.base, Self::route(input)))
                .json(&body),
        );
        let v = self.json_of(self.send(r).await?).await?;
        let choice = &v["choices"][0];
        let text = match input {
            DelegatedInput::Chat(_) => choice["message"]["content"].as_str(),
            DelegatedInput::Text(_) => choice["text"].as_str(),
        }
        .ok_or_else(|| self.protocol("the response has no choices[0] text"))?;
        Ok(DelegatedCompletion {
            text: text.to_string(),
            finish_reason: choice["finish_reason"].as_str().map(str::to_string),
            prompt_tokens: v["usage"]["prompt_tokens"].as_u64(),
            completion_tokens: v["usage"]["completion_tokens"].as_u64(),
        })
    }

    /// A streaming generation. Each chunk must arrive within the timeout.
    pub async fn stream(
        &self,
        input: &DelegatedInput,
        req: &DelegatedRequest,
    ) -> Result<DelegatedStream, DelegateError> {
        let body = self.body(input, req, true);
        let r = self.auth(
            self.http
                .post(format!("{}{}", self.base, Self::route(input)))
                .json(&body),
        );
        let resp = self.send(r).await?;
        Ok(DelegatedStream {
            up: self.clone(),
            resp,
            parser: SseParser::new(matches!(input, DelegatedInput::Chat(_))),
        })
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

    fn transport(&self, e: reqwest::Error) -> DelegateError {
        if e.is_timeout() {
            DelegateError::Timeout {
                url: self.base.clone(),
                secs: self.timeout.as_secs_f64(),
            }
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

    /// Sends with the response-head timeout and maps a non-2xx status to an error of ours.
    async fn send(&self, r: reqwest::RequestBuilder) -> Result<reqwest::Response, DelegateError> {
        let resp = match tokio::time::timeout(self.timeout, r.send()).await {
            Err(_) => {
                return Err(DelegateError::Timeout {
                    url: self.base.clone(),
                    secs: self.timeout.as_secs_f64(),
                })
            }
            Ok(r) => r.map_err(|e| self.transport(e))?,
        };
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
        let bytes = match tokio::time::timeout(self.timeout, resp.bytes()).await {
            Err(_) => {
                return Err(DelegateError::Timeout {
                    url: self.base.clone(),
                    secs: self.timeout.as_secs_f64(),
                })
            }
            Ok(b) => b.map_err(|e| self.transport(e))?,
        };
        serde_json::from_slice(&bytes).map_err(|e| self.protocol(format!("not JSON: {e}")))
    }
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

/// A delegated stream of chunks. Dropping it closes the upstream connection, which cancels the
/// upstream's generation.
pub struct DelegatedStream {
    up: Upstream,
    resp: reqwest::Response,
    parser: SseParser,
}

impl DelegatedStream {
    /// The next chunk; `None` after `[DONE]` (or the end of the body).
    pub async fn next(&mut self) -> Option<Result<DelegatedChunk, DelegateError>> {
        loop {
            match self.parser.next_event(&self.up.base) {
                Some(Ok(c)) => return Some(Ok(c)),
                Some(Err(e)) => return Some(Err(e)),
                None if self.parser.done => return None,
                None => {}
            }
            match tokio::time::timeout(self.up.timeout, self.resp.chunk()).await {
                Err(_) => {
                    self.parser.done = true;
                    return Some(Err(DelegateError::Timeout {
                        url: self.up.base.clone(),
                        secs: self.up.timeout.as_secs_f64(),
                    }));
                }
                Ok(Err(e)) => {
                    self.parser.done = true;
                    return Some(Err(self.up.transport(e)));
                }
                Ok(Ok(None)) => self.parser.finish(&self.up.base),
                Ok(Ok(Some(bytes))) => self.parser.buf.extend_from_slice(&bytes),
            }
        }
    }
}

/// Turns an OpenAI-style SSE body, fed in arbitrary pieces, into chunks.
#[derive(Default)]
struct SseParser {
    chat: bool,
    buf: Vec<u8>,
    pending: std::collections::VecDeque<Result<DelegatedChunk, DelegateError>>,
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
    fn next_event(&mut self, url: &str) -> Option<Result<DelegatedChunk, DelegateError>> {
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
            if let Some(t) = text.filter(|t| !t.is_empty()) {
                self.pending
                    .push_back(Ok(DelegatedChunk::Text(t.to_string())));
            }
            if let Some(r) = choice["finish_reason"].as_str() {
                self.ended = true;
                self.pending
                    .push_back(Ok(DelegatedChunk::Finish(r.to_string())));
            }
        }
        if let (Some(p), Some(c)) = (
            v["usage"]["prompt_tokens"].as_u64(),
            v["usage"]["completion_tokens"].as_u64(),
        ) {
            self.pending.push_back(Ok(DelegatedChunk::Usage {
                prompt_tokens: p,
                completion_tokens: c,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(kind: BackendKind) -> Upstream {
        Upstream {
            kind,
            base: "http://x".into(),
            model: "m".into(),
            api_key: None,
            timeout: Duration::from_secs(1),
            http: reqwest::Client::new(),
        }
    }

    #[test]
    fn urls_normalize() {
        assert_eq!(normalize_url("http://h:1/v1/"), "http://h:1");
        assert_eq!(normalize_url("http://h:1"), "http://h:1");
        assert_eq!(normalize_url(" http://h:1/ "), "http://h:1");
    }

    #[test]
    fn sampling_fields_are_passed_through_and_renamed_for_llama_cpp() {
        let req = DelegatedRequest {
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_k: Some(40),
            min_p: Some(0.05),
            repetition_penalty: Some(1.1),
            seed: Some(7),
            stop: vec!["\n".into()],
            max_tokens: Some(16),
            ..Default::default()
        };
        let input = DelegatedInput::Text("hi".into());
        let b = upstream(BackendKind::LlamaCpp).body(&input, &req, true);
        assert_eq!(b["repeat_penalty"], json!(1.1f32));
        assert!(b.get("repetition_penalty").is_none());
        assert_eq!(b["top_k"], 40);
        assert_eq!(b["min_p"], json!(0.05f32));
        assert_eq!(b["seed"], 7);
        assert_eq!(b["stop"], json!(["\n"]));
        assert_eq!(b["max_tokens"], 16);
        assert_eq!(b["prompt"], "hi");
        assert_eq!(b["stream"], true);
        let b = upstream(BackendKind::OpenaiCompatible).body(&input, &req, false);
        assert_eq!(b["repetition_penalty"], json!(1.1f32));
        assert!(b.get("repeat_penalty").is_none() && b.get("stream").is_none());
        // Unset fields are left to the upstream's defaults.
        let b = upstream(BackendKind::OpenaiCompatible).body(
            &DelegatedInput::Chat(vec![ChatMessage::new("user", "q")]),
            &DelegatedRequest::default(),
            false,
        );
        assert_eq!(
            b,
            json!({"model": "m", "messages": [{"role": "user", "content": "q"}]})
        );
    }

    fn drain(p: &mut SseParser) -> Vec<Result<DelegatedChunk, String>> {
        std::iter::from_fn(|| p.next_event("u"))
            .map(|r| r.map_err(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn sse_in_arbitrary_pieces() {
        let body = concat!(
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        );
        for piece in [1, 7, body.len()] {
            let mut p = SseParser::new(true);
            let mut got = Vec::new();
            for part in body.as_bytes().chunks(piece) {
                p.buf.extend_from_slice(part);
                got.extend(drain(&mut p));
            }
            assert!(p.done);
            assert_eq!(
                got,
                vec![
                    Ok(DelegatedChunk::Text("Hel".into())),
                    Ok(DelegatedChunk::Text("lo".into())),
                    Ok(DelegatedChunk::Finish("stop".into())),
                    Ok(DelegatedChunk::Usage {
                        prompt_tokens: 3,
                        completion_tokens: 2
                    }),
                ]
            );
        }
    }

    #[test]
    fn sse_errors_and_cut_off_streams() {
        let mut p = SseParser::new(false);
        p.buf.extend_from_slice(
            b"data: {\"choices\":[{\"text\":\"a\"}]}\ndata: {\"error\":{\"message\":\"boom\"}}\n",
        );
        let got = drain(&mut p);
        assert_eq!(got[0], Ok(DelegatedChunk::Text("a".into())));
        assert!(got[1].as_ref().unwrap_err().contains("boom"));
        assert!(p.done);
        let mut p = SseParser::new(false);
        p.buf
            .extend_from_slice(b"data: {\"choices\":[{\"text\":\"a\"}]}\n");
        assert_eq!(drain(&mut p).len(), 1);
        p.finish("u");
        assert!(drain(&mut p)[0]
            .as_ref()
            .unwrap_err()
            .contains("ended before"));
    }

    #[test]
    fn error_bodies_yield_their_message() {
        assert_eq!(
            error_message(r#"{"error":{"message":"too long","type":"x"}}"#),
            "too long"
        );
        assert_eq!(error_message(r#"{"detail":"bad"}"#), "bad");
        assert_eq!(error_message("plain words"), "plain words");
        assert_eq!(error_message(""), "(no message)");
    }
}
