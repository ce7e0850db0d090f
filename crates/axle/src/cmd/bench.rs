//! `axle bench ...`: benchmark commands (tables with ratios against libllama).
use axle_bench::compare::{self, CompareOptions};
use axle_models::default_threads;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode tok/s, Axle vs libllama, same process and threads.
    Compare(CompareArgs),
    /// Aggregate decode tok/s at several concurrencies, Axle's engine vs libllama multi-sequence.
    Batched(BatchedArgs),
    /// Time to first token with a cached 1,000-token prefix vs without.
    Prefix(PrefixArgs),
    /// Decode tok/s with n-gram speculation vs plain, on the checked-in workloads.
    Ngram(NgramArgs),
    /// Decode tok/s of one stream through the HTTP server vs the SDK directly.
    Server(ServerArgs),
}

#[derive(clap::Args)]
pub struct ServerArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// CPU threads.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Tokens per generation.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Repetitions (medians reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
}

#[derive(clap::Args)]
pub struct NgramArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// CPU threads.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Workload file.
    #[arg(long, default_value = "benchmarks/workloads/ngram.json")]
    workloads: PathBuf,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Longest draft (1 to 8).
    #[arg(long, default_value_t = 4)]
    draft_len: usize,
    /// Repetitions per prompt.
    #[arg(long, default_value_t = 1)]
    reps: usize,
    /// Also write the raw results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct BatchedArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// CPU threads for both engines.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Concurrency levels (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 2, 4, 8, 16])]
    concurrency: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 32)]
    prompt: usize,
    /// Timed decode steps.
    #[arg(long, default_value_t = 64)]
    steps: usize,
    /// Repetitions (medians reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Also write the raw results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct PrefixArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// CPU threads.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Shared prefix length in tokens.
    #[arg(long, default_value_t = 1000)]
    prefix: usize,
}

#[derive(clap::Args)]
pub struct CompareArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// CPU threads for both engines.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Prompt lengths to prefill (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![128usize, 512])]
    prefill: Vec<usize>,
    /// Tokens to decode.
    #[arg(long, default_value_t = 128)]
    decode: usize,
    /// Repetitions (medians reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Also write the raw results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Compare(a) => {
            let report = compare::run(&CompareOptions {
                model: a.model,
                threads: a.threads,
                prefill: a.prefill,
                decode: a.decode,
                reps: a.reps,
                progress: true,
            })?;
            println!(
                "model: {}  threads: {}  reps: {}",
                report.model, report.threads, a.reps
            );
            print!("{}", report.table());
            if let Some(p) = a.json {
                std::fs::write(&p, serde_json::to_string_pretty(&report)?)?;
            }
            Ok(())
        }
        BenchCommand::Batched(a) => {
            let report = axle_bench::batched::run(&axle_bench::batched::BatchedOptions {
                model: a.model,
                threads: a.threads,
                concurrency: a.concurrency,
                prompt: a.prompt,
                steps: a.steps,
                reps: a.reps,
            })?;
            println!(
                "model: {}  threads: {}  prompt: {} tokens  timed decode steps: {}  reps: {}",
                report.model, report.threads, a.prompt, a.steps, a.reps
            );
            print!("{}", report.table());
            if let Some(p) = a.json {
                std::fs::write(&p, serde_json::to_string_pretty(&report)?)?;
            }
            Ok(())
        }
        BenchCommand::Ngram(a) => {
            if !(1..=8).contains(&a.draft_len) {
                anyhow::bail!("--draft-len must be between 1 and 8");
            }
            let r = axle_bench::ngram::run(&axle_bench::ngram::NgramOptions {
                model: a.model,
                threads: a.threads,
                workloads: a.workloads,
                max_tokens: a.max_tokens,
                max_draft: a.draft_len,
                reps: a.reps,
            })?;
            let costs: Vec<String> = r.verify_cost.iter().map(|c| format!("{c:.2}")).collect();
            println!(
                "model: {}  threads: {}  measured verify cost (k = 0..): [{}]",
                r.model,
                r.threads,
                costs.join(", ")
            );
            print!("{}", r.table());
            if let Some(p) = a.json {
                std::fs::write(&p, serde_json::to_string_pretty(&r)?)?;
            }
            Ok(())
        }
        BenchCommand::Server(a) => {
            let r = axle_bench::server::run(&a.model, a.threads, a.tokens, a.reps)?;
            println!(
                "decode tok/s, one stream of {} tokens: SDK {:.1}, server (SSE over loopback) {:.1}, ratio {:.3}",
                a.tokens, r.sdk_median, r.server_median, r.ratio
            );
            Ok(())
        }
        BenchCommand::Prefix(a) => {
            let r = axle_bench::prefix::run(&a.model, a.threads, a.prefix)?;
            println!(
                "shared prefix {} tokens: first request TTFT {:.1} ms, second (cached {} tokens) {:.1} ms, ratio {:.3}",
                r.prefix_tokens,
                r.first_ttft_s * 1e3,
                r.second_cached_tokens,
                r.second_ttft_s * 1e3,
                r.ratio
            );
            Ok(())
        }
    }
}
