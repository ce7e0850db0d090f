//! The row attention op against ggml's tiled CPU flash attention: every row bit-identical, whether
//! it runs with all the op's rows, alone, or with its keys read through scattered slots; for
//! several head shapes, grouped-query ratios, partial tiles, sliding windows, a logit soft cap and
//! sinks.
mod common;

use axle_ggml::row_attention::{self, RowAttention};
use axle_ggml::{Backend, Context, DType, GraphScheduler};
use common::Lcg;

fn f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

#[derive(Debug, Clone, Copy)]
struct Case {
    dk: i64,
    dv: i64,
    n_head: i64,
    n_head_kv: i64,
    n_kv: i64,
    n_q: i64,
    /// Position of the first query row (row r sees keys 0..=first + r).
    first: i64,
    window: Option<i64>,
    softcap: f32,
    sinks: bool,
    threads: usize,
}

fn check(c: Case) {
    assert!(
        row_attention::supported(),
        "the row attention op does not reproduce this build's ggml (see row_attention::supported)"
    );
    assert!(
        c.n_q >= row_attention::TILED_ROWS,
        "the reference must take the tiled kernel"
    );
    let mut rng = Lcg((c.dk * 131 + c.n_kv * 7 + c.n_q) as u64);
    let ctx = Context::new(64 + 4 * c.n_q as usize, 512).expect("context");
    let q = ctx.input(DType::F32, &[c.dk, c.n_q, c.n_head], "q");
    let k = ctx.input(DType::F16, &[c.dk, c.n_kv, c.n_head_kv], "k");
    let v = ctx.input(DType::F16, &[c.dv, c.n_kv, c.n_head_kv], "v");
    let mask = ctx.input(DType::F16, &[c.n_kv, c.n_q], "mask");
    // The same keys at scattered slots of a larger pool, and the slot of each column.
    let pool = c.n_kv + 37;
    let k2 = ctx.input(DType::F16, &[c.dk, pool, c.n_head_kv], "k2");
    let v2 = ctx.input(DType::F16, &[c.dv, pool, c.n_head_kv], "v2");
    let ids = ctx.input(DType::I32, &[c.n_kv], "ids");
    let sinks = c.sinks.then(|| ctx.input(DType::F32, &[c.n_head], "sinks"));
    let scale = 1.0 / (c.dk as f32).sqrt();

    let theirs = ctx.flash_attn(q, k, v, mask, scale, c.softcap);
    if let Some(s) = sinks {
        ctx.flash_attn_add_sinks(theirs, s);
    }
    let theirs = theirs.as_output();
    let op = RowAttention {
        q,
        k,
        v,
        mask,
        ids: None,
        sinks,
        scale,
        softcap: c.softcap,
    };
    let all = ctx.flash_attn_rows(op).expect("the op applies").as_output();
    let scattered = ctx
        .flash_attn_rows(RowAttention {
            k: k2,
            v: v2,
            ids: Some(ids),
            ..op
        })
        .expect("the op applies")
        .as_output();
    let qn = q.nb();
    let mn = mask.nb();
    let singles: Vec<_> = [0, 1, c.n_q / 2, c.n_q - 1]
        .iter()
        .map(|&r| {
            let qr = ctx.view(q, &[c.dk, 1, c.n_head], &[qn[1], qn[2]], r as usize * qn[1]);
            let mr = ctx.view(mask, &[c.n_kv, 1], &[mn[1]], r as usize * mn[1]);
            let o = ctx
                .flash_attn_rows(RowAttention {
                    q: qr,
                    mask: mr,
                    ..op
                })
                .expect("the op applies")
                .as_output();
            (r, o)
        })
        .collect();
    let mut g = ctx.graph(512);
    g.expand(theirs);
    g.expand(all);
    g.expand(scattered);
    for &(_, o) in &singles {
        g.expand(o);
    }
    let mut sched =
        GraphScheduler::new(vec![Backend::cpu(c.threads).expect("cpu")], 512).expect("scheduler");
    sched.alloc(0, &mut g).expect("alloc");

    let qs: Vec<f32> = (0..c.dk * c.n_q * c.n_head)
        .map(|_| rng.unit() * 2.0)
        .collect();
    q.write(&qs).expect("q");
    let ks: Vec<u16> = (0..c.dk * c.n_kv * c.n_head_kv)
        .map(|_| f16(rng.unit()))
        .collect();
    let vs: Vec<u16> = (0..c.dv * c.n_kv * c.n_head_kv)
        .map(|_| f16(rng.unit()))
        .collect();
    k.write(&ks).expect("k");
    v.write(&vs).expect("v");
    // Column j's key at slot (j * 11 + 5) % pool: a permutation of a subset of the pool.
    let slot = |j: i64| (j * 11 + 5) % pool;
    assert!(pool % 11 != 0);
    let mut k2s = vec![f16(0.5); (c.dk * pool * c.n_head_kv) as usize];
    let mut v2s = vec![f16(0.5); (c.dv * pool * c.n_head_kv) as usize];
    for h in 0..c.n_head_kv {
        for j in 0..c.n_kv {
            let (src, dst) = ((h * c.n_kv + j) as usize, (h * pool + slot(j)) as usize);
            k2s[dst * c.dk as usize..(dst + 1) * c.dk as usize]
                .copy_from_slice(&ks[src * c.dk as usize..(src + 1) * c.dk as usize]);
            v2s[dst * c.dv as usize..(dst + 1) * c.dv as usize]
                .copy_from_slice(&vs[src * c.dv as usize..(src + 1) * c.dv as usize]);
        }
    }
    k2.write(&k2s).expect("k2");
    v2.write(&v2s).expect("v2");
    ids.write(&(0..c.n_kv).map(|j| slot(j) as i32).collect::<Vec<_>>())
        .expect("ids");
    let mut ms = vec![f16(f32::NEG_INFINITY); (c.n_kv * c.n_q) as usize];
    for r in 0..c.n_q {
        let p = c.first + r;
        for j in 0..c.n_kv.min(p + 1) {
            if c.window.is_none_or(|w| p - j < w) {
                ms[(r * c.n_kv + j) as usize] = 0;
            }
        }
    }
    mask.write(&ms).expect("mask");
    if let Some(s) = sinks {
        s.write(
            &(0..c.n_head)
                .map(|_| rng.unit() * 3.0)
                .collect::<Vec<f32>>(),
        )
        .expect("sinks");
    }
    sched.compute(0, &mut g).expect("compute");

    let read = |t: axle_ggml::Tensor<'_>| {
        let mut out = Vec::<f32>::new();
        t.read(&mut out).expect("read");
        out
    };
    let want = read(theirs);
    let row = (c.dv * c.n_head) as usize;
    assert_eq!(want.len(), row * c.n_q as usize);
    assert!(want.iter().all(|x| x.is_finite()) && want.iter().any(|x| *x != 0.0));
    let same = |name: &str, got: &[f32], first_row: usize| {
        for (i, (a, b)) in got.iter().zip(&want[first_row * row..]).enumerate() {
            assert!(
                a.to_bits() == b.to_bits(),
                "{c:?}: {name}: row {} value {}: {a} vs ggml's {b}",
                first_row + i / row,
                i % row
            );
        }
    };
    same("all rows", &read(all), 0);
    same("scattered slots", &read(scattered), 0);
    for (r, o) in singles {
        same("alone", &read(o), r as usize);
    }
}

const BASE: Case = Case {
    dk: 64,
    dv: 64,
    n_head: 9,
    n_head_kv: 3,
    n_kv: 320,
    n_q: 64,
    first: 250,
    window: None,
    softcap: 0.0,
    sinks: false,
    threads: 2,
};

#[test]
fn rows_match_the_tiled_kernel_bit_for_bit() {
    // SmolLM2's shape: three query heads per KV head, the last tile partly visible.
    check(BASE);
    // Rows that start in the first tile, over keys that end in a partial tile, odd thread count.
    check(Case {
        n_kv: 200,
        n_q: 70,
        first: 20,
        threads: 3,
        ..BASE
    });
    // Gemma 3's shape (head size 256, one KV head) with a sliding window.
    check(Case {
        dk: 256,
        dv: 256,
        n_head: 4,
        n_head_kv: 1,
        n_kv: 640,
        n_q: 80,
        first: 520,
        window: Some(512),
        ..BASE
    });
    // Different K and V head sizes, one query head per KV head.
    check(Case {
        dk: 192,
        dv: 128,
        n_head: 4,
        n_head_kv: 4,
        n_kv: 256,
        n_q: 64,
        first: 100,
        ..BASE
    });
    // A logit soft cap, and sinks.
    check(Case {
        softcap: 30.0,
        ..BASE
    });
    check(Case {
        sinks: true,
        n_head: 8,
        n_head_kv: 2,
        ..BASE
    });
}
