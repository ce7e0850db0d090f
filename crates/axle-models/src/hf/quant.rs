//! MLX's affine quantization (`quantization` in config.json, as `mlx_lm.convert` writes it):
//! a quantized weight is `<module>.weight` (u32 words holding each row's `bits`-bit values as one
//! little-endian bit stream, the first value in the lowest bits; for 2, 4 and 8 bits no value
//! crosses a word), `<module>.scales` and `<module>.biases` (one per group of `group_size` values
//! of a row), and means `w = scale * q + bias`.
//!
//! How each reads here: 4-bit and 5-bit weights become ggml's Q4_1 and Q5_1 blocks (32 values,
//! an f16 scale and an f16 minimum, `w = d * q + m`: the same formula), each block taking its
//! group's scale and bias, which is exact where every scale and bias is an f16 value (always for
//! bf16 and f16 models, whose scales are of that type; 0.56 and 0.69 bytes a weight for groups of
//! 64, as MLX's 0.56 and 0.69). No ggml weight type holds 2, 3, 6 or 8-bit affine values, nor 4 or
//! 5-bit ones whose scales f16 cannot hold (f32 models): those are dequantized at load, to f16
//! where the scales are 16-bit (2 bytes a weight against MLX's 1.06 for 8 bits) and to f32 where
//! they are f32 (4 bytes). Other widths and modes are refused by name.
use crate::ModelError;
use axle_ggml::DType;
use half::f16;
use serde_json::Value;
use std::collections::BTreeMap;

/// Bits and group size of one module's weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Affine {
    pub bits: u32,
    pub group: usize,
}

/// The folder's quantization: a default, and per-module choices (`None`: left unquantized);
/// or OpenAI's MXFP4 experts (`quant_method: mxfp4`, gpt-oss's own: [`super::oss`] reads them).
#[derive(Debug, Default)]
pub(super) struct Quantization {
    default: Option<Affine>,
    modules: BTreeMap<String, Option<Affine>>,
    /// The experts' weights are MXFP4 blocks and scales.
    pub mxfp4: bool,
}

fn refuse(what: String) -> ModelError {
    ModelError::Unsupported(format!("config.json quantization: {what}"))
}

fn affine(v: &Value, at: &str) -> Result<Affine, ModelError> {
    let bits = v["bits"].as_u64().unwrap_or(0) as u32;
    let group = v["group_size"].as_u64().unwrap_or(0) as usize;
    if let Some(mode) = v.get("mode").and_then(Value::as_str) {
        if mode != "affine" {
            return Err(refuse(format!("{at}: mode {mode} (Axle reads affine)")));
        }
    }
    if !matches!(bits, 2..=6 | 8) {
        return Err(refuse(format!(
            "{at}: {bits}-bit weights (Axle reads 2, 3, 4, 5, 6 and 8)"
        )));
    }
    if !matches!(group, 32 | 64 | 128) {
        return Err(refuse(format!(
            "{at}: groups of {group} (Axle reads 32, 64, 128)"
        )));
    }
    Ok(Affine { bits, group })
}

impl Quantization {
    /// Reads `quantization` (or `quantization_config`) of a config.
    pub fn read(c: &Value) -> Result<Quantization, ModelError> {
        let Some(q) = c
            .get("quantization")
            .or_else(|| c.get("quantization_config"))
            .filter(|q| !q.is_null())
        else {
            return Ok(Quantization::default());
        };
        let Some(fields) = q.as_object() else {
            return Err(refuse(format!("{q}")));
        };
        match q.get("quant_method").and_then(Value::as_str) {
            Some("mxfp4") => {
                return Ok(Quantization {
                    mxfp4: true,
                    ..Default::default()
                })
            }
            Some(other) => {
                return Err(refuse(format!(
                "quant_method {other} (Axle reads MLX's affine quantization and gpt-oss's MXFP4)"
            )))
            }
            None => {}
        }
        let mut out = Quantization {
            default: Some(affine(q, "the default")?),
            modules: BTreeMap::new(),
            mxfp4: false,
        };
        for (k, v) in fields {
            match v {
                Value::Object(_) => {
                    out.modules.insert(k.clone(), Some(affine(v, k)?));
                }
                Value::Bool(false) => {
                    out.modules.insert(k.clone(), None);
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// How `module`'s weight is quantized (`None` where it is not).
    pub fn of(&self, module: &str) -> Option<Affine> {
        match self.modules.get(module) {
            Some(choice) => *choice,
            None => self.default,
        }
    }

    /// Whether the folder is quantized at all.
    pub fn any(&self) -> bool {
        self.default.is_some()
    }

    /// The same choices with each module named by `rename` (`None`: dropped).
    pub fn renamed(self, rename: impl Fn(&str) -> Option<String>) -> Quantization {
        Quantization {
            default: self.default,
            modules: self
                .modules
                .into_iter()
                .filter_map(|(k, v)| Some((rename(&k)?, v)))
                .collect(),
            mxfp4: self.mxfp4,
        }
    }
}

/// A quantized weight read as a ggml tensor: its type and bytes (rows of `cols` values). Blocks
/// stay within runs of `run` columns (columns that move together later); where 32-value
/// blocks cannot, the weight is dequantized.
#[allow(clippy::too_many_arguments)]
pub(super) fn convert(
    words: &[u8],
    scales: &[f32],
    biases: &[f32],
    scale_type: DType,
    rows: usize,
    cols: usize,
    run: usize,
    a: Affine,
) -> Result<(DType, Vec<u8>), String> {
    let bits = a.bits as usize;
    let groups = cols / a.group;
    if cols == 0 || !cols.is_multiple_of(a.group) || !cols.is_multiple_of(32) {
        return Err(format!(
            "{cols} columns do not split into groups of {}",
            a.group
        ));
    }
    if words.len() != rows * cols * bits / 8
        || scales.len() != rows * groups
        || biases.len() != rows * groups
    {
        return Err(format!(
            "{} bytes of weights and {} scales for {rows} x {cols} at {} bits",
            words.len(),
            scales.len(),
            a.bits
        ));
    }
    // Value (r, c) at bit (r * cols + c) * bits of the stream (rows are whole words long, as
    // columns come in multiples of 32); a value spans at most two bytes.
    let q = |r: usize, c: usize| -> u32 {
        let at = (r * cols + c) * bits;
        let lo = words[at / 8] as u32;
        let hi = words.get(at / 8 + 1).copied().unwrap_or(0) as u32;
        ((lo | (hi << 8)) >> (at % 8)) & ((1 << bits) - 1)
    };
    let f16_exact = |x: f32| f16::from_f32(x).to_f32() == x;
    let exact = scales.iter().chain(biases).all(|&x| f16_exact(x));
    if matches!(a.bits, 4 | 5) && exact && run.is_multiple_of(32) {
        // Q4_1 and Q5_1: per block of 32, d (f16) and m (f16); Q5_1 then a u32 whose bit j is
        // value j's fifth bit; then 16 bytes holding value j's low four bits in the low nibble of
        // byte j and value j + 16's in the high nibble.
        let (dtype, block) = if a.bits == 4 {
            (DType::Q4_1, 20)
        } else {
            (DType::Q5_1, 24)
        };
        let mut out = Vec::with_capacity(rows * cols / 32 * block);
        for r in 0..rows {
            for b in 0..cols / 32 {
                let g = r * groups + b * 32 / a.group;
                out.extend_from_slice(&f16::from_f32(scales[g]).to_le_bytes());
                out.extend_from_slice(&f16::from_f32(biases[g]).to_le_bytes());
                if a.bits == 5 {
                    let high = (0..32).fold(0u32, |h, j| h | ((q(r, b * 32 + j) >> 4) << j));
                    out.extend_from_slice(&high.to_le_bytes());
                }
                for j in 0..16 {
                    let lo = q(r, b * 32 + j) & 15;
                    let hi = q(r, b * 32 + j + 16) & 15;
                    out.push((lo | (hi << 4)) as u8);
                }
            }
        }
        return Ok((dtype, out));
    }
    let value = |r: usize, c: usize| {
        let g = r * groups + c / a.group;
        scales[g] * q(r, c) as f32 + biases[g]
    };
    if scale_type == DType::F32 {
        let mut out = Vec::with_capacity(rows * cols * 4);
        for r in 0..rows {
            for c in 0..cols {
                out.extend_from_slice(&value(r, c).to_le_bytes());
            }
        }
        Ok((DType::F32, out))
    } else {
        let mut out = Vec::with_capacity(rows * cols * 2);
        for r in 0..rows {
            for c in 0..cols {
                out.extend_from_slice(&f16::from_f32(value(r, c)).to_le_bytes());
            }
        }
        Ok((DType::F16, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MLX's packing: the values as one little-endian bit stream.
    fn pack(values: &[u32], bits: u32) -> Vec<u8> {
        let mut out = vec![0u8; values.len() * bits as usize / 8];
        for (i, &v) in values.iter().enumerate() {
            for k in 0..bits as usize {
                let at = i * bits as usize + k;
                out[at / 8] |= (((v >> k) & 1) as u8) << (at % 8);
            }
        }
        out
    }

    #[test]
    fn four_bit_groups_become_q4_1_blocks_with_the_same_values() {
        // One row of 64 values, one group: q = i % 16, scale 0.5, bias -1.
        let values: Vec<u32> = (0..64).map(|i| i % 16).collect();
        let a = Affine { bits: 4, group: 64 };
        let (t, bytes) = convert(
            &pack(&values, 4),
            &[0.5],
            &[-1.0],
            DType::BF16,
            1,
            64,
            64,
            a,
        )
        .unwrap();
        assert_eq!(t, DType::Q4_1);
        assert_eq!(bytes.len(), 2 * 20);
        // Columns that move in runs of 16 (narrower than a block) are dequantized instead.
        let (t16, _) = convert(
            &pack(&values, 4),
            &[0.5],
            &[-1.0],
            DType::BF16,
            1,
            64,
            16,
            a,
        )
        .unwrap();
        assert_eq!(t16, DType::F16);
        for (b, block) in bytes.chunks(20).enumerate() {
            let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
            let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
            for j in 0..32 {
                let nib = if j < 16 {
                    block[4 + j] & 15
                } else {
                    block[4 + j - 16] >> 4
                };
                let want = 0.5 * values[b * 32 + j] as f32 - 1.0;
                assert_eq!(d * nib as f32 + m, want, "block {b} value {j}");
            }
        }
    }

    #[test]
    fn eight_bits_and_inexact_scales_are_dequantized() {
        let values: Vec<u32> = (0..32).map(|i| i * 7).collect();
        let a = Affine { bits: 8, group: 32 };
        let (t, bytes) =
            convert(&pack(&values, 8), &[0.25], &[0.5], DType::F32, 1, 32, 32, a).unwrap();
        assert_eq!(t, DType::F32);
        assert_eq!(
            f32::from_le_bytes(bytes[12..16].try_into().unwrap()),
            0.25 * 21.0 + 0.5
        );
        let a4 = Affine { bits: 4, group: 32 };
        let v4: Vec<u32> = (0..32).map(|i| i % 16).collect();
        let (t, _) = convert(&pack(&v4, 4), &[0.1], &[0.0], DType::F32, 1, 32, 32, a4).unwrap();
        assert_eq!(t, DType::F32, "0.1 is no f16 value");
        assert!(convert(&pack(&v4, 4), &[0.1], &[0.0], DType::F32, 1, 64, 64, a4).is_err());
    }

    #[test]
    fn five_bit_groups_become_q5_1_blocks_with_the_same_values() {
        // One row of 64 values, groups of 32: q = (i * 11) % 32 reaches every fifth bit.
        let values: Vec<u32> = (0..64).map(|i| (i * 11) % 32).collect();
        let a = Affine { bits: 5, group: 32 };
        let (t, bytes) = convert(
            &pack(&values, 5),
            &[0.5, 2.0],
            &[-1.0, 0.25],
            DType::BF16,
            1,
            64,
            64,
            a,
        )
        .unwrap();
        assert_eq!(t, DType::Q5_1);
        assert_eq!(bytes.len(), 2 * 24);
        for (b, block) in bytes.chunks(24).enumerate() {
            let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
            let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
            let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
            // ggml's dequantize_row_q5_1.
            for j in 0..16 {
                let x0 = (block[8 + j] & 15) as u32 | (((qh >> j) << 4) & 0x10);
                let x1 = (block[8 + j] >> 4) as u32 | ((qh >> (j + 12)) & 0x10);
                for (k, x) in [(j, x0), (j + 16, x1)] {
                    let want = [0.5, 2.0][b] * values[b * 32 + k] as f32 + [-1.0, 0.25][b];
                    assert_eq!(d * x as f32 + m, want, "block {b} value {k}");
                }
            }
        }
    }

    #[test]
    fn widths_whose_values_cross_bytes_are_dequantized() {
        for bits in [2u32, 3, 5, 6] {
            // Two rows of 64 values, groups of 32: q cycles through every value the width has.
            let values: Vec<u32> = (0..128).map(|i| (i * 7 + 3) % (1 << bits)).collect();
            // 0.1 is no f16 value: 5 bits too are dequantized then.
            let (scales, biases) = ([0.5f32, 0.25, 2.0, 1.0], [-1.0f32, 0.0, 0.5, 0.1]);
            let a = Affine { bits, group: 32 };
            let (t, bytes) = convert(
                &pack(&values, bits),
                &scales,
                &biases,
                DType::BF16,
                2,
                64,
                64,
                a,
            )
            .unwrap();
            assert_eq!(t, DType::F16, "{bits} bits");
            for (i, &v) in values.iter().enumerate() {
                let got = f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32();
                let want = scales[i / 32] * v as f32 + biases[i / 32];
                assert_eq!(got, f16::from_f32(want).to_f32(), "{bits} bits, value {i}");
            }
        }
    }

    #[test]
    fn per_module_choices_and_refusals() {
        let c: Value = serde_json::json!({"quantization": {"group_size": 64, "bits": 4, "mode": "affine",
            "model.layers.0.mlp.down_proj": {"bits": 8, "group_size": 64}, "lm_head": false}});
        let q = Quantization::read(&c).unwrap();
        assert_eq!(
            q.of("model.layers.1.mlp.up_proj"),
            Some(Affine { bits: 4, group: 64 })
        );
        assert_eq!(
            q.of("model.layers.0.mlp.down_proj"),
            Some(Affine { bits: 8, group: 64 })
        );
        assert_eq!(q.of("lm_head"), None);
        for bad in [
            serde_json::json!({"quantization": {"group_size": 64, "bits": 7}}),
            serde_json::json!({"quantization": {"group_size": 64, "bits": 1}}),
            serde_json::json!({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}}),
            serde_json::json!({"quantization": {"group_size": 48, "bits": 4}}),
        ] {
            assert!(Quantization::read(&bad).is_err(), "{bad}");
        }
    }
}
