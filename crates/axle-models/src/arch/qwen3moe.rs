//! Qwen3-MoE (`qwen3moe` GGUF architecture: Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B):
//! the Qwen3 graph (NeoX RoPE, per-head QK norm) with every FFN a mixture of experts: softmax
//! router, top-k experts whose weights are renormalised to sum to 1, no shared expert.
use super::llama::{load_variant, MoeVariant, Variant};
use super::Family;
use crate::moe::{Gating, SharedGate};
use crate::ModelError;
use axle_ggml::{GgufFile, TensorStore};

/// Reads the config and binds the weights.
pub fn load(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    load_variant(
        f,
        store,
        Variant {
            arch: "qwen3moe",
            rope_mode: 2,
            qk_norm: true,
            ffn_norm: "ffn_norm",
            moe: Some(MoeVariant {
                gating: Gating::Softmax,
                norm_default: true,
                shared_gate: SharedGate::Sigmoid,
                shared_expert: false,
                leading_dense: false,
            }),
        },
    )
}
