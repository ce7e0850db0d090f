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

/// Where the keys and values are: `k(slot)` and `v(slot)` give a slot's row of `n_head_kv *
/// head_dim` values.
pub trait Cache {
    /// Keys of one slot.
    fn k(&self, slot: usize) -> &[f16];
    /// Values of one slot.
    fn v(&self, slot: usize) -> &[f16];
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
                    let k = &cache.k(slot(j))[hk * d..(hk + 1) * d];
                    let dot = q
                        .iter()
                        .zip(k)
                        .fold(0.0f32, |a, (&x, &y)| x.mul_add(y.to_f32(), a));
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
                let v = &cache.v(slot(j))[hk * d..(hk + 1) * d];
                for (a, &x) in part.acc.iter_mut().zip(v) {
                    *a = p.mul_add(x.to_f32(), *a);
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

    struct Flat {
        k: Vec<f16>,
        v: Vec<f16>,
        row: usize,
    }

    impl Cache for Flat {
        fn k(&self, slot: usize) -> &[f16] {
            &self.k[slot * self.row..(slot + 1) * self.row]
        }
        fn v(&self, slot: usize) -> &[f16] {
            &self.v[slot * self.row..(slot + 1) * self.row]
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
                let k = &c.k(slot(j))[hk * d..(hk + 1) * d];
                let dot: f64 = (0..d)
                    .map(|e| row.q[h * d + e] as f64 * k[e].to_f64())
                    .sum();
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
        for (j, sc) in span.zip(&scores) {
            let v = &c.v(slot(j))[hk * d..(hk + 1) * d];
            for e in 0..d {
                out[e] += (sc - max).exp() / sum * v[e].to_f64();
            }
        }
        out
    }

    #[test]
    fn rows_agree_with_plain_attention_and_with_themselves_wherever_their_blocks_lie() {
        let mut seed = 0x5eed_u64;
        for (d, n_head, n_head_kv, window, softcap, sinks) in [
            (64, 9, 3, 0, 0.0, false),
            (128, 8, 2, 300, 0.0, true),
            (64, 4, 4, 0, 20.0, false),
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
            let mut c = Flat {
                k: (0..slots * row_len)
                    .map(|_| f16::from_f32(rand(&mut seed)))
                    .collect(),
                v: (0..slots * row_len)
                    .map(|_| f16::from_f32(rand(&mut seed)))
                    .collect(),
                row: row_len,
            };
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
                let mut c2 = Flat {
                    k: c.k.clone(),
                    v: c.v.clone(),
                    row: row_len,
                };
                for (&from, &to) in table.iter().zip(&moved).take(end.div_ceil(s.block_size)) {
                    let (f, t) = (
                        from as usize * s.block_size * row_len,
                        to as usize * s.block_size * row_len,
                    );
                    let n = s.block_size * row_len;
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
            c.row = row_len;
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
        let c = Flat {
            k: vec![f16::ONE; 16 * 64],
            v: vec![f16::ONE; 16 * 64],
            row: 64,
        };
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
