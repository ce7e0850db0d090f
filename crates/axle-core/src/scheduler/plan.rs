//! The scheduler's plain data: what a request asks for, the scheduler's configuration, the plan
//! of a step and what happened to each request in it.
use super::*;

/// What a request asks for.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// Prompt tokens (at least one).
    pub prompt: Vec<TokenId>,
    /// Sampling options.
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Tokens that end generation (EOS, end-of-turn, user stop ids); not emitted.
    pub stop_tokens: Vec<TokenId>,
    /// Allow n-gram speculation for this request (when the scheduler has it enabled).
    pub speculation: bool,
}

/// Why a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (EOS, end of turn, or a requested stop id).
    Stop,
    /// A stop string matched (decided by the caller, which sees text).
    StopString,
    /// max_tokens reached.
    Length,
    /// The sequence reached the context limit.
    ContextLimit,
    /// Cancelled by the client.
    Cancelled,
    /// Rejected or failed.
    Error(String),
}

/// Where a request is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Queued (new, or preempted and waiting to recompute).
    Waiting,
    /// Has KV blocks and is being computed.
    Running,
    /// Done.
    Finished(FinishReason),
}

/// Why a request cannot be queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// No prompt tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt leaves no room for a generated token.
    #[error("prompt of {prompt_tokens} tokens does not fit the context of {context} tokens")]
    PromptTooLong {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Most tokens a sequence may hold.
        context: usize,
    },
    /// A sampling option out of range.
    #[error(transparent)]
    Sampling(#[from] crate::sampler::SamplingError),
    /// The output constraint failed to start.
    #[error("the output constraint failed: {0}")]
    Constraint(String),
}

/// Scheduler limits.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most tokens computed in one step.
    pub max_batch_tokens: usize,
    /// Most sequences in one step.
    pub max_seqs: usize,
    /// KV blocks in the pool.
    pub n_blocks: u32,
    /// Slots per block.
    pub block_size: u32,
    /// Most tokens one sequence may hold (prompt + generated).
    pub context: usize,
    /// Reuse cached blocks of identical prefixes.
    pub prefix_caching: bool,
    /// Reuse a cached prefix only up to a block the caller marked reusable
    /// ([`Scheduler::set_reusable`]): for models whose state at a position is more than the KV of
    /// the tokens before it (recurrent layers), which the caller saves at some block boundaries.
    pub reuse_marked_only: bool,
    /// Model identity mixed into block hashes.
    pub model_id: u64,
    /// Prompt lengths (ascending) at which the engine's arithmetic for prompt rows changes, for
    /// engines that compute a row by its origin (prompt or generated) and its prompt's length
    /// (each row's numbers still depend on its own request alone). Block keys then name each
    /// block's [`BlockOrigin`], so a cached block is reused only where it holds the numbers the
    /// request would compute. Empty: every row is computed alike, and keys name tokens alone.
    pub prompt_classes: Vec<usize>,
    /// Speculation settings (None: off for every request).
    pub draft: Option<DraftConfig>,
    /// Recurrent models: per-sequence state slots (conv window and delta-rule state of every
    /// linear-attention layer), one per running sequence; None for attention-only models.
    pub state_slots: Option<u32>,
    /// Start each sequence in its own lane of the pool (`max_seqs` lanes; see
    /// [`BlockPool::with_lanes`]), so that sequences growing side by side keep their blocks
    /// consecutive: for runners that read a sequence's consecutive slots in place and gather
    /// scattered ones (device layouts). Off: the lowest free block first.
    pub kv_lanes: bool,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedSeq {
    /// The request.
    pub id: RequestId,
    /// Tokens to compute now.
    pub tokens: Vec<TokenId>,
    /// Position of the first of them.
    pub start_pos: u32,
    /// Length of the request's prompt: positions before it are prompt rows, later ones generated
    /// rows (see [`SchedulerConfig::prompt_classes`]).
    pub prompt_len: usize,
    /// Physical blocks of the sequence, covering every position up to the last token.
    pub block_table: Vec<BlockId>,
    /// Whether the last token's logits are needed (the catch-up reaches the known end).
    pub wants_logits: bool,
    /// How many of `tokens` (at the end) are draft tokens to verify; when non-zero, logits are
    /// needed for the last `n_draft + 1` tokens.
    pub n_draft: usize,
    /// The sequence's recurrent state slot (recurrent models). It changes only when the sequence
    /// starts over (admitted, or re-admitted after preemption).
    pub state_slot: Option<u32>,
    /// Whether the step may return each wanted row's largest-logit index instead of its logits
    /// ([`RowLogits::Picked`]): plain greedy sampling, no constraint, no logprobs. Fixed for the
    /// request's life, so a row is picked the same way in every step.
    pub pick: bool,
}

/// A step: what to compute.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepPlan {
    /// Sequences, in batch order.
    pub seqs: Vec<PlannedSeq>,
    /// Requests preempted while planning (they recompute later).
    pub preempted: Vec<RequestId>,
}

impl StepPlan {
    /// Tokens in the step.
    pub fn n_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }

    /// Whether there is nothing to compute.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}

/// What happened to a request in `apply`.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The request.
    pub id: RequestId,
    /// New tokens, in order (more than one when drafts were accepted; stop tokens not included).
    pub tokens: Vec<TokenId>,
    /// Set when the request finished.
    pub finished: Option<FinishReason>,
    /// Log-probabilities of `tokens`, one each, when the request asked for them.
    pub logprobs: Vec<TokenLogprob>,
    /// Draft tokens of the step that the model accepted.
    pub accepted: usize,
}

/// Per-request statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub generated_tokens: usize,
    /// Prompt tokens served from the prefix cache at the last admission.
    pub cached_tokens: usize,
    /// Times preempted.
    pub preemptions: u32,
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Verify steps.
    pub verifies: usize,
    /// Acceptance by draft position.
    pub positions: PositionStats,
    /// Draft counts by source (indexed by `DraftSource as usize`).
    pub by_source: BySource,
    /// Time spent on the output constraint's masks.
    pub constraint: ConstraintTiming,
}

/// A decoding request the draft model is asked to draft for.
#[derive(Debug, Clone, Copy)]
pub struct ModelAsk<'a> {
    /// The request.
    pub id: RequestId,
    /// Every token it knows (prompt and generated); the last one is not computed by the target
    /// yet, and the first draft token follows it.
    pub tokens: &'a [TokenId],
    /// Its prompt's length.
    pub prompt_len: usize,
    /// Its blocks: they cover every position up to the last draft token's.
    pub block_table: &'a [BlockId],
    /// Draft tokens wanted.
    pub len: usize,
}

/// The draft model, as the scheduler sees it: the engine runs it when the scheduler asks, all
/// asks of a step at once, and its KV lives in the same blocks as the target's (its own cache,
/// indexed by the same block tables).
pub trait ModelDrafter {
    /// Draft tokens for each ask, in order: up to its `len` (fewer or none where the model
    /// cannot; its errors never fail a request, which then decodes without its draft).
    fn draft(&mut self, asks: &[ModelAsk<'_>]) -> Vec<Vec<TokenId>>;
}
