//! Quantizing f32 rows into a ggml block type with ggml's own quantizers, without an importance
//! matrix: the bytes llama.cpp's quantize tool writes for the same values and type.
use crate::{DType, Error, Result};
use llama_cpp_sys_2 as sys;

/// `values` (rows of `n_per_row`) quantized to `dtype`, the rows split over `threads` threads
/// (each row is quantized on its own, so the bytes do not depend on the split).
pub fn quantize_rows(
    dtype: DType,
    values: &[f32],
    n_per_row: usize,
    threads: usize,
) -> Result<Vec<u8>> {
    let bad = |what: String| Error::Quantize(format!("quantizing to {}: {what}", dtype.name()));
    if !dtype.is_quantized() {
        return Err(bad("not a quantized type".into()));
    }
    // SAFETY: pure function of a valid type id.
    if unsafe { sys::ggml_quantize_requires_imatrix(dtype.0) } {
        return Err(bad("needs an importance matrix".into()));
    }
    let block = dtype.block_size() as usize;
    if n_per_row == 0 || !n_per_row.is_multiple_of(block) || !values.len().is_multiple_of(n_per_row)
    {
        return Err(bad(format!(
            "{} values in rows of {n_per_row} (blocks of {block})",
            values.len()
        )));
    }
    let rows = values.len() / n_per_row;
    let row_bytes = dtype.row_size(n_per_row as i64);
    let mut out = vec![0u8; rows * row_bytes];
    // SAFETY: builds ggml's lookup tables for the type once; safe to call from any thread.
    unsafe { sys::ggml_quantize_init(dtype.0) };
    let per_thread = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (src, dst) in values
            .chunks(per_thread * n_per_row)
            .zip(out.chunks_mut(per_thread * row_bytes))
        {
            s.spawn(move || {
                let n = src.len() / n_per_row;
                // SAFETY: `src` holds `n` rows of `n_per_row` f32 values and `dst` exactly `n`
                // rows of the type's row size; no importance matrix (the type needs none). ggml
                // writes its blocks' f16 fields through `dst`: the buffer comes from malloc (16-byte
                // aligned on the platforms Axle builds for) and every row size of these types is
                // even, so each chunk starts 2-byte aligned.
                unsafe {
                    sys::ggml_quantize_chunk(
                        dtype.0,
                        src.as_ptr(),
                        dst.as_mut_ptr().cast(),
                        0,
                        n as i64,
                        n_per_row as i64,
                        std::ptr::null(),
                    )
                };
            });
        }
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_quantize_alike_on_any_number_of_threads_and_round_trip_closely() {
        let values: Vec<f32> = (0..8 * 512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let one = quantize_rows(DType::Q8_0, &values, 512, 1).unwrap();
        assert_eq!(one, quantize_rows(DType::Q8_0, &values, 512, 3).unwrap());
        assert_eq!(one.len(), 8 * DType::Q8_0.row_size(512));
        // Q8_0: each block of 32 is an f16 scale and 32 int8 values.
        let d = half::f16::from_le_bytes([one[0], one[1]]).to_f32();
        for (j, &v) in values[..32].iter().enumerate() {
            assert!((one[2 + j] as i8 as f32 * d - v).abs() <= d / 2.0 + 1e-6);
        }
        assert!(quantize_rows(DType::Q4_K, &values, 512, 2).is_ok());
        assert!(quantize_rows(DType::Q4_K, &values[..100], 100, 1).is_err());
        assert!(quantize_rows(DType::F16, &values, 512, 1).is_err());
    }
}
