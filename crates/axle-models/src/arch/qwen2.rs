//! Qwen2 (`qwen2` GGUF architecture): the Llama graph with NeoX RoPE and biases on Q, K and V
//! (the biases are bound as optional tensors by the Llama family and are present in Qwen2 files).
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
            arch: "qwen2",
            rope_mode: 2,
            qk_norm: false,
            ffn_norm: "ffn_norm",
            moe: None,
        },
    )
}
