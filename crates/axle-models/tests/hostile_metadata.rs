//! Corrupt metadata is refused at load with one error naming the key, before anything is
//! allocated or computed. Each case patches one value of a real file (SmolLM2) or a fixture in
//! memory, writes the copy to a temporary file and loads it. Before these checks, a rotary
//! dimension count of 0 spun forever inside ggml's rope, an odd one or an RMS epsilon of NaN or -1
//! aborted on ggml asserts, a block count of 2^32-1 asked for a 962 GB allocation, and a block
//! count below the file's layers, a rope base of 0, an EOS id outside the vocabulary and a context
//! length of 2^32-1 loaded without a word.
mod common;

use axle_models::{Model, ModelOptions};
use std::time::{Duration, Instant};

/// Replaces the value of metadata `key` (a number of any GGUF numeric type) with `value`.
fn patch_kv(bytes: &mut [u8], key: &str, value: f64) {
    let k = key.as_bytes();
    let mut at = None;
    for i in 8..bytes.len() - k.len() {
        if &bytes[i..i + k.len()] == k
            && u64::from_le_bytes(bytes[i - 8..i].try_into().unwrap()) == k.len() as u64
        {
            at = Some(i + k.len());
            break;
        }
    }
    let at = at.unwrap_or_else(|| panic!("key {key} not in the file"));
    let ty = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let v = at + 4;
    let enc: Vec<u8> = match ty {
        4 => (value as u32).to_le_bytes().to_vec(),
        5 => (value as i32).to_le_bytes().to_vec(),
        6 => (value as f32).to_le_bytes().to_vec(),
        10 => (value as u64).to_le_bytes().to_vec(),
        11 => (value as i64).to_le_bytes().to_vec(),
        12 => value.to_le_bytes().to_vec(),
        other => panic!("{key}: GGUF type {other} is not a patchable number"),
    };
    bytes[v..v + enc.len()].copy_from_slice(&enc);
}

/// Sets the type of tensor `name` in the tensor infos.
fn patch_tensor_type(bytes: &mut [u8], name: &str, ty: u32) {
    let n = name.as_bytes();
    let i = (8..bytes.len() - n.len())
        .find(|&i| {
            &bytes[i..i + n.len()] == n
                && u64::from_le_bytes(bytes[i - 8..i].try_into().unwrap()) == n.len() as u64
        })
        .unwrap_or_else(|| panic!("tensor {name} not in the file"));
    let mut at = i + n.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    at += 4 + 8 * n_dims;
    bytes[at..at + 4].copy_from_slice(&ty.to_le_bytes());
}

/// Loads the patched copy; returns the error text (the load must fail, and fast).
fn load_error(bytes: &[u8], what: &str) -> String {
    let dir = std::env::temp_dir().join(format!("axle-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("patched.gguf");
    std::fs::write(&path, bytes).unwrap();
    let t = Instant::now();
    let r = Model::load(&path, &ModelOptions::cpu(2));
    let took = t.elapsed();
    std::fs::remove_file(&path).ok();
    assert!(took < Duration::from_secs(5), "{what}: took {took:?}");
    match r {
        Ok(_) => panic!("{what}: loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn corrupt_metadata_is_refused_naming_the_key() {
    let real = std::fs::read(common::model(common::SMOLLM2)).unwrap();
    let fixture = std::fs::read(common::fixture("llama-tiny.gguf")).unwrap();
    let nan = f64::NAN;
    let cases: &[(&Vec<u8>, &str, f64)] = &[
        (&real, "llama.rope.dimension_count", 0.0),
        (&real, "llama.rope.dimension_count", 63.0),
        (&real, "llama.rope.dimension_count", 4096.0),
        (&fixture, "llama.attention.layer_norm_rms_epsilon", nan),
        (&fixture, "llama.attention.layer_norm_rms_epsilon", -1.0),
        (&fixture, "llama.block_count", u32::MAX as f64),
        (&fixture, "llama.block_count", 1.0),
        (&fixture, "llama.block_count", 0.0),
        (&fixture, "llama.rope.freq_base", 0.0),
        (&fixture, "llama.rope.freq_base", f64::INFINITY),
        (&fixture, "llama.context_length", u32::MAX as f64),
        (&fixture, "llama.embedding_length", u32::MAX as f64),
        (&fixture, "llama.attention.key_length", 0.0),
        (&fixture, "tokenizer.ggml.eos_token_id", 1e6),
        (&fixture, "tokenizer.ggml.bos_token_id", 1e6),
    ];
    for &(file, key, value) in cases {
        let mut bytes = file.clone();
        patch_kv(&mut bytes, key, value);
        let what = format!("{key} = {value}");
        let err = load_error(&bytes, &what);
        println!("{what}: {err}");
        let short = key.rsplit('.').next().unwrap();
        assert!(
            err.contains(short),
            "{what}: the error does not name the key: {err}"
        );
    }
    // A norm weight whose type says F16 (ggml's element-wise ops abort on one): refused, here by
    // the reader, since the tensor's data no longer fills its span (a well-formed file with an
    // F16 norm is refused by the weight binding, which takes one-dimensional weights as F32 only).
    let mut bytes = fixture.clone();
    patch_tensor_type(&mut bytes, "output_norm.weight", 1);
    let err = load_error(&bytes, "output_norm.weight as f16");
    println!("output_norm.weight as f16: {err}");
}

#[test]
fn the_unpatched_files_load() {
    for path in [
        common::model(common::SMOLLM2),
        common::fixture("llama-tiny.gguf"),
    ] {
        Model::load(&path, &ModelOptions::cpu(2)).unwrap();
    }
}

/// A KV pool larger than the memory available is refused before it is allocated, with the
/// numbers (and a pool that fits is not).
#[test]
fn a_kv_pool_over_available_memory_is_refused() {
    use axle_models::{Runner, RunnerOptions};
    let model = std::sync::Arc::new(
        Model::load(common::model(common::SMOLLM2), &ModelOptions::cpu(2)).unwrap(),
    );
    // 23 KiB a slot: about 90 TiB.
    let slots = 4_000_000_000 / 16 * 16;
    let t = Instant::now();
    let err = Runner::new(
        model.clone(),
        RunnerOptions {
            kv_slots: slots,
            ..Default::default()
        },
    )
    .expect_err("a 90 TiB KV pool was allocated");
    assert!(t.elapsed() < Duration::from_secs(5));
    let msg = err.to_string();
    println!("{msg}");
    assert!(
        msg.contains("KV pool needs") && msg.contains("MiB"),
        "{msg}"
    );
    Runner::new(
        model,
        RunnerOptions {
            kv_slots: 1024,
            ..Default::default()
        },
    )
    .expect("a small pool");
}
