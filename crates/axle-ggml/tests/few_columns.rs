//! The few-column kernel against ggml's own product: for Q4_1, Q5_0 and Q8_0 weights (and the
//! tiled kernel for Q4_1 and Q5_0 at prefill widths), every column bit-identical to ggml's
//! one-column result, at every width it takes, with rows (columns) split over threads.
mod common;

use axle_ggml::{few_columns, BufferType, Context, DType, TensorStore};
use common::Lcg;

/// A finite f16 of varied magnitude (2^-10 .. 2^-1), optionally of either sign.
fn half(rng: &mut Lcg, signed: bool) -> [u8; 2] {
    let exp = 5 + rng.next() % 10;
    let sign = if signed && rng.next().is_multiple_of(2) {
        0x8000
    } else {
        0
    };
    ((sign | (exp << 10) | (rng.next() % 1024)) as u16).to_le_bytes()
}

/// Random blocks of `dtype`: f16 scale (and Q4_1's f16 minimum of either sign), then random bits.
fn blocks(dtype: DType, blocks: usize, rng: &mut Lcg) -> Vec<u8> {
    let (bytes, signed_min) = if dtype == DType::Q4_1 {
        (16, true)
    } else if dtype == DType::Q5_0 {
        (20, false)
    } else {
        (32, false)
    };
    let mut out = Vec::new();
    for _ in 0..blocks {
        out.extend_from_slice(&half(rng, false));
        if signed_min {
            out.extend_from_slice(&half(rng, true));
        }
        out.extend((0..bytes).map(|_| rng.next() as u8));
    }
    out
}

fn check(dtype: DType, k: i64, m: i64, widths: std::ops::RangeInclusive<i64>, threads: usize) {
    assert!(
        few_columns::supported(),
        "the kernel is off: this test needs AVX2, FMA and F16C, a ggml built for them, and ggml's dot products reproduced bit for bit (see few_columns::supported)"
    );
    let mut rng = Lcg(k as u64 * 1000 + m as u64 + u64::from(dtype.raw()));
    let store = TensorStore::zeroed(BufferType::cpu(), &[("w".into(), dtype, vec![k, m])])
        .expect("weight buffer");
    let w = store.get("w").expect("w");
    w.t()
        .write_bytes_at(0, &blocks(dtype, (k / 32 * m) as usize, &mut rng))
        .expect("write weights");
    for n in widths {
        let size = 4 * n as usize + 64;
        let ctx = Context::new(size, size).expect("context");
        let x = ctx.input(DType::F32, &[k, n], "x");
        let few = ctx
            .mul_mat_few(w.t(), x)
            .expect("the kernel applies")
            .named("few")
            .as_output();
        let nb1 = x.nb()[1];
        let singles: Vec<_> = (0..n)
            .map(|c| {
                let col = ctx.view(x, &[k, 1], &[nb1], c as usize * nb1);
                ctx.mul_mat(w.t(), col)
                    .named(&format!("one{c}"))
                    .as_output()
            })
            .collect();
        let whole = ctx.mul_mat(w.t(), x).named("whole").as_output();
        let mut g = ctx.graph(size);
        g.expand(few);
        for &s in &singles {
            g.expand(s);
        }
        g.expand(whole);
        let _sched = common::compute_with_random_input_sized(&mut g, x, threads, size, &mut rng);
        let mut got: Vec<f32> = Vec::new();
        few.read(&mut got).expect("read");
        let mut all: Vec<f32> = Vec::new();
        whole.read(&mut all).expect("read");
        assert_eq!(got.len(), (m * n) as usize);
        for (c, s) in singles.iter().enumerate() {
            let mut one: Vec<f32> = Vec::new();
            s.read(&mut one).expect("read");
            let col = &got[c * m as usize..(c + 1) * m as usize];
            for (r, (a, b)) in col.iter().zip(&one).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits(),
                    "{} k={k} m={m} n={n}: column {c} row {r}: {a} vs ggml's {b}",
                    dtype.name()
                );
            }
            assert!(one.iter().any(|v| *v != 0.0), "a real product");
        }
        let same = got
            .iter()
            .zip(&all)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "k={k} m={m} n={n}: differs from ggml's full-width product"
        );
    }
}

#[test]
fn every_column_matches_ggml_bit_for_bit() {
    // SmolLM2's and Gemma 3's input widths (576, 640) and FFN down widths (1536, 2048), odd row
    // counts so the thread split is uneven, every width up to 9 and the widest.
    let widest = few_columns::MAX_COLUMNS;
    for dtype in [DType::Q4_1, DType::Q5_0, DType::Q8_0] {
        check(dtype, 576, 193, 2..=9, 2);
        check(dtype, 640, 129, 2..=5, 2);
        check(dtype, 1536, 576, 2..=4, 2);
        check(dtype, 2048, 67, 4..=4, 2);
        check(dtype, 576, 67, widest..=widest, 3);
    }
}

/// What the tiled kernel needs of the CPU (the feature queries exist on x86 only).
fn cpu_has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[test]
fn prefill_widths_match_ggml_bit_for_bit() {
    // Past MAX_COLUMNS, Q4_1 and Q5_0 products take the tiled kernel where the CPU has AVX-512 VNNI
    // (`few_columns::wide_supported`); elsewhere they must decline and keep ggml's kernel.
    assert_eq!(
        few_columns::wide_supported(),
        cpu_has_avx512_vnni() && few_columns::supported(),
        "the tiled kernel must run on every CPU with AVX-512 VNNI (its self-check against ggml failed?)"
    );
    if !few_columns::wide_supported() {
        eprintln!("no AVX-512 VNNI here: checking that prefill widths keep ggml's kernel");
        let store = TensorStore::zeroed(
            BufferType::cpu(),
            &[("w".into(), DType::Q4_1, vec![576, 8])],
        )
        .expect("buffer");
        let ctx = Context::new(16, 0).expect("context");
        let x = ctx.tensor(DType::F32, &[576, few_columns::MAX_COLUMNS + 1]);
        let w = store.get("w").expect("w");
        assert!(ctx.mul_mat_few(w.t(), x).is_none());
        return;
    }
    // Row counts that leave tiles of 16 with tails of 4, 2 and 1 rows; column counts past 32
    // with and without a partial group of 4, uneven between the threads; SmolLM2's shapes.
    let widest = few_columns::MAX_COLUMNS;
    check(DType::Q4_1, 576, 199, widest + 1..=widest + 6, 2);
    check(DType::Q4_1, 576, 37, 64..=64, 3);
    check(DType::Q4_1, 1536, 61, 127..=128, 2);
    check(DType::Q4_1, 576, 1536, 512..=512, 2);
    // Gemma 3's Q5_0 shapes (its 640-wide rows are no multiple of 256, so K-quant files fall
    // back to Q5_0 there).
    check(DType::Q5_0, 640, 199, widest + 1..=widest + 6, 2);
    check(DType::Q5_0, 2048, 61, 100..=100, 3);
    check(DType::Q5_0, 640, 2048, 512..=512, 2);
}

#[test]
fn declines_what_it_does_not_cover() {
    let store = TensorStore::zeroed(
        BufferType::cpu(),
        &[
            ("q4_1".into(), DType::Q4_1, vec![64, 8]),
            ("q8_0".into(), DType::Q8_0, vec![64, 8]),
            ("f32".into(), DType::F32, vec![64, 8]),
            ("f16".into(), DType::F16, vec![64, 8]),
        ],
    )
    .expect("buffer");
    let ctx = Context::new(16, 0).expect("context");
    let q = store.get("q4_1").expect("q4_1");
    let f = store.get("f32").expect("f32");
    let x = |n| ctx.tensor(DType::F32, &[64, n]);
    assert!(ctx.mul_mat_few(q.t(), x(4)).is_some());
    assert!(
        ctx.mul_mat_few(q.t(), x(1)).is_none(),
        "one column: ggml's own"
    );
    assert_eq!(
        ctx.mul_mat_few(q.t(), x(few_columns::MAX_COLUMNS + 1))
            .is_some(),
        few_columns::wide_supported(),
        "Q4_1 past MAX_COLUMNS: the tiled kernel, where the CPU runs it"
    );
    let q8 = store.get("q8_0").expect("q8_0");
    assert!(
        ctx.mul_mat_few(q8.t(), x(few_columns::MAX_COLUMNS + 1))
            .is_none(),
        "Q8_0 past MAX_COLUMNS: llamafile's tinyBLAS"
    );
    assert!(ctx.mul_mat_few(f.t(), x(4)).is_none(), "f32 weights");
    let h = store.get("f16").expect("f16");
    assert!(ctx.mul_mat_few(h.t(), x(4)).is_none(), "f16 weights");
    // Weights with no memory yet (not plain host memory).
    let meta = ctx.tensor(DType::Q4_1, &[64, 8]);
    assert!(ctx.mul_mat_few(meta, x(4)).is_none());
}
