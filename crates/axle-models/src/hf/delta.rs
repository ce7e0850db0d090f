//! Gated delta net layers (Qwen 3.5, Qwen3-Next) as Transformers and mlx-lm hold them, read into
//! the layout llama.cpp's converter writes and the `qwen35`, `qwen35moe` and `qwen3next` families
//! read:
//! - **Value heads.** Transformers keeps a key head's value heads together (grouped); Qwen 3.5's
//!   GGUF tiles them (value head `r` of every key head, then `r + 1`), so that ggml broadcasts
//!   the key heads to the value heads. The value rows of `in_proj_qkv` and of the convolution,
//!   the rows of `in_proj_z`, `in_proj_a`, `in_proj_b`, `A_log` and `dt_bias`, and the columns of
//!   `out_proj` move; nothing else does. Qwen3-Next's GGUF keeps them grouped.
//! - **Qwen3-Next's fused projection**, `in_proj_qkvz`, holds per key head its query, key, values
//!   and output gate; GGUF holds all queries, then keys, then values (`attn_qkv`), and the gates
//!   apart (`attn_gate`). Its `in_proj_ba` is GGUF's `ssm_ba` as it is.
//! - **The decay.** Folders hold `A_log`; GGUF holds `-exp(A_log)`, computed here in f64 and
//!   rounded to f32 once.
//! - **The convolution**, `[channels, 1, taps]` (Transformers) or `[channels, taps, 1]` (mlx-lm),
//!   is GGUF's `[taps, channels]` in f32: the same order of numbers.
//! - **Norms** scale by `1 + w`, as Gemma's do, but for the delta net's own output norm: GGUF
//!   stores `1 + w`. Folders mlx-lm wrote hold `1 + w` already; their convolution's layout tells
//!   them apart, as mlx-lm itself tells them.
use super::config::Values;
use axle_ggml::{DType, MetaValue};
use std::collections::BTreeMap;

/// Qwen 3.5's layer tensors, Hugging Face name to GGUF name, where they differ from the other
/// families' (`post_attention_layernorm` is the norm after attention, before the FFN).
pub(super) const LAYER: &[(&str, &str)] = &[
    ("linear_attn.in_proj_qkv.weight", "attn_qkv.weight"),
    // Qwen3-Next's: split at load into attn_qkv and attn_gate.
    ("linear_attn.in_proj_qkvz.weight", "attn_qkvz.weight"),
    ("linear_attn.in_proj_ba.weight", "ssm_ba.weight"),
    ("linear_attn.in_proj_z.weight", "attn_gate.weight"),
    ("linear_attn.in_proj_b.weight", "ssm_beta.weight"),
    ("linear_attn.in_proj_a.weight", "ssm_alpha.weight"),
    ("linear_attn.A_log", "ssm_a"),
    ("linear_attn.dt_bias", "ssm_dt.bias"),
    ("linear_attn.conv1d.weight", "ssm_conv1d.weight"),
    ("linear_attn.norm.weight", "ssm_norm.weight"),
    ("linear_attn.out_proj.weight", "ssm_out.weight"),
    (
        "post_attention_layernorm.weight",
        "post_attention_norm.weight",
    ),
    (
        "mlp.shared_expert.gate_proj.weight",
        "ffn_gate_shexp.weight",
    ),
    ("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
    (
        "mlp.shared_expert.down_proj.weight",
        "ffn_down_shexp.weight",
    ),
    ("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
];

/// Whether a folder's norms hold `w` (Transformers) rather than `1 + w` (mlx-lm): its
/// convolutions are `[channels, 1, taps]`, not `[channels, taps, 1]`.
pub(super) fn norms_hold_w<'a>(mut convolutions: impl Iterator<Item = &'a [usize]>) -> bool {
    !convolutions.any(|s| s.len() == 3 && s[2] == 1 && s[1] != 1)
}

/// Whether a tensor (by its Hugging Face name) is a norm stored as `w` for `1 + w`.
pub(super) fn is_offset_norm(hf: &str) -> bool {
    hf.ends_with("norm.weight") && !hf.ends_with("linear_attn.norm.weight")
}

/// `-exp(A_log)`, each computed in f64 and rounded once.
pub(super) fn decay(a_log: &mut [f32]) {
    for x in a_log {
        *x = -(*x as f64).exp() as f32;
    }
}

/// The delta net's head counts and sizes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Heads {
    values: Values,
    k_heads: usize,
    head_k: usize,
    v_heads: usize,
    head_v: usize,
}

impl Heads {
    /// From the metadata [`super::config`] wrote.
    pub fn read(
        metadata: &BTreeMap<String, MetaValue>,
        arch: &str,
        values: Values,
    ) -> Option<Heads> {
        let int = |k: &str| {
            metadata
                .get(&format!("{arch}.ssm.{k}"))
                .and_then(MetaValue::as_i64)
                .map(|v| v as usize)
        };
        let v_heads = int("time_step_rank")?;
        Some(Heads {
            values,
            k_heads: int("group_count")?,
            head_k: int("state_size")?,
            v_heads,
            head_v: int("inner_size")? / v_heads.max(1),
        })
    }

    /// A GGUF tensor's bytes with its value heads tiled, if it has any: `rows` rows of
    /// `cols` values of `dtype` each. `None` for tensors that keep their order.
    pub fn tile(
        &self,
        name: &str,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        dtype: DType,
    ) -> Result<Option<Vec<u8>>, String> {
        if self.k_heads == self.v_heads || self.values == Values::Grouped {
            return Ok(None);
        }
        let kind = name.split_once('.').map_or(name, |(_, k)| k);
        let kind = kind.split_once('.').map_or(kind, |(_, k)| k);
        let (first, head) = match kind {
            "attn_qkv.weight" | "ssm_conv1d.weight" => {
                (2 * self.k_heads * self.head_k, self.head_v)
            }
            "attn_gate.weight" => (0, self.head_v),
            "ssm_beta.weight" | "ssm_alpha.weight" | "ssm_a" | "ssm_dt.bias" => (0, 1),
            "ssm_out.weight" => return self.tile_columns(bytes, rows, cols, dtype).map(Some),
            _ => return Ok(None),
        };
        if rows == 0 || !bytes.len().is_multiple_of(rows) {
            return Err(format!("{} bytes in {rows} rows", bytes.len()));
        }
        let row = bytes.len() / rows;
        tile(&bytes[first.min(rows) * row..], row, self.k_heads, head)
            .map(|v| Some([&bytes[..first.min(rows) * row], &v[..]].concat()))
    }

    /// How many of a tensor's `cols` columns move together when its value heads are tiled.
    pub fn column_run(&self, name: &str, cols: usize) -> usize {
        match name.ends_with(".ssm_out.weight")
            && self.k_heads != self.v_heads
            && self.values == Values::Tiled
        {
            true => self.head_v,
            false => cols,
        }
    }

    /// `out_proj`'s columns: each row's chunks of `head_v` values, tiled. Quantized rows move by
    /// whole blocks, so a head must hold whole blocks.
    fn tile_columns(
        &self,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        dtype: DType,
    ) -> Result<Vec<u8>, String> {
        let block = dtype.block_size().max(1) as usize;
        if cols != self.v_heads * self.head_v || !self.head_v.is_multiple_of(block) {
            return Err(format!(
                "{cols} columns of {dtype:?} do not split into {} value heads of {} in whole blocks \
                 of {block}",
                self.v_heads, self.head_v
            ));
        }
        if rows == 0 || !bytes.len().is_multiple_of(rows) {
            return Err(format!("{} bytes in {rows} rows", bytes.len()));
        }
        let row = bytes.len() / rows;
        let mut out = Vec::with_capacity(bytes.len());
        for r in bytes.chunks_exact(row) {
            out.extend(tile(r, row / self.v_heads, self.k_heads, 1)?);
        }
        Ok(out)
    }
}

impl Heads {
    /// Qwen3-Next's `in_proj_qkvz` rows (per key head: query, key, values, gates) as GGUF's
    /// `attn_qkv` (all queries, all keys, all values) and `attn_gate` rows.
    pub fn split_qkvz(&self, bytes: &[u8], rows: usize) -> Result<(Vec<u8>, Vec<u8>), String> {
        let per_v = self.v_heads / self.k_heads.max(1) * self.head_v;
        let parts = [self.head_k, self.head_k, per_v, per_v];
        let block: usize = parts.iter().sum();
        if rows != block * self.k_heads || rows == 0 || !bytes.len().is_multiple_of(rows) {
            return Err(format!(
                "{rows} rows are not {} key heads of {block}",
                self.k_heads
            ));
        }
        let row = bytes.len() / rows;
        let mut qkv = Vec::with_capacity(row * (rows - per_v * self.k_heads));
        let mut gate = Vec::with_capacity(row * per_v * self.k_heads);
        for (i, &n) in parts.iter().enumerate() {
            let at: usize = parts[..i].iter().sum();
            for g in 0..self.k_heads {
                let from = (g * block + at) * row;
                let out = if i == 3 { &mut gate } else { &mut qkv };
                out.extend_from_slice(&bytes[from..from + n * row]);
            }
        }
        Ok((qkv, gate))
    }
}

/// Rows of `row` bytes, in runs of `head` rows per value head, from grouped order (key head
/// `g`'s value heads `0..n` together) to tiled order (value head `r` of every key head together).
fn tile(bytes: &[u8], row: usize, k_heads: usize, head: usize) -> Result<Vec<u8>, String> {
    let run = row * head;
    if run == 0 || k_heads == 0 || !bytes.len().is_multiple_of(run * k_heads) {
        return Err(format!(
            "{} bytes do not split into {k_heads} key heads' value heads of {head} rows",
            bytes.len()
        ));
    }
    let per_key = bytes.len() / (run * k_heads);
    let mut out = vec![0u8; bytes.len()];
    for g in 0..k_heads {
        for r in 0..per_key {
            let src = (g * per_key + r) * run;
            let dst = (r * k_heads + g) * run;
            out[dst..dst + run].copy_from_slice(&bytes[src..src + run]);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_heads_go_from_grouped_to_tiled() {
        // 2 key heads with 3 value heads each, one byte per head: g0v0 g0v1 g0v2 g1v0 g1v1 g1v2
        // -> g0v0 g1v0 g0v1 g1v1 g0v2 g1v2.
        let grouped = [0, 1, 2, 10, 11, 12];
        assert_eq!(tile(&grouped, 1, 2, 1).unwrap(), [0, 10, 1, 11, 2, 12]);
        assert!(tile(&grouped, 1, 4, 1).is_err());
        let heads = Heads {
            values: Values::Tiled,
            k_heads: 2,
            head_k: 1,
            v_heads: 4,
            head_v: 1,
        };
        // The first 2 * 2 * 1 rows of in_proj_qkv (queries and keys) keep their place.
        let qkv = [7, 8, 9, 6, 0, 1, 10, 11];
        let out = heads.tile("blk.0.attn_qkv.weight", &qkv, 8, 1, DType::F32);
        assert_eq!(out.unwrap().unwrap(), [7, 8, 9, 6, 0, 10, 1, 11]);
        // out_proj's columns move in each row; whole blocks only.
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let row = f32s(&[0.0, 1.0, 10.0, 11.0]);
        let out = heads.tile("blk.0.ssm_out.weight", &row, 1, 4, DType::F32);
        assert_eq!(out.unwrap().unwrap(), f32s(&[0.0, 10.0, 1.0, 11.0]));
        assert!(heads
            .tile("blk.0.ssm_out.weight", &[0; 18], 1, 4, DType::Q8_0)
            .is_err());
        assert_eq!(
            heads.tile("blk.0.ffn_up.weight", &qkv, 8, 1, DType::F32),
            Ok(None)
        );
    }

    #[test]
    fn qkvz_splits_into_qkv_and_gates_by_key_head() {
        // 2 key heads of queries and keys 1 wide, 2 value heads each 1 wide: per key head
        // q k v v z z.
        let heads = Heads {
            values: Values::Grouped,
            k_heads: 2,
            head_k: 1,
            v_heads: 4,
            head_v: 1,
        };
        let rows = [1, 2, 3, 4, 5, 6, 11, 12, 13, 14, 15, 16];
        let (qkv, gate) = heads.split_qkvz(&rows, 12).unwrap();
        assert_eq!(qkv, [1, 11, 2, 12, 3, 4, 13, 14]);
        assert_eq!(gate, [5, 6, 15, 16]);
        assert!(heads.split_qkvz(&rows[..10], 10).is_err());
        // Grouped values stay where they are.
        assert_eq!(
            heads.tile("blk.0.attn_gate.weight", &rows, 12, 1, DType::F32),
            Ok(None)
        );
    }

    #[test]
    fn mlx_folders_are_told_by_their_convolutions() {
        assert!(norms_hold_w([&[96usize, 1, 4][..]].into_iter()));
        assert!(!norms_hold_w([&[96usize, 4, 1][..]].into_iter()));
        assert!(is_offset_norm("model.layers.0.input_layernorm.weight"));
        assert!(is_offset_norm("model.layers.3.self_attn.q_norm.weight"));
        assert!(!is_offset_norm("model.layers.0.linear_attn.norm.weight"));
        let mut a = [0.0f32, (2.0f64).ln() as f32];
        decay(&mut a);
        assert_eq!(a, [-1.0, -2.0]);
    }
}
