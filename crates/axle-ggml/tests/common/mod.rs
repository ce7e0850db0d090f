//! What the axle-ggml tests share.
use axle_ggml::{Backend, Graph, GraphScheduler, Tensor};

/// A small deterministic generator (no test should depend on a seed source).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    pub fn unit(&mut self) -> f32 {
        self.next() as f32 / (1u64 << 31) as f32 * 2.0 - 1.0
    }
}

/// Allocates `g` on a CPU backend of `threads` threads, fills its input `x` with random values
/// in (-2, 2) and computes it; returns the scheduler, which holds the outputs' memory.
#[allow(dead_code)] // not every test computes a graph this way
pub fn compute_with_random_input<'a>(
    g: &mut Graph<'a>,
    x: Tensor<'a>,
    threads: usize,
    rng: &mut Lcg,
) -> GraphScheduler {
    compute_with_random_input_sized(g, x, threads, 256, rng)
}

/// As [`compute_with_random_input`], for graphs of up to `nodes` nodes.
#[allow(dead_code)] // not every test computes a graph this way
pub fn compute_with_random_input_sized<'a>(
    g: &mut Graph<'a>,
    x: Tensor<'a>,
    threads: usize,
    nodes: usize,
    rng: &mut Lcg,
) -> GraphScheduler {
    let mut sched =
        GraphScheduler::new(vec![Backend::cpu(threads).expect("cpu")], nodes).expect("scheduler");
    sched.alloc(0, g).expect("alloc");
    let xs: Vec<f32> = (0..x.nelements()).map(|_| rng.unit() * 2.0).collect();
    x.write(&xs).expect("write x");
    sched.compute(0, g).expect("compute");
    sched
}
