//! Attention in the device layout: every small row through one paged op, or an op of ggml's
//! per row (stacked where the device allows), prefill chunks through ggml's op of their own.
use super::*;

impl<'a> Step<'a> {
    /// Attention with the device layout. With [`DeviceStep::paged`], every small row in one
    /// paged op over the cache (`paged_cache`: the step's writes of it); otherwise (and for
    /// prefill chunks) one op per [`crate::device_step::AttnOp`], each over its sequence's own
    /// slots (`ks`/`vs`: the cache, or the slots gathered for the step) with its own block of the
    /// mask.
    pub(super) fn attention_device(
        &self,
        d: &DeviceStep,
        q: Tensor<'a>,
        (ks, vs): (Tensor<'a>, Tensor<'a>),
        paged_cache: (Tensor<'a>, Tensor<'a>),
        heads: Heads<'_, 'a>,
    ) -> Tensor<'a> {
        let (g, spec) = (self.ctx, heads.spec);
        let width = spec.head_dim_v * spec.n_head;
        if let (Some(shape), Some(p)) = (d.paged, self.paged) {
            // Every small row in one op; the op's rows of other sequences are zero, and their
            // attention comes from the ops below.
            let (kc, vc) = paged_cache;
            let paged = (spec.head_dim_k == spec.head_dim_v)
                .then(|| {
                    g.paged_attention(PagedAttention {
                        q,
                        k: kc,
                        v: vc,
                        rows: p.rows,
                        table: p.table,
                        sinks: heads.sinks,
                        block_size: shape.block_size,
                        window: if spec.sliding { p.window } else { 0 },
                        chunks: shape.chunks,
                        scale: spec.scale,
                        softcap: spec.softcap,
                    })
                })
                .flatten();
            let Some(o) = paged else {
                *p.refused.borrow_mut() = Some(format!(
                    "heads {}x{} (KV {}, values {}), q {:?} strides {:?}",
                    spec.n_head,
                    spec.head_dim_k,
                    spec.n_head_kv,
                    spec.head_dim_v,
                    q.ne(),
                    q.nb()
                ));
                return g.input(DType::F32, &[width, self.n_tokens], "paged_refused");
            };
            let o = g.reshape(o, &[width, self.n_tokens]);
            if d.attn.is_empty() {
                return o;
            }
            let mut outs = Vec::with_capacity(d.runs.len());
            for run in &d.runs {
                if run.small {
                    outs.push(columns(g, o, run.first, run.cols));
                } else {
                    let Some(at) = d.attn.iter().position(|a| a.first == run.first) else {
                        panic!("no attention op for the prefill chunk at row {}", run.first);
                    };
                    outs.push(self.attention_ops(d, &d.attn[at..at + 1], q, (ks, vs), heads));
                }
            }
            return concat_all(g, outs, 1);
        }
        self.attention_ops(d, &d.attn, q, (ks, vs), heads)
    }

    /// `ops` of the device layout, one ggml attention op each (or a run of one-row ops stacked
    /// into one), their outputs one after another.
    pub(super) fn attention_ops(
        &self,
        d: &DeviceStep,
        ops: &[crate::device_step::AttnOp],
        q: Tensor<'a>,
        (ks, vs): (Tensor<'a>, Tensor<'a>),
        heads: Heads<'_, 'a>,
    ) -> Tensor<'a> {
        let (g, spec) = (self.ctx, heads.spec);
        let il_mask = self.layer_mask(spec);
        let qn = q.nb();
        let width = spec.head_dim_v * spec.n_head;
        let f16_row = |n: i64| DType::F16.row_size(n);
        let mut outs = Vec::with_capacity(ops.len());
        let mut i = 0;
        while i < ops.len() {
            let op = ops[i];
            let slots = KvSlots {
                k: ks,
                v: vs,
                off: op.kv_off,
                len: op.kv_len,
            };
            let q_rows = |rows: i64| {
                if (op.first, rows) == (0, self.n_tokens) {
                    q
                } else {
                    g.view(
                        q,
                        &[spec.head_dim_k, spec.n_head, rows],
                        &[qn[1], qn[2]],
                        op.first as usize * qn[2],
                    )
                }
            };
            // A run of one-row ops over the same slots (a sequence's verify rows), or over
            // segments of the same length one after another (decoding rows of sequences whose
            // gathered slots line up), shares one op where the device gives each row the same
            // numbers that way.
            let stack = match (self.stacking, heads.sinks) {
                (Some(table), None) if op.rows == 1 => {
                    // Other sequences' rows: the next op's slots start at or after this one's
                    // end (a gathered segment right after it, or the next lane of the cache).
                    let next = ops.get(i + 1).map_or(0, |o| o.kv_off - op.kv_off);
                    let segments = next >= op.kv_len;
                    let step = if segments { next } else { 0 };
                    let run = ops[i..]
                        .iter()
                        .zip(0i64..)
                        .take_while(|(o, r)| {
                            o.rows == 1
                                && o.kv_len == op.kv_len
                                && o.kv_off == op.kv_off + r * step
                                && o.first == op.first + r
                                && o.mask_off == op.mask_off + r * op.kv_len
                        })
                        .count() as i64;
                    // The whole run, else halves of it (a device may give the rows of a wide
                    // op other numbers, as its parallel split depends on the op's size).
                    std::iter::successors(Some(run), |&r| (r > 2).then_some((r / 2).max(2)))
                        .filter(|&r| r > 1)
                        .find(|&r| {
                            StackKey::of(spec, op.kv_len, r).is_some_and(|key| table.allows(key))
                        })
                        .map(|r| (r, segments.then_some(step)))
                }
                _ => None,
            };
            if let Some((rows, segments)) = stack {
                let mask = g.view(
                    il_mask,
                    &[op.kv_len * rows],
                    &[],
                    op.mask_off as usize * f16_row(1),
                );
                let how = if let Some(stride) = segments {
                    StackedKv::Segments { stride }
                } else if slots.strided_fits(spec.head_dim_k, spec.n_head_kv, rows) {
                    StackedKv::Strided
                } else {
                    StackedKv::Repeated
                };
                let o = attention_op(g, q_rows(rows), slots, mask, spec, OpRows::Stacked(how));
                outs.push(g.reshape(o, &[width, rows]));
                i += rows as usize;
                continue;
            }
            // One op: the mask input has the op's shape already (see `DeviceStep::mask_shape`).
            let mg = if d.attn.len() == 1 {
                il_mask
            } else {
                g.view(
                    il_mask,
                    &[op.kv_len, op.rows],
                    &[f16_row(op.kv_len)],
                    op.mask_off as usize * f16_row(1),
                )
            };
            let o = attention_op(g, q_rows(op.rows), slots, mg, spec, OpRows::Own);
            heads.add_sinks(g, o);
            outs.push(g.reshape(o, &[width, op.rows]));
            i += 1;
        }
        concat_all(g, outs, 1)
    }
}
