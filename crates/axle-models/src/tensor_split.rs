//! Tensor split (`--split-mode tensor`): which of a model's tensors are cut between the devices of
//! a tensor-parallel device ([`axle_ggml::meta`]), and where.
//!
//! The attention of each layer is split by whole groups of query heads (the heads that share one
//! KV head), so that a device holds the query, key and value projections, the KV cache rows and
//! the output-projection columns of its heads; the feed-forward block is split by columns of its
//! hidden size. The projections into a block are column-parallel (each device computes its own
//! heads or hidden columns) and the projections out of it row-parallel (each device computes a
//! partial sum that ggml adds up across the devices). Everything else (norms, the token
//! embedding, the output head) is mirrored: the output head on every device, so that the logits
//! and the greedy picks read from them are whole on each.
//!
//! Only dense attention families are split this way (the llama, qwen2 and qwen3 graphs); others
//! get a clear error and run with a layer split.
use crate::ModelError;
use axle_ggml::meta::{TensorParallel, TensorSplit};
use axle_ggml::GgufFile;

/// The GGUF architectures whose tensors this module knows how to split.
pub const SUPPORTED: [&str; 3] = ["llama", "qwen2", "qwen3"];

/// Feed-forward columns per unit of a split where the size allows (ggml's CUDA kernels work on
/// tiles of 128 rows).
const FFN_UNIT: i64 = 128;

/// Fills `tp`'s split table for the tensors of `file`, and for the KV cache tensors
/// (`cache_k_l{il}`, `cache_v_l{il}`) the runner creates, each device taking its `shares` of
/// every split tensor; errors where the model cannot be split that way.
pub fn plan(file: &GgufFile, tp: &TensorParallel, shares: &[f64]) -> Result<(), ModelError> {
    let arch = file.str("general.architecture")?;
    if !SUPPORTED.contains(&arch) {
        return Err(ModelError::Invalid(format!(
            "--split-mode tensor supports the {} families, not `{arch}`: use --split-mode layer",
            SUPPORTED.join(", ")
        )));
    }
    // The shared keys, read and checked as the family will (positive head counts that group).
    let hp = crate::arch::Hparams::from_gguf(file, arch, 0)?;
    let (n_head_kv, hd_k, hd_v) = (hp.n_head_kv, hp.head_dim_k, hp.head_dim_v);
    let n_gqa = hp.n_head / n_head_kv;
    let n_dev = tp.n_devices();
    let groups = split_units(n_head_kv, 1, shares).ok_or_else(|| {
        ModelError::Invalid(format!(
            "--split-mode tensor gives each device whole KV heads: {n_head_kv} KV heads do not \
             go over {n_dev} devices in shares {shares:?}"
        ))
    })?;
    let per = |unit: i64| groups.iter().map(|g| g * unit).collect::<Vec<_>>();
    let axis = |axis: u32, sizes: Vec<i64>| TensorSplit::Axis { axis, sizes };
    let table = tp.table;
    for il in 0..file.layers_in_tensors() {
        let t = |n: &str| format!("blk.{il}.{n}");
        for (name, unit) in [("attn_q", n_gqa * hd_k), ("attn_k", hd_k), ("attn_v", hd_v)] {
            table.set(&t(&format!("{name}.weight")), axis(1, per(unit)));
            table.set(&t(&format!("{name}.bias")), axis(0, per(unit)));
        }
        let out = per(n_gqa * hd_v);
        check_blocks(file, &t("attn_output.weight"), &out)?;
        table.set(&t("attn_output.weight"), axis(0, out));
        table.set(&format!("cache_k_l{il}"), axis(0, per(hd_k)));
        table.set(&format!("cache_v_l{il}"), axis(0, per(hd_v)));
        let Some(down) = file
            .tensors()
            .iter()
            .find(|i| i.name == t("ffn_down.weight"))
        else {
            continue;
        };
        let n_ff = down.shape[0];
        let block = down.dtype.block_size();
        // Units of 128 columns where there are enough of them, else of one quantization block.
        let cols = [lcm(FFN_UNIT, block), block]
            .into_iter()
            .filter(|u| n_ff % u == 0)
            .find_map(|u| split_units(n_ff / u, u, shares))
            .ok_or_else(|| {
                ModelError::Invalid(format!(
                    "--split-mode tensor: the feed-forward size {n_ff} of layer {il} does not \
                     split over {n_dev} devices in whole blocks of {block}"
                ))
            })?;
        table.set(&t("ffn_gate.weight"), axis(1, cols.clone()));
        table.set(&t("ffn_up.weight"), axis(1, cols.clone()));
        table.set(&t("ffn_down.weight"), axis(0, cols));
    }
    Ok(())
}

/// `n_units` units of `unit` elements each, shared in proportion to `shares` (whole units, adding
/// up); None when some device would get none.
fn split_units(n_units: i64, unit: i64, shares: &[f64]) -> Option<Vec<i64>> {
    let counts = crate::placement::split_layers(u32::try_from(n_units).ok()?, shares)?;
    (!counts.contains(&0)).then(|| counts.iter().map(|&c| c as i64 * unit).collect())
}

/// A row-parallel weight's slices must hold whole quantization blocks.
fn check_blocks(file: &GgufFile, name: &str, sizes: &[i64]) -> Result<(), ModelError> {
    let Some(info) = file.tensors().iter().find(|i| i.name == name) else {
        return Ok(());
    };
    let b = info.dtype.block_size();
    if sizes.iter().any(|s| s % b != 0) {
        return Err(ModelError::Invalid(format!(
            "--split-mode tensor: {name} ({}) would split into {sizes:?} columns, not whole \
             blocks of {b}",
            info.dtype
        )));
    }
    Ok(())
}

fn lcm(a: i64, b: i64) -> i64 {
    let gcd = |mut x: i64, mut y: i64| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::{lcm, split_units};

    #[test]
    fn units_split_whole_in_proportion_and_add_up() {
        assert_eq!(split_units(8, 128, &[1.0, 1.0]), Some(vec![512, 512]));
        assert_eq!(split_units(8, 1, &[3.0, 1.0]), Some(vec![6, 2]));
        assert_eq!(
            split_units(3, 64, &[1.0, 1.0]).map(|v| v.iter().sum::<i64>()),
            Some(192)
        );
        assert_eq!(split_units(1, 64, &[1.0, 1.0]), None);
    }

    #[test]
    fn units_are_common_multiples() {
        assert_eq!(lcm(128, 256), 256);
        assert_eq!(lcm(128, 32), 128);
        assert_eq!(lcm(128, 1), 128);
    }
}
