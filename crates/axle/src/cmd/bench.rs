//! `axle bench ...`: benchmark commands (tables with ratios against libllama).
use axle_bench::compare::{self, CompareOptions};
use axle_models::default_threads;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode tok/s, Axle vs libllama, same process and threads.
    Compare(CompareArgs),
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
    }
}
