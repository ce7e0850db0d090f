//! Sparse mixture-of-experts feed-forward, shared by every MoE family: a router picks the top-k
//! experts of each token (softmax or sigmoid scores, optionally a selection bias and group limits,
//! optionally renormalised and scaled weights), the chosen experts run as 3-D weights through
//! `mul_mat_id`, their outputs are summed with the routing weights, and an optional shared expert
//! (optionally gated per token) is added. The op sequence is libllama's, so that logits match it.
//!
//! Batch invariance: a token's experts depend on its own router scores only, and every op of the
//! routing works per row. On the CPU the expert products are invariant too: ggml computes each
//! (token, expert) column with the one-row dot product, or, for an expert that 8 or more rows of
//! the step picked, with its tiled K-quant kernel, which (unlike the tiled kernel of the dense
//! product, see [`Step::matmul`]) quantizes the activations as the dot product does and gives the
//! same bits; `tests/verify_invariance.rs` checks steps of up to 63 rows against one-row steps on
//! Q4_K experts. Repacked expert weights use a one-row kernel per column. On an accelerator, the
//! products run in slices of the device layout's group width ([`Step::mul_mat_id`]).
use crate::layers::{FfnWeights, FusedProduct, Kernels, Step};
use crate::weights::{arch_key, Weights};
use crate::ModelError;
use axle_ggml::{FusedWeight, GgufFile, GluOp, StoredTensor, Tensor};

/// Name of a layer's fused FFN gate and up weight.
const FUSED_GATE_UP: &str = "ffn_gate_up.fused";

/// How router logits become expert scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over the experts (Qwen MoE, Mixtral, Gemma 4).
    Softmax,
    /// Independent sigmoid per expert (DeepSeek V3, GLM-4.5+).
    Sigmoid,
    /// The raw logits choose the experts; the weights are a softmax over the chosen ones only
    /// (gpt-oss).
    SoftmaxWeight,
}

/// The routing and expert shape of a MoE layer, read from GGUF metadata.
#[derive(Debug, Clone, Copy)]
pub struct MoeConfig {
    /// Experts per layer.
    pub n_expert: i64,
    /// Experts each token uses (top-k).
    pub n_used: i64,
    /// Inner width of one expert.
    pub n_ff_exp: i64,
    /// Inner width of the shared expert, when the family has one.
    pub n_ff_shared: Option<i64>,
    /// Score function.
    pub gating: Gating,
    /// Whether the chosen experts' weights are renormalised to sum to 1.
    pub norm_weights: bool,
    /// Factor on the routing weights (0 or 1: none).
    pub weights_scale: f32,
    /// Activation of the experts' gated units.
    pub act: GluOp,
    /// How a gated shared expert's gate is computed (the families write it differently, and
    /// the last bits follow the expression).
    pub shared_gate: SharedGate,
    /// Grouped selection (DeepSeek V3): experts in `groups` equal groups, each group scored by
    /// its two best experts, and the top-k chosen within the best `groups_used` groups.
    pub groups: Option<(i64, i64)>,
}

/// The sigmoid of a shared expert's gate, as the family's reference graph computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedGate {
    /// `sigmoid(z)` (Qwen3.5-MoE, Qwen3-Next).
    Sigmoid,
    /// `silu(z) / z` (Qwen2-MoE).
    SiluOverInput,
}

/// Bound of the metadata check: far above any published model (DeepSeek V3: 256 experts;
/// Qwen3-Next: 512).
const MAX_EXPERTS: i64 = 4096;

impl MoeConfig {
    /// Reads `{arch}.expert_count`, `expert_used_count`, `expert_feed_forward_length` (default:
    /// the dense FFN width over the experts used, as libllama has it),
    /// `expert_shared_feed_forward_length`, `expert_weights_scale` and `expert_weights_norm`
    /// (default `norm_default`, the family's). Every size is checked before anything is bound.
    pub fn from_gguf(
        f: &GgufFile,
        arch: &str,
        n_ff: i64,
        gating: Gating,
        norm_default: bool,
    ) -> Result<MoeConfig, ModelError> {
        let key = |k: &str| arch_key(arch, k);
        let bad =
            |k: &str, what: String| ModelError::Invalid(format!("metadata {} {what}", key(k)));
        let n_expert = f.int(&key("expert_count"))?;
        let n_used = f.int(&key("expert_used_count"))?;
        if !(1..=MAX_EXPERTS).contains(&n_expert) {
            return Err(bad(
                "expert_count",
                format!("= {n_expert} is outside 1..={MAX_EXPERTS}"),
            ));
        }
        if !(1..=n_expert).contains(&n_used) {
            return Err(bad(
                "expert_used_count",
                format!("= {n_used} must be in 1..={n_expert} (the expert count)"),
            ));
        }
        let n_ff_exp = f
            .int_opt(&key("expert_feed_forward_length"))?
            .unwrap_or(n_ff / n_used);
        if !(1..=1 << 20).contains(&n_ff_exp) {
            return Err(bad(
                "expert_feed_forward_length",
                format!("= {n_ff_exp} is outside 1..={}", 1 << 20),
            ));
        }
        let n_ff_shared = f.int_opt(&key("expert_shared_feed_forward_length"))?;
        if let Some(s) = n_ff_shared {
            if !(1..=1 << 20).contains(&s) {
                return Err(bad(
                    "expert_shared_feed_forward_length",
                    format!("= {s} is outside 1..={}", 1 << 20),
                ));
            }
        }
        let weights_scale = f.float_opt(&key("expert_weights_scale"))?.unwrap_or(0.0) as f32;
        if !weights_scale.is_finite() || weights_scale < 0.0 {
            return Err(bad(
                "expert_weights_scale",
                format!("= {weights_scale} must be a finite number >= 0"),
            ));
        }
        let norm_weights = f
            .bool_opt(&key("expert_weights_norm"))?
            .unwrap_or(norm_default);
        // 0 is llama.cpp's "no groups", as 1 is.
        let n_groups = f.int_opt(&key("expert_group_count"))?.unwrap_or(1);
        if n_groups < 0 {
            return Err(bad(
                "expert_group_count",
                format!("= {n_groups} must not be negative"),
            ));
        }
        let groups = if n_groups > 1 {
            let used = f.int_opt(&key("expert_group_used_count"))?.unwrap_or(0);
            if !(1..n_groups).contains(&used) {
                return Err(bad(
                    "expert_group_used_count",
                    format!("= {used} must be in 1..{n_groups} (fewer than all of the groups)"),
                ));
            }
            if n_groups >= n_expert || n_expert % n_groups != 0 || !(1..n_groups).contains(&used) {
                return Err(bad(
                    "expert_group_count",
                    format!(
                        "= {n_groups} with {used} used: the groups must split the {n_expert} \
                         experts evenly and fewer than all be used"
                    ),
                ));
            }
            if n_expert / n_groups < 2 {
                return Err(bad(
                    "expert_group_count",
                    format!("= {n_groups}: a group needs at least 2 experts"),
                ));
            }
            Some((n_groups, used))
        } else {
            None
        };
        Ok(MoeConfig {
            n_expert,
            n_used,
            n_ff_exp,
            n_ff_shared,
            gating,
            norm_weights,
            weights_scale,
            act: GluOp::SwiGlu,
            shared_gate: SharedGate::Sigmoid,
            groups,
        })
    }
}

/// A shared expert: a dense gated FFN every token runs, optionally scaled by a per-token sigmoid
/// gate.
#[derive(Debug)]
pub struct SharedExpert {
    /// [n_embd, n_ff_shared] / [n_embd, n_ff_shared] / [n_ff_shared, n_embd]
    gate: StoredTensor,
    up: StoredTensor,
    down: StoredTensor,
    /// [n_embd]: the gate's input weights (Qwen2-MoE, Qwen3.5-MoE), if gated.
    gate_inp: Option<StoredTensor>,
}

/// A layer's feed-forward block: a dense SwiGLU FFN, or experts with the model's routing.
#[derive(Debug)]
pub enum FeedForward {
    /// [n_embd, n_ff] / [n_embd, n_ff] / [n_ff, n_embd]
    Dense {
        /// Gate projection.
        gate: StoredTensor,
        /// Up projection.
        up: StoredTensor,
        /// Down projection.
        down: StoredTensor,
        /// [n_embd, 2 n_ff]: `gate` and `up` stored as one weight, where the store fused them
        /// ([`FeedForward::fused_gate_up`]).
        gate_up: Option<StoredTensor>,
    },
    /// Routed experts (and shared ones).
    Moe(Box<MoeLayer>, MoeConfig),
}

impl FeedForward {
    /// Binds layer `il`'s dense FFN (`ffn_gate`, `ffn_up`, `ffn_down`).
    pub fn dense(
        w: &Weights,
        il: usize,
        n_embd: i64,
        n_ff: i64,
    ) -> Result<FeedForward, ModelError> {
        let n = |s: &str| format!("blk.{il}.{s}");
        Ok(FeedForward::Dense {
            gate: w.req(&n("ffn_gate.weight"), &[n_embd, n_ff])?,
            up: w.req(&n("ffn_up.weight"), &[n_embd, n_ff])?,
            down: w.req(&n("ffn_down.weight"), &[n_ff, n_embd])?,
            gate_up: w.opt(&n(FUSED_GATE_UP), &[n_embd, 2 * n_ff])?,
        })
    }

    /// Layer `il`'s dense gate and up projections as one weight (gate rows first), bound by
    /// [`FeedForward::dense`] where the store fused them.
    pub fn fused_gate_up(il: usize) -> FusedWeight {
        let n = |s: &str| format!("blk.{il}.{s}");
        FusedWeight {
            name: n(FUSED_GATE_UP),
            parts: vec![n("ffn_gate.weight"), n("ffn_up.weight")],
        }
    }
}

/// The gate and up projections of the experts: two 3-D tensors, or one with both (gate rows
/// first), as newer converters write them.
#[derive(Debug)]
enum GateUp {
    /// [n_embd, n_ff_exp, n_expert] each.
    Separate {
        gate: StoredTensor,
        up: StoredTensor,
    },
    /// [n_embd, 2 * n_ff_exp, n_expert].
    Merged(StoredTensor),
}

/// One layer's MoE weights.
#[derive(Debug)]
pub struct MoeLayer {
    /// [n_embd, n_expert]
    router: StoredTensor,
    /// [n_expert]: the router's bias, added to its logits (gpt-oss).
    router_bias: Option<StoredTensor>,
    /// [n_expert]: added to the scores for choosing experts only (DeepSeek V3, GLM-4.5+), not
    /// to the weights of the chosen ones.
    selection_bias: Option<StoredTensor>,
    /// Per-expert biases of the gate, up ([n_ff_exp, n_expert]) and down ([n_embd, n_expert])
    /// products, added for the chosen experts (gpt-oss).
    gate_bias: Option<StoredTensor>,
    up_bias: Option<StoredTensor>,
    down_bias: Option<StoredTensor>,
    gate_up: GateUp,
    /// [n_ff_exp, n_embd, n_expert]
    down: StoredTensor,
    /// [n_expert] each: per-expert output scales of the products, when the file has them.
    gate_scale: Option<StoredTensor>,
    up_scale: Option<StoredTensor>,
    down_scale: Option<StoredTensor>,
    shared: Option<SharedExpert>,
}

impl MoeLayer {
    /// Binds layer `il`'s router (`ffn_gate_inp`, with an optional `.bias`) and experts
    /// (`ffn_gate_exps` and `ffn_up_exps`, or `ffn_gate_up_exps`; `ffn_down_exps`; optional
    /// per-expert `.scale`s and `.bias`es; an optional selection bias `exp_probs_b.bias`)
    /// and, when `shared` is set, its shared expert (`ffn_{gate,up,down}_shexp`, gate
    /// `ffn_gate_inp_shexp` if the file has one).
    pub fn bind(
        w: &Weights,
        il: usize,
        n_embd: i64,
        cfg: &MoeConfig,
        shared: Option<i64>,
    ) -> Result<MoeLayer, ModelError> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let (e, ff, x) = (n_embd, cfg.n_ff_exp, cfg.n_expert);
        let shared = match shared {
            None => None,
            Some(sff) => Some(SharedExpert {
                gate: w.req(&n("ffn_gate_shexp.weight"), &[e, sff])?,
                up: w.req(&n("ffn_up_shexp.weight"), &[e, sff])?,
                down: w.req(&n("ffn_down_shexp.weight"), &[sff, e])?,
                gate_inp: w.opt(&n("ffn_gate_inp_shexp.weight"), &[e])?,
            }),
        };
        let gate_up = match w.opt(&n("ffn_gate_up_exps.weight"), &[e, 2 * ff, x])? {
            Some(t) => GateUp::Merged(t),
            None => GateUp::Separate {
                gate: w.req(&n("ffn_gate_exps.weight"), &[e, ff, x])?,
                up: w.req(&n("ffn_up_exps.weight"), &[e, ff, x])?,
            },
        };
        Ok(MoeLayer {
            router: w.req(&n("ffn_gate_inp.weight"), &[e, x])?,
            router_bias: w.opt(&n("ffn_gate_inp.bias"), &[x])?,
            selection_bias: w.opt(&n("exp_probs_b.bias"), &[x])?,
            gate_bias: w.opt_f32(&n("ffn_gate_exps.bias"), &[ff, x])?,
            up_bias: w.opt_f32(&n("ffn_up_exps.bias"), &[ff, x])?,
            down_bias: w.opt_f32(&n("ffn_down_exps.bias"), &[e, x])?,
            gate_up,
            down: w.req(&n("ffn_down_exps.weight"), &[ff, e, x])?,
            gate_scale: w.opt(&n("ffn_gate_exps.scale"), &[x])?,
            up_scale: w.opt(&n("ffn_up_exps.scale"), &[x])?,
            down_scale: w.opt(&n("ffn_down_exps.scale"), &[x])?,
            shared,
        })
    }

    /// The router's weights [n_embd, n_expert], for families that compute the router logits
    /// themselves (see [`Step::moe_routed`]).
    pub fn router(&self) -> &StoredTensor {
        &self.router
    }
}

impl<'a> Step<'a> {
    /// A SwiGLU feed-forward block of `x` [n_embd, n], dense or MoE.
    pub fn feed_forward(&mut self, x: Tensor<'a>, f: &'a FeedForward) -> Tensor<'a> {
        match f {
            FeedForward::Dense {
                gate_up: Some(gate_up),
                gate,
                up,
                down,
            } => {
                let act = match self.matmul_fused(gate_up, &[gate, up], x, false) {
                    FusedProduct::Whole(y) => self.ctx.glu_halves(y, GluOp::SwiGlu),
                    FusedProduct::Parts(p) => self.ctx.glu(p[0], p[1], GluOp::SwiGlu),
                };
                self.matmul(down, act)
            }
            FeedForward::Dense { gate, up, down, .. } => {
                self.ffn(x, FfnWeights { gate, up, down }, GluOp::SwiGlu)
            }
            FeedForward::Moe(m, cfg) => self.moe(x, m, cfg),
        }
    }

    /// The MoE feed-forward of `x` [n_embd, n]: routed experts (router logits from `x`) plus
    /// the shared expert, if any.
    pub fn moe(&mut self, x: Tensor<'a>, l: &'a MoeLayer, cfg: &MoeConfig) -> Tensor<'a> {
        let g = self.ctx;
        let logits = self.matmul(&l.router, x);
        let out = self.moe_routed(x, logits, l, cfg);
        let Some(sh) = &l.shared else {
            return out;
        };
        let mut shared = self.ffn(
            x,
            FfnWeights {
                gate: &sh.gate,
                up: &sh.up,
                down: &sh.down,
            },
            GluOp::SwiGlu,
        );
        if let Some(gi) = &sh.gate_inp {
            let z = self.matmul(gi, x);
            let gate = match cfg.shared_gate {
                SharedGate::Sigmoid => g.sigmoid(z),
                SharedGate::SiluOverInput => g.div(g.silu(z), z),
            };
            shared = g.mul(shared, gate);
        }
        g.add(out, shared)
    }

    /// The routed experts of `x` [n_embd, n] given the router logits [n_expert, n]. The graph
    /// gets libllama's node order too (the routing weights, then the experts' products, then the
    /// views summed): ggml's CUDA backend fuses the routing ops when they come in that order, and
    /// the fused kernel rounds differently from the separate ones.
    pub fn moe_routed(
        &mut self,
        x: Tensor<'a>,
        logits: Tensor<'a>,
        l: &'a MoeLayer,
        cfg: &MoeConfig,
    ) -> Tensor<'a> {
        let g = self.ctx;
        let [n_embd, n, ..] = x.ne();
        let logits = match &l.router_bias {
            Some(b) => g.add(logits, b.t()),
            None => logits,
        };
        let probs = match cfg.gating {
            Gating::Softmax => g.soft_max(logits),
            Gating::Sigmoid => g.sigmoid(logits),
            Gating::SoftmaxWeight => logits,
        };
        let mut selection = match &l.selection_bias {
            Some(b) => g.add(probs, b.t()),
            None => probs,
        };
        if let Some((n_groups, used)) = cfg.groups {
            // Score each group by the sum of its two best experts, keep the best `used` groups
            // and mask the others' experts out of the top-k (libllama's op sequence).
            let per = cfg.n_expert / n_groups;
            let grouped = g.reshape(selection, &[per, n_groups, n]);
            let best2 = g.argsort_top_k(grouped, 2);
            let scores = g.get_rows(g.reshape(grouped, &[1, per, n_groups, n]), best2);
            let scores = g.sum_rows(g.reshape(scores, &[2, n_groups, n]));
            let keep = g.argsort_top_k(g.reshape(scores, &[n_groups, n]), used);
            let kept = g.get_rows(grouped, keep);
            let masked = g.set_rows(g.fill(grouped, f32::NEG_INFINITY), kept, keep);
            selection = g.reshape(masked, &[cfg.n_expert, n]);
        }
        let selected = g.argsort_top_k(selection, cfg.n_used);
        let mut weights = g.get_rows(g.reshape(probs, &[1, cfg.n_expert, n]), selected);
        if cfg.gating == Gating::SoftmaxWeight {
            let w2 = g.soft_max(g.reshape(weights, &[cfg.n_used, n]));
            weights = g.reshape(w2, &[1, cfg.n_used, n]);
        }
        if cfg.norm_weights {
            let w2 = g.reshape(weights, &[cfg.n_used, n]);
            // Clamped away from 0 (the smallest normal F16) as libllama does.
            let sum = g.clamp(g.sum_rows(w2), 6.103_515_6e-5, f32::INFINITY);
            weights = g.reshape(g.div(w2, sum), &[1, cfg.n_used, n]);
        }
        if cfg.weights_scale != 0.0 && cfg.weights_scale != 1.0 {
            weights = g.scale(weights, cfg.weights_scale);
        }
        self.graph.expand(weights);
        let cur = g.reshape(x, &[n_embd, 1, n]);
        let biased = |y: Tensor<'a>, b: &'a Option<StoredTensor>| match b {
            Some(b) => g.add_id(y, b.t(), selected),
            None => y,
        };
        let (gate, up) = match &l.gate_up {
            GateUp::Separate { gate, up } => {
                let up = self.expert_product(up, cur, selected, l.up_scale.as_ref(), cfg);
                let up = biased(up, &l.up_bias);
                let gate = self.expert_product(gate, cur, selected, l.gate_scale.as_ref(), cfg);
                let gate = biased(gate, &l.gate_bias);
                (gate, up)
            }
            GateUp::Merged(gu) => {
                let both = self.expert_product(gu, cur, selected, l.up_scale.as_ref(), cfg);
                let nb = both.nb();
                let ff = cfg.n_ff_exp;
                let half = |off: usize| g.view(both, &[ff, cfg.n_used, n], &[nb[1], nb[2]], off);
                (half(0), half(ff as usize * nb[0]))
            }
        };
        let act = g.glu(gate, up, cfg.act);
        let down = self.expert_product(&l.down, act, selected, l.down_scale.as_ref(), cfg);
        let down = biased(down, &l.down_bias);
        let experts = g.mul(down, weights);
        self.graph.expand(experts);
        let nb = experts.nb();
        let views: Vec<Tensor<'a>> = (0..cfg.n_used)
            .map(|i| g.view(experts, &[n_embd, n], &[nb[2]], i as usize * nb[1]))
            .collect();
        for &v in &views {
            self.graph.expand(v);
        }
        let mut out = views[0];
        for &v in &views[1..] {
            out = g.add(out, v);
            self.graph.expand(out);
        }
        out
    }

    /// One expert product, times the chosen experts' output scales when the file has them.
    fn expert_product(
        &self,
        w: &'a StoredTensor,
        x: Tensor<'a>,
        selected: Tensor<'a>,
        scale: Option<&'a StoredTensor>,
        cfg: &MoeConfig,
    ) -> Tensor<'a> {
        let g = self.ctx;
        let n = x.ne()[2];
        let y = self.mul_mat_id(w, x, selected);
        match scale {
            None => y,
            Some(s) => {
                // The selected experts' scales, one per (expert slot, token).
                let s = g.reshape(s.t(), &[1, cfg.n_expert, 1]);
                let s = g.repeat_4d(s, [1, cfg.n_expert, n, 1]);
                g.mul(y, g.get_rows(s, selected))
            }
        }
    }

    /// `mul_mat_id(w, x, ids)` (x [k, n_b, n], ids [n_used, n]). With the device layout (batch
    /// invariance on an accelerator): each prefill chunk in one product, and every other token
    /// (decode and verify rows) in a product of its own, so that a token's kernel and arithmetic
    /// are those of a one-token step whatever shares the step (CUDA's indirect products pick
    /// their kernel variant by the step's width).
    fn mul_mat_id(&self, w: &'a StoredTensor, x: Tensor<'a>, ids: Tensor<'a>) -> Tensor<'a> {
        let g = self.ctx;
        let w_t = w.t();
        let n = x.ne()[2];
        let device = match &self.device {
            Some(d) if self.kernels == Kernels::BatchInvariant && w_t.is_on_device() && n > 1 => d,
            _ => return g.mul_mat_id(w_t, x, ids),
        };
        let (xn, idn) = (x.nb(), ids.nb());
        let [k, n_b, ..] = x.ne();
        let n_used = ids.ne()[0];
        let part = |first: i64, t: i64| {
            let xs = g.view(x, &[k, n_b, t], &[xn[1], xn[2]], first as usize * xn[2]);
            let is = g.view(ids, &[n_used, t], &[idn[1]], first as usize * idn[1]);
            g.mul_mat_id(w_t, xs, is)
        };
        let pieces = self.per_token_pieces(device, n, part);
        crate::layers::concat_all(g, pieces, 2)
    }
}
