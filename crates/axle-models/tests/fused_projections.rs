//! Fused projections (`FusedProjections`): a layer's Q, K and V, and its FFN gate and up, stored
//! as one weight each and run as one product. On the host, each row of a product is computed by
//! itself, so fusing changes no number: a prompt, decode steps and a verify step give the same
//! logits bit for bit with the weights fused and separate. (On CUDA the tiled kernel's split of
//! the work depends on the weight's rows, so there the numbers move; the device check measures
//! that path against libllama and against itself.)
mod common;

use axle_models::{
    FusedProjections, LogitRows, Model, ModelOptions, Runner, RunnerOptions, SeqInput,
};
use std::path::Path;
use std::sync::Arc;

const TEXT: &str = "Paged attention keeps each sequence's keys and values in fixed blocks, \
    and a prefix cache lets a later request reuse the blocks of a prompt it shares.";

/// Logits of every row of: the prompt in one step, three decode steps, then a verify step of
/// four tokens (the greedy tokens of the decode steps fed back, as drafts would be).
fn logits(model: Arc<Model>) -> Vec<Vec<f32>> {
    let mut runner = Runner::new(
        model.clone(),
        RunnerOptions {
            kv_slots: 256,
            ..Default::default()
        },
    )
    .unwrap();
    let table: Vec<u32> = (0..256 / runner.options().block_size).collect();
    let prompt = model.tokenizer.encode(TEXT, true, false);
    let p = prompt.len() as u32;
    let mut tokens = prompt.clone();
    let mut out = Vec::new();
    let feed = |runner: &mut Runner, tokens: &[u32], from: usize| {
        let step = runner
            .step(&[SeqInput {
                tokens: tokens[from..].to_vec(),
                start_pos: from as u32,
                prompt_len: p,
                block_table: table.clone(),
                logits: LogitRows::All,
                pick: false,
                state: Default::default(),
            }])
            .unwrap();
        (0..tokens.len() - from)
            .map(|i| step.row(i).to_vec())
            .collect::<Vec<_>>()
    };
    let rows = feed(&mut runner, &tokens, 0);
    tokens.push(common::argmax(rows.last().unwrap()) as u32);
    out.extend(rows);
    for _ in 0..3 {
        let rows = feed(&mut runner, &tokens, tokens.len() - 1);
        tokens.push(common::argmax(&rows[0]) as u32);
        out.extend(rows);
    }
    // Verify: the last four tokens again, over the cache the decode steps wrote.
    out.extend(feed(&mut runner, &tokens, tokens.len() - 4));
    out
}

fn load(path: &Path, fused: FusedProjections) -> Arc<Model> {
    Arc::new(
        Model::load(
            path,
            &ModelOptions {
                fused_projections: fused,
                ..ModelOptions::cpu(2)
            },
        )
        .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
}

/// Fused and separate weights give the same logits; `fused_per_layer` weights are fused in every
/// layer (2: QKV and gate-up; 1: gate-up alone, for layers with per-head Q/K norms).
fn check(path: &Path, fused_per_layer: usize) {
    let fused = load(path, FusedProjections::Everywhere);
    let n_layer = fused.family().hparams().n_layer;
    assert_eq!(
        fused.fused_weights().len(),
        fused_per_layer * n_layer,
        "{}: fused weights {:?}",
        path.display(),
        fused.fused_weights()
    );
    let separate = load(path, FusedProjections::Off);
    assert!(separate.fused_weights().is_empty());
    // On the host the default fuses nothing: the CPU keeps libllama's products.
    assert!(load(path, FusedProjections::Devices)
        .fused_weights()
        .is_empty());
    let (a, b) = (logits(fused), logits(separate));
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let d = common::max_abs_diff(x, y);
        assert!(d == 0.0, "{}: row {i} differs by {d}", path.display());
    }
}

#[test]
fn smollm2_fused_projections_change_no_logit() {
    check(&common::model(common::SMOLLM2), 2);
}

#[test]
fn llama_fixture_fused_projections_change_no_logit() {
    check(&common::fixture("llama-tiny.gguf"), 2);
}

#[test]
fn qwen3_fixture_fuses_gate_up_alone() {
    check(&common::fixture("qwen3-tiny.gguf"), 1);
}
