//! Long-lived tensors (model weights, KV cache) with their backend memory: a [`TensorStore`] owns
//! the metadata context, the buffers and, for weights used in place, the file mmap. Handles to its
//! tensors ([`StoredTensor`]) keep the store alive, so a graph can never see freed weights.
use crate::gguf::{GgufFile, TensorInfo};
use crate::huge_pages::HugeRegion;
use crate::{Backend, BufferType, Context, DType, Error, Result, Tensor};
use llama_cpp_sys_2 as sys;
use memmap2::Mmap;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Alignment of tensors in host buffers that ggml's CPU kernels read (ggml's own CPU buffers
/// align to 64 bytes, as does its GGUF loader's default).
const CPU_ALIGNMENT: usize = 64;

struct Buffer(sys::ggml_backend_buffer_t);
impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated by ggml, freed once, after no graph uses it (the store is dropped last).
        unsafe { sys::ggml_backend_buffer_free(self.0) }
    }
}

struct StoreInner {
    ctx: Context,
    /// The tensors split over several devices, when some are (see [`crate::meta`]).
    split_ctx: Option<Context>,
    _buffers: Vec<Buffer>,
    _mmap: Vec<Arc<Mmap>>,
    /// The in-place weights' copy in huge pages, when they were copied.
    _huge: Option<HugeRegion>,
    by_name: HashMap<String, *mut sys::ggml_tensor>,
    /// Names of the fused weights (see [`WeightFusion`]).
    fused: Vec<String>,
}

// SAFETY: after loading, the store's tensors are only read by graphs (weights) or written by graphs
// run on the engine thread (KV); the metadata itself is never mutated again.
unsafe impl Send for StoreInner {}
// SAFETY: as above: shared access is read-only metadata access.
unsafe impl Sync for StoreInner {}

/// A set of persistent tensors and their memory.
#[derive(Clone)]
pub struct TensorStore {
    inner: Arc<StoreInner>,
}

impl std::fmt::Debug for TensorStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorStore")
            .field("tensors", &self.inner.by_name.len())
            .field("buffers", &self.inner._buffers.len())
            .field("mapped", &!self.inner._mmap.is_empty())
            .finish()
    }
}

/// A handle to one tensor of a [`TensorStore`]; keeps the store alive.
#[derive(Clone)]
pub struct StoredTensor {
    store: Arc<StoreInner>,
    ptr: *mut sys::ggml_tensor,
}

// SAFETY: see StoreInner.
unsafe impl Send for StoredTensor {}
// SAFETY: see StoreInner.
unsafe impl Sync for StoredTensor {}

impl StoredTensor {
    /// The tensor, usable in graphs while this handle is borrowed.
    pub fn t(&self) -> Tensor<'_> {
        let _ = &self.store;
        Tensor::from_raw(self.ptr)
    }
}

impl std::fmt::Debug for StoredTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.t();
        write!(f, "{}:{:?}{:?}", t.name(), t.dtype(), t.ne())
    }
}

/// Where model weights go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightPlacement {
    /// Host memory: used in place from the mmap, except matmul weights that a CPU repacking buffer
    /// type takes (copied once into its faster layout, as llama.cpp does).
    Host {
        /// Whether to use the repacking buffer types.
        repack: bool,
        /// Whether the weights a step streams go to memory backed by transparent huge pages
        /// (see [`crate::huge_pages`]): the ones otherwise used in place are copied there once,
        /// and repacked ones are allocated there. Where the system offers no huge pages, or the
        /// copy would not fit in the memory available, the weights stay in place.
        huge_pages: bool,
    },
    /// Layers on devices (GPUs, RPC devices), each layer's weights copied to the memory of the
    /// device that runs it (`layers[il]`; None: host memory, used in place), and the output norm
    /// and head to `head`. The token embedding stays in host memory (a step reads a few of its
    /// rows, as llama.cpp keeps its input layer on the CPU). A model whose head is its token
    /// embedding (tied) gets a device copy of it as `output.weight`.
    Layers {
        /// Memory of each layer's weights (None: host memory).
        layers: Vec<Option<BufferType>>,
        /// Memory of the output norm and head (None: host memory).
        head: Option<BufferType>,
    },
}

/// Weights stored as one tensor: the rows of `parts`, one part after another, bound as `name`.
/// Each part stays bound under its own name, as a tensor of its own placed on its rows (not a
/// ggml view: a view is a graph node, which would sit between a gate product and an up product and
/// keep ggml's CUDA backend from fusing the two with their gated unit, as it does for libllama's
/// separate weights). One product with the fused weight does the work of one per part (one pass
/// of the kernel, one quantization of the activations, one launch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusedWeight {
    /// Name the fused tensor is bound as.
    pub name: String,
    /// Tensors whose rows it holds, in order.
    pub parts: Vec<String>,
}

/// Which weights [`TensorStore::load_weights`] stores fused, and where.
///
/// A group is fused where its parts are 2-D, of one type and width, and go to one buffer that is
/// not a repacking one (a repacked layout interleaves rows, so a part could not be placed on
/// its rows); otherwise its parts are loaded as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightFusion {
    /// The groups.
    pub groups: Vec<FusedWeight>,
    /// Also fuse groups whose parts stay in host memory (copied out of the mapping into a plain
    /// host buffer); by default only groups in an accelerator's memory are fused.
    pub on_host: bool,
}

/// The token embedding, kept in host memory by [`WeightPlacement::Device`].
const TOKEN_EMBD: &str = "token_embd.weight";
/// The output head a tied model lacks.
const OUTPUT: &str = "output.weight";

impl TensorStore {
    /// A tensor by name.
    pub fn get(&self, name: &str) -> Option<StoredTensor> {
        self.inner.by_name.get(name).map(|&ptr| StoredTensor {
            store: self.inner.clone(),
            ptr,
        })
    }

    /// Every tensor of the store, by name.
    pub fn tensors(&self) -> Vec<StoredTensor> {
        let mut named: Vec<(&String, &*mut sys::ggml_tensor)> = self.inner.by_name.iter().collect();
        named.sort_by(|a, b| a.0.cmp(b.0));
        named
            .into_iter()
            .map(|(_, &ptr)| StoredTensor {
                store: self.inner.clone(),
                ptr,
            })
            .collect()
    }

    /// A tensor by name, or a clear error.
    pub fn require(&self, name: &str) -> Result<StoredTensor> {
        self.get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))
    }

    /// Whether the weights used in place on the host were copied to huge pages (see
    /// [`WeightPlacement::Host`]).
    pub fn in_huge_pages(&self) -> bool {
        self.inner._huge.is_some()
    }

    /// Names of the weights stored fused (see [`WeightFusion`]), in load order.
    pub fn fused(&self) -> &[String] {
        &self.inner.fused
    }

    /// Names and buffer types of all tensors (for reports).
    pub fn placement_summary(&self) -> Vec<(String, String)> {
        let split = self.inner.split_ctx.iter().flat_map(Context::tensors);
        self.inner
            .ctx
            .tensors()
            .into_iter()
            .chain(split)
            .map(|t| {
                let buft = t.buffer_type().map_or_else(String::new, |b| b.name());
                (t.name(), buft)
            })
            .collect()
    }

    /// Loads all tensors of a GGUF file. `matmul_weight(name)` tells which tensors are only used as
    /// the weight of a mul_mat (candidates for repacking); `backend` answers support queries.
    ///
    /// `fusion` names weights to store as one tensor where they can be (see [`WeightFusion`]).
    ///
    /// `progress(done, total)` is called with the bytes copied so far as weights go to non-mmap
    /// memory (a device, or a repacked layout).
    pub fn load_weights(
        file: &GgufFile,
        placement: WeightPlacement,
        backend: &Backend,
        matmul_weight: impl Fn(&str) -> bool,
        fusion: &WeightFusion,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<TensorStore> {
        let infos = file.tensors();
        let ctx = Context::new(infos.len() + fusion.groups.len() + 1, 0)?;
        let mut by_name = HashMap::new();
        let mut groups: HashMap<Option<BufferType>, Vec<(Source, *mut sys::ggml_tensor)>> =
            HashMap::new();
        let extras = match &placement {
            WeightPlacement::Host { repack: true, .. } => backend.device().extra_buffer_types(),
            _ => Vec::new(),
        };
        // Tensors split over several devices get a context of their own: ggml's split buffers
        // take every tensor of the context they are allocated from.
        let split_ctx = Context::new(infos.len() + 1, 0)?;
        let ctx_for = |target: Option<BufferType>| match target {
            Some(b) if b.is_split() => &split_ctx,
            _ => &ctx,
        };
        let target_of = |info: &TensorInfo| match &placement {
            WeightPlacement::Layers { layers, head } => match info.layer() {
                Some(il) => layers.get(il as usize).copied().flatten(),
                None if info.name != TOKEN_EMBD => *head,
                None => None,
            },
            WeightPlacement::Host { .. } => {
                // 2-D product weights and 3-D expert weights (mul_mat_id); other 3-D weights
                // (MLA's per-head absorption matrices) feed plain batched products, which
                // repacked memory does not serve.
                let experts = info.shape.len() == 3 && info.name.contains("_exps.");
                let repackable = (info.shape.len() == 2 || experts) && matmul_weight(&info.name);
                extras.iter().copied().find(|&b| {
                    repackable && backend.supports_matmul_weight(b, info.dtype, &info.shape)
                })
            }
        };
        let host_placement = matches!(placement, WeightPlacement::Host { .. });
        let mut fused_parts = HashSet::new();
        let mut fused_names = Vec::new();
        // The parts of each fused weight (by the fused tensor): each with its offset in it.
        let mut parts_of: HashMap<usize, Vec<(*mut sys::ggml_tensor, usize)>> = HashMap::new();
        for group in &fusion.groups {
            let Some((buft, parts)) =
                fusable(infos, group, &target_of, host_placement, fusion.on_host)
            else {
                continue;
            };
            let first = &infos[parts[0]];
            let rows: i64 = parts.iter().map(|&i| infos[i].shape[1]).sum();
            let fused = ctx
                .tensor(first.dtype, &[first.shape[0], rows])
                .named(&group.name);
            let mut offset = 0;
            for &i in &parts {
                let part = ctx
                    .tensor(first.dtype, &infos[i].shape)
                    .named(&infos[i].name);
                parts_of
                    .entry(fused.raw() as usize)
                    .or_default()
                    .push((part.raw(), offset));
                offset += infos[i].nbytes as usize;
                by_name.insert(infos[i].name.clone(), part.raw());
                fused_parts.insert(i);
            }
            by_name.insert(group.name.clone(), fused.raw());
            fused_names.push(group.name.clone());
            groups
                .entry(Some(buft))
                .or_default()
                .push((Source::Fused(parts), fused.raw()));
        }
        for (i, info) in infos.iter().enumerate() {
            if fused_parts.contains(&i) {
                continue;
            }
            let target = target_of(info);
            let t = ctx_for(target)
                .tensor(info.dtype, &info.shape)
                .named(&info.name);
            if t.nbytes() as u64 != info.nbytes {
                return Err(Error::TensorShape {
                    name: info.name.clone(),
                    found: info.shape.clone(),
                    expected: vec![],
                });
            }
            by_name.insert(info.name.clone(), t.raw());
            groups
                .entry(target)
                .or_default()
                .push((Source::File(i), t.raw()));
        }
        // A tied head on the device: a device copy of the token embedding, bound as the head. On
        // the host with repacking, a repacked copy where the CPU has a layout for its type (as
        // libllama loads a tied head: the embedding itself only feeds get_rows).
        let head_copy = match &placement {
            WeightPlacement::Layers {
                head: Some(buft), ..
            } => Some(*buft),
            WeightPlacement::Host { repack: true, .. } => {
                infos.iter().find(|t| t.name == TOKEN_EMBD).and_then(|t| {
                    extras
                        .iter()
                        .copied()
                        .find(|&b| backend.supports_matmul_weight(b, t.dtype, &t.shape))
                })
            }
            _ => None,
        };
        if let Some(buft) = head_copy {
            if !by_name.contains_key(OUTPUT) {
                if let Some(i) = infos.iter().position(|t| t.name == TOKEN_EMBD) {
                    let t = ctx_for(Some(buft))
                        .tensor(infos[i].dtype, &infos[i].shape)
                        .named(OUTPUT);
                    by_name.insert(OUTPUT.to_string(), t.raw());
                    groups
                        .entry(Some(buft))
                        .or_default()
                        .push((Source::File(i), t.raw()));
                }
            }
        }
        // Huge pages for the host's weights: where the system offers them and a copy of the
        // weights used in place fits in the memory available with room to spare.
        let in_place: u64 = groups
            .get(&None)
            .map_or(0, |ts| ts.iter().map(|(src, _)| src.nbytes(infos)).sum());
        let huge = matches!(
            placement,
            WeightPlacement::Host {
                huge_pages: true,
                ..
            }
        ) && crate::huge_pages::huge_pages_offered()
            && crate::sysinfo::host_available_memory()
                .is_some_and(|avail| in_place < avail as u64 / 4 * 3);
        let total: u64 = groups
            .iter()
            .filter(|(target, _)| target.is_some() || huge)
            .flat_map(|(_, ts)| ts.iter().map(|(src, _)| src.nbytes(infos)))
            .sum();
        let mut done = 0u64;
        let mut buffers = Vec::new();
        let mut mmap = Vec::new();
        let mut huge_region = None;
        // Tensors split over several devices are allocated last, from their own context (a split
        // buffer takes every tensor of the context it is allocated from).
        let mut split = None;
        for (target, tensors) in groups {
            if let Some(buft) = target.filter(BufferType::is_split) {
                split = Some((buft, tensors));
                continue;
            }
            match target {
                None => {
                    // Host weights in their file layout: copied once to huge pages (see
                    // `huge`), or used in place from the file's mapping.
                    if huge {
                        let mut copy_progress = |n: u64| {
                            done += n;
                            progress(done, total);
                        };
                        let (buf, region) =
                            place_in_huge_pages(file, infos, &tensors, &mut copy_progress)?;
                        buffers.push(buf);
                        huge_region = Some(region);
                    } else {
                        let (bufs, maps) = place_in_mapping(file, infos, &tensors)?;
                        buffers.extend(bufs);
                        mmap = maps;
                    }
                }
                Some(buft) => {
                    let buf =
                        alloc_for(buft, &tensors.iter().map(|&(_, t)| t).collect::<Vec<_>>())?;
                    if huge && buft.is_cpu() {
                        // Repacked host weights: advised before the copies below touch them.
                        // SAFETY: a fresh buffer; base and size are its own.
                        let (base, size) = unsafe {
                            (
                                sys::ggml_backend_buffer_get_base(buf.0),
                                sys::ggml_backend_buffer_get_size(buf.0),
                            )
                        };
                        crate::huge_pages::advise_huge(base.cast(), size);
                    }
                    // SAFETY: buf is a fresh buffer.
                    unsafe {
                        sys::ggml_backend_buffer_set_usage(
                            buf.0,
                            sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
                        )
                    };
                    // Each part of a fused weight is bound to its rows before the weight's bytes
                    // are written (a backend may clear a tensor's padding when it is bound; the
                    // write then restores the next part's rows).
                    for &(_, t) in &tensors {
                        for &(part, offset) in parts_of.get(&(t as usize)).into_iter().flatten() {
                            // SAFETY: t was placed in buf above and the part's rows lie inside
                            // it at `offset` (the parts fill it one after another); the part is
                            // a fresh tensor of the context, not yet bound.
                            let st = unsafe {
                                sys::ggml_backend_tensor_alloc(
                                    buf.0,
                                    part,
                                    (*t).data.cast::<u8>().add(offset).cast(),
                                )
                            };
                            if st != sys::GGML_STATUS_SUCCESS {
                                return Err(Error::Alloc(
                                    "binding a part of a fused weight".into(),
                                ));
                            }
                        }
                    }
                    for (src, t) in tensors {
                        let mut offset = 0;
                        for &i in src.parts() {
                            let data = file.tensor_data(&infos[i]);
                            // SAFETY: t is allocated in buf; a file tensor's data has exactly its
                            // nbytes (checked above), a fused one's parts fill it one after another
                            // (its size is their sum); repacking buffer types convert the layout
                            // inside set_tensor and only ever get whole tensors (never fused ones).
                            unsafe {
                                sys::ggml_backend_tensor_set(
                                    t,
                                    data.as_ptr().cast(),
                                    offset,
                                    data.len(),
                                )
                            };
                            offset += data.len();
                            done += data.len() as u64;
                            progress(done, total);
                        }
                    }
                    buffers.push(buf);
                }
            }
        }
        if let Some((buft, tensors)) = split {
            let buf = alloc_context(&split_ctx, buft)?;
            // SAFETY: buf is a fresh buffer.
            unsafe {
                sys::ggml_backend_buffer_set_usage(buf.0, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
            };
            for (src, t) in tensors {
                let Source::File(i) = src else {
                    unreachable!("fused weights are never split");
                };
                let data = file.tensor_data(&infos[i]);
                // SAFETY: t is allocated in buf and data has exactly its nbytes (checked above);
                // the split buffer copies each device's slice of the whole tensor.
                unsafe { sys::ggml_backend_tensor_set(t, data.as_ptr().cast(), 0, data.len()) };
                done += data.len() as u64;
                progress(done, total);
            }
            buffers.push(buf);
        }
        let split_ctx = (!split_ctx.tensors().is_empty()).then_some(split_ctx);
        Ok(TensorStore {
            inner: Arc::new(StoreInner {
                ctx,
                split_ctx,
                _buffers: buffers,
                _mmap: mmap,
                _huge: huge_region,
                by_name,
                fused: fused_names,
            }),
        })
    }

    /// Zero-filled tensors of the given types and shapes in one buffer of `buft` (KV caches).
    pub fn zeroed(buft: BufferType, specs: &[(String, DType, Vec<i64>)]) -> Result<TensorStore> {
        let ctx = Context::new(specs.len() + 1, 0)?;
        let mut by_name = HashMap::new();
        let mut raws = Vec::new();
        for (name, dtype, shape) in specs {
            let t = ctx.tensor(*dtype, shape).named(name);
            by_name.insert(name.clone(), t.raw());
            raws.push(t.raw());
        }
        let buf = if buft.is_split() {
            alloc_context(&ctx, buft)?
        } else {
            alloc_for(buft, &raws)?
        };
        // SAFETY: fresh buffer.
        unsafe { sys::ggml_backend_buffer_clear(buf.0, 0) };
        Ok(TensorStore {
            inner: Arc::new(StoreInner {
                ctx,
                split_ctx: None,
                _buffers: vec![buf],
                _mmap: Vec::new(),
                _huge: None,
                by_name,
                fused: Vec::new(),
            }),
        })
    }
}

/// Places every tensor of `ctx` in one buffer of `buft` (the way split buffers must be filled:
/// ggml's split buffer takes all of a context's tensors, allocated or not).
fn alloc_context(ctx: &Context, buft: BufferType) -> Result<Buffer> {
    // SAFETY: live context and buffer type; the result is checked for null.
    let buf = unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.raw(), buft.0) };
    if buf.is_null() {
        return Err(Error::Alloc(format!("tensors of {}", buft.name())));
    }
    Ok(Buffer(buf))
}

/// Allocates one buffer of `buft` large enough for `tensors` and places each in it.
fn alloc_for(buft: BufferType, tensors: &[*mut sys::ggml_tensor]) -> Result<Buffer> {
    // SAFETY: size queries on live tensors; the buffer is checked for null; tallocr places tensors
    // at aligned offsets inside the buffer it was given.
    unsafe {
        let align = sys::ggml_backend_buft_get_alignment(buft.0);
        let mut size = 0usize;
        for &t in tensors {
            size += sys::ggml_backend_buft_get_alloc_size(buft.0, t).div_ceil(align) * align;
        }
        let buf = sys::ggml_backend_buft_alloc_buffer(buft.0, size.max(align));
        if buf.is_null() {
            return Err(Error::Alloc(format!(
                "{} bytes of {}",
                size,
                BufferType(buft.0).name()
            )));
        }
        let buf = Buffer(buf);
        let mut talloc = sys::ggml_tallocr_new(buf.0);
        for &t in tensors {
            if sys::ggml_tallocr_alloc(&mut talloc, t) != sys::GGML_STATUS_SUCCESS {
                return Err(Error::Alloc("tensor placement in buffer".into()));
            }
        }
        Ok(buf)
    }
}

/// Places `tensors` (file tensors or fused ones) in one host buffer over a copy of their bytes
/// in huge pages, at aligned offsets; `copied(n)` follows the bytes copied.
fn place_in_huge_pages(
    file: &GgufFile,
    infos: &[TensorInfo],
    tensors: &[(Source, *mut sys::ggml_tensor)],
    copied: &mut dyn FnMut(u64),
) -> Result<(Buffer, HugeRegion)> {
    let mut offsets = Vec::with_capacity(tensors.len());
    let mut size = 0usize;
    for (src, _) in tensors {
        offsets.push(size);
        size += (src.nbytes(infos) as usize).div_ceil(CPU_ALIGNMENT) * CPU_ALIGNMENT;
    }
    let region = HugeRegion::filled(size.max(CPU_ALIGNMENT), |bytes| {
        for ((src, _), &off) in tensors.iter().zip(&offsets) {
            let mut at = off;
            for &i in src.parts() {
                let data = file.tensor_data(&infos[i]);
                bytes[at..at + data.len()].copy_from_slice(data);
                at += data.len();
                copied(data.len() as u64);
            }
        }
    })?;
    let base = region.as_ptr() as *mut u8;
    // SAFETY: the region outlives the buffer (both owned by the store; the buffer is dropped
    // first) and holds `len` bytes. ggml never writes to weights.
    let buf = unsafe { sys::ggml_backend_cpu_buffer_from_ptr(base.cast(), region.len()) };
    if buf.is_null() {
        return Err(Error::Alloc("cpu buffer over huge pages".into()));
    }
    let buf = Buffer(buf);
    // SAFETY: a fresh buffer.
    unsafe { sys::ggml_backend_buffer_set_usage(buf.0, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS) };
    for ((_, t), &off) in tensors.iter().zip(&offsets) {
        // SAFETY: `off` + the tensor's bytes <= `size` = the region's length, so the address
        // lies inside buf, aligned to CPU_ALIGNMENT.
        let st = unsafe { sys::ggml_backend_tensor_alloc(buf.0, *t, base.add(off).cast()) };
        if st != sys::GGML_STATUS_SUCCESS {
            return Err(Error::Alloc("placing weights in huge pages".into()));
        }
    }
    Ok((buf, region))
}

/// Places file tensors in host buffers over the files' whole mappings (one per part of a split
/// model), each at its own bytes.
fn place_in_mapping(
    file: &GgufFile,
    infos: &[TensorInfo],
    tensors: &[(Source, *mut sys::ggml_tensor)],
) -> Result<(Vec<Buffer>, Vec<Arc<Mmap>>)> {
    let mut buffers = Vec::new();
    let mut maps = Vec::new();
    for part in 0..file.part_count() {
        let in_part: Vec<(usize, *mut sys::ggml_tensor)> = tensors
            .iter()
            .map(|(src, t)| match src {
                Source::File(i) => (*i, *t),
                Source::Fused(_) => unreachable!("fused weights always get a buffer of their own"),
            })
            .filter(|(i, _)| infos[*i].part == part)
            .collect();
        if in_part.is_empty() {
            continue;
        }
        let m = file.mmap(part).clone();
        // SAFETY: the mapping outlives the buffer (both owned by the store; the buffer is
        // dropped first). ggml never writes to weight tensors.
        let buf = unsafe { sys::ggml_backend_cpu_buffer_from_ptr(m.as_ptr() as *mut _, m.len()) };
        if buf.is_null() {
            return Err(Error::Alloc("cpu buffer over mmap".into()));
        }
        let buf = Buffer(buf);
        // SAFETY: buf is a fresh buffer.
        unsafe {
            sys::ggml_backend_buffer_set_usage(buf.0, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        };
        for (i, t) in in_part {
            let off = infos[i].file_offset as usize;
            // SAFETY: off + nbytes <= the part's size was checked when the part was opened, so
            // the address lies inside buf.
            let st =
                unsafe { sys::ggml_backend_tensor_alloc(buf.0, t, m.as_ptr().add(off) as *mut _) };
            if st != sys::GGML_STATUS_SUCCESS {
                return Err(Error::Alloc(format!("placing {} in mmap", infos[i].name)));
            }
        }
        buffers.push(buf);
        maps.push(m);
    }
    Ok((buffers, maps))
}

/// Where a loaded tensor's bytes come from.
enum Source {
    /// One tensor of the file (its index).
    File(usize),
    /// The parts of a fused weight, in order.
    Fused(Vec<usize>),
}

impl Source {
    /// The file tensors whose bytes fill it, in order.
    fn parts(&self) -> &[usize] {
        match self {
            Source::File(i) => std::slice::from_ref(i),
            Source::Fused(parts) => parts,
        }
    }

    fn nbytes(&self, infos: &[TensorInfo]) -> u64 {
        self.parts().iter().map(|&i| infos[i].nbytes).sum()
    }
}

/// The buffer and the file tensors of a fusion group, where it can be fused: every part present,
/// 2-D, of one type and width, all bound for one buffer that is an accelerator's (or, with
/// `on_host`, host memory used in place, which gets a plain host buffer instead). Not for
/// repacking or split buffers: a part must lie on its rows.
fn fusable(
    infos: &[TensorInfo],
    group: &FusedWeight,
    target_of: &dyn Fn(&TensorInfo) -> Option<BufferType>,
    host_placement: bool,
    on_host: bool,
) -> Option<(BufferType, Vec<usize>)> {
    let parts = group
        .parts
        .iter()
        .map(|name| infos.iter().position(|t| &t.name == name))
        .collect::<Option<Vec<usize>>>()?;
    let first = &infos[*parts.first()?];
    let alike = parts.iter().all(|&i| {
        let t = &infos[i];
        t.shape.len() == 2 && t.dtype == first.dtype && t.shape[0] == first.shape[0]
    });
    let target = target_of(first);
    if !alike || parts.iter().any(|&i| target_of(&infos[i]) != target) {
        return None;
    }
    let buft = match target {
        // In place in the mapping.
        None if on_host => BufferType::cpu(),
        None => return None,
        // Host placement's buffers are repacking ones.
        Some(_) if host_placement => return None,
        Some(b) if b.is_split() => return None,
        Some(b) => b,
    };
    Some((buft, parts))
}
