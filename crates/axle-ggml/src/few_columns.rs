//! Matrix products with a few columns (speculative verify steps, small batches) that unpack each
//! weight block once for all columns, for the quantized types where ggml's CPU backend does more
//! work per column.
//!
//! On x86-64 ggml multiplies Q4_1 weights by several columns one column at a time, redoing the
//! nibble unpacking and block scales for each; llamafile's tinyBLAS covers Q8_0 and Q5_0 from two
//! columns on, but with tiles that cost a 4-column product of Gemma 3's 262,144-row Q8_0 output
//! head about 2.8 one-column products. Here each thread streams its share of the weight rows once,
//! unpacks each block once and multiplies it into up to 4 columns.
//!
//! Each column's result is bit-identical to ggml's one-column dot product for the type
//! (`ggml_vec_dot_q4_1_q8_1`, `ggml_vec_dot_q8_0_q8_0`, `ggml_vec_dot_q5_0_q8_0`, AVX2): the
//! activations are quantized by ggml's own quantizer (from its CPU type traits), integer parts
//! are exact, and each column repeats that function's float operations in the same order
//! (lane-wise FMA of `d_w * d_x` times the integer block sum, for Q4_1 a scalar FMA of
//! `m_w * s_x`, the same horizontal sum). So a row's logits do not depend on how many other rows
//! share its step: the batch invariance the engine needs is kept, and `tests/few_columns.rs`
//! checks it against ggml itself. Since ggml picks its one-column kernels at compile time (and
//! the Q4_1 FMA comes from the C compiler contracting `summs += m * s`), [`supported`] also
//! checks at run time, once, that this build's ggml gives bit-identical results, and turns the
//! kernel off otherwise.
//!
//! Past [`MAX_COLUMNS`] columns (prefill), Q4_1 and Q5_0 products go through a tiled kernel of
//! the same arithmetic on CPUs with AVX-512 VNNI ([`wide`]): there ggml still multiplies Q4_1
//! one (row, column) at a time (70% of a SmolLM2 prefill), and gives Q5_0 (47% of a Gemma 3
//! prefill) to llamafile's tinyBLAS, which the tiled kernel outruns by 12-20%.
//!
//! Hand-written because no crate provides ggml-compatible quantized kernels; it is wired in as a
//! ggml custom op, so graphs, threads and memory stay ggml's.
use crate::{DType, Tensor};
use llama_cpp_sys_2 as sys;
use std::os::raw::{c_int, c_void};

/// Most columns a product may have to go through the few-column kernel: beyond that,
/// prefill-sized products take the tiled kernel ([`wide_supported`]; Q4_1, Q5_0) or keep ggml's
/// kernel (whose per-column numbers are the same).
pub const MAX_COLUMNS: i64 = 32;

const QK: usize = 32;

/// The weight types the kernel covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    /// `block_q4_1`: f16 scale, f16 minimum, 16 bytes of nibbles (20 bytes); columns in Q8_1.
    Q4_1 = 0,
    /// `block_q5_0`: f16 scale, 4 bytes of fifth bits, 16 bytes of nibbles (22); columns in Q8_0.
    Q5_0 = 1,
    /// `block_q8_0`: f16 scale, 32 signed bytes (34); columns in Q8_0.
    Q8_0 = 2,
}

impl Kind {
    fn of(t: DType) -> Option<Kind> {
        match t.0 {
            sys::GGML_TYPE_Q4_1 => Some(Kind::Q4_1),
            sys::GGML_TYPE_Q5_0 => Some(Kind::Q5_0),
            sys::GGML_TYPE_Q8_0 => Some(Kind::Q8_0),
            _ => None,
        }
    }

    /// ggml's id of the weight type (the inverse of [`Kind::of`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn weight_type(self) -> sys::ggml_type {
        match self {
            Kind::Q4_1 => sys::GGML_TYPE_Q4_1,
            Kind::Q5_0 => sys::GGML_TYPE_Q5_0,
            Kind::Q8_0 => sys::GGML_TYPE_Q8_0,
        }
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const fn from_tag(tag: u8) -> Kind {
        match tag {
            0 => Kind::Q4_1,
            1 => Kind::Q5_0,
            _ => Kind::Q8_0,
        }
    }

    /// Whether products of more than [`MAX_COLUMNS`] columns take [`wide`]'s kernel: the types
    /// where `examples/block_products.rs` measured it faster than ggml's product at 512 columns
    /// (Q4_1, which ggml multiplies one (row, column) at a time; Q5_0, which ggml gives to
    /// llamafile's tinyBLAS). Q8_0 keeps tinyBLAS, which the kernel does not beat
    /// (docs/performance.md has the figures).
    fn wide(self) -> bool {
        matches!(self, Kind::Q4_1 | Kind::Q5_0)
    }

    const fn block_bytes(self) -> usize {
        match self {
            Kind::Q4_1 => 20,
            Kind::Q5_0 => 22,
            Kind::Q8_0 => 34,
        }
    }

    /// ggml's type for the quantized columns (its `vec_dot_type`), its block size, and where the
    /// 32 quants start in a block (after the f16 scale, and for Q8_1 the f16 scaled sum).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const fn columns(self) -> (sys::ggml_type, usize, usize) {
        match self {
            Kind::Q4_1 => (sys::GGML_TYPE_Q8_1, 36, 4),
            Kind::Q5_0 | Kind::Q8_0 => (sys::GGML_TYPE_Q8_0, 34, 2),
        }
    }
}

/// Whether the kernel runs here and agrees with this build's ggml: the CPU has AVX2, FMA and F16C,
/// ggml was compiled for them (its one-column kernels are chosen at compile time), and a product
/// of random blocks through both gives bit-identical results for every covered type (checked
/// once per process). Otherwise products keep ggml's kernels.
pub fn supported() -> bool {
    static AGREES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AGREES.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let cpu = std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c");
            // SAFETY: ggml's compile-time feature queries, no state.
            let built = unsafe {
                sys::ggml_cpu_has_avx2() != 0
                    && sys::ggml_cpu_has_fma() != 0
                    && sys::ggml_cpu_has_f16c() != 0
            };
            // SAFETY: the CPU features were checked just before.
            cpu && built && unsafe { x86::agrees_with_ggml() }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether products of more than [`MAX_COLUMNS`] columns (prefill) go through the tiled kernel
/// of [`wide`]: the CPU has AVX-512 VNNI and the kernel gives this build's ggml's bits (checked
/// once per process). Otherwise they keep ggml's kernels.
pub fn wide_supported() -> bool {
    static AGREES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AGREES.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the CPU features were checked just before.
            supported() && wide::cpu_has() && unsafe { wide::agrees_with_ggml() }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether `w @ x` can go through [`op`]: Q4_1, Q5_0 or Q8_0 weights in plain host memory, 2 to
/// `MAX_COLUMNS` contiguous f32 columns (or more, where [`wide_supported`]), no batch dimensions,
/// and a CPU that runs the kernel.
pub fn applies(w: Tensor<'_>, x: Tensor<'_>) -> bool {
    let [k, m, w2, w3] = w.ne();
    let [xk, n, x2, x3] = x.ne();
    let Some(kind) = Kind::of(w.dtype()) else {
        return false;
    };
    x.dtype() == DType::F32
        && k == xk
        && k % QK as i64 == 0
        && m > 0
        && [w2, w3, x2, x3] == [1, 1, 1, 1]
        && ((2..=MAX_COLUMNS).contains(&n) || (n > MAX_COLUMNS && kind.wide() && wide_supported()))
        && w.nb()[0] == kind.block_bytes()
        && x.nb()[0] == 4
        && x.nb()[1] == 4 * k as usize
        && w.is_plain_host()
        && supported()
}

/// The custom op's body: `dst[m, n] = w[k, m]^T @ x[k, n]`, rows of `w` split over the threads.
///
/// # Safety
/// Called by ggml's CPU backend with `dst` built by `Context::mul_mat_few` (src 0: weights of a
/// covered type, src 1: contiguous f32 activations, both in host memory, shapes checked by [`applies`]).
pub(crate) unsafe extern "C" fn op(
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    _userdata: *mut c_void,
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract above; `applies` checked the CPU features.
    unsafe {
        x86::mul_mat(dst, ith as usize, nth.max(1) as usize)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, ith, nth);
        unreachable!("few_columns::applies is false off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
mod wide;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Kind, QK};
    use crate::DType;
    use llama_cpp_sys_2 as sys;
    use std::arch::x86_64::*;

    /// One quantized activation column: its blocks, and each block's scale (and, for Q8_1,
    /// scaled sum) as f32.
    #[derive(Clone, Copy)]
    struct Column<'a> {
        q: *const u8,
        scale: &'a [f32],
        sum: &'a [f32],
    }

    /// Activation columns quantized by ggml's own quantizer (what its mul_mat does), with each
    /// block's scale (and, for Q8_1, scaled sum) taken as f32 once.
    struct Quantized {
        q: Vec<u8>,
        scale: Vec<f32>,
        sum: Vec<f32>,
        nb: usize,
        block: usize,
    }

    /// ggml's quantizer for the kind's column type (its `vec_dot_type`'s `from_float`, what its
    /// mul_mat quantizes activations with).
    pub(super) fn column_quantizer(
        kind: Kind,
    ) -> unsafe extern "C" fn(*const f32, *mut std::os::raw::c_void, i64) {
        let (col_type, _, _) = kind.columns();
        // SAFETY: ggml returns static traits for every type id.
        let traits = unsafe { &*sys::ggml_get_type_traits_cpu(col_type) };
        let Some(quantize) = traits.from_float else {
            unreachable!("ggml's CPU traits quantize to Q8_0 and Q8_1")
        };
        quantize
    }

    /// A quantized column block's scale and (Q8_1, for Q4_1 weights) scaled sum as f32; the sum
    /// is 0 for Q8_0 columns.
    ///
    /// # Safety
    /// The CPU has F16C.
    #[target_feature(enable = "f16c")]
    pub(super) unsafe fn scale_and_sum(kind: Kind, blk: &[u8]) -> (f32, f32) {
        let d = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
        let s = match kind {
            Kind::Q4_1 => f16_to_f32(u16::from_le_bytes([blk[2], blk[3]])),
            Kind::Q5_0 | Kind::Q8_0 => 0.0,
        };
        (d, s)
    }

    impl Quantized {
        /// # Safety
        /// `src(c)` points at `nb * QK` readable f32 values for every `c < n`; the CPU has F16C.
        unsafe fn new(kind: Kind, nb: usize, n: usize, src: impl Fn(usize) -> *const f32) -> Self {
            let (_, block, _) = kind.columns();
            let quantize = column_quantizer(kind);
            let mut q = vec![0u8; n * nb * block];
            let mut scale = vec![0f32; n * nb];
            let mut sum = vec![0f32; n * nb];
            for c in 0..n {
                let col = &mut q[c * nb * block..(c + 1) * nb * block];
                // SAFETY: the caller's contract for src(c); col has room for nb blocks.
                unsafe { quantize(src(c), col.as_mut_ptr() as *mut _, (nb * QK) as i64) };
                for b in 0..nb {
                    // SAFETY: F16C (the caller's contract).
                    let (d, s) = unsafe { scale_and_sum(kind, &col[b * block..]) };
                    scale[c * nb + b] = d;
                    sum[c * nb + b] = s;
                }
            }
            Quantized {
                q,
                scale,
                sum,
                nb,
                block,
            }
        }

        fn column(&self, c: usize) -> Column<'_> {
            let nb = self.nb;
            Column {
                q: self.q[c * nb * self.block..].as_ptr(),
                scale: &self.scale[c * nb..(c + 1) * nb],
                sum: &self.sum[c * nb..(c + 1) * nb],
            }
        }
    }

    /// Whether this build's ggml computes exactly what [`row_dot`] does: for each covered type, a
    /// product of random blocks with 4 random columns through ggml's own one-column dot product
    /// (from its CPU type traits) and through [`row_dot`], compared bit for bit. This catches a
    /// ggml built without AVX2/FMA (when `RUSTFLAGS` overrides the workspace's target CPU) or by a
    /// compiler that does not fuse Q4_1's `summs += m * s` into an FMA.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    pub(super) unsafe fn agrees_with_ggml() -> bool {
        // SAFETY: idempotent initialisation of ggml's CPU tables (the f16 table its dot
        // products read).
        unsafe { sys::ggml_cpu_init() };
        let mut next = crate::xorshift(0x2545_f491_4f6c_dd1d);
        let nb = 8;
        for kind in [Kind::Q4_1, Kind::Q5_0, Kind::Q8_0] {
            let bb = kind.block_bytes();
            let mut w = vec![0u8; nb * bb];
            for blk in w.chunks_mut(bb) {
                for (i, byte) in blk.iter_mut().enumerate() {
                    *byte = next() as u8;
                    // Finite f16 scale (and Q4_1 minimum): exponent bits 5..=14.
                    if i == 1 || (kind == Kind::Q4_1 && i == 3) {
                        *byte = (*byte & 0x83) | (((5 + next() % 10) as u8) << 2);
                    }
                }
            }
            let xs: Vec<f32> = (0..4 * nb * QK)
                .map(|_| (next() % 4001) as f32 / 1000.0 - 2.0)
                .collect();
            // SAFETY: 4 columns of nb * QK values each; F16C (the caller's contract).
            let cols = unsafe { Quantized::new(kind, nb, 4, |c| xs[c * nb * QK..].as_ptr()) };
            // SAFETY: ggml returns static traits for every type id.
            let traits = unsafe { &*sys::ggml_get_type_traits_cpu(kind.weight_type()) };
            let Some(vec_dot) = traits.vec_dot else {
                return false;
            };
            let mut ours = [0f32; 4];
            let columns: Vec<Column<'_>> = (0..4).map(|c| cols.column(c)).collect();
            // SAFETY: w holds nb blocks; each column nb blocks; the caller's contract.
            unsafe { dot(kind, w.as_ptr(), nb, &columns, &mut ours) };
            for (c, v) in ours.iter().enumerate() {
                let mut theirs = 0f32;
                // SAFETY: a one-row, one-column product over nb blocks of live buffers.
                unsafe {
                    vec_dot(
                        (nb * QK) as i32,
                        &mut theirs,
                        0,
                        w.as_ptr() as *const _,
                        0,
                        cols.column(c).q as *const _,
                        0,
                        1,
                    )
                };
                if theirs.to_bits() != v.to_bits() {
                    return false;
                }
            }
        }
        true
    }

    /// Row `wrow` times the columns `cs` (1 to 4) into the first `cs.len()` values of `r`, for a
    /// kind known at run time: the one dispatch from [`mul_mat`] and the self-check into the
    /// kernel.
    ///
    /// # Safety
    /// As [`row_dot`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot(kind: Kind, wrow: *const u8, nb: usize, cs: &[Column<'_>], r: &mut [f32; 4]) {
        macro_rules! by_width {
            ($kind:expr) => {
                match *cs {
                    [a] => r[..1].copy_from_slice(&row_dot::<1, { $kind }>(wrow, nb, [a])),
                    [a, b] => r[..2].copy_from_slice(&row_dot::<2, { $kind }>(wrow, nb, [a, b])),
                    [a, b, c] => {
                        r[..3].copy_from_slice(&row_dot::<3, { $kind }>(wrow, nb, [a, b, c]))
                    }
                    [a, b, c, d] => {
                        r.copy_from_slice(&row_dot::<4, { $kind }>(wrow, nb, [a, b, c, d]))
                    }
                    _ => unreachable!("1 to 4 columns at a time"),
                }
            };
        }
        // SAFETY: the caller's contract.
        unsafe {
            match kind {
                Kind::Q4_1 => by_width!(Kind::Q4_1 as u8),
                Kind::Q5_0 => by_width!(Kind::Q5_0 as u8),
                Kind::Q8_0 => by_width!(Kind::Q8_0 as u8),
            }
        }
    }

    /// # Safety
    /// As [`super::op`]; the CPU has AVX2, FMA and F16C.
    pub(super) unsafe fn mul_mat(dst: *mut sys::ggml_tensor, ith: usize, nth: usize) {
        // SAFETY: ggml passes a live tensor whose sources were set when the op was built.
        let (d, w, x) = unsafe { (&*dst, &*(*dst).src[0], &*(*dst).src[1]) };
        let Some(kind) = Kind::of(DType(w.type_)) else {
            unreachable!("`applies` admitted only covered weight types")
        };
        let k = w.ne[0] as usize;
        let m = w.ne[1] as usize;
        let n = x.ne[1] as usize;
        let nb = k / QK;
        if n > super::MAX_COLUMNS as usize {
            // SAFETY: as this function's; `applies` admitted more than MAX_COLUMNS columns only
            // where `wide::cpu_has`.
            unsafe { super::wide::mul_mat(d, w, x, kind, ith, nth) };
            return;
        }
        let rows_per = m.div_ceil(nth);
        let (r0, r1) = ((ith * rows_per).min(m), ((ith + 1) * rows_per).min(m));
        if r0 == r1 {
            return;
        }
        // SAFETY: column c of x holds k contiguous f32 values (checked by `applies`).
        let cols = unsafe {
            Quantized::new(kind, nb, n, |c| {
                (x.data as *const u8).add(c * x.nb[1]) as *const f32
            })
        };
        let columns: Vec<Column<'_>> = (0..n).map(|c| cols.column(c)).collect();
        let out = d.data as *mut f32;
        let mut r = [0f32; 4];
        for row in r0..r1 {
            // SAFETY: row < m; each weight row is nb contiguous blocks.
            let wrow = unsafe { (w.data as *const u8).add(row * w.nb[1]) };
            for (g, cs) in columns.chunks(4).enumerate() {
                // SAFETY: wrow has nb blocks; each Column covers nb blocks; features checked.
                unsafe { dot(kind, wrow, nb, cs, &mut r) };
                for (j, v) in r[..cs.len()].iter().enumerate() {
                    // SAFETY: dst is [m, n] f32, contiguous (made by ggml_custom_4d).
                    unsafe { *out.add((4 * g + j) * m + row) = *v };
                }
            }
        }
    }

    /// An IEEE half to f32 (exact, as ggml's conversion is).
    #[target_feature(enable = "f16c")]
    #[inline]
    pub(super) fn f16_to_f32(h: u16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
    }

    /// ggml's `hsum_float_8`, in its order.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) fn hsum(x: __m256) -> f32 {
        let mut r = _mm256_extractf128_ps(x, 1);
        r = _mm_add_ps(r, _mm256_castps256_ps128(x));
        r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }

    /// ggml's `bytes_from_nibbles_32`: 16 bytes of nibbles to 32 bytes in 0..=15 (low nibbles
    /// first).
    ///
    /// # Safety
    /// `p` points at 16 readable bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
        // SAFETY: caller's contract; unaligned load.
        let tmp = unsafe { _mm_loadu_si128(p as *const __m128i) };
        let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
        _mm256_and_si256(_mm256_set1_epi8(0x0F), bytes)
    }

    /// ggml's `bytes_from_bits_32`: 32 bits to 32 bytes of 0xFF (bit set) or 0.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) fn bits(x32: u32) -> __m256i {
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }

    /// A weight block's scale, minimum (Q4_1; 0 for the others) and 32 quants as bytes: Q4_1's
    /// unsigned (0..=15), Q5_0's and Q8_0's signed, as ggml's dot products unpack them.
    ///
    /// # Safety
    /// `blk` points at one block of `kind`; the CPU has AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(super) unsafe fn weight_block(kind: Kind, blk: *const u8) -> (f32, f32, __m256i) {
        // SAFETY: the caller's contract; unaligned reads.
        let dw = f16_to_f32(unsafe { (blk as *const u16).read_unaligned() });
        match kind {
            Kind::Q4_1 => {
                // SAFETY: as above (m at byte 2, nibbles at byte 4).
                let mw = f16_to_f32(unsafe { (blk.add(2) as *const u16).read_unaligned() });
                (dw, mw, unsafe { nibbles(blk.add(4)) })
            }
            Kind::Q5_0 => {
                // SAFETY: as above (fifth bits at byte 2, nibbles at byte 6).
                let (qh, lo) = unsafe {
                    (
                        (blk.add(2) as *const u32).read_unaligned(),
                        nibbles(blk.add(6)),
                    )
                };
                let hi = _mm256_andnot_si256(bits(qh), _mm256_set1_epi8(0xF0u8 as i8));
                (dw, 0.0, _mm256_or_si256(lo, hi))
            }
            // SAFETY: as above (32 signed bytes at byte 2).
            Kind::Q8_0 => (dw, 0.0, unsafe {
                _mm256_loadu_si256(blk.add(2) as *const __m256i)
            }),
        }
    }

    /// Dot products of one weight row with N quantized columns, each as ggml's one-column dot
    /// product for the type computes it.
    ///
    /// # Safety
    /// `wrow` points at `nb` weight blocks of `kind`; each column's `q` at `nb` blocks of the
    /// column type, with `nb` entries in `scale` (and `sum` for Q4_1).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn row_dot<const N: usize, const KIND: u8>(
        wrow: *const u8,
        nb: usize,
        cols: [Column; N],
    ) -> [f32; N] {
        let kind = Kind::from_tag(KIND);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut summs = [0f32; N];
        let ones = _mm256_set1_epi16(1);
        let bb = kind.block_bytes();
        let (_, cb, qoff) = kind.columns();
        for b in 0..nb {
            // SAFETY: block b of the row (caller's contract); unaligned reads.
            let blk = unsafe { wrow.add(b * bb) };
            // SAFETY: as above.
            let (dw, mw, qx) = unsafe { weight_block(kind, blk) };
            // Q4_1: unsigned weights 0..=15 times signed activations, plus m * s. Q8_0 and Q5_0:
            // signed times signed, through ggml's sign trick (|w| times sign(w) * x).
            let (wx, wsign) = match kind {
                Kind::Q4_1 => (qx, None),
                Kind::Q5_0 | Kind::Q8_0 => (_mm256_sign_epi8(qx, qx), Some(qx)),
            };
            for j in 0..N {
                let c = &cols[j];
                let dd = _mm256_set1_ps(dw * c.scale[b]);
                // SAFETY: block b of column j (caller's contract).
                let qy = unsafe { _mm256_loadu_si256(c.q.add(b * cb + qoff) as *const __m256i) };
                let qy = match wsign {
                    Some(qx) => _mm256_sign_epi8(qy, qx),
                    None => {
                        summs[j] = mw.mul_add(c.sum[b], summs[j]);
                        qy
                    }
                };
                let xy = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(wx, qy)));
                acc[j] = _mm256_fmadd_ps(dd, xy, acc[j]);
            }
        }
        let mut out = [0f32; N];
        for j in 0..N {
            out[j] = hsum(acc[j]);
            if kind == Kind::Q4_1 {
                out[j] += summs[j];
            }
        }
        out
    }
}
