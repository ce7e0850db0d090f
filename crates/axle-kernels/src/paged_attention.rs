//! Paged attention for every query row of a step, with a split of each row's keys that depends
//! on the row alone (`cuda/paged-attention.cuh` is the CUDA kernel; this is its reference).
//!
//! A row attends keys `begin..end` of its sequence: `end` is its position + 1, `begin` is 0, or
//! `end - window` on sliding-window layers. Key `j` lives in cache slot
//! `table[j / block_size] * block_size + j % block_size`. The keys are cut into chunks of
//! [`CHUNK`] at absolute key indices; each chunk keeps a softmax of its own (maximum, sum,
//! weighted values) and the chunks are combined in order, with an optional sink logit per head.
//! Every sum runs in an order fixed by the row's own keys, so a row's numbers do not depend on
//! which other rows share the step or where its blocks lie in the cache. The CUDA kernel follows
//! the same chunks (its order inside a chunk is its own), so the two agree to rounding, and each
//! is exact with respect to itself.
use half::f16;

/// Keys per chunk (`AXLE_PA_CHUNK` in the CUDA kernel).
pub const CHUNK: usize = 256;

/// Head sizes the CUDA kernel takes.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Most query heads per KV head the CUDA kernel takes.
pub const MAX_GROUP: usize = 8;

/// Whether the CUDA kernel takes heads of `head_dim` with `group` query heads per KV head.
pub fn supported(head_dim: usize, group: usize) -> bool {
    HEAD_DIMS.contains(&head_dim) && (1..=MAX_GROUP).contains(&group)
}

/// The shape and constants of one launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Size of a query, key and value head.
    pub head_dim: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads (divides `n_head`).
    pub n_head_kv: usize,
    /// Slots per block of the block tables.
    pub block_size: usize,
    /// Sliding window (0: none).
    pub window: usize,
    /// Softmax scale.
    pub scale: f32,
    /// Logit soft cap (0: none).
    pub softcap: f32,
}

impl Shape {
    /// The keys a row ending at `end` attends.
    pub fn span(&self, end: usize) -> std::ops::Range<usize> {
        let begin = if self.window > 0 && end > self.window {
            end - self.window
        } else {
            0
        };
        begin..end
    }

    /// Chunks a launch whose longest row ends at `max_end` covers.
    pub fn chunks(max_end: usize) -> usize {
        max_end.div_ceil(CHUNK).max(1)
    }
}

/// One query row: `q` is its `n_head * head_dim` values, `table` its sequence's block ids,
/// `end` the keys it sees (0: a row not computed, whose output is zero).
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    /// Queries, head after head.
    pub q: &'a [f32],
    /// Block ids of the row's sequence.
    pub table: &'a [i32],
    /// Keys visible.
    pub end: usize,
}

/// Where the keys and values are: a slot's row holds `n_head_kv * head_dim` values, stored as
/// [`Stored`] says.
pub trait Cache {
    /// Keys of KV head `hk` of one slot, as f32, into `out` (`head_dim` values).
    fn k(&self, slot: usize, hk: usize, out: &mut [f32]);
    /// Values of KV head `hk` of one slot, as `k`.
    fn v(&self, slot: usize, hk: usize, out: &mut [f32]);
}

/// How a cache row stores its values: ggml's F16, or ggml's Q8_0 (blocks of 32 values: an F16
/// scale, then 32 int8; a value is scale * int8, exact in f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Two bytes a value.
    F16,
    /// 34 bytes per 32 values.
    Q8_0,
}

/// Values of a Q8_0 block.
pub const Q8_0_BLOCK: usize = 32;
const Q8_0_BYTES: usize = 34;

impl Stored {
    /// Bytes of a row of `width` values (`width` a multiple of [`Q8_0_BLOCK`] for Q8_0).
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            Stored::F16 => 2 * width,
            Stored::Q8_0 => width / Q8_0_BLOCK * Q8_0_BYTES,
        }
    }

    /// Values `[first, first + out.len())` of a row's bytes, as f32 (`first` and the length
    /// whole blocks for Q8_0).
    pub fn read(self, row: &[u8], first: usize, out: &mut [f32]) {
        match self {
            Stored::F16 => {
                for (o, b) in out.iter_mut().zip(row[2 * first..].chunks_exact(2)) {
                    *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            Stored::Q8_0 => {
                let blocks = row[first / Q8_0_BLOCK * Q8_0_BYTES..].chunks_exact(Q8_0_BYTES);
                for (o, b) in out.chunks_mut(Q8_0_BLOCK).zip(blocks) {
                    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    for (x, &q) in o.iter_mut().zip(&b[2..]) {
                        *x = d * f32::from(q as i8);
                    }
                }
            }
        }
    }

    /// `x` stored as a row (ggml's rounding for Q8_0: scale = max |x| / 127 as F16, each value
    /// round(x / scale) through the reciprocal).
    pub fn write(self, x: &[f32], out: &mut Vec<u8>) {
        match self {
            Stored::F16 => out.extend(x.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes())),
            Stored::Q8_0 => {
                for b in x.chunks(Q8_0_BLOCK) {
                    let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    out.extend(f16::from_f32(d).to_le_bytes());
                    out.extend(b.iter().map(|&v| (v * id).round() as i8 as u8));
                }
            }
        }
    }
}

/// One chunk's softmax for one head: its largest score, the sum of its weights, the weighted
/// values.
struct Partial {
    max: f32,
    sum: f32,
    acc: Vec<f32>,
}

/// Computes `row` for query heads `heads` into `out` (`head_dim` values a head, in order).
/// `sinks`: one extra logit per query head.
pub fn attend<C: Cache + ?Sized>(
    s: &Shape,
    row: Row<'_>,
    heads: std::ops::Range<usize>,
    sinks: Option<&[f32]>,
    cache: &C,
    out: &mut [f32],
) {
    let d = s.head_dim;
    let group = s.n_head / s.n_head_kv;
    let span = s.span(row.end);
    let slot = |j: usize| row.table[j / s.block_size] as usize * s.block_size + j % s.block_size;
    let mut kv = vec![0.0f32; d];
    for (h, o) in heads.zip(out.chunks_exact_mut(d)) {
        o.fill(0.0);
        if span.is_empty() {
            continue;
        }
        let hk = h / group;
        let q = &row.q[h * d..(h + 1) * d];
        let mut parts = Vec::new();
        for c in span.start / CHUNK..=(span.end - 1) / CHUNK {
            let keys = span.start.max(c * CHUNK)..span.end.min((c + 1) * CHUNK);
            let scores: Vec<f32> = keys
                .clone()
                .map(|j| {
                    cache.k(slot(j), hk, &mut kv);
                    let dot = q
                        .iter()
                        .zip(&kv)
                        .fold(0.0f32, |a, (&x, &y)| x.mul_add(y, a));
                    let x = dot * s.scale;
                    if s.softcap != 0.0 {
                        s.softcap * (x / s.softcap).tanh()
                    } else {
                        x
                    }
                })
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut part = Partial {
                max,
                sum: 0.0,
                acc: vec![0.0; d],
            };
            for (j, &sc) in keys.zip(&scores) {
                let p = (sc - max).exp();
                part.sum += p;
                cache.v(slot(j), hk, &mut kv);
                for (a, &x) in part.acc.iter_mut().zip(&kv) {
                    *a = p.mul_add(x, *a);
                }
            }
            parts.push(part);
        }
        let sink = sinks.map(|x| x[h]);
        let max = parts
            .iter()
            .map(|p| p.max)
            .chain(sink)
            .fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for p in &parts {
            let f = (p.max - max).exp();
            sum = p.sum.mul_add(f, sum);
            for (a, &x) in o.iter_mut().zip(&p.acc) {
                *a = x.mul_add(f, *a);
            }
        }
        if let Some(x) = sink {
            sum += (x - max).exp();
        }
        if sum > 0.0 {
            o.iter_mut().for_each(|a| *a /= sum);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of `row` values stored as `stored`, heads `d` wide.
    struct Flat {
        k: Vec<u8>,
        v: Vec<u8>,
        row: usize,
        d: usize,
        stored: Stored,
    }

    impl Flat {
        fn new(k: &[f32], v: &[f32], row: usize, d: usize, stored: Stored) -> Flat {
            let (mut kb, mut vb) = (Vec::new(), Vec::new());
            stored.write(k, &mut kb);
            stored.write(v, &mut vb);
            Flat {
                k: kb,
                v: vb,
                row,
                d,
                stored,
            }
        }
        fn head(&self, bytes: &[u8], slot: usize, hk: usize, out: &mut [f32]) {
            let n = self.stored.row_bytes(self.row);
            let row = &bytes[slot * n..(slot + 1) * n];
            self.stored.read(row, hk * self.d, &mut out[..self.d]);
        }
    }

    impl Cache for Flat {
        fn k(&self, slot: usize, hk: usize, out: &mut [f32]) {
            self.head(&self.k, slot, hk, out)
        }
        fn v(&self, slot: usize, hk: usize, out: &mut [f32]) {
            self.head(&self.v, slot, hk, out)
        }
    }

    #[test]
    fn q8_0_rows_round_as_ggml_does_and_read_back() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        let mut bytes = Vec::new();
        Stored::Q8_0.write(&x, &mut bytes);
        assert_eq!(bytes.len(), Stored::Q8_0.row_bytes(64));
        let mut back = vec![0.0; 32];
        Stored::Q8_0.read(&bytes, 32, &mut back);
        // The block's largest value is 127 steps of its scale; every value within half a step.
        let d = f16::from_le_bytes([bytes[34], bytes[35]]).to_f32();
        assert_eq!(bytes[34 + 2 + 31] as i8, 127);
        for (a, b) in back.iter().zip(&x[32..]) {
            assert!((a - b).abs() <= d / 2.0 + 1e-6, "{a} {b}");
        }
    }

    fn rand(seed: &mut u64) -> f32 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        (*seed % 2001) as f32 / 1000.0 - 1.0
    }

    /// Plain softmax attention in f64 over the row's keys.
    fn plain(s: &Shape, row: Row<'_>, sinks: Option<&[f32]>, c: &Flat, h: usize) -> Vec<f64> {
        let d = s.head_dim;
        let hk = h / (s.n_head / s.n_head_kv);
        let slot =
            |j: usize| row.table[j / s.block_size] as usize * s.block_size + j % s.block_size;
        let span = s.span(row.end);
        let scores: Vec<f64> = span
            .clone()
            .map(|j| {
                let mut k = vec![0.0; d];
                c.k(slot(j), hk, &mut k);
                let dot: f64 = (0..d).map(|e| row.q[h * d + e] as f64 * k[e] as f64).sum();
                let x = dot * s.scale as f64;
                if s.softcap != 0.0 {
                    s.softcap as f64 * (x / s.softcap as f64).tanh()
                } else {
                    x
                }
            })
            .collect();
        let sink = sinks.map(|x| x[h] as f64);
        let max = scores
            .iter()
            .copied()
            .chain(sink)
            .fold(f64::NEG_INFINITY, f64::max);
        let mut sum: f64 = scores.iter().map(|x| (x - max).exp()).sum();
        sum += sink.map_or(0.0, |x| (x - max).exp());
        let mut out = vec![0.0; d];
        let mut v = vec![0.0; d];
        for (j, sc) in span.zip(&scores) {
            c.v(slot(j), hk, &mut v);
            for e in 0..d {
                out[e] += (sc - max).exp() / sum * v[e] as f64;
            }
        }
        out
    }

    #[test]
    fn rows_agree_with_plain_attention_and_with_themselves_wherever_their_blocks_lie() {
        let mut seed = 0x5eed_u64;
        for (d, n_head, n_head_kv, window, softcap, sinks, stored) in [
            (64, 9, 3, 0, 0.0, false, Stored::F16),
            (128, 8, 2, 300, 0.0, true, Stored::F16),
            (64, 4, 4, 0, 20.0, false, Stored::F16),
            (64, 9, 3, 0, 0.0, false, Stored::Q8_0),
            (128, 8, 2, 300, 30.0, true, Stored::Q8_0),
        ] {
            let s = Shape {
                head_dim: d,
                n_head,
                n_head_kv,
                block_size: 16,
                window,
                scale: 1.0 / (d as f32).sqrt(),
                softcap,
            };
            let row_len = n_head_kv * d;
            let n_blocks = 80;
            let slots = n_blocks * s.block_size;
            let k: Vec<f32> = (0..slots * row_len).map(|_| rand(&mut seed)).collect();
            let v: Vec<f32> = (0..slots * row_len).map(|_| rand(&mut seed)).collect();
            let c = Flat::new(&k, &v, row_len, d, stored);
            let sink: Vec<f32> = (0..n_head).map(|_| rand(&mut seed)).collect();
            let sinks = sinks.then_some(sink.as_slice());
            let q: Vec<f32> = (0..n_head * d).map(|_| rand(&mut seed)).collect();
            // Blocks in a scattered order; 600 keys span three chunks.
            let table: Vec<i32> = (0..38).map(|b| (b * 7 % n_blocks) as i32).collect();
            for end in [1, 255, 256, 257, 600] {
                let row = Row {
                    q: &q,
                    table: &table,
                    end,
                };
                let mut out = vec![0.0; n_head * d];
                attend(&s, row, 0..n_head, sinks, &c, &mut out);
                for h in 0..n_head {
                    let want = plain(&s, row, sinks, &c, h);
                    for e in 0..d {
                        assert!(
                            (out[h * d + e] as f64 - want[e]).abs() < 1e-4,
                            "end {end} head {h}"
                        );
                    }
                }
                // The same keys at other blocks: the same bits.
                let moved: Vec<i32> = table.iter().map(|&b| (b + 40) % n_blocks as i32).collect();
                let mut c2 = Flat::new(&[], &[], row_len, d, stored);
                c2.k = c.k.clone();
                c2.v = c.v.clone();
                let n = s.block_size * stored.row_bytes(row_len);
                for (&from, &to) in table.iter().zip(&moved).take(end.div_ceil(s.block_size)) {
                    let (f, t) = (from as usize * n, to as usize * n);
                    c2.k[t..t + n].copy_from_slice(&c.k[f..f + n]);
                    c2.v[t..t + n].copy_from_slice(&c.v[f..f + n]);
                }
                let mut again = vec![0.0; n_head * d];
                attend(
                    &s,
                    Row {
                        q: &q,
                        table: &moved,
                        end,
                    },
                    0..n_head,
                    sinks,
                    &c2,
                    &mut again,
                );
                assert_eq!(out, again, "end {end}: blocks moved");
            }
        }
    }

    #[test]
    fn a_row_of_no_keys_is_zero() {
        let s = Shape {
            head_dim: 64,
            n_head: 2,
            n_head_kv: 1,
            block_size: 16,
            window: 0,
            scale: 0.1,
            softcap: 0.0,
        };
        let c = Flat::new(&[1.0; 16 * 64], &[1.0; 16 * 64], 64, 64, Stored::F16);
        let q = vec![1.0; 128];
        let mut out = vec![7.0; 128];
        attend(
            &s,
            Row {
                q: &q,
                table: &[0],
                end: 0,
            },
            0..2,
            None,
            &c,
            &mut out,
        );
        assert!(out.iter().all(|&x| x == 0.0));
    }
}
