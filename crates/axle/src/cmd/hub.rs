//! Models by name: `axle pull`, `axle list`, `axle rm`, and the resolution of every `--model`
//! that names a Hub repository (`org/repo[:QUANT][@REVISION]`) instead of a file: pulled on
//! first use into the standard Hub cache (`HF_HOME`), found there with `--offline`.
use anyhow::Context;
use axle_hub::{Format, Hub, HubId, Located, ModelRef, Recheck};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::path::Path;

/// `axle pull`.
#[derive(Debug, clap::Args)]
pub struct PullArgs {
    /// `org/repo` (a safetensors repository, or the GGUF repository's preferred quantization),
    /// `org/repo:QUANT` (that GGUF), with `@REVISION` for a branch, tag or commit.
    model: String,
}

/// `axle list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Print the paths a loader opens too.
    #[arg(long)]
    paths: bool,
}

/// `axle rm`.
#[derive(Debug, clap::Args)]
pub struct RmArgs {
    /// `org/repo` (the whole repository) or `org/repo:QUANT` (that GGUF's files).
    model: String,
}

/// Bars on stderr, one per file, for a pull.
struct Bars {
    multi: MultiProgress,
    bar: Option<ProgressBar>,
}

impl Bars {
    fn new() -> Bars {
        Bars {
            multi: MultiProgress::new(),
            bar: None,
        }
    }
}

impl axle_hub::Progress for Bars {
    fn file(&mut self, name: &str, size: u64, done: u64) {
        if let Some(old) = self.bar.take() {
            old.abandon();
        }
        let bar = self.multi.add(ProgressBar::new(size));
        if let Ok(style) = ProgressStyle::with_template(
            "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(name.to_string());
        bar.set_position(done);
        self.bar = Some(bar);
    }

    fn advance(&mut self, bytes: u64) {
        if let Some(b) = &self.bar {
            b.inc(bytes);
        }
    }

    fn done(&mut self, name: &str) {
        match self.bar.take() {
            Some(b) => b.finish(),
            None => {
                let _ = self.multi.println(format!("{name}: cached"));
            }
        }
    }

    fn note(&mut self, message: &str) {
        let _ = self.multi.println(message);
    }
}

fn hub() -> anyhow::Result<Hub> {
    Ok(Hub::from_env()?)
}

fn hub_id(text: &str) -> anyhow::Result<HubId> {
    match ModelRef::parse(text)? {
        ModelRef::Hub(id) => Ok(id),
        ModelRef::Path(_) => Ok(HubId::parse(text)?),
    }
}

/// The model a `--model` names, on this machine ([`axle_hub::locate`]; `--offline` reaches it
/// as HF_HUB_OFFLINE). Runs its requests on a thread of its own, so callers inside an async
/// runtime may call it.
pub fn local(model: &Path) -> anyhow::Result<Located> {
    let text = model.to_string_lossy().into_owned();
    let located = std::thread::scope(|s| {
        s.spawn(|| axle_hub::locate(&text, false, &mut Bars::new()))
            .join()
            .map_err(|_| anyhow::anyhow!("the pull of {text} stopped unexpectedly"))
    })?;
    // Only a Hub id fails here, and a mistyped relative path reads as one: say both.
    located.with_context(|| format!("no file or folder `{text}` here, and as a Hub id"))
}

pub fn pull(a: PullArgs) -> anyhow::Result<()> {
    let id = hub_id(&a.model)?;
    let hub = hub()?;
    if hub.is_offline() {
        anyhow::bail!("`axle pull` needs the network; HF_HUB_OFFLINE or --offline forbids it");
    }
    let pulled = hub.pull(&id, Recheck::Hash, &mut Bars::new())?;
    let size: u64 = pulled
        .files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    println!(
        "{} ({}, {} file{}, {}, {} downloaded)",
        pulled.source(),
        pulled.format.name(),
        pulled.files.len(),
        if pulled.files.len() == 1 { "" } else { "s" },
        indicatif::HumanBytes(size),
        indicatif::HumanBytes(pulled.downloaded),
    );
    println!("{}", pulled.path.display());
    Ok(())
}

/// A cached model's architecture, quantization and whether Axle runs it natively.
fn describe(row: &axle_hub::Listed) -> (String, String, &'static str) {
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    match row.format {
        Format::Gguf => {
            let quant = row.name.rsplit(':').next().unwrap_or("").to_string();
            match axle_models::arch::architecture_of(&row.path()) {
                Ok(arch) => {
                    let native = axle_models::arch::supported().contains(&arch.as_str());
                    (arch, quant, yes_no(native))
                }
                Err(_) => ("unreadable".into(), quant, "no"),
            }
        }
        Format::Safetensors => {
            let config = std::fs::read_to_string(row.path().join("config.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .unwrap_or_default();
            let arch = config["model_type"]
                .as_str()
                .unwrap_or("unknown")
                .to_string();
            let quant = match config
                .get("quantization")
                .or_else(|| config.get("quantization_config"))
            {
                Some(q) => match (q["bits"].as_u64(), q["group_size"].as_u64()) {
                    (Some(b), Some(g)) => format!("{b}-bit g{g}"),
                    (Some(b), None) => format!("{b}-bit"),
                    _ => "quantized".into(),
                },
                None => config
                    .get("torch_dtype")
                    .or_else(|| config.get("dtype"))
                    .and_then(|d| d.as_str())
                    .unwrap_or("?")
                    .to_string(),
            };
            // Native: a family read from folders, in a type read as it is.
            let native = axle_models::arch::architecture_of(&row.path()).is_ok();
            (arch, quant, yes_no(native))
        }
    }
}

pub fn list(a: ListArgs) -> anyhow::Result<()> {
    let hub = hub()?;
    let rows = hub.list();
    if rows.is_empty() {
        println!("no models in {}", hub.cache().root().display());
        return Ok(());
    }
    let table: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            let (arch, quant, native) = describe(r);
            let mut name = r.name.clone();
            if !r.refs.iter().any(|x| x == "main") {
                name.push_str(&format!(
                    "@{}",
                    r.commit.chars().take(12).collect::<String>()
                ));
            }
            [
                name,
                indicatif::HumanBytes(r.size()).to_string(),
                arch,
                quant,
                r.format.name().to_string(),
                native.to_string(),
            ]
        })
        .collect();
    let head = ["NAME", "SIZE", "ARCH", "QUANT", "FORMAT", "NATIVE"];
    let width = |i: usize| {
        table
            .iter()
            .map(|r| r[i].chars().count())
            .chain([head[i].len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..6).map(width).collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    println!("{}", line(&head.map(String::from)));
    for (row, cells) in rows.iter().zip(&table) {
        println!("{}", line(cells));
        if a.paths {
            println!("  {}", row.path().display());
        }
    }
    Ok(())
}

pub fn rm(a: RmArgs) -> anyhow::Result<()> {
    let id = hub_id(&a.model)?;
    let hub = hub()?;
    let removed = hub
        .remove(&id)
        .with_context(|| format!("cannot remove {id}"))?;
    println!(
        "removed {id}: {} file{}, {}",
        removed.files,
        if removed.files == 1 { "" } else { "s" },
        indicatif::HumanBytes(removed.bytes)
    );
    Ok(())
}
