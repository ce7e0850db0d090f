//! `axle`: run local LLMs. Subcommands: generate, chat, serve, pull, list, rm, tokenize,
//! doctor, bench, rpc-server.
#![forbid(unsafe_code)]

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "axle", version, about = "Axle: a local LLM inference runtime")]
struct Cli {
    /// Never reach the Hub: models named by Hub id come from the cache (as HF_HUB_OFFLINE=1).
    #[arg(long, global = true)]
    offline: bool,
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
    /// Download a model from the Hugging Face Hub (or HF_ENDPOINT) into the Hub cache.
    Pull(cmd::hub::PullArgs),
    /// The models in the Hub cache: name, size, architecture, quantization, native or not.
    List(cmd::hub::ListArgs),
    /// Remove a model (a repository, or one GGUF quantization) from the Hub cache.
    Rm(cmd::hub::RmArgs),
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
    if cli.offline {
        // Read by the Hub client wherever a command resolves a model id; set before any thread
        // starts.
        std::env::set_var("HF_HUB_OFFLINE", "1");
    }
    let result = match cli.command {
        Command::Generate(a) => cmd::generate::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Pull(a) => cmd::hub::pull(a),
        Command::List(a) => cmd::hub::list(a),
        Command::Rm(a) => cmd::hub::rm(a),
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
