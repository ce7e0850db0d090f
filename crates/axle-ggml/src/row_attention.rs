//! Flash attention for any number of query rows with the arithmetic of ggml's tiled CPU kernel.
//!
//! ggml's CPU flash attention has two kernels. Ops of fewer than 64 query rows take the one-pass
//! kernel (each key in turn: an F16 dot product, an online softmax step, an F16 accumulator);
//! ops of 64 rows or more take the tiled one, which walks the keys in tiles of 64 from the op's
//! first key: F32 dot products (an FMA chain over the head dimension), each tile's softmax by
//! ggml's vector `exp`, and an F32 accumulator updated by FMA. In the tiled kernel a row's numbers
//! depend only on its own query, mask and the keys of its tiles: not on the other rows of its tile
//! (each element of the tile products is its own FMA chain) nor on tiles it cannot see (a tile
//! masked for every row is skipped; one masked for this row adds zero).
//!
//! A decode or verify step has too few rows for the tiled kernel, and padding them to 64 would
//! multiply its attention work by up to 64. This op computes each row (and each head) on its own
//! with the tiled kernel's arithmetic: the same tiles from the op's first key, the same FMA chains,
//! ggml's own softmax function for each tile, and the same rescaling and sink steps, so a row gets
//! the numbers an op of 64 rows or more would give it. A step can then run long prompt chunks
//! through ggml's tiled kernel (libllama's speed) and decode rows through this op, and a position's
//! attention output is the same whichever ran it. [`supported`] checks once, on random data, that
//! this holds bit for bit with this build's ggml before anything uses it.
//!
//! Keys may also be read through a list of cache slots (`ids`), so that a step whose sequences'
//! slots are scattered over the cache need not gather them first.
//!
//! Hand-written because ggml has no kernel with this property and no crate reproduces ggml's; it
//! is wired in as a ggml custom op, so graphs, threads and memory stay ggml's.
use crate::{Context, DType, Tensor};
use llama_cpp_sys_2 as sys;
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ops::Range;

/// Keys per tile of ggml's tiled kernel (`GGML_FA_TILE_KV`).
pub const KV_TILE: usize = 64;

/// Query rows from which ggml's CPU flash attention takes its tiled kernel (`GGML_FA_TILE_Q`).
pub const TILED_ROWS: i64 = 64;

extern "C" {
    /// ggml's CPU softmax step over `n` values (exported by ggml-cpu, declared in its internal
    /// `vec.h`): writes `exp(x - max)` to `y` with ggml's vector `exp` and returns their sum in
    /// double precision, summed in ggml's order. The tiled kernel calls it for every tile.
    fn ggml_vec_soft_max_f32(n: c_int, y: *mut f32, x: *const f32, max: f32) -> f64;
}

/// Whether this op reproduces ggml's tiled kernel here, bit for bit (checked once per process on
/// random data against ggml itself, with and without a logit soft cap and sinks).
pub fn supported() -> bool {
    static AGREES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AGREES.get_or_init(probe::agrees_with_ggml)
}

/// Whether [`Context::flash_attn_rows`] takes these operands: F32 queries, F16 keys and values
/// not in an accelerator's memory, contiguous rows, and a build where [`supported`] holds.
pub fn applies(q: Tensor<'_>, k: Tensor<'_>, v: Tensor<'_>) -> bool {
    q.dtype() == DType::F32
        && k.dtype() == DType::F16
        && v.dtype() == DType::F16
        && !k.is_on_device()
        && !v.is_on_device()
        && q.nb()[0] == 4
        && k.nb()[0] == 2
        && v.nb()[0] == 2
        && supported()
}

/// Scale and soft cap travel in the custom op's user-data word (two f32 bit patterns); it is
/// never dereferenced.
fn pack(scale: f32, softcap: f32) -> *mut c_void {
    ((u64::from(softcap.to_bits()) << 32) | u64::from(scale.to_bits())) as usize as *mut c_void
}

fn unpack(word: *mut c_void) -> (f32, f32) {
    let w = word as usize as u64;
    (f32::from_bits(w as u32), f32::from_bits((w >> 32) as u32))
}

/// The operands of [`Context::flash_attn_rows`]: q [dk, n_q, n_head] (F32), k [dk, n_k,
/// n_head_kv] and v [dv, n_k, n_head_kv] (F16), mask F16 [n_cols, n_q], as for
/// [`Context::flash_attn`]. Without `ids` column `c` of the mask is key `c`; with `ids` (I32
/// [n_cols]) it is key `ids[c]`. `sinks` [n_head] F32 adds one logit per head to each row's
/// softmax (gpt-oss).
#[derive(Debug, Clone, Copy)]
pub struct RowAttention<'a> {
    /// Queries.
    pub q: Tensor<'a>,
    /// Keys.
    pub k: Tensor<'a>,
    /// Values.
    pub v: Tensor<'a>,
    /// 0 where a row may attend to a column, -inf elsewhere.
    pub mask: Tensor<'a>,
    /// The key of each mask column, when not the column itself.
    pub ids: Option<Tensor<'a>>,
    /// One extra logit per head.
    pub sinks: Option<Tensor<'a>>,
    /// Softmax scale.
    pub scale: f32,
    /// Logit soft cap (0: none).
    pub softcap: f32,
}

impl RowAttention<'_> {
    fn shapes_agree(&self) -> bool {
        let [dk, n_q, n_head, _] = self.q.ne();
        let [_, n_k, n_head_kv, _] = self.k.ne();
        let n_cols = self.mask.ne()[0];
        self.k.ne()[0] == dk
            && self.v.ne()[1] == n_k
            && self.v.ne()[2] == n_head_kv
            && n_head_kv > 0
            && n_head % n_head_kv == 0
            && self.mask.dtype() == DType::F16
            && self.mask.ne()[1] >= n_q
            && self.mask.nb()[0] == 2
            && match self.ids {
                Some(ids) => ids.dtype() == DType::I32 && ids.ne()[0] == n_cols,
                None => n_k >= n_cols,
            }
            && self
                .sinks
                .is_none_or(|s| s.dtype() == DType::F32 && s.ne()[0] == n_head)
    }
}

impl Context {
    /// Flash attention with the arithmetic of ggml's tiled CPU kernel for any number of rows (see
    /// [`crate::row_attention`]); returns [dv, n_head, n_q] (F32), as [`Context::flash_attn`]
    /// does. `None` where [`applies`] does not hold or the shapes disagree.
    pub fn flash_attn_rows<'a>(&'a self, a: RowAttention<'a>) -> Option<Tensor<'a>> {
        (a.shapes_agree() && applies(a.q, a.k, a.v)).then(|| self.rows_op(a))
    }

    /// The op node itself, operands as checked by [`Context::flash_attn_rows`] (the probe builds
    /// it before [`supported`] is known).
    fn rows_op<'a>(&'a self, a: RowAttention<'a>) -> Tensor<'a> {
        let RowAttention {
            q,
            k,
            v,
            mask,
            ids,
            sinks,
            scale,
            softcap,
        } = a;
        let dv = v.ne()[0];
        let [_, n_q, n_head, _] = q.ne();
        let mut srcs = vec![q, k, v, mask];
        srcs.extend(ids);
        srcs.extend(sinks);
        // SAFETY: live tensors whose types and shapes were checked; the op's body reads them
        // through their strides only; the user-data word is never dereferenced (it carries two
        // f32 bit patterns).
        unsafe { self.custom_f32([dv, n_head, n_q, 1], &srcs, op, pack(scale, softcap)) }
    }
}

/// Reads operand `i` of a custom op node.
///
/// # Safety
/// `dst` is a live node with at least `i + 1` sources.
unsafe fn src(dst: *const sys::ggml_tensor, i: usize) -> &'static sys::ggml_tensor {
    // SAFETY: the caller's contract; ggml keeps sources alive while the graph runs.
    unsafe { &*(*dst).src[i] }
}

/// Per-thread scratch: a K tile transposed (dk x 64, a column per key), a V tile (64 x dv), one
/// key row, the tile's mask, and per head its scores, accumulator, running maximum and sum.
#[derive(Default)]
struct Scratch {
    k: Vec<f32>,
    v: Vec<f32>,
    row: Vec<f32>,
    mask: Vec<f32>,
    kq: Vec<f32>,
    acc: Vec<f32>,
    m: Vec<f32>,
    sum: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The op's body. The (query row, query head) pairs are cut into one contiguous range per thread
/// (a decode step has one row: its heads are the work to share); within its range a thread
/// handles the heads of one KV head together, unpacking each tile of keys once for them.
///
/// # Safety
/// Called by ggml's CPU backend with `dst` built by [`Context::flash_attn_rows`].
unsafe extern "C" fn op(dst: *mut sys::ggml_tensor, ith: c_int, nth: c_int, word: *mut c_void) {
    // SAFETY: the node built by flash_attn_rows: sources q, k, v, mask, then optional ids (I32)
    // and sinks (F32), all live while the graph runs.
    let (q, k, v, mask, ids, sinks) = unsafe {
        let n = (0..(*dst).src.len())
            .take_while(|&i| !(*dst).src[i].is_null())
            .count();
        let mut ids = None;
        let mut sinks = None;
        for i in 4..n {
            let t = src(dst, i);
            if t.type_ == sys::GGML_TYPE_I32 {
                ids = Some(t);
            } else {
                sinks = Some(t);
            }
        }
        (
            src(dst, 0),
            src(dst, 1),
            src(dst, 2),
            src(dst, 3),
            ids,
            sinks,
        )
    };
    let (scale, softcap) = unpack(word);
    let rows = Rows {
        q,
        k,
        v,
        mask,
        ids,
        sinks,
        dk: q.ne[0] as usize,
        dv: v.ne[0] as usize,
        n_head: q.ne[2] as usize,
        n_cols: mask.ne[0] as usize,
        group: (q.ne[2] / k.ne[2]) as usize,
        scale,
        softcap,
    };
    let n_q = q.ne[1] as usize;
    let items = n_q * rows.n_head;
    let (ith, nth) = (ith.max(0) as usize, nth.max(1) as usize);
    let (first, end) = (items * ith / nth, items * (ith + 1) / nth);
    // SAFETY: dst is the op's F32 output [dv, n_head, n_q], contiguous (a fresh custom node);
    // this thread's (row, head) items first..end are its own dv values each.
    let out = unsafe {
        std::slice::from_raw_parts_mut(
            ((*dst).data as *mut f32).add(first * rows.dv),
            (end - first) * rows.dv,
        )
    };
    let mut item = first;
    SCRATCH.with_borrow_mut(|s| {
        s.k.resize(rows.dk * KV_TILE, 0.0);
        s.v.resize(KV_TILE * rows.dv, 0.0);
        s.row.resize(rows.dk, 0.0);
        s.mask.resize(KV_TILE, 0.0);
        s.kq.resize(rows.group * KV_TILE, 0.0);
        s.acc.resize(rows.group * rows.dv, 0.0);
        s.m.resize(rows.group, 0.0);
        s.sum.resize(rows.group, 0.0);
        while item < end {
            let (r, head) = (item / rows.n_head, item % rows.n_head);
            // The rest of this KV head's query heads in the range.
            let last = (head / rows.group + 1) * rows.group;
            let heads = head..last.min(head + end - item);
            let o = &mut out[(item - first) * rows.dv..(item - first + heads.len()) * rows.dv];
            item += heads.len();
            // SAFETY: r < n_q and the heads < n_head share one KV head; every read goes through
            // the operands' own strides within the shapes checked when the node was built.
            unsafe { rows.attend(r, heads, s, o) };
        }
    });
}

/// The operands of one op and their derived sizes.
struct Rows<'t> {
    q: &'t sys::ggml_tensor,
    k: &'t sys::ggml_tensor,
    v: &'t sys::ggml_tensor,
    mask: &'t sys::ggml_tensor,
    ids: Option<&'t sys::ggml_tensor>,
    sinks: Option<&'t sys::ggml_tensor>,
    dk: usize,
    dv: usize,
    n_head: usize,
    n_cols: usize,
    /// Query heads per KV head.
    group: usize,
    scale: f32,
    softcap: f32,
}

/// An f16 mask value as f32 (exact): 0 and -inf directly, anything else through `half`.
fn mask_value(bits: u16) -> f32 {
    match bits {
        0 => 0.0,
        0xfc00 => f32::NEG_INFINITY,
        b => half::f16::from_bits(b).to_f32(),
    }
}

/// `dst.len()` f16 values at `src` as f32 into `dst` (exact).
///
/// # Safety
/// `src` points to `dst.len()` readable f16 values.
unsafe fn widen(src: *const u8, dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    // SAFETY: the caller's contract; f16 is a transparent u16, aligned to 2 in ggml's rows.
    let halves = unsafe { std::slice::from_raw_parts(src as *const half::f16, dst.len()) };
    halves.convert_to_f32_slice(dst);
}

impl Rows<'_> {
    /// Query row `r` for `heads` (query heads of one KV head), into `out` (dv values a head).
    ///
    /// Mirrors ggml's tiled kernel for one row: for each tile of 64 columns that the row can see,
    /// the scores as FMA chains over the head dimension, scaled (and soft-capped), plus the mask;
    /// the running maximum and sum rescaled by `expf`; ggml's own softmax step; the values added
    /// by FMA chains over the tile's keys. Keys the row cannot see get score -inf and weight 0
    /// there, so they are not read here (adding `0 * v` leaves the accumulator as it is).
    ///
    /// # Safety
    /// The operands are the op's live tensors; `r` and `heads` are in range.
    unsafe fn attend(&self, r: usize, heads: Range<usize>, s: &mut Scratch, out: &mut [f32]) {
        let (dk, dv, nh) = (self.dk, self.dv, heads.len());
        let hk = heads.start / self.group;
        // ggml divides the scale by the cap before the products when a cap is set.
        let scale = if self.softcap != 0.0 {
            self.scale / self.softcap
        } else {
            self.scale
        };
        s.m[..nh].fill(f32::NEG_INFINITY);
        s.sum[..nh].fill(0.0);
        s.acc[..nh * dv].fill(0.0);
        // SAFETY (for every raw read below): offsets stay within each operand's shape, walked
        // through its strides, as ggml's own kernel reads them.
        let mask_row = unsafe { (self.mask.data as *const u8).add(r * self.mask.nb[1]) };
        let mut first = 0;
        while first < self.n_cols {
            let kv_tile = KV_TILE.min(self.n_cols - first);
            let mut visible = false;
            for j in 0..KV_TILE {
                s.mask[j] = if j < kv_tile {
                    // SAFETY: column first + j < n_cols of row r.
                    mask_value(unsafe { *(mask_row.add((first + j) * 2) as *const u16) })
                } else {
                    f32::NEG_INFINITY
                };
                visible |= s.mask[j] != f32::NEG_INFINITY;
            }
            if !visible {
                first += KV_TILE;
                continue;
            }
            // Unpack the visible keys: V as rows; K transposed (a column per key), eight keys at
            // a time where they are all visible.
            let k_row = |j: usize| {
                // SAFETY: the key of a column < n_cols is < n_k; its row of KV head hk.
                unsafe {
                    (self.k.data as *const u8)
                        .add(self.key(first + j) * self.k.nb[1] + hk * self.k.nb[2])
                }
            };
            let mut j = 0;
            while j < kv_tile {
                let eight =
                    j + 8 <= kv_tile && s.mask[j..j + 8].iter().all(|&m| m != f32::NEG_INFINITY);
                if eight && transpose::available() && dk % 8 == 0 {
                    let rows: [*const u8; 8] = std::array::from_fn(|i| k_row(j + i));
                    // SAFETY: eight rows of dk halves; s.k holds dk x 64 values.
                    unsafe { transpose::eight_keys(rows, dk, &mut s.k, j) };
                } else {
                    for jj in j..(j + 8).min(kv_tile) {
                        if s.mask[jj] == f32::NEG_INFINITY {
                            continue;
                        }
                        // SAFETY: dk halves at this key's row.
                        unsafe { widen(k_row(jj), &mut s.row) };
                        for (d, &x) in s.row.iter().enumerate() {
                            s.k[d * KV_TILE + jj] = x;
                        }
                    }
                }
                j += 8;
            }
            for j in 0..kv_tile {
                if s.mask[j] == f32::NEG_INFINITY {
                    continue;
                }
                let key = self.key(first + j);
                // SAFETY: key < n_k; dv halves at this key's row of KV head hk.
                unsafe {
                    widen(
                        (self.v.data as *const u8).add(key * self.v.nb[1] + hk * self.v.nb[2]),
                        &mut s.v[j * dv..(j + 1) * dv],
                    );
                }
            }
            for (h, head) in heads.clone().enumerate() {
                // SAFETY: dk f32 values of row r, head `head`.
                let qr = unsafe {
                    std::slice::from_raw_parts(
                        (self.q.data as *const u8).add(r * self.q.nb[1] + head * self.q.nb[2])
                            as *const f32,
                        dk,
                    )
                };
                let kq = &mut s.kq[h * KV_TILE..(h + 1) * KV_TILE];
                kq.fill(0.0);
                for (d, &qd) in qr.iter().enumerate() {
                    let kd = &s.k[d * KV_TILE..(d + 1) * KV_TILE];
                    for (x, &kv) in kq.iter_mut().zip(kd) {
                        *x = kv.mul_add(qd, *x);
                    }
                }
                for x in kq.iter_mut() {
                    *x *= scale;
                }
                if self.softcap != 0.0 {
                    for x in kq.iter_mut() {
                        *x = x.tanh() * self.softcap;
                    }
                }
                for (x, &mv) in kq.iter_mut().zip(&s.mask) {
                    // Masked and padding entries are -inf whatever their (unpacked) product.
                    *x = if mv == f32::NEG_INFINITY {
                        f32::NEG_INFINITY
                    } else {
                        *x + mv
                    };
                }
                let tile_max = kq.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                if tile_max == f32::NEG_INFINITY {
                    continue;
                }
                let acc = &mut s.acc[h * dv..(h + 1) * dv];
                let m_new = s.m[h].max(tile_max);
                if m_new > s.m[h] {
                    let ms = (s.m[h] - m_new).exp();
                    acc.iter_mut().for_each(|x| *x *= ms);
                    s.sum[h] *= ms;
                }
                s.m[h] = m_new;
                // SAFETY: 64 values, written in place as ggml's kernel does.
                let tile_sum = unsafe {
                    ggml_vec_soft_max_f32(KV_TILE as c_int, kq.as_mut_ptr(), kq.as_ptr(), m_new)
                };
                s.sum[h] = (f64::from(s.sum[h]) + tile_sum) as f32;
                for (j, &p) in kq.iter().enumerate().take(kv_tile) {
                    if s.mask[j] == f32::NEG_INFINITY {
                        continue;
                    }
                    let vj = &s.v[j * dv..(j + 1) * dv];
                    for (x, &vv) in acc.iter_mut().zip(vj) {
                        *x = vv.mul_add(p, *x);
                    }
                }
            }
            first += KV_TILE;
        }
        for (h, head) in heads.enumerate() {
            let acc = &mut s.acc[h * dv..(h + 1) * dv];
            let (m, mut sum) = (s.m[h], s.sum[h]);
            if let Some(sk) = self.sinks {
                // SAFETY: sinks holds n_head f32 values.
                let sink = unsafe { *(sk.data as *const f32).add(head) };
                let (mut ms, mut vs) = (1.0f32, 1.0f32);
                if sink > m {
                    ms = (m - sink).exp();
                    acc.iter_mut().for_each(|x| *x *= ms);
                } else {
                    vs = (sink - m).exp();
                }
                // ggml's C is compiled with FMA contraction: `S*ms + vs` is one FMA there.
                sum = sum.mul_add(ms, vs);
            }
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            for (y, &x) in out[h * dv..(h + 1) * dv].iter_mut().zip(acc.iter()) {
                *y = x * inv;
            }
        }
    }

    /// The key row of mask column `c`.
    fn key(&self, c: usize) -> usize {
        match self.ids {
            Some(ids) => {
                // SAFETY: ids holds n_cols i32 values and c < n_cols.
                let id = unsafe { *(ids.data as *const i32).add(c) };
                match usize::try_from(id) {
                    Ok(key) if key < self.k.ne[1] as usize => key,
                    _ => panic!(
                        "flash_attn_rows: slot id {id} outside the {} keys",
                        self.k.ne[1]
                    ),
                }
            }
            None => c,
        }
    }
}

mod transpose {
    //! Eight keys' rows of f16 into eight columns of the transposed f32 tile, 8 x 8 at a time
    //! (AVX2 and F16C; exact, as every f16 to f32 conversion is).

    /// Whether this CPU runs [`eight_keys`].
    pub(super) fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Writes key `j0 + i`'s value at dimension `d` (from `rows[i]`) to `k[d * 64 + j0 + i]`.
    ///
    /// # Safety
    /// [`available`]; each of `rows` points to `dk` readable f16 values, `dk` is a multiple of 8,
    /// `j0 + 8 <= 64` and `k` holds `dk * 64` values.
    pub(super) unsafe fn eight_keys(rows: [*const u8; 8], dk: usize, k: &mut [f32], j0: usize) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's contract.
        unsafe {
            x86(rows, dk, k, j0)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (rows, dk, k, j0);
            unreachable!("transpose::available is false off x86-64")
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn x86(rows: [*const u8; 8], dk: usize, k: &mut [f32], j0: usize) {
        use std::arch::x86_64::*;
        assert!(dk.is_multiple_of(8) && j0 + 8 <= super::KV_TILE && k.len() >= dk * super::KV_TILE);
        for d0 in (0..dk).step_by(8) {
            // SAFETY: dims d0..d0 + 8 of each row (the caller's contract).
            let r: [__m256; 8] = std::array::from_fn(|i| unsafe {
                _mm256_cvtph_ps(_mm_loadu_si128(rows[i].add(d0 * 2) as *const __m128i))
            });
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xee>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xee>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xee>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xee>(t5, t7);
            let cols = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (i, c) in cols.iter().enumerate() {
                let at = (d0 + i) * super::KV_TILE + j0;
                // SAFETY: at + 8 <= dk * 64 <= k.len() (asserted above).
                unsafe { _mm256_storeu_ps(k.as_mut_ptr().add(at), *c) };
            }
        }
    }
}

mod probe {
    //! Runs ggml's tiled kernel and [`super::op`] on the same random operands and compares them.
    use crate::{Backend, Context, DType, GraphScheduler};

    struct Lcg(u64);
    impl Lcg {
        fn unit(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    fn f16_bits(x: f32) -> u16 {
        // SAFETY: a plain conversion.
        unsafe { llama_cpp_sys_2::ggml_fp32_to_fp16(x) }
    }

    pub(super) fn agrees_with_ggml() -> bool {
        [(0.0f32, false), (30.0, true)]
            .iter()
            .all(|&(cap, sinks)| one(cap, sinks).unwrap_or(false))
    }

    /// 70 causal rows (positions 130..200) over 200 keys, two query heads per KV head.
    fn one(softcap: f32, with_sinks: bool) -> crate::Result<bool> {
        let (d, n_head, n_head_kv, n_kv, n_q, first_pos) = (64i64, 4i64, 2i64, 200i64, 70i64, 130);
        let ctx = Context::new(32, 64)?;
        let q = ctx.input(DType::F32, &[d, n_q, n_head], "q");
        let k = ctx.input(DType::F16, &[d, n_kv, n_head_kv], "k");
        let v = ctx.input(DType::F16, &[d, n_kv, n_head_kv], "v");
        let mask = ctx.input(DType::F16, &[n_kv, n_q], "mask");
        let sinks = with_sinks.then(|| ctx.input(DType::F32, &[n_head], "sinks"));
        let scale = 0.125;
        let theirs = ctx.flash_attn(q, k, v, mask, scale, softcap);
        if let Some(s) = sinks {
            ctx.flash_attn_add_sinks(theirs, s);
        }
        let theirs = theirs.as_output();
        let ours = ctx
            .rows_op(super::RowAttention {
                q,
                k,
                v,
                mask,
                ids: None,
                sinks,
                scale,
                softcap,
            })
            .as_output();
        let mut g = ctx.graph(64);
        g.expand(theirs);
        g.expand(ours);
        let mut sched = GraphScheduler::new(vec![Backend::cpu(2)?], 64)?;
        sched.alloc(0, &mut g)?;
        let mut rng = Lcg(0x9e37_79b9_7f4a_7c15);
        let qs: Vec<f32> = (0..d * n_q * n_head).map(|_| rng.unit() * 2.0).collect();
        q.write(&qs)?;
        for t in [k, v] {
            let xs: Vec<u16> = (0..d * n_kv * n_head_kv)
                .map(|_| f16_bits(rng.unit()))
                .collect();
            t.write(&xs)?;
        }
        let mut ms = vec![f16_bits(f32::NEG_INFINITY); (n_kv * n_q) as usize];
        for r in 0..n_q {
            for c in 0..=(first_pos + r).min(n_kv - 1) {
                ms[(r * n_kv + c) as usize] = 0;
            }
        }
        mask.write(&ms)?;
        if let Some(s) = sinks {
            s.write(&(0..n_head).map(|_| rng.unit()).collect::<Vec<f32>>())?;
        }
        sched.compute(0, &mut g)?;
        let (mut a, mut b) = (Vec::<f32>::new(), Vec::<f32>::new());
        theirs.read(&mut a)?;
        ours.read(&mut b)?;
        Ok(a.len() == b.len()
            && a.iter().any(|x| *x != 0.0)
            && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()))
    }
}
