//! `axle generate`: one prompt (plain or chat), streamed to stdout, speeds on stderr.
use anyhow::{bail, Context};
use axle_core::{Sampler, SamplingParams};
use axle_models::{default_threads, ChatMessage, Runner, RunnerOptions, Sequence, StreamDecoder};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Plain prompt (continued as is).
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// Optional system message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Top-p (1 = off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Min-p (0 = off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// CPU threads.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Context length (KV slots); default: the model's, capped at 4096.
    #[arg(long)]
    ctx: Option<u32>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let params = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        seed: a.seed,
        ..Default::default()
    };
    params
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid sampling options: {e}"))?;
    let model = Arc::new(super::load_model(&a.model, a.threads)?);
    let prompt = match (&a.prompt, &a.chat) {
        (Some(p), _) => model.tokenizer.encode(p, true, false),
        (None, Some(c)) => {
            let mut msgs = Vec::new();
            if let Some(s) = &a.system {
                msgs.push(ChatMessage::new("system", s));
            }
            msgs.push(ChatMessage::new("user", c));
            model.encode_chat(&msgs)?
        }
        (None, None) => bail!("give --prompt or --chat"),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let ctx = a.ctx.unwrap_or_else(|| model.n_ctx_train().min(4096));
    let kv_slots = ctx.div_ceil(256) * 256;
    if prompt.len() >= ctx as usize {
        bail!(
            "prompt of {} tokens does not fit the context of {} tokens (use --ctx)",
            prompt.len(),
            ctx
        );
    }
    let mut runner = Runner::new(
        model.clone(),
        RunnerOptions {
            kv_slots,
            ..Default::default()
        },
    )?;
    let mut seq = Sequence::new(&runner);
    let mut sampler = Sampler::new(params);
    let tok = &model.tokenizer;
    let t0 = Instant::now();
    let mut logits = seq
        .feed(&mut runner, &prompt)
        .context("prompt processing failed")?;
    let t_prompt = t0.elapsed();
    let mut history = prompt.clone();
    let mut decoder = StreamDecoder::new();
    let mut out = std::io::stdout().lock();
    let t1 = Instant::now();
    let mut generated = 0usize;
    let budget = a.max_tokens.min(ctx as usize - prompt.len());
    while generated < budget {
        let next = sampler.sample(&logits, &history);
        generated += 1;
        if tok.is_eog(next) {
            break;
        }
        history.push(next);
        write!(out, "{}", decoder.push(tok, next))?;
        out.flush()?;
        if generated == budget {
            break;
        }
        logits = seq.feed(&mut runner, &[next])?;
    }
    writeln!(out, "{}", decoder.finish())?;
    let t_dec = t1.elapsed().as_secs_f64();
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s",
        prompt.len(),
        prompt.len() as f64 / t_prompt.as_secs_f64(),
        generated,
        generated as f64 / t_dec.max(1e-9)
    );
    Ok(())
}
