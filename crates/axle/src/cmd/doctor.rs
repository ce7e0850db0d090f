//! `axle doctor`: what this build can use on this machine, and whether a model file is usable.
use axle_ggml::{cpu_features, system_info, Device};
use axle_models::{arch, default_threads, Tokenizer};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A GGUF model file (or Hub id) to check.
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
    let on = |b: bool| if b { "on" } else { "off" };
    println!(
        "axle's CPU products: few-column (Q4_1/Q5_0/Q8_0, 2-32 columns; AVX2) {}, \
         prefill (Q4_1/Q5_0, more columns; AVX-512 VNNI) {}",
        on(axle_ggml::few_columns::supported()),
        on(axle_ggml::few_columns::wide_supported())
    );
    println!("ggml: {}", system_info().trim());
    print_backends();
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
    if let Some(model) = a.model {
        let path = super::hub::local(&model)?.path;
        let file = axle_models::hf::open_model(&path)?;
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

/// Where GPU backends were looked for, and what loaded (or why not).
fn print_backends() {
    let loaded = axle_ggml::load_dynamic_backends();
    let dirs: Vec<String> = axle_ggml::backend_search_dirs()
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    println!("backend libraries searched in: {}", dirs.join(", "));
    if loaded.is_empty() {
        println!("  none found: CPU only (scripts/build-backend.sh cuda builds libggml-cuda.so)");
    }
    for (path, result) in loaded {
        match result {
            Ok(name) => println!("  loaded {} ({name})", path.display()),
            Err(e) => println!("  NOT loaded {}: {e}", path.display()),
        }
    }
    print_environment();
}

/// Every environment variable Axle reads (`axle_ggml::env::REGISTRY`), with its value here.
fn print_environment() {
    println!("environment variables (docs/environment.md):");
    for v in axle_ggml::env::REGISTRY {
        match std::env::var_os(v.name) {
            Some(x) => println!("  {}={} ({})", v.name, x.to_string_lossy(), v.meaning),
            None => println!("  {} unset, so {} ({})", v.name, v.default, v.meaning),
        }
    }
}

/// SHA-256 of the Gemma 3 270M file the fetch script assembles.
const GEMMA3_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";

/// `axle bench doctor`: can this machine run the benchmarks? One line per item; each failure
/// comes with a one-line fix, and any failure makes the exit status 1.
pub fn bench_readiness() -> anyhow::Result<()> {
    use axle_ggml::oracle::{LlamaOracle, OracleOptions};
    use axle_models::fetched::{dir as model_dir, GEMMA3, SMOLLM2};
    let mut failures = 0;
    let mut report = |ok: bool, what: String, fix: &str| {
        if ok {
            println!("[ok]   {what}");
        } else {
            failures += 1;
            println!("[FAIL] {what}\n       fix: {fix}");
        }
    };
    let feats = cpu_features();
    let on: Vec<&str> = feats.iter().filter(|f| f.enabled).map(|f| f.name).collect();
    let x86 = cfg!(target_arch = "x86_64");
    report(
        !x86 || on.contains(&"AVX2"),
        format!("cpu features used by ggml: {}", on.join(" ")),
        "build on the machine that runs the bench (.cargo/config.toml sets target-cpu=native); without AVX2 the figures are not comparable",
    );
    report(
        true,
        format!(
            "threads: {} available, {} by default",
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            default_threads()
        ),
        "",
    );
    axle_ggml::load_dynamic_backends();
    let devices: Vec<String> = Device::all()
        .iter()
        .map(|d| format!("{} ({:?}, {} MiB)", d.name(), d.kind(), d.memory().1 >> 20))
        .collect();
    report(
        !devices.is_empty(),
        format!("ggml devices: {}", devices.join(", ")),
        "rebuild: cargo build --release (ggml's CPU backend is always built)",
    );
    let dir = model_dir();
    for (name, want) in [(SMOLLM2, None), (GEMMA3, Some(GEMMA3_SHA256))] {
        let p = dir.join(name);
        if !p.is_file() {
            report(
                false,
                format!("model {} missing", p.display()),
                "./scripts/fetch-models.sh",
            );
            continue;
        }
        match axle_sdk::route::file_sha256(&p) {
            Ok(h) => report(
                want.is_none_or(|w| w == h),
                format!("model {} sha256 {h}", p.display()),
                "delete it and run ./scripts/fetch-models.sh (the file is not the expected one)",
            ),
            Err(e) => report(
                false,
                format!("model {}: {e}", p.display()),
                "./scripts/fetch-models.sh",
            ),
        }
    }
    let smol = dir.join(SMOLLM2);
    if smol.is_file() {
        let oracle = LlamaOracle::load(
            &smol,
            &OracleOptions {
                vocab_only: true,
                ..Default::default()
            },
        );
        report(
            oracle.is_ok(),
            format!(
                "libllama oracle (llama-cpp-sys-2): {}",
                match &oracle {
                    Ok(o) => format!("loads, vocabulary {}", o.n_vocab()),
                    Err(e) => e.to_string(),
                }
            ),
            "rebuild with cmake and libclang present: ./scripts/setup.sh && cargo build --release",
        );
    }
    let fixtures: Vec<_> = std::fs::read_dir("fixtures")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "gguf"))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    report(
        !fixtures.is_empty(),
        format!("fixtures (./fixtures): {}", fixtures.join(", ")),
        "run from the repository root (or regenerate: python3 scripts/make-fixtures.py)",
    );
    let manifests = std::fs::read_dir("benchmarks/manifests")
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0);
    report(
        manifests > 0,
        format!("manifests (./benchmarks/manifests): {manifests} files"),
        "run from the repository root",
    );
    if failures > 0 {
        anyhow::bail!("{failures} readiness checks failed");
    }
    println!("ready");
    Ok(())
}
