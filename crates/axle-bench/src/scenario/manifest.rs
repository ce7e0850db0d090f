//! The manifest: what a scenario runs and checks. TOML or JSON (by extension); the schema is
//! documented in `benchmarks/manifests/README.md`. Unknown fields are errors, so a typo cannot
//! silently turn a check off.
use crate::BenchError;
use axle_sdk::{RuntimeKind, SupportTier};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A scenario manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Name of the scenario (names its artifact and README section).
    pub name: String,
    /// What it shows.
    #[serde(default)]
    pub description: String,
    /// The model.
    pub model: ModelSpec,
    /// The route the runtime report must show (checked when given).
    #[serde(default)]
    pub route: Option<RouteSpec>,
    /// What to measure.
    pub workload: Workload,
    /// Repetitions of the measurement.
    #[serde(default = "one")]
    pub repetitions: usize,
    /// What to check.
    #[serde(default)]
    pub checks: Checks,
}

fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn yes() -> bool {
    true
}

/// The model file and threads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Path: `{models}/NAME` for the model cache, else relative to the manifest's folder.
    pub path: String,
    /// CPU threads.
    #[serde(default = "two")]
    pub threads: usize,
    /// Repack weights for ggml's CPU GEMM kernels, as libllama does (`ModelOptions::repack`; off
    /// by default, as in the CLI: where a repacked kernel handles 4 rows at a time, Gemma 3's
    /// Q4_K, it rounds differently from one row, and n-gram verify steps would not be bit-exact
    /// with plain decoding).
    #[serde(default)]
    pub repack: bool,
    /// Device: `auto` (the default: the first GPU when a GPU backend is loaded, else the CPU),
    /// `cpu`, or a device name (`cuda0`). libllama, where a workload runs it, gets the same layers
    /// on the same device.
    #[serde(default = "auto_device")]
    pub device: String,
    /// Layers on the GPU, counted from the last (absent: all).
    #[serde(default)]
    pub gpu_layers: Option<u32>,
    /// Share of the layers per device of a device list (`device = "cuda0,cuda1"`; absent: by
    /// free memory, as libllama splits).
    #[serde(default)]
    pub split: Option<Vec<f32>>,
    /// RPC servers (`host:port`) whose devices to attach.
    #[serde(default)]
    pub rpc: Vec<String>,
    /// What memory the CPU reads weights from: `huge-pages` (absent) or `mapped`
    /// (`ModelOptions::host_memory`).
    #[serde(default)]
    pub host_memory: Option<String>,
    /// libllama's `--split-mode` over several GPUs: `layer` (absent), `row` or `tensor`.
    #[serde(default)]
    pub oracle_split_mode: Option<String>,
    /// Axle's `--split-mode` over several devices: `layer` (absent) or `tensor`.
    #[serde(default)]
    pub split_mode: Option<String>,
}

impl ModelSpec {
    /// libllama's split mode for the references, and the reference's name in the artifact.
    pub fn oracle_split(&self) -> Result<(axle_ggml::oracle::SplitMode, String), String> {
        match self.oracle_split_mode.as_deref() {
            None => Ok((Default::default(), "libllama".into())),
            Some(m) => {
                let mode: axle_ggml::oracle::SplitMode = m.parse().map_err(|e| format!("{e}"))?;
                Ok((mode, format!("libllama split-mode {}", mode.name())))
            }
        }
    }
}

fn auto_device() -> String {
    "auto".into()
}

/// The expected runtime report.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// `native`, `llama_cpp` or `openai_compatible`.
    pub selected_backend: RuntimeKind,
    /// `native` or `delegated`.
    pub support_tier: SupportTier,
    /// The model file's sha256, when pinned.
    #[serde(default)]
    pub model_sha256: Option<String>,
}

/// What to measure. `generate` is the general engine workload; the others run the comparison
/// benches against their references (libllama, no speculation, no cache, the SDK).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Workload {
    /// Prompts through the engine (continuous batching, speculation as configured).
    Generate(GenerateSpec),
    /// Prefill and decode against libllama.
    Compare(CompareSpec),
    /// Aggregate decode at several concurrencies against libllama's batched decode.
    Batched(BatchedSpec),
    /// Time to first token with a cached shared prefix against the uncached first request.
    Prefix(PrefixSpec),
    /// A multi-turn agent session through `/v1/messages`: each turn's time to first token
    /// against the first turn's.
    Agent(AgentSpec),
    /// N-gram speculation against plain decode on prompt sets.
    Ngram(NgramSpec),
    /// One stream through the HTTP server against the SDK directly.
    Server(ServerSpec),
    /// Constrained (JSON schema) decoding against free decoding on the same prompts.
    Structured(StructuredSpec),
}

impl Workload {
    /// The kind's name.
    pub fn kind(&self) -> &'static str {
        match self {
            Workload::Generate(_) => "generate",
            Workload::Compare(_) => "compare",
            Workload::Batched(_) => "batched",
            Workload::Prefix(_) => "prefix",
            Workload::Agent(_) => "agent",
            Workload::Ngram(_) => "ngram",
            Workload::Server(_) => "server",
            Workload::Structured(_) => "structured",
        }
    }
}

/// The engine workload.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateSpec {
    /// Prompts (plain text, the tokenizer's special tokens parsed).
    #[serde(default)]
    pub prompts: Vec<String>,
    /// Or synthetic prompts of this many random tokens (one per `synthetic_prompts`).
    #[serde(default)]
    pub prompt_tokens: Option<usize>,
    /// How many synthetic prompts.
    #[serde(default = "one")]
    pub synthetic_prompts: usize,
    /// Tokens prepended to every prompt, identical across prompts (prefix sharing).
    #[serde(default)]
    pub shared_prefix_tokens: usize,
    /// Tokens generated per prompt (EOS ignored, so every run does the same work).
    pub max_tokens: usize,
    /// Sequences run at once.
    #[serde(default = "one")]
    pub concurrency: usize,
    /// Sampling temperature (0 = greedy).
    #[serde(default)]
    pub temperature: f32,
    /// Seed of the first prompt (then +1 per prompt).
    #[serde(default)]
    pub seed: u64,
    /// N-gram self-speculation.
    #[serde(default)]
    pub ngram: bool,
    /// Longest draft.
    #[serde(default = "four")]
    pub draft_len: usize,
    /// Also time libllama on the same prompts (greedy, one at a time) for ratios.
    #[serde(default)]
    pub reference: bool,
}

fn four() -> usize {
    4
}

/// `compare`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareSpec {
    /// Prompt lengths for prefill.
    pub prefill: Vec<usize>,
    /// Decode tokens.
    pub decode: usize,
    /// The exact kernels' arithmetic on the CPU: `origin`, `compatible` or `tiled` (absent:
    /// origin, as the CLI's `--host-kernels`); the correctness check's engine runs the same.
    #[serde(default)]
    pub host_kernels: Option<String>,
}

impl CompareSpec {
    /// The host kernels asked for.
    pub fn host_kernels(&self) -> Result<axle_models::HostKernels, String> {
        self.host_kernels
            .as_deref()
            .map_or(Ok(Default::default()), str::parse)
    }
}

/// `batched`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchedSpec {
    /// Concurrencies.
    pub concurrency: Vec<usize>,
    /// Prompt tokens per sequence.
    pub prompt_tokens: usize,
    /// Decode steps timed.
    pub steps: usize,
    /// Also time the engine with ggml's shape-dependent kernels (what batch invariance costs;
    /// reported as `shape_kernels_tok_s` and `shape_kernels_ratio` against libllama).
    #[serde(default)]
    pub fast_kernels: bool,
    /// The exact engine's products on GPUs: `groups` or `wide` (absent: by device, as the CLI's
    /// `--device-products`).
    #[serde(default)]
    pub device_products: Option<String>,
    /// How the exact engine's decode rows attend on GPUs: `rows` or `paged` (absent: the
    /// engine's default, as the CLI's `--device-attention`).
    #[serde(default)]
    pub device_attention: Option<String>,
    /// How the exact engine's KV cache stores keys and values: `f16` or `q8_0` (absent: f16, as
    /// the CLI's `--kv-type`).
    #[serde(default)]
    pub kv_type: Option<String>,
}

/// `prefix`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixSpec {
    /// Shared prefix length.
    pub prefix_tokens: usize,
}

/// `agent`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Turns of the session.
    pub turns: usize,
    /// The system prompt's length (about; tools come on top).
    pub system_tokens: usize,
}

/// `structured`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredSpec {
    /// Schema prompts (JSON, `{"schemas": [{prompt, schema}]}`), relative to the manifest's
    /// folder.
    pub schemas: String,
    /// Most tokens per answer.
    pub max_tokens: usize,
    /// Longest draft of the speculative mode.
    #[serde(default = "four")]
    pub draft_len: usize,
}

/// `ngram`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NgramSpec {
    /// Prompt sets (JSON), relative to the manifest's folder.
    pub workloads: String,
    /// Tokens per prompt.
    pub max_tokens: usize,
    /// Longest draft.
    #[serde(default = "four")]
    pub draft_len: usize,
    /// The drafter sets compared, one speculative engine each (`ngram`, `suffix`, `all`, or a
    /// comma-separated list).
    #[serde(default = "all_drafters")]
    pub drafters: Vec<String>,
    /// Sampling temperature (0: greedy).
    #[serde(default)]
    pub temperature: f32,
    /// A draft model for the drafter sets that include `model` (a path as the model's: on the
    /// same device).
    #[serde(default)]
    pub draft_model: Option<String>,
    /// llama-server `--spec-type` modes to compare with, when a binary is given
    /// (`--llama-server` or `AXLE_LLAMA_SERVER`).
    #[serde(default = "default_llama_server_modes")]
    pub llama_server_modes: Vec<String>,
}

fn all_drafters() -> Vec<String> {
    vec!["all".into()]
}

fn default_llama_server_modes() -> Vec<String> {
    crate::llama_server::DEFAULT_MODES
        .iter()
        .map(|m| m.to_string())
        .collect()
}

/// `server`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    /// Tokens in the stream.
    pub tokens: usize,
}

/// The checks.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checks {
    /// Outputs against the libllama oracle or expected text.
    #[serde(default)]
    pub correctness: Option<Correctness>,
    /// Same seed, same tokens.
    #[serde(default)]
    pub determinism: Option<Determinism>,
    /// Metrics against a baseline artifact.
    #[serde(default)]
    pub regression: Option<Regression>,
}

/// Correctness: greedy identity and a logit tolerance against libllama, and/or expected text.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Correctness {
    /// Prompts (default: the generate workload's).
    #[serde(default)]
    pub prompts: Vec<String>,
    /// Compare with the libllama oracle.
    #[serde(default = "yes")]
    pub oracle: bool,
    /// Greedy tokens compared per prompt.
    #[serde(default = "sixteen")]
    pub greedy_tokens: usize,
    /// Largest allowed |logit difference| at the last prompt position.
    #[serde(default)]
    pub logit_tolerance: Option<f32>,
    /// Expected greedy continuations, one per prompt.
    #[serde(default)]
    pub expected_text: Vec<String>,
}

fn sixteen() -> usize {
    16
}

/// Determinism: the same seeded sampled request twice gives the same tokens.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Determinism {
    /// Prompts (default: the generate workload's).
    #[serde(default)]
    pub prompts: Vec<String>,
    /// Temperature (sampling, so the seed matters).
    #[serde(default = "default_temperature")]
    pub temperature: f32,
    /// Seed.
    #[serde(default)]
    pub seed: u64,
    /// Tokens per run.
    #[serde(default = "sixteen")]
    pub tokens: usize,
}

fn default_temperature() -> f32 {
    0.8
}

/// Regression: each metric's median against the baseline's, within a relative tolerance.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Regression {
    /// The baseline artifact, relative to the manifest's folder.
    pub baseline: String,
    /// Allowed relative loss (0.1 = 10 % slower fails beyond that).
    #[serde(default = "default_tolerance")]
    pub tolerance: f64,
    /// Metrics compared (default: every metric present in both).
    #[serde(default)]
    pub metrics: Vec<String>,
}

fn default_tolerance() -> f64 {
    0.10
}

impl Manifest {
    /// Reads a manifest (`.toml` or `.json`) and validates it.
    pub fn load(path: &Path) -> Result<Manifest, BenchError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| BenchError::Invalid(format!("cannot read {}: {e}", path.display())))?;
        let m: Manifest = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| e.to_string())
        } else {
            toml::from_str(&text).map_err(|e| e.to_string())
        }
        .map_err(|e| BenchError::Invalid(format!("{}: {e}", path.display())))?;
        m.validate()
            .map_err(|e| BenchError::Invalid(format!("{}: {e}", path.display())))?;
        Ok(m)
    }

    fn validate(&self) -> Result<(), String> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err("name must be non-empty letters, digits, '-' or '_'".into());
        }
        if self.repetitions == 0 || self.model.threads == 0 {
            return Err("repetitions and threads must be at least 1".into());
        }
        if let Workload::Generate(g) = &self.workload {
            if g.prompts.is_empty() && g.prompt_tokens.is_none() {
                return Err("a generate workload needs prompts or prompt_tokens".into());
            }
            if g.max_tokens == 0 || g.concurrency == 0 {
                return Err("max_tokens and concurrency must be at least 1".into());
            }
            if !(1..=8).contains(&g.draft_len) {
                return Err("draft_len must be between 1 and 8".into());
            }
        }
        if let Some(c) = &self.checks.correctness {
            if !c.oracle && c.expected_text.is_empty() {
                return Err("checks.correctness needs oracle = true or expected_text".into());
            }
        }
        Ok(())
    }

    /// The model path: `{models}/` is the model cache; relative paths are relative to `dir`.
    pub fn model_path(&self, dir: &Path) -> PathBuf {
        resolve(&self.model.path, dir)
    }
}

/// Resolves a manifest path.
pub fn resolve(p: &str, dir: &Path) -> PathBuf {
    if let Some(rest) = p.strip_prefix("{models}/") {
        return axle_models::fetched::dir().join(rest);
    }
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}
