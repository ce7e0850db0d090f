//! `axle chat`: an interactive terminal chat over a Session (history, /reset, /quit, streaming).
use axle_core::FinishReason;
use axle_models::{default_threads, ChatMessage};
use axle_sdk::{
    EngineConfig, GenerateRequest, Prompt, RequestOptions, SamplingParams, Session, StreamEvent,
};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Optional system message.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// CPU threads.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Context length (tokens).
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// Repack matmul weights for ggml's CPU GEMM kernels. Off by default: where a repacked kernel
    /// handles 4 rows at once (Gemma 3's Q4_K) it rounds differently from one-row decoding, and
    /// n-gram verify steps would then not reproduce plain decoding bit for bit.
    #[arg(long)]
    repack: bool,
    /// Device choice.
    #[command(flatten)]
    device: super::DeviceArgs,
    #[command(flatten)]
    kernels: super::KernelArgs,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let model = Arc::new(super::load_model(&a.model, a.threads, a.repack, &a.device)?);
    model.chat_template()?; // fail now, not at the first message, if there is no template
    let session = Session::new(
        model,
        EngineConfig {
            kv_slots: a.ctx as u32,
            context_len: a.ctx,
            max_seqs: 1,
            kernels: a.kernels.kernels(),
            ..Default::default()
        },
    )?;
    let mut history: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s))
        .collect();
    let base = history.clone();
    eprintln!(
        "chat with {} (/reset clears the history, /quit leaves)",
        a.model.display()
    );
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut seed = 0u64;
    loop {
        write!(out, "> ")?;
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                history = base.clone();
                eprintln!("(history cleared)");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", line));
        seed += 1;
        let req = GenerateRequest {
            prompt: Prompt::Chat(history.clone()),
            options: RequestOptions {
                max_tokens: a.max_tokens,
                sampling: SamplingParams {
                    temperature: a.temperature,
                    seed,
                    ..Default::default()
                },
                ..Default::default()
            },
        };
        let mut reply = String::new();
        match session.stream(req) {
            Err(e) => {
                eprintln!("error: {e}");
                history.pop();
                continue;
            }
            Ok(stream) => {
                for ev in stream {
                    let (text, done) = match ev {
                        StreamEvent::Token { text, .. } => (text, None),
                        StreamEvent::Done { text, reason, .. } => (text, Some(reason)),
                    };
                    write!(out, "{text}")?;
                    out.flush()?;
                    reply.push_str(&text);
                    if let Some(FinishReason::Error(e)) = done {
                        eprintln!("\nerror: {e}");
                    }
                }
            }
        }
        writeln!(out)?;
        history.push(ChatMessage::new("assistant", reply.trim()));
    }
    Ok(())
}
