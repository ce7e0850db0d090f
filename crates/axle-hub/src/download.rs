//! The Hub's HTTP API, the three requests a pull needs: the repository's file listing with each
//! file's size and hash (`/api/models/<repo>/revision/<rev>?blobs=true`), and each file
//! (`/<repo>/resolve/<commit>/<path>`), resumed with a `Range` request where a partial download
//! is on disk. Every byte is hashed as it arrives; a file whose hash is not the listed one is
//! deleted, never linked.
use crate::cache::io;
use crate::{HubError, Progress};
use serde::Deserialize;
use sha1::Digest as _;
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::Duration;

/// A repository at one commit, as the API lists it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RepoInfo {
    /// The commit the revision names.
    pub sha: String,
    /// Its files.
    #[serde(default)]
    pub siblings: Vec<Sibling>,
}

/// One file of a repository.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Sibling {
    pub rfilename: String,
    #[serde(rename = "blobId", default)]
    pub blob_id: Option<String>,
    #[serde(default)]
    pub size: Option<u64>,
    #[serde(default)]
    pub lfs: Option<Lfs>,
}

/// A file stored in Git LFS: its sha256 and size.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Lfs {
    pub sha256: String,
    pub size: u64,
}

/// What a file must be: how the Hub names its blob and how to check its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expected {
    /// The blob's name in the cache: the LFS sha256, else the git blob id.
    pub id: String,
    /// Size in bytes.
    pub size: u64,
    /// How to check the bytes.
    pub check: Check,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Check {
    /// sha256 of the content (LFS files).
    Sha256(String),
    /// git's blob id: sha1 of `blob <size>\0` and the content (small files).
    GitBlob(String),
}

impl Sibling {
    /// What the file must be, when the listing says enough to check it.
    pub fn expected(&self) -> Option<Expected> {
        let hex = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
        if let Some(lfs) = &self.lfs {
            let sha = lfs.sha256.to_ascii_lowercase();
            return hex(&sha, 64).then(|| Expected {
                id: sha.clone(),
                size: lfs.size,
                check: Check::Sha256(sha),
            });
        }
        let id = self.blob_id.as_deref()?.to_ascii_lowercase();
        let size = self.size?;
        hex(&id, 40).then(|| Expected {
            id: id.clone(),
            size,
            check: Check::GitBlob(id),
        })
    }
}

/// A hasher for one of the checks.
enum Hasher {
    Sha256(sha2::Sha256),
    GitBlob(sha1::Sha1),
}

impl Hasher {
    fn new(check: &Check, size: u64) -> Hasher {
        match check {
            Check::Sha256(_) => Hasher::Sha256(sha2::Sha256::new()),
            Check::GitBlob(_) => {
                let mut h = sha1::Sha1::new();
                h.update(format!("blob {size}\0").as_bytes());
                Hasher::GitBlob(h)
            }
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::GitBlob(h) => h.update(bytes),
        }
    }

    fn hex(self) -> String {
        let bytes: Vec<u8> = match self {
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::GitBlob(h) => h.finalize().to_vec(),
        };
        hex(&bytes)
    }
}

impl Check {
    fn want(&self) -> &str {
        match self {
            Check::Sha256(h) | Check::GitBlob(h) => h,
        }
    }
}

/// Bytes as lower-case hexadecimal, as the Hub writes hashes.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hashes a file on disk as `expected` says, and says whether it matches.
pub(crate) fn verify(path: &Path, expected: &Expected) -> Result<bool, HubError> {
    let mut file = std::fs::File::open(path).map_err(|e| io(path, e))?;
    let size = file.metadata().map_err(|e| io(path, e))?.len();
    if size != expected.size {
        return Ok(false);
    }
    let mut hasher = Hasher::new(&expected.check, size);
    hash_reader(&mut file, &mut hasher, None).map_err(|e| io(path, e))?;
    Ok(hasher.hex() == expected.check.want())
}

fn hash_reader(
    r: &mut impl Read,
    hasher: &mut Hasher,
    mut progress: Option<&mut dyn Progress>,
) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        hasher.update(&buf[..n]);
        total += n as u64;
        if let Some(p) = progress.as_deref_mut() {
            p.advance(n as u64);
        }
    }
}

/// An HTTP client for one Hub endpoint.
pub(crate) struct Client {
    http: reqwest::blocking::Client,
    endpoint: String,
    token: Option<String>,
}

impl Client {
    pub fn new(endpoint: &str, token: Option<String>) -> Result<Client, HubError> {
        let http = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(20))
            // Per read: a stalled transfer fails after this and resumes where it stopped.
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("axle/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HubError::Http(e.to_string()))?;
        Ok(Client {
            http,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
        })
    }

    fn get(&self, url: &str) -> reqwest::blocking::RequestBuilder {
        let req = self.http.get(url);
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    fn send(
        &self,
        repo: &str,
        req: reqwest::blocking::RequestBuilder,
    ) -> Result<reqwest::blocking::Response, HubError> {
        let response = req.send().map_err(|e| HubError::Unreachable {
            endpoint: self.endpoint.clone(),
            detail: error_chain(&e),
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let header = |k: &str| {
            response
                .headers()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let code = header("x-error-code").unwrap_or_default();
        let message = header("x-error-message").unwrap_or_default();
        let repo = repo.to_string();
        let endpoint = self.endpoint.clone();
        Err(match (code.as_str(), status.as_u16()) {
            ("GatedRepo", _) => HubError::Gated {
                repo,
                endpoint,
                token: self.token.is_some(),
            },
            ("RepoNotFound", _) | ("", 401) => HubError::NotFound {
                repo,
                endpoint,
                token: self.token.is_some(),
            },
            ("RevisionNotFound", _) => HubError::NoRevision { repo, endpoint },
            _ => HubError::Status {
                repo,
                status: status.as_u16(),
                message: if message.is_empty() { code } else { message },
            },
        })
    }

    /// The repository's files at `revision`, with sizes and hashes.
    pub fn info(&self, repo: &str, revision: &str) -> Result<RepoInfo, HubError> {
        let url = format!(
            "{}/api/models/{repo}/revision/{}?blobs=true",
            self.endpoint,
            revision.replace('/', "%2F")
        );
        let response = self.send(repo, self.get(&url))?;
        let body = response.bytes().map_err(|e| HubError::Unreachable {
            endpoint: self.endpoint.clone(),
            detail: error_chain(&e),
        })?;
        serde_json::from_slice(&body).map_err(|e| HubError::Status {
            repo: repo.to_string(),
            status: 200,
            message: format!("the repository listing is not what the Hub's API returns: {e}"),
        })
    }

    /// Downloads `name` at `commit` into `partial`, continuing a partial download there, and
    /// checks it. `Ok(false)`: the bytes are not the listed ones (the partial file is deleted).
    pub fn fetch(
        &self,
        repo: &str,
        commit: &str,
        name: &str,
        expected: &Expected,
        partial: &Path,
        progress: &mut dyn Progress,
    ) -> Result<bool, HubError> {
        let url = format!("{}/{repo}/resolve/{commit}/{name}", self.endpoint);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(partial)
            .map_err(|e| io(partial, e))?;
        let mut have = file.metadata().map_err(|e| io(partial, e))?.len();
        if have > expected.size {
            file.set_len(0).map_err(|e| io(partial, e))?;
            have = 0;
        }
        progress.file(name, expected.size, have);
        // The bytes already on disk enter the hash first.
        let mut hasher = Hasher::new(&expected.check, expected.size);
        file.rewind().map_err(|e| io(partial, e))?;
        let hashed = hash_reader(&mut (&mut file).take(have), &mut hasher, None)
            .map_err(|e| io(partial, e))?;
        if hashed != have {
            return Err(io(partial, std::io::ErrorKind::UnexpectedEof.into()));
        }
        if have < expected.size {
            let mut req = self.get(&url);
            if have > 0 {
                req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
            }
            let mut response = self.send(repo, req)?;
            if have > 0 && response.status() != reqwest::StatusCode::PARTIAL_CONTENT {
                // The server sent the whole file: start over.
                file.set_len(0).map_err(|e| io(partial, e))?;
                file.rewind().map_err(|e| io(partial, e))?;
                hasher = Hasher::new(&expected.check, expected.size);
                progress.file(name, expected.size, 0);
                have = 0;
            }
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = match response.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        file.flush().map_err(|e| io(partial, e))?;
                        return Err(HubError::Cut {
                            name: name.to_string(),
                            have,
                            size: expected.size,
                            detail: e.to_string(),
                        });
                    }
                };
                if n == 0 {
                    break;
                }
                let n = n.min((expected.size - have) as usize);
                file.write_all(&buf[..n]).map_err(|e| io(partial, e))?;
                hasher.update(&buf[..n]);
                have += n as u64;
                progress.advance(n as u64);
                if have == expected.size {
                    break;
                }
            }
            file.flush().map_err(|e| io(partial, e))?;
            if have < expected.size {
                return Err(HubError::Cut {
                    name: name.to_string(),
                    have,
                    size: expected.size,
                    detail: "the connection closed early".into(),
                });
            }
        }
        let ok = hasher.hex() == expected.check.want();
        if !ok {
            drop(file);
            std::fs::remove_file(partial).map_err(|e| io(partial, e))?;
        }
        Ok(ok)
    }
}

/// An error with its causes, one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
