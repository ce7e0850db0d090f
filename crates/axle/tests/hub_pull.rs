//! `axle pull`, `list`, `rm` and `--model ORG/REPO` against a local server that speaks the Hub's
//! API (the same code path as the real Hub; only HF_ENDPOINT differs), with SmolLM2's real GGUF
//! served as a repository.
use axle_hub::mock::MockHub;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn smollm2() -> PathBuf {
    axle_models::fetched::model_path(axle_models::fetched::SMOLLM2)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn axle(home: &Path, endpoint: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_axle"))
        .args(args)
        .env("HF_HOME", home)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_CACHE")
        .output()
        .expect("run axle")
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn err(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

const REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF";

#[test]
fn pull_list_generate_offline_and_remove() {
    let mock = MockHub::start();
    let gguf = std::fs::read(smollm2()).expect("SmolLM2 GGUF");
    mock.add(
        REPO,
        vec![
            ("README.md".into(), b"# SmolLM2".to_vec()),
            ("smollm2-135m-instruct-q4_1.gguf".into(), gguf.clone()),
            (
                "smollm2-135m-instruct-q8_0.gguf".into(),
                b"not fetched".to_vec(),
            ),
        ],
    );
    let home = tempfile::tempdir().expect("temp dir");
    let ep = mock.endpoint().to_string();
    let id = format!("{REPO}:Q4_1");

    // A pull cut in the middle resumes and checks the whole file.
    mock.cut_next("smollm2-135m-instruct-q4_1.gguf", gguf.len() as u64 / 3);
    let out = ok(&axle(home.path(), &ep, &["pull", &id]));
    assert!(out.contains(&format!("hf:{REPO}@")), "{out}");
    let path = PathBuf::from(out.lines().last().expect("path line"));
    assert_eq!(std::fs::read(&path).expect("pulled file"), gguf);
    assert!(mock.log().iter().any(|l| l.contains("q4_1.gguf bytes=")));
    assert!(!mock.log().iter().any(|l| l.contains("q8_0")));

    let list = ok(&axle(home.path(), &ep, &["list"]));
    let row = list
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{list}"));
    for cell in ["llama", "Q4_1", "gguf", "yes"] {
        assert!(row.split_whitespace().any(|c| c == cell), "{cell}: {row}");
    }

    // The same tokens by id, offline, as by path.
    let gen = |model: &str, offline: bool| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--prompt",
            "The capital of France is",
        ];
        args.extend(["--max-tokens", "12", "--threads", "2"]);
        if offline {
            args.push("--offline");
        }
        let out = axle(home.path(), &ep, &args);
        (ok(&out), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (by_path, _) = gen(&smollm2().display().to_string(), false);
    let requests = mock.log().len();
    let (by_id, stderr) = gen(&id, true);
    assert_eq!(by_id, by_path);
    assert_eq!(mock.log().len(), requests, "--offline made a request");
    assert!(stderr.contains(&format!("from hf:{REPO}@")), "{stderr}");
    // Online, a cached model costs one listing request and no download.
    let (online, _) = gen(&id, false);
    assert_eq!(online, by_path);
    let log = mock.log();
    assert!(
        log[requests..].iter().all(|l| l.contains("/api/models/")),
        "{log:?}"
    );

    // Refusals, one line each.
    let e = err(&axle(home.path(), &ep, &["pull", "nobody/nothing"]));
    assert!(e.contains("nobody/nothing was not found"), "{e}");
    mock.add_gated(
        "org/gated",
        vec![("g-Q4_0.gguf".into(), gguf[..1000].to_vec())],
        "t",
    );
    let e = err(&axle(home.path(), &ep, &["pull", "org/gated"]));
    assert!(e.contains("org/gated is gated"), "{e}");
    let e = err(&axle(
        home.path(),
        &ep,
        &["pull", &format!("{REPO}:Q5_K_M")],
    ));
    assert!(e.contains("Q4_1, Q8_0"), "{e}");
    let e = err(&axle(
        home.path(),
        &ep,
        &[
            "generate",
            "--model",
            "org/other",
            "--prompt",
            "x",
            "--offline",
        ],
    ));
    assert!(e.contains("not in the Hub cache"), "{e}");
    // A sharded safetensors repository: pulled whole and run natively, as from its folder.
    let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf/llama-f32");
    let files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&folder)
        .expect("fixtures/hf/llama-f32 (scripts/make-hf-fixtures.py)")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("file"),
            )
        })
        .collect();
    mock.add("org/st", files);
    let (by_folder, _) = gen(&folder.display().to_string(), false);
    let (by_repo, stderr) = gen("org/st", false);
    assert_eq!(by_repo, by_folder);
    assert!(stderr.contains("from hf:org/st@"), "{stderr}");
    let list = ok(&axle(home.path(), &ep, &["list"]));
    let row = list
        .lines()
        .find(|l| l.starts_with("org/st "))
        .unwrap_or_else(|| panic!("{list}"));
    for cell in ["llama", "float32", "safetensors", "yes"] {
        assert!(row.split_whitespace().any(|c| c == cell), "{cell}: {row}");
    }

    let out = ok(&axle(home.path(), &ep, &["rm", REPO]));
    assert!(out.contains("removed"), "{out}");
    assert!(!path.exists());
    let e = err(&axle(
        home.path(),
        &ep,
        &["generate", "--model", &id, "--prompt", "x", "--offline"],
    ));
    assert!(e.contains("not in the Hub cache"), "{e}");
}
