//! Models by name. A reference like `org/repo:Q4_K_M` is pulled from the Hugging Face Hub (or
//! the server `HF_ENDPOINT` names) into the standard Hub cache, so that files another tool
//! downloaded are reused and ours are theirs; offline, it is found there.
//!
//! A pull lists the repository with each file's size and hash, picks the model's files
//! ([`select`]), and downloads each into `<blob>.incomplete`, resuming a partial one with a
//! `Range` request, hashing every byte (sha256 for LFS files, git's blob id for small ones) and
//! linking the file into the snapshot only once its hash is the listed one. A corrupted download
//! is deleted and fetched again; a cut one resumes.
//!
//! The HTTP is ours rather than the `hf-hub` crate's: its client panics on some server answers,
//! checks no hash, lists no sizes, and brings a second HTTP and TLS stack beside reqwest, while
//! the API a pull needs is three requests. The cache layout is `huggingface_hub`'s (see
//! [`Cache`]).
#![forbid(unsafe_code)]

mod cache;
mod download;
#[cfg(feature = "mock")]
pub mod mock;
mod reference;
mod select;

pub use cache::{Cache, CachedFile, CachedSnapshot};
pub use reference::{HubId, ModelRef};
pub use select::{gguf_groups, select, Format, GgufGroup, Selection};

use cache::io;
use download::{verify, Client, Expected};
use std::path::PathBuf;

/// Why a model could not be pulled or found.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("`{id}` is not a Hub id: {why}")]
    BadId { id: String, why: String },
    #[error("no Hub cache folder: set HF_HOME (or HF_HUB_CACHE, or HOME)")]
    NoCache,
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("HTTP client: {0}")]
    Http(String),
    #[error("cannot reach {endpoint}: {detail}")]
    Unreachable { endpoint: String, detail: String },
    #[error("{repo} was not found at {endpoint}{}", if *token { " (or the token in HF_TOKEN cannot see it)" } else { " (a private repository needs a token: set HF_TOKEN)" })]
    NotFound {
        repo: String,
        endpoint: String,
        token: bool,
    },
    #[error("{repo} is gated: accept its terms at {endpoint}/{repo}{}", if *token { " with the account whose token is in HF_TOKEN" } else { ", then set HF_TOKEN to a token of that account" })]
    Gated {
        repo: String,
        endpoint: String,
        token: bool,
    },
    #[error("{repo} has no such revision at {endpoint}")]
    NoRevision { repo: String, endpoint: String },
    #[error("{repo}: the Hub answered {status}: {message}")]
    Status {
        repo: String,
        status: u16,
        message: String,
    },
    #[error("{repo} has no `{quant}` GGUF; it has: {available}")]
    NoSuchQuant {
        repo: String,
        quant: String,
        available: String,
    },
    #[error("{repo} has several GGUF quantizations ({available}): name one, as `{repo}:QUANT`")]
    ChooseQuant { repo: String, available: String },
    #[error("{repo} holds no GGUF or safetensors weights")]
    NoWeights { repo: String },
    #[error("{repo}: the listing gives no size and hash for `{name}`, so it cannot be checked")]
    Unlisted { repo: String, name: String },
    #[error("downloading {name}: stopped at {have} of {size} bytes ({detail})")]
    Cut {
        name: String,
        have: u64,
        size: u64,
        detail: String,
    },
    #[error("{repo}: `{name}` arrived corrupted twice (its hash is not the one the Hub lists)")]
    Corrupted { repo: String, name: String },
    #[error("`{id}` is not in the Hub cache at {} and the network is off (--offline or HF_HUB_OFFLINE): pull it first", root.display())]
    NotCached { id: String, root: PathBuf },
    #[error("`{id}` is in the Hub cache but incomplete: {detail}; pull it again")]
    Incomplete { id: String, detail: String },
}

/// Progress of a pull, for a bar per file (the library draws nothing itself).
pub trait Progress {
    /// A file starts, `done` of its `size` bytes already on disk.
    fn file(&mut self, name: &str, size: u64, done: u64);
    /// More bytes arrived (or were checked).
    fn advance(&mut self, bytes: u64);
    /// The current file is complete and checked.
    fn done(&mut self, name: &str);
    /// Something the user should read (a retry, a fallback to the cache).
    fn note(&mut self, message: &str);
}

/// No progress shown.
pub struct Quiet;

impl Progress for Quiet {
    fn file(&mut self, _: &str, _: u64, _: u64) {}
    fn advance(&mut self, _: u64) {}
    fn done(&mut self, _: &str) {}
    fn note(&mut self, _: &str) {}
}

/// How much a pull checks files that are already in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recheck {
    /// Their sizes (what loading by name does each time).
    Size,
    /// Their hashes (what `axle pull` does).
    Hash,
}

/// A model on this machine, from the Hub.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The reference, with the quantization picked.
    pub id: HubId,
    /// The commit its files come from.
    pub commit: String,
    /// How the weights are stored.
    pub format: Format,
    /// What a loader opens: the GGUF (its first part), or the safetensors folder.
    pub path: PathBuf,
    /// Its files.
    pub files: Vec<PathBuf>,
    /// Bytes downloaded by this call.
    pub downloaded: u64,
}

impl Pulled {
    /// `hf:org/repo@commit`, for runtime reports.
    pub fn source(&self) -> String {
        format!("hf:{}@{}", self.id.repo, self.commit)
    }
}

/// A model on this machine, and where it came from.
#[derive(Debug, Clone)]
pub struct Located {
    /// What a loader opens.
    pub path: PathBuf,
    /// `hf:org/repo@commit`, or `file:PATH` for a model given by path.
    pub source: String,
}

/// What a model reference (a `--model`, Python's `Engine(...)`) names, on this machine: a path
/// as it is, a Hub id resolved by [`Hub::from_env`] (offline when `offline` or the environment
/// says so; see [`Hub::resolve`]).
pub fn locate(text: &str, offline: bool, progress: &mut dyn Progress) -> Result<Located, HubError> {
    let id = match ModelRef::parse(text)? {
        ModelRef::Path(path) => {
            let abs = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            return Ok(Located {
                source: format!("file:{}", abs.display()),
                path,
            });
        }
        ModelRef::Hub(id) => id,
    };
    let pulled = Hub::from_env()?.offline(offline).resolve(&id, progress)?;
    Ok(Located {
        source: pulled.source(),
        path: pulled.path,
    })
}

/// One model in the cache, for `axle list`.
#[derive(Debug, Clone)]
pub struct Listed {
    /// `org/repo:QUANT` (GGUF) or `org/repo`.
    pub name: String,
    /// How the weights are stored.
    pub format: Format,
    /// The commit, and the refs pointing at it.
    pub commit: String,
    pub refs: Vec<String>,
    /// Its files.
    pub files: Vec<CachedFile>,
}

impl Listed {
    /// Bytes on disk.
    pub fn size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// What a loader opens.
    pub fn path(&self) -> PathBuf {
        match self.format {
            Format::Gguf => self.files[0].path.clone(),
            Format::Safetensors => self.files[0]
                .path
                .parent()
                .map(PathBuf::from)
                .unwrap_or_default(),
        }
    }
}

/// What `remove` freed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    pub files: usize,
    pub bytes: u64,
}

/// A Hub endpoint and the cache its files go to.
#[derive(Debug, Clone)]
pub struct Hub {
    cache: Cache,
    endpoint: String,
    token: Option<String>,
    offline: bool,
}

/// Times a cut download is resumed before the pull gives up.
const RESUMES: u32 = 5;

impl Hub {
    /// As `huggingface_hub` configures itself: `HF_ENDPOINT` (default `https://huggingface.co`),
    /// `HF_TOKEN` (else the token file `huggingface-cli login` wrote), `HF_HUB_OFFLINE`, and the
    /// cache of [`Cache::from_env`].
    pub fn from_env() -> Result<Hub, HubError> {
        let cache = Cache::from_env()?;
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let token = var("HF_TOKEN").or_else(|| {
            let text = std::fs::read_to_string(cache.token_file()?).ok()?;
            Some(text.trim().to_string()).filter(|t| !t.is_empty())
        });
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
        });
        Ok(Hub {
            cache,
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()),
            token,
            offline,
        })
    }

    /// A hub at `endpoint` over `cache`, without a token.
    pub fn new(endpoint: &str, cache: Cache) -> Hub {
        Hub {
            cache,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token: None,
            offline: false,
        }
    }

    /// Forbids (or allows) the network.
    pub fn offline(mut self, offline: bool) -> Hub {
        self.offline = self.offline || offline;
        self
    }

    /// The token sent with requests.
    pub fn with_token(mut self, token: Option<String>) -> Hub {
        self.token = token;
        self
    }

    /// The cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Whether the network is off.
    pub fn is_offline(&self) -> bool {
        self.offline
    }

    /// The model `id` names, on this machine: from the cache when offline, else pulled (files
    /// already cached are checked by size and kept). When the Hub cannot be reached and the
    /// cache has the revision, the cache serves, with a note.
    pub fn resolve(&self, id: &HubId, progress: &mut dyn Progress) -> Result<Pulled, HubError> {
        if self.offline {
            return self.cached(id);
        }
        match self.pull(id, Recheck::Size, progress) {
            Err(HubError::Unreachable { endpoint, detail }) => match self.cached(id) {
                Ok(p) => {
                    progress.note(&format!(
                        "cannot reach {endpoint} ({detail}); using the cached {}",
                        p.source()
                    ));
                    Ok(p)
                }
                Err(_) => Err(HubError::Unreachable { endpoint, detail }),
            },
            other => other,
        }
    }

    /// Downloads what the cache lacks of the model `id` names.
    pub fn pull(
        &self,
        id: &HubId,
        recheck: Recheck,
        progress: &mut dyn Progress,
    ) -> Result<Pulled, HubError> {
        if self.offline {
            return Err(HubError::NotCached {
                id: id.to_string(),
                root: self.cache.root().to_path_buf(),
            });
        }
        let client = Client::new(&self.endpoint, self.token.clone())?;
        let info = client.info(&id.repo, &id.revision)?;
        if !reference::is_commit(&info.sha) {
            return Err(HubError::Status {
                repo: id.repo.clone(),
                status: 200,
                message: format!("the listing names no commit (`{}`)", info.sha),
            });
        }
        let names: Vec<String> = info.siblings.iter().map(|s| s.rfilename.clone()).collect();
        let selection = select(&id.repo, &names, id.quant.as_deref())?;
        let mut files = Vec::new();
        let mut downloaded = 0;
        for name in &selection.files {
            let expected = info
                .siblings
                .iter()
                .find(|s| &s.rfilename == name)
                .and_then(|s| s.expected())
                .ok_or_else(|| HubError::Unlisted {
                    repo: id.repo.clone(),
                    name: name.clone(),
                })?;
            let (path, bytes) = self.fetch_file(
                &client, &id.repo, &info.sha, name, &expected, recheck, progress,
            )?;
            files.push(path);
            downloaded += bytes;
        }
        self.cache.set_ref(&id.repo, &id.revision, &info.sha)?;
        Ok(self.pulled(id, &info.sha, &selection, files, downloaded))
    }

    fn pulled(
        &self,
        id: &HubId,
        commit: &str,
        selection: &Selection,
        files: Vec<PathBuf>,
        downloaded: u64,
    ) -> Pulled {
        let snapshot = self.cache.snapshot(&id.repo, commit);
        let path = match selection.entry() {
            Some(entry) => snapshot.join(entry),
            None => snapshot,
        };
        Pulled {
            id: HubId {
                quant: selection.quant.clone().filter(|_| id.quant.is_some()),
                ..id.clone()
            },
            commit: commit.to_string(),
            format: selection.format,
            path,
            files,
            downloaded,
        }
    }

    /// One file into the cache: kept when its blob is there and passes `recheck`, else
    /// downloaded (resumed, checked). Returns its snapshot path and the bytes downloaded.
    #[allow(clippy::too_many_arguments)]
    fn fetch_file(
        &self,
        client: &Client,
        repo: &str,
        commit: &str,
        name: &str,
        expected: &Expected,
        recheck: Recheck,
        progress: &mut dyn Progress,
    ) -> Result<(PathBuf, u64), HubError> {
        let blob = self.cache.blob(repo, &expected.id);
        let dir = blob.parent().unwrap_or(self.cache.root()).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        // One process downloads a blob at a time; the others wait and then find it.
        let lock_path = dir.join(format!("{}.lock", expected.id));
        let lock = std::fs::File::create(&lock_path).map_err(|e| io(&lock_path, e))?;
        lock.lock().map_err(|e| io(&lock_path, e))?;
        if let Ok(meta) = std::fs::metadata(&blob) {
            let good = match recheck {
                Recheck::Size => meta.len() == expected.size,
                Recheck::Hash => {
                    progress.file(name, expected.size, expected.size);
                    verify(&blob, expected)?
                }
            };
            if good {
                progress.done(name);
                return Ok((self.cache.link(repo, commit, name, &expected.id)?, 0));
            }
            progress.note(&format!(
                "{name}: the cached copy is damaged; fetching it again"
            ));
            std::fs::remove_file(&blob).map_err(|e| io(&blob, e))?;
        }
        let partial = dir.join(format!("{}.incomplete", expected.id));
        let before = std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
        let mut cuts = 0;
        let mut corrupted = 0;
        loop {
            match client.fetch(repo, commit, name, expected, &partial, progress) {
                Ok(true) => break,
                Ok(false) => {
                    corrupted += 1;
                    if corrupted == 2 {
                        return Err(HubError::Corrupted {
                            repo: repo.to_string(),
                            name: name.to_string(),
                        });
                    }
                    progress.note(&format!("{name}: arrived corrupted; fetching it again"));
                }
                Err(HubError::Cut { detail, have, .. }) if cuts < RESUMES => {
                    cuts += 1;
                    progress.note(&format!("{name}: cut at {have} bytes ({detail}); resuming"));
                    std::thread::sleep(std::time::Duration::from_millis(200 << cuts));
                }
                Err(e) => return Err(e),
            }
        }
        std::fs::rename(&partial, &blob).map_err(|e| io(&blob, e))?;
        drop(lock);
        let _ = std::fs::remove_file(&lock_path);
        progress.done(name);
        let link = self.cache.link(repo, commit, name, &expected.id)?;
        Ok((link, expected.size.saturating_sub(before)))
    }

    /// The model `id` names, from the cache alone.
    pub fn cached(&self, id: &HubId) -> Result<Pulled, HubError> {
        let not_cached = || HubError::NotCached {
            id: id.to_string(),
            root: self.cache.root().to_path_buf(),
        };
        let commit = self
            .cache
            .commit_of(&id.repo, &id.revision)
            .ok_or_else(not_cached)?;
        let present = self.cache.snapshot_files(&id.repo, &commit);
        if present.is_empty() {
            return Err(not_cached());
        }
        let names: Vec<String> = present.iter().map(|f| f.name.clone()).collect();
        let selection = select(&id.repo, &names, id.quant.as_deref()).map_err(|e| match e {
            HubError::NoWeights { .. } => not_cached(),
            other => other,
        })?;
        complete(&selection, &present).map_err(|detail| HubError::Incomplete {
            id: id.to_string(),
            detail,
        })?;
        let files = selection
            .files
            .iter()
            .filter_map(|n| present.iter().find(|f| &f.name == n))
            .map(|f| f.path.clone())
            .collect();
        Ok(self.pulled(id, &commit, &selection, files, 0))
    }

    /// The models in the cache: a row per GGUF quantization and per safetensors folder.
    pub fn list(&self) -> Vec<Listed> {
        let mut out = Vec::new();
        for snap in self.cache.snapshots() {
            let names: Vec<String> = snap.files.iter().map(|f| f.name.clone()).collect();
            let pick = |wanted: &[String]| -> Vec<CachedFile> {
                wanted
                    .iter()
                    .filter_map(|n| snap.files.iter().find(|f| &f.name == n).cloned())
                    .collect()
            };
            for group in gguf_groups(&names) {
                out.push(Listed {
                    name: format!("{}:{}", snap.repo, group.label),
                    format: Format::Gguf,
                    commit: snap.commit.clone(),
                    refs: snap.refs.clone(),
                    files: pick(&group.files),
                });
            }
            let shards: Vec<String> = names
                .iter()
                .filter(|n| n.ends_with(".safetensors") && !n.contains('/'))
                .cloned()
                .collect();
            if !shards.is_empty() {
                if let Ok(s) = select(&snap.repo, &names, None) {
                    if s.format == Format::Safetensors {
                        out.push(Listed {
                            name: snap.repo.clone(),
                            format: Format::Safetensors,
                            commit: snap.commit.clone(),
                            refs: snap.refs.clone(),
                            files: pick(&s.files),
                        });
                    }
                }
            }
        }
        out
    }

    /// Removes a model from the cache: the whole repository, or with `:QUANT` that GGUF's files
    /// (and their blobs where nothing else links them).
    pub fn remove(&self, id: &HubId) -> Result<Removed, HubError> {
        let rows: Vec<Listed> = self
            .list()
            .into_iter()
            .filter(|l| l.name.split(':').next() == Some(id.repo.as_str()))
            .filter(|l| match &id.quant {
                Some(q) => l
                    .name
                    .rsplit(':')
                    .next()
                    .is_some_and(|x| x.eq_ignore_ascii_case(q)),
                None => true,
            })
            .collect();
        let dir = self.cache.repo_dir(&id.repo);
        if rows.is_empty() && (id.quant.is_some() || !dir.exists()) {
            return Err(HubError::NotCached {
                id: id.to_string(),
                root: self.cache.root().to_path_buf(),
            });
        }
        let removed = Removed {
            files: rows.iter().map(|r| r.files.len()).sum(),
            bytes: rows.iter().map(Listed::size).sum(),
        };
        if id.quant.is_none() {
            self.cache.remove_repo(&id.repo)?;
        } else {
            for row in &rows {
                let names: Vec<String> = row.files.iter().map(|f| f.name.clone()).collect();
                self.cache.remove_files(&id.repo, &row.commit, &names)?;
            }
        }
        Ok(removed)
    }
}

/// Whether the cached files make the whole model: every split part of the GGUF, every shard
/// the safetensors index names.
fn complete(selection: &Selection, present: &[CachedFile]) -> Result<(), String> {
    match selection.format {
        Format::Gguf => {
            let first = &selection.files[0];
            let parts = first
                .strip_suffix(".gguf")
                .and_then(|s| s.rsplit_once("-of-"))
                .and_then(|(_, n)| n.parse::<usize>().ok())
                .unwrap_or(1);
            if selection.files.len() != parts {
                return Err(format!(
                    "{} of the {parts} parts of {first}",
                    selection.files.len()
                ));
            }
        }
        Format::Safetensors => {
            let Some(index) = present
                .iter()
                .find(|f| f.name == "model.safetensors.index.json")
            else {
                return Ok(());
            };
            let text = std::fs::read_to_string(&index.path).map_err(|e| e.to_string())?;
            let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let map = json.get("weight_map").and_then(|m| m.as_object());
            for shard in map.into_iter().flat_map(|m| m.values()) {
                let name = shard.as_str().unwrap_or_default();
                if !present.iter().any(|f| f.name == name) {
                    return Err(format!("the shard {name} is missing"));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
