//! Hugging Face safetensors folders (`config.json`, `tokenizer.json`, `*.safetensors` with their
//! index), read natively as the GGUF a converter would write: the config becomes the family's
//! metadata ([`config`]), the tokenizer its vocabulary, merges and pre-tokenizer
//! ([`tokenizer`]), each weight its GGUF name. Weights of 2 or more dimensions stay in the
//! shards' mappings in their own type (bf16, f16, f32), used in place; those that need changing
//! are converted once at load into memory of their own: 1-D weights (norms, biases) to f32, as
//! GGUF stores them, MLX-quantized weights as [`quant`] says, experts written one by one
//! (Transformers) stacked into one tensor per layer and projection, for the llama family Q and K
//! rows from rotate-half order to the interleaved pairs the family rotates (llama.cpp's
//! permutation), and Qwen 3.5's gated delta net weights as [`delta`] says. Vision-language
//! checkpoints load as their language model: its config from `text_config`, its weights from
//! under `model.language_model.` (Transformers) or `language_model.` (mlx-lm); the vision
//! tower's and the MTP head's weights are left unread.
mod config;
mod delta;
mod mla;
mod oss;
mod quant;
mod tokenizer;

use crate::ModelError;
use axle_ggml::{DType, GgufFile, MadeBytes, MetaValue, Mmap, TensorInfo};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use config::supported;

/// A model path opened as what it is: a safetensors folder, or a GGUF file.
pub fn open_model(path: &Path) -> Result<GgufFile, ModelError> {
    if is_folder(path) {
        open(path)
    } else {
        Ok(GgufFile::open(path)?)
    }
}

/// Whether `path` is a safetensors folder (a directory with a config.json).
pub fn is_folder(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

fn invalid(path: &Path, what: impl std::fmt::Display) -> ModelError {
    ModelError::Invalid(format!("{}: {what}", path.display()))
}

/// The shards of a folder: those its index names, else every `*.safetensors`.
fn shards(folder: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = folder.join("model.safetensors.index.json");
    let mut names: Vec<String> = if index.is_file() {
        let json = read_json(&index)?;
        let map = json["weight_map"]
            .as_object()
            .ok_or_else(|| invalid(&index, "no weight_map"))?;
        map.values()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid(&index, "a weight_map value is not a file name"))?
    } else {
        std::fs::read_dir(folder)
            .map_err(|e| invalid(folder, e))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".safetensors"))
            .collect()
    };
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err(invalid(folder, "no *.safetensors files"));
    }
    for n in &names {
        if n.contains('/') || n.contains("..") {
            return Err(invalid(&index, format!("shard name {n:?}")));
        }
    }
    Ok(names.into_iter().map(|n| folder.join(n)).collect())
}

/// Gemma's layer norms, whose names mean other norms than in the Llama-shaped families.
const GEMMA_LAYER: &[(&str, &str)] = &[
    (
        "post_attention_layernorm.weight",
        "post_attention_norm.weight",
    ),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
];

/// Gemma 4's own layer names, beside Gemma's norms ([`GEMMA_LAYER`]): per-layer embeddings'
/// gate, projection and norm, the layer's output scale, and the experts' block (26B-A4B: the
/// router with its input and per-expert scales, the experts stacked with gate and up rows in one
/// tensor, the two branches' norms).
const GEMMA4_LAYER: &[(&str, &str)] = &[
    ("per_layer_input_gate.weight", "inp_gate.weight"),
    ("per_layer_projection.weight", "proj.weight"),
    ("post_per_layer_input_norm.weight", "post_norm.weight"),
    ("layer_scalar", "layer_output_scale.weight"),
    ("router.proj.weight", "ffn_gate_inp.weight"),
    ("router.scale", "ffn_gate_inp.scale"),
    ("router.per_expert_scale", "ffn_down_exps.scale"),
    ("experts.gate_up_proj", "ffn_gate_up_exps.weight"),
    ("experts.down_proj", "ffn_down_exps.weight"),
    // mlx-lm's names for them: gate and up apart.
    (
        "experts.switch_glu.gate_proj.weight",
        "ffn_gate_exps.weight",
    ),
    ("experts.switch_glu.up_proj.weight", "ffn_up_exps.weight"),
    (
        "experts.switch_glu.down_proj.weight",
        "ffn_down_exps.weight",
    ),
    (
        "pre_feedforward_layernorm_2.weight",
        "pre_ffw_norm_2.weight",
    ),
    (
        "post_feedforward_layernorm_1.weight",
        "post_ffw_norm_1.weight",
    ),
    (
        "post_feedforward_layernorm_2.weight",
        "post_ffw_norm_2.weight",
    ),
];

/// The GGUF name of a Hugging Face tensor name; `None` for tensors a GGUF leaves out.
fn gguf_name(hf: &str, family: &config::Family) -> Result<Option<String>, String> {
    const TOP: &[(&str, &str)] = &[
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
        // Per-layer embeddings (Gemma 4 E2B/E4B).
        (
            "model.embed_tokens_per_layer.weight",
            "per_layer_token_embd.weight",
        ),
        (
            "model.per_layer_model_projection.weight",
            "per_layer_model_proj.weight",
        ),
        (
            "model.per_layer_projection_norm.weight",
            "per_layer_proj_norm.weight",
        ),
    ];
    const LAYER: &[(&str, &str)] = &[
        ("input_layernorm.weight", "attn_norm.weight"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.q_proj.bias", "attn_q.bias"),
        ("self_attn.k_proj.weight", "attn_k.weight"),
        ("self_attn.k_proj.bias", "attn_k.bias"),
        ("self_attn.v_proj.weight", "attn_v.weight"),
        ("self_attn.v_proj.bias", "attn_v.bias"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        ("self_attn.k_norm.weight", "attn_k_norm.weight"),
        ("post_attention_layernorm.weight", "ffn_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
        ("mlp.gate.weight", "ffn_gate_inp.weight"),
        ("mlp.switch_mlp.gate_proj.weight", "ffn_gate_exps.weight"),
        ("mlp.switch_mlp.up_proj.weight", "ffn_up_exps.weight"),
        ("mlp.switch_mlp.down_proj.weight", "ffn_down_exps.weight"),
        // Transformers' stacked experts, gate and up rows in one tensor (Qwen 3.5 MoE).
        ("mlp.experts.gate_up_proj", "ffn_gate_up_exps.weight"),
        ("mlp.experts.down_proj", "ffn_down_exps.weight"),
    ];
    if let Some((_, g)) = TOP.iter().find(|(h, _)| *h == hf) {
        return Ok(Some(g.to_string()));
    }
    if hf.ends_with("rotary_emb.inv_freq") {
        return Ok(None);
    }
    let rest = hf
        .strip_prefix("model.layers.")
        .ok_or_else(|| hf.to_string())?;
    let (layer, field) = rest.split_once('.').ok_or_else(|| hf.to_string())?;
    let layer: u32 = layer.parse().map_err(|_| hf.to_string())?;
    let own: &[&[(&str, &str)]] = match (family.gemma, family.delta, family.mla) {
        _ if family.oss => &[oss::LAYER],
        _ if family.gemma4 => &[GEMMA_LAYER, GEMMA4_LAYER],
        (true, _, _) => &[GEMMA_LAYER],
        (_, Some(_), _) => &[delta::LAYER],
        (_, _, true) => &[mla::LAYER],
        _ => &[],
    };
    let (_, g) = own
        .iter()
        .flat_map(|t| t.iter())
        .chain(LAYER)
        .find(|(h, _)| *h == field)
        .ok_or_else(|| hf.to_string())?;
    Ok(Some(format!("blk.{layer}.{g}")))
}

/// A weight's name as its language model's own (`model.`, `lm_head.`), or `None` for weights
/// outside it: a vision tower's, an MTP head's.
fn language_model_name(hf: &str) -> Option<String> {
    const SKIPPED: &[&str] = &[
        "visual.",
        "vision_tower.",
        "mtp.",
        "multi_modal_projector.",
        "audio_tower.",
        "embed_vision.",
        "embed_audio.",
    ];
    let name = if let Some(rest) = hf.strip_prefix("model.language_model.") {
        format!("model.{rest}")
    } else if let Some(rest) = hf.strip_prefix("language_model.") {
        rest.to_string()
    } else {
        hf.to_string()
    };
    let bare = name.strip_prefix("model.").unwrap_or(&name);
    (!SKIPPED.iter().any(|s| bare.starts_with(s))).then_some(name)
}

/// Layer, expert and projection (`gate`, `up`, `down`) of one expert's weight as Transformers
/// names it (`model.layers.L.mlp.experts.E.gate_proj.weight`); mlx-lm's folders hold them
/// stacked already (`mlp.switch_mlp.*`).
fn expert_part(hf: &str) -> Option<(u32, usize, &str)> {
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once(".mlp.experts.")?;
    let (expert, field) = rest.split_once('.')?;
    let proj = field.strip_suffix("_proj.weight")?;
    matches!(proj, "gate" | "up" | "down").then_some(())?;
    Some((layer.parse().ok()?, expert.parse().ok()?, proj))
}

/// One layer's experts' weights for one projection, stacked in expert order into the one
/// tensor a GGUF holds (`[columns, rows, experts]`), in memory of its own.
fn stack_experts(
    views: &BTreeMap<String, View>,
    parts: &[Arc<Mmap>],
    layer: u32,
    proj: &str,
    experts: usize,
) -> Result<(DType, Vec<i64>, Vec<u8>), String> {
    let name = |e: usize| format!("model.layers.{layer}.mlp.experts.{e}.{proj}_proj.weight");
    if experts == 0 {
        return Err("weights of experts, but config.json names no `num_experts`".into());
    }
    let prefix = format!("model.layers.{layer}.mlp.experts.");
    let suffix = format!(".{proj}_proj.weight");
    // A layer's experts' names lie together in the map, in order of their text.
    if let Some(e) = views
        .range(prefix.clone()..)
        .map(|(k, _)| k)
        .take_while(|k| k.starts_with(&prefix))
        .filter_map(|k| {
            k.strip_prefix(&prefix)?
                .strip_suffix(&suffix)?
                .parse::<usize>()
                .ok()
        })
        .find(|&e| e >= experts)
    {
        return Err(format!(
            "expert {e} exists, but config.json names {experts} experts"
        ));
    }
    let first = views.get(&name(0)).ok_or("expert 0 is missing")?;
    let dtype = first
        .dtype
        .ok_or("experts quantized one by one (mlx-lm stacks them)")?;
    if first.shape.len() != 2 {
        return Err(format!("expert 0 has shape {:?}", first.shape));
    }
    let mut bytes = Vec::with_capacity(first.nbytes * experts);
    for e in 0..experts {
        let v = views
            .get(&name(e))
            .ok_or_else(|| format!("expert {e} is missing"))?;
        if v.dtype != first.dtype || v.shape != first.shape {
            return Err(format!(
                "expert {e} is {:?} {:?}, expert 0 {:?} {:?}",
                v.dtype, v.shape, first.dtype, first.shape
            ));
        }
        bytes.extend_from_slice(&parts[v.part][v.offset..v.offset + v.nbytes]);
    }
    let shape = vec![first.shape[1] as i64, first.shape[0] as i64, experts as i64];
    Ok((dtype, shape, bytes))
}

/// The weights converted at load: one mapping of their own after the shards'.
struct Converted {
    /// The mapping's index among the parts.
    part: usize,
    made: MadeBytes,
}

impl Converted {
    /// Places a converted tensor; its entry.
    fn push(&mut self, name: String, dtype: DType, shape: Vec<i64>, out: Vec<u8>) -> TensorInfo {
        let nbytes = out.len() as u64;
        TensorInfo {
            name,
            dtype,
            shape,
            part: self.part,
            file_offset: self.made.place(out),
            nbytes,
        }
    }
}

/// Whether a weight is a vector stored as a matrix of one row: Qwen 3.5's shared expert gate,
/// `[1, n_embd]` in folders, `[n_embd]` in GGUF.
fn is_vector(name: &str, shape: &[usize]) -> bool {
    name.ends_with(".ffn_gate_inp_shexp.weight") && shape.len() == 2 && shape[0] == 1
}

/// One tensor of a shard, by its Hugging Face name.
struct View {
    /// Its type (`None`: u32, the words of a quantized weight).
    dtype: Option<DType>,
    /// Transformers' order: the contiguous dimension last.
    shape: Vec<usize>,
    shard: PathBuf,
    part: usize,
    offset: usize,
    nbytes: usize,
}

/// Little-endian elements of a float type (f32, f16, bf16) as f32.
pub(crate) fn floats(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    }
}

/// f32 values as little-endian bytes.
fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A JSON file of the folder, parsed.
fn read_json(path: &Path) -> Result<serde_json::Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| invalid(path, e))?;
    serde_json::from_str(&text).map_err(|e| invalid(path, e))
}

/// llama.cpp's Q/K permutation: within each head, row `p * half + j` (rotate-half order)
/// moves to `2 * j + p` (interleaved pairs).
fn permute_rows(bytes: &[u8], rows: usize, heads: usize) -> Result<Vec<u8>, String> {
    if heads == 0
        || rows == 0
        || !rows.is_multiple_of(heads)
        || !(rows / heads).is_multiple_of(2)
        || !bytes.len().is_multiple_of(rows)
    {
        return Err(format!(
            "{rows} rows do not split into {heads} heads of pairs"
        ));
    }
    let row = bytes.len() / rows;
    let head_rows = rows / heads;
    let half = head_rows / 2;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..heads {
        for p in 0..2 {
            for j in 0..half {
                let src = h * head_rows + p * half + j;
                let dst = h * head_rows + 2 * j + p;
                out[dst * row..(dst + 1) * row].copy_from_slice(&bytes[src * row..(src + 1) * row]);
            }
        }
    }
    Ok(out)
}

/// The GGUF architecture a folder's config.json names (reading nothing else).
pub fn architecture_of(folder: &Path) -> Result<String, ModelError> {
    let config = read_json(&folder.join("config.json"))?;
    quant::Quantization::read(&config)?;
    Ok(config::read(&config)?.0.arch.to_string())
}

/// Opens a safetensors folder as the GGUF model it holds.
pub fn open(folder: &Path) -> Result<GgufFile, ModelError> {
    let config = read_json(&folder.join("config.json"))?;
    let (family, mut metadata) = config::read(&config)?;
    metadata.extend(tokenizer::read(folder)?);
    let name = folder
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    metadata.insert("general.name".into(), MetaValue::Str(name));
    let int = |k: &str| {
        metadata
            .get(&format!("{}.{k}", family.arch))
            .and_then(MetaValue::as_i64)
            .unwrap_or(0) as usize
    };
    let (heads, kv_heads) = (int("attention.head_count"), int("attention.head_count_kv"));
    let experts = int("expert_count");

    let quantization = quant::Quantization::read(&config)?.renamed(language_model_name);
    if quantization.mxfp4 && !family.oss {
        return Err(ModelError::Unsupported(format!(
            "{}: MXFP4 quantization in a {} folder (Axle reads it for gpt-oss)",
            folder.display(),
            family.arch
        )));
    }

    let mut parts: Vec<Arc<Mmap>> = Vec::new();
    let mut views: BTreeMap<String, View> = BTreeMap::new();
    for shard in shards(folder)? {
        let map = axle_ggml::map_file(&shard)?;
        let st = safetensors::SafeTensors::deserialize(&map[..])
            .map_err(|e| invalid(&shard, format!("not a safetensors file: {e}")))?;
        let part = parts.len();
        for (hf, view) in st.tensors() {
            let Some(hf) = language_model_name(&hf) else {
                continue;
            };
            let dtype = match view.dtype() {
                safetensors::Dtype::BF16 => Some(DType::BF16),
                safetensors::Dtype::F16 => Some(DType::F16),
                safetensors::Dtype::F32 => Some(DType::F32),
                safetensors::Dtype::U32 if quantization.any() => None,
                // MXFP4 blocks and their exponents (gpt-oss).
                safetensors::Dtype::U8 if quantization.mxfp4 => None,
                other => {
                    return Err(ModelError::Unsupported(format!(
                        "{hf} in {} is {other:?}; Axle reads bf16, f16 and f32 folders and MLX's \
                         affine quantization",
                        shard.display()
                    )))
                }
            };
            let most = if hf.ends_with("_blocks") { 4 } else { 3 };
            if view.shape().is_empty() || view.shape().len() > most {
                return Err(invalid(
                    &shard,
                    format!("{hf} has shape {:?}", view.shape()),
                ));
            }
            views.insert(
                hf,
                View {
                    dtype,
                    shape: view.shape().to_vec(),
                    shard: shard.clone(),
                    part,
                    offset: view.data().as_ptr() as usize - map.as_ptr() as usize,
                    nbytes: view.data().len(),
                },
            );
        }
        parts.push(map);
    }
    let delta_heads = family
        .delta
        .and_then(|values| delta::Heads::read(&metadata, family.arch, values));
    let latent = family
        .mla
        .then(|| mla::Latent::read(&metadata, family.arch))
        .flatten();
    // Layers past the model's own hold its MTP heads, where the config names some.
    let model_layers = config::language_model(&config)
        .get("num_nextn_predict_layers")
        .and_then(serde_json::Value::as_u64)
        .filter(|&n| n > 0)
        .map(|_| int("block_count"));
    let norms_hold_w = delta::norms_hold_w(
        views
            .iter()
            .filter(|(k, _)| k.ends_with("linear_attn.conv1d.weight"))
            .map(|(_, v)| &v.shape[..]),
    );
    // Norms stored as w where GGUF stores 1 + w.
    let plus_one = |hf: &str| {
        (family.gemma && hf.ends_with("norm.weight"))
            || (family.delta.is_some() && norms_hold_w && delta::is_offset_norm(hf))
    };
    let mut converted = Converted {
        part: parts.len(),
        made: MadeBytes::default(),
    };
    let mut tensors = Vec::with_capacity(views.len());
    // Gemma 4: layers from here on read an earlier layer's KV; the global layers' proportional
    // RoPE as factors (rotated pairs 1, the rest 1e30: never rotated), as the converter writes it.
    let first_shared = int("block_count").saturating_sub(int("attention.shared_kv_layers"));
    if family.gemma4 {
        let rope = config::gemma4_rope(&config)?;
        let pairs = rope.head_dim / 2;
        let rotated = (rope.head_dim as f64 * rope.partial / 2.0) as usize;
        let factors: Vec<f32> = (0..pairs)
            .map(|i| if i < rotated { 1.0 } else { 1e30 })
            .collect();
        tensors.push(converted.push(
            "rope_freqs.weight".into(),
            DType::F32,
            vec![pairs as i64],
            f32_bytes(&factors),
        ));
    }
    let data = |v: &View| &parts[v.part][v.offset..v.offset + v.nbytes];
    for (hf, view) in &views {
        // A quantized weight's scales and biases are read with it.
        let module = hf
            .strip_suffix(".scales")
            .or_else(|| hf.strip_suffix(".biases"));
        if module.is_some_and(|m| {
            views
                .get(&format!("{m}.weight"))
                .is_some_and(|w| w.dtype.is_none())
        }) {
            continue;
        }
        let hf_layer = hf
            .strip_prefix("model.layers.")
            .and_then(|r| r.split('.').next()?.parse::<usize>().ok());
        if model_layers.is_some_and(|n| hf_layer.is_some_and(|l| l >= n)) {
            continue;
        }
        // Gemma 4: the KV-shared layers' own key and value weights (unused: they read an
        // earlier layer's cache), and quantization-aware training's clipping ranges.
        if family.gemma4
            && (hf_layer.is_some_and(|l| l >= first_shared)
                && [
                    ".self_attn.k_proj.",
                    ".self_attn.v_proj.",
                    ".self_attn.k_norm.",
                ]
                .iter()
                .any(|p| hf.contains(p))
                || ["input_max", "input_min", "output_max", "output_min"]
                    .iter()
                    .any(|s| hf.ends_with(s)))
        {
            continue;
        }
        if family.oss {
            let made = oss::tensors(hf, &views, &data).map_err(|e| invalid(&view.shard, e))?;
            if let Some(made) = made {
                for (name, dtype, shape, out) in made {
                    tensors.push(converted.push(name, dtype, shape, out));
                }
                continue;
            }
        }
        let expert = expert_part(hf);
        if expert.is_some_and(|(_, e, _)| e != 0) {
            continue;
        }
        let name = match expert {
            Some((layer, _, proj)) => format!("blk.{layer}.ffn_{proj}_exps.weight"),
            None => match gguf_name(hf, family)
                .map_err(|n| invalid(&view.shard, format!("tensor {n} is not one Axle reads")))?
            {
                Some(name) => name,
                None => continue,
            },
        };
        // GGUF order: the contiguous dimension first. Weights of 3 dimensions (experts) have
        // their leading two as rows.
        let rows: usize = view.shape[..view.shape.len().max(2) - 1].iter().product();
        let reversed = |cols: usize| {
            std::iter::once(cols as i64)
                .chain(
                    view.shape[..view.shape.len() - 1]
                        .iter()
                        .rev()
                        .map(|&d| d as i64),
                )
                .collect::<Vec<i64>>()
        };
        let vector = is_vector(&name, &view.shape);
        let (dtype, shape, mut out): (DType, Vec<i64>, Option<Vec<u8>>) = match (expert, view.dtype)
        {
            (Some((layer, _, proj)), _) => {
                let (t, shape, b) = stack_experts(&views, &parts, layer, proj, experts)
                    .map_err(|e| invalid(&view.shard, format!("{name}: {e}")))?;
                (t, shape, Some(b))
            }
            (None, None) => {
                let module = hf.strip_suffix(".weight").unwrap_or(hf);
                let a = quantization.of(module).ok_or_else(|| {
                    invalid(
                        &view.shard,
                        format!("{hf} is u32 but {module} is not quantized"),
                    )
                })?;
                let part = |what: &str| {
                    views
                        .get(&format!("{module}.{what}"))
                        .ok_or_else(|| invalid(&view.shard, format!("{module} has no {what}")))
                };
                let (sv, bv) = (part("scales")?, part("biases")?);
                let scale_type = sv.dtype.unwrap_or(DType::F32);
                let cols = match view.shape.len() {
                    1 => 0,
                    n => view.shape[n - 1] * 32 / a.bits as usize,
                };
                let (t, b) = quant::convert(
                    data(view),
                    &floats(data(sv), scale_type),
                    &floats(data(bv), bv.dtype.unwrap_or(DType::F32)),
                    scale_type,
                    rows,
                    cols,
                    match (&delta_heads, vector) {
                        // Dequantized: a vector's one row is f32 in GGUF.
                        (_, true) => 1,
                        (Some(h), _) => h.column_run(&name, cols),
                        (None, _) => cols,
                    },
                    a,
                )
                .map_err(|e| invalid(&view.shard, format!("{hf}: {e}")))?;
                match vector {
                    true => (
                        DType::F32,
                        vec![cols as i64],
                        Some(f32_bytes(&floats(&b, t))),
                    ),
                    false => (t, reversed(cols), Some(b)),
                }
            }
            // Vectors, and Qwen 3.5's shared expert gate ([1, n_embd]), in f32 as GGUF has them.
            (None, Some(t)) if view.shape.len() == 1 || vector => {
                let mut f32s = floats(data(view), t);
                if plus_one(hf) {
                    f32s.iter_mut().for_each(|x| *x += 1.0);
                }
                if name.ends_with(".ssm_a") {
                    delta::decay(&mut f32s);
                }
                (DType::F32, vec![f32s.len() as i64], Some(f32_bytes(&f32s)))
            }
            // The delta net's convolution: [channels, taps] in f32, the same order of numbers.
            (None, Some(t)) if name.ends_with(".ssm_conv1d.weight") => {
                let f32s = floats(data(view), t);
                let channels = view.shape[0];
                (
                    DType::F32,
                    vec![(f32s.len() / channels.max(1)) as i64, channels as i64],
                    Some(f32_bytes(&f32s)),
                )
            }
            (None, Some(t)) => (t, reversed(view.shape[view.shape.len() - 1]), None),
        };
        let heads_of = match name.rsplit('.').nth(1) {
            Some("attn_q") if family.permute_qk => Some(heads),
            Some("attn_k") if family.permute_qk => Some(kv_heads),
            _ => None,
        };
        if let Some(h) = heads_of {
            let permuted = permute_rows(out.as_deref().unwrap_or(data(view)), rows, h)
                .map_err(|e| invalid(folder, format!("{name}: {e}")))?;
            out = Some(permuted);
        }
        if let Some(heads) = &delta_heads {
            let (rows, cols) = match shape[..] {
                [n] => (n as usize, 1),
                _ => (
                    shape[1..].iter().product::<i64>() as usize,
                    shape[0] as usize,
                ),
            };
            let tiled = heads
                .tile(
                    &name,
                    out.as_deref().unwrap_or(data(view)),
                    rows,
                    cols,
                    dtype,
                )
                .map_err(|e| invalid(folder, format!("{name}: {e}")))?;
            out = tiled.or(out);
        }
        // The latent attention's key and value up-projections, split as GGUF holds them.
        if let (Some(latent), Some(stem)) = (&latent, name.strip_suffix("attn_kv_b.weight")) {
            let ((k_shape, k_b), (v_shape, v_b)) = latent
                .split_kv_b(out.as_deref().unwrap_or(data(view)), dtype)
                .map_err(|e| invalid(folder, format!("{name}: {e}")))?;
            tensors.push(converted.push(format!("{stem}attn_k_b.weight"), dtype, k_shape, k_b));
            tensors.push(converted.push(format!("{stem}attn_v_b.weight"), dtype, v_shape, v_b));
            continue;
        }
        // Qwen3-Next's fused projection, split into the two GGUF holds.
        if let (Some(heads), Some(stem)) = (&delta_heads, name.strip_suffix("attn_qkvz.weight")) {
            let rows = shape[1..].iter().product::<i64>() as usize;
            let all = out.as_deref().unwrap_or(data(view));
            let row = all.len() / rows.max(1);
            let (qkv, gate) = heads
                .split_qkvz(all, rows)
                .map_err(|e| invalid(folder, format!("{name}: {e}")))?;
            for (part, out) in [("attn_qkv", qkv), ("attn_gate", gate)] {
                let shape = vec![shape[0], (out.len() / row) as i64];
                let name = format!("{stem}{part}.weight");
                tensors.push(converted.push(name, dtype, shape, out));
            }
            continue;
        }
        match out {
            None => tensors.push(TensorInfo {
                name,
                dtype,
                shape,
                part: view.part,
                file_offset: view.offset as u64,
                nbytes: view.nbytes as u64,
            }),
            Some(out) => tensors.push(converted.push(name, dtype, shape, out)),
        }
    }
    parts.push(converted.made.map()?);
    tensors.sort_by(|a, b| natural(&a.name).cmp(&natural(&b.name)));
    Ok(GgufFile::assembled(
        folder.to_path_buf(),
        metadata,
        tensors,
        parts,
    )?)
}

/// The layer of a GGUF tensor name (`blk.N.`).
fn layer_of(name: &str) -> Option<u32> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Sorts `blk.2` before `blk.10`.
fn natural(name: &str) -> (u32, &str) {
    (layer_of(name).map_or(0, |l| l + 1), name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_and_unknown_ones_are_named() {
        let family = |t: &str| {
            config::read(&serde_json::json!({"model_type": t, "num_attention_heads": 4, "hidden_size": 256, "num_hidden_layers": 1, "intermediate_size": 512, "head_dim": 64, "query_pre_attn_scalar": 64})).unwrap().0
        };
        let (llama, gemma) = (family("llama"), family("gemma3_text"));
        for (hf, l, g) in [
            (
                "post_attention_layernorm",
                "ffn_norm",
                "post_attention_norm",
            ),
            ("pre_feedforward_layernorm", "", "ffn_norm"),
            ("post_feedforward_layernorm", "", "post_ffw_norm"),
        ] {
            let name = format!("model.layers.2.{hf}.weight");
            let ours = |f| gguf_name(&name, f).ok().flatten();
            assert_eq!(
                ours(llama),
                (!l.is_empty()).then(|| format!("blk.2.{l}.weight"))
            );
            assert_eq!(ours(gemma), Some(format!("blk.2.{g}.weight")));
        }
        assert_eq!(
            gguf_name("model.layers.11.self_attn.k_norm.weight", llama)
                .unwrap()
                .as_deref(),
            Some("blk.11.attn_k_norm.weight")
        );
        assert_eq!(
            gguf_name("lm_head.weight", llama).unwrap().as_deref(),
            Some("output.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq", llama).unwrap(),
            None
        );
        assert!(gguf_name("model.layers.0.mlp.experts.0.w1.weight", llama).is_err());
        assert!(gguf_name("model.vision_tower.x", llama).is_err());
    }

    #[test]
    fn permutation_interleaves_the_halves_of_each_head() {
        // 2 heads of 4 rows, one byte per row: [a0 a1 b0 b1] -> [a0 b0 a1 b1].
        let rows: Vec<u8> = (0..8).collect();
        assert_eq!(permute_rows(&rows, 8, 2).unwrap(), [0, 2, 1, 3, 4, 6, 5, 7]);
        assert!(permute_rows(&rows, 8, 3).is_err());
    }
}
