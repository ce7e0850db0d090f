//! `axle bench ngram`: decode speed with n-gram self-speculation against plain decoding, on the
//! checked-in workloads (`benchmarks/workloads/ngram.json`), same engine, same process, greedy, with
//! the outputs checked to be identical.
use crate::stats::median;
use crate::BenchError;
use axle_models::{Model, ModelOptions};
use axle_sdk::{EngineConfig, EngineCore, Output, RequestOptions};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// A workload: prompts of one kind.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Workload {
    /// Name.
    pub name: String,
    /// "high-hit" or "low-hit".
    pub kind: String,
    /// Plain completion prompts.
    pub prompts: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct WorkloadFile {
    workloads: Vec<Workload>,
}

/// Reads a workload file.
pub fn load_workloads(path: &Path) -> Result<Vec<Workload>, BenchError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| BenchError::Invalid(format!("{}: {e}", path.display())))?;
    let f: WorkloadFile = serde_json::from_str(&text)
        .map_err(|e| BenchError::Invalid(format!("{}: {e}", path.display())))?;
    Ok(f.workloads)
}

/// What to run.
#[derive(Debug, Clone)]
pub struct NgramOptions {
    /// Model.
    pub model: PathBuf,
    /// Threads.
    pub threads: usize,
    /// Workload file.
    pub workloads: PathBuf,
    /// Tokens to generate per prompt.
    pub max_tokens: usize,
    /// Longest draft.
    pub max_draft: usize,
    /// Repetitions per prompt.
    pub reps: usize,
}

/// One workload's result.
#[derive(Debug, Clone, Serialize)]
pub struct NgramRow {
    /// Workload.
    pub workload: String,
    /// Kind.
    pub kind: String,
    /// Plain decode tok/s (median over prompts and reps).
    pub plain: f64,
    /// Accelerated decode tok/s.
    pub accelerated: f64,
    /// accelerated / plain.
    pub ratio: f64,
    /// Accepted / drafted.
    pub acceptance: f64,
    /// Mean accepted draft tokens per verify step.
    pub mean_accepted: f64,
    /// Whether every output was identical to plain decoding.
    pub identical: bool,
}

/// The result.
#[derive(Debug, Clone, Serialize)]
pub struct NgramReport {
    /// Model.
    pub model: String,
    /// Threads.
    pub threads: usize,
    /// Verify cost measured at start-up (k draft tokens -> cost vs one decode step).
    pub verify_cost: Vec<f64>,
    /// Rows.
    pub rows: Vec<NgramRow>,
}

impl NgramReport {}

struct RunResult {
    tokens: Vec<u32>,
    decode_tok_s: f64,
    drafted: usize,
    accepted: usize,
    verifies: usize,
}

fn generate(
    e: &mut EngineCore,
    prompt: Vec<u32>,
    max_tokens: usize,
) -> Result<RunResult, BenchError> {
    let id = e.add(
        prompt,
        RequestOptions {
            max_tokens,
            ..Default::default()
        },
    )?;
    let mut tokens = Vec::new();
    let mut first: Option<Instant> = None;
    let (mut drafted, mut accepted, mut verifies) = (0, 0, 0);
    while e.has_work() {
        for o in e.step() {
            match o {
                Output::Token { id: i, token, .. } if i == id => {
                    first.get_or_insert_with(Instant::now);
                    tokens.push(token);
                }
                Output::Finished {
                    id: i,
                    drafted: d,
                    accepted: a,
                    verifies: v,
                    ..
                } if i == id => {
                    (drafted, accepted, verifies) = (d, a, v);
                }
                _ => {}
            }
        }
    }
    let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    let decode_tok_s = if tokens.len() > 1 && secs > 0.0 {
        (tokens.len() - 1) as f64 / secs
    } else {
        0.0
    };
    Ok(RunResult {
        tokens,
        decode_tok_s,
        drafted,
        accepted,
        verifies,
    })
}

/// Runs the benchmark.
pub fn run(opts: &NgramOptions) -> Result<NgramReport, BenchError> {
    let workloads = load_workloads(&opts.workloads)?;
    let model = Arc::new(Model::load(
        &opts.model,
        &ModelOptions {
            threads: opts.threads,
            repack: true,
        },
    )?);
    let base = EngineConfig {
        kv_slots: 4096,
        prefix_caching: false,
        ..Default::default()
    };
    let mut plain = EngineCore::new(
        model.clone(),
        &EngineConfig {
            max_draft: 0,
            ..base.clone()
        },
    )?;
    let mut fast = EngineCore::new(
        model.clone(),
        &EngineConfig {
            max_draft: opts.max_draft,
            ..base
        },
    )?;
    let verify_cost = fast
        .draft_config()
        .map(|d| d.verify_cost.clone())
        .unwrap_or_default();
    let total: usize =
        workloads.iter().map(|w| w.prompts.len()).sum::<usize>() * opts.reps.max(1) * 2;
    let bar = indicatif::ProgressBar::new(total as u64);
    let mut rows = Vec::new();
    for w in &workloads {
        let (mut p_speed, mut f_speed) = (Vec::new(), Vec::new());
        let (mut drafted, mut accepted, mut verifies) = (0, 0, 0);
        let mut identical = true;
        for (pi, text) in w.prompts.iter().enumerate() {
            let prompt = model.tokenizer.encode(text, true, false);
            for rep in 0..opts.reps.max(1) {
                bar.set_message(format!("{} prompt {} rep {}", w.name, pi + 1, rep + 1));
                // Alternate the order so neither mode always runs on a warmer machine.
                let (a, b) = if rep % 2 == 0 {
                    let a = generate(&mut plain, prompt.clone(), opts.max_tokens)?;
                    bar.inc(1);
                    (a, generate(&mut fast, prompt.clone(), opts.max_tokens)?)
                } else {
                    let b = generate(&mut fast, prompt.clone(), opts.max_tokens)?;
                    bar.inc(1);
                    (generate(&mut plain, prompt.clone(), opts.max_tokens)?, b)
                };
                bar.inc(1);
                identical &= a.tokens == b.tokens;
                p_speed.push(a.decode_tok_s);
                f_speed.push(b.decode_tok_s);
                drafted += b.drafted;
                accepted += b.accepted;
                verifies += b.verifies;
            }
        }
        let (p, f) = (median(&p_speed), median(&f_speed));
        rows.push(NgramRow {
            workload: w.name.clone(),
            kind: w.kind.clone(),
            plain: p,
            accelerated: f,
            ratio: f / p,
            acceptance: if drafted > 0 {
                accepted as f64 / drafted as f64
            } else {
                0.0
            },
            mean_accepted: if verifies > 0 {
                accepted as f64 / verifies as f64
            } else {
                0.0
            },
            identical,
        });
    }
    bar.finish_and_clear();
    Ok(NgramReport {
        model: opts.model.display().to_string(),
        threads: opts.threads,
        verify_cost,
        rows,
    })
}
