//! `axle`: run local LLMs. Subcommands: generate, chat, serve, tokenize, doctor, bench,
//! rpc-server.
#![forbid(unsafe_code)]

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "axle", version, about = "Axle: a local LLM inference runtime")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt or a chat message, streamed to stdout.
    Generate(cmd::generate::Args),
    /// Chat in the terminal (history, /reset, /quit).
    Chat(cmd::chat::Args),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(cmd::serve::Args),
    /// Print the token ids and pieces of a text.
    Tokenize(cmd::tokenize::Args),
    /// Print what this build can use here (CPU features, threads, ggml backends) and check a model.
    Doctor(cmd::doctor::Args),
    /// Benchmarks against libllama in the same process.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Serve this machine's devices to other processes over ggml's RPC protocol (`--rpc` there).
    RpcServer(cmd::rpc_server::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => cmd::generate::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Bench(b) => cmd::bench::run(b),
        Command::RpcServer(a) => cmd::rpc_server::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
