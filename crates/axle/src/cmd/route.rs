//! The model reference and backend policy shared by `generate`, `chat` and `serve`, and their
//! resolution into a generator (our engine over the model, or a delegated upstream), with the
//! runtime report that names the route.
use super::EngineArgs;
use axle_sdk::route::{self, RouteSpec};
use axle_sdk::{EngineConfig, Generator, RoutePolicy, RuntimeReport, SdkError};
use std::path::PathBuf;
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
    /// GGUF model file, or Hub id (`org/repo[:QUANT][@REVISION]`, pulled on first use into the
    /// Hub cache; with --offline, found there). Optional when an upstream serves the model.
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
        engine.check_sizes(max_seqs, kv_seqs)?;
        let local = self.model.as_deref().map(super::hub::local).transpose()?;
        let spec = RouteSpec {
            model: local.as_ref().map(|l| l.path.clone()),
            policy: self.backend.into(),
            upstream: self.upstream.clone(),
            upstream_model: self.upstream_model.clone(),
            upstream_api_key: self.upstream_api_key.clone(),
            upstream_timeout: Duration::from_secs_f64(self.upstream_timeout.max(0.001)),
            allow_delegation: self.allow_delegation,
        };
        let load = |path: &std::path::Path| {
            super::load_model(path, engine).map_err(|e| SdkError::Config(format!("{e:#}")))
        };
        let draft_model = match self.backend {
            BackendArg::Auto | BackendArg::Native if local.is_some() => {
                engine.load_draft_model()?
            }
            _ => None,
        };
        let configure = |model: &axle_models::Model| EngineConfig {
            draft_model: draft_model.clone(),
            ..engine.engine_config(model, max_seqs, kv_seqs)
        };
        let (generator, mut report) = route::open(&spec, load, configure).await?;
        if matches!(generator, Generator::Native(_)) {
            report.model_source = local.map(|l| l.source);
        }
        if matches!(generator, Generator::Delegated(_)) {
            engine.check_delegated()?;
        }
        Ok((generator, report))
    }

    /// The name clients use: the alias, else the Hub id or the file stem, else the upstream's
    /// model id.
    pub fn display_name(&self, alias: Option<&str>, generator: &Generator) -> String {
        if let Some(a) = alias {
            return a.to_string();
        }
        let text = self
            .model
            .as_deref()
            .map(|m| m.to_string_lossy().into_owned());
        if let Some(Ok(axle_hub::ModelRef::Hub(id))) =
            text.as_deref().map(axle_hub::ModelRef::parse)
        {
            return id.to_string();
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
