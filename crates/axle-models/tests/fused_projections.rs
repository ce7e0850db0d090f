//! Fused projections (`FusedProjections`): a layer's Q, K and V, and its FFN gate and up, stored
//! as one weight each and run as one product. On the host, each row of a product is computed by
//! itself, so fusing changes no number: a prompt, decode steps and a verify step give the same
//! logits bit for bit with the weights fused and separate. (On CUDA the tiled kernel's split of
//! the work depends on the weight's rows, so there the numbers move; the device check measures
//! that path against libllama and against itself.)
mod common;

use axle_models::{FusedProjections, Model, ModelOptions};
use std::path::Path;
use std::sync::Arc;

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
    // Each part of a fused weight reads its own rows: the bytes of the separate weight.
    let bytes = |t: &axle_ggml::StoredTensor| {
        let mut b = vec![0u8; t.t().nbytes()];
        t.t().read_bytes_at(0, &mut b).expect("read");
        b
    };
    let separate_by_name: std::collections::HashMap<String, axle_ggml::StoredTensor> = separate
        .tensors()
        .into_iter()
        .map(|s| (s.t().name(), s))
        .collect();
    let mut parts = 0;
    for t in fused.tensors() {
        let name = t.t().name();
        if fused.fused_weights().contains(&name) {
            continue;
        }
        let Some(s) = separate_by_name.get(&name) else {
            continue;
        };
        assert_eq!(bytes(&t), bytes(s), "{}: part {name}", path.display());
        parts += 1;
    }
    assert!(
        parts > fused_per_layer * n_layer,
        "{}: {parts} parts",
        path.display()
    );
    // On the host the default fuses nothing: the CPU keeps libllama's products.
    assert!(load(path, FusedProjections::Devices)
        .fused_weights()
        .is_empty());
    common::assert_same_step_logits(fused, separate, path);
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
