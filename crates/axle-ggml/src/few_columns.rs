//! Matrix products with a few columns (speculative verify steps, small batches) that unpack each
//! weight block once for all columns, where ggml's CPU backend redoes the whole dot product per
//! column.
//!
//! ggml has no multi-column kernel for Q4_1 on x86-64 (llamafile's tinyBLAS covers Q4_0, Q5_0 and
//! Q8_0 there), so a product with 4 columns costs about 4 one-column products: the nibble
//! unpacking, the block scale and offset loads are repeated for every column. Here one weight row
//! is read and unpacked once per block and multiplied into up to 4 columns.
//!
//! Each column's result is bit-identical to ggml's one-column `ggml_vec_dot_q4_1_q8_1` (AVX2): the
//! activations are quantized by ggml's own Q8_1 quantizer (from its CPU type traits), and each
//! column repeats that function's float operations in the same order (lane-wise FMA of
//! `d_w * d_x` times the integer block sum, scalar FMA of `m_w * s_x`, the same horizontal sum,
//! then one add). So a row's logits do not depend on how many other rows share its step: the
//! batch invariance the engine needs is kept, and `tests` below check it against ggml itself.
//!
//! Hand-written because no crate provides a ggml-compatible Q4_1 kernel; it is wired in as a
//! ggml custom op, so graphs, threads and memory stay ggml's.
use crate::{DType, Tensor};
use llama_cpp_sys_2 as sys;
use std::os::raw::{c_int, c_void};

/// Most columns a product may have to go through this kernel: beyond that, prefill-sized
/// products keep ggml's kernel (whose per-column numbers are the same).
pub const MAX_COLUMNS: i64 = 32;

const QK: usize = 32;
/// `block_q4_1`: f16 scale, f16 minimum, 16 bytes of nibbles.
const Q4_1_BLOCK: usize = 20;
/// `block_q8_1`: f16 scale, f16 scale * sum, 32 signed bytes.
const Q8_1_BLOCK: usize = 36;

/// Whether this CPU runs the kernel (AVX2, FMA and F16C, as ggml's own path requires).
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether `w @ x` can go through [`op`]: Q4_1 weights in plain host memory, 2 to `MAX_COLUMNS`
/// contiguous f32 columns, no batch dimensions, and a CPU that runs the kernel.
pub fn applies(w: Tensor<'_>, x: Tensor<'_>) -> bool {
    let [k, m, w2, w3] = w.ne();
    let [xk, n, x2, x3] = x.ne();
    w.dtype() == DType::Q4_1
        && x.dtype() == DType::F32
        && k == xk
        && k % QK as i64 == 0
        && m > 0
        && [w2, w3, x2, x3] == [1, 1, 1, 1]
        && (2..=MAX_COLUMNS).contains(&n)
        && w.nb()[0] == Q4_1_BLOCK
        && x.nb()[0] == 4
        && x.nb()[1] == 4 * k as usize
        && w.is_plain_host()
        && supported()
}

/// The custom op's body: `dst[m, n] = w[k, m]^T @ x[k, n]`, rows of `w` split over the threads.
///
/// # Safety
/// Called by ggml's CPU backend with `dst` built by `Context::mul_mat_few` (src 0: Q4_1 weights,
/// src 1: contiguous f32 activations, both in host memory, shapes checked by [`applies`]).
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
mod x86 {
    use super::{Q4_1_BLOCK, Q8_1_BLOCK, QK};
    use llama_cpp_sys_2 as sys;
    use std::arch::x86_64::*;

    /// # Safety
    /// As [`super::op`]; the CPU has AVX2, FMA and F16C.
    pub(super) unsafe fn mul_mat(dst: *mut sys::ggml_tensor, ith: usize, nth: usize) {
        // SAFETY: ggml passes a live tensor whose sources were set when the op was built.
        let (d, w, x) = unsafe { (&*dst, &*(*dst).src[0], &*(*dst).src[1]) };
        let k = w.ne[0] as usize;
        let m = w.ne[1] as usize;
        let n = x.ne[1] as usize;
        let nb = k / QK;
        let rows_per = m.div_ceil(nth);
        let (r0, r1) = ((ith * rows_per).min(m), ((ith + 1) * rows_per).min(m));
        if r0 == r1 {
            return;
        }
        // Quantize the columns with ggml's own Q8_1 quantizer (what its mul_mat does), and take
        // each block's scale and scaled sum as f32 once.
        // SAFETY: ggml returns static traits for every type id.
        let traits = unsafe { &*sys::ggml_get_type_traits_cpu(sys::GGML_TYPE_Q8_1) };
        let Some(quantize) = traits.from_float else {
            unreachable!("ggml's CPU traits quantize to Q8_1")
        };
        let mut q = vec![0u8; n * nb * Q8_1_BLOCK];
        let mut scale = vec![0f32; n * nb];
        let mut sum = vec![0f32; n * nb];
        for c in 0..n {
            // SAFETY: column c of x holds k f32 values (contiguous, checked by `applies`); q has
            // room for nb blocks at this offset.
            unsafe {
                let src = (x.data as *const u8).add(c * x.nb[1]) as *const f32;
                quantize(
                    src,
                    q.as_mut_ptr().add(c * nb * Q8_1_BLOCK) as *mut _,
                    k as i64,
                );
            }
            for b in 0..nb {
                let blk = &q[(c * nb + b) * Q8_1_BLOCK..];
                // SAFETY: F16C is available (checked by `applies`).
                unsafe {
                    scale[c * nb + b] = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                    sum[c * nb + b] = f16_to_f32(u16::from_le_bytes([blk[2], blk[3]]));
                }
            }
        }
        let out = d.data as *mut f32;
        let mut r = [0f32; 4];
        for row in r0..r1 {
            // SAFETY: row < m; each weight row is nb contiguous Q4_1 blocks.
            let wrow = unsafe { (w.data as *const u8).add(row * w.nb[1]) };
            let mut c0 = 0;
            while c0 < n {
                let cols = (n - c0).min(4);
                let at = |j: usize| Column {
                    q: q[(c0 + j) * nb * Q8_1_BLOCK..].as_ptr(),
                    scale: &scale[(c0 + j) * nb..(c0 + j + 1) * nb],
                    sum: &sum[(c0 + j) * nb..(c0 + j + 1) * nb],
                };
                // SAFETY: wrow has nb blocks; each Column covers nb blocks; features checked.
                unsafe {
                    match cols {
                        1 => r[..1].copy_from_slice(&row_dot::<1>(wrow, nb, [at(0)])),
                        2 => r[..2].copy_from_slice(&row_dot::<2>(wrow, nb, [at(0), at(1)])),
                        3 => r[..3].copy_from_slice(&row_dot::<3>(wrow, nb, [at(0), at(1), at(2)])),
                        _ => {
                            r.copy_from_slice(&row_dot::<4>(wrow, nb, [at(0), at(1), at(2), at(3)]))
                        }
                    }
                }
                for (j, v) in r[..cols].iter().enumerate() {
                    // SAFETY: dst is [m, n] f32, contiguous (made by ggml_custom_4d).
                    unsafe { *out.add((c0 + j) * m + row) = *v };
                }
                c0 += cols;
            }
        }
    }

    /// One quantized activation column.
    struct Column<'a> {
        q: *const u8,
        scale: &'a [f32],
        sum: &'a [f32],
    }

    /// An IEEE half to f32 (exact, as ggml's conversion is).
    #[target_feature(enable = "f16c")]
    #[inline]
    fn f16_to_f32(h: u16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
    }

    /// ggml's `hsum_float_8`, in its order.
    #[target_feature(enable = "avx2")]
    fn hsum(x: __m256) -> f32 {
        let mut r = _mm256_extractf128_ps(x, 1);
        r = _mm_add_ps(r, _mm256_castps256_ps128(x));
        r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }

    /// Dot products of one Q4_1 weight row with N Q8_1 columns, each as ggml's
    /// `ggml_vec_dot_q4_1_q8_1` computes it.
    ///
    /// # Safety
    /// `wrow` points at `nb` Q4_1 blocks; each column's `q` at `nb` Q8_1 blocks, with `nb`
    /// entries in `scale` and `sum`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row_dot<const N: usize>(wrow: *const u8, nb: usize, cols: [Column; N]) -> [f32; N] {
        let mut acc = [_mm256_setzero_ps(); N];
        let mut summs = [0f32; N];
        let low = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        for b in 0..nb {
            // SAFETY: block b of the row (caller's contract); unaligned reads.
            let (dw, mw, qx) = unsafe {
                let blk = wrow.add(b * Q4_1_BLOCK);
                let dw = f16_to_f32((blk as *const u16).read_unaligned());
                let mw = f16_to_f32((blk.add(2) as *const u16).read_unaligned());
                let tmp = _mm_loadu_si128(blk.add(4) as *const __m128i);
                let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
                (dw, mw, _mm256_and_si256(low, bytes))
            };
            for j in 0..N {
                let c = &cols[j];
                summs[j] = mw.mul_add(c.sum[b], summs[j]);
                let dd = _mm256_set1_ps(dw * c.scale[b]);
                // SAFETY: block b of column j (caller's contract).
                let qy =
                    unsafe { _mm256_loadu_si256(c.q.add(b * Q8_1_BLOCK + 4) as *const __m256i) };
                let xy = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(qx, qy)));
                acc[j] = _mm256_fmadd_ps(dd, xy, acc[j]);
            }
        }
        let mut out = [0f32; N];
        for j in 0..N {
            out[j] = hsum(acc[j]) + summs[j];
        }
        out
    }
}
