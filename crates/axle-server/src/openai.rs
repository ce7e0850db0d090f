//! OpenAI's request and response shapes as typed serde structs (plus Axle's token-id route),
//! and the conversion of a request body into the SDK's [`GenerateRequest`]. The server and the
//! tests use these; nothing else writes OpenAI JSON by hand.
use axle_models::{ChatMessage, TemplateVars};
use axle_sdk::{
    Field, GenerateRequest, Prompt, Rejection, ResponseFormat, RuntimeReport, SamplingField,
    SamplingOptions, ToolCall, ToolChoice,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Object names and id prefixes.
pub mod names {
    /// A chat completion.
    pub const CHAT: &str = "chat.completion";
    /// A streamed chat completion chunk.
    pub const CHAT_CHUNK: &str = "chat.completion.chunk";
    /// A text completion (blocking and streamed).
    pub const TEXT: &str = "text_completion";
    /// Chat completion ids.
    pub const CHAT_ID: &str = "chatcmpl";
    /// Text completion ids.
    pub const TEXT_ID: &str = "cmpl";
}

// ---------------------------------------------------------------------------------------------
// Requests

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// A message's content: text or a list of parts.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts (only `text` parts are supported).
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ContentPart {
    /// The part's type (`text`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Its text.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Message {
    /// system, user, assistant, tool or developer.
    pub role: String,
    /// Its content.
    pub content: Option<Content>,
    /// An assistant message's tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallBody>>,
    /// A tool message's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool message's function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A tool call, in messages and in responses.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct ToolCallBody {
    /// `call_...`.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The call.
    pub function: FunctionCall,
}

/// A function call: its name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// Arguments (a JSON object, as text).
    pub arguments: String,
}

impl ToolCallBody {
    /// The wire form of a call found in the output (`id` from the completion id and index).
    pub fn of(call: &ToolCall, id: String) -> ToolCallBody {
        ToolCallBody {
            id,
            kind: "function".into(),
            function: FunctionCall {
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            },
        }
    }
}

/// A streamed tool call (OpenAI's `delta.tool_calls[]`): whole, in one chunk.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct ToolCallDelta {
    /// Position among the choice's calls.
    pub index: usize,
    /// The call.
    #[serde(flatten)]
    pub call: ToolCallBody,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct StreamOptions {
    /// Send a last chunk with the token counts.
    pub include_usage: Option<bool>,
}

/// Fields accepted and deliberately not acted on: request metadata.
const IGNORED_FIELDS: [&str; 2] = ["user", "metadata"];

/// The fields every generation route shares: sampling, length, streaming, and Axle's extensions
/// (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `ngram`).
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct GenerationFields {
    /// The model name (must be the served one, or empty).
    pub model: Option<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<usize>,
    /// The same (OpenAI's newer name); wins over `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// Sampling (temperature, top_p, top_k, min_p, the penalties, seed).
    #[serde(flatten)]
    pub sampling: SamplingOptions,
    /// Stop strings.
    pub stop: Option<StopInput>,
    /// Choices.
    pub n: Option<usize>,
    /// Chat: a bool (with `top_logprobs`); completions: the number of alternatives.
    pub logprobs: Option<Value>,
    /// Chat: alternatives per token.
    pub top_logprobs: Option<usize>,
    /// Token id (as a string) to bias.
    pub logit_bias: Option<HashMap<String, f32>>,
    /// Stream as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Do not stop at end-of-generation tokens.
    pub ignore_eos: Option<bool>,
    /// Allow n-gram speculation (default true; it never changes the output).
    pub ngram: Option<bool>,
    /// What the output must be; decoding is constrained to it.
    pub response_format: Option<Value>,
    /// Every other field: refused by name unless it is metadata (`user`, `metadata`) or null.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

impl GenerationFields {
    /// Whether the response streams.
    pub fn streams(&self) -> bool {
        self.stream == Some(true)
    }

    /// Whether a streamed response ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }

    /// A request for `prompt` with these fields.
    fn request(&self, prompt: Prompt) -> Result<GenerateRequest, WireError> {
        refuse_unknown(&self.other, &IGNORED_FIELDS)?;
        let logprobs = match &self.logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) => None,
            Some(Value::Bool(true)) => Some(self.top_logprobs.unwrap_or(0)),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(k) => Some(k as usize),
                None => return Err(invalid(Field::Logprobs, "must be a boolean or a count")),
            },
            Some(_) => return Err(invalid(Field::Logprobs, "must be a boolean or a count")),
        };
        // OpenAI's range; the SDK itself takes any temperature >= 0.
        if self.sampling.temperature.is_some_and(|t| t > 2.0) {
            return Err(invalid(
                Field::Sampling(SamplingField::Temperature),
                "must be in [0, 2]",
            ));
        }
        let mut logit_bias = Vec::new();
        for (k, &v) in self.logit_bias.iter().flatten() {
            let id = k.parse().map_err(|_| {
                invalid(
                    Field::Sampling(SamplingField::LogitBias),
                    format!("key `{k}` is not a token id"),
                )
            })?;
            logit_bias.push((id, v));
        }
        logit_bias.sort_by_key(|b| b.0);
        let format = match &self.response_format {
            None | Some(Value::Null) => None,
            Some(v) => serde_json::from_value::<ResponseFormat>(v.clone())
                .map_err(|e| invalid(Field::ResponseFormat, e.to_string()))?
                .constraint(),
        };
        Ok(GenerateRequest {
            format,
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            sampling: self.sampling.clone(),
            stop: match &self.stop {
                None => Vec::new(),
                Some(StopInput::One(s)) => vec![s.clone()],
                Some(StopInput::Many(v)) => v.clone(),
            },
            logprobs,
            logit_bias,
            n: self.n.unwrap_or(1),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            speculation: self.ngram.unwrap_or(true),
            ..GenerateRequest::new(prompt)
        })
    }
}

/// A body that does not map onto a request.
#[derive(Debug, Clone, PartialEq)]
pub enum WireError {
    /// A field's value is wrong.
    Rejected(Rejection),
    /// A field this server does not know (refused rather than ignored).
    Unknown(String),
    /// A wire-only field with a value this server cannot honour.
    Unsupported {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

impl From<Rejection> for WireError {
    fn from(r: Rejection) -> WireError {
        WireError::Rejected(r)
    }
}

/// Refuses the first field of `other` (what a body's known fields left) that is set and not
/// one of `ignored`.
pub(crate) fn refuse_unknown(
    other: &BTreeMap<String, Value>,
    ignored: &[&str],
) -> Result<(), WireError> {
    match other
        .iter()
        .find(|(k, v)| !v.is_null() && !ignored.contains(&k.as_str()))
    {
        Some((name, _)) => Err(WireError::Unknown(name.clone())),
        None => Ok(()),
    }
}

/// One call of an assistant turn as chat templates take it (an element of a
/// [`ChatMessage`]'s `tool_calls`), its arguments a JSON value.
pub(crate) fn template_call(id: Value, name: &str, arguments: Value) -> Value {
    serde_json::json!({"id": id, "type": "function",
        "function": {"name": name, "arguments": arguments}})
}

/// Arguments sent as text, as templates render them: the JSON they hold, else the text itself.
pub(crate) fn call_arguments(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// A function tool in the chat completions' shape, which the SDK takes.
pub(crate) fn chat_tool(name: &str, description: Value, parameters: Option<Value>) -> Value {
    serde_json::json!({"type": "function", "function": {
        "name": name,
        "description": description,
        "parameters": parameters.unwrap_or_else(|| serde_json::json!({"type": "object"})),
    }})
}

fn invalid(field: Field, reason: impl Into<String>) -> WireError {
    WireError::Rejected(Rejection::invalid(field, reason))
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize, Serialize)]
pub struct ChatCompletionRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// Tool definitions, shown to the model through its chat template (or a system prompt).
    pub tools: Option<Value>,
    /// `auto` (default), `none`, `required`, or `{"type": "function", "function": {"name"}}`;
    /// the last two constrain decoding to a valid call.
    pub tool_choice: Option<Value>,
    /// Whether a required call may be several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `none`, `minimal`, `low`, `medium` or `high`: passed to the chat template (see
    /// [`effort_vars`]).
    pub reasoning_effort: Option<String>,
    /// More variables for the chat template (e.g. `{"enable_thinking": false}`); they win over
    /// what `reasoning_effort` sets.
    pub chat_template_kwargs: Option<BTreeMap<String, Value>>,
    /// Shared fields.
    #[serde(flatten)]
    pub fields: GenerationFields,
}

impl ChatCompletionRequest {
    /// The SDK request (roles and content parts checked).
    pub fn to_request(&self) -> Result<GenerateRequest, WireError> {
        let mut msgs = Vec::with_capacity(self.messages.len());
        for m in &self.messages {
            if !matches!(
                m.role.as_str(),
                "system" | "user" | "assistant" | "tool" | "developer"
            ) {
                return Err(invalid(Field::Prompt, format!("unknown role `{}`", m.role)));
            }
            let text = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut s = String::new();
                    for p in parts {
                        if p.kind != "text" {
                            return Err(invalid(
                                Field::Prompt,
                                format!("content part type `{}` is not supported", p.kind),
                            ));
                        }
                        s.push_str(p.text.as_deref().unwrap_or(""));
                    }
                    s
                }
            };
            let mut msg = ChatMessage::new(&m.role, &text);
            if let Some(calls) = &m.tool_calls {
                // Templates render arguments as JSON objects: parse the wire's text.
                let calls: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        let args = call_arguments(&c.function.arguments);
                        template_call(serde_json::json!(c.id), &c.function.name, args)
                    })
                    .collect();
                msg.tool_calls = Some(Value::Array(calls));
            }
            msg.tool_call_id = m.tool_call_id.clone();
            msg.name = m.name.clone();
            msgs.push(msg);
        }
        let mut req = self.fields.request(Prompt::Chat(msgs))?;
        req.tools = self.tools.clone().filter(|t| !t.is_null());
        req.tool_choice = match &self.tool_choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
            Some(Value::String(s)) if s == "none" => ToolChoice::None,
            Some(Value::String(s)) if s == "required" => ToolChoice::Required,
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                    ToolChoice::Function(name.to_string())
                }
                _ => {
                    return Err(invalid(
                        Field::ToolChoice,
                        format!("must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, not {v}"),
                    ))
                }
            },
        };
        req.parallel_tool_calls = self.parallel_tool_calls.unwrap_or(true);
        if let Some(e) = &self.reasoning_effort {
            req.template_args = effort_vars(e, "reasoning_effort")?;
        }
        req.template_args
            .extend(self.chat_template_kwargs.clone().unwrap_or_default());
        Ok(req)
    }
}

/// `prompt`: one string or a list of them, or token ids (one list or a list of lists), as
/// OpenAI's completions take it. Token ids are used as they are (no BOS added).
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// One prompt.
    One(String),
    /// Several (one set of choices each).
    Many(Vec<String>),
    /// One prompt of token ids.
    Tokens(Vec<u32>),
    /// Several prompts of token ids.
    ManyTokens(Vec<Vec<u32>>),
}

impl PromptInput {
    /// Reads `prompt`'s value; the error names what it may be.
    pub fn from_value(v: &Value) -> Result<PromptInput, WireError> {
        let bad = || {
            invalid(
                Field::Prompt,
                "must be a string, a list of strings, a list of token ids or a list of such lists",
            )
        };
        let ids = |xs: &[Value]| -> Option<Vec<u32>> {
            xs.iter()
                .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect()
        };
        match v {
            Value::String(s) => Ok(PromptInput::One(s.clone())),
            Value::Array(xs) if xs.iter().all(Value::is_string) => Ok(PromptInput::Many(
                xs.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect(),
            )),
            Value::Array(xs) if xs.iter().all(Value::is_number) => {
                ids(xs).map(PromptInput::Tokens).ok_or_else(bad)
            }
            Value::Array(xs) if xs.iter().all(Value::is_array) => xs
                .iter()
                .map(|x| x.as_array().and_then(|a| ids(a)))
                .collect::<Option<Vec<_>>>()
                .map(PromptInput::ManyTokens)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

/// Most prompts times choices in one text completion request.
pub const MAX_TEXT_CHOICES: usize = 16;

/// `POST /v1/completions`.
#[derive(Debug, Deserialize, Serialize)]
pub struct CompletionRequest {
    /// The prompt(s): see [`PromptInput`] (read when the request is mapped, so that a wrong one
    /// is refused naming the field).
    pub prompt: Value,
    /// Shared fields.
    #[serde(flatten)]
    pub fields: GenerationFields,
}

impl CompletionRequest {
    /// One SDK request per prompt.
    pub fn to_requests(&self) -> Result<Vec<GenerateRequest>, WireError> {
        let prompts: Vec<Prompt> = match PromptInput::from_value(&self.prompt)? {
            PromptInput::One(p) => vec![Prompt::Text(p)],
            PromptInput::Many(v) => v.into_iter().map(Prompt::Text).collect(),
            PromptInput::Tokens(t) => vec![Prompt::Tokens(t)],
            PromptInput::ManyTokens(v) => v.into_iter().map(Prompt::Tokens).collect(),
        };
        let n = self.fields.n.unwrap_or(1).max(1);
        if prompts.is_empty() || prompts.len() * n > MAX_TEXT_CHOICES {
            return Err(invalid(
                Field::Prompt,
                format!(
                    "must be a string, token ids, or a list of 1 to {MAX_TEXT_CHOICES} of either \
                     (times n)"
                ),
            ));
        }
        if prompts
            .iter()
            .any(|p| matches!(p, Prompt::Tokens(t) if t.is_empty()))
        {
            return Err(invalid(
                Field::Prompt,
                "a list of token ids must not be empty",
            ));
        }
        if self.fields.streams() && prompts.len() > 1 {
            return Err(invalid(Field::Prompt, "streaming takes a single prompt"));
        }
        prompts
            .into_iter()
            .map(|p| self.fields.request(p))
            .collect()
    }
}

/// `POST /v1/generate` (Axle's): token ids in, token ids out.
#[derive(Debug, Deserialize, Serialize)]
pub struct TokenGenerationRequest {
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Shared fields.
    #[serde(flatten)]
    pub fields: GenerationFields,
}

impl TokenGenerationRequest {
    /// The SDK request.
    pub fn to_request(&self) -> Result<GenerateRequest, WireError> {
        self.fields.request(Prompt::Tokens(self.tokens.clone()))
    }
}

/// `POST /tokenize`.
#[derive(Debug, Deserialize, Serialize)]
pub struct TokenizeRequest {
    /// Text to tokenize.
    pub text: String,
    /// Add BOS as the model asks (default true).
    pub add_special: Option<bool>,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize, Serialize)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<u32>,
}

// ---------------------------------------------------------------------------------------------
// Responses

/// Token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageBody {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// What the generated tokens were.
    #[serde(default)]
    pub completion_tokens_details: CompletionDetails,
}

/// What generated tokens were.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionDetails {
    /// Tokens inside the thinking.
    pub reasoning_tokens: usize,
}

impl UsageBody {
    /// Counts of `prompt` and `completion` tokens, `reasoning` of them thinking.
    pub fn new(prompt: usize, completion: usize, reasoning: usize) -> UsageBody {
        UsageBody {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            completion_tokens_details: CompletionDetails {
                reasoning_tokens: reasoning,
            },
        }
    }
}

/// Reasoning efforts a request may name (OpenAI's `reasoning_effort`, Responses'
/// `reasoning.effort`).
const EFFORTS: [&str; 5] = ["none", "minimal", "low", "medium", "high"];

/// The template variables of a reasoning effort: `none` turns thinking off
/// (`enable_thinking: false`, what Qwen-style templates read); the others turn it on and pass
/// the effort as `reasoning_effort` (what gpt-oss templates read). `field` names the wire field.
pub(crate) fn effort_vars(effort: &str, field: &'static str) -> Result<TemplateVars, WireError> {
    if !EFFORTS.contains(&effort) {
        return Err(WireError::Unsupported {
            field,
            reason: format!("effort `{effort}`: one of {}", EFFORTS.join(", ")),
        });
    }
    let mut vars = TemplateVars::new();
    vars.insert("enable_thinking".into(), Value::Bool(effort != "none"));
    if effort != "none" {
        vars.insert("reasoning_effort".into(), Value::String(effort.into()));
    }
    Ok(vars)
}

/// A chat token, or one of its alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// One chat token's log-probability entry: the token's own fields, then its alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogprobEntry {
    /// The token: its text, log-probability and bytes.
    #[serde(flatten)]
    pub chosen: TopLogprob,
    /// The most likely alternatives.
    pub top_logprobs: Vec<TopLogprob>,
}

/// A chat choice's log-probabilities.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One entry per token.
    pub content: Vec<LogprobEntry>,
}

/// A text choice's log-probabilities (the legacy completions shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities.
    pub token_logprobs: Vec<f32>,
    /// The alternatives of each, by text.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Each token's offset in the choice's text.
    pub text_offset: Vec<usize>,
}

/// The assistant's message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// `assistant`.
    pub role: String,
    /// Its text (null when the reply is only tool calls).
    pub content: Option<String>,
    /// The thinking before the answer (models whose template marks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls found in the reply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallBody>,
}

/// A chat choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Choice index.
    pub index: usize,
    /// The reply.
    pub message: AssistantMessage,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length`.
    pub finish_reason: String,
}

/// A streamed chat delta.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// `assistant`, in the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Text to append.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Thinking to append (models whose template marks it), before the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls, each whole, in the choice's last chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A streamed chat choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    /// Choice index.
    pub index: usize,
    /// What to append.
    pub delta: Delta,
    /// The token's log-probabilities, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChatLogprobs>,
    /// Set in the choice's last chunk.
    pub finish_reason: Option<String>,
}

/// A text choice (blocking or streamed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextChoice {
    /// Choice index.
    pub index: usize,
    /// The text (a piece of it, when streamed).
    pub text: String,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<TextLogprobs>,
    /// Set when the choice ends.
    pub finish_reason: Option<String>,
}

/// A completion, blocking or streamed: `chat.completion` (choices [`ChatChoice`]),
/// `text_completion` ([`TextChoice`]), or a streamed chunk: one chat or text choice, or the closing
/// usage chunk (no choices). Blocking bodies always carry usage and the runtime report; chunks
/// carry the report on a choice's last chunk and on the usage chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion<C> {
    /// `chatcmpl-N` or `cmpl-N` (the same in every chunk of a stream).
    pub id: String,
    /// One of [`names`].
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model name.
    pub model: String,
    /// The choices (a chunk: the one it is about, or none in the usage chunk).
    pub choices: Vec<C>,
    /// Token counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageBody>,
    /// Which runtime served it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Arc<RuntimeReport>>,
}

/// A choice of `POST /v1/generate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenChoice {
    /// Choice index.
    pub index: usize,
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// `stop` or `length`.
    pub finish_reason: String,
}

/// The response of `POST /v1/generate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenCompletion {
    /// The model name.
    pub model: String,
    /// The choices.
    pub choices: Vec<TokenChoice>,
    /// Which runtime served it.
    pub runtime: Arc<RuntimeReport>,
    /// Token counts.
    pub usage: UsageBody,
}

/// A streamed event of `POST /v1/generate`: one token, or the end (`token` null).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenChunk {
    /// Choice index.
    pub index: usize,
    /// The token (null in the last event).
    pub token: Option<u32>,
    /// Set in the last event.
    pub finish_reason: Option<String>,
    /// Its log-probability, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprob: Option<f32>,
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// The model name.
    pub id: String,
    /// `model`.
    pub object: String,
    /// Unix seconds (0: unknown).
    pub created: u64,
    /// `axle`, or the upstream's kind `via axle`.
    pub owned_by: String,
    /// Which runtime serves it.
    pub runtime: Arc<RuntimeReport>,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The served model.
    pub data: Vec<ModelCard>,
}

/// `POST /tokenize`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tokens {
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// `POST /detokenize`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Text {
    /// The text.
    pub text: String,
}

/// An error's details.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Human-readable message.
    pub message: String,
    /// OpenAI's error type.
    #[serde(rename = "type")]
    pub kind: String,
    /// The offending parameter.
    pub param: Option<String>,
    /// Machine-readable code.
    pub code: Option<String>,
}

/// OpenAI's error body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<GenerateRequest, WireError> {
        serde_json::from_value::<ChatCompletionRequest>(body)
            .expect("shape")
            .to_request()
    }

    #[test]
    fn fields_map_onto_the_request() {
        let r = chat(serde_json::json!({
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0.5, "stop": "x",
            "logprobs": true, "top_logprobs": 3, "logit_bias": {"12": -100, "3": 1.5},
            "n": 2, "seed": 9, "ngram": false, "user": "u", "metadata": {"a": 1},
            "response_format": null,
        }))
        .expect("valid");
        assert_eq!(r.prompt, Prompt::Chat(vec![ChatMessage::new("user", "hi")]));
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.stop, vec!["x".to_string()]);
        assert_eq!(r.logprobs, Some(3));
        assert_eq!(r.logit_bias, vec![(3, 1.5), (12, -100.0)]);
        assert_eq!((r.n, r.sampling.seed, r.speculation), (2, Some(9), false));
    }

    /// A chat token's entry is OpenAI's flat object: the token's own fields beside its
    /// alternatives.
    #[test]
    fn logprob_entries_are_flat() {
        let top = |token: &str, logprob| TopLogprob {
            token: token.into(),
            logprob,
            bytes: token.as_bytes().to_vec(),
        };
        let entry = LogprobEntry {
            chosen: top("a", -0.5),
            top_logprobs: vec![top("b", -1.0)],
        };
        let json = serde_json::json!({
            "token": "a", "logprob": -0.5, "bytes": [97],
            "top_logprobs": [{"token": "b", "logprob": -1.0, "bytes": [98]}],
        });
        assert_eq!(serde_json::to_value(&entry).expect("serializes"), json);
        assert_eq!(
            serde_json::from_value::<LogprobEntry>(json).expect("parses"),
            entry
        );
    }

    #[test]
    fn unknown_and_malformed_fields_are_named() {
        let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
        let e = chat(serde_json::json!({"messages": msgs, "guided_json": {"type": "object"}}));
        assert_eq!(e, Err(WireError::Unknown("guided_json".into())));
        let field = |extra: Value| {
            let mut body = serde_json::json!({"messages": msgs});
            for (k, v) in extra.as_object().expect("object") {
                body[k] = v.clone();
            }
            match chat(body) {
                Err(WireError::Rejected(r)) => r.field(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            field(serde_json::json!({"logprobs": "yes"})),
            Field::Logprobs
        );
        assert_eq!(
            field(serde_json::json!({"logit_bias": {"a": 1}})),
            Field::Sampling(SamplingField::LogitBias)
        );
        assert_eq!(
            field(serde_json::json!({"messages": [{"role": "robot", "content": "x"}]})),
            Field::Prompt
        );
        assert_eq!(
            field(
                serde_json::json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
            ),
            Field::Prompt
        );
        for bad in [
            serde_json::json!({"type": "xml"}),
            serde_json::json!({"type": "json_schema"}),
            serde_json::json!({"type": "json_schema", "json_schema": {"name": "a", "extra": 1}}),
            serde_json::json!("json"),
        ] {
            assert_eq!(
                field(serde_json::json!({"response_format": bad})),
                Field::ResponseFormat
            );
        }
        for bad in [
            serde_json::json!("sometimes"),
            serde_json::json!({"type": "function"}),
            serde_json::json!({"type": "code", "function": {"name": "f"}}),
        ] {
            assert_eq!(
                field(serde_json::json!({"tool_choice": bad})),
                Field::ToolChoice
            );
        }
    }

    #[test]
    fn formats_and_tool_choices_map_onto_the_request() {
        let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
        let r = chat(
            serde_json::json!({"messages": msgs, "response_format": {"type": "json_schema",
            "json_schema": {"name": "p", "strict": true, "schema": {"type": "object"}}}}),
        )
        .unwrap();
        assert_eq!(
            r.format,
            Some(axle_sdk::OutputConstraint::JsonSchema {
                schema: serde_json::json!({"type": "object"})
            })
        );
        let r = chat(serde_json::json!({"messages": msgs, "response_format": {"type": "text"}}))
            .unwrap();
        assert_eq!(r.format, None);
        let r = chat(
            serde_json::json!({"messages": msgs, "tools": [], "parallel_tool_calls": false,
            "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        )
        .unwrap();
        assert_eq!(r.tool_choice, ToolChoice::Function("f".into()));
        assert!(!r.parallel_tool_calls);
        // A tool call in the history reaches the template with its arguments as an object.
        let r = chat(serde_json::json!({"messages": [
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "2"}]}))
        .unwrap();
        let Prompt::Chat(m) = r.prompt else { panic!() };
        assert_eq!(
            m[0].tool_calls.as_ref().unwrap()[0]["function"]["arguments"]["a"],
            1
        );
        assert_eq!(m[1].tool_call_id.as_deref(), Some("c1"));
    }
}
