//! Runs of one-row attention ops in one op, where the device gives each row exactly the
//! arithmetic of a one-row op: a verify step's rows of one sequence, and decoding rows of
//! sequences whose gathered slots line up.
//!
//! The device layout ([`crate::device_step`]) gives every decode and verify row an attention op
//! of its own, because ggml's kernels choose their arithmetic by the op's shape. That cost a
//! verify step an op, its combine step and a share of the concatenation per layer and extra row
//! (most of a verify step's extra time), and a batched step one op per sequence.
//!
//! Rows can share one op when each goes into the op's fourth dimension (one "sequence" each,
//! with one query row and its own mask row) and the kernel treats each of them as it treats a
//! one-row op. A sequence's verify rows read the same slots (a view stepping 0 bytes per row, or
//! a copy per row); decoding rows of different sequences read gathered segments of the same
//! length one after another (a view stepping one segment per row). Whether the kernel then gives
//! each row a one-row op's bits depends on the device and the shape: on CUDA, a one-row op over
//! F16 KV takes the vector kernel, and so does an op of one query row per sequence when ggml's
//! grouped-query optimization is off (one stride of the query that is not a multiple of 16 bytes
//! turns it off: the query's stride across its single row, which addresses nothing); the KV range
//! is then split into parallel blocks by occupancy, and the split is the same only while the
//! op's extra blocks fit the same wave. Rather than predict ggml's heuristics, the runner asks
//! the device: before a step first stacks rows of a shape ([`StackKey`]), it computes the shape
//! every way on random data in every memory that holds attention layers, and stacks only where
//! the results are equal bit for bit ([`probe`]); a run the device refuses is tried in halves.
//! Each shape is probed once per runner.

use crate::heads::AttnSpec;
use crate::ModelError;
use axle_ggml::{BufferType, Context, DType, GraphScheduler, Tensor, TensorStore};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::cell::RefCell;
use std::collections::HashMap;

/// Most device memory a probe may take for its keys and values and their copies: 1 GiB, which
/// with 2 KiB KV rows (Llama-3-8B) covers a verify step of 8 drafts over about 14k slots, or 64
/// batched rows over about 2k. A larger shape is not stacked.
const PROBE_MAX_BYTES: i64 = 1 << 30;

/// The shape of a stacked op: what decides a kernel's arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StackKey {
    /// Head size of queries, keys and values (stacking needs them equal).
    pub head_dim: i64,
    /// Query heads.
    pub n_head: i64,
    /// KV heads.
    pub n_head_kv: i64,
    /// Softmax scale (bits).
    pub scale: u32,
    /// Logit softcap (bits; 0 = off).
    pub softcap: u32,
    /// KV slots the rows attend (a multiple of [`crate::device_step::KV_ALIGN`]).
    pub kv_len: i64,
    /// Query rows.
    pub rows: i64,
}

impl StackKey {
    /// The key of `rows` rows of a layer of `spec` over `kv_len` slots, or None where rows of
    /// such a layer are never stacked (keys and values of other sizes, as with latent attention).
    pub fn of(spec: &AttnSpec, kv_len: i64, rows: i64) -> Option<StackKey> {
        (spec.head_dim_k == spec.head_dim_v).then_some(StackKey {
            head_dim: spec.head_dim_k,
            n_head: spec.n_head,
            n_head_kv: spec.n_head_kv,
            scale: spec.scale.to_bits(),
            softcap: spec.softcap.to_bits(),
            kv_len,
            rows,
        })
    }

    fn spec(&self) -> AttnSpec {
        AttnSpec {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim_k: self.head_dim,
            head_dim_v: self.head_dim,
            scale: f32::from_bits(self.scale),
            softcap: f32::from_bits(self.softcap),
            sliding: false,
        }
    }
}

/// Which shapes may be stacked, as probed; graph building records the shapes it met unprobed.
#[derive(Debug, Default)]
pub struct StackTable {
    known: HashMap<StackKey, bool>,
    misses: RefCell<Vec<StackKey>>,
}

impl StackTable {
    /// Whether rows of shape `key` may share an op. An unprobed shape is not stacked and is
    /// recorded for [`StackTable::take_misses`].
    pub fn allows(&self, key: StackKey) -> bool {
        match self.known.get(&key) {
            Some(&ok) => ok,
            None => {
                let mut misses = self.misses.borrow_mut();
                if !misses.contains(&key) {
                    misses.push(key);
                }
                false
            }
        }
    }

    /// The shapes met unprobed since the last call.
    pub fn take_misses(&self) -> Vec<StackKey> {
        std::mem::take(&mut self.misses.borrow_mut())
    }

    /// Records a probe's answer.
    pub fn record(&mut self, key: StackKey, ok: bool) {
        self.known.insert(key, ok);
    }

    /// Probed shapes and their answers.
    pub fn known(&self) -> impl Iterator<Item = (&StackKey, &bool)> {
        self.known.iter()
    }
}

/// The KV rows `off..off + len` of a cache-shaped source [n_head_kv * dim, slots] as a flash
/// attention operand [dim, len, n_head_kv].
pub(crate) fn kv_rows<'a>(
    g: &'a Context,
    src: Tensor<'a>,
    dim: i64,
    n_head_kv: i64,
    off: i64,
    len: i64,
) -> Tensor<'a> {
    let nb1 = src.nb()[1];
    let head = src.dtype().row_size(dim);
    let view = g.view(
        src,
        &[dim, n_head_kv, len],
        &[head, nb1],
        off as usize * nb1,
    );
    g.permute(view, [0, 2, 1, 3])
}

/// The keys and values an attention op reads: slots `off..off + len` of the cache-shaped sources
/// `k` and `v` [n_head_kv * head_dim, slots].
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvSlots<'a> {
    pub k: Tensor<'a>,
    pub v: Tensor<'a>,
    pub off: i64,
    pub len: i64,
}

/// How an attention op of the device layout takes its query rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpRows {
    /// As rows of one query (a prefill chunk, or one decode or verify row).
    Own,
    /// Stacked: each row a sequence of its own in the op's fourth dimension, all over the same
    /// slots, with the keys and values read this way.
    Stacked(StackedKv),
}

/// How a stacked op reads its KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StackedKv {
    /// Every row the same slots, through a view that steps 0 bytes from row to row (where the
    /// source is long enough for ggml to accept a view of that nominal size).
    Strided,
    /// Every row the same slots, copied once per row (`repeat`).
    Repeated,
    /// Each row its own slots: row `r` reads `off + r * stride .. off + r * stride + len`, with
    /// `stride >= len` (rows of different sequences whose slots have the same length, one after
    /// another: gathered segments, `stride == len`, or sequences read in place in lanes of the
    /// cache).
    Segments {
        /// Slots from one row's first to the next's.
        stride: i64,
    },
}

/// One attention op of the device layout: query rows `q` [dim, n_head, rows] (consecutive in
/// memory) over `kv` with `mask` [len, rows] (one mask row per query row); returns the
/// flash-attention node, [dim * n_head, rows] once reshaped (sinks attach to it). Stacked rows
/// give the same numbers as ops of one row each, where [`probe`] says so.
pub(crate) fn attention_op<'a>(
    g: &'a Context,
    q: Tensor<'a>,
    kv: KvSlots<'a>,
    mask: Tensor<'a>,
    spec: &AttnSpec,
    how: OpRows,
) -> Tensor<'a> {
    let KvSlots { k, v, off, len } = kv;
    let [dim, n_head, rows, _] = q.ne();
    let form = match how {
        OpRows::Own => {
            let own = |src, dim| kv_rows(g, src, dim, spec.n_head_kv, off, len);
            return g.flash_attn(
                g.permute(q, [0, 2, 1, 3]),
                own(k, spec.head_dim_k),
                own(v, spec.head_dim_v),
                mask,
                spec.scale,
                spec.softcap,
            );
        }
        OpRows::Stacked(form) => form,
    };
    let qn = q.nb();
    // [dim, 1, n_head, rows]. The stride across the single query row addresses nothing; it is
    // 4 bytes so that ggml's CUDA backend does not take its grouped-query kernel variant (which
    // needs every stride a multiple of 16) and keeps the one-row vector kernel.
    let q4 = g.view(
        q,
        &[dim, 1, n_head, rows],
        &[DType::F32.row_size(1), qn[1], qn[2]],
        0,
    );
    let m4 = g.view(mask, &[len, 1, 1, rows], &[DType::F16.row_size(len); 3], 0);
    let operand = |src: Tensor<'a>| {
        let nb1 = src.nb()[1];
        let head = src.dtype().row_size(dim);
        let at = off as usize * nb1;
        match form {
            StackedKv::Strided => {
                g.view(src, &[dim, len, spec.n_head_kv, rows], &[nb1, head, 0], at)
            }
            StackedKv::Segments { stride } => g.view(
                src,
                &[dim, len, spec.n_head_kv, rows],
                &[nb1, head, stride as usize * nb1],
                at,
            ),
            StackedKv::Repeated => {
                let view = g.view(src, &[dim, spec.n_head_kv, len], &[head, nb1], at);
                let copies = g.repeat_4d(view, [dim, spec.n_head_kv, len, rows]);
                g.permute(copies, [0, 2, 1, 3])
            }
        }
    };
    g.flash_attn(q4, operand(k), operand(v), m4, spec.scale, spec.softcap)
}

impl KvSlots<'_> {
    /// Whether [`StackedKv::Strided`] fits both sources for `rows` rows of heads of `dim`
    /// (ggml accepts a view only as long as its nominal contiguous size, which counts every
    /// row's copy, lies inside the source).
    pub(crate) fn strided_fits(&self, dim: i64, n_head_kv: i64, rows: i64) -> bool {
        [self.k, self.v].iter().all(|src| {
            let [_, slots, ..] = src.ne();
            let nb1 = src.nb()[1] as i64;
            let nominal = src.dtype().row_size(dim) as i64 * n_head_kv * self.len * rows;
            self.off * nb1 + nominal <= slots * nb1
        })
    }
}

/// Computes `key`'s rows both ways (one op each, and stacked with every KV form: the same slots
/// for every row, or each row its own) on random data in `buft`, with the rows at the start and
/// at the end of their KV range, and says whether every result is the same bit for bit. `sched`
/// runs the probe's graph in its slot `slot`.
pub fn probe(
    sched: &mut GraphScheduler,
    slot: usize,
    buft: BufferType,
    key: StackKey,
) -> Result<bool, ModelError> {
    let spec = key.spec();
    let (dim, rows, len) = (key.head_dim, key.rows, key.kv_len);
    let width = dim * key.n_head_kv;
    // Long enough for the strided form: every row's nominal copy (and each row's own segment).
    let n_slots = len * rows;
    // Keys and values for that many slots, plus the copies of the repeated form: a shape too
    // large to probe cheaply is not stacked.
    let bytes = 4 * DType::F16.row_size(width) as i64 * n_slots;
    if bytes > PROBE_MAX_BYTES {
        return Ok(false);
    }
    let store = TensorStore::zeroed(
        buft,
        &[
            ("probe_q".into(), DType::F32, vec![dim, key.n_head, rows]),
            ("probe_k".into(), DType::F16, vec![width, n_slots]),
            ("probe_v".into(), DType::F16, vec![width, n_slots]),
            ("probe_mask".into(), DType::F16, vec![len * rows * 2]),
        ],
    )?;
    let t = |name: &str| store.require(name);
    let (q, k, v, mask) = (
        t("probe_q")?,
        t("probe_k")?,
        t("probe_v")?,
        t("probe_mask")?,
    );
    let mut rng = ChaCha8Rng::seed_from_u64(key.kv_len as u64 ^ (key.rows as u64) << 32);
    let mut unit = move || (rng.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
    let qs: Vec<f32> = (0..dim * key.n_head * rows).map(|_| unit()).collect();
    q.t().write(&qs)?;
    for kv in [&k, &v] {
        let xs: Vec<u16> = (0..width * n_slots)
            .map(|_| half::f16::from_f32(unit()).to_bits())
            .collect();
        kv.t().write(&xs)?;
    }
    // Rows at the start of the range (most slots masked) and at its end (none).
    let neg = half::f16::NEG_INFINITY.to_bits();
    let mut masks: Vec<u16> = Vec::new();
    for first in [len - crate::device_step::KV_ALIGN as i64, len - rows] {
        for r in 0..rows {
            masks.extend((0..len).map(|s| if s <= first + r { 0 } else { neg }));
        }
    }
    mask.t().write(&masks)?;

    let slots = KvSlots {
        k: k.t(),
        v: v.t(),
        off: 0,
        len,
    };
    let nodes = 256 + 64 * rows as usize;
    let ctx = Context::new(nodes, nodes)?;
    let mut graph = ctx.graph(nodes);
    let mut outs = Vec::new();
    let mb = DType::F16.row_size(len * rows);
    for half_at in 0..2usize {
        let m = ctx.view(mask.t(), &[len * rows], &[], half_at * mb);
        let per_row: Vec<(Tensor<'_>, Tensor<'_>)> = (0..rows)
            .map(|r| {
                let qn = q.t().nb();
                let qr = ctx.view(
                    q.t(),
                    &[dim, key.n_head, 1],
                    &[qn[1], qn[2]],
                    r as usize * qn[2],
                );
                let mr = ctx.view(
                    m,
                    &[len, 1],
                    &[DType::F16.row_size(len)],
                    r as usize * DType::F16.row_size(len),
                );
                let o = attention_op(&ctx, qr, slots, mr, &spec, OpRows::Own);
                let own = KvSlots {
                    off: r * len,
                    ..slots
                };
                let d = attention_op(&ctx, qr, own, mr, &spec, OpRows::Own);
                let flat = |o| ctx.reshape(o, &[dim * key.n_head, 1]);
                (flat(o), flat(d))
            })
            .collect();
        let (same, distinct): (Vec<_>, Vec<_>) = per_row.into_iter().unzip();
        outs.push(crate::pieces::concat_all(&ctx, same, 1));
        for how in [StackedKv::Strided, StackedKv::Repeated] {
            let o = attention_op(&ctx, q.t(), slots, m, &spec, OpRows::Stacked(how));
            outs.push(ctx.reshape(o, &[dim * key.n_head, rows]));
        }
        outs.push(crate::pieces::concat_all(&ctx, distinct, 1));
        let o = attention_op(
            &ctx,
            q.t(),
            slots,
            m,
            &spec,
            OpRows::Stacked(StackedKv::Segments { stride: len }),
        );
        outs.push(ctx.reshape(o, &[dim * key.n_head, rows]));
    }
    let outs: Vec<Tensor<'_>> = outs.into_iter().map(|o| o.as_output()).collect();
    for &o in &outs {
        graph.expand(o);
    }
    let results = crate::small_products::computed_bits(sched, slot, &mut graph, &outs)?;
    // Per mask placement: rows over the same slots one op each, stacked both ways; rows over
    // their own slots one op each, stacked.
    Ok(results
        .chunks(5)
        .all(|r| r[0] == r[1] && r[0] == r[2] && r[3] == r[4]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axle_ggml::Backend;

    fn key(kv_len: i64, rows: i64) -> StackKey {
        StackKey {
            head_dim: 64,
            n_head: 9,
            n_head_kv: 3,
            scale: 0.125f32.to_bits(),
            softcap: 0,
            kv_len,
            rows,
        }
    }

    /// ggml's CPU kernel computes a one-row op over fewer than 512 slots row by row, as a stacked
    /// one does; from 512 slots it splits a one-row op's slots across the threads and adds the
    /// parts, which rounds differently: the probe must tell the two apart.
    #[test]
    fn the_probe_tells_equal_from_different_arithmetic() {
        let mut sched = GraphScheduler::new(vec![Backend::cpu(2).unwrap()], 8192).unwrap();
        for rows in [2, 5, 9] {
            assert!(probe(&mut sched, 0, BufferType::cpu(), key(256, rows)).unwrap());
        }
        assert!(!probe(&mut sched, 0, BufferType::cpu(), key(512, 4)).unwrap());
    }

    /// A shape whose probe would need more than `PROBE_MAX_BYTES` is refused without allocating.
    #[test]
    fn shapes_too_large_to_probe_are_not_stacked() {
        let mut sched = GraphScheduler::new(vec![Backend::cpu(1).unwrap()], 1024).unwrap();
        assert!(!probe(&mut sched, 0, BufferType::cpu(), key(1 << 20, 64)).unwrap());
    }

    #[test]
    fn unprobed_shapes_are_not_stacked_and_are_recorded_once() {
        let mut t = StackTable::default();
        assert!(!t.allows(key(256, 3)));
        assert!(!t.allows(key(256, 3)));
        assert_eq!(t.take_misses(), vec![key(256, 3)]);
        assert!(t.take_misses().is_empty());
        t.record(key(256, 3), true);
        t.record(key(512, 3), false);
        assert!(t.allows(key(256, 3)));
        assert!(!t.allows(key(512, 3)));
        assert!(t.take_misses().is_empty());
    }
}
