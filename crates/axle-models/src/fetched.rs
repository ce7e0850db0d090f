//! Where Axle's fetched models live: `$AXLE_MODEL_DIR`, else `$XDG_CACHE_HOME/axle/models`, else
//! `~/.cache/axle/models` (the directory `scripts/fetch-models.sh` fills).
use std::path::PathBuf;

/// File name of the default model (SmolLM2-135M-Instruct, Q4_1).
pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name of Gemma 3 270M (Q4_K_M).
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// The model cache directory.
pub fn dir() -> PathBuf {
    if let Some(d) = axle_ggml::env::var_os("AXLE_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache")
        });
    cache.join("axle/models")
}

/// A cached model's path, or an error that says how to fetch it.
pub fn model_path(name: &str) -> Result<PathBuf, String> {
    let p = dir().join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "model {} is missing: run scripts/fetch-models.sh (or set AXLE_MODEL_DIR)",
            p.display()
        ))
    }
}
