//! Shared helpers of the model tests: where the real test models live. A missing model fails the
//! test loudly (never a silent skip): run `scripts/fetch-models.sh` first.
#![allow(dead_code)]
use std::path::PathBuf;

#[allow(unused_imports)]
pub use axle_models::fetched::{GEMMA3, SMOLLM2};

pub fn model(name: &str) -> PathBuf {
    axle_models::fetched::model_path(name).unwrap_or_else(|e| panic!("{e}"))
}

/// `fixtures/<folder>/<name>`, which `script` writes.
fn fixture_in(folder: &str, name: &str, script: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(folder)
        .join(name);
    assert!(p.exists(), "{} is missing: run {script}", p.display());
    p
}

pub fn fixture(name: &str) -> PathBuf {
    fixture_in("", name, "scripts/make-fixtures.py")
}

/// A safetensors folder of `fixtures/hf`, or its GGUF twin (`NAME.gguf`).
pub fn hf_fixture(name: &str) -> PathBuf {
    fixture_in("hf", name, "scripts/make-hf-fixtures.py")
}

/// Prompts of varied lengths and content for oracle comparisons.
pub fn prompts() -> Vec<String> {
    let para = "The history of computing is a story of abstraction layered upon abstraction: \
        from switches to gates, from gates to instructions, from instructions to languages, \
        and from languages to the systems that run our lives. ";
    vec![
        "Hi".to_string(),
        "The capital of France is".to_string(),
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n".to_string(),
        "Translate to French: I would like a cup of coffee, please.".to_string(),
        "1, 2, 3, 5, 8, 13, 21,".to_string(),
        "Once upon a time, in a small village by the sea, there lived an old fisherman who"
            .to_string(),
        "Question: What is the boiling point of water at sea level in Celsius?\nAnswer:"
            .to_string(),
        "{\"name\": \"Ada\", \"languages\": [\"en\", \"fr\"], \"age\":".to_string(),
        para.repeat(4),
        para.repeat(24),
    ]
}

/// Greatest absolute difference between two logit vectors.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Asserts that every difference in `diffs` is zero (bit-identical logits); `what` says what
/// was compared, in the failure message (followed by the differences).
pub fn assert_exact(diffs: &[f32], what: &str) {
    assert!(diffs.iter().all(|&d| d == 0.0), "{what}: {diffs:?}");
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Gap between the best and second-best logit.
pub fn top2_gap(v: &[f32]) -> f32 {
    let b = argmax(v);
    let second = v
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != b)
        .map(|(_, &x)| x)
        .fold(f32::NEG_INFINITY, f32::max);
    v[b] - second
}

use axle_ggml::oracle::{LlamaOracle, OracleOptions};
use axle_models::{LogitRows, Model, ModelOptions, Runner, RunnerOptions, SeqInput, Sequence};
use std::sync::Arc;

const CONTINUATION: usize = 64;

fn greedy_axle(runner: &mut Runner, prompt: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let mut seq = Sequence::new(runner);
    let first = seq.feed(runner, prompt).expect("prefill");
    let mut out = Vec::new();
    let mut logits = first.clone();
    for _ in 0..CONTINUATION {
        let t = argmax(&logits) as u32;
        out.push(t);
        logits = seq.feed(runner, &[t]).expect("decode");
    }
    (first, out)
}

/// libllama on the CPU with `n_ctx` KV cells and its defaults otherwise (flash attention on).
pub fn oracle(path: &std::path::Path, n_ctx: u32) -> LlamaOracle {
    LlamaOracle::load(
        path,
        &OracleOptions {
            n_ctx,
            ..Default::default()
        },
    )
    .expect("oracle")
}

fn greedy_oracle(o: &mut LlamaOracle, prompt: &[u32]) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    o.clear();
    let toks: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let first = o.prefill(&toks, 0).expect("oracle prefill");
    let mut out = Vec::new();
    let mut gaps = Vec::new();
    let mut logits = first.clone();
    for i in 0..CONTINUATION {
        let t = argmax(&logits) as u32;
        gaps.push(top2_gap(&logits));
        out.push(t);
        logits = o
            .decode(&[(t as i32, (prompt.len() + i) as i32, 0, true)])
            .expect("oracle decode")
            .remove(0);
    }
    (first, out, gaps)
}

pub fn run_oracle_suite(model_file: &str, prompts: &[String], min_identical: usize) {
    run_oracle_suite_path(&model(model_file), prompts, min_identical)
}

pub fn run_oracle_suite_path(path: &std::path::Path, prompts: &[String], min_identical: usize) {
    let path = path.to_path_buf();
    let model = Arc::new(Model::load(&path, &ModelOptions::cpu_repacked(2)).expect("load"));
    let mut runner =
        Runner::new(model.clone(), RunnerOptions::like_llama_cpp(2048)).expect("runner");
    let mut oracle = oracle(&path, 2048);
    let mut identical = 0;
    let mut exact = 0;
    let mut worst = 0.0f32;
    println!(
        "{:>6} {:>10} {:>6} {:>9}",
        "tokens", "max|dlogit|", "top1", "greedy64"
    );
    for p in prompts {
        let toks = model.tokenizer.encode(p, true, false);
        let (a_first, a_cont) = greedy_axle(&mut runner, &toks);
        let (o_first, o_cont, gaps) = greedy_oracle(&mut oracle, &toks);
        let d = max_abs_diff(&a_first, &o_first);
        let spread = o_first.iter().cloned().fold(f32::MIN, f32::max)
            - o_first.iter().cloned().fold(f32::MAX, f32::min);
        assert!(
            spread > 1.0,
            "degenerate reference logits (spread {spread})"
        );
        worst = worst.max(d);
        let top1 = argmax(&a_first) == argmax(&o_first);
        let same = a_cont == o_cont;
        if same {
            identical += 1;
        } else {
            let i = a_cont
                .iter()
                .zip(&o_cont)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            println!(
                "  divergence at step {i}: oracle top-2 logit gap there {:.4}",
                gaps[i]
            );
        }
        println!("{:>6} {:>10.2e} {:>6} {:>9}", toks.len(), d, top1, same);
        exact += (d == 0.0) as usize;
        assert!(
            top1 || top2_gap(&o_first) < 0.05,
            "top-1 differs on a clear decision"
        );
        assert!(d < 0.35, "last-position logits differ by {d}");
    }
    println!(
        "identical greedy continuations: {identical}/{}, bit-identical logits {exact}/{}, worst max|dlogit| {worst:.2e}",
        prompts.len(),
        prompts.len()
    );
    // Every family is built from libllama's op sequence: logits must match bit for bit.
    assert_eq!(
        exact,
        prompts.len(),
        "logits not bit-identical on every prompt"
    );
    assert!(
        identical >= min_identical,
        "only {identical}/{} greedy continuations identical",
        prompts.len()
    );
}

/// Text for [`step_logits`].
const STEP_TEXT: &str = "Paged attention keeps each sequence's keys and values in fixed blocks, \
    and a prefix cache lets a later request reuse the blocks of a prompt it shares.";

/// Logits of every row of (for checks that two ways of loading or running a model give the same
/// numbers): the prompt in one step, three decode steps, then a verify step of
/// four tokens (the greedy tokens of the decode steps fed back, as drafts would be).
pub fn step_logits(model: Arc<Model>) -> Vec<Vec<f32>> {
    let mut runner = Runner::new(
        model.clone(),
        RunnerOptions {
            kv_slots: 256,
            ..Default::default()
        },
    )
    .unwrap();
    let table: Vec<u32> = (0..256 / runner.options().block_size).collect();
    let prompt = model.tokenizer.encode(STEP_TEXT, true, false);
    let p = prompt.len() as u32;
    let mut tokens = prompt.clone();
    let mut out = Vec::new();
    let feed = |runner: &mut Runner, tokens: &[u32], from: usize| {
        let step = runner
            .step(&[SeqInput {
                hidden: Vec::new(),
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
    tokens.push(argmax(rows.last().unwrap()) as u32);
    out.extend(rows);
    for _ in 0..3 {
        let rows = feed(&mut runner, &tokens, tokens.len() - 1);
        tokens.push(argmax(&rows[0]) as u32);
        out.extend(rows);
    }
    // Verify: the last four tokens again, over the cache the decode steps wrote.
    out.extend(feed(&mut runner, &tokens, tokens.len() - 4));
    out
}

/// Asserts that two models give the same [`step_logits`], bit for bit (`path`: the model file,
/// for the failure message).
pub fn assert_same_step_logits(a: Arc<Model>, b: Arc<Model>, path: &std::path::Path) {
    let (a, b) = (step_logits(a), step_logits(b));
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let d = max_abs_diff(x, y);
        assert!(d == 0.0, "{}: row {i} differs by {d}", path.display());
    }
}
