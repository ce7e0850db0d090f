//! The recurrent state of hybrid models (Qwen3.5's gated delta net layers) under speculation: a
//! verify step keeps the state after each of its tokens, and dropping rejected drafts makes the
//! next step start from the state after the last accepted one, without recomputing anything.
//! Checked on the fixtures against plain one-token decoding, bit for bit: every accepted row's
//! logits, with 0 to 3 of 3 drafts accepted in turn, over 48 positions.
mod common;

use axle_models::{Model, ModelOptions, Runner, RunnerOptions, Sequence};
use std::sync::Arc;

const TEXT: &str = "The history of computing is a story of abstraction layered upon abstraction.";

#[test]
fn rejected_drafts_roll_the_recurrent_state_back() {
    for name in [
        "qwen35-tiny.gguf",
        "qwen35moe-tiny.gguf",
        "qwen3next-tiny.gguf",
    ] {
        let model =
            Arc::new(Model::load(common::fixture(name), &ModelOptions::cpu(2)).expect("load"));
        let runner = |snapshots| {
            Runner::new(
                model.clone(),
                RunnerOptions {
                    kv_slots: 1024,
                    state_snapshots: snapshots,
                    ..Default::default()
                },
            )
            .expect("runner")
        };
        let prompt = model.tokenizer.encode(TEXT, true, false);
        // Plain greedy decoding: the reference tokens and each position's logits.
        let mut plain_runner = runner(1);
        let mut plain = Sequence::new(&plain_runner);
        let mut logits = vec![plain.feed(&mut plain_runner, &prompt).unwrap()];
        let mut greedy = Vec::new();
        for _ in 0..52 {
            let t = common::argmax(logits.last().unwrap()) as u32;
            greedy.push(t);
            logits.push(plain.feed(&mut plain_runner, &[t]).unwrap());
        }
        // Speculative: verify 3 drafts at a time, the first `a` of them right.
        let mut spec_runner = runner(4);
        let mut spec = Sequence::new(&spec_runner);
        spec.feed(&mut spec_runner, &prompt).unwrap();
        let (mut i, mut step) = (0usize, 0usize);
        let (mut accepted, mut rejected) = (0, 0);
        while i + 4 <= greedy.len() {
            let a = step % 4;
            let mut tokens = greedy[i..i + 1 + a].to_vec();
            // Wrong drafts after the right ones: another token than the greedy one.
            for k in tokens.len()..4 {
                tokens.push((greedy[i + k] + 1) % 1000);
            }
            let rows = spec.feed_all(&mut spec_runner, &tokens).unwrap();
            for (j, row) in rows.iter().enumerate().take(a + 1) {
                let d = common::max_abs_diff(row, &logits[i + j + 1]);
                assert_eq!(
                    d,
                    0.0,
                    "{name}: position {} (step {step}) differs by {d}",
                    i + j
                );
            }
            accepted += a;
            rejected += 3 - a;
            // Keep the real token and the accepted drafts; drop the rest.
            spec.truncate(prompt.len() + i + 1 + a);
            i += 1 + a;
            step += 1;
        }
        println!("{name}: {step} verify steps, {accepted} drafts accepted, {rejected} rejected: identical logits");
        assert!(accepted > 0 && rejected > 0);
    }
}
