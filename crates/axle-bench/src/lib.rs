//! Axle's benchmark toolkit. Every figure is measured in one process against the reference
//! (libllama, same ggml build, same file, same threads), repeated, and reported as medians and
//! ratios. Benchmarks are commands that print tables, never timed tests.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod agent;
pub mod batched;
pub mod compare;
pub mod device_check;
pub mod llama_server;
pub mod ngram;
pub mod prefix;
pub mod scenario;
pub mod serve;
pub mod server;
pub mod soak;
pub mod stats;
pub mod structured;

/// The libllama oracle's `n_gpu_layers` that puts the same layers on accelerators as `model`
/// has: 0 on the CPU, every layer and the head (999) when the model is wholly offloaded.
pub fn oracle_gpu_layers(model: &axle_models::Model) -> i32 {
    let p = model.placement();
    match p.head_device() {
        Some(_) => 999,
        None => p.accelerator_layers() as i32,
    }
}

/// A progress bar on stderr (hidden when `show` is false).
pub fn progress_bar(show: bool, len: u64, message: &str) -> indicatif::ProgressBar {
    let bar = if show {
        indicatif::ProgressBar::new(len)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(message.to_string());
    bar
}

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Axle failed.
    #[error(transparent)]
    Model(#[from] axle_models::ModelError),
    /// The reference failed.
    #[error(transparent)]
    Ggml(#[from] axle_ggml::Error),
    /// The engine failed.
    #[error(transparent)]
    Sdk(#[from] axle_sdk::SdkError),
    /// Bad options.
    #[error("{0}")]
    Invalid(String),
}

/// The kernels a bench runs Axle with: batch-invariant, except under a tensor split, which
/// cannot be (its runs are compared with libllama's own kernels).
pub fn default_kernels(model: &axle_models::Model) -> axle_models::Kernels {
    if model.placement().tensor_parallel().is_some() {
        axle_models::Kernels::LikeLlamaCpp
    } else {
        axle_models::Kernels::BatchInvariant
    }
}

/// The commit of the code that runs: `AXLE_GIT_COMMIT` when set (a binary carried to a machine
/// whose copy of the tree has no history of its own), else the working tree's.
pub(crate) fn git_commit() -> String {
    if let Some(c) = axle_ggml::env::var("AXLE_GIT_COMMIT").filter(|c| !c.is_empty()) {
        return c;
    }
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match run(&["rev-parse", "HEAD"]) {
        Some(c) => {
            let dirty = run(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}-dirty")
            } else {
                c
            }
        }
        None => "unknown".into(),
    }
}
