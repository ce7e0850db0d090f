//! The workloads a manifest can name, each turned into artifact rows. `generate` is measured
//! here; the comparison kinds run the existing benches (compare, batched, prefix, ngram, server),
//! so there is one way to measure and one format for the results.
use super::manifest::{GenerateSpec, Manifest, Workload};
use super::{CheckResult, Row};
use crate::stats::{median, synthetic_tokens};
use crate::{agent, batched, compare, ngram, prefix, server, structured, BenchError};
use axle_ggml::oracle::{LlamaOracle, OracleOptions};
use axle_models::device_step::DeviceProducts;
use axle_models::Model;
use axle_sdk::{DraftSources, EngineConfig, GenerateRequest, SamplingParams, Session, StreamEvent};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The runner's step phases, in `StepProfile::per_step_us` order.
pub(crate) const STEP_PHASES: [&str; 5] = ["prepare", "build", "inputs", "compute", "logits"];

/// Runs the manifest's workload: its rows, and the checks the workload itself makes (the batched
/// workload's device products).
pub fn run(
    m: &Manifest,
    dir: &Path,
    model: &Arc<Model>,
    path: &Path,
    opts: &super::RunOptions,
) -> Result<(Vec<Row>, Vec<CheckResult>), BenchError> {
    let progress = opts.progress;
    let (threads, reps, path) = (m.model.threads, m.repetitions, path.to_path_buf());
    let (oracle_split, reference) = m.model.oracle_split().map_err(BenchError::Invalid)?;
    let mut checks = Vec::new();
    let rows = match &m.workload {
        Workload::Generate(g) => generate(g, reps, model, &path, threads, progress)?,
        Workload::Compare(c) => {
            let r = compare::run(
                model,
                &compare::CompareOptions {
                    model: path,
                    threads,
                    prefill: c.prefill.clone(),
                    decode: c.decode,
                    reps,
                    progress,
                    oracle_split,
                    host_kernels: c.host_kernels().map_err(BenchError::Invalid)?,
                },
            )?;
            r.rows
                .into_iter()
                .map(|row| {
                    let metric = if row.test.starts_with("pp") {
                        "prefill_tok_s"
                    } else {
                        "decode_tok_s"
                    };
                    let (p, t) = (row.profile, row.tok_s);
                    let mut r = Row::new(row.test, metric, t.axle, Some((&reference, t.llama)));
                    // libllama's time for as many tokens as one of Axle's steps took (a decode
                    // step's one, a prefill chunk's).
                    let per_step = (row.tokens * reps) as f64 / p.steps.max(1) as f64;
                    for (k, v) in STEP_PHASES.iter().zip(p.per_step_us()) {
                        r.extra.insert(format!("step_{k}_us"), v);
                    }
                    r.extra.insert(
                        "step_builds".into(),
                        p.builds as f64 / p.steps.max(1) as f64,
                    );
                    r.extra
                        .insert("step_llama_us".into(), 1e6 * per_step / t.llama_median);
                    r
                })
                .collect()
        }
        Workload::Batched(b) => {
            let (r, products) = batched::run(
                model,
                &batched::BatchedOptions {
                    model: path,
                    threads,
                    concurrency: b.concurrency.clone(),
                    prompt: b.prompt_tokens,
                    steps: b.steps,
                    reps,
                    fast_kernels: b.fast_kernels,
                    device_products: b
                        .device_products
                        .as_deref()
                        .map(str::parse)
                        .transpose()
                        .map_err(BenchError::Invalid)?,
                    device_attention: b
                        .device_attention
                        .as_deref()
                        .map(str::parse)
                        .transpose()
                        .map_err(BenchError::Invalid)?
                        .unwrap_or_default(),
                    kv_type: b
                        .kv_type
                        .as_deref()
                        .map(str::parse)
                        .transpose()
                        .map_err(BenchError::Invalid)?
                        .unwrap_or_default(),
                    oracle_split,
                },
            )?;
            if products.asked.is_some() || products.chosen.iter().any(|(_, p)| p.is_some()) {
                checks.push(products_check(products.asked, &products.chosen));
            }
            r.rows
                .into_iter()
                .map(|row| {
                    let llama = row.tok_s.llama_median;
                    let fast = (!row.axle_fast.is_empty()).then(|| median(&row.axle_fast));
                    let mut r = Row::new(
                        format!("seqs={}", row.sequences),
                        "aggregate_decode_tok_s",
                        row.tok_s.axle,
                        Some((&reference, row.tok_s.llama)),
                    );
                    if let Some(fast) = fast {
                        r.extra.insert("shape_kernels_tok_s".into(), fast);
                        r.extra.insert("shape_kernels_ratio".into(), fast / llama);
                    }
                    // Where a decode step's time went (ms): the runner's phases and the rest.
                    let s = row.split;
                    for (k, v) in [
                        ("step_ms", s.step_ms),
                        ("compute_ms", s.compute_ms),
                        ("logits_ms", s.logits_ms),
                        ("host_ms", s.host_ms),
                        ("engine_ms", s.engine_ms),
                    ] {
                        r.extra.insert(k.into(), v);
                    }
                    r.extra
                        .insert("stacked_rows_widest".into(), row.widest_stack as f64);
                    if let Some(s) = row.fast_split {
                        r.extra.insert("shape_kernels_step_ms".into(), s.step_ms);
                        r.extra
                            .insert("shape_kernels_compute_ms".into(), s.compute_ms);
                    }
                    r
                })
                .collect()
        }
        Workload::Prefix(p) => {
            let (mut cached, mut uncached) = (Vec::new(), Vec::new());
            let (mut from_cache, mut identical) = (0, true);
            for _ in 0..reps {
                let r = prefix::run(model, p.prefix_tokens)?;
                cached.push(r.second_ttft_s * 1e3);
                uncached.push(r.first_ttft_s * 1e3);
                from_cache = r.second_cached_tokens;
                identical &= r.second_identical_to_cold;
            }
            vec![Row::new(
                format!("prefix={}", p.prefix_tokens),
                "ttft_ms",
                cached,
                Some(("uncached first request", uncached)),
            )
            .with("cached_tokens", from_cache as f64)
            .with("identical_to_cold", if identical { 1.0 } else { 0.0 })]
        }
        Workload::Agent(a) => {
            let runs = (0..reps)
                .map(|_| agent::run(model, a.turns, a.system_tokens))
                .collect::<Result<Vec<_>, _>>()?;
            let ms = |turn: usize| -> Vec<f64> {
                runs.iter().map(|r| r.turns[turn].ttft_s * 1e3).collect()
            };
            (0..a.turns)
                .map(|t| {
                    let last = &runs[runs.len() - 1].turns[t];
                    let first_turn = (t > 0).then(|| ("first turn", ms(0)));
                    Row::new(format!("turn={}", t + 1), "ttft_ms", ms(t), first_turn)
                        .with("uncached_tokens", last.uncached_tokens as f64)
                        .with("cached_tokens", last.cached_tokens as f64)
                        .with("called_tool", if last.called_tool { 1.0 } else { 0.0 })
                })
                .collect()
        }
        Workload::Ngram(n) => {
            let draft_model = match &n.draft_model {
                Some(p) => Some(Arc::new(Model::load(
                    super::manifest::resolve(p, dir),
                    &axle_models::ModelOptions {
                        threads,
                        device: m.model.device.parse().unwrap_or_default(),
                        ..Default::default()
                    },
                )?)),
                None => None,
            };
            let r = ngram::run(
                model,
                &ngram::NgramOptions {
                    model: path,
                    threads,
                    workloads: super::manifest::resolve(&n.workloads, dir),
                    max_tokens: n.max_tokens,
                    draft_len: n.draft_len,
                    drafters: n
                        .drafters
                        .iter()
                        .map(|d| DraftSources::parse(d))
                        .collect::<Result<_, _>>()
                        .map_err(BenchError::Invalid)?,
                    temperature: n.temperature,
                    draft_model,
                    reps,
                    llama_server: opts.llama_server.clone(),
                    llama_server_modes: n.llama_server_modes.clone(),
                },
            )?;
            let several = n.drafters.len() > 1;
            let mut rows: Vec<Row> = r
                .rows
                .into_iter()
                .map(|row| {
                    let name = if several {
                        format!("{} ({}) [{}]", row.workload, row.kind, row.drafters)
                    } else {
                        format!("{} ({})", row.workload, row.kind)
                    };
                    let mut out = Row::new(
                        name,
                        "decode_tok_s",
                        vec![row.speed.accelerated],
                        Some(("no speculation", vec![row.speed.plain])),
                    )
                    .with("acceptance_rate", row.speed.acceptance)
                    .with("mean_accepted", row.mean_accepted)
                    .with("identical_share", row.identical_share);
                    for (j, a) in row.acceptance_by_position.iter().enumerate() {
                        out = out.with(&format!("accept_pos{}", j + 1), *a);
                    }
                    for ls in &row.llama_server {
                        let key = format!("llama_server_{}", ls.mode.replace('-', "_"));
                        out = out
                            .with(&format!("{key}_tok_s"), ls.speed.accelerated)
                            .with(&format!("{key}_ratio"), ls.speed.ratio)
                            .with(&format!("{key}_acceptance"), ls.speed.acceptance)
                            .with(&format!("{key}_identical_share"), ls.identical_share)
                            .with("llama_server_plain_tok_s", ls.speed.plain);
                    }
                    out
                })
                .collect();
            if let Some(first) = rows.first_mut() {
                if let Some(c) = r.draft_model_cost {
                    first.extra.insert("draft_model_cost".into(), c);
                }
                for (k, c) in r.verify_cost.iter().enumerate() {
                    first.extra.insert(format!("verify_cost_k{k}"), *c);
                }
                if !r.verify_split_us.is_empty() {
                    for (phase, us) in STEP_PHASES.iter().zip(r.plain_split_us) {
                        first
                            .extra
                            .insert(format!("verify_step_plain_{phase}_us"), us);
                    }
                }
                if !r.stacked_shapes.is_empty() {
                    let shared = r.stacked_shapes.iter().filter(|s| s.2).count();
                    first
                        .extra
                        .insert("stacked_shapes_shared".into(), shared as f64);
                    first.extra.insert(
                        "stacked_shapes_probed".into(),
                        r.stacked_shapes.len() as f64,
                    );
                }
                for (k, split) in r.verify_split_us.iter().enumerate() {
                    for (phase, us) in STEP_PHASES.iter().zip(split) {
                        first
                            .extra
                            .insert(format!("verify_step_k{k}_{phase}_us"), *us);
                    }
                }
            }
            rows
        }
        Workload::Structured(st) => {
            let schemas = structured::load_schemas(&super::manifest::resolve(&st.schemas, dir))?;
            let r = structured::run(
                model.clone(),
                &schemas,
                st.max_tokens,
                st.draft_len,
                reps,
                progress,
            )?;
            let per = |m: usize| -> Vec<f64> { r.reps.iter().map(|t| t[m].tok_s()).collect() };
            let sum = |m: usize, f: &dyn Fn(&structured::ModeTotals) -> f64| -> f64 {
                r.reps.iter().map(|t| f(&t[m])).sum()
            };
            let n = (r.prompts * r.reps.len()) as f64;
            let labels = [
                "",
                "masked (mask on every token)",
                "forced (grammar-forced tokens unsampled)",
                "forced + n-gram speculation",
            ];
            (1..structured::MODES.len())
                .map(|m| {
                    let masks = sum(m, &|t| t.masks as f64).max(1.0);
                    let mut row = Row::new(
                        labels[m],
                        "decode_tok_s",
                        per(m),
                        Some(("free decoding", per(0))),
                    )
                    .with(
                        "mask_compute_us",
                        sum(m, &|t| t.mask_compute_us as f64) / masks,
                    )
                    .with("mask_wait_us", sum(m, &|t| t.mask_wait_us as f64) / masks)
                    .with(
                        "sampled_share",
                        masks / sum(m, &|t| t.tokens as f64).max(1.0),
                    )
                    .with("valid_share", sum(m, &|t| t.valid as f64) / n)
                    .with("tokens_per_answer", sum(m, &|t| t.tokens as f64) / n)
                    .with("free_tokens_per_answer", sum(0, &|t| t.tokens as f64) / n);
                    if structured::MODES[m] == "forced+ngram" {
                        let drafted = sum(m, &|t| t.drafted as f64).max(1.0);
                        row = row
                            .with("acceptance_rate", sum(m, &|t| t.accepted as f64) / drafted)
                            .with(
                                "identical_to_forced",
                                if r.speculation_identical { 1.0 } else { 0.0 },
                            );
                    }
                    row
                })
                .collect()
        }
        Workload::Server(s) => {
            let r = server::run(model, s.tokens, reps)?;
            vec![Row::new(
                format!("stream={}", s.tokens),
                "decode_tok_s",
                r.server,
                Some(("SDK directly", r.sdk)),
            )]
        }
    };
    Ok((rows, checks))
}

/// The batched workload's record of the products the exact engines multiplied with on their
/// devices (the manifest's `device_products`, or the device's default where it names none, which
/// goes by the engine's capacity), per concurrency where they differ: passes where every engine
/// took what the manifest asked for.
fn products_check(
    asked: Option<DeviceProducts>,
    chosen: &[(usize, Option<DeviceProducts>)],
) -> CheckResult {
    let name =
        |p: Option<DeviceProducts>| p.map_or("none (no device layout)".into(), |p| p.to_string());
    let asked_name = asked.map_or("the device's default".to_string(), |p| p.to_string());
    // Runs of concurrency levels that took the same products, in the order run.
    let mut runs: Vec<(Option<DeviceProducts>, Vec<String>)> = Vec::new();
    for &(seqs, p) in chosen {
        match runs.last_mut() {
            Some((q, levels)) if *q == p => levels.push(seqs.to_string()),
            _ => runs.push((p, vec![seqs.to_string()])),
        }
    }
    let taken = match runs.as_slice() {
        [(p, _)] => name(*p),
        _ => runs
            .iter()
            .map(|(p, levels)| format!("{} at {} sequences", name(*p), levels.join(", ")))
            .collect::<Vec<_>>()
            .join("; "),
    };
    CheckResult {
        kind: "products".into(),
        passed: asked.is_none() || chosen.iter().all(|&(_, p)| p == asked),
        detail: format!("asked for {asked_name}, the engine multiplied with {taken}"),
    }
}

/// The prompts of a generate workload as token ids.
pub fn prompt_tokens(g: &GenerateSpec, model: &Model) -> Vec<Vec<u32>> {
    let n_vocab = model.tokenizer.len();
    let prefix = synthetic_tokens(g.shared_prefix_tokens, n_vocab, 0x5eed);
    let bodies: Vec<Vec<u32>> = if g.prompts.is_empty() {
        (0..g.synthetic_prompts.max(1))
            .map(|i| synthetic_tokens(g.prompt_tokens.unwrap_or(16), n_vocab, 17 + i as u64))
            .collect()
    } else {
        g.prompts
            .iter()
            .map(|p| model.tokenizer.encode(p, true, true))
            .collect()
    };
    bodies
        .into_iter()
        .map(|b| prefix.iter().copied().chain(b).collect())
        .collect()
}

/// Per-request timings of one repetition.
struct Timing {
    prompt: usize,
    ttft: f64,
    decode: f64,
    tokens: usize,
    drafted: usize,
    accepted: usize,
}

fn generate(
    g: &GenerateSpec,
    reps: usize,
    model: &Arc<Model>,
    path: &Path,
    threads: usize,
    progress: bool,
) -> Result<Vec<Row>, BenchError> {
    let prompts = prompt_tokens(g, model);
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let ctx = (longest + g.max_tokens + 16).div_ceil(256) * 256;
    let cfg = EngineConfig {
        kv_slots: (ctx * g.concurrency) as u32,
        context: ctx,
        max_seqs: g.concurrency,
        draft_len: if g.ngram { g.draft_len } else { 0 },
        ..Default::default()
    };
    let mut oracle = if g.reference {
        Some(LlamaOracle::load(
            path,
            &OracleOptions {
                n_ctx: ctx as u32,
                n_threads: threads,
                n_gpu_layers: crate::oracle_gpu_layers(model),
                ..Default::default()
            },
        )?)
    } else {
        None
    };
    let bar = crate::progress_bar(progress, reps as u64, "generate");
    let names = [
        "ttft_ms",
        "prefill_tok_s",
        "decode_tok_s",
        "aggregate_tok_s",
        "peak_rss_mib",
    ];
    let mut axle: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let (mut ref_prefill, mut ref_decode) = (Vec::new(), Vec::new());
    let (mut drafted, mut accepted) = (0usize, 0usize);
    for _ in 0..reps {
        // A fresh engine per repetition: the prefix cache starts empty each time, so repetitions
        // measure the same thing (a shared prefix is still reused across the rep's prompts).
        let session = Session::new(model.clone(), cfg.clone())?;
        // Warm-up on tokens no prompt shares: threads spun up, buffers allocated.
        let mut warm_up =
            GenerateRequest::new(synthetic_tokens(8, model.tokenizer.len(), 0xabc)).max_tokens(4);
        warm_up.ignore_eos = true;
        session.generate(&warm_up.greedy())?;
        // A closed loop of `concurrency` clients: each submits its next prompt when its last one
        // finishes, so TTFT is measured from each request's own submission.
        let t_rep = Instant::now();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let timings: Vec<Timing> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..g.concurrency)
                .map(|_| {
                    s.spawn(|| -> Result<Vec<Timing>, BenchError> {
                        let mut out = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(p) = prompts.get(i) else {
                                return Ok(out);
                            };
                            out.push(timed_request(&session, p, i, g)?);
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("client thread panicked"))
                .collect::<Result<Vec<_>, _>>()
        })?
        .into_iter()
        .flatten()
        .collect();
        let wall = t_rep.elapsed().as_secs_f64();
        let mut ttfts: Vec<f64> = timings.iter().map(|t| t.ttft * 1e3).collect();
        ttfts.sort_by(f64::total_cmp);
        let sum = |f: fn(&Timing) -> f64| timings.iter().map(f).sum::<f64>();
        axle[0].push(crate::stats::median(&ttfts));
        axle[1].push(sum(|t| t.prompt as f64) / sum(|t| t.ttft).max(1e-9));
        axle[2].push(sum(|t| t.tokens.saturating_sub(1) as f64) / sum(|t| t.decode).max(1e-9));
        axle[3].push(sum(|t| t.tokens as f64) / wall);
        axle[4].push(super::peak_rss_mib());
        drafted += timings.iter().map(|t| t.drafted).sum::<usize>();
        accepted += timings.iter().map(|t| t.accepted).sum::<usize>();
        drop(session);
        if let Some(o) = oracle.as_mut() {
            let (p, d) = reference_run(o, &prompts, g.max_tokens)?;
            ref_prefill.push(p);
            ref_decode.push(d);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let workload = if g.concurrency > 1 {
        format!("generate x{}", g.concurrency)
    } else {
        "generate".to_string()
    };
    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let reference = match (*name, oracle.is_some()) {
            ("prefill_tok_s", true) => Some(("libllama", ref_prefill.clone())),
            ("decode_tok_s", true) => Some(("libllama", ref_decode.clone())),
            _ => None,
        };
        rows.push(Row::new(
            workload.clone(),
            name,
            std::mem::take(&mut axle[i]),
            reference,
        ));
    }
    if drafted > 0 {
        rows[2]
            .extra
            .insert("acceptance_rate".into(), accepted as f64 / drafted as f64);
        rows[2].extra.insert("drafted".into(), drafted as f64);
    }
    Ok(rows)
}

/// One request, timed from its submission.
fn timed_request(
    session: &Session,
    prompt: &[u32],
    i: usize,
    g: &GenerateSpec,
) -> Result<Timing, BenchError> {
    let t0 = Instant::now();
    let mut req = GenerateRequest::new(prompt.to_vec())
        .with_sampling(&SamplingParams {
            temperature: g.temperature,
            seed: g.seed + i as u64,
            ..SamplingParams::greedy()
        })
        .max_tokens(g.max_tokens);
    req.ignore_eos = true;
    req.speculation = g.ngram;
    let stream = session.start_blocking(&req)?.into_iter().flatten();
    let (mut first, mut last) = (None, t0);
    let mut t = Timing {
        prompt: 0,
        ttft: 0.0,
        decode: 0.0,
        tokens: 0,
        drafted: 0,
        accepted: 0,
    };
    for ev in stream {
        match ev {
            StreamEvent::Token { .. } => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                t.tokens += 1;
            }
            StreamEvent::Done { finish, .. } => {
                t.prompt = finish.usage.map_or(0, |u| u.prompt_tokens);
                t.drafted = finish.speculation.drafted;
                t.accepted = finish.speculation.accepted;
            }
            StreamEvent::Error(e) => return Err(e.into()),
        }
    }
    let first = first.unwrap_or(last);
    t.ttft = (first - t0).as_secs_f64();
    t.decode = (last - first).as_secs_f64();
    Ok(t)
}

/// libllama on the same prompts, one at a time, greedy: (prefill tok/s, decode tok/s).
fn reference_run(
    o: &mut LlamaOracle,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Result<(f64, f64), BenchError> {
    let (mut p_tok, mut p_time, mut d_tok, mut d_time) = (0.0, 0.0, 0.0, 0.0);
    for p in prompts {
        o.clear();
        let toks: Vec<i32> = p.iter().map(|&t| t as i32).collect();
        let t = Instant::now();
        let mut logits = o.prefill(&toks, 0)?;
        p_time += t.elapsed().as_secs_f64();
        p_tok += p.len() as f64;
        let t = Instant::now();
        for i in 0..max_tokens.saturating_sub(1) {
            let next = argmax(&logits) as i32;
            logits = o
                .decode(&[(next, (p.len() + i) as i32, 0, true)])?
                .pop()
                .unwrap_or_default();
        }
        d_time += t.elapsed().as_secs_f64();
        d_tok += max_tokens.saturating_sub(1) as f64;
    }
    Ok((p_tok / p_time.max(1e-9), d_tok / d_time.max(1e-9)))
}

/// Index of the largest logit.
pub fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_products_check_names_what_was_asked_and_what_ran() {
        let wide = Some(DeviceProducts::Wide);
        let columns = Some(DeviceProducts::Columns);
        let c = products_check(wide, &[(1, wide), (64, wide)]);
        assert!(c.passed);
        assert_eq!(c.kind, "products");
        assert_eq!(c.detail, "asked for wide, the engine multiplied with wide");
        let c = products_check(None, &[(1, columns)]);
        assert!(c.passed, "no ask: a record of the device's default");
        assert!(c.detail.ends_with("with columns"), "{}", c.detail);
        let c = products_check(None, &[(1, columns), (16, columns), (64, wide)]);
        assert!(c.passed, "the default goes by the engine's capacity");
        assert_eq!(
            c.detail,
            "asked for the device's default, the engine multiplied with columns at 1, 16 \
             sequences; wide at 64 sequences"
        );
        let c = products_check(wide, &[(1, wide), (4, None)]);
        assert!(
            !c.passed,
            "asked for wide, one engine ran without the device layout"
        );
        assert!(
            c.detail.contains("none (no device layout) at 4"),
            "{}",
            c.detail
        );
    }
}
