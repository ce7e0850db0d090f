//! How a step on an accelerator keeps each row's arithmetic independent of the step's shape.
//!
//! ggml's CUDA kernels pick their arithmetic by the shape of the op, not of the row:
//! - Quantized products of 1-8 columns take the mat-vec kernel (MMVQ), the rest the tiled one
//!   (MMQ, with K split across blocks by grid size). MMVQ sums a row with 4 warps at 1-4 columns
//!   and with 2 warps at 5-8, so a column's result depends on how many columns share the op.
//!   At 1-4 columns (and only there) every column's result is the same bit for bit (on NVIDIA's
//!   generic parameter table: Volta-Turing and GB10 differ at one column).
//! - Flash attention takes its vector kernel for one query row over F16 KV (Ada and newer) and a
//!   tensor-core kernel otherwise, and splits the KV range into parallel blocks by occupancy, which
//!   depends on the number of query rows, heads and KV slots in the op.
//!
//! So on a device, a step's products run its "small" columns (sequences decoding or verifying
//! drafts) in groups of [`GROUP_COLS`] through MMVQ, whatever sequence each column belongs to, and
//! gives each prefill chunk its own product, as wide as the chunk; attention runs one op per query
//! row of small sequences and one per prefill chunk, each over that sequence's own slots (starting
//! at its position 0) padded to a length that depends only on the row's position. A row's numbers
//! then depend on its sequence alone, and decode, verify and batched steps agree bit for bit.
//! (Where the device gives each row the same bits that way, a sequence's one-row ops over the same
//! slots run as one op: [`crate::stacked_attention`]; the layout still lists one op per row.)
//! Prefill chunks keep their wide kernels: their numbers depend on how the prompt was chunked.
//!
//! On CUDA ([`DeviceProducts::Wide`]) the small columns of quantized products go through MMQ
//! instead, which reads the weights once for up to 128 columns rather than once per 4. MMQ's
//! arithmetic for a column depends on how the K range of each tile of output rows is split across
//! thread blocks (stream-k), and that split depends only on the number of tiles: with all of an
//! op's columns in one column tile (at most 128 columns) and no batch dimension, it is the number
//! of row tiles, a property of the weight. So every small column gets the same numbers in an op of
//! 9 to 128 columns. Below [`WIDE_MIN_COLS`] ggml takes MMVQ, so ops of fewer columns go through
//! Axle's replay of MMQ's arithmetic where the backends carry it for the weight
//! ([`axle_ggml::wide_replay`], [`DeviceStep::wide_replay`]: one pass over the weights at mat-vec
//! speed). A weight the replay does not take (the Q6_K output head of a Q4_0 model) multiplies
//! its small columns with the column-invariant kernel's arithmetic at every width where the
//! backends carry it ([`DeviceStep::wide_by_columns`]), and is padded with zero columns to
//! [`WIDE_MIN_COLS`] otherwise. Wider runs are cut into ops of at most [`WIDE_MAX_COLS`].

/// Columns per MMVQ op: at 1 to 4 columns MMVQ gives every column the same arithmetic.
pub const GROUP_COLS: i64 = 4;

/// Columns per op of an F32 weight (MoE routers): ggml's CUDA backend takes its float mat-vec
/// kernel (MMVF) for F32 weights at 1 to 3 columns only on GPUs with tensor cores (Ampere and
/// newer; 4 on Turing), and a tensor-core or cuBLAS product from there, which rounds
/// differently; a group of 4 would give a router's logits other bits than a one-token step.
pub const FLOAT_GROUP_COLS: i64 = 3;

/// A sequence with at most this many tokens in a step (a decode, a verify step of up to 8
/// drafts, a short prefill chunk) is "small": its columns go through MMVQ groups and its rows get
/// attention ops of their own. Longer ones (prefill chunks, or a long run of tokens asking for
/// every row's logits) get one product and one attention op: the classification depends on the
/// sequence alone, so a row is treated the same way whatever shares its step.
pub const SMALL_TOKENS: usize = 9;

/// Fewest columns of a [`DeviceProducts::Wide`] op: ggml's CUDA backend takes MMVQ up to 8.
pub const WIDE_MIN_COLS: i64 = 9;

/// Most columns of a [`DeviceProducts::Wide`] op: MMQ's widest column tile, so that an op's
/// columns share one tile and its stream-k split depends on the weight alone.
pub const WIDE_MAX_COLS: i64 = 128;

/// How a step's small columns multiply quantized weights on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceProducts {
    /// Groups of [`GROUP_COLS`] through the mat-vec kernel: one pass over the weights per group.
    /// For devices whose tiled kernel is not known to be column-invariant.
    #[default]
    Groups,
    /// Ops of [`WIDE_MIN_COLS`] to [`WIDE_MAX_COLS`] columns through CUDA's tiled MMQ kernel: one
    /// pass over the weights per 128 columns (see the module notes); weights whose few-column
    /// products Axle cannot replay take the column-invariant kernel where it covers them.
    Wide,
    /// One op over all small columns through Axle's column-invariant kernel in the CUDA backend
    /// ([`axle_ggml::column_invariant`]): one-column MMVQ arithmetic for every column, one pass
    /// over the weights per 8 columns; groups for weight types the backend does not cover.
    Columns,
}

impl DeviceProducts {
    /// The products `AXLE_DEVICE_PRODUCTS` asks for where the runner's options name none: `None`
    /// where it is unset or empty, an error that names it where its value is not one of the
    /// names. With the exact kernels the runner honours or refuses the choice as it does an
    /// explicit one.
    pub fn from_env() -> Result<Option<DeviceProducts>, String> {
        from_env_value(axle_ggml::env::var("AXLE_DEVICE_PRODUCTS").as_deref())
    }
}

fn from_env_value(value: Option<&str>) -> Result<Option<DeviceProducts>, String> {
    value
        .filter(|v| !v.is_empty())
        .map(|v| v.parse().map_err(|e| format!("AXLE_DEVICE_PRODUCTS: {e}")))
        .transpose()
}

// The names of the CLI's `--device-products`.
crate::choice::named_choice!(DeviceProducts, "device products", {
    "groups" => DeviceProducts::Groups,
    "wide" => DeviceProducts::Wide,
    "columns" => DeviceProducts::Columns,
});

/// How decode and verify rows attend on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceAttention {
    /// One op per layer for every small row of the step: Axle's paged attention
    /// ([`axle_ggml::paged_attention`]), reading each row's keys through its block table, with a
    /// split of the keys that depends on the row alone. Where the backend does not carry the
    /// kernel, or a layer's heads are not ones it takes, rows get ops of their own.
    #[default]
    Paged,
    /// An op of ggml's per small row (or per run of rows the device stacks), over that row's
    /// sequence's slots with a mask of its own: host work and ops grow with the rows and their
    /// contexts (docs/gpu.md, "Against llama.cpp's own tools").
    Rows,
}

// The names of the CLI's `--device-attention`.
crate::choice::named_choice!(DeviceAttention, "device attention", {
    "paged" => DeviceAttention::Paged,
    "rows" => DeviceAttention::Rows,
});

/// KV lengths of attention ops are multiples of this (ggml's CUDA vector kernel needs it).
pub const KV_ALIGN: u32 = 256;

/// A run of consecutive columns of the step's activations and how it is multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnRun {
    /// First column.
    pub first: i64,
    /// Columns.
    pub cols: i64,
    /// Small columns (MMVQ groups) rather than one prefill chunk (one product of its own).
    pub small: bool,
}

/// One attention op: query rows `first..first + rows` over `kv_len` slots of the KV source
/// starting at `kv_off`, with a mask of `kv_len * rows` elements at `mask_off` of the mask input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnOp {
    /// First query row of the step.
    pub first: i64,
    /// Query rows.
    pub rows: i64,
    /// First slot of the KV source (the cache, or the gathered slots).
    pub kv_off: i64,
    /// Slots attended (a multiple of [`KV_ALIGN`]).
    pub kv_len: i64,
    /// Offset of this op's mask in the mask input, in elements.
    pub mask_off: i64,
}

/// The device layout of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceStep {
    /// Column runs of the step's tokens, in order.
    pub runs: Vec<ColumnRun>,
    /// Attention ops, in row order.
    pub attn: Vec<AttnOp>,
    /// Elements of the mask input.
    pub mask_len: i64,
    /// Slots gathered into a KV of the step's own (`None`: ops read the cache directly).
    pub gathered: Option<i64>,
    /// Small rows attend through one paged op per layer ([`DeviceAttention::Paged`]).
    pub paged: Option<PagedStep>,
    /// How small columns multiply quantized weights (the runner's choice for its devices).
    pub products: DeviceProducts,
    /// With [`DeviceProducts::Columns`]: the weight types (bit `1 << ggml type id`) that every
    /// device of the model multiplies through the column-invariant kernel, as their backends
    /// answer ([`axle_ggml::Device::column_invariant_products`]).
    pub column_types: u64,
    /// With [`DeviceProducts::Wide`]: the weight types (bit per type) whose products of fewer
    /// than [`WIDE_MIN_COLS`] columns every device of the model gives MMQ's numbers through
    /// Axle's replay ([`axle_ggml::wide_replay`]) instead of padding them with zero columns.
    pub replay_types: u64,
}

impl DeviceStep {
    /// A layout of no rows that only decides how small columns multiply (the runner's check of
    /// its products at load, [`crate::small_products::probe`]).
    pub fn for_products(products: DeviceProducts, column_types: u64, replay_types: u64) -> Self {
        DeviceStep {
            runs: Vec::new(),
            attn: Vec::new(),
            mask_len: 0,
            gathered: None,
            paged: None,
            products,
            column_types,
            replay_types,
        }
    }

    /// Whether small columns of a `dtype` weight go through the column-invariant kernel.
    pub fn column_invariant(&self, dtype: axle_ggml::DType) -> bool {
        self.products == DeviceProducts::Columns
            && dtype.raw() < 64
            && self.column_types & (1u64 << dtype.raw()) != 0
    }

    /// Whether small columns of a `dtype` weight of `rows` rows of `row_len` weights take the
    /// column-invariant kernel's arithmetic (one-column MMVQ's, at every width) under wide
    /// products: a weight whose few-column products the replay does not take
    /// ([`DeviceStep::wide_replay`]) where the backends carry the column-invariant kernel for its
    /// type (the Q6_K output head of a Q4_0 model). Padded to [`WIDE_MIN_COLS`] instead, such a
    /// product would read the weight through MMQ at about half the mat-vec kernel's speed for a
    /// lone sequence.
    pub fn wide_by_columns(&self, dtype: axle_ggml::DType, row_len: i64, rows: i64) -> bool {
        self.products == DeviceProducts::Wide
            && !self.wide_replay(dtype, row_len, rows)
            && dtype.raw() < 64
            && self.column_types & (1u64 << dtype.raw()) != 0
    }

    /// Whether a product of fewer than [`WIDE_MIN_COLS`] columns of a `dtype` weight of `rows`
    /// rows of `row_len` weights takes Axle's replay of MMQ: wide products, a type the backends
    /// replay, rows of whole K iterations ([`axle_ggml::wide_replay::ROW_MULTIPLE`]), at most
    /// [`axle_ggml::wide_replay::ROW_MAX`] weights a row and
    /// [`axle_ggml::wide_replay::ROWS_MAX`] rows (the bounds the backend refuses beyond).
    /// Otherwise such a product is padded to [`WIDE_MIN_COLS`] columns.
    pub fn wide_replay(&self, dtype: axle_ggml::DType, row_len: i64, rows: i64) -> bool {
        self.products == DeviceProducts::Wide
            && dtype.raw() < 64
            && self.replay_types & (1u64 << dtype.raw()) != 0
            && row_len % axle_ggml::wide_replay::ROW_MULTIPLE == 0
            && row_len <= axle_ggml::wide_replay::ROW_MAX
            && rows <= axle_ggml::wide_replay::ROWS_MAX
    }
}

impl DeviceStep {
    /// Shape of the mask input: the op's own when the step has one op, else every op's block
    /// one after another.
    pub fn mask_shape(&self) -> Vec<i64> {
        match self.attn.as_slice() {
            [op] => vec![op.kv_len, op.rows],
            _ => vec![self.mask_len.max(1)],
        }
    }
}

/// The shape of a step's paged attention (part of the graph's shape): sizes rounded up to powers
/// of two, so that decoding sequences growing by a token a step keep their graph for long runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedStep {
    /// Slots per block.
    pub block_size: u32,
    /// Length of the block-table input.
    pub table_len: i64,
    /// Key chunks the op covers ([`axle_kernels::paged_attention::CHUNK`] keys each).
    pub chunks: u32,
}

/// One sequence of a step, as the layout sees it.
#[derive(Debug, Clone)]
pub struct SeqSlots<'s> {
    /// Position of the first token of the step.
    pub start_pos: u32,
    /// Tokens in the step.
    pub n_tokens: usize,
    /// Slot of each position `0..start_pos + n_tokens` (with paged attention only sequences
    /// that are not small need them).
    pub slots: &'s [u32],
    /// Block ids covering every position up to the end of the step (read by paged attention).
    pub block_table: &'s [u32],
}

/// The layout of a step and its inputs: mask values (F16 bits) and gathered slot ids.
#[derive(Debug, Clone)]
pub struct DeviceInputs {
    /// The layout (the graph's shape).
    pub step: DeviceStep,
    /// Mask of full-attention layers.
    pub mask: Vec<u16>,
    /// Mask of sliding-window layers (empty without a window).
    pub mask_swa: Vec<u16>,
    /// Slots to gather (empty when ops read the cache directly).
    pub kv_ids: Vec<i32>,
    /// With paged attention: per step row, the offset of its sequence's block table in
    /// `paged_table` and the keys it sees (0 for rows of sequences that are not small).
    pub paged_rows: Vec<i32>,
    /// With paged attention: the block tables of the small sequences, one after another, padded
    /// to [`PagedStep::table_len`].
    pub paged_table: Vec<i32>,
}

fn align(n: u32) -> u32 {
    n.div_ceil(KV_ALIGN) * KV_ALIGN
}

/// Lays out a step over `kv_slots` cache slots. `window`: the sliding window, if the model has
/// sliding-window layers. Each sequence must list the slots of all its positions up to the end of
/// the step.
pub fn layout(seqs: &[SeqSlots<'_>], kv_slots: u32, window: Option<u32>) -> DeviceInputs {
    layout_with(seqs, kv_slots, window, None)
}

/// [`layout`], with paged attention for small sequences when `paged_block` names the block size:
/// their rows get no op, mask or gathered slots of their own, only an entry of `paged_rows` (so
/// the host's work for them grows with their blocks, not their tokens); sequences that are not
/// small are laid out as [`layout`] does.
pub fn layout_with(
    seqs: &[SeqSlots<'_>],
    kv_slots: u32,
    window: Option<u32>,
    paged_block: Option<u32>,
) -> DeviceInputs {
    let paged_row = |s: &SeqSlots<'_>| paged_block.is_some() && s.n_tokens <= SMALL_TOKENS;
    // Read the cache directly when every sequence's slots are consecutive and its padded range
    // fits, and decoding sequences next to each other in the step have ranges that do not
    // overlap (so that rows of sequences in lanes of the pool, one after another, share one op
    // reading the cache at a stride; overlapping ranges, from lanes narrower than a range,
    // would leave every row an op of its own); otherwise gather each sequence's slots into a
    // segment of its own.
    let range = |s: &SeqSlots<'_>| {
        let first = s.slots.first().copied().unwrap_or(0) as u64;
        (first, first + align(s.start_pos + s.n_tokens as u32) as u64)
    };
    let direct = seqs.iter().filter(|s| !paged_row(s)).all(|s| {
        let first = s.slots.first().copied().unwrap_or(0);
        s.slots
            .iter()
            .enumerate()
            .all(|(q, &slot)| slot == first + q as u32)
            && range(s).1 <= kv_slots as u64
    }) && seqs.windows(2).all(|w| {
        if paged_row(&w[0]) || paged_row(&w[1]) {
            return true;
        }
        let small = |s: &SeqSlots<'_>| s.n_tokens <= SMALL_TOKENS;
        let (a, b) = (range(&w[0]), range(&w[1]));
        !(small(&w[0]) && small(&w[1])) || a.1 <= b.0 || b.1 <= a.0
    });
    let mut kv_ids: Vec<i32> = Vec::new();
    let mut bases = Vec::with_capacity(seqs.len());
    let mut paged_rows: Vec<i32> = Vec::new();
    let mut paged_table: Vec<i32> = Vec::new();
    let mut max_end = 0u32;
    for s in seqs {
        if paged_row(s) {
            bases.push(0);
            continue;
        }
        if direct {
            bases.push(s.slots.first().copied().unwrap_or(0) as i64);
        } else {
            let end = s.start_pos + s.n_tokens as u32;
            bases.push(kv_ids.len() as i64);
            let seg = kv_ids.len() + align(end) as usize;
            kv_ids.extend(s.slots.iter().map(|&x| x as i32));
            // Padding slots are masked; any valid slot does.
            kv_ids.resize(seg, 0);
        }
    }
    let neg = half::f16::NEG_INFINITY.to_bits();
    let mut runs: Vec<ColumnRun> = Vec::new();
    let mut attn = Vec::new();
    let mut mask = Vec::new();
    let mut mask_swa = Vec::new();
    let mut row = 0i64;
    for (s, &base) in seqs.iter().zip(&bases) {
        let n = s.n_tokens as i64;
        let small = s.n_tokens <= SMALL_TOKENS;
        match runs.last_mut() {
            Some(r) if small && r.small => r.cols += n,
            _ => runs.push(ColumnRun {
                first: row,
                cols: n,
                small,
            }),
        }
        if paged_row(s) {
            let off = paged_table.len() as i32;
            paged_table.extend(s.block_table.iter().map(|&b| b as i32));
            for t in 0..s.n_tokens as u32 {
                paged_rows.extend([off, (s.start_pos + t + 1) as i32]);
            }
            max_end = max_end.max(s.start_pos + s.n_tokens as u32);
            row += n;
            continue;
        }
        if paged_block.is_some() {
            paged_rows.extend(std::iter::repeat_n(0, 2 * s.n_tokens));
        }
        // Small sequences: one op per row, over the slots up to the row's own position.
        // A prefill chunk: one op over the slots up to its last position.
        let ops: Vec<(i64, i64, u32)> = if small {
            (0..n)
                .map(|t| (row + t, 1, align(s.start_pos + t as u32 + 1)))
                .collect()
        } else {
            vec![(row, n, align(s.start_pos + s.n_tokens as u32))]
        };
        for (first, rows, len) in ops {
            attn.push(AttnOp {
                first,
                rows,
                kv_off: base,
                kv_len: len as i64,
                mask_off: mask.len() as i64,
            });
            // Row p sees slots 0..=p (and, through a window w, only the last w of them): each
            // mask row is runs of equal values, filled as runs.
            for r in 0..rows {
                let p = s.start_pos + (first - row + r) as u32;
                let seen = (p + 1).min(len) as usize;
                let hidden = len as usize - seen;
                mask.resize(mask.len() + seen, 0);
                mask.resize(mask.len() + hidden, neg);
                if let Some(w) = window {
                    let before = ((p + 1).saturating_sub(w) as usize).min(seen);
                    mask_swa.resize(mask_swa.len() + before, neg);
                    mask_swa.resize(mask_swa.len() + seen - before, 0);
                    mask_swa.resize(mask_swa.len() + hidden, neg);
                }
            }
        }
        row += n;
    }
    let paged = paged_block.filter(|_| max_end > 0).map(|block_size| {
        let table_len = paged_table.len().max(64).next_power_of_two();
        paged_table.resize(table_len, 0);
        let chunks = axle_kernels::paged_attention::Shape::chunks(max_end as usize);
        PagedStep {
            block_size,
            table_len: table_len as i64,
            chunks: chunks.next_power_of_two() as u32,
        }
    });
    if paged.is_none() {
        paged_rows.clear();
        paged_table.clear();
    }
    DeviceInputs {
        step: DeviceStep {
            runs,
            attn,
            mask_len: mask.len() as i64,
            gathered: (!direct && !kv_ids.is_empty()).then_some(kv_ids.len() as i64),
            paged,
            products: DeviceProducts::default(),
            column_types: 0,
            replay_types: 0,
        },
        mask,
        mask_swa,
        kv_ids,
        paged_rows,
        paged_table,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every op's mask rows, element by element: slot q is visible to row p where q <= p (and,
    /// through window w, p - q < w), as the runs the layout fills must give.
    #[test]
    fn masks_hide_the_future_and_what_lies_past_the_window() {
        let neg = half::f16::NEG_INFINITY.to_bits();
        let slots: Vec<u32> = (0..2048).collect();
        for (start, n, window) in [
            (0, 300, None),
            (700, 333, Some(256)),
            (0, 100, Some(4096)),
            (1000, 24, Some(1)),
            (37, 1, Some(3)),
            (300, 2, None),
        ] {
            let seqs = [seq(start, n, &slots[..start as usize + n])];
            let d = layout(&seqs, 4096, window);
            for op in &d.step.attn {
                for r in 0..op.rows {
                    let p = start as i64 + op.first + r;
                    for q in 0..op.kv_len {
                        let at = (op.mask_off + r * op.kv_len + q) as usize;
                        let want = if q <= p { 0 } else { neg };
                        assert_eq!(d.mask[at], want, "start {start} row {r} slot {q}");
                        if let Some(w) = window {
                            let want = if q <= p && p - q < w as i64 { 0 } else { neg };
                            assert_eq!(d.mask_swa[at], want, "window {w} row {r} slot {q}");
                        }
                    }
                }
            }
            assert_eq!(
                d.mask_swa.len(),
                if window.is_some() { d.mask.len() } else { 0 }
            );
        }
    }

    /// The layout of a step of one sequence decoding its first token.
    fn one_decode_row() -> DeviceStep {
        let seqs = [SeqSlots {
            start_pos: 0,
            n_tokens: 1,
            slots: &[0],
            block_table: &[0],
        }];
        layout(&seqs, 256, None).step
    }

    #[test]
    fn wide_replay_needs_the_mode_the_type_and_whole_k_iterations() {
        let mut step = one_decode_row();
        let q4_0 = axle_ggml::DType::from_raw(2).expect("q4_0");
        step.replay_types = 1 << q4_0.raw();
        assert!(!step.wide_replay(q4_0, 4096, 4096), "groups: no replay");
        step.products = DeviceProducts::Wide;
        assert!(step.wide_replay(q4_0, 4096, 4096));
        assert!(
            step.wide_replay(q4_0, 14336, 4096),
            "56 K iterations of 256"
        );
        assert!(
            !step.wide_replay(q4_0, 4096 + 32, 4096),
            "not whole K iterations: padded"
        );
        assert!(!step.wide_replay(q4_0, 2 * axle_ggml::wide_replay::ROW_MAX, 4096));
        assert!(
            !step.wide_replay(axle_ggml::DType::Q8_0, 4096, 4096),
            "a type not replayed"
        );
        assert!(
            !step.wide_replay(q4_0, 4096, axle_ggml::wide_replay::ROWS_MAX + 1),
            "more rows than the counters cover: padded"
        );
        assert!(
            step.wide_replay(q4_0, 4096, 128_256),
            "a 128K-vocabulary head"
        );
        step.products = DeviceProducts::Columns;
        assert!(!step.wide_replay(q4_0, 4096, 4096), "columns: no replay");
    }

    #[test]
    fn column_invariant_products_need_the_mode_and_the_type() {
        let mut step = one_decode_row();
        let q4_0 = axle_ggml::DType::from_raw(2).expect("q4_0");
        let q8_0 = axle_ggml::DType::Q8_0;
        step.column_types = 1 << q4_0.raw();
        assert!(
            !step.column_invariant(q4_0),
            "groups: the kernel is not asked for"
        );
        step.products = DeviceProducts::Columns;
        assert!(step.column_invariant(q4_0));
        assert!(
            !step.column_invariant(q8_0),
            "a type the backend does not cover"
        );
        assert!(!step.column_invariant(axle_ggml::DType::F32));
    }

    #[test]
    fn wide_products_take_the_column_kernel_for_weights_the_replay_does_not_take() {
        let mut step = one_decode_row();
        let q4_0 = axle_ggml::DType::from_raw(2).expect("q4_0");
        let q6_k = axle_ggml::DType::from_raw(14).expect("q6_k");
        step.replay_types = 1 << q4_0.raw();
        step.column_types = (1 << q4_0.raw()) | (1 << q6_k.raw());
        step.products = DeviceProducts::Wide;
        assert!(step.wide_by_columns(q6_k, 4096, 128_256), "the Q6_K head");
        assert!(
            !step.wide_by_columns(q4_0, 4096, 4096),
            "replayed: MMQ's numbers"
        );
        assert!(
            step.wide_by_columns(q4_0, 4096 + 32, 4096),
            "a Q4_0 weight the replay does not take"
        );
        assert!(
            !step.wide_by_columns(axle_ggml::DType::Q8_0, 4096, 4096),
            "neither kernel: padded"
        );
        step.products = DeviceProducts::Columns;
        assert!(
            !step.wide_by_columns(q6_k, 4096, 128_256),
            "not wide products"
        );
    }

    /// Round trips of the names are in `choice.rs`; here the error lists every name.
    #[test]
    fn device_products_parse_errors_name_every_choice() {
        let err = "narrow".parse::<DeviceProducts>().unwrap_err();
        assert!(err.contains("groups, wide or columns"), "{err}");
        // The environment's value: unset or empty is no choice, a name is one, anything else an error
        // that names the variable.
        assert_eq!(from_env_value(None), Ok(None));
        assert_eq!(from_env_value(Some("")), Ok(None));
        assert_eq!(from_env_value(Some("wide")), Ok(Some(DeviceProducts::Wide)));
        let err = from_env_value(Some("narrow")).unwrap_err();
        assert!(err.starts_with("AXLE_DEVICE_PRODUCTS: "), "{err}");
        assert!(err.contains("groups, wide or columns"), "{err}");
    }

    fn seq(start_pos: u32, n_tokens: usize, slots: &[u32]) -> SeqSlots<'_> {
        SeqSlots {
            start_pos,
            n_tokens,
            slots,
            block_table: &[],
        }
    }

    #[test]
    fn paged_small_sequences_get_table_entries_and_prefill_chunks_keep_their_ops() {
        // A verify step of 3 rows at positions 297..300 (19 blocks), a prefill chunk of 20
        // tokens, and a decode row at position 9.
        let slots: Vec<u32> = (0..320).collect();
        let table_a: Vec<u32> = (0..19).rev().collect();
        let table_c = [40u32];
        let seqs = [
            SeqSlots {
                block_table: &table_a,
                ..seq(297, 3, &[])
            },
            seq(0, 20, &slots[..20]),
            SeqSlots {
                block_table: &table_c,
                ..seq(9, 1, &[])
            },
        ];
        let d = layout_with(&seqs, 4096, None, Some(16));
        let paged = d.step.paged.expect("small rows attend paged");
        assert_eq!(paged.block_size, 16);
        assert_eq!(paged.table_len, 64, "19 + 1 entries, at least 64");
        assert_eq!(paged.chunks, 2, "300 keys: two chunks of 256");
        let mut rows = vec![0, 298, 0, 299, 0, 300];
        rows.extend([0; 40]);
        rows.extend([19, 10]);
        assert_eq!(d.paged_rows, rows);
        assert_eq!(
            &d.paged_table[..20],
            &[18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 40]
        );
        assert_eq!(d.paged_table.len(), 64);
        // Only the prefill chunk has an op and a mask; nothing is gathered for the others.
        assert_eq!(d.step.attn.len(), 1);
        assert_eq!((d.step.attn[0].first, d.step.attn[0].rows), (3, 20));
        assert_eq!(d.mask.len(), 256 * 20);
        assert_eq!(d.step.gathered, None);
        let runs: Vec<_> = d
            .step
            .runs
            .iter()
            .map(|r| (r.first, r.cols, r.small))
            .collect();
        assert_eq!(runs, [(0, 3, true), (3, 20, false), (23, 1, true)]);
        // Without paged attention the same step has an op per small row.
        assert_eq!(
            layout_with(&[seq(9, 1, &slots[..10])], 4096, None, None)
                .step
                .paged,
            None
        );
    }

    #[test]
    fn a_row_gets_the_same_op_in_decode_verify_and_batched_steps() {
        let slots: Vec<u32> = (32..32 + 300).collect();
        // Decode of position 299 alone.
        let decode = layout(&[seq(299, 1, &slots[..300])], 4096, None);
        // Verify of positions 297..300 (3 drafts), and the same verify beside another sequence.
        let verify = layout(&[seq(297, 3, &slots[..300])], 4096, None);
        let other: Vec<u32> = (1000..1010).collect();
        let batched = layout(&[seq(297, 3, &slots[..300]), seq(9, 1, &other)], 4096, None);
        let op_of = |d: &DeviceInputs, row: i64| {
            let op = *d.step.attn.iter().find(|o| o.first == row).unwrap();
            let m = &d.mask[op.mask_off as usize..(op.mask_off + op.kv_len) as usize];
            (op.kv_off, op.kv_len, m.to_vec())
        };
        assert_eq!(op_of(&decode, 0), op_of(&verify, 2));
        assert_eq!(op_of(&verify, 2), op_of(&batched, 2));
        assert_eq!(op_of(&decode, 0).1, 512);
        assert_eq!(decode.step.gathered, None);
        assert_eq!(batched.step.gathered, None);
        // Gathered (beside a sequence whose range overlaps this one's): the row's own segment,
        // the same length and mask.
        let overlapping: Vec<u32> = (400..410).collect();
        let gathered = layout(
            &[seq(9, 1, &overlapping), seq(297, 3, &slots[..300])],
            4096,
            None,
        );
        assert_eq!(gathered.step.gathered, Some(256 + 512));
        let (off, len, mask) = op_of(&gathered, 3);
        assert_eq!((off, len, mask), (256, 512, op_of(&decode, 0).2));
        // All small: one column run.
        assert_eq!(
            batched.step.runs,
            vec![ColumnRun {
                first: 0,
                cols: 4,
                small: true
            }]
        );
    }

    #[test]
    fn prefill_chunks_get_their_own_product_and_op() {
        let a: Vec<u32> = (0..100).collect();
        let b: Vec<u32> = (256..266).collect();
        let d = layout(
            &[seq(0, 100, &a), seq(9, 1, &b), seq(8, 2, &b[..10])],
            4096,
            Some(4),
        );
        assert_eq!(
            d.step.runs,
            vec![
                ColumnRun {
                    first: 0,
                    cols: 100,
                    small: false
                },
                ColumnRun {
                    first: 100,
                    cols: 3,
                    small: true
                }
            ]
        );
        assert_eq!(d.step.attn.len(), 4);
        assert_eq!((d.step.attn[0].rows, d.step.attn[0].kv_len), (100, 256));
        // Sliding window of 4: row 99 sees positions 96..=99.
        let m = &d.mask_swa[99 * 256..100 * 256];
        let seen: Vec<usize> = (0..256).filter(|&q| m[q] == 0).collect();
        assert_eq!(seen, vec![96, 97, 98, 99]);
        assert_eq!(d.mask.len(), d.mask_swa.len());
        assert_eq!(d.step.mask_len as usize, d.mask.len());
    }

    #[test]
    fn sequences_in_lanes_are_read_in_place_where_their_ranges_do_not_overlap() {
        // Three decoding sequences in lanes of 272 slots, 40-100 positions each: read in place,
        // one op each at its lane's start.
        let lane = |l: u32, n: u32| (l * 272..l * 272 + n).collect::<Vec<u32>>();
        let (a, b, c) = (lane(0, 40), lane(1, 100), lane(2, 64));
        let d = layout(
            &[seq(39, 1, &a), seq(99, 1, &b), seq(63, 1, &c)],
            816 + 256,
            None,
        );
        assert_eq!(d.step.gathered, None);
        let offs: Vec<(i64, i64)> = d.step.attn.iter().map(|o| (o.kv_off, o.kv_len)).collect();
        assert_eq!(offs, [(0, 256), (272, 256), (544, 256)]);
        // A range past the cache's end is gathered (the runner's cache has KV_ALIGN slots past
        // the pool's for the last lane's).
        assert_eq!(
            layout(&[seq(63, 1, &c)], 790, None).step.gathered,
            Some(256)
        );
        // Lanes narrower than a range: the ranges overlap, so the rows are gathered (and share an
        // op over segments one after another).
        let narrow = |l: u32, n: u32| (l * 128..l * 128 + n).collect::<Vec<u32>>();
        let (a, b) = (narrow(0, 40), narrow(1, 100));
        let d = layout(&[seq(39, 1, &a), seq(99, 1, &b)], 4096, None);
        assert_eq!(d.step.gathered, Some(512));
        // Out of order but not overlapping: read in place (each row its own op).
        let (a, b) = (lane(0, 40), lane(1, 100));
        let d = layout(&[seq(99, 1, &b), seq(39, 1, &a)], 4096, None);
        assert_eq!(d.step.gathered, None);
        let offs: Vec<i64> = d.step.attn.iter().map(|o| o.kv_off).collect();
        assert_eq!(offs, [272, 0]);
        // A prefill chunk beside them may overlap the next lane: it reads in place alone.
        let p = lane(0, 200);
        let d = layout(&[seq(0, 200, &p), seq(99, 1, &b)], 4096, None);
        assert_eq!(d.step.gathered, None);
    }

    #[test]
    fn scattered_blocks_are_gathered_in_logical_order() {
        // Positions 0..20 in two blocks of 16, the second before the first.
        let slots: Vec<u32> = (64..80).chain(16..20).collect();
        let d = layout(&[seq(19, 1, &slots)], 4096, None);
        assert_eq!(d.step.gathered, Some(256));
        assert_eq!(
            &d.kv_ids[..20],
            &slots.iter().map(|&x| x as i32).collect::<Vec<_>>()[..]
        );
        assert_eq!(d.step.attn[0].kv_off, 0);
        // A sequence whose padded range would run past the cache is gathered too.
        let tail: Vec<u32> = (4000..4010).collect();
        let d = layout(&[seq(9, 1, &tail)], 4096, None);
        assert_eq!(d.step.gathered, Some(256));
    }
}
