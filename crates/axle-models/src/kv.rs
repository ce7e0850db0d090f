//! KV storage: per layer, one K and one V tensor of `kv_size` slots ([`KvType`]). A slot holds one
//! token's keys (or values) for all KV heads; which slot a token uses is decided by the core
//! (slot = block * block_size + offset) and written with `set_rows`. Nothing here knows about
//! sequences: visibility is the attention mask's job.
use axle_ggml::{BufferType, DType, StoredTensor, TensorStore};

/// A tensor to allocate: name, type, shape.
type TensorSpec = (String, DType, Vec<i64>);

/// How the cache stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// ggml's F16: two bytes a value.
    #[default]
    F16,
    /// ggml's Q8_0: blocks of 32 int8 with an F16 scale, 34 bytes per 32 values (about half of
    /// F16). A token's row is rounded once, when it is written, from that row's values alone, so
    /// rows read the same whoever wrote them beside it; read by Axle's paged attention.
    Q8_0,
}

// The names of the CLI's `--kv-type`.
crate::choice::named_choice!(KvType, "KV types", {
    "f16" => KvType::F16,
    "q8_0" => KvType::Q8_0,
});

impl KvType {
    /// The ggml type of the cache's tensors.
    pub fn dtype(self) -> DType {
        match self {
            KvType::F16 => DType::F16,
            KvType::Q8_0 => DType::Q8_0,
        }
    }

    /// Bytes of a row of `width` values.
    pub fn row_bytes(self, width: i64) -> usize {
        self.dtype().row_size(width)
    }
}

/// The KV tensors of all layers.
#[derive(Debug)]
pub struct KvCache {
    _stores: Vec<TensorStore>,
    /// K per layer: [n_embd_k_gqa, kv_size].
    pub k: Vec<StoredTensor>,
    /// V per layer: [n_embd_v_gqa, kv_size]; none for a K-only (latent) layer, whose V is the
    /// start of each K row.
    pub v: Vec<Option<StoredTensor>>,
    /// Number of slots.
    pub size: u32,
}

impl KvCache {
    /// Allocates `size` zeroed slots for layers with the given (k, v) widths (v = 0: a K-only
    /// layer), each layer's in the memory of its buffer type (`bufts[il]`: the device that runs
    /// the layer), stored as `ty`.
    pub fn new(
        bufts: &[BufferType],
        dims: &[(i64, i64)],
        size: u32,
        ty: KvType,
    ) -> Result<KvCache, axle_ggml::Error> {
        assert_eq!(bufts.len(), dims.len(), "one buffer type per layer");
        let mut stores: Vec<(BufferType, Vec<TensorSpec>)> = Vec::new();
        for (il, (&(k, v), &buft)) in dims.iter().zip(bufts).enumerate() {
            let specs = match stores.iter_mut().find(|(b, _)| *b == buft) {
                Some((_, specs)) => specs,
                None => {
                    stores.push((buft, Vec::new()));
                    &mut stores.last_mut().expect("just pushed").1
                }
            };
            specs.push((format!("cache_k_l{il}"), ty.dtype(), vec![k, size as i64]));
            if v > 0 {
                specs.push((format!("cache_v_l{il}"), ty.dtype(), vec![v, size as i64]));
            }
        }
        let stores = stores
            .iter()
            .map(|(buft, specs)| TensorStore::zeroed(*buft, specs))
            .collect::<Result<Vec<_>, _>>()?;
        let find = |name: &str| {
            stores
                .iter()
                .find_map(|s| s.get(name))
                .ok_or_else(|| axle_ggml::Error::MissingTensor(name.to_string()))
        };
        let mut k = Vec::new();
        let mut v = Vec::new();
        for (il, &(_, v_width)) in dims.iter().enumerate() {
            k.push(find(&format!("cache_k_l{il}"))?);
            v.push(match v_width {
                0 => None,
                _ => Some(find(&format!("cache_v_l{il}"))?),
            });
        }
        Ok(KvCache {
            _stores: stores,
            k,
            v,
            size,
        })
    }

    /// Whether some layer's KV lives in device (not host) memory.
    pub fn on_device(&self) -> bool {
        self.k.iter().any(|t| t.t().is_on_device())
    }

    /// Bytes used by the cache.
    pub fn nbytes(&self) -> usize {
        self.k
            .iter()
            .chain(self.v.iter().flatten())
            .map(|t| t.t().nbytes())
            .sum()
    }
}
