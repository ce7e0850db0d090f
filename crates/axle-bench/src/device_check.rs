//! Correctness on a device (a GPU), as a command whose report is checked in, since CI has no GPU:
//! Axle's logits and greedy continuations against libllama on the same device and the same
//! backend (flash attention on, as Axle runs), with libllama against itself (flash attention off)
//! as the yardstick of how far two correct kernel choices drift apart; then the engine's greedy
//! output with n-gram speculation on against off, each prompt alone and all of them batched.
//! Models whose file carries an MTP block also get their head's logits compared with libllama's
//! MTP context on the same device, fed the same hidden states.
use crate::BenchError;
use axle_core::TokenId;
use axle_ggml::oracle::{LlamaOracle, MtpOracle, OracleOptions};
use axle_models::device_step::DeviceProducts;
use axle_models::kv::KvType;
use axle_models::{LogitRows, Model, Runner, RunnerOptions, SeqInput, Sequence, StateSlots};
use axle_sdk::{EngineConfig, EngineCore, RequestOptions};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Options of a device check.
#[derive(Debug, Clone)]
pub struct DeviceCheckOptions {
    /// Greedy tokens generated per prompt.
    pub continuation: usize,
    /// CPU threads (for what stays on the CPU, and libllama's).
    pub threads: usize,
    /// The KV type of the engine runs (speculation on and off, alone and batched); with one
    /// other than F16 the plain batched run is repeated with F16 KV, and their greedy outputs
    /// compared.
    pub kv_type: KvType,
}

/// One prompt's comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PromptCheck {
    /// Prompt tokens.
    pub tokens: usize,
    /// max |Axle - libllama (flash attention on)| over the last position's logits.
    pub max_abs_diff: f32,
    /// The same between libllama with flash attention on and off.
    pub llama_self_max_abs_diff: f32,
    /// Relative L2 distance of Axle's last logits from libllama's.
    pub rel_l2: f64,
    /// Whether Axle's top-1 token equals libllama's.
    pub top1_same: bool,
    /// Whether Axle's greedy continuation equals libllama's (flash attention on).
    pub greedy_same: bool,
    /// Whether libllama's greedy continuations with flash attention on and off agree.
    pub llama_self_greedy_same: bool,
    /// Tokens before Axle's continuation first differs from libllama's.
    pub agree_prefix: usize,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceCheckReport {
    /// Where Axle ran.
    pub device: String,
    /// The commit of the code that ran (`AXLE_GIT_COMMIT` where set, as for scenario artifacts).
    #[serde(default)]
    pub git_commit: String,
    /// How the engine's device layout multiplied small columns (`groups`, `wide`, `columns`), or
    /// `host layout` where its steps did not take the device layout.
    #[serde(default)]
    pub device_products: String,
    /// Per prompt.
    pub prompts: Vec<PromptCheck>,
    /// Greedy continuations identical to libllama's.
    pub greedy_identical: usize,
    /// libllama's own flash-attention-on/off agreement (the bar for `greedy_identical`).
    pub llama_self_identical: usize,
    /// Worst max |dlogit| against libllama.
    pub worst_max_abs_diff: f32,
    /// Worst of libllama against itself.
    pub worst_llama_self_max_abs_diff: f32,
    /// Prompts whose speculative output equals plain output, alone.
    pub speculation_alone_identical: usize,
    /// Prompts whose speculative output equals plain output with every prompt in one engine.
    pub speculation_batched_identical: usize,
    /// Prompts whose batched plain output equals their plain output alone.
    pub batched_plain_identical: usize,
    /// Prompts whose batched plain tokens have log-probabilities bit-identical to alone (a
    /// function of every logit of every step: a stricter check than the tokens).
    #[serde(default)]
    pub batched_logprobs_identical: usize,
    /// Draft tokens proposed and accepted in the speculative runs.
    pub drafted: usize,
    /// Accepted draft tokens.
    pub accepted: usize,
    /// The engine runs' KV type.
    #[serde(default)]
    pub kv_type: String,
    /// With a KV type other than F16: prompts whose greedy output equals F16 KV's.
    #[serde(default)]
    pub kv_f16_identical: Option<usize>,
    /// Where the file carries an MTP block: its head against libllama's MTP context.
    #[serde(default)]
    pub mtp_head: Option<MtpHeadCheck>,
}

/// An MTP head's logits against libllama's MTP context on the same device: every row of each
/// prompt, each token paired with libllama's trunk state of the row before.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MtpHeadCheck {
    /// Prompts compared.
    pub prompts: usize,
    /// Rows compared (every position of each prompt).
    pub rows: usize,
    /// Rows whose top-1 token is libllama's.
    pub top1_same: usize,
    /// Rows whose logits are bit-identical to libllama's.
    pub identical_rows: usize,
    /// Worst max |dlogit| over the rows.
    pub worst_max_abs_diff: f32,
    /// What the engine measured at start-up with the head drafting: a step verifying k draft
    /// tokens against a decode step (k = 0..=4), and the head's step against a decode step.
    #[serde(default)]
    pub verify_cost: Vec<f64>,
    /// See `verify_cost`.
    #[serde(default)]
    pub head_step_cost: Option<f64>,
}

/// The MTP head check (prompts up to one libllama batch long).
fn mtp_head_check(
    model: &Arc<Model>,
    toks: &[Vec<u32>],
    n_ctx: u32,
    threads: usize,
) -> Result<Option<MtpHeadCheck>, BenchError> {
    if model.family().mtp().is_none() {
        return Ok(None);
    }
    let e = model.family().hparams().n_embd as usize;
    let mut oracle = MtpOracle::load(
        model.path(),
        &OracleOptions {
            n_ctx,
            n_threads: threads,
            n_gpu_layers: crate::oracle_gpu_layers(model),
            ..Default::default()
        },
    )?;
    let mut head = Runner::new(
        model.clone(),
        RunnerOptions {
            mtp: true,
            ..RunnerOptions::like_llama_cpp(n_ctx)
        },
    )?;
    let mut c = MtpHeadCheck {
        prompts: 0,
        rows: 0,
        top1_same: 0,
        identical_rows: 0,
        worst_max_abs_diff: 0.0,
        verify_cost: Vec::new(),
        head_step_cost: None,
    };
    for p in toks.iter().filter(|p| !p.is_empty() && p.len() <= 512) {
        oracle.clear();
        let ids: Vec<i32> = p.iter().map(|&t| t as i32).collect();
        let (h, _) = oracle.trunk(&ids, 0)?;
        let mut paired = vec![0.0f32; e];
        paired.extend_from_slice(&h[..(p.len() - 1) * e]);
        let entries: Vec<(i32, i32)> = ids.iter().zip(0..).map(|(&t, i)| (t, i)).collect();
        let want = oracle.head(&entries, &paired)?;
        let got = head.step(&[SeqInput {
            tokens: p.clone(),
            start_pos: 0,
            prompt_len: p.len() as u32,
            block_table: (0..n_ctx / 16).collect(),
            logits: LogitRows::All,
            pick: false,
            state: StateSlots::default(),
            hidden: paired,
        }])?;
        for (i, w) in want.logits.iter().enumerate() {
            let d = max_abs_diff(got.row(i), w);
            c.rows += 1;
            c.top1_same += usize::from(argmax(got.row(i)) == argmax(w));
            c.identical_rows += usize::from(d == 0.0);
            c.worst_max_abs_diff = c.worst_max_abs_diff.max(d);
        }
        c.prompts += 1;
    }
    drop((oracle, head));
    let engine = EngineCore::new(
        model.clone(),
        &EngineConfig {
            kv_slots: n_ctx.div_ceil(16) * 16,
            draft_len: 4,
            drafters: axle_sdk::DraftSources::parse("mtp").map_err(BenchError::Invalid)?,
            ..Default::default()
        },
    )?;
    if let Some(d) = engine.draft_config() {
        c.verify_cost = d.verify_cost.clone();
        c.head_step_cost = d.model_cost;
    }
    Ok(Some(c))
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += ((x - y) as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

fn greedy_axle(
    runner: &mut Runner,
    prompt: &[u32],
    n: usize,
) -> Result<(Vec<f32>, Vec<u32>), BenchError> {
    let mut seq = Sequence::new(runner);
    let first = seq.feed(runner, prompt)?;
    let mut out = Vec::new();
    let mut logits = first.clone();
    for _ in 0..n {
        let t = argmax(&logits) as u32;
        out.push(t);
        logits = seq.feed(runner, &[t])?;
    }
    Ok((first, out))
}

pub(crate) fn greedy_llama(
    o: &mut LlamaOracle,
    prompt: &[u32],
    n: usize,
) -> Result<(Vec<f32>, Vec<u32>), BenchError> {
    o.clear();
    let toks: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let first = o.prefill(&toks, 0)?;
    let mut out = Vec::new();
    let mut logits = first.clone();
    for i in 0..n {
        let t = argmax(&logits) as u32;
        out.push(t);
        logits = o
            .decode(&[(t as i32, (prompt.len() + i) as i32, 0, true)])?
            .remove(0);
    }
    Ok((first, out))
}

/// What one engine gave for a set of prompts.
struct EngineRun {
    /// Greedy outputs, in prompt order.
    outputs: Vec<Vec<TokenId>>,
    /// Their tokens' log-probabilities, where the requests asked for them.
    logprobs: Vec<Vec<f32>>,
    drafted: usize,
    accepted: usize,
    /// The engine's device products (`None`: the host layout).
    products: Option<DeviceProducts>,
}

/// Greedy outputs of `prompts` through one engine (all admitted at once).
fn engine_run(
    model: &Arc<Model>,
    cfg: &EngineConfig,
    prompts: &[Vec<u32>],
    opts: &RequestOptions,
) -> Result<EngineRun, BenchError> {
    let mut e = EngineCore::new(model.clone(), cfg)?;
    let ids = prompts
        .iter()
        .map(|p| e.add(p.clone(), opts.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut d = e.drain(|_| {});
    Ok(EngineRun {
        outputs: d.outputs(&ids),
        logprobs: d.logprobs(&ids),
        drafted: d.drafted(),
        accepted: d.accepted(),
        products: e.device_products(),
    })
}

/// Runs the check on `model` (already loaded on its device) with `prompts`.
pub fn run(
    model: &Arc<Model>,
    prompts: &[String],
    opts: &DeviceCheckOptions,
    progress: bool,
) -> Result<DeviceCheckReport, BenchError> {
    let path = model.path().to_path_buf();
    let toks: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| model.tokenizer.encode(p, true, false))
        .collect();
    let longest = toks.iter().map(Vec::len).max().unwrap_or(0);
    let n_ctx = ((longest + opts.continuation + 16).div_ceil(256) * 256) as u32;
    let oracle = |flash_attn| {
        LlamaOracle::load(
            &path,
            &OracleOptions {
                n_ctx,
                n_threads: opts.threads,
                n_gpu_layers: crate::oracle_gpu_layers(model),
                flash_attn,
                ..Default::default()
            },
        )
    };
    let mut fa_on = oracle(true)?;
    let mut fa_off = oracle(false)?;
    let mut runner = Runner::new(model.clone(), RunnerOptions::like_llama_cpp(n_ctx))?;
    let bar = crate::progress_bar(progress, toks.len() as u64 * 2, "device check");
    let mut checks = Vec::new();
    for p in &toks {
        let (a_first, a_cont) = greedy_axle(&mut runner, p, opts.continuation)?;
        let (l_first, l_cont) = greedy_llama(&mut fa_on, p, opts.continuation)?;
        let (s_first, s_cont) = greedy_llama(&mut fa_off, p, opts.continuation)?;
        checks.push(PromptCheck {
            tokens: p.len(),
            max_abs_diff: max_abs_diff(&a_first, &l_first),
            llama_self_max_abs_diff: max_abs_diff(&s_first, &l_first),
            rel_l2: rel_l2(&a_first, &l_first),
            top1_same: argmax(&a_first) == argmax(&l_first),
            greedy_same: a_cont == l_cont,
            llama_self_greedy_same: s_cont == l_cont,
            agree_prefix: a_cont
                .iter()
                .zip(&l_cont)
                .take_while(|(a, b)| a == b)
                .count(),
        });
        bar.inc(1);
    }
    drop((fa_on, fa_off, runner));
    let mtp_head = mtp_head_check(model, &toks, n_ctx, opts.threads)?;

    // Speculation: the engine's own kernels, greedy, 48 tokens, as the CPU test does.
    let cfg = |draft_len| EngineConfig {
        kv_slots: (toks.len() * (longest + 64)).div_ceil(16) as u32 * 16,
        max_batch_tokens: 32,
        max_seqs: toks.len().max(1),
        prefix_caching: false,
        draft_len,
        kv_type: opts.kv_type,
        verify_cost: Some((0..=8).map(|k| 1.0 + 0.05 * k as f64).collect()),
        ..Default::default()
    };
    let req = RequestOptions {
        max_tokens: 48,
        ignore_eos: true,
        ..Default::default()
    };
    // Plain runs report each token's log-probability (the logits read back whole).
    let mut with_logprobs = req.clone();
    with_logprobs.sampling.logprobs = Some(0);
    let mut plain = Vec::new();
    let mut plain_logprobs = Vec::new();
    let mut alone_same = 0;
    let (mut drafted, mut accepted) = (0, 0);
    for p in &toks {
        let a = engine_run(model, &cfg(0), std::slice::from_ref(p), &with_logprobs)?;
        let b = engine_run(model, &cfg(4), std::slice::from_ref(p), &req)?;
        alone_same += usize::from(a.outputs == b.outputs);
        drafted += b.drafted;
        accepted += b.accepted;
        plain.push(a.outputs.into_iter().next().unwrap_or_default());
        plain_logprobs.push(a.logprobs.into_iter().next().unwrap_or_default());
        bar.inc(1);
    }
    let batched_plain = engine_run(model, &cfg(0), &toks, &with_logprobs)?;
    let batched_spec = engine_run(model, &cfg(4), &toks, &req)?;
    let kv_f16 = (opts.kv_type != KvType::F16)
        .then(|| {
            let f16 = EngineConfig {
                kv_type: KvType::F16,
                ..cfg(0)
            };
            engine_run(model, &f16, &toks, &req)
        })
        .transpose()?;
    bar.finish_and_clear();
    drafted += batched_spec.drafted;
    accepted += batched_spec.accepted;
    let same = |v: &[Vec<TokenId>]| v.iter().zip(&plain).filter(|(a, b)| a == b).count();
    Ok(DeviceCheckReport {
        device: model.device_summary(),
        git_commit: crate::git_commit(),
        device_products: batched_spec
            .products
            .map_or_else(|| "host layout".to_string(), |p| p.to_string()),
        greedy_identical: checks.iter().filter(|c| c.greedy_same).count(),
        llama_self_identical: checks.iter().filter(|c| c.llama_self_greedy_same).count(),
        worst_max_abs_diff: checks.iter().map(|c| c.max_abs_diff).fold(0.0, f32::max),
        worst_llama_self_max_abs_diff: checks
            .iter()
            .map(|c| c.llama_self_max_abs_diff)
            .fold(0.0, f32::max),
        prompts: checks,
        speculation_alone_identical: alone_same,
        speculation_batched_identical: same(&batched_spec.outputs),
        batched_plain_identical: same(&batched_plain.outputs),
        batched_logprobs_identical: batched_plain
            .logprobs
            .iter()
            .zip(&plain_logprobs)
            .filter(|(a, b)| !a.is_empty() && bits(a) == bits(b))
            .count(),
        drafted,
        accepted,
        kv_type: opts.kv_type.to_string(),
        kv_f16_identical: kv_f16.map(|r| same(&r.outputs)),
        mtp_head,
    })
}

/// The bit patterns of `v`, for comparisons that tell -0.0 from 0.0 and NaN from NaN.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `v`, or `unknown` for a field an older report lacks.
fn or_unknown(v: &str) -> &str {
    if v.is_empty() {
        "unknown"
    } else {
        v
    }
}

/// The report as text.
pub fn render(r: &DeviceCheckReport) -> String {
    let mut s = format!(
        "device: {}; device products: {}; commit {}\n",
        r.device,
        or_unknown(&r.device_products),
        or_unknown(&r.git_commit)
    );
    s += &format!(
        "{:>6} {:>11} {:>11} {:>9} {:>5} {:>7} {:>7} {:>6}\n",
        "tokens", "max|dlogit|", "llama-self", "rel-L2", "top1", "greedy", "llama", "agree"
    );
    for c in &r.prompts {
        s += &format!(
            "{:>6} {:>11.5} {:>11.5} {:>9.2e} {:>5} {:>7} {:>7} {:>6}\n",
            c.tokens,
            c.max_abs_diff,
            c.llama_self_max_abs_diff,
            c.rel_l2,
            c.top1_same,
            c.greedy_same,
            c.llama_self_greedy_same,
            c.agree_prefix
        );
    }
    let n = r.prompts.len();
    s += &format!(
        "greedy identical to libllama (same device, flash attention on): {}/{n}; libllama flash \
         attention on vs off: {}/{n}\nworst max|dlogit|: Axle vs libllama {:.5}, libllama vs itself {:.5}\n",
        r.greedy_identical,
        r.llama_self_identical,
        r.worst_max_abs_diff,
        r.worst_llama_self_max_abs_diff
    );
    s += &format!(
        "speculation on == off: alone {}/{n}, batched {}/{n}; batched plain == alone plain {}/{n} \
         (log-probabilities bit-identical {}/{n}); drafted {} accepted {}\n",
        r.speculation_alone_identical,
        r.speculation_batched_identical,
        r.batched_plain_identical,
        r.batched_logprobs_identical,
        r.drafted,
        r.accepted
    );
    if let Some(m) = &r.mtp_head {
        s += &format!(
            "MTP head vs libllama's MTP context: {} prompts, {} rows: top-1 same {}, logits \
             bit-identical {}, worst max|dlogit| {:.5}\nverify step of k = 0.. draft tokens / \
             decode step: {}; MTP head step / decode step: {}\n",
            m.prompts,
            m.rows,
            m.top1_same,
            m.identical_rows,
            m.worst_max_abs_diff,
            m.verify_cost
                .iter()
                .map(|c| format!("{c:.3}"))
                .collect::<Vec<_>>()
                .join(" "),
            m.head_step_cost
                .map_or_else(|| "not measured".to_string(), |c| format!("{c:.3}"))
        );
    }
    if let Some(k) = r.kv_f16_identical {
        s += &format!(
            "KV {}: greedy output equal to F16 KV's {k}/{n}\n",
            or_unknown(&r.kv_type)
        );
    }
    s
}
