//! `axle bench ngram`: decode speed with self-speculation against plain decoding, on checked-in
//! workloads (`benchmarks/workloads/ngram.json`, `suffix.json`), same engine, same process, with
//! the outputs checked to be identical: one speculative engine per drafter set compared
//! (`ngram`, `suffix`, `all`), greedy or sampled with the same seed as the plain run. The outputs
//! kept for suffix drafts across requests are cleared before each prompt, except within a
//! workload marked `session` (turns of one agent session, run in order). Given a `llama-server`
//! binary, the same prompts also go through llama.cpp's own n-gram speculative modes, each against
//! its own plain decoding.
use crate::llama_server::LlamaServer;
use crate::stats::median;
use crate::BenchError;
use axle_models::Model;
use axle_sdk::{
    DraftSources, EngineConfig, EngineCore, Output, PositionStats, RequestOptions, SamplingParams,
};
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
    /// The prompts are turns of one session, run in order, sharing the outputs kept for suffix
    /// drafts across requests (cleared before the first turn only).
    #[serde(default)]
    pub session: bool,
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
    pub draft_len: usize,
    /// The drafter sets compared, one speculative engine each.
    pub drafters: Vec<DraftSources>,
    /// Sampling temperature (0: greedy); sampled runs use the repetition's seed in both modes.
    pub temperature: f32,
    /// A draft model for the drafter sets that include `model`.
    pub draft_model: Option<Arc<Model>>,
    /// Repetitions per prompt.
    pub reps: usize,
    /// A `llama-server` binary to compare with (its n-gram speculative modes).
    pub llama_server: Option<PathBuf>,
    /// The `--spec-type` values to run it with.
    pub llama_server_modes: Vec<String>,
}

/// Decode speed with speculation against without, and how much of the draft was accepted.
#[derive(Debug, Clone, Serialize)]
pub struct Speedup {
    /// Decode tok/s without speculation (median over prompts and reps).
    pub plain: f64,
    /// Decode tok/s with speculation.
    pub accelerated: f64,
    /// accelerated / plain.
    pub ratio: f64,
    /// Accepted / drafted.
    pub acceptance: f64,
}

/// `part / whole`, or 0 when `whole` is 0.
fn fraction(part: usize, whole: usize) -> f64 {
    if whole > 0 {
        part as f64 / whole as f64
    } else {
        0.0
    }
}

/// llama-server on one workload in one speculative mode.
#[derive(Debug, Clone, Serialize)]
pub struct LlamaServerRow {
    /// `--spec-type`.
    pub mode: String,
    /// Its decode speed without speculation and with this mode.
    #[serde(flatten)]
    pub speed: Speedup,
    /// Share of outputs identical to its plain output.
    pub identical_share: f64,
}

/// One workload's result.
#[derive(Debug, Clone, Serialize)]
pub struct NgramRow {
    /// Workload.
    pub workload: String,
    /// The drafters of the speculative engine (`ngram`, `suffix`, `ngram,suffix`).
    pub drafters: String,
    /// Kind.
    pub kind: String,
    /// Plain and accelerated decode tok/s.
    #[serde(flatten)]
    pub speed: Speedup,
    /// Mean accepted draft tokens per verify step.
    pub mean_accepted: f64,
    /// Share of outputs (prompts x repetitions) identical to plain decoding.
    pub identical_share: f64,
    /// Conditional acceptance by draft position (position 1 first).
    pub acceptance_by_position: Vec<f64>,
    /// llama-server's n-gram modes on the same prompts, when a binary was given.
    pub llama_server: Vec<LlamaServerRow>,
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
    /// The draft model's step cost against the model's decode step, measured at start-up.
    pub draft_model_cost: Option<f64>,
    /// Where those steps spent their time, per k: microseconds per step preparing, building,
    /// writing inputs, computing and reading back.
    pub verify_split_us: Vec<[f64; 5]>,
    /// Where the plain engine's steps spent their time over the whole run (prefill chunks
    /// included), in the same phases.
    pub plain_split_us: [f64; 5],
    /// Shapes of verify rows (KV slots, rows) the speculative engine probed for one shared
    /// attention op, and whether the device gave them one (`axle_models::stacked_attention`).
    pub stacked_shapes: Vec<(i64, i64, bool)>,
    /// Rows.
    pub rows: Vec<NgramRow>,
}

struct RunResult {
    tokens: Vec<u32>,
    decode_tok_s: f64,
    drafted: usize,
    accepted: usize,
    verifies: usize,
    positions: PositionStats,
}

fn generate(
    e: &mut EngineCore,
    prompt: Vec<u32>,
    max_tokens: usize,
    temperature: f32,
    seed: u64,
) -> Result<RunResult, BenchError> {
    let id = e.add(
        prompt,
        RequestOptions {
            max_tokens,
            sampling: SamplingParams {
                temperature,
                seed,
                ..Default::default()
            },
            ..Default::default()
        },
    )?;
    let mut tokens = Vec::new();
    let mut first: Option<Instant> = None;
    let (mut drafted, mut accepted, mut verifies) = (0, 0, 0);
    let mut positions = PositionStats::default();
    while e.has_work() {
        for o in e.step() {
            match o {
                Output::Token { id: i, token, .. } if i == id => {
                    first.get_or_insert_with(Instant::now);
                    tokens.push(token);
                }
                Output::Finished { id: i, finish, .. } if i == id => {
                    let s = finish.speculation;
                    (drafted, accepted, verifies, positions) =
                        (s.drafted, s.accepted, s.verifies, s.positions);
                }
                _ => {}
            }
        }
    }
    let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    // The next run may be another engine's: its threads must not compete with these polling.
    e.pause_threads();
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
        positions,
    })
}

/// Runs every workload's prompts through llama-server, plain and in each speculative mode.
fn llama_server_rows(
    bin: &std::path::Path,
    opts: &NgramOptions,
    prompts: &[Vec<Vec<u32>>],
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Vec<LlamaServerRow>>, BenchError> {
    struct ModeRuns {
        speed: Vec<f64>,
        drafted: usize,
        accepted: usize,
        contents: Vec<String>,
    }
    let ctx = 4096;
    let mut per_mode: Vec<(String, Vec<ModeRuns>)> = Vec::new();
    let modes = std::iter::once(None).chain(opts.llama_server_modes.iter().map(Some));
    for mode in modes {
        let name = mode.cloned().unwrap_or_else(|| "plain".into());
        bar.set_message(format!("llama-server {name}: starting"));
        let server = LlamaServer::start(
            bin,
            &opts.model,
            opts.threads,
            ctx,
            mode.map(|m| m.as_str()),
        )?;
        let mut runs = Vec::new();
        for (wi, w) in prompts.iter().enumerate() {
            let mut r = ModeRuns {
                speed: Vec::new(),
                drafted: 0,
                accepted: 0,
                contents: Vec::new(),
            };
            for p in w {
                for _ in 0..opts.reps.max(1) {
                    bar.set_message(format!("llama-server {name}: workload {}", wi + 1));
                    let out = server.complete(p, opts.max_tokens)?;
                    r.speed.push(out.decode_tok_s);
                    r.drafted += out.drafted as usize;
                    r.accepted += out.accepted as usize;
                    r.contents.push(out.content);
                    bar.inc(1);
                }
            }
            runs.push(r);
        }
        per_mode.push((name, runs));
    }
    let Some((_, plain)) = per_mode.first() else {
        return Ok(Vec::new());
    };
    Ok((0..prompts.len())
        .map(|wi| {
            let p = median(&plain[wi].speed);
            per_mode[1..]
                .iter()
                .map(|(mode, runs)| {
                    let r = &runs[wi];
                    let f = median(&r.speed);
                    let same = r
                        .contents
                        .iter()
                        .zip(&plain[wi].contents)
                        .filter(|(a, b)| a == b)
                        .count();
                    LlamaServerRow {
                        mode: mode.clone(),
                        speed: Speedup {
                            plain: p,
                            accelerated: f,
                            ratio: f / p,
                            acceptance: fraction(r.accepted, r.drafted),
                        },
                        identical_share: fraction(same, r.contents.len()),
                    }
                })
                .collect()
        })
        .collect())
}

/// Runs the benchmark on `model`, already loaded from `opts.model` (the file llama-server gets).
pub fn run(model: &Arc<Model>, opts: &NgramOptions) -> Result<NgramReport, BenchError> {
    let workloads = load_workloads(&opts.workloads)?;
    let base = EngineConfig {
        kv_slots: 4096,
        prefix_caching: false,
        ..Default::default()
    };
    let mut plain = EngineCore::new(
        model.clone(),
        &EngineConfig {
            draft_len: 0,
            ..base.clone()
        },
    )?;
    let drafters = if opts.drafters.is_empty() {
        vec![DraftSources::default()]
    } else {
        opts.drafters.clone()
    };
    // One speculative engine per drafter set; the first measures the verify cost, the others
    // take its measurement.
    let mut fast: Vec<EngineCore> = Vec::new();
    for &d in &drafters {
        let verify_cost = fast
            .first()
            .and_then(|e| e.draft_config())
            .map(|c| c.verify_cost.clone());
        fast.push(EngineCore::new(
            model.clone(),
            &EngineConfig {
                draft_len: opts.draft_len,
                drafters: d,
                verify_cost,
                draft_model: opts.draft_model.clone(),
                draft_cost: fast
                    .iter()
                    .find_map(|e| e.draft_config().and_then(|c| c.model_cost)),
                ..base.clone()
            },
        )?);
    }
    let verify_cost = fast[0]
        .draft_config()
        .map(|d| d.verify_cost.clone())
        .unwrap_or_default();
    let draft_model_cost = fast
        .iter()
        .find_map(|e| e.draft_config().and_then(|c| c.model_cost));
    let verify_split_us = fast[0]
        .verify_profiles()
        .iter()
        .map(|p| p.per_step_us())
        .collect();
    let per_pass: usize =
        workloads.iter().map(|w| w.prompts.len()).sum::<usize>() * opts.reps.max(1);
    let server_passes = if opts.llama_server.is_some() {
        1 + opts.llama_server_modes.len()
    } else {
        0
    };
    let total = per_pass * (2 * drafters.len() + server_passes);
    let prompts: Vec<Vec<Vec<u32>>> = workloads
        .iter()
        .map(|w| {
            w.prompts
                .iter()
                .map(|t| model.tokenizer.encode(t, true, false))
                .collect()
        })
        .collect();
    let bar = indicatif::ProgressBar::new(total as u64);
    let mut rows = Vec::new();
    plain.take_profile();
    for (w, w_prompts) in workloads.iter().zip(&prompts) {
        for (engine, d) in fast.iter_mut().zip(&drafters) {
            let (mut p_speed, mut f_speed) = (Vec::new(), Vec::new());
            let (mut drafted, mut accepted, mut verifies) = (0, 0, 0);
            let mut positions = PositionStats::default();
            let (mut same, mut runs) = (0usize, 0usize);
            for rep in 0..opts.reps.max(1) {
                let seed = rep as u64 + 1;
                engine.clear_shared_drafts();
                for (pi, prompt) in w_prompts.iter().enumerate() {
                    bar.set_message(format!(
                        "{} [{}] prompt {} rep {}",
                        w.name,
                        d.names(),
                        pi + 1,
                        rep + 1
                    ));
                    if !w.session {
                        engine.clear_shared_drafts();
                    }
                    let (t, tau) = (opts.max_tokens, opts.temperature);
                    // Alternate the order so neither mode always runs on a warmer machine.
                    let (a, b) = if rep % 2 == 0 {
                        let a = generate(&mut plain, prompt.clone(), t, tau, seed)?;
                        bar.inc(1);
                        (a, generate(engine, prompt.clone(), t, tau, seed)?)
                    } else {
                        let b = generate(engine, prompt.clone(), t, tau, seed)?;
                        bar.inc(1);
                        (generate(&mut plain, prompt.clone(), t, tau, seed)?, b)
                    };
                    bar.inc(1);
                    same += usize::from(a.tokens == b.tokens);
                    runs += 1;
                    positions.add(&b.positions);
                    // A prompt answered in one token (an end of text at once) has no decode to
                    // time: it would enter the medians as 0 tok/s in both modes.
                    if a.tokens.len() > 1 && b.tokens.len() > 1 {
                        p_speed.push(a.decode_tok_s);
                        f_speed.push(b.decode_tok_s);
                    }
                    drafted += b.drafted;
                    accepted += b.accepted;
                    verifies += b.verifies;
                }
            }
            let (p, f) = (median(&p_speed), median(&f_speed));
            rows.push(NgramRow {
                workload: w.name.clone(),
                drafters: d.names(),
                kind: w.kind.clone(),
                speed: Speedup {
                    plain: p,
                    accelerated: f,
                    ratio: if p > 0.0 { f / p } else { 0.0 },
                    acceptance: fraction(accepted, drafted),
                },
                mean_accepted: fraction(accepted, verifies),
                identical_share: fraction(same, runs),
                acceptance_by_position: positions.rates(),
                llama_server: Vec::new(),
            });
        }
    }
    let plain_split_us = plain.take_profile().per_step_us();
    let stacked_shapes = fast[0].stacked_shapes();
    if let Some(bin) = &opts.llama_server {
        // Axle's engines hold spinning thread pools: free the cores for llama-server.
        drop((plain, fast));
        let per_workload = llama_server_rows(bin, opts, &prompts, &bar)?;
        for (chunk, ls) in rows.chunks_mut(drafters.len()).zip(per_workload) {
            for row in chunk {
                row.llama_server = ls.clone();
            }
        }
    }
    bar.finish_and_clear();
    Ok(NgramReport {
        model: opts.model.display().to_string(),
        threads: opts.threads,
        verify_cost,
        draft_model_cost,
        verify_split_us,
        plain_split_us,
        stacked_shapes,
        rows,
    })
}
