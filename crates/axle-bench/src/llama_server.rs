//! llama.cpp's own server as a comparison: `axle bench ngram --llama-server PATH` starts the given
//! `llama-server` binary on the same model, once without speculation and once per n-gram
//! speculative mode (`--spec-type ngram-simple`, `ngram-map-k`, `ngram-mod`), sends it the same
//! prompt token ids greedily, and reads its own timings (`predicted_per_second`, `draft_n`,
//! `draft_n_accepted`). [`ChildServer`] runs any HTTP server in a child process (`axle bench serve`
//! starts `axle serve` and `llama-server` with it).
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
    server: ChildServer,
    http: reqwest::blocking::Client,
}

/// An HTTP server in a child process on a loopback port (`axle serve`, `llama-server`), its
/// output in a log file; killed on drop.
#[derive(Debug)]
pub struct ChildServer {
    child: Child,
    port: u16,
    log: PathBuf,
    name: String,
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

/// A loopback port nobody listens on now.
pub fn free_port() -> Result<u16, BenchError> {
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

impl ChildServer {
    /// Starts `cmd` (named `name` in errors), which must listen on loopback `port`, its output
    /// going to a log file; waits up to `wait` until `GET /health` answers with success.
    pub fn start(
        name: &str,
        mut cmd: Command,
        port: u16,
        wait: Duration,
    ) -> Result<ChildServer, BenchError> {
        let log = std::env::temp_dir().join(format!("axle-{name}-{port}.log"));
        let out =
            std::fs::File::create(&log).map_err(|e| invalid(format!("{}: {e}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(|e| invalid(format!("{}: {e}", log.display())))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                invalid(format!(
                    "cannot start {name} ({:?}): {e}",
                    cmd.get_program()
                ))
            })?;
        let mut server = ChildServer {
            child,
            port,
            log,
            name: name.to_string(),
        };
        let http = client()?;
        let deadline = Instant::now() + wait;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(invalid(format!(
                    "{name} exited ({status}) at start-up; its log:\n{}",
                    server.log_tail()
                )));
            }
            let health = http.get(format!("http://127.0.0.1:{port}/health")).send();
            if health.is_ok_and(|r| r.status().is_success()) {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(invalid(format!(
                    "{name} did not become healthy in {} s; its log:\n{}",
                    wait.as_secs(),
                    server.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The last 20 lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "[{}]\n{}",
            self.name,
            lines[lines.len().saturating_sub(20)..].join("\n")
        )
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
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
        let mut cmd = Command::new(bin);
        cmd.arg("-m")
            .arg(model)
            .args(["-t", &threads.to_string(), "-tb", &threads.to_string()])
            .args(["-c", &ctx.to_string(), "-np", "1", "-ngl", "0"])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()]);
        if let Some(s) = spec {
            cmd.args(["--spec-type", s]);
        }
        Ok(LlamaServer {
            server: ChildServer::start("llama-server", cmd, port, Duration::from_secs(180))?,
            http: client()?,
        })
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
            .post(format!("http://127.0.0.1:{}/completion", self.server.port))
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
