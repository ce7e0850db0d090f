//! Axle's paged attention as a ggml op: one node per layer computes every query row of a step,
//! reading keys and values through block tables (`axle_kernels::paged_attention` says what it
//! computes and why each row's numbers depend on the row alone).
//!
//! The node is a ggml custom op carrying [`MARK`] in its op parameters. A CUDA backend built by
//! `scripts/build-backend.sh` runs it with Axle's kernel (`crates/axle-kernels/cuda/`) and answers
//! [`crate::Device::paged_attention`]; anywhere else ggml's CPU backend runs the op's body here,
//! the plain reference over the same chunks (so a graph with the op computes on the CPU too,
//! as tests do).
use crate::{Context, DType, Tensor};
use axle_kernels::paged_attention::{self as pa, Cache, Row, Shape, Stored};
use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, c_void};

/// The op parameter that marks the node for Axle's CUDA kernel (`"AXL3"`).
pub const MARK: i32 = 0x4158_4c33;

/// Where the op's constants sit in `op_params` (after ggml's custom-op header of six words;
/// `AXLE_PA_P_*` in `paged-attention.cu`).
const P_MARK: usize = 8;
const P_BLOCK: usize = 9;
const P_WINDOW: usize = 10;
const P_CHUNKS: usize = 11;
const P_SCALE: usize = 12;
const P_SOFTCAP: usize = 13;

/// The operands of [`Context::paged_attention`].
#[derive(Debug, Clone, Copy)]
pub struct PagedAttention<'a> {
    /// Queries: F32 [head_dim, n_head, n_rows], each head's values adjacent.
    pub q: Tensor<'a>,
    /// The key cache: F16 or Q8_0 [n_head_kv * head_dim, slots].
    pub k: Tensor<'a>,
    /// The value cache, shaped and typed as `k`.
    pub v: Tensor<'a>,
    /// Per row, the offset of its sequence's block table in `table` and the keys it sees
    /// (0: a row not computed here, whose output is zero): I32 [2, n_rows].
    pub rows: Tensor<'a>,
    /// Block ids: I32.
    pub table: Tensor<'a>,
    /// One extra logit per query head (F32 [n_head]), if the layer has them.
    pub sinks: Option<Tensor<'a>>,
    /// Slots per block.
    pub block_size: u32,
    /// Sliding window (0: none).
    pub window: u32,
    /// Chunks of the longest row ([`Shape::chunks`]; more is allowed and costs little).
    pub chunks: u32,
    /// Softmax scale.
    pub scale: f32,
    /// Logit soft cap (0: none).
    pub softcap: f32,
}

impl PagedAttention<'_> {
    /// Whether the operands have the types and shapes the op takes (the CUDA kernel's head sizes
    /// and groups included, so that a graph never holds a node only the CPU can run).
    pub fn applies(&self) -> bool {
        let [d, n_head, n_rows, _] = self.q.ne();
        let width = self.k.ne()[0];
        // Rows the CUDA kernel copies in pieces of 16 bytes (F16), or for Q8_0 of the widest of
        // 16, 8 and 4 bytes that divides a head's bytes.
        let cache_rows = |t: Tensor<'_>| {
            let align = match t.dtype() {
                DType::F16 => 16,
                DType::Q8_0 => {
                    let head = Stored::Q8_0.row_bytes(d.max(0) as usize);
                    [16, 8, 4]
                        .into_iter()
                        .find(|p| head.is_multiple_of(*p))
                        .unwrap_or(1)
                }
                _ => return false,
            };
            t.dtype() == self.k.dtype()
                && t.nb()[0] == t.dtype().row_size(t.dtype().block_size())
                && t.nb()[1].is_multiple_of(align)
                && t.ne()[0] == width
        };
        d > 0
            && width % d == 0
            && n_head % (width / d).max(1) == 0
            && pa::supported(d as usize, (n_head / (width / d).max(1)) as usize)
            && self.q.dtype() == DType::F32
            && self.q.nb()[0] == 4
            && self.q.nb()[1].is_multiple_of(16)
            && self.q.nb()[2].is_multiple_of(16)
            && cache_rows(self.k)
            && cache_rows(self.v)
            && self.v.ne()[1] == self.k.ne()[1]
            && self.rows.dtype() == DType::I32
            && self.rows.ne() == [2, n_rows, 1, 1]
            && self.table.dtype() == DType::I32
            && self
                .sinks
                .is_none_or(|s| s.dtype() == DType::F32 && s.ne()[0] == n_head)
            && self.block_size > 0
            && self.chunks > 0
    }
}

impl Context {
    /// Attention of every row of `a.q` through block tables; returns F32 [head_dim, n_head,
    /// n_rows]. `None` where [`PagedAttention::applies`] does not hold.
    pub fn paged_attention<'a>(&'a self, a: PagedAttention<'a>) -> Option<Tensor<'a>> {
        if !a.applies() {
            return None;
        }
        let [d, n_head, n_rows, _] = a.q.ne();
        let mut srcs = vec![a.q, a.k, a.v, a.rows, a.table];
        srcs.extend(a.sinks);
        // SAFETY: live tensors whose types and shapes were checked; the body reads them through
        // their strides within those shapes; the user-data word is unused.
        let t = unsafe { self.custom_f32([d, n_head, n_rows, 1], &srcs, op, std::ptr::null_mut()) };
        // SAFETY: a fresh custom node of this context; words 8..14 of its op parameters follow
        // ggml's custom-op header (function, task count, user data: six words) and are read only
        // by Axle's kernel and the body below.
        unsafe {
            let p = &mut (*t.raw()).op_params;
            p[P_MARK] = MARK;
            p[P_BLOCK] = a.block_size as i32;
            p[P_WINDOW] = a.window as i32;
            p[P_CHUNKS] = a.chunks as i32;
            p[P_SCALE] = a.scale.to_bits() as i32;
            p[P_SOFTCAP] = a.softcap.to_bits() as i32;
        }
        Some(t)
    }
}

/// A cache tensor's rows as bytes.
struct Rows<'t> {
    k: &'t sys::ggml_tensor,
    v: &'t sys::ggml_tensor,
    stored: Stored,
    head_dim: usize,
    row_bytes: usize,
}

impl Cache for Rows<'_> {
    fn k(&self, slot: usize, hk: usize, out: &mut [f32]) {
        // SAFETY: slots come from the op's block tables, within the cache (the runner checks each
        // block id against the pool); a row is `row_bytes` bytes at its stride.
        let row = unsafe { slot_row(self.k, slot, self.row_bytes) };
        self.stored
            .read(row, hk * self.head_dim, &mut out[..self.head_dim]);
    }
    fn v(&self, slot: usize, hk: usize, out: &mut [f32]) {
        // SAFETY: as for `k`.
        let row = unsafe { slot_row(self.v, slot, self.row_bytes) };
        self.stored
            .read(row, hk * self.head_dim, &mut out[..self.head_dim]);
    }
}

/// # Safety
/// `slot < t.ne[1]`, `t` a tensor whose rows hold at least `bytes` bytes.
unsafe fn slot_row(t: &sys::ggml_tensor, slot: usize, bytes: usize) -> &[u8] {
    assert!((slot as i64) < t.ne[1], "slot {slot} outside the cache");
    // SAFETY: the caller's contract and the check above.
    unsafe { std::slice::from_raw_parts((t.data as *const u8).add(slot * t.nb[1]), bytes) }
}

/// The op's body on ggml's CPU backend: rows cut into one contiguous range per thread.
///
/// # Safety
/// Called by ggml's CPU backend with `dst` built by [`Context::paged_attention`].
unsafe extern "C" fn op(dst: *mut sys::ggml_tensor, ith: c_int, nth: c_int, _: *mut c_void) {
    // SAFETY: the node built by paged_attention: sources q, k, v, rows, table and optional
    // sinks, live while the graph runs, with the types and shapes checked there.
    let (d, q, k, v, rows, table, sinks) = unsafe {
        let s = |i: usize| (*dst).src[i].as_ref();
        (
            &*dst,
            s(0).expect("q"),
            s(1).expect("k"),
            s(2).expect("v"),
            s(3).expect("rows"),
            s(4).expect("table"),
            s(5),
        )
    };
    let head_dim = q.ne[0] as usize;
    let n_head = q.ne[1] as usize;
    let n_rows = q.ne[2] as usize;
    let p = &d.op_params;
    let shape = Shape {
        head_dim,
        n_head,
        n_head_kv: k.ne[0] as usize / head_dim,
        block_size: p[P_BLOCK] as usize,
        window: p[P_WINDOW] as usize,
        scale: f32::from_bits(p[P_SCALE] as u32),
        softcap: f32::from_bits(p[P_SOFTCAP] as u32),
    };
    let stored = if k.type_ == DType::Q8_0.raw() {
        Stored::Q8_0
    } else {
        Stored::F16
    };
    let cache = Rows {
        k,
        v,
        stored,
        head_dim,
        row_bytes: stored.row_bytes(k.ne[0] as usize),
    };
    // SAFETY: contiguous I32 rows [2, n_rows] and table, F32 sinks [n_head] (checked at build).
    let (row_info, blocks, sinks) = unsafe {
        (
            std::slice::from_raw_parts(rows.data as *const i32, 2 * n_rows),
            std::slice::from_raw_parts(table.data as *const i32, table.ne[0] as usize),
            sinks.map(|s| std::slice::from_raw_parts(s.data as *const f32, n_head)),
        )
    };
    let (ith, nth) = (ith.max(0) as usize, nth.max(1) as usize);
    let width = n_head * head_dim;
    let mut qrow = vec![0.0f32; width];
    for r in n_rows * ith / nth..n_rows * (ith + 1) / nth {
        for h in 0..n_head {
            // SAFETY: row r < n_rows, head h < n_head, each head's values adjacent (checked).
            let src = unsafe {
                std::slice::from_raw_parts(
                    (q.data as *const u8).add(r * q.nb[2] + h * q.nb[1]) as *const f32,
                    head_dim,
                )
            };
            qrow[h * head_dim..(h + 1) * head_dim].copy_from_slice(src);
        }
        let (off, end) = (
            row_info[2 * r].max(0) as usize,
            row_info[2 * r + 1].max(0) as usize,
        );
        let table = blocks.get(off..).unwrap_or(&[]);
        assert!(
            end.div_ceil(shape.block_size) <= table.len(),
            "row {r}: block table too short for {end} keys"
        );
        // SAFETY: dst is the op's contiguous F32 [head_dim, n_head, n_rows]; row r is this
        // thread's alone.
        let out =
            unsafe { std::slice::from_raw_parts_mut((d.data as *mut f32).add(r * width), width) };
        let row = Row {
            q: &qrow,
            table,
            end,
        };
        pa::attend(&shape, row, 0..n_head, sinks, &cache, out);
    }
}

#[cfg(test)]
mod tests {
    use crate::{Backend, Context, DType, GraphScheduler};
    use axle_kernels::paged_attention::Stored;

    /// The op over scattered blocks agrees with ggml's flash attention over the same keys laid
    /// out in order (one decode row per sequence, GQA, a soft cap), to rounding: with an F16
    /// cache and with a Q8_0 one.
    #[test]
    fn the_op_agrees_with_ggml_flash_attention() {
        agrees_with_ggml(DType::F16, Stored::F16);
        agrees_with_ggml(DType::Q8_0, Stored::Q8_0);
    }

    fn agrees_with_ggml(dtype: DType, stored: Stored) {
        let (d, n_head, n_head_kv, bs) = (64i64, 6i64, 2i64, 16u32);
        let ends = [1i64, 40, 300];
        let n_blocks = 64i64;
        let slots = n_blocks * bs as i64;
        let width = d * n_head_kv;
        let ctx = Context::new(64, 128).unwrap();
        let q = ctx.input(DType::F32, &[d, n_head, ends.len() as i64], "q");
        let k = ctx.input(dtype, &[width, slots], "k");
        let v = ctx.input(dtype, &[width, slots], "v");
        let rows = ctx.input(DType::I32, &[2, ends.len() as i64], "rows");
        let table = ctx.input(DType::I32, &[64], "table");
        let (scale, softcap) = (0.125f32, 20.0f32);
        let ours = ctx
            .paged_attention(super::PagedAttention {
                q,
                k,
                v,
                rows,
                table,
                sinks: None,
                block_size: bs,
                window: 0,
                chunks: 2,
                scale,
                softcap,
            })
            .expect("applies")
            .as_output();
        // ggml's: per row, its keys gathered in order into a KV of its own.
        let mut theirs = Vec::new();
        let mut kin = Vec::new();
        for (i, &end) in ends.iter().enumerate() {
            let kr = ctx.input(dtype, &[d, end, n_head_kv], &format!("k{i}"));
            let vr = ctx.input(dtype, &[d, end, n_head_kv], &format!("v{i}"));
            let mask = ctx.input(DType::F16, &[end, 1], &format!("m{i}"));
            let qi = ctx.view(q, &[d, 1, n_head], &[q.nb()[2], q.nb()[1]], i * q.nb()[2]);
            let o = ctx.flash_attn(qi, kr, vr, mask, scale, softcap).as_output();
            theirs.push(o);
            kin.push((kr, vr, mask, end));
        }
        let mut g = ctx.graph(128);
        g.expand(ours);
        for &o in &theirs {
            g.expand(o);
        }
        let mut sched = GraphScheduler::new(vec![Backend::cpu(2).unwrap()], 128).unwrap();
        sched.alloc(0, &mut g).unwrap();
        let mut seed = 0x1234_5678_u64;
        let mut unit = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 2001) as f32 / 1000.0 - 1.0
        };
        let qs: Vec<f32> = (0..d * n_head * ends.len() as i64)
            .map(|_| unit())
            .collect();
        q.write(&qs).unwrap();
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        stored.write(
            &(0..width * slots).map(|_| unit()).collect::<Vec<_>>(),
            &mut ks,
        );
        stored.write(
            &(0..width * slots).map(|_| unit()).collect::<Vec<_>>(),
            &mut vs,
        );
        k.write(&ks).unwrap();
        v.write(&vs).unwrap();
        // Each sequence's blocks scattered: sequence i uses blocks (i * 20 + 7 * b) % 64.
        let mut tab = vec![0i32; 64];
        let mut rws = Vec::new();
        for (i, &end) in ends.iter().enumerate() {
            let off = i * 20;
            rws.extend([off as i32, end as i32]);
            for b in 0..(end as usize).div_ceil(bs as usize) {
                tab[off + b] = ((i * 20 + 7 * b) % 64) as i32;
            }
        }
        rows.write(&rws).unwrap();
        table.write(&tab).unwrap();
        for (i, &(kr, vr, mask, end)) in kin.iter().enumerate() {
            let off = i * 20;
            let (row, head) = (
                stored.row_bytes(width as usize),
                stored.row_bytes(d as usize),
            );
            let gather = |src: &[u8]| {
                let mut out = Vec::new();
                for hk in 0..n_head_kv as usize {
                    for j in 0..end as usize {
                        let slot =
                            tab[off + j / bs as usize] as usize * bs as usize + j % bs as usize;
                        let at = slot * row + hk * head;
                        out.extend_from_slice(&src[at..at + head]);
                    }
                }
                out
            };
            kr.write(&gather(&ks)).unwrap();
            vr.write(&gather(&vs)).unwrap();
            mask.write(&vec![0u16; end as usize]).unwrap();
        }
        sched.compute(0, &mut g).unwrap();
        let mut a = Vec::<f32>::new();
        ours.read(&mut a).unwrap();
        let row = (d * n_head) as usize;
        for (i, t) in theirs.iter().enumerate() {
            let mut b = Vec::<f32>::new();
            t.read(&mut b).unwrap();
            let diff = a[i * row..(i + 1) * row]
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(diff < 2e-3, "{dtype:?} row {i}: max |diff| {diff}");
        }
    }
}
