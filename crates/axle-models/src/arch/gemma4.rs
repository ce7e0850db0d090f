//! Gemma 4 (`gemma4` GGUF architecture): every variant from one file, configured by the GGUF
//! metadata.
//!
//! - Interleaved sliding-window and global layers (`attention.sliding_window_pattern`, one bool
//!   per layer), each kind with its own head size (`attention.key_length_swa` /
//!   `attention.key_length`), rotary dimensions and base (`rope.*_swa`); global layers rotate
//!   with the file's `rope_freqs` factors (proportional RoPE).
//! - Per-head RMSNorm of Q and K, an unweighted RMSNorm of V, attention scale 1.
//! - Global layers without `attn_v`: V is K's projection (K = V layers).
//! - KV sharing (`attention.shared_kv_layers` = s): the last s layers store no keys and values;
//!   each attends over the cache of the last earlier layer of its kind.
//! - Per-head counts and FFN widths may differ per layer (arrays).
//! - Per-layer embeddings (E2B/E4B, `embedding_length_per_layer_input` > 0): a second embedding
//!   table gives every token a small vector per layer, mixed with a projection of the input
//!   embedding; each layer gates it with its output and adds it back.
//! - Mixture of experts (26B-A4B, layers with `ffn_gate_inp`): a dense GELU FFN beside top-k
//!   GELU experts routed from the RMS-normed residual scaled by `ffn_gate_inp.scale`, each branch
//!   with its own norms.
//! - An optional per-layer output scale and final logit softcapping; tied or separate head.
//!
//! The op sequence is libllama's, so that logits match it bit for bit.
use super::{
    bad, non_negative_float, per_layer, positive_float, sliding_layers, Family, Head, Hparams,
    Weights,
};
use crate::layers::{AttnSpec, FfnWeights, Step};
use crate::moe::{Gating, MoeConfig, MoeLayer};
use crate::ModelError;
use axle_ggml::{GgufFile, GluOp, RopeParams, StoredTensor, Tensor, TensorStore};

const ARCH: &str = "gemma4";

/// Attention shape of one layer.
#[derive(Debug, Clone, Copy)]
struct LayerShape {
    n_head: i64,
    n_head_kv: i64,
    head_dim: i64,
    n_ff: i64,
    sliding: bool,
    /// Cache layer this layer writes (its own index) or reads (an earlier layer's).
    cache: usize,
    /// Whether the layer writes its own keys and values.
    has_kv: bool,
}

/// The MoE branch of a layer.
#[derive(Debug)]
struct MoeBranch {
    experts: MoeLayer,
    /// [n_embd]: scale of the router's input.
    router_scale: StoredTensor,
    /// [n_embd] each: the expert branch's input norm and the two branches' output norms.
    pre_norm_2: StoredTensor,
    post_norm_1: StoredTensor,
    post_norm_2: StoredTensor,
}

/// A layer's per-layer-embedding weights.
#[derive(Debug)]
struct LayerPle {
    /// [n_embd, n_pl]
    inp_gate: StoredTensor,
    /// [n_pl, n_embd]
    proj: StoredTensor,
    /// [n_embd]
    post_norm: StoredTensor,
}

/// One decoder layer.
#[derive(Debug)]
struct Layer {
    shape: LayerShape,
    attn_norm: StoredTensor,
    attn_post_norm: StoredTensor,
    wq: StoredTensor,
    /// Absent on KV-shared layers.
    wk: Option<StoredTensor>,
    /// Absent on K = V layers (and KV-shared ones).
    wv: Option<StoredTensor>,
    wo: StoredTensor,
    q_norm: StoredTensor,
    k_norm: Option<StoredTensor>,
    ffn_norm: StoredTensor,
    ffn_post_norm: StoredTensor,
    ffn_gate: StoredTensor,
    ffn_up: StoredTensor,
    ffn_down: StoredTensor,
    moe: Option<MoeBranch>,
    ple: Option<LayerPle>,
    /// [1]
    out_scale: Option<StoredTensor>,
}

/// The model-level per-layer-embedding weights.
#[derive(Debug)]
struct Ple {
    /// Width per layer.
    n_pl: i64,
    /// [n_pl * n_layer, n_vocab]
    tok_embd: StoredTensor,
    /// [n_embd, n_pl * n_layer]
    model_proj: StoredTensor,
    /// [n_pl]
    proj_norm: StoredTensor,
}

/// The Gemma 4 model.
#[derive(Debug)]
pub struct Gemma4 {
    hp: Hparams,
    /// RoPE of the global layers (with the file's frequency factors) and of the local ones.
    rope_full: RopeParams,
    rope_swa: RopeParams,
    final_softcap: f32,
    moe: Option<MoeConfig>,
    head: Head,
    /// [head_dim_full / 2]
    rope_freqs: Option<StoredTensor>,
    ple: Option<Ple>,
    layers: Vec<Layer>,
}

/// Reads the config and binds the weights.
pub fn load(f: &GgufFile, store: &TensorStore) -> Result<Box<dyn Family>, ModelError> {
    let mut hp = Hparams::from_gguf(f, ARCH, 2)?;
    let nl = hp.n_layer;
    let sliding = sliding_layers(f, ARCH, nl, 6)?;
    let n_head = per_layer(f, &hp.key("attention.head_count"), nl)?.unwrap_or(vec![hp.n_head; nl]);
    let n_head_kv = per_layer(f, &hp.key("attention.head_count_kv"), nl)?.unwrap_or(n_head.clone());
    let n_ff = per_layer(f, &hp.key("feed_forward_length"), nl)?.unwrap_or(vec![hp.n_ff; nl]);
    let head_full = hp.head_dim_k;
    if hp.head_dim_v != head_full {
        return Err(bad(
            &hp.key("attention.value_length"),
            "must equal the key length (Gemma 4 shares one head size for K and V)",
        ));
    }
    let head_swa = f
        .int_opt(&hp.key("attention.key_length_swa"))?
        .unwrap_or(head_full);
    let head_swa_v = f
        .int_opt(&hp.key("attention.value_length_swa"))?
        .unwrap_or(head_swa);
    if !(1..=4096).contains(&head_swa) {
        return Err(bad(
            &hp.key("attention.key_length_swa"),
            &format!("= {head_swa} must be in 1..=4096"),
        ));
    }
    if head_swa_v != head_swa {
        return Err(bad(
            &hp.key("attention.value_length_swa"),
            &format!(
                "= {head_swa_v} must equal the key length {head_swa} (one head size for K and V)"
            ),
        ));
    }
    let n_rot_swa = f
        .int_opt(&hp.key("rope.dimension_count_swa"))?
        .unwrap_or(hp.rope.n_dims as i64);
    if n_rot_swa <= 0 || n_rot_swa % 2 != 0 || n_rot_swa > head_swa {
        return Err(bad(
            &hp.key("rope.dimension_count_swa"),
            &format!("= {n_rot_swa} must be even and in 2..={head_swa}"),
        ));
    }
    let shared_kv = f
        .int_opt(&hp.key("attention.shared_kv_layers"))?
        .unwrap_or(0);
    let kv_from = nl as i64 - shared_kv;
    if shared_kv < 0 || (shared_kv > 0 && kv_from < 2) {
        return Err(bad(
            &hp.key("attention.shared_kv_layers"),
            &format!("= {shared_kv} must leave at least 2 of the {nl} layers with their own KV"),
        ));
    }
    let kv_from = kv_from as usize;
    let window = f
        .int_opt(&hp.key("attention.sliding_window"))?
        .filter(|&w| w > 0)
        .ok_or_else(|| {
            bad(
                &hp.key("attention.sliding_window"),
                "must be set and positive",
            )
        })? as u32;
    hp.sliding_window = Some(window);
    let mut shapes = Vec::with_capacity(nl);
    for il in 0..nl {
        let (h, hkv) = (n_head[il], n_head_kv[il]);
        if h <= 0 || hkv <= 0 || h % hkv != 0 {
            return Err(bad(
                &hp.key("attention.head_count_kv"),
                &format!("layer {il}: {hkv} KV heads for {h} query heads"),
            ));
        }
        if !(1..=1 << 20).contains(&n_ff[il]) {
            return Err(bad(
                &hp.key("feed_forward_length"),
                &format!("layer {il}: {} is outside 1..={}", n_ff[il], 1 << 20),
            ));
        }
        let has_kv = il < kv_from;
        // libllama's reuse rule: a shared layer reads the last global layer with KV, or the
        // one before it for a local layer.
        let cache = if has_kv {
            il
        } else {
            kv_from - if sliding[il] { 2 } else { 1 }
        };
        shapes.push(LayerShape {
            n_head: h,
            n_head_kv: hkv,
            head_dim: if sliding[il] { head_swa } else { head_full },
            n_ff: n_ff[il],
            sliding: sliding[il],
            cache,
            has_kv,
        });
    }
    // A shared layer must read a cache of its own kind and shape.
    for (il, sh) in shapes.iter().enumerate().filter(|(_, s)| !s.has_kv) {
        let src = shapes[sh.cache];
        if src.sliding != sh.sliding || src.n_head_kv != sh.n_head_kv {
            return Err(bad(
                &hp.key("attention.shared_kv_layers"),
                &format!(
                    "= {shared_kv}: layer {il} would reuse layer {}'s KV, of another kind",
                    sh.cache
                ),
            ));
        }
    }
    let rope_full = hp.rope;
    let rope_swa = RopeParams {
        n_dims: n_rot_swa as i32,
        freq_base: positive_float(f, &hp.key("rope.freq_base_swa"), 10000.0)?,
        freq_scale: 1.0,
        ..hp.rope
    };
    let final_softcap = non_negative_float(f, &hp.key("final_logit_softcapping"))?;
    let n_pl = f
        .int_opt(&hp.key("embedding_length_per_layer_input"))?
        .unwrap_or(0);
    if !(0..=1 << 16).contains(&n_pl) {
        return Err(bad(
            &hp.key("embedding_length_per_layer_input"),
            &format!("= {n_pl} is outside 0..={}", 1 << 16),
        ));
    }

    let w = Weights::new(store);
    let (e, v) = (hp.n_embd, hp.n_vocab);
    let head = Head::bind(&w, e, v)?;
    let ple = if n_pl > 0 {
        let all = n_pl * nl as i64;
        Some(Ple {
            n_pl,
            tok_embd: w.req("per_layer_token_embd.weight", &[all, v])?,
            model_proj: w.req("per_layer_model_proj.weight", &[e, all])?,
            proj_norm: w.req("per_layer_proj_norm.weight", &[n_pl])?,
        })
    } else {
        None
    };
    let has_router = (0..nl).any(|il| {
        store
            .get(&format!("blk.{il}.ffn_gate_inp.weight"))
            .is_some()
    });
    let moe = if has_router {
        let mut cfg = MoeConfig::from_gguf(f, ARCH, hp.n_ff, Gating::Softmax, true)?;
        cfg.act = GluOp::GeGlu;
        cfg.norm_weights = true;
        cfg.weights_scale = 1.0;
        Some(cfg)
    } else {
        None
    };
    let mut layers = Vec::with_capacity(nl);
    for (il, &shape) in shapes.iter().enumerate() {
        let n = |s: &str| format!("blk.{il}.{s}");
        if store.get(&n("attn_qkv.weight")).is_some() {
            return Err(ModelError::Unsupported(format!(
                "gemma4 with a fused {} is not implemented",
                n("attn_qkv.weight")
            )));
        }
        let (hd, q_dim, kv_dim) = (
            shape.head_dim,
            shape.head_dim * shape.n_head,
            shape.head_dim * shape.n_head_kv,
        );
        let ff = shape.n_ff;
        let moe_branch = match (&moe, store.get(&n("ffn_gate_inp.weight")).is_some()) {
            (Some(cfg), true) => Some(MoeBranch {
                experts: MoeLayer::bind(&w, il, e, cfg, None)?,
                router_scale: w.req(&n("ffn_gate_inp.scale"), &[e])?,
                pre_norm_2: w.req(&n("pre_ffw_norm_2.weight"), &[e])?,
                post_norm_1: w.req(&n("post_ffw_norm_1.weight"), &[e])?,
                post_norm_2: w.req(&n("post_ffw_norm_2.weight"), &[e])?,
            }),
            (Some(_), false)
                if store.get(&n("ffn_gate_exps.weight")).is_some()
                    || store.get(&n("ffn_gate_up_exps.weight")).is_some() =>
            {
                return Err(ModelError::Ggml(axle_ggml::Error::MissingTensor(n(
                    "ffn_gate_inp.weight",
                ))))
            }
            _ => None,
        };
        layers.push(Layer {
            shape,
            attn_norm: w.req(&n("attn_norm.weight"), &[e])?,
            attn_post_norm: w.req(&n("post_attention_norm.weight"), &[e])?,
            wq: w.req(&n("attn_q.weight"), &[e, q_dim])?,
            wk: if shape.has_kv {
                Some(w.req(&n("attn_k.weight"), &[e, kv_dim])?)
            } else {
                w.opt(&n("attn_k.weight"), &[e, kv_dim])?
            },
            wv: w.opt(&n("attn_v.weight"), &[e, kv_dim])?,
            wo: w.req(&n("attn_output.weight"), &[q_dim, e])?,
            q_norm: w.req(&n("attn_q_norm.weight"), &[hd])?,
            k_norm: if shape.has_kv {
                Some(w.req(&n("attn_k_norm.weight"), &[hd])?)
            } else {
                w.opt(&n("attn_k_norm.weight"), &[hd])?
            },
            ffn_norm: w.req(&n("ffn_norm.weight"), &[e])?,
            ffn_post_norm: w.req(&n("post_ffw_norm.weight"), &[e])?,
            ffn_gate: w.req(&n("ffn_gate.weight"), &[e, ff])?,
            ffn_up: w.req(&n("ffn_up.weight"), &[e, ff])?,
            ffn_down: w.req(&n("ffn_down.weight"), &[ff, e])?,
            moe: moe_branch,
            ple: match &ple {
                Some(p) => Some(LayerPle {
                    inp_gate: w.req(&n("inp_gate.weight"), &[e, p.n_pl])?,
                    proj: w.req(&n("proj.weight"), &[p.n_pl, e])?,
                    post_norm: w.req(&n("post_norm.weight"), &[e])?,
                }),
                None => None,
            },
            out_scale: w.opt(&n("layer_output_scale.weight"), &[1])?,
        });
    }
    Ok(Box::new(Gemma4 {
        rope_freqs: w.opt("rope_freqs.weight", &[head_full / 2])?,
        head,
        ple,
        layers,
        rope_full,
        rope_swa,
        final_softcap,
        moe,
        hp,
    }))
}

impl Family for Gemma4 {
    fn hparams(&self) -> &Hparams {
        &self.hp
    }

    fn kv_dims(&self) -> Vec<(i64, i64)> {
        self.layers
            .iter()
            .filter(|l| l.shape.has_kv)
            .map(|l| {
                let d = l.shape.head_dim * l.shape.n_head_kv;
                (d, d)
            })
            .collect()
    }

    fn forward<'a>(&'a self, s: &mut Step<'a>) -> Tensor<'a> {
        let g = s.ctx;
        let (hp, n) = (&self.hp, s.n_tokens);
        let eps = hp.rms_eps;
        let embd = g.get_rows(self.head.tok_embd.t(), s.tokens);
        let mut x = g.scale(embd, (hp.n_embd as f32).sqrt()).named("inp_scaled");
        let nl = self.layers.len() as i64;
        // Per-layer inputs [n_pl, n, n_layer]: the token's per-layer embedding mixed with a
        // projection of its input embedding.
        let per_layer = self.ple.as_ref().map(|p| {
            let rows = g.get_rows(p.tok_embd.t(), s.tokens);
            let rows = g.scale(g.reshape(rows, &[p.n_pl, nl, n]), (p.n_pl as f32).sqrt());
            let proj = g.scale(s.matmul(&p.model_proj, x), 1.0 / (hp.n_embd as f32).sqrt());
            let proj = s.rms_norm(g.reshape(proj, &[p.n_pl, nl, n]), &p.proj_norm, eps);
            let mixed = g.scale(g.add(proj, rows), std::f32::consts::FRAC_1_SQRT_2);
            g.cont(g.permute(mixed, [0, 2, 1, 3]))
        });
        for (il, l) in self.layers.iter().enumerate() {
            let sh = l.shape;
            let (rope, factors) = if sh.sliding {
                (&self.rope_swa, None)
            } else {
                (&self.rope_full, self.rope_freqs.as_ref().map(|t| t.t()))
            };
            let h = s.rms_norm(x, &l.attn_norm, eps);
            let q = g.reshape(s.matmul(&l.wq, h), &[sh.head_dim, sh.n_head, n]);
            let q = g.rope(s.rms_norm(q, &l.q_norm, eps), s.pos, factors, rope);
            let spec = AttnSpec {
                n_head: sh.n_head,
                n_head_kv: sh.n_head_kv,
                head_dim_k: sh.head_dim,
                head_dim_v: sh.head_dim,
                scale: 1.0,
                softcap: 0.0,
                sliding: sh.sliding,
            };
            let att = match (&l.wk, &l.k_norm, sh.has_kv) {
                (Some(wk), Some(k_norm), true) => {
                    let k_proj = s.matmul(wk, h);
                    let v_proj = match &l.wv {
                        Some(wv) => s.matmul(wv, h),
                        None => k_proj,
                    };
                    let k = g.reshape(k_proj, &[sh.head_dim, sh.n_head_kv, n]);
                    let v = g.reshape(v_proj, &[sh.head_dim, sh.n_head_kv, n]);
                    let k = g.rope(s.rms_norm(k, k_norm, eps), s.pos, factors, rope);
                    let v = g.rms_norm(v, eps);
                    s.attention(sh.cache, q, k, v, &spec, None)
                }
                _ => s.attend(sh.cache, q, &spec),
            };
            let a = s.matmul(&l.wo, att);
            let attn_out = g.add(s.rms_norm(a, &l.attn_post_norm, eps), x);
            let dense = |h: Tensor<'a>| {
                s.ffn(
                    h,
                    FfnWeights {
                        gate: &l.ffn_gate,
                        up: &l.ffn_up,
                        down: &l.ffn_down,
                    },
                    GluOp::GeGlu,
                )
            };
            let f = match (&l.moe, &self.moe) {
                (Some(m), Some(cfg)) => {
                    let mlp = dense(s.rms_norm(attn_out, &l.ffn_norm, eps));
                    let mlp = s.rms_norm(mlp, &m.post_norm_1, eps);
                    let moe_in = s.rms_norm(attn_out, &m.pre_norm_2, eps);
                    // The router reads the residual, RMS-normed, scaled by 1/sqrt(width) and by
                    // its own per-channel scale.
                    let r = g.scale(g.rms_norm(attn_out, eps), 1.0 / (hp.n_embd as f32).sqrt());
                    let r = g.mul(r, m.router_scale.t());
                    let logits = s.matmul(m.experts.router(), r);
                    let moe = s.moe_routed(moe_in, logits, &m.experts, cfg);
                    g.add(mlp, s.rms_norm(moe, &m.post_norm_2, eps))
                }
                _ => dense(s.rms_norm(attn_out, &l.ffn_norm, eps)),
            };
            let mut cur = g.add(s.rms_norm(f, &l.ffn_post_norm, eps), attn_out);
            if let (Some(p), Some(inputs)) = (&l.ple, per_layer) {
                let gate = g.gelu(s.matmul(&p.inp_gate, cur));
                let nb = inputs.nb();
                let this = g.view(inputs, &[inputs.ne()[0], n], &[nb[1]], il * nb[2]);
                let pe = s.matmul(&p.proj, g.mul(gate, this));
                cur = g.add(cur, s.rms_norm(pe, &p.post_norm, eps));
            }
            if let Some(sc) = &l.out_scale {
                cur = g.mul(cur, sc.t());
            }
            x = cur.named(&format!("l_out-{il}"));
        }
        // libllama runs the last layer on every row and picks the output rows after the norm.
        let x = g.get_rows(s.rms_norm(x, &self.head.output_norm, eps), s.out_ids);
        s.output(&self.head.output, x, self.final_softcap)
    }
}
