//! Llama family (`llama` GGUF architecture: Llama 2/3, SmolLM, Mistral): RMSNorm, rotary
//! embeddings (with llama3 frequency factors when the file has them), grouped-query attention
//! (sliding-window on every layer when the file sets `llama.attention.sliding_window`, as Mistral
//! does), SwiGLU feed-forward, tied or separate output matrix. The Qwen families and GLM-4.5 are
//! this graph with a different [`Variant`] (NeoX RoPE; QKV biases for Qwen2 and GLM, per-head QK
//! norm for Qwen3 and some GLM files; mixtures of experts, after leading dense layers for GLM).
use super::nextn::{self, Nextn};
use super::{Family, Head, Hparams, Weights};
use crate::layers::{AttnSpec, FusedProduct, Step};
use crate::moe::{FeedForward, Gating, MoeConfig, MoeLayer, SharedGate};
use crate::ModelError;
use axle_ggml::{FusedWeight, GgufFile, StoredTensor, Tensor, TensorStore};

/// One decoder layer.
#[derive(Debug)]
struct Layer {
    /// [n_embd]
    attn_norm: StoredTensor,
    /// [n_embd, n_head * head_dim]
    wq: StoredTensor,
    /// [n_embd, n_head_kv * head_dim]
    wk: StoredTensor,
    /// [n_embd, n_head_kv * head_dim]
    wv: StoredTensor,
    /// [n_embd, q_dim + 2 kv_dim]: `wq`, `wk` and `wv` stored as one weight, where the store
    /// fused them (see [`projection_fusions`]).
    wqkv: Option<StoredTensor>,
    /// [n_head * head_dim, n_embd]
    wo: StoredTensor,
    /// Optional QKV biases.
    bq: Option<StoredTensor>,
    bk: Option<StoredTensor>,
    bv: Option<StoredTensor>,
    /// [head_dim] each: per-head RMSNorm of queries and keys (Qwen3).
    q_norm: Option<StoredTensor>,
    k_norm: Option<StoredTensor>,
    /// [n_embd]
    ffn_norm: StoredTensor,
    ffn: FeedForward,
}

/// The Llama model.
#[derive(Debug)]
pub struct Llama {
    hp: Hparams,
    head: Head,
    /// [head_dim / 2] llama3 rope frequency factors
    rope_freqs: Option<StoredTensor>,
    layers: Vec<Layer>,
    attn: AttnSpec,
    /// An MTP head's own input and output weights (set on the head, not the trunk).
    nextn: Option<Nextn>,
    /// The model's MTP head: the first `nextn` block after the trunk, with its input and output.
    mtp: Option<Box<Llama>>,
    /// The model layer of the first of `layers`.
    first_layer: usize,
}

/// What distinguishes the Llama-shaped families from each other.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    /// GGUF architecture name (metadata key prefix).
    pub arch: &'static str,
    /// RoPE mode: 0 normal (Llama), 2 NeoX (Qwen).
    pub rope_mode: i32,
    /// Per-head RMSNorm of Q and K before RoPE: required when set, used when the file has it
    /// otherwise.
    pub qk_norm: bool,
    /// Name of the norm before the feed-forward block (`ffn_norm`; `post_attention_norm` in
    /// GLM-4.5's files).
    pub ffn_norm: &'static str,
    /// Every layer's FFN is a mixture of experts (the MoE variants), or dense.
    pub moe: Option<MoeVariant>,
}

/// What a Llama-shaped MoE family fixes that its metadata does not say.
#[derive(Debug, Clone, Copy)]
pub struct MoeVariant {
    /// Router score function.
    pub gating: Gating,
    /// Whether routing weights are renormalised when the file does not say
    /// (`{arch}.expert_weights_norm`).
    pub norm_default: bool,
    /// Each layer has a shared expert (`ffn_*_shexp`), of width
    /// `{arch}.expert_shared_feed_forward_length` or else the dense FFN width.
    pub shared_expert: bool,
    /// How the shared expert's gate is written.
    pub shared_gate: SharedGate,
    /// The first `{arch}.leading_dense_block_count` layers have a dense FFN (GLM-4.5).
    pub leading_dense: bool,
}

/// Name of a layer's fused Q, K and V weight.
const FUSED_QKV: &str = "attn_qkv.fused";

/// The architectures whose graph is this one, and which therefore use fused projections.
pub const FUSING_ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "glm4moe"];

/// The weights of `f` that this graph can use fused: each layer's Q, K and V (where the layer has
/// no QKV biases and no per-head Q/K norms, which apply to each part by itself) and its dense
/// FFN's gate and up ([`FeedForward::dense`]). The store fuses a group only where its parts match
/// (one type, one width, one buffer); the graph binds whatever it finds.
pub fn projection_fusions(f: &GgufFile) -> Vec<FusedWeight> {
    let has = |name: &str| f.tensors().iter().any(|t| t.name == name);
    let mut groups = Vec::new();
    for il in 0..f.layers_in_tensors() {
        let n = |s: &str| format!("blk.{il}.{s}");
        let separate = [
            "attn_q.bias",
            "attn_k.bias",
            "attn_v.bias",
            "attn_q_norm.weight",
            "attn_k_norm.weight",
        ];
        if !separate.iter().any(|s| has(&n(s))) {
            groups.push(FusedWeight {
                name: n(FUSED_QKV),
                parts: ["attn_q.weight", "attn_k.weight", "attn_v.weight"]
                    .iter()
                    .map(|s| n(s))
                    .collect(),
            });
        }
        groups.push(FeedForward::fused_gate_up(il as usize));
    }
    groups
}

/// Reads the config and binds the weights.
pub fn load(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    load_variant(
        f,
        store,
        Variant {
            arch: "llama",
            rope_mode: 0,
            qk_norm: false,
            ffn_norm: "ffn_norm",
            moe: None,
        },
    )
}

/// Loads a Llama-shaped family.
pub fn load_variant(
    f: &GgufFile,
    store: &TensorStore,
    variant: Variant,
) -> Result<Box<dyn Family>, ModelError> {
    let mut hp = Hparams::from_gguf(f, variant.arch, variant.rope_mode)?;
    // Multi-token-prediction layers (GLM-4.5's `nextn`) follow the trunk in the file; the trunk
    // alone makes the next-token graph.
    nextn::split_off(f, &mut hp)?;
    hp.sliding_window = f
        .int_opt(&format!("{}.attention.sliding_window", variant.arch))?
        .filter(|&w| w > 0)
        .map(|w| w as u32);
    Ok(Box::new(Llama::new(f, hp, store, variant)?))
}

impl Llama {
    fn new(
        f: &GgufFile,
        hp: Hparams,
        store: &TensorStore,
        variant: Variant,
    ) -> Result<Llama, ModelError> {
        let w = Weights::new(store);
        let (e, v, ff) = (hp.n_embd, hp.n_vocab, hp.n_ff);
        let (q_dim, kv_dim) = (hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k);
        let vv_dim = hp.n_head_kv * hp.head_dim_v;
        let key = |k: &str| format!("{}.{k}", variant.arch);
        let moe = match variant.moe {
            None => None,
            Some(m) => {
                let gating = match f.int_opt(&key("expert_gating_func"))?.unwrap_or(0) {
                    0 => m.gating,
                    1 => Gating::Softmax,
                    2 => Gating::Sigmoid,
                    v => {
                        return Err(ModelError::Unsupported(format!(
                            "{} = {v}: only softmax (1) and sigmoid (2) routing are implemented",
                            key("expert_gating_func")
                        )))
                    }
                };
                Some(MoeConfig {
                    shared_gate: m.shared_gate,
                    ..MoeConfig::from_gguf(f, variant.arch, ff, gating, m.norm_default)?
                })
            }
        };
        // The shared expert's width: its own key, else the routed width times the shared count
        // (GLM-4.5), else the dense width.
        let n_shared = f.int_opt(&key("expert_shared_count"))?;
        if let Some(c) = n_shared {
            if !(0..=64).contains(&c) {
                return Err(super::bad(
                    &key("expert_shared_count"),
                    &format!("= {c} is outside 0..=64"),
                ));
            }
        }
        let shared_ff = match (variant.moe, &moe) {
            (Some(m), Some(c)) if m.shared_expert => match (c.n_ff_shared, n_shared) {
                (Some(w), _) => Some(w),
                (None, Some(0)) => None,
                (None, Some(k)) => Some(c.n_ff_exp * k),
                (None, None) => Some(ff),
            },
            _ => None,
        };
        let n_dense = match variant.moe {
            Some(m) if m.leading_dense => f
                .int_opt(&key("leading_dense_block_count"))?
                .unwrap_or(0)
                .clamp(0, hp.n_layer as i64) as usize,
            _ => 0,
        };
        let layer = |i: usize| -> Result<Layer, ModelError> {
            let n = |s: &str| format!("blk.{i}.{s}");
            Ok(Layer {
                attn_norm: w.req(&n("attn_norm.weight"), &[e])?,
                wq: w.req(&n("attn_q.weight"), &[e, q_dim])?,
                wk: w.req(&n("attn_k.weight"), &[e, kv_dim])?,
                wv: w.req(&n("attn_v.weight"), &[e, vv_dim])?,
                wqkv: w.opt(&n(FUSED_QKV), &[e, q_dim + kv_dim + vv_dim])?,
                wo: w.req(&n("attn_output.weight"), &[hp.n_head * hp.head_dim_v, e])?,
                bq: w.opt(&n("attn_q.bias"), &[q_dim])?,
                bk: w.opt(&n("attn_k.bias"), &[kv_dim])?,
                bv: w.opt(&n("attn_v.bias"), &[vv_dim])?,
                q_norm: if variant.qk_norm {
                    Some(w.req(&n("attn_q_norm.weight"), &[hp.head_dim_k])?)
                } else {
                    w.opt(&n("attn_q_norm.weight"), &[hp.head_dim_k])?
                },
                k_norm: if variant.qk_norm {
                    Some(w.req(&n("attn_k_norm.weight"), &[hp.head_dim_k])?)
                } else {
                    w.opt(&n("attn_k_norm.weight"), &[hp.head_dim_k])?
                },
                ffn_norm: w.req(&n(&format!("{}.weight", variant.ffn_norm)), &[e])?,
                ffn: match &moe {
                    Some(cfg) if i >= n_dense => {
                        FeedForward::Moe(Box::new(MoeLayer::bind(&w, i, e, cfg, shared_ff)?), *cfg)
                    }
                    _ => FeedForward::dense(&w, i, e, ff)?,
                },
            })
        };
        let layers = (0..hp.n_layer).map(layer).collect::<Result<Vec<_>, _>>()?;
        let attn = AttnSpec {
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim_k: hp.head_dim_k,
            head_dim_v: hp.head_dim_v,
            scale: 1.0 / (hp.head_dim_k as f32).sqrt(),
            softcap: 0.0,
            sliding: hp.sliding_window.is_some(),
        };
        let rope_freqs = w.opt("rope_freqs.weight", &[hp.rope.n_dims as i64 / 2])?;
        // The first MTP block, where the file carries one after the trunk.
        let at = hp.n_layer;
        let mtp = match nextn::is_block(f, at) {
            false => None,
            true => Some(Box::new(Llama {
                head: Head::bind(&w, e, v)?,
                rope_freqs: rope_freqs.clone(),
                layers: vec![layer(at)?],
                attn,
                nextn: Some(Nextn::bind(&w, at, e, v)?),
                mtp: None,
                first_layer: at,
                hp: Hparams {
                    n_layer: 1,
                    ..hp.clone()
                },
            })),
        };
        Ok(Llama {
            head: Head::bind(&w, e, v)?,
            rope_freqs,
            layers,
            attn,
            nextn: None,
            mtp,
            first_layer: 0,
            hp,
        })
    }
}

impl Llama {
    /// Q [head_dim_k, n_head, n], K [head_dim_k, n_head_kv, n] and V [head_dim_v, n_head_kv, n]
    /// from a fused QKV product: views of the rows of the fused weight's output, or the parts'
    /// outputs.
    fn split_qkv<'a>(
        &self,
        g: &'a axle_ggml::Context,
        y: FusedProduct<'a>,
    ) -> (Tensor<'a>, Tensor<'a>, Tensor<'a>) {
        let hp = &self.hp;
        let dims = [
            (hp.head_dim_k, hp.n_head),
            (hp.head_dim_k, hp.n_head_kv),
            (hp.head_dim_v, hp.n_head_kv),
        ];
        let heads = |t: Tensor<'a>, (d, h): (i64, i64), offset: usize| {
            let n = t.ne()[1];
            g.view(t, &[d, h, n], &[t.dtype().row_size(d), t.nb()[1]], offset)
        };
        match y {
            FusedProduct::Whole(y) => {
                let size = |(d, h): (i64, i64)| y.dtype().row_size(d * h);
                (
                    heads(y, dims[0], 0),
                    heads(y, dims[1], size(dims[0])),
                    heads(y, dims[2], size(dims[0]) + size(dims[1])),
                )
            }
            FusedProduct::Parts(p) => (
                heads(p[0], dims[0], 0),
                heads(p[1], dims[1], 0),
                heads(p[2], dims[2], 0),
            ),
        }
    }
}

impl Family for Llama {
    fn hparams(&self) -> &Hparams {
        &self.hp
    }

    fn forward<'a>(&'a self, s: &mut Step<'a>) -> Tensor<'a> {
        let g = s.ctx;
        let (hp, n) = (&self.hp, s.n_tokens);
        let rope_freqs = self.rope_freqs.as_ref().map(|t| t.t());
        let mut x = nextn::input(self.nextn.as_ref(), s, &self.head, hp.rms_eps);
        let last = self.layers.len() - 1;
        // Output rows are picked before the last layer's residual, unless every row's hidden
        // state is returned too (an MTP head reads them all).
        let early = !s.returns_hidden;
        for (il, l) in self.layers.iter().enumerate() {
            let h = s
                .rms_norm(x, &l.attn_norm, hp.rms_eps)
                .named(&format!("attn_norm-{il}"));
            let (q, k, v) = match &l.wqkv {
                Some(wqkv) => {
                    self.split_qkv(g, s.matmul_fused(wqkv, &[&l.wq, &l.wk, &l.wv], h, true))
                }
                None => (
                    g.reshape(
                        s.linear(&l.wq, l.bq.as_ref(), h),
                        &[hp.head_dim_k, hp.n_head, n],
                    ),
                    g.reshape(
                        s.linear(&l.wk, l.bk.as_ref(), h),
                        &[hp.head_dim_k, hp.n_head_kv, n],
                    ),
                    g.reshape(
                        s.linear(&l.wv, l.bv.as_ref(), h),
                        &[hp.head_dim_v, hp.n_head_kv, n],
                    ),
                ),
            };
            let (q, k) = match (&l.q_norm, &l.k_norm) {
                (Some(qn), Some(kn)) => {
                    (s.rms_norm(q, qn, hp.rms_eps), s.rms_norm(k, kn, hp.rms_eps))
                }
                _ => (q, k),
            };
            let q = g.rope(q, s.pos, rope_freqs, &hp.rope);
            let k = g.rope(k, s.pos, rope_freqs, &hp.rope);
            let q = q.named(&format!("q_rope-{il}"));
            let k = k.named(&format!("k_rope-{il}"));
            let v = v.named(&format!("v-{il}"));
            let a = s
                .attention(il, q, k, v, &self.attn, None)
                .named(&format!("attn-{il}"));
            let mut o = s.matmul(&l.wo, a);
            let mut residual = x;
            if il == last && early {
                o = g.get_rows(o, s.out_ids);
                residual = g.get_rows(residual, s.out_ids);
            }
            let x_attn = g.add(o, residual);
            let x_attn = x_attn.named(&format!("ffn_inp-{il}"));
            let h = s
                .rms_norm(x_attn, &l.ffn_norm, hp.rms_eps)
                .named(&format!("ffn_norm-{il}"));
            let f = s.feed_forward(h, &l.ffn);
            x = g.add(f, x_attn).named(&format!("l_out-{il}"));
        }
        nextn::output(self.nextn.as_ref(), s, &self.head, x, hp.rms_eps, early)
    }

    fn mtp(&self) -> Option<&dyn Family> {
        self.mtp.as_deref().map(|m| m as &dyn Family)
    }

    fn first_layer(&self) -> usize {
        self.first_layer
    }
}
