//! Bad input to the `axle` binary: each case gets a one-line error and a non-zero exit, never a
//! panic or a backtrace.
use std::path::PathBuf;
use std::process::Command;

fn smollm2() -> PathBuf {
    axle_models::fetched::model_path(axle_models::fetched::SMOLLM2)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("axle-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Runs axle and returns (exit code, stderr), asserting the error shape.
/// The stderr of a command line the argument parser refuses (exit code 2).
fn bad_flag(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_axle"))
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "exit code for {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn fails(args: &[&str]) -> String {
    fails_with_env(args, &[])
}

fn fails_with_env(args: &[&str], envs: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_axle"))
        .args(args)
        .envs(envs.iter().copied())
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "expected failure for {args:?}");
    assert_eq!(
        out.status.code(),
        Some(1),
        "exit code for {args:?}: {stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("stack backtrace"),
        "panic for {args:?}: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one error line for {args:?}, got: {stderr}"
    );
    assert!(lines[0].starts_with("error: "), "{stderr}");
    stderr
}

/// A minimal GGUF v3 file with the given string metadata and no tensors.
fn write_gguf(path: &PathBuf, kv: &[(&str, &str)]) {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        b.extend_from_slice(&(k.len() as u64).to_le_bytes());
        b.extend_from_slice(k.as_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    std::fs::write(path, b).unwrap();
}

#[test]
fn missing_model_file() {
    let e = fails(&[
        "generate",
        "--model",
        "/nonexistent/model.gguf",
        "--prompt",
        "hi",
    ]);
    assert!(
        e.contains("/nonexistent/model.gguf") && e.contains("No such file"),
        "{e}"
    );
}

#[test]
fn not_a_gguf_file() {
    let p = tmp("notes.txt");
    std::fs::write(&p, "just some text, not a model\n").unwrap();
    let e = fails(&["generate", "--model", p.to_str().unwrap(), "--prompt", "hi"]);
    assert!(e.contains("is not a GGUF file"), "{e}");
    let e = fails(&["tokenize", "--model", p.to_str().unwrap(), "hi"]);
    assert!(e.contains("is not a GGUF file"), "{e}");
}

#[test]
fn truncated_gguf_files() {
    let data = std::fs::read(smollm2()).unwrap();
    // Cut inside the tensor data: the header parses, the data is short.
    let p = tmp("truncated-data.gguf");
    std::fs::write(&p, &data[..data.len() / 2]).unwrap();
    let e = fails(&["generate", "--model", p.to_str().unwrap(), "--prompt", "hi"]);
    assert!(e.contains("truncated"), "{e}");
    // Cut inside the metadata: the header itself is incomplete.
    let p = tmp("truncated-header.gguf");
    std::fs::write(&p, &data[..4096]).unwrap();
    let e = fails(&["generate", "--model", p.to_str().unwrap(), "--prompt", "hi"]);
    assert!(e.contains("malformed GGUF"), "{e}");
    // It says what could not be read, and no route fixes a broken file.
    assert!(e.contains("failed to read"), "{e}");
    assert!(!e.contains("--allow-delegation"), "{e}");
}

#[test]
fn unknown_architecture() {
    let p = tmp("mamba.gguf");
    write_gguf(&p, &[("general.architecture", "mamba9")]);
    let e = fails(&["generate", "--model", p.to_str().unwrap(), "--prompt", "hi"]);
    assert!(
        e.contains("`mamba9` is not implemented natively") && e.contains("llama, gemma3"),
        "{e}"
    );
    // Naming the native backend gives the same answer; the hint says how to delegate instead.
    let e = fails(&[
        "generate",
        "--model",
        p.to_str().unwrap(),
        "--backend",
        "native",
        "--prompt",
        "hi",
    ]);
    assert!(
        e.contains("--backend native: GGUF architecture `mamba9`"),
        "{e}"
    );
    let e = fails(&["doctor", "--model", p.to_str().unwrap()]);
    assert!(e.contains("mamba9"), "{e}");
}

#[test]
fn prompt_longer_than_context() {
    let prompt = "word ".repeat(300);
    let e = fails(&[
        "generate",
        "--model",
        smollm2().to_str().unwrap(),
        "--prompt",
        &prompt,
        "--ctx",
        "64",
        "--threads",
        "2",
    ]);
    assert!(e.contains("does not fit the context of 64 tokens"), "{e}");
}

#[test]
fn generate_and_tokenize_work() {
    let m = smollm2();
    let out = Command::new(env!("CARGO_BIN_EXE_axle"))
        .args([
            "generate",
            "--model",
            m.to_str().unwrap(),
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "8",
            "--threads",
            "2",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Paris"), "unexpected continuation: {text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("decode: 8 tokens"));
    let out = Command::new(env!("CARGO_BIN_EXE_axle"))
        .args(["tokenize", "--model", m.to_str().unwrap(), "Hello world"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"Hello\""));
}

/// A device that is not registered is one clear error naming it, the devices there are and where
/// GPU backends were looked for; nothing is silently run on the CPU instead.
#[test]
fn unknown_device() {
    let m = smollm2();
    let m = m.to_str().unwrap();
    let err = fails(&[
        "generate", "--model", m, "--prompt", "Hi", "--device", "cuda7",
    ]);
    assert!(err.contains("no device `cuda7`"), "{err}");
    assert!(err.contains("devices here: cpu"), "{err}");
    assert!(err.contains("GPU backends load from"), "{err}");
}

/// `--device-products` where it cannot apply: wide products without a CUDA device, column
/// products without Axle's CUDA kernel, any choice with the fast kernels, and a name that is not
/// one.
#[test]
fn device_products_and_host_kernels_where_they_do_not_apply() {
    let m = smollm2();
    let m = m.to_str().unwrap();
    let gen = [
        "generate",
        "--model",
        m,
        "--prompt",
        "Hi",
        "--max-tokens",
        "1",
    ];
    // Refused by the run (one error line, exit code 1) or by the argument parser (exit code 2),
    // with an error that says `says`; returns the error.
    let run_refuses = |flags: &[&str], says: &str| {
        let err = fails(&[&gen[..], flags].concat());
        assert!(err.contains(says), "{err}");
        err
    };
    let parser_refuses = |flags: &[&str], says: &str| {
        let stderr = bad_flag(&[&gen[..], flags].concat());
        assert!(stderr.contains(says), "{stderr}");
    };
    let err = run_refuses(&["--device-products", "wide"], "wide device products need");
    assert!(err.contains("CUDA"), "{err}");
    run_refuses(
        &["--kernels", "fast", "--device-products", "groups"],
        "device products are a choice of the exact",
    );
    let err = run_refuses(
        &["--device-products", "columns"],
        "column device products need",
    );
    assert!(err.contains("scripts/build-backend.sh"), "{err}");
    parser_refuses(
        &["--device-products", "narrow"],
        "device products are groups, wide or columns",
    );
    // The same choices through AXLE_DEVICE_PRODUCTS: refused alike, not dropped.
    let env_refuses = |value: &str, says: &str| {
        let err = fails_with_env(&gen, &[("AXLE_DEVICE_PRODUCTS", value)]);
        assert!(err.contains(says), "{err}");
    };
    env_refuses("columns", "column device products need");
    env_refuses("wide", "wide device products need");
    env_refuses(
        "narrow",
        "AXLE_DEVICE_PRODUCTS: device products are groups, wide or columns",
    );
    // Host kernels: a choice of the exact kernels, by name.
    run_refuses(
        &["--kernels", "fast", "--host-kernels", "tiled"],
        "host kernels are a choice of the exact",
    );
    parser_refuses(
        &["--host-kernels", "fused"],
        "host kernels are origin, compatible or tiled",
    );
}

/// Several devices asked wrongly: each a clear error before anything loads. An RPC server that
/// is not there is an error naming it (ggml's client would abort the process: Axle checks the
/// address first); so is a split whose shares do not match the devices, and a device twice.
#[test]
fn bad_device_lists_and_rpc_servers() {
    let m = smollm2();
    let m = m.to_str().unwrap();
    let free_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let nobody = format!("127.0.0.1:{free_port}");
    let err = fails(&["generate", "--model", m, "--prompt", "Hi", "--rpc", &nobody]);
    assert!(
        err.contains(&format!("RPC server {nobody}: nothing accepts connections")),
        "{err}"
    );
    let err = fails(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "Hi",
        "--rpc",
        "not-an-address",
    ]);
    assert!(err.contains("not a host:port address"), "{err}");
    let err = fails(&[
        "generate", "--model", m, "--prompt", "Hi", "--device", "cpu", "--split", "1,2",
    ]);
    assert!(
        err.contains("--split needs one non-negative share per device"),
        "{err}"
    );
    let err = fails(&[
        "generate", "--model", m, "--prompt", "Hi", "--device", "cpu,cpu",
    ]);
    assert!(err.contains("device cpu is listed twice"), "{err}");
}

#[test]
fn numbers_out_of_range_are_refused_by_flag_not_wrapped() {
    let m = smollm2();
    let m = m.to_str().unwrap();
    for (args, flag) in [
        (vec!["--ctx", "4294967312"], "--ctx"),
        (vec!["--ctx", "0"], "--ctx"),
        (vec!["--kv-slots", "0"], "--kv-slots"),
        (vec!["--threads", "100000"], "threads"),
        (vec!["--threads", "0"], "threads"),
    ] {
        let mut all = vec![
            "generate",
            "--model",
            m,
            "--prompt",
            "Hi",
            "--max-tokens",
            "2",
        ];
        all.extend(args.iter().copied());
        let err = fails(&all);
        assert!(err.contains(flag), "{args:?}: {err}");
    }
    let err = fails(&["rpc-server", "--threads", "100000"]);
    assert!(err.contains("--threads"), "{err}");
}

#[test]
fn special_files_are_refused_without_blocking() {
    let fifo = tmp("model.fifo");
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let started = std::time::Instant::now();
    let err = fails(&[
        "generate",
        "--model",
        fifo.to_str().unwrap(),
        "--prompt",
        "Hi",
    ]);
    assert!(err.contains("not a regular file"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let dir = std::env::temp_dir();
    let err = fails(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "Hi",
    ]);
    assert!(err.contains("not a regular file"), "{err}");
    let _ = std::fs::remove_file(&fifo);
}

/// A quantization recipe Axle does not have is refused by the argument parser, naming the ones
/// it has.
#[test]
fn unknown_quantization_recipes_are_refused_by_flag() {
    let m = smollm2();
    let e = bad_flag(&[
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--quantize",
        "q3_k",
        "--prompt",
        "x",
    ]);
    assert!(e.contains("--quantize") && e.contains("q4_k_m"), "{e}");
}
