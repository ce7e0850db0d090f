//! Tensor parallelism: several devices as one ggml device (ggml's "meta" device), each holding a
//! slice of every split tensor. ggml infers how every intermediate tensor is split, runs each
//! device's share of a graph and sums the partial results of row-parallel products across the
//! devices (an all-reduce: NCCL or CUDA's own where built, else copies and adds).
//!
//! Which tensors are split, and how, comes from a [`SplitTable`] keyed by tensor name, filled
//! before the tensors are allocated. ggml asks for a tensor's split whenever it places the tensor
//! and again later, for as long as the program runs, so the table lives as long as the device
//! (both are leaked: ggml caches meta devices for the life of the process).
//!
//! Constraints of ggml's meta device that callers must respect: the split tensors must be
//! allocated from a context (`TensorStore` does), the graph of one step at a time may hold views of
//! them (one scheduler slot), and an op that works per row (norms, argmax) must not see a tensor
//! split along its rows.
use crate::{Device, Error, Result};
use llama_cpp_sys_2 as sys;
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::RwLock;

/// How one tensor is spread over the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorSplit {
    /// A whole copy on every device.
    Mirrored,
    /// Cut along dimension `axis` (ggml's order: 0 is the contiguous one) into one slice per
    /// device, of `sizes[i]` elements on device `i` (they add up to the dimension).
    Axis {
        /// The dimension.
        axis: u32,
        /// Elements on each device.
        sizes: Vec<i64>,
    },
}

/// The split of every named tensor; tensors it does not name are mirrored.
#[derive(Debug, Default)]
pub struct SplitTable {
    splits: RwLock<HashMap<String, TensorSplit>>,
}

impl SplitTable {
    /// Sets how the tensor called `name` is split (before it is allocated).
    pub fn set(&self, name: &str, split: TensorSplit) {
        if let Ok(mut m) = self.splits.write() {
            m.insert(name.to_string(), split);
        }
    }

    /// The split of `name` (mirrored when it was not set).
    pub fn get(&self, name: &str) -> TensorSplit {
        self.splits
            .read()
            .ok()
            .and_then(|m| m.get(name).cloned())
            .unwrap_or(TensorSplit::Mirrored)
    }
}

/// A device made of several devices, with the table that says how its tensors are split.
#[derive(Debug, Clone, Copy)]
pub struct TensorParallel {
    /// The combined device: its buffer type holds split tensors, its backend runs a graph on
    /// every device.
    pub device: Device,
    /// The split table ggml consults.
    pub table: &'static SplitTable,
    n_devices: usize,
}

/// ggml's most devices in one meta device (`GGML_BACKEND_META_MAX_DEVICES`, a macro bindgen
/// does not carry).
pub const MAX_DEVICES: usize = 16;

impl TensorParallel {
    /// Joins `devices` (at least two, at most ggml's 16) into one device with an empty split
    /// table: fill it before allocating tensors on the device.
    pub fn new(devices: &[Device]) -> Result<TensorParallel> {
        if devices.len() < 2 || devices.len() > MAX_DEVICES {
            return Err(Error::NoDevice(format!(
                "tensor split needs 2 to {} devices, not {}",
                MAX_DEVICES,
                devices.len()
            )));
        }
        // Leaked on purpose: ggml keeps the device, and asks the table, for the rest of the
        // process.
        let table: &'static SplitTable = Box::leak(Box::default());
        let mut raws: Vec<sys::ggml_backend_dev_t> = devices.iter().map(|d| d.0).collect();
        // SAFETY: raws holds registered devices; the callback and its userdata (a leaked table)
        // live for the rest of the process, as ggml's cached meta device does.
        let dev = unsafe {
            sys::ggml_backend_meta_device(
                raws.as_mut_ptr(),
                raws.len(),
                Some(split_state),
                table as *const SplitTable as *mut std::ffi::c_void,
            )
        };
        if dev.is_null() {
            return Err(Error::NoDevice(
                "ggml could not join the devices into one".into(),
            ));
        }
        Ok(TensorParallel {
            device: Device(dev),
            table,
            n_devices: devices.len(),
        })
    }

    /// How many devices it joins.
    pub fn n_devices(&self) -> usize {
        self.n_devices
    }
}

impl PartialEq for TensorParallel {
    fn eq(&self, other: &TensorParallel) -> bool {
        self.device == other.device
    }
}

impl Eq for TensorParallel {}

/// ggml's question: how is this tensor split? Answered from the table by the tensor's name.
/// Must not unwind: it only reads the table and fills a plain struct.
unsafe extern "C" fn split_state(
    tensor: *const sys::ggml_tensor,
    ud: *mut std::ffi::c_void,
) -> sys::ggml_backend_meta_split_state {
    // SAFETY: a zeroed split state is a valid value of this plain C struct.
    let mut st: sys::ggml_backend_meta_split_state = unsafe { std::mem::zeroed() };
    st.axis = sys::GGML_BACKEND_SPLIT_AXIS_MIRRORED;
    st.nr[0] = 1;
    st.n_segments = 1;
    if tensor.is_null() || ud.is_null() {
        return st;
    }
    // SAFETY: ud is the leaked table given at creation; ggml passes live tensors whose name is a
    // NUL-terminated array inside the tensor.
    let (table, name) = unsafe {
        (
            &*(ud as *const SplitTable),
            CStr::from_ptr((*tensor).name.as_ptr()),
        )
    };
    let Ok(name) = name.to_str() else {
        return st;
    };
    if let TensorSplit::Axis { axis, sizes } = table.get(name) {
        if sizes.len() <= st.ne.len() {
            st.axis = axis as sys::ggml_backend_meta_split_axis;
            for (slot, &n) in st.ne.iter_mut().zip(&sizes) {
                *slot = n;
            }
        }
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unnamed_tensors_are_mirrored() {
        let t = SplitTable::default();
        t.set(
            "blk.0.attn_q.weight",
            TensorSplit::Axis {
                axis: 1,
                sizes: vec![64, 64],
            },
        );
        assert_eq!(t.get("blk.0.ffn_norm.weight"), TensorSplit::Mirrored);
        assert!(matches!(
            t.get("blk.0.attn_q.weight"),
            TensorSplit::Axis { axis: 1, .. }
        ));
    }
}
