//! One module per subcommand.
pub mod bench;
pub mod chat;
pub mod doctor;
pub mod generate;
pub mod serve;
pub mod tokenize;

use anyhow::Context;
use axle_models::{Model, ModelOptions};
use std::path::Path;
use std::time::Duration;

/// Loads a model with a spinner on stderr.
pub fn load_model(path: &Path, threads: usize) -> anyhow::Result<Model> {
    let spin = indicatif::ProgressBar::new_spinner();
    spin.set_message(format!("loading {}", path.display()));
    spin.enable_steady_tick(Duration::from_millis(100));
    let m = Model::load(
        path,
        &ModelOptions {
            threads,
            repack: true,
        },
    );
    spin.finish_and_clear();
    m.with_context(|| format!("cannot load model {}", path.display()))
}
