//! `axle generate`: one prompt (plain or chat) through the engine, streamed to stdout, speeds on
//! stderr; `--parallel N` runs N copies together (continuous batching).
use super::route::{Route, RouteArgs};
use anyhow::bail;
use axle_core::{FinishReason, SamplingParams};
use axle_models::{default_threads, ChatMessage};
use axle_sdk::{EngineConfig, GenerateRequest, Prompt, RequestOptions, Session, StreamEvent};
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    route: RouteArgs,
    #[command(flatten)]
    kernels: super::KernelArgs,
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
    /// Run this many copies of the prompt at once (seeds seed, seed+1, ...), continuously batched.
    #[arg(long, default_value_t = 1)]
    parallel: usize,
    /// N-gram self-speculation (the gate still turns it off where it would not pay).
    #[arg(long, value_enum, default_value_t = Ngram::On)]
    ngram: Ngram,
    /// Longest n-gram draft (1 to 8).
    #[arg(long, default_value_t = 4)]
    draft_len: usize,
}

/// Speculation switch.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Ngram {
    On,
    Off,
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
    if a.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if !(1..=8).contains(&a.draft_len) {
        bail!("--draft-len must be between 1 and 8");
    }
    let prompt = match (&a.prompt, &a.chat) {
        (Some(p), _) => Prompt::Text(p.clone()),
        (None, Some(c)) => {
            let mut msgs = Vec::new();
            if let Some(s) = &a.system {
                msgs.push(ChatMessage::new("system", s));
            }
            msgs.push(ChatMessage::new("user", c));
            Prompt::Chat(msgs)
        }
        (None, None) => bail!("give --prompt or --chat"),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (route, report) = rt.block_on(a.route.resolve(a.threads))?;
    let model = match route {
        Route::Native(m) => Arc::new(*m),
        Route::Delegated(up) => {
            eprintln!("route: {}", report.summary());
            if a.parallel != 1 {
                bail!("--parallel is served by the native backend only");
            }
            if a.kernels.kernels != super::KernelChoice::Exact {
                bail!("--kernels applies to the native backend only");
            }
            return rt.block_on(delegated(&up, prompt, &a));
        }
    };
    let ctx = a.ctx.unwrap_or_else(|| model.n_ctx_train().min(4096)) as usize;
    let cfg = EngineConfig {
        kv_slots: (ctx * a.parallel) as u32,
        context_len: ctx,
        max_seqs: a.parallel.max(1),
        max_draft: if a.ngram == Ngram::On { a.draft_len } else { 0 },
        kernels: a.kernels.kernels(),
        ..Default::default()
    };
    let session = Session::new(model.clone(), cfg)?;
    let n_prompt = session.prompt_tokens(&prompt)?.len();
    if n_prompt == 0 {
        bail!("the prompt is empty");
    }
    if n_prompt >= ctx {
        bail!("prompt of {n_prompt} tokens does not fit the context of {ctx} tokens (use --ctx)");
    }
    let t0 = Instant::now();
    let streams = (0..a.parallel)
        .map(|i| {
            let mut sampling = params.clone();
            sampling.seed = params.seed.wrapping_add(i as u64);
            session.stream(GenerateRequest {
                prompt: prompt.clone(),
                options: RequestOptions {
                    sampling,
                    max_tokens: a.max_tokens,
                    ..Default::default()
                },
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if a.parallel == 1 {
        let mut out = std::io::stdout().lock();
        let mut first: Option<Instant> = None;
        let mut n = 0usize;
        for ev in streams.into_iter().next().into_iter().flatten() {
            match ev {
                StreamEvent::Token { text, .. } => {
                    first.get_or_insert_with(Instant::now);
                    n += 1;
                    write!(out, "{text}")?;
                    out.flush()?;
                }
                StreamEvent::Done {
                    text,
                    reason,
                    prompt_tokens,
                    completion_tokens,
                    drafted,
                    accepted,
                    ..
                } => {
                    writeln!(out, "{text}")?;
                    if let FinishReason::Error(e) = reason {
                        bail!("generation failed: {e}");
                    }
                    let ttft = first.map_or(t0.elapsed(), |f| f - t0);
                    let dec = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
                    eprintln!("route: {}", report.summary());
                    eprintln!(
                        "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s | ngram: {} drafted, {} accepted",
                        prompt_tokens,
                        prompt_tokens as f64 / ttft.as_secs_f64(),
                        completion_tokens,
                        n.saturating_sub(1) as f64 / dec.max(1e-9),
                        drafted,
                        accepted
                    );
                }
            }
        }
        return Ok(());
    }
    // Several sequences: run them together and print each when done.
    let handles: Vec<_> = streams
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let mut n = 0;
                for ev in s {
                    match ev {
                        StreamEvent::Token { text: t, .. } => {
                            n += 1;
                            text.push_str(&t);
                        }
                        StreamEvent::Done { text: t, .. } => text.push_str(&t),
                    }
                }
                (text, n)
            })
        })
        .collect();
    let mut total = 0;
    for (i, h) in handles.into_iter().enumerate() {
        let (text, n) = h
            .join()
            .map_err(|_| anyhow::anyhow!("a stream reader panicked"))?;
        total += n;
        println!("--- [{i}] ---\n{text}");
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("route: {}", report.summary());
    eprintln!(
        "{} sequences: {} tokens in {:.2} s, {:.1} tok/s aggregate",
        a.parallel,
        total,
        secs,
        total as f64 / secs
    );
    Ok(())
}

/// Generation through an upstream server, streamed to stdout.
async fn delegated(up: &axle_sdk::Upstream, prompt: Prompt, a: &Args) -> anyhow::Result<()> {
    use axle_sdk::delegate::DelegatedChunk;
    use axle_sdk::{DelegatedInput, DelegatedRequest};
    let input = match prompt {
        Prompt::Text(t) => DelegatedInput::Text(t),
        Prompt::Chat(m) => DelegatedInput::Chat(m),
        Prompt::Tokens(_) => bail!("delegated backends take text, not token ids"),
    };
    // Only what the user set (or our CLI's defaults that differ from OpenAI's) goes upstream.
    let req = DelegatedRequest {
        temperature: Some(a.temperature),
        top_p: (a.top_p != 1.0).then_some(a.top_p),
        top_k: (a.top_k != 0).then_some(a.top_k),
        min_p: (a.min_p != 0.0).then_some(a.min_p),
        repetition_penalty: (a.repetition_penalty != 1.0).then_some(a.repetition_penalty),
        seed: Some(a.seed),
        max_tokens: Some(a.max_tokens),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut stream = up.stream(&input, &req).await?;
    let mut out = std::io::stdout().lock();
    let (mut first, mut usage, mut reason) = (None, None, None);
    while let Some(ev) = stream.next().await {
        match ev? {
            DelegatedChunk::Text(t) => {
                first.get_or_insert_with(Instant::now);
                write!(out, "{t}")?;
                out.flush()?;
            }
            DelegatedChunk::Finish(r) => reason = Some(r),
            DelegatedChunk::Usage {
                prompt_tokens,
                completion_tokens,
            } => usage = Some((prompt_tokens, completion_tokens)),
        }
    }
    writeln!(out)?;
    let ttft = first.map_or(t0.elapsed(), |f| f - t0);
    let total = t0.elapsed();
    match usage {
        Some((p, c)) => eprintln!(
            "upstream: prompt {p} tokens, first text after {:.0} ms | {c} tokens in {:.2} s ({:.1} tok/s end to end) | finish: {}",
            ttft.as_secs_f64() * 1e3,
            total.as_secs_f64(),
            c as f64 / total.as_secs_f64(),
            reason.as_deref().unwrap_or("?")
        ),
        None => eprintln!(
            "upstream: first text after {:.0} ms, done in {:.2} s (no token counts reported) | finish: {}",
            ttft.as_secs_f64() * 1e3,
            total.as_secs_f64(),
            reason.as_deref().unwrap_or("?")
        ),
    }
    Ok(())
}
