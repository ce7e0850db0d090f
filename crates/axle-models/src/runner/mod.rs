//! The runner: executes one step of a plan (many sequences, each a prefill chunk or a decode
//! token) as one ggml graph over the whole batch, with KV in paged slots. It builds the graph
//! inputs (token ids, positions, slot indices, attention masks, output rows), lets the model family
//! build the graph, computes it and returns the logits of the rows that asked for them. It decides
//! no policy: which tokens, which slots and which rows come from the caller (the core).
use crate::device_step::{self, DeviceAttention, DeviceProducts, DeviceStep, SeqSlots};
use crate::kv::{KvCache, KvType};
use crate::layers::{AttnGroup, HostKernels, Kernels, PagedInputs, RowArithmetic, RowValues, Step};
use crate::model::Model;
use crate::recurrent::{RecurrentCache, StateSeq, StateSlots, StateStep};
use crate::small_products;
use crate::stacked_attention::{self, StackKey, StackTable};
use crate::ModelError;
use axle_core::{RowLogits, TokenId};
use axle_ggml::{Backend, BufferType, Context, DType, GraphScheduler, PinnedHost, StoredTensor};
use half::f16;
use smart_default::SmartDefault;
use std::sync::Arc;

mod arithmetic;
mod graph;
mod kv_budget;
mod prepare;
mod products;
mod step_io;

use arithmetic::{takes_device_layout, Arithmetic};
use graph::{graph_slots, CachedGraph, GraphKey};
use kv_budget::check_kv_fits;
pub use kv_budget::{kv_layers, kv_slots_that_fit};
use prepare::{tiled_product_cols, HostInputs};
use products::all_cuda;
pub use products::{column_types, default_products, replay_types, WIDE_FROM_SEQS};
use step_io::check_token;
pub use step_io::{LogitRows, SeqInput, StepOutput};

/// Options of a runner.
#[derive(Debug, Clone, SmartDefault)]
pub struct RunnerOptions {
    /// KV slots (the total context across all sequences).
    #[default(4096)]
    pub kv_slots: u32,
    /// Slots per block.
    #[default(16)]
    pub block_size: u32,
    /// Most tokens in one step.
    #[default(512)]
    pub max_batch_tokens: usize,
    /// Kernel choice: batch-invariant (the default), or libllama's for oracle comparisons.
    pub kernels: Kernels,
    /// Use the device layout of steps (see [`crate::device_step`]) with host KV too, so that
    /// machines without an accelerator can test it. With batch-invariant kernels it is used
    /// whenever some layer's KV lives on an accelerator, whatever this says.
    pub force_device_layout: bool,
    /// How the device layout multiplies small columns by quantized weights (`None`: by device
    /// and `max_seqs`, see [`default_products`]).
    pub device_products: Option<DeviceProducts>,
    /// How decode and verify rows attend in the device layout.
    pub device_attention: DeviceAttention,
    /// Most sequences the engine runs at once (its capacity): picks the default products.
    #[default(1)]
    pub max_seqs: usize,
    /// Step shapes whose graphs are kept (`None`: by device, see `graph_slots`).
    pub graph_slots: Option<usize>,
    /// Recurrent models: sequences that can hold state at once (state groups).
    #[default(1)]
    pub state_groups: u32,
    /// Recurrent models: states kept per sequence (1 + the longest draft, for rollback).
    #[default(1)]
    pub state_snapshots: u32,
    /// Recurrent models: saved states for prefix reuse ([`Runner::save_state`]).
    pub state_saved: u32,
    /// With the device layout: let runs of one-row attention ops (a sequence's verify rows, or
    /// decoding rows whose gathered slots line up) share one op where the device gives each row
    /// the same numbers that way ([`crate::stacked_attention`]). `AXLE_STACKED_ROWS=0` turns it
    /// off too (a diagnostic, to compare).
    #[default(true)]
    pub stacked_rows: bool,
    /// With batch-invariant kernels and KV in host memory: which of ggml's kernels rows share
    /// ([`HostKernels`]).
    pub host_kernels: HostKernels,
    /// What returned rows hold: logits (generation), or final-normed hidden states (an
    /// embedding runner: the head is never computed).
    pub values: RowValues,
    /// How the KV cache stores keys and values. Q8_0 needs paged attention (steps of the
    /// device layout on backends that carry Axle's kernel, or the CPU body of the op with
    /// `force_device_layout`) and every layer's heads a multiple of 32 wide with K and V of one
    /// width: anything else is refused when the runner is made.
    pub kv_type: KvType,
    /// Runs the model's next-token-prediction head ([`crate::arch::Family::mtp`]) instead of its
    /// trunk: each token comes with a hidden state ([`SeqInput::hidden`]) and each step returns
    /// every token's hidden state beside the asked rows' logits. Refused for models without one.
    pub mtp: bool,
    /// Each step also returns every token's final-normed hidden state
    /// ([`StepOutput::hidden`]): a trunk whose MTP head drafts.
    pub returns_hidden: bool,
}

impl RunnerOptions {
    /// libllama's kernel choice and `kv_slots` slots: for comparisons with the oracle bit for bit.
    pub fn like_llama_cpp(kv_slots: u32) -> Self {
        RunnerOptions {
            kernels: Kernels::LikeLlamaCpp,
            kv_slots,
            ..Default::default()
        }
    }
}

/// Graph nodes reserved per step: about 30 per layer, plus a few per attention group and layer
/// (one attention op per group of sequences): a 32-layer model decoding 64 sequences needs ~10k.
const MAX_NODES: usize = 32768;
/// Graph nodes of one attention op of the device layout (views of q, k, v and the mask, the
/// attention, a reshape, its share of the concatenation), and of one token's three expert
/// products in a MoE layer, with a margin.
const NODES_PER_ROW_OP: usize = 24;
/// Graph nodes of a layer besides its attention ops (products in groups, norms, rope, KV writes).
const NODES_PER_LAYER: usize = 160;
/// n_kv is rounded up to this, as llama.cpp does, so graphs have stable shapes.
const KV_PAD: u32 = 256;

/// Where a runner's steps spent their time since the last [`Runner::take_profile`], summed over
/// steps: what `axle bench compare` prints for decode steps on each device.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StepProfile {
    /// Steps run.
    pub steps: u64,
    /// Steps whose graph was built (the rest reused the previous step's graph).
    pub builds: u64,
    /// Host work before the graph: block tables, positions, masks, the device layout (s).
    pub prepare_s: f64,
    /// Building and allocating graphs (s).
    pub build_s: f64,
    /// Writing the step's inputs into the graph's tensors (s).
    pub inputs_s: f64,
    /// Computing the graph, until the device has finished (s).
    pub compute_s: f64,
    /// Reading the logits back (s).
    pub logits_s: f64,
}

impl StepProfile {
    /// Adds another profile's counts.
    pub fn add(&mut self, o: &StepProfile) {
        self.steps += o.steps;
        self.builds += o.builds;
        self.prepare_s += o.prepare_s;
        self.build_s += o.build_s;
        self.inputs_s += o.inputs_s;
        self.compute_s += o.compute_s;
        self.logits_s += o.logits_s;
    }

    /// Mean microseconds per step of each phase: prepare, build, inputs, compute, logits.
    pub fn per_step_us(&self) -> [f64; 5] {
        let n = self.steps.max(1) as f64 / 1e6;
        [
            self.prepare_s / n,
            self.build_s / n,
            self.inputs_s / n,
            self.compute_s / n,
            self.logits_s / n,
        ]
    }
}

/// Executes plans on one model.
#[derive(Debug)]
pub struct Runner {
    model: Arc<Model>,
    kv: KvCache,
    /// Recurrent state pools (models with linear-attention layers).
    state: Option<RecurrentCache>,
    sched: GraphScheduler,
    /// Graph nodes of a step without the device layout's ops of their own (see `MAX_NODES`).
    base_nodes: usize,
    opts: RunnerOptions,
    host: HostInputs,
    /// The graphs built for the latest step shapes, each in a scheduler slot of its own (ggml's
    /// scheduler rewires the nodes of a graph it splits across backends to copies it frees at the
    /// next split, so a graph runs again only in a slot no other graph has used since). With an
    /// accelerator, several shapes are kept ([`graph_slots`]): speculative decoding alternates
    /// decode and verify shapes, and a kept graph lets the backend replay what it recorded for it
    /// (CUDA graphs) instead of launching every kernel again.
    cached: Vec<CachedGraph>,
    /// Graph shapes kept at most.
    graph_slots: usize,
    profile: StepProfile,
    /// Page-locked host memory the logits are read back through, on an accelerator.
    pinned: Option<PinnedHost>,
    /// A returned step's logits buffer, reused by the next step ([`Runner::recycle`]).
    spare_logits: Vec<f32>,
    /// Which arithmetic rows get ([`Arithmetic`]).
    arithmetic: Arithmetic,
    /// The memories that hold attention layers' KV (where stacking is probed).
    kv_bufts: Vec<BufferType>,
}

impl Runner {
    /// A runner with a fresh KV cache.
    pub fn new(model: Arc<Model>, opts: RunnerOptions) -> Result<Runner, ModelError> {
        if opts.block_size == 0
            || opts.kv_slots == 0
            || !opts.kv_slots.is_multiple_of(opts.block_size)
        {
            return Err(ModelError::Invalid(format!(
                "kv slots ({}) must be a positive multiple of the block size ({})",
                opts.kv_slots, opts.block_size
            )));
        }
        // Each layer's KV lives with the device that runs the layer; the scheduler gets the
        // accelerators first, in layer order, and the CPU last (it runs what the accelerators
        // cannot, and the layers left on the host).
        if opts.mtp && model.family().mtp().is_none() {
            return Err(ModelError::Unsupported(format!(
                "an MTP head for {}: the file has no next-token-prediction layer Axle runs",
                model.arch()
            )));
        }
        let family = family_of(&model, opts.mtp);
        let (dims, bufts) = kv_budget::cache_layers(family, &model);
        let placement = model.placement();
        let mut backends = placement
            .accelerators()
            .into_iter()
            .map(Backend::on)
            .collect::<Result<Vec<_>, _>>()?;
        backends.push(Backend::cpu(model.threads())?);
        // With the device layout a sequence whose slots are consecutive is read in place over
        // its padded range (up to KV_ALIGN slots past its end): slots past the pool's own keep
        // the last sequences' ranges inside the cache. They are never handed out, and masked.
        let on_device = bufts.iter().any(|b| *b != BufferType::cpu());
        let pad = if takes_device_layout(&opts, on_device) {
            device_step::KV_ALIGN
        } else {
            0
        };
        let arithmetic = Arithmetic::choose(&model, &opts, on_device)?;
        check_kv_fits(&model, &bufts, &dims, opts.kv_slots + pad, opts.kv_type)?;
        let kv = KvCache::new(&bufts, &dims, opts.kv_slots + pad, opts.kv_type)?;
        let state_dims = family.state_dims();
        let state = if state_dims.is_empty() {
            None
        } else {
            if opts.state_groups == 0 || opts.state_snapshots == 0 {
                return Err(ModelError::Invalid(
                    "a recurrent model needs at least one state group and snapshot".into(),
                ));
            }
            let bufts: Vec<BufferType> = state_dims
                .iter()
                .map(|d| placement.layer_buffer(d.0 as u32))
                .collect();
            let widths: Vec<(i64, i64)> = state_dims.iter().map(|d| (d.1, d.2)).collect();
            Some(RecurrentCache::new(
                &bufts,
                &widths,
                opts.state_groups,
                opts.state_snapshots,
                opts.state_saved,
            )?)
        };
        // Graphs are sized per step shape (`nodes_for`): the device layout's ops of their own
        // make a wide step's graph many times a decode step's.
        let mut base_nodes = MAX_NODES;
        if state.is_some() {
            // Recurrent layers run per sequence: about 40 nodes each, plus one per kept state.
            let n_layer = family.hparams().n_layer;
            let seqs = (opts.state_groups as usize).min(opts.max_batch_tokens);
            base_nodes += n_layer * seqs * (48 + opts.state_snapshots as usize);
        }
        let tensor_split = placement.tensor_parallel().is_some();
        // ggml's tensor-parallel device keeps the views a graph takes of the KV cache only
        // until another graph takes views of it: one graph at a time.
        let graph_slots = if tensor_split {
            1
        } else {
            opts.graph_slots
                .unwrap_or_else(|| graph_slots(!placement.accelerators().is_empty()))
                .max(1)
        };
        let sched = GraphScheduler::new(backends, base_nodes)?;
        // Logits come from the head's device (the last layer's, or the CPU).
        let pinned = model
            .placement()
            .head_device()
            .and_then(|d| PinnedHost::for_device(&d));
        let mut kv_bufts: Vec<BufferType> = Vec::new();
        for b in bufts {
            if !kv_bufts.contains(&b) {
                kv_bufts.push(b);
            }
        }
        let named_products = arithmetic.named_products;
        let mut runner = Runner {
            arithmetic,
            kv_bufts,
            model,
            kv,
            state,
            sched,
            base_nodes,
            opts,
            host: HostInputs::default(),
            cached: Vec::new(),
            graph_slots,
            profile: StepProfile::default(),
            pinned,
            spare_logits: Vec::new(),
        };
        runner.check_products(named_products)?;
        Ok(runner)
    }

    /// Why the default device products gave way to others at load (their check failed on one
    /// of the model's weights), if they did.
    pub fn products_note(&self) -> Option<&str> {
        self.arithmetic.products_note.as_deref()
    }

    /// Whether a step reads a sequence's KV in place where its slots are consecutive (and
    /// gathers it otherwise): with the device layout. The scheduler then keeps each sequence's
    /// blocks consecutive where it can ([`axle_core::SchedulerConfig::kv_lanes`]).
    pub fn reads_consecutive_kv_in_place(&self) -> bool {
        self.device_layout()
    }

    /// Whether steps use the device layout of [`device_step`]: batch-invariant kernels with KV
    /// on an accelerator, where ggml's kernels choose their arithmetic by the op's shape.
    fn device_layout(&self) -> bool {
        takes_device_layout(&self.opts, self.kv.on_device())
    }

    /// Whether device steps attend through Axle's paged attention (one op per layer for their
    /// small rows; [`DeviceAttention::Paged`]).
    pub fn paged_attention(&self) -> bool {
        self.arithmetic.paged
    }

    /// Why paged attention is off where it was asked for (the backends lack it, or a layer's
    /// heads are not ones it takes).
    pub fn paged_note(&self) -> Option<&str> {
        self.arithmetic.paged_note.as_deref()
    }

    /// The family whose graph the runner's steps build: the model's trunk, or its MTP head.
    fn family(&self) -> &dyn crate::arch::Family {
        family_of(&self.model, self.opts.mtp)
    }

    /// Whether steps return every token's hidden state.
    fn returns_hidden(&self) -> bool {
        self.opts.returns_hidden || self.opts.mtp
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Options in force.
    pub fn options(&self) -> &RunnerOptions {
        &self.opts
    }

    /// Number of KV blocks.
    pub fn n_blocks(&self) -> u32 {
        self.opts.kv_slots / self.opts.block_size
    }

    /// Recurrent models: copies the state of `group` at the end of its last step (after its
    /// last kept token) into saved slot `slot`, for a later request that reuses the prefix.
    pub fn save_state(&mut self, group: u32, slot: u32) -> Result<(), ModelError> {
        let cache = self.recurrent_slot(group, slot)?;
        cache.copy_row(cache.row(group, 0), cache.saved_row(slot))?;
        Ok(())
    }

    /// Recurrent models: makes saved slot `slot` the starting state of `group`'s next step (read
    /// it with `from` = 0).
    pub fn restore_state(&mut self, slot: u32, group: u32) -> Result<(), ModelError> {
        let cache = self.recurrent_slot(group, slot)?;
        cache.copy_row(cache.saved_row(slot), cache.row(group, 0))?;
        Ok(())
    }

    fn recurrent_slot(&self, group: u32, slot: u32) -> Result<&RecurrentCache, ModelError> {
        match &self.state {
            Some(c) if group < c.groups && slot < c.saved => Ok(c),
            Some(c) => Err(ModelError::Batch(format!(
                "state group {group} / saved slot {slot} outside {} groups / {} slots",
                c.groups, c.saved
            ))),
            None => Err(ModelError::Batch("the model has no recurrent state".into())),
        }
    }

    /// The prompt lengths at which this runner's arithmetic for prompt rows changes (see
    /// [`HostKernels::prompt_classes`]): the engine's prefix cache keys blocks with them. Empty
    /// where a row's arithmetic does not depend on its origin.
    pub fn prompt_classes(&self) -> Vec<usize> {
        self.arithmetic
            .host_kernels
            .map(HostKernels::prompt_classes)
            .unwrap_or_default()
    }

    /// Runs one step and returns the requested logits.
    ///
    /// A graph depends only on the step's shape (tokens, visible slots, output rows), so when a step
    /// has the same shape as the previous one (steady decoding) the previous graph and its memory
    /// assignment are reused and only the inputs are rewritten, as llama.cpp does.
    pub fn step(&mut self, seqs: &[SeqInput]) -> Result<StepOutput, ModelError> {
        let t0 = std::time::Instant::now();
        let (n, n_kv) = self.prepare(seqs)?;
        let n_out = self.host.out_ids.len();
        if n_out == 0 {
            // Nothing to return, but the KV must still be written: compute with one output row.
            self.host.out_ids.push(n as i32 - 1);
        }
        let key = GraphKey {
            n_tokens: n,
            n_kv,
            n_out: self.host.out_ids.len(),
            gathered: !self.host.kv_ids.is_empty(),
            // Only batch-invariant kernels split attention by group; otherwise the groups would
            // make steps of one shape look different and rebuild the graph for nothing.
            device: self.host.device.clone(),
            groups: if self.host.device.is_none() {
                self.host.groups.clone()
            } else {
                Vec::new()
            },
            tiled_product_cols: tiled_product_cols(self.host.arith.iter()),
            tiled_product_out_cols: tiled_product_cols(
                self.host
                    .out_ids
                    .iter()
                    .filter_map(|&r| self.host.arith.get(r as usize)),
            ),
            state: self.host.state_seqs.clone(),
        };
        let t_prepared = std::time::Instant::now();
        let at = match self.cached.iter().position(|c| c.key == key) {
            Some(i) => i,
            None => {
                let i = self.build_in_slot(key.clone())?;
                let refused = self.arithmetic.paged_refused.borrow_mut().take();
                if let Some(why) = refused {
                    // Some layer's heads are not ones paged attention takes: lay steps out
                    // with an op per row from now on, and start this one again.
                    self.cached.swap_remove(i);
                    self.cached
                        .retain(|c| c.key.device.as_ref().is_none_or(|d| d.paged.is_none()));
                    self.arithmetic.paged = false;
                    self.arithmetic.paged_note =
                        Some(format!("a layer's attention is not one it takes: {why}"));
                    return self.step(seqs);
                }
                let misses = self
                    .arithmetic
                    .stacking
                    .as_ref()
                    .map(|t| t.take_misses())
                    .unwrap_or_default();
                if misses.is_empty() {
                    i
                } else {
                    // Shapes of stacked rows met for the first time: ask the device, then build
                    // again with the answers.
                    self.cached.swap_remove(i);
                    self.probe_stacking(&misses)?;
                    self.build_in_slot(key)?
                }
            }
        };
        self.cached[at].last_used = self.profile.steps;
        let slot = self.cached[at].slot;
        let ctx = &self.cached[at].ctx;
        let input = |name: &str| {
            ctx.find(name)
                .ok_or_else(|| ModelError::Batch(format!("graph input {name} missing")))
        };
        let h = &self.host;
        let t_built = std::time::Instant::now();
        input("inp_tokens")?.write(&h.tokens)?;
        input("inp_pos")?.write(&h.pos)?;
        input("inp_slots")?.write(&h.slots)?;
        // A mask no layer reads (all layers local, or none) has no memory assigned: skip it.
        for (name, data) in [("inp_kq_mask", &h.mask), ("inp_kq_mask_swa", &h.mask_swa)] {
            if let Some(m) = ctx.find(name).filter(|m| m.is_allocated()) {
                m.write(data)?;
            }
        }
        if let Some(t) = ctx.find("inp_kv_ids").filter(|t| t.is_allocated()) {
            t.write(&h.kv_ids)?;
        }
        if let Some(t) = ctx.find("inp_pa_rows").filter(|t| t.is_allocated()) {
            t.write(&h.paged_rows)?;
        }
        if let Some(t) = ctx.find("inp_pa_table").filter(|t| t.is_allocated()) {
            t.write(&h.paged_table)?;
        }
        if let Some(t) = ctx.find("inp_out_ids").filter(|t| t.is_allocated()) {
            t.write(&h.out_ids)?;
        }
        if let Some(t) = ctx.find("inp_state_read").filter(|t| t.is_allocated()) {
            t.write(&h.state_read)?;
        }
        if let Some(t) = ctx.find("inp_state_write").filter(|t| t.is_allocated()) {
            t.write(&h.state_write)?;
        }
        if let Some(t) = ctx.find("inp_hidden").filter(|t| t.is_allocated()) {
            t.write(&h.hidden)?;
        }
        let mut graph = ctx
            .existing_graph()
            .ok_or_else(|| ModelError::Batch("graph missing".into()))?;
        let t_inputs = std::time::Instant::now();
        self.sched.compute(slot, &mut graph)?;
        let t_computed = std::time::Instant::now();
        let hp = self.family().hparams();
        let mut out = StepOutput {
            width: match self.opts.values {
                RowValues::Logits => hp.n_vocab as usize,
                RowValues::Hidden => hp.n_embd as usize,
            },
            rows: h.rows.clone(),
            logits: std::mem::take(&mut self.spare_logits),
            picked: Vec::new(),
            hidden: Vec::new(),
        };
        if self.returns_hidden() {
            input(HIDDEN)?.read_f32(&mut out.hidden)?;
        }
        if n_out > 0 {
            // Picks are made on the head's accelerator: only their indices come back, and the
            // logits only if some row wants them.
            let picks = ctx.find(PICKS).filter(|t| t.is_allocated());
            let mut full = true;
            if let (Some(t), true) = (picks, h.row_picks.iter().any(|&p| p)) {
                let mut ids: Vec<i32> = Vec::new();
                t.read(&mut ids)?;
                out.picked = h
                    .row_picks
                    .iter()
                    .zip(&ids)
                    .map(|(&p, &id)| p.then_some(id as TokenId))
                    .collect();
                full = h.row_picks.iter().any(|&p| !p);
            }
            if full {
                let logits = input(LOGITS)?;
                match &mut self.pinned {
                    Some(p) => p.read_f32(&logits, &mut out.logits)?,
                    None => logits.read_f32(&mut out.logits)?,
                }
            }
        }
        let p = &mut self.profile;
        p.steps += 1;
        p.prepare_s += (t_prepared - t0).as_secs_f64();
        p.build_s += (t_built - t_prepared).as_secs_f64();
        p.inputs_s += (t_inputs - t_built).as_secs_f64();
        p.compute_s += (t_computed - t_inputs).as_secs_f64();
        p.logits_s += t_computed.elapsed().as_secs_f64();
        Ok(out)
    }

    /// Probes each shape of stacked rows in every memory holding attention layers and records
    /// whether all of them give each row a one-row op's numbers. A probe that fails (its memory
    /// cannot be had, say) counts as a no: the rows then keep an op each, as without stacking.
    fn probe_stacking(&mut self, keys: &[StackKey]) -> Result<(), ModelError> {
        // The slot after every graph slot, so that no kept graph is dropped for a probe.
        let slot = self.graph_slots;
        while self.sched.slots() <= slot {
            self.sched.add_slot(self.base_nodes)?;
        }
        for &key in keys {
            let mut ok = true;
            for &buft in &self.kv_bufts {
                ok &= stacked_attention::probe(&mut self.sched, slot, buft, key).unwrap_or(false);
            }
            if let Some(t) = self.arithmetic.stacking.as_mut() {
                t.record(key, ok);
            }
        }
        Ok(())
    }

    /// How the device layout multiplies small columns (chosen at construction: the options, else
    /// `AXLE_DEVICE_PRODUCTS`, else [`default_products`]); `None` where steps do not take the
    /// device layout.
    pub fn device_products(&self) -> Option<DeviceProducts> {
        self.device_layout().then_some(self.arithmetic.products)
    }

    /// The shapes of rows probed for stacking so far, and whether they share an op.
    pub fn stacked_shapes(&self) -> Vec<(StackKey, bool)> {
        let mut v: Vec<(StackKey, bool)> = self
            .arithmetic
            .stacking
            .iter()
            .flat_map(|t| t.known().map(|(&k, &ok)| (k, ok)))
            .collect();
        v.sort_by_key(|(k, _)| (k.kv_len, k.rows));
        v
    }

    /// Puts the runner's CPU threads to sleep until its next step (which wakes them), so that
    /// another runner in the process (a draft model's) gets the cores meanwhile.
    pub fn pause_threads(&self) {
        self.sched.pause_threads();
    }

    /// Hands a step's logits buffer back for the next step to read into, so that a decode step's
    /// read-back (1 MB for a 262k vocabulary) is not a fresh allocation each time.
    pub fn recycle(&mut self, logits: Vec<f32>) {
        if logits.capacity() > self.spare_logits.capacity() {
            self.spare_logits = logits;
        }
    }

    /// Where the steps since the last call spent their time (and starts a new count).
    pub fn take_profile(&mut self) -> StepProfile {
        std::mem::take(&mut self.profile)
    }
}

/// The family a runner's steps build: the model's trunk, or its MTP head (`mtp`; checked at
/// construction).
fn family_of(model: &Model, mtp: bool) -> &dyn crate::arch::Family {
    let trunk = model.family();
    match mtp {
        true => trunk.mtp().unwrap_or(trunk),
        false => trunk,
    }
}

/// Graph output: every token's final-normed hidden state, where steps return it.
const HIDDEN: &str = "axle_hidden";
/// Name of the logits tensor in every graph.
const LOGITS: &str = "axle_logits";
/// Graph output: each logits row's largest index (I32), with the head on an accelerator.
const PICKS: &str = "axle_picks";
