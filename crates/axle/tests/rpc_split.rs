//! A model split across processes through ggml's RPC backend, on this machine's CPU: two
//! `axle rpc-server` processes on localhost each serve a CPU device, and SmolLM2's 30 layers
//! spread over the local CPU (layers 0-9) and the two servers (10-19, 20-29), each layer's KV on
//! its device. Greedy output must be the same as the unsplit CPU run's, token for token, for
//! every prompt alone, all prompts batched, and with n-gram speculation on. Gemma 3 split the
//! same way must give the same tokens alone, batched and with speculation.
//!
//! Needs `libggml-rpc.so` (`scripts/build-backend.sh rpc`, which the test setup runs) in
//! `target/release/backends`; fails with that instruction when it is missing.
use axle_sdk::{EngineConfig, EngineCore, Model, ModelOptions, Output, RequestOptions};
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A running `axle rpc-server`, killed when dropped.
struct Server {
    child: Child,
    endpoint: String,
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

fn backends_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_axle"))
        .parent()
        .expect("the binary's folder")
        .join("backends")
}

fn start_server() -> Server {
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

fn prompts(m: &Model) -> Vec<Vec<u32>> {
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

fn cfg(max_draft: usize) -> EngineConfig {
    EngineConfig {
        kv_slots: 2048,
        max_batch_tokens: 64,
        max_seqs: 8,
        max_draft,
        verify_cost: Some((0..=8).map(|k| 1.0 + 0.05 * k as f64).collect()),
        ..Default::default()
    }
}

/// Greedy tokens of each prompt, all prompts in one engine (batched) or each in its own, and
/// the drafts accepted.
fn run(
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
        let mut toks: HashMap<u64, Vec<u32>> = HashMap::new();
        while e.has_work() {
            for o in e.step() {
                match o {
                    Output::Token { id, token, .. } => toks.entry(id).or_default().push(token),
                    Output::Finished { finish, .. } => accepted += finish.speculation.accepted,
                }
            }
        }
        out.extend(ids.iter().map(|id| toks.remove(id).unwrap_or_default()));
    }
    (out, accepted)
}

#[test]
fn split_over_two_rpc_servers_and_the_cpu_matches_the_unsplit_run() {
    std::env::set_var("AXLE_BACKENDS_DIR", backends_dir());
    let (a, b) = (start_server(), start_server());
    let rpc = vec![a.endpoint.clone(), b.endpoint.clone()];
    let load_split = |path: &std::path::Path| {
        Arc::new(
            Model::load(
                path,
                &ModelOptions {
                    device: "cpu,rpc0,rpc1".parse().expect("device list"),
                    split: Some(vec![1.0, 1.0, 1.0]),
                    rpc: rpc.clone(),
                    ..ModelOptions::cpu(2)
                },
            )
            .unwrap_or_else(|e| panic!("split load: {e}")),
        )
    };
    let fetched =
        |name: &str| axle_models::fetched::model_path(name).unwrap_or_else(|e| panic!("{e}"));

    // SmolLM2 (Q4_1): the split run against the unsplit CPU run.
    let path = fetched(axle_models::fetched::SMOLLM2);
    let unsplit = Arc::new(Model::load(&path, &ModelOptions::cpu(2)).expect("load"));
    let split = load_split(&path);
    let summary = split.device_summary();
    println!("placement: {summary}");
    assert!(
        summary.starts_with("CPU layers 0-9, RPC0")
            && summary.contains("layers 10-19, RPC1")
            && summary.ends_with("layers 20-29"),
        "{summary}"
    );
    let ps = prompts(&unsplit);
    let (reference, _) = run(&unsplit, &cfg(0), &ps, false);
    check_split("SmolLM2", &split, &ps, &reference);

    // Gemma 3 (Q4_K_M): batching and speculation across the split, against the split run
    // alone. Not against the unsplit run: an RPC device counts as an accelerator (ggml cannot
    // tell what serves it), so its layers take the device layout, whose prefill products run
    // as one product; on a CPU server that is ggml's tiled K-quant kernel, which rounds
    // differently from the CPU layout's sliced products (docs/multi-device.md).
    let path = fetched(axle_models::fetched::GEMMA3);
    let split = load_split(&path);
    let ps = prompts(&split);
    let (reference, _) = run(&split, &cfg(0), &ps, false);
    check_split("Gemma 3", &split, &ps, &reference);
}

/// The split model's greedy tokens equal `reference` for every prompt alone and batched, with
/// n-gram speculation off and on (and drafts accepted when on).
fn check_split(name: &str, split: &Arc<Model>, ps: &[Vec<u32>], reference: &[Vec<u32>]) {
    assert!(reference.iter().all(|t| t.len() == 32), "{reference:?}");
    for (what, c, batched) in [
        ("alone", cfg(0), false),
        ("batched", cfg(0), true),
        ("alone, n-gram speculation", cfg(4), false),
        ("batched, n-gram speculation", cfg(4), true),
    ] {
        let (got, accepted) = run(split, &c, ps, batched);
        for (i, (r, g)) in reference.iter().zip(&got).enumerate() {
            assert_eq!(r, g, "{name} split run ({what}) differs on prompt {i}");
        }
        if c.max_draft > 0 {
            assert!(
                accepted > 0,
                "{name}: no draft was accepted ({what}): speculation not exercised"
            );
        }
        println!(
            "{name} split ({what}): {}/{} prompts identical, {accepted} drafted tokens accepted",
            got.len(),
            ps.len()
        );
    }
}
