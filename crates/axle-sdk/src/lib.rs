//! Axle's SDK: one request type and one event stream for every route.
//!
//! - [`GenerateRequest`]: what to generate, with unset options left to the route's defaults
//!   ([`defaults`]); refused requests come back as a typed [`Rejection`] naming the field.
//! - [`Generator`]: who generates, Axle's engine ([`Session`]) or an upstream server
//!   ([`Upstream`]); [`Generator::start`] gives one async [`EventStream`] per choice.
//! - [`EngineCore`]: one model driven synchronously (core plans, runner executes, core
//!   applies); a [`Session`] runs it in a thread of its own. Dropping a stream cancels its
//!   request and frees its KV.
//!
//! ```no_run
//! use axle_sdk::{EngineConfig, GenerateRequest, Model, ModelOptions, Session};
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = Arc::new(Model::load("SmolLM2-135M-Instruct.Q4_1.gguf", &ModelOptions::default())?);
//! let session = Session::new(model, EngineConfig::default())?;
//! let done = session.generate(&GenerateRequest::new("The capital of France is").greedy().max_tokens(16))?;
//! println!("{} ({} tokens)", done.text, done.tokens.len());
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod delegate;
mod draft_model;
mod embedder;
mod engine;
mod events;
mod generator;
mod request;
pub mod route;
mod session;
mod sizing;
mod stop;
mod structured;

pub use axle_models::pooling::normalize;
pub use axle_structured::tools::{ToolCall, ToolChoice, ToolFormat};
pub use axle_structured::{JsonSchemaFormat, OutputConstraint, ResponseFormat};
pub use embedder::{Embedder, EmbedderConfig, Embeddings};
pub use engine::{Drained, EngineConfig, EngineCore, KvType, Output, RequestOptions};
pub use events::{Completion, Finish, Speculation, StreamEvent, Timing, Usage};
pub use generator::{Delivery, EventStream, Generator};
pub use request::{
    check_vocab, defaults, Field, GenerateRequest, Prompt, Rejection, SamplingOptions,
};
pub use session::{EngineStats, Session, TokenStream};
pub use sizing::{EngineSizing, SizeError, MAX_CONTEXT};
pub use stop::StopMatcher;

pub use delegate::{DelegateError, Upstream};
pub use route::{RoutePolicy, RouteSpec, RuntimeKind, RuntimeReport, SupportTier};

pub use axle_core::{
    BySource, DraftSource, DraftSources, FinishReason, PositionStats, RequestId, SamplingField,
    SamplingParams, SourceCounts, TokenLogprob, DRAFT_SOURCES, MAX_DRAFT,
};
pub use axle_models::{
    fetched, ChatMessage, DeviceChoice, Model, ModelOptions, Pooling, TokenId, Tokenizer,
};

/// The README's Rust blocks run as doctests of this crate.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// Errors of the SDK.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// Model loading or execution failed.
    #[error(transparent)]
    Model(#[from] axle_models::ModelError),
    /// The request was refused; the rejection names the field.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// The engine's configuration cannot work (draft length over the step budget, ...).
    #[error("{0}")]
    Config(String),
    /// The upstream of a delegated route failed or refused.
    #[error(transparent)]
    Upstream(#[from] DelegateError),
    /// A step of this request failed on the device; the engine keeps serving others.
    #[error("generation failed: {0}")]
    Generation(String),
    /// No route could be chosen for the model.
    #[error(transparent)]
    Route(#[from] route::ResolveError),
    /// The engine thread is gone.
    #[error("the engine has stopped")]
    EngineStopped,
}
