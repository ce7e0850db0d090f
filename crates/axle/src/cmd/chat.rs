//! `axle chat`: an interactive terminal chat (history, /reset, /quit, streaming) through the
//! generator: our engine, or a delegated upstream.
use super::{RunArgs, SamplingArgs};
use axle_models::ChatMessage;
use axle_sdk::{Generator, StreamEvent};
use std::io::{BufRead, Write};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Optional system message.
    #[arg(long)]
    system: Option<String>,
}

/// Chat's temperature unless `--temperature` says otherwise.
const CHAT_TEMPERATURE: f32 = 0.7;

pub fn run(a: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (generator, report) = rt.block_on(a.run.start(1, 1))?;
    if let Generator::Native(s) = &generator {
        s.model().chat_template()?; // fail now, not at the first message, if there is none
    }
    let mut history: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s))
        .collect();
    let base = history.clone();
    eprintln!("route: {}", report.summary());
    eprintln!("(/reset clears the history, /quit leaves)");
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut turn = 0u64; // each reply's seed: --seed + its turn
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
        turn += 1;
        let mut sampling = a.sampling.clone();
        sampling.seed = a.sampling.seed.wrapping_add(turn);
        let req = sampling.request(history.clone(), CHAT_TEMPERATURE);
        let reply = rt.block_on(async {
            let mut reply = String::new();
            let mut stream = match generator.start(&req).await {
                Ok(mut s) => s.remove(0),
                Err(e) => return Err(e),
            };
            while let Some(ev) = stream.next().await {
                let (text, reasoning) = match ev {
                    StreamEvent::Token {
                        text, reasoning, ..
                    }
                    | StreamEvent::Done {
                        text, reasoning, ..
                    } => (text, reasoning),
                    StreamEvent::Error(e) => return Err(e),
                };
                // Thinking goes to stderr, dimmed; it is not part of the reply kept in history.
                if !reasoning.is_empty() {
                    eprint!("\x1b[2m{reasoning}\x1b[0m");
                }
                print!("{text}");
                let _ = std::io::stdout().flush();
                reply.push_str(&text);
            }
            Ok(reply)
        });
        println!();
        match reply {
            Ok(reply) => history.push(ChatMessage::new("assistant", reply.trim())),
            Err(e) => {
                eprintln!("error: {e}");
                history.pop();
            }
        }
    }
    Ok(())
}
