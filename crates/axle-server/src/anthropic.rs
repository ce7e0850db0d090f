//! Anthropic's Messages API shapes (`POST /v1/messages`, `/v1/messages/count_tokens`) as typed
//! serde structs, and the conversion of a request body into the SDK's [`GenerateRequest`]: the
//! system prompt and content blocks become chat messages, `tool_use` and `tool_result` blocks
//! become the assistant's calls and `tool` messages, tools and `tool_choice` map onto the same
//! tool machinery as chat completions. What the route cannot honour is refused by name.
use crate::openai::{chat_tool, template_call, WireError};
use axle_models::ChatMessage;
use axle_sdk::{
    Field, GenerateRequest, OutputConstraint, Prompt, Rejection, SamplingOptions, ToolChoice,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Fields accepted and deliberately not acted on: request metadata, routing and caching hints
/// (Axle caches every prompt's prefix).
const IGNORED_FIELDS: [&str; 7] = [
    "metadata",
    "service_tier",
    "container",
    "cache_control",
    "inference_geo",
    "user_profile_id",
    "workspace_id",
];

/// `POST /v1/messages` (and, without `max_tokens` and `stream`, `/v1/messages/count_tokens`).
#[derive(Debug, Deserialize, Serialize)]
pub struct MessagesRequest {
    /// The model name (must be the served one, or empty).
    pub model: Option<String>,
    /// The conversation: alternating `user` and `assistant` turns.
    pub messages: Vec<InputMessage>,
    /// The system prompt: text, or text blocks.
    pub system: Option<Content>,
    /// Most tokens to generate.
    pub max_tokens: Option<usize>,
    /// Strings that end the answer (not part of it).
    pub stop_sequences: Option<Vec<String>>,
    /// Sampling temperature, in [0, 1].
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens.
    pub top_k: Option<usize>,
    /// Stream as server-sent events.
    pub stream: Option<bool>,
    /// Tools: `{name, description, input_schema}`.
    pub tools: Option<Vec<ToolDef>>,
    /// `{type: auto|any|tool|none, name, disable_parallel_tool_use}`.
    pub tool_choice: Option<Value>,
    /// Extended thinking: `{"type": "enabled"|"adaptive"|"disabled"}`, passed to the template as
    /// `enable_thinking`; `enabled` takes `budget_tokens`, the most tokens of thinking (the
    /// closing marker is forced there).
    pub thinking: Option<Value>,
    /// `{"format": {"type": "json_schema", "schema": {...}}}`: the answer follows the schema
    /// (Axle also takes `{"type": "regex", "regex"}` and `{"type": "grammar", "grammar"}`).
    pub output_config: Option<Value>,
    /// Every other field: refused by name unless it is metadata or null.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A message of the conversation.
#[derive(Debug, Deserialize, Serialize)]
pub struct InputMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// Text, or content blocks.
    pub content: Content,
}

/// Content: a string, or a list of blocks.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Blocks (`text`, `tool_use`, `tool_result`, `thinking`...).
    Blocks(Vec<Value>),
}

/// A tool the model may call.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ToolDef {
    /// The function's name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// A JSON schema of its input (an object).
    pub input_schema: Option<Value>,
    /// Server tools (`web_search_20250305`, ...) have a type; custom tools have none or
    /// `custom`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Prompt-caching hints and the like: accepted, not acted on.
    pub cache_control: Option<Value>,
}

fn invalid(field: Field, reason: impl Into<String>) -> WireError {
    WireError::Rejected(Rejection::invalid(field, reason))
}

fn unsupported(field: &'static str, reason: impl Into<String>) -> WireError {
    WireError::Unsupported {
        field,
        reason: reason.into(),
    }
}

/// The text of text blocks (`what` names the place, for errors).
fn block_text(blocks: &[Value], what: &str) -> Result<String, WireError> {
    let mut s = String::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => s.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some(t) => {
                return Err(invalid(
                    Field::Prompt,
                    format!("{what}: content block type `{t}` is not supported here"),
                ))
            }
            None => {
                return Err(invalid(
                    Field::Prompt,
                    format!("{what}: a block has no type"),
                ))
            }
        }
    }
    Ok(s)
}

impl MessagesRequest {
    /// Whether the response streams.
    pub fn streams(&self) -> bool {
        self.stream == Some(true)
    }

    /// Whether thinking was asked for (`enabled` or `adaptive`): the model's thinking, where its
    /// template marks it, comes back as `thinking` blocks; otherwise it is left out.
    pub fn thinks(&self) -> bool {
        matches!(
            self.thinking
                .as_ref()
                .and_then(|t| t.get("type"))
                .and_then(Value::as_str),
            Some("enabled" | "adaptive")
        )
    }

    /// The chat messages of the system prompt and the conversation.
    fn chat_messages(&self) -> Result<Vec<ChatMessage>, WireError> {
        let mut msgs = Vec::with_capacity(self.messages.len() + 1);
        match &self.system {
            None => {}
            Some(Content::Text(t)) => msgs.push(ChatMessage::new("system", t)),
            Some(Content::Blocks(b)) => {
                msgs.push(ChatMessage::new("system", &block_text(b, "system")?))
            }
        }
        if self.messages.is_empty() {
            return Err(invalid(Field::Prompt, "at least one message is needed"));
        }
        for (i, m) in self.messages.iter().enumerate() {
            if m.role != "user" && m.role != "assistant" {
                return Err(invalid(
                    Field::Prompt,
                    format!(
                        "messages[{i}]: role `{}` (only `user` and `assistant`; the system prompt \
                         is the top-level `system`)",
                        m.role
                    ),
                ));
            }
            let blocks = match &m.content {
                Content::Text(t) => {
                    msgs.push(ChatMessage::new(&m.role, t));
                    continue;
                }
                Content::Blocks(b) => b,
            };
            let mut text = String::new();
            let mut calls = Vec::new();
            for (j, b) in blocks.iter().enumerate() {
                let at = format!("messages[{i}].content[{j}]");
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        text.push_str(b.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    // Earlier turns' thinking is not shown to the model again.
                    Some("thinking" | "redacted_thinking") if m.role == "assistant" => {}
                    Some("tool_use") if m.role == "assistant" => {
                        let name = b.get("name").and_then(Value::as_str).ok_or_else(|| {
                            invalid(
                                Field::Prompt,
                                format!("{at}: a tool_use block needs a name"),
                            )
                        })?;
                        calls.push(template_call(
                            b.get("id").cloned().unwrap_or(Value::Null),
                            name,
                            b.get("input").cloned().unwrap_or(json!({})),
                        ));
                    }
                    Some("tool_result") if m.role == "user" => {
                        // Text before a result is its own user turn.
                        if !text.is_empty() {
                            msgs.push(ChatMessage::new("user", &std::mem::take(&mut text)));
                        }
                        let content = match b.get("content") {
                            None | Some(Value::Null) => String::new(),
                            Some(Value::String(s)) => s.clone(),
                            Some(Value::Array(parts)) => block_text(parts, &at)?,
                            Some(_) => {
                                return Err(invalid(
                                    Field::Prompt,
                                    format!("{at}: content must be text or text blocks"),
                                ))
                            }
                        };
                        let mut msg = ChatMessage::new("tool", &content);
                        msg.tool_call_id = b
                            .get("tool_use_id")
                            .and_then(Value::as_str)
                            .map(str::to_string);
                        msgs.push(msg);
                    }
                    Some(t) => {
                        return Err(invalid(
                            Field::Prompt,
                            format!(
                                "{at}: content block type `{t}` is not supported in a {} message",
                                m.role
                            ),
                        ))
                    }
                    None => {
                        return Err(invalid(Field::Prompt, format!("{at}: a block has no type")))
                    }
                }
            }
            if !text.is_empty() || !calls.is_empty() || m.role == "assistant" {
                let mut msg = ChatMessage::new(&m.role, &text);
                if !calls.is_empty() {
                    msg.tool_calls = Some(Value::Array(calls));
                }
                msgs.push(msg);
            }
        }
        Ok(msgs)
    }

    /// The tools in OpenAI's shape, which the SDK takes.
    fn openai_tools(&self) -> Result<Option<Value>, WireError> {
        let Some(tools) = &self.tools else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(tools.len());
        for t in tools {
            if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
                return Err(unsupported(
                    "tools",
                    format!(
                        "server tool `{kind}` ({}): only custom tools run here",
                        t.name
                    ),
                ));
            }
            let description = json!(t.description.clone().unwrap_or_default());
            out.push(chat_tool(&t.name, description, t.input_schema.clone()));
        }
        Ok(Some(Value::Array(out)))
    }

    /// The SDK request.
    pub fn to_request(&self) -> Result<GenerateRequest, WireError> {
        crate::openai::refuse_unknown(&self.other, &IGNORED_FIELDS)?;
        match self.thinking.as_ref().and_then(|t| t.get("type")) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if matches!(s.as_str(), "disabled" | "enabled" | "adaptive") => {
            }
            Some(t) => {
                return Err(unsupported(
                    "thinking",
                    format!("type {t} (\"enabled\", \"adaptive\" or \"disabled\")"),
                ))
            }
        }
        let budget = match self.thinking.as_ref() {
            Some(t) if t.get("type") == Some(&Value::String("enabled".into())) => {
                match t.get("budget_tokens") {
                    None | Some(Value::Null) => None,
                    Some(v) => match v.as_u64() {
                        Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
                        _ => {
                            return Err(invalid(
                                Field::ReasoningBudget,
                                format!("budget_tokens must be a positive integer, got {v}"),
                            ))
                        }
                    },
                }
            }
            _ => None,
        };
        if self.temperature.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
            return Err(invalid(
                Field::Sampling(axle_sdk::SamplingField::Temperature),
                "must be in [0, 1]",
            ));
        }
        let mut req = GenerateRequest::new(Prompt::Chat(self.chat_messages()?));
        req.max_tokens = self.max_tokens;
        req.reasoning_budget = budget;
        req.sampling = SamplingOptions {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            ..SamplingOptions::default()
        };
        req.stop = self.stop_sequences.clone().unwrap_or_default();
        req.tools = self.openai_tools()?;
        let (choice, parallel) = tool_choice(self.tool_choice.as_ref())?;
        req.tool_choice = choice;
        req.parallel_tool_calls = parallel;
        req.format = self.output_format()?;
        // Thinking on or off reaches templates that read `enable_thinking` (Qwen-style).
        if let Some(kind) = self.thinking.as_ref().and_then(|t| t.get("type")) {
            req.template_args.insert(
                "enable_thinking".into(),
                Value::Bool(kind.as_str() != Some("disabled")),
            );
        }
        // The effort reaches templates that read `reasoning_effort` (gpt-oss's).
        if let Some(effort) = self.effort()? {
            req.template_args
                .insert("reasoning_effort".into(), Value::String(effort.into()));
        }
        Ok(req)
    }

    /// `output_config.effort`: `low`, `medium` or `high`.
    fn effort(&self) -> Result<Option<&str>, WireError> {
        match self.output_config.as_ref().and_then(|c| c.get("effort")) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(e)) if matches!(e.as_str(), "low" | "medium" | "high") => {
                Ok(Some(e.as_str()))
            }
            Some(e) => Err(unsupported(
                "output_config",
                format!("effort {e}: one of low, medium, high"),
            )),
        }
    }

    /// `output_config.format`: a JSON schema the answer follows.
    fn output_format(&self) -> Result<Option<OutputConstraint>, WireError> {
        let Some(cfg) = self.output_config.as_ref().filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let Some(obj) = cfg.as_object() else {
            return Err(invalid(Field::ResponseFormat, "must be an object"));
        };
        if let Some(k) = obj
            .keys()
            .find(|k| !matches!(k.as_str(), "format" | "effort"))
        {
            return Err(unsupported(
                "output_config",
                format!("`{k}` is not supported (only `format` and `effort`)"),
            ));
        }
        match obj.get("format") {
            None | Some(Value::Null) => Ok(None),
            Some(f) if f.get("type").and_then(Value::as_str) == Some("json_schema") => {
                match f.get("schema") {
                    Some(schema) if schema.is_object() => Ok(Some(OutputConstraint::JsonSchema {
                        schema: schema.clone(),
                    })),
                    _ => Err(invalid(
                        Field::ResponseFormat,
                        "format.schema must be a JSON schema object",
                    )),
                }
            }
            // Axle's extensions, as on the OpenAI routes: a pattern or a Lark grammar.
            Some(f) if f.get("type").and_then(Value::as_str) == Some("regex") => {
                match f.get("regex").and_then(Value::as_str) {
                    Some(p) => Ok(Some(OutputConstraint::Regex {
                        pattern: p.to_string(),
                    })),
                    None => Err(invalid(Field::ResponseFormat, "format.regex must be text")),
                }
            }
            Some(f) if f.get("type").and_then(Value::as_str) == Some("grammar") => {
                match f.get("grammar").and_then(Value::as_str) {
                    Some(g) => Ok(Some(OutputConstraint::Grammar {
                        lark: g.to_string(),
                    })),
                    None => Err(invalid(
                        Field::ResponseFormat,
                        "format.grammar must be text",
                    )),
                }
            }
            Some(f) => Err(invalid(
                Field::ResponseFormat,
                format!("format {f}: json_schema (or Axle's regex and grammar)"),
            )),
        }
    }
}

/// `tool_choice` and whether several calls may be made.
fn tool_choice(v: Option<&Value>) -> Result<(ToolChoice, bool), WireError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok((ToolChoice::Auto, true));
    };
    let parallel = !v
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let choice = match v.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("none") => ToolChoice::None,
        Some("any") => ToolChoice::Required,
        Some("tool") => match v.get("name").and_then(Value::as_str) {
            Some(name) => ToolChoice::Function(name.to_string()),
            None => return Err(invalid(Field::ToolChoice, "type `tool` needs a `name`")),
        },
        _ => {
            return Err(invalid(
                Field::ToolChoice,
                format!("must be {{\"type\": \"auto\"|\"any\"|\"tool\"|\"none\"}}, not {v}"),
            ))
        }
    };
    Ok((choice, parallel))
}

/// The wire name of an SDK field on this route.
pub fn param(field: Field) -> &'static str {
    match field {
        Field::Prompt => "messages",
        Field::Stop => "stop_sequences",
        Field::ResponseFormat => "output_config",
        f => f.name(),
    }
}

// ---------------------------------------------------------------------------------------------
// Responses

/// Token counts.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// Generated tokens.
    pub output_tokens: usize,
    /// Prompt tokens read from the prefix cache.
    pub cache_read_input_tokens: usize,
    /// Prompt tokens written to the cache (Axle caches every prompt; not counted apart).
    pub cache_creation_input_tokens: usize,
}

/// A message, as a blocking response returns it and `message_start` opens it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Message {
    /// `msg_...`.
    pub id: String,
    /// `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `assistant`.
    pub role: String,
    /// The served model.
    pub model: String,
    /// Text and `tool_use` blocks.
    pub content: Vec<Value>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use` (null while streaming).
    pub stop_reason: Option<String>,
    /// The stop sequence that ended the answer, where known.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: Usage,
}

/// `POST /v1/messages/count_tokens`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenCount {
    /// Tokens of the rendered prompt.
    pub input_tokens: usize,
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// `error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The error itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `not_found_error`,
    /// `request_too_large`, `overloaded_error`, `api_error`...
    #[serde(rename = "type")]
    pub kind: String,
    /// The message, starting with the field at fault where there is one.
    pub message: String,
    /// The field at fault (Axle's addition; Anthropic's own errors name it in the message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> Result<GenerateRequest, WireError> {
        serde_json::from_value::<MessagesRequest>(v)
            .expect("parses")
            .to_request()
    }

    #[test]
    fn blocks_tools_and_choices_map_onto_the_request() {
        let r = req(json!({
        "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "be brief"}],
        "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5,
        "tools": [{"name": "get", "description": "d",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}],
        "tool_choice": {"type": "tool", "name": "get", "disable_parallel_tool_use": true},
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "x"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"q": "a"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "42"}]},
                {"type": "text", "text": "and?"}]},
        ]}))
        .expect("maps");
        let Prompt::Chat(m) = &r.prompt else {
            panic!("chat prompt")
        };
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(m[0].content, "be brief");
        assert_eq!(m[2].content, "calling");
        let calls = m[2].tool_calls.as_ref().expect("calls");
        assert_eq!(calls[0]["function"]["arguments"], json!({"q": "a"}));
        assert_eq!(m[3].content, "42");
        assert_eq!(m[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(r.tool_choice, ToolChoice::Function("get".into()));
        assert!(!r.parallel_tool_calls);
        assert_eq!(r.stop, ["END"]);
        assert_eq!(r.max_tokens, Some(64));
        assert_eq!(r.sampling.top_k, Some(5));
        let tools = r.tools.expect("tools");
        assert_eq!(
            tools[0]["function"]["parameters"]["properties"]["q"]["type"],
            "string"
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let base = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            req(b).expect_err("refused")
        };
        let field = |e: WireError| match e {
            WireError::Rejected(r) => param(r.field()).to_string(),
            WireError::Unsupported { field, .. } => field.to_string(),
            WireError::Unknown(name) => name,
        };
        assert_eq!(
            field(with("thinking", json!({"type": "sometimes"}))),
            "thinking"
        );
        for bad in [json!(0), json!(-3), json!(2.5), json!("many")] {
            let t = json!({"type": "enabled", "budget_tokens": bad});
            assert_eq!(field(with("thinking", t)), "thinking");
        }
        let mut ok = base.clone();
        ok["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
        assert_eq!(req(ok.clone()).expect("taken").reasoning_budget, Some(1024));
        ok["thinking"] = json!({"type": "disabled", "budget_tokens": 0});
        assert_eq!(req(ok.clone()).expect("taken").reasoning_budget, None);
        ok["output_config"] = json!({"effort": "low"});
        let r = req(ok.clone()).expect("taken");
        assert_eq!(r.template_args.get("reasoning_effort"), Some(&json!("low")));
        ok["output_config"] = json!({"effort": "extreme"});
        assert_eq!(field(req(ok).expect_err("refused")), "output_config");
        assert_eq!(field(with("temperature", json!(1.5))), "temperature");
        assert_eq!(
            field(with("tool_choice", json!({"type": "tool"}))),
            "tool_choice"
        );
        assert_eq!(field(with("frobnicate", json!(1))), "frobnicate");
        let server_tool = json!([{"type": "web_search_20250305", "name": "web_search"}]);
        assert_eq!(field(with("tools", server_tool)), "tools");
        let image = json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]);
        assert_eq!(field(with("messages", image)), "messages");
        let role = json!([{"role": "system", "content": "x"}]);
        assert_eq!(field(with("messages", role)), "messages");
        assert_eq!(field(with("messages", json!([]))), "messages");
        let fmt = json!({"format": {"type": "json_schema", "schema": 3}});
        assert_eq!(field(with("output_config", fmt)), "output_config");
        // Metadata is accepted and ignored.
        let mut ok = base.clone();
        ok["metadata"] = json!({"user_id": "u"});
        req(ok).expect("metadata ignored");
    }
}
