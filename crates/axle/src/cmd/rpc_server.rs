//! `axle rpc-server`: serves this machine's devices to other Axle (or llama.cpp) processes over
//! ggml's RPC protocol, so that one model can spread over several machines (`--rpc host:port`
//! on the client). What llama.cpp's `rpc-server` program does, with the same ggml as the client.
use axle_models::{placement, DeviceChoice};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on. The protocol has no authentication and no encryption: keep it on
    /// loopback or a private network.
    #[arg(long, default_value = "127.0.0.1:50052")]
    listen: String,
    /// Devices to serve: `cpu`, a device name (`cuda0`), several (`cuda0,cuda1`), or `auto`
    /// (every GPU, else the CPU).
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// CPU threads of a served CPU device.
    #[arg(long, default_value_t = axle_models::default_threads())]
    threads: usize,
    /// Folder that keeps tensors sent before, so that a client loading the same model again
    /// sends only their hashes.
    #[arg(long)]
    cache: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let most = axle_models::MAX_THREADS_PER_CORE * axle_models::default_threads();
    if a.threads == 0 || a.threads > most {
        anyhow::bail!(
            "--threads must be 1 to {most} on this machine, got {}",
            a.threads
        );
    }
    axle_ggml::load_dynamic_backends();
    let gpus = placement::local_gpus();
    let cpu = axle_ggml::Device::cpu()?;
    let devices = match &a.device {
        DeviceChoice::Cpu => vec![cpu],
        DeviceChoice::Auto | DeviceChoice::All if gpus.is_empty() => vec![cpu],
        DeviceChoice::Auto | DeviceChoice::All => gpus,
        DeviceChoice::Named(n) => vec![placement::find_device(n)?],
        DeviceChoice::List(names) => names
            .iter()
            .map(|n| placement::find_device(n))
            .collect::<Result<_, _>>()?,
    };
    if let Some(dir) = &a.cache {
        std::fs::create_dir_all(dir)?;
    }
    eprintln!(
        "serving {} on {} (ggml RPC protocol; no authentication: keep it on a private network)",
        devices
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join(", "),
        a.listen
    );
    axle_ggml::rpc::serve(&a.listen, &devices, a.threads, a.cache.as_deref())?;
    Ok(())
}
