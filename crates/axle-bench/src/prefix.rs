//! `axle bench prefix`: time to first token of a request whose long prefix is already cached, against
//! the request that filled the cache (prefix caching through the engine).
use crate::stats::synthetic_tokens;
use crate::BenchError;
use axle_models::Model;
use axle_sdk::{EngineConfig, EngineCore, Output, RequestOptions};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The result.
#[derive(Debug, Clone, Serialize)]
pub struct PrefixReport {
    /// Shared prefix tokens.
    pub prefix_tokens: usize,
    /// TTFT of the first request (cold), seconds.
    pub first_ttft_s: f64,
    /// TTFT of the second request (prefix cached), seconds.
    pub second_ttft_s: f64,
    /// Prompt tokens the second request took from the cache.
    pub second_cached_tokens: usize,
    /// second / first.
    pub ratio: f64,
    /// Whether the second request's first tokens equal those of the same request on a fresh
    /// engine (nothing cached).
    pub second_identical_to_cold: bool,
}

/// Tokens generated per request (the first one is timed; all are compared with a cold run).
const TOKENS: usize = 8;

/// Time to first token, prompt tokens served from the cache, and the generated tokens.
fn ttft(e: &mut EngineCore, prompt: Vec<u32>) -> Result<(Duration, usize, Vec<u32>), BenchError> {
    let t = Instant::now();
    let id = e.add(
        prompt,
        RequestOptions {
            max_tokens: TOKENS,
            ignore_eos: true,
            ..Default::default()
        },
    )?;
    let mut first = None;
    let mut cached = 0;
    let mut tokens = Vec::new();
    while e.has_work() {
        for o in e.step() {
            match o {
                Output::Token { id: i, token, .. } if i == id => {
                    tokens.push(token);
                    if first.is_none() {
                        first = Some(t.elapsed())
                    }
                }
                Output::Finished { id: i, finish, .. } if i == id => {
                    cached = finish.usage.map_or(0, |u| u.cached_tokens)
                }
                _ => {}
            }
        }
    }
    Ok((first.unwrap_or_else(|| t.elapsed()), cached, tokens))
}

/// Runs it on `model` (loaded by the caller).
pub fn run(model: &Arc<Model>, prefix_tokens: usize) -> Result<PrefixReport, BenchError> {
    let cfg = EngineConfig {
        kv_slots: (prefix_tokens as u32 + 256).div_ceil(256) * 256 + 256,
        ..Default::default()
    };
    let mut e = EngineCore::new(model.clone(), &cfg)?;
    let n_vocab = model.tokenizer.len();
    let prefix = synthetic_tokens(prefix_tokens, n_vocab, 5);
    // Warm-up on unrelated tokens so both measurements see built graphs and paged-in weights.
    ttft(&mut e, synthetic_tokens(64, n_vocab, 99))?;
    let mut a = prefix.clone();
    a.extend(synthetic_tokens(16, n_vocab, 6));
    let mut b = prefix;
    b.extend(synthetic_tokens(16, n_vocab, 7));
    let (t1, _, _) = ttft(&mut e, a)?;
    let (t2, cached, warm) = ttft(&mut e, b.clone())?;
    let (_, _, cold) = ttft(&mut EngineCore::new(model.clone(), &cfg)?, b)?;
    Ok(PrefixReport {
        second_identical_to_cold: warm == cold,
        prefix_tokens,
        first_ttft_s: t1.as_secs_f64(),
        second_ttft_s: t2.as_secs_f64(),
        second_cached_tokens: cached,
        ratio: t2.as_secs_f64() / t1.as_secs_f64(),
    })
}
