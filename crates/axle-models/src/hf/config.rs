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
    /// Hybrid layers: gated delta net layers between full-attention ones, norms that scale by
    /// `1 + w` but the delta net's own (see [`super::delta`]).
    pub delta: Option<Values>,
    /// Multi-head latent attention and DeepSeek's mixture of experts (see [`super::mla`]).
    pub mla: bool,
    /// gpt-oss: attention sinks, alternating sliding-window layers, MXFP4 experts with biases
    /// (see [`super::oss`]).
    pub oss: bool,
    /// Gemma 4: local and global layers of their own head sizes, proportional RoPE on the global
    /// ones, shared KV, per-layer embeddings; norms stored as they are (GGUF too).
    pub gemma4: bool,
}

/// How a gated delta net family's GGUF orders the value heads of a key head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Values {
    /// Tiled (Qwen 3.5): the folder's grouped value heads are reordered at load.
    Tiled,
    /// Grouped, as the folder has them (Qwen3-Next, whose family repeats key heads in runs); its
    /// folders fuse queries, keys, values and the output gate per key head (`in_proj_qkvz`).
    Grouped,
}

/// The `model_type`s read natively, each with the family it loads as.
/// A family with none of the layouts above: the fields the table below leaves out.
const PLAIN: Family = Family {
    arch: "",
    permute_qk: false,
    moe: false,
    gemma: false,
    delta: None,
    mla: false,
    oss: false,
    gemma4: false,
};

const FAMILIES: &[(&[&str], Family)] = &[
    (
        &["llama", "mistral"],
        Family {
            arch: "llama",
            permute_qk: true,
            ..PLAIN
        },
    ),
    (
        &["qwen2"],
        Family {
            arch: "qwen2",
            ..PLAIN
        },
    ),
    (
        &["qwen3"],
        Family {
            arch: "qwen3",
            ..PLAIN
        },
    ),
    (
        &["qwen3_moe"],
        Family {
            arch: "qwen3moe",
            moe: true,
            ..PLAIN
        },
    ),
    (
        &["gemma3_text", "gemma3"],
        Family {
            arch: "gemma3",
            gemma: true,
            ..PLAIN
        },
    ),
    (
        &["qwen3_5", "qwen3_5_text"],
        Family {
            arch: "qwen35",
            delta: Some(Values::Tiled),
            ..PLAIN
        },
    ),
    (
        &["qwen3_5_moe", "qwen3_5_moe_text"],
        Family {
            arch: "qwen35moe",
            moe: true,
            delta: Some(Values::Tiled),
            ..PLAIN
        },
    ),
    (
        &["qwen3_next"],
        Family {
            arch: "qwen3next",
            moe: true,
            delta: Some(Values::Grouped),
            ..PLAIN
        },
    ),
    (
        &["gemma4_text", "gemma4"],
        Family {
            arch: "gemma4",
            gemma4: true,
            ..PLAIN
        },
    ),
    (
        &["gpt_oss"],
        Family {
            arch: "gpt-oss",
            oss: true,
            ..PLAIN
        },
    ),
    (
        &["deepseek_v3", "glm4_moe_lite"],
        Family {
            arch: "deepseek2",
            mla: true,
            ..PLAIN
        },
    ),
];

/// The families read from safetensors folders, by `model_type`.
pub fn supported() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|(t, _)| t.iter().copied())
        .collect()
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

/// The experts' count, how many a token takes and their width, from the config's fields of
/// those names (each family names them its own way).
fn expert_counts(
    c: &Value,
    m: &mut BTreeMap<String, MetaValue>,
    arch: &str,
    fields: [&str; 3],
) -> Result<(), ModelError> {
    let keys = [
        "expert_count",
        "expert_used_count",
        "expert_feed_forward_length",
    ];
    for (k, field) in keys.into_iter().zip(fields) {
        m.insert(format!("{arch}.{k}"), MetaValue::UInt(required(c, field)?));
    }
    Ok(())
}

/// Refuses a config whose boolean `key` is set (`what`: what it turns on), naming it.
fn refuse_flag(c: &Value, key: &str, what: &str) -> Result<(), ModelError> {
    match c.get(key).and_then(Value::as_bool) {
        Some(true) => Err(ModelError::Unsupported(format!(
            "{key} ({what}) in a safetensors folder"
        ))),
        _ => Ok(()),
    }
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

/// A vision-language checkpoint's config (its language model's under `text_config`) as the
/// language model's own, keeping the top level's `model_type`; any other config as it is.
pub(super) fn language_model(c: &Value) -> Value {
    let Some(text) = c.get("text_config").and_then(Value::as_object) else {
        return c.clone();
    };
    let mut out = text.clone();
    for (k, v) in c.as_object().into_iter().flatten() {
        if k == "model_type" || !(out.contains_key(k) || k.ends_with("_config")) {
            out.insert(k.clone(), v.clone());
        }
    }
    Value::Object(out)
}

/// The family and the metadata of a config.
pub(super) fn read(
    c: &Value,
) -> Result<(&'static Family, BTreeMap<String, MetaValue>), ModelError> {
    let mut c = language_model(c);
    let model_type = c
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("`model_type` is missing".into()))?;
    let family = FAMILIES
        .iter()
        .find(|(t, _)| t.contains(&model_type))
        .map(|(_, f)| f)
        .ok_or_else(|| ModelError::UnsupportedArch {
            arch: format!("{model_type} (safetensors)"),
            supported: supported().join(", "),
        })?;
    if family.gemma {
        gemma_defaults(&mut c);
    }
    rope_parameters(&mut c);
    let c = &c;
    let linear = |r: &Value| r.get("rope_type").or_else(|| r.get("type")) == Some(&"linear".into());
    let rope_scaling = c.get("rope_scaling").filter(|r| !r.is_null());
    let yarn = |r: &Value| r.get("rope_type").or_else(|| r.get("type")) == Some(&"yarn".into());
    if let Some(r) = rope_scaling
        .filter(|r| !((family.gemma && linear(r)) || ((family.mla || family.oss) && yarn(r))))
    {
        return Err(ModelError::Unsupported(format!(
            "rope_scaling {r} in a safetensors folder (a GGUF of the model carries it)"
        )));
    }
    refuse_flag(c, "use_sliding_window", "a window")?;
    let arch = family.arch;
    let mut m = BTreeMap::new();
    let key = |k: &str| format!("{arch}.{k}");
    let uint = |v: u64| MetaValue::UInt(v);
    m.insert("general.architecture".into(), MetaValue::Str(arch.into()));
    let heads = required(c, "num_attention_heads")?;
    let hidden = required(c, "hidden_size")?;
    m.insert(key("embedding_length"), uint(hidden));
    m.insert(key("block_count"), uint(required(c, "num_hidden_layers")?));
    // Qwen 3.5's MoE configs have no dense FFN size: its experts' stands in.
    let ffn = match family.moe {
        true => count(c, "intermediate_size")?
            .map_or_else(|| required(c, "moe_intermediate_size"), Ok)?,
        false => required(c, "intermediate_size")?,
    };
    m.insert(key("feed_forward_length"), uint(ffn));
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
        experts(c, &mut m, arch, family.delta.is_some())?;
    }
    if family.mla {
        mla(c, &mut m, arch)?;
    }
    if family.oss {
        oss(c, &mut m, arch)?;
    }
    if family.gemma4 {
        gemma4(c, &mut m, arch)?;
    }
    if let Some(values) = family.delta {
        delta(c, &mut m, arch, values)?;
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
/// `moe_intermediate_size`, `norm_topk_prob` (by default off for Qwen3-MoE, as Transformers has
/// it, and on for Qwen 3.5, as mlx-lm and llama.cpp have it) and a shared expert's
/// `shared_expert_intermediate_size`. Configs with dense layers among the experts
/// (`mlp_only_layers`, `decoder_sparse_step` above 1) are refused by name.
fn experts(
    c: &Value,
    m: &mut BTreeMap<String, MetaValue>,
    arch: &str,
    norm_default: bool,
) -> Result<(), ModelError> {
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
    expert_counts(
        c,
        m,
        arch,
        [
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
        ],
    )?;
    if let Some(n) = count(c, "shared_expert_intermediate_size")? {
        m.insert(key("expert_shared_feed_forward_length"), MetaValue::UInt(n));
    }
    let norm = match c.get("norm_topk_prob") {
        None | Some(Value::Null) => norm_default,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| invalid(format!("`norm_topk_prob` is {v}, not a boolean")))?,
    };
    m.insert(key("expert_weights_norm"), MetaValue::Bool(norm));
    Ok(())
}

/// DeepSeek V2/V3's and GLM-4.7-Flash's latent attention and experts, under the keys llama.cpp's
/// converter writes: one KV head of `kv_lora_rank` plus the rotated part, the per-head key and
/// value sizes (`qk_nope_head_dim + qk_rope_head_dim`, `v_head_dim`), low-rank queries
/// (`q_lora_rank`, none where null), the leading dense layers, routed and shared experts, sigmoid
/// or softmax routing (`scoring_func`), expert groups, and YaRN RoPE (`mscale_all_dim` as 0.1
/// times it, as the converter writes it).
fn mla(c: &Value, m: &mut BTreeMap<String, MetaValue>, arch: &str) -> Result<(), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let uint = MetaValue::UInt;
    let kv_lora = required(c, "kv_lora_rank")?;
    let rope = required(c, "qk_rope_head_dim")?;
    let nope = required(c, "qk_nope_head_dim")?;
    m.insert(key("attention.head_count_kv"), uint(1));
    m.insert(key("attention.kv_lora_rank"), uint(kv_lora));
    m.insert(key("attention.key_length"), uint(kv_lora + rope));
    m.insert(key("attention.value_length"), uint(kv_lora));
    m.insert(key("attention.key_length_mla"), uint(nope + rope));
    m.insert(
        key("attention.value_length_mla"),
        uint(required(c, "v_head_dim")?),
    );
    m.insert(key("rope.dimension_count"), uint(rope));
    if let Some(q) = count(c, "q_lora_rank")? {
        m.insert(key("attention.q_lora_rank"), uint(q));
    }
    let layers = required(c, "num_hidden_layers")?;
    let experts = count(c, "n_routed_experts")?;
    let dense = match c.get("first_k_dense_replace") {
        Some(v) if !v.is_null() => v
            .as_u64()
            .ok_or_else(|| invalid(format!("`first_k_dense_replace` is {v}")))?,
        _ if experts.is_none() => layers,
        _ => 0,
    };
    m.insert(key("leading_dense_block_count"), uint(dense.min(layers)));
    if count(c, "moe_layer_freq")?.is_some_and(|f| f != 1) {
        return Err(ModelError::Unsupported(
            "moe_layer_freq above 1 (dense layers among the experts) in a safetensors folder"
                .into(),
        ));
    }
    let Some(experts) = experts else {
        return Err(ModelError::Unsupported(
            "a latent-attention folder without experts (`n_routed_experts`)".into(),
        ));
    };
    m.insert(key("expert_count"), uint(experts));
    for (name, field) in [
        ("expert_used_count", "num_experts_per_tok"),
        ("expert_feed_forward_length", "moe_intermediate_size"),
    ] {
        m.insert(key(name), uint(required(c, field)?));
    }
    m.insert(
        key("expert_shared_count"),
        uint(count(c, "n_shared_experts")?.unwrap_or(0)),
    );
    if let Some(s) = positive(c, "routed_scaling_factor")? {
        m.insert(key("expert_weights_scale"), MetaValue::Float(s));
    }
    if c.get("norm_topk_prob").and_then(Value::as_bool) == Some(true) {
        m.insert(key("expert_weights_norm"), MetaValue::Bool(true));
    }
    let gating = match c.get("scoring_func").and_then(Value::as_str) {
        None | Some("softmax") => 1,
        Some("sigmoid") => 2,
        Some(f) => {
            return Err(ModelError::Unsupported(format!(
                "scoring_func {f} in a safetensors folder (softmax and sigmoid are read)"
            )))
        }
    };
    m.insert(key("expert_gating_func"), uint(gating));
    if let Some(g) = count(c, "n_group")? {
        m.insert(key("expert_group_count"), uint(g));
    }
    if let Some(g) = count(c, "topk_group")? {
        m.insert(key("expert_group_used_count"), uint(g));
    }
    if let Some(r) = yarn(c, m, arch)? {
        if let Some(all) = positive(r, "mscale_all_dim")? {
            m.insert(
                key("rope.scaling.yarn_log_multiplier"),
                MetaValue::Float(0.1 * all),
            );
        }
    }
    Ok(())
}

/// `layer_types` (of `layers` entries, where given) as one flag a layer: whether it is of type
/// `marked` rather than `full_attention`; `None` where the config has none.
fn layer_types(
    c: &Value,
    marked: &str,
    layers: Option<u64>,
) -> Result<Option<Vec<MetaValue>>, ModelError> {
    let Some(types) = c.get("layer_types").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let types = types
        .as_array()
        .filter(|t| layers.is_none_or(|n| t.len() as u64 == n))
        .ok_or_else(|| invalid(format!("`layer_types` is {types}, not one type a layer")))?;
    let flags = types
        .iter()
        .map(|t| match t.as_str() {
            Some(s) if s == marked => Ok(MetaValue::Bool(true)),
            Some("full_attention") => Ok(MetaValue::Bool(false)),
            _ => Err(invalid(format!("`layer_types` holds {t}"))),
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(flags))
}

/// Qwen 3.5's and Qwen3-Next's hybrid layers: the gated delta net's shape (`linear_*`), which
/// layers are full attention (`layer_types`, else every `full_attention_interval`-th), and the
/// partial RoPE (`rope_parameters`, or the same fields at the top level), multi-section for
/// Qwen 3.5. A head size must be given (Transformers' default of 256 and mlx-lm's of the hidden
/// size over the heads differ), attention biases and RoPE types other than the default are
/// refused by name.
fn delta(
    c: &Value,
    m: &mut BTreeMap<String, MetaValue>,
    arch: &str,
    values: Values,
) -> Result<(), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let uint = MetaValue::UInt;
    refuse_flag(c, "attention_bias", "a gated delta net's")?;
    let head_dim = required(c, "head_dim")?;
    let nv = required(c, "linear_num_value_heads")?;
    for (name, field) in [
        ("ssm.conv_kernel", "linear_conv_kernel_dim"),
        ("ssm.state_size", "linear_key_head_dim"),
        ("ssm.group_count", "linear_num_key_heads"),
    ] {
        m.insert(key(name), uint(required(c, field)?));
    }
    m.insert(key("ssm.time_step_rank"), uint(nv));
    m.insert(
        key("ssm.inner_size"),
        uint(required(c, "linear_value_head_dim")? * nv),
    );
    let layers = required(c, "num_hidden_layers")?;
    match layer_types(c, "linear_attention", Some(layers))? {
        Some(recurrent) => {
            m.insert(
                key("attention.recurrent_layers"),
                MetaValue::Array(recurrent),
            );
        }
        None => {
            let every = count(c, "full_attention_interval")?.unwrap_or(4);
            m.insert(key("full_attention_interval"), uint(every));
        }
    }
    let rope = c
        .get("rope_parameters")
        .filter(|r| r.is_object())
        .unwrap_or(c);
    if let Some(t) = rope
        .get("rope_type")
        .or_else(|| rope.get("type"))
        .filter(|t| *t != "default")
    {
        return Err(ModelError::Unsupported(format!(
            "RoPE type {t} in a gated delta net safetensors folder"
        )));
    }
    let theta = positive(rope, "rope_theta")?
        .or(positive(c, "rope_theta")?)
        .ok_or_else(|| invalid("`rope_theta` is missing".into()))?;
    m.insert(key("rope.freq_base"), MetaValue::Float(theta));
    let partial = positive(rope, "partial_rotary_factor")?
        .or(positive(c, "partial_rotary_factor")?)
        .unwrap_or(0.25);
    let dims = (head_dim as f64 * partial).round() as u64;
    if partial > 1.0 || dims == 0 || !dims.is_multiple_of(2) {
        return Err(invalid(format!(
            "`partial_rotary_factor` {partial} of a head of {head_dim} is not an even number of \
             dimensions"
        )));
    }
    m.insert(key("rope.dimension_count"), uint(dims));
    if values == Values::Grouped {
        return Ok(());
    }
    let sections = match rope.get("mrope_section").filter(|s| !s.is_null()) {
        None => vec![11, 11, 10],
        Some(s) => s
            .as_array()
            .filter(|s| s.len() <= 4)
            .and_then(|s| s.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
            .ok_or_else(|| invalid(format!("`mrope_section` is {s}, not up to 4 sizes")))?,
    };
    let sections = (0..4)
        .map(|i| MetaValue::UInt(sections.get(i).copied().unwrap_or(0)))
        .collect();
    m.insert(key("rope.dimension_sections"), MetaValue::Array(sections));
    Ok(())
}

/// YaRN RoPE (`rope_scaling` of type yarn, where the config has one) under the keys llama.cpp's
/// converter writes: factor, original context, and the betas and extrapolation factor where
/// given. A YaRN `attention_factor` other than 1 is refused by name. Returns the scaling read.
fn yarn<'c>(
    c: &'c Value,
    m: &mut BTreeMap<String, MetaValue>,
    arch: &str,
) -> Result<Option<&'c Value>, ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let Some(r) = c.get("rope_scaling").filter(|r| !r.is_null()) else {
        return Ok(None);
    };
    let factor =
        positive(r, "factor")?.ok_or_else(|| invalid(format!("rope_scaling {r} has no factor")))?;
    m.insert(key("rope.scaling.type"), MetaValue::Str("yarn".into()));
    m.insert(key("rope.scaling.factor"), MetaValue::Float(factor));
    m.insert(
        key("rope.scaling.original_context_length"),
        MetaValue::UInt(required(r, "original_max_position_embeddings")?),
    );
    for (field, name) in [
        ("beta_fast", "yarn_beta_fast"),
        ("beta_slow", "yarn_beta_slow"),
        ("extrapolation_factor", "yarn_ext_factor"),
    ] {
        if let Some(v) = positive(r, field)? {
            m.insert(key(&format!("rope.scaling.{name}")), MetaValue::Float(v));
        }
    }
    if positive(r, "attention_factor")?.is_some_and(|a| a != 1.0) {
        return Err(ModelError::Unsupported(format!(
            "rope_scaling {r}: a YaRN attention_factor in a safetensors folder"
        )));
    }
    Ok(Some(r))
}

/// gpt-oss: experts (`num_local_experts`, `num_experts_per_tok`, each `intermediate_size`
/// wide), the sliding window and which layers take it (`layer_types`; without them every other
/// layer from the first, as llama.cpp has it), YaRN RoPE. The SwiGLU clamp is ggml's (7):
/// another `swiglu_limit` is refused by name.
fn oss(c: &Value, m: &mut BTreeMap<String, MetaValue>, arch: &str) -> Result<(), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let uint = MetaValue::UInt;
    expert_counts(
        c,
        m,
        arch,
        [
            "num_local_experts",
            "num_experts_per_tok",
            "intermediate_size",
        ],
    )?;
    if let Some(w) = count(c, "sliding_window")? {
        m.insert(key("attention.sliding_window"), uint(w));
    }
    let layers = required(c, "num_hidden_layers")?;
    if let Some(sliding) = layer_types(c, "sliding_attention", Some(layers))? {
        m.insert(
            key("attention.sliding_window_pattern"),
            MetaValue::Array(sliding),
        );
    }
    if let Some(limit) = c.get("swiglu_limit").and_then(Value::as_f64) {
        if limit != 7.0 {
            return Err(ModelError::Unsupported(format!(
                "swiglu_limit {limit} (ggml's gpt-oss SwiGLU clamps at 7)"
            )));
        }
    }
    yarn(c, m, arch)?;
    Ok(())
}

/// Gemma 4's global layers' head size and share of rotated dimensions (proportional RoPE), from
/// which the loader makes the `rope_freqs` factors llama.cpp's converter writes.
pub(super) struct Gemma4Rope {
    pub head_dim: usize,
    pub partial: f64,
}

/// The RoPE fields of one kind of Gemma 4 layer (`rope_parameters.full_attention` or
/// `.sliding_attention`): base, share of rotated dimensions, and type.
fn gemma4_rope_of<'c>(c: &'c Value, kind: &str) -> Result<(f64, f64, &'c str), ModelError> {
    let r = c
        .get("rope_parameters")
        .and_then(|r| r.get(kind))
        .ok_or_else(|| invalid(format!("`rope_parameters.{kind}` is missing")))?;
    let theta = positive(r, "rope_theta")?
        .ok_or_else(|| invalid(format!("`rope_parameters.{kind}` has no rope_theta")))?;
    let partial = positive(r, "partial_rotary_factor")?.unwrap_or(1.0);
    let kind_of = r
        .get("rope_type")
        .and_then(Value::as_str)
        .unwrap_or("default");
    Ok((theta, partial.min(1.0), kind_of))
}

/// The global layers' RoPE of a Gemma 4 config (see [`Gemma4Rope`]).
pub(super) fn gemma4_rope(c: &Value) -> Result<Gemma4Rope, ModelError> {
    let c = language_model(c);
    let swa = required(&c, "head_dim")?;
    let head_dim = count(&c, "global_head_dim")?.unwrap_or(swa) as usize;
    let (_, partial, _) = gemma4_rope_of(&c, "full_attention")?;
    Ok(Gemma4Rope { head_dim, partial })
}

/// Gemma 4 under the keys llama.cpp's converter writes: the global layers' head size
/// (`global_head_dim`) and the local ones' (`head_dim`), each kind's RoPE base and rotated
/// dimensions (global layers proportional, their factors made at load), the window and which
/// layers take it (`layer_types`), KV heads of the global layers (`num_global_key_value_heads`),
/// KV shared by the last `num_kv_shared_layers` layers, FFN widths (doubled on those with
/// `use_double_wide_mlp`), per-layer embeddings, the experts' block (`enable_moe_block`:
/// `num_experts`, `top_k_experts`, `moe_intermediate_size`) and the final logit softcap. Other
/// RoPE types are refused by name.
fn gemma4(c: &Value, m: &mut BTreeMap<String, MetaValue>, arch: &str) -> Result<(), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let uint = MetaValue::UInt;
    if c.get("enable_moe_block").and_then(Value::as_bool) == Some(true) {
        expert_counts(
            c,
            m,
            arch,
            ["num_experts", "top_k_experts", "moe_intermediate_size"],
        )?;
    }
    let layers = required(c, "num_hidden_layers")?;
    let swa_dim = required(c, "head_dim")?;
    let full_dim = count(c, "global_head_dim")?.unwrap_or(swa_dim);
    m.insert(key("attention.key_length"), uint(full_dim));
    m.insert(key("attention.value_length"), uint(full_dim));
    m.insert(key("attention.key_length_swa"), uint(swa_dim));
    m.insert(key("attention.value_length_swa"), uint(swa_dim));
    let (full_theta, _, full_kind) = gemma4_rope_of(c, "full_attention")?;
    let (swa_theta, swa_partial, swa_kind) = gemma4_rope_of(c, "sliding_attention")?;
    if !matches!(full_kind, "proportional" | "default") || swa_kind != "default" {
        return Err(ModelError::Unsupported(format!(
            "Gemma 4 RoPE types {full_kind} (global) and {swa_kind} (local) in a safetensors \
             folder (Axle reads proportional and default)"
        )));
    }
    m.insert(key("rope.freq_base"), MetaValue::Float(full_theta));
    m.insert(key("rope.freq_base_swa"), MetaValue::Float(swa_theta));
    m.insert(key("rope.dimension_count"), uint(full_dim));
    m.insert(
        key("rope.dimension_count_swa"),
        uint((swa_dim as f64 * swa_partial) as u64),
    );
    if let Some(w) = count(c, "sliding_window")? {
        m.insert(key("attention.sliding_window"), uint(w));
    }
    let sliding = layer_types(c, "sliding_attention", Some(layers))?
        .ok_or_else(|| invalid("`layer_types` is missing".into()))?;
    let is_swa: Vec<bool> = sliding
        .iter()
        .map(|v| matches!(v, MetaValue::Bool(true)))
        .collect();
    m.insert(
        key("attention.sliding_window_pattern"),
        MetaValue::Array(sliding),
    );
    let shared = c
        .get("num_kv_shared_layers")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if shared >= layers {
        return Err(invalid(format!(
            "`num_kv_shared_layers` {shared} of {layers} layers"
        )));
    }
    m.insert(key("attention.shared_kv_layers"), uint(shared));
    let per_layer = c
        .get("hidden_size_per_layer_input")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    m.insert(key("embedding_length_per_layer_input"), uint(per_layer));
    if c.get("use_double_wide_mlp").and_then(Value::as_bool) == Some(true) {
        let ff = required(c, "intermediate_size")?;
        let first_shared = layers - shared;
        m.insert(
            key("feed_forward_length"),
            MetaValue::Array(
                (0..layers)
                    .map(|i| uint(if i < first_shared { ff } else { 2 * ff }))
                    .collect(),
            ),
        );
    }
    let kv = count(c, "num_key_value_heads")?.unwrap_or(required(c, "num_attention_heads")?);
    if let Some(global) = count(c, "num_global_key_value_heads")?.filter(|&g| g != kv) {
        m.insert(
            key("attention.head_count_kv"),
            MetaValue::Array(
                is_swa
                    .iter()
                    .map(|&s| uint(if s { kv } else { global }))
                    .collect(),
            ),
        );
    }
    if let Some(s) = positive(c, "final_logit_softcapping")? {
        m.insert(key("final_logit_softcapping"), MetaValue::Float(s));
    }
    Ok(())
}

/// Transformers 5 writes RoPE's base and scaling as one `rope_parameters` object: as the older
/// `rope_theta` and `rope_scaling` fields, where those are missing (a scaling only where its type
/// is not the default). Objects by layer type (Gemma's) are read by [`gemma_defaults`].
fn rope_parameters(c: &mut Value) {
    let Some(fields) = c.as_object_mut() else {
        return;
    };
    let Some(rope) = fields
        .get("rope_parameters")
        .filter(|r| r.get("rope_theta").is_some())
        .cloned()
    else {
        return;
    };
    if let Some(theta) = rope.get("rope_theta") {
        fields.entry("rope_theta").or_insert(theta.clone());
    }
    let kind = rope
        .get("rope_type")
        .or_else(|| rope.get("type"))
        .and_then(Value::as_str);
    if kind.is_some_and(|k| k != "default") && fields.get("rope_scaling").is_none_or(Value::is_null)
    {
        fields.insert("rope_scaling".into(), rope);
    }
}

/// Gemma 3's configs leave out what equals Transformers' defaults (a vision-language checkpoint's
/// `text_config` names little more than its sizes): those defaults, where a field is missing.
/// Transformers 5's RoPE fields by layer type (`rope_parameters.full_attention` and
/// `.sliding_attention`) become the older fields the reading below takes.
fn gemma_defaults(c: &mut Value) {
    let Some(fields) = c.as_object_mut() else {
        return;
    };
    if let Some(by_type) = fields.get("rope_parameters").cloned() {
        let theta = |t: &str| by_type.get(t).and_then(|r| r.get("rope_theta")).cloned();
        if let Some(t) = theta("full_attention") {
            fields.entry("rope_theta").or_insert(t);
        }
        if let Some(t) = theta("sliding_attention") {
            fields.entry("rope_local_base_freq").or_insert(t);
        }
        if let Some(full) = by_type.get("full_attention").filter(|r| {
            r.get("rope_type")
                .and_then(Value::as_str)
                .unwrap_or("default")
                != "default"
        }) {
            fields.entry("rope_scaling").or_insert(full.clone());
        }
    }
    let defaults = serde_json::json!({
        "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0, "sliding_window_pattern": 6,
    });
    for (k, v) in defaults.as_object().into_iter().flatten() {
        if fields.get(k).is_none_or(Value::is_null)
            && !(k == "sliding_window_pattern" && fields.contains_key("layer_types"))
        {
            fields.insert(k.clone(), v.clone());
        }
    }
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
    match layer_types(c, "sliding_attention", None)? {
        Some(local) => {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3 4B's config as its checkpoint has it (a vision-language one, the language model's
    /// sizes under text_config and Transformers' defaults left out) reads as the same config
    /// written whole.
    #[test]
    fn gemma3_vision_language_configs_take_transformers_defaults() {
        let sparse = serde_json::json!({
            "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                "sliding_window": 1024},
            "vision_config": {"model_type": "siglip_vision_model"}
        });
        let whole = serde_json::json!({
            "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
            "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
            "head_dim": 256, "vocab_size": 262208, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256, "sliding_window": 1024,
            "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}
        });
        let (a, b) = (read(&sparse).unwrap(), read(&whole).unwrap());
        assert_eq!(a.0.arch, "gemma3");
        assert_eq!(a.1, b.1);
        // Transformers 5 writes RoPE by layer type.
        let mut v5 = whole.clone();
        for k in ["rope_theta", "rope_local_base_freq", "rope_scaling"] {
            v5.as_object_mut().unwrap().remove(k);
        }
        v5["rope_parameters"] = serde_json::json!({
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}
        });
        assert_eq!(read(&v5).unwrap().1, b.1);
    }

    /// Transformers 5's `rope_parameters` reads as the older `rope_theta` and `rope_scaling`.
    #[test]
    fn rope_parameters_read_as_the_older_fields() {
        let old = serde_json::json!({"model_type": "deepseek_v3", "hidden_size": 64,
            "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4,
            "kv_lora_rank": 32, "q_lora_rank": null, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32,
            "v_head_dim": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 64, "first_k_dense_replace": 1, "rope_theta": 10000.0,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                "mscale_all_dim": 1.0}});
        let mut new = old.clone();
        let o = new.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.remove("rope_scaling");
        o.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "yarn",
            "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256,
            "mscale_all_dim": 1.0}),
        );
        let (a, b) = (read(&old).unwrap().1, read(&new).unwrap().1);
        assert_eq!(a, b);
        assert_eq!(
            a.get("deepseek2.rope.scaling.type"),
            Some(&MetaValue::Str("yarn".into()))
        );
    }
}
