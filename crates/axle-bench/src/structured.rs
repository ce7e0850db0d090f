//! `axle bench structured`: what constrained decoding costs and what it gains, same engine, same
//! process, same prompts (the 20 schema prompts of `benchmarks/workloads/schemas.json`), greedy,
//! one request at a time. Four modes per prompt, interleaved:
//! - `free`: no constraint, no speculation (the reference), generating as many tokens as the
//!   `masked` answer to the same prompt (end-of-generation ignored), so both do the same work;
//! - `masked`: the schema, every token sampled under its mask (the mask's cost alone);
//! - `forced`: the schema, tokens the grammar forces emitted without sampling (the default);
//! - `forced+ngram`: the default with n-gram speculation.
//!
//! Decode speed is (tokens - 1) / (time from the first token to the last), summed over prompts.
//! Every constrained answer is checked to parse as JSON; speculation is checked to change no
//! output.
use crate::BenchError;
use axle_models::Model;
use axle_sdk::{
    ChatMessage, Completion, EngineConfig, GenerateRequest, OutputConstraint, Session, StreamEvent,
};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The modes, in the order they run.
pub const MODES: [&str; 4] = ["free", "masked", "forced", "forced+ngram"];

/// One mode's totals over the prompts of one repetition.
#[derive(Debug, Clone, Default)]
pub struct ModeTotals {
    /// Tokens generated.
    pub tokens: usize,
    /// Tokens after the first.
    pub decode_tokens: usize,
    /// Seconds from first to last token.
    pub decode_s: f64,
    /// Masks computed.
    pub masks: u64,
    /// Microseconds computing them.
    pub mask_compute_us: u64,
    /// Microseconds the engine waited on the grammar worker.
    pub mask_wait_us: u64,
    /// Answers that parse as JSON.
    pub valid: usize,
    /// Drafts proposed and accepted.
    pub drafted: usize,
    /// Drafts accepted.
    pub accepted: usize,
}

impl ModeTotals {
    /// Decode tokens per second.
    pub fn tok_s(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_s.max(1e-9)
    }
}

/// The result: per repetition, per mode.
#[derive(Debug, Clone)]
pub struct StructuredResult {
    /// `reps[r][m]`: repetition r, mode [`MODES`]`[m]`.
    pub reps: Vec<Vec<ModeTotals>>,
    /// Prompts.
    pub prompts: usize,
    /// Whether greedy output with speculation equalled `forced` on every prompt.
    pub speculation_identical: bool,
}

/// (prompt, schema) pairs of a schema workload file.
pub fn load_schemas(path: &Path) -> Result<Vec<(String, Value)>, BenchError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| BenchError::Invalid(format!("{}: {e}", path.display())))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| BenchError::Invalid(format!("{}: {e}", path.display())))?;
    let list = v["schemas"]
        .as_array()
        .ok_or_else(|| BenchError::Invalid(format!("{}: no `schemas` list", path.display())))?;
    list.iter()
        .map(|s| match (s["prompt"].as_str(), s.get("schema")) {
            (Some(p), Some(schema)) => Ok((p.to_string(), schema.clone())),
            _ => Err(BenchError::Invalid(format!(
                "{}: each schema needs `prompt` and `schema`",
                path.display()
            ))),
        })
        .collect()
}

fn request(prompt: &str, schema: &Value, mode: &str, max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(vec![ChatMessage::new("user", prompt)])
        .greedy()
        .max_tokens(max_tokens);
    // The small models loop inside numbers and strings without it (see the structured tests).
    r.sampling.repetition_penalty = Some(1.2);
    if mode != "free" {
        r.format = Some(OutputConstraint::JsonSchema {
            schema: schema.clone(),
        });
    }
    r.fast_forward = mode != "masked";
    r.speculation = mode == "forced+ngram";
    r
}

/// Runs one request; returns it and its decode seconds (first token to last).
fn timed(s: &Session, req: &GenerateRequest) -> Result<(Completion, f64), BenchError> {
    let mut streams = s
        .start_blocking(req)
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
    let stream = streams.remove(0);
    let mut c = Completion::empty();
    let mut first: Option<Instant> = None;
    for ev in stream {
        if matches!(ev, StreamEvent::Token { .. }) && first.is_none() {
            first = Some(Instant::now());
        }
        if c.absorb(ev)
            .map_err(|e| BenchError::Invalid(e.to_string()))?
        {
            break;
        }
    }
    let decode = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    Ok((c, decode))
}

/// Runs the modes over the schema prompts `reps` times.
pub fn run(
    model: Arc<Model>,
    schemas: &[(String, Value)],
    max_tokens: usize,
    draft_len: usize,
    reps: usize,
    progress: bool,
) -> Result<StructuredResult, BenchError> {
    // One engine for every mode (speculation is a per-request permission): a second engine's
    // CPU threads would still be spinning when the next mode starts, and slow it.
    let session = Session::new(
        model,
        EngineConfig {
            draft_len,
            ..EngineConfig::default()
        },
    )
    .map_err(|e| BenchError::Invalid(e.to_string()))?;
    let bar = crate::progress_bar(
        progress,
        (reps * schemas.len() * MODES.len()) as u64,
        "structured",
    );
    let mut out = Vec::with_capacity(reps);
    let mut identical = true;
    for _ in 0..reps {
        let mut totals = vec![ModeTotals::default(); MODES.len()];
        for (prompt, schema) in schemas {
            let mut forced_tokens = None;
            let mut masked_len = max_tokens;
            // `masked` first: `free` generates as many tokens.
            for m in [1, 0, 2, 3] {
                let mode = MODES[m];
                let s = &session;
                let mut req = request(prompt, schema, mode, max_tokens);
                if mode == "free" {
                    req.max_tokens = Some(masked_len.max(2));
                    req.ignore_eos = true;
                }
                let (c, decode) = timed(s, &req)?;
                if mode == "masked" {
                    masked_len = c.tokens.len();
                }
                let t = &mut totals[m];
                t.tokens += c.tokens.len();
                t.decode_tokens += c.tokens.len().saturating_sub(1);
                t.decode_s += decode;
                t.masks += c.finish.constraint.masks;
                t.mask_compute_us += c.finish.constraint.compute_us;
                t.mask_wait_us += c.finish.constraint.wait_us;
                t.drafted += c.finish.speculation.drafted;
                t.accepted += c.finish.speculation.accepted;
                if serde_json::from_str::<Value>(&c.text).is_ok() {
                    t.valid += 1;
                }
                match mode {
                    "forced" => forced_tokens = Some(c.tokens.clone()),
                    "forced+ngram" => identical &= forced_tokens.as_ref() == Some(&c.tokens),
                    _ => {}
                }
                bar.inc(1);
            }
        }
        out.push(totals);
    }
    bar.finish_and_clear();
    Ok(StructuredResult {
        reps: out,
        prompts: schemas.len(),
        speculation_identical: identical,
    })
}
