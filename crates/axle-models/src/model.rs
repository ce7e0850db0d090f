//! A loaded model: the GGUF file's weights in backend memory, its family graph, tokenizer and chat
//! template. Loading validates everything a user can get wrong (path, format, architecture) and
//! reports it as one clear error.
use crate::arch::{self, Family};
use crate::chat::{ChatError, ChatMessage, ChatTemplate, TemplateVars};
use crate::placement::{DeviceChoice, Placement, PlacementRequest, SplitMode};
use crate::pooling::Pooling;
use crate::tokenizer::Tokenizer;
use crate::ModelError;
use axle_ggml::{Backend, StoredTensor, TensorStore, WeightFusion, WeightPlacement};
use smart_default::SmartDefault;
use std::path::{Path, PathBuf};

/// How to load a model.
#[derive(Debug, Clone, SmartDefault)]
pub struct ModelOptions {
    /// CPU threads.
    #[default(default_threads())]
    pub threads: usize,
    /// Use the CPU repacking buffer types for matmul weights (faster Q4_0 / Q4_K / IQ4_NL GEMM).
    /// Off by default: a repacked kernel that takes 4 rows at once (Q4_K) rounds differently
    /// from the one-row kernel, so n-gram verify steps would not reproduce plain decoding bit for
    /// bit. libllama repacks, so the oracle tests turn it on to compare like with like.
    pub repack: bool,
    /// The device that runs the model.
    #[default(DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Layers on the accelerators, counted from the last (None: all of them, with the output
    /// head; fewer leave the first layers on the CPU, for models larger than the cards).
    pub gpu_layers: Option<u32>,
    /// Share of the layers per device of a device list (None: by free memory).
    pub split: Option<Vec<f32>>,
    /// RPC servers (`host:port`) whose devices join the registry before devices are chosen.
    pub rpc: Vec<String>,
    /// Layer ranges over the devices, or every layer split over all of them.
    #[default(SplitMode::Layer)]
    pub split_mode: SplitMode,
    /// Where projections that read the same input are stored as one weight.
    pub fused_projections: FusedProjections,
    /// What memory the CPU's weights are read from.
    pub host_memory: HostMemory,
    /// Quantize the float weights at load by this recipe (None: as the file holds them).
    pub quantize: Option<crate::quantize::Quantize>,
}

/// What memory a model on the CPU reads its weights from. Either way the bytes and the kernels
/// are the same, so are the logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostMemory {
    /// A copy in anonymous memory backed by 2 MiB transparent huge pages (the default), where
    /// the system offers them (Linux, `transparent_hugepage` set to `always` or `madvise`) and
    /// the copy fits in three quarters of the memory available; otherwise as `Mapped`. A decode
    /// step streams every weight once, and 4 KiB pages cost a TLB miss each: Gemma 3 270M
    /// decodes 12-20% faster on this project's 2-core x86 machine (see
    /// [`axle_ggml::huge_pages`]). The cost: the weights' bytes twice in memory while the file's
    /// pages stay cached (the kernel drops those first), and one copy at load.
    #[default]
    HugePages,
    /// The file's pages, mapped and used in place (repacked weights in ggml's own memory).
    Mapped,
}

// The names of the CLI's `--host-memory`.
crate::choice::named_choice!(HostMemory, "host memory kinds", {
    "huge-pages" => HostMemory::HugePages,
    "mapped" => HostMemory::Mapped,
});

/// Where a layer's projections that read the same input (its Q, K and V; its FFN gate and up)
/// are stored as one weight, so that a step's small columns (decoding and verifying sequences)
/// run one product where they would run two or three: one pass of the kernel, one quantization
/// of the activations, one launch. Prefill chunks keep the separate products (the parts stay
/// bound, as views of the fused weight's rows).
///
/// Fused by default where a layer's weights live in an accelerator's memory. The fused weight
/// serves only products whose rows it computes as the parts would: mat-vec products (each row by
/// itself) and, with wide products, the small columns' MMQ ops (Axle's own numbers there anyway).
/// Products ggml runs with MMQ for libllama (prefill chunks, and every product of 9 columns or
/// more under `--kernels fast`) take the parts, because MMQ splits the K range by the weight's
/// rows. So logits stay bit-identical to libllama's (on the H100: SmolLM2, the random 8B and the
/// fixtures, `benchmarks/artifacts/gpu/dc-*.json`), and a decode step on the 8B costs 3.20-3.25
/// ms instead of 3.39.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FusedProjections {
    /// Separate weights, as the file has them.
    Off,
    /// Fused where the layer's weights live in an accelerator's memory (the default).
    #[default]
    Devices,
    /// Fused everywhere (on the host a copy of the weights, instead of using them in place).
    Everywhere,
}

// The names of the CLI's `--fused-projections` (and of `AXLE_FUSED_PROJECTIONS`).
crate::choice::named_choice!(FusedProjections, "fused projections", {
    "off" => FusedProjections::Off,
    "devices" => FusedProjections::Devices,
    "everywhere" => FusedProjections::Everywhere,
});

impl ModelOptions {
    /// The CPU alone with `threads` threads and the file's weight layout (what the CPU oracle
    /// tests compare with libllama).
    pub fn cpu(threads: usize) -> ModelOptions {
        ModelOptions {
            threads,
            device: DeviceChoice::Cpu,
            ..Default::default()
        }
    }

    /// The CPU alone with `threads` threads and weights repacked for its kernels where ggml
    /// has a layout for them (what the engine uses by default).
    pub fn cpu_repacked(threads: usize) -> ModelOptions {
        ModelOptions {
            repack: true,
            ..ModelOptions::cpu(threads)
        }
    }
}

/// The most CPU threads a model takes per core the machine has: more only contend.
pub const MAX_THREADS_PER_CORE: usize = 4;

/// Physical cores are what ggml scales with; use all available parallelism by default.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A loaded model.
#[derive(Debug)]
pub struct Model {
    path: PathBuf,
    family: Box<dyn Family>,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    chat_source: Option<String>,
    pooling: Option<Pooling>,
    _weights: TensorStore,
    file_size: u64,
    threads: usize,
    placement: Placement,
    quantized: Option<crate::quantize::Quantize>,
}

/// Architectures that ggml's CUDA backend computed with a race on an H200 while kernels started
/// before the ones ahead of them had finished (programmatic dependent launch): their greedy
/// output differed from libllama's and between runs (0/20 prompts alike), and was exact with the
/// early starts off. Loading one onto a CUDA device turns them off for the process
/// ([`axle_ggml::serialize_cuda_launches`]); every other family measured exact with them on.
const CUDA_PDL_RACE: &[&str] = &["gemma4", "qwen3moe"];

impl Model {
    /// Loads a GGUF model.
    pub fn load(path: impl AsRef<Path>, opts: &ModelOptions) -> Result<Model, ModelError> {
        Model::load_with_progress(path, opts, &mut |_, _| {})
    }

    /// Loads a GGUF model; `progress(done, total)` follows the bytes copied to device (or
    /// repacked) memory.
    pub fn load_with_progress(
        path: impl AsRef<Path>,
        opts: &ModelOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model, ModelError> {
        let path = path.as_ref();
        let cores = default_threads();
        if opts.threads == 0 || opts.threads > MAX_THREADS_PER_CORE * cores {
            return Err(ModelError::Option(format!(
                "threads must be 1 to {} ({MAX_THREADS_PER_CORE} per core of this machine's {cores}), got {}",
                MAX_THREADS_PER_CORE * cores,
                opts.threads
            )));
        }
        let mut file = crate::hf::open_model(path)?;
        if let Some(recipe) = opts.quantize {
            file = crate::quantize::quantize(file, recipe, opts.threads)?;
        }
        let arch_name = file.str("general.architecture")?.to_string();
        let loader = arch::loader_for(&arch_name)?;
        // Layers counted from the tensors themselves (`blk.N.*`), before any family reads them.
        let n_layer = file.layers_in_tensors();
        let placement = Placement::resolve(
            &PlacementRequest {
                device: opts.device.clone(),
                gpu_layers: opts.gpu_layers,
                split: opts.split.clone(),
                rpc: opts.rpc.clone(),
                split_mode: opts.split_mode,
            },
            n_layer,
        )?;
        if let Some((tp, shares)) = placement.tensor_parallel() {
            crate::tensor_split::plan(&file, tp, shares)?;
        }
        if CUDA_PDL_RACE.contains(&arch_name.as_str())
            && placement
                .accelerators()
                .iter()
                .any(|d| d.name().starts_with("CUDA"))
        {
            axle_ggml::serialize_cuda_launches();
        }
        let weight_placement = if placement.uses_accelerator() {
            WeightPlacement::Layers {
                layers: (0..n_layer)
                    .map(|il| placement.layer_device(il).map(|d| d.buffer_type()))
                    .collect(),
                head: placement.head_device().map(|d| d.buffer_type()),
            }
        } else {
            WeightPlacement::Host {
                repack: opts.repack,
                huge_pages: opts.host_memory == HostMemory::HugePages,
            }
        };
        // Used for placement queries while loading; each runner owns the backend it computes with.
        let backend = Backend::cpu(opts.threads)?;
        // `AXLE_FUSED_PROJECTIONS` fills in where the options keep the default (for measuring
        // one against the other); a choice made in code stands.
        let fused = match axle_ggml::env::var("AXLE_FUSED_PROJECTIONS") {
            Some(v) if opts.fused_projections == FusedProjections::default() => {
                v.parse().map_err(ModelError::Invalid)?
            }
            _ => opts.fused_projections,
        };
        let fusion = WeightFusion {
            groups: match fused {
                FusedProjections::Off => Vec::new(),
                _ => arch::projection_fusions(&arch_name, &file),
            },
            on_host: fused == FusedProjections::Everywhere,
        };
        let weights = TensorStore::load_weights(
            &file,
            weight_placement,
            &backend,
            |name| name != "token_embd.weight",
            &fusion,
            progress,
        )?;
        let family = loader(&file, &weights)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let hp = family.hparams();
        if tokenizer.len() as i64 > hp.n_vocab {
            return Err(ModelError::Invalid(format!(
                "tokenizer has {} tokens but the output layer has {} rows",
                tokenizer.len(),
                hp.n_vocab
            )));
        }
        let chat_source = file.str_opt("tokenizer.chat_template")?.map(str::to_string);
        let pooling = Pooling::from_file(&file, &arch_name)?;
        Ok(Model {
            quantized: opts.quantize,
            pooling,
            path: path.to_path_buf(),
            family,
            tokenizer,
            chat_source,
            _weights: weights,
            file_size: file.file_size(),
            threads: opts.threads,
            placement,
        })
    }

    /// Names of the weights stored fused ([`FusedProjections`]).
    pub fn fused_weights(&self) -> &[String] {
        self._weights.fused()
    }

    /// The recipe the float weights were quantized by at load, if any.
    pub fn quantized_at_load(&self) -> Option<crate::quantize::Quantize> {
        self.quantized
    }

    /// Whether the host's weights were copied to huge pages ([`HostMemory::HugePages`] where
    /// the system allowed it).
    pub fn weights_in_huge_pages(&self) -> bool {
        self._weights.in_huge_pages()
    }

    /// Every tensor of the model's file (and its fused weights), by name.
    pub fn tensors(&self) -> Vec<StoredTensor> {
        self._weights.tensors()
    }

    /// Where the layers run.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Where the model runs, for reports: `CPU`, `CUDA0 (NVIDIA H100 80GB HBM3)`, or each
    /// device with its layers when several share the model.
    pub fn device_summary(&self) -> String {
        self.placement.summary()
    }

    /// The model file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the model file in bytes.
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// CPU threads in use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The family graph.
    pub fn family(&self) -> &dyn Family {
        self.family.as_ref()
    }

    /// GGUF architecture name.
    pub fn arch(&self) -> &str {
        &self.family.hparams().arch
    }

    /// The pooling the file asks its embeddings to take (embedding models); `None` for a
    /// generative model.
    pub fn pooling(&self) -> Option<Pooling> {
        self.pooling
    }

    /// Training context length.
    pub fn n_ctx_train(&self) -> u32 {
        self.family.hparams().n_ctx_train
    }

    /// The chat template's source as the GGUF file carries it (None: no template in the file).
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_source.as_deref()
    }

    /// The chat template (the model's, or the built-in one for its family).
    pub fn chat_template(&self) -> Result<ChatTemplate, ChatError> {
        let tok = &self.tokenizer;
        let text = |t: Option<u32>| t.and_then(|t| tok.token_text(t)).unwrap_or("").to_string();
        ChatTemplate::new(
            self.chat_source.as_deref(),
            self.arch(),
            &text(tok.bos),
            &text(tok.eos),
        )
    }

    /// Renders messages (and tool definitions, if any) with the chat template and tokenizes the
    /// result (special tokens parsed; BOS added only if the template did not already write it).
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        vars: &TemplateVars,
    ) -> Result<Vec<u32>, ChatError> {
        let text = self.chat_template()?.render(messages, true, tools, vars)?;
        let tok = &self.tokenizer;
        let mut ids = tok.encode(&text, false, true);
        if tok.add_bos {
            if let Some(bos) = tok.bos {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        Ok(ids)
    }
}
