//! One module per subcommand.
pub mod bench;
pub mod chat;
pub mod doctor;
pub mod generate;
pub mod route;
pub mod serve;
pub mod tokenize;

use anyhow::Context;
use axle_models::{Model, ModelOptions};
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

/// Loads a model with a spinner on stderr; `repack` picks ggml's repacked weight layouts.
pub fn load_model(path: &Path, threads: usize, repack: bool) -> anyhow::Result<Model> {
    with_spinner(&format!("loading {}", path.display()), || {
        Model::load(path, &ModelOptions { threads, repack })
    })
    .with_context(|| format!("cannot load model {}", path.display()))
}
