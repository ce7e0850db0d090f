//! The model reference and backend policy shared by `generate`, `chat` and `serve`, and their
//! resolution into a generator (our engine over the model, or a delegated upstream), with the
//! runtime report that names the route.
use super::EngineArgs;
use anyhow::Context;
use axle_sdk::route::{self, LocalModel, ResolveInput};
use axle_sdk::{Generator, RoutePolicy, RuntimeKind, RuntimeReport, Session, Upstream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
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

impl From<BackendArg> for RoutePolicy {
    fn from(b: BackendArg) -> RoutePolicy {
        match b {
            BackendArg::Auto => RoutePolicy::Auto,
            BackendArg::Native => RoutePolicy::Native,
            BackendArg::LlamaCpp => RoutePolicy::LlamaCpp,
            BackendArg::Openai => RoutePolicy::Openai,
        }
    }
}

/// Which model, and who runs it.
#[derive(Debug, clap::Args)]
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
}

impl RouteArgs {
    /// Resolves the route and starts it: loads the model and starts its engine (`max_seqs`
    /// sequences together, KV for `kv_seqs` full contexts unless `--kv-slots` says otherwise),
    /// or connects to the upstream. Returns the generator and its runtime report.
    pub async fn start(
        &self,
        engine: &EngineArgs,
        max_seqs: usize,
        kv_seqs: usize,
    ) -> anyhow::Result<(Generator, RuntimeReport)> {
        let timeout = Duration::from_secs_f64(self.upstream_timeout.max(0.001));
        let mut input = ResolveInput {
            policy: self.backend.into(),
            allow_delegation: self.allow_delegation,
            local: self.model.as_deref().map(route::inspect_local),
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
        if input.policy == RoutePolicy::Auto && input.allow_delegation && !natively_runnable {
            if let Some(url) = &input.upstream {
                input.upstream_is_llama_cpp = Upstream::probe_llama_cpp(url, timeout).await;
            }
        }
        let resolution = route::decide(&input)?;
        match resolution.backend {
            RuntimeKind::Native => {
                let path = self
                    .model
                    .as_deref()
                    .context("the native backend needs --model PATH")?;
                let model = super::load_model(path, engine)?;
                let sha = super::with_spinner(&format!("hashing {}", path.display()), || {
                    route::file_sha256(path)
                })
                .with_context(|| format!("cannot hash {}", path.display()))?;
                let report = RuntimeReport::new(&input, &resolution, Some(path), Some(&sha), None)
                    .on_device(&model);
                let cfg = engine.engine_config(&model, max_seqs, kv_seqs);
                let session = Session::new(Arc::new(model), cfg)?;
                Ok((Generator::Native(Arc::new(session)), report))
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
                engine.check_delegated()?;
                Ok((Generator::Delegated(Arc::new(up)), report))
            }
        }
    }

    /// The name clients use: the alias, else the file stem, else the upstream's model id.
    pub fn display_name(&self, alias: Option<&str>, generator: &Generator) -> String {
        if let Some(a) = alias {
            return a.to_string();
        }
        if let Some(stem) = self.model.as_deref().and_then(|m| m.file_stem()) {
            return stem.to_string_lossy().into_owned();
        }
        match generator {
            Generator::Delegated(up) => up.model().to_string(),
            Generator::Native(_) => "model".into(),
        }
    }
}
