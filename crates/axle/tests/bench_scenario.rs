//! `axle bench scenario / check / report` end to end: the smoke manifest (all four check kinds on
//! a tiny fixture) passes, the regression check fails against a baseline doctored to be 20 %
//! faster and passes against an honest one, and bad manifests get clear errors.
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn axle(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_axle"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run axle")
}

/// The stdout of a run that must have succeeded (`what` names it when it did not).
fn succeeded(o: &std::process::Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("axle-bench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the smoke manifest once; returns its artifact's path.
fn smoke(out: &Path) -> PathBuf {
    let t0 = Instant::now();
    let o = axle(&[
        "bench",
        "scenario",
        "--manifest",
        "benchmarks/manifests/smoke.toml",
        "--output-root",
        out.to_str().unwrap(),
    ]);
    succeeded(&o, "smoke");
    assert!(
        t0.elapsed().as_secs() < 60,
        "the smoke scenario must stay under a minute"
    );
    out.join("smoke.json")
}

#[test]
fn smoke_manifest_runs_every_check_kind_and_passes() {
    let out = tmp("smoke");
    let a: Value = serde_json::from_slice(&std::fs::read(smoke(&out)).unwrap()).unwrap();
    let kinds: Vec<&str> = a["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["correctness", "determinism", "route", "regression"],
        "{a}"
    );
    assert!(a["checks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["passed"] == true));
    assert_eq!(a["passed"], true);
    assert_eq!(a["runtime"]["selected_backend"], "native");
    // Environment and raw per-repetition figures are recorded.
    let env = &a["environment"];
    for k in ["cpu_model", "git_commit", "model_sha256", "os", "build"] {
        assert!(env[k].as_str().is_some_and(|s| !s.is_empty()), "{k}");
    }
    let decode = a["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["metric"] == "decode_tok_s")
        .unwrap();
    assert_eq!(decode["axle"].as_array().unwrap().len(), 5);
    assert_eq!(decode["reference_name"], "libllama");
    assert!(decode["ratio"].as_f64().unwrap() > 0.0);
    // The report renders it, with a chart.
    let reports = out.join("reports");
    let o = axle(&[
        "bench",
        "report",
        out.join("smoke.json").to_str().unwrap(),
        "--output",
        reports.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(md.contains("| generate | decode_tok_s (tok/s) |"), "{md}");
    let svg = std::fs::read_to_string(reports.join("smoke.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<rect"));
}

/// The artifact with every Axle figure made `factor` times better.
fn doctored(artifact: &Path, factor: f64, to: &Path) {
    let mut a: Value = serde_json::from_slice(&std::fs::read(artifact).unwrap()).unwrap();
    for r in a["rows"].as_array_mut().unwrap() {
        let f = if r["higher_is_better"] == true {
            factor
        } else {
            1.0 / factor
        };
        let m = r["axle_median"].as_f64().unwrap() * f;
        r["axle_median"] = m.into();
        for x in r["axle"].as_array_mut().unwrap() {
            *x = (x.as_f64().unwrap() * f).into();
        }
    }
    std::fs::write(to, serde_json::to_vec_pretty(&a).unwrap()).unwrap();
}

#[test]
fn regression_check_fails_on_a_faster_baseline_and_passes_on_an_honest_one() {
    let out = tmp("regression");
    let current = smoke(&out);
    let fake = out.join("baseline-20pct-faster.json");
    doctored(&current, 1.2, &fake);
    let check = |baseline: &Path| {
        axle(&[
            "bench",
            "check",
            "--artifact",
            current.to_str().unwrap(),
            "--baseline",
            baseline.to_str().unwrap(),
        ])
    };
    let o = check(&fake);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "{text}");
    assert!(
        text.contains("regression: FAILED") && text.contains("decode_tok_s"),
        "{text}"
    );
    let o = check(&current);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("regression: passed"), "{text}");
    // 5 % slower than the baseline is within the default 10 %.
    let near = out.join("baseline-5pct-faster.json");
    doctored(&current, 1.05, &near);
    assert!(check(&near).status.success());
}

#[test]
fn bad_manifests_get_clear_errors() {
    let out = tmp("bad");
    let write = |name: &str, text: &str| {
        let p = out.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let run = |p: &Path| {
        let o = axle(&["bench", "scenario", "--manifest", p.to_str().unwrap()]);
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let base = "name = \"x\"\n[model]\npath = \"FIXTURE\"\n[workload]\nkind = \"generate\"\nprompts = [\"hi\"]\nmax_tokens = 4\n";
    let fixture = root().join("fixtures/llama-tiny.gguf");
    let ok = base.replace("FIXTURE", fixture.to_str().unwrap());
    let e = run(&write("typo.toml", &format!("{ok}repetitons = 3\n")));
    assert!(e.contains("unknown field `repetitons`"), "{e}");
    let e = run(&write("kind.toml", &ok.replace("generate", "genrate")));
    assert!(e.contains("genrate"), "{e}");
    let e = run(&write(
        "missing.toml",
        &base.replace("FIXTURE", "/nope.gguf"),
    ));
    assert!(
        e.contains("/nope.gguf is missing") && e.contains("fetch-models"),
        "{e}"
    );
    let e = run(&write(
        "baseline.toml",
        &format!("{ok}[checks.regression]\nbaseline = \"none.json\"\n"),
    ));
    assert!(e.contains("none.json"), "{e}");
}

/// `axle bench device-check` on the CPU with the tiny llama fixture: the report names the device,
/// the commit and the device products, and the checks hold (logits equal libllama's, greedy output
/// identical, speculation and batching exact).
#[test]
fn device_check_reports_what_ran_and_passes_on_the_cpu() {
    let out = tmp("device-check").join("dc.json");
    let fixture = root().join("fixtures/llama-tiny.gguf");
    assert!(
        fixture.exists(),
        "missing {} (scripts/setup-tests.sh writes it)",
        fixture.display()
    );
    let o = Command::new(env!("CARGO_BIN_EXE_axle"))
        .args([
            "bench",
            "device-check",
            "--model",
            fixture.to_str().unwrap(),
            "--device",
            "cpu",
            "--continuation",
            "8",
            "--output",
            out.to_str().unwrap(),
        ])
        .current_dir(root())
        .env("AXLE_GIT_COMMIT", "0123abc")
        .env_remove("AXLE_DEVICE_PRODUCTS")
        .output()
        .expect("run axle");
    let stdout = succeeded(&o, "device-check");
    assert!(
        stdout.contains("device products: host layout; commit 0123abc"),
        "{stdout}"
    );
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(r["device"], "CPU");
    assert_eq!(r["git_commit"], "0123abc");
    assert_eq!(r["device_products"], "host layout");
    let n = r["prompts"].as_array().unwrap().len();
    assert_eq!(n, 20);
    for key in [
        "greedy_identical",
        "speculation_alone_identical",
        "speculation_batched_identical",
        "batched_plain_identical",
        "batched_logprobs_identical",
    ] {
        assert_eq!(r[key].as_u64(), Some(n as u64), "{key}: {r}");
    }
    assert_eq!(r["worst_max_abs_diff"].as_f64(), Some(0.0), "{r}");
}
