//! `axle serve`: the OpenAI-compatible server over one model (ours, or a delegated upstream's).
use super::RunArgs;
use anyhow::Context;
use axle_server::{AppState, Metrics, ServeOptions};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// Address to bind (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 16)]
    max_batch_size: usize,
    /// Require this bearer key.
    #[arg(long)]
    api_key: Option<String>,
    /// Model name clients use (default: the file name without extension, or the upstream's id).
    #[arg(long)]
    model_alias: Option<String>,
    /// Requests queued before new ones get 503.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Most tokens one request may generate: a larger `max_tokens` is refused (400), and
    /// requests without one get the default capped by this.
    #[arg(long)]
    max_tokens_limit: Option<usize>,
    /// Most connections open at once; one more gets a 503 and is closed.
    #[arg(long, default_value_t = ServeOptions::default().max_connections)]
    max_connections: usize,
    /// Seconds a connection may take to send a request head, or sit idle between requests.
    #[arg(long, default_value_t = ServeOptions::default().header_timeout.as_secs_f64())]
    header_timeout: f64,
    /// Seconds a request's body may take to arrive after its head (408 after that); while
    /// every connection slot is taken, bodies slower than 16 KiB/s for over a second are cut.
    #[arg(long, default_value_t = ServeOptions::default().body_timeout.as_secs_f64())]
    body_timeout: f64,
    /// Serve `/v1/embeddings` with the model too (on without this flag for a model whose file
    /// names a pooling type, such as Qwen3-Embedding's; a generative model needs `--pooling`).
    /// The embeddings get KV for one context of their own beside the engine's.
    #[arg(long)]
    embeddings: bool,
    /// How `/v1/embeddings` pools a sequence's final hidden states: `mean`, `cls` or `last`
    /// (default: as the model file says).
    #[arg(long)]
    pooling: Option<axle_sdk::Pooling>,
    /// Seconds running requests get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = ServeOptions::default().shutdown_grace.as_secs_f64())]
    shutdown_grace: f64,
}

/// Full contexts the KV pool holds unless `--kv-slots` says otherwise.
const SERVE_KV_CONTEXTS: usize = 2;

pub fn run(a: Args) -> anyhow::Result<()> {
    let seconds = |flag: &str, v: f64| {
        std::time::Duration::try_from_secs_f64(v)
            .ok()
            .filter(|d| !d.is_zero())
            .with_context(|| format!("--{flag} must be a positive number of seconds, got {v}"))
    };
    if a.max_tokens_limit == Some(0) {
        anyhow::bail!("--max-tokens-limit must be at least 1");
    }
    let opts = ServeOptions {
        max_connections: a.max_connections.max(1),
        header_timeout: seconds("header-timeout", a.header_timeout)?,
        body_timeout: seconds("body-timeout", a.body_timeout)?,
        shutdown_grace: seconds("shutdown-grace", a.shutdown_grace)?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (generator, report) = rt.block_on(a.run.start(a.max_batch_size, SERVE_KV_CONTEXTS))?;
    let name = a
        .run
        .route
        .display_name(a.model_alias.as_deref(), &generator);
    eprintln!("route: {}", report.summary());
    let embeddings = start_embeddings(&a, &generator)?;
    let state = AppState {
        generator,
        runtime: Arc::new(report),
        model_name: name.clone(),
        api_key: a.api_key,
        metrics: Arc::new(Metrics::default()),
        max_queue: a.max_queue,
        max_tokens_limit: a.max_tokens_limit,
        responses: Default::default(),
        embeddings,
    };
    let addr = SocketAddr::new(a.host, a.port);
    eprintln!("serving {name} on http://{addr} (OpenAI-compatible: /v1/chat/completions, /v1/completions)");
    rt.block_on(axle_server::serve(state, addr, opts))
        .with_context(|| format!("cannot serve on {addr}"))?;
    // Requests still running after the grace period end with the runtime.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    eprintln!("shut down");
    Ok(())
}

/// The embedding service, where the model names a pooling or the flags ask for one.
fn start_embeddings(
    a: &Args,
    generator: &axle_sdk::Generator,
) -> anyhow::Result<Option<Arc<axle_sdk::Embeddings>>> {
    let asked = a.embeddings || a.pooling.is_some();
    let axle_sdk::Generator::Native(session) = generator else {
        if asked {
            anyhow::bail!("--embeddings needs a model Axle runs natively, not a delegated route");
        }
        return Ok(None);
    };
    let model = session.model();
    if !asked && model.pooling().is_none() {
        return Ok(None);
    }
    let engine = a.run.engine.engine_config(model, a.max_batch_size, 1);
    let service = axle_sdk::Embeddings::start(
        model.clone(),
        &axle_sdk::EmbedderConfig::beside(&engine, a.pooling),
    )
    .context("cannot serve embeddings")?;
    eprintln!(
        "embeddings: {} pooling, {} dimensions, inputs of up to {} tokens",
        service.pooling(),
        service.width(),
        service.max_tokens()
    );
    Ok(Some(Arc::new(service)))
}
