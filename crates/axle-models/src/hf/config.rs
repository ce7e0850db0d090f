//! `config.json` → the GGUF metadata a family reads: which family (`model_type`), and its
//! hyperparameters under the keys `convert_hf_to_gguf.py` writes.
use crate::ModelError;
use axle_ggml::MetaValue;
use serde_json::Value;
use std::collections::BTreeMap;

/// The family a `model_type` loads as, and whether its Q and K rows are stored for rotary
/// halves (Hugging Face) where the family rotates pairs (GGUF's `llama`): those get permuted.
pub(super) struct Family {
    /// The GGUF architecture.
    pub arch: &'static str,
    /// Q and K rows need llama.cpp's permutation (rotate-half order to interleaved pairs).
    pub permute_qk: bool,
    /// Every layer's FFN is a mixture of experts, configured as Qwen's MoE configs write it.
    pub moe: bool,
    /// Gemma's norms: RMS norms that scale by `1 + w` (GGUF stores `1 + w`), four per layer,
    /// local (sliding-window) and global layers.
    pub gemma: bool,
}

/// The `model_type`s read natively.
const FAMILIES: &[(&str, Family)] = &[
    (
        "llama",
        Family {
            arch: "llama",
            permute_qk: true,
            moe: false,
            gemma: false,
        },
    ),
    (
        "mistral",
        Family {
            arch: "llama",
            permute_qk: true,
            moe: false,
            gemma: false,
        },
    ),
    (
        "qwen2",
        Family {
            arch: "qwen2",
            permute_qk: false,
            moe: false,
            gemma: false,
        },
    ),
    (
        "qwen3",
        Family {
            arch: "qwen3",
            permute_qk: false,
            moe: false,
            gemma: false,
        },
    ),
    (
        "qwen3_moe",
        Family {
            arch: "qwen3moe",
            permute_qk: false,
            moe: true,
            gemma: false,
        },
    ),
    (
        "gemma3_text",
        Family {
            arch: "gemma3",
            permute_qk: false,
            moe: false,
            gemma: true,
        },
    ),
];

/// The families read from safetensors folders, by `model_type`.
pub fn supported() -> Vec<&'static str> {
    FAMILIES.iter().map(|(t, _)| *t).collect()
}

fn invalid(what: String) -> ModelError {
    ModelError::Invalid(format!("config.json: {what}"))
}

/// A positive integer field.
fn count(c: &Value, key: &str) -> Result<Option<u64>, ModelError> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 && n <= u32::MAX as u64 => Ok(Some(n)),
            _ => Err(invalid(format!("`{key}` is {v}, not a positive integer"))),
        },
    }
}

fn required(c: &Value, key: &str) -> Result<u64, ModelError> {
    count(c, key)?.ok_or_else(|| invalid(format!("`{key}` is missing")))
}

/// A finite positive float field.
fn positive(c: &Value, key: &str) -> Result<Option<f64>, ModelError> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
            _ => Err(invalid(format!("`{key}` is {v}, not a positive number"))),
        },
    }
}

/// The family and the metadata of a config.
pub(super) fn read(
    c: &Value,
) -> Result<(&'static Family, BTreeMap<String, MetaValue>), ModelError> {
    let model_type = c
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("`model_type` is missing".into()))?;
    let family = FAMILIES
        .iter()
        .find(|(t, _)| *t == model_type)
        .map(|(_, f)| f)
        .ok_or_else(|| ModelError::UnsupportedArch {
            arch: format!("{model_type} (safetensors)"),
            supported: supported().join(", "),
        })?;
    let linear = |r: &Value| r.get("rope_type").or_else(|| r.get("type")) == Some(&"linear".into());
    let rope_scaling = c.get("rope_scaling").filter(|r| !r.is_null());
    if let Some(r) = rope_scaling.filter(|r| !(family.gemma && linear(r))) {
        return Err(ModelError::Unsupported(format!(
            "rope_scaling {r} in a safetensors folder (a GGUF of the model carries it)"
        )));
    }
    if c.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
        return Err(ModelError::Unsupported(
            "use_sliding_window in a safetensors folder".into(),
        ));
    }
    let arch = family.arch;
    let mut m = BTreeMap::new();
    let key = |k: &str| format!("{arch}.{k}");
    let uint = |v: u64| MetaValue::UInt(v);
    m.insert("general.architecture".into(), MetaValue::Str(arch.into()));
    let heads = required(c, "num_attention_heads")?;
    let hidden = required(c, "hidden_size")?;
    m.insert(key("embedding_length"), uint(hidden));
    m.insert(key("block_count"), uint(required(c, "num_hidden_layers")?));
    m.insert(
        key("feed_forward_length"),
        uint(required(c, "intermediate_size")?),
    );
    m.insert(key("attention.head_count"), uint(heads));
    let kv = count(c, "num_key_value_heads")?.unwrap_or(heads);
    m.insert(key("attention.head_count_kv"), uint(kv));
    if let Some(hd) = count(c, "head_dim")? {
        m.insert(key("attention.key_length"), uint(hd));
        m.insert(key("attention.value_length"), uint(hd));
    }
    if let Some(n) = count(c, "max_position_embeddings")? {
        m.insert(key("context_length"), uint(n));
    }
    if let Some(n) = count(c, "vocab_size")? {
        m.insert(key("vocab_size"), uint(n));
    }
    if let Some(t) = positive(c, "rope_theta")? {
        m.insert(key("rope.freq_base"), MetaValue::Float(t));
    }
    if family.moe {
        experts(c, &mut m, arch)?;
    }
    if family.gemma {
        gemma(c, &mut m, arch)?;
    }
    let eps = positive(c, "rms_norm_eps")?.unwrap_or(1e-6);
    m.insert(
        key("attention.layer_norm_rms_epsilon"),
        MetaValue::Float(eps),
    );
    Ok((family, m))
}

/// A mixture of experts in every layer: `num_experts`, `num_experts_per_tok`,
/// `moe_intermediate_size` and `norm_topk_prob` (Transformers' default: off). Configs with dense
/// layers among the experts (`mlp_only_layers`, `decoder_sparse_step` above 1) are refused by name.
fn experts(c: &Value, m: &mut BTreeMap<String, MetaValue>, arch: &str) -> Result<(), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    if count(c, "decoder_sparse_step")?.is_some_and(|s| s != 1) {
        return Err(ModelError::Unsupported(
            "decoder_sparse_step above 1 (dense layers among the experts) in a safetensors folder"
                .into(),
        ));
    }
    if c.get("mlp_only_layers")
        .and_then(Value::as_array)
        .is_some_and(|l| !l.is_empty())
    {
        return Err(ModelError::Unsupported(
            "mlp_only_layers (dense layers among the experts) in a safetensors folder".into(),
        ));
    }
    m.insert(
        key("expert_count"),
        MetaValue::UInt(required(c, "num_experts")?),
    );
    m.insert(
        key("expert_used_count"),
        MetaValue::UInt(required(c, "num_experts_per_tok")?),
    );
    m.insert(
        key("expert_feed_forward_length"),
        MetaValue::UInt(required(c, "moe_intermediate_size")?),
    );
    let norm = match c.get("norm_topk_prob") {
        None | Some(Value::Null) => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| invalid(format!("`norm_topk_prob` is {v}, not a boolean")))?,
    };
    m.insert(key("expert_weights_norm"), MetaValue::Bool(norm));
    Ok(())
}

/// Gemma 3's local and global layers: the window, which layers are local (`layer_types`, else
/// one global layer in `sliding_window_pattern`), the local layers' RoPE base, linear RoPE scaling
/// of the global ones, and the final logit softcap. A query scale other than one over the root of
/// the head size (`query_pre_attn_scalar`) is refused by name.
fn gemma(c: &Value, m: &mut BTreeMap<String, MetaValue>, arch: &str) -> Result<(), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let head_dim = required(c, "head_dim")?;
    if let Some(s) = positive(c, "query_pre_attn_scalar")? {
        if s != head_dim as f64 {
            return Err(ModelError::Unsupported(format!(
                "query_pre_attn_scalar {s} other than head_dim {head_dim} in a safetensors folder"
            )));
        }
    }
    if let Some(w) = count(c, "sliding_window")? {
        m.insert(key("attention.sliding_window"), MetaValue::UInt(w));
    }
    match c.get("layer_types").and_then(Value::as_array) {
        Some(types) => {
            let local = types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(MetaValue::Bool(true)),
                    Some("full_attention") => Ok(MetaValue::Bool(false)),
                    _ => Err(invalid(format!("`layer_types` holds {t}"))),
                })
                .collect::<Result<_, _>>()?;
            m.insert(
                key("attention.sliding_window_pattern"),
                MetaValue::Array(local),
            );
        }
        None => {
            if let Some(p) = count(c, "sliding_window_pattern")? {
                m.insert(key("attention.sliding_window_pattern"), MetaValue::UInt(p));
            }
        }
    }
    if let Some(b) = positive(c, "rope_local_base_freq")? {
        m.insert(key("rope.freq_base_swa"), MetaValue::Float(b));
    }
    if let Some(r) = c.get("rope_scaling").filter(|r| !r.is_null()) {
        let factor = positive(r, "factor")?
            .ok_or_else(|| invalid(format!("rope_scaling {r} has no factor")))?;
        m.insert(key("rope.scaling.type"), MetaValue::Str("linear".into()));
        m.insert(key("rope.scaling.factor"), MetaValue::Float(factor));
    }
    if let Some(s) = positive(c, "final_logit_softcapping")? {
        m.insert(key("final_logit_softcapping"), MetaValue::Float(s));
    }
    if c.get("attn_logit_softcapping")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ModelError::Unsupported(
            "attn_logit_softcapping in a safetensors folder".into(),
        ));
    }
    Ok(())
}
