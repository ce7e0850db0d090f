//! `axle bench serve`: N concurrent streaming clients over HTTP against `axle serve`, and against
//! llama.cpp's own `llama-server` on the same file with the same context budget, one server
//! after the other. Each client streams `/v1/completions` (random token-id prompts, greedy, the
//! end-of-generation token ignored so every request generates the same number of tokens) for a
//! number of rounds; the report gives output throughput, time to first token and the gaps
//! between streamed tokens (inter-token latency), p50 and p99.
use crate::llama_server::{free_port, ChildServer};
use crate::stats::{percentile, synthetic_tokens};
use crate::BenchError;
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The load every server gets.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Load {
    /// Clients streaming at once.
    pub clients: usize,
    /// Tokens in each prompt.
    pub prompt_tokens: usize,
    /// Tokens each request generates.
    pub max_tokens: usize,
    /// Requests each client sends, one after the other.
    pub rounds: usize,
}

impl Load {
    /// Context each sequence needs, rounded up to 256 tokens: both servers get this per
    /// sequence and `clients` times it in all.
    pub fn context(&self) -> usize {
        (self.prompt_tokens + self.max_tokens).div_ceil(256) * 256
    }
}

/// What to run: the model, the two servers and their extra arguments, the load.
#[derive(Debug, Clone)]
pub struct ServeBench {
    /// The GGUF file both servers load.
    pub model: PathBuf,
    /// The `axle` binary (`axle serve` runs in a child process, as users run it).
    pub axle: PathBuf,
    /// Extra arguments for `axle serve` (device, kernels, ...).
    pub axle_args: Vec<String>,
    /// `llama-server`, when the comparison is wanted.
    pub llama_server: Option<PathBuf>,
    /// Extra arguments for `llama-server`.
    pub llama_args: Vec<String>,
    /// The load.
    pub load: Load,
    /// Seconds a server may take to load the model and answer `/health`.
    pub startup: Duration,
}

/// One server's figures under the load.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerStats {
    /// `axle serve` or `llama-server`.
    pub server: String,
    /// Requests that completed.
    pub requests: usize,
    /// Those whose stream carried text to time (a stream whose tokens never complete a
    /// character, as random weights can give, counts its tokens but has no first-token time or
    /// gaps).
    pub timed_requests: usize,
    /// Tokens generated over all requests (the servers' own counts where they send them).
    pub output_tokens: usize,
    /// From the clients' common start to the last request's end.
    pub wall_s: f64,
    /// Output tokens per second of wall time.
    pub output_tok_s: f64,
    /// Time to first token, p50, ms.
    pub ttft_p50_ms: f64,
    /// Time to first token, p99, ms.
    pub ttft_p99_ms: f64,
    /// Gap between streamed tokens, p50, ms.
    pub itl_p50_ms: f64,
    /// Gap between streamed tokens, p99, ms.
    pub itl_p99_ms: f64,
}

/// Both servers under the same load.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServeReport {
    /// The load.
    pub load: Load,
    /// `axle serve`.
    pub axle: ServerStats,
    /// `llama-server`, when it ran.
    pub llama_server: Option<ServerStats>,
}

impl ServeReport {
    /// A Markdown table: one line per server, ratios Axle / llama-server where both ran.
    pub fn table(&self) -> String {
        let line = |s: &ServerStats| {
            vec![
                s.server.clone(),
                format!("{:.1}", s.output_tok_s),
                format!("{:.0}", s.ttft_p50_ms),
                format!("{:.0}", s.ttft_p99_ms),
                format!("{:.1}", s.itl_p50_ms),
                format!("{:.1}", s.itl_p99_ms),
                format!("{}/{}", s.timed_requests, s.requests),
            ]
        };
        let mut rows = vec![line(&self.axle)];
        if let Some(l) = &self.llama_server {
            rows.push(line(l));
            let a = &self.axle;
            rows.push(vec![
                "Axle / llama-server".into(),
                format!("{:.3}", a.output_tok_s / l.output_tok_s),
                format!("{:.3}", a.ttft_p50_ms / l.ttft_p50_ms),
                format!("{:.3}", a.ttft_p99_ms / l.ttft_p99_ms),
                format!("{:.3}", a.itl_p50_ms / l.itl_p50_ms),
                format!("{:.3}", a.itl_p99_ms / l.itl_p99_ms),
                String::new(),
            ]);
        }
        crate::stats::markdown_table(
            &[
                "server",
                "output tok/s",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "ITL p50 ms",
                "ITL p99 ms",
                "streams timed",
            ],
            &rows,
        )
    }
}

/// What one line of a `/v1/completions` event stream says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// Text (or a token whose text is still incomplete) arrived.
    Token,
    /// The server's count of generated tokens (a usage chunk, or a last chunk carrying usage).
    Usage(usize),
    /// The stream ended.
    Done,
    /// Anything else (keep-alives, the finish chunk, other lines).
    Other,
}

/// Reads one line of the stream. A chunk with a choice whose `finish_reason` is still null, or
/// with text, is a token; usage may ride on the same chunk as the finish.
fn event(line: &str) -> Result<Vec<Event>, BenchError> {
    let Some(data) = line.strip_prefix("data:").map(str::trim) else {
        return Ok(vec![Event::Other]);
    };
    if data == "[DONE]" {
        return Ok(vec![Event::Done]);
    }
    let v: Value = serde_json::from_str(data)
        .map_err(|e| BenchError::Invalid(format!("bad event ({e}): {data}")))?;
    if let Some(err) = v.get("error") {
        return Err(BenchError::Invalid(format!(
            "the server sent an error: {err}"
        )));
    }
    let mut out = Vec::new();
    if let Some(c) = v["choices"].as_array().and_then(|c| c.first()) {
        let text = c["text"].as_str().unwrap_or_default();
        if c["finish_reason"].is_null() || !text.is_empty() {
            out.push(Event::Token);
        }
    }
    if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
        out.push(Event::Usage(n as usize));
    }
    if out.is_empty() {
        out.push(Event::Other);
    }
    Ok(out)
}

/// One request's timeline.
#[derive(Debug, Clone)]
struct Trace {
    sent: Instant,
    tokens_at: Vec<Instant>,
    end: Instant,
    /// The server's own count, where it sent one.
    counted: Option<usize>,
}

impl Trace {
    fn tokens(&self) -> usize {
        self.counted.unwrap_or(self.tokens_at.len())
    }
}

/// Streams one completion of `prompt` from the server on `port`.
fn stream(
    http: &reqwest::blocking::Client,
    port: u16,
    prompt: &[u32],
    max_tokens: usize,
) -> Result<Trace, BenchError> {
    let body = json!({
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let sent = Instant::now();
    let r = http
        .post(format!("http://127.0.0.1:{port}/v1/completions"))
        .json(&body)
        .send()
        .map_err(|e| BenchError::Invalid(format!("request failed: {e}")))?;
    let status = r.status();
    if !status.is_success() {
        let text = r.text().unwrap_or_default();
        return Err(BenchError::Invalid(format!("answered {status}: {text}")));
    }
    let mut trace = Trace {
        sent,
        tokens_at: Vec::with_capacity(max_tokens),
        end: sent,
        counted: None,
    };
    for line in std::io::BufReader::new(r).lines() {
        let line = line.map_err(|e| BenchError::Invalid(format!("stream broke: {e}")))?;
        let now = Instant::now();
        let mut done = false;
        for ev in event(&line)? {
            match ev {
                Event::Token => trace.tokens_at.push(now),
                Event::Usage(n) => trace.counted = Some(n),
                Event::Done => done = true,
                Event::Other => {}
            }
        }
        if done {
            break;
        }
    }
    trace.end = Instant::now();
    if trace.tokens() == 0 {
        return Err(BenchError::Invalid("a stream ended without tokens".into()));
    }
    Ok(trace)
}

/// The prompts: client `c`'s round `r` gets its own random token ids, the same for every server.
pub fn prompts(load: &Load, n_vocab: usize) -> Vec<Vec<Vec<u32>>> {
    (0..load.clients)
        .map(|c| {
            (0..load.rounds)
                .map(|r| {
                    synthetic_tokens(load.prompt_tokens, n_vocab, 7919 * (c * 64 + r + 1) as u64)
                })
                .collect()
        })
        .collect()
}

/// Runs the load against the server on `port`: every client starts at once and sends its rounds
/// one after the other.
pub fn drive(
    name: &str,
    port: u16,
    load: &Load,
    prompts: &[Vec<Vec<u32>>],
) -> Result<ServerStats, BenchError> {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(3600))
        .pool_max_idle_per_host(load.clients)
        .build()
        .map_err(|e| BenchError::Invalid(format!("http client: {e}")))?;
    // One warm-up request: the first request's one-off costs (graphs, allocations) stay out.
    stream(&http, port, &synthetic_tokens(16, 256, 3), 4)?;
    let barrier = Arc::new(Barrier::new(load.clients + 1));
    let handles: Vec<_> = prompts
        .iter()
        .cloned()
        .map(|rounds| {
            let (http, barrier, max_tokens) = (http.clone(), barrier.clone(), load.max_tokens);
            std::thread::spawn(move || {
                barrier.wait();
                rounds
                    .iter()
                    .map(|p| stream(&http, port, p, max_tokens))
                    .collect::<Result<Vec<_>, _>>()
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let mut traces = Vec::new();
    for h in handles {
        let t = h
            .join()
            .map_err(|_| BenchError::Invalid("a client thread panicked".into()))??;
        traces.extend(t);
    }
    Ok(summarize(name, start, &traces))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn summarize(name: &str, start: Instant, traces: &[Trace]) -> ServerStats {
    let end = traces.iter().map(|t| t.end).max().unwrap_or(start);
    let wall_s = end.duration_since(start).as_secs_f64().max(1e-9);
    let output_tokens: usize = traces.iter().map(Trace::tokens).sum();
    let mut ttft: Vec<f64> = traces
        .iter()
        .filter_map(|t| t.tokens_at.first().map(|f| ms(f.duration_since(t.sent))))
        .collect();
    let mut itl: Vec<f64> = traces
        .iter()
        .flat_map(|t| {
            t.tokens_at
                .windows(2)
                .map(|w| ms(w[1].duration_since(w[0])))
        })
        .collect();
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    ServerStats {
        server: name.to_string(),
        requests: traces.len(),
        timed_requests: ttft.len(),
        output_tokens,
        wall_s,
        output_tok_s: output_tokens as f64 / wall_s,
        ttft_p50_ms: percentile(&ttft, 0.5),
        ttft_p99_ms: percentile(&ttft, 0.99),
        itl_p50_ms: percentile(&itl, 0.5),
        itl_p99_ms: percentile(&itl, 0.99),
    }
}

/// The model's vocabulary size, from the file's metadata (no weights loaded).
fn vocab_size(model: &std::path::Path) -> Result<usize, BenchError> {
    let file = axle_ggml::GgufFile::open(model)?;
    let tokens = file.array_opt("tokenizer.ggml.tokens")?.ok_or_else(|| {
        BenchError::Invalid(format!("{} has no tokenizer.ggml.tokens", model.display()))
    })?;
    Ok(tokens.len())
}

/// Runs `axle serve`, then `llama-server` where given, under the same load.
pub fn run(b: &ServeBench) -> Result<ServeReport, BenchError> {
    let load = b.load;
    if load.clients == 0 || load.rounds == 0 || load.max_tokens == 0 || load.prompt_tokens == 0 {
        return Err(BenchError::Invalid(
            "clients, rounds, prompt and tokens must each be at least 1".into(),
        ));
    }
    let prompts = prompts(&load, vocab_size(&b.model)?);
    let (ctx, total) = (load.context(), load.context() * load.clients);

    let port = free_port()?;
    let mut cmd = Command::new(&b.axle);
    cmd.arg("serve")
        .arg("--model")
        .arg(&b.model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--max-batch-size", &load.clients.to_string()])
        .args(["--ctx", &ctx.to_string(), "--kv-slots", &total.to_string()])
        .args(["--max-queue", &(load.clients * 2).to_string()])
        .args(&b.axle_args);
    let server = ChildServer::start("axle-serve", cmd, port, b.startup)?;
    let axle = drive("axle serve", port, &load, &prompts)
        .map_err(|e| BenchError::Invalid(format!("axle serve: {e}\n{}", server.log_tail())))?;
    drop(server);

    let llama_server = match &b.llama_server {
        None => None,
        Some(bin) => {
            let port = free_port()?;
            let mut cmd = Command::new(bin);
            cmd.arg("-m")
                .arg(&b.model)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["-np", &load.clients.to_string(), "-c", &total.to_string()])
                .args(&b.llama_args);
            let server = ChildServer::start("llama-server", cmd, port, b.startup)?;
            let stats = drive("llama-server", port, &load, &prompts).map_err(|e| {
                BenchError::Invalid(format!("llama-server: {e}\n{}", server.log_tail()))
            })?;
            Some(stats)
        }
    };
    Ok(ServeReport {
        load,
        axle,
        llama_server,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_both_servers_streams() {
        // Axle's and llama-server's chunk shapes.
        let tok = r#"data: {"choices":[{"text":"Hi","index":0,"finish_reason":null}]}"#;
        assert_eq!(event(tok).unwrap(), vec![Event::Token]);
        let empty = r#"data: {"choices":[{"text":"","index":0,"finish_reason":null}]}"#;
        assert_eq!(event(empty).unwrap(), vec![Event::Token]);
        let fin = r#"data: {"choices":[{"text":"","index":0,"finish_reason":"length"}]}"#;
        assert_eq!(event(fin).unwrap(), vec![Event::Other]);
        let last = r#"data: {"choices":[{"text":"!","finish_reason":"length"}],"usage":{"completion_tokens":7}}"#;
        assert_eq!(event(last).unwrap(), vec![Event::Token, Event::Usage(7)]);
        let usage = r#"data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}"#;
        assert_eq!(event(usage).unwrap(), vec![Event::Usage(9)]);
        assert_eq!(event("data: [DONE]").unwrap(), vec![Event::Done]);
        assert_eq!(event("").unwrap(), vec![Event::Other]);
        assert_eq!(event(": keep-alive").unwrap(), vec![Event::Other]);
        assert!(event(r#"data: {"error":{"message":"boom"}}"#).is_err());
        assert!(event("data: {not json").is_err());
    }

    #[test]
    fn summary_counts_tokens_gaps_and_first_tokens() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let traces = vec![
            Trace {
                sent: at(0),
                tokens_at: vec![at(100), at(110), at(130)],
                end: at(140),
                counted: None,
            },
            Trace {
                sent: at(0),
                tokens_at: vec![at(300), at(310)],
                end: at(400),
                counted: Some(5),
            },
            // Tokens without text: counted, not timed.
            Trace {
                sent: at(0),
                tokens_at: vec![],
                end: at(200),
                counted: Some(4),
            },
        ];
        let s = summarize("x", t0, &traces);
        assert_eq!((s.requests, s.timed_requests, s.output_tokens), (3, 2, 12));
        assert!((s.wall_s - 0.4).abs() < 1e-9);
        assert!((s.output_tok_s - 30.0).abs() < 1e-6);
        assert!((s.ttft_p50_ms - 100.0).abs() < 1e-6, "{}", s.ttft_p50_ms);
        assert!((s.ttft_p99_ms - 300.0).abs() < 1e-6);
        assert!((s.itl_p50_ms - 10.0).abs() < 1e-6, "{}", s.itl_p50_ms);
        assert!((s.itl_p99_ms - 20.0).abs() < 1e-6);
    }

    #[test]
    fn prompts_differ_per_client_and_round_and_repeat() {
        let load = Load {
            clients: 3,
            prompt_tokens: 16,
            max_tokens: 4,
            rounds: 2,
        };
        let p = prompts(&load, 1000);
        assert_eq!(p, prompts(&load, 1000));
        let all: std::collections::BTreeSet<_> = p.iter().flatten().collect();
        assert_eq!(all.len(), 6);
        assert!(p.iter().flatten().all(|x| x.len() == 16));
        assert_eq!(load.context(), 256);
    }
}
