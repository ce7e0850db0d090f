//! The shape of a layer's attention heads, as graph code and the kernels' probes see it.

/// Attention hyperparameters of one layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnSpec {
    /// Query heads.
    pub n_head: i64,
    /// KV heads.
    pub n_head_kv: i64,
    /// Key (and query) head size.
    pub head_dim_k: i64,
    /// Value head size.
    pub head_dim_v: i64,
    /// Softmax scale.
    pub scale: f32,
    /// Attention logit softcap (0 = off).
    pub softcap: f32,
    /// Whether the layer uses the sliding-window mask.
    pub sliding: bool,
}
