//! Axle's core: the policy layer above the kernels, as plain deterministic data structures.
//!
//! It decides which tokens run, where their KV lives and which token comes next; it never sees a
//! tensor, never does I/O, and waits only where a request's output constraint (implemented
//! outside, see [`constraint`]) is still computing its mask. The runner (in `axle-models`)
//! executes what this crate plans, and hands back logits for it to apply.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod blocks;
pub mod constraint;
pub mod drafter;
pub mod sampler;
pub mod scheduler;
pub mod states;

pub use blocks::{BlockId, BlockOrigin, BlockPool};
pub use constraint::{Advanced, Allowed, ConstraintTiming, TokenConstraint, TokenMask};
pub use drafter::{
    BySource, DraftConfig, DraftSource, DraftSources, Drafter, MatchClass, PositionStats,
    SourceCounts, SuffixCache, DRAFT_SOURCES, MAX_DRAFT,
};
pub use sampler::{RowLogits, Sampler, SamplingError, SamplingField, SamplingParams, TokenLogprob};
pub use scheduler::{
    AdmitError, Event, FinishReason, ModelAsk, ModelDrafter, Phase, PlannedSeq, RequestId,
    RequestSpec, Scheduler, SchedulerConfig, StepPlan,
};
pub use states::{RecurrentStates, Save, StateSlots};

/// A token id.
pub type TokenId = u32;
