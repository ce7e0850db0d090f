//! Where a model's layers run: one device, or contiguous layer ranges over several (GPUs of one
//! host, devices of other machines served over ggml's RPC backend, and the host CPU).
//!
//! A layer's weights and its KV blocks live on the device that runs the layer; ggml's graph
//! scheduler runs each layer's ops there and copies the activations between devices at range
//! boundaries, so a step crosses each boundary once. The token embedding stays in host memory (a
//! step reads a few of its rows); the output norm and head go with the last layer when every
//! layer is on an accelerator, and stay on the CPU otherwise.
use crate::ModelError;
use axle_ggml::meta::TensorParallel;
use axle_ggml::{BufferType, Device, DeviceKind};
use std::ops::Range;

/// Which devices run a model (`--device`, `--devices`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The first GPU when a GPU backend is registered (after any attached RPC devices, which
    /// come first), else the CPU.
    #[default]
    Auto,
    /// The CPU only.
    Cpu,
    /// Every GPU and attached RPC device, layers split between them.
    All,
    /// A device by ggml's name (`cuda0`, `cuda1`, `rpc0`, `metal`, `vulkan0`; any case).
    Named(String),
    /// Several devices by name, in layer order (`cpu` among them takes host layers).
    List(Vec<String>),
}

impl std::str::FromStr for DeviceChoice {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let names: Vec<String> = s
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        Ok(match names.as_slice() {
            [one] => match one.to_ascii_lowercase().as_str() {
                "auto" => DeviceChoice::Auto,
                "cpu" => DeviceChoice::Cpu,
                "all" => DeviceChoice::All,
                _ => DeviceChoice::Named(one.clone()),
            },
            [] => DeviceChoice::Auto,
            _ => DeviceChoice::List(names),
        })
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::All => f.write_str("all"),
            DeviceChoice::Named(n) => f.write_str(n),
            DeviceChoice::List(names) => f.write_str(&names.join(",")),
        }
    }
}

/// How a model is spread over several devices (`--split-mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SplitMode {
    /// Contiguous layer ranges, one per device.
    #[default]
    Layer,
    /// Every layer over every device: attention heads and feed-forward columns split between
    /// them, partial sums added across them (see [`crate::tensor_split`]).
    Tensor,
}

// The names of the CLI's `--split-mode`.
crate::choice::named_choice!(SplitMode, "split modes", {
    "layer" => SplitMode::Layer,
    "tensor" => SplitMode::Tensor,
});

/// Where a model goes, as asked: devices, split ratios, remote servers, host layers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlacementRequest {
    /// The devices.
    pub device: DeviceChoice,
    /// Layers on the accelerators, counted from the last (None: all of them, with the output
    /// head; fewer leave the first layers on the CPU).
    pub gpu_layers: Option<u32>,
    /// Share of the layers per device, in the order of the device list (None: in proportion to
    /// each device's free memory).
    pub split: Option<Vec<f32>>,
    /// RPC servers (`host:port`) whose devices to attach before choosing (`--rpc`).
    pub rpc: Vec<String>,
    /// Layer ranges, or every layer split over every device.
    pub split_mode: SplitMode,
}

/// A run of consecutive layers on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRange {
    /// The device (None: the host CPU).
    pub device: Option<Device>,
    /// The layers.
    pub layers: Range<u32>,
}

/// The layer ranges of a loaded model, first layer first.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    ranges: Vec<LayerRange>,
    /// With a tensor split: the joined device (the one range's device), the devices it joins
    /// and each one's share of every split tensor.
    tensor: Option<(TensorParallel, Vec<Device>, Vec<f64>)>,
}

impl Placement {
    /// Every layer on the CPU.
    pub fn host(n_layer: u32) -> Placement {
        Placement {
            ranges: vec![LayerRange {
                device: None,
                layers: 0..n_layer,
            }],
            tensor: None,
        }
    }

    /// Resolves a request for a model of `n_layer` layers: attaches RPC servers, finds the
    /// devices, and gives each a contiguous range of layers.
    pub fn resolve(req: &PlacementRequest, n_layer: u32) -> Result<Placement, ModelError> {
        axle_ggml::load_dynamic_backends();
        let mut remote = Vec::new();
        for endpoint in &req.rpc {
            remote.extend(axle_ggml::rpc::attach_server(endpoint)?);
        }
        let devices: Vec<Option<Device>> = match &req.device {
            DeviceChoice::Cpu => vec![None],
            DeviceChoice::Auto => {
                let mut d: Vec<Option<Device>> = remote.iter().copied().map(Some).collect();
                match Device::first_gpu().filter(|g| !remote.contains(g)) {
                    Some(g) => d.push(Some(g)),
                    None if !d.is_empty() => d.push(None),
                    None => {}
                }
                if d.is_empty() {
                    vec![None]
                } else {
                    d
                }
            }
            DeviceChoice::All => {
                let mut d: Vec<Option<Device>> = remote.iter().copied().map(Some).collect();
                d.extend(local_gpus().into_iter().map(Some));
                if d.is_empty() {
                    vec![None]
                } else {
                    d
                }
            }
            DeviceChoice::Named(n) => vec![find(n)?],
            DeviceChoice::List(names) => names.iter().map(|n| find(n)).collect::<Result<_, _>>()?,
        };
        let mut seen = Vec::new();
        for d in &devices {
            if seen.contains(d) {
                return Err(ModelError::Invalid(format!(
                    "device {} is listed twice",
                    d.map_or("cpu".to_string(), |d| d.name().to_ascii_lowercase())
                )));
            }
            seen.push(*d);
        }
        let weights: Vec<f64> = match &req.split {
            Some(r) => {
                if r.len() != devices.len()
                    || r.iter().any(|&x| !x.is_finite() || x < 0.0)
                    || r.iter().sum::<f32>() <= 0.0
                {
                    return Err(ModelError::Invalid(format!(
                        "--split needs one non-negative share per device, not all zero ({} \
                         devices, {} shares)",
                        devices.len(),
                        r.len()
                    )));
                }
                r.iter().map(|&x| x as f64).collect()
            }
            None => devices.iter().map(|d| free_memory(*d) as f64).collect(),
        };
        if req.split_mode == SplitMode::Tensor {
            return Placement::tensor(req, &devices, n_layer);
        }
        let accel = devices.iter().filter(|d| d.is_some()).count();
        if accel == 0 {
            return Ok(Placement::host(n_layer));
        }
        if req.gpu_layers.is_some() && devices.contains(&None) {
            return Err(ModelError::Invalid(
                "--gpu-layers and `cpu` in the device list both place host layers: use one".into(),
            ));
        }
        let on_accel = req.gpu_layers.unwrap_or(n_layer).min(n_layer);
        let first = n_layer - on_accel;
        let counts = split_layers(on_accel, &weights)
            .ok_or_else(|| ModelError::Invalid("--split shares add up to zero".to_string()))?;
        let mut ranges = Vec::new();
        if first > 0 {
            ranges.push(LayerRange {
                device: None,
                layers: 0..first,
            });
        }
        let mut at = first;
        for (d, c) in devices.iter().zip(counts) {
            if c > 0 {
                ranges.push(LayerRange {
                    device: *d,
                    layers: at..at + c,
                });
                at += c;
            }
        }
        if ranges.is_empty() {
            return Ok(Placement::host(n_layer));
        }
        Ok(Placement {
            ranges,
            tensor: None,
        })
    }

    /// Every layer on one device joined from `devices` (all accelerators, two or more).
    fn tensor(
        req: &PlacementRequest,
        devices: &[Option<Device>],
        n_layer: u32,
    ) -> Result<Placement, ModelError> {
        let joined: Vec<Device> = devices.iter().copied().flatten().collect();
        if joined.len() != devices.len() || joined.len() < 2 {
            return Err(ModelError::Invalid(
                "--split-mode tensor needs two or more accelerators and no `cpu` in --device"
                    .into(),
            ));
        }
        if req.gpu_layers.is_some() {
            return Err(ModelError::Invalid(
                "--split-mode tensor puts every layer on every device: --gpu-layers is for \
                 --split-mode layer"
                    .into(),
            ));
        }
        // Shares as given (checked above), else even: the devices of a tensor split are
        // usually alike, and each step waits for the slowest.
        let shares = match &req.split {
            Some(r) => r.iter().map(|&x| x as f64).collect(),
            None => vec![1.0; joined.len()],
        };
        let tp = TensorParallel::new(&joined)?;
        Ok(Placement {
            ranges: vec![LayerRange {
                device: Some(tp.device),
                layers: 0..n_layer,
            }],
            tensor: Some((tp, joined, shares)),
        })
    }

    /// The tensor-parallel device and each device's share, when the model is split by tensors.
    pub fn tensor_parallel(&self) -> Option<(&TensorParallel, &[f64])> {
        self.tensor
            .as_ref()
            .map(|(tp, _, shares)| (tp, shares.as_slice()))
    }

    /// The ranges, first layer first.
    pub fn ranges(&self) -> &[LayerRange] {
        &self.ranges
    }

    /// The device that runs layer `il` (None: the CPU).
    pub fn layer_device(&self, il: u32) -> Option<Device> {
        self.ranges
            .iter()
            .find(|r| r.layers.contains(&il))
            .and_then(|r| r.device)
    }

    /// The memory of layer `il`'s weights, KV and state (the device's, or host memory).
    pub fn layer_buffer(&self, il: u32) -> BufferType {
        self.layer_device(il)
            .map_or_else(BufferType::cpu, |d| d.buffer_type())
    }

    /// The device of the output norm and head: the last layer's when every layer is on an
    /// accelerator, else the CPU (None), as libllama places its output layer.
    pub fn head_device(&self) -> Option<Device> {
        if self.ranges.iter().any(|r| r.device.is_none()) {
            return None;
        }
        self.ranges.last().and_then(|r| r.device)
    }

    /// The accelerators in use, in layer order, each once.
    pub fn accelerators(&self) -> Vec<Device> {
        let mut out: Vec<Device> = Vec::new();
        for d in self.ranges.iter().filter_map(|r| r.device) {
            if !out.contains(&d) {
                out.push(d);
            }
        }
        out
    }

    /// Whether any layer runs on an accelerator.
    pub fn uses_accelerator(&self) -> bool {
        self.ranges.iter().any(|r| r.device.is_some())
    }

    /// Layers on accelerators (what libllama's `n_gpu_layers` counts, with the head when the
    /// first layer is on one too).
    pub fn accelerator_layers(&self) -> u32 {
        self.ranges
            .iter()
            .filter(|r| r.device.is_some())
            .map(|r| r.layers.len() as u32)
            .sum()
    }

    /// For reports: `CPU`, `CUDA0 (NVIDIA H100 80GB HBM3)`, or every range with its layers
    /// (`CPU layers 0-9, RPC0 (127.0.0.1:50052) layers 10-19, ...`) when there are several.
    pub fn summary(&self) -> String {
        let name = |d: &Option<Device>| match d {
            None => "CPU".to_string(),
            Some(d) => format!("{} ({})", d.name(), d.description()),
        };
        if let Some((_, devices, _)) = &self.tensor {
            let each: Vec<String> = devices.iter().map(|d| name(&Some(*d))).collect();
            return format!("tensor split over {}", each.join(", "));
        }
        match self.ranges.as_slice() {
            [one] => name(&one.device),
            many => many
                .iter()
                .map(|r| {
                    format!(
                        "{} layers {}-{}",
                        name(&r.device),
                        r.layers.start,
                        r.layers.end.saturating_sub(1)
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// The device called `name` (None for the CPU), or an error listing what there is.
fn find(name: &str) -> Result<Option<Device>, ModelError> {
    let d = find_device(name)?;
    Ok((d.kind() != DeviceKind::Cpu).then_some(d))
}

/// The registered device called `name` (ggml's name, any case; the CPU too), or the error that
/// names the devices there are and where backends were looked for.
pub fn find_device(name: &str) -> Result<Device, ModelError> {
    match Device::find(name) {
        Some(d) => Ok(d),
        None => Err(ModelError::NoDevice {
            asked: name.to_string(),
            available: Device::all()
                .iter()
                .map(|d| d.name().to_ascii_lowercase())
                .collect::<Vec<_>>()
                .join(", "),
            searched: axle_ggml::backend_search_dirs()
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The local GPUs (discrete and integrated), not the ones attached over RPC.
pub fn local_gpus() -> Vec<Device> {
    Device::all()
        .into_iter()
        .filter(|d| {
            matches!(d.kind(), DeviceKind::Gpu | DeviceKind::IntegratedGpu)
                && !axle_ggml::rpc::is_remote(d)
        })
        .collect()
}

/// Free memory of a device (the host's available memory for the CPU), for the default split.
fn free_memory(d: Option<Device>) -> usize {
    match d {
        Some(d) => d.memory().0,
        None => axle_ggml::host_available_memory().unwrap_or(0),
    }
}

/// Splits `n` layers into contiguous counts in proportion to `weights` (each boundary rounded
/// from the cumulative share, so the counts add up to `n`); None when the weights add up to zero.
/// Equal weights where every device reports zero free memory (a backend that does not tell).
pub fn split_layers(n: u32, weights: &[f64]) -> Option<Vec<u32>> {
    let total: f64 = weights.iter().sum();
    let weights: Vec<f64> = if total > 0.0 {
        weights.to_vec()
    } else if weights.iter().all(|&w| w == 0.0) && !weights.is_empty() {
        return split_layers(n, &vec![1.0; weights.len()]);
    } else {
        return None;
    };
    let total: f64 = weights.iter().sum();
    let mut out = Vec::with_capacity(weights.len());
    let mut cum = 0.0;
    let mut prev = 0u32;
    for (i, w) in weights.iter().enumerate() {
        cum += w;
        let bound = if i + 1 == weights.len() {
            n
        } else {
            ((cum / total) * n as f64).round().min(n as f64) as u32
        };
        let bound = bound.max(prev);
        out.push(bound - prev);
        prev = bound;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_parse() {
        assert_eq!("auto".parse::<DeviceChoice>().unwrap(), DeviceChoice::Auto);
        assert_eq!("ALL".parse::<DeviceChoice>().unwrap(), DeviceChoice::All);
        assert_eq!(
            "cuda0".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Named("cuda0".into())
        );
        assert_eq!(
            "cuda0, cuda1".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::List(vec!["cuda0".into(), "cuda1".into()])
        );
        assert_eq!(
            "cpu,rpc0,rpc1".parse::<DeviceChoice>().unwrap().to_string(),
            "cpu,rpc0,rpc1"
        );
    }

    #[test]
    fn layers_split_in_proportion_and_add_up() {
        assert_eq!(split_layers(80, &[1.0, 1.0]), Some(vec![40, 40]));
        assert_eq!(split_layers(30, &[1.0, 1.0, 1.0]), Some(vec![10, 10, 10]));
        assert_eq!(split_layers(10, &[3.0, 1.0]), Some(vec![8, 2]));
        assert_eq!(split_layers(5, &[0.0, 1.0]), Some(vec![0, 5]));
        assert_eq!(split_layers(7, &[0.0, 0.0]), Some(vec![4, 3]));
        assert_eq!(split_layers(7, &[]), None);
        for n in 0..50u32 {
            for w in [[1.0, 2.0, 3.0], [5.0, 0.5, 0.1], [1.0, 1.0, 1.0]] {
                let c = split_layers(n, &w).unwrap();
                assert_eq!(c.iter().sum::<u32>(), n, "{n} {w:?}");
            }
        }
    }
}
