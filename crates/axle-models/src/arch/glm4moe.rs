//! GLM-4.5 / GLM-4.6 (`glm4moe` GGUF architecture: GLM-4.5, GLM-4.5-Air, GLM-4.6): the Llama-shaped
//! graph with QKV biases, partial NeoX RoPE (`rope.dimension_count`, half the head in the released
//! files), per-head QK norm where the file has it (GLM-4.5), the pre-FFN norm named
//! `post_attention_norm`, dense FFNs in the first `leading_dense_block_count` layers and a mixture
//! of experts after them: sigmoid router with a selection bias, top-k weights renormalised and
//! scaled (`expert_weights_norm`, `expert_weights_scale`), and an ungated shared expert of
//! `expert_shared_count` routed widths. The multi-token-prediction layer the files carry after
//! the trunk (`nextn_predict_layers`) is the model's MTP head ([`super::nextn`]), which drafts.
//! Vision variants (M-RoPE sections, GLM-4.5V) are refused by name.
use super::llama::{load_variant, MoeVariant, Variant};
use super::Family;
use crate::moe::{Gating, SharedGate};
use crate::ModelError;
use axle_ggml::{GgufFile, TensorStore};

/// Reads the config and binds the weights.
pub fn load(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    if f.array_opt("glm4moe.rope.dimension_sections")?
        .is_some_and(|s| s.iter().any(|v| v.as_i64().unwrap_or(0) != 0))
    {
        return Err(ModelError::Unsupported(
            "glm4moe with M-RoPE sections (GLM-4.5V, a vision model): not implemented".into(),
        ));
    }
    load_variant(
        f,
        store,
        Variant {
            arch: "glm4moe",
            rope_mode: 2,
            qk_norm: false,
            ffn_norm: "post_attention_norm",
            moe: Some(MoeVariant {
                gating: Gating::Sigmoid,
                norm_default: false,
                shared_expert: true,
                shared_gate: SharedGate::Sigmoid,
                leading_dense: true,
            }),
        },
    )
}
