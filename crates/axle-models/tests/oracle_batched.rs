//! The multi-sequence runner against libllama's own multi-sequence batch: 13 prompts (65 tokens)
//! prefilled in one step, then three decode steps of 13 tokens, on SmolLM2. Every sequence's logits
//! must equal libllama's for the same batch, bit for bit. (At 64+ tokens in a step, ggml's CPU
//! kernels shift every row's arithmetic slightly, in libllama as in Axle; this test pins that
//! Axle's batched path computes exactly what libllama's does.)
mod common;

use axle_ggml::oracle::{LlamaOracle, OracleOptions};
use axle_models::{LogitRows, Model, ModelOptions, Runner, RunnerOptions, SeqInput};
use std::sync::Arc;

#[test]
fn batched_logits_equal_libllama_batched_logits() {
    let path = common::model(common::SMOLLM2);
    let model = Arc::new(Model::load(&path, &ModelOptions::cpu_repacked(2)).unwrap());
    let texts = [
        "The capital of France is",
        "Water boils at",
        "One, two, three,",
        "fn main() {",
        "Dear Sir or Madam,",
    ];
    let prompts: Vec<Vec<u32>> = (0..13)
        .map(|i| model.tokenizer.encode(texts[i % texts.len()], true, false))
        .collect();
    let n_seq = prompts.len();
    let mut runner = Runner::new(model.clone(), RunnerOptions::like_llama_cpp(1024)).unwrap();
    let mut oracle = LlamaOracle::load(
        &path,
        &OracleOptions {
            n_ctx: 1024,
            n_seq_max: n_seq as u32,
            ..Default::default()
        },
    )
    .unwrap();
    // Blocks handed out in a scattered order, as the engine would after churn.
    let tables: Vec<Vec<u32>> = (0..n_seq as u32).map(|i| vec![(i * 7) % 40 + 1]).collect();
    let mut pos: Vec<u32> = vec![0; n_seq];
    let mut inputs: Vec<SeqInput> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| SeqInput {
            hidden: Vec::new(),
            tokens: p.clone(),
            start_pos: 0,
            prompt_len: p.len() as u32,
            block_table: t.clone(),
            logits: LogitRows::Last,
            pick: false,
            state: Default::default(),
        })
        .collect();
    for step in 0..4 {
        let ours = runner.step(&inputs).unwrap();
        let entries: Vec<(i32, i32, i32, bool)> = inputs
            .iter()
            .enumerate()
            .flat_map(|(s, inp)| {
                let n = inp.tokens.len();
                inp.tokens.iter().enumerate().map(move |(i, &t)| {
                    (
                        t as i32,
                        (inp.start_pos as usize + i) as i32,
                        s as i32,
                        i + 1 == n,
                    )
                })
            })
            .collect();
        let theirs = oracle.decode(&entries).unwrap();
        for (s, reference) in theirs.iter().enumerate() {
            let d = common::max_abs_diff(ours.row(s), reference);
            assert_eq!(d, 0.0, "step {step}, sequence {s}: logits differ by {d}");
        }
        // Next: every sequence decodes its greedy token.
        for (s, inp) in inputs.iter_mut().enumerate() {
            pos[s] = inp.start_pos + inp.tokens.len() as u32;
            let next = common::argmax(ours.row(s)) as u32;
            *inp = SeqInput {
                hidden: Vec::new(),
                tokens: vec![next],
                start_pos: pos[s],
                prompt_len: prompts[s].len() as u32,
                block_table: tables[s].clone(),
                logits: LogitRows::Last,
                pick: false,
                state: Default::default(),
            };
        }
    }
}
