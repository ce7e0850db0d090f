//! A draft model changes no output. Greedy, on the 20 prompts of the exactness checks, each
//! alone and all batched, output with a draft model equals output without, token for token:
//! with the target as its own draft (drafts nearly all accepted: the accept path, KV kept for the
//! accepted tokens) and with another random model of the same vocabulary (drafts nearly all
//! rejected: the rollback path), on fixtures and on SmolLM2. Seeded sampling gives the same tokens
//! with the draft model as without. A draft model of another vocabulary is refused by name.
//!
//! The model's own next-token-prediction head drafts the same way and changes no output either:
//! on the seeds' fixtures whose files carry an MTP block, each prompt alone and all batched, and
//! with prefix caching on (each prompt twice in one engine: the second copy starts from the
//! first's cached blocks and the target state kept at their end); seeded sampling gives the same
//! tokens with the head drafting as without.
use axle_sdk::{
    DraftSource, DraftSources, EngineConfig, EngineCore, Model, ModelOptions, RequestOptions,
    SamplingParams,
};
use std::path::PathBuf;
use std::sync::Arc;

fn model(name: &str) -> Arc<Model> {
    let p = if name.ends_with("-tiny.gguf") {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures")
            .join(name)
    } else {
        axle_models::fetched::model_path(name).unwrap_or_else(|e| panic!("{e}"))
    };
    Arc::new(Model::load(&p, &ModelOptions::cpu(2)).expect("load"))
}

fn prompts(m: &Model) -> Vec<Vec<u32>> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../benchmarks/workloads/check.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w["prompts"].as_array().unwrap().clone())
        .map(|p| m.tokenizer.encode(p.as_str().unwrap(), true, false))
        .collect()
}

/// Only the draft model drafts (n-gram and suffix off), cheap, so that it drafts at every step.
fn cfg(draft: Option<&Arc<Model>>) -> EngineConfig {
    EngineConfig {
        kv_slots: 8192,
        max_batch_tokens: 64,
        max_seqs: 32,
        prefix_caching: false,
        draft_len: if draft.is_some() { 4 } else { 0 },
        verify_cost: Some((0..=4).map(|k| 1.0 + 0.05 * k as f64).collect()),
        drafters: DraftSources::parse("model").unwrap(),
        draft_model: draft.cloned(),
        draft_cost: Some(0.05),
        ..Default::default()
    }
}

/// Outputs, and (drafted, accepted) by the draft model.
fn run(
    m: &Arc<Model>,
    c: &EngineConfig,
    prompts: &[Vec<u32>],
    opts: &RequestOptions,
) -> (Vec<Vec<u32>>, usize, usize) {
    run_by(m, c, prompts, opts, DraftSource::Model)
}

/// Outputs, and (drafted, accepted) by `source`.
fn run_by(
    m: &Arc<Model>,
    c: &EngineConfig,
    prompts: &[Vec<u32>],
    opts: &RequestOptions,
    source: DraftSource,
) -> (Vec<Vec<u32>>, usize, usize) {
    let mut e = EngineCore::new(m.clone(), c).unwrap();
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| e.add(p.clone(), opts.clone()).unwrap())
        .collect();
    let mut d = e.drain(|e| assert_eq!(e.scheduler().check(), Ok(())));
    assert_eq!(e.scheduler().pool().in_use(), 0);
    assert_eq!(e.draft_model_error(), None);
    let by_model: (usize, usize) = ids
        .iter()
        .map(|id| {
            let s = d.finished[id].speculation.by_source[source as usize];
            (s.drafted, s.accepted)
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    (d.outputs(&ids), by_model.0, by_model.1)
}

fn exact_with(target: &str, draft: &str, max_tokens: usize) -> (usize, usize) {
    let m = model(target);
    let dm = if draft == target {
        m.clone()
    } else {
        model(draft)
    };
    let prompts = prompts(&m);
    let opts = RequestOptions {
        max_tokens,
        ..Default::default()
    };
    let (mut drafted, mut accepted) = (0, 0);
    let mut plain = Vec::new();
    for p in &prompts {
        let (a, ..) = run(&m, &cfg(None), std::slice::from_ref(p), &opts);
        let (b, d, acc) = run(&m, &cfg(Some(&dm)), std::slice::from_ref(p), &opts);
        assert_eq!(a, b, "{target} with {draft} as draft model: alone");
        drafted += d;
        accepted += acc;
        plain.push(a[0].clone());
    }
    let (batched, d, acc) = run(&m, &cfg(Some(&dm)), &prompts, &opts);
    assert_eq!(
        plain, batched,
        "{target} with {draft} as draft model: batched"
    );
    println!(
        "{target} drafted by {draft}: 20/20 identical alone and batched; alone {accepted}/{drafted} accepted, batched {acc}/{d}"
    );
    (drafted, accepted)
}

#[test]
fn a_draft_model_of_the_same_weights_is_accepted_and_changes_nothing() {
    let (drafted, accepted) = exact_with("llama-tiny.gguf", "llama-tiny.gguf", 32);
    assert!(
        drafted > 100 && accepted * 10 >= drafted * 9,
        "{accepted}/{drafted}"
    );
}

#[test]
fn a_draft_model_that_disagrees_is_rejected_and_changes_nothing() {
    let (drafted, accepted) = exact_with("llama-tiny.gguf", "qwen2-tiny.gguf", 32);
    assert!(
        drafted > 100 && accepted * 2 < drafted,
        "{accepted}/{drafted}"
    );
}

#[test]
fn a_draft_model_changes_nothing_on_smollm2() {
    let (drafted, accepted) = exact_with(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        24,
    );
    assert!(drafted > 0 && accepted > 0);
}

/// Seeded sampling at temperature 0.7, 12 tokens from one prompt, on 40 seeds: the tokens with
/// `with` equal the tokens with `without`; (drafted, accepted) by `source` with `with`.
fn sampled_alike(
    m: &Arc<Model>,
    without: &EngineConfig,
    with: &EngineConfig,
    source: DraftSource,
) -> (usize, usize) {
    let prompt = m.tokenizer.encode("alpha beta gamma delta", true, false);
    let one = std::slice::from_ref(&prompt);
    let (mut drafted, mut accepted) = (0, 0);
    for seed in 0..40u64 {
        let opts = RequestOptions {
            max_tokens: 12,
            ignore_eos: true,
            sampling: SamplingParams {
                temperature: 0.7,
                seed,
                ..Default::default()
            },
            ..Default::default()
        };
        let (a, ..) = run_by(m, without, one, &opts, source);
        let (b, d, acc) = run_by(m, with, one, &opts, source);
        assert_eq!(a, b, "seed {seed}");
        drafted += d;
        accepted += acc;
    }
    (drafted, accepted)
}

#[test]
fn seeded_sampling_with_a_draft_model_matches_plain_sampling() {
    let m = model("llama-tiny.gguf");
    let (drafted, accepted) = sampled_alike(&m, &cfg(None), &cfg(Some(&m)), DraftSource::Model);
    assert!(accepted > 0 && accepted < drafted, "{accepted}/{drafted}");
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let m = model("llama-tiny.gguf");
    let gemma = model("gemma-3-270m-q4_k_m.gguf");
    let err = EngineCore::new(m, &cfg(Some(&gemma)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("draft model") && err.contains("vocabulary"),
        "{err}"
    );
}

/// Only the MTP head drafts (n-gram and suffix off), priced cheap so that it drafts at every step.
fn mtp_cfg(mtp: bool, prefix_caching: bool) -> EngineConfig {
    EngineConfig {
        kv_slots: 8192,
        max_batch_tokens: 64,
        max_seqs: 32,
        prefix_caching,
        draft_len: if mtp { 3 } else { 0 },
        verify_cost: Some((0..=3).map(|k| 1.0 + 0.05 * k as f64).collect()),
        drafters: DraftSources::parse("mtp").unwrap(),
        draft_cost: Some(0.05),
        ..Default::default()
    }
}

fn mtp_exact(file: &str) {
    let m = model(file);
    assert!(m.family().mtp().is_some(), "{file} carries an MTP block");
    let prompts = prompts(&m);
    let opts = RequestOptions {
        max_tokens: 24,
        ..Default::default()
    };
    let run = |c: &EngineConfig, p: &[Vec<u32>]| run_by(&m, c, p, &opts, DraftSource::Mtp);
    let (mut drafted, mut accepted) = (0, 0);
    let mut plain = Vec::new();
    for p in &prompts {
        let (a, ..) = run(&mtp_cfg(false, false), std::slice::from_ref(p));
        let (b, d, acc) = run(&mtp_cfg(true, false), std::slice::from_ref(p));
        assert_eq!(a, b, "{file}: MTP on == off alone");
        drafted += d;
        accepted += acc;
        plain.push(a[0].clone());
    }
    assert!(
        drafted > 100,
        "{file}: the MTP head drafted {drafted} tokens"
    );
    let (batched, d, acc) = run(&mtp_cfg(true, false), &prompts);
    assert_eq!(plain, batched, "{file}: MTP on, batched == alone");
    assert!(d > 100, "{file}: batched, the MTP head drafted {d} tokens");
    // Each prompt twice in one engine with prefix caching: the second starts from the first's
    // cached blocks.
    let twice: Vec<Vec<u32>> = prompts.iter().chain(&prompts).cloned().collect();
    let (cached, ..) = run(&mtp_cfg(true, true), &twice);
    let want: Vec<Vec<u32>> = plain.iter().chain(&plain).cloned().collect();
    assert_eq!(cached, want, "{file}: MTP on with prefix caching");
    println!(
        "{file}: MTP on == off 20/20 alone and batched; alone {accepted}/{drafted} accepted, batched {acc}/{d}"
    );
}

#[test]
fn the_glm4moe_mtp_head_drafts_and_changes_nothing() {
    mtp_exact("glm4moe-tiny.gguf");
}

#[test]
fn the_qwen35_mtp_head_drafts_and_changes_nothing() {
    mtp_exact("qwen35-mtp-tiny.gguf");
}

#[test]
fn the_qwen35moe_mtp_head_drafts_and_changes_nothing() {
    mtp_exact("qwen35moe-mtp-tiny.gguf");
}

#[test]
fn the_deepseek2_mtp_head_drafts_and_changes_nothing() {
    mtp_exact("deepseek2-mtp-tiny.gguf");
}

#[test]
fn seeded_sampling_with_the_mtp_head_drafting_matches_plain_sampling() {
    let m = model("glm4moe-tiny.gguf");
    let (without, with) = (mtp_cfg(false, false), mtp_cfg(true, false));
    let (drafted, _) = sampled_alike(&m, &without, &with, DraftSource::Mtp);
    assert!(drafted > 100, "the MTP head drafted {drafted} tokens");
}
