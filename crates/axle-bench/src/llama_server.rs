//! llama.cpp's own server as a comparison: `axle bench ngram --llama-server PATH` starts the given
//! `llama-server` binary on the same model, once without speculation and once per n-gram
//! speculative mode (`--spec-type ngram-simple`, `ngram-map-k`, `ngram-mod`), sends it the same
//! prompt token ids greedily, and reads its own timings (`predicted_per_second`, `draft_n`,
//! `draft_n_accepted`).
use crate::BenchError;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The speculative modes compared by default.
pub const DEFAULT_MODES: &[&str] = &["ngram-simple", "ngram-map-k", "ngram-mod"];

/// A running `llama-server`, stopped on drop.
#[derive(Debug)]
pub struct LlamaServer {
    child: Child,
    http: reqwest::blocking::Client,
    port: u16,
    log: PathBuf,
}

/// One completion as llama-server reports it.
#[derive(Debug, Clone)]
pub struct ServerRun {
    /// Generated text.
    pub content: String,
    /// Its decode tok/s.
    pub decode_tok_s: f64,
    /// Draft tokens proposed.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
}

fn invalid(msg: impl Into<String>) -> BenchError {
    BenchError::Invalid(msg.into())
}

fn free_port() -> Result<u16, BenchError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| invalid(format!("no free port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| invalid(format!("no free port: {e}")))
}

/// A blocking client for the local server: long completions may take minutes on 2 cores.
fn client() -> Result<reqwest::blocking::Client, BenchError> {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .map_err(|e| invalid(format!("http client: {e}")))
}

impl LlamaServer {
    /// Starts `bin` on `model` with `threads` threads, one slot and `ctx` tokens of context; with
    /// `spec` (a `--spec-type` value) speculation is on. Waits until `/health` answers.
    pub fn start(
        bin: &Path,
        model: &Path,
        threads: usize,
        ctx: usize,
        spec: Option<&str>,
    ) -> Result<LlamaServer, BenchError> {
        let port = free_port()?;
        let log = std::env::temp_dir().join(format!("axle-llama-server-{port}.log"));
        let out =
            std::fs::File::create(&log).map_err(|e| invalid(format!("{}: {e}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(|e| invalid(format!("{}: {e}", log.display())))?;
        let mut cmd = Command::new(bin);
        cmd.arg("-m")
            .arg(model)
            .args(["-t", &threads.to_string(), "-tb", &threads.to_string()])
            .args(["-c", &ctx.to_string(), "-np", "1", "-ngl", "0"])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some(s) = spec {
            cmd.args(["--spec-type", s]);
        }
        let child = cmd
            .spawn()
            .map_err(|e| invalid(format!("cannot start {}: {e}", bin.display())))?;
        let mut server = LlamaServer {
            child,
            http: client()?,
            port,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(invalid(format!(
                    "llama-server exited ({status}) at start-up; its log:\n{}",
                    server.log_tail()
                )));
            }
            let health = server
                .http
                .get(format!("http://127.0.0.1:{port}/health"))
                .send();
            if health.is_ok_and(|r| r.status().is_success()) {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(invalid(format!(
                    "llama-server did not become healthy in 180 s; its log:\n{}",
                    server.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Greedy completion of `prompt` (token ids, BOS included as the model wants it) for exactly
    /// `n_predict` tokens unless an end-of-generation token comes first.
    pub fn complete(&self, prompt: &[u32], n_predict: usize) -> Result<ServerRun, BenchError> {
        let body = json!({
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": false,
            "stream": false,
        });
        let r = self
            .http
            .post(format!("http://127.0.0.1:{}/completion", self.port))
            .json(&body)
            .send()
            .map_err(|e| invalid(format!("llama-server: {e}")))?;
        let status = r.status();
        let text = r
            .text()
            .map_err(|e| invalid(format!("llama-server: {e}")))?;
        if !status.is_success() {
            return Err(invalid(format!("llama-server answered {status}: {text}")));
        }
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| invalid(format!("llama-server sent bad JSON ({e}): {text}")))?;
        let t = &v["timings"];
        Ok(ServerRun {
            content: v["content"].as_str().unwrap_or_default().to_string(),
            decode_tok_s: t["predicted_per_second"].as_f64().unwrap_or(0.0),
            drafted: t["draft_n"].as_u64().unwrap_or(0),
            accepted: t["draft_n_accepted"].as_u64().unwrap_or(0),
        })
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_is_a_clear_error() {
        let e = LlamaServer::start(
            Path::new("/nonexistent/llama-server"),
            Path::new("/nonexistent/model.gguf"),
            1,
            512,
            None,
        )
        .expect_err("must fail");
        assert!(e.to_string().contains("cannot start"), "{e}");
    }
}
