//! Models by name: `axle pull`, `axle list`, `axle rm`, and the resolution of every `--model`
//! that names a Hub repository (`org/repo[:QUANT][@REVISION]`) instead of a file: pulled on
//! first use into the standard Hub cache (`HF_HOME`), found there with `--offline`.
use anyhow::Context;
use axle_hub::{Format, Hub, HubId, ModelRef, Recheck};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

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

/// A model on this machine, and where it came from.
#[derive(Debug, Clone)]
pub struct Local {
    /// What a loader opens.
    pub path: PathBuf,
    /// `hf:org/repo@commit` or `file:PATH`.
    pub source: String,
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

/// The model a `--model` names, on this machine: a path as it is, a Hub id pulled (or found in
/// the cache with `--offline`). Runs its requests on a thread of its own, so callers inside an
/// async runtime may call it.
pub fn local(model: &Path) -> anyhow::Result<Local> {
    let text = model.to_string_lossy().into_owned();
    let id = match ModelRef::parse(&text)? {
        ModelRef::Path(path) => {
            let abs = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            return Ok(Local {
                source: format!("file:{}", abs.display()),
                path,
            });
        }
        ModelRef::Hub(id) => id,
    };
    let pulled = std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<axle_hub::Pulled> {
            Ok(hub()?.resolve(&id, &mut Bars::new())?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the pull of {id} stopped unexpectedly"))?
    });
    // A mistyped relative path reads as a Hub id: say both.
    let pulled =
        pulled.with_context(|| format!("no file or folder `{text}` here, and as a Hub id"))?;
    Ok(Local {
        source: pulled.source(),
        path: pulled.path,
    })
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

/// The architecture and whether Axle runs it natively.
fn architecture(row: &axle_hub::Listed) -> (String, &'static str) {
    match row.format {
        Format::Gguf => match axle_models::arch::architecture_of(&row.path()) {
            Ok(arch) => {
                let native = axle_models::arch::supported().contains(&arch.as_str());
                (arch, if native { "yes" } else { "no" })
            }
            Err(_) => ("unreadable".into(), "no"),
        },
        Format::Safetensors => {
            let config = row.path().join("config.json");
            let arch = std::fs::read_to_string(config)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| v.get("model_type")?.as_str().map(str::to_string))
                .unwrap_or_else(|| "unknown".into());
            // Native: a family read from folders, in a type read as it is.
            let native = axle_models::arch::architecture_of(&row.path()).is_ok();
            (arch, if native { "yes" } else { "no" })
        }
    }
}

fn quantization(row: &axle_hub::Listed) -> String {
    match row.format {
        Format::Gguf => row.name.rsplit(':').next().unwrap_or("").to_string(),
        Format::Safetensors => {
            let config = std::fs::read_to_string(row.path().join("config.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
            let Some(c) = config else {
                return "?".into();
            };
            if let Some(q) = c
                .get("quantization")
                .or_else(|| c.get("quantization_config"))
            {
                let bits = q.get("bits").and_then(|b| b.as_u64());
                let group = q.get("group_size").and_then(|g| g.as_u64());
                return match (bits, group) {
                    (Some(b), Some(g)) => format!("{b}-bit g{g}"),
                    (Some(b), None) => format!("{b}-bit"),
                    _ => "quantized".into(),
                };
            }
            c.get("torch_dtype")
                .or_else(|| c.get("dtype"))
                .and_then(|d| d.as_str())
                .unwrap_or("?")
                .to_string()
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
            let (arch, native) = architecture(r);
            let mut name = r.name.clone();
            if !r.refs.iter().any(|x| x == "main") {
                name.push_str(&format!("@{}", &r.commit[..r.commit.len().min(12)]));
            }
            [
                name,
                indicatif::HumanBytes(r.size()).to_string(),
                arch,
                quantization(r),
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
