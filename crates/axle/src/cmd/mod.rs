//! One module per subcommand.
pub mod bench;
pub mod chat;
pub mod doctor;
pub mod generate;
pub mod hub;
pub mod route;
pub mod rpc_server;
pub mod serve;
pub mod tokenize;

use anyhow::Context;
use axle_models::device_step::{DeviceAttention, DeviceProducts};
use axle_models::kv::KvType;
use axle_models::{default_threads, DeviceChoice, HostKernels, Model, ModelOptions};
use axle_sdk::{defaults, DraftSources, EngineConfig, EngineSizing, GenerateRequest, MAX_DRAFT};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a native model runs (threads, device, layers on the GPU): shared by every command that
/// loads one.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// CPU threads.
    #[arg(long, default_value_t = default_threads())]
    pub threads: usize,
    /// Device: `auto` (the first GPU when a GPU backend is loaded, else the CPU), `cpu`, `all`
    /// (every GPU and RPC device), a device name from `axle doctor` (`cuda0`, `vulkan0`,
    /// `metal`, `rpc0`, ...), or several in layer order (`cuda0,cuda1`; `cpu` among them takes
    /// host layers): each gets a contiguous range of layers with their KV. GPU backends are
    /// shared libraries (`libggml-cuda.so`) loaded from $AXLE_BACKENDS_DIR, or from the folder of
    /// the axle binary and its `backends/` subfolder.
    #[arg(long, alias = "devices", default_value = "auto")]
    pub device: DeviceChoice,
    /// Layers on the GPUs, counted from the last (default: all, with the output head); the first
    /// ones stay on the CPU, for models larger than the cards.
    #[arg(long)]
    pub gpu_layers: Option<u32>,
    /// Share of the layers per device when `--device` lists several (`3,1`: three quarters on
    /// the first); default: in proportion to each device's free memory. With `--split-mode
    /// tensor`: each device's share of every split tensor (default: even).
    #[arg(long, value_delimiter = ',')]
    pub split: Option<Vec<f32>>,
    /// RPC servers (`host:port`, comma-separated) whose devices join this run as `rpc0`,
    /// `rpc1`, ... (`axle rpc-server` or llama.cpp's `rpc-server` serves them). With
    /// `--device auto` the model spreads over them and the first local GPU (or the CPU).
    #[arg(long, value_delimiter = ',')]
    pub rpc: Vec<String>,
    /// How several devices share the model: `layer` (contiguous layer ranges) or `tensor`
    /// (every layer over every device: attention heads and feed-forward columns split, partial
    /// sums added across the devices; llama, qwen2 and qwen3 models, with `--kernels fast`).
    #[arg(long, default_value = "layer")]
    pub split_mode: axle_models::SplitMode,
    /// Where a layer's projections that read the same input (Q, K and V; the FFN's gate and up)
    /// are stored as one weight, so that decoding rows run one product for them: `devices` (on
    /// accelerators, the default), `off`, or `everywhere` (the host too, from a copy of the
    /// weights).
    #[arg(long, default_value_t)]
    pub fused_projections: axle_models::FusedProjections,
    /// What memory the CPU reads weights from: `huge-pages` (a copy backed by 2 MiB transparent
    /// huge pages, where Linux offers them and memory allows; the default: faster CPU decoding)
    /// or `mapped` (the file's pages, used in place).
    #[arg(long, default_value_t)]
    pub host_memory: axle_models::HostMemory,
    /// Quantize the model's float weights at load, into the types llama.cpp's quantize tool
    /// would write: `q8_0`, `q6_k`, `q5_k_m`, `q4_k_m` or `q4_0` (weights already quantized
    /// keep their type).
    #[arg(long)]
    pub quantize: Option<axle_models::quantize::Quantize>,
}

/// Which model, who runs it and how: shared by generate, chat and serve.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The model and its route.
    #[command(flatten)]
    pub route: route::RouteArgs,
    /// How a native model runs.
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl RunArgs {
    /// Starts the route: see [`route::RouteArgs::start`].
    pub async fn start(
        &self,
        max_seqs: usize,
        kv_seqs: usize,
    ) -> anyhow::Result<(axle_sdk::Generator, axle_sdk::RuntimeReport)> {
        self.route.start(&self.engine, max_seqs, kv_seqs).await
    }
}

/// How a native model runs, shared by the commands that run the engine (generate, chat, serve):
/// threads and device, context and batching limits, speculation and kernels. Every default is
/// the SDK's ([`axle_sdk::defaults`]).
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// Threads and device.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Repack matmul weights for ggml's CPU GEMM kernels. Off by default: where a repacked kernel
    /// handles 4 rows at once (Gemma 3's Q4_K) it rounds differently from one-row decoding, and
    /// n-gram verify steps would then not reproduce plain decoding bit for bit.
    #[arg(long)]
    pub repack: bool,
    /// Context length per sequence in tokens (default: the model's, capped at 4096).
    #[arg(long, alias = "context-len")]
    pub ctx: Option<usize>,
    /// KV slots shared by all sequences (default: the context length times the sequences that
    /// may run together, at most 2 for serve).
    #[arg(long)]
    pub kv_slots: Option<u32>,
    /// Most tokens computed in one step (prefill chunks and decodes together); raised to fit
    /// one token per sequence and a full draft (default: 512, or 4096 when the whole model is
    /// on accelerators).
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// Hybrid (linear-attention) models: sequences that may hold a recurrent state at once
    /// (default: one per running sequence). Each is a fixed block of memory; fewer slots cap
    /// concurrency (the others wait) instead of memory.
    #[arg(long)]
    pub state_slots: Option<usize>,
    /// Speculation: drafts from the drafters below, verified in one step (the gate still turns
    /// it off where it would not pay; it never changes the output). `--ngram` is its old name.
    #[arg(long, alias = "ngram", value_enum, default_value_t = Switch::On)]
    pub speculation: Switch,
    /// Longest draft.
    #[arg(long, default_value_t = defaults::DRAFT_LEN,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_DRAFT as u64))]
    pub draft_len: usize,
    /// Where drafts come from, comma-separated: `ngram` (prompt lookup over the sequence's own
    /// tokens), `suffix` (suffix decoding over the sequence's tokens and recent outputs of all
    /// requests), `model` (the `--draft-model`), `mtp` (the model's own next-token-prediction
    /// head, where its file carries one and no draft model is given), or `all`. Each step the
    /// proposal with the longest match goes to the gate; the model drafters are asked where the
    /// lookups found no copy.
    #[arg(long, default_value = "all", value_parser = DraftSources::parse)]
    pub drafters: DraftSources,
    /// A draft model: a smaller model with the same vocabulary (GGUF path or Hub id), loaded on
    /// the same device, asked for drafts where n-gram and suffix lookups found no copy. It never
    /// changes the output.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Kernel choice: `exact` (a request's output does not depend on what shares its steps, and
    /// n-gram speculation reproduces plain decoding) or `fast` (ggml's kernels for each step's
    /// shape, as llama.cpp runs: more tokens/s for many concurrent sequences on a GPU, where
    /// exactness costs extra passes over the weights and one attention op per decoding row;
    /// outputs may then change with the batch at close calls). How exact rows compute on each
    /// device is chosen for you; `--device-products`, `--device-attention` and `--host-kernels`
    /// (not listed here) pin one of the exact arithmetics, for measurements: docs/correctness.md.
    #[arg(long, value_enum, default_value_t = KernelChoice::Exact)]
    pub kernels: KernelChoice,
    /// With `--kernels exact` on GPUs: how decode and verify rows multiply quantized weights.
    /// `columns` (the default where the CUDA backend was built by scripts/build-backend.sh, for
    /// engines of fewer than 16 sequences): Axle's column-invariant kernel, one pass over the
    /// weights per 8 columns and ggml's one-column arithmetic for each. `groups` (the default
    /// elsewhere): ggml's mat-vec kernel, 4 columns at a time. `wide` (CUDA only; the default for
    /// engines of 16 sequences or more, e.g. `serve`'s default, where the backend also replays
    /// MMQ): tiled ops of up to 128 columns, one pass over the weights a step, the choice for
    /// serving many concurrent sequences (level with libllama for a lone one, below `columns`
    /// for a few). All exact; one engine keeps one choice.
    #[arg(long, hide = true)]
    pub device_products: Option<DeviceProducts>,
    /// With `--kernels exact` on GPUs: how decode and verify rows attend. `paged` (the default):
    /// Axle's paged attention, one op per layer for all of a step's decode and verify rows,
    /// reading each row's keys through its block table (where the CUDA backend carries it and
    /// the model's heads are ones it takes; else `rows`). `rows`: an op of ggml's per row, over
    /// that row's sequence's slots with a mask of its own. Both exact.
    #[arg(long, hide = true, default_value_t = DeviceAttention::Paged)]
    pub device_attention: DeviceAttention,
    /// How the KV cache stores keys and values. `f16` (the default): two bytes a value. `q8_0`:
    /// ggml's Q8_0, 34 bytes per 32 values, so about twice the contexts fit; each token's row is
    /// rounded once when written, from its own values, so output stays exact (alone, batched,
    /// cached or speculated alike) while differing from f16's where the rounding tips a choice.
    /// Read by Axle's paged attention: needs `--kernels exact` with the model on a GPU whose
    /// CUDA backend carries it, and heads whose keys and values are one width.
    #[arg(long, default_value_t = KvType::F16)]
    pub kv_type: KvType,
    /// With `--kernels exact` on the CPU: which of ggml's kernels rows share. `origin` (the
    /// default): prompt rows take the arithmetic libllama prefills with (tiled kernels for
    /// prompts of 64 tokens or more), generated rows the one it decodes with, so prefill runs at
    /// libllama's speed and greedy output follows libllama's. `compatible`: libllama's decode
    /// arithmetic for every row (attention ops of at most 63 rows, K-quant products in 4-column
    /// slices: slower prefill). `tiled`: ggml's tiled kernels' arithmetic for every row (greedy
    /// output parts from libllama's sooner). All are exact.
    #[arg(long, hide = true)]
    pub host_kernels: Option<HostKernels>,
}

/// Sampling and length options of the commands that generate (generate, chat).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate (per reply, in chat).
    #[arg(long, default_value_t = axle_sdk::defaults::MAX_TOKENS)]
    pub max_tokens: usize,
    /// Sampling temperature, 0 for greedy (default: greedy for generate, 0.7 for chat).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Top-k (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Top-p (1 = off).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Min-p (0 = off).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Repetition penalty (1 = off).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// RNG seed (choice i of several uses seed + i).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    /// A request for `prompt` with these options; an unset temperature is `default_temperature`.
    pub fn request(
        &self,
        prompt: impl Into<axle_sdk::Prompt>,
        default_temperature: f32,
    ) -> GenerateRequest {
        let mut req = GenerateRequest::new(prompt).max_tokens(self.max_tokens);
        req.sampling = axle_sdk::SamplingOptions {
            temperature: Some(self.temperature.unwrap_or(default_temperature)),
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            seed: Some(self.seed),
            ..Default::default()
        };
        req
    }
}

/// On or off.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// `--kernels`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelChoice {
    /// Batch-invariant kernels.
    Exact,
    /// Shape-dependent kernels.
    Fast,
}

impl EngineArgs {
    /// Loads the draft model that `--draft-model` names (pulled first when it is a Hub id).
    pub fn load_draft_model(&self) -> anyhow::Result<Option<std::sync::Arc<Model>>> {
        let Some(p) = &self.draft_model else {
            return Ok(None);
        };
        let local = hub::local(p)?;
        let m = load_model(&local.path, self)
            .with_context(|| format!("cannot load the draft model {}", p.display()))?;
        Ok(Some(std::sync::Arc::new(m)))
    }

    /// The engine's configuration for `model`, with `max_seqs` sequences running together and
    /// KV for `kv_seqs` full contexts unless `--kv-slots` says otherwise.
    pub fn engine_config(&self, model: &Model, max_seqs: usize, kv_seqs: usize) -> EngineConfig {
        let sizing = self.sizing(max_seqs, kv_seqs);
        EngineConfig {
            kernels: match self.kernels {
                KernelChoice::Exact => axle_models::Kernels::BatchInvariant,
                KernelChoice::Fast => axle_models::Kernels::LikeLlamaCpp,
            },
            device_products: self.device_products,
            device_attention: self.device_attention,
            host_kernels: self.host_kernels,
            kv_type: self.kv_type,
            drafters: self.drafters,
            ..EngineConfig::sized(model, &sizing)
        }
    }

    /// Refuses sizes that cannot work before anything loads (`--ctx 0`, a context that would
    /// wrap the KV slot count, ...).
    pub fn check_sizes(&self, max_seqs: usize, kv_seqs: usize) -> anyhow::Result<()> {
        self.sizing(max_seqs, kv_seqs).check().map_err(|e| {
            let flag = match e.option {
                "context" => "ctx",
                "kv_slots" => "kv-slots",
                "max_batch_size" => "max-batch-size",
                "max_batch_tokens" => "max-batch-tokens",
                "state_slots" => "state-slots",
                other => other,
            };
            anyhow::anyhow!("--{flag} must be {}, got {}", e.range, e.got)
        })
    }

    fn sizing(&self, max_seqs: usize, kv_seqs: usize) -> EngineSizing {
        EngineSizing {
            context: self.ctx,
            kv_slots: self.kv_slots,
            kv_contexts: kv_seqs,
            max_seqs,
            max_batch_tokens: self.max_batch_tokens,
            state_slots: self.state_slots,
            draft_len: match self.speculation {
                Switch::On => self.draft_len,
                Switch::Off => 0,
            },
            kv_type: self.kv_type,
        }
    }

    /// Refuses native-only options on a delegated route.
    pub fn check_delegated(&self) -> anyhow::Result<()> {
        if self.kernels != KernelChoice::Exact {
            anyhow::bail!("--kernels applies to the native backend only");
        }
        if self.device_products.is_some() {
            anyhow::bail!("--device-products applies to the native backend only");
        }
        if self.host_kernels.is_some() {
            anyhow::bail!("--host-kernels applies to the native backend only");
        }
        if self.kv_type != KvType::F16 {
            anyhow::bail!("--kv-type applies to the native backend only");
        }
        if self.draft_model.is_some() {
            anyhow::bail!("--draft-model applies to the native backend only");
        }
        Ok(())
    }
}

/// Loads a model as `engine` says (threads, device, repacking): a spinner on stderr while the
/// file is opened, a progress bar while weights are copied to a device.
pub fn load_model(path: &Path, engine: &EngineArgs) -> anyhow::Result<Model> {
    load_model_on(path, engine.repack, &engine.device)
}

/// [`load_model`] for the bench commands, which take threads and device alone.
pub fn load_model_on(path: &Path, repack: bool, device: &DeviceArgs) -> anyhow::Result<Model> {
    let opts = ModelOptions {
        threads: device.threads,
        repack,
        device: device.device.clone(),
        gpu_layers: device.gpu_layers,
        split: device.split.clone(),
        rpc: device.rpc.clone(),
        split_mode: device.split_mode,
        fused_projections: device.fused_projections,
        host_memory: device.host_memory,
        quantize: device.quantize,
    };
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(format!("loading {}", path.display()));
    bar.enable_steady_tick(Duration::from_millis(100));
    let mut styled = false;
    let model = Model::load_with_progress(path, &opts, &mut |done, total| {
        if !styled {
            styled = true;
            bar.set_length(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
        }
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let model = model.with_context(|| format!("cannot load model {}", path.display()))?;
    if model.placement().uses_accelerator() {
        eprintln!("device: {}", model.device_summary());
    }
    Ok(model)
}
