//! What the RPC tests share: `axle rpc-server` processes on localhost, their prompts and engine
//! runs.
use axle_sdk::{EngineConfig, EngineCore, Model, RequestOptions};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A running `axle rpc-server`, killed when dropped.
pub struct Server {
    child: Child,
    pub endpoint: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub fn backends_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_axle"))
        .parent()
        .expect("the binary's folder")
        .join("backends")
}

pub fn start_server() -> Server {
    let endpoint = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_axle"))
        .args([
            "rpc-server",
            "--listen",
            &endpoint,
            "--device",
            "cpu",
            "--threads",
            "1",
        ])
        .env("AXLE_BACKENDS_DIR", backends_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start axle rpc-server");
    let mut server = Server { child, endpoint };
    let start = Instant::now();
    while TcpStream::connect(&server.endpoint).is_err() {
        if let Ok(Some(status)) = server.child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = server.child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            panic!(
                "axle rpc-server exited ({status}): {err}\n(build libggml-rpc.so with \
                 scripts/build-backend.sh rpc)"
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "axle rpc-server did not listen on {} within 30 s",
            server.endpoint
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

pub fn prompts(m: &Model) -> Vec<Vec<u32>> {
    [
        "The capital of France is",
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\ndef fib_memo(n, memo={}):\n",
        "1, 2, 3, 4, 5, 6, 7, 8,",
        "Once upon a time, in a small village by the sea, there lived an old fisherman who",
        "The list of colors: red, green, blue, red, green, blue, red,",
        "Water boils at",
    ]
    .iter()
    .map(|p| m.tokenizer.encode(p, true, false))
    .collect()
}

pub fn cfg(draft_len: usize) -> EngineConfig {
    EngineConfig {
        kv_slots: 2048,
        max_batch_tokens: 64,
        max_seqs: 8,
        draft_len,
        verify_cost: Some((0..=8).map(|k| 1.0 + 0.05 * k as f64).collect()),
        ..Default::default()
    }
}

/// Greedy tokens of each prompt, all prompts in one engine (batched) or each in its own, and
/// the drafts accepted.
pub fn run(
    m: &Arc<Model>,
    c: &EngineConfig,
    prompts: &[Vec<u32>],
    batched: bool,
) -> (Vec<Vec<u32>>, usize) {
    let opts = RequestOptions {
        max_tokens: 32,
        ..Default::default()
    };
    let groups: Vec<Vec<Vec<u32>>> = if batched {
        vec![prompts.to_vec()]
    } else {
        prompts.iter().map(|p| vec![p.clone()]).collect()
    };
    let (mut out, mut accepted) = (Vec::new(), 0);
    for group in groups {
        let mut e = EngineCore::new(m.clone(), c).expect("engine");
        let ids: Vec<_> = group
            .iter()
            .map(|p| e.add(p.clone(), opts.clone()).expect("add"))
            .collect();
        let mut d = e.drain(|_| {});
        accepted += d.accepted();
        out.extend(d.outputs(&ids));
    }
    (out, accepted)
}
