//! Gemma 3 (`gemma3` GGUF architecture): embeddings scaled by sqrt(hidden), four RMSNorms per layer
//! (pre/post attention, pre/post FFN; the GGUF stores Gemma's (1 + w) weights already folded),
//! QK RMSNorm, GELU-tanh gated FFN, interleaved sliding-window and global attention layers with
//! their own RoPE bases, optional final logit softcapping, tied output matrix.
use super::{
    non_negative_float, positive_float, sliding_layers, Family, Head, Hparams, NormedAttention,
    Weights,
};
use crate::layers::{AttnSpec, FfnWeights, Step};
use crate::ModelError;
use axle_ggml::{GgufFile, GluOp, RopeParams, StoredTensor, Tensor, TensorStore};

/// One decoder layer.
#[derive(Debug)]
struct Layer {
    /// [n_embd] each: pre-attention, post-attention, pre-FFN, post-FFN norms.
    attn_norm: StoredTensor,
    attn_post_norm: StoredTensor,
    ffn_norm: StoredTensor,
    ffn_post_norm: StoredTensor,
    /// Queries: [n_embd, n_head * head_dim].
    attn: NormedAttention,
    /// [n_embd, n_ff] / [n_embd, n_ff] / [n_ff, n_embd]
    ffn_gate: StoredTensor,
    ffn_up: StoredTensor,
    ffn_down: StoredTensor,
    /// Sliding-window (local) layer, or global.
    sliding: bool,
}

/// The Gemma 3 model.
#[derive(Debug)]
pub struct Gemma3 {
    hp: Hparams,
    /// RoPE of the sliding-window layers (their own base, no scaling).
    rope_swa: RopeParams,
    /// Final logit softcap (0 = off).
    final_softcap: f32,
    head: Head,
    layers: Vec<Layer>,
}

/// Reads the config and binds the weights.
pub fn load(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    let mut hp = Hparams::from_gguf(f, "gemma3", 2)?;
    let window = f
        .int_opt("gemma3.attention.sliding_window")?
        .filter(|&w| w > 0)
        .map(|w| w as u32);
    hp.sliding_window = window;
    let sliding = match window {
        Some(_) => sliding_layers(f, "gemma3", hp.n_layer, 6)?,
        None => vec![false; hp.n_layer],
    };
    let rope_swa = RopeParams {
        freq_base: positive_float(f, "gemma3.rope.freq_base_swa", 10000.0)?,
        freq_scale: 1.0,
        ..hp.rope
    };
    let final_softcap = non_negative_float(f, "gemma3.final_logit_softcapping")?;
    let w = Weights::new(store);
    let (e, v, ff, hd) = (hp.n_embd, hp.n_vocab, hp.n_ff, hp.head_dim_k);
    let head = Head::bind(&w, e, v)?;
    let mut layers = Vec::with_capacity(hp.n_layer);
    for (i, &sliding) in sliding.iter().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}");
        layers.push(Layer {
            attn_norm: w.req(&n("attn_norm.weight"), &[e])?,
            attn_post_norm: w.req(&n("post_attention_norm.weight"), &[e])?,
            ffn_norm: w.req(&n("ffn_norm.weight"), &[e])?,
            ffn_post_norm: w.req(&n("post_ffw_norm.weight"), &[e])?,
            attn: NormedAttention::bind(&w, i, &hp, hp.n_head * hd)?,
            ffn_gate: w.req(&n("ffn_gate.weight"), &[e, ff])?,
            ffn_up: w.req(&n("ffn_up.weight"), &[e, ff])?,
            ffn_down: w.req(&n("ffn_down.weight"), &[ff, e])?,
            sliding,
        });
    }
    Ok(Box::new(Gemma3 {
        head,
        layers,
        rope_swa,
        final_softcap,
        hp,
    }))
}

impl Family for Gemma3 {
    fn hparams(&self) -> &Hparams {
        &self.hp
    }

    fn forward<'a>(&'a self, s: &mut Step<'a>) -> Tensor<'a> {
        let g = s.ctx;
        let (hp, n) = (&self.hp, s.n_tokens);
        let embd = g.get_rows(self.head.tok_embd.t(), s.tokens);
        let mut x = g.scale(embd, (hp.n_embd as f32).sqrt()).named("inp_scaled");
        let q_scale = 1.0 / (hp.head_dim_k as f32).sqrt();
        let last = self.layers.len() - 1;
        for (il, l) in self.layers.iter().enumerate() {
            let rope = if l.sliding { &self.rope_swa } else { &hp.rope };
            let h = s.rms_norm(x, &l.attn_norm, hp.rms_eps);
            let q = g.reshape(s.matmul(&l.attn.wq, h), &[hp.head_dim_k, hp.n_head, n]);
            let k = g.reshape(s.matmul(&l.attn.wk, h), &[hp.head_dim_k, hp.n_head_kv, n]);
            let v = g.reshape(s.matmul(&l.attn.wv, h), &[hp.head_dim_v, hp.n_head_kv, n]);
            let q = g.rope(s.rms_norm(q, &l.attn.q_norm, hp.rms_eps), s.pos, None, rope);
            let k = g.rope(s.rms_norm(k, &l.attn.k_norm, hp.rms_eps), s.pos, None, rope);
            // The query is pre-scaled, so attention itself runs with scale 1.
            let q = g.scale(q, q_scale);
            let spec = AttnSpec {
                n_head: hp.n_head,
                n_head_kv: hp.n_head_kv,
                head_dim_k: hp.head_dim_k,
                head_dim_v: hp.head_dim_v,
                scale: 1.0,
                softcap: 0.0,
                sliding: l.sliding,
            };
            let att = s.attention(il, q, k, v, &spec, None);
            let mut a = s.matmul(&l.attn.wo, att);
            if il == last {
                a = g.get_rows(a, s.out_ids);
                x = g.get_rows(x, s.out_ids);
            }
            let sa = g.add(s.rms_norm(a, &l.attn_post_norm, hp.rms_eps), x);
            let h = s.rms_norm(sa, &l.ffn_norm, hp.rms_eps);
            let f = s.ffn(
                h,
                FfnWeights {
                    gate: &l.ffn_gate,
                    up: &l.ffn_up,
                    down: &l.ffn_down,
                },
                GluOp::GeGlu,
            );
            x = g
                .add(s.rms_norm(f, &l.ffn_post_norm, hp.rms_eps), sa)
                .named(&format!("l_out-{il}"));
        }
        let x = s.rms_norm(x, &self.head.output_norm, hp.rms_eps);
        s.output(&self.head.output, x, self.final_softcap)
    }
}
