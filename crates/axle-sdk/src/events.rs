//! What a request produces, the same for every route: a stream of [`StreamEvent`]s ending in one
//! [`Finish`], or, run to the end, one [`Completion`].
use crate::SdkError;
use axle_core::{BySource, ConstraintTiming, FinishReason, PositionStats, TokenLogprob};
use axle_models::TokenId;
use axle_structured::tools::ToolCall;

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Generated tokens inside the thinking (models whose template marks it): those generated
    /// while the thinking was open, its closing marker's included.
    pub reasoning_tokens: usize,
}

/// What speculation did for a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Speculation {
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Verify steps.
    pub verifies: usize,
    /// Acceptance by draft position.
    pub positions: PositionStats,
    /// Counts by drafter (indexed by `DraftSource as usize`).
    pub by_source: BySource,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// Why it ended.
    pub reason: FinishReason,
    /// Token counts: always reported by native routes; by delegated ones when the upstream
    /// reports them.
    pub usage: Option<Usage>,
    /// Speculation counts (native routes).
    pub speculation: Box<Speculation>,
    /// The finish reason as a delegated upstream gave it (`tool_calls`, `content_filter`, ...),
    /// passed on as it is.
    pub upstream_reason: Option<String>,
    /// Tool calls found in the output (their text is not part of the content).
    pub tool_calls: Vec<ToolCall>,
    /// The stop string that ended it (native routes; with [`FinishReason::StopString`]).
    pub stop_string: Option<String>,
    /// Time spent on the output constraint's masks (native routes).
    pub constraint: ConstraintTiming,
    /// When tokens came out of the engine's steps (native routes that generated any), as the
    /// engine saw it rather than as a reader of the stream sees it.
    pub timing: Option<Timing>,
}

/// A request's times as the engine saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// From submission to the first generated token.
    pub first_token: std::time::Duration,
    /// From the first generated token to the end.
    pub decode: std::time::Duration,
}

impl Finish {
    /// OpenAI's name of the finish reason (an upstream's own, on delegated routes).
    pub fn openai_reason(&self) -> &str {
        if let Some(r) = &self.upstream_reason {
            return r;
        }
        if !self.tool_calls.is_empty() {
            return "tool_calls";
        }
        match self.reason {
            FinishReason::Length | FinishReason::ContextLimit => "length",
            _ => "stop",
        }
    }
}

/// One event of a request's stream.
#[derive(Debug)]
pub enum StreamEvent {
    /// A generated token and the text it completed (possibly empty while a character or a
    /// possible stop string is incomplete).
    Token {
        /// The token id (None on delegated routes, whose vocabulary is the upstream's).
        token: Option<TokenId>,
        /// Answer text to append.
        text: String,
        /// Reasoning text to append (models whose template marks thinking; else empty).
        reasoning: String,
        /// Its log-probabilities, when asked for.
        logprob: Option<TokenLogprob>,
    },
    /// The request ended; `text` is the last text to append.
    Done {
        /// Final answer text.
        text: String,
        /// Final reasoning text.
        reasoning: String,
        /// How it ended.
        finish: Finish,
    },
    /// The request failed part-way (the engine step or the upstream failed); the stream ends.
    Error(SdkError),
}

/// What one event appends: reasoning text, answer text, and the finish at the end.
pub type Pieces = (String, String, Option<Finish>);

impl StreamEvent {
    /// The reasoning and answer text the event appends and, at the end, the finish; the error
    /// of a failed stream.
    pub fn into_pieces(self) -> Result<Pieces, SdkError> {
        match self {
            StreamEvent::Token {
                text, reasoning, ..
            } => Ok((reasoning, text, None)),
            StreamEvent::Done {
                text,
                reasoning,
                finish,
            } => Ok((reasoning, text, Some(finish))),
            StreamEvent::Error(e) => Err(e),
        }
    }
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Generated answer text.
    pub text: String,
    /// The thinking before the answer (models whose template marks it; else empty).
    pub reasoning: String,
    /// Generated token ids (empty on delegated routes).
    pub tokens: Vec<TokenId>,
    /// Log-probabilities of the tokens, when asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// How it ended.
    pub finish: Finish,
}

impl Completion {
    /// Folds an event into a completion under construction (start from
    /// [`Completion::empty`]); `Err` on a failure event. Returns true once the request is done.
    pub fn absorb(&mut self, ev: StreamEvent) -> Result<bool, SdkError> {
        match ev {
            StreamEvent::Token {
                token,
                text,
                reasoning,
                logprob,
            } => {
                self.tokens.extend(token);
                self.text.push_str(&text);
                self.reasoning.push_str(&reasoning);
                self.logprobs.extend(logprob);
                Ok(false)
            }
            StreamEvent::Done {
                text,
                reasoning,
                finish,
            } => {
                self.text.push_str(&text);
                self.reasoning.push_str(&reasoning);
                self.finish = finish;
                Ok(true)
            }
            StreamEvent::Error(e) => Err(e),
        }
    }

    /// Nothing generated yet.
    pub fn empty() -> Completion {
        Completion {
            text: String::new(),
            reasoning: String::new(),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: Finish {
                reason: FinishReason::Stop,
                usage: None,
                speculation: Box::default(),
                upstream_reason: None,
                tool_calls: Vec::new(),
                stop_string: None,
                constraint: ConstraintTiming::default(),
                timing: None,
            },
        }
    }
}
