//! The default host kernels (`HostKernels::Origin`) against libllama on both real models: a
//! prompt of 64 tokens or more, prefilled in one step, then greedy decode steps. libllama prefills
//! such a prompt with ggml's tiled attention and tiled K-quant GEMM and decodes with the one-pass
//! attention and the dot product; the exact engine gives prompt rows and generated rows those
//! arithmetics by their origin, so its logits must equal libllama's bit for bit at every step.
//! (With `HostKernels::Compatible` the prompt's last logits already differ, which the test checks
//! too, so that it fails if the two choices stop differing.)
mod common;

use axle_models::{HostKernels, LogitRows, Model, ModelOptions, Runner, RunnerOptions, SeqInput};
use std::sync::Arc;

const TEXT: &str = "The engine keeps its key and value cache in fixed blocks of sixteen slots. \
    A request holds a table of blocks, and a block whose last owner leaves keeps its contents \
    until it is evicted, so that a later request with the same prefix finds it again. Attention \
    visits each sequence's tokens in logical order wherever its blocks lie. Speculation drafts \
    tokens from n-grams of the text so far and verifies them in one step; the rows of that step \
    must compute the numbers a decode step would, or the output would change with the drafts. ";

/// Largest |difference| of the prompt's last logits, then of each of `decode` decode steps',
/// between the runner with `host_kernels` and libllama, the runner's greedy tokens fed to both;
/// the prompt is `TEXT` `repeat` times.
fn diffs(name: &str, host_kernels: HostKernels, repeat: usize, decode: usize) -> Vec<f32> {
    let path = common::model(name);
    // libllama repacks the weights it has a repacked layout for; so does this model.
    let model = Arc::new(Model::load(&path, &ModelOptions::cpu_repacked(2)).unwrap());
    let prompt = model.tokenizer.encode(&TEXT.repeat(repeat), true, false);
    assert!(
        (64..512).contains(&prompt.len()),
        "{} prompt tokens: one tiled ubatch wanted",
        prompt.len()
    );
    let mut runner = Runner::new(
        model.clone(),
        RunnerOptions {
            kv_slots: 1024,
            host_kernels,
            ..Default::default()
        },
    )
    .unwrap();
    let mut oracle = common::oracle(&path, 1024);
    let table: Vec<u32> = (0..1024 / runner.options().block_size).collect();
    let p = prompt.len();
    let mut tokens = prompt.clone();
    let mut out = Vec::new();
    for step in 0..=decode {
        let from = if step == 0 { 0 } else { tokens.len() - 1 };
        let ours = runner
            .step(&[SeqInput {
                hidden: Vec::new(),
                tokens: tokens[from..].to_vec(),
                start_pos: from as u32,
                prompt_len: p as u32,
                block_table: table.clone(),
                logits: LogitRows::Last,
                pick: false,
                state: Default::default(),
            }])
            .unwrap();
        let n = tokens.len() - from;
        let entries: Vec<(i32, i32, i32, bool)> = (from..tokens.len())
            .enumerate()
            .map(|(i, pos)| (tokens[pos] as i32, pos as i32, 0, i + 1 == n))
            .collect();
        let theirs = oracle.decode(&entries).unwrap();
        out.push(common::max_abs_diff(ours.row(0), &theirs[0]));
        tokens.push(common::argmax(ours.row(0)) as u32);
    }
    out
}

/// Asserts that the origin host kernels give libllama's logits at every step (see [`diffs`]) on
/// `case`: a prompt of `repeat` x `TEXT`, then `decode` decode steps.
fn assert_origin_exact(name: &str, repeat: usize, decode: usize, case: &str) {
    let origin = diffs(name, HostKernels::Origin, repeat, decode);
    println!(
        "{name}: {case}, origin host kernels, max |dlogit| (prompt, then decode steps): {origin:?}"
    );
    common::assert_exact(
        &origin,
        &format!("{name}: origin host kernels differ from libllama after {case}"),
    );
}

#[test]
fn origin_rows_follow_libllama() {
    for name in [common::SMOLLM2, common::GEMMA3] {
        assert_origin_exact(name, 1, 12, "a short prompt");
        let compatible = diffs(name, HostKernels::Compatible, 1, 12);
        println!("{name}: compatible host kernels: {compatible:?}");
        assert!(
            compatible[0] > 0.0,
            "{name}: the compatible arithmetic gave libllama's prompt logits; the test no longer \
             tells the two apart"
        );
    }
}

/// A prompt of 4 x `TEXT` (over 256 tokens), then decode steps whose libllama KV view is 512 and
/// then 768 cells: libllama takes ggml's split-KV kernel for them, and so do the generated rows.
#[test]
fn origin_rows_follow_libllama_past_512_cells() {
    for name in [common::SMOLLM2, common::GEMMA3] {
        assert_origin_exact(name, 4, 40, "a long prompt");
    }
}
