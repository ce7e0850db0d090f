//! A loaded model: the GGUF file's weights in backend memory, its family graph, tokenizer and chat
//! template. Loading validates everything a user can get wrong (path, format, architecture) and
//! reports it as one clear error.
use crate::arch::{self, Family};
use crate::chat::{ChatError, ChatMessage, ChatTemplate};
use crate::tokenizer::Tokenizer;
use crate::ModelError;
use axle_ggml::{Backend, Device, DeviceKind, GgufFile, TensorStore, WeightPlacement};
use std::path::{Path, PathBuf};

/// Which device runs a model (`--device`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The first GPU when a GPU backend is registered, else the CPU.
    #[default]
    Auto,
    /// The CPU only.
    Cpu,
    /// A device by ggml's name (`cuda0`, `cuda1`, `metal`, `vulkan0`; any case).
    Named(String),
}

impl std::str::FromStr for DeviceChoice {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => DeviceChoice::Auto,
            "cpu" => DeviceChoice::Cpu,
            _ => DeviceChoice::Named(s.to_string()),
        })
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Named(n) => f.write_str(n),
        }
    }
}

impl DeviceChoice {
    /// The accelerator this choice means (None: the CPU alone), after loading the shared-library
    /// backends ([`axle_ggml::load_dynamic_backends`]).
    pub fn resolve(&self) -> Result<Option<Device>, ModelError> {
        axle_ggml::load_dynamic_backends();
        match self {
            DeviceChoice::Auto => Ok(Device::first_gpu()),
            DeviceChoice::Cpu => Ok(None),
            DeviceChoice::Named(n) => match Device::find(n) {
                Some(d) if d.kind() == DeviceKind::Cpu => Ok(None),
                Some(d) => Ok(Some(d)),
                None => Err(ModelError::NoDevice {
                    asked: n.clone(),
                    available: Device::all()
                        .iter()
                        .map(|d| d.name().to_ascii_lowercase())
                        .collect::<Vec<_>>()
                        .join(", "),
                    searched: axle_ggml::backend_search_dirs()
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
            },
        }
    }
}

/// Layers of a model on an accelerator (the rest, and the token embedding, on the CPU).
#[derive(Debug, Clone, Copy)]
pub struct Offload {
    /// The accelerator.
    pub device: Device,
    /// First layer on it (layers before it run on the CPU).
    pub first_layer: u32,
}

/// How to load a model.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// CPU threads.
    pub threads: usize,
    /// Use the CPU repacking buffer types for matmul weights (faster Q4_0 / Q4_K / IQ4_NL GEMM).
    /// Off by default: a repacked kernel that takes 4 rows at once (Q4_K) rounds differently
    /// from the one-row kernel, so n-gram verify steps would not reproduce plain decoding bit for
    /// bit. libllama repacks, so the oracle tests turn it on to compare like with like.
    pub repack: bool,
    /// The device that runs the model.
    pub device: DeviceChoice,
    /// Layers on the accelerator, counted from the last (None: all of them, with the output
    /// head; fewer leave the first layers on the CPU, for models larger than the card).
    pub gpu_layers: Option<u32>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            threads: default_threads(),
            repack: false,
            device: DeviceChoice::Auto,
            gpu_layers: None,
        }
    }
}

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
}

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
    _weights: TensorStore,
    file_size: u64,
    threads: usize,
    offload: Option<Offload>,
}

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
        let file = GgufFile::open(path)?;
        let arch_name = file.str("general.architecture")?.to_string();
        let loader = arch::loader_for(&arch_name)?;
        // Layers counted from the tensors themselves (`blk.N.*`), before any family reads them.
        let n_layer = file.layers_in_tensors();
        let offload = match opts.device.resolve()? {
            Some(device) if opts.gpu_layers != Some(0) => Some(Offload {
                device,
                first_layer: n_layer - opts.gpu_layers.unwrap_or(n_layer).min(n_layer),
            }),
            _ => None,
        };
        let placement = match offload {
            Some(o) => WeightPlacement::Device {
                buft: o.device.buffer_type(),
                first_layer: o.first_layer,
            },
            None => WeightPlacement::Host {
                repack: opts.repack,
            },
        };
        // Used for placement queries while loading; each runner owns the backend it computes with.
        let backend = Backend::cpu(opts.threads)?;
        let weights = TensorStore::load_weights(
            &file,
            placement,
            &backend,
            |name| name != "token_embd.weight",
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
        Ok(Model {
            path: path.to_path_buf(),
            family,
            tokenizer,
            chat_source,
            _weights: weights,
            file_size: file.file_size(),
            threads: opts.threads,
            offload,
        })
    }

    /// The layers on an accelerator, if any.
    pub fn offload(&self) -> Option<Offload> {
        self.offload
    }

    /// Where the model runs, for reports: `CPU`, `CUDA0 (NVIDIA H100 80GB HBM3)`, or
    /// `CUDA0 (...), layers 8.. of 32` when some layers stay on the CPU.
    pub fn device_summary(&self) -> String {
        match self.offload {
            None => "CPU".into(),
            Some(o) => {
                let n_layer = self.family.hparams().n_layer;
                let head = format!("{} ({})", o.device.name(), o.device.description());
                if o.first_layer == 0 {
                    head
                } else {
                    format!(
                        "{head}, layers {}.. of {n_layer} (the rest on the CPU)",
                        o.first_layer
                    )
                }
            }
        }
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
    ) -> Result<Vec<u32>, ChatError> {
        let text = self.chat_template()?.render(messages, true, tools)?;
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
