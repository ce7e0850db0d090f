//! How many KV slots fit: each memory's share of a slot, the budget a device leaves free, and the
//! check before a pool is allocated.
use super::*;

/// Each memory that holds some layer's KV, with its free bytes and the bytes one KV slot takes
/// there (every layer has every slot): a device's share is its layers' K and V rows (stored as
/// `ty`), the host's the rows of the layers left on the CPU. Memories whose free size is unknown
/// are left out.
pub(super) fn kv_memories(
    model: &Model,
    bufts: &[BufferType],
    dims: &[(i64, i64)],
    ty: KvType,
) -> Vec<KvMemory> {
    let mut per_slot: Vec<(BufferType, usize)> = Vec::new();
    for (&(k, v), &b) in dims.iter().zip(bufts) {
        let row = ty.row_bytes(k) + ty.row_bytes(v);
        match per_slot.iter_mut().find(|(x, _)| *x == b) {
            Some((_, n)) => *n += row,
            None => per_slot.push((b, row)),
        }
    }
    per_slot
        .into_iter()
        .filter_map(|(buft, slot_bytes)| {
            let (free, name) = if buft == BufferType::cpu() {
                (axle_ggml::host_available_memory()?, "the host".to_string())
            } else {
                let d = model
                    .placement()
                    .accelerators()
                    .into_iter()
                    .find(|d| d.buffer_type() == buft)?;
                let (free, total) = d.memory();
                if total == 0 {
                    return None;
                }
                (free, d.name())
            };
            Some(KvMemory {
                name,
                free,
                slot_bytes,
            })
        })
        .collect()
}

/// One memory's share of the KV pool (see [`kv_memories`]).
#[derive(Debug)]
pub(super) struct KvMemory {
    pub(super) name: String,
    pub(super) free: usize,
    pub(super) slot_bytes: usize,
}

/// Memory a device keeps free beside the KV pool for the step's compute buffers: a tenth of
/// what is free, and at least 1 GiB.
pub(super) fn kv_budget(free: usize) -> usize {
    let reserve = (free / 10).max(1 << 30);
    free.saturating_sub(reserve)
}

/// The K and V widths of each layer that keeps KV in the pool, and the memory that holds it:
/// the trunk's layers, then, with `mtp_head`, the layers of the model's next-token-prediction head
/// where it has one (its cache layers sit where its blocks' layers are placed, and take the same
/// slots as the trunk's).
pub fn kv_layers(model: &Model, mtp_head: bool) -> (Vec<(i64, i64)>, Vec<BufferType>) {
    let (mut dims, mut bufts) = cache_layers(model.family(), model);
    if let Some(head) = model.family().mtp().filter(|_| mtp_head) {
        let (d, b) = cache_layers(head, model);
        dims.extend(d);
        bufts.extend(b);
    }
    (dims, bufts)
}

/// The K and V widths of `family`'s cache layers (a trunk's, or an MTP head's) and the memory
/// each is placed in: where the model layer it stands for runs.
pub(super) fn cache_layers(
    family: &dyn crate::arch::Family,
    model: &Model,
) -> (Vec<(i64, i64)>, Vec<BufferType>) {
    let dims = family.kv_dims();
    let first = family.first_layer() as u32;
    let bufts = (0..dims.len() as u32)
        .map(|il| model.placement().layer_buffer(first + il))
        .collect();
    (dims, bufts)
}

/// The most KV slots (a multiple of `block_size`) that the memories holding `model`'s KV can
/// take, leaving room for compute buffers; None when no memory tells its free size. The
/// engine caps its default pool with it, so that a model spread over devices of different
/// sizes gets the pool the tightest one allows instead of an allocation failure. With
/// `mtp_head` the head's cache layers count too (see [`kv_layers`]): an engine whose head drafts
/// holds a second cache of the same slots for them.
pub fn kv_slots_that_fit(
    model: &Model,
    block_size: u32,
    ty: KvType,
    mtp_head: bool,
) -> Option<u32> {
    let (dims, bufts) = kv_layers(model, mtp_head);
    let bs = block_size.max(1) as usize;
    kv_memories(model, &bufts, &dims, ty)
        .iter()
        .map(|m| kv_budget(m.free) / m.slot_bytes.max(1) / bs * bs)
        .min()
        .map(|n| n.min(u32::MAX as usize) as u32)
}

/// Refuses a KV pool larger than the memory that would hold it, before allocating it: each
/// device's share against the device's free memory, and the host's share against the memory the
/// system has available. Without this a large `--kv-slots` or context ran into the allocator (or
/// the OOM killer) instead of an error.
pub(super) fn check_kv_fits(
    model: &Model,
    bufts: &[BufferType],
    dims: &[(i64, i64)],
    slots: u32,
    ty: KvType,
) -> Result<(), ModelError> {
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    for m in kv_memories(model, bufts, dims, ty) {
        let need = m.slot_bytes * slots as usize;
        if need > m.free {
            return Err(ModelError::Invalid(format!(
                "the KV pool needs {:.0} MiB on {} ({slots} slots), but only {:.0} MiB are \
                 free there (at most {} slots fit); ask for fewer KV slots or a shorter context",
                mib(need),
                m.name,
                mib(m.free),
                m.free / m.slot_bytes.max(1)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod kv_budget_tests {
    use super::kv_budget;

    #[test]
    fn the_budget_leaves_a_tenth_and_at_least_a_gibibyte() {
        let gib = 1usize << 30;
        assert_eq!(kv_budget(80 * gib), 72 * gib);
        assert_eq!(kv_budget(4 * gib), 3 * gib);
        assert_eq!(kv_budget(gib / 2), 0);
    }
}
