//! Route resolution: which runtime serves a model reference (our own, or a server the user
//! already runs), and the runtime report that says so on every response.
//!
//! The decision ([`decide`]) is pure: it takes what was learnt about the local file and the
//! upstream and the user's policy. [`inspect_local`] and [`file_sha256`] do the file I/O.
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;
use std::path::{Path, PathBuf};

/// The runtime that serves requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    /// Axle's own graphs over ggml.
    Native,
    /// A llama.cpp server (`llama-server`, or llama-cpp-python's server) the user runs.
    LlamaCpp,
    /// Any OpenAI-compatible server (mlx_lm.server, vLLM, another Axle).
    OpenaiCompatible,
}

impl RuntimeKind {
    /// Native or delegated.
    pub fn tier(self) -> SupportTier {
        match self {
            RuntimeKind::Native => SupportTier::Native,
            _ => SupportTier::Delegated,
        }
    }

    /// The name used in reports and messages.
    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::Native => "native",
            RuntimeKind::LlamaCpp => "llama_cpp",
            RuntimeKind::OpenaiCompatible => "openai_compatible",
        }
    }
}

/// Whether Axle runs the model itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SupportTier {
    /// Our runtime.
    Native,
    /// Another server, named in the report.
    Delegated,
}

/// What the user asked for (`--backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoutePolicy {
    /// Native when the file's architecture is implemented; delegation only when allowed.
    #[default]
    Auto,
    /// Native or an error.
    Native,
    /// Delegate to a llama.cpp server.
    LlamaCpp,
    /// Delegate to an OpenAI-compatible server.
    Openai,
}

impl RoutePolicy {
    /// The name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            RoutePolicy::Auto => "auto",
            RoutePolicy::Native => "native",
            RoutePolicy::LlamaCpp => "llama-cpp",
            RoutePolicy::Openai => "openai",
        }
    }
}

/// What was learnt about a local model file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalModel {
    /// A GGUF file and its architecture.
    Gguf {
        /// `general.architecture`.
        arch: String,
        /// Whether Axle implements it.
        supported: bool,
    },
    /// The file could not be read as GGUF (the message says why).
    Unreadable(String),
}

/// The inputs of a resolution.
#[derive(Clone, Debug, Default)]
pub struct ResolveInput {
    /// The user's policy.
    pub policy: RoutePolicy,
    /// Whether `auto` may delegate.
    pub allow_delegation: bool,
    /// The local file, when one was given.
    pub local: Option<LocalModel>,
    /// The upstream URL, when one was given.
    pub upstream: Option<String>,
    /// Whether the upstream identified itself as a llama.cpp server (`auto` only).
    pub upstream_is_llama_cpp: bool,
}

/// The chosen backend and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// The runtime.
    pub backend: RuntimeKind,
    /// One sentence: why this one.
    pub reason: String,
}

/// Why no backend could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// Neither a model file nor an upstream was given.
    #[error("no model: give a GGUF file (--model PATH) or an upstream server (--upstream URL)")]
    NothingGiven,
    /// Native was required (or chosen) but the file cannot run natively.
    #[error("{0}")]
    NotNative(String),
    /// Delegation was asked for without an upstream.
    #[error("--backend {0} needs an upstream server: pass --upstream URL")]
    NoUpstream(&'static str),
}

/// Chooses the backend. `auto` prefers native and never delegates silently: without
/// `allow_delegation` a model it cannot run natively is an error that says how to delegate.
pub fn decide(input: &ResolveInput) -> Result<Resolution, ResolveError> {
    let supported = axle_models::arch::supported().join(", ");
    let native_ok = |local: &Option<LocalModel>| -> Result<Resolution, String> {
        match local {
            Some(LocalModel::Gguf {
                arch,
                supported: true,
            }) => Ok(Resolution {
                backend: RuntimeKind::Native,
                reason: format!("GGUF architecture `{arch}` is implemented natively"),
            }),
            Some(LocalModel::Gguf { arch, .. }) => Err(format!(
                "GGUF architecture `{arch}` is not implemented natively (native: {supported})"
            )),
            Some(LocalModel::Unreadable(why)) => Err(why.clone()),
            None => Err("no local GGUF file was given (--model PATH)".into()),
        }
    };
    let delegated = |kind: RuntimeKind, why: &str| -> Result<Resolution, ResolveError> {
        let Some(url) = &input.upstream else {
            return Err(ResolveError::NoUpstream(match kind {
                RuntimeKind::LlamaCpp => "llama-cpp",
                _ => "openai",
            }));
        };
        Ok(Resolution {
            backend: kind,
            reason: format!("{why}; delegated to {} at {url}", kind.name()),
        })
    };
    match input.policy {
        RoutePolicy::Native => native_ok(&input.local)
            .map_err(|e| ResolveError::NotNative(format!("--backend native: {e}"))),
        RoutePolicy::LlamaCpp => delegated(RuntimeKind::LlamaCpp, "--backend llama-cpp"),
        RoutePolicy::Openai => delegated(RuntimeKind::OpenaiCompatible, "--backend openai"),
        RoutePolicy::Auto => {
            if input.local.is_none() && input.upstream.is_none() {
                return Err(ResolveError::NothingGiven);
            }
            let why = match native_ok(&input.local) {
                Ok(r) => return Ok(r),
                Err(why) => why,
            };
            match (&input.upstream, input.allow_delegation) {
                (Some(_), true) => {
                    let kind = if input.upstream_is_llama_cpp {
                        RuntimeKind::LlamaCpp
                    } else {
                        RuntimeKind::OpenaiCompatible
                    };
                    delegated(kind, &format!("auto: {why}"))
                }
                (Some(url), false) => Err(ResolveError::NotNative(format!(
                    "{why}; an upstream ({url}) was given but delegation is off: add \
                     --allow-delegation, or choose --backend llama-cpp|openai"
                ))),
                // A file that cannot be read is that file's problem: no route fixes it.
                (None, _) if matches!(input.local, Some(LocalModel::Unreadable(_))) => {
                    Err(ResolveError::NotNative(why))
                }
                (None, _) => Err(ResolveError::NotNative(format!(
                    "{why}; to serve it through a server you run, pass --upstream URL with \
                     --allow-delegation (or --backend llama-cpp|openai)"
                ))),
            }
        }
    }
}

/// Reads what resolution needs from a local file (its header only).
pub fn inspect_local(path: &Path) -> LocalModel {
    match axle_models::arch::architecture_of(path) {
        Ok(arch) => LocalModel::Gguf {
            supported: axle_models::arch::supported().contains(&arch.as_str()),
            arch,
        },
        Err(e) => LocalModel::Unreadable(format!("cannot read {}: {e}", path.display())),
    }
}

/// The runtime report: which route served a request, under which policy, for which model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RuntimeReport {
    /// The runtime that serves requests.
    pub selected_backend: RuntimeKind,
    /// Native or delegated.
    pub support_tier: SupportTier,
    /// The user's policy.
    pub resolution_policy: RoutePolicy,
    /// Whether `auto` was allowed to delegate.
    pub delegation_allowed: bool,
    /// Why this backend was chosen.
    pub reason: String,
    /// The upstream server (delegated routes).
    pub upstream_url: Option<String>,
    /// The model id the upstream reports (delegated routes).
    pub upstream_model: Option<String>,
    /// The model identity: `sha256:<hex>` of the local file, else `upstream:<model id>`.
    pub model_id: String,
    /// The local model file, when one was given.
    pub model_path: Option<PathBuf>,
    /// Where the model came from: `hf:org/repo@commit` for a model pulled from the Hub,
    /// `file:PATH` for one given by path; absent on delegated routes and where the caller did
    /// not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_source: Option<String>,
    /// Its GGUF architecture, when known.
    pub architecture: Option<String>,
    /// Axle's version.
    pub axle_version: String,
    /// Where a native model runs (`CPU`, `CUDA0 (NVIDIA H100 80GB HBM3)`); absent on delegated
    /// routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// How a native engine's exact kernels multiply decode rows on its devices (`columns`,
    /// `wide`, `groups`), and why where the default gave way at load; absent without devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_products: Option<String>,
    /// What memory a native model's host weights are read from (`huge pages`, `mapped`); absent
    /// on delegated routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory: Option<String>,
    /// The recipe a native model's float weights were quantized by at load (`q4_k_m`); absent
    /// where they run as the file holds them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantized_at_load: Option<String>,
    /// A native engine's speculation: its drafters and longest draft (`ngram,suffix up to 4
    /// tokens`); absent where speculation is off and on delegated routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<String>,
}

impl RuntimeReport {
    /// A report for a resolution.
    pub fn new(
        input: &ResolveInput,
        resolution: &Resolution,
        model_path: Option<&Path>,
        model_sha256: Option<&str>,
        upstream_model: Option<&str>,
    ) -> RuntimeReport {
        let delegated = resolution.backend != RuntimeKind::Native;
        let model_id = match (model_sha256, upstream_model) {
            (Some(h), _) => format!("sha256:{h}"),
            (None, Some(m)) => format!("upstream:{m}"),
            (None, None) => "unknown".into(),
        };
        RuntimeReport {
            selected_backend: resolution.backend,
            support_tier: resolution.backend.tier(),
            resolution_policy: input.policy,
            delegation_allowed: input.allow_delegation,
            reason: resolution.reason.clone(),
            upstream_url: if delegated {
                input.upstream.clone()
            } else {
                None
            },
            upstream_model: if delegated {
                upstream_model.map(str::to_string)
            } else {
                None
            },
            model_id,
            model_path: model_path.map(Path::to_path_buf),
            model_source: None,
            architecture: match &input.local {
                Some(LocalModel::Gguf { arch, .. }) => Some(arch.clone()),
                _ => None,
            },
            axle_version: env!("CARGO_PKG_VERSION").into(),
            device: None,
            device_products: None,
            host_memory: None,
            quantized_at_load: None,
            speculation: None,
        }
    }

    /// The report of a model loaded natively without a policy choice (SDK users, benches).
    pub fn native(model: &axle_models::Model, sha256: Option<&str>) -> RuntimeReport {
        let arch = model.arch().to_string();
        let input = ResolveInput {
            policy: RoutePolicy::Native,
            local: Some(LocalModel::Gguf {
                arch: arch.clone(),
                supported: true,
            }),
            ..Default::default()
        };
        let resolution = Resolution {
            backend: RuntimeKind::Native,
            reason: format!("GGUF architecture `{arch}` is implemented natively"),
        };
        RuntimeReport::new(&input, &resolution, Some(model.path()), sha256, None).on_device(model)
    }

    /// The report with the device a native model runs on.
    pub fn on_device(mut self, model: &axle_models::Model) -> RuntimeReport {
        self.device = Some(model.device_summary());
        self.quantized_at_load = model.quantized_at_load().map(|q| q.name().to_string());
        self.host_memory = Some(
            if model.weights_in_huge_pages() {
                "huge pages"
            } else {
                "mapped"
            }
            .to_string(),
        );
        self
    }

    /// One line for logs: `native (native), sha256:...[, device products wide]` or
    /// `llama_cpp (delegated) at URL, model M`.
    pub fn summary(&self) -> String {
        match &self.upstream_url {
            Some(url) => format!(
                "{} ({}) at {url}, model {}",
                self.selected_backend.name(),
                tier_name(self.support_tier),
                self.upstream_model.as_deref().unwrap_or("?")
            ),
            None => {
                let mut line = format!(
                    "{} ({}), {}",
                    self.selected_backend.name(),
                    tier_name(self.support_tier),
                    self.model_id
                );
                if let Some(source) = self
                    .model_source
                    .as_deref()
                    .filter(|s| s.starts_with("hf:"))
                {
                    line.push_str(&format!(", from {source}"));
                }
                if let Some(p) = &self.device_products {
                    line.push_str(&format!(", device products {p}"));
                }
                line
            }
        }
    }
}

fn tier_name(t: SupportTier) -> &'static str {
    match t {
        SupportTier::Native => "native",
        SupportTier::Delegated => "delegated",
    }
}

/// SHA-256 of a file, hex. Hashing a multi-GB model takes seconds, so results are cached under
/// the user cache directory, keyed by the canonical path, size and modification time.
pub fn file_sha256(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let meta = std::fs::metadata(path)?;
    if meta.is_dir() {
        // A safetensors folder: the hash of its files' names and hashes, in name order.
        let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        names.sort();
        let mut hasher = Sha256::new();
        for p in names {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            hasher.update(format!(
                "{}:{}\n",
                name.unwrap_or_default(),
                file_sha256(&p)?
            ));
        }
        return Ok(hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect());
    }
    let canon = std::fs::canonicalize(path)?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let key = format!("{}|{}|{mtime}", canon.display(), meta.len());
    let cache = hash_cache_path();
    let mut known: std::collections::BTreeMap<String, String> = cache
        .as_ref()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if let Some(h) = known.get(&key) {
        return Ok(h.clone());
    }
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let hex: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if let Some(p) = cache {
        known.insert(key, hex.clone());
        // The cache is an optimisation: failing to write it loses nothing.
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Ok(bytes) = serde_json::to_vec_pretty(&known) {
            let _ = std::fs::write(&p, bytes);
        }
    }
    Ok(hex)
}

fn hash_cache_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("axle").join("hashes.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gguf(arch: &str, supported: bool) -> Option<LocalModel> {
        Some(LocalModel::Gguf {
            arch: arch.into(),
            supported,
        })
    }

    fn input(
        policy: RoutePolicy,
        local: Option<LocalModel>,
        upstream: Option<&str>,
    ) -> ResolveInput {
        ResolveInput {
            policy,
            allow_delegation: false,
            local,
            upstream: upstream.map(str::to_string),
            upstream_is_llama_cpp: false,
        }
    }

    #[test]
    fn auto_prefers_native_even_with_an_upstream() {
        let mut i = input(RoutePolicy::Auto, gguf("llama", true), Some("http://u"));
        i.allow_delegation = true;
        assert_eq!(decide(&i).unwrap().backend, RuntimeKind::Native);
    }

    #[test]
    fn auto_never_delegates_silently() {
        let i = input(RoutePolicy::Auto, gguf("phi3", false), Some("http://u:1"));
        let e = decide(&i).unwrap_err().to_string();
        assert!(e.contains("`phi3` is not implemented natively"), "{e}");
        assert!(e.contains("--allow-delegation"), "{e}");
        let i = input(RoutePolicy::Auto, gguf("phi3", false), None);
        let e = decide(&i).unwrap_err().to_string();
        assert!(e.contains("--upstream URL"), "{e}");
        assert!(e.contains("llama, gemma3"), "{e}");
    }

    #[test]
    fn auto_delegates_when_allowed_and_picks_the_upstream_kind() {
        let mut i = input(RoutePolicy::Auto, gguf("phi3", false), Some("http://u:1"));
        i.allow_delegation = true;
        assert_eq!(decide(&i).unwrap().backend, RuntimeKind::OpenaiCompatible);
        i.upstream_is_llama_cpp = true;
        let r = decide(&i).unwrap();
        assert_eq!(r.backend, RuntimeKind::LlamaCpp);
        assert!(r.reason.contains("phi3") && r.reason.contains("http://u:1"));
        // An upstream model id alone (no local file) is a delegated route too.
        let mut i = input(RoutePolicy::Auto, None, Some("http://u:1"));
        i.allow_delegation = true;
        assert_eq!(decide(&i).unwrap().backend, RuntimeKind::OpenaiCompatible);
    }

    #[test]
    fn explicit_policies() {
        let i = input(RoutePolicy::Native, gguf("phi3", false), Some("http://u"));
        assert!(matches!(decide(&i), Err(ResolveError::NotNative(_))));
        let i = input(
            RoutePolicy::Native,
            Some(LocalModel::Unreadable("cannot read x: not GGUF".into())),
            None,
        );
        assert!(decide(&i).unwrap_err().to_string().contains("not GGUF"));
        // Explicit delegation overrides a natively runnable file (the user asked for it).
        let i = input(RoutePolicy::LlamaCpp, gguf("llama", true), Some("http://u"));
        assert_eq!(decide(&i).unwrap().backend, RuntimeKind::LlamaCpp);
        let i = input(RoutePolicy::Openai, None, None);
        assert_eq!(decide(&i), Err(ResolveError::NoUpstream("openai")));
        assert_eq!(
            decide(&input(RoutePolicy::Auto, None, None)),
            Err(ResolveError::NothingGiven)
        );
    }

    #[test]
    fn report_names_the_route() {
        let mut i = input(RoutePolicy::Auto, gguf("phi3", false), Some("http://u:1"));
        i.allow_delegation = true;
        let r = decide(&i).unwrap();
        let rep = RuntimeReport::new(&i, &r, None, None, Some("m1"));
        let v = serde_json::to_value(&rep).unwrap();
        assert_eq!(v["selected_backend"], "openai_compatible");
        assert_eq!(v["support_tier"], "delegated");
        assert_eq!(v["resolution_policy"], "auto");
        assert_eq!(v["upstream_url"], "http://u:1");
        assert_eq!(v["model_id"], "upstream:m1");
        let i = input(RoutePolicy::Native, gguf("llama", true), Some("http://u:1"));
        let r = decide(&i).unwrap();
        let rep = RuntimeReport::new(&i, &r, None, Some("ab"), None);
        assert_eq!(rep.model_id, "sha256:ab");
        assert_eq!(rep.upstream_url, None);
        assert_eq!(rep.support_tier, SupportTier::Native);
    }

    #[test]
    fn sha256_of_a_file() {
        let dir = std::env::temp_dir().join(format!("axle-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            file_sha256(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Where a model is and who may run it: the inputs of [`open`].
#[derive(Clone, Debug, SmartDefault)]
pub struct RouteSpec {
    /// A local GGUF file (optional when an upstream serves the model).
    pub model: Option<PathBuf>,
    /// The user's policy.
    #[default(RoutePolicy::Auto)]
    pub policy: RoutePolicy,
    /// An upstream server for delegated routes.
    pub upstream: Option<String>,
    /// The model id at the upstream (default: the first it lists).
    pub upstream_model: Option<String>,
    /// Bearer key for the upstream.
    pub upstream_api_key: Option<String>,
    /// How long to wait for the upstream's response, and for each of its stream chunks.
    #[default(std::time::Duration::from_secs(60))]
    pub upstream_timeout: std::time::Duration,
    /// Let `auto` delegate a model it cannot run natively.
    pub allow_delegation: bool,
}

/// Resolves a route and opens it: loads the model with `load` and starts its engine with the
/// configuration `configure` gives for it, or connects to the upstream. Returns the generator
/// and the runtime report that names the route.
pub async fn open(
    spec: &RouteSpec,
    load: impl FnOnce(&Path) -> Result<axle_models::Model, crate::SdkError>,
    configure: impl FnOnce(&axle_models::Model) -> crate::EngineConfig,
) -> Result<(crate::Generator, RuntimeReport), crate::SdkError> {
    use crate::{Generator, SdkError, Session, Upstream};
    use std::sync::Arc;
    let timeout = spec
        .upstream_timeout
        .max(std::time::Duration::from_millis(1));
    let mut input = ResolveInput {
        policy: spec.policy,
        allow_delegation: spec.allow_delegation,
        local: spec.model.as_deref().map(inspect_local),
        upstream: spec.upstream.as_deref().map(normalize_url),
        upstream_is_llama_cpp: false,
    };
    let natively_runnable = matches!(
        input.local,
        Some(LocalModel::Gguf {
            supported: true,
            ..
        })
    );
    if input.policy == RoutePolicy::Auto && input.allow_delegation && !natively_runnable {
        if let Some(url) = &input.upstream {
            input.upstream_is_llama_cpp = Upstream::probe_llama_cpp(url, timeout).await;
        }
    }
    let resolution = decide(&input)?;
    match resolution.backend {
        RuntimeKind::Native => {
            let path = spec
                .model
                .as_deref()
                .ok_or_else(|| SdkError::Config("the native backend needs a model file".into()))?;
            let model = load(path)?;
            let sha = file_sha256(path)
                .map_err(|e| SdkError::Config(format!("cannot hash {}: {e}", path.display())))?;
            let mut report = RuntimeReport::new(&input, &resolution, Some(path), Some(&sha), None)
                .on_device(&model);
            let cfg = configure(&model);
            report.speculation = (cfg.draft_len > 0).then(|| {
                let sources = crate::DraftSources {
                    model: cfg.drafters.model && cfg.draft_model.is_some(),
                    ..cfg.drafters
                };
                format!(
                    "{} up to {} tokens",
                    sources.names(),
                    cfg.draft_len.min(crate::MAX_DRAFT)
                )
            });
            let session = Session::new(Arc::new(model), cfg)?;
            report.device_products = session.device_products_summary().map(str::to_string);
            Ok((Generator::Native(Arc::new(session)), report))
        }
        kind => {
            let url = input
                .upstream
                .clone()
                .ok_or_else(|| SdkError::Config("no upstream".into()))?;
            let up = Upstream::connect(
                kind,
                &url,
                spec.upstream_model.as_deref(),
                spec.upstream_api_key.clone(),
                timeout,
            )
            .await?;
            let report = RuntimeReport::new(
                &input,
                &resolution,
                spec.model.as_deref(),
                None,
                Some(up.model()),
            );
            Ok((Generator::Delegated(Arc::new(up)), report))
        }
    }
}

/// `http://h:p/v1/` and `http://h:p` name the same server.
pub fn normalize_url(url: &str) -> String {
    let u = url.trim().trim_end_matches('/');
    u.strip_suffix("/v1").unwrap_or(u).to_string()
}
