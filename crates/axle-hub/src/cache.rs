//! The Hub cache as `huggingface_hub` lays it out, so that what one tool downloaded the others
//! reuse: `<root>/models--org--name/{blobs/<id>, snapshots/<commit>/<path> -> blob, refs/<rev>}`.
//! A blob is named by the id the Hub lists for its file (the LFS sha256, or the git blob id of
//! small files); a download in progress is `<id>.incomplete` and is never linked.
use crate::reference::is_commit;
use crate::HubError;
use std::path::{Path, PathBuf};

/// The cache root (`.../hub`).
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

/// One file of a cached snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedFile {
    /// Path inside the repository.
    pub name: String,
    /// Path on this machine (the snapshot's link).
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
}

/// A cached snapshot of one repository.
#[derive(Debug, Clone)]
pub struct CachedSnapshot {
    /// `org/name`.
    pub repo: String,
    /// The commit.
    pub commit: String,
    /// The refs that point at it (`main`).
    pub refs: Vec<String>,
    /// Its complete files.
    pub files: Vec<CachedFile>,
}

impl Cache {
    /// The cache at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Cache {
        Cache { root: root.into() }
    }

    /// Where `huggingface_hub` looks: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
    /// `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
    pub fn from_env() -> Result<Cache, HubError> {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        if let Some(p) = var("HF_HUB_CACHE") {
            return Ok(Cache::new(p));
        }
        if let Some(p) = var("HF_HOME") {
            return Ok(Cache::new(PathBuf::from(p).join("hub")));
        }
        let base = match (var("XDG_CACHE_HOME"), var("HOME")) {
            (Some(x), _) => PathBuf::from(x),
            (None, Some(h)) => PathBuf::from(h).join(".cache"),
            (None, None) => return Err(HubError::NoCache),
        };
        Ok(Cache::new(base.join("huggingface").join("hub")))
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The token file beside the cache (`HF_HOME/token`), as `huggingface-cli login` writes it.
    pub fn token_file(&self) -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("HF_TOKEN_PATH") {
            return Some(PathBuf::from(p));
        }
        self.root.parent().map(|p| p.join("token"))
    }

    pub(crate) fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    pub(crate) fn blob(&self, repo: &str, id: &str) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(id)
    }

    pub(crate) fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// The commit `revision` names here: itself when it is one, else the ref's content.
    pub fn commit_of(&self, repo: &str, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_string());
        }
        let text = std::fs::read_to_string(self.repo_dir(repo).join("refs").join(revision)).ok()?;
        let commit = text.trim();
        is_commit(commit).then(|| commit.to_string())
    }

    /// Points `revision` at `commit` (no-op when the revision is the commit).
    pub(crate) fn set_ref(&self, repo: &str, revision: &str, commit: &str) -> Result<(), HubError> {
        if revision == commit {
            return Ok(());
        }
        let path = self.repo_dir(repo).join("refs").join(revision);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        }
        std::fs::write(&path, commit).map_err(|e| io(&path, e))
    }

    /// Links `snapshots/<commit>/<name>` to the blob `id` (relatively, so the cache can move).
    pub(crate) fn link(
        &self,
        repo: &str,
        commit: &str,
        name: &str,
        id: &str,
    ) -> Result<PathBuf, HubError> {
        let link = self.snapshot(repo, commit).join(name);
        let dir = link.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let depth = name.matches('/').count() + 2;
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(id);
        match std::fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&link, e)),
        }
        std::os::unix::fs::symlink(&target, &link).map_err(|e| io(&link, e))?;
        Ok(link)
    }

    /// The complete files of a cached commit (broken links, which point at missing blobs, are
    /// left out).
    pub fn snapshot_files(&self, repo: &str, commit: &str) -> Vec<CachedFile> {
        let root = self.snapshot(repo, commit);
        let mut out = Vec::new();
        walk(&root, &root, &mut out);
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Every cached snapshot of every model repository, by repository then commit.
    pub fn snapshots(&self) -> Vec<CachedSnapshot> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return out;
        };
        let mut dirs: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.strip_prefix("models--").map(str::to_string))
            .collect();
        dirs.sort();
        for folder in dirs {
            let repo = folder.replacen("--", "/", 1);
            let refs = read_refs(&self.repo_dir(&repo).join("refs"));
            let Ok(commits) = std::fs::read_dir(self.repo_dir(&repo).join("snapshots")) else {
                continue;
            };
            let mut commits: Vec<String> = commits
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            commits.sort();
            for commit in commits {
                let files = self.snapshot_files(&repo, &commit);
                if files.is_empty() {
                    continue;
                }
                out.push(CachedSnapshot {
                    refs: refs
                        .iter()
                        .filter(|(_, c)| *c == commit)
                        .map(|(r, _)| r.clone())
                        .collect(),
                    repo: repo.clone(),
                    commit,
                    files,
                });
            }
        }
        out
    }

    /// Removes a whole repository.
    pub(crate) fn remove_repo(&self, repo: &str) -> Result<(), HubError> {
        let dir = self.repo_dir(repo);
        std::fs::remove_dir_all(&dir).map_err(|e| io(&dir, e))
    }

    /// Removes some files of a snapshot, and their blobs where no other link uses them.
    pub(crate) fn remove_files(
        &self,
        repo: &str,
        commit: &str,
        names: &[String],
    ) -> Result<(), HubError> {
        let dir = self.repo_dir(repo);
        let mut blobs = Vec::new();
        for name in names {
            let link = self.snapshot(repo, commit).join(name);
            if let Ok(target) = std::fs::canonicalize(&link) {
                blobs.push(target);
            }
            std::fs::remove_file(&link).map_err(|e| io(&link, e))?;
        }
        let still_used: Vec<PathBuf> = self
            .snapshots()
            .into_iter()
            .filter(|s| s.repo == repo)
            .flat_map(|s| s.files)
            .filter_map(|f| std::fs::canonicalize(f.path).ok())
            .collect();
        for blob in blobs {
            if blob.starts_with(&dir) && !still_used.contains(&blob) {
                std::fs::remove_file(&blob).map_err(|e| io(&blob, e))?;
            }
        }
        Ok(())
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<CachedFile>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            walk(root, &path, out);
            continue;
        }
        // Following the link: a missing blob makes this fail and the file is left out.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let Ok(rel) = path.strip_prefix(root) else {
            continue;
        };
        out.push(CachedFile {
            name: rel.to_string_lossy().into_owned(),
            path,
            size: meta.len(),
        });
    }
}

fn read_refs(dir: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    walk(dir, dir, &mut files);
    files
        .into_iter()
        .filter_map(|f| {
            let commit = std::fs::read_to_string(&f.path).ok()?;
            Some((f.name, commit.trim().to_string()))
        })
        .collect()
}

pub(crate) fn io(path: &Path, source: std::io::Error) -> HubError {
    HubError::Io {
        path: path.to_path_buf(),
        source,
    }
}
