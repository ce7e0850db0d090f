//! How a step's small columns (decode and verify rows) multiply a weight on an accelerator, so
//! that a column's numbers do not depend on how many columns share its op
//! ([`crate::device_step::DeviceProducts`]): MMVQ groups, Axle's column-invariant kernel, or MMQ
//! ops of 9 to 128 columns with Axle's replay of MMQ below 9 (wide products).
//!
//! The runner checks the chosen products once at load on each of the model's weight shapes
//! ([`probe`]): the same random columns multiplied at several widths must give every column the
//! same bits. Axle's kernels rest on an analysis of ggml's (which kernel runs a width, how it
//! splits K); the probe is what tells on a GPU or a ggml that analysis did not cover.
use crate::device_step::{
    DeviceProducts, DeviceStep, FLOAT_GROUP_COLS, GROUP_COLS, WIDE_MAX_COLS, WIDE_MIN_COLS,
};
use crate::pieces::{columns, concat_all};
use crate::ModelError;
use axle_ggml::{Context, DType, Graph, GraphScheduler, Tensor, TensorStore};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// Whether small columns of `w` take the column-invariant kernel's arithmetic: with column
/// products where the kernel covers the type, with wide products where the replay does not take
/// the weight but the kernel covers it ([`DeviceStep::wide_by_columns`]).
pub(crate) fn by_columns(w: Tensor<'_>, d: &DeviceStep) -> bool {
    d.column_invariant(w.dtype()) || d.wide_by_columns(w.dtype(), w.ne()[0], w.ne()[1])
}

/// A weight's products in a graph's context.
#[derive(Clone, Copy)]
pub(crate) struct Product<'a> {
    /// The context the ops are made in.
    pub g: &'a Context,
    /// The weight.
    pub w: Tensor<'a>,
}

impl<'a> Product<'a> {
    /// `w @ xs` for small columns: MMVQ groups, or MMQ ops (wide products) for weights it
    /// takes; F32 weights in MMVF groups.
    pub fn small(self, xs: Tensor<'a>, d: &DeviceStep) -> Tensor<'a> {
        let by_columns = by_columns(self.w, d);
        if d.products == DeviceProducts::Wide && self.w.dtype().has_cuda_mmq() && !by_columns {
            return self.wide(xs, d);
        }
        // Up to GROUP_COLS columns ggml's own mat-vec kernel has the same arithmetic (and fuses
        // a one-column gate, up and gated unit); wider, Axle's kernel in one op.
        if by_columns && xs.ne()[1] > GROUP_COLS {
            return self.g.mul_mat_column_invariant(self.w, xs);
        }
        let group = if self.w.dtype() == DType::F32 {
            FLOAT_GROUP_COLS
        } else {
            GROUP_COLS
        };
        self.grouped(xs, group)
    }

    /// `w @ x` for `x` [k, n, h] with fewer than `cols` columns: `x` padded with zero columns
    /// to `cols`, and the product's first `n` columns.
    pub fn padded(self, x: Tensor<'a>, cols: i64) -> Tensor<'a> {
        let g = self.g;
        let [_, n, h, _] = x.ne();
        let y = g.mul_mat(self.w, g.pad_cols(x, cols - n));
        let nb = y.nb();
        let first = g.view(y, &[self.w.ne()[1], n, h], &[nb[1], nb[2]], 0);
        // One head: the first n columns are contiguous already.
        if h == 1 {
            first
        } else {
            g.cont(first)
        }
    }

    /// `w @ x` in products of at most `group` columns: one op over groups of exactly that many
    /// (a 3-D batch) and one for the rest.
    pub fn grouped(self, x: Tensor<'a>, group: i64) -> Tensor<'a> {
        let (g, w) = (self.g, self.w);
        let [k, n, ..] = x.ne();
        if n <= group {
            return g.mul_mat(w, x);
        }
        let nb1 = x.nb()[1];
        let full = n / group;
        let main = g.view(x, &[k, group, full], &[nb1, nb1 * group as usize], 0);
        let m = w.ne()[1];
        let y = g.reshape(g.mul_mat(w, main), &[m, full * group]);
        let left = n - full * group;
        if left == 0 {
            return y;
        }
        let tail = g.view(x, &[k, left], &[nb1], (full * group) as usize * nb1);
        g.concat(y, g.mul_mat(w, tail), 1)
    }

    /// `w @ x` in ops of [`WIDE_MIN_COLS`] to [`WIDE_MAX_COLS`] columns (MMQ with one column
    /// tile on CUDA): runs of at most 128 columns; a shorter one through Axle's replay of MMQ
    /// where the backends carry it for the weight ([`DeviceStep::wide_replay`]), else padded
    /// with zero columns.
    fn wide(self, x: Tensor<'a>, d: &DeviceStep) -> Tensor<'a> {
        let (g, w) = (self.g, self.w);
        let n = x.ne()[1];
        let mut pieces = Vec::new();
        let mut first = 0;
        while first < n {
            let cols = (n - first).min(WIDE_MAX_COLS);
            let xs = columns(g, x, first, cols);
            pieces.push(
                if cols < WIDE_MIN_COLS && d.wide_replay(w.dtype(), w.ne()[0], w.ne()[1]) {
                    g.mul_mat_wide_replay(w, xs)
                } else if cols < WIDE_MIN_COLS {
                    self.padded(xs, WIDE_MIN_COLS)
                } else {
                    g.mul_mat(w, xs)
                },
            );
            first += cols;
        }
        concat_all(g, pieces, 1)
    }
}

/// Widths at which [`probe`] multiplies a weight: below, at and above each kernel's thresholds
/// (mat-vec groups of 4, the replay below 9, MMQ from 9, runs of at most 128), the last the
/// widest, whose columns the others are compared with.
pub const PROBE_WIDTHS: [i64; 9] = [1, 2, 3, 4, 5, 8, 9, 16, WIDE_MAX_COLS];

/// A column of a probe whose bits changed with the width of its product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WidthMismatch {
    /// The product's width.
    pub width: i64,
    /// The column.
    pub column: i64,
    /// The first row whose value differs from the widest product's.
    pub row: i64,
}

impl std::fmt::Display for WidthMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "column {} of a {}-column product differs from the same column in a {}-column one \
             (row {})",
            self.column,
            self.width,
            PROBE_WIDTHS[PROBE_WIDTHS.len() - 1],
            self.row
        )
    }
}

/// Multiplies `w` by the same random columns at each of [`PROBE_WIDTHS`] with `d`'s small
/// products ([`small_product`]), in one graph run in slot `slot` of `sched`, and compares every
/// column's bits with the widest product's: the first column that differs, or `None`. The
/// columns live in the weight's own memory.
pub fn probe(
    sched: &mut GraphScheduler,
    slot: usize,
    w: Tensor<'_>,
    d: &DeviceStep,
) -> Result<Option<WidthMismatch>, ModelError> {
    probe_with(sched, slot, w, |g, w, xs| Product { g, w }.small(xs, d))
}

/// [`probe`] with the product `product(ctx, w, xs)`.
fn probe_with(
    sched: &mut GraphScheduler,
    slot: usize,
    w: Tensor<'_>,
    product: impl for<'a> Fn(&'a Context, Tensor<'a>, Tensor<'a>) -> Tensor<'a>,
) -> Result<Option<WidthMismatch>, ModelError> {
    let [k, m, ..] = w.ne();
    let widest = PROBE_WIDTHS[PROBE_WIDTHS.len() - 1];
    let buft = w
        .buffer_type()
        .ok_or_else(|| ModelError::Invalid(format!("probe: weight {} has no memory", w.name())))?;
    let store = TensorStore::zeroed(buft, &[("probe_x".into(), DType::F32, vec![k, widest])])?;
    let x = store.require("probe_x")?;
    let mut rng = ChaCha8Rng::seed_from_u64(k as u64 ^ (m as u64) << 32);
    let xs: Vec<f32> = (0..k * widest)
        .map(|_| (rng.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0)
        .collect();
    x.t().write(&xs)?;

    let nodes = 64 * PROBE_WIDTHS.len() + 256;
    let ctx = Context::new(nodes, nodes)?;
    let mut graph = ctx.graph(nodes);
    let outs: Vec<Tensor<'_>> = PROBE_WIDTHS
        .iter()
        .map(|&n| {
            let y = product(&ctx, w, columns(&ctx, x.t(), 0, n));
            ctx.cont(y).as_output()
        })
        .collect();
    for &o in &outs {
        graph.expand(o);
    }
    let results = computed_bits(sched, slot, &mut graph, &outs)?;
    let Some(reference) = results.last() else {
        return Ok(None);
    };
    for (&width, ys) in PROBE_WIDTHS.iter().zip(&results) {
        let m = m as usize;
        for (column, col) in ys.chunks(m).enumerate() {
            let same = &reference[column * m..(column + 1) * m];
            if let Some(row) = col.iter().zip(same).position(|(a, b)| a != b) {
                return Ok(Some(WidthMismatch {
                    width,
                    column: column as i64,
                    row: row as i64,
                }));
            }
        }
    }
    Ok(None)
}

/// Allocates and computes `graph` in slot `slot` of `sched` and reads the F32 outputs `outs` back
/// as bits (the probes' comparisons are bit for bit).
pub(crate) fn computed_bits(
    sched: &mut GraphScheduler,
    slot: usize,
    graph: &mut Graph<'_>,
    outs: &[Tensor<'_>],
) -> Result<Vec<Vec<u32>>, ModelError> {
    sched.alloc(slot, graph)?;
    sched.compute(slot, graph)?;
    let mut results = Vec::new();
    for o in outs {
        let mut ys: Vec<f32> = Vec::new();
        o.read(&mut ys)?;
        results.push(ys.iter().map(|y| y.to_bits()).collect());
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axle_ggml::{Backend, BufferType};

    /// A Q4_0 weight of `m` rows of `k` weights in host memory, random quants and small scales.
    fn q4_0_weight(k: i64, m: i64) -> TensorStore {
        let store =
            TensorStore::zeroed(BufferType::cpu(), &[("w".into(), DType::Q4_0, vec![k, m])])
                .unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut bytes = vec![0u8; DType::Q4_0.row_size(k) * m as usize];
        for block in bytes.chunks_mut(18) {
            let d = half::f16::from_f32(0.01 + (rng.next_u32() % 100) as f32 * 1e-4);
            block[..2].copy_from_slice(&d.to_bits().to_le_bytes());
            for q in &mut block[2..] {
                *q = rng.next_u32() as u8;
            }
        }
        store.require("w").unwrap().t().write(&bytes).unwrap();
        store
    }

    /// ggml's CPU dot product gives a Q4_0 column the same bits at every width: groups pass.
    #[test]
    fn the_probe_passes_products_whose_columns_do_not_depend_on_the_width() {
        let mut sched = GraphScheduler::new(vec![Backend::cpu(2).unwrap()], 4096).unwrap();
        let store = q4_0_weight(256, 48);
        let w = store.require("w").unwrap();
        let d = DeviceStep::for_products(DeviceProducts::Groups, 0, 0);
        assert_eq!(probe(&mut sched, 0, w.t(), &d).unwrap(), None);
    }

    /// A product that rounds one width otherwise is caught, with the width and column named.
    #[test]
    fn the_probe_names_the_first_width_whose_columns_differ() {
        let mut sched = GraphScheduler::new(vec![Backend::cpu(2).unwrap()], 4096).unwrap();
        let store = q4_0_weight(256, 48);
        let w = store.require("w").unwrap();
        let found = probe_with(&mut sched, 0, w.t(), |g, w, xs| {
            let y = g.mul_mat(w, xs);
            if xs.ne()[1] == 5 {
                g.scale(y, 1.0 + f32::EPSILON)
            } else {
                y
            }
        })
        .unwrap();
        let found = found.expect("the 5-column product is scaled");
        assert_eq!((found.width, found.column), (5, 0));
        assert!(found.to_string().contains("5-column"), "{found}");
    }
}
