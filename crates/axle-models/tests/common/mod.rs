//! Shared helpers of the model tests: where the real test models live. A missing model fails the
//! test loudly (never a silent skip): run `scripts/fetch-models.sh` first.
#![allow(dead_code)]
use std::path::PathBuf;

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

pub fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("AXLE_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is not set")).join(".cache")
        });
    home.join("axle/models")
}

pub fn model(name: &str) -> PathBuf {
    let p = model_dir().join(name);
    assert!(
        p.is_file(),
        "test model {} is missing: run scripts/fetch-models.sh (or set AXLE_MODEL_DIR)",
        p.display()
    );
    p
}

pub fn fixture(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    assert!(
        p.is_file(),
        "fixture {} is missing: run scripts/make-fixtures.py",
        p.display()
    );
    p
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
