//! Manifest-driven scenarios: run a manifest's workload, check what it says to check, and write
//! one artifact per run. Every figure in the README comes from one of these.
pub mod artifact;
pub mod checks;
pub mod manifest;
pub mod report;
mod workloads;

pub use artifact::{Artifact, CheckResult, Environment, Row};
pub use manifest::Manifest;

use crate::BenchError;
use axle_models::{Model, ModelOptions};
use axle_sdk::RuntimeReport;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How to run a scenario.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Where the artifact goes (`DIR/<scenario>.json`).
    pub output_root: Option<PathBuf>,
    /// A baseline artifact that overrides the manifest's (regression check).
    pub baseline: Option<PathBuf>,
    /// Progress bars on stderr.
    pub progress: bool,
    /// A `llama-server` binary: `ngram` workloads also run its n-gram speculative modes.
    pub llama_server: Option<PathBuf>,
}

/// Runs the manifest at `path`; returns the artifact and where it was written.
pub fn run(path: &Path, opts: &RunOptions) -> Result<(Artifact, Option<PathBuf>), BenchError> {
    let manifest = Manifest::load(path)?;
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let artifact = run_manifest(&manifest, &dir, opts)?;
    let written = match &opts.output_root {
        Some(root) => {
            let out = root.join(format!("{}.json", manifest.name));
            artifact.save(&out)?;
            Some(out)
        }
        None => None,
    };
    Ok((artifact, written))
}

/// Runs a loaded manifest whose relative paths are relative to `dir`.
pub fn run_manifest(m: &Manifest, dir: &Path, opts: &RunOptions) -> Result<Artifact, BenchError> {
    let t0 = Instant::now();
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let model_path = m.model_path(dir);
    if !model_path.is_file() {
        return Err(BenchError::Invalid(format!(
            "model {} is missing (run scripts/fetch-models.sh, or fix the manifest's model.path)",
            model_path.display()
        )));
    }
    let sha = axle_sdk::route::file_sha256(&model_path)
        .map_err(|e| BenchError::Invalid(format!("cannot hash {}: {e}", model_path.display())))?;
    let model = std::sync::Arc::new(Model::load(
        &model_path,
        &ModelOptions {
            threads: m.model.threads,
            repack: m.model.repack,
            device: m.model.device.parse().unwrap_or_default(),
            gpu_layers: m.model.gpu_layers,
            split: m.model.split.clone(),
            rpc: m.model.rpc.clone(),
            split_mode: match &m.model.split_mode {
                Some(s) => s.parse().map_err(BenchError::Invalid)?,
                None => Default::default(),
            },
            host_memory: match &m.model.host_memory {
                Some(s) => s.parse().map_err(BenchError::Invalid)?,
                None => Default::default(),
            },
            ..Default::default()
        },
    )?);
    let runtime = RuntimeReport::native(&model, Some(&sha));
    let (rows, mut results) = workloads::run(m, dir, &model, &model_path, opts)?;
    if let Some(c) = &m.checks.correctness {
        results.push(checks::correctness(m, c, &model, &model_path)?);
    }
    if let Some(d) = &m.checks.determinism {
        results.push(checks::determinism(m, d, &model)?);
    }
    if let Some(r) = &m.route {
        results.push(checks::route(r, &runtime));
    }
    let baseline = match (&opts.baseline, &m.checks.regression) {
        (Some(b), r) => Some((
            b.clone(),
            r.as_ref().map_or(0.10, |r| r.tolerance),
            r.as_ref().map(|r| r.metrics.clone()).unwrap_or_default(),
        )),
        (None, Some(r)) => Some((
            manifest::resolve(&r.baseline, dir),
            r.tolerance,
            r.metrics.clone(),
        )),
        (None, None) => None,
    };
    if let Some((b, tol, metrics)) = baseline {
        let base = Artifact::load(&b)?;
        results.push(artifact::regression(&rows, &base, tol, &metrics));
    }
    let environment = environment(m.model.threads, &model_path, &sha);
    Ok(Artifact {
        schema: artifact::SCHEMA,
        scenario: m.name.clone(),
        description: m.description.clone(),
        manifest: m.clone(),
        started_unix,
        wall_s: t0.elapsed().as_secs_f64(),
        environment,
        runtime,
        passed: results.iter().all(|c| c.passed),
        rows,
        checks: results,
    })
}

/// Re-evaluates the regression check of an existing artifact against a baseline (no rerun).
pub fn check_against(
    current: &Artifact,
    baseline: &Artifact,
    tolerance: f64,
    metrics: &[String],
) -> CheckResult {
    artifact::regression(&current.rows, baseline, tolerance, metrics)
}

/// Machine, build and model facts for the artifact.
pub fn environment(threads: usize, model: &Path, sha: &str) -> Environment {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cpu_features = axle_ggml::cpu_features()
        .iter()
        .filter(|f| f.enabled)
        .map(|f| f.name.to_string())
        .collect();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let mut target = Vec::new();
    for (on, name) in [
        (cfg!(target_feature = "avx2"), "avx2"),
        (cfg!(target_feature = "fma"), "fma"),
        (cfg!(target_feature = "f16c"), "f16c"),
        (cfg!(target_feature = "avx512f"), "avx512f"),
        (cfg!(target_feature = "neon"), "neon"),
    ] {
        if on {
            target.push(name);
        }
    }
    Environment {
        cpu_model,
        cpu_features,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        threads,
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        kernel,
        build: format!(
            "profile={} target-features={} llama-cpp-sys-2=0.1.161",
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            target.join(",")
        ),
        axle_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: crate::git_commit(),
        model_path: model.display().to_string(),
        model_bytes: std::fs::metadata(model).map_or(0, |m| m.len()),
        model_sha256: sha.into(),
        peak_rss_mib: peak_rss_mib(),
    }
}

/// The process's peak resident set (VmHWM), MiB; 0 where /proc is not there.
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
