//! Next-token-prediction heads against libllama's MTP context on the seeds' fixtures that carry
//! an MTP block: the trunk's hidden states of every row, then the head's logits and hidden states
//! over a prompt (each token paired with the trunk's state of the row before it, zeros before
//! the first) and over a chain of drafts fed the head's own states, bit for bit, with libllama's
//! kernels on the CPU; the trunk's last logits too (the fixtures with an MTP block are not in
//! `oracle_fixtures.rs`).
mod common;

use axle_ggml::oracle::{MtpOracle, OracleOptions};
use axle_models::{LogitRows, Model, ModelOptions, Runner, RunnerOptions, SeqInput, StateSlots};
use std::sync::Arc;

/// One sequence's step of `tokens` from `start` (blocks 0.. of 16 slots), every row's logits.
fn input(tokens: &[u32], start: usize, hidden: Vec<f32>) -> SeqInput {
    let end = start + tokens.len();
    SeqInput {
        hidden,
        tokens: tokens.to_vec(),
        start_pos: start as u32,
        prompt_len: end as u32,
        block_table: (0..end.div_ceil(16) as u32).collect(),
        logits: LogitRows::All,
        pick: false,
        state: StateSlots::default(),
    }
}

fn rows(v: &[f32], width: usize) -> Vec<Vec<f32>> {
    v.chunks(width).map(<[f32]>::to_vec).collect()
}

fn diffs(a: &[Vec<f32>], b: &[Vec<f32>]) -> Vec<f32> {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| common::max_abs_diff(x, y))
        .collect()
}

fn check_head(file: &str) {
    let path = common::fixture(file);
    let model = Arc::new(Model::load(&path, &ModelOptions::cpu(2)).expect("model"));
    assert!(model.family().mtp().is_some(), "{file} has an MTP head");
    let e = model.family().hparams().n_embd as usize;
    let opts = |mtp: bool| RunnerOptions {
        mtp,
        returns_hidden: !mtp,
        ..RunnerOptions::like_llama_cpp(256)
    };
    let mut trunk = Runner::new(model.clone(), opts(false)).expect("trunk runner");
    let mut head = Runner::new(model.clone(), opts(true)).expect("head runner");
    let mut oracle = MtpOracle::load(
        &path,
        &OracleOptions {
            n_ctx: 256,
            ..Default::default()
        },
    )
    .expect("MTP oracle");
    for prompt in common::prompts().iter().take(4) {
        oracle.clear();
        let tokens = model.tokenizer.encode(prompt, true, false);
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let n = tokens.len();

        // The trunk: every row's hidden state.
        let (want_h, want_last) = oracle.trunk(&ids, 0).expect("oracle trunk");
        let out = trunk
            .step(&[input(&tokens, 0, Vec::new())])
            .expect("trunk step");
        common::assert_exact(
            &[common::max_abs_diff(out.row(n - 1), &want_last)],
            &format!("{file} trunk logits of the last row, {n} tokens"),
        );
        common::assert_exact(
            &diffs(&rows(&out.hidden, e), &rows(&want_h, e)),
            &format!("{file} trunk hidden states, {n} tokens"),
        );

        // The head over the prompt: token p with the trunk's state of row p - 1.
        let mut paired = vec![0.0f32; e];
        paired.extend_from_slice(&want_h[..(n - 1) * e]);
        let entries: Vec<(i32, i32)> = ids
            .iter()
            .enumerate()
            .map(|(p, &t)| (t, p as i32))
            .collect();
        let want = oracle.head(&entries, &paired).expect("oracle head");
        let got = head.step(&[input(&tokens, 0, paired)]).expect("head step");
        common::assert_exact(
            &diffs(&rows(&got.logits, got.width), &want.logits),
            &format!("{file} head logits over the prompt"),
        );
        common::assert_exact(
            &diffs(&rows(&got.hidden, e), &rows(&want.hidden, e)),
            &format!("{file} head hidden states over the prompt"),
        );

        // A chain of drafts: each fed the head's own last state.
        let mut h: Vec<f32> = want.hidden[(n - 1) * e..].to_vec();
        let mut logits: Vec<f32> = want.logits[n - 1].clone();
        for k in 0..3 {
            let t = common::argmax(&logits) as u32;
            let want = oracle
                .head(&[(t as i32, (n + k) as i32)], &h)
                .expect("oracle draft");
            let got = head
                .step(&[input(&[t], n + k, h.clone())])
                .expect("head draft");
            common::assert_exact(
                &diffs(&rows(&got.logits, got.width), &want.logits),
                &format!("{file} draft {k} logits"),
            );
            assert_eq!(got.hidden, want.hidden, "{file} draft {k} hidden state");
            (h, logits) = (want.hidden, want.logits[0].clone());
        }
    }
}

#[test]
fn glm4moe_mtp_head_matches_libllama() {
    check_head("glm4moe-tiny.gguf");
}

#[test]
fn qwen35_mtp_head_matches_libllama() {
    check_head("qwen35-mtp-tiny.gguf");
}

#[test]
fn qwen35moe_mtp_head_matches_libllama() {
    check_head("qwen35moe-mtp-tiny.gguf");
}

#[test]
fn deepseek2_mtp_head_matches_libllama() {
    check_head("deepseek2-mtp-tiny.gguf");
}

/// The KV budget counts the head's cache layer when the head may draft: its layers come after
/// the trunk's, with the head family's widths, and the slots that fit shrink by its share.
#[test]
fn the_kv_budget_counts_the_mtp_head() {
    let path = common::fixture("glm4moe-tiny.gguf");
    let model = Model::load(&path, &ModelOptions::cpu(2)).expect("load");
    let trunk = model.family().kv_dims();
    let head = model.family().mtp().expect("an MTP head").kv_dims();
    let (without, _) = axle_models::runner::kv_layers(&model, false);
    let (with, bufts) = axle_models::runner::kv_layers(&model, true);
    assert_eq!(without, trunk);
    assert_eq!(with.len(), trunk.len() + head.len());
    assert_eq!(bufts.len(), with.len());
    assert_eq!(&with[trunk.len()..], &head[..]);
    let bytes = |d: &[(i64, i64)]| d.iter().map(|(k, v)| k + v).sum::<i64>() as f64;
    let fit = |h| {
        axle_models::runner::kv_slots_that_fit(&model, 16, Default::default(), h)
            .expect("the host tells its free memory") as f64
    };
    let ratio = fit(true) / fit(false);
    let expected = bytes(&without) / bytes(&with);
    assert!(
        (ratio - expected).abs() < 0.02,
        "slots with the head / without: {ratio:.3}, expected {expected:.3}"
    );
}
