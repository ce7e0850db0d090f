//! `axle serve`: the OpenAI-compatible server over one model.
use super::route::{Route, RouteArgs};
use anyhow::Context;
use axle_models::default_threads;
use axle_sdk::{EngineConfig, Session};
use axle_server::{AppState, Backend, Metrics};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    route: RouteArgs,
    #[command(flatten)]
    kernels: super::KernelArgs,
    /// Address to bind (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 16)]
    max_batch_size: usize,
    /// Most tokens computed in one step (prefill chunks and decodes together).
    #[arg(long, default_value_t = 512)]
    max_batch_tokens: usize,
    /// Context length per sequence (tokens).
    #[arg(long, default_value_t = 4096)]
    context_len: usize,
    /// KV slots shared by all sequences (default: context length x 2).
    #[arg(long)]
    kv_slots: Option<u32>,
    /// Require this bearer key.
    #[arg(long)]
    api_key: Option<String>,
    /// Model name clients use (default: the file name without extension, or the upstream's id).
    #[arg(long)]
    model_alias: Option<String>,
    /// Requests queued before new ones get 503.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// CPU threads.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Longest n-gram draft (0 = speculation off).
    #[arg(long, default_value_t = 4)]
    draft_len: usize,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (route, report) = rt.block_on(a.route.resolve(a.threads))?;
    let name = a.route.display_name(a.model_alias.as_deref(), &route);
    let backend = match route {
        Route::Native(model) => {
            let cfg = EngineConfig {
                kv_slots: a.kv_slots.unwrap_or((a.context_len * 2) as u32),
                context_len: a.context_len,
                max_seqs: a.max_batch_size.max(1),
                max_batch_tokens: a
                    .max_batch_tokens
                    .max(a.draft_len + 1)
                    .max(a.max_batch_size),
                max_draft: a.draft_len.min(8),
                kernels: a.kernels.kernels(),
                ..Default::default()
            };
            Backend::Native(Arc::new(Session::new(Arc::new(*model), cfg)?))
        }
        Route::Delegated(up) => {
            if a.kernels.kernels != super::KernelChoice::Exact {
                anyhow::bail!("--kernels applies to the native backend only");
            }
            Backend::Delegated(Arc::new(up))
        }
    };
    eprintln!("route: {}", report.summary());
    let state = AppState {
        backend,
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
