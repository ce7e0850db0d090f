//! gpt-oss folders as OpenAI's checkpoints hold them: each layer's experts in MXFP4
//! (`mlp.experts.{gate_up,down}_proj_blocks`: per 32 weights 16 bytes of two 4-bit values each,
//! the first in the low nibble; `*_scales`: one E8M0 exponent per 32), with biases; gate and up
//! rows interleaved in `gate_up_proj` (gate rows even, up rows odd). They are read as llama.cpp's
//! converter writes them: ggml's MXFP4 blocks (the exponent, then 16 bytes holding value `j` in
//! the low nibble and value `j + 16` in the high one: the same numbers), gate and up split into
//! `ffn_gate_exps` and `ffn_up_exps`, the biases likewise and in f32.
use super::{floats, View};
use axle_ggml::DType;
use std::collections::BTreeMap;

/// gpt-oss's own layer names, before the shared ones.
pub(super) const LAYER: &[(&str, &str)] = &[
    (
        "post_attention_layernorm.weight",
        "post_attention_norm.weight",
    ),
    ("self_attn.sinks", "attn_sinks.weight"),
    ("self_attn.o_proj.bias", "attn_output.bias"),
    ("mlp.router.weight", "ffn_gate_inp.weight"),
    ("mlp.router.bias", "ffn_gate_inp.bias"),
];

/// A tensor made at load: GGUF name, type, GGUF shape, bytes.
pub(super) type Made = (String, DType, Vec<i64>, Vec<u8>);

/// The GGUF tensors a folder tensor of the experts becomes: `None` for tensors read the shared
/// way, an empty list for the scales (read with their blocks).
pub(super) fn tensors<'a>(
    hf: &str,
    views: &BTreeMap<String, View>,
    data: &dyn Fn(&View) -> &'a [u8],
) -> Result<Option<Vec<Made>>, String> {
    let Some((layer, field)) = hf
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once(".mlp.experts."))
    else {
        return Ok(None);
    };
    let view = &views[hf];
    let blk = |t: &str| format!("blk.{layer}.ffn_{t}_exps");
    match field {
        "gate_up_proj_scales" | "down_proj_scales" => Ok(Some(Vec::new())),
        "gate_up_proj_blocks" | "down_proj_blocks" => {
            let scales = views
                .get(&hf.replace("_blocks", "_scales"))
                .ok_or_else(|| format!("{hf} has no scales"))?;
            let (e, r, nb) = match view.shape[..] {
                [e, r, nb, 16] if scales.shape == [e, r, nb] => (e, r, nb),
                _ => {
                    return Err(format!(
                        "{hf} is {:?} with scales {:?}, not [experts, rows, blocks, 16] and \
                         [experts, rows, blocks]",
                        view.shape, scales.shape
                    ))
                }
            };
            let (blocks, scales) = (data(view), data(scales));
            let shape = |rows: usize| vec![(nb * 32) as i64, rows as i64, e as i64];
            let pack = |rows: &dyn Fn(usize) -> usize, n: usize| {
                let mut out = Vec::with_capacity(e * n * nb * 17);
                for x in 0..e {
                    for i in 0..n {
                        let row = x * r + rows(i);
                        for b in 0..nb {
                            out.push(scales[row * nb + b]);
                            out.extend(repack(&blocks[(row * nb + b) * 16..][..16]));
                        }
                    }
                }
                out
            };
            if field == "down_proj_blocks" {
                return Ok(Some(vec![(
                    format!("{}.weight", blk("down")),
                    DType::MXFP4,
                    shape(r),
                    pack(&|i| i, r),
                )]));
            }
            if r % 2 != 0 {
                return Err(format!("{hf} has {r} rows, not gate and up rows in pairs"));
            }
            Ok(Some(vec![
                (
                    format!("{}.weight", blk("gate")),
                    DType::MXFP4,
                    shape(r / 2),
                    pack(&|i| 2 * i, r / 2),
                ),
                (
                    format!("{}.weight", blk("up")),
                    DType::MXFP4,
                    shape(r / 2),
                    pack(&|i| 2 * i + 1, r / 2),
                ),
            ]))
        }
        "gate_up_proj_bias" | "down_proj_bias" => {
            let (Some(t), &[e, r]) = (view.dtype, &view.shape[..]) else {
                return Err(format!("{hf} is {:?} {:?}", view.dtype, view.shape));
            };
            let x = floats(data(view), t);
            let rows = |pick: &dyn Fn(usize) -> usize, n: usize| -> Vec<u8> {
                (0..e)
                    .flat_map(|x_| (0..n).map(move |i| (x_, i)))
                    .flat_map(|(x_, i)| x[x_ * r + pick(i)].to_le_bytes())
                    .collect()
            };
            if field == "down_proj_bias" {
                let shape = vec![r as i64, e as i64];
                return Ok(Some(vec![(
                    format!("{}.bias", blk("down")),
                    DType::F32,
                    shape,
                    rows(&|i| i, r),
                )]));
            }
            if r % 2 != 0 {
                return Err(format!("{hf} has {r} values, not gate and up in pairs"));
            }
            let shape = vec![(r / 2) as i64, e as i64];
            Ok(Some(vec![
                (
                    format!("{}.bias", blk("gate")),
                    DType::F32,
                    shape.clone(),
                    rows(&|i| 2 * i, r / 2),
                ),
                (
                    format!("{}.bias", blk("up")),
                    DType::F32,
                    shape,
                    rows(&|i| 2 * i + 1, r / 2),
                ),
            ]))
        }
        "gate_up_proj" | "down_proj" => Err(format!(
            "{hf}: gpt-oss experts without quantization (a dequantized checkpoint); Axle reads \
             OpenAI's MXFP4 ones (`*_blocks`, `*_scales`)"
        )),
        _ => Ok(None),
    }
}

/// 16 bytes of an OpenAI MXFP4 block (value `2k` in byte `k`'s low nibble, `2k + 1` in its high
/// one) as ggml holds them (value `j` in byte `j`'s low nibble, `j + 16` in its high one).
fn repack(block: &[u8]) -> [u8; 16] {
    let v = |i: usize| (block[i / 2] >> (4 * (i % 2))) & 0x0f;
    std::array::from_fn(|j| v(j) | (v(j + 16) << 4))
}

#[cfg(test)]
mod tests {
    use super::repack;

    #[test]
    fn blocks_repack_as_llama_cpps_converter_does() {
        // Values 0..32 (mod 16) in OpenAI's order: byte k = v[2k] | v[2k + 1] << 4.
        let v: Vec<u8> = (0..32).map(|i| (i * 7 % 16) as u8).collect();
        let theirs: Vec<u8> = (0..16).map(|k| v[2 * k] | (v[2 * k + 1] << 4)).collect();
        let ours = repack(&theirs);
        for j in 0..16 {
            assert_eq!(ours[j] & 0x0f, v[j], "low nibble of byte {j}");
            assert_eq!(ours[j] >> 4, v[j + 16], "high nibble of byte {j}");
        }
    }
}
