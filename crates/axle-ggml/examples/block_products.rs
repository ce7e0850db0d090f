//! Times one quantized product through Axle's block kernels (`Context::mul_mat_few`: the
//! few-column kernel up to 32 columns, the tiled one past that) against ggml's own `mul_mat` on
//! the same weights and activations, and says whether the two results are bit-identical.
//!
//! ```sh
//! cargo run --release -p axle-ggml --example block_products -- q4_1 576 1536 512 [threads]
//! ```
//! Arguments: weight type (`q4_1`, `q5_0`, `q8_0`), K (the row width, a multiple of 32), M (rows),
//! N (columns), threads (default 2). Both products run on one CPU backend (one thread pool, so
//! neither waits on the other's spinning threads), alternately, 15 times; medians are printed.
use axle_ggml::{Backend, BufferType, Context, DType, GraphScheduler, TensorStore};
use std::time::Instant;

const RUNS: usize = 15;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: block_products q4_1|q5_0|q8_0 K M N [threads]";
    let dtype = match args.get(1).map(String::as_str) {
        Some("q4_1") => DType::Q4_1,
        Some("q5_0") => DType::Q5_0,
        Some("q8_0") => DType::Q8_0,
        _ => panic!("{usage}"),
    };
    let num = |i: usize, default: Option<i64>| -> i64 {
        args.get(i)
            .map(|s| s.parse().expect(usage))
            .or(default)
            .expect(usage)
    };
    let (k, m, n) = (num(2, None), num(3, None), num(4, None));
    let threads = num(5, Some(2)) as usize;
    assert!(k % 32 == 0 && m > 0 && n > 0, "{usage}");

    let store = TensorStore::zeroed(BufferType::cpu(), &[("w".into(), dtype, vec![k, m])])
        .expect("weight buffer");
    let w = store.get("w").expect("w");
    let block = match dtype {
        DType::Q4_1 => 20,
        DType::Q5_0 => 22,
        _ => 34,
    };
    // Random blocks whose f16 scales (and Q4_1 minimum) are finite: exponent bits 9.
    let mut state = 1u64;
    let bytes: Vec<u8> = (0..(k / 32 * m) as usize * block)
        .map(|i| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let b = (state >> 33) as u8;
            let scale_high = i % block == 1 || (dtype == DType::Q4_1 && i % block == 3);
            if scale_high {
                (b & 0x83) | (9 << 2)
            } else {
                b
            }
        })
        .collect();
    w.t().write_bytes_at(0, &bytes).expect("write weights");

    let ctx = Context::new(16, 16).expect("context");
    let x = ctx.input(DType::F32, &[k, n], "x");
    let ours = ctx
        .mul_mat_few(w.t(), x)
        .unwrap_or_else(|| panic!("the block kernels do not take this product here"))
        .as_output();
    let ggml = ctx.mul_mat(w.t(), x).as_output();
    let mut g_ours = ctx.graph(16);
    g_ours.expand(ours);
    let mut g_ggml = ctx.graph(16);
    g_ggml.expand(ggml);
    let mut sched =
        GraphScheduler::new(vec![Backend::cpu(threads).expect("cpu")], 16).expect("scheduler");
    let slot = sched.add_slot(16).expect("slot");
    sched.alloc(0, &mut g_ours).expect("alloc");
    sched.alloc(slot, &mut g_ggml).expect("alloc");
    let xs: Vec<f32> = (0..k * n)
        .map(|i| (i * 7919 % 4001) as f32 / 1000.0 - 2.0)
        .collect();
    x.write(&xs).expect("write x");

    let (mut t_ours, mut t_ggml) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let t = Instant::now();
        sched.compute(0, &mut g_ours).expect("compute");
        t_ours.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        sched.compute(slot, &mut g_ggml).expect("compute");
        t_ggml.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (mut a, mut b): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
    ours.read(&mut a).expect("read");
    ggml.read(&mut b).expect("read");
    let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (ms_ours, ms_ggml) = (median(t_ours), median(t_ggml));
    println!(
        "{} K={k} M={m} N={n}, {threads} threads: Axle {ms_ours:.3} ms, ggml {ms_ggml:.3} ms, \
         {:.2}x ggml's speed, bit-identical: {same}",
        dtype.name(),
        ms_ggml / ms_ours
    );
}
