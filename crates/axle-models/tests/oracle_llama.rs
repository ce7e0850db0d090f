//! SmolLM2-135M (llama architecture) against libllama on the same file: last-position logits for
//! ten prompts of 1 to ~1000 tokens, and greedy 64-token continuations.
mod common;

use axle_ggml::oracle::{LlamaOracle, OracleOptions};
use axle_models::{Model, ModelOptions, Runner, RunnerOptions, Sequence};
use common::*;
use std::sync::Arc;

const CONTINUATION: usize = 64;

fn greedy_axle(runner: &mut Runner, prompt: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let mut seq = Sequence::new(runner);
    let first = seq.feed(runner, prompt).expect("prefill");
    let mut out = Vec::new();
    let mut logits = first.clone();
    for _ in 0..CONTINUATION {
        let t = argmax(&logits) as u32;
        out.push(t);
        logits = seq.feed(runner, &[t]).expect("decode");
    }
    (first, out)
}

fn greedy_oracle(o: &mut LlamaOracle, prompt: &[u32]) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    o.clear();
    let toks: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let first = o.prefill(&toks, 0).expect("oracle prefill");
    let mut out = Vec::new();
    let mut gaps = Vec::new();
    let mut logits = first.clone();
    for i in 0..CONTINUATION {
        let t = argmax(&logits) as u32;
        gaps.push(top2_gap(&logits));
        out.push(t);
        logits = o
            .decode(&[(t as i32, (prompt.len() + i) as i32, 0, true)])
            .expect("oracle decode")
            .remove(0);
    }
    (first, out, gaps)
}

pub fn run_oracle_suite(model_file: &str, min_identical: usize) {
    let path = model(model_file);
    let model = Arc::new(
        Model::load(
            &path,
            &ModelOptions {
                threads: 2,
                repack: true,
            },
        )
        .expect("load"),
    );
    let mut runner = Runner::new(
        model.clone(),
        RunnerOptions {
            kv_slots: 2048,
            ..Default::default()
        },
    )
    .expect("runner");
    let mut oracle = LlamaOracle::load(
        &path,
        &OracleOptions {
            n_ctx: 2048,
            ..Default::default()
        },
    )
    .expect("oracle");
    let mut identical = 0;
    let mut worst = 0.0f32;
    println!(
        "{:>6} {:>10} {:>6} {:>9}",
        "tokens", "max|dlogit|", "top1", "greedy64"
    );
    for p in prompts() {
        let toks = model.tokenizer.encode(&p, true, false);
        let (a_first, a_cont) = greedy_axle(&mut runner, &toks);
        let (o_first, o_cont, gaps) = greedy_oracle(&mut oracle, &toks);
        let d = max_abs_diff(&a_first, &o_first);
        worst = worst.max(d);
        let top1 = argmax(&a_first) == argmax(&o_first);
        let same = a_cont == o_cont;
        if same {
            identical += 1;
        } else {
            let i = a_cont
                .iter()
                .zip(&o_cont)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            println!(
                "  divergence at step {i}: oracle top-2 logit gap there {:.4}",
                gaps[i]
            );
        }
        println!("{:>6} {:>10.5} {:>6} {:>9}", toks.len(), d, top1, same);
        assert!(
            top1 || top2_gap(&o_first) < 0.05,
            "top-1 differs on a clear decision"
        );
        assert!(d < 0.35, "last-position logits differ by {d}");
    }
    println!("identical greedy continuations: {identical}/10, worst max|dlogit| {worst:.5}");
    assert!(
        identical >= min_identical,
        "only {identical}/10 greedy continuations identical"
    );
}

#[test]
fn smollm2_logits_and_greedy_match_libllama() {
    run_oracle_suite(SMOLLM2, 9);
}
