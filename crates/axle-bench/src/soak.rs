//! `axle bench soak`: a long, hostile run through the HTTP server, in one process. Many client
//! threads send chat and text completions for a set time, streamed and blocking, with random
//! prompt lengths, token counts and sampling settings; a share of them go away mid-answer; the
//! KV pool is small enough to force preemption; a share of the requests are hostile (grammar bombs
//! of several shapes, malformed fields, bodies abandoned half-sent), each of which must be refused
//! with a 400 naming its field, or cost nothing; a greedy canary request is repeated throughout
//! and must get the same text every time, and again from a restarted server. The report: requests
//! served, errors by kind (a client that left on purpose is not an error), TTFT and inter-token
//! percentiles, resident memory after the warm-up and at the end, and the KV blocks still in use
//! once every client is done (must be 0: cached prefix blocks are free, not in use).
use crate::server::LocalServer;
use crate::stats::percentile;
use crate::BenchError;
use axle_models::Model;
use axle_sdk::{EngineConfig, Session};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakSpec {
    /// Client threads, each with one request in flight at a time.
    pub clients: usize,
    /// How long clients keep sending.
    pub duration: Duration,
    /// KV slots of the engine (small: preemption).
    pub kv_slots: u32,
    /// Share of requests whose client goes away before the answer is complete.
    pub leave_share: f64,
    /// Share of requests that are hostile (see [`hostile_request`]).
    pub hostile_share: f64,
    /// Seconds between canary requests.
    pub canary_every: Duration,
    /// Seed of the clients' choices.
    pub seed: u64,
}

/// The result, as written to the artifact.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SoakReport {
    /// Client threads.
    pub clients: usize,
    /// Seconds of load.
    pub seconds: f64,
    /// KV slots of the engine.
    pub kv_slots: u32,
    /// Requests answered in full.
    pub served: usize,
    /// Requests whose client left on purpose (streams dropped mid-answer, blocking requests
    /// given up on).
    pub left: usize,
    /// Hostile requests sent, and how many were refused with a 400 naming their field (the
    /// rest were bodies abandoned half-sent, which get no answer).
    #[serde(default)]
    pub hostile: [usize; 2],
    /// Failures by kind (HTTP status, or the transport failure; a hostile request answered
    /// otherwise than expected counts here too); empty when nothing was lost.
    pub errors: BTreeMap<String, usize>,
    /// Tokens streamed to clients.
    pub streamed_tokens: usize,
    /// Time to first token of streamed requests, seconds: p50, p95, p99.
    pub ttft_s: [f64; 3],
    /// Gaps between streamed tokens, seconds: p50, p95, p99.
    pub inter_token_s: [f64; 3],
    /// Resident memory after the first tenth of the run (KV pool, graphs and caches allocated),
    /// and at the end, in MiB.
    pub rss_mib: [f64; 2],
    /// (end - after warm-up) / after warm-up.
    pub rss_growth: f64,
    /// KV blocks in use once every client is done.
    pub kv_blocks_in_use_at_end: usize,
    /// Canary requests sent during the run, and how many got the first answer's text.
    pub canaries: usize,
    /// Canaries identical to the first.
    pub canaries_identical: usize,
    /// Whether a restarted server (new engine, same model) answers the canary identically.
    pub restart_canary_identical: bool,
}

impl SoakReport {
    /// Whether nothing was lost, nothing leaked and the canary never changed (RSS grew under 5%
    /// after the warm-up).
    pub fn sound(&self) -> bool {
        self.errors.is_empty()
            && self.kv_blocks_in_use_at_end == 0
            && self.canaries_identical == self.canaries
            && self.restart_canary_identical
            && self.rss_growth < 0.05
    }

    /// The report as a Markdown table.
    pub fn markdown(&self) -> String {
        let ms = |v: [f64; 3]| format!("{:.0} / {:.0} / {:.0}", v[0] * 1e3, v[1] * 1e3, v[2] * 1e3);
        let errors: usize = self.errors.values().sum();
        crate::stats::markdown_table(
            &["what", "value"],
            &[
                vec![
                    "clients, seconds (until the last finished)".into(),
                    format!("{}, {:.0}", self.clients, self.seconds),
                ],
                vec!["KV slots".into(), self.kv_slots.to_string()],
                vec!["requests served in full".into(), self.served.to_string()],
                vec![
                    "clients that left mid-answer (on purpose)".into(),
                    self.left.to_string(),
                ],
                vec![
                    "hostile requests (refused by name)".into(),
                    format!("{} ({})", self.hostile[0], self.hostile[1]),
                ],
                vec!["errors".into(), format!("{errors} {:?}", self.errors)],
                vec!["tokens streamed".into(), self.streamed_tokens.to_string()],
                vec!["TTFT p50 / p95 / p99 (ms)".into(), ms(self.ttft_s)],
                vec![
                    "inter-token p50 / p95 / p99 (ms)".into(),
                    ms(self.inter_token_s),
                ],
                vec![
                    "RSS after the first tenth -> end (MiB)".into(),
                    format!(
                        "{:.0} -> {:.0} ({:+.1}%)",
                        self.rss_mib[0],
                        self.rss_mib[1],
                        self.rss_growth * 100.0
                    ),
                ],
                vec![
                    "KV blocks in use at the end".into(),
                    self.kv_blocks_in_use_at_end.to_string(),
                ],
                vec![
                    "canaries identical to the first".into(),
                    format!("{}/{}", self.canaries_identical, self.canaries),
                ],
                vec![
                    "canary identical after a restart".into(),
                    self.restart_canary_identical.to_string(),
                ],
            ],
        )
    }
}

/// A uniform draw in [0, 1).
fn unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A uniform draw in [0, n).
fn below(rng: &mut ChaCha8Rng, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

const SENTENCES: [&str; 8] = [
    "The history of computing is a story of abstraction layered upon abstraction.",
    "A river rises in the mountains and runs a long way to the sea.",
    "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()\n",
    "Bread needs flour, water, salt and time; the rest is patience.",
    "In 1969 two people walked on the moon while a third circled above.",
    "| city | population |\n|---|---|\n| Lyon | 522,000 |\n| Porto | 232,000 |\n",
    "Explain, step by step, why the sky is blue on a clear afternoon.",
    "The committee met on Tuesday and agreed to meet again on Thursday.",
];

const CANARY: &str = "Write a short poem about a lighthouse keeper.";

/// One request's outcome.
enum Outcome {
    Served {
        ttft: Option<f64>,
        gaps: Vec<f64>,
    },
    Left,
    /// A hostile request answered as it should be: refused naming its field, or (a body
    /// abandoned half-sent) not answered at all.
    Refused {
        by_name: bool,
    },
    Failed(String),
}

/// A `$ref` chain of `n` objects, each holding the next (a compiler's recursion bomb).
fn object_chain(n: usize) -> serde_json::Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(
            format!("d{i}"),
            serde_json::json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}}),
        );
    }
    defs.insert(format!("d{n}"), serde_json::json!({"type": "integer"}));
    serde_json::json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

/// Sends one hostile request of a kind drawn from `rng`: grammar bombs (a deep `$ref` chain, a
/// long Lark rule chain, deeply nested regex groups, a schema that admits nothing), a malformed
/// field, or a body abandoned half-sent.
fn hostile_request(rng: &mut ChaCha8Rng, port: u16) -> Outcome {
    let stream = unit(rng) < 0.5;
    let chat = |format: serde_json::Value| {
        serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "stream": stream, "response_format": format})
    };
    let (body, field) = match below(rng, 6) {
        0 => (
            chat(serde_json::json!({"type": "json_schema",
                "json_schema": {"name": "bomb", "schema": object_chain(300 + below(rng, 3000))}})),
            "response_format",
        ),
        1 => {
            let n = 1000 + below(rng, 4000);
            let mut lark = String::from("start: r0\n");
            for i in 0..n {
                lark.push_str(&format!("r{i}: \"a\" r{}\n", i + 1));
            }
            lark.push_str(&format!("r{n}: \"b\"\n"));
            (
                chat(serde_json::json!({"type": "grammar", "grammar": lark})),
                "response_format",
            )
        }
        2 => {
            let n = 1000 + below(rng, 20000);
            let regex = format!("{}a{}", "(".repeat(n), ")".repeat(n));
            (
                chat(serde_json::json!({"type": "regex", "regex": regex})),
                "response_format",
            )
        }
        3 => (
            chat(serde_json::json!({"type": "json_schema",
                "json_schema": {"name": "none", "schema": {"$ref": "#"}}})),
            "response_format",
        ),
        4 => (
            serde_json::json!({"prompt": "hi", "max_tokens": -1}),
            "max_tokens",
        ),
        _ => return abandoned_body(port),
    };
    refused(port, &body, field)
}

/// Sends `body` and expects a 400 whose error names `field`.
fn refused(port: u16, body: &serde_json::Value, field: &str) -> Outcome {
    let route = if body.get("messages").is_some() {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let text = body.to_string();
    let answer = (|| -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(STALL))?;
        write!(
            s,
            "POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
            text.len()
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })();
    match answer {
        Ok(a) if a.starts_with("HTTP/1.1 400") && a.contains(&format!("\"param\":\"{field}\"")) => {
            Outcome::Refused { by_name: true }
        }
        Ok(a) => Outcome::Failed(format!(
            "hostile {field}: {}",
            a.lines().next().unwrap_or("no answer")
        )),
        Err(e) => Outcome::Failed(format!("hostile {field}: {:?}", e.kind())),
    }
}

/// A head and half a body, then the client goes away.
fn abandoned_body(port: u16) -> Outcome {
    let sent = (|| -> std::io::Result<()> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{{\"prompt\": \"a half"
        )?;
        std::thread::sleep(Duration::from_millis(300));
        Ok(())
    })();
    match sent {
        Ok(()) => Outcome::Refused { by_name: false },
        Err(e) => Outcome::Failed(format!("abandoned body: {:?}", e.kind())),
    }
}

/// Sends one request over a fresh connection; `leave_after` tokens (streamed) or seconds
/// (blocking) make the client go away early.
fn request(port: u16, body: &serde_json::Value, leave: Option<f64>) -> Outcome {
    let fail = |what: &str, e: std::io::Error| Outcome::Failed(format!("{what}: {:?}", e.kind()));
    let text = body.to_string();
    let route = if body.get("messages").is_some() {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let mut s = match std::net::TcpStream::connect(("127.0.0.1", port)) {
        Ok(s) => s,
        Err(e) => return fail("connect", e),
    };
    let stream = body["stream"].as_bool().unwrap_or(false);
    // A client that gives up waits a second or less; the others wait long, but not forever (a
    // stalled server is a failure, not a hang of the benchmark).
    let patience = match leave {
        Some(secs) if !stream => Duration::from_secs_f64(secs),
        _ => STALL,
    };
    let _ = s.set_read_timeout(Some(patience));
    let _ = s.set_write_timeout(Some(STALL));
    let t0 = Instant::now();
    if let Err(e) = write!(
        s,
        "POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    ) {
        return fail("write", e);
    }
    let mut r = BufReader::new(s);
    let mut status = String::new();
    if let Err(e) = r.read_line(&mut status) {
        return match (leave, e.kind()) {
            (Some(_), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                Outcome::Left
            }
            _ => fail("read", e),
        };
    }
    let code = status
        .split_whitespace()
        .nth(1)
        .unwrap_or("none")
        .to_string();
    if code != "200" {
        return Outcome::Failed(format!("HTTP {code}"));
    }
    if !stream {
        let mut rest = String::new();
        return match r.read_to_string(&mut rest) {
            Ok(_) if rest.contains("\"choices\"") => Outcome::Served {
                ttft: None,
                gaps: Vec::new(),
            },
            Ok(_) => Outcome::Failed("blocking body without choices".into()),
            Err(e) => fail("read body", e),
        };
    }
    let leave_after = leave.map(|t| t as usize);
    let (mut ttft, mut last, mut gaps, mut tokens) = (None, None::<Instant>, Vec::new(), 0usize);
    for line in r.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => return fail("read stream", e),
        };
        if line.starts_with("data: [DONE]") {
            return Outcome::Served { ttft, gaps };
        }
        if line.starts_with("data: {\"error\"") || line.contains("\"error\":{") {
            return Outcome::Failed("error event".into());
        }
        if line.starts_with("data: {") && carries_text(&line) {
            let now = Instant::now();
            match last {
                None => ttft = Some((now - t0).as_secs_f64()),
                Some(l) => gaps.push((now - l).as_secs_f64()),
            }
            last = Some(now);
            tokens += 1;
            if leave_after.is_some_and(|n| tokens >= n) {
                return Outcome::Left; // drops the connection mid-stream
            }
        }
    }
    Outcome::Failed("stream ended without [DONE]".into())
}

/// Whether an SSE data line carries generated text (a chat chunk's `delta.content` or a text
/// chunk's `text`, non-empty): a chat stream's first chunk has only the role, and the last ones
/// only the finish reason or usage.
fn carries_text(line: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&line["data: ".len()..]) else {
        return false;
    };
    let c = &v["choices"][0];
    let text = c["delta"]["content"].as_str().or(c["text"].as_str());
    text.is_some_and(|t| !t.is_empty())
}

/// How long a client waits for the next bytes before it counts the request as failed.
const STALL: Duration = Duration::from_secs(300);

/// A random request of client `rng`: chat or text, streamed or blocking, and whether (and when)
/// its client leaves.
fn random_request(rng: &mut ChaCha8Rng, leave_share: f64) -> (serde_json::Value, Option<f64>) {
    let n = 1 + below(rng, 6);
    let prompt: String = (0..n)
        .map(|_| SENTENCES[below(rng, SENTENCES.len())])
        .collect::<Vec<_>>()
        .join(" ");
    let stream = unit(rng) < 0.75;
    let mut body = serde_json::json!({
        "max_tokens": 8 + below(rng, 249),
        "temperature": if unit(rng) < 0.3 { 0.0 } else { (unit(rng) * 1.2 * 100.0).round() / 100.0 },
        "top_p": if unit(rng) < 0.5 { 1.0 } else { 0.9 },
        "seed": rng.next_u64() % 1_000_000,
        "stream": stream,
    });
    if unit(rng) < 0.5 {
        body["messages"] = serde_json::json!([{"role": "user", "content": prompt}]);
    } else {
        body["prompt"] = serde_json::json!(prompt);
    }
    let leave = (unit(rng) < leave_share).then(|| {
        if stream {
            1.0 + below(rng, 10) as f64 // tokens read before leaving
        } else {
            0.2 + unit(rng) // seconds waited before giving up
        }
    });
    (body, leave)
}

fn canary_body() -> serde_json::Value {
    serde_json::json!({"messages": [{"role": "user", "content": CANARY}], "max_tokens": 48,
        "temperature": 0, "stream": false})
}

/// Sends the canary (blocking) and returns its text.
fn canary(port: u16) -> Result<String, BenchError> {
    let err = |e: String| BenchError::Invalid(format!("canary: {e}"));
    let body = canary_body().to_string();
    let mut s =
        std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| err(e.to_string()))?;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| err(e.to_string()))?;
    let mut all = String::new();
    s.read_to_string(&mut all).map_err(|e| err(e.to_string()))?;
    let json = all.split_once("\r\n\r\n").map_or("", |x| x.1);
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| err(format!("{e}: {all}")))?;
    v["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| err(format!("no content: {all}")))
}

/// A fresh engine on `model` with `kv_slots` slots.
fn engine(model: &Arc<Model>, kv_slots: u32) -> Result<Arc<Session>, BenchError> {
    Ok(Arc::new(Session::new(
        model.clone(),
        EngineConfig {
            kv_slots,
            context: 1024,
            ..Default::default()
        },
    )?))
}

/// Resident memory of this process, MiB (Linux; 0 elsewhere).
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Sets the flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Tally {
    served: usize,
    left: usize,
    hostile: [usize; 2],
    errors: BTreeMap<String, usize>,
    ttft: Vec<f64>,
    gaps: Vec<f64>,
}

/// Runs the soak on `model`; `progress` is called about once a second with the seconds done.
pub fn run(
    model: &Arc<Model>,
    spec: &SoakSpec,
    progress: impl Fn(u64),
) -> Result<SoakReport, BenchError> {
    let server = LocalServer::start(engine(model, spec.kv_slots)?, 2)?;
    let port = server.port;
    let reference = canary(port)?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    // However this function returns (a failed canary included), the clients stop.
    let _stop_clients = StopOnDrop(stop.clone());
    let start = Instant::now();
    let clients: Vec<_> = (0..spec.clients)
        .map(|i| {
            let (tally, stop) = (tally.clone(), stop.clone());
            let mut rng = ChaCha8Rng::seed_from_u64(spec.seed.wrapping_add(i as u64));
            let (leave_share, hostile_share) = (spec.leave_share, spec.hostile_share);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let outcome = if unit(&mut rng) < hostile_share {
                        hostile_request(&mut rng, port)
                    } else {
                        let (body, leave) = random_request(&mut rng, leave_share);
                        request(port, &body, leave)
                    };
                    let Ok(mut t) = tally.lock() else { return };
                    match outcome {
                        Outcome::Served { ttft, gaps } => {
                            t.served += 1;
                            t.ttft.extend(ttft);
                            t.gaps.extend(gaps);
                        }
                        Outcome::Left => t.left += 1,
                        Outcome::Refused { by_name } => {
                            t.hostile[0] += 1;
                            t.hostile[1] += usize::from(by_name);
                        }
                        Outcome::Failed(kind) => *t.errors.entry(kind).or_insert(0) += 1,
                    }
                }
            })
        })
        .collect();
    let (mut canaries, mut identical) = (0, 0);
    let mut rss_warm = None;
    let mut next_canary = Instant::now() + spec.canary_every;
    while start.elapsed() < spec.duration {
        std::thread::sleep(Duration::from_millis(500));
        progress(start.elapsed().as_secs());
        if rss_warm.is_none() && start.elapsed() >= spec.duration / 10 {
            rss_warm = Some(rss_mib());
        }
        if Instant::now() >= next_canary {
            canaries += 1;
            if canary(port)? == reference {
                identical += 1;
            }
            next_canary = Instant::now() + spec.canary_every;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    let seconds = start.elapsed().as_secs_f64();
    // Every client is done: the engine must have nothing running and every block back.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.session.stats().running > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let kv_end = server.session.stats().kv_blocks_used;
    let rss_end = rss_mib();
    drop(server);
    let restarted = LocalServer::start(engine(model, spec.kv_slots)?, 2)?;
    let restart_identical = canary(restarted.port)? == reference;
    drop(restarted);
    let t = tally
        .lock()
        .map_err(|_| BenchError::Invalid("a client thread panicked".into()))?;
    let pct = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        [
            percentile(&v, 0.50),
            percentile(&v, 0.95),
            percentile(&v, 0.99),
        ]
    };
    let warm = rss_warm.unwrap_or(rss_end);
    Ok(SoakReport {
        clients: spec.clients,
        seconds,
        kv_slots: spec.kv_slots,
        served: t.served,
        left: t.left,
        hostile: t.hostile,
        errors: t.errors.clone(),
        streamed_tokens: t.ttft.len() + t.gaps.len(),
        ttft_s: pct(&t.ttft),
        inter_token_s: pct(&t.gaps),
        rss_mib: [warm, rss_end],
        rss_growth: if warm > 0.0 {
            (rss_end - warm) / warm
        } else {
            0.0
        },
        kv_blocks_in_use_at_end: kv_end,
        canaries,
        canaries_identical: identical,
        restart_canary_identical: restart_identical,
    })
}
