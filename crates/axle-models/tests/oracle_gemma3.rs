//! Gemma 3 270M (real weights) against libllama: last-position logits and greedy 64-token
//! continuations for ten prompts, including one of ~1,500 tokens, longer than the 512-token
//! sliding window, so local and global attention layers both run past the window.
mod common;

#[test]
fn gemma3_logits_and_greedy_match_libllama() {
    let mut prompts = common::prompts();
    prompts[8] =
        "The history of computing is a story of abstraction layered upon abstraction. ".repeat(116);
    common::run_oracle_suite(common::GEMMA3, &prompts, 9);
}
