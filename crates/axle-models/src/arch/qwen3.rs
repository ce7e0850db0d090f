//! Qwen3 (`qwen3` GGUF architecture): the Llama graph with NeoX RoPE, no QKV biases, and a
//! per-head RMSNorm on queries and keys before RoPE. Head size comes from `qwen3.attention.key_length`
//! and need not equal hidden / heads.
use super::llama::{load_variant, Variant};
use super::Family;
use crate::ModelError;
use axle_ggml::{GgufFile, TensorStore};

/// Reads the config and binds the weights.
pub fn load(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    load_variant(
        f,
        store,
        Variant {
            arch: "qwen3",
            rope_mode: 2,
            qk_norm: true,
            ffn_norm: "ffn_norm",
            moe: None,
        },
    )
}
