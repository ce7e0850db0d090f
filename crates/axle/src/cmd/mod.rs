//! One module per subcommand.
pub mod bench;
pub mod chat;
pub mod doctor;
pub mod generate;
pub mod route;
pub mod serve;
pub mod tokenize;

use anyhow::Context;
use axle_models::{DeviceChoice, Model, ModelOptions};
use std::path::Path;
use std::time::Duration;

/// Runs `f` with a spinner and `message` on stderr.
pub fn with_spinner<T>(message: &str, f: impl FnOnce() -> T) -> T {
    let spin = indicatif::ProgressBar::new_spinner();
    spin.set_message(message.to_string());
    spin.enable_steady_tick(Duration::from_millis(100));
    let out = f();
    spin.finish_and_clear();
    out
}

/// Where a native model runs: shared by every command that loads one.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Device: `auto` (the first GPU when a GPU backend is loaded, else the CPU), `cpu`, or a
    /// device name from `axle doctor` (`cuda0`, `cuda1`, `vulkan0`, `metal`, ...). GPU backends are
    /// shared libraries (`libggml-cuda.so`) loaded from $AXLE_BACKENDS_DIR, or from the folder of
    /// the axle binary and its `backends/` subfolder.
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
    /// Layers on the GPU, counted from the last (default: all, with the output head); the first
    /// ones stay on the CPU, for models larger than the card.
    #[arg(long)]
    pub gpu_layers: Option<u32>,
}

/// The engine's kernel choice, for the commands that run the engine (generate, serve, chat).
#[derive(clap::Args, Debug, Clone)]
pub struct KernelArgs {
    /// Kernel choice: `exact` (a request's output does not depend on what shares its steps, and
    /// n-gram speculation reproduces plain decoding) or `fast` (ggml's kernels for each step's
    /// shape, as llama.cpp runs: more tokens/s for many concurrent sequences on a GPU, where
    /// exactness costs extra passes over the weights and one attention op per decoding row;
    /// outputs may then change with the batch at close calls).
    #[arg(long, value_enum, default_value_t = KernelChoice::Exact)]
    pub kernels: KernelChoice,
}

/// `--kernels`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelChoice {
    /// Batch-invariant kernels.
    Exact,
    /// Shape-dependent kernels.
    Fast,
}

impl KernelArgs {
    /// The engine's kernel choice.
    pub fn kernels(&self) -> axle_models::Kernels {
        match self.kernels {
            KernelChoice::Exact => axle_models::Kernels::BatchInvariant,
            KernelChoice::Fast => axle_models::Kernels::LikeLlamaCpp,
        }
    }
}

/// Loads a model: a spinner on stderr while the file is opened, a progress bar while weights
/// are copied to a device; `repack` picks ggml's repacked CPU weight layouts.
pub fn load_model(
    path: &Path,
    threads: usize,
    repack: bool,
    device: &DeviceArgs,
) -> anyhow::Result<Model> {
    let opts = ModelOptions {
        threads,
        repack,
        device: device.device.clone(),
        gpu_layers: device.gpu_layers,
    };
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(format!("loading {}", path.display()));
    bar.enable_steady_tick(Duration::from_millis(100));
    let mut styled = false;
    let model = Model::load_with_progress(path, &opts, &mut |done, total| {
        if !styled {
            styled = true;
            bar.set_length(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
        }
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let model = model.with_context(|| format!("cannot load model {}", path.display()))?;
    if model.offload().is_some() {
        eprintln!("device: {}", model.device_summary());
    }
    Ok(model)
}
