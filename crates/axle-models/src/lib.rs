//! Axle's models: GGUF weights bound to one hand-written graph per architecture family, the
//! tokenizers and chat templates that go with them, and the [`Runner`] that executes a step of a
//! core plan as one ggml graph. Model files never touch raw pointers (that is `axle-ggml`'s job)
//! and never decide policy (that is `axle-core`'s).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod arch;
pub mod chat;
mod choice;
pub mod device_step;
pub mod fetched;
mod heads;
pub mod hf;
pub mod kv;
pub mod layers;
pub mod model;
pub mod moe;
mod pieces;
pub mod placement;
pub mod pooling;
pub mod quantize;
pub mod recurrent;
pub mod runner;
pub mod sequence;
pub mod small_products;
pub mod stacked_attention;
pub mod tensor_split;
pub mod tokenizer;
mod weights;

pub use chat::{ChatError, ChatMessage, ChatTemplate, TemplateVars, TEMPLATE_INPUTS};
pub use layers::{HostKernels, Kernels, RowValues};
pub use model::{
    default_threads, FusedProjections, HostMemory, Model, ModelOptions, MAX_THREADS_PER_CORE,
};
pub use placement::{DeviceChoice, LayerRange, Placement, PlacementRequest, SplitMode};
pub use pooling::{Pooled, Pooling};
pub use recurrent::StateSlots;
pub use runner::{LogitRows, Runner, RunnerOptions, SeqInput, StepOutput, StepProfile};
pub use sequence::Sequence;
pub use tokenizer::{StreamDecoder, TokenId, TokenKind, Tokenizer};

/// Errors of model loading and execution.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// File, format or ggml failure.
    #[error(transparent)]
    Ggml(#[from] axle_ggml::Error),
    /// Tokenizer construction failure.
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    /// Chat template failure.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// The file's architecture has no family here.
    #[error("unsupported model architecture `{arch}` (supported: {supported})")]
    UnsupportedArch {
        /// The architecture in the file.
        arch: String,
        /// What Axle implements.
        supported: String,
    },
    /// A variant of a supported architecture that Axle does not implement (named in the message).
    #[error("unsupported model variant: {0}")]
    Unsupported(String),
    /// Inconsistent hyperparameters.
    #[error("invalid model: {0}")]
    Invalid(String),
    /// A load option out of range (named in the message).
    #[error("invalid option: {0}")]
    Option(String),
    /// The prompt and generation do not fit the context.
    #[error("prompt of {tokens} tokens does not fit the context of {limit} tokens")]
    ContextOverflow {
        /// Tokens needed.
        tokens: usize,
        /// The limit.
        limit: usize,
    },
    /// A malformed step.
    #[error("bad batch: {0}")]
    Batch(String),
    /// The asked-for device is not registered.
    #[error("no device `{asked}` (devices here: {available}; GPU backends load from {searched})")]
    NoDevice {
        /// What was asked for.
        asked: String,
        /// The registered devices.
        available: String,
        /// Where backends were looked for.
        searched: String,
    },
}
