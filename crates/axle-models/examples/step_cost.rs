//! What a step costs by shape, on this machine: `cargo run --release -p axle-models --example
//! step_cost -- MODEL.gguf [k]`. Prefills 300 tokens (timed), then times steps of one sequence
//! with k + 1 tokens and logits at every position (a verify step of k drafts; k = 0 is a plain
//! decode step): repeated with the same shape, and alternating with k + 1 (graph rebuilds). With
//! `k [steps]`, prefills once and times only that width, `steps` times (default 20): for profiling,
//! e.g. `perf record -D 3000 target/release/examples/step_cost MODEL 3 300`. For recurrent
//! (hybrid) models, `AXLE_KEEP_STATES=1` makes each verify step keep the state after each of its
//! tokens (what rollback of rejected drafts needs) instead of the last one only: the difference is
//! what per-position states cost. `AXLE_HOST_KERNELS=compatible|origin|tiled` picks the host
//! kernels (default: the runner's).
use axle_models::{LogitRows, Model, ModelOptions, Runner, RunnerOptions, SeqInput};
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: step_cost MODEL.gguf [k]")?;
    let only: Option<usize> = args.next().map(|k| k.parse()).transpose()?;
    let n: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(20);
    let model = Arc::new(Model::load(&path, &ModelOptions::default())?);
    let keep_all = axle_ggml::env::var_os("AXLE_KEEP_STATES").is_some();
    let mut r = Runner::new(
        model,
        RunnerOptions {
            state_snapshots: 9,
            host_kernels: match axle_ggml::env::var("AXLE_HOST_KERNELS") {
                Some(k) => k.parse()?,
                None => Default::default(),
            },
            ..RunnerOptions::default()
        },
    )?;
    let ctx = 300usize;
    let table: Vec<u32> = (0..64).collect();
    let toks: Vec<u32> = (0..ctx as u32 + 16)
        .map(|i| (i * 7919) % 1000 + 10)
        .collect();
    for _ in 0..if only.is_some() { 1 } else { 3 } {
        let t = Instant::now();
        r.step(&[SeqInput {
            hidden: Vec::new(),
            tokens: toks[..ctx].to_vec(),
            start_pos: 0,
            prompt_len: ctx as u32,
            block_table: table.clone(),
            logits: LogitRows::Last,
            pick: false,
            state: Default::default(),
        }])?;
        println!("prefill {ctx}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    }
    let inp = |k: usize| SeqInput {
        hidden: Vec::new(),
        tokens: toks[ctx..ctx + k + 1].to_vec(),
        start_pos: ctx as u32,
        prompt_len: ctx as u32,
        block_table: table.clone(),
        logits: LogitRows::for_drafts(k),
        pick: false,
        state: axle_models::StateSlots {
            keep: if keep_all { k as u32 + 1 } else { 1 },
            ..Default::default()
        },
    };
    for k in only.map_or(0..=8, |k| k..=k) {
        r.step(&[inp(k)])?;
        let t = Instant::now();
        for _ in 0..n {
            r.step(&[inp(k)])?;
        }
        let steady = t.elapsed().as_secs_f64() / n as f64 * 1e3;
        if only.is_some() {
            println!("k={k}: {steady:.2} ms steady");
            break;
        }
        let t = Instant::now();
        for i in 0..n {
            r.step(&[inp(if i % 2 == 0 { k } else { (k + 1) % 9 })])?;
        }
        let alt = t.elapsed().as_secs_f64() / n as f64 * 1e3;
        println!("k={k}: {steady:.2} ms steady, {alt:.2} ms alternating with k+1");
    }
    Ok(())
}
