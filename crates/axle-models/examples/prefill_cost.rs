//! What a cold prefill costs on this machine, repeated, for profiling prefill:
//! `cargo run --release -p axle-models --example prefill_cost -- MODEL.gguf [tokens] [reps]
//! [device-layout]`
//! (default 512 tokens, 10 times; the CPU, 2 threads, weights repacked as libllama has them, the
//! runner's default kernels; `device-layout` lays steps out as on an accelerator). Each repetition
//! prefills the same synthetic prompt into a fresh sequence and prints its tok/s and where the
//! runner's time went (host work: prepare, build, inputs; compute), e.g. under
//! `perf record -e cpu-clock target/release/examples/prefill_cost MODEL 512 12`.
use axle_models::{Model, ModelOptions, Runner, RunnerOptions, Sequence};
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: prefill_cost MODEL.gguf [tokens] [reps]")?;
    let n: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(512);
    let reps: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(10);
    let model = Arc::new(Model::load(&path, &ModelOptions::cpu_repacked(2))?);
    let vocab = model.tokenizer.len() as u32;
    let mut runner = Runner::new(
        model,
        RunnerOptions {
            kv_slots: (n as u32 + 1).div_ceil(256) * 256,
            force_device_layout: args.next().as_deref() == Some("device-layout"),
            ..RunnerOptions::default()
        },
    )?;
    let toks: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    for _ in 0..reps {
        let mut seq = Sequence::new(&runner);
        let t = Instant::now();
        seq.feed(&mut runner, &toks)?;
        let wall = t.elapsed().as_secs_f64();
        let p = runner.take_profile();
        println!(
            "{:.1} tok/s; {} steps, {} graphs built; host ms: prepare {:.1} build {:.1} inputs {:.1}; compute {:.1}",
            n as f64 / wall,
            p.steps,
            p.builds,
            p.prepare_s * 1e3,
            p.build_s * 1e3,
            p.inputs_s * 1e3,
            p.compute_s * 1e3
        );
    }
    Ok(())
}
