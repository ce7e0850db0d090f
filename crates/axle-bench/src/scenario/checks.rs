//! The checks a manifest can ask for, besides regression (in `artifact`): correctness against
//! the libllama oracle or expected text, determinism, and route identity.
use super::manifest::{Correctness, Determinism, Manifest, RouteSpec, Workload};
use super::CheckResult;
use crate::BenchError;
use axle_ggml::oracle::{LlamaOracle, OracleOptions};
use axle_models::{Model, Runner, RunnerOptions, Sequence};
use axle_sdk::{EngineConfig, GenerateRequest, RuntimeReport, SamplingParams, Session};
use std::path::Path;
use std::sync::Arc;

/// The prompts a check uses: its own, else the generate workload's text prompts.
fn prompts_for(m: &Manifest, own: &[String]) -> Result<Vec<String>, BenchError> {
    if !own.is_empty() {
        return Ok(own.to_vec());
    }
    match &m.workload {
        Workload::Generate(g) if !g.prompts.is_empty() => Ok(g.prompts.clone()),
        _ => Err(BenchError::Invalid(
            "this check needs prompts (in the check, or in a generate workload)".into(),
        )),
    }
}

fn session(model: &Arc<Model>, m: &Manifest) -> Result<Session, BenchError> {
    let draft = match &m.workload {
        Workload::Generate(g) if g.ngram => g.draft_len,
        _ => 0,
    };
    let host_kernels = match &m.workload {
        Workload::Compare(c) => c.host_kernels().map_err(BenchError::Invalid)?,
        _ => Default::default(),
    };
    Ok(Session::new(
        model.clone(),
        EngineConfig {
            kv_slots: 4096,
            context: 2048,
            draft_len: draft,
            host_kernels: Some(host_kernels),
            ..Default::default()
        },
    )?)
}

/// Continuations through the engine (EOS ignored, so lengths are fixed).
/// The prompt is tokenized as the workloads do (BOS added, special tokens parsed).
fn greedy(
    s: &Session,
    prompt: &str,
    tokens: usize,
    sampling: SamplingParams,
) -> Result<(Vec<u32>, String), BenchError> {
    let ids = s.model().tokenizer.encode(prompt, true, true);
    let mut req = GenerateRequest::new(ids)
        .with_sampling(&sampling)
        .max_tokens(tokens);
    req.ignore_eos = true;
    let c = s.generate(&req)?;
    Ok((c.tokens, c.text))
}

/// Outputs against libllama (greedy identity and the last-position logit gap) and/or the
/// expected texts.
pub fn correctness(
    m: &Manifest,
    c: &Correctness,
    model: &Arc<Model>,
    path: &Path,
) -> Result<CheckResult, BenchError> {
    let prompts = prompts_for(m, &c.prompts)?;
    let s = session(model, m)?;
    let mut problems = Vec::new();
    let mut found = Vec::new();
    if c.oracle {
        // libllama with flash attention on (its default) is the reference; with it off, libllama
        // rounds otherwise, and how often its greedy output still agrees with itself is the bar:
        // the exact engine gives every attention row the tiled kernel's arithmetic, where
        // libllama decodes with its one-pass kernel, so its tokens may part from libllama's at
        // a close call as libllama's own settings do.
        let load = |flash_attn| {
            LlamaOracle::load(
                path,
                &OracleOptions {
                    n_ctx: 2048,
                    n_threads: m.model.threads,
                    n_gpu_layers: crate::oracle_gpu_layers(model),
                    flash_attn,
                    ..Default::default()
                },
            )
        };
        let mut oracle = load(true)?;
        let mut fa_off = load(false)?;
        let mut runner = Runner::new(model.clone(), RunnerOptions::like_llama_cpp(2048))?;
        let (mut same, mut self_same, mut worst) = (0, 0, 0.0f32);
        let mut parted = Vec::new();
        for p in &prompts {
            let ids = model.tokenizer.encode(p, true, true);
            let (ours, _) = greedy(&s, p, c.greedy_tokens, SamplingParams::greedy())?;
            let (logits, theirs) =
                crate::device_check::greedy_llama(&mut oracle, &ids, c.greedy_tokens)?;
            let (_, theirs_off) =
                crate::device_check::greedy_llama(&mut fa_off, &ids, c.greedy_tokens)?;
            // The last prompt position's logits, libllama's ops (one sequence, no cache)
            // against libllama's: bit for bit.
            let mut seq = Sequence::new(&runner);
            let our_logits = seq.feed(&mut runner, &ids)?;
            let gap = our_logits
                .iter()
                .zip(&logits)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            worst = worst.max(gap);
            self_same += usize::from(theirs_off == theirs);
            if ours == theirs {
                same += 1;
            } else {
                let at = ours.iter().zip(&theirs).take_while(|(a, b)| a == b).count();
                parted.push(format!("token {at} for {p:?}"));
            }
        }
        if same < self_same {
            problems.push(format!(
                "greedy identical to libllama on {same} prompts, fewer than libllama with flash \
                 attention off ({self_same}); parted at {}",
                parted.join(", ")
            ));
        }
        found.push(format!(
            "greedy {same}/{} identical to libllama over {} tokens (libllama flash attention on \
             vs off: {self_same}/{}); max |dlogit| {worst:.5}",
            prompts.len(),
            c.greedy_tokens,
            prompts.len()
        ));
        if let Some(tol) = c.logit_tolerance {
            if worst > tol {
                problems.push(format!("max |dlogit| {worst:.5} over the tolerance {tol}"));
            }
        }
    }
    if !c.expected_text.is_empty() {
        if c.expected_text.len() != prompts.len() {
            return Err(BenchError::Invalid(format!(
                "checks.correctness.expected_text has {} entries for {} prompts",
                c.expected_text.len(),
                prompts.len()
            )));
        }
        let mut same = 0;
        for (p, want) in prompts.iter().zip(&c.expected_text) {
            let (_, got) = greedy(&s, p, c.greedy_tokens, SamplingParams::greedy())?;
            if &got == want {
                same += 1;
            } else {
                problems.push(format!("{p:?}: expected {want:?}, got {got:?}"));
            }
        }
        found.push(format!("expected text {same}/{}", c.expected_text.len()));
    }
    Ok(CheckResult {
        kind: "correctness".into(),
        passed: problems.is_empty(),
        detail: [found, problems].concat().join("; "),
    })
}

/// The same seeded, sampled request twice (in fresh engines) gives the same tokens.
pub fn determinism(
    m: &Manifest,
    d: &Determinism,
    model: &Arc<Model>,
) -> Result<CheckResult, BenchError> {
    let prompts = prompts_for(m, &d.prompts)?;
    let sampling = |i: usize| SamplingParams {
        temperature: d.temperature,
        seed: d.seed + i as u64,
        ..SamplingParams::greedy()
    };
    let runs: Vec<Vec<Vec<u32>>> = (0..2)
        .map(|_| {
            let s = session(model, m)?;
            prompts
                .iter()
                .enumerate()
                .map(|(i, p)| greedy(&s, p, d.tokens, sampling(i)).map(|(t, _)| t))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let same = runs[0].iter().zip(&runs[1]).filter(|(a, b)| a == b).count();
    // A different seed must change something, or the check could not fail.
    let s = session(model, m)?;
    let other = greedy(
        &s,
        &prompts[0],
        d.tokens,
        SamplingParams {
            seed: d.seed.wrapping_add(1_000_003),
            ..sampling(0)
        },
    )?
    .0;
    let seed_matters = other != runs[0][0];
    Ok(CheckResult {
        kind: "determinism".into(),
        // With sampling on, a seed that changes nothing means the check tested nothing.
        passed: same == prompts.len() && (d.temperature == 0.0 || seed_matters),
        detail: format!(
            "{same}/{} prompts gave identical tokens in two runs (temperature {}, {} tokens); \
             another seed {} the output",
            prompts.len(),
            d.temperature,
            d.tokens,
            if seed_matters {
                "changed"
            } else {
                "did not change"
            }
        ),
    })
}

/// The runtime report against the manifest's route.
pub fn route(want: &RouteSpec, got: &RuntimeReport) -> CheckResult {
    let mut problems = Vec::new();
    if want.selected_backend != got.selected_backend {
        problems.push(format!(
            "selected_backend {} (manifest: {})",
            got.selected_backend.name(),
            want.selected_backend.name()
        ));
    }
    if want.support_tier != got.support_tier {
        problems.push(format!(
            "support_tier {:?} (manifest: {:?})",
            got.support_tier, want.support_tier
        ));
    }
    if let Some(h) = &want.model_sha256 {
        if got.model_id != format!("sha256:{h}") {
            problems.push(format!("model {} (manifest: sha256:{h})", got.model_id));
        }
    }
    CheckResult {
        kind: "route".into(),
        passed: problems.is_empty(),
        detail: if problems.is_empty() {
            format!(
                "{} ({:?}), {}",
                got.selected_backend.name(),
                got.support_tier,
                got.model_id
            )
        } else {
            problems.join("; ")
        },
    }
}
