//! Qwen2-MoE (`qwen2moe` GGUF architecture: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): the Qwen2 graph
//! (NeoX RoPE, QKV biases) with every FFN a mixture of experts: softmax router, top-k experts with
//! unnormalised weights, plus a shared expert scaled per token by a sigmoid gate.
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
            arch: "qwen2moe",
            rope_mode: 2,
            qk_norm: false,
            ffn_norm: "ffn_norm",
            moe: Some(MoeVariant {
                gating: Gating::Softmax,
                norm_default: false,
                shared_gate: SharedGate::SiluOverInput,
                shared_expert: true,
                leading_dense: false,
            }),
        },
    )
}
