//! Whether a verify step (k + 1 tokens of one sequence, logits at every position) computes the
//! same logits as k + 1 one-token decode steps, bit for bit: the condition for greedy n-gram
//! speculation to reproduce plain decoding token for token. Prints, per model, weight layout and
//! step width, the largest logit difference, and asserts what is known to hold: SmolLM2 (Q4_1,
//! which has no repacked kernel) is exact at every width with either layout, and so is Gemma 3
//! with the plain (not repacked) layout, its K-quant products sliced below ggml's tiled-GEMM
//! width (see `Step::matmul`). Gemma's repacked Q4_K kernels switch to a 4-row GEMM that rounds
//! differently from the 1-row GEMV. The plain-layout cases run twice: with the sequence in the
//! first slots, and with its blocks spread over 512 slots, where a one-row step would take ggml's
//! split-KV attention kernel (the runner attends with the row twice instead).
//!
//! Also: where a sequence's blocks lie does not change its logits.
mod common;

use axle_models::device_step::DeviceAttention;
use axle_models::kv::KvType;
use axle_models::{HostKernels, LogitRows, Model, ModelOptions, Runner, RunnerOptions, SeqInput};
use std::sync::Arc;

const TEXT: &str = "The history of computing is a story of abstraction layered upon abstraction: \
    from switches to gates, from gates to instructions, from instructions to languages.";

/// The model `name` (2 threads, weights repacked or not) and a runner with `kv_slots` slots,
/// with the device step layout (`axle_models::device_step`) or the host one.
/// Where a test's step layout comes from: the host layout with its kernels, or the device layout
/// forced on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Host(HostKernels),
    /// The device layout with paged attention (the default).
    Device,
    /// The device layout with an attention op per row.
    DeviceRows,
    /// The device layout with paged attention over a Q8_0 KV cache.
    DeviceQ8,
}

const HOST: Layout = Layout::Host(HostKernels::Compatible);

/// Both real models, each with its blocks in order (first block 0, stride 1) and spread (blocks
/// 10, 20, 30, ...: the visible slots spread over 512 columns, read through the slot list).
const BOTH_MODELS_IN_ORDER_AND_SPREAD: [(&str, (u32, u32)); 4] = [
    (common::SMOLLM2, (0, 1)),
    (common::SMOLLM2, (10, 10)),
    (common::GEMMA3, (0, 1)),
    (common::GEMMA3, (10, 10)),
];

fn load(name: &str, repack: bool, kv_slots: u32, layout: Layout) -> (Arc<Model>, Runner) {
    let model = Arc::new(
        Model::load(
            if name.ends_with("-tiny.gguf") {
                common::fixture(name)
            } else {
                common::model(name)
            },
            &ModelOptions {
                repack,
                ..ModelOptions::cpu(2)
            },
        )
        .unwrap(),
    );
    let runner = Runner::new(
        model.clone(),
        RunnerOptions {
            kv_slots,
            force_device_layout: !matches!(layout, Layout::Host(_)),
            host_kernels: match layout {
                Layout::Host(k) => k,
                _ => HostKernels::Compatible,
            },
            kv_type: if layout == Layout::DeviceQ8 {
                KvType::Q8_0
            } else {
                KvType::F16
            },
            device_attention: if layout == Layout::DeviceRows {
                DeviceAttention::Rows
            } else {
                DeviceAttention::Paged
            },
            device_products: None,
            graph_slots: None,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        runner.paged_attention(),
        matches!(layout, Layout::Device | Layout::DeviceQ8)
    );
    (model, runner)
}

/// One sequence's share of a step: tokens `from..to` of `tokens`, stored in the blocks `table`;
/// its first `prompt` tokens are the prompt, the rest generated rows.
fn seq_input(
    tokens: &[u32],
    prompt: usize,
    (from, to): (usize, usize),
    table: &[u32],
    logits: LogitRows,
) -> SeqInput {
    SeqInput {
        hidden: Vec::new(),
        tokens: tokens[from..to].to_vec(),
        start_pos: from as u32,
        prompt_len: prompt as u32,
        block_table: table.to_vec(),
        logits,
        pick: false,
        state: Default::default(),
    }
}

/// Largest |difference| between the logits of each width-w verify step and the decode steps, for
/// widths 1..=max_w, with the sequence's blocks at `first_block`, `first_block + stride`, ...;
/// and the shapes of rows the runner stacked into one attention op (KV slots, rows, shared).
fn max_diff_by_width(
    name: &str,
    repack: bool,
    max_w: usize,
    blocks: (u32, u32),
    layout: Layout,
) -> (Vec<f32>, Vec<(i64, i64, bool)>) {
    max_diff_by_width_after(name, repack, max_w, blocks, layout, 0)
}

/// [`max_diff_by_width`] after a prompt of at least `min_ctx` tokens.
fn max_diff_by_width_after(
    name: &str,
    repack: bool,
    max_w: usize,
    (first_block, stride): (u32, u32),
    layout: Layout,
    min_ctx: usize,
) -> (Vec<f32>, Vec<(i64, i64, bool)>) {
    let kv_slots = if min_ctx > 0 { 8192 } else { 2048 };
    let (model, mut runner) = load(name, repack, kv_slots, layout);
    // Long enough for the widest step (the text once for the usual widths up to 9).
    let tokens = model
        .tokenizer
        .encode(&TEXT.repeat(1 + max_w / 20 + min_ctx / 20), true, false);
    let ctx = tokens.len() - max_w;
    assert!(ctx >= min_ctx, "a prompt of {ctx} tokens, {min_ctx} wanted");
    let bs = runner.options().block_size;
    let table: Vec<u32> = (0..(256 / bs).max((tokens.len() as u32).div_ceil(bs)))
        .map(|i| first_block + i * stride)
        .collect();
    let input =
        |from: usize, to: usize, logits| seq_input(&tokens, ctx, (from, to), &table, logits);
    runner.step(&[input(0, ctx, LogitRows::None)]).unwrap();
    // Reference: one token per step.
    let mut one: Vec<Vec<f32>> = Vec::new();
    for i in ctx..ctx + max_w {
        let out = runner.step(&[input(i, i + 1, LogitRows::Last)]).unwrap();
        one.push(out.row(0).to_vec());
    }
    let diffs = (1..=max_w)
        .map(|w| {
            let out = runner.step(&[input(ctx, ctx + w, LogitRows::All)]).unwrap();
            (0..w)
                .map(|j| {
                    out.row(j)
                        .iter()
                        .zip(&one[j])
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0f32, f32::max)
                })
                .fold(0.0f32, f32::max)
        })
        .collect();
    let stacked: Vec<(i64, i64, bool)> = runner
        .stacked_shapes()
        .iter()
        .map(|(k, ok)| (k.kv_len, k.rows, *ok))
        .collect();
    if layout == Layout::DeviceRows {
        println!("{name}: stacked row shapes (kv_len, rows, shared): {stacked:?}");
    }
    (diffs, stacked)
}

#[test]
fn verify_steps_reproduce_decode_steps() {
    // Blocks 10, 20, 30, ...: the visible slots spread over 512 columns, across the middle where
    // split-KV attention would cut them in two chunks (one per thread).
    let spread = (10, 10);
    for (name, repack, exact_up_to, blocks) in [
        (common::SMOLLM2, true, 9, (0, 1)),
        (common::SMOLLM2, false, 9, (0, 1)),
        (common::SMOLLM2, false, 9, spread),
        (common::GEMMA3, false, 9, (0, 1)),
        (common::GEMMA3, false, 9, spread),
        (common::GEMMA3, true, 0, (0, 1)),
    ] {
        let (d, _) = max_diff_by_width(name, repack, 9, blocks, HOST);
        let shown: Vec<String> = d.iter().map(|x| format!("{x:.2e}")).collect();
        println!(
            "{name} repack={repack} blocks {blocks:?} (first, stride): max |dlogit| by width 1..=9: [{}]",
            shown.join(", ")
        );
        assert!(
            d[..exact_up_to].iter().all(|&x| x == 0.0),
            "{name} repack={repack}: widths 1..={exact_up_to} must be exact: {d:?}"
        );
    }
}

/// Verify steps of 1 to 70 rows against decode steps with `host_kernels`, on both real models,
/// blocks in order and spread (read through the slot list); every width must be exact.
fn wide_verify_steps_reproduce_decode_steps(host_kernels: HostKernels) {
    for (name, blocks) in BOTH_MODELS_IN_ORDER_AND_SPREAD {
        let (d, _) = max_diff_by_width(name, false, 70, blocks, Layout::Host(host_kernels));
        let worst = d.iter().cloned().fold(0.0f32, f32::max);
        println!(
            "{name} {host_kernels}, blocks {blocks:?}: max |dlogit| over widths 1..=70: {worst:.2e}"
        );
        common::assert_exact(
            &d,
            &format!(
                "{name}: verify steps differ from decode steps with {host_kernels} host kernels"
            ),
        );
    }
}

/// With [`HostKernels::Tiled`]: decode and verify rows through the row attention and
/// tiled-columns ops, the prefill through ggml's tiled attention and tiled K-quant GEMM; widths up
/// to 70 (past the 64 rows from which a verify step's own attention op is ggml's tiled kernel,
/// and the 8 columns from which its K-quant products are ggml's tiled GEMM).
#[test]
fn tiled_host_kernels_verify_steps_reproduce_decode_steps() {
    wide_verify_steps_reproduce_decode_steps(HostKernels::Tiled);
}

/// With [`HostKernels::Origin`] (the default): the prompt (over 64 tokens) through ggml's tiled
/// attention and tiled K-quant GEMM, the decode and verify rows (generated) through the one-pass
/// attention and the dot product, however wide the verify step.
#[test]
fn origin_host_kernels_verify_steps_reproduce_decode_steps() {
    wide_verify_steps_reproduce_decode_steps(HostKernels::Origin);
}

/// The same past 256 positions, where a generated row takes ggml's split-KV kernel over a view
/// of 512 cells of its own (as libllama's lone decode does): verify steps of up to 9 rows, each
/// row in its own op, against decode steps; blocks in order and spread (gathered).
#[test]
fn origin_host_kernels_verify_steps_reproduce_decode_steps_past_256_positions() {
    for (name, blocks) in BOTH_MODELS_IN_ORDER_AND_SPREAD {
        let layout = Layout::Host(HostKernels::Origin);
        let (d, _) = max_diff_by_width_after(name, false, 9, blocks, layout, 300);
        println!("{name} origin after 300 tokens, blocks {blocks:?}: max |dlogit| by width: {d:?}");
        common::assert_exact(
            &d,
            &format!("{name}: verify steps past 256 positions differ from decode steps"),
        );
    }
}

/// Tiled host kernels are a choice for the host layout: with the device layout they would have
/// no effect, so the runner refuses them with a reason.
#[test]
fn tiled_host_kernels_are_refused_with_the_device_layout() {
    let (model, _) = load(common::SMOLLM2, false, 256, HOST);
    let err = Runner::new(
        model,
        RunnerOptions {
            kv_slots: 256,
            force_device_layout: true,
            host_kernels: HostKernels::Tiled,
            ..Default::default()
        },
    )
    .expect_err("refused");
    assert!(err.to_string().contains("tiled host kernels"), "{err}");
}

/// The families of fixtures only (MoE, Gemma 4 with KV-shared layers and per-layer embeddings).
/// Mixture of experts with K-quant experts, not repacked: a verify step of up to 63 rows (every
/// expert picked by about 16 of them, past the 8 from which ggml's tiled kernel takes over for an
/// expert) gives each row the logits of its one-token decode step (see `axle_models::moe`). From
/// 64 rows ggml's CPU flash attention would take a tiled kernel, which rounds differently; the
/// runner cuts attention into ops of at most 63 rows.
#[test]
fn fixture_verify_steps_reproduce_decode_steps() {
    for name in [
        "qwen3moe-tiny.gguf",
        "qwen2moe-tiny.gguf",
        "gemma4moe-tiny.gguf",
        "gemma4-tiny.gguf",
        "deepseek2-tiny.gguf",
        "deepseek2-v3-tiny.gguf",
        "gpt-oss-tiny.gguf",
        "glm4moe-tiny.gguf",
    ] {
        let (d, _) = max_diff_by_width(name, false, 63, (0, 1), HOST);
        let worst = d.iter().cloned().fold(0.0f32, f32::max);
        println!("{name}: max |dlogit| over widths 1..=63: {worst:.2e}");
        common::assert_exact(
            &d,
            &format!("{name}: verify steps differ from decode steps"),
        );
        // The GPU step layout (forced on the host), blocks spread: the per-row attention ops,
        // gathered slots, latent (K-only) and shared caches, grouped expert products.
        let (d, _) = max_diff_by_width(name, false, 9, (10, 10), Layout::Device);
        println!("{name} device layout, spread blocks: max |dlogit| by width 1..=9: {d:?}");
        common::assert_exact(
            &d,
            &format!("{name}: device layout verify steps differ from decode steps"),
        );
    }
}

/// Logits of the last `decode` tokens of `TEXT`, decoded one per step after a prefill, with the
/// sequence's logical blocks stored in the physical blocks `table`.
/// The largest |difference| of two runs' logits, per decode step.
fn max_diff_per_step(a: &[Vec<f32>], b: &[Vec<f32>]) -> Vec<f32> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            x.iter()
                .zip(y)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max)
        })
        .collect()
}

fn decode_logits(
    runner: &mut Runner,
    tokens: &[u32],
    table: &[u32],
    decode: usize,
) -> Vec<Vec<f32>> {
    let ctx = tokens.len() - decode;
    let input = |from: usize, to: usize| seq_input(tokens, ctx, (from, to), table, LogitRows::Last);
    runner.step(&[input(0, ctx)]).unwrap();
    (ctx..tokens.len())
        .map(|i| runner.step(&[input(i, i + 1)]).unwrap().row(0).to_vec())
        .collect()
}

/// Where a sequence's blocks lie must not change its numbers: blocks in descending or shuffled
/// order (as preemption and prefix reuse leave them) give the same logits, bit for bit, as
/// ascending blocks, alone and next to another sequence in the batch. Attention gathers such a
/// sequence's slots in logical order; without that the softmax sums in another order and greedy
/// outputs drift. The tables reach past slot 512, where a one-row step would take ggml's split-KV
/// kernel (whose chunks follow the slot range); the runner keeps such rows on the one-pass kernel.
#[test]
fn block_placement_does_not_change_logits() {
    block_placement(HOST);
}

/// The same with the device step layout and paged attention (one op per layer for the decoding
/// rows, reading the blocks where they lie), on the host.
#[test]
fn device_layout_block_placement_does_not_change_logits() {
    block_placement(Layout::Device);
}

/// The same with an attention op per decode row over its own slots (gathered when they are out
/// of order; the two batched rows' gathered segments line up, so they share one stacked op).
#[test]
fn device_rows_block_placement_does_not_change_logits() {
    block_placement(Layout::DeviceRows);
}

/// A Q8_0 cache: each token's row is rounded once, from its own values, so placement and
/// batching change nothing either.
#[test]
fn q8_0_kv_block_placement_does_not_change_logits() {
    block_placement(Layout::DeviceQ8);
}

/// A Q8_0 cache against an F16 one, both with paged attention: logits close (not equal); and
/// refused by name where paged attention would not read it.
#[test]
fn q8_0_kv_stays_close_to_f16_kv_and_is_refused_without_paged_attention() {
    for name in [common::SMOLLM2, common::GEMMA3] {
        let (model, mut f16) = load(name, false, 1024, Layout::Device);
        let (_, mut q8) = load(name, false, 1024, Layout::DeviceQ8);
        let tokens = model.tokenizer.encode(&TEXT.repeat(2), true, false);
        let table: Vec<u32> = (0..64).collect();
        let a = decode_logits(&mut f16, &tokens, &table, 4);
        let b = decode_logits(&mut q8, &tokens, &table, 4);
        let diff = max_diff_per_step(&a, &b);
        println!("{name}: Q8_0 KV vs F16 KV, max |dlogit| per decode step {diff:?}");
        assert!(
            diff.iter().any(|&d| d > 0.0),
            "{name}: Q8_0 KV read as F16?"
        );
        assert!(
            diff.iter().all(|&d| d < 2.0),
            "{name}: Q8_0 KV drifts from F16 KV: {diff:?}"
        );
        for opts in [
            RunnerOptions {
                kv_type: KvType::Q8_0,
                ..Default::default()
            },
            RunnerOptions {
                kv_type: KvType::Q8_0,
                force_device_layout: true,
                device_attention: DeviceAttention::Rows,
                ..Default::default()
            },
        ] {
            let Err(e) = Runner::new(model.clone(), opts) else {
                panic!("{name}: a Q8_0 cache without paged attention was taken");
            };
            assert!(e.to_string().contains("KV type q8_0"), "{e}");
        }
    }
}

/// The device step layout that GPUs use, run here on the host: verify steps of every width up to
/// 9 reproduce decode steps bit for bit (with the sequence's blocks in the first slots, and spread
/// so that the slots are gathered), and its logits stay close to the host layout's (they differ
/// only in how attention splits the slots).
#[test]
fn device_layout_verify_steps_reproduce_decode_steps() {
    for (name, blocks) in BOTH_MODELS_IN_ORDER_AND_SPREAD {
        for layout in [Layout::Device, Layout::DeviceRows, Layout::DeviceQ8] {
            let (d, shapes) = max_diff_by_width(name, false, 9, blocks, layout);
            println!("{name} {layout:?}, blocks {blocks:?}: max |dlogit| by width 1..=9: {d:?}");
            // On the CPU a one-row op over fewer than 512 slots and a stacked one compute each
            // row alike, so these verify steps ran stacked.
            assert!(
                layout != Layout::DeviceRows || shapes.iter().any(|&(len, _, ok)| ok && len < 512),
                "{name}: no verify rows shared an attention op: {shapes:?}"
            );
            common::assert_exact(&d, name);
        }
    }
    for name in [common::SMOLLM2, common::GEMMA3] {
        let (model, _) = load(name, false, 1024, HOST);
        // The device layout's host products are the compatible ones (K-quant slices), so it is
        // compared with the compatible host kernels: with `origin` a prompt's K-quant products
        // take the tiled GEMM's arithmetic, which moves Gemma 3's logits by up to 1.2.
        let mut host = Runner::new(
            model.clone(),
            RunnerOptions {
                kv_slots: 1024,
                host_kernels: HostKernels::Compatible,
                ..Default::default()
            },
        )
        .unwrap();
        let tokens = model.tokenizer.encode(&TEXT.repeat(2), true, false);
        let table: Vec<u32> = (0..64).collect();
        let a = decode_logits(&mut host, &tokens, &table, 4);
        for layout in [Layout::DeviceRows, Layout::Device] {
            let (_, mut dev) = load(name, false, 1024, layout);
            let b = decode_logits(&mut dev, &tokens, &table, 4);
            let diff = max_diff_per_step(&a, &b);
            println!("{name}: {layout:?} vs host layout, max |dlogit| per decode step {diff:?}");
            // Rows ops are the host layout's kernel; paged attention sums in F32 where ggml's
            // one-pass CPU kernel takes F16 products and an F16 accumulator (its op-level
            // agreement with ggml is axle-ggml's paged_attention test), so its logits move more:
            // bounded, and the greedy token the same.
            let bound = if layout == Layout::Device { 1.0 } else { 0.05 };
            assert!(
                diff.iter().all(|&d| d < bound),
                "{name}: {layout:?} drifts from the host layout: {diff:?}"
            );
            let argmax = |x: &[f32]| {
                (0..x.len())
                    .max_by(|&i, &j| x[i].total_cmp(&x[j]))
                    .unwrap_or(0)
            };
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(
                    argmax(x),
                    argmax(y),
                    "{name}: {layout:?} changes the greedy token"
                );
            }
        }
    }
}

fn block_placement(layout: Layout) {
    for name in [common::SMOLLM2, common::GEMMA3] {
        // Plain weight layout: its matmuls give every row the same numbers at any batch width
        // (see above), so the batched comparison isolates attention.
        let (model, mut runner) = load(name, false, 1024, layout);
        let tokens = model.tokenizer.encode(&TEXT.repeat(2), true, false);
        let bs = runner.options().block_size as usize;
        let need = tokens.len().div_ceil(bs) as u32;
        assert!(need >= 3, "the text must span several blocks");
        let ascending: Vec<u32> = (0..need).collect();
        let descending: Vec<u32> = (0..need).rev().map(|b| b + 4).collect();
        // Out of order, reaching past slot 512.
        let shuffled: Vec<u32> = (0..need).map(|b| (b * 37 + 9) % 61).collect();
        assert!(shuffled.iter().any(|&b| b * 16 >= 512));
        assert!(shuffled.windows(2).any(|w| w[0] > w[1]));
        let reference = decode_logits(&mut runner, &tokens, &ascending, 6);
        for table in [&descending, &shuffled] {
            let got = decode_logits(&mut runner, &tokens, table, 6);
            assert!(
                got == reference,
                "{name}: blocks {table:?} changed the logits"
            );
        }
        // Batched beside another sequence whose blocks ascend: both prefilled the same way (one
        // step each, under 64 rows), then decoded together in one step.
        let other: Vec<u32> = (0..need).map(|b| b + 40).collect();
        assert!(other.iter().all(|b| !shuffled.contains(b)));
        let ctx = tokens.len() - 1;
        let seq = |table: &[u32], from: usize, to: usize, logits| {
            seq_input(&tokens, ctx, (from, to), table, logits)
        };
        runner
            .step(&[seq(&ascending, 0, ctx, LogitRows::None)])
            .unwrap();
        let alone = runner
            .step(&[seq(&ascending, ctx, ctx + 1, LogitRows::Last)])
            .unwrap()
            .row(0)
            .to_vec();
        // Prefills two sequences, one step each, then decodes them together in one step.
        let pair = |runner: &mut Runner, a: &[u32], b: &[u32]| {
            for table in [a, b] {
                runner.step(&[seq(table, 0, ctx, LogitRows::None)]).unwrap();
            }
            let out = runner
                .step(&[
                    seq(a, ctx, ctx + 1, LogitRows::Last),
                    seq(b, ctx, ctx + 1, LogitRows::Last),
                ])
                .unwrap();
            [out.row(0).to_vec(), out.row(1).to_vec()]
        };
        let out = pair(&mut runner, &other, &shuffled);
        assert!(out[0] == alone, "{name}: batched differs from alone");
        assert!(out[1] == alone, "{name}: batched rows differ by placement");
        if layout == Layout::DeviceRows {
            // The two decoding rows read gathered segments of the same length one after
            // another, so they shared one attention op (the only two-row shape here).
            assert!(
                runner
                    .stacked_shapes()
                    .iter()
                    .any(|(k, ok)| *ok && k.rows == 2),
                "{name}: the batched rows did not share an attention op: {:?}",
                runner.stacked_shapes()
            );
            // Two sequences in lanes of the cache (as the scheduler keeps them with the device
            // layout), each in consecutive blocks, the second 320 slots after the first: read in
            // place, at a stride, in one op.
            let lane: Vec<u32> = (0..need).map(|b| b + 20).collect();
            assert!(
                need * 16 <= 256,
                "the first lane's range must end before the second"
            );
            assert!(
                pair(&mut runner, &ascending, &lane) == [alone.clone(), alone.clone()],
                "{name}: rows read in place in lanes differ from alone"
            );
        }
        println!("{name}: identical logits for ascending, descending, shuffled and batched blocks");
    }
}

/// Keeping several step shapes' graphs, as a runner with an accelerator does (so that its backend
/// replays what it recorded for each), changes no logits: decode and verify steps alternate, each
/// reusing its kept graph, and give the logits of a runner that rebuilds its one graph whenever
/// the shape changes, bit for bit.
#[test]
fn kept_graphs_change_no_logits() {
    for name in [common::SMOLLM2, "qwen3moe-tiny.gguf"] {
        let path = if name.ends_with("-tiny.gguf") {
            common::fixture(name)
        } else {
            common::model(name)
        };
        let model = Arc::new(Model::load(path, &ModelOptions::cpu(2)).unwrap());
        let tokens = model.tokenizer.encode(TEXT, true, false);
        let run = |slots: usize| {
            let mut runner = Runner::new(
                model.clone(),
                RunnerOptions {
                    kv_slots: 512,
                    graph_slots: Some(slots),
                    ..Default::default()
                },
            )
            .unwrap();
            let table: Vec<u32> = (0..512 / runner.options().block_size).collect();
            let ctx = tokens.len() - 12;
            let input = |from: usize, to: usize, logits| {
                seq_input(&tokens, ctx, (from, to), &table, logits)
            };
            runner.step(&[input(0, ctx, LogitRows::None)]).unwrap();
            let mut logits = Vec::new();
            // A decode step, then a verify step of 3 drafts over the next positions, in turn.
            for i in (ctx..tokens.len() - 4).step_by(4) {
                logits.push(
                    runner
                        .step(&[input(i, i + 1, LogitRows::Last)])
                        .unwrap()
                        .logits,
                );
                logits.push(
                    runner
                        .step(&[input(i + 1, i + 4, LogitRows::All)])
                        .unwrap()
                        .logits,
                );
            }
            (logits, runner.take_profile())
        };
        let (one, one_profile) = run(1);
        let (kept, kept_profile) = run(3);
        assert_eq!(one, kept, "{name}: kept graphs changed the logits");
        assert_eq!(
            one_profile.builds, one_profile.steps,
            "{name}: one slot rebuilds"
        );
        assert_eq!(
            kept_profile.builds, 3,
            "{name}: three slots build the prefill, decode and verify graphs once each"
        );
    }
}
