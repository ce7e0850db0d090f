//! K-quant products of fewer than 8 columns with the numbers ggml's tiled K-quant GEMM gives a
//! column in a wider product.
//!
//! ggml's CPU backend multiplies Q4_K, Q5_K and Q6_K weights (and other K-quant and IQ types) by
//! 8 or more columns with its tiled GEMM (`ggml-cpu/tiled`) and by fewer with a per-element dot
//! product that rounds otherwise. The tiled GEMM gives a column the same numbers at every width
//! from 8 on (`tests/tiled_columns.rs` checks it), so a batch-invariant step could pad its short
//! products to 8 columns, but that multiplies a decode step's K-quant work by 8 (Gemma 3 decodes
//! a fifth slower). This op computes 1 to 7 columns with the tiled GEMM's arithmetic instead:
//! - the columns quantized to Q8_K by ggml's own quantizer, as ggml's product does;
//! - per 256-value block of a weight row and a column, the exact integer sums the tiled kernel
//!   forms (the sub-blocks' products times their scales, and for types with minimums the
//!   minimums times the activation sums);
//! - then its float steps in its order: `r = s1 * d`, `r = r - dmin * s2` fused, and the block's
//!   contribution `r * d_x` added to the row's sum, fused on AVX2 builds, rounded first on
//!   AVX-512 VNNI builds ([`supported`] finds which, once, against ggml itself).
//!
//! So a prefill chunk can take ggml's tiled GEMM at full speed while decode and verify steps pay
//! no more than ggml's dot product, and a row's numbers do not depend on the width of its step.
//! Hand-written because no crate reproduces ggml's kernels; wired in as a ggml custom op.
use crate::{Context, DType, Tensor};
use llama_cpp_sys_2 as sys;
use std::cell::RefCell;
use std::ffi::{c_int, c_void};

/// Columns from which ggml's CPU backend takes its tiled K-quant GEMM.
pub const TILED_COLS: i64 = 8;

/// Values per K-quant block.
const QK: usize = 256;

/// Bytes of a Q8_K block: f32 scale, 256 quants, 16 sums of 16.
const Q8K_BYTES: usize = 4 + QK + 32;

/// The weight types this op covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Q4K,
    Q5K,
    Q6K,
}

impl Kind {
    fn of(t: DType) -> Option<Kind> {
        match t.raw() {
            sys::GGML_TYPE_Q4_K => Some(Kind::Q4K),
            sys::GGML_TYPE_Q5_K => Some(Kind::Q5K),
            sys::GGML_TYPE_Q6_K => Some(Kind::Q6K),
            _ => None,
        }
    }

    const fn block_bytes(self) -> usize {
        match self {
            Kind::Q4K => 144,
            Kind::Q5K => 176,
            Kind::Q6K => 210,
        }
    }
}

/// How the tiled kernel adds a block's contribution to a row's sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accumulate {
    /// `sum = fma(r, d_x, sum)` (its AVX2 kernel).
    Fused,
    /// `sum = sum + round(r * d_x)` (its AVX-512 VNNI kernel).
    Rounded,
}

/// How this build's tiled kernel accumulates, if this op reproduces it (checked once per process
/// on random blocks of every covered type against ggml's own 8-column product).
fn accumulate() -> Option<Accumulate> {
    static FOUND: std::sync::OnceLock<Option<Accumulate>> = std::sync::OnceLock::new();
    *FOUND.get_or_init(|| {
        [Accumulate::Fused, Accumulate::Rounded]
            .into_iter()
            .find(|&a| probe::agrees_with_ggml(a).unwrap_or(false))
    })
}

/// Whether this op reproduces this build's tiled K-quant GEMM.
pub fn supported() -> bool {
    accumulate().is_some()
}

/// Whether products with weight `w` can go through [`Context::mul_mat_tiled_columns`] below 8
/// columns: Q4_K, Q5_K or Q6_K, one matrix in plain host memory, and [`supported`]. (Where this
/// holds, a batch-invariant step sends every narrow product of `w` there and every wide one to
/// ggml; elsewhere it keeps one arithmetic some other way.)
pub fn covers(w: Tensor<'_>) -> bool {
    let [k, m, w2, w3] = w.ne();
    Kind::of(w.dtype()).is_some_and(|kind| w.nb()[0] == kind.block_bytes())
        && k % QK as i64 == 0
        && m > 0
        && [w2, w3] == [1, 1]
        && w.is_plain_host()
        && supported()
}

/// Whether `w @ x` can go through [`Context::mul_mat_tiled_columns`]: [`covers`] `w`, and `x`
/// holds 1 to 7 f32 columns (each contiguous) of `w`'s length, no batch dimensions.
pub fn applies(w: Tensor<'_>, x: Tensor<'_>) -> bool {
    let [xk, n, x2, x3] = x.ne();
    x.dtype() == DType::F32
        && xk == w.ne()[0]
        && [x2, x3] == [1, 1]
        && (1..TILED_COLS).contains(&n)
        && x.nb()[0] == 4
        && covers(w)
}

impl Context {
    /// `w^T @ x` for a K-quant weight and 1 to 7 columns, each column's numbers those of ggml's
    /// tiled GEMM in a product of 8 or more columns (see [`crate::tiled_columns`]). `None` where
    /// [`applies`] does not hold.
    pub fn mul_mat_tiled_columns<'a>(&'a self, w: Tensor<'a>, x: Tensor<'a>) -> Option<Tensor<'a>> {
        applies(w, x).then(|| self.tiled_columns_op(w, x, accumulate()))
    }

    fn tiled_columns_op<'a>(
        &'a self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        acc: Option<Accumulate>,
    ) -> Tensor<'a> {
        let word = usize::from(acc == Some(Accumulate::Rounded)) as *mut c_void;
        // SAFETY: live tensors whose types and shapes `applies` checked; the op reads them
        // through their strides; the user-data word is a flag, never dereferenced.
        unsafe { self.custom_f32([w.ne()[1], x.ne()[1], 1, 1], &[w, x], op, word) }
    }
}

thread_local! {
    /// Each thread's quantized columns (Q8_K blocks).
    static COLUMNS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The op's body: every thread quantizes the columns (a small share of the work) and computes a
/// contiguous range of the weight's rows for all of them.
///
/// # Safety
/// Called by ggml's CPU backend with `dst` built by [`Context::tiled_columns_op`].
unsafe extern "C" fn op(dst: *mut sys::ggml_tensor, ith: c_int, nth: c_int, word: *mut c_void) {
    // SAFETY: the node's two sources, live while the graph runs.
    let (w, x) = unsafe { (&*(*dst).src[0], &*(*dst).src[1]) };
    let rounded = word as usize == 1;
    let Some(kind) = Kind::of(DType(w.type_)) else {
        unreachable!("the op is built for covered weight types only")
    };
    let (k, m, n) = (w.ne[0] as usize, w.ne[1] as usize, x.ne[1] as usize);
    let nb = k / QK;
    let (ith, nth) = (ith.max(0) as usize, nth.max(1) as usize);
    let (r0, r1) = (m * ith / nth, m * (ith + 1) / nth);
    if r0 >= r1 {
        return;
    }
    // SAFETY: ggml returns static traits for every type id.
    let traits = unsafe { &*sys::ggml_get_type_traits_cpu(sys::GGML_TYPE_Q8_K) };
    let Some(quantize) = traits.from_float else {
        unreachable!("ggml's CPU traits quantize to Q8_K")
    };
    // The op's F32 output [m, n], contiguous; each thread writes its own rows of every column
    // (through the pointer: the threads' shares interleave, so none holds a slice of it).
    // SAFETY: dst is the live node being computed.
    let out = unsafe { (*dst).data } as *mut f32;
    COLUMNS.with_borrow_mut(|cols| {
        cols.resize(n * nb * Q8K_BYTES, 0);
        for c in 0..n {
            // SAFETY: column c holds k f32 values; its Q8_K blocks fit nb * Q8K_BYTES bytes.
            unsafe {
                quantize(
                    (x.data as *const u8).add(c * x.nb[1]) as *const f32,
                    cols[c * nb * Q8K_BYTES..].as_mut_ptr() as *mut c_void,
                    k as i64,
                )
            };
        }
        let mut wq = [0i8; QK];
        let simd = x86::available();
        let bb = kind.block_bytes();
        for r in r0..r1 {
            let mut sums = [0f32; TILED_COLS as usize];
            // SAFETY: row r's nb blocks lie within the weight's data.
            let row = unsafe {
                std::slice::from_raw_parts((w.data as *const u8).add(r * w.nb[1]), nb * bb)
            };
            if simd {
                // SAFETY: AVX2 is available; the row holds nb blocks and `cols` n columns of nb
                // Q8_K blocks each.
                unsafe { x86::row(kind, row, cols, n, rounded, &mut sums[..n]) };
            } else {
                for (b, blk) in row.chunks_exact(bb).enumerate() {
                    let block = Block::unpack(kind, blk, &mut wq);
                    for (c, sum) in sums.iter_mut().enumerate().take(n) {
                        let xb = &cols[(c * nb + b) * Q8K_BYTES..(c * nb + b + 1) * Q8K_BYTES];
                        let part = block.dot(&wq, xb);
                        *sum = accumulate_block(*sum, part, xb, rounded);
                    }
                }
            }
            for (c, &sum) in sums.iter().enumerate().take(n) {
                // SAFETY: c < n and r < m: inside the output, in this thread's rows.
                unsafe { *out.add(c * m + r) = sum };
            }
        }
    });
}

/// One weight block, unpacked: its quants (into the caller's buffer, as signed values), the
/// scale and minimum of each sub-block, and the block's f32 scales.
struct Block {
    kind: Kind,
    d: f32,
    dmin: f32,
    scales: [i32; 16],
    mins: [i32; 8],
}

fn f16(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

impl Block {
    fn unpack(kind: Kind, b: &[u8], q: &mut [i8; QK]) -> Block {
        match kind {
            Kind::Q4K | Kind::Q5K => {
                let (qh, qs) = if kind == Kind::Q5K {
                    (Some(&b[16..48]), &b[48..176])
                } else {
                    (None, &b[16..144])
                };
                for j in 0..4 {
                    for l in 0..32 {
                        let byte = qs[32 * j + l];
                        let (mut lo, mut hi) = (byte & 0xf, byte >> 4);
                        if let Some(qh) = qh {
                            lo |= ((qh[l] >> (2 * j)) & 1) << 4;
                            hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
                        }
                        q[64 * j + l] = lo as i8;
                        q[64 * j + 32 + l] = hi as i8;
                    }
                }
            }
            Kind::Q6K => {
                let (ql, qh) = (&b[0..128], &b[128..192]);
                for n in 0..2 {
                    let (ql, qh) = (&ql[64 * n..], &qh[32 * n..]);
                    for l in 0..32 {
                        let y = 128 * n + l;
                        q[y] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
                        q[y + 32] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                        q[y + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                        q[y + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                    }
                }
            }
        }
        header(kind, b)
    }

    /// This block's contribution before the column's scale: `s1 * d`, less `dmin * s2` (fused)
    /// for types with minimums, from the exact integer sums over the block.
    fn dot(&self, q: &[i8; QK], xb: &[u8]) -> f32 {
        let xq = &xb[4..4 + QK];
        let sub = if self.kind == Kind::Q6K { 16 } else { 32 };
        let mut s1 = 0i32;
        for (s, (w, x)) in q.chunks_exact(sub).zip(xq.chunks_exact(sub)).enumerate() {
            let raw: i32 = w
                .iter()
                .zip(x)
                .map(|(&a, &b)| i32::from(a) * i32::from(b as i8))
                .sum();
            s1 += self.scales[s] * raw;
        }
        self.finish(s1, xb)
    }

    /// The tiled kernel's float steps from the block's integer sum `s1`, with the minimums'
    /// sum `s2` formed here from the column's 16-value sums for types that have minimums.
    fn finish(&self, s1: i32, xb: &[u8]) -> f32 {
        let s2: i32 = (0..8)
            .map(|s| self.mins[s] * (bsum(xb, 2 * s) + bsum(xb, 2 * s + 1)))
            .sum();
        self.float_steps(s1, s2)
    }

    /// `s1 * d`, less `dmin * s2` (fused) for types with minimums: the tiled kernel's order.
    fn float_steps(&self, s1: i32, s2: i32) -> f32 {
        let r = s1 as f32 * self.d;
        if self.kind == Kind::Q6K {
            return r;
        }
        (-self.dmin).mul_add(s2 as f32, r)
    }
}

/// Sum `i` of 16 activations of a Q8_K block (ggml's `bsums`).
fn bsum(xb: &[u8], i: usize) -> i32 {
    i32::from(i16::from_le_bytes([xb[4 + QK + 2 * i], xb[5 + QK + 2 * i]]))
}

/// A row's running sum plus a block's contribution `part` times the column block's scale, as
/// the tiled kernel adds it.
fn accumulate_block(sum: f32, part: f32, xb: &[u8], rounded: bool) -> f32 {
    let d_x = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
    if rounded {
        sum + part * d_x
    } else {
        part.mul_add(d_x, sum)
    }
}

/// The scales and minimums of a block (its quants left packed), for the vector path.
fn header(kind: Kind, b: &[u8]) -> Block {
    let mut scales = [0i32; 16];
    let mut mins = [0i32; 8];
    match kind {
        Kind::Q4K | Kind::Q5K => {
            let sc = &b[4..16];
            for j in 0..8 {
                let (s, m) = if j < 4 {
                    (sc[j] & 63, sc[j + 4] & 63)
                } else {
                    (
                        (sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4),
                        (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
                    )
                };
                scales[j] = i32::from(s);
                mins[j] = i32::from(m);
            }
            Block {
                kind,
                d: f16(b, 0),
                dmin: f16(b, 2),
                scales,
                mins,
            }
        }
        Kind::Q6K => {
            for (s, &v) in scales.iter_mut().zip(&b[192..208]) {
                *s = i32::from(v as i8);
            }
            Block {
                kind,
                d: f16(b, 208),
                dmin: 0.0,
                scales,
                mins,
            }
        }
    }
}

mod x86 {
    //! The integer sums with AVX2: a block's quants unpacked once into eight vectors of 32
    //! unsigned values, then for each column `maddubs` products, times each sub-block's scale by
    //! `madd`, summed in 32-bit lanes (exact: any order gives the same integers).
    use super::{accumulate_block, header, Kind, Q8K_BYTES, QK};

    /// Whether this CPU runs [`row`].
    pub(super) fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx2")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// One weight row (`row`: its blocks) times each of `sums.len()` quantized columns (`cols`:
    /// each column's Q8_K blocks one after another), into `sums`.
    ///
    /// # Safety
    /// [`available`].
    pub(super) unsafe fn row(
        kind: Kind,
        row: &[u8],
        cols: &[u8],
        n: usize,
        rounded: bool,
        sums: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's contract.
        unsafe {
            avx2(kind, row, cols, n, rounded, sums)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (kind, row, cols, n, rounded, sums);
            unreachable!("x86::available is false off x86-64")
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn avx2(kind: Kind, row: &[u8], cols: &[u8], n: usize, rounded: bool, sums: &mut [f32]) {
        use std::arch::x86_64::*;
        let bb = kind.block_bytes();
        let nb = row.len() / bb;
        assert!(row.len() == nb * bb && cols.len() >= n * nb * Q8K_BYTES && sums.len() == n);
        let load = |p: &[u8], at: usize| {
            assert!(at + 32 <= p.len());
            // SAFETY: 32 bytes at `at` (asserted).
            unsafe { _mm256_loadu_si256(p.as_ptr().add(at) as *const __m256i) }
        };
        let hsum = |v: __m256i| {
            let h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0x4e>(h));
            let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0xb1>(h));
            _mm_cvtsi128_si32(h)
        };
        let low = _mm256_set1_epi8(0x0f);
        for (bi, b) in row.chunks_exact(bb).enumerate() {
            let block = header(kind, b);
            let mut w = [_mm256_setzero_si256(); 8];
            // Each vector's scales as 16-bit lanes (Q6_K: two sub-blocks of 16 per vector).
            let mut sc = [_mm256_setzero_si256(); 8];
            match kind {
                Kind::Q4K | Kind::Q5K => {
                    let qs_at = if kind == Kind::Q5K { 48 } else { 16 };
                    let qh = (kind == Kind::Q5K).then(|| load(b, 16));
                    for j in 0..4 {
                        let v = load(b, qs_at + 32 * j);
                        let mut lo = _mm256_and_si256(v, low);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                        if let Some(qh) = qh {
                            let bit = |k: usize| {
                                let m = _mm256_set1_epi8(1 << k);
                                let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m);
                                _mm256_and_si256(set, _mm256_set1_epi8(0x10))
                            };
                            lo = _mm256_or_si256(lo, bit(2 * j));
                            hi = _mm256_or_si256(hi, bit(2 * j + 1));
                        }
                        w[2 * j] = lo;
                        w[2 * j + 1] = hi;
                    }
                    for (v, s) in sc.iter_mut().enumerate() {
                        *s = _mm256_set1_epi16(block.scales[v] as i16);
                    }
                }
                Kind::Q6K => {
                    let three = _mm256_set1_epi8(3);
                    for h in 0..2 {
                        let ql0 = load(b, 64 * h);
                        let ql1 = load(b, 64 * h + 32);
                        let qh = load(b, 128 + 32 * h);
                        let top = |v: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(v, three));
                        // Unsigned 0..63 (the quant plus 32).
                        w[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, low), top(qh));
                        w[4 * h + 1] = _mm256_or_si256(
                            _mm256_and_si256(ql1, low),
                            top(_mm256_srli_epi16::<2>(qh)),
                        );
                        w[4 * h + 2] = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low),
                            top(_mm256_srli_epi16::<4>(qh)),
                        );
                        w[4 * h + 3] = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low),
                            top(_mm256_srli_epi16::<6>(qh)),
                        );
                    }
                    for (v, s) in sc.iter_mut().enumerate() {
                        *s = _mm256_set_m128i(
                            _mm_set1_epi16(block.scales[2 * v + 1] as i16),
                            _mm_set1_epi16(block.scales[2 * v] as i16),
                        );
                    }
                }
            }
            // The 16-value activation sums times what each of them carries: the minimums (Q4_K,
            // Q5_K: one per 32 values, so each twice) or 32 times the scales (Q6_K: the quants
            // were stored plus 32).
            let per16: [i16; 16] = std::array::from_fn(|i| match kind {
                Kind::Q6K => (32 * block.scales[i]) as i16,
                _ => block.mins[i / 2] as i16,
            });
            // SAFETY: 16 i16 values.
            let per16 = unsafe { _mm256_loadu_si256(per16.as_ptr() as *const __m256i) };
            for (c, sum) in sums.iter_mut().enumerate() {
                let at = (c * nb + bi) * Q8K_BYTES;
                let xb = &cols[at..at + Q8K_BYTES];
                let mut acc = _mm256_setzero_si256();
                for v in 0..8 {
                    let p = _mm256_maddubs_epi16(w[v], load(xb, 4 + 32 * v));
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc[v]));
                }
                let carried = hsum(_mm256_madd_epi16(load(xb, 4 + QK), per16));
                let (s1, s2) = match kind {
                    Kind::Q6K => (hsum(acc) - carried, 0),
                    _ => (hsum(acc), carried),
                };
                *sum = accumulate_block(*sum, block.float_steps(s1, s2), xb, rounded);
            }
        }
    }
}

mod probe {
    //! Runs ggml's 8-column tiled product and [`super::op`] on the same random blocks.
    use super::{Accumulate, Kind, QK};
    use crate::{Backend, BufferType, Context, DType, GraphScheduler, TensorStore};
    use llama_cpp_sys_2 as sys;

    pub(super) fn agrees_with_ggml(acc: Accumulate) -> crate::Result<bool> {
        let mut next = crate::xorshift(0x2545_f491_4f6c_dd1d);
        let (k, m, n) = (2 * QK as i64, 48i64, 8i64);
        for (kind, id) in [
            (Kind::Q4K, sys::GGML_TYPE_Q4_K),
            (Kind::Q5K, sys::GGML_TYPE_Q5_K),
            (Kind::Q6K, sys::GGML_TYPE_Q6_K),
        ] {
            let dtype = DType(id);
            let store = TensorStore::zeroed(BufferType::cpu(), &[("w".into(), dtype, vec![k, m])])?;
            let Some(w) = store.get("w") else {
                return Ok(false);
            };
            let bb = kind.block_bytes();
            let mut bytes = vec![0u8; (k / QK as i64 * m) as usize * bb];
            for blk in bytes.chunks_mut(bb) {
                for byte in blk.iter_mut() {
                    *byte = next() as u8;
                }
                // Finite f16 scales of moderate size where the type keeps them.
                let at: &[usize] = if kind == Kind::Q6K { &[208] } else { &[0, 2] };
                for &i in at {
                    blk[i] = next() as u8;
                    blk[i + 1] = (((5 + next() % 8) as u8) << 2) | (next() as u8 & 0x03);
                }
            }
            w.t().write_bytes_at(0, &bytes)?;
            let ctx = Context::new(16, 16)?;
            let x = ctx.input(DType::F32, &[k, n], "x");
            let theirs = ctx.mul_mat(w.t(), x).as_output();
            let first = ctx.view(x, &[k, 3], &[x.nb()[1]], 0);
            let ours = ctx.tiled_columns_op(w.t(), first, Some(acc)).as_output();
            let mut g = ctx.graph(16);
            g.expand(theirs);
            g.expand(ours);
            let mut sched = GraphScheduler::new(vec![Backend::cpu(2)?], 16)?;
            sched.alloc(0, &mut g)?;
            let xs: Vec<f32> = (0..k * n)
                .map(|_| (next() % 4001) as f32 / 1000.0 - 2.0)
                .collect();
            x.write(&xs)?;
            sched.compute(0, &mut g)?;
            let (mut a, mut b) = (Vec::<f32>::new(), Vec::<f32>::new());
            theirs.read(&mut a)?;
            ours.read(&mut b)?;
            let same = b.len() == (3 * m) as usize
                && a.iter().any(|v| *v != 0.0)
                && a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
            if !same {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
