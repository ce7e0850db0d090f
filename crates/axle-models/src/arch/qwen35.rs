//! Qwen3.5 / Qwen3.6 (`qwen35` and `qwen35moe` GGUF architectures) and Qwen3-Next (`qwen3next`):
//! hybrid linear attention.
//!
//! Most layers (three of every four by default; `full_attention_interval`, or the per-layer
//! `attention.recurrent_layers`) are gated delta net layers: one projection gives the queries,
//! keys and values, which pass a short causal convolution (`ssm.conv_kernel` taps, carried across
//! steps in a window state) and then the gated delta rule, a recurrent state of
//! `head_v x head_v` per value head updated token by token; the output is RMS-normed, gated by
//! SiLU of a second projection and projected back. The other layers are full attention with a
//! per-head sigmoid output gate (queries and gates from one projection), QK norm and
//! interleaved multi-section RoPE. The MoE variant replaces the FFN with routed experts and a
//! gated shared expert. Qwen3-Next is the MoE variant with plain (NeoX) RoPE, one fused projection
//! for the delta rule's beta and decay inputs (`ssm_ba`, grouped per key head), and key heads
//! repeated to the value heads head by head.
//!
//! The recurrent state lives in the runner's state pools (see [`crate::recurrent`]); each
//! sequence of a step runs its recurrent ops alone, so a token's arithmetic does not depend on
//! the other sequences of the step. The op sequence is libllama's (with its fused delta-rule op),
//! so that logits match it. An MTP block after the trunk (`nextn_predict_layers`) is the model's
//! MTP head ([`super::nextn`]): a gated full-attention layer with the trunk's FFN kind.
use super::nextn::{self, Nextn};
use super::{arch_key, bad, Family, Head, Hparams, NormedAttention, Weights};
use crate::layers::{AttnSpec, Step};
use crate::moe::{FeedForward, Gating, MoeConfig, MoeLayer};
use crate::ModelError;
use axle_ggml::{GgufFile, StoredTensor, Tensor, TensorStore, MROPE_SECTIONS, ROPE_TYPE_IMROPE};

/// Shape of the gated delta net layers.
#[derive(Debug, Clone, Copy)]
struct DeltaShape {
    d_conv: i64,
    /// Key heads and their size.
    n_k_heads: i64,
    head_k: i64,
    /// Value heads and their size (the state is head_v x head_v per value head).
    n_v_heads: i64,
    head_v: i64,
}

impl DeltaShape {
    fn key_dim(&self) -> i64 {
        self.head_k * self.n_k_heads
    }
    fn value_dim(&self) -> i64 {
        self.head_v * self.n_v_heads
    }
    fn conv_dim(&self) -> i64 {
        2 * self.key_dim() + self.value_dim()
    }
}

/// How the beta and decay inputs are projected.
#[derive(Debug)]
enum BetaAlpha {
    /// Two projections [n_embd, n_v_heads] (Qwen3.5).
    Split {
        beta: StoredTensor,
        alpha: StoredTensor,
    },
    /// One [n_embd, 2 * n_v_heads], per key head its value heads' betas then their decay inputs
    /// (Qwen3-Next).
    Fused(StoredTensor),
}

/// What distinguishes the variants of the family.
#[derive(Debug, Clone, Copy)]
struct Variant {
    /// Interleaved multi-section RoPE (Qwen3.5) or NeoX RoPE (Qwen3-Next).
    mrope: bool,
    /// Key heads repeated to the value heads before the delta rule, each key head for a run of
    /// consecutive value heads (Qwen3-Next); otherwise the op broadcasts them cyclically.
    repeat_keys: bool,
}

/// A gated delta net layer's weights.
#[derive(Debug)]
struct DeltaLayer {
    /// [n_embd, conv_dim]: queries, keys, values.
    wqkv: StoredTensor,
    /// [n_embd, value_dim]: the output gate's input.
    wgate: StoredTensor,
    /// [d_conv, conv_dim]
    conv: StoredTensor,
    /// [n_v_heads] each: decay bias and scale.
    dt_bias: StoredTensor,
    a: StoredTensor,
    beta_alpha: BetaAlpha,
    /// [head_v]
    norm: StoredTensor,
    /// [value_dim, n_embd]
    out: StoredTensor,
    /// Index of the layer's state pools.
    state: usize,
}

/// A gated full-attention layer's weights.
#[derive(Debug)]
struct AttnLayer {
    /// Queries: [n_embd, 2 * head * n_head], per head the query then its output gate.
    attn: NormedAttention,
    /// Cache layer.
    cache: usize,
}

#[derive(Debug)]
enum Mixer {
    Delta(DeltaLayer),
    Attn(AttnLayer),
}

#[derive(Debug)]
struct Layer {
    attn_norm: StoredTensor,
    post_norm: StoredTensor,
    mixer: Mixer,
    ffn: FeedForward,
}

/// The model.
#[derive(Debug)]
pub struct Qwen35 {
    hp: Hparams,
    variant: Variant,
    delta: DeltaShape,
    sections: [i32; MROPE_SECTIONS],
    head: Head,
    layers: Vec<Layer>,
    /// An MTP head's own input and output weights (set on the head, not the trunk).
    nextn: Option<Nextn>,
    /// The model's MTP head: the first block after the trunk (a gated full-attention layer),
    /// with its input and output.
    mtp: Option<Box<Qwen35>>,
    /// The model layer of the first of `layers`.
    first_layer: usize,
}

const QWEN35: Variant = Variant {
    mrope: true,
    repeat_keys: false,
};

/// Loads `qwen35` (dense FFN).
pub fn load(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    load_arch(f, store, "qwen35", false, QWEN35)
}

/// Loads `qwen35moe` (routed experts and a gated shared expert).
pub fn load_moe(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    load_arch(f, store, "qwen35moe", true, QWEN35)
}

/// Loads `qwen3next` (routed experts, NeoX RoPE, fused beta/decay projection).
pub fn load_next(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    let variant = Variant {
        mrope: false,
        repeat_keys: true,
    };
    load_arch(f, store, "qwen3next", true, variant)
}

fn load_arch(
    f: &GgufFile,
    store: &TensorStore,
    arch: &str,
    moe: bool,
    variant: Variant,
) -> Result<Box<dyn Family>, ModelError> {
    let key = |k: &str| arch_key(arch, k);
    let rope_mode = if variant.mrope { ROPE_TYPE_IMROPE } else { 2 };
    let mut hp = Hparams::from_gguf(f, arch, rope_mode)?;
    // Next-token-prediction blocks follow the trunk in the file.
    let n_mtp = nextn::split_off(f, &mut hp)?;
    let nl = hp.n_layer;
    let sections = if !variant.mrope {
        [0; MROPE_SECTIONS]
    } else {
        let k = key("rope.dimension_sections");
        let arr = f.array_opt(&k)?.ok_or_else(|| bad(&k, "is missing"))?;
        let mut out = [0i32; MROPE_SECTIONS];
        for (i, v) in arr.iter().take(MROPE_SECTIONS).enumerate() {
            out[i] = v
                .as_i64()
                .filter(|x| (0..=4096).contains(x))
                .ok_or_else(|| bad(&k, "holds a value that is not a section size"))?
                as i32;
        }
        let sum: i32 = out.iter().sum();
        if sum <= 0 || sum > hp.rope.n_dims / 2 {
            return Err(bad(
                &k,
                &format!(
                    "= {out:?} must share out at most the {} rotary pairs, and some of them",
                    hp.rope.n_dims / 2
                ),
            ));
        }
        out
    };
    let int = |k: &str, max: i64| -> Result<i64, ModelError> {
        let v = f.int(&key(k))?;
        if (1..=max).contains(&v) {
            Ok(v)
        } else {
            Err(bad(&key(k), &format!("= {v} is outside 1..={max}")))
        }
    };
    let d_conv = int("ssm.conv_kernel", 64)?;
    let d_inner = int("ssm.inner_size", 1 << 16)?;
    let head_k = int("ssm.state_size", 4096)?;
    let n_v_heads = int("ssm.time_step_rank", 4096)?;
    let n_k_heads = int("ssm.group_count", 4096)?;
    if d_inner % n_v_heads != 0 || n_v_heads % n_k_heads != 0 || d_inner / n_v_heads != head_k {
        return Err(bad(
            &key("ssm.inner_size"),
            &format!(
                "= {d_inner} with {n_v_heads} value heads, {n_k_heads} key heads of {head_k}: \
                 value heads must be as wide as key heads and a multiple of them in number"
            ),
        ));
    }
    let delta = DeltaShape {
        d_conv,
        n_k_heads,
        head_k,
        n_v_heads,
        head_v: d_inner / n_v_heads,
    };
    let recurrent: Vec<bool> = match f
        .array_opt(&key("attention.recurrent_layers"))
        .ok()
        .flatten()
    {
        Some(arr) if arr.len() == nl || arr.len() == nl + n_mtp => arr
            .iter()
            .take(nl)
            .map(|v| matches!(v, axle_ggml::MetaValue::Bool(true)) || v.as_i64().unwrap_or(0) != 0)
            .collect(),
        Some(arr) => {
            return Err(bad(
                &key("attention.recurrent_layers"),
                &format!("has {} values for {nl} layers", arr.len()),
            ))
        }
        None => {
            let every = f
                .int_opt(&key("full_attention_interval"))?
                .unwrap_or(4)
                .max(1) as usize;
            (0..nl).map(|il| (il + 1) % every != 0).collect()
        }
    };
    let moe_cfg = if moe {
        Some(MoeConfig::from_gguf(
            f,
            arch,
            hp.n_ff,
            Gating::Softmax,
            true,
        )?)
    } else {
        None
    };
    let w = Weights::new(store);
    let (e, v) = (hp.n_embd, hp.n_vocab);
    let (hd, nh) = (hp.head_dim_k, hp.n_head);
    let head = Head::bind(&w, e, v)?;
    let (mut n_cache, mut n_state) = (0, 0);
    let ffn = |il: usize| -> Result<FeedForward, ModelError> {
        Ok(match &moe_cfg {
            Some(cfg) => {
                let shared = cfg.n_ff_shared.unwrap_or(hp.n_ff);
                FeedForward::Moe(
                    Box::new(MoeLayer::bind(&w, il, e, cfg, Some(shared))?),
                    *cfg,
                )
            }
            None => FeedForward::dense(&w, il, e, hp.n_ff)?,
        })
    };
    let attn_layer = |il: usize, cache: usize| -> Result<Mixer, ModelError> {
        Ok(Mixer::Attn(AttnLayer {
            attn: NormedAttention::bind(&w, il, &hp, 2 * hd * nh)?,
            cache,
        }))
    };
    let norms = |il: usize| -> Result<(StoredTensor, StoredTensor), ModelError> {
        Ok((
            w.req(&format!("blk.{il}.attn_norm.weight"), &[e])?,
            w.req(&format!("blk.{il}.post_attention_norm.weight"), &[e])?,
        ))
    };
    let mut layers = Vec::with_capacity(nl);
    for (il, &recr) in recurrent.iter().enumerate() {
        let n = |s: &str| format!("blk.{il}.{s}");
        let mixer = if recr {
            let d = &delta;
            if store.get(&n("ssm_in.weight")).is_some() {
                return Err(ModelError::Unsupported(format!(
                    "{arch} with the legacy fused {} (an old conversion): reconvert the model",
                    n("ssm_in.weight")
                )));
            }
            let beta_alpha = match w.opt(&n("ssm_ba.weight"), &[e, 2 * d.n_v_heads])? {
                Some(t) => BetaAlpha::Fused(t),
                None => BetaAlpha::Split {
                    beta: w.req(&n("ssm_beta.weight"), &[e, d.n_v_heads])?,
                    alpha: w.req(&n("ssm_alpha.weight"), &[e, d.n_v_heads])?,
                },
            };
            let l = DeltaLayer {
                wqkv: w.req(&n("attn_qkv.weight"), &[e, d.conv_dim()])?,
                wgate: w.req(&n("attn_gate.weight"), &[e, d.value_dim()])?,
                conv: w.req_f32(&n("ssm_conv1d.weight"), &[d.d_conv, d.conv_dim()])?,
                dt_bias: w.req(&n("ssm_dt.bias"), &[d.n_v_heads])?,
                a: w.req(&n("ssm_a"), &[d.n_v_heads])?,
                beta_alpha,
                norm: w.req(&n("ssm_norm.weight"), &[d.head_v])?,
                out: w.req(&n("ssm_out.weight"), &[d.value_dim(), e])?,
                state: n_state,
            };
            n_state += 1;
            Mixer::Delta(l)
        } else {
            n_cache += 1;
            attn_layer(il, n_cache - 1)?
        };
        let (attn_norm, post_norm) = norms(il)?;
        layers.push(Layer {
            attn_norm,
            post_norm,
            mixer,
            ffn: ffn(il)?,
        });
    }
    // The first MTP block, where the file carries one after the trunk.
    let mtp = match nextn::is_block(f, nl) {
        false => None,
        true => {
            let (attn_norm, post_norm) = norms(nl)?;
            Some(Box::new(Qwen35 {
                head: Head::bind(&w, e, v)?,
                layers: vec![Layer {
                    attn_norm,
                    post_norm,
                    mixer: attn_layer(nl, 0)?,
                    ffn: ffn(nl)?,
                }],
                delta,
                sections,
                variant,
                nextn: Some(Nextn::bind(&w, nl, e, v)?),
                mtp: None,
                first_layer: nl,
                hp: Hparams {
                    n_layer: 1,
                    ..hp.clone()
                },
            }))
        }
    };
    Ok(Box::new(Qwen35 {
        head,
        layers,
        delta,
        sections,
        variant,
        nextn: None,
        mtp,
        first_layer: 0,
        hp,
    }))
}

impl Qwen35 {
    /// The gated delta net mixer of `h` [n_embd, n].
    fn delta_net<'a>(&'a self, s: &mut Step<'a>, l: &'a DeltaLayer, h: Tensor<'a>) -> Tensor<'a> {
        let g = s.ctx;
        let d = self.delta;
        let n = s.n_tokens;
        let eps = self.hp.rms_eps;
        let qkv = s.matmul(&l.wqkv, h);
        let z = s.matmul(&l.wgate, h);
        let (beta, alpha) = match &l.beta_alpha {
            BetaAlpha::Split { beta, alpha } => (g.sigmoid(s.matmul(beta, h)), s.matmul(alpha, h)),
            BetaAlpha::Fused(ba) => {
                // Per key head: its value heads' betas, then their decay inputs.
                let per = d.n_v_heads / d.n_k_heads;
                let mixed = g.reshape(s.matmul(ba, h), &[2 * per, d.n_k_heads, n]);
                let nb = mixed.nb();
                let part = |off: usize| g.view(mixed, &[per, d.n_k_heads, n], &[nb[1], nb[2]], off);
                let beta = g.sigmoid(g.cont(part(0)));
                let alpha = g.cont(part(mixed.dtype().row_size(per)));
                (
                    g.reshape(beta, &[d.n_v_heads, n]),
                    g.reshape(alpha, &[d.n_v_heads, n]),
                )
            }
        };
        let alpha = g.add(alpha, l.dt_bias.t());
        let decay = g.mul(g.softplus(alpha), l.a.t());
        let l2 = |x: Tensor<'a>| {
            let width = x.ne()[0] as f32;
            g.scale(g.rms_norm(x, eps / width), 1.0 / width.sqrt())
        };
        let conv_row = (d.d_conv - 1) * d.conv_dim();
        let state_row = d.head_v * d.head_v * d.n_v_heads;
        let cache = match &s.state {
            Some(st) => st.cache,
            None => panic!("a recurrent layer in a step without recurrent state"),
        };
        let (conv_pool, ssm_pool) = (&cache.conv[l.state], &cache.ssm[l.state]);
        let mut outs = Vec::new();
        for (i, seq) in s.state_seqs().into_iter().enumerate() {
            let rows = |t: Tensor<'a>| {
                let nb1 = t.nb()[1];
                g.view(t, &[t.ne()[0], seq.n], &[nb1], seq.first as usize * nb1)
            };
            // The window: the previous d_conv - 1 inputs, then this step's, time first.
            let window = g.reshape(s.state_read(conv_pool, i), &[d.d_conv - 1, d.conv_dim(), 1]);
            let x = g.transpose(rows(qkv));
            let conv_in = g.concat(window, x, 0);
            // The windows after each kept token, most recent first.
            let nb = conv_in.nb();
            let kept: Vec<Tensor<'a>> = (0..seq.keep)
                .map(|k| {
                    let at = (seq.n - k) as usize * nb[0];
                    let w = g.view(conv_in, &[d.d_conv - 1, d.conv_dim()], &[nb[1]], at);
                    g.reshape(g.cont(w), &[conv_row, 1])
                })
                .collect();
            s.state_write(conv_pool, i, crate::layers::concat_all(g, kept, 1));
            let conv = g.silu(g.ssm_conv(conv_in, l.conv.t()));
            let cb = conv.nb();
            let part = |heads: i64, size: i64, off: i64| {
                g.view(
                    conv,
                    &[size, heads, seq.n, 1],
                    &[conv.dtype().row_size(size), cb[1], cb[1] * seq.n as usize],
                    conv.dtype().row_size(off),
                )
            };
            let q = l2(part(d.n_k_heads, d.head_k, 0));
            let k = l2(part(d.n_k_heads, d.head_k, d.key_dim()));
            // Qwen3-Next: each key head serves a run of consecutive value heads.
            let (q, k) = if self.variant.repeat_keys && d.n_k_heads != d.n_v_heads {
                let rep = |t: Tensor<'a>| {
                    let t = g.reshape(t, &[d.head_k, 1, d.n_k_heads, seq.n]);
                    let per = d.n_v_heads / d.n_k_heads;
                    let t = g.repeat_4d(t, [d.head_k, per, d.n_k_heads, seq.n]);
                    g.reshape(t, &[d.head_k, d.n_v_heads, seq.n, 1])
                };
                (rep(q), rep(k))
            } else {
                (q, k)
            };
            let v = part(d.n_v_heads, d.head_v, 2 * d.key_dim());
            let per_head = |t: Tensor<'a>| g.reshape(g.cont(rows(t)), &[1, d.n_v_heads, seq.n, 1]);
            let state = g.reshape(
                s.state_read(ssm_pool, i),
                &[d.head_v, d.head_v, d.n_v_heads, 1],
            );
            let out = g.gated_delta_net(q, k, v, per_head(decay), per_head(beta), state, seq.keep);
            let attn_elems = d.head_v * d.n_v_heads * seq.n;
            let o = g.view(
                out,
                &[d.value_dim(), seq.n],
                &[out.dtype().row_size(d.value_dim())],
                0,
            );
            let states = g.view(
                out,
                &[state_row, seq.keep],
                &[out.dtype().row_size(state_row)],
                out.dtype().row_size(attn_elems),
            );
            s.state_write(ssm_pool, i, states);
            outs.push(o);
        }
        let o = crate::layers::concat_all(g, outs, 1);
        let o = g.reshape(g.cont(o), &[d.head_v, d.n_v_heads, n]);
        let z = g.reshape(z, &[d.head_v, d.n_v_heads, n]);
        let gated = g.mul(s.rms_norm(o, &l.norm, eps), g.silu(z));
        s.matmul(&l.out, g.reshape(gated, &[d.value_dim(), n]))
    }

    /// The gated full-attention mixer of `h` [n_embd, n].
    fn attention<'a>(&'a self, s: &mut Step<'a>, l: &'a AttnLayer, h: Tensor<'a>) -> Tensor<'a> {
        let g = s.ctx;
        let hp = &self.hp;
        let (hd, nh, n) = (hp.head_dim_k, hp.n_head, s.n_tokens);
        let qg = s.matmul(&l.attn.wq, h);
        let es = qg.dtype().row_size(1);
        let half = |off: usize| {
            g.view(
                qg,
                &[hd, nh, n],
                &[es * 2 * hd as usize, es * 2 * (hd * nh) as usize],
                off,
            )
        };
        let q = s.rms_norm(half(0), &l.attn.q_norm, hp.rms_eps);
        let gate = g.reshape(g.cont(half(es * hd as usize)), &[hd * nh, n]);
        let k = g.reshape(s.matmul(&l.attn.wk, h), &[hd, hp.n_head_kv, n]);
        let k = s.rms_norm(k, &l.attn.k_norm, hp.rms_eps);
        let v = g.reshape(s.matmul(&l.attn.wv, h), &[hp.head_dim_v, hp.n_head_kv, n]);
        let (q, k) = if self.variant.mrope {
            (
                g.rope_multi(q, s.pos, self.sections, &hp.rope),
                g.rope_multi(k, s.pos, self.sections, &hp.rope),
            )
        } else {
            (
                g.rope(q, s.pos, None, &hp.rope),
                g.rope(k, s.pos, None, &hp.rope),
            )
        };
        let spec = AttnSpec {
            n_head: nh,
            n_head_kv: hp.n_head_kv,
            head_dim_k: hd,
            head_dim_v: hp.head_dim_v,
            scale: 1.0 / (hd as f32).sqrt(),
            softcap: 0.0,
            sliding: false,
        };
        let att = s.attention(l.cache, q, k, v, &spec, None);
        s.matmul(&l.attn.wo, g.mul(att, g.sigmoid(gate)))
    }
}

impl Family for Qwen35 {
    fn hparams(&self) -> &Hparams {
        &self.hp
    }

    fn kv_dims(&self) -> Vec<(i64, i64)> {
        let hp = &self.hp;
        let n = self
            .layers
            .iter()
            .filter(|l| matches!(l.mixer, Mixer::Attn(_)))
            .count();
        vec![(hp.head_dim_k * hp.n_head_kv, hp.head_dim_v * hp.n_head_kv); n]
    }

    fn state_dims(&self) -> Vec<(usize, i64, i64)> {
        let d = self.delta;
        self.layers
            .iter()
            .enumerate()
            .filter(|(_, l)| matches!(l.mixer, Mixer::Delta(_)))
            .map(|(il, _)| {
                (
                    il,
                    (d.d_conv - 1) * d.conv_dim(),
                    d.head_v * d.head_v * d.n_v_heads,
                )
            })
            .collect()
    }

    fn positions_per_token(&self) -> usize {
        if self.variant.mrope {
            MROPE_SECTIONS
        } else {
            1
        }
    }

    fn forward<'a>(&'a self, s: &mut Step<'a>) -> Tensor<'a> {
        let g = s.ctx;
        let eps = self.hp.rms_eps;
        let mut x = nextn::input(self.nextn.as_ref(), s, &self.head, eps);
        for (il, l) in self.layers.iter().enumerate() {
            let h = s.rms_norm(x, &l.attn_norm, eps);
            let mixed = match &l.mixer {
                Mixer::Delta(d) => self.delta_net(s, d, h),
                Mixer::Attn(a) => self.attention(s, a, h),
            };
            let res = g.add(mixed, x);
            let h = s.rms_norm(res, &l.post_norm, eps);
            let f = s.feed_forward(h, &l.ffn);
            x = g.add(f, res).named(&format!("l_out-{il}"));
        }
        // libllama runs the last layer on every row and picks the output rows after the norm.
        nextn::output(self.nextn.as_ref(), s, &self.head, x, eps, false)
    }

    fn mtp(&self) -> Option<&dyn Family> {
        self.mtp.as_deref().map(|m| m as &dyn Family)
    }

    fn first_layer(&self) -> usize {
        self.first_layer
    }
}
