//! How a runner's device steps multiply small columns: the default products by device and
//! engine size, the weight types the backends' kernels take, and the load-time check.
use super::*;

/// Engines that run at least this many sequences at once take wide products by default where the
/// backend replays MMQ for a few columns (see [`default_products`]): from here wide products
/// measured faster than the column-invariant kernel on Llama-3-8B-shaped Q4_0 and Q4_K_M files,
/// below it slower (docs/gpu.md).
pub const WIDE_FROM_SEQS: usize = 16;

/// The device layout's products where neither the runner's options nor `AXLE_DEVICE_PRODUCTS`
/// name them, given the weight types the accelerators multiply through Axle's column-invariant
/// kernel (`column_types`, bit per type: [`column_types`]) and through its replay of MMQ for a
/// few columns (`replay_types`: [`replay_types`]), and the most sequences the engine runs at once
/// (`max_seqs`):
/// - wide products ([`DeviceProducts::Wide`]: MMQ ops, one pass over the weights a step) where
///   both kernels are there and the engine runs [`WIDE_FROM_SEQS`] sequences or more;
/// - else the column-invariant kernel ([`DeviceProducts::Columns`]) where every accelerator's
///   backend carries it;
/// - else mat-vec groups ([`DeviceProducts::Groups`]).
///
/// The choice is the engine's for its life (a step cannot switch kernels without changing a
/// sequence's numbers), so it goes by the engine's capacity, not by the sequences of a step.
pub fn default_products(column_types: u64, replay_types: u64, max_seqs: usize) -> DeviceProducts {
    if column_types != 0 && replay_types != 0 && max_seqs >= WIDE_FROM_SEQS {
        DeviceProducts::Wide
    } else if column_types != 0 {
        DeviceProducts::Columns
    } else {
        DeviceProducts::Groups
    }
}

/// The quantized weight types (bit `1 << ggml id`) that every accelerator multiplies through
/// Axle's column-invariant kernel; 0 without accelerators, where one is not a CUDA device (a
/// tensor split's combined device among them) or where one lacks the kernel.
pub fn column_types(accelerators: &[axle_ggml::Device]) -> u64 {
    kernel_types(accelerators, axle_ggml::Device::column_invariant_products)
}

/// The quantized weight types (bit `1 << ggml id`) whose products of a few columns every
/// accelerator gives MMQ's numbers through Axle's replay ([`axle_ggml::wide_replay`]); 0 as for
/// [`column_types`].
pub fn replay_types(accelerators: &[axle_ggml::Device]) -> u64 {
    kernel_types(accelerators, axle_ggml::Device::wide_replay_products)
}

/// The types (bit per type) that every accelerator, all of them CUDA devices, `takes`.
pub(super) fn kernel_types(
    accelerators: &[axle_ggml::Device],
    takes: impl Fn(&axle_ggml::Device, DType) -> bool,
) -> u64 {
    if !all_cuda(accelerators) {
        return 0;
    }
    (0..64u32)
        .filter_map(DType::from_raw)
        .filter(|&t| accelerators.iter().all(|d| takes(d, t)))
        .fold(0, |mask, t| mask | 1u64 << t.raw())
}

/// Whether there are accelerators and all are CUDA devices: where wide products may run.
/// One weight per shape (type, row length, rows, memory) that small products multiply on an
/// accelerator: the model's quantized 2-D weights in device memory (not split across devices).
pub(super) fn product_weights(model: &Model) -> Vec<StoredTensor> {
    let mut seen = Vec::new();
    model
        .tensors()
        .into_iter()
        .filter(|w| {
            let t = w.t();
            let [k, m, rest @ ..] = t.ne();
            let buft = t.buffer_type();
            let key = (t.dtype(), k, m, buft);
            let take = t.dtype().is_quantized()
                && m > 1
                && rest == [1, 1]
                && t.is_on_device()
                && buft.is_some_and(|b| !b.is_split())
                && !seen.contains(&key);
            if take {
                seen.push(key);
            }
            take
        })
        .collect()
}

pub(super) fn all_cuda(accelerators: &[axle_ggml::Device]) -> bool {
    !accelerators.is_empty() && accelerators.iter().all(|d| d.name().starts_with("CUDA"))
}

impl Runner {
    /// Checks at load that the small products give a column the same bits at every width on
    /// each weight shape the model multiplies on its accelerators ([`small_products::probe`]).
    /// Only Axle's own kernels are probed (wide and column products; groups are ggml's mat-vec
    /// kernel, which computes every column by itself). Products the caller named are refused
    /// where the probe fails; default ones give way to the next (wide to columns, columns to
    /// groups), and [`Runner::products_note`] says why. `AXLE_PRODUCTS_PROBE=0` skips it.
    pub(super) fn check_products(&mut self, named: bool) -> Result<(), ModelError> {
        let probed = |p| matches!(p, DeviceProducts::Wide | DeviceProducts::Columns);
        if !self.device_layout()
            || !probed(self.arithmetic.products)
            || axle_ggml::env::var("AXLE_PRODUCTS_PROBE").as_deref() == Some("0")
        {
            return Ok(());
        }
        let weights = product_weights(&self.model);
        // The slot after every graph slot; resized afterwards, which frees the probe's memory.
        let slot = self.graph_slots;
        while self.sched.slots() <= slot {
            self.sched.add_slot(self.base_nodes)?;
        }
        let mut result = Ok(());
        while probed(self.arithmetic.products) {
            let d = DeviceStep::for_products(
                self.arithmetic.products,
                self.arithmetic.column_types,
                self.arithmetic.replay_types,
            );
            let mut failed = None;
            for w in &weights {
                let probed = small_products::probe(&mut self.sched, slot, w.t(), &d);
                if let Some(m) = probed.map_err(|e| {
                    ModelError::Invalid(format!(
                        "the check of the {} device products at load could not run on {}: {e} \
                         (AXLE_PRODUCTS_PROBE=0 skips it)",
                        self.arithmetic.products,
                        w.t().name()
                    ))
                })? {
                    failed = Some((w, m));
                    break;
                }
            }
            let Some((w, m)) = failed else {
                break;
            };
            let t = w.t();
            let what = format!(
                "{} device products failed their check at load on {} ({} [{}, {}] in {}): {m}",
                self.arithmetic.products,
                t.name(),
                t.dtype().name(),
                t.ne()[0],
                t.ne()[1],
                t.buffer_type().map_or_else(String::new, |b| b.name()),
            );
            if named {
                result = Err(ModelError::Invalid(format!(
                    "{what}; this device or ggml build does not give a column the same numbers at \
                     every width with them: choose other device products (groups always hold)"
                )));
                break;
            }
            let next = match self.arithmetic.products {
                DeviceProducts::Wide if self.arithmetic.column_types != 0 => {
                    DeviceProducts::Columns
                }
                _ => DeviceProducts::Groups,
            };
            self.arithmetic.products_note = Some(format!("{what}; took {next} instead"));
            self.arithmetic.products = next;
        }
        self.sched.resize(slot, self.base_nodes)?;
        result
    }
}

#[cfg(test)]
mod default_products_tests {
    use super::{default_products, DeviceProducts, WIDE_FROM_SEQS};

    const Q4_0: u64 = 1 << 2;

    #[test]
    fn large_engines_take_wide_products_where_the_replay_is_there() {
        let wide = default_products(Q4_0, Q4_0, WIDE_FROM_SEQS);
        assert_eq!(wide, DeviceProducts::Wide);
        assert_eq!(default_products(Q4_0, Q4_0, 64), DeviceProducts::Wide);
        let below = default_products(Q4_0, Q4_0, WIDE_FROM_SEQS - 1);
        assert_eq!(below, DeviceProducts::Columns, "a smaller engine");
        assert_eq!(default_products(Q4_0, Q4_0, 1), DeviceProducts::Columns);
        let no_replay = default_products(Q4_0, 0, 64);
        assert_eq!(
            no_replay,
            DeviceProducts::Columns,
            "a backend without the replay"
        );
        assert_eq!(
            default_products(0, 0, 64),
            DeviceProducts::Groups,
            "no Axle kernels"
        );
        assert_eq!(default_products(0, Q4_0, 64), DeviceProducts::Groups);
    }
}
