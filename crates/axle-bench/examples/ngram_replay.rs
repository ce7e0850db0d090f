//! Replays plain greedy outputs (from the `ngram_traces` example) through the drafter (n-gram and
//! suffix sources over the sequence itself) and
//! its gate with a given verify-cost curve, and prints the decode speed-up each workload would get
//! if steps cost exactly that: a model-free, deterministic way to compare drafting policies before
//! benchmarking them. Beside it, the speed-up of a hindsight choice: at every step the draft length
//! (of the drafter's ungated candidate) that gains most tokens per unit cost, knowing the outcome. `cargo run --release -p axle-bench --example ngram_replay -- TRACES.jsonl
//! 1,1.95,3.8,2.62,4.6` (the cost of verifying k = 0, 1, ... drafts relative to one decode step).
use axle_core::{DraftConfig, Drafter, TokenId};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct Trace {
    workload: String,
    kind: String,
    prompt: Vec<TokenId>,
    output: Vec<TokenId>,
}

/// Simulated (tokens, cost in decode steps, drafted, accepted) of one trace.
fn replay(t: &Trace, cfg: &DraftConfig) -> (usize, f64, usize, usize) {
    let mut d = Drafter::new(&t.prompt, cfg.sources);
    let out = &t.output;
    let (mut i, mut cost) = (0usize, 0.0f64);
    while i < out.len() {
        let room = out.len() - i - 1;
        let draft = if room > 0 {
            d.propose(cfg, room, None, None)
        } else {
            Vec::new()
        };
        let accepted = draft
            .iter()
            .zip(&out[i..])
            .take_while(|(a, b)| a == b)
            .count();
        cost += cfg
            .verify_cost
            .get(draft.len())
            .copied()
            .unwrap_or(f64::NAN);
        d.record(cfg, draft.len(), accepted);
        for &tok in &out[i..i + accepted + 1] {
            d.push(tok);
        }
        i += accepted + 1;
    }
    (out.len(), cost, d.drafted, d.accepted)
}

/// Simulated (tokens, cost) when every step picks its draft length knowing the outcome.
fn hindsight(t: &Trace, cfg: &DraftConfig) -> (usize, f64) {
    let mut d = Drafter::new(&t.prompt, cfg.sources);
    let out = &t.output;
    let (mut i, mut cost) = (0usize, 0.0f64);
    while i < out.len() {
        let room = out.len() - i - 1;
        let cand = d.candidate(cfg.max_len.min(room), None);
        // (tokens per unit cost, cost, accepted) of the best length; 0 drafts is a plain step.
        let mut best = (1.0, 1.0, 0usize);
        for k in 1..=cand.len() {
            let a = cand[..k]
                .iter()
                .zip(&out[i..])
                .take_while(|(x, y)| x == y)
                .count();
            let c = cfg.verify_cost[k];
            if (a + 1) as f64 / c > best.0 {
                best = ((a + 1) as f64 / c, c, a);
            }
        }
        cost += best.1;
        for &tok in &out[i..i + best.2 + 1] {
            d.push(tok);
        }
        i += best.2 + 1;
    }
    (out.len(), cost)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: ngram_replay TRACES.jsonl COST0,COST1,...";
    let traces = std::fs::read_to_string(args.next().ok_or(usage)?)?;
    let costs: Vec<f64> = args
        .next()
        .ok_or(usage)?
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    if costs.len() < 2 || costs[0] != 1.0 {
        return Err("costs start with 1 (k = 0) and give at least k = 1".into());
    }
    let cfg = DraftConfig {
        max_len: costs.len() - 1,
        verify_cost: costs,
        ..Default::default()
    };
    // workload -> (kind, per-trace ratios, hindsight ratios, drafted, accepted)
    type Row = (String, Vec<f64>, Vec<f64>, usize, usize);
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    for line in traces.lines().filter(|l| !l.trim().is_empty()) {
        let t: Trace = serde_json::from_str(line)?;
        let (n, cost, drafted, accepted) = replay(&t, &cfg);
        let r = rows
            .entry(t.workload.clone())
            .or_insert_with(|| (t.kind.clone(), Vec::new(), Vec::new(), 0, 0));
        if n > 0 {
            r.1.push(n as f64 / cost);
            let (n, cost) = hindsight(&t, &cfg);
            r.2.push(n as f64 / cost);
        }
        r.3 += drafted;
        r.4 += accepted;
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "workload\tkind\tspeed-up\thindsight\tdrafted\taccepted (speed-ups: mean over prompts)"
    );
    for (w, (kind, ratios, best, drafted, accepted)) in rows {
        let (r, b) = (mean(&ratios), mean(&best));
        println!("{w}\t{kind}\t{r:.3}\t{b:.3}\t{drafted}\t{accepted}");
    }
    Ok(())
}
