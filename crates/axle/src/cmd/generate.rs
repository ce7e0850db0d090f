//! `axle generate`: one prompt (plain or chat) through the generator (our engine, or a
//! delegated upstream), streamed to stdout, speeds on stderr; `--parallel N` runs N choices of it
//! together (continuous batching).
use super::{RunArgs, SamplingArgs};
use anyhow::bail;
use axle_models::ChatMessage;
use axle_sdk::{defaults, DraftSource, EventStream, Prompt, StreamEvent};
use std::io::Write;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Plain prompt (continued as is).
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// Optional system message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Run this many choices of the prompt at once (seeds seed, seed+1, ...), continuously
    /// batched.
    #[arg(long, default_value_t = 1,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=defaults::MAX_CHOICES as u64))]
    parallel: usize,
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn run(a: Args) -> anyhow::Result<()> {
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
    let mut req = a.sampling.request(prompt, 0.0);
    req.n = a.parallel;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (generator, report) = a.run.start(a.parallel, a.parallel).await?;
        let t0 = Instant::now();
        let streams = generator.start(&req).await?;
        eprintln!("route: {}", report.summary());
        if a.parallel == 1 {
            for s in streams {
                single(s, t0).await?;
            }
            return Ok(());
        }
        // Several choices: run them together and print each when done.
        let mut total = 0;
        let mut done = Vec::new();
        for s in streams {
            done.push(tokio::spawn(s.collect()));
        }
        for (i, h) in done.into_iter().enumerate() {
            let c = h.await??;
            total += c.finish.usage.map_or(0, |u| u.completion_tokens);
            println!("--- [{i}] ---\n{}", c.text);
        }
        let secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "{} sequences: {} tokens in {:.2} s, {:.1} tok/s aggregate",
            a.parallel,
            total,
            secs,
            total as f64 / secs
        );
        Ok(())
    })
}

/// One stream to stdout as it comes, then its speeds.
async fn single(mut s: EventStream, t0: Instant) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let mut first: Option<Instant> = None;
    let mut n = 0usize;
    while let Some(ev) = s.next().await {
        match ev {
            StreamEvent::Token { text, .. } => {
                first.get_or_insert_with(Instant::now);
                n += 1;
                write!(out, "{text}")?;
                out.flush()?;
            }
            StreamEvent::Error(e) => {
                writeln!(out)?;
                bail!("generation failed: {e}");
            }
            StreamEvent::Done { text, finish, .. } => {
                writeln!(out, "{text}")?;
                // The engine's times where it reports them (a reader of the stream may first run
                // after the generation is done when the model's threads hold every core); else
                // as the stream arrived.
                let ttft = match finish.timing {
                    Some(t) => t.first_token,
                    None => first.map_or(t0.elapsed(), |f| f - t0),
                };
                let decode = match (finish.timing, &finish.usage) {
                    (Some(t), Some(u)) => {
                        u.completion_tokens.saturating_sub(1) as f64
                            / t.decode.as_secs_f64().max(1e-9)
                    }
                    _ => {
                        let dec = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
                        n.saturating_sub(1) as f64 / dec.max(1e-9)
                    }
                };
                // Accepted of drafted tokens, by drafter.
                let drafts = DraftSource::ALL
                    .iter()
                    .map(|&d| {
                        let c = finish.speculation.by_source[d as usize];
                        format!("{} {}/{}", d.name(), c.accepted, c.drafted)
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                match finish.usage {
                    Some(u) => eprintln!(
                        "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {decode:.1} tok/s | drafts accepted: {drafts} | finish: {}",
                        u.prompt_tokens,
                        u.prompt_tokens as f64 / ttft.as_secs_f64(),
                        u.completion_tokens,
                        finish.openai_reason()
                    ),
                    None => eprintln!(
                        "first text after {:.0} ms | {n} pieces, {decode:.1} per s (no token counts reported) | finish: {}",
                        ttft.as_secs_f64() * 1e3,
                        finish.openai_reason()
                    ),
                }
            }
        }
    }
    Ok(())
}
