//! Architecture families, one file each, and the registry that maps a GGUF
//! `general.architecture` to the family that implements it. Adding a family means one new file and
//! one line in [`REGISTRY`].
pub mod deepseek2;
pub mod gemma3;
pub mod gemma4;
pub mod glm4moe;
pub mod gpt_oss;
pub mod llama;
pub mod nextn;
pub mod qwen2;
pub mod qwen2moe;
pub mod qwen3;
pub mod qwen35;
pub mod qwen3moe;

use crate::layers::Step;
pub use crate::weights::Weights;
pub(crate) use crate::weights::{arch_key, bad};
use crate::ModelError;
use axle_ggml::{GgufFile, MetaValue, RopeParams, StoredTensor, Tensor, TensorStore};

/// What every family exposes to the runner.
pub trait Family: Send + Sync + std::fmt::Debug {
    /// Shared hyperparameters.
    fn hparams(&self) -> &Hparams;
    /// Builds the forward pass for one step; returns logits [n_vocab, n_out].
    fn forward<'a>(&'a self, s: &mut Step<'a>) -> Tensor<'a>;
    /// Sliding window of the model's local-attention layers, if any.
    fn sliding_window(&self) -> Option<u32> {
        self.hparams().sliding_window
    }
    /// (K, V) widths of each cache layer: one per layer by default; fewer where later layers
    /// reuse earlier layers' keys and values, and widths that differ where local and global
    /// layers have different head sizes. The KV pool's memory per slot is their sum.
    fn kv_dims(&self) -> Vec<(i64, i64)> {
        self.hparams().kv_dims()
    }
    /// (layer, convolution window width, state width) of each recurrent (linear-attention)
    /// layer, in the order the family indexes the state pools; empty for attention-only models.
    fn state_dims(&self) -> Vec<(usize, i64, i64)> {
        Vec::new()
    }
    /// Positions per token in [`Step::pos`]: 1, or [`axle_ggml::MROPE_SECTIONS`] for
    /// multi-section RoPE, section-major (text tokens: p, p, p, 0).
    fn positions_per_token(&self) -> usize {
        1
    }
    /// The model's next-token-prediction head (the file's first MTP block), where the file has
    /// one and the family runs it: a family of its own, with one cache layer, whose steps read
    /// [`Step::hidden_in`] and return their rows' hidden states ([`nextn`]).
    fn mtp(&self) -> Option<&dyn Family> {
        None
    }
    /// The model layer of the family's first cache layer (where its KV is placed): 0 for a
    /// trunk, the block's own index for an MTP head.
    fn first_layer(&self) -> usize {
        0
    }
}

/// Hyperparameters common to the decoder-only families.
#[derive(Debug, Clone)]
pub struct Hparams {
    /// GGUF architecture name.
    pub arch: String,
    /// Vocabulary size (rows of the output matrix).
    pub n_vocab: i64,
    /// Hidden size.
    pub n_embd: i64,
    /// Layers.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: i64,
    /// KV heads.
    pub n_head_kv: i64,
    /// Key/query head size.
    pub head_dim_k: i64,
    /// Value head size.
    pub head_dim_v: i64,
    /// FFN inner size.
    pub n_ff: i64,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// Training context length.
    pub n_ctx_train: u32,
    /// Rotary embedding parameters.
    pub rope: RopeParams,
    /// Sliding window of the local-attention layers, if the family has them (set by the
    /// family from its metadata).
    pub sliding_window: Option<u32>,
}

impl Hparams {
    /// The GGUF key `k` of the model's architecture (`{arch}.{k}`).
    pub fn key(&self, k: &str) -> String {
        arch_key(&self.arch, k)
    }

    /// Per-layer (K, V) widths of the KV cache.
    pub fn kv_dims(&self) -> Vec<(i64, i64)> {
        vec![
            (
                self.head_dim_k * self.n_head_kv,
                self.head_dim_v * self.n_head_kv
            );
            self.n_layer
        ]
    }

    /// Reads the shared keys `{arch}.*`. `rope_mode` is 0 (normal) or 2 (NeoX).
    pub fn from_gguf(f: &GgufFile, arch: &str, rope_mode: i32) -> Result<Hparams, ModelError> {
        let key = |k: &str| arch_key(arch, k);
        let int = |k: &str| f.int(&key(k)).map_err(ModelError::from);
        let n_embd = int("embedding_length")?;
        let n_layer = int("block_count")?;
        // Bounded first: per-layer arrays below are sized by it.
        if !(1..=MAX_LAYERS).contains(&n_layer) {
            return Err(bad(
                &key("block_count"),
                &format!("= {n_layer} is outside 1..={MAX_LAYERS}"),
            ));
        }
        let n_layer = n_layer as usize;
        // Head counts and FFN widths may be per-layer arrays (Gemma 4): the largest sizes here,
        // the family reads the per-layer values.
        let largest = |k: &str| -> Result<Option<i64>, ModelError> {
            Ok(per_layer(f, &key(k), n_layer)?.map(|v| v.into_iter().max().unwrap_or(0)))
        };
        let n_head = largest("attention.head_count")?
            .ok_or_else(|| bad(&key("attention.head_count"), "is missing"))?;
        let n_head_kv = largest("attention.head_count_kv")?.unwrap_or(n_head);
        for (k, v) in [
            ("embedding_length", n_embd),
            ("attention.head_count", n_head),
            ("attention.head_count_kv", n_head_kv),
            ("block_count", n_layer as i64),
        ] {
            if v <= 0 {
                return Err(bad(&key(k), &format!("= {v} must be positive")));
            }
        }
        if n_head % n_head_kv != 0 {
            return Err(bad(
                &key("attention.head_count_kv"),
                &format!("= {n_head_kv} does not divide the {n_head} query heads"),
            ));
        }
        let head_dim_k = f
            .int_opt(&key("attention.key_length"))?
            .unwrap_or(n_embd / n_head);
        let head_dim_v = f
            .int_opt(&key("attention.value_length"))?
            .unwrap_or(head_dim_k);
        let n_vocab = match f.int_opt(&key("vocab_size"))? {
            Some(v) => v,
            None => f
                .array_opt("tokenizer.ggml.tokens")?
                .map_or(0, |a| a.len() as i64),
        };
        let n_ctx_train = f.int_opt(&key("context_length"))?.unwrap_or(2048) as i32;
        let n_rot = f
            .int_opt(&key("rope.dimension_count"))?
            .unwrap_or(head_dim_k) as i32;
        let freq_base = f.float_opt(&key("rope.freq_base"))?.unwrap_or(10000.0) as f32;
        let scaling = f
            .str_opt(&key("rope.scaling.type"))?
            .unwrap_or("none")
            .to_string();
        let factor = match f.float_opt(&key("rope.scaling.factor"))? {
            Some(x) if x <= 0.0 && scaling != "none" => {
                return Err(bad(
                    &key("rope.scaling.factor"),
                    &format!("= {x} must be positive"),
                ))
            }
            x => x.unwrap_or(0.0) as f32,
        };
        let freq_scale = match (scaling.as_str(), factor) {
            ("linear" | "yarn", x) if x > 0.0 => 1.0 / x,
            _ => f
                .float_opt(&key("rope.scale_linear"))?
                .map_or(1.0, |s| 1.0 / s as f32),
        };
        let yarn = scaling == "yarn";
        let rope = RopeParams {
            n_dims: n_rot,
            mode: rope_mode,
            n_ctx_orig: match f.int_opt(&key("rope.scaling.original_context_length"))? {
                None => n_ctx_train,
                Some(n) if (1..=MAX_CONTEXT).contains(&n) => n as i32,
                Some(n) => {
                    return Err(bad(
                        &key("rope.scaling.original_context_length"),
                        &format!("= {n} is outside 1..={MAX_CONTEXT}"),
                    ))
                }
            },
            freq_base,
            freq_scale,
            // A negative factor is llama.cpp's "unset": YaRN's default of 1.
            ext_factor: if yarn {
                match f.float_opt(&key("rope.scaling.yarn_ext_factor"))? {
                    Some(x) if x >= 0.0 => x as f32,
                    _ => 1.0,
                }
            } else {
                0.0
            },
            attn_factor: f
                .float_opt(&key("rope.scaling.attn_factor"))?
                .unwrap_or(1.0) as f32,
            beta_fast: f
                .float_opt(&key("rope.scaling.yarn_beta_fast"))?
                .unwrap_or(32.0) as f32,
            beta_slow: f
                .float_opt(&key("rope.scaling.yarn_beta_slow"))?
                .unwrap_or(1.0) as f32,
        };
        let rms_eps = f
            .float_opt(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5) as f32;
        let hp = Hparams {
            arch: arch.into(),
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff: largest("feed_forward_length")?
                .ok_or_else(|| bad(&key("feed_forward_length"), "is missing"))?,
            rms_eps,
            n_ctx_train: f
                .int_opt(&key("context_length"))?
                .map_or(Ok(2048), u32::try_from)
                .map_err(|_| bad(&key("context_length"), "is not a context length"))?,
            rope,
            sliding_window: None,
        };
        hp.check(f)?;
        Ok(hp)
    }

    /// Checks every number that sizes memory or work against sane bounds and against the
    /// tensors that must agree with it, before anything is allocated: a corrupt file is one clear
    /// error naming the key, not an allocation of terabytes, a ggml assert or a kernel that never
    /// ends (a rotary dimension count of 0 spins ggml's rope forever).
    fn check(&self, f: &GgufFile) -> Result<(), ModelError> {
        let key = |k: &str| format!("{}.{k}", self.arch);
        let within = |k: &str, v: i64, max: i64| {
            if (1..=max).contains(&v) {
                Ok(())
            } else {
                Err(bad(&key(k), &format!("= {v} is outside 1..={max}")))
            }
        };
        within("block_count", self.n_layer as i64, MAX_LAYERS)?;
        within("embedding_length", self.n_embd, MAX_WIDTH)?;
        within("feed_forward_length", self.n_ff, MAX_WIDTH * 8)?;
        within("attention.head_count", self.n_head, MAX_HEADS)?;
        within("attention.key_length", self.head_dim_k, MAX_HEAD_DIM)?;
        within("attention.value_length", self.head_dim_v, MAX_HEAD_DIM)?;
        within("vocab_size", self.n_vocab, MAX_VOCAB)?;
        within("context_length", self.n_ctx_train as i64, MAX_CONTEXT)?;
        let n_rot = self.rope.n_dims as i64;
        if n_rot <= 0 || n_rot % 2 != 0 || n_rot > self.head_dim_k {
            return Err(bad(
                &key("rope.dimension_count"),
                &format!(
                    "= {n_rot} must be even and in 2..={} (the key length)",
                    self.head_dim_k
                ),
            ));
        }
        let positive = |k: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(bad(
                    &key(k),
                    &format!("= {v} must be a positive finite number"),
                ))
            }
        };
        positive("attention.layer_norm_rms_epsilon", self.rms_eps)?;
        positive("rope.freq_base", self.rope.freq_base)?;
        positive(
            "rope.scaling.factor (or rope.scale_linear)",
            self.rope.freq_scale,
        )?;
        positive("rope.scaling.attn_factor", self.rope.attn_factor)?;
        positive("rope.scaling.yarn_beta_fast", self.rope.beta_fast)?;
        positive("rope.scaling.yarn_beta_slow", self.rope.beta_slow)?;
        if !(0.0..=1.0).contains(&self.rope.ext_factor) {
            return Err(bad(
                &key("rope.scaling.yarn_ext_factor"),
                &format!("= {} must be in 0..=1", self.rope.ext_factor),
            ));
        }
        // The layers the file declares must be the layers its tensors hold.
        let in_tensors = f.layers_in_tensors();
        if in_tensors as usize != self.n_layer {
            return Err(bad(
                &key("block_count"),
                &format!(
                    "= {} but the file's tensors hold {in_tensors} layers",
                    self.n_layer
                ),
            ));
        }
        Ok(())
    }
}

/// Bounds of the metadata checks: far above any model published (Llama 3.1 405B: 126 layers,
/// width 16,384, 128 heads; vocabularies to ~260k; contexts to 10M), far below what would make an
/// allocation absurd.
const MAX_LAYERS: i64 = 1024;
const MAX_WIDTH: i64 = 1 << 17;
const MAX_HEADS: i64 = 4096;
const MAX_HEAD_DIM: i64 = 4096;
const MAX_VOCAB: i64 = 1 << 24;
const MAX_CONTEXT: i64 = 1 << 27;

/// Which layers use the sliding window: the per-layer array `{arch}.attention.sliding_window_pattern`
/// (booleans or integers), or, when it is one integer `p` (default `default_pattern`: the
/// family's), every layer except each `p`-th (with 6: five local layers, then one global).
pub fn sliding_layers(
    f: &GgufFile,
    arch: &str,
    n_layer: usize,
    default_pattern: i64,
) -> Result<Vec<bool>, ModelError> {
    let key = arch_key(arch, "attention.sliding_window_pattern");
    if let Some(arr) = f.array_opt(&key).ok().flatten() {
        if arr.len() != n_layer {
            return Err(bad(
                &key,
                &format!("has {} values for {n_layer} layers", arr.len()),
            ));
        }
        return Ok(arr
            .iter()
            .map(|v| matches!(v, MetaValue::Bool(true)) || v.as_i64().unwrap_or(0) != 0)
            .collect());
    }
    let pattern = f
        .int_opt(&key)
        .ok()
        .flatten()
        .unwrap_or(default_pattern)
        .max(0) as usize;
    Ok((0..n_layer)
        .map(|il| pattern == 0 || il % pattern < pattern - 1)
        .collect())
}

/// A per-layer integer: an array of one value per layer, or one value for every layer; `None`
/// when the key is absent.
pub fn per_layer(f: &GgufFile, key: &str, n_layer: usize) -> Result<Option<Vec<i64>>, ModelError> {
    if n_layer as i64 > MAX_LAYERS {
        return Err(bad(
            key,
            &format!("is read for {n_layer} layers (more than {MAX_LAYERS})"),
        ));
    }
    if let Some(arr) = f.array_opt(key).ok().flatten() {
        if arr.len() != n_layer {
            return Err(bad(
                key,
                &format!("has {} values for {n_layer} layers", arr.len()),
            ));
        }
        return arr
            .iter()
            .map(|v| {
                v.as_i64()
                    .ok_or_else(|| bad(key, "holds a value that is not an integer"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some);
    }
    Ok(f.int_opt(key)?.map(|v| vec![v; n_layer]))
}

/// An optional float that must be positive (a RoPE base); `default` where it is absent.
pub(crate) fn positive_float(f: &GgufFile, key: &str, default: f32) -> Result<f32, ModelError> {
    match f.float_opt(key)? {
        None => Ok(default),
        Some(v) if v > 0.0 => Ok(v as f32),
        Some(v) => Err(bad(key, &format!("= {v} must be positive"))),
    }
}

/// An optional float that must not be negative (a softcap, where 0 means none); 0 where absent.
pub(crate) fn non_negative_float(f: &GgufFile, key: &str) -> Result<f32, ModelError> {
    match f.float_opt(key)? {
        None => Ok(0.0),
        Some(v) if v >= 0.0 => Ok(v as f32),
        Some(v) => Err(bad(key, &format!("= {v} must not be negative"))),
    }
}

/// The token embedding, final norm and output matrix every family has (the output matrix is the
/// embedding itself when the file ties them).
#[derive(Debug)]
pub struct Head {
    /// [n_embd, n_vocab]
    pub tok_embd: StoredTensor,
    /// [n_embd]
    pub output_norm: StoredTensor,
    /// [n_embd, n_vocab]
    pub output: StoredTensor,
}

impl Head {
    /// Binds `token_embd`, `output` (or the embedding, tied) and `output_norm`.
    pub fn bind(w: &Weights, n_embd: i64, n_vocab: i64) -> Result<Head, ModelError> {
        let tok_embd = w.req("token_embd.weight", &[n_embd, n_vocab])?;
        let output = w
            .opt("output.weight", &[n_embd, n_vocab])?
            .unwrap_or_else(|| tok_embd.clone());
        Ok(Head {
            output_norm: w.req("output_norm.weight", &[n_embd])?,
            tok_embd,
            output,
        })
    }
}

/// The projections of an attention block with per-head RMSNorms of queries and keys (Gemma 3,
/// Qwen 3.5's full-attention layers).
#[derive(Debug)]
pub struct NormedAttention {
    /// [n_embd, q_cols]
    pub wq: StoredTensor,
    /// [n_embd, n_head_kv * head_dim_k]
    pub wk: StoredTensor,
    /// [n_embd, n_head_kv * head_dim_v]
    pub wv: StoredTensor,
    /// [n_head * head_dim_v, n_embd]
    pub wo: StoredTensor,
    /// [head_dim_k]
    pub q_norm: StoredTensor,
    /// [head_dim_k]
    pub k_norm: StoredTensor,
}

impl NormedAttention {
    /// Binds layer `il`'s `attn_{q,k,v,output}` and `attn_{q,k}_norm`; the query projection has
    /// `q_cols` outputs.
    pub fn bind(
        w: &Weights,
        il: usize,
        hp: &Hparams,
        q_cols: i64,
    ) -> Result<NormedAttention, ModelError> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let (e, hd) = (hp.n_embd, hp.head_dim_k);
        Ok(NormedAttention {
            wq: w.req(&n("attn_q.weight"), &[e, q_cols])?,
            wk: w.req(&n("attn_k.weight"), &[e, hp.n_head_kv * hd])?,
            wv: w.req(&n("attn_v.weight"), &[e, hp.n_head_kv * hp.head_dim_v])?,
            wo: w.req(&n("attn_output.weight"), &[hp.n_head * hp.head_dim_v, e])?,
            q_norm: w.req(&n("attn_q_norm.weight"), &[hd])?,
            k_norm: w.req(&n("attn_k_norm.weight"), &[hd])?,
        })
    }
}

/// Weights that `arch`'s graph can use fused (see [`axle_ggml::WeightFusion`]); none for the
/// families whose graphs do not bind fused weights.
pub fn projection_fusions(arch: &str, f: &GgufFile) -> Vec<axle_ggml::FusedWeight> {
    if llama::FUSING_ARCHS.contains(&arch) {
        llama::projection_fusions(f)
    } else {
        Vec::new()
    }
}

/// A family constructor: reads its config from the file and binds its weights.
pub type Loader = fn(&GgufFile, &TensorStore) -> Result<Box<dyn Family>, ModelError>;

/// GGUF architecture name -> family.
pub const REGISTRY: &[(&str, Loader)] = &[
    ("llama", llama::load),
    ("gemma3", gemma3::load),
    ("gemma4", gemma4::load),
    ("qwen2", qwen2::load),
    ("qwen3", qwen3::load),
    ("qwen2moe", qwen2moe::load),
    ("qwen3moe", qwen3moe::load),
    ("deepseek2", deepseek2::load),
    ("qwen35", qwen35::load),
    ("qwen35moe", qwen35::load_moe),
    ("qwen3next", qwen35::load_next),
    ("gpt-oss", gpt_oss::load),
    ("glm4moe", glm4moe::load),
];

/// Names of the supported architectures.
pub fn supported() -> Vec<&'static str> {
    REGISTRY.iter().map(|(n, _)| *n).collect()
}

/// The `general.architecture` of a GGUF file, read from its header (tensors are not loaded).
pub fn architecture_of(path: &std::path::Path) -> Result<String, ModelError> {
    if crate::hf::is_folder(path) {
        return crate::hf::architecture_of(path);
    }
    let file = GgufFile::open(path)?;
    Ok(file.str("general.architecture")?.to_string())
}

/// The loader for an architecture, or a clear error naming the supported ones.
pub fn loader_for(arch: &str) -> Result<Loader, ModelError> {
    REGISTRY
        .iter()
        .find(|(n, _)| *n == arch)
        .map(|(_, l)| *l)
        .ok_or_else(|| ModelError::UnsupportedArch {
            arch: arch.into(),
            supported: supported().join(", "),
        })
}
