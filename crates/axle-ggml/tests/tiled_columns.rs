//! ggml's tiled K-quant GEMM gives a column the same numbers at every width from 8 on, and the
//! tiled-columns op gives 1 to 7 columns those numbers too: for Q4_K, Q5_K and Q6_K weights,
//! several shapes and thread counts, bit for bit.
mod common;

use axle_ggml::{tiled_columns, BufferType, Context, DType, TensorStore};
use common::Lcg;

/// A finite f16 of moderate size (2^-10 .. 2^-3).
fn f16_small(rng: &mut Lcg) -> [u8; 2] {
    let exp = 5 + rng.next() % 8;
    ((exp << 10 | (rng.next() % 1024)) as u16).to_le_bytes()
}

/// Random blocks of `dtype` (Q4_K, Q5_K or Q6_K) with finite scales.
fn blocks(dtype: &str, n: usize, rng: &mut Lcg) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..n {
        match dtype {
            "q6_K" => {
                out.extend((0..208).map(|_| rng.next() as u8));
                out.extend_from_slice(&f16_small(rng));
            }
            _ => {
                out.extend_from_slice(&f16_small(rng));
                out.extend_from_slice(&f16_small(rng));
                let rest = if dtype == "q4_K" { 140 } else { 172 };
                out.extend((0..rest).map(|_| rng.next() as u8));
            }
        }
    }
    out
}

fn dtype(name: &str) -> DType {
    (0..64)
        .filter_map(DType::from_raw)
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no type {name}"))
}

/// Each column of products of `widths` columns (wide ones through ggml, narrow ones through the
/// op) against the same column in an 8-column ggml product.
fn check(name: &str, k: i64, m: i64, widths: &[i64], threads: usize) {
    let t = dtype(name);
    let mut rng = Lcg(k as u64 * 31 + m as u64 + u64::from(t.raw()));
    let store = TensorStore::zeroed(BufferType::cpu(), &[("w".into(), t, vec![k, m])]).expect("w");
    let w = store.get("w").expect("w");
    w.t()
        .write_bytes_at(0, &blocks(name, (k / 256 * m) as usize, &mut rng))
        .expect("write");
    for &n in widths {
        let ctx = Context::new(256, 256).expect("context");
        let x = ctx.input(DType::F32, &[k, n], "x");
        let product = if n < tiled_columns::TILED_COLS {
            ctx.mul_mat_tiled_columns(w.t(), x).expect("the op applies")
        } else {
            ctx.mul_mat(w.t(), x)
        }
        .as_output();
        let nb1 = x.nb()[1];
        // Column c beside 7 zero columns: an 8-column product.
        let eights: Vec<_> = (0..n.min(10))
            .map(|c| {
                let col = ctx.view(x, &[k, 1], &[nb1], c as usize * nb1);
                ctx.mul_mat(w.t(), ctx.pad_cols(col, 7)).as_output()
            })
            .collect();
        let mut g = ctx.graph(256);
        g.expand(product);
        for &e in &eights {
            g.expand(e);
        }
        let _sched = common::compute_with_random_input(&mut g, x, threads, &mut rng);
        let mut got = Vec::<f32>::new();
        product.read(&mut got).expect("read");
        for (c, e) in eights.iter().enumerate() {
            let mut want = Vec::<f32>::new();
            e.read(&mut want).expect("read");
            assert!(
                want[..m as usize].iter().any(|v| *v != 0.0),
                "a real product"
            );
            for r in 0..m as usize {
                let (a, b) = (got[c * m as usize + r], want[r]);
                assert!(
                    a.to_bits() == b.to_bits(),
                    "{name} k={k} m={m} n={n} threads={threads}: column {c} row {r}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn narrow_and_wide_products_give_each_column_the_same_numbers() {
    assert!(
        tiled_columns::supported(),
        "the tiled-columns op does not reproduce this build's ggml (see tiled_columns::supported)"
    );
    for name in ["q4_K", "q5_K", "q6_K"] {
        check(name, 1024, 300, &[1, 2, 3, 5, 7, 8, 9, 16, 17, 64, 257], 2);
        check(name, 512, 640, &[1, 4, 7, 20], 3);
    }
}
