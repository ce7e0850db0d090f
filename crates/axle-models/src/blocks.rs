//! Graph pieces shared by the architecture files: the per-step inputs ([`Step`]), weighted RMS
//! norm, attention through the KV slots, and gated feed-forward. Models call these with small
//! structs; they never see block tables or slot arithmetic.
use crate::kv::KvCache;
use axle_ggml::{Context, GluOp, Graph, StoredTensor, Tensor};

/// Everything a model's forward pass reads for one step (one graph over the whole batch).
pub struct Step<'a> {
    /// The graph context (ops are created here).
    pub ctx: &'a Context,
    /// The graph being built.
    pub graph: Graph<'a>,
    /// Tokens in the batch.
    pub n_tokens: i64,
    /// I32 [n_tokens]: token ids.
    pub tokens: Tensor<'a>,
    /// I32 [n_tokens]: positions.
    pub pos: Tensor<'a>,
    /// I64 [n_tokens]: KV slot each token writes.
    pub slots: Tensor<'a>,
    /// F16 [n_kv, n_tokens]: 0 where a token may attend to a slot, -inf elsewhere.
    pub mask: Tensor<'a>,
    /// F16 [n_kv, n_tokens]: the same for sliding-window layers (if the model has them).
    pub mask_swa: Option<Tensor<'a>>,
    /// I32 [n_out]: rows whose logits are wanted (applied before the last layer's residual).
    pub out_ids: Tensor<'a>,
    /// Columns of the mask: visible slots this step (a prefix of the cache), or the length of
    /// the gathered KV when `kv_ids` is set.
    pub n_kv: i64,
    /// I32 [n_kv]: when set, attention reads these slots, gathered in this order, instead of a
    /// prefix of the cache. Used when some sequence's blocks do not lie in ascending order, so
    /// that attention still visits every sequence's tokens in logical order (and computes the
    /// same numbers wherever the blocks happen to lie).
    pub kv_ids: Option<Tensor<'a>>,
    /// The KV storage.
    pub kv: &'a KvCache,
    /// (first row, rows) of each attention op: rows are split so that every sequence gets the
    /// same attention kernel whatever else is in the batch.
    pub attn_groups: Vec<(i64, i64)>,
}

/// Attention hyperparameters of one layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnSpec {
    /// Query heads.
    pub n_head: i64,
    /// KV heads.
    pub n_head_kv: i64,
    /// Key (and query) head size.
    pub head_dim_k: i64,
    /// Value head size.
    pub head_dim_v: i64,
    /// Softmax scale.
    pub scale: f32,
    /// Attention logit softcap (0 = off).
    pub softcap: f32,
    /// Whether the layer uses the sliding-window mask.
    pub sliding: bool,
}

/// The weights of a gated feed-forward block.
pub struct FfnWeights<'w> {
    /// [n_embd, n_ff]
    pub gate: &'w StoredTensor,
    /// [n_embd, n_ff]
    pub up: &'w StoredTensor,
    /// [n_ff, n_embd]
    pub down: &'w StoredTensor,
}

impl<'a> Step<'a> {
    /// x * rms(x)^-1 * w.
    pub fn rms_norm(&self, x: Tensor<'a>, w: &'a StoredTensor, eps: f32) -> Tensor<'a> {
        self.ctx.mul(self.ctx.rms_norm(x, eps), w.t())
    }

    /// `w @ x` plus an optional bias.
    pub fn linear(
        &self,
        w: &'a StoredTensor,
        b: Option<&'a StoredTensor>,
        x: Tensor<'a>,
    ) -> Tensor<'a> {
        let y = self.ctx.mul_mat(w.t(), x);
        match b {
            Some(b) => self.ctx.add(y, b.t()),
            None => y,
        }
    }

    /// Gated FFN: down(act(gate x) * up x).
    pub fn ffn(&self, x: Tensor<'a>, w: FfnWeights<'a>, act: GluOp) -> Tensor<'a> {
        let g = self.ctx.mul_mat(w.gate.t(), x);
        let u = self.ctx.mul_mat(w.up.t(), x);
        self.ctx.mul_mat(w.down.t(), self.ctx.glu(g, u, act))
    }

    /// Stores this step's K and V of layer `il` in their slots, then attends over the visible
    /// slots. q: [head_dim_k, n_head, n], k: [head_dim_k, n_head_kv, n], v: [head_dim_v, n_head_kv, n].
    /// Returns [head_dim_v * n_head, n].
    pub fn attention(
        &mut self,
        il: usize,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        spec: &AttnSpec,
    ) -> Tensor<'a> {
        let g = self.ctx;
        let n = self.n_tokens;
        let (kc, vc) = (self.kv.k[il].t(), self.kv.v[il].t());
        let k_rows = g.reshape(k, &[spec.head_dim_k * spec.n_head_kv, n]);
        let v_rows = g.reshape(v, &[spec.head_dim_v * spec.n_head_kv, n]);
        let k_written = g.set_rows(kc, k_rows, self.slots);
        let v_written = g.set_rows(vc, v_rows, self.slots);
        self.graph.expand(k_written);
        self.graph.expand(v_written);
        let (kview, vview) = match self.kv_ids {
            None => {
                let row_k = kc.dtype().row_size(spec.head_dim_k);
                let row_v = vc.dtype().row_size(spec.head_dim_v);
                (
                    g.view(
                        kc,
                        &[spec.head_dim_k, spec.n_head_kv, self.n_kv],
                        &[row_k, kc.nb()[1]],
                        0,
                    ),
                    g.view(
                        vc,
                        &[spec.head_dim_v, spec.n_head_kv, self.n_kv],
                        &[row_v, vc.nb()[1]],
                        0,
                    ),
                )
            }
            Some(ids) => {
                // get_rows yields F32; back to the cache's F16 (exact) so that the attention
                // kernel is the same one the direct path uses.
                let gather = |cache: Tensor<'a>, d: i64| {
                    let rows = g.cast(g.get_rows(cache, ids), cache.dtype());
                    g.reshape(rows, &[d, spec.n_head_kv, self.n_kv])
                };
                (
                    gather(k_written, spec.head_dim_k),
                    gather(v_written, spec.head_dim_v),
                )
            }
        };
        let q = g.permute(q, [0, 2, 1, 3]);
        let kview = g.permute(kview, [0, 2, 1, 3]);
        let vview = g.permute(vview, [0, 2, 1, 3]);
        let mask = if spec.sliding {
            self.mask_swa.unwrap_or(self.mask)
        } else {
            self.mask
        };
        let out = g.flash_attn(q, kview, vview, mask, spec.scale, spec.softcap);
        g.reshape(out, &[spec.head_dim_v * spec.n_head, n])
    }
}
