//! Axle's SDK. [`EngineCore`] drives one model synchronously (core plans, runner executes, core
//! applies); [`Session`] owns a model and runs an `EngineCore` in a thread of its own, fed by a
//! channel, streaming events per request. Dropping a stream cancels its request and frees its KV.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod backend;
pub mod delegate;
mod engine;
mod session;
mod stop;

pub use engine::{EngineConfig, EngineCore, Output, RequestOptions};
pub use session::{
    Completion, EngineStats, GenerateRequest, Prompt, Session, StreamEvent, TokenStream,
};
pub use stop::StopMatcher;

pub use backend::{BackendKind, Policy, RuntimeReport, SupportTier};
pub use delegate::{DelegateError, DelegatedInput, DelegatedRequest, Upstream};

pub use axle_core::{FinishReason, PositionStats, RequestId, SamplingParams, TokenLogprob};
pub use axle_models::{ChatMessage, DeviceChoice, Model, ModelOptions};

/// Errors of the SDK.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// Model loading or execution failed.
    #[error(transparent)]
    Model(#[from] axle_models::ModelError),
    /// The request was rejected (empty prompt, over the context, bad options).
    #[error("{0}")]
    Rejected(String),
    /// The engine thread is gone.
    #[error("the engine has stopped")]
    EngineStopped,
}
