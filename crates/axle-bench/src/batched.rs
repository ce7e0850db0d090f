//! `axle bench batched`: aggregate decode throughput with N concurrent sequences, Axle's engine
//! (scheduler + paged KV + one graph per step) against libllama's own multi-sequence batched decode
//! with the same sequences, prompts and greedy token choice, in one process.
use crate::stats::{synthetic_tokens, Paired};
use crate::BenchError;
use axle_ggml::oracle::{LlamaOracle, OracleOptions};
use axle_models::device_step::{DeviceAttention, DeviceProducts, KV_ALIGN};
use axle_models::kv::KvType;
use axle_models::{Kernels, Model};
use axle_sdk::{EngineConfig, EngineCore, Output, RequestOptions};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BatchedOptions {
    /// The GGUF model.
    pub model: PathBuf,
    /// CPU threads.
    pub threads: usize,
    /// Concurrency levels.
    pub concurrency: Vec<usize>,
    /// Prompt tokens per sequence.
    pub prompt: usize,
    /// Timed decode steps.
    pub steps: usize,
    /// Repetitions (median reported).
    pub reps: usize,
    /// Also run the engine with ggml's shape-dependent kernels (`Kernels::LikeLlamaCpp`): what
    /// batch invariance costs.
    pub fast_kernels: bool,
    /// The exact engine's products on GPUs (`None`: by device).
    pub device_products: Option<DeviceProducts>,
    /// How the exact engine's decode rows attend on GPUs.
    pub device_attention: DeviceAttention,
    /// How the exact engine's KV cache stores keys and values (libllama's stays F16).
    pub kv_type: KvType,
    /// How libllama spreads layers over several GPUs.
    pub oracle_split: axle_ggml::oracle::SplitMode,
}

/// One row.
#[derive(Debug, Clone, Serialize)]
pub struct BatchedRow {
    /// Sequences decoding together.
    pub sequences: usize,
    /// Aggregate tok/s, Axle against libllama.
    #[serde(flatten)]
    pub tok_s: Paired,
    /// Axle with shape-dependent kernels, per repetition (empty unless asked for).
    pub axle_fast: Vec<f64>,
    /// Where Axle's decode steps spent their time (the last repetition).
    pub split: StepSplit,
    /// The same with shape-dependent kernels (when asked for).
    pub fast_split: Option<StepSplit>,
    /// The most decoding rows one attention op took in the device layout (stacked rows, see
    /// `axle_models::stacked_attention`; 1: an op per row).
    pub widest_stack: i64,
}

/// The result.
#[derive(Debug, Clone, Serialize)]
pub struct BatchedReport {
    /// Model file.
    pub model: String,
    /// Threads.
    pub threads: usize,
    /// Rows.
    pub rows: Vec<BatchedRow>,
}

/// The device products of a run: what the options asked for (`None`: the device's default) and
/// what the exact engine of each concurrency multiplied small columns with, as it reported
/// (`EngineCore::device_products`; `None`: steps without the device layout). The default depends
/// on the engine's capacity, so engines of different concurrency may take different products.
#[derive(Debug, Clone)]
pub struct ProductsUsed {
    /// Asked for.
    pub asked: Option<DeviceProducts>,
    /// Taken, per concurrency (sequences, products), in the order run.
    pub chosen: Vec<(usize, Option<DeviceProducts>)>,
}

/// Untimed decode steps before timing (graphs built, thread pools awake, caches warm).
const WARM: usize = 4;

/// Where one of Axle's timed decode steps spent its time, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StepSplit {
    /// The whole step (wall time of `EngineCore::step`).
    pub step_ms: f64,
    /// Host work of the runner before computing: plan inputs, masks, layout, graph build.
    pub host_ms: f64,
    /// Computing the graph, until the device has finished.
    pub compute_ms: f64,
    /// Reading the logits back.
    pub logits_ms: f64,
    /// The rest: scheduling, sampling, detokenizing, bookkeeping.
    pub engine_ms: f64,
}

fn axle_run(
    model: &Arc<Model>,
    prompts: &[Vec<u32>],
    steps: usize,
    kernels: Kernels,
    device_products: Option<DeviceProducts>,
    (device_attention, kv_type): (DeviceAttention, KvType),
) -> Result<AxleRun, BenchError> {
    let b = prompts.len();
    // Prefill batches of 2,048 tokens, as llama-batched-bench's default (-b 2048) takes them.
    let budget = 2048.max(b);
    // Prompts are prefilled a step's budget at a time, beside the decode rows of the sequences
    // already started, so the first sequence decodes while the last prefills: each sequence may
    // generate tokens for as many steps as the prefill takes before the timed window opens, and
    // must not finish inside it (a sequence that finished, or a prefill chunk in a timed step,
    // would make the window something other than every sequence decoding together, as
    // llama-batched-bench measures it).
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let stagger = prompt_tokens.div_ceil(budget.saturating_sub(b).max(1)) + b;
    let max_new = stagger + WARM + steps + 2;
    // Room for every sequence, and at least one attention range (256 slots) a sequence, as a
    // serving pool has (8192 slots for 16 sequences by default): sequences that the scheduler
    // keeps in lanes of the pool are then read in place on a device instead of gathered.
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let per_seq = (longest + max_new + 8).max(KV_ALIGN as usize);
    let cfg = EngineConfig {
        // Long enough for the longest prompt and its tokens (8k-token prompts included).
        context: per_seq.max(axle_sdk::defaults::CONTEXT),
        kv_slots: ((b * per_seq) as u32).div_ceil(256) * 256 + 256,
        max_seqs: b.max(1),
        max_batch_tokens: budget,
        prefix_caching: false,
        // Batching against batching: libllama decodes one token per sequence per step, so
        // n-gram speculation (measured on its own by the ngram workloads) stays off here.
        draft_len: 0,
        kernels,
        device_products,
        device_attention,
        kv_type,
        ..Default::default()
    };
    let mut e = EngineCore::new(model.clone(), &cfg)?;
    for p in prompts {
        e.add(
            p.clone(),
            RequestOptions {
                max_tokens: max_new,
                ignore_eos: true,
                ..Default::default()
            },
        )?;
    }
    // Prefill until every sequence has its first token (then all decode together).
    // Counted by request: the sequences started first emit tokens every step meanwhile.
    let mut started = std::collections::HashSet::new();
    while started.len() < b {
        for o in e.step() {
            if let Output::Token { id, .. } = o {
                started.insert(id);
            }
        }
    }
    for _ in 0..WARM {
        e.step();
    }
    e.take_profile();
    let t = Instant::now();
    let mut tokens = 0;
    for _ in 0..steps {
        tokens += e
            .step()
            .iter()
            .filter(|o| matches!(o, Output::Token { .. }))
            .count();
    }
    let wall = t.elapsed().as_secs_f64();
    if tokens != b * steps {
        return Err(BenchError::Invalid(format!(
            "the timed steps were not every sequence decoding: {tokens} tokens in {steps} steps \
             of {b} sequences"
        )));
    }
    let p = e.take_profile();
    let [prepare, build, inputs, compute, logits] = p.per_step_us().map(|us| us / 1e3);
    let (step_ms, host_ms) = (wall * 1e3 / steps as f64, prepare + build + inputs);
    let split = StepSplit {
        step_ms,
        host_ms,
        compute_ms: compute,
        logits_ms: logits,
        engine_ms: step_ms - (host_ms + compute + logits),
    };
    let widest = e
        .stacked_shapes()
        .iter()
        .filter(|s| s.2)
        .map(|s| s.1)
        .max()
        .unwrap_or(1);
    if let Some(a) = e.device_attention_summary() {
        eprintln!("device attention: {a}");
    }
    Ok(AxleRun {
        tok_s: tokens as f64 / wall,
        split,
        widest_stack: widest,
        products: e.device_products(),
    })
}

/// One timed run of Axle's engine.
struct AxleRun {
    tok_s: f64,
    split: StepSplit,
    widest_stack: i64,
    products: Option<DeviceProducts>,
}

/// The most tokens libllama takes in one prefill batch here (prompts are fed in such chunks).
const ORACLE_BATCH: usize = 4096;

fn llama_run(o: &mut LlamaOracle, prompts: &[Vec<u32>], steps: usize) -> Result<f64, BenchError> {
    o.clear();
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > v[b] { i } else { b }) as i32
    };
    let entries: Vec<_> = prompts
        .iter()
        .enumerate()
        .flat_map(|(s, p)| {
            p.iter()
                .enumerate()
                .map(move |(i, &t)| (t as i32, i as i32, s as i32, i + 1 == p.len()))
        })
        .collect();
    let mut next = Vec::with_capacity(prompts.len());
    for chunk in entries.chunks(ORACLE_BATCH) {
        next.extend(o.decode(chunk)?.iter().map(|l| argmax(l)));
    }
    let mut pos: Vec<i32> = prompts.iter().map(|p| p.len() as i32).collect();
    let mut t = Instant::now();
    // As llama-batched-bench times decoding: every row's logits are computed and left on the
    // device (which token is fed does not change the work), not copied and scanned on the host.
    for step in 0..WARM + steps {
        if step == WARM {
            t = Instant::now();
        }
        let batch: Vec<_> = (0..prompts.len())
            .map(|s| (next[s], pos[s], s as i32, true))
            .collect();
        o.decode_unread(&batch)?;
        pos.iter_mut().for_each(|p| *p += 1);
    }
    Ok((steps * prompts.len()) as f64 / t.elapsed().as_secs_f64())
}

/// Runs the benchmark on `model` (loaded by the caller), against libllama loaded from `opts.model`;
/// also says which device products the exact engine took.
pub fn run(
    model: &Arc<Model>,
    opts: &BatchedOptions,
) -> Result<(BatchedReport, ProductsUsed), BenchError> {
    if opts.reps == 0 || opts.steps == 0 || opts.concurrency.is_empty() {
        return Err(BenchError::Invalid(
            "reps, steps and concurrency must be positive".into(),
        ));
    }
    // libllama is loaded per concurrency, sized for it, and only after Axle's runs of it: at long
    // contexts the two KV caches do not fit on one device together.
    let load_oracle = |b: usize| {
        let n_ctx = ((b * (opts.prompt + opts.steps + WARM + 8)) as u32).div_ceil(256) * 256 + 256;
        LlamaOracle::load(
            &opts.model,
            &OracleOptions {
                n_ctx,
                n_threads: opts.threads,
                n_seq_max: b as u32,
                n_batch: (b * opts.prompt).clamp(512, ORACLE_BATCH).max(b) as u32,
                n_gpu_layers: crate::oracle_gpu_layers(model),
                split_mode: opts.oracle_split,
                // A KV stream per sequence, as llama-batched-bench runs by default.
                kv_unified: false,
                ..Default::default()
            },
        )
    };
    let bar = indicatif::ProgressBar::new((opts.concurrency.len() * opts.reps * 2) as u64);
    let mut rows = Vec::new();
    let mut chosen = Vec::new();
    for &b in &opts.concurrency {
        let prompts: Vec<Vec<u32>> = (0..b)
            .map(|s| synthetic_tokens(opts.prompt, model.tokenizer.len(), 1000 + s as u64))
            .collect();
        let (mut a, mut l, mut f) = (Vec::new(), Vec::new(), Vec::new());
        let (mut split, mut fast_split, mut widest_stack) = (StepSplit::default(), None, 1);
        let invariant = crate::default_kernels(model);
        let mut device_products = None;
        let mut exact = |a: &mut Vec<f64>| -> Result<(), BenchError> {
            let run = axle_run(
                model,
                &prompts,
                opts.steps,
                invariant,
                opts.device_products,
                (opts.device_attention, opts.kv_type),
            )?;
            a.push(run.tok_s);
            split = run.split;
            widest_stack = run.widest_stack;
            device_products = run.products;
            Ok(())
        };
        for rep in 0..opts.reps {
            bar.set_message(format!("{b} sequences, Axle, rep {}", rep + 1));
            exact(&mut a)?;
            bar.inc(1);
            if opts.fast_kernels {
                let run = axle_run(
                    model,
                    &prompts,
                    opts.steps,
                    Kernels::LikeLlamaCpp,
                    None,
                    (DeviceAttention::default(), KvType::F16),
                )?;
                f.push(run.tok_s);
                fast_split = Some(run.split);
            }
        }
        let mut oracle = load_oracle(b)?;
        for rep in 0..opts.reps {
            bar.set_message(format!("{b} sequences, libllama, rep {}", rep + 1));
            l.push(llama_run(&mut oracle, &prompts, opts.steps)?);
            bar.inc(1);
        }
        drop(oracle);
        chosen.push((b, device_products));
        rows.push(BatchedRow {
            sequences: b,
            tok_s: Paired::new(a, l),
            axle_fast: f,
            split,
            fast_split,
            widest_stack,
        });
    }
    bar.finish_and_clear();
    let report = BatchedReport {
        model: opts.model.display().to_string(),
        threads: opts.threads,
        rows,
    };
    let products = ProductsUsed {
        asked: opts.device_products,
        chosen,
    };
    Ok((report, products))
}
