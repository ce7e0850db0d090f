//! The model reference and backend policy shared by `generate` and `serve`, and their resolution
//! into a native model or a delegated upstream, with the runtime report that names the route.
use anyhow::Context;
use axle_models::Model;
use axle_sdk::backend::{self, LocalModel, ResolveInput};
use axle_sdk::{BackendKind, Policy, RuntimeReport, Upstream};
use std::path::PathBuf;
use std::time::Duration;

/// `--backend`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// Native when the GGUF's architecture is implemented; delegate only with --allow-delegation.
    Auto,
    /// Native or an error.
    Native,
    /// Delegate to a llama.cpp server (llama-server, llama-cpp-python) at --upstream.
    LlamaCpp,
    /// Delegate to an OpenAI-compatible server (mlx_lm.server, vLLM, another axle) at --upstream.
    Openai,
}

impl From<BackendArg> for Policy {
    fn from(b: BackendArg) -> Policy {
        match b {
            BackendArg::Auto => Policy::Auto,
            BackendArg::Native => Policy::Native,
            BackendArg::LlamaCpp => Policy::LlamaCpp,
            BackendArg::Openai => Policy::Openai,
        }
    }
}

/// Which model, and who runs it.
#[derive(clap::Args)]
pub struct RouteArgs {
    /// GGUF model file (optional when an upstream serves the model).
    #[arg(long, required_unless_present = "upstream")]
    pub model: Option<PathBuf>,
    /// Backend policy.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Upstream server for delegated routes (e.g. http://127.0.0.1:8081).
    #[arg(long)]
    pub upstream: Option<String>,
    /// Model id at the upstream (default: the first it lists).
    #[arg(long)]
    pub upstream_model: Option<String>,
    /// Bearer key for the upstream.
    #[arg(long)]
    pub upstream_api_key: Option<String>,
    /// Seconds to wait for the upstream's response, and for each of its stream chunks.
    #[arg(long, default_value_t = 60.0)]
    pub upstream_timeout: f64,
    /// Let `--backend auto` delegate a model it cannot run natively to --upstream.
    #[arg(long)]
    pub allow_delegation: bool,
    /// Repack matmul weights for ggml's CPU GEMM kernels. Off by default: where a repacked kernel
    /// handles 4 rows at once (Gemma 3's Q4_K) it rounds differently from one-row decoding, and
    /// n-gram verify steps would then not reproduce plain decoding bit for bit.
    #[arg(long)]
    pub repack: bool,
    /// Device choice.
    #[command(flatten)]
    pub device: super::DeviceArgs,
}

/// A resolved route.
pub enum Route {
    /// Our runtime.
    Native(Box<Model>),
    /// A server the user runs.
    Delegated(Upstream),
}

impl RouteArgs {
    /// Resolves the route (loading the model, or connecting to the upstream) and its report.
    pub async fn resolve(&self, threads: usize) -> anyhow::Result<(Route, RuntimeReport)> {
        let timeout = Duration::from_secs_f64(self.upstream_timeout.max(0.001));
        let mut input = ResolveInput {
            policy: self.backend.into(),
            allow_delegation: self.allow_delegation,
            local: self.model.as_deref().map(backend::inspect_local),
            upstream: self
                .upstream
                .as_deref()
                .map(axle_sdk::delegate::normalize_url),
            upstream_is_llama_cpp: false,
        };
        let natively_runnable = matches!(
            input.local,
            Some(LocalModel::Gguf {
                supported: true,
                ..
            })
        );
        if input.policy == Policy::Auto && input.allow_delegation && !natively_runnable {
            if let Some(url) = &input.upstream {
                input.upstream_is_llama_cpp = Upstream::probe_llama_cpp(url, timeout).await;
            }
        }
        let resolution = backend::decide(&input)?;
        match resolution.backend {
            BackendKind::Native => {
                let path = self
                    .model
                    .as_deref()
                    .context("the native backend needs --model PATH")?;
                let model = super::load_model(path, threads, self.repack, &self.device)?;
                let sha = super::with_spinner(&format!("hashing {}", path.display()), || {
                    backend::file_sha256(path)
                })
                .with_context(|| format!("cannot hash {}", path.display()))?;
                let report = RuntimeReport::new(&input, &resolution, Some(path), Some(&sha), None)
                    .on_device(&model);
                Ok((Route::Native(Box::new(model)), report))
            }
            kind => {
                let url = input.upstream.clone().context("no upstream")?;
                let up = Upstream::connect(
                    kind,
                    &url,
                    self.upstream_model.as_deref(),
                    self.upstream_api_key.clone(),
                    timeout,
                )
                .await?;
                let report = RuntimeReport::new(
                    &input,
                    &resolution,
                    self.model.as_deref(),
                    None,
                    Some(up.model()),
                );
                Ok((Route::Delegated(up), report))
            }
        }
    }

    /// The name clients use: the alias, else the file stem, else the upstream's model id.
    pub fn display_name(&self, alias: Option<&str>, route: &Route) -> String {
        if let Some(a) = alias {
            return a.to_string();
        }
        if let Some(stem) = self.model.as_deref().and_then(|m| m.file_stem()) {
            return stem.to_string_lossy().into_owned();
        }
        match route {
            Route::Delegated(up) => up.model().to_string(),
            Route::Native(_) => "model".into(),
        }
    }
}
