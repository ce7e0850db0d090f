//! Axle's own kernels: where exactness or speed needs arithmetic that ggml does not have.
//!
//! The CUDA sources live in `cuda/` and are compiled into ggml's CUDA backend by
//! `scripts/build-backend.sh` (through `cuda/apply.py`); each has a standalone test or a check
//! against ggml on the GPU machine. This crate holds the plain references of those kernels: safe
//! Rust over slices, the arithmetic the CUDA kernels are checked against and the body that runs
//! the same ops on the CPU. It knows nothing of ggml, models or scheduling.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod paged_attention;
