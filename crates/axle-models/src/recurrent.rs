//! Recurrent state of linear-attention layers (Qwen3.5's gated delta net): per layer, a
//! convolution window and a delta-rule state per sequence. Unlike KV, the state is not a list of
//! per-token rows: a step reads a sequence's state once and writes it back once.
//!
//! Each sequence owns a group of `snapshots` rows per layer. A step that runs `n` tokens of a
//! sequence writes the states after its last `keep` tokens (row `s` of the group = the state `s`
//! tokens back from the end; keep = drafts + 1 for a verify step, 1 otherwise), and the next step
//! reads whichever row the accepted tokens end at. Rejecting drafts therefore costs nothing: no
//! copy, no recompute, whatever the context length. A step at position 0 starts from the zero
//! state (row 0 of every pool, never written).
use axle_ggml::{BufferType, DType, StoredTensor, Tensor, TensorStore};

pub use axle_core::StateSlots;

/// The state pools: per recurrent layer, the convolution windows and the delta-rule states of
/// every group, F32, one row per (group, snapshot) plus the zero row.
#[derive(Debug)]
pub struct RecurrentCache {
    _stores: Vec<TensorStore>,
    /// [conv_width, rows] per recurrent layer (in the family's order).
    pub conv: Vec<StoredTensor>,
    /// [state_width, rows] per recurrent layer.
    pub ssm: Vec<StoredTensor>,
    /// Groups (sequences that can hold state at once).
    pub groups: u32,
    /// Rows per group.
    pub snapshots: u32,
    /// Rows after the groups that hold saved states (prefix reuse).
    pub saved: u32,
}

impl RecurrentCache {
    /// Zeroed pools for layers of the given (conv, state) widths, each in its buffer type.
    pub fn new(
        bufts: &[BufferType],
        dims: &[(i64, i64)],
        groups: u32,
        snapshots: u32,
        saved: u32,
    ) -> Result<RecurrentCache, axle_ggml::Error> {
        assert_eq!(
            bufts.len(),
            dims.len(),
            "one buffer type per recurrent layer"
        );
        let rows = 1 + groups as i64 * snapshots as i64 + saved as i64;
        let mut stores = Vec::new();
        let mut conv = Vec::new();
        let mut ssm = Vec::new();
        for (i, (&(c, s), &buft)) in dims.iter().zip(bufts).enumerate() {
            let specs = vec![
                (format!("state_conv_l{i}"), DType::F32, vec![c, rows]),
                (format!("state_ssm_l{i}"), DType::F32, vec![s, rows]),
            ];
            let store = TensorStore::zeroed(buft, &specs)?;
            let get = |name: &str| {
                store
                    .get(name)
                    .ok_or_else(|| axle_ggml::Error::MissingTensor(name.to_string()))
            };
            conv.push(get(&format!("state_conv_l{i}"))?);
            ssm.push(get(&format!("state_ssm_l{i}"))?);
            stores.push(store);
        }
        Ok(RecurrentCache {
            _stores: stores,
            conv,
            ssm,
            groups,
            snapshots,
            saved,
        })
    }

    /// The pool row of saved state `slot`.
    pub fn saved_row(&self, slot: u32) -> u32 {
        1 + self.groups * self.snapshots + slot
    }

    /// Copies row `from` to row `to` in every pool (a saved prefix state in or out).
    pub fn copy_row(&self, from: u32, to: u32) -> Result<(), axle_ggml::Error> {
        let mut buf = Vec::new();
        for pool in self.conv.iter().chain(&self.ssm) {
            let t = pool.t();
            let row = t.nb()[1];
            buf.resize(row, 0u8);
            t.read_bytes_at(from as usize * row, &mut buf)?;
            t.write_bytes_at(to as usize * row, &buf)?;
        }
        Ok(())
    }

    /// The pool row of snapshot `s` of `group`.
    pub fn row(&self, group: u32, s: u32) -> u32 {
        1 + group * self.snapshots + s
    }

    /// Bytes used by the pools.
    pub fn nbytes(&self) -> usize {
        self.conv
            .iter()
            .chain(&self.ssm)
            .map(|t| t.t().nbytes())
            .sum()
    }
}

/// One sequence's share of a step, for the recurrent layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StateSeq {
    /// First row of the sequence in the step.
    pub first: i64,
    /// Its tokens.
    pub n: i64,
    /// States it keeps (at most `n`).
    pub keep: i64,
    /// Where its rows start in the step's write indices.
    pub write_off: i64,
}

/// The recurrent part of a step: the pools, the sequences and the row indices to read and write.
#[derive(Debug)]
pub struct StateStep<'a> {
    /// The pools.
    pub cache: &'a RecurrentCache,
    /// The step's sequences, in order.
    pub seqs: Vec<StateSeq>,
    /// I32 [n_seqs]: the pool row each sequence starts from.
    pub read: Tensor<'a>,
    /// I64 [sum of keep]: the pool rows each sequence's kept states go to, most recent first.
    pub write: Tensor<'a>,
}
