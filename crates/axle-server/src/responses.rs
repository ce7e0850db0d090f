//! OpenAI's Responses API shapes (`POST /v1/responses`) as typed serde structs, the conversion
//! of a request body into the SDK's [`GenerateRequest`], and the bounded store behind `store`
//! and `previous_response_id`: a stored response keeps its conversation (input and output, as
//! chat messages), so a follow-up renders the same prefix and the prefix cache reuses its KV.
use crate::openai::{call_arguments, chat_tool, template_call, WireError};
use axle_models::{ChatMessage, TemplateVars};
use axle_sdk::{
    Field, GenerateRequest, OutputConstraint, Prompt, Rejection, SamplingField, SamplingOptions,
    ToolChoice,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

/// Fields accepted and deliberately not acted on: metadata, caching and routing hints.
const IGNORED_FIELDS: [&str; 5] = [
    "metadata",
    "user",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
];

/// `POST /v1/responses`.
#[derive(Debug, Deserialize, Serialize)]
pub struct ResponsesRequest {
    /// The model name (must be the served one, or empty).
    pub model: Option<String>,
    /// Text, or a list of items (messages, `function_call`, `function_call_output`).
    pub input: Input,
    /// A system message placed first (not carried over to follow-ups).
    pub instructions: Option<String>,
    /// Function tools: `{type: "function", name, description, parameters, strict}`.
    pub tools: Option<Vec<Value>>,
    /// `auto`, `none`, `required`, or `{type: "function", name}`.
    pub tool_choice: Option<Value>,
    /// Whether several calls may be made (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `{format: {type: "text"|"json_object"|"json_schema", ...}}`.
    pub text: Option<Value>,
    /// `{effort, summary}`: the effort reaches the chat template; the thinking comes back as a
    /// reasoning item (no summary is written).
    pub reasoning: Option<Value>,
    /// Most tokens to generate.
    pub max_output_tokens: Option<usize>,
    /// Sampling temperature, in [0, 2].
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Stream typed events.
    pub stream: Option<bool>,
    /// Keep the response for `previous_response_id` (default true).
    pub store: Option<bool>,
    /// Continue the conversation of a stored response.
    pub previous_response_id: Option<String>,
    /// `disabled` (the default) only: a conversation over the context is refused, not cut.
    pub truncation: Option<String>,
    /// Extra output to include: none is offered, so only an empty list.
    pub include: Option<Vec<String>>,
    /// Every other field: refused by name unless it is metadata or null.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `input`: text or items.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Input {
    /// One user message.
    Text(String),
    /// Items.
    Items(Vec<Value>),
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

/// The text of a message's content: a string, or parts of text.
fn content_text(v: Option<&Value>, at: &str) -> Result<String, WireError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        s.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some("refusal") => {
                        s.push_str(p.get("refusal").and_then(Value::as_str).unwrap_or(""))
                    }
                    t => {
                        return Err(invalid(
                            Field::Prompt,
                            format!("{at}: content part type {t:?} is not supported"),
                        ))
                    }
                }
            }
            Ok(s)
        }
        Some(_) => Err(invalid(
            Field::Prompt,
            format!("{at}: content must be text or a list of parts"),
        )),
    }
}

/// The chat messages of `input` items, appended to `msgs`: consecutive function calls join the
/// assistant turn before them.
pub fn append_items(msgs: &mut Vec<ChatMessage>, input: &Input) -> Result<(), WireError> {
    let items = match input {
        Input::Text(t) => {
            msgs.push(ChatMessage::new("user", t));
            return Ok(());
        }
        Input::Items(items) => items,
    };
    for (i, it) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = it.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = it.get("role").and_then(Value::as_str).unwrap_or("");
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    return Err(invalid(Field::Prompt, format!("{at}: role {role:?}")));
                }
                let role = if role == "developer" { "system" } else { role };
                msgs.push(ChatMessage::new(
                    role,
                    &content_text(it.get("content"), &at)?,
                ));
            }
            "function_call" => {
                let name = it.get("name").and_then(Value::as_str).ok_or_else(|| {
                    invalid(Field::Prompt, format!("{at}: a function_call needs a name"))
                })?;
                let args = it.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                let id = it.get("call_id").cloned().unwrap_or(Value::Null);
                let call = template_call(id, name, call_arguments(args));
                let joins = msgs.last().is_some_and(|m| m.role == "assistant");
                if !joins {
                    msgs.push(ChatMessage::new("assistant", ""));
                }
                if let Some(last) = msgs.last_mut() {
                    match &mut last.tool_calls {
                        Some(Value::Array(calls)) => calls.push(call),
                        _ => last.tool_calls = Some(json!([call])),
                    }
                }
            }
            "function_call_output" => {
                let output = match it.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    other => content_text(other, &at)?,
                };
                let mut m = ChatMessage::new("tool", &output);
                m.tool_call_id = it
                    .get("call_id")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                msgs.push(m);
            }
            // Earlier reasoning is not shown to the model again.
            "reasoning" => {}
            t => {
                return Err(invalid(
                    Field::Prompt,
                    format!("{at}: item type {t:?} is not supported"),
                ))
            }
        }
    }
    Ok(())
}

impl ResponsesRequest {
    /// Whether the response streams.
    pub fn streams(&self) -> bool {
        self.stream == Some(true)
    }

    /// Whether the response is kept for follow-ups (the API's default: yes).
    pub fn stores(&self) -> bool {
        self.store != Some(false)
    }

    /// The tools in the chat completions' shape, which the SDK takes.
    fn chat_tools(&self) -> Result<Option<Value>, WireError> {
        let Some(tools) = &self.tools else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(tools.len());
        for t in tools {
            match t.get("type").and_then(Value::as_str) {
                Some("function") => {}
                other => {
                    return Err(unsupported(
                        "tools",
                        format!("tool type {other:?}: only function tools run here"),
                    ))
                }
            }
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                return Err(invalid(Field::Tools, "a function tool needs a name"));
            };
            let description = t.get("description").cloned().unwrap_or(json!(""));
            out.push(chat_tool(name, description, t.get("parameters").cloned()));
        }
        Ok(Some(Value::Array(out)))
    }

    /// The constraint of `text.format`.
    fn format(&self) -> Result<Option<OutputConstraint>, WireError> {
        let Some(f) = self.text.as_ref().and_then(|t| t.get("format")) else {
            return Ok(None);
        };
        match f.get("type").and_then(Value::as_str) {
            None | Some("text") => Ok(None),
            Some("json_object") => Ok(Some(OutputConstraint::JsonObject)),
            Some("json_schema") => match f.get("schema") {
                Some(s) if s.is_object() => {
                    Ok(Some(OutputConstraint::JsonSchema { schema: s.clone() }))
                }
                _ => Err(invalid(
                    Field::ResponseFormat,
                    "format.schema must be a JSON schema object",
                )),
            },
            Some(t) => Err(invalid(
                Field::ResponseFormat,
                format!("format type {t:?}: text, json_object or json_schema"),
            )),
        }
    }

    /// `reasoning`: `effort` reaches the chat template (see `openai::effort_vars`); `summary` is
    /// accepted, but no summary is written: the thinking itself comes back as a reasoning
    /// item's `reasoning_text`.
    fn template_vars(&self) -> Result<TemplateVars, WireError> {
        let Some(r) = self.reasoning.as_ref().filter(|r| !r.is_null()) else {
            return Ok(TemplateVars::new());
        };
        let Some(obj) = r.as_object() else {
            return Err(unsupported("reasoning", "must be an object"));
        };
        if let Some(k) = obj
            .iter()
            .find(|(k, v)| !v.is_null() && !matches!(k.as_str(), "effort" | "summary"))
            .map(|(k, _)| k)
        {
            return Err(unsupported(
                "reasoning",
                format!("`{k}` is not supported (effort, summary)"),
            ));
        }
        match obj.get("effort") {
            None | Some(Value::Null) => Ok(TemplateVars::new()),
            Some(Value::String(e)) => crate::openai::effort_vars(e, "reasoning"),
            Some(e) => Err(unsupported("reasoning", format!("effort {e}: a string"))),
        }
    }

    /// Checks the fields that need no conversation, then the SDK request for `history` (the
    /// stored conversation this one continues) and this input. Returns the request and the
    /// conversation without the instructions (what a stored response keeps).
    pub fn to_request(
        &self,
        history: Vec<ChatMessage>,
    ) -> Result<(GenerateRequest, Vec<ChatMessage>), WireError> {
        crate::openai::refuse_unknown(&self.other, &IGNORED_FIELDS)?;
        let vars = self.template_vars()?;
        if self.truncation.as_deref().is_some_and(|t| t != "disabled") {
            return Err(unsupported(
                "truncation",
                "only \"disabled\": a conversation over the context is refused, not cut",
            ));
        }
        if self.include.as_ref().is_some_and(|i| !i.is_empty()) {
            return Err(unsupported("include", "no extra output is offered"));
        }
        if self.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
            return Err(invalid(
                Field::Sampling(SamplingField::Temperature),
                "must be in [0, 2]",
            ));
        }
        let mut conversation = history;
        append_items(&mut conversation, &self.input)?;
        let mut msgs = Vec::with_capacity(conversation.len() + 1);
        if let Some(i) = self.instructions.as_ref().filter(|i| !i.is_empty()) {
            msgs.push(ChatMessage::new("system", i));
        }
        msgs.extend(conversation.iter().cloned());
        let mut req = GenerateRequest::new(Prompt::Chat(msgs));
        req.max_tokens = self.max_output_tokens;
        req.template_args = vars;
        req.sampling = SamplingOptions {
            temperature: self.temperature,
            top_p: self.top_p,
            ..SamplingOptions::default()
        };
        req.tools = self.chat_tools()?;
        req.tool_choice = match &self.tool_choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
            Some(Value::String(s)) if s == "none" => ToolChoice::None,
            Some(Value::String(s)) if s == "required" => ToolChoice::Required,
            Some(v) => match (
                v.get("type").and_then(Value::as_str),
                v.get("name").and_then(Value::as_str),
            ) {
                (Some("function"), Some(name)) => ToolChoice::Function(name.to_string()),
                _ => {
                    return Err(invalid(
                        Field::ToolChoice,
                        format!("must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"name\": ...}}, not {v}"),
                    ))
                }
            },
        };
        req.parallel_tool_calls = self.parallel_tool_calls.unwrap_or(true);
        req.format = self.format()?;
        Ok((req, conversation))
    }
}

/// The wire name of an SDK field on this route.
pub fn param(field: Field) -> &'static str {
    match field {
        Field::Prompt => "input",
        Field::MaxTokens => "max_output_tokens",
        Field::ResponseFormat => "text",
        f => f.name(),
    }
}

/// Stored responses: each one's conversation (input and output as chat messages, without the
/// instructions), the oldest dropped past the capacity.
pub struct ResponseStore {
    capacity: usize,
    inner: Mutex<Stored>,
}

/// The stored conversations, and their ids oldest first.
#[derive(Default)]
struct Stored {
    by_id: HashMap<String, Vec<ChatMessage>>,
    order: VecDeque<String>,
}

impl Default for ResponseStore {
    fn default() -> Self {
        ResponseStore::new(DEFAULT_STORED)
    }
}

/// Responses kept by default.
pub const DEFAULT_STORED: usize = 256;

impl ResponseStore {
    /// A store of at most `capacity` responses.
    pub fn new(capacity: usize) -> ResponseStore {
        ResponseStore {
            capacity: capacity.max(1),
            inner: Mutex::new(Stored::default()),
        }
    }

    /// The conversation of response `id`, if it is still kept.
    pub fn get(&self, id: &str) -> Option<Vec<ChatMessage>> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.by_id.get(id).cloned()
    }

    /// Keeps response `id`'s conversation.
    pub fn put(&self, id: String, conversation: Vec<ChatMessage>) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.by_id.insert(id.clone(), conversation).is_none() {
            g.order.push_back(id);
        }
        while g.order.len() > self.capacity {
            if let Some(old) = g.order.pop_front() {
                g.by_id.remove(&old);
            }
        }
    }
}

impl std::fmt::Debug for ResponseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.inner.lock().map_or(0, |g| g.order.len());
        write!(f, "ResponseStore({n} of {})", self.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> ResponsesRequest {
        serde_json::from_value(v).expect("parses")
    }

    #[test]
    fn items_map_onto_chat_messages() {
        let r = parse(json!({
        "instructions": "be brief", "max_output_tokens": 9,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "calling"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "reasoning", "summary": []},
        ]}));
        let history = vec![ChatMessage::new("user", "before")];
        let (req, conversation) = r.to_request(history).expect("maps");
        let Prompt::Chat(m) = &req.prompt else {
            panic!("chat")
        };
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "user", "assistant", "tool"]);
        let calls = m[3].tool_calls.as_ref().expect("calls");
        assert_eq!(calls.as_array().map(Vec::len), Some(2));
        assert_eq!(calls[0]["function"]["arguments"], json!({"a": 1}));
        assert_eq!(m[4].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(
            conversation.len(),
            4,
            "the stored conversation has no instructions"
        );
        assert_eq!(req.tool_choice, ToolChoice::Function("f".into()));
        assert!(!req.parallel_tool_calls);
        assert_eq!(req.max_tokens, Some(9));
        assert!(matches!(
            req.format,
            Some(OutputConstraint::JsonSchema { .. })
        ));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let field = |v: Value| {
            let mut b = json!({"input": "hi"});
            for (k, x) in v.as_object().expect("object") {
                b[k] = x.clone();
            }
            match parse(b).to_request(Vec::new()).expect_err("refused") {
                WireError::Rejected(r) => param(r.field()).to_string(),
                WireError::Unsupported { field, .. } => field.to_string(),
                WireError::Unknown(name) => name,
            }
        };
        assert_eq!(
            field(json!({"reasoning": {"effort": "extreme"}})),
            "reasoning"
        );
        assert_eq!(
            field(json!({"reasoning": {"generate_summary": "auto"}})),
            "reasoning"
        );
        assert_eq!(field(json!({"tools": [{"type": "web_search"}]})), "tools");
        assert_eq!(field(json!({"truncation": "auto"})), "truncation");
        assert_eq!(field(json!({"include": ["x"]})), "include");
        assert_eq!(field(json!({"temperature": 3})), "temperature");
        assert_eq!(field(json!({"frobnicate": 1})), "frobnicate");
        assert_eq!(field(json!({"input": [{"type": "image"}]})), "input");
        assert_eq!(field(json!({"text": {"format": {"type": "yaml"}}})), "text");
    }

    #[test]
    fn reasoning_effort_reaches_the_template() {
        let vars = |v: Value| {
            parse(json!({"input": "hi", "reasoning": v}))
                .to_request(Vec::new())
                .expect("accepted")
                .0
                .template_args
        };
        let off = vars(json!({"effort": "none", "summary": "auto"}));
        assert_eq!(off.get("enable_thinking"), Some(&json!(false)));
        assert_eq!(off.get("reasoning_effort"), None);
        let high = vars(json!({"effort": "high"}));
        assert_eq!(high.get("enable_thinking"), Some(&json!(true)));
        assert_eq!(high.get("reasoning_effort"), Some(&json!("high")));
        assert!(vars(json!({"summary": "auto"})).is_empty());
    }

    #[test]
    fn the_store_keeps_the_newest() {
        let s = ResponseStore::new(2);
        for i in 0..3 {
            s.put(
                format!("r{i}"),
                vec![ChatMessage::new("user", &i.to_string())],
            );
        }
        assert!(s.get("r0").is_none());
        assert_eq!(s.get("r2").expect("kept")[0].content, "2");
    }
}
