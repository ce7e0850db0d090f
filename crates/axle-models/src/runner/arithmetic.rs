//! Which arithmetic a runner's rows get: with batch-invariant kernels, numbers that depend on
//! each row alone (the device layout's products and paged attention on accelerators, the host
//! kernels on the CPU); with libllama's (`Kernels::LikeLlamaCpp`), its shape-dependent ones. The
//! choice is made once, from the runner's options, the environment's diagnostics
//! (`AXLE_DEVICE_PRODUCTS`, `AXLE_STACKED_ROWS`) and what the devices' backends carry; options
//! that cannot keep it (tensor split with exact kernels, a product or KV type a device lacks)
//! are refused here by name. A device may narrow it later: the product probe
//! ([`Runner::check_products`]) and a layer whose heads paged attention does not take.
use super::*;

/// The arithmetic of a runner's steps.
#[derive(Debug)]
pub(super) struct Arithmetic {
    /// How the device layout multiplies small columns.
    pub(super) products: DeviceProducts,
    /// Why the default products gave way to others at load ([`Runner::check_products`]).
    pub(super) products_note: Option<String>,
    /// With column-invariant products: the weight types every accelerator covers (bit per type).
    pub(super) column_types: u64,
    /// With wide products: the weight types whose few-column products every accelerator replays
    /// with MMQ's numbers (bit per type).
    pub(super) replay_types: u64,
    /// Which runs of one-row attention ops may share an op (`None`: never).
    pub(super) stacking: Option<StackTable>,
    /// The host kernels in force with batch-invariant kernels and the host layout (see
    /// [`HostKernels`]): `Tiled` is refused where the row attention op does not reproduce this
    /// build's ggml or steps take the device layout; `Origin` then takes the compatible
    /// arithmetic for every row. `None`: no host arithmetic to choose.
    pub(super) host_kernels: Option<HostKernels>,
    /// Whether device steps attend through paged attention ([`DeviceAttention::Paged`], where
    /// the backends carry it and the model's heads are ones it takes).
    pub(super) paged: bool,
    /// Set by graph building when some layer's heads are not ones paged attention takes.
    pub(super) paged_refused: std::cell::RefCell<Option<String>>,
    /// Why paged attention is off where it was asked for.
    pub(super) paged_note: Option<String>,
    /// The products were named (by the options or the environment), not the default: a
    /// failed probe refuses them instead of falling back.
    pub(super) named_products: bool,
}

impl Arithmetic {
    /// Chooses for `model` with `opts`, whose KV lies (`kv_on_device`) or not on an accelerator.
    pub(super) fn choose(
        model: &Model,
        opts: &RunnerOptions,
        kv_on_device: bool,
    ) -> Result<Arithmetic, ModelError> {
        let placement = model.placement();
        if placement.tensor_parallel().is_some() && opts.kernels == Kernels::BatchInvariant {
            return Err(ModelError::Invalid(
                "--split-mode tensor adds partial products across the devices in ops whose \
                 shape depends on the step, so it cannot keep outputs batch-invariant: use \
                 --kernels fast with it"
                    .into(),
            ));
        }
        let accelerators = placement.accelerators();
        // Paged attention where every accelerator's backend carries Axle's kernel (KV in host
        // memory: ggml's CPU runs the op's reference body).
        let paged_wanted = opts.device_attention == DeviceAttention::Paged
            && takes_device_layout(opts, kv_on_device);
        let paged = paged_wanted && accelerators.iter().all(|d| d.paged_attention(128, 1));
        check_kv_type(model, opts, kv_on_device, paged)?;
        let column_types = column_types(&accelerators);
        let replay_types = replay_types(&accelerators);
        // An explicit choice, else (with the exact kernels, whose choice it is) the
        // environment's, is honoured or refused below.
        let named = match opts.device_products {
            Some(p) => Some(p),
            None if opts.kernels == Kernels::BatchInvariant => {
                DeviceProducts::from_env().map_err(ModelError::Invalid)?
            }
            None => None,
        };
        let products =
            named.unwrap_or_else(|| default_products(column_types, replay_types, opts.max_seqs));
        if products == DeviceProducts::Wide && !all_cuda(&accelerators) {
            return Err(ModelError::Invalid(
                "wide device products need the model's layers on CUDA devices only: their column \
                 invariance is a property of CUDA's tiled quantized kernel"
                    .into(),
            ));
        }
        if products == DeviceProducts::Columns && column_types == 0 {
            return Err(ModelError::Invalid(
                "column device products need every accelerator's backend to carry Axle's \
                 column-invariant kernel: build the CUDA backend with scripts/build-backend.sh"
                    .into(),
            ));
        }
        let stacking = (opts.stacked_rows
            && axle_ggml::env::var("AXLE_STACKED_ROWS").as_deref() != Some("0"))
        .then(StackTable::default);
        let device_layout = opts.force_device_layout || kv_on_device;
        let host_tiled =
            opts.kernels == Kernels::BatchInvariant && opts.host_kernels == HostKernels::Tiled;
        if host_tiled && !axle_ggml::row_attention::supported() {
            return Err(ModelError::Invalid(
                "tiled host kernels: the row attention op does not reproduce this build's ggml \
                 (its self-check failed); use the compatible host kernels"
                    .into(),
            ));
        }
        if host_tiled && device_layout {
            return Err(ModelError::Invalid(
                "tiled host kernels are a choice for models whose KV lies in host memory; this one has \
                 layers on accelerators, whose steps take the device layout"
                    .into(),
            ));
        }
        let host_kernels = match opts.host_kernels {
            _ if opts.kernels != Kernels::BatchInvariant || device_layout => None,
            HostKernels::Origin if !axle_ggml::row_attention::supported() => {
                Some(HostKernels::Compatible)
            }
            k => Some(k),
        };
        Ok(Arithmetic {
            products,
            products_note: None,
            column_types,
            replay_types,
            stacking,
            host_kernels,
            paged,
            paged_refused: std::cell::RefCell::new(None),
            paged_note: (paged_wanted && !paged)
                .then(|| "the accelerators' backends do not carry Axle's paged attention".into()),
            named_products: named.is_some(),
        })
    }
}

/// Refuses a Q8_0 KV cache where paged attention would not read it: without the device layout
/// and paged attention (on every accelerator's backend), or with layers whose K and V rows are
/// not of one width and a multiple of a Q8_0 block (latent attention's K-only rows).
/// `paged`: whether steps attend through paged attention (what [`Arithmetic::choose`] decided).
fn check_kv_type(
    model: &Model,
    opts: &RunnerOptions,
    kv_on_device: bool,
    paged: bool,
) -> Result<(), ModelError> {
    if opts.kv_type == KvType::F16 {
        return Ok(());
    }
    let why = if !takes_device_layout(opts, kv_on_device) {
        Some("steps of the device layout (KV on an accelerator, batch-invariant kernels)")
    } else if opts.device_attention != DeviceAttention::Paged {
        Some("--device-attention paged")
    } else if !paged {
        Some("accelerators whose backends carry Axle's paged attention (scripts/build-backend.sh)")
    } else if model
        .family()
        .kv_dims()
        .iter()
        .any(|&(k, v)| k != v || k % 32 != 0)
    {
        Some("layers whose keys and values are rows of one width, a multiple of 32 (this model's latent or uneven heads are not)")
    } else {
        None
    };
    match why {
        Some(why) => Err(ModelError::Invalid(format!(
            "KV type {}: it is read by Axle's paged attention, which needs {why}; use f16",
            opts.kv_type
        ))),
        None => Ok(()),
    }
}

/// Whether a runner with `opts` whose KV is (`kv_on_device`) or is not on an accelerator
/// takes the device layout ([`Runner::device_layout`]).
pub(super) fn takes_device_layout(opts: &RunnerOptions, kv_on_device: bool) -> bool {
    opts.kernels == Kernels::BatchInvariant && (opts.force_device_layout || kv_on_device)
}
