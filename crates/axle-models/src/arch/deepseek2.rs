//! DeepSeek V2/V3-style models with multi-head latent attention (`deepseek2` GGUF architecture:
//! DeepSeek-V2/V2.5/V3, Kimi K2, GLM-4.7-Flash and the other files llama.cpp converts to it).
//!
//! Attention compresses each token's keys and values into one latent row (`kv_lora_rank` wide,
//! RMS-normed) plus a small rotated key part (`rope.dimension_count` wide) shared by all heads.
//! That row is all the KV pool stores: one row per token per layer, not one per head
//! ([`Step::attention_latent`]; [`Family::kv_dims`] gives the pool K-only layers). Queries (from
//! a low-rank `attn_q_a`/`attn_q_b` pair, or one `attn_q`) absorb the per-head key up-projection
//! (`attn_k_b`), so attention runs as one-KV-head attention over the latent rows, and the result
//! goes through the per-head value up-projection (`attn_v_b`): libllama's "absorbed" MLA.
//!
//! Feed-forward: the first `leading_dense_block_count` layers are dense SwiGLU; the rest are
//! mixtures of experts (softmax or sigmoid router, per `expert_gating_func`; an optional
//! selection bias; optional renormalisation and scale) plus always-on shared experts.
//!
//! YaRN-scaled RoPE (DeepSeek V3, Kimi K2) corrects the attention scale by the `mscale` of
//! `rope.scaling.yarn_log_multiplier`, as libllama does. Grouped expert selection (DeepSeek V3's
//! router) comes with the MoE block. An MTP block after the trunk (`nextn_predict_layers`,
//! GLM-4.7-Flash's files) is the model's MTP head ([`super::nextn`]): one MoE layer with a
//! low-rank query. Refused by name: files without the split `attn_k_b`/`attn_v_b` (old GGUFs
//! with `attn_kv_b`).
use super::nextn::{self, Nextn};
use super::{bad, non_negative_float, Family, Head, Hparams, Weights};
use crate::layers::{AttnSpec, Step};
use crate::moe::{FeedForward, Gating, MoeConfig, MoeLayer};
use crate::ModelError;
use axle_ggml::{GgufFile, StoredTensor, Tensor, TensorStore};

const ARCH: &str = "deepseek2";

/// How a layer computes its queries.
#[derive(Debug)]
enum Query {
    /// [n_embd, q_lora_rank], [q_lora_rank], [q_lora_rank, n_head * head_k]
    LowRank {
        a: StoredTensor,
        a_norm: StoredTensor,
        b: StoredTensor,
    },
    /// [n_embd, n_head * head_k]
    Full(StoredTensor),
}

/// One decoder layer.
#[derive(Debug)]
struct Layer {
    attn_norm: StoredTensor,
    query: Query,
    /// [n_embd, kv_lora_rank + n_rot]
    wkv_a: StoredTensor,
    /// [kv_lora_rank]
    kv_a_norm: StoredTensor,
    /// [qk_nope, kv_lora_rank, n_head]: per-head key up-projection, absorbed into the queries.
    wk_b: StoredTensor,
    /// [kv_lora_rank, head_v, n_head]: per-head value up-projection.
    wv_b: StoredTensor,
    /// [n_head * head_v, n_embd]
    wo: StoredTensor,
    ffn_norm: StoredTensor,
    ffn: FeedForward,
}

/// The model.
#[derive(Debug)]
pub struct DeepSeek2 {
    hp: Hparams,
    /// Query/key head size before absorption (nope + rope part) and value head size.
    head_k: i64,
    head_v: i64,
    kv_lora: i64,
    n_rot: i64,
    /// Softmax scale: 1/sqrt(head_k), times the squared YaRN mscale when RoPE is scaled.
    kq_scale: f32,
    head: Head,
    layers: Vec<Layer>,
    /// An MTP head's own input and output weights (set on the head, not the trunk).
    nextn: Option<Nextn>,
    /// The model's MTP head: the first block after the trunk, with its input and output.
    mtp: Option<Box<DeepSeek2>>,
    /// The model layer of the first of `layers`.
    first_layer: usize,
}

/// Reads the config and binds the weights.
pub fn load(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    let mut hp = Hparams::from_gguf(f, ARCH, 0)?;
    // YaRN: libllama's attention factor for the rotations and the softmax-scale correction.
    let kq_mscale = if hp.rope.ext_factor != 0.0 {
        let factor = 1.0 / hp.rope.freq_scale;
        let get_mscale = |m: f32| {
            if factor <= 1.0 {
                1.0
            } else {
                0.1 * m * factor.ln() + 1.0
            }
        };
        // The converter writes 0.1 x mscale_all_dim; libllama cancels the 0.1.
        let log_mul = non_negative_float(f, &hp.key("rope.scaling.yarn_log_multiplier"))? / 0.1;
        let mut attn_factor = if log_mul != 0.0 {
            let mscale = if log_mul != 1.0 { log_mul } else { 1.0 };
            get_mscale(mscale) / get_mscale(log_mul)
        } else {
            get_mscale(1.0)
        };
        attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
        attn_factor *= hp.rope.attn_factor;
        hp.rope.attn_factor = attn_factor;
        let attn_factor_org = attn_factor * (1.0 + 0.1 * (1.0 / hp.rope.freq_scale).ln());
        attn_factor_org * (1.0 + 0.1 * log_mul * (1.0 / hp.rope.freq_scale).ln())
    } else {
        hp.rope.attn_factor
    };
    let int_in = |k: &str, v: Option<i64>, max: i64| -> Result<i64, ModelError> {
        match v {
            Some(v) if (1..=max).contains(&v) => Ok(v),
            Some(v) => Err(bad(&hp.key(k), &format!("= {v} is outside 1..={max}"))),
            None => Err(bad(&hp.key(k), "is missing")),
        }
    };
    let kv_lora = int_in(
        "attention.kv_lora_rank",
        f.int_opt(&hp.key("attention.kv_lora_rank"))?,
        1 << 16,
    )?;
    let q_lora = f.int_opt(&hp.key("attention.q_lora_rank"))?.unwrap_or(0);
    let head_k = match f.int_opt(&hp.key("attention.key_length_mla"))? {
        Some(v) => int_in("attention.key_length_mla", Some(v), 4096)?,
        None => {
            return Err(ModelError::Unsupported(format!(
                "{ARCH} without {} (a file from before llama.cpp split attn_kv_b): reconvert it",
                hp.key("attention.key_length_mla")
            )))
        }
    };
    let head_v = int_in(
        "attention.value_length_mla",
        f.int_opt(&hp.key("attention.value_length_mla"))?,
        4096,
    )?;
    let n_rot = hp.rope.n_dims as i64;
    if n_rot >= head_k {
        return Err(bad(
            &hp.key("rope.dimension_count"),
            &format!("= {n_rot} leaves no unrotated key part of the {head_k}-wide heads"),
        ));
    }
    // The cache row: latent then rotated key part, one KV head.
    if hp.head_dim_k != kv_lora + n_rot || hp.n_head_kv != 1 {
        return Err(bad(
            &hp.key("attention.key_length"),
            &format!(
                "= {} with {} KV heads; an MLA file has kv_lora_rank + rope dims = {} and 1",
                hp.head_dim_k,
                hp.n_head_kv,
                kv_lora + n_rot
            ),
        ));
    }
    let n_dense = f
        .int_opt(&hp.key("leading_dense_block_count"))?
        .unwrap_or(0)
        .clamp(0, hp.n_layer as i64) as usize;
    let n_vocab_hint = hp.n_vocab;
    let gating = match f.int_opt(&hp.key("expert_gating_func"))?.unwrap_or(0) {
        1 => Gating::Softmax,
        2 => Gating::Sigmoid,
        // Unset in DeepSeek V2/V2.5 files; GLM-4.7-Flash files without it are sigmoid-routed
        // (libllama recognises them by shape, as here).
        0 if (hp.n_layer == 47 || hp.n_layer == 48) && n_vocab_hint == 154_880 => Gating::Sigmoid,
        0 => Gating::Softmax,
        v => {
            return Err(ModelError::Unsupported(format!(
                "{} = {v}: only softmax (1) and sigmoid (2) routing are implemented",
                hp.key("expert_gating_func")
            )))
        }
    };
    // Next-token-prediction blocks follow the trunk in the file.
    nextn::split_off(f, &mut hp)?;
    let moe = MoeConfig::from_gguf(f, ARCH, hp.n_ff, gating, false)?;
    let n_shared = f.int_opt(&hp.key("expert_shared_count"))?.unwrap_or(0);
    if !(0..=64).contains(&n_shared) {
        return Err(bad(
            &hp.key("expert_shared_count"),
            &format!("= {n_shared} is outside 0..=64"),
        ));
    }
    let shared_ff = (n_shared > 0).then_some(moe.n_ff_exp * n_shared);

    let w = Weights::new(store);
    let (e, v, nh) = (hp.n_embd, hp.n_vocab, hp.n_head);
    let qk_nope = head_k - n_rot;
    let layer = |il: usize| -> Result<Layer, ModelError> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let query = if q_lora > 0 {
            Query::LowRank {
                a: w.req(&n("attn_q_a.weight"), &[e, q_lora])?,
                a_norm: w.req(&n("attn_q_a_norm.weight"), &[q_lora])?,
                b: w.req(&n("attn_q_b.weight"), &[q_lora, nh * head_k])?,
            }
        } else {
            Query::Full(w.req(&n("attn_q.weight"), &[e, nh * head_k])?)
        };
        let ffn = if il < n_dense {
            FeedForward::dense(&w, il, e, hp.n_ff)?
        } else {
            FeedForward::Moe(Box::new(MoeLayer::bind(&w, il, e, &moe, shared_ff)?), moe)
        };
        Ok(Layer {
            attn_norm: w.req(&n("attn_norm.weight"), &[e])?,
            query,
            wkv_a: w.req(&n("attn_kv_a_mqa.weight"), &[e, kv_lora + n_rot])?,
            kv_a_norm: w.req(&n("attn_kv_a_norm.weight"), &[kv_lora])?,
            wk_b: w.req(&n("attn_k_b.weight"), &[qk_nope, kv_lora, nh])?,
            wv_b: w.req(&n("attn_v_b.weight"), &[kv_lora, head_v, nh])?,
            wo: w.req(&n("attn_output.weight"), &[nh * head_v, e])?,
            ffn_norm: w.req(&n("ffn_norm.weight"), &[e])?,
            ffn,
        })
    };
    let layers = (0..hp.n_layer).map(layer).collect::<Result<Vec<_>, _>>()?;
    let kq_scale = kq_mscale * kq_mscale / (head_k as f32).sqrt();
    // The first MTP block, where the file carries one after the trunk.
    let at = hp.n_layer;
    let mtp = match nextn::is_block(f, at) {
        false => None,
        true => Some(Box::new(DeepSeek2 {
            head: Head::bind(&w, e, v)?,
            layers: vec![layer(at)?],
            head_k,
            head_v,
            kv_lora,
            n_rot,
            kq_scale,
            nextn: Some(Nextn::bind(&w, at, e, v)?),
            mtp: None,
            first_layer: at,
            hp: Hparams {
                n_layer: 1,
                ..hp.clone()
            },
        })),
    };
    Ok(Box::new(DeepSeek2 {
        head: Head::bind(&w, e, v)?,
        layers,
        head_k,
        head_v,
        kv_lora,
        n_rot,
        kq_scale,
        nextn: None,
        mtp,
        first_layer: 0,
        hp,
    }))
}

impl Family for DeepSeek2 {
    fn hparams(&self) -> &Hparams {
        &self.hp
    }

    /// K-only layers: one latent-plus-rope row per token.
    fn kv_dims(&self) -> Vec<(i64, i64)> {
        vec![(self.kv_lora + self.n_rot, 0); self.hp.n_layer]
    }

    fn forward<'a>(&'a self, s: &mut Step<'a>) -> Tensor<'a> {
        let g = s.ctx;
        let (hp, n) = (&self.hp, s.n_tokens);
        let (eps, nh) = (hp.rms_eps, hp.n_head);
        let (kv_lora, n_rot) = (self.kv_lora, self.n_rot);
        let qk_nope = self.head_k - n_rot;
        let spec = AttnSpec {
            n_head: nh,
            n_head_kv: 1,
            head_dim_k: kv_lora + n_rot,
            head_dim_v: kv_lora,
            scale: self.kq_scale,
            softcap: 0.0,
            sliding: false,
        };
        let mut x = nextn::input(self.nextn.as_ref(), s, &self.head, eps);
        let last = self.layers.len() - 1;
        // Output rows are picked before the last layer's residual, unless every row's hidden
        // state is returned too (an MTP head reads them all).
        let early = !s.returns_hidden;
        for (il, l) in self.layers.iter().enumerate() {
            let h = s.rms_norm(x, &l.attn_norm, eps);
            let q = match &l.query {
                Query::LowRank { a, a_norm, b } => {
                    let qa = s.rms_norm(s.matmul(a, h), a_norm, eps);
                    s.matmul(b, qa)
                }
                Query::Full(wq) => s.matmul(wq, h),
            };
            let q = g.reshape(q, &[self.head_k, nh, n]);
            let kv = s.matmul(&l.wkv_a, h);
            let kv_row = kv.nb()[1];
            let latent = g.view(kv, &[kv_lora, n], &[kv_row], 0);
            let k_pe = g.view(
                kv,
                &[n_rot, 1, n],
                &[kv_row, kv_row],
                kv.dtype().row_size(kv_lora),
            );
            let k_pe = g.rope(k_pe, s.pos, None, &hp.rope);
            let latent = s.rms_norm(latent, &l.kv_a_norm, eps);
            let qn = q.nb();
            let q_nope = g.view(q, &[qk_nope, nh, n], &[qn[1], qn[2]], 0);
            let q_pe = g.view(
                q,
                &[n_rot, nh, n],
                &[qn[1], qn[2]],
                q.dtype().row_size(qk_nope),
            );
            let q_pe = g.rope(q_pe, s.pos, None, &hp.rope);
            // Absorb the key up-projection: per head, [qk_nope] -> [kv_lora].
            let q_abs = s.head_matmul(&l.wk_b, g.permute(q_nope, [0, 2, 1, 3]));
            let q_abs = g.permute(q_abs, [0, 2, 1, 3]);
            let q = g.concat(q_abs, q_pe, 0);
            let k = g.concat(g.reshape(latent, &[kv_lora, 1, n]), k_pe, 0);
            let att = s.attention_latent(il, q, k, &spec);
            // Per head, the latent result through the value up-projection.
            let att = g.permute(g.reshape(att, &[kv_lora, nh, n]), [0, 2, 1, 3]);
            let att = g.cont(g.permute(s.head_matmul(&l.wv_b, att), [0, 2, 1, 3]));
            let mut o = s.matmul(&l.wo, g.reshape(att, &[self.head_v * nh, n]));
            let mut residual = x;
            if il == last && early {
                o = g.get_rows(o, s.out_ids);
                residual = g.get_rows(residual, s.out_ids);
            }
            let ffn_inp = g.add(o, residual);
            let h = s.rms_norm(ffn_inp, &l.ffn_norm, eps);
            let f = s.feed_forward(h, &l.ffn);
            x = g.add(f, ffn_inp).named(&format!("l_out-{il}"));
        }
        nextn::output(self.nextn.as_ref(), s, &self.head, x, eps, early)
    }

    fn mtp(&self) -> Option<&dyn Family> {
        self.mtp.as_deref().map(|m| m as &dyn Family)
    }

    fn first_layer(&self) -> usize {
        self.first_layer
    }
}
