//! Products of a few columns with the numbers of ggml's tiled MMQ kernel, on CUDA devices.
//!
//! Axle's wide products multiply small columns through MMQ with all of an op's columns in one
//! column tile, where a column gets the same bits in any op of 9 to 128 columns: MMQ splits each
//! output tile's K range across thread blocks (stream-k) by the weight's rows and the device's
//! SM count alone. Below 9 columns ggml takes its mat-vec kernel, whose sums run in another
//! order, so such ops used to be padded with zero columns to 9, and one sequence ran at about half
//! the mat-vec kernel's speed.
//!
//! `scripts/build-backend.sh` builds ggml's CUDA backend with a kernel of Axle's
//! (`crates/axle-kernels/cuda/wide-replay-mmq.cu`) that computes MMQ's numbers for 1 to 8 columns: the same
//! stretches of K per output tile, each summed block by block with MMQ's multiply and fused
//! multiply-add, and the stretches added in the order of MMQ's fix-up kernel. It reads the
//! weights once. It runs only for products carrying [`HINT`] (ggml's mul_mat hint,
//! `op_params[1]`); the backend answers [`crate::Device::wide_replay_products`] per weight type
//! (Q4_0 on NVIDIA GPUs from Ampere to Hopper, where MMQ's configuration is the one analysed).
//! A one-column product takes a kernel that gives a thread block a few rows over the whole K
//! range; 2 to 8 columns take MMQ's own grid. A hinted product followed by an add is fused with it
//! in the backend (the add made where the product is written). `axle bench device-check` with
//! wide products compares greedy tokens and every token's log-probability bits (one sequence
//! against a batch, speculation on against off) where it runs;
//! `tests/python/test_wide_replay_order.py` checks the order in which both kernels add a tile's
//! stretches against ggml's.

/// The mul_mat hint that asks for Axle's replay of MMQ (`"AXL2"`); ggml's own hints are small
/// numbers, and backends ignore hints they do not know.
pub const HINT: i32 = 0x4158_4c32;

/// Rows of a weight the replay takes are a multiple of this many weights: MMQ's K iteration
/// (its stretches are whole ones).
pub const ROW_MULTIPLE: i64 = 256;

/// Most weights per row the replay takes.
pub const ROW_MAX: i64 = 131_072;

/// Most rows of a weight the replay takes: its per-device counters cover 65536 quarters of
/// 128-row tiles.
pub const ROWS_MAX: i64 = 65_536 / 4 * 128;
