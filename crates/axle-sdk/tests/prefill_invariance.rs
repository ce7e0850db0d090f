//! Same request, same tokens: a prompt's greedy continuation does not depend on how its prefill
//! was split into steps. On both real models, 20 prompts of 50 to 1,500 tokens are run cold and
//! alone in 496-token chunks (the reference), then
//! - all together, after the prefix cache was filled with 1, 16 and 64 blocks of each prompt, in
//!   prefill chunks of 16, 64 and 256 tokens respectively, then once more with every block the
//!   scheduler can reuse (all but the last, partial one: 1 to 16 tokens left to prefill);
//! - alone, cold, in 64-token chunks;
//! - together under a KV budget small enough to force preemption (a preempted sequence
//!   recomputes its prompt and generated tokens as prefill chunks).
//!
//! Every case must give the reference's tokens. Each case also checks that it did what it says
//! (tokens served from the cache, preemptions), so the test fails if the set-up stops exercising
//! the path. What makes this hold: batch-invariant kernels, and a row's attention either in ops of
//! at most 63 query rows (ggml's one-pass kernel) or on the arithmetic of ggml's tiled kernel over
//! tiles laid from its sequence's position 0 (see `attention_groups` in `axle_models::runner`).
//! All three host-kernel choices run here: `origin` (the default: prompt rows tiled, generated
//! rows one-pass, so a recomputed sequence mixes both in a chunk), `compatible` (all one-pass)
//! and `tiled`.
//!
//! The warm-up requests that fill the cache are each prompt's prefix and one token the prompt does
//! not continue with, padded with that token to the shortest length of the prompt's class: with
//! `origin` a block is reused only by a request whose prompt is of the same class (length range)
//! as the one that computed it (see `axle_core::SchedulerConfig::prompt_classes`), and a block is
//! reused from a shorter request of that class than the one reusing it.
use axle_models::HostKernels;
use axle_sdk::{EngineConfig, EngineCore, Model, ModelOptions, RequestOptions};
use std::sync::Arc;

/// Prompt lengths in tokens (BOS included): 50 to 1,500, spaced geometrically.
const LENGTHS: [usize; 20] = [
    50, 60, 72, 86, 102, 122, 146, 175, 209, 250, 299, 358, 428, 512, 612, 732, 876, 1048, 1253,
    1500,
];
/// Greedy tokens generated per prompt.
const NEW_TOKENS: usize = 12;
const BLOCK: usize = 16;

/// English prose, code and tables to cut prompts from (the project's own notes).
fn corpus() -> String {
    [
        include_str!("../../../docs/correctness.md"),
        include_str!("../../../docs/speculation.md"),
        include_str!("../../../docs/performance.md"),
    ]
    .concat()
}

fn load(name: &str) -> Arc<Model> {
    let p = axle_models::fetched::model_path(name).unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Model::load(&p, &ModelOptions::cpu(2)).expect("load"))
}

/// The prompts: each a BOS (where the model uses one) and a window of the corpus starting at its
/// own offset.
fn prompts(m: &Model) -> Vec<Vec<u32>> {
    let text = m.tokenizer.encode(&corpus(), false, false);
    let bos = m.tokenizer.encode("", true, false);
    LENGTHS
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let body = len - bos.len();
            assert!(text.len() > body + 20 * 211, "corpus too short");
            let start = i * 211;
            [bos.as_slice(), &text[start..start + body]].concat()
        })
        .collect()
}

fn opts() -> RequestOptions {
    RequestOptions {
        max_tokens: NEW_TOKENS,
        ignore_eos: true,
        ..Default::default()
    }
}

/// What a case produced: each prompt's tokens and cached prompt tokens, and the preemptions seen.
struct Ran {
    tokens: Vec<Vec<u32>>,
    cached: Vec<usize>,
    preemptions: u32,
}

/// Runs `prompts` through a fresh engine, after running each of `warm` (one greedy token) to fill
/// the prefix cache: all at once when `together`, else one after another.
fn run(
    m: &Arc<Model>,
    cfg: &EngineConfig,
    warm: &[Vec<u32>],
    prompts: &[Vec<u32>],
    together: bool,
) -> Ran {
    let mut e = EngineCore::new(m.clone(), cfg).expect("engine");
    run_in(&mut e, warm, prompts, together)
}

/// [`run`] on an engine that may hold a prefix cache already.
fn run_in(e: &mut EngineCore, warm: &[Vec<u32>], prompts: &[Vec<u32>], together: bool) -> Ran {
    let warm_opts = RequestOptions {
        max_tokens: 1,
        ..opts()
    };
    for w in warm.iter().filter(|w| !w.is_empty()) {
        e.add(w.clone(), warm_opts.clone()).expect("add");
        if !together {
            e.drain(|_| {});
        }
    }
    e.drain(|_| {});
    // Runs `live` to the end: each one's tokens and cached prompt tokens.
    let mut preemptions = 0;
    let mut step_all = |e: &mut EngineCore, live: &[u64]| {
        let d = e.drain(|e| {
            for id in live {
                if let Some(s) = e.scheduler().stats(*id) {
                    preemptions = preemptions.max(s.preemptions);
                }
            }
            assert_eq!(e.scheduler().check(), Ok(()));
        });
        live.iter()
            .map(|&id| {
                let tokens = d.tokens.get(&id).cloned().unwrap_or_default();
                let finish = d.finished.get(&id).expect("every request finishes");
                (tokens, finish.usage.map_or(0, |u| u.cached_tokens))
            })
            .collect::<Vec<_>>()
    };
    let results: Vec<(Vec<u32>, usize)> = if together {
        let ids: Vec<u64> = prompts
            .iter()
            .map(|p| e.add(p.clone(), opts()).expect("add"))
            .collect();
        step_all(e, &ids)
    } else {
        prompts
            .iter()
            .flat_map(|p| {
                let id = e.add(p.clone(), opts()).expect("add");
                step_all(e, &[id])
            })
            .collect()
    };
    let (tokens, cached) = results.into_iter().unzip();
    Ran {
        tokens,
        cached,
        preemptions,
    }
}

/// Engine limits: prefill chunks of `chunk` tokens, `seqs` sequences at a time, with
/// `host_kernels`.
fn config(
    host_kernels: HostKernels,
    chunk: usize,
    seqs: usize,
    kv_slots: u32,
    caching: bool,
) -> EngineConfig {
    EngineConfig {
        host_kernels: Some(host_kernels),
        kv_slots,
        block_size: BLOCK as u32,
        max_batch_tokens: chunk + seqs,
        max_seqs: seqs,
        prefix_caching: caching,
        draft_len: 0,
        ..Default::default()
    }
}

/// Every case on the model `name`, with each host-kernel choice in turn:
/// - `origin` (the default);
/// - `compatible`: libllama's decode arithmetic for every row (attention in ops of at most 63
///   rows, K-quant products through the dot product);
/// - `tiled`: the tiled kernels' arithmetic for every row (prefill chunks through ggml's tiled
///   attention and K-quant GEMM; short chunks, decode rows and recomputation through the row
///   attention and tiled-columns ops).
fn check_model(name: &str) {
    let m = load(name);
    let prompts = prompts(&m);
    for host_kernels in [
        HostKernels::Origin,
        HostKernels::Compatible,
        HostKernels::Tiled,
    ] {
        check_host_kernels(&m, &prompts, name, host_kernels);
    }
}

fn check_host_kernels(m: &Arc<Model>, prompts: &[Vec<u32>], name: &str, host_kernels: HostKernels) {
    let name = &format!("{name} ({host_kernels} host kernels)");
    let config =
        |chunk, seqs, kv_slots, caching| config(host_kernels, chunk, seqs, kv_slots, caching);
    let roomy = 32 * 1024;
    let t0 = std::time::Instant::now();
    // The reference: each prompt alone in a fresh engine, cold, in the default's 496-token chunks.
    let reference: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            run(
                m,
                &config(496, 16, 2048, false),
                &[],
                std::slice::from_ref(p),
                false,
            )
            .tokens
            .remove(0)
        })
        .collect();
    assert!(reference.iter().all(|t| t.len() == NEW_TOKENS));
    eprintln!("{name}: reference in {:.1} s", t0.elapsed().as_secs_f64());
    let same = |case: &str, ran: &Ran| {
        for (i, (r, t)) in reference.iter().zip(&ran.tokens).enumerate() {
            assert_eq!(
                r,
                t,
                "{name}: prompt {i} ({} tokens) differs {case}",
                prompts[i].len()
            );
        }
        eprintln!(
            "{name}: {case}: 20/20 identical ({:.1} s)",
            t0.elapsed().as_secs_f64()
        );
    };

    // The prefix cache holding 1, 16 or 64 blocks of each prompt (as many as it can reuse where
    // the prompt is shorter), each case with another prefill chunk size, so that chunks start
    // after cached prefixes of every kind. All 20 prompts run together.
    let cases = [(1, 16), (16, 64), (64, 256)];
    // The shortest prompt length of each prompt's class (0 where the kernels have no classes).
    let classes = host_kernels.prompt_classes();
    let class_start = |len: usize| classes.iter().copied().filter(|&c| c <= len).max();
    let cached_blocks = |blocks: usize| -> Vec<usize> {
        prompts
            .iter()
            .map(|p| blocks.min((p.len() - 1) / BLOCK) * BLOCK)
            .collect()
    };
    let mut last = None;
    for (blocks, chunk) in cases {
        let want = cached_blocks(blocks);
        let warm: Vec<Vec<u32>> = prompts
            .iter()
            .zip(&want)
            .map(|(p, &n)| {
                let other = if p[n] == 13 { 14 } else { 13 };
                let mut w = p[..n].to_vec();
                w.resize((n + 1).max(class_start(p.len()).unwrap_or(0)), other);
                w
            })
            .collect();
        let mut e = EngineCore::new(m.clone(), &config(chunk, 4, roomy, true)).expect("engine");
        let ran = run_in(&mut e, &warm, prompts, true);
        assert_eq!(
            ran.cached, want,
            "{name}: cached prefixes ({blocks} blocks)"
        );
        same(
            &format!("with {blocks} cached blocks, {chunk}-token chunks, together"),
            &ran,
        );
        last = Some(e);
    }
    // Every block it can reuse (all but the last, partial one: 1 to 16 tokens left to prefill):
    // the prompts again, in the engine that just ran them.
    let mut e = last.expect("an engine ran");
    let ran = run_in(&mut e, &[], prompts, true);
    assert_eq!(
        ran.cached,
        cached_blocks(usize::MAX),
        "{name}: cached prefixes (all reusable)"
    );
    same("with all reusable blocks cached, together", &ran);
    // Alone, in 64-token chunks after a cold start: every chunk boundary differs from the
    // reference's.
    same(
        "cold in 64-token chunks, alone",
        &run(m, &config(64, 4, roomy, false), &[], prompts, false),
    );
    // 100 blocks for 4 sequences of up to 95 blocks each: newer ones are preempted and recompute
    // their prompt and generated tokens as prefill chunks.
    let ran = run(m, &config(496, 4, 1600, true), &[], prompts, true);
    assert!(
        ran.preemptions > 0,
        "{name}: the small KV budget preempted nothing"
    );
    same(
        &format!(
            "under preemption ({} at most per request), together",
            ran.preemptions
        ),
        &ran,
    );
}

#[test]
fn smollm2_prefill_splits_give_the_same_tokens() {
    check_model(axle_models::fetched::SMOLLM2);
}

#[test]
fn gemma3_prefill_splits_give_the_same_tokens() {
    check_model(axle_models::fetched::GEMMA3);
}
