//! Prefill-sized products (more than [`super::MAX_COLUMNS`] columns) on x86-64 CPUs with
//! AVX-512 VNNI, bit-identical to ggml's one-column dot products.
//!
//! ggml's CPU backend multiplies Q4_1 weights by a prompt's columns one (row, column) pair at a
//! time: every call unpacks the row's nibbles, converts its f16 scales and sums its lanes again,
//! over only `k / 32` blocks (18 for SmolLM2's 576-wide rows). That is 70% of a SmolLM2 prefill.
//! This kernel tiles the product instead: a thread takes a contiguous share of the columns
//! (and quantizes only those), lays each group of 4 quantized columns out block by block, and
//! runs 2 weight rows against a group at a time, so each weight block is unpacked once for 4
//! columns and each activation block loaded once for 2 rows.
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
/// block `b`, the 4 columns' 32 quants one after another, their scales as f32, and (Q4_1) their
/// scaled sums as f32. Columns past the last are zero (their results are discarded).
struct Groups {
    q: Vec<u8>,
    scale: Vec<f32>,
    sum: Vec<f32>,
    nb: usize,
}

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
        let mut col = vec![0u8; nb * block];
        for c in 0..n {
            // SAFETY: the caller's contract for src(c); `col` has room for nb blocks.
            unsafe { quantize(src(c), col.as_mut_ptr() as *mut _, (nb * QK) as i64) };
            let (g, j) = (c / GROUP, c % GROUP);
            for b in 0..nb {
                let blk = &col[b * block..(b + 1) * block];
                let at = (g * nb + b) * GROUP + j;
                q[at * QK..(at + 1) * QK].copy_from_slice(&blk[qoff..qoff + QK]);
                // SAFETY: F16C (the caller's contract).
                (scale[at], sum[at]) = unsafe { scale_and_sum(kind, blk) };
            }
        }
        Groups { q, scale, sum, nb }
    }

    /// Group `g`'s quants, scales and sums, from its first block.
    fn group(&self, g: usize) -> (*const u8, *const f32, *const f32) {
        let at = g * self.nb * GROUP;
        (
            self.q[at * QK..].as_ptr(),
            self.scale[at..].as_ptr(),
            self.sum[at..].as_ptr(),
        )
    }
}

/// `dst[m, n] = w[k, m]^T @ x[k, n]` for a prefill-sized `n`: column groups split over the
/// threads, weight rows in tiles of [`TILE_ROWS`], 2 rows by one group at a time.
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
    let row = |r: usize| {
        // SAFETY: r < m; each weight row is nb contiguous blocks.
        unsafe { (w.data as *const u8).add(r * w.nb[1]) }
    };
    for t0 in (0..m).step_by(TILE_ROWS) {
        let t1 = (t0 + TILE_ROWS).min(m);
        for g in 0..g1 - g0 {
            let width = (c1 - c0 - g * GROUP).min(GROUP);
            let store = |r: usize, v: &[f32; GROUP]| {
                for (j, v) in v[..width].iter().enumerate() {
                    // SAFETY: dst is [m, n] f32, contiguous (made by ggml_custom_4d); r < m and
                    // the column is below n.
                    unsafe { *out.add((c0 + g * GROUP + j) * m + r) = *v };
                }
            };
            let grp = cols.group(g);
            let mut r = t0;
            while r + 4 <= t1 {
                // SAFETY: four rows of nb blocks; the group covers nb blocks; features enabled.
                let v = unsafe {
                    dispatch::<4>(kind, [row(r), row(r + 1), row(r + 2), row(r + 3)], nb, grp)
                };
                for (i, v) in v.iter().enumerate() {
                    store(r + i, v);
                }
                r += 4;
            }
            while r + 2 <= t1 {
                // SAFETY: two rows of nb blocks; the group covers nb blocks; features enabled.
                let [a, b] = unsafe { dispatch::<2>(kind, [row(r), row(r + 1)], nb, grp) };
                store(r, &a);
                store(r + 1, &b);
                r += 2;
            }
            if r < t1 {
                // SAFETY: as above, one row.
                let [a] = unsafe { dispatch::<1>(kind, [row(r)], nb, grp) };
                store(r, &a);
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
    rows: [*const u8; R],
    nb: usize,
    grp: (*const u8, *const f32, *const f32),
) -> [[f32; GROUP]; R] {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            Kind::Q4_1 => tile::<R, { Kind::Q4_1 as u8 }>(rows, nb, grp),
            Kind::Q5_0 => tile::<R, { Kind::Q5_0 as u8 }>(rows, nb, grp),
            Kind::Q8_0 => tile::<R, { Kind::Q8_0 as u8 }>(rows, nb, grp),
        }
    }
}

/// `R` weight rows times one group of [`GROUP`] columns, each (row, column) as ggml's one-column
/// dot product for the kind computes it.
///
/// # Safety
/// Each row points at `nb` weight blocks of the kind; the group at `nb` blocks of quants, scales
/// and (Q4_1) sums laid out by [`Groups`]; the CPU has what [`cpu_has`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
// Indices name the (row, column) of the tile in several arrays at once.
#[allow(clippy::needless_range_loop)]
unsafe fn tile<const R: usize, const KIND: u8>(
    rows: [*const u8; R],
    nb: usize,
    (q, scale, sum): (*const u8, *const f32, *const f32),
) -> [[f32; GROUP]; R] {
    let kind = Kind::from_tag(KIND);
    let bb = kind.block_bytes();
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); GROUP]; R];
    let mut summs = [_mm_setzero_ps(); R];
    for b in 0..nb {
        // Each row's block: its scale, and its quants as unsigned bytes with (Q5_0, Q8_0) the
        // lanes whose sign moves to the activation, as ggml's `mul_sum_i8_pairs_float` does.
        let mut dw = [_mm256_setzero_ps(); R];
        let mut mw = [_mm_setzero_ps(); R];
        let mut wq = [zero; R];
        let mut neg = [0u32; R];
        for r in 0..R {
            // SAFETY: block b of row r (the caller's contract); unaligned reads.
            let blk = unsafe { rows[r].add(b * bb) };
            // SAFETY: as above.
            let (d, m, qx) = unsafe { weight_block(kind, blk) };
            dw[r] = _mm256_set1_ps(d);
            match kind {
                Kind::Q4_1 => {
                    mw[r] = _mm_set1_ps(m);
                    wq[r] = qx;
                }
                Kind::Q5_0 | Kind::Q8_0 => {
                    neg[r] = _mm256_movepi8_mask(qx);
                    wq[r] = _mm256_abs_epi8(qx);
                }
            }
        }
        let at = b * GROUP;
        for j in 0..GROUP {
            // SAFETY: block b of column j of the group (the caller's contract).
            let (qy, s) = unsafe {
                (
                    _mm256_loadu_si256(q.add((at + j) * QK) as *const __m256i),
                    _mm256_set1_ps(*scale.add(at + j)),
                )
            };
            for r in 0..R {
                let dd = _mm256_mul_ps(dw[r], s);
                let sy = match kind {
                    Kind::Q4_1 => qy,
                    // ggml's sign(y, x) where x is not 0 (where it is, |x| is 0 and so is the
                    // product).
                    _ => _mm256_mask_sub_epi8(qy, neg[r], zero, qy),
                };
                let xy = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, wq[r], sy));
                acc[r][j] = _mm256_fmadd_ps(dd, xy, acc[r][j]);
            }
        }
        if kind == Kind::Q4_1 {
            // SAFETY: block b's 4 sums of the group (the caller's contract).
            let s = unsafe { _mm_loadu_ps(sum.add(at)) };
            for r in 0..R {
                summs[r] = _mm_fmadd_ps(mw[r], s, summs[r]);
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

/// Whether this kernel computes exactly what this build's ggml does: for each covered type, 3
/// random rows by 9 random columns (two groups, one partial; a pair of rows and a single one)
/// through the kernel's tile and through ggml's one-column dot product, bit for bit.
///
/// # Safety
/// The CPU has what [`cpu_has`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn agrees_with_ggml() -> bool {
    // SAFETY: idempotent initialisation of ggml's CPU tables.
    unsafe { sys::ggml_cpu_init() };
    let mut next = crate::xorshift(0x9e37_79b9_7f4a_7c15);
    let (nb, rows, n) = (6, 3, 9);
    for kind in [Kind::Q4_1, Kind::Q5_0, Kind::Q8_0] {
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
        let (_, cb, _) = kind.columns();
        let quantize = column_quantizer(kind);
        // SAFETY: ggml returns static traits for every type id.
        let Some(vec_dot) =
            (unsafe { &*sys::ggml_get_type_traits_cpu(kind.weight_type()) }).vec_dot
        else {
            return false;
        };
        let row = |r: usize| w[r * nb * bb..].as_ptr();
        for g in 0..n.div_ceil(GROUP) {
            // SAFETY: rows of nb blocks, a group of nb blocks; features enabled.
            let (pair, single) = unsafe {
                (
                    dispatch::<2>(kind, [row(0), row(1)], nb, cols.group(g)),
                    dispatch::<1>(kind, [row(2)], nb, cols.group(g)),
                )
            };
            let ours = [pair[0], pair[1], single[0]];
            for j in 0..GROUP.min(n - g * GROUP) {
                let c = g * GROUP + j;
                let mut qc = vec![0u8; nb * cb];
                // SAFETY: one column of nb * QK values into room for nb blocks.
                unsafe {
                    quantize(
                        xs[c * nb * QK..].as_ptr(),
                        qc.as_mut_ptr() as *mut _,
                        (nb * QK) as i64,
                    )
                };
                for (r, got) in ours.iter().enumerate() {
                    let mut theirs = 0f32;
                    // SAFETY: a one-row, one-column product over nb blocks of live buffers.
                    unsafe {
                        vec_dot(
                            (nb * QK) as i32,
                            &mut theirs,
                            0,
                            row(r) as *const _,
                            0,
                            qc.as_ptr() as *const _,
                            0,
                            1,
                        )
                    };
                    if theirs.to_bits() != got[j].to_bits() {
                        return false;
                    }
                }
            }
        }
    }
    true
}
