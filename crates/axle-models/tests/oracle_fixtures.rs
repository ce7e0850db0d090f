//! Families with no real weights here, on tiny random-weight fixtures (`scripts/make-fixtures.py`):
//! our graphs against libllama on the same files, five prompts each, logits and greedy continuations.
mod common;

/// One test per fixture: our graph against libllama on the fixture's first `n` prompts of
/// `common::prompts()`, with `n` greedy continuations required identical.
macro_rules! fixture_tests {
    ($($(#[doc = $doc:literal])* $name:ident: $file:literal, $n:literal;)*) => {
        $(
            $(#[doc = $doc])*
            #[test]
            fn $name() {
                let prompts: Vec<String> = common::prompts().into_iter().take($n).collect();
                common::run_oracle_suite_path(&common::fixture($file), &prompts, $n);
            }
        )*
    };
}

fixture_tests! {
    llama_fixture_matches_libllama: "llama-tiny.gguf", 5;
    qwen2_fixture_matches_libllama: "qwen2-tiny.gguf", 5;
    qwen3_fixture_matches_libllama: "qwen3-tiny.gguf", 5;
    /// Mixture of experts with K-quant (Q4_K) experts, softmax top-2 of 8, renormalised weights.
    qwen3moe_fixture_matches_libllama: "qwen3moe-tiny.gguf", 5;
    /// Mixture of experts with a gated shared expert, unnormalised top-2 of 6, QKV biases.
    qwen2moe_fixture_matches_libllama: "qwen2moe-tiny.gguf", 5;
    /// Gemma 4, dense with per-layer embeddings, KV-shared layers, K = V global layers, local and
    /// global heads of different sizes, proportional RoPE; 10 prompts, two past the 16-token
    /// window.
    gemma4_fixture_matches_libllama: "gemma4-tiny.gguf", 10;
    /// Gemma 4 with a dense FFN beside routed experts (merged gate/up, per-expert scales).
    gemma4moe_fixture_matches_libllama: "gemma4moe-tiny.gguf", 10;
    /// Multi-head latent attention (K-only latent cache) with sigmoid-routed experts, a selection
    /// bias and a shared expert (DeepSeek V3 / GLM-4.7-Flash structure).
    deepseek2_fixture_matches_libllama: "deepseek2-tiny.gguf", 10;
    /// DeepSeek-V3 style MLA: full-rank queries, YaRN with the MLA softmax-scale correction,
    /// grouped expert selection.
    deepseek2_v3_fixture_matches_libllama: "deepseek2-v3-tiny.gguf", 10;
    /// Hybrid linear attention: gated delta net layers with their recurrent state, and a gated
    /// full-attention layer with M-RoPE; 10 prompts, the longest in several prefill chunks.
    qwen35_fixture_matches_libllama: "qwen35-tiny.gguf", 10;
    /// The same with routed experts and a gated shared expert.
    qwen35moe_fixture_matches_libllama: "qwen35moe-tiny.gguf", 10;
    /// Qwen3-Next: fused beta/decay projection, key heads repeated per value-head run, NeoX
    /// RoPE.
    qwen3next_fixture_matches_libllama: "qwen3next-tiny.gguf", 10;
    /// gpt-oss: attention sinks, QKV and output biases, alternating sliding-window (16) and global
    /// layers, YaRN RoPE, MXFP4 experts chosen by raw router logits and weighted by a softmax over
    /// the chosen ones, per-expert biases, the clamped SwiGLU; 10 prompts, two past the window.
    gpt_oss_fixture_matches_libllama: "gpt-oss-tiny.gguf", 10;
    /// GLM-4.5: QKV biases, QK norm, partial NeoX RoPE, a leading dense layer, sigmoid-routed
    /// experts with a selection bias, renormalised and scaled weights, an ungated shared expert, and
    /// a multi-token-prediction layer in the file that the next-token graph leaves out.
    glm4moe_fixture_matches_libllama: "glm4moe-tiny.gguf", 10;
}

/// Sliding-window attention (Mistral style) on a one-layer fixture with a 16-token window: the last
/// token's logits over a long prompt must equal libllama's full attention over only the last 16
/// tokens at their true positions (libllama's `llama` graph has no window, so this is how the window
/// is checked against it), and must differ from full attention over the whole prompt.
#[test]
fn sliding_window_matches_truncated_full_attention() {
    use axle_models::{Model, ModelOptions, Runner, RunnerOptions, Sequence};
    use std::sync::Arc;
    let path = common::fixture("mistral-swa-tiny.gguf");
    let model = Arc::new(Model::load(&path, &ModelOptions::cpu_repacked(2)).unwrap());
    assert_eq!(model.family().sliding_window(), Some(16));
    let mut runner = Runner::new(model.clone(), RunnerOptions::like_llama_cpp(1024)).unwrap();
    let mut oracle = common::oracle(&path, 1024);
    let long: Vec<String> = common::prompts()
        .into_iter()
        .filter(|p| model.tokenizer.encode(p, true, false).len() > 16)
        .collect();
    assert!(long.len() >= 5);
    for p in &long {
        let toks = model.tokenizer.encode(p, true, false);
        // The last 16 tokens go in one step, as in the reference, so that both compute their K/V
        // with the same batch shape (matmul kernels differ by batch size, in the last bits).
        let start = toks.len() - 16;
        let mut seq = Sequence::new(&runner);
        seq.feed(&mut runner, &toks[..start]).unwrap();
        let ours = seq.feed(&mut runner, &toks[start..]).unwrap();
        let window: Vec<_> = (start..toks.len())
            .map(|i| (toks[i] as i32, i as i32, 0, i + 1 == toks.len()))
            .collect();
        oracle.clear();
        let windowed = oracle.decode(&window).unwrap().remove(0);
        let all: Vec<i32> = toks.iter().map(|&t| t as i32).collect();
        oracle.clear();
        let full = oracle.prefill(&all, 0).unwrap();
        let d = common::max_abs_diff(&ours, &windowed);
        let d_full = common::max_abs_diff(&ours, &full);
        println!(
            "{} tokens: |ours - window-only reference| {d:.6}, |ours - full attention| {d_full:.4}",
            toks.len()
        );
        assert!(d < 1e-3, "windowed logits differ by {d}");
        assert!(d_full > 1e-2, "the window had no effect");
    }
}
