//! Architecture families, one file each, and the registry that maps a GGUF
//! `general.architecture` to the family that implements it. Adding a family means one new file and
//! one line in [`REGISTRY`].
pub mod gemma3;
pub mod llama;
pub mod qwen2;
pub mod qwen3;

use crate::blocks::Step;
use crate::ModelError;
use axle_ggml::{GgufFile, RopeParams, StoredTensor, Tensor, TensorStore};

/// What every family exposes to the runner.
pub trait Family: Send + Sync {
    /// Shared hyperparameters.
    fn hparams(&self) -> &Hparams;
    /// Builds the forward pass for one step; returns logits [n_vocab, n_out].
    fn forward<'a>(&'a self, s: &mut Step<'a>) -> Tensor<'a>;
    /// Sliding window of the model's local-attention layers, if any.
    fn sliding_window(&self) -> Option<u32> {
        None
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
}

impl Hparams {
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
        let key = |k: &str| format!("{arch}.{k}");
        let int = |k: &str| f.int(&key(k)).map_err(ModelError::from);
        let n_embd = int("embedding_length")?;
        let n_head = int("attention.head_count")?;
        let n_layer = int("block_count")? as usize;
        let n_head_kv = f
            .int_opt(&key("attention.head_count_kv"))?
            .unwrap_or(n_head);
        if n_embd <= 0 || n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 || n_layer == 0 {
            return Err(ModelError::Invalid(format!(
                "inconsistent attention shape: n_embd {n_embd}, heads {n_head}, kv heads {n_head_kv}, layers {n_layer}"
            )));
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
        let n_ctx_train = f.int_opt(&key("context_length"))?.unwrap_or(2048) as u32;
        let n_rot = f
            .int_opt(&key("rope.dimension_count"))?
            .unwrap_or(head_dim_k) as i32;
        let freq_base = f.float_opt(&key("rope.freq_base"))?.unwrap_or(10000.0) as f32;
        let scaling = f
            .str_opt(&key("rope.scaling.type"))?
            .unwrap_or("none")
            .to_string();
        let factor = f.float_opt(&key("rope.scaling.factor"))?.unwrap_or(0.0) as f32;
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
            n_ctx_orig: f
                .int_opt(&key("rope.scaling.original_context_length"))?
                .unwrap_or(n_ctx_train as i64) as i32,
            freq_base,
            freq_scale,
            ext_factor: if yarn {
                f.float_opt(&key("rope.scaling.yarn_ext_factor"))?
                    .unwrap_or(1.0) as f32
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
        Ok(Hparams {
            arch: arch.into(),
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff: int("feed_forward_length")?,
            rms_eps,
            n_ctx_train,
            rope,
        })
    }
}

/// Looks weights up by GGUF name and checks their shapes: the one place model files bind tensors.
pub struct Weights<'s> {
    store: &'s TensorStore,
}

impl<'s> Weights<'s> {
    /// Binding over a loaded store.
    pub fn new(store: &'s TensorStore) -> Self {
        Weights { store }
    }

    /// A required tensor with the given shape (ggml order).
    pub fn req(&self, name: &str, shape: &[i64]) -> Result<StoredTensor, ModelError> {
        let t = self.store.require(name)?;
        let ne = t.t().ne();
        let found: Vec<i64> = ne[..shape.len()].to_vec();
        if found != shape || ne[shape.len()..].iter().any(|&d| d != 1) {
            return Err(ModelError::Ggml(axle_ggml::Error::TensorShape {
                name: name.into(),
                found: ne.to_vec(),
                expected: shape.to_vec(),
            }));
        }
        Ok(t)
    }

    /// An optional tensor (shape checked when present).
    pub fn opt(&self, name: &str, shape: &[i64]) -> Result<Option<StoredTensor>, ModelError> {
        match self.store.get(name) {
            None => Ok(None),
            Some(_) => self.req(name, shape).map(Some),
        }
    }
}

/// A family constructor: reads its config from the file and binds its weights.
pub type Loader = fn(&GgufFile, &TensorStore) -> Result<Box<dyn Family>, ModelError>;

/// GGUF architecture name -> family.
pub const REGISTRY: &[(&str, Loader)] = &[
    ("llama", llama::load),
    ("gemma3", gemma3::load),
    ("qwen2", qwen2::load),
    ("qwen3", qwen3::load),
];

/// Names of the supported architectures.
pub fn supported() -> Vec<&'static str> {
    REGISTRY.iter().map(|(n, _)| *n).collect()
}

/// The `general.architecture` of a GGUF file, read from its header (tensors are not loaded).
pub fn architecture_of(path: &std::path::Path) -> Result<String, ModelError> {
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
