//! Speculation with sampling keeps the target's distribution, and more: each request's tokens are
//! those plain sampling draws with the same seed. Verification draws every position's token from
//! the target's own distribution with the request's RNG (one draw per emitted token, as plain
//! decoding does) and accepts a draft token only where the draw equals it. Every drafter proposes
//! tokens, not distributions, so this is rejection sampling with a proposal that puts all its mass
//! on the draft token: accepted with the target's probability of that token, and on rejection the
//! token comes from the target's distribution without it.
//!
//! A small Markov "model" (its logits a function of the last token) runs 10,000 seeded requests
//! of 4 tokens, batched, with and without drafts; the outputs must be equal seed by seed, drafts
//! must have been both accepted and rejected, and the first-token and 4-token frequencies must
//! fit the model's exact distribution (a chi-square test at p > 0.01).
use axle_core::{
    DraftConfig, DraftSources, Phase, RequestSpec, RowLogits, SamplingParams, Scheduler,
    SchedulerConfig,
};
use std::collections::HashMap;

const VOCAB: usize = 4;
const SAMPLES: u64 = 10_000;
const TOKENS: usize = 4;

/// Logits after `last`: one likely successor, the others less so.
fn logits(last: u32) -> Vec<f32> {
    (0..VOCAB as u32)
        .map(|v| match (v + VOCAB as u32 - last) % VOCAB as u32 {
            1 => 2.0,
            2 => 0.8,
            0 => 0.3,
            _ => -0.5,
        })
        .collect()
}

fn softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().copied().fold(f32::MIN, f32::max);
    let e: Vec<f64> = l.iter().map(|&x| f64::from(x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// Each seed's output, and the drafted and accepted totals.
fn run(draft: Option<DraftConfig>, prompt: &[u32]) -> (Vec<Vec<u32>>, usize, usize) {
    let mut s = Scheduler::new(SchedulerConfig {
        max_batch_tokens: 512,
        max_seqs: 64,
        n_blocks: 4096,
        block_size: 16,
        context: 64,
        prefix_caching: true,
        reuse_marked_only: false,
        model_id: 1,
        prompt_classes: Vec::new(),
        draft,
        state_slots: None,
        kv_lanes: false,
    });
    let mut ids = Vec::new();
    let (mut drafted, mut accepted) = (0, 0);
    for seed in 0..SAMPLES {
        ids.push(
            s.add(RequestSpec {
                prompt: prompt.to_vec(),
                sampling: SamplingParams {
                    temperature: 1.0,
                    seed,
                    ..Default::default()
                },
                max_tokens: TOKENS,
                stop_tokens: Vec::new(),
                speculation: true,
            })
            .expect("fits"),
        );
    }
    let mut outputs = HashMap::new();
    while s.has_work() {
        let plan = s.schedule();
        // The model reads only the last token of each position's prefix.
        let rows: Vec<Vec<Vec<f32>>> = plan
            .seqs
            .iter()
            .map(|p| p.tokens.iter().map(|&t| logits(t)).collect())
            .collect();
        s.apply(&plan, |i, j| Some(RowLogits::Full(&rows[i][j])));
        for &id in &ids {
            if matches!(s.phase(id), Some(Phase::Finished(_))) && !outputs.contains_key(&id) {
                let st = s.stats(id).expect("known");
                drafted += st.drafted;
                accepted += st.accepted;
                outputs.insert(id, s.generated(id).expect("known").to_vec());
                s.forget(id);
            }
        }
    }
    let out = ids.iter().map(|id| outputs[id].clone()).collect();
    (out, drafted, accepted)
}

/// Pearson's statistic of `counts` against `expected` probabilities over `n` samples, cells
/// expected below 5 merged into one; with its degrees of freedom.
fn chi_square(
    counts: &HashMap<Vec<u32>, u64>,
    expected: &HashMap<Vec<u32>, f64>,
    n: f64,
) -> (f64, usize) {
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut rest_obs, mut rest_exp) = (0.0, 0.0);
    for (k, &p) in expected {
        let obs = counts.get(k).copied().unwrap_or(0) as f64;
        let e = p * n;
        if e < 5.0 {
            rest_obs += obs;
            rest_exp += e;
        } else {
            stat += (obs - e).powi(2) / e;
            cells += 1;
        }
    }
    if rest_exp > 0.0 {
        stat += (rest_obs - rest_exp).powi(2) / rest_exp;
        cells += 1;
    }
    (stat, cells - 1)
}

/// The chi-square distribution's 99th percentile with `k` degrees of freedom (Wilson-Hilferty).
fn critical_99(k: usize) -> f64 {
    let k = k as f64;
    let z = 2.326_347_874;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

#[test]
fn sampled_speculation_draws_what_plain_sampling_draws() {
    // A periodic prompt following the likeliest successor: drafts propose it, and the draws
    // accept them often, not always.
    let prompt: Vec<u32> = (0..24).map(|i| (i % VOCAB) as u32).collect();
    let (plain, d0, _) = run(None, &prompt);
    assert_eq!(d0, 0);
    for sources in [
        DraftSources::parse("ngram").expect("known"),
        DraftSources::parse("suffix").expect("known"),
    ] {
        let cfg = DraftConfig {
            max_len: 4,
            verify_cost: vec![1.0, 1.01, 1.02, 1.03, 1.04],
            sources,
            ..Default::default()
        };
        let (fast, drafted, accepted) = run(Some(cfg), &prompt);
        let same = plain.iter().zip(&fast).filter(|(a, b)| a == b).count();
        assert_eq!(
            same,
            SAMPLES as usize,
            "{}: outputs differ by seed",
            sources.names()
        );
        assert!(
            drafted > 0 && accepted > 0 && accepted < drafted,
            "{} {drafted} {accepted}",
            sources.names()
        );

        // The exact distributions of the first token and of the 4 tokens.
        let last = *prompt.last().expect("prompt");
        let mut first = HashMap::new();
        let mut four: HashMap<Vec<u32>, f64> = HashMap::from([(Vec::new(), 1.0)]);
        for step in 0..TOKENS {
            let mut next = HashMap::new();
            for (seq, p) in &four {
                let l = softmax(&logits(seq.last().copied().unwrap_or(last)));
                for (v, q) in l.iter().enumerate() {
                    let mut s = seq.clone();
                    s.push(v as u32);
                    next.insert(s, p * q);
                }
            }
            four = next;
            if step == 0 {
                first = four.clone();
            }
        }
        let mut c1 = HashMap::new();
        let mut c4 = HashMap::new();
        for out in &fast {
            *c1.entry(out[..1].to_vec()).or_insert(0u64) += 1;
            *c4.entry(out.clone()).or_insert(0u64) += 1;
        }
        for (what, counts, expected) in [("first token", &c1, &first), ("4 tokens", &c4, &four)] {
            let (stat, dof) = chi_square(counts, expected, SAMPLES as f64);
            let crit = critical_99(dof);
            println!(
                "{}: {what}: chi-square {stat:.1} on {dof} degrees of freedom (p > 0.01 below {crit:.1}); {accepted}/{drafted} drafts accepted",
                sources.names()
            );
            assert!(stat < crit, "{}: {what}: {stat} >= {crit}", sources.names());
        }
    }
}
