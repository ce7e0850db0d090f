//! Errors of the ggml wrapper: every failure of a ggml call that can fail on user input.
use std::path::PathBuf;

/// Errors raised by the ggml wrapper.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file does not start with the GGUF magic.
    #[error("{path} is not a GGUF file (bad magic {magic:?})")]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// The first bytes found.
        magic: String,
    },
    /// ggml's GGUF parser rejected the file.
    #[error("{path} is a malformed GGUF file: {detail}")]
    MalformedGguf {
        /// The file.
        path: PathBuf,
        /// What the parser could not read, in its words.
        detail: String,
    },
    /// The tensor data region is shorter than the header says.
    #[error("{path} is truncated: tensor data needs {needed} bytes but the file has {actual}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes the header implies.
        needed: u64,
        /// Bytes in the file.
        actual: u64,
    },
    /// A metadata key is missing.
    #[error("GGUF metadata key `{0}` is missing")]
    MissingKey(String),
    /// A metadata key has an unexpected type.
    #[error("GGUF metadata key `{key}` has type {found}, expected {expected}")]
    KeyType {
        /// The key.
        key: String,
        /// What it holds.
        found: &'static str,
        /// What was asked for.
        expected: &'static str,
    },
    /// A metadata value no model can have (a float that is NaN or infinite).
    #[error("GGUF metadata key `{key}` = {value} is not a finite number")]
    KeyNotFinite {
        /// The key.
        key: String,
        /// Its value.
        value: f64,
    },
    /// A tensor is missing from the file.
    #[error("tensor `{0}` is missing from the model file")]
    MissingTensor(String),
    /// A tensor has the wrong shape.
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        /// The tensor.
        name: String,
        /// Its shape.
        found: Vec<i64>,
        /// The expected shape.
        expected: Vec<i64>,
    },
    /// ggml could not allocate a context or buffer.
    #[error("ggml allocation failed: {0}")]
    Alloc(String),
    /// Graph computation failed.
    #[error("ggml graph computation failed with status {0}")]
    Compute(i32),
    /// A data transfer did not match the tensor.
    #[error(
        "tensor data size mismatch for `{name}`: tensor has {tensor} bytes, buffer has {given}"
    )]
    DataSize {
        /// The tensor.
        name: String,
        /// Bytes in the tensor.
        tensor: usize,
        /// Bytes given.
        given: usize,
    },
    /// No backend device matched the request.
    #[error("no ggml backend device: {0}")]
    NoDevice(String),
    /// Values that cannot be quantized to the type asked for.
    #[error("{0}")]
    Quantize(String),
    /// The libllama oracle failed.
    #[error("libllama oracle: {0}")]
    Oracle(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
