//! `axle bench compare`: prefill and decode throughput of Axle against libllama on one model, in
//! one process, same threads, interleaved repetitions, medians and ratios.
use crate::stats::{synthetic_tokens, Paired};
use crate::BenchError;
use axle_ggml::oracle::{LlamaOracle, OracleOptions};
use axle_models::{Model, Runner, RunnerOptions, Sequence, StepProfile};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// The GGUF model.
    pub model: PathBuf,
    /// CPU threads (both engines).
    pub threads: usize,
    /// Prompt lengths to prefill.
    pub prefill: Vec<usize>,
    /// Tokens to decode.
    pub decode: usize,
    /// Repetitions per test (median reported).
    pub reps: usize,
    /// Show a progress bar.
    pub progress: bool,
    /// How libllama spreads layers over several GPUs.
    pub oracle_split: axle_ggml::oracle::SplitMode,
    /// The exact kernels' arithmetic on the CPU.
    pub host_kernels: axle_models::HostKernels,
}

/// One row of the result.
#[derive(Debug, Clone, Serialize)]
pub struct CompareRow {
    /// "pp128", "tg128", ...
    pub test: String,
    /// Tokens a repetition feeds (the number in the test's name).
    #[serde(skip)]
    pub tokens: usize,
    /// Tok/s, Axle against libllama.
    #[serde(flatten)]
    pub tok_s: Paired,
    /// Where Axle's steps (decode steps, or prefill chunks) spent their time, over every timed
    /// repetition.
    pub profile: StepProfile,
}

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    /// Model file.
    pub model: String,
    /// Threads.
    pub threads: usize,
    /// Rows.
    pub rows: Vec<CompareRow>,
}

/// How long an engine runs untimed (short prefills) before each of its timed samples.
///
/// The engine that ran just before slows the next one's first tenth of a second on a 2-core
/// machine: with one short warm-up, samples taken right after the other engine read up to half
/// speed, and a median of 5 could land on either mode. Settling for 256 tokens' time (about
/// 0.23 s) left no slow sample; 300 ms keeps a margin.
const SETTLE: Duration = Duration::from_millis(300);

/// Runs `warm_up` until [`SETTLE`] has passed (at least once).
fn settle(mut warm_up: impl FnMut() -> Result<f64, BenchError>) -> Result<(), BenchError> {
    let t = Instant::now();
    loop {
        warm_up()?;
        if t.elapsed() >= SETTLE {
            return Ok(());
        }
    }
}

fn time_axle_prefill(runner: &mut Runner, toks: &[u32]) -> Result<f64, BenchError> {
    let mut seq = Sequence::new(runner);
    let t = Instant::now();
    seq.feed(runner, toks)?;
    Ok(toks.len() as f64 / t.elapsed().as_secs_f64())
}

fn time_llama_prefill(o: &mut LlamaOracle, toks: &[u32]) -> Result<f64, BenchError> {
    o.clear();
    let ids: Vec<i32> = toks.iter().map(|&t| t as i32).collect();
    let t = Instant::now();
    o.prefill(&ids, 0)?;
    Ok(toks.len() as f64 / t.elapsed().as_secs_f64())
}

fn time_axle_decode(runner: &mut Runner, toks: &[u32]) -> Result<f64, BenchError> {
    let mut seq = Sequence::new(runner);
    let t = Instant::now();
    for &tok in toks {
        let logits = seq.feed(runner, &[tok])?;
        runner.recycle(logits);
    }
    Ok(toks.len() as f64 / t.elapsed().as_secs_f64())
}

fn time_llama_decode(o: &mut LlamaOracle, toks: &[u32]) -> Result<f64, BenchError> {
    o.clear();
    let t = Instant::now();
    // As llama-bench times decoding: the head runs, its logits stay on the device.
    for (i, &tok) in toks.iter().enumerate() {
        o.decode_unread(&[(tok as i32, i as i32, 0, true)])?;
    }
    Ok(toks.len() as f64 / t.elapsed().as_secs_f64())
}

/// Runs the comparison on `model` (loaded by the caller, in the layout its manifest asks for)
/// against libllama loaded from `opts.model`.
pub fn run(model: &Arc<Model>, opts: &CompareOptions) -> Result<CompareReport, BenchError> {
    if opts.reps == 0 {
        return Err(BenchError::Invalid("--reps must be at least 1".into()));
    }
    let max_len = opts
        .prefill
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(opts.decode)
        + 1;
    let kv_slots = (max_len as u32).div_ceil(256) * 256;
    let mut runner = Runner::new(
        model.clone(),
        RunnerOptions {
            kv_slots,
            kernels: crate::default_kernels(model),
            host_kernels: opts.host_kernels,
            ..Default::default()
        },
    )?;
    let mut oracle = LlamaOracle::load(
        &opts.model,
        &OracleOptions {
            n_ctx: kv_slots,
            n_threads: opts.threads,
            n_gpu_layers: crate::oracle_gpu_layers(model),
            split_mode: opts.oracle_split,
            ..Default::default()
        },
    )?;
    let n_vocab = model.tokenizer.len();
    let tests: Vec<(String, usize, bool)> = opts
        .prefill
        .iter()
        .map(|&n| (format!("pp{n}"), n, true))
        .chain((opts.decode > 0).then(|| (format!("tg{}", opts.decode), opts.decode, false)))
        .collect();
    let bar = crate::progress_bar(opts.progress, (tests.len() * opts.reps * 2 + 2) as u64, "");
    // Warm-up: page the weights in and let both engines build their buffers once.
    let warm = synthetic_tokens(32, n_vocab, 1);
    bar.set_message("warm-up");
    time_axle_prefill(&mut runner, &warm)?;
    bar.inc(1);
    time_llama_prefill(&mut oracle, &warm)?;
    bar.inc(1);
    let mut rows = Vec::new();
    for (name, n, prefill) in tests {
        let (mut a, mut l) = (Vec::new(), Vec::new());
        let mut profile = StepProfile::default();
        for rep in 0..opts.reps {
            let toks = synthetic_tokens(n, n_vocab, 100 + rep as u64);
            bar.set_message(format!("{name} rep {}", rep + 1));
            // Alternate which engine goes first so drift (thermal, caches) does not favour one.
            let axle_first = rep % 2 == 0;
            for turn in 0..2 {
                // Untimed work on the engine about to be measured, until it runs at its own
                // speed again (see [`SETTLE`]).
                if (turn == 0) == axle_first {
                    settle(|| time_axle_prefill(&mut runner, &warm))?;
                    runner.take_profile();
                    a.push(if prefill {
                        time_axle_prefill(&mut runner, &toks)?
                    } else {
                        time_axle_decode(&mut runner, &toks)?
                    });
                    profile.add(&runner.take_profile());
                } else {
                    settle(|| time_llama_prefill(&mut oracle, &warm))?;
                    l.push(if prefill {
                        time_llama_prefill(&mut oracle, &toks)?
                    } else {
                        time_llama_decode(&mut oracle, &toks)?
                    });
                }
                bar.inc(1);
            }
        }
        rows.push(CompareRow {
            test: name,
            tokens: n,
            tok_s: Paired::new(a, l),
            profile,
        });
    }
    bar.finish_and_clear();
    Ok(CompareReport {
        model: opts.model.display().to_string(),
        threads: opts.threads,
        rows,
    })
}
