//! Embeddings against libllama's for the same file and pooling (cosine at least 0.9999), and the
//! same embedding for an input alone or in a batch, whatever its chunks (bit for bit): on
//! SmolLM2 with last-token and mean pooling chosen by the caller, and on a Qwen3-shaped embedding
//! fixture whose file names last-token pooling.
use axle_ggml::oracle::{LlamaOracle, OracleOptions};
use axle_sdk::{Embedder, EmbedderConfig, Model, ModelOptions, Pooling};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const TEXTS: [&str; 5] = [
    "The capital of France is Paris.",
    "def add(a, b):\n    return a + b",
    "A haiku about the sea",
    "Water boils at 100 degrees Celsius at sea level.",
    "x",
];

fn fixture(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    assert!(p.is_file(), "fixture {} is missing", p.display());
    p
}

fn smollm2() -> PathBuf {
    axle_models::fetched::model_path(axle_models::fetched::SMOLLM2)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The texts, and one long input (about 700 tokens: chunks of the step budget) from the notes.
fn inputs(m: &Model) -> Vec<Vec<u32>> {
    let mut v: Vec<Vec<u32>> = TEXTS
        .iter()
        .map(|t| m.tokenizer.encode(t, true, false))
        .collect();
    let notes = include_str!("../../../docs/speculation.md");
    let mut long = m.tokenizer.encode(notes, true, false);
    long.truncate(700);
    v.push(long);
    v
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn embedder(m: &Arc<Model>, pooling: Option<Pooling>, step_tokens: usize) -> Embedder {
    Embedder::new(
        m.clone(),
        &EmbedderConfig {
            pooling,
            kv_slots: 4096,
            max_batch_tokens: step_tokens,
            max_seqs: 4,
            ..Default::default()
        },
    )
    .expect("embedder")
}

/// Checks `path` with `pooling` (None: the file's) against libllama, and alone against batched.
fn check(path: &Path, pooling: Option<Pooling>) {
    let m = Arc::new(Model::load(path, &ModelOptions::cpu(2)).expect("load"));
    let inputs = inputs(&m);
    let mut e = embedder(&m, pooling, 512);
    let pooling = e.pooling();
    let alone: Vec<Vec<f32>> = inputs
        .iter()
        .map(|t| {
            e.embed(std::slice::from_ref(t), true)
                .expect("embed")
                .remove(0)
        })
        .collect();
    let mut oracle = LlamaOracle::load(
        path,
        &OracleOptions {
            n_ctx: 2048,
            n_batch: 2048,
            pooling: Some(pooling.llama_type()),
            ..Default::default()
        },
    )
    .expect("oracle");
    let mut worst = 1.0f64;
    for (i, (t, ours)) in inputs.iter().zip(&alone).enumerate() {
        let ids: Vec<i32> = t.iter().map(|&x| x as i32).collect();
        let theirs = oracle.embed(&ids).expect("oracle embedding");
        assert_eq!(ours.len(), theirs.len(), "input {i}: width");
        let c = cosine(ours, &theirs);
        worst = worst.min(c);
        assert!(
            c >= 0.9999,
            "{} ({pooling}): input {i} ({} tokens): cosine {c} with libllama's",
            path.display(),
            t.len()
        );
        let len: f64 = ours.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        assert!(
            (len - 1.0).abs() < 1e-5,
            "input {i}: not normalized ({len})"
        );
    }
    // All together in steps of 64 tokens, four inputs at a time: other chunks, other neighbours.
    let batched = embedder(&m, Some(pooling), 64)
        .embed(&inputs, true)
        .expect("batched");
    assert_eq!(
        batched,
        alone,
        "{} ({pooling}): batched differs",
        path.display()
    );
    eprintln!(
        "{} ({pooling}): {} inputs, worst cosine with libllama {worst:.7}, the same batched",
        path.display(),
        inputs.len()
    );
}

#[test]
fn smollm2_embeddings_match_libllama_with_last_and_mean_pooling() {
    check(&smollm2(), Some(Pooling::Last));
    check(&smollm2(), Some(Pooling::Mean));
}

#[test]
fn an_embedding_models_file_names_its_pooling() {
    let p = fixture("qwen3-embedding-tiny.gguf");
    let m = Model::load(&p, &ModelOptions::cpu(2)).expect("load");
    assert_eq!(m.pooling(), Some(Pooling::Last));
    check(&p, None);
}

#[test]
fn bad_inputs_and_models_without_pooling_are_refused() {
    let m = Arc::new(Model::load(smollm2(), &ModelOptions::cpu(2)).expect("load"));
    assert_eq!(m.pooling(), None);
    let err = Embedder::new(m.clone(), &EmbedderConfig::default()).unwrap_err();
    assert!(err.to_string().contains("pooling"), "{err}");
    let mut e = embedder(&m, Some(Pooling::Last), 512);
    let err = e.embed(&[vec![1], vec![]], true).unwrap_err().to_string();
    assert!(err.contains("input 1 has no tokens"), "{err}");
    let err = e.embed(&[vec![1; 5000]], true).unwrap_err().to_string();
    assert!(err.contains("5000"), "{err}");
    let err = e.embed(&[vec![u32::MAX]], true).unwrap_err().to_string();
    assert!(err.contains("vocabulary"), "{err}");
}
