//! `axle serve`: the OpenAI-compatible server over one model (ours, or a delegated upstream's).
use super::RunArgs;
use anyhow::Context;
use axle_server::{AppState, Metrics};
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
}

/// Full contexts the KV pool holds unless `--kv-slots` says otherwise.
const SERVE_KV_CONTEXTS: usize = 2;

pub fn run(a: Args) -> anyhow::Result<()> {
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
    let state = AppState {
        generator,
        runtime: Arc::new(report),
        model_name: name.clone(),
        api_key: a.api_key,
        metrics: Arc::new(Metrics::default()),
        max_queue: a.max_queue,
    };
    let addr = SocketAddr::new(a.host, a.port);
    eprintln!("serving {name} on http://{addr} (OpenAI-compatible: /v1/chat/completions, /v1/completions)");
    rt.block_on(axle_server::serve(state, addr))
        .with_context(|| format!("cannot serve on {addr}"))?;
    eprintln!("shut down");
    Ok(())
}
