//! The one generation request of every route (native or delegated, from the server, the CLI or
//! the SDK), its defaults, and the typed reasons a request is refused.
//!
//! A [`GenerateRequest`] keeps unset options unset: a native route resolves them with the
//! defaults of [`defaults`] ([`GenerateRequest::options`]), a delegated route leaves them to the
//! upstream's own. Field ranges are checked once, by [`GenerateRequest::validate`], which every
//! route's entry point calls; what a route cannot honour (a delegated upstream asked for token
//! log-probabilities, say) is refused by that route with [`Rejection::Unsupported`].
use axle_core::{AdmitError, SamplingField, SamplingParams};
use axle_models::{ChatMessage, TemplateVars, TokenId, TEMPLATE_INPUTS};
use axle_structured::reasoning::ThinkingMarkers;
use axle_structured::tools::{ToolChoice, ToolFormat};
use axle_structured::OutputConstraint;
use smart_default::SmartDefault;
use std::sync::atomic::{AtomicU64, Ordering};

/// A request's options as the engine runs them, every default resolved (from a
/// [`crate::GenerateRequest`] by [`crate::GenerateRequest::options`]).
#[derive(Debug, Clone, SmartDefault)]
pub struct RequestOptions {
    /// Sampling.
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    #[default(defaults::MAX_TOKENS)]
    pub max_tokens: usize,
    /// Stop strings (matched on generated text; never emitted).
    pub stop_strings: Vec<String>,
    /// Extra stop token ids.
    pub stop_tokens: Vec<TokenId>,
    /// Do not stop at the model's end-of-generation tokens.
    pub ignore_eos: bool,
    /// Use speculation when the engine has it on (the gate still decides per step).
    #[default(true)]
    pub speculation: bool,
    /// Look for tool calls of this format, of these functions, in the output.
    pub tool_format: Option<(ToolFormat, Vec<String>)>,
    /// Split thinking between these markers from the answer (and whether the prompt opened it).
    pub thinking: Option<(ThinkingMarkers, bool)>,
}

/// The defaults, each in one place.
pub mod defaults {
    /// Most tokens generated when a request does not say.
    pub const MAX_TOKENS: usize = 512;
    /// Sampling temperature when a request does not say (OpenAI's).
    pub const TEMPERATURE: f32 = 1.0;
    /// Longest n-gram draft.
    pub const DRAFT_LEN: usize = 4;
    /// Context length per sequence (tokens), capped by the model's training context.
    pub const CONTEXT: usize = 4096;
    /// Most tokens one step computes (prefill chunks and decodes together) on the CPU.
    pub const STEP_TOKENS: usize = 512;
    /// The same where the whole model is on accelerators: longer prefill chunks per step there
    /// cut time to first token under load without slowing the decodes that share the step
    /// (docs/gpu.md, `axle bench serve`).
    pub const STEP_TOKENS_ACCELERATED: usize = 4096;
    /// Most choices (`n`) per request.
    pub const MAX_CHOICES: usize = 8;
    /// Most stop strings per request.
    pub const MAX_STOP_STRINGS: usize = 4;
    /// Most top alternatives reported per token.
    pub const MAX_TOP_LOGPROBS: usize = 20;
    /// Bound of a logit bias value (OpenAI's); -100 bans the token.
    pub const LOGIT_BIAS_LIMIT: f32 = 100.0;
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Plain text (BOS added as the model asks).
    Text(String),
    /// Chat messages, rendered with the model's template (by the upstream, when delegated).
    Chat(Vec<ChatMessage>),
    /// Token ids, used as they are (native routes only).
    Tokens(Vec<TokenId>),
}

impl From<&str> for Prompt {
    fn from(s: &str) -> Prompt {
        Prompt::Text(s.to_string())
    }
}

impl From<String> for Prompt {
    fn from(s: String) -> Prompt {
        Prompt::Text(s)
    }
}

impl From<Vec<ChatMessage>> for Prompt {
    fn from(m: Vec<ChatMessage>) -> Prompt {
        Prompt::Chat(m)
    }
}

impl From<Vec<TokenId>> for Prompt {
    fn from(t: Vec<TokenId>) -> Prompt {
        Prompt::Tokens(t)
    }
}

/// A request's sampling options, each unset unless given (the wire field names are OpenAI's,
/// plus `top_k`, `min_p` and `repetition_penalty`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingOptions {
    /// Sampling temperature, 0 for greedy (default [`defaults::TEMPERATURE`]).
    pub temperature: Option<f32>,
    /// Nucleus sampling (1 = off).
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: Option<usize>,
    /// Drop tokens below this fraction of the top probability (0 = off).
    pub min_p: Option<f32>,
    /// Multiplicative repetition penalty (1 = off).
    pub repetition_penalty: Option<f32>,
    /// OpenAI's presence penalty (0 = off).
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty (0 = off).
    pub frequency_penalty: Option<f32>,
    /// RNG seed (default: a fresh one per request). Choice i of n uses seed + i.
    pub seed: Option<u64>,
}

/// A generation request. Build one with [`GenerateRequest::new`] and the setters; unset
/// options take the route's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// What to generate from.
    pub prompt: Prompt,
    /// Tool definitions (OpenAI's JSON), shown to the model by its chat template (or by a
    /// system prompt when the template has no tools); chat prompts only. Calls the model writes
    /// come back as [`crate::Finish::tool_calls`].
    pub tools: Option<serde_json::Value>,
    /// Which tool the model must call (`Required` and `Function` constrain decoding to a valid
    /// call).
    pub tool_choice: ToolChoice,
    /// Whether a forced call may be several calls.
    pub parallel_tool_calls: bool,
    /// What the output must be (JSON for a schema, a pattern, a grammar); decoding is
    /// constrained to it.
    pub format: Option<OutputConstraint>,
    /// Emit tokens the constraint forces (the only ones it allows) without sampling them; they
    /// are computed with the next step. Off, every token is sampled under its mask (the model
    /// may then spell forced text with other tokens; the bench uses it to measure the mask's
    /// cost alone). Off as well when the request wants log-probabilities.
    pub fast_forward: bool,
    /// Most tokens to generate (default [`defaults::MAX_TOKENS`]).
    pub max_tokens: Option<usize>,
    /// Sampling options, as set.
    pub sampling: SamplingOptions,
    /// Stop strings, matched on generated text and never emitted.
    pub stop: Vec<String>,
    /// Extra stop token ids (native routes only).
    pub stop_tokens: Vec<TokenId>,
    /// Report each token's log-probability and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Added to the logits of given tokens, in [-100, 100]; -100 bans a token.
    pub logit_bias: Vec<(TokenId, f32)>,
    /// Independent choices generated from the prompt.
    pub n: usize,
    /// Do not stop at the model's end-of-generation tokens.
    pub ignore_eos: bool,
    /// Allow n-gram speculation where the engine has it on (it never changes the output; the
    /// engine's gate decides per step whether it pays). A permission, so routes without
    /// speculation simply do not use it.
    pub speculation: bool,
    /// Variables given to the chat template beside the messages (`enable_thinking`,
    /// `reasoning_effort`, a client's `chat_template_kwargs`); chat prompts only. The names the
    /// template's own inputs use ([`TEMPLATE_INPUTS`]) are refused.
    pub template_args: TemplateVars,
    /// Most tokens of thinking (models whose template marks it; chat prompts): at this many the
    /// closing marker is forced and the answer follows. Thinking that closes in time is left as
    /// it would be without the bound. None: no bound.
    pub reasoning_budget: Option<usize>,
}

/// Seeds of requests that set none: distinct per request, the same sequence on every run.
static NEXT_SEED: AtomicU64 = AtomicU64::new(1);

impl GenerateRequest {
    /// A request with every option unset (one choice, speculation allowed).
    pub fn new(prompt: impl Into<Prompt>) -> GenerateRequest {
        GenerateRequest {
            prompt: prompt.into(),
            tools: None,
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            format: None,
            fast_forward: true,
            max_tokens: None,
            sampling: SamplingOptions::default(),
            stop: Vec::new(),
            stop_tokens: Vec::new(),
            logprobs: None,
            logit_bias: Vec::new(),
            n: 1,
            ignore_eos: false,
            speculation: true,
            template_args: TemplateVars::new(),
            reasoning_budget: None,
        }
    }

    /// Sets a chat template variable (e.g. `enable_thinking`).
    pub fn template_arg(mut self, name: &str, value: serde_json::Value) -> Self {
        self.template_args.insert(name.to_string(), value);
        self
    }

    /// Sets the token limit.
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = Some(n);
        self
    }

    /// Sets the temperature (0 = greedy).
    pub fn temperature(mut self, t: f32) -> Self {
        self.sampling.temperature = Some(t);
        self
    }

    /// Greedy decoding.
    pub fn greedy(self) -> Self {
        self.temperature(0.0)
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.sampling.seed = Some(seed);
        self
    }

    /// Sets every sampling option from `p` (its penalty window aside).
    pub fn with_sampling(mut self, p: &SamplingParams) -> Self {
        self.sampling = SamplingOptions {
            temperature: Some(p.temperature),
            top_p: Some(p.top_p),
            top_k: Some(p.top_k),
            min_p: Some(p.min_p),
            repetition_penalty: Some(p.repetition_penalty),
            presence_penalty: Some(p.presence_penalty),
            frequency_penalty: Some(p.frequency_penalty),
            seed: Some(p.seed),
        };
        self.logit_bias = p.logit_bias.clone();
        self.logprobs = p.logprobs;
        self
    }

    /// Constrains the output (JSON schema, JSON object, pattern, grammar).
    pub fn format(mut self, f: OutputConstraint) -> Self {
        self.format = Some(f);
        self
    }

    /// Adds a stop string.
    pub fn stop(mut self, s: impl Into<String>) -> Self {
        self.stop.push(s.into());
        self
    }

    /// Checks every option's range (what needs no model). Each route's entry point calls it.
    pub fn validate(&self) -> Result<(), Rejection> {
        let invalid = |field: Field, reason: String| Err(Rejection::Invalid { field, reason });
        if self.max_tokens == Some(0) {
            return invalid(Field::MaxTokens, "must be at least 1".into());
        }
        if self.reasoning_budget == Some(0) {
            return invalid(
                Field::ReasoningBudget,
                "budget_tokens must be at least 1".into(),
            );
        }
        if !(1..=defaults::MAX_CHOICES).contains(&self.n) {
            return invalid(
                Field::N,
                format!(
                    "must be between 1 and {}, got {}",
                    defaults::MAX_CHOICES,
                    self.n
                ),
            );
        }
        if self.stop.len() > defaults::MAX_STOP_STRINGS {
            return invalid(
                Field::Stop,
                format!("at most {} stop sequences", defaults::MAX_STOP_STRINGS),
            );
        }
        if self.stop.iter().any(String::is_empty) {
            return invalid(Field::Stop, "stop sequences must not be empty".into());
        }
        if self
            .logprobs
            .is_some_and(|k| k > defaults::MAX_TOP_LOGPROBS)
        {
            return invalid(
                Field::TopLogprobs,
                format!(
                    "at most {} top log-probabilities",
                    defaults::MAX_TOP_LOGPROBS
                ),
            );
        }
        let limit = defaults::LOGIT_BIAS_LIMIT;
        if self
            .logit_bias
            .iter()
            .any(|&(_, v)| !(-limit..=limit).contains(&v))
        {
            return invalid(
                Field::Sampling(SamplingField::LogitBias),
                format!("values must be in [-{limit}, {limit}]"),
            );
        }
        if self.tools.is_some() && !matches!(self.prompt, Prompt::Chat(_)) {
            return invalid(Field::Tools, "tools go with chat messages".into());
        }
        if !self.template_args.is_empty() && !matches!(self.prompt, Prompt::Chat(_)) {
            return invalid(
                Field::TemplateArgs,
                "template variables go with chat messages".into(),
            );
        }
        if let Some(name) = self
            .template_args
            .keys()
            .find(|k| TEMPLATE_INPUTS.contains(&k.as_str()))
        {
            return invalid(
                Field::TemplateArgs,
                format!("`{name}` is the template's own input; it cannot be set"),
            );
        }
        if self.tools.is_none()
            && matches!(
                self.tool_choice,
                ToolChoice::Required | ToolChoice::Function(_)
            )
        {
            return invalid(
                Field::ToolChoice,
                "a required tool call needs `tools`".into(),
            );
        }
        if let Prompt::Chat(m) = &self.prompt {
            if m.is_empty() {
                return invalid(Field::Prompt, "messages must not be empty".into());
            }
        }
        self.resolved_sampling(0, 0)
            .validate()
            .map_err(|e| Rejection::Invalid {
                field: Field::Sampling(e.field),
                reason: e.reason.into(),
            })
    }

    /// The seed of choice 0: the request's, else a fresh one (distinct per call, the same
    /// sequence on every run). Draw it once per request; choice i uses it + i.
    pub fn base_seed(&self) -> u64 {
        self.sampling
            .seed
            .unwrap_or_else(|| NEXT_SEED.fetch_add(1, Ordering::Relaxed))
    }

    /// The sampling of choice `choice` with the native defaults.
    fn resolved_sampling(&self, choice: usize, base_seed: u64) -> SamplingParams {
        let d = SamplingParams::default();
        let s = &self.sampling;
        let limit = defaults::LOGIT_BIAS_LIMIT;
        SamplingParams {
            temperature: s.temperature.unwrap_or(defaults::TEMPERATURE),
            top_p: s.top_p.unwrap_or(d.top_p),
            top_k: s.top_k.unwrap_or(d.top_k),
            min_p: s.min_p.unwrap_or(d.min_p),
            repetition_penalty: s.repetition_penalty.unwrap_or(d.repetition_penalty),
            presence_penalty: s.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: s.frequency_penalty.unwrap_or(d.frequency_penalty),
            logit_bias: self
                .logit_bias
                .iter()
                .map(|&(t, v)| (t, if v <= -limit { f32::NEG_INFINITY } else { v }))
                .collect(),
            seed: base_seed.wrapping_add(choice as u64),
            logprobs: self.logprobs,
            ..d
        }
    }

    /// The engine's options for choice `choice` (of `n`), unset options resolved with the
    /// native defaults; `base_seed` from [`GenerateRequest::base_seed`].
    pub fn options(&self, choice: usize, base_seed: u64) -> RequestOptions {
        RequestOptions {
            sampling: self.resolved_sampling(choice, base_seed),
            max_tokens: self.max_tokens.unwrap_or(defaults::MAX_TOKENS),
            stop_strings: self.stop.clone(),
            stop_tokens: self.stop_tokens.clone(),
            ignore_eos: self.ignore_eos,
            speculation: self.speculation,
            tool_format: None,
            thinking: None,
        }
    }
}

/// A request field, as named in rejections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// The prompt (messages, text or token ids).
    Prompt,
    /// `tools`.
    Tools,
    /// `max_tokens`.
    MaxTokens,
    /// A sampling option.
    Sampling(SamplingField),
    /// `stop`.
    Stop,
    /// `stop_tokens`.
    StopTokens,
    /// `logprobs`.
    Logprobs,
    /// `top_logprobs`.
    TopLogprobs,
    /// `n`.
    N,
    /// `ignore_eos`.
    IgnoreEos,
    /// `response_format` (the output constraint).
    ResponseFormat,
    /// `tool_choice`.
    ToolChoice,
    /// The chat template's variables (`chat_template_kwargs`).
    TemplateArgs,
    /// The thinking's bound (Anthropic's `thinking.budget_tokens`).
    ReasoningBudget,
}

impl Field {
    /// The field's name; the prompt is named by its kind (`messages`, `prompt`, `tokens`) by
    /// whoever knows the wire shape.
    pub fn name(self) -> &'static str {
        match self {
            Field::Prompt => "prompt",
            Field::Tools => "tools",
            Field::MaxTokens => "max_tokens",
            Field::Sampling(s) => s.name(),
            Field::Stop => "stop",
            Field::StopTokens => "stop_tokens",
            Field::Logprobs => "logprobs",
            Field::TopLogprobs => "top_logprobs",
            Field::N => "n",
            Field::IgnoreEos => "ignore_eos",
            Field::ResponseFormat => "response_format",
            Field::ToolChoice => "tool_choice",
            Field::TemplateArgs => "chat_template_kwargs",
            Field::ReasoningBudget => "thinking",
        }
    }
}

/// Why a request was refused: the request is at fault, and the field says where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Rejection {
    /// A field's value is out of range or malformed.
    #[error("{}: {reason}", field.name())]
    Invalid {
        /// Which field.
        field: Field,
        /// What is wrong.
        reason: String,
    },
    /// The prompt leaves no room to generate.
    #[error("prompt of {prompt_tokens} tokens does not fit the context of {context} tokens")]
    ContextOverflow {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Most tokens a sequence may hold.
        context: usize,
    },
    /// The route cannot honour the field (refused rather than ignored).
    #[error("{}: {reason}", field.name())]
    Unsupported {
        /// Which field.
        field: Field,
        /// Why this route cannot honour it.
        reason: String,
    },
}

impl Rejection {
    /// The field at fault.
    pub fn field(&self) -> Field {
        match self {
            Rejection::Invalid { field, .. } | Rejection::Unsupported { field, .. } => *field,
            Rejection::ContextOverflow { .. } => Field::Prompt,
        }
    }

    /// The reason without the field's name.
    pub fn reason(&self) -> String {
        match self {
            Rejection::Invalid { reason, .. } | Rejection::Unsupported { reason, .. } => {
                reason.clone()
            }
            Rejection::ContextOverflow { .. } => self.to_string(),
        }
    }

    /// An out-of-range or malformed field.
    pub fn invalid(field: Field, reason: impl Into<String>) -> Rejection {
        Rejection::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// A field the route cannot honour.
    pub fn unsupported(field: Field, reason: impl Into<String>) -> Rejection {
        Rejection::Unsupported {
            field,
            reason: reason.into(),
        }
    }
}

/// Refuses the first of `ids` outside a vocabulary of `vocab` tokens, naming `field`.
pub fn check_vocab(ids: &[TokenId], vocab: usize, field: Field) -> Result<(), Rejection> {
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(bad) => Err(Rejection::invalid(
            field,
            format!("token {bad} is outside the vocabulary ({vocab})"),
        )),
        None => Ok(()),
    }
}

impl From<AdmitError> for Rejection {
    fn from(e: AdmitError) -> Rejection {
        match e {
            AdmitError::EmptyPrompt => Rejection::invalid(Field::Prompt, "the prompt is empty"),
            AdmitError::PromptTooLong {
                prompt_tokens,
                context,
            } => Rejection::ContextOverflow {
                prompt_tokens,
                context,
            },
            AdmitError::Sampling(s) => Rejection::invalid(Field::Sampling(s.field), s.reason),
            AdmitError::Constraint(e) => Rejection::invalid(Field::ResponseFormat, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(r: GenerateRequest) -> Field {
        r.validate().expect_err("refused").field()
    }

    #[test]
    fn each_bad_field_is_named() {
        let base = || GenerateRequest::new("hi");
        assert!(base().validate().is_ok());
        assert_eq!(field_of(base().max_tokens(0)), Field::MaxTokens);
        let mut r = base();
        r.n = 9;
        assert_eq!(field_of(r), Field::N);
        let mut r = base();
        r.n = 0;
        assert_eq!(field_of(r), Field::N);
        let r = base().stop("a").stop("b").stop("c").stop("d").stop("e");
        assert_eq!(field_of(r), Field::Stop);
        assert_eq!(field_of(base().stop("")), Field::Stop);
        let mut r = base();
        r.logprobs = Some(21);
        assert_eq!(field_of(r), Field::TopLogprobs);
        let mut r = base();
        r.logit_bias = vec![(1, 101.0)];
        assert_eq!(field_of(r), Field::Sampling(SamplingField::LogitBias));
        let mut r = base();
        r.tools = Some(serde_json::json!([]));
        assert_eq!(field_of(r), Field::Tools);
        assert_eq!(
            field_of(GenerateRequest::new(Vec::<ChatMessage>::new())),
            Field::Prompt
        );
        let thinking_off = |r: GenerateRequest| r.template_arg("enable_thinking", false.into());
        assert_eq!(field_of(thinking_off(base())), Field::TemplateArgs);
        let chat = || GenerateRequest::new(vec![ChatMessage::new("user", "hi")]);
        assert!(thinking_off(chat()).validate().is_ok());
        let r = chat().template_arg("bos_token", "<evil>".into());
        assert_eq!(field_of(r), Field::TemplateArgs);
        for (f, set) in [
            (
                SamplingField::Temperature,
                (|r: &mut GenerateRequest| r.sampling.temperature = Some(-1.0))
                    as fn(&mut GenerateRequest),
            ),
            (SamplingField::TopP, |r| r.sampling.top_p = Some(0.0)),
            (SamplingField::MinP, |r| r.sampling.min_p = Some(1.5)),
            (SamplingField::RepetitionPenalty, |r| {
                r.sampling.repetition_penalty = Some(0.0)
            }),
            (SamplingField::PresencePenalty, |r| {
                r.sampling.presence_penalty = Some(f32::NAN)
            }),
            (SamplingField::FrequencyPenalty, |r| {
                r.sampling.frequency_penalty = Some(f32::INFINITY)
            }),
        ] {
            let mut r = base();
            set(&mut r);
            assert_eq!(field_of(r), Field::Sampling(f), "{f:?}");
        }
    }

    #[test]
    fn unset_options_take_the_defaults_once() {
        let r = GenerateRequest::new("hi").seed(7);
        let o = r.options(2, r.base_seed());
        assert_eq!(o.max_tokens, defaults::MAX_TOKENS);
        assert_eq!(o.sampling.temperature, defaults::TEMPERATURE);
        assert_eq!(o.sampling.seed, 9);
        assert!(o.speculation);
        let mut r = GenerateRequest::new("hi");
        r.logit_bias = vec![(3, -100.0), (4, 2.0)];
        let o = r.options(0, 0);
        assert_eq!(
            o.sampling.logit_bias,
            vec![(3, f32::NEG_INFINITY), (4, 2.0)]
        );
        // Requests without a seed get distinct ones; choices of one request seed + i; checking a
        // request draws none.
        let r = GenerateRequest::new("hi");
        let (a, b) = (r.base_seed(), r.base_seed());
        assert_ne!(a, b);
        assert_eq!(r.options(3, a).sampling.seed, a + 3);
        r.validate().expect("valid");
        assert_eq!(r.base_seed(), b + 1);
    }
}
