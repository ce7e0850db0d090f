//! Safe RAII wrappers over ggml, reached through `llama-cpp-sys-2`.
//!
//! This is the only crate in Axle that contains `unsafe` code. It exposes a small tensor and graph
//! API ([`Context`], [`Tensor`], [`Graph`]), backends and a scheduler ([`Backend`], [`GraphScheduler`]),
//! GGUF reading with mmap'd weights ([`GgufFile`], [`TensorStore`]) and, for tests and benchmarks
//! only, an in-process libllama oracle ([`oracle`]). It must not contain model policy: model graphs
//! live in `axle-models`.
#![deny(missing_docs)]

mod backend;
pub mod column_invariant;
mod dtype;
pub mod env;
mod error;
pub mod few_columns;
mod gguf;
pub mod huge_pages;
mod log;
pub mod meta;
pub mod oracle;
pub mod paged_attention;
mod quantize;
pub mod row_attention;
pub mod rpc;
mod store;
mod sysinfo;
mod tensor;
pub mod tiled_columns;
pub mod wide_replay;

pub use backend::{
    backend_search_dirs, load_dynamic_backends, serialize_cuda_launches, Backend, BufferType,
    Device, DeviceKind, GraphScheduler, LoadedBackend, PinnedHost,
};
pub use dtype::DType;
pub use error::{Error, Result};
pub use gguf::{map_file, GgufFile, MadeBytes, MetaValue, TensorInfo};
pub use log::quiet_logs;
pub use memmap2::Mmap;
pub use quantize::quantize_rows;
pub use store::{FusedWeight, StoredTensor, TensorStore, WeightFusion, WeightPlacement};
pub use sysinfo::{cpu_features, host_available_memory, system_info, CpuFeature};
/// A small deterministic generator for the kernels' self-checks (xorshift64).
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

pub use tensor::{Context, GluOp, Graph, RopeParams, Tensor, MROPE_SECTIONS, ROPE_TYPE_IMROPE};
