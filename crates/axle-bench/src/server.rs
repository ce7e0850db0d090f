//! `axle bench server`: decode tok/s of one stream through the HTTP server (SSE over loopback)
//! against the same generation through the SDK directly, same engine, same process.
use crate::BenchError;
use axle_models::Model;
use axle_sdk::{EngineConfig, GenerateRequest, Generator, RuntimeReport, Session, StreamEvent};
use axle_server::{AppState, Metrics, ServeOptions};
use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The result: decode tok/s per repetition, each way (the scenario's row takes their medians and
/// ratio).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerReport {
    /// SDK decode tok/s per repetition.
    pub sdk: Vec<f64>,
    /// Server decode tok/s per repetition.
    pub server: Vec<f64>,
}

/// Decode tok/s of `n` streamed tokens, the first of which came at `first`: the tokens after it
/// over the time since.
fn decode_tok_s(first: Option<Instant>, n: usize) -> f64 {
    let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    n.saturating_sub(1) as f64 / secs.max(1e-9)
}

const PROMPT: &str = "Once upon a time, in a quiet village by the sea,";

fn sdk_run(session: &Session, tokens: usize) -> Result<f64, BenchError> {
    let mut req = GenerateRequest::new(PROMPT).greedy().max_tokens(tokens);
    req.ignore_eos = true;
    req.speculation = false;
    let mut first = None;
    let mut n = 0usize;
    for ev in session.start_blocking(&req)?.into_iter().flatten() {
        if let StreamEvent::Token { .. } = ev {
            first.get_or_insert_with(Instant::now);
            n += 1;
        }
    }
    Ok(decode_tok_s(first, n))
}

/// A bench's HTTP failure.
fn io(e: std::io::Error) -> BenchError {
    BenchError::Invalid(format!("http: {e}"))
}

/// Posts `body` as JSON to `path` of the server on loopback `port` (the connection closes after
/// the answer) and returns the answer's lines, status line and headers first.
pub(crate) fn post_lines(
    port: u16,
    path: &str,
    body: &serde_json::Value,
) -> Result<impl Iterator<Item = Result<String, BenchError>>, BenchError> {
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(io)?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{}",
        body.len(),
        body
    )
    .map_err(io)?;
    Ok(BufReader::new(s).lines().map(|l| l.map_err(io)))
}

fn http_run(port: u16, tokens: usize) -> Result<f64, BenchError> {
    let body = serde_json::json!({"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": true, "ngram": false, "stream": true});
    let mut first = None;
    let mut n = 0usize;
    for line in post_lines(port, "/v1/completions", &body)? {
        let line = line?;
        if line.starts_with("data: {") && line.contains("\"finish_reason\":null") {
            first.get_or_insert_with(Instant::now);
            n += 1;
        }
        if line.starts_with("data: [DONE]") {
            break;
        }
    }
    Ok(decode_tok_s(first, n))
}

/// Runs it on `m` (loaded by the caller).
pub fn run(m: &Arc<Model>, tokens: usize, reps: usize) -> Result<ServerReport, BenchError> {
    let session = Arc::new(Session::new(
        m.clone(),
        EngineConfig {
            draft_len: 0,
            kv_slots: 4096,
            ..Default::default()
        },
    )?);
    let server = LocalServer::start(session.clone(), 1)?;
    let port = server.port;
    sdk_run(&session, 16)?; // warm-up
    http_run(port, 16)?;
    let (mut sdk, mut server) = (Vec::new(), Vec::new());
    for rep in 0..reps.max(1) {
        if rep % 2 == 0 {
            sdk.push(sdk_run(&session, tokens)?);
            server.push(http_run(port, tokens)?);
        } else {
            server.push(http_run(port, tokens)?);
            sdk.push(sdk_run(&session, tokens)?);
        }
    }
    Ok(ServerReport { sdk, server })
}

/// An HTTP server over `session` on a loopback port of its own, in a runtime of its own;
/// dropping it shuts the server down as SIGTERM would.
pub(crate) struct LocalServer {
    /// The port it listens on.
    pub port: u16,
    /// The engine behind it.
    pub session: Arc<Session>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl LocalServer {
    /// Starts serving `session` with `workers` async worker threads.
    pub fn start(session: Arc<Session>, workers: usize) -> Result<LocalServer, BenchError> {
        let bad = |e: std::io::Error| BenchError::Invalid(e.to_string());
        let state = AppState {
            generator: Generator::Native(session.clone()),
            runtime: Arc::new(RuntimeReport::native(session.model(), None)),
            model_name: "bench".into(),
            api_key: None,
            metrics: Arc::new(Metrics::default()),
            max_queue: 1024,
            max_tokens_limit: None,
            responses: Default::default(),
            embeddings: None,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .map_err(bad)?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .map_err(bad)?;
        let port = listener.local_addr().map_err(bad)?.port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = rt.spawn(axle_server::serve_until(
            state,
            listener,
            ServeOptions::default(),
            async {
                let _ = stopped.await;
            },
        ));
        Ok(LocalServer {
            port,
            session,
            stop: Some(stop),
            served: Some(served),
            rt: Some(rt),
        })
    }
}

impl Drop for LocalServer {
    /// Stops accepting and lets running requests finish within the grace period (the server's
    /// own shutdown), then ends the runtime.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.rt.take() {
            if let Some(served) = self.served.take() {
                let grace = ServeOptions::default().shutdown_grace + Duration::from_secs(1);
                // The timer is made inside the runtime (it needs its time driver).
                let _ = rt.block_on(async { tokio::time::timeout(grace, served).await });
            }
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}
