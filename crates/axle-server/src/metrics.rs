//! Server metrics in Prometheus text format. Hand-written rather than the `prometheus` crate: a
//! dozen counters and two fixed-bucket histograms do not need a registry, and this keeps the
//! server's dependency tree small.
use axle_sdk::{BySource, DraftSource, EngineStats, DRAFT_SOURCES};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    n: u64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        for (i, &b) in BUCKETS.iter().enumerate() {
            if v <= b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.n += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", self.counts[i]);
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}",
            self.n, self.sum, self.n
        );
    }
}

/// Counters and histograms of one server.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: AtomicU64,
    errors: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    /// Draft tokens proposed and accepted, by drafter (`DraftSource as usize`).
    drafted: [AtomicU64; DRAFT_SOURCES],
    accepted: [AtomicU64; DRAFT_SOURCES],
    max_running: AtomicU64,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
}

impl Metrics {
    /// A request arrived.
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A request failed.
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A request finished with these token counts and these drafts by drafter.
    pub fn finished(&self, prompt: usize, completion: usize, drafts: &BySource) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(completion as u64, Ordering::Relaxed);
        for (i, d) in drafts.iter().enumerate() {
            self.drafted[i].fetch_add(d.drafted as u64, Ordering::Relaxed);
            self.accepted[i].fetch_add(d.accepted as u64, Ordering::Relaxed);
        }
    }

    /// Time to first token, seconds.
    pub fn ttft(&self, secs: f64) {
        if let Ok(mut h) = self.ttft.lock() {
            h.observe(secs);
        }
    }

    /// Time between two tokens of a stream, seconds.
    pub fn inter_token(&self, secs: f64) {
        if let Ok(mut h) = self.itl.lock() {
            h.observe(secs);
        }
    }

    /// Records the running-sequence count (the peak is exported).
    pub fn observe_running(&self, running: usize) {
        self.max_running
            .fetch_max(running as u64, Ordering::Relaxed);
    }

    /// The Prometheus text exposition, with the engine's live gauges.
    pub fn render(&self, e: &EngineStats) -> String {
        self.observe_running(e.running);
        let mut out = String::new();
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (c, g) = ("counter", "gauge");
        // One series a line: kind, name, help, value.
        #[rustfmt::skip]
        let series = [
            (c, "axle_requests_total",              "Requests received.",                           r(&self.requests)),
            (c, "axle_request_errors_total",        "Requests that ended in an error.",             r(&self.errors)),
            (c, "axle_prompt_tokens_total",         "Prompt tokens processed.",                     r(&self.prompt_tokens)),
            (c, "axle_completion_tokens_total",     "Tokens generated.",                            r(&self.completion_tokens)),
            (g, "axle_queue_depth",                 "Requests waiting.",                            e.waiting as u64),
            (g, "axle_running_sequences",           "Sequences holding KV.",                        e.running as u64),
            (g, "axle_running_sequences_max",       "Peak running sequences since start.",          r(&self.max_running)),
            (g, "axle_kv_blocks_used",              "KV blocks in use.",                            e.kv_blocks_used as u64),
        ];
        for (kind, name, help, v) in series {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        for (name, help, counts) in [
            (
                "axle_drafted_tokens_total",
                "Draft tokens proposed, by drafter.",
                &self.drafted,
            ),
            (
                "axle_accepted_tokens_total",
                "Draft tokens accepted, by drafter.",
                &self.accepted,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for d in DraftSource::ALL {
                let _ = writeln!(
                    out,
                    "{name}{{drafter=\"{}\"}} {}",
                    d.name(),
                    r(&counts[d as usize])
                );
            }
        }
        if let Ok(h) = self.ttft.lock() {
            h.render(
                &mut out,
                "axle_time_to_first_token_seconds",
                "Time to first token.",
            );
        }
        if let Ok(h) = self.itl.lock() {
            h.render(
                &mut out,
                "axle_inter_token_latency_seconds",
                "Time between streamed tokens.",
            );
        }
        out
    }
}
