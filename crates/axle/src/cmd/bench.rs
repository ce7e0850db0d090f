//! `axle bench ...`: every measurement is a scenario (a manifest, from a file or built from the
//! flags of the quick commands), printed as a table and written as an artifact.
use anyhow::Context;
use axle_bench::scenario::manifest::{
    AgentSpec, BatchedSpec, CompareSpec, ModelSpec, NgramSpec, PrefixSpec, ServerSpec,
    StructuredSpec, Workload,
};
use axle_bench::scenario::{self, report, Artifact, Manifest, RunOptions};
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode tok/s, Axle vs libllama, same process and threads.
    Compare(CompareArgs),
    /// Aggregate decode tok/s at several concurrencies, Axle's engine vs libllama multi-sequence.
    Batched(BatchedArgs),
    /// Time to first token with a cached 1,000-token prefix vs without.
    Prefix(PrefixArgs),
    /// A multi-turn agent session through /v1/messages (a long system prompt with tools): each
    /// turn's time to first token against the first turn's.
    Agent(AgentArgs),
    /// Decode tok/s with n-gram speculation vs plain, on the checked-in workloads.
    Ngram(NgramArgs),
    /// Decode tok/s of JSON-schema answers (masked, forced tokens, with speculation) vs free
    /// decoding on the same prompts, with the mask time per step.
    Structured(StructuredArgs),
    /// A long hostile run through the HTTP server: many clients, random requests, clients that
    /// leave, preemption, a repeated greedy canary and a restart; writes a JSON artifact.
    Soak(SoakArgs),
    /// Decode tok/s of one stream through the HTTP server vs the SDK directly.
    Server(ServerArgs),
    /// N concurrent streaming clients over HTTP against `axle serve`, and against llama.cpp's
    /// `llama-server` on the same file and context budget: output tok/s, time to first token
    /// and inter-token latency p50/p99.
    Serve(ServeArgs),
    /// Runs a manifest: its workload, its checks, one artifact. Exit 1 when a check fails.
    Scenario(ScenarioArgs),
    /// Renders artifacts: Markdown tables and SVG charts, a comparison, the README sections.
    Report(ReportArgs),
    /// Re-checks an artifact against a baseline artifact (regression), without rerunning.
    Check(CheckArgs),
    /// Readiness: CPU features, ggml backends and devices, the oracle, models and their hashes.
    Doctor,
    /// Correctness on a device: logits and greedy output against libllama on the same device,
    /// and speculation on == off (alone and batched). Exit 1 when speculation changes output.
    DeviceCheck(DeviceCheckArgs),
}

#[derive(Debug, clap::Args)]
pub struct DeviceCheckArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Greedy tokens per prompt.
    #[arg(long, default_value_t = 32)]
    continuation: usize,
    /// The KV type of the engine runs (speculation on and off); with `q8_0` the plain runs are
    /// repeated with F16 KV and their greedy outputs compared.
    #[arg(long, default_value_t = axle_models::kv::KvType::F16)]
    kv_type: axle_models::kv::KvType,
    /// Prompts: every prompt of this workloads file (default: the n-gram workloads' prompts and
    /// eight general ones, 20 in all).
    #[arg(long, default_value = "benchmarks/workloads/check.json")]
    workloads: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Device choice.
    #[command(flatten)]
    device: super::DeviceArgs,
}

fn device_check(a: DeviceCheckArgs) -> anyhow::Result<()> {
    let path = super::hub::local(&a.model)?.path;
    let model = std::sync::Arc::new(super::load_model_on(&path, false, &a.device)?);
    let text = std::fs::read_to_string(&a.workloads)
        .with_context(|| format!("cannot read {}", a.workloads.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", a.workloads.display()))?;
    let prompts: Vec<String> = v["workloads"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|w| w["prompts"].as_array().into_iter().flatten())
        .filter_map(|p| p.as_str().map(str::to_string))
        .collect();
    let report = axle_bench::device_check::run(
        &model,
        &prompts,
        &axle_bench::device_check::DeviceCheckOptions {
            continuation: a.continuation,
            threads: a.device.threads,
            kv_type: a.kv_type,
        },
        true,
    )?;
    print!("{}", axle_bench::device_check::render(&report));
    if let Some(out) = &a.output {
        std::fs::write(out, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", out.display()))?;
    }
    let n = report.prompts.len();
    anyhow::ensure!(
        report.speculation_alone_identical == n && report.speculation_batched_identical == n,
        "speculation changed greedy output on this device"
    );
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct ScenarioArgs {
    /// The manifest (TOML or JSON; schema in benchmarks/manifests/README.md).
    #[arg(long)]
    manifest: PathBuf,
    /// The artifact goes to DIR/<scenario>.json.
    #[arg(long, default_value = "bench-artifacts")]
    output_root: PathBuf,
    /// Baseline artifact for the regression check (overrides the manifest's).
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// A llama.cpp `llama-server` binary: n-gram scenarios also run its n-gram speculative modes
    /// on the same prompts.
    #[arg(long, env = "AXLE_LLAMA_SERVER")]
    llama_server: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Artifacts (JSON).
    #[arg(required = true)]
    artifacts: Vec<PathBuf>,
    /// Write NAME.md and NAME.svg per artifact here.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Fill the `<!-- bench:NAME -->` sections of these Markdown files (README, docs/*.md)
    /// from the artifacts.
    #[arg(long, num_args = 1..)]
    readme: Vec<PathBuf>,
    /// Print one table comparing the runs instead of one per run.
    #[arg(long)]
    compare: bool,
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The current artifact.
    #[arg(long)]
    artifact: PathBuf,
    /// The baseline artifact.
    #[arg(long)]
    baseline: PathBuf,
    /// Allowed relative loss per metric.
    #[arg(long, default_value_t = 0.10)]
    tolerance: f64,
}

/// What every quick bench command runs on and where its artifact goes.
#[derive(Debug, clap::Args)]
pub struct QuickTarget {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// The artifact goes to DIR/<scenario>.json.
    #[arg(long, default_value = "bench-artifacts")]
    output_root: PathBuf,
    /// Device choice.
    #[command(flatten)]
    device: super::DeviceArgs,
}

#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// Model, artifact folder and device.
    #[command(flatten)]
    target: QuickTarget,
    /// Tokens per generation.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Repetitions (medians reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// GGUF model file (both servers load it).
    #[arg(long)]
    model: PathBuf,
    /// Clients streaming at once (also `axle serve --max-batch-size` and `llama-server -np`).
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Tokens in each prompt (random token ids, a different prompt per request).
    #[arg(long, default_value_t = 2048)]
    prompt: usize,
    /// Tokens each request generates (end-of-generation ignored).
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Requests each client sends, one after the other.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// llama.cpp's `llama-server` to compare with (same file, same context per sequence and in
    /// all, one slot per client).
    #[arg(long)]
    llama_server: Option<PathBuf>,
    /// An extra argument for `axle serve` (repeat: `--axle-arg=--device --axle-arg=cuda0`).
    #[arg(long = "axle-arg", allow_hyphen_values = true)]
    axle_args: Vec<String>,
    /// An extra argument for `llama-server` (repeat: `--llama-arg=-ngl --llama-arg=999`).
    #[arg(long = "llama-arg", allow_hyphen_values = true)]
    llama_args: Vec<String>,
    /// Seconds a server may take to load the model.
    #[arg(long, default_value_t = 600)]
    startup: u64,
    /// Write the artifact (JSON) here.
    #[arg(long, default_value = "bench-artifacts/serve.json")]
    output: PathBuf,
}

/// The accelerators `nvidia-smi` lists (name, memory, driver), or `cpu`.
fn device_name() -> String {
    std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,memory.total,driver_version",
            "--format=csv,noheader",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .replace('\n', "; ")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "cpu".into())
}

/// What `BIN --version` prints (llama.cpp's tools print their build and commit), and the
/// `COMMIT` file beside it where `scripts/build-llama-tools.sh` wrote one (the source it built).
fn version_of(bin: &std::path::Path) -> String {
    let source = bin
        .parent()
        .and_then(|d| std::fs::read_to_string(d.join("COMMIT")).ok())
        .map(|s| format!("; source: {}", s.trim()))
        .unwrap_or_default();
    let version = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .map(|o| {
            let text = [o.stdout, o.stderr].concat();
            String::from_utf8_lossy(&text)
                .lines()
                .filter(|l| l.contains("version") || l.contains("built with"))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    version + &source
}

fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let path = super::hub::local(&a.model)?.path;
    let bench = axle_bench::serve::ServeBench {
        model: path.clone(),
        axle: std::env::current_exe().context("cannot find the axle binary")?,
        axle_args: a.axle_args,
        llama_server: a.llama_server.clone(),
        llama_args: a.llama_args,
        load: axle_bench::serve::Load {
            clients: a.clients,
            prompt_tokens: a.prompt,
            max_tokens: a.tokens,
            rounds: a.rounds,
        },
        startup: std::time::Duration::from_secs(a.startup.max(1)),
    };
    let report = axle_bench::serve::run(&bench)?;
    let sha = axle_sdk::route::file_sha256(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let artifact = serde_json::json!({
        "scenario": "serve",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "device": device_name(),
        "reference": a.llama_server.as_deref().map(version_of),
        "environment": scenario::environment(0, &path, &sha),
        "report": report,
    });
    if let Some(dir) = a.output.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&a.output, serde_json::to_string_pretty(&artifact)?)
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    let l = report.load;
    println!(
        "{} clients x {} rounds, {}-token prompts, {} tokens each; {}\n\n{}",
        l.clients,
        l.rounds,
        l.prompt_tokens,
        l.max_tokens,
        artifact["device"].as_str().unwrap_or_default(),
        report.table()
    );
    eprintln!("artifact: {}", a.output.display());
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// GGUF model file (not needed with --render).
    #[arg(long, required_unless_present = "render")]
    model: Option<PathBuf>,
    /// Client threads, each with one request in flight.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// KV slots of the engine (small, so that sequences are preempted).
    #[arg(long, default_value_t = 2048)]
    kv_slots: u32,
    /// Share of requests whose client leaves before the answer is complete.
    #[arg(long, default_value_t = 0.25)]
    leave_share: f64,
    /// Share of requests that are hostile: grammar bombs, malformed fields, bodies abandoned
    /// half-sent (each must be refused by name, or cost nothing).
    #[arg(long, default_value_t = 0.1)]
    hostile_share: f64,
    /// Seconds between canary requests.
    #[arg(long, default_value_t = 20)]
    canary_every: u64,
    /// Seed of the clients' choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the JSON artifact goes.
    #[arg(long, default_value = "bench-artifacts/soak.json")]
    output: PathBuf,
    /// Print the table of this artifact instead of running.
    #[arg(long)]
    render: Option<PathBuf>,
    /// Fill this file's `<!-- bench:soak -->` section with the table.
    #[arg(long)]
    readme: Option<PathBuf>,
    /// Device choice.
    #[command(flatten)]
    device: super::DeviceArgs,
}

fn soak(a: SoakArgs) -> anyhow::Result<()> {
    let (report, artifact) = match &a.render {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let artifact: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            let report: axle_bench::soak::SoakReport =
                serde_json::from_value(artifact["report"].clone())
                    .with_context(|| format!("{} is not a soak artifact", path.display()))?;
            (report, artifact)
        }
        None => soak_run(&a)?,
    };
    let env = &artifact["environment"];
    let table = format!(
        "{}\n`{}`; {} threads on {}; commit {}; model sha256 {}\n",
        report.markdown(),
        artifact["command"].as_str().unwrap_or_default(),
        env["threads"],
        env["cpu_model"].as_str().unwrap_or_default(),
        env["git_commit"].as_str().unwrap_or_default(),
        env["model_sha256"].as_str().unwrap_or_default(),
    );
    println!("{table}");
    if let Some(readme) = &a.readme {
        let text = std::fs::read_to_string(readme)
            .with_context(|| format!("cannot read {}", readme.display()))?;
        let by = "`axle bench soak --render` from its artifact";
        let new = axle_bench::scenario::report::fill_section(&text, "soak", by, &table)
            .with_context(|| format!("{} has no <!-- bench:soak --> section", readme.display()))?;
        std::fs::write(readme, new)
            .with_context(|| format!("cannot write {}", readme.display()))?;
    }
    anyhow::ensure!(
        report.sound(),
        "the soak run lost requests, leaked, or changed the canary (see above)"
    );
    Ok(())
}

/// Runs the soak and writes its artifact; returns the report and the artifact.
fn soak_run(a: &SoakArgs) -> anyhow::Result<(axle_bench::soak::SoakReport, serde_json::Value)> {
    anyhow::ensure!(a.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(
        (0.0..=1.0).contains(&a.leave_share),
        "--leave-share must be in [0, 1]"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&a.hostile_share),
        "--hostile-share must be in [0, 1]"
    );
    let path = a
        .model
        .as_deref()
        .context("--model is needed to run a soak")?;
    let path = &super::hub::local(path)?.path;
    let model = std::sync::Arc::new(super::load_model_on(path, false, &a.device)?);
    let spec = axle_bench::soak::SoakSpec {
        clients: a.clients,
        duration: std::time::Duration::from_secs(a.seconds.max(1)),
        kv_slots: a.kv_slots,
        leave_share: a.leave_share,
        hostile_share: a.hostile_share,
        canary_every: std::time::Duration::from_secs(a.canary_every.max(1)),
        seed: a.seed,
    };
    let bar = axle_bench::progress_bar(true, a.seconds.max(1), "seconds of load");
    let r = axle_bench::soak::run(&model, &spec, |s| bar.set_position(s))?;
    bar.finish_and_clear();
    let sha = axle_sdk::route::file_sha256(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let env = scenario::environment(a.device.threads, path, &sha);
    let artifact = serde_json::json!({
        "scenario": "soak",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "environment": env,
        "report": r,
    });
    if let Some(dir) = a.output.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&a.output, serde_json::to_string_pretty(&artifact)?)
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    eprintln!("artifact: {}", a.output.display());
    Ok((r, artifact))
}

#[derive(Debug, clap::Args)]
pub struct StructuredArgs {
    /// Model, artifact folder and device.
    #[command(flatten)]
    target: QuickTarget,
    /// Schema prompts.
    #[arg(long, default_value = "benchmarks/workloads/schemas.json")]
    schemas: PathBuf,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Draft length and repetitions.
    #[command(flatten)]
    runs: SpeculativeRuns,
}

/// The draft length and repetitions of the benches with a speculative mode.
#[derive(Debug, clap::Args)]
pub struct SpeculativeRuns {
    /// Longest draft of the speculative mode.
    #[arg(long, default_value_t = axle_sdk::defaults::DRAFT_LEN,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=axle_sdk::MAX_DRAFT as u64))]
    draft_len: usize,
    /// Repetitions of every prompt.
    #[arg(long, default_value_t = 1)]
    reps: usize,
}

#[derive(Debug, clap::Args)]
pub struct NgramArgs {
    /// Model, artifact folder and device.
    #[command(flatten)]
    target: QuickTarget,
    /// Workload file.
    #[arg(long, default_value = "benchmarks/workloads/ngram.json")]
    workloads: PathBuf,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Draft length and repetitions.
    #[command(flatten)]
    runs: SpeculativeRuns,
    /// A drafter set to compare (`ngram`, `suffix`, `all` or a comma-separated list); give it
    /// several times for one speculative engine each.
    #[arg(long, default_value = "all")]
    drafters: Vec<String>,
    /// Sampling temperature (0: greedy); sampled runs give both modes the same seed.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// A draft model (same vocabulary, same device) for the drafter sets that include `model`.
    #[arg(long)]
    draft_model: Option<PathBuf>,
    /// A llama.cpp `llama-server` binary: also run its n-gram speculative modes on the same
    /// prompts (`--spec-type` each of --llama-server-modes) and print them beside ours.
    #[arg(long, env = "AXLE_LLAMA_SERVER")]
    llama_server: Option<PathBuf>,
    /// llama-server speculative modes to compare with.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ngram-simple,ngram-map-k,ngram-mod"
    )]
    llama_server_modes: Vec<String>,
    /// Repack weights for ggml's GEMM kernels (on Gemma 3's Q4_K the repacked 4-row GEMM rounds
    /// differently from 1-row decode, so speculation is then not bit-exact).
    #[arg(long)]
    repack: bool,
}

#[derive(Debug, clap::Args)]
pub struct BatchedArgs {
    /// Model, artifact folder and device.
    #[command(flatten)]
    target: QuickTarget,
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
    /// Also time the engine with ggml's shape-dependent kernels (what batch invariance costs).
    #[arg(long)]
    fast_kernels: bool,
    /// The exact engine's products on GPUs: `groups` or `wide` (as generate's).
    #[arg(long)]
    device_products: Option<axle_models::device_step::DeviceProducts>,
    /// How the exact engine's decode rows attend on GPUs: `rows` or `paged` (as generate's).
    #[arg(long)]
    device_attention: Option<axle_models::device_step::DeviceAttention>,
    /// How the exact engine's KV cache stores keys and values: `f16` or `q8_0` (as generate's;
    /// libllama's stays F16).
    #[arg(long)]
    kv_type: Option<axle_models::kv::KvType>,
}

#[derive(Debug, clap::Args)]
pub struct PrefixArgs {
    /// Model, artifact folder and device.
    #[command(flatten)]
    target: QuickTarget,
    /// Shared prefix length in tokens.
    #[arg(long, default_value_t = 1000)]
    prefix: usize,
    /// Repetitions (medians reported).
    #[arg(long, default_value_t = 1)]
    reps: usize,
}

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// Model, artifact folder and device.
    #[command(flatten)]
    target: QuickTarget,
    /// Turns of the session.
    #[arg(long, default_value_t = 5)]
    turns: usize,
    /// The system prompt's length in tokens (about; the tools come on top).
    #[arg(long, default_value_t = 2048)]
    system_tokens: usize,
    /// Repetitions (medians reported).
    #[arg(long, default_value_t = 1)]
    reps: usize,
}

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Model, artifact folder and device.
    #[command(flatten)]
    target: QuickTarget,
    /// Prompt lengths to prefill (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![128usize, 512])]
    prefill: Vec<usize>,
    /// Tokens to decode.
    #[arg(long, default_value_t = 128)]
    decode: usize,
    /// Repetitions (medians reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// The exact kernels' arithmetic on the CPU: `origin` (the default), `compatible` or `tiled`
    /// (see `axle generate --help`).
    #[arg(long)]
    host_kernels: Option<axle_models::HostKernels>,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Compare(a) => quick(
            "compare",
            a.target,
            a.reps,
            Workload::Compare(CompareSpec {
                prefill: a.prefill,
                decode: a.decode,
                host_kernels: a.host_kernels.map(|k| k.to_string()),
            }),
            QuickExtras::default(),
        ),
        BenchCommand::Batched(a) => quick(
            "batched",
            a.target,
            a.reps,
            Workload::Batched(BatchedSpec {
                concurrency: a.concurrency,
                prompt_tokens: a.prompt,
                steps: a.steps,
                fast_kernels: a.fast_kernels,
                device_products: a.device_products.map(|p| p.to_string()),
                device_attention: a.device_attention.map(|p| p.to_string()),
                kv_type: a.kv_type.map(|p| p.to_string()),
            }),
            QuickExtras::default(),
        ),
        BenchCommand::Ngram(a) => {
            let workloads = std::fs::canonicalize(&a.workloads)
                .with_context(|| format!("cannot read {}", a.workloads.display()))?;
            if let Some(bin) = &a.llama_server {
                anyhow::ensure!(
                    bin.is_file(),
                    "--llama-server {} is not a file",
                    bin.display()
                );
            }
            quick(
                "ngram",
                a.target,
                a.runs.reps,
                Workload::Ngram(NgramSpec {
                    workloads: workloads.display().to_string(),
                    max_tokens: a.max_tokens,
                    draft_len: a.runs.draft_len,
                    drafters: a.drafters,
                    temperature: a.temperature,
                    draft_model: a
                        .draft_model
                        .map(|p| std::fs::canonicalize(&p).unwrap_or(p).display().to_string()),
                    llama_server_modes: a.llama_server_modes,
                }),
                QuickExtras {
                    llama_server: a.llama_server,
                    repack: a.repack,
                },
            )
        }
        BenchCommand::Structured(a) => {
            let schemas = std::fs::canonicalize(&a.schemas)
                .with_context(|| format!("cannot read {}", a.schemas.display()))?;
            quick(
                "structured",
                a.target,
                a.runs.reps,
                Workload::Structured(StructuredSpec {
                    schemas: schemas.display().to_string(),
                    max_tokens: a.max_tokens,
                    draft_len: a.runs.draft_len,
                }),
                QuickExtras::default(),
            )
        }
        BenchCommand::Server(a) => quick(
            "server",
            a.target,
            a.reps,
            Workload::Server(ServerSpec { tokens: a.tokens }),
            QuickExtras::default(),
        ),
        BenchCommand::Prefix(a) => quick(
            "prefix",
            a.target,
            a.reps,
            Workload::Prefix(PrefixSpec {
                prefix_tokens: a.prefix,
            }),
            QuickExtras::default(),
        ),
        BenchCommand::Agent(a) => quick(
            "agent",
            a.target,
            a.reps,
            Workload::Agent(AgentSpec {
                turns: a.turns,
                system_tokens: a.system_tokens,
            }),
            QuickExtras::default(),
        ),
        BenchCommand::Scenario(a) => {
            let (artifact, written) = scenario::run(
                &a.manifest,
                &RunOptions {
                    output_root: Some(a.output_root),
                    baseline: a.baseline,
                    progress: true,
                    llama_server: a.llama_server,
                },
            )?;
            finish(&artifact, written.as_deref())
        }
        BenchCommand::Report(a) => {
            let runs = a
                .artifacts
                .iter()
                .map(|p| Artifact::load(p))
                .collect::<Result<Vec<_>, _>>()?;
            if a.compare {
                print!("{}", report::comparison(&runs));
            } else {
                for r in &runs {
                    println!("## {}\n\n{}", r.scenario, report::markdown(r));
                }
            }
            if let Some(dir) = &a.output {
                report::write_reports(&runs, dir)?;
                eprintln!("wrote reports (Markdown and SVG) to {}", dir.display());
            }
            for doc in &a.readme {
                let text = std::fs::read_to_string(doc)
                    .with_context(|| format!("cannot read {}", doc.display()))?;
                let (new, filled) = report::fill_readme(&text, &runs);
                std::fs::write(doc, new)?;
                eprintln!(
                    "{}: filled {} sections: {}",
                    doc.display(),
                    filled.len(),
                    filled.join(", ")
                );
            }
            Ok(())
        }
        BenchCommand::Check(a) => {
            let current = Artifact::load(&a.artifact)?;
            let baseline = Artifact::load(&a.baseline)?;
            let c = scenario::check_against(&current, &baseline, a.tolerance, &[]);
            println!(
                "regression: {} ({})",
                if c.passed { "passed" } else { "FAILED" },
                c.detail
            );
            if !c.passed {
                anyhow::bail!("regression check failed");
            }
            Ok(())
        }
        BenchCommand::Doctor => super::doctor::bench_readiness(),
        BenchCommand::Soak(a) => soak(a),
        BenchCommand::Serve(a) => serve(a),
        BenchCommand::DeviceCheck(a) => device_check(a),
    }
}

/// A quick command: the scenario its flags describe, run like any manifest.
/// Options only some quick commands take.
#[derive(Default)]
struct QuickExtras {
    /// A llama-server binary to compare with (n-gram).
    llama_server: Option<PathBuf>,
    /// Repack weights for ggml's GEMM kernels.
    repack: bool,
}

fn quick(
    name: &str,
    target: QuickTarget,
    reps: usize,
    workload: Workload,
    extras: QuickExtras,
) -> anyhow::Result<()> {
    let local = super::hub::local(&target.model)?.path;
    let model = std::fs::canonicalize(&local)
        .with_context(|| format!("cannot open model {}", local.display()))?;
    let stem = model
        .file_stem()
        .map(|s| {
            s.to_string_lossy()
                .replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        })
        .unwrap_or_default();
    let d = target.device;
    let m = Manifest {
        name: format!("{name}-{stem}"),
        description: format!("axle bench {name} (quick command)"),
        model: ModelSpec {
            path: model.display().to_string(),
            threads: d.threads,
            repack: extras.repack,
            device: d.device.to_string(),
            gpu_layers: d.gpu_layers,
            split: d.split,
            rpc: d.rpc,
            oracle_split_mode: None,
            split_mode: (d.split_mode == axle_models::SplitMode::Tensor).then(|| "tensor".into()),
            host_memory: Some(d.host_memory.to_string()),
        },
        route: None,
        workload,
        repetitions: reps,
        checks: Default::default(),
    };
    let artifact = scenario::run_manifest(
        &m,
        Path::new("."),
        &RunOptions {
            output_root: None,
            baseline: None,
            progress: true,
            llama_server: extras.llama_server,
        },
    )?;
    let out = target.output_root.join(format!("{}.json", m.name));
    artifact.save(&out)?;
    finish(&artifact, Some(&out))
}

fn finish(a: &Artifact, written: Option<&Path>) -> anyhow::Result<()> {
    print!("{}", report::markdown(a));
    if let Some(p) = written {
        eprintln!("artifact: {}", p.display());
    }
    if !a.passed {
        anyhow::bail!("scenario {}: a check failed", a.scenario);
    }
    Ok(())
}
