//! The runner: executes one step of a plan (many sequences, each a prefill chunk or a decode
//! token) as one ggml graph over the whole batch, with KV in paged slots. It builds the graph
//! inputs (token ids, positions, slot indices, attention masks, output rows), lets the model family
//! build the graph, computes it and returns the logits of the rows that asked for them. It decides
//! no policy: which tokens, which slots and which rows come from the caller (the core).
use crate::device_step::{self, DeviceAttention, DeviceProducts, DeviceStep, SeqSlots};
use crate::kv::KvCache;
use crate::layers::{AttnGroup, HostKernels, Kernels, PagedInputs, RowArithmetic, Step};
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

/// Which logits a sequence wants back from a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// None (a prefill chunk that does not end the prompt).
    None,
    /// The last token's (end of prompt, or a plain decode).
    Last,
    /// Every token's (verifying draft tokens).
    All,
}

impl LogitRows {
    /// The rows a decoding step of a sequence with `drafts` draft tokens wants: the last one for
    /// a plain decode, every one to verify drafts.
    pub fn for_drafts(drafts: usize) -> LogitRows {
        if drafts == 0 {
            LogitRows::Last
        } else {
            LogitRows::All
        }
    }

    /// Whether token `ti` of `n` wants its logits.
    fn wants(self, ti: usize, n: usize) -> bool {
        match self {
            LogitRows::None => false,
            LogitRows::Last => ti + 1 == n,
            LogitRows::All => true,
        }
    }
}

fn check_token(t: TokenId, n_vocab: i64) -> Result<(), ModelError> {
    if t as i64 >= n_vocab {
        return Err(ModelError::Batch(format!(
            "token id {t} is outside the vocabulary ({n_vocab})"
        )));
    }
    Ok(())
}

/// One sequence's share of a step.
#[derive(Debug, Clone)]
pub struct SeqInput {
    /// Tokens to run, at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: Vec<TokenId>,
    /// Position of the first token (= tokens already in the KV cache for this sequence).
    pub start_pos: u32,
    /// Length of the request's prompt: positions before it are prompt rows, later ones were
    /// generated. With [`HostKernels::Origin`] a row's arithmetic follows it (see
    /// [`HostKernels::row`]); other kernel choices ignore it.
    pub prompt_len: u32,
    /// Physical block of each logical block of the sequence; must cover every position up to the
    /// last token of this step.
    pub block_table: Vec<u32>,
    /// Which logits to return.
    pub logits: LogitRows,
    /// Return each wanted row's largest-logit index instead of its logits, where the head runs
    /// on an accelerator (only the indices are read back); on the host, the logits as asked.
    pub pick: bool,
    /// Recurrent state rows (models with linear-attention layers; ignored otherwise).
    pub state: StateSlots,
}

/// Logits returned by a step, one row per requested position, in input order.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// Row-major logits, `rows.len() * n_vocab`.
    pub logits: Vec<f32>,
    /// Vocabulary size (row length).
    pub n_vocab: usize,
    /// For each row: (sequence index in the step, token index within that sequence's input).
    pub rows: Vec<(usize, usize)>,
    /// For each row, when its sequence asked for picks and the head runs on an accelerator: the
    /// index of its largest logit (empty when no row was picked). Picked rows' logits may be
    /// absent: `logits` is empty when every row was picked.
    pub picked: Vec<Option<TokenId>>,
}

impl StepOutput {
    /// Logits of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.n_vocab..(i + 1) * self.n_vocab]
    }

    /// Row `i`'s logits, owned: the step's buffer itself when it holds only that row (a decode
    /// step's 512 KB for a 128k vocabulary is not copied again).
    pub fn into_row(self, i: usize) -> Vec<f32> {
        if i == 0 && self.logits.len() == self.n_vocab {
            return self.logits;
        }
        self.row(i).to_vec()
    }

    /// Logits of (sequence, token index), if requested.
    pub fn find(&self, seq: usize, tok: usize) -> Option<&[f32]> {
        self.rows
            .iter()
            .position(|&r| r == (seq, tok))
            .map(|i| self.row(i))
    }

    /// What (sequence, token index) returned, if requested: its pick or its logits.
    pub fn find_row(&self, seq: usize, tok: usize) -> Option<RowLogits<'_>> {
        let i = self.rows.iter().position(|&r| r == (seq, tok))?;
        Some(match self.picked.get(i) {
            Some(&Some(t)) => RowLogits::Picked(t),
            _ => RowLogits::Full(self.row(i)),
        })
    }
}

/// Engines that run at least this many sequences at once take wide products by default where the
/// backend replays MMQ for a few columns (see [`default_products`]). On an H200 with the
/// Llama-3-8B-shaped files (Q4_0, Q4_K_M), wide products at 16 sequences ran 1.72x and 1.46x
/// libllama where the column-invariant kernel gave 1.33x and 0.91x, alone 1.12x and 0.99x (1.07x
/// and 1.05x); 4 sequences in such an engine run 0.92x and 0.87x (1.16x and 1.09x).
pub const WIDE_FROM_SEQS: usize = 16;

/// The device layout's products where neither the runner's options nor `AXLE_DEVICE_PRODUCTS`
/// name them, given the weight types the accelerators multiply through Axle's column-invariant
/// kernel (`column_types`, bit per type: [`column_types`]) and through its replay of MMQ for a
/// few columns (`replay_types`: [`replay_types`]), and the most sequences the engine runs at once
/// (`max_seqs`):
/// - wide products ([`DeviceProducts::Wide`]: MMQ ops, one pass over the weights a step) where
///   both kernels are there and the engine runs [`WIDE_FROM_SEQS`] sequences or more;
/// - else the column-invariant kernel ([`DeviceProducts::Columns`]) where every accelerator's
///   backend carries it;
/// - else mat-vec groups ([`DeviceProducts::Groups`]).
///
/// The choice is the engine's for its life (a step cannot switch kernels without changing a
/// sequence's numbers), so it goes by the engine's capacity, not by the sequences of a step.
pub fn default_products(column_types: u64, replay_types: u64, max_seqs: usize) -> DeviceProducts {
    if column_types != 0 && replay_types != 0 && max_seqs >= WIDE_FROM_SEQS {
        DeviceProducts::Wide
    } else if column_types != 0 {
        DeviceProducts::Columns
    } else {
        DeviceProducts::Groups
    }
}

/// The quantized weight types (bit `1 << ggml id`) that every accelerator multiplies through
/// Axle's column-invariant kernel; 0 without accelerators, where one is not a CUDA device (a
/// tensor split's combined device among them) or where one lacks the kernel.
pub fn column_types(accelerators: &[axle_ggml::Device]) -> u64 {
    kernel_types(accelerators, axle_ggml::Device::column_invariant_products)
}

/// The quantized weight types (bit `1 << ggml id`) whose products of a few columns every
/// accelerator gives MMQ's numbers through Axle's replay ([`axle_ggml::wide_replay`]); 0 as for
/// [`column_types`].
pub fn replay_types(accelerators: &[axle_ggml::Device]) -> u64 {
    kernel_types(accelerators, axle_ggml::Device::wide_replay_products)
}

/// The types (bit per type) that every accelerator, all of them CUDA devices, `takes`.
fn kernel_types(
    accelerators: &[axle_ggml::Device],
    takes: impl Fn(&axle_ggml::Device, DType) -> bool,
) -> u64 {
    if !all_cuda(accelerators) {
        return 0;
    }
    (0..64u32)
        .filter_map(DType::from_raw)
        .filter(|&t| accelerators.iter().all(|d| takes(d, t)))
        .fold(0, |mask, t| mask | 1u64 << t.raw())
}

/// Whether there are accelerators and all are CUDA devices: where wide products may run.
/// One weight per shape (type, row length, rows, memory) that small products multiply on an
/// accelerator: the model's quantized 2-D weights in device memory (not split across devices).
fn product_weights(model: &Model) -> Vec<StoredTensor> {
    let mut seen = Vec::new();
    model
        .tensors()
        .into_iter()
        .filter(|w| {
            let t = w.t();
            let [k, m, rest @ ..] = t.ne();
            let buft = t.buffer_type();
            let key = (t.dtype(), k, m, buft);
            let take = t.dtype().is_quantized()
                && m > 1
                && rest == [1, 1]
                && t.is_on_device()
                && buft.is_some_and(|b| !b.is_split())
                && !seen.contains(&key);
            if take {
                seen.push(key);
            }
            take
        })
        .collect()
}

fn all_cuda(accelerators: &[axle_ggml::Device]) -> bool {
    !accelerators.is_empty() && accelerators.iter().all(|d| d.name().starts_with("CUDA"))
}

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
    /// How the device layout multiplies small columns.
    products: DeviceProducts,
    /// Why the default products gave way to others at load ([`Runner::check_products`]).
    products_note: Option<String>,
    /// With column-invariant products: the weight types every accelerator covers (bit per type).
    column_types: u64,
    /// With wide products: the weight types whose few-column products every accelerator replays
    /// with MMQ's numbers (bit per type).
    replay_types: u64,
    /// Which runs of one-row attention ops may share an op (`None`: never).
    stacking: Option<StackTable>,
    /// The memories that hold attention layers' KV (where stacking is probed).
    kv_bufts: Vec<BufferType>,
    /// The host kernels in force with batch-invariant kernels and the host layout (see
    /// [`HostKernels`]): `Tiled` is refused where the row attention op does not reproduce this
    /// build's ggml or steps take the device layout; `Origin` then takes the compatible
    /// arithmetic for every row. `None`: no host arithmetic to choose.
    host_kernels: Option<HostKernels>,
    /// Whether device steps attend through paged attention ([`DeviceAttention::Paged`], where
    /// the backends carry it and the model's heads are ones it takes).
    paged: bool,
    /// Set by graph building when some layer's heads are not ones paged attention takes.
    paged_refused: std::cell::RefCell<Option<String>>,
    /// Why paged attention is off where it was asked for.
    paged_note: Option<String>,
}

#[derive(Debug, Default)]
struct HostInputs {
    tokens: Vec<i32>,
    pos: Vec<i32>,
    slots: Vec<i64>,
    mask: Vec<u16>,
    mask_swa: Vec<u16>,
    /// Gathered slots (empty when attention reads a prefix of the cache directly).
    kv_ids: Vec<i32>,
    /// Paged attention's rows and block tables (see [`device_step::DeviceInputs`]).
    paged_rows: Vec<i32>,
    paged_table: Vec<i32>,
    out_ids: Vec<i32>,
    rows: Vec<(usize, usize)>,
    /// Whether each row's sequence asked for picks.
    row_picks: Vec<bool>,
    /// Each row's arithmetic (host layout).
    arith: Vec<RowArithmetic>,
    /// The step's attention ops (host layout, batch-invariant kernels; see [`attention_groups`]).
    groups: Vec<AttnGroup>,
    /// The step's device layout (see [`device_step`]), when it has one.
    device: Option<DeviceStep>,
    /// Recurrent models: each sequence's rows and the pool rows to read and write.
    state_seqs: Vec<StateSeq>,
    state_read: Vec<i32>,
    state_write: Vec<i64>,
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
        let dims = model.family().kv_dims();
        let placement = model.placement();
        let mut backends = placement
            .accelerators()
            .into_iter()
            .map(Backend::on)
            .collect::<Result<Vec<_>, _>>()?;
        let bufts: Vec<BufferType> = (0..dims.len() as u32)
            .map(|il| placement.layer_buffer(il))
            .collect();
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
        check_kv_fits(&model, &bufts, &dims, opts.kv_slots + pad)?;
        let kv = KvCache::new(&bufts, &dims, opts.kv_slots + pad)?;
        let state_dims = model.family().state_dims();
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
            let n_layer = model.family().hparams().n_layer;
            let seqs = (opts.state_groups as usize).min(opts.max_batch_tokens);
            base_nodes += n_layer * seqs * (48 + opts.state_snapshots as usize);
        }
        let tensor_split = placement.tensor_parallel().is_some();
        if tensor_split && opts.kernels == Kernels::BatchInvariant {
            return Err(ModelError::Invalid(
                "--split-mode tensor adds partial products across the devices in ops whose \
                 shape depends on the step, so it cannot keep outputs batch-invariant: use \
                 --kernels fast with it"
                    .into(),
            ));
        }
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
        let accelerators = placement.accelerators();
        let column_types = column_types(&accelerators);
        let replay_types = replay_types(&accelerators);
        // An explicit choice, else (with the exact kernels, whose choice it is) the
        // environment's, is honoured or refused below.
        let named = match opts.device_products {
            Some(p) => Some(p),
            None if opts.kernels == Kernels::BatchInvariant => {
                DeviceProducts::from_env().map_err(ModelError::Invalid)?
            }
            None => None,
        };
        let products =
            named.unwrap_or_else(|| default_products(column_types, replay_types, opts.max_seqs));
        if products == DeviceProducts::Wide && !all_cuda(&accelerators) {
            return Err(ModelError::Invalid(
                "wide device products need the model's layers on CUDA devices only: their column \
                 invariance is a property of CUDA's tiled quantized kernel"
                    .into(),
            ));
        }
        if products == DeviceProducts::Columns && column_types == 0 {
            return Err(ModelError::Invalid(
                "column device products need every accelerator's backend to carry Axle's \
                 column-invariant kernel: build the CUDA backend with scripts/build-backend.sh"
                    .into(),
            ));
        }
        let stacking = (opts.stacked_rows
            && axle_ggml::env::var("AXLE_STACKED_ROWS").as_deref() != Some("0"))
        .then(StackTable::default);
        let mut kv_bufts: Vec<BufferType> = Vec::new();
        for b in bufts {
            if !kv_bufts.contains(&b) {
                kv_bufts.push(b);
            }
        }
        let device_layout = opts.force_device_layout || kv.on_device();
        // Paged attention where every accelerator's backend carries Axle's kernel (KV in host
        // memory: ggml's CPU runs the op's reference body).
        let paged = opts.device_attention == DeviceAttention::Paged
            && takes_device_layout(&opts, kv.on_device())
            && placement
                .accelerators()
                .iter()
                .all(|d| d.paged_attention(128, 1));
        let host_tiled =
            opts.kernels == Kernels::BatchInvariant && opts.host_kernels == HostKernels::Tiled;
        if host_tiled && !axle_ggml::row_attention::supported() {
            return Err(ModelError::Invalid(
                "tiled host kernels: the row attention op does not reproduce this build's ggml \
                 (its self-check failed); use the compatible host kernels"
                    .into(),
            ));
        }
        if host_tiled && device_layout {
            return Err(ModelError::Invalid(
                "tiled host kernels are a choice for models whose KV lies in host memory; this one has \
                 layers on accelerators, whose steps take the device layout"
                    .into(),
            ));
        }
        let host_kernels = match opts.host_kernels {
            _ if opts.kernels != Kernels::BatchInvariant || device_layout => None,
            HostKernels::Origin if !axle_ggml::row_attention::supported() => {
                Some(HostKernels::Compatible)
            }
            k => Some(k),
        };
        let mut runner = Runner {
            paged,
            paged_refused: std::cell::RefCell::new(None),
            paged_note: (opts.device_attention == DeviceAttention::Paged
                && takes_device_layout(&opts, kv.on_device())
                && !paged)
                .then(|| "the accelerators' backends do not carry Axle's paged attention".into()),
            host_kernels,
            products,
            products_note: None,
            column_types,
            replay_types,
            stacking,
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
        runner.check_products(named.is_some())?;
        Ok(runner)
    }

    /// Checks at load that the small products give a column the same bits at every width on
    /// each weight shape the model multiplies on its accelerators ([`small_products::probe`]).
    /// Only Axle's own kernels are probed (wide and column products; groups are ggml's mat-vec
    /// kernel, which computes every column by itself). Products the caller named are refused
    /// where the probe fails; default ones give way to the next (wide to columns, columns to
    /// groups), and [`Runner::products_note`] says why. `AXLE_PRODUCTS_PROBE=0` skips it.
    fn check_products(&mut self, named: bool) -> Result<(), ModelError> {
        let probed = |p| matches!(p, DeviceProducts::Wide | DeviceProducts::Columns);
        if !self.device_layout()
            || !probed(self.products)
            || axle_ggml::env::var("AXLE_PRODUCTS_PROBE").as_deref() == Some("0")
        {
            return Ok(());
        }
        let weights = product_weights(&self.model);
        // The slot after every graph slot; resized afterwards, which frees the probe's memory.
        let slot = self.graph_slots;
        while self.sched.slots() <= slot {
            self.sched.add_slot(self.base_nodes)?;
        }
        let mut result = Ok(());
        while probed(self.products) {
            let d = DeviceStep::for_products(self.products, self.column_types, self.replay_types);
            let mut failed = None;
            for w in &weights {
                let probed = small_products::probe(&mut self.sched, slot, w.t(), &d);
                if let Some(m) = probed.map_err(|e| {
                    ModelError::Invalid(format!(
                        "the check of the {} device products at load could not run on {}: {e} \
                         (AXLE_PRODUCTS_PROBE=0 skips it)",
                        self.products,
                        w.t().name()
                    ))
                })? {
                    failed = Some((w, m));
                    break;
                }
            }
            let Some((w, m)) = failed else {
                break;
            };
            let t = w.t();
            let what = format!(
                "{} device products failed their check at load on {} ({} [{}, {}] in {}): {m}",
                self.products,
                t.name(),
                t.dtype().name(),
                t.ne()[0],
                t.ne()[1],
                t.buffer_type().map_or_else(String::new, |b| b.name()),
            );
            if named {
                result = Err(ModelError::Invalid(format!(
                    "{what}; this device or ggml build does not give a column the same numbers at \
                     every width with them: choose other device products (groups always hold)"
                )));
                break;
            }
            let next = match self.products {
                DeviceProducts::Wide if self.column_types != 0 => DeviceProducts::Columns,
                _ => DeviceProducts::Groups,
            };
            self.products_note = Some(format!("{what}; took {next} instead"));
            self.products = next;
        }
        self.sched.resize(slot, self.base_nodes)?;
        result
    }

    /// Why the default device products gave way to others at load (their check failed on one
    /// of the model's weights), if they did.
    pub fn products_note(&self) -> Option<&str> {
        self.products_note.as_deref()
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
        self.paged
    }

    /// Why paged attention is off where it was asked for (the backends lack it, or a layer's
    /// heads are not ones it takes).
    pub fn paged_note(&self) -> Option<&str> {
        self.paged_note.as_deref()
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

    fn slot(&self, table: &[u32], pos: u32) -> Result<u32, ModelError> {
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

    fn prepare(&mut self, seqs: &[SeqInput]) -> Result<(i64, u32), ModelError> {
        let window = self.model.family().sliding_window();
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
        let n_vocab = self.model.family().hparams().n_vocab;
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
        // their new tokens' slots are needed.
        let paged_block = self.paged.then_some(self.opts.block_size);
        let mut visible: Vec<Vec<u32>> = Vec::with_capacity(seqs.len());
        for s in seqs {
            let end = s.start_pos + s.tokens.len() as u32;
            let first = if paged_block.is_some() && s.tokens.len() <= device_step::SMALL_TOKENS {
                for &b in s
                    .block_table
                    .iter()
                    .take(end.div_ceil(self.opts.block_size) as usize)
                {
                    if b >= self.n_blocks() {
                        return Err(ModelError::Batch(format!(
                            "block {b} out of range ({} blocks)",
                            self.n_blocks()
                        )));
                    }
                }
                s.start_pos
            } else {
                0
            };
            let mut v = vec![0; first as usize];
            for p in first..end {
                v.push(self.slot(&s.block_table, p)?);
            }
            visible.push(v);
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
                products: self.products,
                column_types: self.column_types,
                replay_types: self.replay_types,
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
                h.slots.push(visible[si][p as usize] as i64);
                if let Some(k) = self.host_kernels {
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
        let ppt = self.model.family().positions_per_token();
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
        self.host_kernels
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
                let refused = self.paged_refused.borrow_mut().take();
                if let Some(why) = refused {
                    // Some layer's heads are not ones paged attention takes: lay steps out
                    // with an op per row from now on, and start this one again.
                    self.cached.swap_remove(i);
                    self.cached
                        .retain(|c| c.key.device.as_ref().is_none_or(|d| d.paged.is_none()));
                    self.paged = false;
                    self.paged_note =
                        Some(format!("a layer's attention is not one it takes: {why}"));
                    return self.step(seqs);
                }
                let misses = self
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
        let mut graph = ctx
            .existing_graph()
            .ok_or_else(|| ModelError::Batch("graph missing".into()))?;
        let t_inputs = std::time::Instant::now();
        self.sched.compute(slot, &mut graph)?;
        let t_computed = std::time::Instant::now();
        let mut out = StepOutput {
            n_vocab: self.model.family().hparams().n_vocab as usize,
            rows: h.rows.clone(),
            logits: std::mem::take(&mut self.spare_logits),
            picked: Vec::new(),
        };
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
            if let Some(t) = self.stacking.as_mut() {
                t.record(key, ok);
            }
        }
        Ok(())
    }

    /// How the device layout multiplies small columns (chosen at construction: the options, else
    /// `AXLE_DEVICE_PRODUCTS`, else [`default_products`]); `None` where steps do not take the
    /// device layout.
    pub fn device_products(&self) -> Option<DeviceProducts> {
        self.device_layout().then_some(self.products)
    }

    /// The shapes of rows probed for stacking so far, and whether they share an op.
    pub fn stacked_shapes(&self) -> Vec<(StackKey, bool)> {
        let mut v: Vec<(StackKey, bool)> = self
            .stacking
            .iter()
            .flat_map(|t| t.known().map(|(&k, &ok)| (k, ok)))
            .collect();
        v.sort_by_key(|(k, _)| (k.kv_len, k.rows));
        v
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

    /// Builds the graph of step shape `key` into a free slot, or the least recently used one's;
    /// returns its index in `cached`.
    fn build_in_slot(&mut self, key: GraphKey) -> Result<usize, ModelError> {
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
    fn nodes_for(&self, key: &GraphKey) -> usize {
        let n_layer = self.model.family().hparams().n_layer;
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
    fn build(&self, key: &GraphKey, nodes: usize) -> Result<Context, ModelError> {
        let has_swa = self.model.family().sliding_window().is_some();
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
                    &[n * self.model.family().positions_per_token() as i64],
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
                stacking: self.stacking.as_ref(),
                paged: key
                    .device
                    .as_ref()
                    .and_then(|d| d.paged)
                    .map(|shape| PagedInputs {
                        rows: ctx.input(DType::I32, &[2, n], "inp_pa_rows"),
                        table: ctx.input(DType::I32, &[shape.table_len], "inp_pa_table"),
                        window: self.model.family().sliding_window().unwrap_or(0),
                        refused: &self.paged_refused,
                    }),
            };
            let logits = self
                .model
                .family()
                .forward(&mut step)
                .named(LOGITS)
                .as_output();
            step.graph.expand(logits);
            // With the head on an accelerator, each row's largest logit is picked there too (a
            // greedy step then reads back one index a row instead of the vocabulary).
            if self.pinned.is_some() {
                let picks = ctx.argmax(logits).named(PICKS).as_output();
                step.graph.expand(picks);
            }
        }
        Ok(ctx)
    }
}

/// Each memory that holds some layer's KV, with its free bytes and the bytes one KV slot takes
/// there (every layer has every slot): a device's share is its layers' K and V rows (F16), the
/// host's the rows of the layers left on the CPU. Memories whose free size is unknown are left
/// out.
fn kv_memories(model: &Model, bufts: &[BufferType], dims: &[(i64, i64)]) -> Vec<KvMemory> {
    let mut per_slot: Vec<(BufferType, usize)> = Vec::new();
    for (&(k, v), &b) in dims.iter().zip(bufts) {
        let row = (k + v) as usize * DType::F16.row_size(1);
        match per_slot.iter_mut().find(|(x, _)| *x == b) {
            Some((_, n)) => *n += row,
            None => per_slot.push((b, row)),
        }
    }
    per_slot
        .into_iter()
        .filter_map(|(buft, slot_bytes)| {
            let (free, name) = if buft == BufferType::cpu() {
                (axle_ggml::host_available_memory()?, "the host".to_string())
            } else {
                let d = model
                    .placement()
                    .accelerators()
                    .into_iter()
                    .find(|d| d.buffer_type() == buft)?;
                let (free, total) = d.memory();
                if total == 0 {
                    return None;
                }
                (free, d.name())
            };
            Some(KvMemory {
                name,
                free,
                slot_bytes,
            })
        })
        .collect()
}

/// One memory's share of the KV pool (see [`kv_memories`]).
#[derive(Debug)]
struct KvMemory {
    name: String,
    free: usize,
    slot_bytes: usize,
}

/// Memory a device keeps free beside the KV pool for the step's compute buffers: a tenth of
/// what is free, and at least 1 GiB.
fn kv_budget(free: usize) -> usize {
    let reserve = (free / 10).max(1 << 30);
    free.saturating_sub(reserve)
}

/// The most KV slots (a multiple of `block_size`) that the memories holding `model`'s KV can
/// take, leaving room for compute buffers; None when no memory tells its free size. The
/// engine caps its default pool with it, so that a model spread over devices of different
/// sizes gets the pool the tightest one allows instead of an allocation failure.
pub fn kv_slots_that_fit(model: &Model, block_size: u32) -> Option<u32> {
    let dims = model.family().kv_dims();
    let bufts: Vec<BufferType> = (0..dims.len() as u32)
        .map(|il| model.placement().layer_buffer(il))
        .collect();
    let bs = block_size.max(1) as usize;
    kv_memories(model, &bufts, &dims)
        .iter()
        .map(|m| kv_budget(m.free) / m.slot_bytes.max(1) / bs * bs)
        .min()
        .map(|n| n.min(u32::MAX as usize) as u32)
}

/// Whether a runner with `opts` whose KV is (`kv_on_device`) or is not on an accelerator
/// takes the device layout ([`Runner::device_layout`]).
fn takes_device_layout(opts: &RunnerOptions, kv_on_device: bool) -> bool {
    opts.kernels == Kernels::BatchInvariant && (opts.force_device_layout || kv_on_device)
}

/// Refuses a KV pool larger than the memory that would hold it, before allocating it: each
/// device's share against the device's free memory, and the host's share against the memory the
/// system has available. Without this a large `--kv-slots` or context ran into the allocator (or
/// the OOM killer) instead of an error.
fn check_kv_fits(
    model: &Model,
    bufts: &[BufferType],
    dims: &[(i64, i64)],
    slots: u32,
) -> Result<(), ModelError> {
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    for m in kv_memories(model, bufts, dims) {
        let need = m.slot_bytes * slots as usize;
        if need > m.free {
            return Err(ModelError::Invalid(format!(
                "the KV pool needs {:.0} MiB on {} ({slots} slots), but only {:.0} MiB are \
                 free there (at most {} slots fit); ask for fewer KV slots or a shorter context",
                mib(need),
                m.name,
                mib(m.free),
                m.free / m.slot_bytes.max(1)
            )));
        }
    }
    Ok(())
}

/// Name of the logits tensor in every graph.
const LOGITS: &str = "axle_logits";
/// Graph output: each logits row's largest index (I32), with the head on an accelerator.
const PICKS: &str = "axle_picks";

/// Query rows at or above which ggml's CPU flash attention switches to its tiled kernel.
const FA_TILE_ROWS: usize = 64;

/// Keys per tile of ggml's tiled CPU flash attention.
const KV_TILE: u32 = axle_ggml::row_attention::KV_TILE as u32;

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
fn attention_groups(
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
fn tiled_product_cols<'r>(rows: impl Iterator<Item = &'r RowArithmetic>) -> Vec<bool> {
    let cols: Vec<bool> = rows.map(|a| a.tiled_products).collect();
    if cols.iter().any(|&t| t) {
        cols
    } else {
        Vec::new()
    }
}

/// A built graph kept for its step shape.
#[derive(Debug)]
struct CachedGraph {
    key: GraphKey,
    ctx: Context,
    /// The scheduler slot it is allocated in.
    slot: usize,
    /// The step count when it last ran.
    last_used: u64,
}

/// Step shapes whose graphs a runner keeps: several with an accelerator (see `Runner::cached`),
/// one on the CPU alone (it records nothing to replay, and each kept graph holds compute buffers
/// of its own). `AXLE_GRAPH_SLOTS=N` overrides it (a diagnostic: comparing on one device).
fn graph_slots(accelerated: bool) -> usize {
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
const GRAPH_SLOTS: usize = 11;

/// Steps of at most this many tokens count as small: their graphs are kept beside each other.
/// Wider steps (prefill chunks) share one slot, so that kept compute buffers stay small.
const KEPT_STEP_TOKENS: i64 = 256;

/// The shape of a step: graphs with equal keys are interchangeable.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GraphKey {
    n_tokens: i64,
    n_kv: u32,
    n_out: usize,
    /// Whether attention reads gathered slots (`inp_kv_ids`) rather than a prefix of the cache.
    gathered: bool,
    /// The device layout, when steps have one.
    device: Option<DeviceStep>,
    /// The attention ops of a host step.
    groups: Vec<AttnGroup>,
    /// Which columns take the tiled product arithmetic (empty: none).
    tiled_product_cols: Vec<bool>,
    /// The same for the output rows.
    tiled_product_out_cols: Vec<bool>,
    /// Recurrent models: each sequence's rows and kept states.
    state: Vec<StateSeq>,
}

#[cfg(test)]
mod kv_budget_tests {
    use super::kv_budget;

    #[test]
    fn the_budget_leaves_a_tenth_and_at_least_a_gibibyte() {
        let gib = 1usize << 30;
        assert_eq!(kv_budget(80 * gib), 72 * gib);
        assert_eq!(kv_budget(4 * gib), 3 * gib);
        assert_eq!(kv_budget(gib / 2), 0);
    }
}

#[cfg(test)]
mod default_products_tests {
    use super::{default_products, DeviceProducts, WIDE_FROM_SEQS};

    const Q4_0: u64 = 1 << 2;

    #[test]
    fn large_engines_take_wide_products_where_the_replay_is_there() {
        let wide = default_products(Q4_0, Q4_0, WIDE_FROM_SEQS);
        assert_eq!(wide, DeviceProducts::Wide);
        assert_eq!(default_products(Q4_0, Q4_0, 64), DeviceProducts::Wide);
        let below = default_products(Q4_0, Q4_0, WIDE_FROM_SEQS - 1);
        assert_eq!(below, DeviceProducts::Columns, "a smaller engine");
        assert_eq!(default_products(Q4_0, Q4_0, 1), DeviceProducts::Columns);
        let no_replay = default_products(Q4_0, 0, 64);
        assert_eq!(
            no_replay,
            DeviceProducts::Columns,
            "a backend without the replay"
        );
        assert_eq!(
            default_products(0, 0, 64),
            DeviceProducts::Groups,
            "no Axle kernels"
        );
        assert_eq!(default_products(0, Q4_0, 64), DeviceProducts::Groups);
    }
}

#[cfg(test)]
mod tests {
    use super::{attention_groups, AttnGroup};
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
