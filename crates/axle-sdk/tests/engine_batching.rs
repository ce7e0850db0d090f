//! The engine on SmolLM2-135M: batched greedy outputs equal each prompt run alone (prefix cache on
//! and off), a KV budget too small for all requests still completes everything correctly through
//! preemption, and a dropped stream frees its KV.
//!
//! Speculation is off here (`tests/speculation.rs` covers it). Steps are kept small here
//! (`max_batch_tokens: 32`, so prompts prefill in chunks and share steps with decodes);
//! `tests/prefill_invariance.rs` covers long prefill chunks, prefix reuse and preemption on both
//! real models.
use axle_sdk::{
    EngineConfig, EngineCore, GenerateRequest, Model, ModelOptions, RequestOptions, Session,
    StreamEvent,
};
use std::sync::Arc;

fn model() -> Arc<Model> {
    let p = axle_models::fetched::model_path(axle_models::fetched::SMOLLM2)
        .unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Model::load(&p, &ModelOptions::cpu_repacked(2)).expect("load"))
}

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "def add(a, b):\n    return",
    "List three fruits:\n1.",
    "Water boils at a temperature of",
    "In 1969, the first person to walk on the moon was",
    "The quick brown fox",
    "Translate 'good morning' into Spanish:",
    "A haiku about the sea:\n",
];

fn opts(max_tokens: usize) -> RequestOptions {
    RequestOptions {
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

/// Runs prompts together through one engine; returns each request's tokens.
fn run_together(
    m: &Arc<Model>,
    cfg: &EngineConfig,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> (Vec<Vec<u32>>, usize) {
    let mut e = EngineCore::new(m.clone(), cfg).unwrap();
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| e.add(p.clone(), opts(max_tokens)).unwrap())
        .collect();
    let mut max_running = 0;
    let mut d = e.drain(|e| {
        max_running = max_running.max(e.scheduler().n_running());
        assert_eq!(e.scheduler().check(), Ok(()));
    });
    assert_eq!(e.scheduler().pool().in_use(), 0, "KV blocks leaked");
    (d.outputs(&ids), max_running)
}

fn encoded(m: &Model) -> Vec<Vec<u32>> {
    PROMPTS
        .iter()
        .map(|p| m.tokenizer.encode(p, true, false))
        .collect()
}

/// Steps of at most 32 tokens (prompts prefill in chunks and share steps with decodes).
fn small_steps(kv_slots: u32, prefix_caching: bool, draft_len: usize) -> EngineConfig {
    EngineConfig {
        kv_slots,
        prefix_caching,
        max_batch_tokens: 32,
        draft_len,
        ..Default::default()
    }
}

/// Each prompt's tokens, each run in an engine of its own.
fn alone_outputs(
    m: &Arc<Model>,
    cfg: &EngineConfig,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|p| {
            run_together(m, cfg, std::slice::from_ref(p), max_tokens)
                .0
                .remove(0)
        })
        .collect()
}

/// A random-weight fixture written by `scripts/setup-tests.sh`.
fn fixture_model(name: &str) -> Arc<Model> {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    assert!(p.is_file(), "fixture {} is missing", p.display());
    Arc::new(Model::load(&p, &ModelOptions::cpu(2)).expect("load"))
}

#[test]
fn batched_outputs_equal_single_runs_with_and_without_prefix_cache() {
    let m = model();
    let prompts = encoded(&m);
    let alone = alone_outputs(&m, &small_steps(1024, false, 0), &prompts, 32);
    for caching in [false, true] {
        let cfg = small_steps(2048, caching, 0);
        let (together, max_running) = run_together(&m, &cfg, &prompts, 32);
        assert_eq!(max_running, 8, "all eight should run in one batch");
        assert_eq!(together.iter().map(Vec::len).sum::<usize>(), 8 * 32);
        for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
            assert_eq!(
                a, t,
                "prompt {i} ({:?}) differs batched (prefix caching {caching})",
                PROMPTS[i]
            );
        }
    }
}

#[test]
fn exhausted_kv_preempts_and_completes_correctly() {
    preemption_keeps_outputs(model());
}

/// A hybrid model (recurrent state per sequence): a preempted sequence gives its state group back
/// and recomputes its state with its KV when it runs again.
#[test]
fn exhausted_kv_preempts_and_completes_correctly_with_recurrent_state() {
    preemption_keeps_outputs(fixture_model("qwen35-tiny.gguf"));
}

/// A hybrid model with fewer recurrent state slots than requests: the scheduler runs at most
/// that many sequences at once (the others wait for a slot), and each output is the one it has
/// alone, with n-gram speculation off and on.
#[test]
fn hybrid_state_slots_cap_running_sequences() {
    let m = fixture_model("qwen35-tied-tiny.gguf");
    let prompts = encoded(&m);
    for draft_len in [0, 4] {
        let base = EngineConfig {
            verify_cost: Some((0..=8).map(|k| 1.0 + 0.05 * k as f64).collect()),
            ..small_steps(1024, false, draft_len)
        };
        let alone = alone_outputs(&m, &base, &prompts, 24);
        let capped = EngineConfig {
            state_slots: Some(3),
            ..base
        };
        let (together, max_running) = run_together(&m, &capped, &prompts, 24);
        assert_eq!(
            max_running, 3,
            "3 state slots should cap running sequences at 3"
        );
        assert_eq!(
            alone, together,
            "state slots changed outputs (drafts {draft_len})"
        );
    }
}

fn preemption_keeps_outputs(m: Arc<Model>) {
    let prompts = encoded(&m);
    let alone = alone_outputs(&m, &small_steps(1024, false, 0), &prompts, 40);
    // 8 requests need about 8 x 4 blocks of 16 slots at the end; give them 12 blocks.
    let tight = EngineConfig {
        block_size: 16,
        ..small_steps(192, true, 0)
    };
    let (together, _) = run_together(&m, &tight, &prompts, 40);
    assert_eq!(alone, together, "preemption changed outputs");
}

#[test]
fn dropped_streams_cancel_and_free_kv() {
    let m = model();
    let s = Session::new(
        m,
        EngineConfig {
            kv_slots: 2048,
            ..Default::default()
        },
    )
    .unwrap();
    let request = |prompt: &str, max_tokens: usize| {
        let mut r = GenerateRequest::new(prompt).greedy().max_tokens(max_tokens);
        r.ignore_eos = true;
        r
    };
    let mut streams: Vec<_> = (0..6)
        .map(|i| {
            s.start_blocking(&request(PROMPTS[i], 200))
                .unwrap()
                .remove(0)
        })
        .collect();
    for st in streams.iter_mut() {
        for _ in 0..3 {
            assert!(matches!(st.next(), Some(StreamEvent::Token { .. })));
        }
    }
    assert!(s.stats().kv_blocks_used > 0);
    drop(streams);
    // A blocking request afterwards completes, and once it is done no blocks remain in use.
    let t0 = std::time::Instant::now();
    let c = s.generate(&request("Hello", 4)).unwrap();
    assert_eq!(c.finish.usage.map(|u| u.completion_tokens), Some(4));
    // The engine's own times: to the first token, then to the end, within the call's.
    let timing = c.finish.timing.expect("a native request reports its times");
    assert!(timing.first_token + timing.decode <= t0.elapsed());
    for _ in 0..200 {
        if s.stats().kv_blocks_used == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("KV blocks still in use: {:?}", s.stats());
}

/// Prefix reuse on a hybrid model: the state at the end of each prefill chunk that ends on a
/// block boundary is saved; a later request sharing the prefix reuses its KV blocks up to the
/// last such boundary and starts from the saved state. Its output equals a cold run's.
#[test]
fn hybrid_prefix_reuse_restores_the_recurrent_state() {
    let m = fixture_model("qwen35-tiny.gguf");
    // Prefill chunks of 36 - 4 = 32 tokens: each ends on a 16-slot block boundary.
    let cfg = EngineConfig {
        kv_slots: 2048,
        prefix_caching: true,
        max_batch_tokens: 36,
        max_seqs: 4,
        draft_len: 0,
        ..Default::default()
    };
    let shared = "The history of computing is a story of abstraction layered upon abstraction: \
        from switches to gates, from gates to instructions, from instructions to languages. "
        .repeat(3);
    let a = m
        .tokenizer
        .encode(&format!("{shared}Question one?"), true, false);
    let b = m.tokenizer.encode(
        &format!("{shared}And a different second question?"),
        true,
        false,
    );
    let run = |e: &mut EngineCore, prompt: &[u32]| {
        let id = e.add(prompt.to_vec(), opts(24)).unwrap();
        let mut d = e.drain(|_| {});
        let cached = d.finished[&id].usage.map_or(0, |u| u.cached_tokens);
        (d.outputs(&[id]).remove(0), cached)
    };
    let mut warm = EngineCore::new(m.clone(), &cfg).unwrap();
    let (_, a_cached) = run(&mut warm, &a);
    let (b_warm, b_cached) = run(&mut warm, &b);
    let mut cold = EngineCore::new(m.clone(), &cfg).unwrap();
    let (b_cold, b_cold_cached) = run(&mut cold, &b);
    println!(
        "prompt b: {} tokens, {b_cached} from the cache (shared prefix about {} tokens)",
        b.len(),
        m.tokenizer.encode(&shared, true, false).len()
    );
    assert_eq!((a_cached, b_cold_cached), (0, 0));
    assert!(
        b_cached >= 64,
        "the shared prefix was not reused ({b_cached} tokens)"
    );
    assert_eq!(
        b_cached % 32,
        0,
        "reuse must stop at a saved chunk boundary"
    );
    assert_eq!(b_warm, b_cold, "prefix reuse changed the output");
    assert_eq!(warm.scheduler().pool().in_use(), 0);
}
