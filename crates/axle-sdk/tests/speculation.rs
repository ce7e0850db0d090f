//! N-gram speculation is exact. Greedy: on 20 prompts (the checked-in high- and low-hit workloads
//! plus general prompts), output with speculation equals output without, token for token, for
//! SmolLM2 and Gemma 3, each prompt alone and all of them batched, against the plain single runs:
//! all 20 identical in both cases. This rests on the engine's batch-invariant kernels (see
//! `axle_models::Kernels`): before them, Gemma 3's batched runs matched only 14/20, because ggml's
//! tiled K-quant GEMM takes over from 8 rows in a step. Models load with the default weight
//! layout (not repacked).
//! Seeded sampling: on a tiny fixture, 200 seeds give identical samples with and without speculation (the draw order is the same, so
//! the output distribution is exactly plain sampling's), with drafts both accepted and rejected.
//! The verify cost is pinned low here so drafting really happens; the gate is tested in axle-core.
use axle_sdk::{EngineConfig, EngineCore, Model, ModelOptions, RequestOptions, SamplingParams};
use std::path::PathBuf;
use std::sync::Arc;

/// A cached real model, or a fixture of `fixtures/` (named `*-tiny.gguf`, or `hf/NAME` for a
/// safetensors folder).
fn model(name: &str) -> Arc<Model> {
    let p = if name.ends_with("-tiny.gguf") || name.starts_with("hf/") {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures")
            .join(name);
        assert!(p.exists(), "fixture {} is missing", p.display());
        p
    } else {
        axle_models::fetched::model_path(name).unwrap_or_else(|e| panic!("{e}"))
    };
    Arc::new(Model::load(&p, &ModelOptions::cpu(2)).expect("load"))
}

/// The 20 prompts of the exactness checks (`axle bench device-check` runs the same ones).
fn prompts() -> Vec<String> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../benchmarks/workloads/check.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let out: Vec<String> = v["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| {
            w["prompts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(out.len(), 20);
    out
}

fn cfg(draft_len: usize) -> EngineConfig {
    EngineConfig {
        kv_slots: 8192,
        max_batch_tokens: 32,
        max_seqs: 32,
        prefix_caching: false,
        draft_len,
        verify_cost: Some((0..=8).map(|k| 1.0 + 0.05 * k as f64).collect()),
        ..Default::default()
    }
}

struct Run {
    tokens: Vec<Vec<u32>>,
    drafted: usize,
    accepted: usize,
}

fn run(m: &Arc<Model>, c: &EngineConfig, prompts: &[Vec<u32>], opts: &RequestOptions) -> Run {
    let mut e = EngineCore::new(m.clone(), c).unwrap();
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| e.add(p.clone(), opts.clone()).unwrap())
        .collect();
    let mut d = e.drain(|e| assert_eq!(e.scheduler().check(), Ok(())));
    assert_eq!(e.scheduler().pool().in_use(), 0);
    Run {
        tokens: d.outputs(&ids),
        drafted: d.drafted(),
        accepted: d.accepted(),
    }
}

/// Top-2 gap of the reference logits where two greedy outputs first differ.
fn gap_at_divergence(
    m: &Arc<Model>,
    prompt: &[u32],
    reference: &[u32],
    other: &[u32],
) -> Option<f32> {
    // The first differing position; if one output is a prefix of the other, the shorter one stopped
    // (an end-of-generation token) where the other went on.
    let k = reference
        .iter()
        .zip(other)
        .position(|(a, b)| a != b)
        .unwrap_or(reference.len().min(other.len()));
    if reference == other {
        return None;
    }
    let mut r = axle_models::Runner::new(
        m.clone(),
        axle_models::RunnerOptions {
            kv_slots: 2048,
            max_batch_tokens: 32,
            ..Default::default()
        },
    )
    .unwrap();
    let mut s = axle_models::Sequence::new(&r);
    let mut hist = prompt.to_vec();
    hist.extend_from_slice(&reference[..k]);
    let l = s.feed(&mut r, &hist).unwrap();
    let mut v = l.clone();
    v.sort_by(|a, b| b.total_cmp(a));
    Some(v[0] - v[1])
}

/// Whether `other` equals the reference `plain`; where not, prints the top-2 gap of the reference
/// logits at the first difference (a close call points at kernel arithmetic, a wide gap at a
/// logic error).
fn same_or_report(
    m: &Arc<Model>,
    what: &str,
    prompt: &[u32],
    plain: &[u32],
    other: &[u32],
) -> bool {
    if plain == other {
        return true;
    }
    let gap = gap_at_divergence(m, prompt, plain, other).expect("outputs differ");
    println!("{what}: differs from plain decoding; top-2 logit gap there {gap:.4}");
    false
}

/// What a run must show about drafting besides exactness.
#[derive(Clone, Copy, PartialEq)]
enum Drafts {
    /// Drafts both accepted and rejected (real models: real text repeats itself).
    AcceptedAndRejected,
    /// Whatever comes: random-weight fixtures write text that rarely repeats, so drafts are few
    /// (the multi-row verify steps are checked at the logit level in
    /// `axle-models/tests/verify_invariance.rs`); this still checks batched = alone.
    AsTheyCome,
}

fn greedy_exactness(name: &str, drafts: Drafts) {
    let m = model(name);
    let prompts: Vec<Vec<u32>> = prompts()
        .iter()
        .map(|p| m.tokenizer.encode(p, true, false))
        .collect();
    let n = prompts.len();
    let opts = RequestOptions {
        max_tokens: 48,
        ..Default::default()
    };
    let (mut drafted, mut accepted, mut alone_same) = (0, 0, 0);
    let mut plain_alone = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let plain = run(&m, &cfg(0), std::slice::from_ref(p), &opts);
        let fast = run(&m, &cfg(4), std::slice::from_ref(p), &opts);
        alone_same += same_or_report(
            &m,
            &format!("{name} prompt {i} alone"),
            p,
            &plain.tokens[0],
            &fast.tokens[0],
        ) as usize;
        drafted += fast.drafted;
        accepted += fast.accepted;
        plain_alone.push(plain.tokens[0].clone());
    }
    let distinct: std::collections::HashSet<u32> = plain_alone.iter().flatten().copied().collect();
    println!(
        "{name} alone: {alone_same}/{n} identical; drafted {drafted}, accepted {accepted}; {} distinct tokens in the plain outputs",
        distinct.len()
    );
    if drafts == Drafts::AcceptedAndRejected {
        assert!(
            accepted > 0 && accepted < drafted,
            "drafts should be both accepted and rejected"
        );
    }
    let fast = run(&m, &cfg(4), &prompts, &opts);
    let mut batched_same = 0;
    for i in 0..n {
        batched_same += same_or_report(
            &m,
            &format!("{name} prompt {i} batched"),
            &prompts[i],
            &plain_alone[i],
            &fast.tokens[i],
        ) as usize;
    }
    println!("{name} batched: {batched_same}/{n} identical to plain single runs; drafted {}, accepted {}", fast.drafted, fast.accepted);
    if drafts == Drafts::AcceptedAndRejected {
        assert!(fast.drafted > 0);
    }
    assert_eq!(
        alone_same, n,
        "{name}: speculation changed single-run outputs"
    );
    assert_eq!(
        batched_same, n,
        "{name}: batched speculation changed outputs"
    );
}

#[test]
fn greedy_speculation_is_exact_smollm2() {
    greedy_exactness(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        Drafts::AcceptedAndRejected,
    );
}

#[test]
fn greedy_speculation_is_exact_gemma3() {
    greedy_exactness("gemma-3-270m-q4_k_m.gguf", Drafts::AcceptedAndRejected);
}

/// Safetensors folders (bf16 and f32 weights used in place, Q/K rows permuted at load) keep the
/// invariants a GGUF has.
#[test]
fn greedy_speculation_is_exact_bf16_folder() {
    greedy_exactness("hf/llama-bf16", Drafts::AsTheyCome);
}

#[test]
fn greedy_speculation_is_exact_f32_folder() {
    greedy_exactness("hf/qwen2-f32", Drafts::AsTheyCome);
}

/// Experts stacked at load from a Transformers folder, in bf16.
#[test]
fn greedy_speculation_is_exact_moe_folder() {
    greedy_exactness("hf/qwen3moe-bf16", Drafts::AsTheyCome);
}

/// Qwen 3.5 MoE from a Transformers folder: hybrid recurrent layers (value heads tiled at load),
/// experts' merged gate and up rows read in place, in bf16.
#[test]
fn greedy_speculation_is_exact_hybrid_moe_folder() {
    greedy_exactness("hf/qwen35moe-bf16", Drafts::AsTheyCome);
}

/// GLM-4.7-Flash's layout from a Transformers folder: latent attention whose kv_b_proj is split
/// at load, sigmoid-routed experts, in bf16.
#[test]
fn greedy_speculation_is_exact_latent_folder() {
    greedy_exactness("hf/glm4lite-bf16", Drafts::AsTheyCome);
}

/// Mixture of experts with K-quant experts (not repacked: the expert products run in slices so
/// that no expert sees the 8 rows from which ggml's tiled kernel takes over).
#[test]
fn greedy_speculation_is_exact_qwen3moe_fixture() {
    greedy_exactness("qwen3moe-tiny.gguf", Drafts::AsTheyCome);
}

/// Mixture of experts with a gated shared expert.
#[test]
fn greedy_speculation_is_exact_qwen2moe_fixture() {
    greedy_exactness("qwen2moe-tiny.gguf", Drafts::AsTheyCome);
}

/// Gemma 4 with KV-shared layers and per-layer embeddings.
#[test]
fn greedy_speculation_is_exact_gemma4_fixture() {
    greedy_exactness("gemma4-tiny.gguf", Drafts::AsTheyCome);
}

/// Gemma 4 with routed experts beside the dense FFN.
#[test]
fn greedy_speculation_is_exact_gemma4moe_fixture() {
    greedy_exactness("gemma4moe-tiny.gguf", Drafts::AsTheyCome);
}

/// gpt-oss: attention sinks, alternating sliding-window layers, MXFP4 experts with biases.
#[test]
fn greedy_speculation_is_exact_gpt_oss_fixture() {
    greedy_exactness("gpt-oss-tiny.gguf", Drafts::AsTheyCome);
}

/// GLM-4.5: a leading dense layer, sigmoid-routed experts with a shared expert.
#[test]
fn greedy_speculation_is_exact_glm4moe_fixture() {
    greedy_exactness("glm4moe-tiny.gguf", Drafts::AsTheyCome);
}

/// Multi-head latent attention over a K-only cache, sigmoid-routed experts.
#[test]
fn greedy_speculation_is_exact_deepseek2_fixture() {
    greedy_exactness("deepseek2-tiny.gguf", Drafts::AsTheyCome);
}

/// DeepSeek-V3 style: YaRN and grouped expert selection. One position of the test prompts has a
/// near tie between experts, which the router's F32 product used to break differently in a
/// one-token step (ggml's dot product) and a wider one (llamafile's sgemm): see
/// `FLOAT_MIN_COLS` in `axle-models/src/layers.rs`.
#[test]
fn greedy_speculation_is_exact_deepseek2_v3_fixture() {
    greedy_exactness("deepseek2-v3-tiny.gguf", Drafts::AsTheyCome);
}

/// Hybrid linear attention: a verify step keeps the recurrent state after each of its tokens,
/// and the next step starts from the one the accepted tokens end at.
#[test]
fn greedy_speculation_is_exact_qwen35_fixture() {
    greedy_exactness("qwen35-tiny.gguf", Drafts::AsTheyCome);
}

/// Hybrid linear attention with a tied head (the random model repeats itself): drafts accepted
/// and rejected, so the engine moves each sequence's recurrent state back after rejections.
#[test]
fn greedy_speculation_is_exact_qwen35_tied_fixture() {
    greedy_exactness("qwen35-tied-tiny.gguf", Drafts::AcceptedAndRejected);
}

/// Hybrid linear attention with routed experts.
#[test]
fn greedy_speculation_is_exact_qwen35moe_fixture() {
    greedy_exactness("qwen35moe-tiny.gguf", Drafts::AsTheyCome);
}

/// Qwen3-Next (hybrid, MoE, fused beta/decay projection).
#[test]
fn greedy_speculation_is_exact_qwen3next_fixture() {
    greedy_exactness("qwen3next-tiny.gguf", Drafts::AsTheyCome);
}

#[test]
fn seeded_sampling_with_speculation_matches_plain_sampling() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/llama-tiny.gguf");
    let m = Arc::new(Model::load(&p, &ModelOptions::cpu_repacked(2)).unwrap());
    let prompt = m
        .tokenizer
        .encode(&"alpha beta gamma delta ".repeat(6), true, false);
    let (mut drafted, mut accepted) = (0, 0);
    let mut distinct = std::collections::HashSet::new();
    for seed in 0..200u64 {
        let opts = RequestOptions {
            max_tokens: 12,
            ignore_eos: true,
            sampling: SamplingParams {
                temperature: 4.0,
                seed,
                ..Default::default()
            },
            ..Default::default()
        };
        let plain = run(&m, &cfg(0), std::slice::from_ref(&prompt), &opts);
        let fast = run(&m, &cfg(4), std::slice::from_ref(&prompt), &opts);
        assert_eq!(plain.tokens, fast.tokens, "seed {seed}");
        drafted += fast.drafted;
        accepted += fast.accepted;
        distinct.insert(plain.tokens[0].clone());
    }
    println!(
        "200 seeds identical; {} distinct outputs; drafted {drafted}, accepted {accepted}",
        distinct.len()
    );
    assert!(distinct.len() > 20, "sampling should vary across seeds");
    assert!(
        accepted > 0 && accepted < drafted,
        "drafts should be both accepted and rejected"
    );
}
