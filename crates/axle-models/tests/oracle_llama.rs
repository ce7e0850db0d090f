//! SmolLM2-135M (llama architecture) against libllama on the same file: last-position logits for
//! ten prompts of 1 to ~1000 tokens, and greedy 64-token continuations.
mod common;

#[test]
fn smollm2_logits_and_greedy_match_libllama() {
    common::run_oracle_suite(common::SMOLLM2, &common::prompts(), 9);
}
