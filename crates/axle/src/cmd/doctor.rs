//! `axle doctor`: what this build can use on this machine, and whether a model file is usable.
use axle_ggml::{cpu_features, system_info, Device, GgufFile};
use axle_models::{arch, default_threads, Tokenizer};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF model file to check.
    #[arg(long)]
    model: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    println!("axle {}", env!("CARGO_PKG_VERSION"));
    let feats: Vec<String> = cpu_features()
        .iter()
        .map(|f| format!("{}={}", f.name, if f.enabled { "on" } else { "off" }))
        .collect();
    println!("cpu features (ggml build): {}", feats.join(" "));
    println!(
        "threads: {} available (default for generation)",
        default_threads()
    );
    println!(
        "build: target-cpu=native, profile={}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!("ggml: {}", system_info().trim());
    for d in Device::all() {
        let (free, total) = d.memory();
        println!(
            "device: {} ({:?}) {} [{} MiB free / {} MiB]",
            d.name(),
            d.kind(),
            d.description(),
            free >> 20,
            total >> 20
        );
        for b in d.extra_buffer_types() {
            println!("  extra buffer type: {}", b.name());
        }
    }
    println!("supported architectures: {}", arch::supported().join(", "));
    if let Some(path) = a.model {
        let file = GgufFile::open(&path)?;
        let arch_name = file.str("general.architecture")?;
        if arch::loader_for(arch_name).is_err() {
            anyhow::bail!(
                "{}: unsupported model architecture `{arch_name}` (supported: {})",
                path.display(),
                arch::supported().join(", ")
            );
        }
        let tok = Tokenizer::from_gguf(&file)?;
        println!(
            "model: {} — {} tensors, {:.1} MiB, architecture {} (supported), vocabulary {} tokens, chat template: {}",
            path.display(),
            file.tensors().len(),
            file.file_size() as f64 / (1 << 20) as f64,
            arch_name,
            tok.len(),
            if file.str_opt("tokenizer.chat_template")?.is_some() { "yes" } else { "no" },
        );
    }
    Ok(())
}
