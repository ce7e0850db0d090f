//! A local server that speaks the part of the Hub's API a pull uses, for tests: repository
//! listings with sizes and hashes, file downloads with `Range`, the Hub's error codes for
//! unknown and gated repositories, and faults on demand (a download cut short, a corrupted one).
//! Plain HTTP/1.1 over std's TCP, one thread per connection.
use crate::download::hex;
use sha1::Digest as _;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The server; stops when dropped.
pub struct MockHub {
    endpoint: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct State {
    repos: BTreeMap<String, Repo>,
    /// The next download of a file stops after this many bytes.
    cuts: BTreeMap<String, u64>,
    /// The next downloads of a file (this many) carry a flipped byte.
    corrupt: BTreeMap<String, u32>,
    log: Vec<String>,
}

struct Repo {
    commit: String,
    files: BTreeMap<String, Vec<u8>>,
    /// Gated: only this token sees it.
    token: Option<String>,
}

fn git_blob_id(content: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", content.len()).as_bytes());
    h.update(content);
    hex(&h.finalize())
}

fn is_lfs(name: &str) -> bool {
    name.ends_with(".gguf") || name.ends_with(".safetensors")
}

impl MockHub {
    /// Starts on a free port of 127.0.0.1.
    pub fn start() -> MockHub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        MockHub {
            endpoint,
            state,
            stop,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Adds (or replaces) a public repository; returns its commit.
    pub fn add(&self, repo: &str, files: Vec<(String, Vec<u8>)>) -> String {
        self.insert(repo, files, None)
    }

    /// Adds a gated repository that only `token` may read.
    pub fn add_gated(&self, repo: &str, files: Vec<(String, Vec<u8>)>, token: &str) -> String {
        self.insert(repo, files, Some(token.to_string()))
    }

    fn insert(&self, repo: &str, files: Vec<(String, Vec<u8>)>, token: Option<String>) -> String {
        let mut h = sha1::Sha1::new();
        h.update(repo.as_bytes());
        for (name, content) in &files {
            h.update(name.as_bytes());
            h.update(content);
        }
        let commit = hex(&h.finalize());
        let repo_state = Repo {
            commit: commit.clone(),
            files: files.into_iter().collect(),
            token,
        };
        self.lock().repos.insert(repo.to_string(), repo_state);
        commit
    }

    /// The next download of `name` stops after `bytes` bytes (the connection closes).
    pub fn cut_next(&self, name: &str, bytes: u64) {
        self.lock().cuts.insert(name.to_string(), bytes);
    }

    /// The next `times` downloads of `name` carry a flipped byte.
    pub fn corrupt_next(&self, name: &str, times: u32) {
        self.lock().corrupt.insert(name.to_string(), times);
    }

    /// The requests so far: `GET /path` and, for ranges, ` bytes=N-`.
    pub fn log(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for MockHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
    }
}

struct Request {
    method: String,
    path: String,
    range: Option<u64>,
    token: Option<String>,
}

fn read_request(conn: &mut TcpStream) -> Option<Request> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 << 10 || conn.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.split('?').next()?.to_string();
    let mut range = None;
    let mut token = None;
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.to_ascii_lowercase().as_str() {
            "range" => {
                range = v
                    .strip_prefix("bytes=")
                    .and_then(|r| r.strip_suffix('-'))
                    .and_then(|n| n.parse().ok())
            }
            "authorization" => token = v.strip_prefix("Bearer ").map(str::to_string),
            _ => {}
        }
    }
    Some(Request {
        method,
        path,
        range,
        token,
    })
}

fn respond(
    conn: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
    send: usize,
) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(&body[..send.min(body.len())]);
    let _ = conn.flush();
}

fn error(conn: &mut TcpStream, status: &str, code: &str, message: &str) {
    let body = serde_json::json!({ "error": message }).to_string();
    let headers = [
        ("X-Error-Code", code.to_string()),
        ("X-Error-Message", message.to_string()),
        ("Content-Type", "application/json".to_string()),
    ];
    respond(conn, status, &headers, body.as_bytes(), usize::MAX);
}

fn serve(mut conn: TcpStream, state: &Mutex<State>) {
    let Some(req) = read_request(&mut conn) else {
        return;
    };
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    st.log.push(match req.range {
        Some(n) => format!("{} {} bytes={n}-", req.method, req.path),
        None => format!("{} {}", req.method, req.path),
    });
    let path = req.path.trim_start_matches('/');
    let (api, rest) = match path.strip_prefix("api/models/") {
        Some(rest) => (true, rest),
        None => (false, path),
    };
    let mut parts = rest.splitn(3, '/');
    let (Some(org), Some(name), tail) = (parts.next(), parts.next(), parts.next()) else {
        return error(&mut conn, "404 Not Found", "EntryNotFound", "no such route");
    };
    let repo_id = format!("{org}/{name}");
    let Some(repo) = st.repos.get(&repo_id) else {
        // The Hub does not tell a missing repository from a private one.
        return error(
            &mut conn,
            "401 Unauthorized",
            "RepoNotFound",
            "Repository not found",
        );
    };
    if repo.token.is_some() && req.token != repo.token {
        let msg = format!("Access to model {repo_id} is restricted. You must be authenticated.");
        return error(&mut conn, "401 Unauthorized", "GatedRepo", &msg);
    }
    let tail = tail.unwrap_or_default();
    let (revision, file) = if api {
        (
            tail.strip_prefix("revision/")
                .unwrap_or("main")
                .replace("%2F", "/"),
            None,
        )
    } else {
        let Some(r) = tail.strip_prefix("resolve/") else {
            return error(&mut conn, "404 Not Found", "EntryNotFound", "no such route");
        };
        let (rev, file) = r.split_once('/').unwrap_or((r, ""));
        (rev.to_string(), Some(file.to_string()))
    };
    if revision != "main" && revision != repo.commit {
        return error(
            &mut conn,
            "404 Not Found",
            "RevisionNotFound",
            "Invalid rev id",
        );
    }
    let commit = repo.commit.clone();
    let Some(file) = file else {
        let siblings: Vec<serde_json::Value> = repo
            .files
            .iter()
            .map(|(n, content)| {
                let mut s = serde_json::json!({ "rfilename": n, "size": content.len() });
                if is_lfs(n) {
                    let sha = hex(&sha2::Sha256::digest(content));
                    s["blobId"] = git_blob_id(sha.as_bytes()).into();
                    s["lfs"] = serde_json::json!({ "sha256": sha, "size": content.len(), "pointerSize": 134 });
                } else {
                    s["blobId"] = git_blob_id(content).into();
                }
                s
            })
            .collect();
        let body = serde_json::json!({
            "id": repo_id, "sha": commit, "siblings": siblings,
            "gated": if repo.token.is_some() { "manual".into() } else { serde_json::Value::Bool(false) },
        });
        let headers = [("Content-Type", "application/json".to_string())];
        return respond(
            &mut conn,
            "200 OK",
            &headers,
            body.to_string().as_bytes(),
            usize::MAX,
        );
    };
    let Some(content) = repo.files.get(&file).cloned() else {
        return error(
            &mut conn,
            "404 Not Found",
            "EntryNotFound",
            "Entry not found",
        );
    };
    let head = req.method == "HEAD";
    let cut = if head { None } else { st.cuts.remove(&file) };
    let mut body = content.clone();
    if let Some(times) = st.corrupt.get_mut(&file).filter(|_| !head) {
        if *times > 0 {
            *times -= 1;
            let mid = body.len() / 2;
            body[mid] ^= 0x5a;
        }
    }
    drop(st);
    let start = req.range.unwrap_or(0).min(body.len() as u64) as usize;
    let etag = if is_lfs(&file) {
        hex(&sha2::Sha256::digest(&content))
    } else {
        git_blob_id(&content)
    };
    let mut headers = vec![
        ("X-Repo-Commit", commit),
        ("ETag", format!("\"{etag}\"")),
        ("X-Linked-Etag", format!("\"{etag}\"")),
        ("X-Linked-Size", content.len().to_string()),
    ];
    let status = if req.range.is_some() {
        headers.push((
            "Content-Range",
            format!(
                "bytes {start}-{}/{}",
                body.len().saturating_sub(1),
                body.len()
            ),
        ));
        "206 Partial Content"
    } else {
        "200 OK"
    };
    let send = match (head, cut) {
        (true, _) => 0,
        (false, Some(n)) => n as usize,
        (false, None) => usize::MAX,
    };
    respond(&mut conn, status, &headers, &body[start..], send);
}
