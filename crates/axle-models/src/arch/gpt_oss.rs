//! gpt-oss (`gpt-oss` GGUF architecture: OpenAI's gpt-oss-20b and gpt-oss-120b): pre-norm
//! decoder layers with
//! - grouped-query attention with QKV and output biases, NeoX RoPE (YaRN-scaled in the released
//!   files), and a learned sink logit per head that joins every row's softmax;
//! - sliding-window attention on every other layer (`attention.sliding_window_pattern`, default
//!   2: even layers local, odd layers global);
//! - a mixture of experts on every layer: the router (with a bias) picks the top-k experts by
//!   raw logit and weights them by a softmax over the chosen ones; every expert product has a
//!   per-expert bias; the gated unit is the clamped SwiGLU of gpt-oss (`GluOp::SwiGluOai`).
//!
//! The op order is libllama's graph for the architecture, so that logits match it. Expert
//! weights are MXFP4 in the released files; any type ggml multiplies works.
use super::{positive_float, sliding_layers, Family, Head, Hparams, Weights};
use crate::layers::{AttnSpec, Step};
use crate::moe::{Gating, MoeConfig, MoeLayer};
use crate::ModelError;
use axle_ggml::{GgufFile, GluOp, RopeParams, StoredTensor, Tensor, TensorStore};

const ARCH: &str = "gpt-oss";

/// One decoder layer.
#[derive(Debug)]
struct Layer {
    /// [n_embd]
    attn_norm: StoredTensor,
    /// [n_embd, n_head * head_dim], [n_embd, n_head_kv * head_dim] (twice), with biases.
    wq: StoredTensor,
    bq: StoredTensor,
    wk: StoredTensor,
    bk: StoredTensor,
    wv: StoredTensor,
    bv: StoredTensor,
    /// [n_head * head_dim, n_embd] and its bias [n_embd].
    wo: StoredTensor,
    bo: StoredTensor,
    /// [n_head]: one sink logit per head.
    sinks: StoredTensor,
    /// [n_embd]: the norm before the experts.
    post_attn_norm: StoredTensor,
    moe: MoeLayer,
    /// Whether the layer attends over the sliding window.
    sliding: bool,
}

/// The gpt-oss model.
#[derive(Debug)]
pub struct GptOss {
    hp: Hparams,
    head: Head,
    layers: Vec<Layer>,
    moe: MoeConfig,
    /// RoPE of the sliding-window layers (`rope.freq_base_swa` when the file has it).
    rope_swa: RopeParams,
}

/// Reads the config and binds the weights.
pub fn load(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    let mut hp = Hparams::from_gguf(f, ARCH, 2)?;
    let w = Weights::new(store);
    let (e, v) = (hp.n_embd, hp.n_vocab);
    let (q_dim, kv_dim) = (hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k);
    let vv_dim = hp.n_head_kv * hp.head_dim_v;
    let moe = MoeConfig {
        act: GluOp::SwiGluOai,
        ..MoeConfig::from_gguf(f, ARCH, hp.n_ff, Gating::SoftmaxWeight, false)?
    };
    let window = f
        .int_opt(&hp.key("attention.sliding_window"))?
        .filter(|&w| w > 0)
        .map(|w| w as u32);
    hp.sliding_window = window;
    let sliding = match window {
        Some(_) => sliding_layers(f, ARCH, hp.n_layer, 2)?,
        None => vec![false; hp.n_layer],
    };
    let mut rope_swa = hp.rope;
    rope_swa.freq_base = positive_float(f, &hp.key("rope.freq_base_swa"), hp.rope.freq_base)?;
    let mut layers = Vec::with_capacity(hp.n_layer);
    for (i, &sliding) in sliding.iter().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}");
        layers.push(Layer {
            attn_norm: w.req(&n("attn_norm.weight"), &[e])?,
            wq: w.req(&n("attn_q.weight"), &[e, q_dim])?,
            bq: w.req(&n("attn_q.bias"), &[q_dim])?,
            wk: w.req(&n("attn_k.weight"), &[e, kv_dim])?,
            bk: w.req(&n("attn_k.bias"), &[kv_dim])?,
            wv: w.req(&n("attn_v.weight"), &[e, vv_dim])?,
            bv: w.req(&n("attn_v.bias"), &[vv_dim])?,
            wo: w.req(&n("attn_output.weight"), &[hp.n_head * hp.head_dim_v, e])?,
            bo: w.req(&n("attn_output.bias"), &[e])?,
            sinks: w.req(&n("attn_sinks.weight"), &[hp.n_head])?,
            post_attn_norm: w.req(&n("post_attention_norm.weight"), &[e])?,
            moe: MoeLayer::bind(&w, i, e, &moe, None)?,
            sliding,
        });
    }
    Ok(Box::new(GptOss {
        head: Head::bind(&w, e, v)?,
        layers,
        moe,
        rope_swa,
        hp,
    }))
}

impl Family for GptOss {
    fn hparams(&self) -> &Hparams {
        &self.hp
    }

    fn forward<'a>(&'a self, s: &mut Step<'a>) -> Tensor<'a> {
        let g = s.ctx;
        let (hp, n) = (&self.hp, s.n_tokens);
        let mut x = g
            .get_rows(self.head.tok_embd.t(), s.tokens)
            .named("inp_embd");
        let last = self.layers.len() - 1;
        for (il, l) in self.layers.iter().enumerate() {
            let h = s.rms_norm(x, &l.attn_norm, hp.rms_eps);
            let q = g.reshape(
                s.linear(&l.wq, Some(&l.bq), h),
                &[hp.head_dim_k, hp.n_head, n],
            );
            let k = g.reshape(
                s.linear(&l.wk, Some(&l.bk), h),
                &[hp.head_dim_k, hp.n_head_kv, n],
            );
            let v = g.reshape(
                s.linear(&l.wv, Some(&l.bv), h),
                &[hp.head_dim_v, hp.n_head_kv, n],
            );
            let rope = if l.sliding { &self.rope_swa } else { &hp.rope };
            let q = g.rope(q, s.pos, None, rope);
            let k = g.rope(k, s.pos, None, rope);
            let spec = AttnSpec {
                n_head: hp.n_head,
                n_head_kv: hp.n_head_kv,
                head_dim_k: hp.head_dim_k,
                head_dim_v: hp.head_dim_v,
                scale: 1.0 / (hp.rope.n_dims as f32).sqrt(),
                softcap: 0.0,
                sliding: l.sliding,
            };
            let a = s.attention(il, q, k, v, &spec, Some(l.sinks.t()));
            let mut o = s.linear(&l.wo, Some(&l.bo), a);
            let mut residual = x;
            if il == last {
                o = g.get_rows(o, s.out_ids);
                residual = g.get_rows(residual, s.out_ids);
            }
            let x_attn = g.add(o, residual).named(&format!("ffn_inp-{il}"));
            let h = s.rms_norm(x_attn, &l.post_attn_norm, hp.rms_eps);
            let f = s.moe(h, &l.moe, &self.moe);
            x = g.add(f, x_attn).named(&format!("l_out-{il}"));
        }
        let x = s.rms_norm(x, &self.head.output_norm, hp.rms_eps);
        s.output(&self.head.output, x, 0.0)
    }
}
