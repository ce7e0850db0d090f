//! Axle's column-invariant product hint on a backend without Axle's CUDA kernel: the CPU device
//! does not claim the kernel, and a hinted product computes exactly what ggml's own does (the
//! hint is ignored), so graphs may carry it wherever they run. The kernel itself is checked on
//! CUDA devices by `axle bench device-check` (docs/gpu.md).
mod common;

use axle_ggml::{column_invariant, BufferType, Context, DType, Device, TensorStore};
use common::Lcg;

#[test]
fn the_cpu_neither_claims_the_kernel_nor_changes_a_hinted_product() {
    let cpu = Device::cpu().expect("the CPU device");
    for t in [
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::F16,
        DType::F32,
    ] {
        assert!(!cpu.column_invariant_products(t), "{t:?}");
    }
    let (k, m, n) = (256i64, 24i64, 12i64);
    let store = TensorStore::zeroed(BufferType::cpu(), &[("w".into(), DType::F32, vec![k, m])])
        .expect("weight buffer");
    let w = store.get("w").expect("w");
    let mut rng = Lcg(7);
    let ws: Vec<f32> = (0..k * m)
        .map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    w.t().write(&ws).expect("write weights");
    let ctx = Context::new(64, 64).expect("context");
    let x = ctx.input(DType::F32, &[k, n], "x");
    let hinted = ctx
        .mul_mat_column_invariant(w.t(), x)
        .named("hinted")
        .as_output();
    assert_eq!(hinted.op_param_i32(1), column_invariant::HINT);
    let plain = ctx.mul_mat(w.t(), x).named("plain").as_output();
    let mut g = ctx.graph(64);
    g.expand(hinted);
    g.expand(plain);
    let _sched = common::compute_with_random_input(&mut g, x, 1, &mut rng);
    let (mut a, mut b): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
    hinted.read(&mut a).expect("read");
    plain.read(&mut b).expect("read");
    assert_eq!(a.len(), (m * n) as usize);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b));
}
