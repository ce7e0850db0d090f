//! A corpus of corrupted GGUF files, derived deterministically from the Llama fixture (the SmolLM2
//! tokenizer and a two-layer model, 5 MB) and from the real SmolLM2 file's header: truncations,
//! byte flips, absurd counts and string lengths, wrong value types, tensor dims, types and
//! offsets, and every numeric metadata value set to 0, -1, 2^32-1, NaN and infinity. Each copy is
//! loaded; a copy that loads must then prefill a short prompt and decode a token. The promise: no
//! panic, no abort, no hang, every case done or refused with an error, and quickly (a case over
//! `HARD_LIMIT` fails the test; the slowest is printed). The counts by outcome are printed, and the
//! README quotes them.
mod common;

use axle_models::{Model, ModelOptions, Runner, RunnerOptions, Sequence};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A case running longer than this is a hang.
const HARD_LIMIT: Duration = Duration::from_secs(10);

/// Where each part of a GGUF file lies, as read by a walker of the format (independent of the
/// reader under test).
#[derive(Debug, Default)]
struct Layout {
    /// (offset of the key's length, offset of the value type, offset of the value, type).
    kvs: Vec<(usize, usize, usize, u32)>,
    /// Offsets of array lengths (element type at `at - 4`).
    array_lens: Vec<usize>,
    /// (offset of the name length, offset of n_dims, offsets of the dims, offset of the type,
    /// offset of the data offset).
    tensors: Vec<(usize, usize, Vec<usize>, usize, usize)>,
    /// End of the tensor infos.
    infos_end: usize,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Size of a scalar of GGUF type `ty` (strings and arrays are not scalars).
fn scalar_size(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => panic!("type {ty} is not a scalar"),
    }
}

/// Walks a value of type `ty` at `at`; returns the offset after it.
fn skip_value(b: &[u8], at: usize, ty: u32, layout: &mut Layout) -> usize {
    match ty {
        8 => at + 8 + u64_at(b, at) as usize,
        9 => {
            let elem = u32_at(b, at);
            let n = u64_at(b, at + 4) as usize;
            layout.array_lens.push(at + 4);
            let mut p = at + 12;
            for _ in 0..n {
                p = skip_value(b, p, elem, layout);
            }
            p
        }
        t => at + scalar_size(t),
    }
}

fn layout(b: &[u8]) -> Layout {
    let mut l = Layout::default();
    let n_tensors = u64_at(b, 8) as usize;
    let n_kv = u64_at(b, 16) as usize;
    let mut p = 24;
    for _ in 0..n_kv {
        let key_at = p;
        p += 8 + u64_at(b, p) as usize;
        let ty = u32_at(b, p);
        let value = p + 4;
        l.kvs.push((key_at, p, value, ty));
        p = skip_value(b, value, ty, &mut l);
    }
    for _ in 0..n_tensors {
        let name_at = p;
        p += 8 + u64_at(b, p) as usize;
        let n_dims_at = p;
        let n_dims = u32_at(b, p) as usize;
        p += 4;
        let dims = (0..n_dims).map(|i| p + 8 * i).collect();
        p += 8 * n_dims;
        l.tensors.push((name_at, n_dims_at, dims, p, p + 4));
        p += 12;
    }
    l.infos_end = p;
    l
}

/// One corrupted copy: what was done, and the bytes.
struct Case {
    what: String,
    bytes: Vec<u8>,
}

fn with(base: &[u8], what: String, edit: impl FnOnce(&mut Vec<u8>)) -> Case {
    let mut bytes = base.to_vec();
    edit(&mut bytes);
    Case { what, bytes }
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

/// A uniform draw in [0, n) (the corpus is the same on every machine: a seeded ChaCha).
fn below(rng: &mut ChaCha8Rng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// The corpus derived from `base` (named `name` in the cases): every `tensor_stride`-th tensor's
/// infos are corrupted in each way.
fn corpus(name: &str, base: &[u8], flips: usize, tensor_stride: usize) -> Vec<Case> {
    let l = layout(base);
    let mut cases = Vec::new();
    let len = base.len();
    // Truncations: inside the header, at the end of the infos, and through the data.
    for cut in [
        0,
        3,
        4,
        8,
        12,
        20,
        24,
        100,
        1000,
        l.infos_end - 1,
        l.infos_end,
    ]
    .into_iter()
    .chain((1..20).map(|i| l.infos_end + (len - l.infos_end) * i / 20))
    .chain([len - 1])
    {
        cases.push(Case {
            what: format!("{name}: truncated to {cut} bytes"),
            bytes: base[..cut.min(len)].to_vec(),
        });
    }
    // Header counts and the version.
    for (at, field) in [(4, "version"), (8, "tensor count"), (16, "kv count")] {
        let width = if at == 4 { 4 } else { 8 };
        for v in [0u64, 1, 0xFFFF_FFFF, u64::MAX] {
            cases.push(with(base, format!("{name}: {field} = {v}"), |b| {
                put(b, at, &v.to_le_bytes()[..width])
            }));
        }
    }
    // Every key's string length, every array length: zero and absurd.
    for &(key_at, ..) in &l.kvs {
        for v in [0u64, 1 << 40, u64::MAX] {
            cases.push(with(
                base,
                format!("{name}: key length at {key_at} = {v}"),
                |b| put(b, key_at, &v.to_le_bytes()),
            ));
        }
    }
    for &at in &l.array_lens {
        for v in [0u64, 3, 1 << 40, u64::MAX] {
            cases.push(with(
                base,
                format!("{name}: array length at {at} = {v}"),
                |b| put(b, at, &v.to_le_bytes()),
            ));
        }
    }
    // Every value's type, changed; every numeric value set to edge values.
    for &(_, ty_at, value_at, ty) in &l.kvs {
        for new in [ty ^ 1, 8, 9, 13, 0xFFFF_FFFF] {
            cases.push(with(
                base,
                format!("{name}: value type at {ty_at} {ty} -> {new}"),
                |b| put(b, ty_at, &new.to_le_bytes()),
            ));
        }
        let edges: Vec<Vec<u8>> = match ty {
            4 | 5 => [0u32, 1, u32::MAX, 0x8000_0000]
                .iter()
                .map(|v| v.to_le_bytes().to_vec())
                .collect(),
            10 | 11 => [0u64, u64::MAX, 1 << 40]
                .iter()
                .map(|v| v.to_le_bytes().to_vec())
                .collect(),
            6 => [0.0f32, -1.0, f32::NAN, f32::INFINITY, 1e30]
                .iter()
                .map(|v| v.to_le_bytes().to_vec())
                .collect(),
            8 => [0u64, u64::MAX]
                .iter()
                .map(|v| v.to_le_bytes().to_vec())
                .collect(),
            _ => Vec::new(),
        };
        for v in edges {
            cases.push(with(
                base,
                format!("{name}: value at {value_at} (type {ty}) = {v:02x?}"),
                |b| put(b, value_at, &v),
            ));
        }
    }
    // Every tensor: name length, dims count, each dim, type, data offset.
    for (name_at, n_dims_at, dims, type_at, offset_at) in l.tensors.iter().step_by(tensor_stride) {
        let t = format!("{name}: tensor info at {name_at}");
        cases.push(with(base, format!("{t}: name length = 2^40"), |b| {
            put(b, *name_at, &(1u64 << 40).to_le_bytes())
        }));
        for v in [0u32, 5, 255] {
            cases.push(with(base, format!("{t}: n_dims = {v}"), |b| {
                put(b, *n_dims_at, &v.to_le_bytes())
            }));
        }
        for &d in dims {
            for v in [0u64, 3, 1 << 33, u64::MAX] {
                cases.push(with(base, format!("{t}: dim at {d} = {v}"), |b| {
                    put(b, d, &v.to_le_bytes())
                }));
            }
        }
        for v in [0u32, 1, 2, 12, 40, 0xFFFF] {
            cases.push(with(base, format!("{t}: type = {v}"), |b| {
                put(b, *type_at, &v.to_le_bytes())
            }));
        }
        for v in [1u64, 1 << 40, u64::MAX - 31] {
            cases.push(with(base, format!("{t}: data offset = {v}"), |b| {
                put(b, *offset_at, &v.to_le_bytes())
            }));
        }
    }
    // Random byte flips in the header and tensor infos (and a few in the data).
    let mut rng = ChaCha8Rng::seed_from_u64(len as u64);
    for i in 0..flips {
        let at = if i % 10 == 9 {
            l.infos_end + below(&mut rng, len - l.infos_end)
        } else {
            below(&mut rng, l.infos_end)
        };
        let v = (rng.next_u64() & 0xFF) as u8 | 1;
        cases.push(with(base, format!("{name}: byte {at} ^= {v:#04x}"), |b| {
            b[at] ^= v
        }));
    }
    cases
}

/// What a case did.
#[derive(Debug, PartialEq, Eq, Hash, Clone, Copy, PartialOrd, Ord)]
enum Outcome {
    /// Load refused with an error.
    Refused,
    /// Loaded; then the runner or a step refused with an error.
    RefusedLater,
    /// Loaded and generated a token.
    Ran,
}

/// Loads `path`; if it loads, prefills a short prompt and decodes one token.
fn try_file(path: &Path) -> Result<Outcome, String> {
    let model = match Model::load(path, &ModelOptions::cpu(1)) {
        Ok(m) => std::sync::Arc::new(m),
        Err(e) => {
            let msg = e.to_string();
            if msg.trim().is_empty() {
                return Err("refused with an empty message".into());
            }
            return Ok(Outcome::Refused);
        }
    };
    let opts = RunnerOptions {
        kv_slots: 256,
        ..Default::default()
    };
    let Ok(mut runner) = Runner::new(model.clone(), opts) else {
        return Ok(Outcome::RefusedLater);
    };
    let prompt = model
        .tokenizer
        .encode("The capital of France is", true, false);
    let prompt: Vec<u32> = prompt
        .into_iter()
        .filter(|&t| (t as usize) < model.tokenizer.len())
        .collect();
    let mut seq = Sequence::new(&runner);
    let Ok(logits) = seq.feed(&mut runner, if prompt.is_empty() { &[0] } else { &prompt }) else {
        return Ok(Outcome::RefusedLater);
    };
    let next = logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 {
                (i, v)
            } else {
                best
            }
        })
        .0 as u32;
    match seq.feed(&mut runner, &[next]) {
        Ok(_) => Ok(Outcome::Ran),
        Err(_) => Ok(Outcome::RefusedLater),
    }
}

/// Runs every case, its copies written under a folder named `tag` (one per test, so that tests
/// running side by side keep to their own files).
fn run_corpus(tag: &str, cases: Vec<Case>) {
    let dir = std::env::temp_dir().join(format!("axle-corrupt-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut counts = std::collections::BTreeMap::new();
    let mut slowest = (Duration::ZERO, String::new());
    let n = cases.len();
    for (i, case) in cases.into_iter().enumerate() {
        let path: PathBuf = dir.join(format!("case-{i}.gguf"));
        std::fs::write(&path, &case.bytes).expect("write");
        // Each case in a thread of its own, so that a hang fails the test instead of stalling it.
        let (tx, rx) = mpsc::channel();
        let p = path.clone();
        let t0 = Instant::now();
        std::thread::spawn(move || {
            let _ = tx.send(try_file(&p));
        });
        let outcome = match rx.recv_timeout(HARD_LIMIT) {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => panic!("{}: {e}", case.what),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("{}: still running after {HARD_LIMIT:?}", case.what)
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{}: panicked", case.what),
        };
        let took = t0.elapsed();
        if took > slowest.0 {
            slowest = (took, case.what.clone());
        }
        *counts.entry(outcome).or_insert(0) += 1;
        std::fs::remove_file(&path).ok();
    }
    std::fs::remove_dir_all(&dir).ok();
    println!(
        "{n} cases: {counts:?}; slowest {:?} ({})",
        slowest.0, slowest.1
    );
}

/// The fixture, whole (header, tensor infos and data): every kind of corruption.
#[test]
fn corrupted_fixture_files_are_refused_or_run_never_crash() {
    let base = std::fs::read(common::fixture("llama-tiny.gguf")).expect("fixture");
    let cases = corpus("llama-tiny", &base, 200, 1);
    assert!(cases.len() > 600, "{} cases", cases.len());
    run_corpus("fixture", cases);
}

/// The real SmolLM2 file's metadata and tensor infos (its 98 MB of weights cut to the first
/// megabyte after the infos, so every copy is refused for its size or earlier): the real
/// tokenizer arrays and keys, and every ninth of its 272 tensors.
#[test]
fn corrupted_real_headers_are_refused_never_crash() {
    let real = std::fs::read(common::model(common::SMOLLM2)).expect("model");
    let end = layout(&real).infos_end + (1 << 20);
    let cases = corpus("SmolLM2 header", &real[..end], 100, 9);
    assert!(cases.len() > 600, "{} cases", cases.len());
    run_corpus("smollm2", cases);
}
