//! Plain greedy outputs of the n-gram workloads as token ids, for studying drafting policies
//! offline: `cargo run --release -p axle-bench --example ngram_traces -- MODEL.gguf WORKLOADS.json
//! [max_tokens]` prints one JSON line per prompt: workload, kind, prompt ids, output ids.
use axle_models::{Model, ModelOptions};
use axle_sdk::{EngineConfig, EngineCore, RequestOptions};
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: ngram_traces MODEL.gguf WORKLOADS.json [max_tokens]";
    let model_path = args.next().ok_or(usage)?;
    let workloads = args.next().ok_or(usage)?;
    let max_tokens: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(128);
    let model = Arc::new(Model::load(&model_path, &ModelOptions::default())?);
    let mut e = EngineCore::new(
        model.clone(),
        &EngineConfig {
            draft_len: 0,
            kv_slots: 4096,
            ..Default::default()
        },
    )?;
    for w in axle_bench::ngram::load_workloads(workloads.as_ref())? {
        for p in &w.prompts {
            let prompt = model.tokenizer.encode(p, true, false);
            let id = e.add(
                prompt.clone(),
                RequestOptions {
                    max_tokens,
                    ..Default::default()
                },
            )?;
            let out = e.drain(|_| {}).outputs(&[id]).remove(0);
            println!(
                "{}",
                serde_json::json!({"workload": w.name, "kind": w.kind, "prompt": prompt, "output": out})
            );
        }
    }
    Ok(())
}
