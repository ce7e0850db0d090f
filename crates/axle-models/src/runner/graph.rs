//! Graphs of step shapes: the shape key, the graphs kept per shape, and building a step's graph
//! through the model family.
use super::*;

/// A built graph kept for its step shape.
#[derive(Debug)]
pub(super) struct CachedGraph {
    pub(super) key: GraphKey,
    pub(super) ctx: Context,
    /// The scheduler slot it is allocated in.
    pub(super) slot: usize,
    /// The step count when it last ran.
    pub(super) last_used: u64,
}

/// Step shapes whose graphs a runner keeps: several with an accelerator (see `Runner::cached`),
/// one on the CPU alone (it records nothing to replay, and each kept graph holds compute buffers
/// of its own). `AXLE_GRAPH_SLOTS=N` overrides it (a diagnostic: comparing on one device).
pub(super) fn graph_slots(accelerated: bool) -> usize {
    if let Some(n) = axle_ggml::env::var("AXLE_GRAPH_SLOTS")
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    if accelerated {
        GRAPH_SLOTS
    } else {
        1
    }
}

/// Graphs kept with an accelerator: one wide step's and ten small ones' (a decode step and verify
/// steps of every draft length up to `axle_core::MAX_DRAFT` (8), with one to spare, or batched
/// steps of as many shapes). A small step's compute buffers are small; a verify shape evicted
/// costs a rebuild and a fresh CUDA graph capture every time it comes back (about 1 ms and a
/// decode step's time again on an H200).
pub(super) const GRAPH_SLOTS: usize = 11;

/// Steps of at most this many tokens count as small: their graphs are kept beside each other.
/// Wider steps (prefill chunks) share one slot, so that kept compute buffers stay small.
pub(super) const KEPT_STEP_TOKENS: i64 = 256;

/// The shape of a step: graphs with equal keys are interchangeable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GraphKey {
    pub(super) n_tokens: i64,
    pub(super) n_kv: u32,
    pub(super) n_out: usize,
    /// Whether attention reads gathered slots (`inp_kv_ids`) rather than a prefix of the cache.
    pub(super) gathered: bool,
    /// The device layout, when steps have one.
    pub(super) device: Option<DeviceStep>,
    /// The attention ops of a host step.
    pub(super) groups: Vec<AttnGroup>,
    /// Which columns take the tiled product arithmetic (empty: none).
    pub(super) tiled_product_cols: Vec<bool>,
    /// The same for the output rows.
    pub(super) tiled_product_out_cols: Vec<bool>,
    /// Recurrent models: each sequence's rows and kept states.
    pub(super) state: Vec<StateSeq>,
}

impl Runner {
    /// Builds the graph of step shape `key` into a free slot, or the least recently used one's;
    /// returns its index in `cached`.
    pub(super) fn build_in_slot(&mut self, key: GraphKey) -> Result<usize, ModelError> {
        self.profile.builds += 1;
        // Slot 0 holds the graph of the last wide step (a prefill chunk): wide steps' compute
        // buffers are the large ones, so only one is kept. Small steps (decoding and verifying,
        // alone or batched) keep theirs in the other slots, least recently used out.
        let small = self.graph_slots > 1 && key.n_tokens <= KEPT_STEP_TOKENS;
        let slot = if small {
            let taken: Vec<usize> = self.cached.iter().map(|c| c.slot).collect();
            match (1..self.graph_slots).find(|s| !taken.contains(s)) {
                Some(free) => {
                    while self.sched.slots() <= free {
                        self.sched.add_slot(self.base_nodes)?;
                    }
                    free
                }
                None => {
                    let lru = (0..self.cached.len())
                        .filter(|&i| self.cached[i].slot > 0)
                        .min_by_key(|&i| self.cached[i].last_used)
                        .unwrap_or(0);
                    self.cached.swap_remove(lru).slot
                }
            }
        } else {
            if let Some(i) = self.cached.iter().position(|c| c.slot == 0) {
                self.cached.swap_remove(i);
            }
            0
        };
        let nodes = self.nodes_for(&key);
        if nodes > self.sched.capacity(slot) {
            self.sched.resize(slot, nodes.next_power_of_two())?;
        }
        let ctx = self.build(&key, nodes)?;
        let mut graph = ctx
            .existing_graph()
            .ok_or_else(|| ModelError::Batch("graph missing".into()))?;
        self.sched.alloc(slot, &mut graph)?;
        self.cached.push(CachedGraph {
            key,
            ctx,
            slot,
            last_used: self.profile.steps,
        });
        Ok(self.cached.len() - 1)
    }

    /// Graph nodes a step of this shape needs: the base, plus a few dozen per layer for every op
    /// of its own: each attention group on the host (a long prefill chunk makes several), and in
    /// the device layout each decoding row's attention and each small column's expert or
    /// per-head products.
    pub(super) fn nodes_for(&self, key: &GraphKey) -> usize {
        let n_layer = self.family().hparams().n_layer;
        let ops = match &key.device {
            None => key.groups.len(),
            Some(d) => {
                let pieces: usize = d
                    .runs
                    .iter()
                    .map(|r| if r.small { r.cols as usize } else { 1 })
                    .sum();
                d.attn.len() + pieces
            }
        };
        let recurrent = self.base_nodes - MAX_NODES;
        (n_layer * (NODES_PER_ROW_OP * ops + NODES_PER_LAYER) + 4096).max(MAX_NODES) + recurrent
    }

    /// Builds the graph of a step shape in a fresh context sized for `nodes` graph nodes.
    pub(super) fn build(&self, key: &GraphKey, nodes: usize) -> Result<Context, ModelError> {
        let has_swa = self.family().sliding_window().is_some();
        let ctx = Context::new(nodes, nodes)?;
        {
            let (n, n_kv) = (key.n_tokens, key.n_kv as i64);
            // The device layout packs each attention op's mask rows one after another.
            let mask_shape = match &key.device {
                Some(d) => d.mask_shape(),
                None => vec![n_kv, n],
            };
            let mut step = Step {
                ctx: &ctx,
                graph: ctx.graph(nodes),
                n_tokens: n,
                tokens: ctx.input(DType::I32, &[n], "inp_tokens"),
                pos: ctx.input(
                    DType::I32,
                    &[n * self.family().positions_per_token() as i64],
                    "inp_pos",
                ),
                slots: ctx.input(DType::I64, &[n], "inp_slots"),
                mask: ctx.input(DType::F16, &mask_shape, "inp_kq_mask"),
                mask_swa: has_swa.then(|| ctx.input(DType::F16, &mask_shape, "inp_kq_mask_swa")),
                out_ids: ctx.input(DType::I32, &[key.n_out as i64], "inp_out_ids"),
                n_kv,
                kv_ids: key
                    .gathered
                    .then(|| ctx.input(DType::I32, &[n_kv], "inp_kv_ids")),
                kv: &self.kv,
                kv_written: Vec::new(),
                state: self.state.as_ref().map(|cache| StateStep {
                    cache,
                    seqs: key.state.clone(),
                    read: ctx.input(DType::I32, &[key.state.len() as i64], "inp_state_read"),
                    write: ctx.input(
                        DType::I64,
                        &[key.state.iter().map(|s| s.keep).sum::<i64>()],
                        "inp_state_write",
                    ),
                }),
                attn_groups: key.groups.clone(),
                tiled_product_cols: key.tiled_product_cols.clone(),
                tiled_product_out_cols: key.tiled_product_out_cols.clone(),
                device: key.device.clone(),
                kernels: self.opts.kernels,
                stacking: self.arithmetic.stacking.as_ref(),
                paged: key
                    .device
                    .as_ref()
                    .and_then(|d| d.paged)
                    .map(|shape| PagedInputs {
                        rows: ctx.input(DType::I32, &[2, n], "inp_pa_rows"),
                        table: ctx.input(DType::I32, &[shape.table_len], "inp_pa_table"),
                        window: self.family().sliding_window().unwrap_or(0),
                        refused: &self.arithmetic.paged_refused,
                    }),
                values: self.opts.values,
                hidden_in: self.opts.mtp.then(|| {
                    let e = self.family().hparams().n_embd;
                    ctx.input(DType::F32, &[e, n], "inp_hidden")
                }),
                returns_hidden: self.returns_hidden(),
                hidden_out: None,
            };
            let logits = self.family().forward(&mut step).named(LOGITS).as_output();
            step.graph.expand(logits);
            if step.returns_hidden {
                let Some(hidden) = step.hidden_out else {
                    return Err(ModelError::Unsupported(format!(
                        "{} steps that return hidden states (for an MTP head)",
                        self.family().hparams().arch
                    )));
                };
                let hidden = hidden.named(HIDDEN).as_output();
                step.graph.expand(hidden);
            }
            // With the head on an accelerator, each row's largest logit is picked there too (a
            // greedy step then reads back one index a row instead of the vocabulary).
            if self.pinned.is_some() && self.opts.values == RowValues::Logits {
                let picks = ctx.argmax(logits).named(PICKS).as_output();
                step.graph.expand(picks);
            }
        }
        Ok(ctx)
    }
}
