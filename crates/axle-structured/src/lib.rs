//! Structured output for Axle: what a request's output must look like (a JSON schema, any JSON
//! object, a regular expression, a Lark grammar, a tool call), compiled by llguidance into a
//! per-request constraint that gives the scheduler a token mask at every step.
//!
//! - [`Vocabulary`]: a model's token bytes, as the grammar engine sees them.
//! - [`GrammarEngine`]: one per model; compiles an [`OutputConstraint`] into a [`Grammar`].
//! - [`Grammar::constraint`]: a fresh [`axle_core::TokenConstraint`] for one choice, whose masks
//!   are computed on a worker thread while the model runs its forward pass.
//! - [`tools`]: OpenAI tool definitions, the tool-call formats of model families, the grammar that
//!   forces a valid call, and the parser that finds calls in generated text.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod budget;
mod constraint;
mod digits;
mod format;
mod grammar_constraint;
mod limits;
pub mod reasoning;
pub mod tools;
mod vocabulary;

pub use constraint::{AnswerStart, Grammar, GrammarEngine};
pub use digits::{digit_limit, JSON_DIGIT_LIMIT};
pub use format::{JsonSchemaFormat, OutputConstraint, ResponseFormat};
pub use limits::{check_tool_schema, MAX_GRAMMAR_BYTES, MAX_GRAMMAR_DEPTH};
pub use vocabulary::Vocabulary;

/// Why a constraint cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StructuredError {
    /// The schema, pattern or grammar is wrong, or the grammar compiler cannot handle it.
    #[error("{0}")]
    Invalid(String),
    /// The grammar is over one of the limits on size and depth checked before compiling.
    #[error("{0}")]
    Limit(String),
    /// The tokenizer could not be turned into the grammar engine's vocabulary.
    #[error("the grammar engine cannot use this tokenizer: {0}")]
    Vocabulary(String),
    /// The worker thread could not start.
    #[error("cannot start the grammar worker: {0}")]
    Worker(String),
}
