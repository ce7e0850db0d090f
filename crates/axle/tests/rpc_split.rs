//! A model split across processes through ggml's RPC backend, on this machine's CPU: two
//! `axle rpc-server` processes on localhost each serve a CPU device, and SmolLM2's 30 layers
//! spread over the local CPU (layers 0-9) and the two servers (10-19, 20-29), each layer's KV on
//! its device. Greedy output must be the same as the unsplit CPU run's, token for token, for
//! every prompt alone, all prompts batched, and with n-gram speculation on. Gemma 3 split the
//! same way must give the same tokens alone, batched and with speculation.
//!
//! Needs `libggml-rpc.so` (`scripts/build-backend.sh rpc`, which the test setup runs) in
//! `target/release/backends`; fails with that instruction when it is missing.
mod common;

use axle_sdk::{Model, ModelOptions};
use common::{backends_dir, cfg, prompts, run, start_server};
use std::sync::Arc;

#[test]
fn split_over_two_rpc_servers_and_the_cpu_matches_the_unsplit_run() {
    std::env::set_var("AXLE_BACKENDS_DIR", backends_dir());
    let (a, b) = (start_server(), start_server());
    let rpc = vec![a.endpoint.clone(), b.endpoint.clone()];
    let load_split = |path: &std::path::Path| {
        Arc::new(
            Model::load(
                path,
                &ModelOptions {
                    device: "cpu,rpc0,rpc1".parse().expect("device list"),
                    split: Some(vec![1.0, 1.0, 1.0]),
                    rpc: rpc.clone(),
                    ..ModelOptions::cpu(2)
                },
            )
            .unwrap_or_else(|e| panic!("split load: {e}")),
        )
    };
    let fetched =
        |name: &str| axle_models::fetched::model_path(name).unwrap_or_else(|e| panic!("{e}"));

    // SmolLM2 (Q4_1): the split run against the unsplit CPU run.
    let path = fetched(axle_models::fetched::SMOLLM2);
    let unsplit = Arc::new(Model::load(&path, &ModelOptions::cpu(2)).expect("load"));
    let split = load_split(&path);
    let summary = split.device_summary();
    println!("placement: {summary}");
    assert!(
        summary.starts_with("CPU layers 0-9, RPC0")
            && summary.contains("layers 10-19, RPC1")
            && summary.ends_with("layers 20-29"),
        "{summary}"
    );
    let ps = prompts(&unsplit);
    let (reference, _) = run(&unsplit, &cfg(0), &ps, false);
    check_split("SmolLM2", &split, &ps, &reference);

    // Gemma 3 (Q4_K_M): batching and speculation across the split, against the split run
    // alone. Not against the unsplit run: an RPC device counts as an accelerator (ggml cannot
    // tell what serves it), so its layers take the device layout, whose prefill products run
    // as one product; on a CPU server that is ggml's tiled K-quant kernel, which rounds
    // differently from the CPU layout's sliced products (docs/multi-device.md).
    let path = fetched(axle_models::fetched::GEMMA3);
    let split = load_split(&path);
    let ps = prompts(&split);
    let (reference, _) = run(&split, &cfg(0), &ps, false);
    check_split("Gemma 3", &split, &ps, &reference);
}

/// The split model's greedy tokens equal `reference` for every prompt alone and batched, with
/// n-gram speculation off and on (and drafts accepted when on).
fn check_split(name: &str, split: &Arc<Model>, ps: &[Vec<u32>], reference: &[Vec<u32>]) {
    assert!(reference.iter().all(|t| t.len() == 32), "{reference:?}");
    for (what, c, batched) in [
        ("alone", cfg(0), false),
        ("batched", cfg(0), true),
        ("alone, n-gram speculation", cfg(4), false),
        ("batched, n-gram speculation", cfg(4), true),
    ] {
        let (got, accepted) = run(split, &c, ps, batched);
        for (i, (r, g)) in reference.iter().zip(&got).enumerate() {
            assert_eq!(r, g, "{name} split run ({what}) differs on prompt {i}");
        }
        if c.draft_len > 0 {
            assert!(
                accepted > 0,
                "{name}: no draft was accepted ({what}): speculation not exercised"
            );
        }
        println!(
            "{name} split ({what}): {}/{} prompts identical, {accepted} drafted tokens accepted",
            got.len(),
            ps.len()
        );
    }
}
