//! Multi-head latent attention (DeepSeek V2/V3, GLM-4.7-Flash) as Transformers and mlx-lm hold
//! it, read into the `deepseek2` family's GGUF layout. Transformers keeps one `kv_b_proj` a layer,
//! per head the key up-projection's rows then the value up-projection's; GGUF holds them apart,
//! the key one transposed (`attn_k_b`, `[heads, kv_lora, nope]`, absorbed into the queries) and
//! the value one as it is (`attn_v_b`, `[heads, v, kv_lora]`), as llama.cpp's converter splits
//! them. mlx-lm's folders hold that split already (`embed_q`, `unembed_out`), quantized or not.
use axle_ggml::{DType, MetaValue};
use std::collections::BTreeMap;

/// The family's layer tensors, Hugging Face name to GGUF name, where they differ from the other
/// families'.
pub(super) const LAYER: &[(&str, &str)] = &[
    ("self_attn.q_a_proj.weight", "attn_q_a.weight"),
    ("self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"),
    ("self_attn.q_b_proj.weight", "attn_q_b.weight"),
    (
        "self_attn.kv_a_proj_with_mqa.weight",
        "attn_kv_a_mqa.weight",
    ),
    ("self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"),
    // Split at load into attn_k_b and attn_v_b.
    ("self_attn.kv_b_proj.weight", "attn_kv_b.weight"),
    ("self_attn.embed_q.weight", "attn_k_b.weight"),
    ("self_attn.unembed_out.weight", "attn_v_b.weight"),
    ("mlp.gate.e_score_correction_bias", "exp_probs_b.bias"),
    (
        "mlp.shared_experts.gate_proj.weight",
        "ffn_gate_shexp.weight",
    ),
    ("mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"),
    (
        "mlp.shared_experts.down_proj.weight",
        "ffn_down_shexp.weight",
    ),
];

/// The latent attention's sizes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Latent {
    heads: usize,
    kv_lora: usize,
    nope: usize,
    v: usize,
}

impl Latent {
    /// From the metadata [`super::config`] wrote.
    pub fn read(metadata: &BTreeMap<String, MetaValue>, arch: &str) -> Option<Latent> {
        let int = |k: &str| {
            metadata
                .get(&format!("{arch}.{k}"))
                .and_then(MetaValue::as_i64)
                .map(|v| v as usize)
        };
        Some(Latent {
            heads: int("attention.head_count")?,
            kv_lora: int("attention.kv_lora_rank")?,
            nope: int("attention.key_length_mla")?.checked_sub(int("rope.dimension_count")?)?,
            v: int("attention.value_length_mla")?,
        })
    }

    /// `kv_b_proj` (`[heads * (nope + v), kv_lora]` of a float type) as GGUF's `attn_k_b` and
    /// `attn_v_b`: (shape, bytes) each.
    #[allow(clippy::type_complexity)]
    pub fn split_kv_b(
        &self,
        bytes: &[u8],
        dtype: DType,
    ) -> Result<((Vec<i64>, Vec<u8>), (Vec<i64>, Vec<u8>)), String> {
        let size = match dtype {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            other => {
                return Err(format!(
                    "a {other:?} kv_b_proj (a quantized one is read from mlx-lm's embed_q and \
                     unembed_out)"
                ))
            }
        };
        let Latent {
            heads,
            kv_lora,
            nope,
            v,
        } = *self;
        let row = kv_lora * size;
        if bytes.len() != heads * (nope + v) * row {
            return Err(format!(
                "{} bytes are not {heads} heads of {nope} + {v} rows of {kv_lora}",
                bytes.len()
            ));
        }
        let mut k_b = vec![0u8; heads * nope * row];
        let mut v_b = Vec::with_capacity(heads * v * row);
        for h in 0..heads {
            let head = &bytes[h * (nope + v) * row..(h + 1) * (nope + v) * row];
            // Key rows [nope, kv_lora], transposed to [kv_lora, nope].
            for n in 0..nope {
                for l in 0..kv_lora {
                    let from = n * row + l * size;
                    let to = ((h * kv_lora + l) * nope + n) * size;
                    k_b[to..to + size].copy_from_slice(&head[from..from + size]);
                }
            }
            v_b.extend_from_slice(&head[nope * row..]);
        }
        let shape = |a: usize, b: usize| vec![a as i64, b as i64, heads as i64];
        Ok(((shape(nope, kv_lora), k_b), (shape(kv_lora, v), v_b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_b_splits_into_transposed_keys_and_values() {
        // 2 heads, nope 2, v 1, kv_lora 3; one byte per value would be no float type, so f16
        // pairs: value x as [x, 0].
        let latent = Latent {
            heads: 2,
            kv_lora: 3,
            nope: 2,
            v: 1,
        };
        let rows: Vec<u8> = (0u8..18).flat_map(|x| [x, 0]).collect();
        let ((ks, k), (vs, v)) = latent.split_kv_b(&rows, DType::F16).unwrap();
        assert_eq!((ks, vs), (vec![2, 3, 2], vec![3, 1, 2]));
        let vals = |b: Vec<u8>| b.chunks(2).map(|c| c[0]).collect::<Vec<u8>>();
        // Head 0 keys [[0 1 2] [3 4 5]] transposed: [[0 3] [1 4] [2 5]]; head 1 from 9.
        assert_eq!(vals(k), [0, 3, 1, 4, 2, 5, 9, 12, 10, 13, 11, 14]);
        assert_eq!(vals(v), [6, 7, 8, 15, 16, 17]);
        assert!(latent.split_kv_b(&rows[..30], DType::F16).is_err());
        assert!(latent.split_kv_b(&rows, DType::Q8_0).is_err());
    }
}
