//! How an engine is sized: what callers set (context, KV pool, batch, drafts, KV type), the
//! checks on it, and the configuration the rest keeps defaults for.
use crate::engine::EngineConfig;
use crate::request::defaults;
use axle_models::kv::KvType;
use axle_models::Model;

/// What a caller sizes an engine by (CLI flags, Python keywords); the rest of [`EngineConfig`]
/// keeps its defaults (a caller sets its kernel choices on the sized configuration).
#[derive(Debug, Clone)]
pub struct EngineSizing {
    /// Context length per sequence (default: the model's, capped at [`defaults::CONTEXT`]).
    pub context: Option<usize>,
    /// KV slots shared by all sequences (default: `kv_contexts` full contexts, or fewer where
    /// the devices holding the KV have room for less, as long as one full context fits).
    pub kv_slots: Option<u32>,
    /// Full contexts the KV pool holds when `kv_slots` is not given.
    pub kv_contexts: usize,
    /// Most sequences per step.
    pub max_seqs: usize,
    /// Most tokens per step; raised to fit one token per sequence and a full draft (default:
    /// [`defaults::STEP_TOKENS`], or [`defaults::STEP_TOKENS_ACCELERATED`] where the whole
    /// model is on accelerators).
    pub max_batch_tokens: Option<usize>,
    /// Hybrid models: recurrent state slots (default: one per `max_seqs`).
    pub state_slots: Option<usize>,
    /// Longest n-gram draft (0: speculation off).
    pub draft_len: usize,
    /// How the KV cache stores keys and values: the default pool counts its slots in it.
    pub kv_type: KvType,
}

/// The longest context per sequence an engine takes (tokens): far past any model's, and small
/// enough that KV slot counts of a few contexts stay inside `u32`.
pub const MAX_CONTEXT: usize = 1 << 24;

/// A size option out of range: which one (as the Python package spells it) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{option} must be {range}, got {got}")]
pub struct SizeError {
    /// The option.
    pub option: &'static str,
    /// What it must be.
    pub range: String,
    /// What it was.
    pub got: usize,
}

impl EngineSizing {
    /// Refuses sizes that cannot work, naming the option.
    pub fn check(&self) -> Result<(), SizeError> {
        let within = |option: &'static str, v: Option<usize>, max: usize| match v {
            Some(got) if got == 0 || got > max => Err(SizeError {
                option,
                range: format!("1 to {max}"),
                got,
            }),
            _ => Ok(()),
        };
        within("context", self.context, MAX_CONTEXT)?;
        within(
            "kv_slots",
            self.kv_slots.map(|k| k as usize),
            u32::MAX as usize,
        )?;
        within("max_batch_size", Some(self.max_seqs), MAX_CONTEXT)?;
        within("max_batch_tokens", self.max_batch_tokens, MAX_CONTEXT)?;
        within("state_slots", self.state_slots, MAX_CONTEXT)
    }
}

/// The default step budget for `model` as placed (see [`EngineSizing::max_batch_tokens`]).
pub fn step_tokens(model: &Model) -> usize {
    match model.placement().head_device() {
        Some(_) => defaults::STEP_TOKENS_ACCELERATED,
        None => defaults::STEP_TOKENS,
    }
}

impl EngineConfig {
    /// The configuration `sizing` asks for on `model`.
    pub fn sized(model: &Model, sizing: &EngineSizing) -> EngineConfig {
        let ctx = sizing
            .context
            .unwrap_or_else(|| (model.n_ctx_train() as usize).min(defaults::CONTEXT));
        let max_seqs = sizing.max_seqs.max(1);
        let block_size = EngineConfig::default().block_size;
        let kv_slots = sizing.kv_slots.unwrap_or_else(|| {
            let wanted =
                u32::try_from(ctx.saturating_mul(sizing.kv_contexts.max(1))).unwrap_or(u32::MAX);
            // The tightest memory (a device's share of the layers, or the host's) caps the default
            // pool; below one full context the runner refuses with the count that would fit. A
            // model whose MTP head may draft keeps the head's KV beside the trunk's.
            let mtp_head = sizing.draft_len > 0 && model.family().mtp().is_some();
            match axle_models::runner::kv_slots_that_fit(
                model,
                block_size,
                sizing.kv_type,
                mtp_head,
            ) {
                Some(fit) if fit as usize >= ctx => wanted.min(fit),
                _ => wanted,
            }
        });
        EngineConfig {
            kv_slots,
            context: ctx,
            max_seqs,
            max_batch_tokens: sizing
                .max_batch_tokens
                .unwrap_or_else(|| step_tokens(model))
                .max(sizing.draft_len + 1)
                .max(max_seqs),
            draft_len: sizing.draft_len,
            state_slots: sizing.state_slots,
            kv_type: sizing.kv_type,
            ..Default::default()
        }
    }
}
