//! KV storage: per layer, one K and one V tensor of `kv_size` slots (F16). A slot holds one
//! token's keys (or values) for all KV heads; which slot a token uses is decided by the core
//! (slot = block * block_size + offset) and written with `set_rows`. Nothing here knows about
//! sequences: visibility is the attention mask's job.
use axle_ggml::{BufferType, DType, StoredTensor, TensorStore};

/// The KV tensors of all layers.
pub struct KvCache {
    _store: TensorStore,
    /// K per layer: [n_embd_k_gqa, kv_size].
    pub k: Vec<StoredTensor>,
    /// V per layer: [n_embd_v_gqa, kv_size].
    pub v: Vec<StoredTensor>,
    /// Number of slots.
    pub size: u32,
}

impl KvCache {
    /// Allocates `size` zeroed slots for layers with the given (k, v) widths.
    pub fn new(
        buft: BufferType,
        dims: &[(i64, i64)],
        size: u32,
    ) -> Result<KvCache, axle_ggml::Error> {
        let mut specs = Vec::with_capacity(dims.len() * 2);
        for (il, &(k, v)) in dims.iter().enumerate() {
            specs.push((format!("cache_k_l{il}"), DType::F16, vec![k, size as i64]));
            specs.push((format!("cache_v_l{il}"), DType::F16, vec![v, size as i64]));
        }
        let store = TensorStore::zeroed(buft, &specs)?;
        let mut k = Vec::new();
        let mut v = Vec::new();
        for il in 0..dims.len() {
            k.push(store.require(&format!("cache_k_l{il}"))?);
            v.push(store.require(&format!("cache_v_l{il}"))?);
        }
        Ok(KvCache {
            _store: store,
            k,
            v,
            size,
        })
    }

    /// Bytes used by the cache.
    pub fn nbytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|t| t.t().nbytes()).sum()
    }
}
