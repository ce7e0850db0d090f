//! Prefill-sized products (more than [`super::MAX_COLUMNS`] columns) on x86-64 CPUs with
//! AVX-512 VNNI, bit-identical to ggml's one-column dot products.
//!
//! ggml's CPU backend multiplies Q4_1 weights by a prompt's columns one (row, column) pair at a
//! time: every call unpacks the row's nibbles, converts its f16 scales and sums its lanes again,
//! over only `k / 32` blocks (18 for SmolLM2's 576-wide rows). That is 70% of a SmolLM2 prefill.
//! Q5_0 (and Q8_0) products go to llamafile's tinyBLAS, which tiles them but unpacks a weight
//! block for every column it meets: 47% of a Gemma 3 prefill is its Q5_0 products.
//!
//! This kernel tiles the product instead: a thread takes a contiguous share of the columns
//! (and quantizes only those) and lays each group of 4 quantized columns out block by block; it
//! unpacks a tile of 16 weight rows once (quants as bytes, scales as f32) for all of its column
//! groups, and runs 4 rows against a group at a time, so an activation block is loaded once for 4
//! rows and the inner loop is integer dot products, conversions and FMAs only.
//!
//! The arithmetic of every (row, column) is that of ggml's AVX2 dot product for the type, built
//! with AVX-512 VNNI as this workspace builds it (`target-cpu=native`): per block, the integer dot
//! product of the 32 quants in 8 lanes of 4 (`vpdpbusd`, exact), converted to f32, times the
//! product of the two f16 scales, added with one FMA into that column's 8-lane accumulator; for
//! Q4_1 the minimum's term `m_w * s_x` into a running sum with one FMA; at the end ggml's
//! horizontal sum. Integer sums are exact whatever the instruction, and every float operation is
//! the same operation on the same operands in the same order, so the results are the same bits
//! ([`agrees_with_ggml`] checks this once per process against this build's ggml, and
//! `tests/few_columns.rs` at prefill widths).
use super::x86::{column_quantizer, hsum, scale_and_sum, weight_block};
use super::{Kind, QK};
use llama_cpp_sys_2 as sys;
use std::arch::x86_64::*;

/// Columns in a group: each gets its own accumulator in the microkernel.
const GROUP: usize = 4;

/// Rows of a weight tile, whose blocks stay in L1 while every column group of the thread passes
/// over them.
const TILE_ROWS: usize = 16;

/// Whether the CPU has what the kernel uses (AVX-512 F, BW, VL and VNNI, FMA, F16C).
pub(super) fn cpu_has() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vl")
        && std::is_x86_feature_detected!("avx512vnni")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c")
}

/// Quantized columns in groups of [`GROUP`], laid out for the microkernel: for group `g` and
/// block `b`, the 4 columns' 32 quants one after another, their scales as f32, (Q4_1) their
/// scaled sums as f32 and (Q5_0) each of the 8 lanes' starting value for its integer sum:
/// -128 times the sum of the lane's 4 quants, which takes back the 128 that [`Unpacked`] adds to
/// the weights. Columns past the last are zero (their results are discarded).
struct Groups {
    q: Vec<u8>,
    scale: Vec<f32>,
    sum: Vec<f32>,
    start: Vec<i32>,
    nb: usize,
}

/// A group's data from its first block: quants, scales, sums, starting values.
type Group = (*const u8, *const f32, *const f32, *const i32);

impl Groups {
    /// Quantizes `n` columns with ggml's own quantizer for the kind's column type.
    ///
    /// # Safety
    /// `src(c)` points at `nb * QK` readable f32 values for every `c < n`; the CPU has F16C.
    unsafe fn new(kind: Kind, nb: usize, n: usize, src: impl Fn(usize) -> *const f32) -> Groups {
        let (_, block, qoff) = kind.columns();
        let quantize = column_quantizer(kind);
        let groups = n.div_ceil(GROUP);
        let mut q = vec![0u8; groups * nb * GROUP * QK];
        let mut scale = vec![0f32; groups * nb * GROUP];
        let mut sum = vec![0f32; groups * nb * GROUP];
        let mut start = vec![0i32; groups * nb * GROUP * 8];
        let mut col = vec![0u8; nb * block];
        for c in 0..n {
            // SAFETY: the caller's contract for src(c); `col` has room for nb blocks.
            unsafe { quantize(src(c), col.as_mut_ptr() as *mut _, (nb * QK) as i64) };
            let (g, j) = (c / GROUP, c % GROUP);
            for b in 0..nb {
                let blk = &col[b * block..(b + 1) * block];
                let at = (g * nb + b) * GROUP + j;
                let quants = &blk[qoff..qoff + QK];
                q[at * QK..(at + 1) * QK].copy_from_slice(quants);
                // SAFETY: F16C (the caller's contract).
                (scale[at], sum[at]) = unsafe { scale_and_sum(kind, blk) };
                if kind != Kind::Q4_1 {
                    for (lane, four) in quants.chunks(4).enumerate() {
                        let s: i32 = four.iter().map(|&v| i32::from(v as i8)).sum();
                        start[at * 8 + lane] = -128 * s;
                    }
                }
            }
        }
        Groups {
            q,
            scale,
            sum,
            start,
            nb,
        }
    }

    /// Group `g`'s data.
    fn group(&self, g: usize) -> Group {
        let at = g * self.nb * GROUP;
        (
            self.q[at * QK..].as_ptr(),
            self.scale[at..].as_ptr(),
            self.sum[at..].as_ptr(),
            self.start[at * 8..].as_ptr(),
        )
    }
}

/// A tile of weight rows unpacked for the microkernel: each block's 32 quants as unsigned bytes
/// (Q4_1's nibbles; Q5_0's signed quants plus 128, which the columns' starting values
/// take back), its scale and (Q4_1) minimum as f32.
struct Unpacked {
    q: Vec<u8>,
    d: Vec<f32>,
    m: Vec<f32>,
    nb: usize,
}

/// An unpacked row: quants, scales, minimums.
type Row = (*const u8, *const f32, *const f32);

impl Unpacked {
    fn new(rows: usize, nb: usize) -> Unpacked {
        Unpacked {
            q: vec![0; rows * nb * QK],
            d: vec![0.0; rows * nb],
            m: vec![0.0; rows * nb],
            nb,
        }
    }

    /// Unpacks `rows` weight rows into the tile's first rows.
    ///
    /// # Safety
    /// Each `row(i)` points at `nb` blocks of the kind; `rows` is at most the tile's rows; the CPU
    /// has what [`cpu_has`] checks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn fill(&mut self, kind: Kind, rows: usize, row: impl Fn(usize) -> *const u8) {
        let (nb, bb) = (self.nb, kind.block_bytes());
        for i in 0..rows {
            for b in 0..nb {
                // SAFETY: block b of row i (the caller's contract).
                let (d, m, qx) = unsafe { weight_block(kind, row(i).add(b * bb)) };
                let qx = match kind {
                    Kind::Q4_1 => qx,
                    Kind::Q5_0 | Kind::Q8_0 => _mm256_xor_si256(qx, _mm256_set1_epi8(0x80u8 as i8)),
                };
                let at = i * nb + b;
                // SAFETY: `at` is inside the tile (rows fit it).
                unsafe {
                    _mm256_storeu_si256(self.q.as_mut_ptr().add(at * QK) as *mut __m256i, qx)
                };
                (self.d[at], self.m[at]) = (d, m);
            }
        }
    }

    fn row(&self, i: usize) -> Row {
        let at = i * self.nb;
        (
            self.q[at * QK..].as_ptr(),
            self.d[at..].as_ptr(),
            self.m[at..].as_ptr(),
        )
    }
}

/// `dst[m, n] = w[k, m]^T @ x[k, n]` for a prefill-sized `n`: column groups split over the
/// threads, weight rows in tiles of [`TILE_ROWS`].
///
/// # Safety
/// As `super::x86::mul_mat`; the CPU has what [`cpu_has`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn mul_mat(
    d: &sys::ggml_tensor,
    w: &sys::ggml_tensor,
    x: &sys::ggml_tensor,
    kind: Kind,
    ith: usize,
    nth: usize,
) {
    let k = w.ne[0] as usize;
    let m = w.ne[1] as usize;
    let n = x.ne[1] as usize;
    let nb = k / QK;
    let groups = n.div_ceil(GROUP);
    let per = groups.div_ceil(nth);
    let (g0, g1) = ((ith * per).min(groups), ((ith + 1) * per).min(groups));
    if g0 == g1 {
        return;
    }
    let c0 = g0 * GROUP;
    let c1 = (g1 * GROUP).min(n);
    // SAFETY: column c of x holds k contiguous f32 values (checked by `applies`).
    let cols = unsafe {
        Groups::new(kind, nb, c1 - c0, |c| {
            (x.data as *const u8).add((c0 + c) * x.nb[1]) as *const f32
        })
    };
    let out = d.data as *mut f32;
    // SAFETY: rows below m, each nb contiguous blocks; the features are enabled here.
    unsafe {
        product(
            kind,
            m,
            nb,
            |r| (w.data as *const u8).add(r * w.nb[1]),
            &cols,
            c1 - c0,
            // SAFETY: dst is [m, n] f32, contiguous (made by ggml_custom_4d); r < m and the
            // column is below n.
            |r, c, v| *out.add((c0 + c) * m + r) = v,
        )
    }
}

/// Every row below `m` times the `n` columns of `cols`, each value handed to `store(row,
/// column, value)`.
///
/// # Safety
/// Each `row(r)` points at `nb` blocks of the kind; the CPU has what [`cpu_has`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn product(
    kind: Kind,
    m: usize,
    nb: usize,
    row: impl Fn(usize) -> *const u8,
    cols: &Groups,
    n: usize,
    mut store: impl FnMut(usize, usize, f32),
) {
    let mut tile = Unpacked::new(TILE_ROWS, nb);
    for t0 in (0..m).step_by(TILE_ROWS) {
        let rows = (m - t0).min(TILE_ROWS);
        // SAFETY: the caller's contract for rows t0..t0 + rows.
        unsafe { tile.fill(kind, rows, |i| row(t0 + i)) };
        for g in 0..n.div_ceil(GROUP) {
            let width = (n - g * GROUP).min(GROUP);
            let grp = cols.group(g);
            let mut put = |i: usize, v: &[f32; GROUP]| {
                for (j, &v) in v[..width].iter().enumerate() {
                    store(t0 + i, g * GROUP + j, v);
                }
            };
            let mut i = 0;
            while i + 4 <= rows {
                let r = [
                    tile.row(i),
                    tile.row(i + 1),
                    tile.row(i + 2),
                    tile.row(i + 3),
                ];
                // SAFETY: unpacked rows and a group of nb blocks each; features enabled.
                for (di, v) in unsafe { dispatch::<4>(kind, r, nb, grp) }
                    .iter()
                    .enumerate()
                {
                    put(i + di, v);
                }
                i += 4;
            }
            while i < rows {
                // SAFETY: as above, one row.
                let [v] = unsafe { dispatch::<1>(kind, [tile.row(i)], nb, grp) };
                put(i, &v);
                i += 1;
            }
        }
    }
}

/// [`tile`] for a kind known at run time.
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dispatch<const R: usize>(
    kind: Kind,
    rows: [Row; R],
    nb: usize,
    grp: Group,
) -> [[f32; GROUP]; R] {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            Kind::Q4_1 => tile::<R, { Kind::Q4_1 as u8 }>(rows, nb, grp),
            Kind::Q5_0 => tile::<R, { Kind::Q5_0 as u8 }>(rows, nb, grp),
            Kind::Q8_0 => unreachable!("Q8_0 keeps tinyBLAS (Kind::wide)"),
        }
    }
}

/// `R` unpacked weight rows times one group of [`GROUP`] columns, each (row, column) as ggml's
/// one-column dot product for the kind computes it.
///
/// # Safety
/// Each row holds `nb` blocks unpacked by [`Unpacked::fill`] for the kind; the group `nb` blocks
/// laid out by [`Groups`]; the CPU has what [`cpu_has`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
// Indices name the (row, column) of the tile in several arrays at once.
#[allow(clippy::needless_range_loop)]
unsafe fn tile<const R: usize, const KIND: u8>(
    rows: [Row; R],
    nb: usize,
    (q, scale, sum, start): Group,
) -> [[f32; GROUP]; R] {
    let kind = Kind::from_tag(KIND);
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); GROUP]; R];
    let mut summs = [_mm_setzero_ps(); R];
    for b in 0..nb {
        let mut wq = [zero; R];
        let mut dw = [_mm256_setzero_ps(); R];
        for r in 0..R {
            let (rq, rd, _) = rows[r];
            // SAFETY: block b of an unpacked row (the caller's contract).
            unsafe {
                wq[r] = _mm256_loadu_si256(rq.add(b * QK) as *const __m256i);
                dw[r] = _mm256_set1_ps(*rd.add(b));
            }
        }
        let at = b * GROUP;
        for j in 0..GROUP {
            // SAFETY: block b of column j of the group (the caller's contract).
            let (qy, s, init) = unsafe {
                (
                    _mm256_loadu_si256(q.add((at + j) * QK) as *const __m256i),
                    _mm256_set1_ps(*scale.add(at + j)),
                    match kind {
                        Kind::Q4_1 => zero,
                        // -128 times each lane's 4 activations: takes back the weights' offset.
                        _ => _mm256_loadu_si256(start.add((at + j) * 8) as *const __m256i),
                    },
                )
            };
            for r in 0..R {
                let dd = _mm256_mul_ps(dw[r], s);
                let xy = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(init, wq[r], qy));
                acc[r][j] = _mm256_fmadd_ps(dd, xy, acc[r][j]);
            }
        }
        if kind == Kind::Q4_1 {
            // SAFETY: block b's 4 sums of the group (the caller's contract).
            let s = unsafe { _mm_loadu_ps(sum.add(at)) };
            for r in 0..R {
                // SAFETY: block b of an unpacked row.
                let mw = unsafe { _mm_set1_ps(*rows[r].2.add(b)) };
                summs[r] = _mm_fmadd_ps(mw, s, summs[r]);
            }
        }
    }
    let mut out = [[0f32; GROUP]; R];
    for r in 0..R {
        let mut extra = [0f32; GROUP];
        // SAFETY: 4 floats.
        unsafe { _mm_storeu_ps(extra.as_mut_ptr(), summs[r]) };
        for j in 0..GROUP {
            out[r][j] = hsum(acc[r][j]);
            if kind == Kind::Q4_1 {
                out[r][j] += extra[j];
            }
        }
    }
    out
}

/// Whether this kernel computes exactly what this build's ggml does: for each type that takes it
/// (Q4_1, Q5_0: Q8_0 keeps tinyBLAS, so a Q8_0 difference would not turn the kernel off), 7
/// random rows (a group of 4 rows, then single ones) by 9 random columns (two groups, one
/// partial) through the kernel and through ggml's one-column dot product, bit for bit.
///
/// # Safety
/// The CPU has what [`cpu_has`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn agrees_with_ggml() -> bool {
    // SAFETY: idempotent initialisation of ggml's CPU tables.
    unsafe { sys::ggml_cpu_init() };
    let mut next = crate::xorshift(0x9e37_79b9_7f4a_7c15);
    let (nb, rows, n) = (6, 7, 9);
    for kind in [Kind::Q4_1, Kind::Q5_0] {
        let bb = kind.block_bytes();
        let mut w = vec![0u8; rows * nb * bb];
        for blk in w.chunks_mut(bb) {
            for (i, byte) in blk.iter_mut().enumerate() {
                *byte = next() as u8;
                // Finite f16 scale (and Q4_1 minimum): exponent bits 5..=14.
                if i == 1 || (kind == Kind::Q4_1 && i == 3) {
                    *byte = (*byte & 0x83) | (((5 + next() % 10) as u8) << 2);
                }
            }
        }
        let xs: Vec<f32> = (0..n * nb * QK)
            .map(|_| (next() % 4001) as f32 / 1000.0 - 2.0)
            .collect();
        // SAFETY: n columns of nb * QK values each; F16C.
        let cols = unsafe { Groups::new(kind, nb, n, |c| xs[c * nb * QK..].as_ptr()) };
        let mut ours = vec![0f32; rows * n];
        // SAFETY: rows of nb blocks; features enabled.
        unsafe {
            product(
                kind,
                rows,
                nb,
                |r| w[r * nb * bb..].as_ptr(),
                &cols,
                n,
                |r, c, v| ours[c * rows + r] = v,
            )
        };
        let (_, cb, _) = kind.columns();
        let quantize = column_quantizer(kind);
        // SAFETY: ggml returns static traits for every type id.
        let Some(vec_dot) =
            (unsafe { &*sys::ggml_get_type_traits_cpu(kind.weight_type()) }).vec_dot
        else {
            return false;
        };
        for c in 0..n {
            let mut qc = vec![0u8; nb * cb];
            // SAFETY: one column of nb * QK values into room for nb blocks.
            unsafe {
                quantize(
                    xs[c * nb * QK..].as_ptr(),
                    qc.as_mut_ptr() as *mut _,
                    (nb * QK) as i64,
                )
            };
            for r in 0..rows {
                let mut theirs = 0f32;
                // SAFETY: a one-row, one-column product over nb blocks of live buffers.
                unsafe {
                    vec_dot(
                        (nb * QK) as i32,
                        &mut theirs,
                        0,
                        w[r * nb * bb..].as_ptr() as *const _,
                        0,
                        qc.as_ptr() as *const _,
                        0,
                        1,
                    )
                };
                if theirs.to_bits() != ours[c * rows + r].to_bits() {
                    return false;
                }
            }
        }
    }
    true
}
