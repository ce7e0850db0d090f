//! A step's host inputs: tokens, positions, slots, masks or block tables, the device layout or
//! the host's attention groups, output rows and recurrent state rows.
use super::*;

#[derive(Debug, Default)]
pub(super) struct HostInputs {
    pub(super) tokens: Vec<i32>,
    pub(super) pos: Vec<i32>,
    pub(super) slots: Vec<i64>,
    pub(super) mask: Vec<u16>,
    pub(super) mask_swa: Vec<u16>,
    /// Gathered slots (empty when attention reads a prefix of the cache directly).
    pub(super) kv_ids: Vec<i32>,
    /// Paged attention's rows and block tables (see [`device_step::DeviceInputs`]).
    pub(super) paged_rows: Vec<i32>,
    pub(super) paged_table: Vec<i32>,
    pub(super) out_ids: Vec<i32>,
    pub(super) rows: Vec<(usize, usize)>,
    /// Whether each row's sequence asked for picks.
    pub(super) row_picks: Vec<bool>,
    /// Each row's arithmetic (host layout).
    pub(super) arith: Vec<RowArithmetic>,
    /// The step's attention ops (host layout, batch-invariant kernels; see [`attention_groups`]).
    pub(super) groups: Vec<AttnGroup>,
    /// The step's device layout (see [`device_step`]), when it has one.
    pub(super) device: Option<DeviceStep>,
    /// Recurrent models: each sequence's rows and the pool rows to read and write.
    pub(super) state_seqs: Vec<StateSeq>,
    pub(super) state_read: Vec<i32>,
    pub(super) state_write: Vec<i64>,
    /// An MTP head's step: each token's paired hidden state.
    pub(super) hidden: Vec<f32>,
}

impl Runner {
    pub(super) fn slot(&self, table: &[u32], pos: u32) -> Result<u32, ModelError> {
        let bs = self.opts.block_size;
        let block = *table.get((pos / bs) as usize).ok_or_else(|| {
            ModelError::Batch(format!("block table too short for position {pos}"))
        })?;
        if block >= self.n_blocks() {
            return Err(ModelError::Batch(format!(
                "block {block} out of range ({} blocks)",
                self.n_blocks()
            )));
        }
        Ok(block * bs + pos % bs)
    }

    pub(super) fn prepare(&mut self, seqs: &[SeqInput]) -> Result<(i64, u32), ModelError> {
        let window = self.family().sliding_window();
        let n_tokens: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if n_tokens == 0 {
            return Err(ModelError::Batch("empty step".into()));
        }
        if n_tokens > self.opts.max_batch_tokens {
            return Err(ModelError::Batch(format!(
                "{n_tokens} tokens exceed the step budget {}",
                self.opts.max_batch_tokens
            )));
        }
        let n_vocab = self.family().hparams().n_vocab;
        let mut h = std::mem::take(&mut self.host);
        h.tokens.clear();
        h.pos.clear();
        h.slots.clear();
        h.out_ids.clear();
        h.rows.clear();
        h.row_picks.clear();
        h.arith.clear();
        // Each sequence's visible slots in logical order. When they ascend for every sequence,
        // attention reads a prefix of the cache and the mask picks each row's slots; a row then
        // visits its tokens in logical order. When some sequence's blocks lie out of order (after
        // preemption or prefix reuse), the step instead gathers every sequence's slots, in logical
        // order, into a KV of its own, so the row still visits its tokens in logical order and the
        // arithmetic is the same as if the blocks had been ascending.
        // With paged attention, small sequences are read through their block tables: only
        // their new tokens' slots are listed (from `first[i]` on), after every block up to the
        // end is checked as `slot` checks a position's.
        let paged_block = self.arithmetic.paged.then_some(self.opts.block_size);
        let mut visible: Vec<Vec<u32>> = Vec::with_capacity(seqs.len());
        let mut first: Vec<u32> = Vec::with_capacity(seqs.len());
        for s in seqs {
            let end = s.start_pos + s.tokens.len() as u32;
            let from = if paged_block.is_some() && s.tokens.len() <= device_step::SMALL_TOKENS {
                for p in (0..s.start_pos).step_by(self.opts.block_size as usize) {
                    self.slot(&s.block_table, p)?;
                }
                s.start_pos
            } else {
                0
            };
            visible.push(
                (from..end)
                    .map(|p| self.slot(&s.block_table, p))
                    .collect::<Result<_, _>>()?,
            );
            first.push(from);
        }
        if self.device_layout() {
            let d = device_step::layout_with(
                &seqs
                    .iter()
                    .zip(&visible)
                    .map(|(s, v)| SeqSlots {
                        start_pos: s.start_pos,
                        n_tokens: s.tokens.len(),
                        slots: v,
                        block_table: &s.block_table,
                    })
                    .collect::<Vec<_>>(),
                self.kv.size,
                window,
                paged_block,
            );
            h.mask = d.mask;
            h.mask_swa = d.mask_swa;
            h.kv_ids = d.kv_ids;
            h.paged_rows = d.paged_rows;
            h.paged_table = d.paged_table;
            h.device = Some(DeviceStep {
                products: self.arithmetic.products,
                column_types: self.arithmetic.column_types,
                replay_types: self.arithmetic.replay_types,
                ..d.step
            });
        } else {
            h.device = None;
        }
        // The step's rows: token, position, slot, and which rows return logits.
        for (si, s) in seqs.iter().enumerate() {
            for (ti, &t) in s.tokens.iter().enumerate() {
                check_token(t, n_vocab)?;
                let p = s.start_pos + ti as u32;
                h.tokens.push(t as i32);
                h.pos.push(p as i32);
                h.slots.push(visible[si][(p - first[si]) as usize] as i64);
                if let Some(k) = self.arithmetic.host_kernels {
                    h.arith.push(k.row(s.prompt_len, p, self.opts.kv_slots));
                }
                if s.logits.wants(ti, s.tokens.len()) {
                    h.out_ids.push(h.tokens.len() as i32 - 1);
                    h.rows.push((si, ti));
                    h.row_picks.push(s.pick);
                }
            }
        }
        h.state_seqs.clear();
        h.state_read.clear();
        h.state_write.clear();
        if let Some(cache) = &self.state {
            let mut first = 0i64;
            for (si, s) in seqs.iter().enumerate() {
                let st = s.state;
                if st.group >= cache.groups || st.from >= cache.snapshots || st.keep == 0 {
                    return Err(ModelError::Batch(format!(
                        "sequence {si}: state group {} / row {} / keep {} outside {} groups of {}",
                        st.group, st.from, st.keep, cache.groups, cache.snapshots
                    )));
                }
                let n = s.tokens.len() as i64;
                let keep = (st.keep.min(cache.snapshots) as i64).min(n);
                h.state_read.push(if s.start_pos == 0 {
                    0
                } else {
                    cache.row(st.group, st.from) as i32
                });
                h.state_seqs.push(StateSeq {
                    first,
                    n,
                    keep,
                    write_off: h.state_write.len() as i64,
                });
                h.state_write
                    .extend((0..keep as u32).map(|k| cache.row(st.group, k) as i64));
                first += n;
            }
        }
        h.hidden.clear();
        if self.opts.mtp {
            let e = self.family().hparams().n_embd as usize;
            for s in seqs {
                if s.hidden.len() != s.tokens.len() * e {
                    return Err(ModelError::Batch(format!(
                        "an MTP head's step needs {e} hidden values a token: {} for {} tokens",
                        s.hidden.len(),
                        s.tokens.len()
                    )));
                }
                h.hidden.extend_from_slice(&s.hidden);
            }
        }
        let ppt = self.family().positions_per_token();
        if ppt > 1 {
            // Multi-section RoPE: section-major, text positions [p, p, p, 0].
            let n = h.pos.len();
            for sec in 1..ppt {
                if sec < 3 {
                    h.pos.extend_from_within(..n);
                } else {
                    h.pos.resize(h.pos.len() + n, 0);
                }
            }
        }
        if h.device.is_some() {
            // The device layout made the masks and the gathered slots.
            let n_kv = h.kv_ids.len() as u32;
            self.host = h;
            return Ok((n_tokens as i64, n_kv));
        }
        // With row attention (ggml's tiled arithmetic, see `attention_groups`) a row's numbers
        // depend on where its keys fall in tiles of 64 columns: every sequence's position 0 must
        // start a tile, its positions in consecutive columns. A split-KV row's numbers depend on
        // where its keys fall in its op's view, which starts at its sequence's position 0 and
        // needs its positions in consecutive columns too. With the one-pass kernel only the
        // order of a row's keys matters.
        let tiled = h.arith.iter().any(|a| a.tiled_attention || a.split_kv > 0);
        // Each sequence's widest split-KV view (0: none).
        let mut split_view = vec![0u32; seqs.len()];
        let mut row = 0usize;
        for (si, s) in seqs.iter().enumerate() {
            for a in h.arith.iter().skip(row).take(s.tokens.len()) {
                split_view[si] = split_view[si].max(a.split_kv);
            }
            row += s.tokens.len();
        }
        let kv_slots = self.opts.kv_slots;
        let ascending = if tiled {
            visible.iter().zip(&split_view).all(|(v, &view)| {
                v.first().is_none_or(|&b| {
                    b.is_multiple_of(KV_TILE)
                        && b + view <= kv_slots
                        && v.iter().zip(b..).all(|(&s, want)| s == want)
                })
            })
        } else {
            visible.iter().all(|v| v.windows(2).all(|w| w[0] < w[1]))
        };
        h.kv_ids.clear();
        // Column of the mask where each sequence's position 0 lies, and the stride per position
        // (direct: the slot itself; gathered: consecutive columns).
        let mut seg_start = Vec::with_capacity(seqs.len());
        let n_kv = if ascending {
            let end = visible
                .iter()
                .zip(&split_view)
                .filter_map(|(v, &view)| Some((v.last()? + 1).max(v.first()? + view)))
                .max()
                .unwrap_or(1);
            (end.div_ceil(KV_PAD) * KV_PAD).min(kv_slots)
        } else {
            let mut end = 0;
            for (v, &view) in visible.iter().zip(&split_view) {
                if tiled {
                    let start = h.kv_ids.len().next_multiple_of(KV_TILE as usize);
                    h.kv_ids.resize(start, 0);
                }
                seg_start.push(h.kv_ids.len());
                end = end.max(h.kv_ids.len() + view as usize);
                h.kv_ids.extend(v.iter().map(|&x| x as i32));
            }
            let n = (h.kv_ids.len().max(end) as u32).div_ceil(KV_PAD) * KV_PAD;
            h.kv_ids.resize(n as usize, 0);
            n
        };
        // Each sequence's column of position 0, for split-KV rows' views.
        let first_col: Vec<i64> = if ascending {
            visible
                .iter()
                .map(|v| v.first().map_or(0, |&b| b as i64))
                .collect()
        } else {
            seg_start.iter().map(|&c| c as i64).collect()
        };
        h.groups = if self.opts.kernels == Kernels::BatchInvariant {
            attention_groups(&h.arith, seqs.iter().map(|s| s.tokens.len()).zip(first_col))
        } else {
            Vec::new()
        };
        let neg = f16::NEG_INFINITY.to_bits();
        h.mask.clear();
        h.mask.resize(n_kv as usize * n_tokens, neg);
        if window.is_some() {
            h.mask_swa.clear();
            h.mask_swa.resize(n_kv as usize * n_tokens, neg);
        }
        let mut row = 0usize;
        for (si, s) in seqs.iter().enumerate() {
            for ti in 0..s.tokens.len() {
                let p = s.start_pos + ti as u32;
                let base = row * n_kv as usize;
                for q in 0..=p {
                    let col = if ascending {
                        visible[si][q as usize] as usize
                    } else {
                        seg_start[si] + q as usize
                    };
                    h.mask[base + col] = 0;
                    if let Some(w) = window {
                        if p - q < w {
                            h.mask_swa[base + col] = 0;
                        }
                    }
                }
                row += 1;
            }
        }
        self.host = h;
        Ok((n_tokens as i64, n_kv))
    }
}

/// Query rows at or above which ggml's CPU flash attention switches to its tiled kernel.
pub(super) const FA_TILE_ROWS: usize = 64;

/// Keys per tile of ggml's tiled CPU flash attention.
pub(super) const KV_TILE: u32 = axle_ggml::row_attention::KV_TILE as u32;

/// Splits the batch's rows into attention groups so that every row gets the same attention
/// arithmetic whatever else shares its op (ggml picks its CPU kernel by the number of query rows
/// in the op). `arith` gives each row's arithmetic (empty: compatible for every row), `lens` each
/// sequence's rows; a sequence's rows split into runs of one arithmetic (a recomputed sequence's
/// prompt rows, then its generated rows).
///
/// A run with the tiled kernel's arithmetic of `FA_TILE_ROWS` rows or more (a prefill chunk) is
/// one op of its own, which ggml's tiled kernel runs at full speed; shorter tiled runs share ops
/// of fewer than `FA_TILE_ROWS` rows, which run [`axle_ggml::Context::flash_attn_rows`] (the
/// tiled kernel's numbers). In the tiled kernel a row's numbers depend only on its own keys, laid
/// out in tiles from its sequence's position 0 (which the step layout guarantees), so a
/// position's attention output does not depend on how its prompt was split into steps: a cold
/// prefill, a prefill after a cached prefix, a recomputation after preemption and a decode step
/// give it the same numbers.
///
/// A run with the one-pass arithmetic is cut into ops of `FA_TILE_ROWS - 1` rows, and short runs
/// share such ops, so that every op takes ggml's one-pass kernel (the one libllama decodes with),
/// which computes each row on its own too (its keys in order, masked slots skipped), at a cost
/// that grows with the run.
pub(super) fn attention_groups(
    arith: &[RowArithmetic],
    seqs: impl IntoIterator<Item = (usize, i64)>,
) -> Vec<AttnGroup> {
    const MOST: i64 = FA_TILE_ROWS as i64 - 1;
    let at = |row: i64| arith.get(row as usize).copied().unwrap_or_default();
    let tiled_at = |row: i64| at(row).tiled_attention;
    let split_at = |row: i64| at(row).split_kv > 0;
    let mut groups: Vec<AttnGroup> = Vec::new();
    let mut row = 0i64;
    let mut open: Option<usize> = None;
    for (len, first_col) in seqs {
        let end = row + len as i64;
        while row < end {
            if split_at(row) {
                groups.push(AttnGroup {
                    first: row,
                    rows: 1,
                    tiled: false,
                    split_kv: Some((first_col, i64::from(at(row).split_kv))),
                });
                open = None;
                row += 1;
                continue;
            }
            let tiled = tiled_at(row);
            let n = (row..end)
                .take_while(|&r| tiled_at(r) == tiled && !split_at(r))
                .count() as i64;
            if n > MOST {
                let piece = if tiled { n } else { MOST };
                let mut first = row;
                while first < row + n {
                    let rows = piece.min(row + n - first);
                    groups.push(AttnGroup {
                        first,
                        rows,
                        tiled,
                        split_kv: None,
                    });
                    first += rows;
                }
                open = None;
            } else {
                match open {
                    Some(g)
                        if groups[g].tiled == tiled
                            && groups[g].rows + n <= MOST
                            && groups[g].first + groups[g].rows == row =>
                    {
                        groups[g].rows += n
                    }
                    _ => {
                        groups.push(AttnGroup {
                            first: row,
                            rows: n,
                            tiled,
                            split_kv: None,
                        });
                        open = Some(groups.len() - 1);
                    }
                }
            }
            row += n;
        }
    }
    groups
}

/// Which of `rows` take the tiled product arithmetic; empty where none does (the product then
/// takes one path).
pub(super) fn tiled_product_cols<'r>(rows: impl Iterator<Item = &'r RowArithmetic>) -> Vec<bool> {
    let cols: Vec<bool> = rows.map(|a| a.tiled_products).collect();
    if cols.iter().any(|&t| t) {
        cols
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::attention_groups;
    use crate::layers::AttnGroup;
    use crate::layers::RowArithmetic;

    /// Groups as (first, rows, tiled) of sequences of `lens` rows, every row with the tiled
    /// attention arithmetic or none.
    fn groups(lens: &[usize], tiled: bool) -> Vec<(i64, i64, bool)> {
        let arith = vec![
            RowArithmetic {
                tiled_attention: tiled,
                tiled_products: tiled,
                split_kv: 0,
            };
            lens.iter().sum()
        ];
        flat(attention_groups(&arith, lens.iter().map(|&n| (n, 0))))
    }

    fn flat(groups: Vec<AttnGroup>) -> Vec<(i64, i64, bool)> {
        groups.iter().map(|g| (g.first, g.rows, g.tiled)).collect()
    }

    #[test]
    fn attention_groups_keep_long_tiled_runs_whole() {
        assert_eq!(groups(&[1, 1, 5], true), vec![(0, 7, true)]);
        assert_eq!(
            groups(&[3, 130, 2], true),
            vec![(0, 3, true), (3, 130, true), (133, 2, true)]
        );
        assert_eq!(groups(&[64], true), vec![(0, 64, true)]);
        assert_eq!(
            groups(&[40, 23, 1], true),
            vec![(0, 63, true), (63, 1, true)]
        );
    }

    #[test]
    fn attention_groups_stay_under_the_tiled_kernel() {
        // Short sequences share ops while they stay under 64 rows.
        assert_eq!(groups(&[1, 1, 5], false), vec![(0, 7, false)]);
        assert_eq!(
            groups(&[40, 23, 1], false),
            vec![(0, 63, false), (63, 1, false)]
        );
        // A long run of one sequence is cut into ops of 63 rows, and a short sequence after it
        // starts a new op.
        assert_eq!(
            groups(&[3, 130, 2], false),
            vec![
                (0, 3, false),
                (3, 63, false),
                (66, 63, false),
                (129, 4, false),
                (133, 2, false)
            ]
        );
        assert_eq!(groups(&[63], false), vec![(0, 63, false)]);
        assert_eq!(groups(&[64], false), vec![(0, 63, false), (63, 1, false)]);
        for lens in [vec![496], vec![1, 1, 400, 7, 90]] {
            let groups = groups(&lens, false);
            assert!(groups.iter().all(|&(_, r, _)| (1..64).contains(&r)));
            // The groups tile the rows in order.
            let mut row = 0;
            for &(first, rows, _) in &groups {
                assert_eq!(first, row);
                row += rows;
            }
            assert_eq!(row as usize, lens.iter().sum::<usize>());
        }
    }

    #[test]
    fn attention_groups_split_rows_by_arithmetic() {
        let tiled = RowArithmetic {
            tiled_attention: true,
            tiled_products: true,
            split_kv: 0,
        };
        let one_pass = RowArithmetic::default();
        // A decode row, a prompt chunk of 100 tiled rows, a recomputed sequence of 70 tiled
        // prompt rows and 3 generated rows, two decode rows.
        let mut arith = vec![one_pass];
        arith.extend(vec![tiled; 170]);
        arith.extend(vec![one_pass; 5]);
        assert_eq!(
            flat(attention_groups(&arith, [1, 100, 73, 1, 1].map(|n| (n, 0)))),
            vec![
                (0, 1, false),
                (1, 100, true),
                (101, 70, true),
                (171, 5, false)
            ]
        );
        // Short tiled and one-pass runs never share an op.
        let arith = [tiled, tiled, one_pass, tiled];
        assert_eq!(
            flat(attention_groups(&arith, [2, 1, 1].map(|n| (n, 0)))),
            vec![(0, 2, true), (2, 1, false), (3, 1, true)]
        );
    }

    #[test]
    fn split_kv_rows_get_an_op_each_over_their_sequences_view() {
        let one_pass = RowArithmetic::default();
        let split = |view| RowArithmetic {
            split_kv: view,
            ..one_pass
        };
        // A decode row under 256 positions, then a sequence whose verify rows cross into
        // libllama's 512-cell view, then a decode row at 768 cells; position 0 of each sequence
        // at columns 0, 256 and 1024.
        let arith = [one_pass, one_pass, split(512), split(512), split(768)];
        let groups = attention_groups(&arith, [(1, 0), (3, 256), (1, 1024)]);
        type Group = (i64, i64, Option<(i64, i64)>);
        let got: Vec<Group> = groups
            .iter()
            .map(|g| (g.first, g.rows, g.split_kv))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 2, None),
                (2, 1, Some((256, 512))),
                (3, 1, Some((256, 512))),
                (4, 1, Some((1024, 768)))
            ]
        );
    }

    #[test]
    fn split_kv_views_follow_libllama_for_generated_rows_only() {
        use crate::layers::HostKernels;
        let k = HostKernels::Origin;
        // libllama's view: the cells up to the row's, padded to 256, at least 256.
        assert_eq!(k.row(100, 254, 4096).split_kv, 0);
        assert_eq!(k.row(100, 255, 4096).split_kv, 0);
        assert_eq!(k.row(100, 256, 4096).split_kv, 512);
        assert_eq!(k.row(100, 511, 4096).split_kv, 512);
        assert_eq!(k.row(100, 512, 4096).split_kv, 768);
        // At most the cache.
        assert_eq!(k.row(100, 900, 1000).split_kv, 1000);
        // Prompt rows never; other kernel choices never.
        assert_eq!(k.row(1000, 900, 4096).split_kv, 0);
        assert_eq!(HostKernels::Compatible.row(100, 900, 4096).split_kv, 0);
        assert_eq!(HostKernels::Tiled.row(100, 900, 4096).split_kv, 0);
    }
}
