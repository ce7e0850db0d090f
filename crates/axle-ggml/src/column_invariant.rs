//! Column-invariant quantized products on CUDA devices.
//!
//! ggml's CUDA mat-vec kernel (MMVQ) gives a column other bits at 5-8 columns than at 1-4 (fewer
//! warps share a row), and from 9 columns ggml takes its tiled kernel (MMQ), whose split of the K
//! range depends on the op's grid. So a batch's decode columns, multiplied together, would not get
//! the numbers each gets alone, and Axle's device layout multiplies them in groups of 4: one pass
//! over the weights per group, which at 16 and 64 sequences costs more than the batch saves.
//!
//! `scripts/build-backend.sh` builds ggml's CUDA backend with a kernel of Axle's
//! (`crates/axle-kernels/cuda/column-invariant-mmvq.cu`) that gives every column of a product of any width the
//! arithmetic of ggml's one-column MMVQ kernel (the same assignment of weight blocks to threads,
//! the same vec-dot functions, the same order of partial sums) and reads the weights once per 8
//! columns. For Q4_0 rows of whole 2048-weight slabs on Ampere or newer, a variant takes the
//! integer sums from tensor cores (exact in any order) and replays the float steps in the
//! one-column order, 16 columns a pass. It runs only for products carrying [`HINT`] (ggml's mul_mat hint, `op_params[1]`), so
//! libllama and llama.cpp's tools built from that source are unchanged. The backend answers
//! [`crate::Device::column_invariant_products`] for each weight type (yes only on NVIDIA GPUs
//! whose one-column kernel uses ggml's generic parameter table); `axle bench device-check`
//! checks the bits (batched against alone, speculation on against off) where it runs.

/// The mul_mat hint that asks Axle's CUDA kernel for a product (`"AXL1"`); ggml's own hints are
/// small numbers, and backends ignore hints they do not know.
pub const HINT: i32 = 0x4158_4c31;
