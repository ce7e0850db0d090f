//! Long-lived tensors (model weights, KV cache) with their backend memory: a [`TensorStore`] owns
//! the metadata context, the buffers and, for weights used in place, the file mmap. Handles to its
//! tensors ([`StoredTensor`]) keep the store alive, so a graph can never see freed weights.
use crate::gguf::GgufFile;
use crate::{Backend, BufferType, Context, DType, Error, Result, Tensor};
use llama_cpp_sys_2 as sys;
use memmap2::Mmap;
use std::collections::HashMap;
use std::sync::Arc;

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
    _mmap: Option<Arc<Mmap>>,
    by_name: HashMap<String, *mut sys::ggml_tensor>,
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
            .field("mapped", &self.inner._mmap.is_some())
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

    /// A tensor by name, or a clear error.
    pub fn require(&self, name: &str) -> Result<StoredTensor> {
        self.get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))
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
                // SAFETY: tensors of a live store; buffer is set for all of them after loading.
                let buft = unsafe {
                    let b = (*t.raw()).buffer;
                    if b.is_null() {
                        String::new()
                    } else {
                        BufferType(sys::ggml_backend_buffer_get_type(b)).name()
                    }
                };
                (t.name(), buft)
            })
            .collect()
    }

    /// Loads all tensors of a GGUF file. `matmul_weight(name)` tells which tensors are only used as
    /// the weight of a mul_mat (candidates for repacking); `backend` answers support queries.
    ///
    /// `progress(done, total)` is called with the bytes copied so far as weights go to non-mmap
    /// memory (a device, or a repacked layout).
    pub fn load_weights(
        file: &GgufFile,
        placement: WeightPlacement,
        backend: &Backend,
        matmul_weight: impl Fn(&str) -> bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<TensorStore> {
        let infos = file.tensors();
        let ctx = Context::new(infos.len() + 1, 0)?;
        let mut by_name = HashMap::new();
        let mut groups: HashMap<Option<BufferType>, Vec<(usize, *mut sys::ggml_tensor)>> =
            HashMap::new();
        let extras = match &placement {
            WeightPlacement::Host { repack: true } => backend.device().extra_buffer_types(),
            _ => Vec::new(),
        };
        // Tensors split over several devices get a context of their own: ggml's split buffers
        // take every tensor of the context they are allocated from.
        let split_ctx = Context::new(infos.len() + 1, 0)?;
        let ctx_for = |target: Option<BufferType>| match target {
            Some(b) if b.is_split() => &split_ctx,
            _ => &ctx,
        };
        for (i, info) in infos.iter().enumerate() {
            let target = match &placement {
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
                    let repackable =
                        (info.shape.len() == 2 || experts) && matmul_weight(&info.name);
                    extras.iter().copied().find(|&b| {
                        repackable && backend.supports_matmul_weight(b, info.dtype, &info.shape)
                    })
                }
            };
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
            groups.entry(target).or_default().push((i, t.raw()));
        }
        // A tied head on the device: a device copy of the token embedding, bound as the head. On
        // the host with repacking, a repacked copy where the CPU has a layout for its type (as
        // libllama loads a tied head: the embedding itself only feeds get_rows).
        let head_copy = match &placement {
            WeightPlacement::Layers {
                head: Some(buft), ..
            } => Some(*buft),
            WeightPlacement::Host { repack: true } => {
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
                    groups.entry(Some(buft)).or_default().push((i, t.raw()));
                }
            }
        }
        let total: u64 = groups
            .iter()
            .filter(|(target, _)| target.is_some())
            .flat_map(|(_, ts)| ts.iter().map(|&(i, _)| infos[i].nbytes))
            .sum();
        let mut done = 0u64;
        let mut buffers = Vec::new();
        let mut mmap = None;
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
                    // In place: one host buffer over the whole mapping; tensors point into it.
                    let m = file.mmap().clone();
                    // SAFETY: the mapping outlives the buffer (both owned by the store; the buffer is
                    // dropped first). ggml never writes to weight tensors.
                    let buf = unsafe {
                        sys::ggml_backend_cpu_buffer_from_ptr(m.as_ptr() as *mut _, m.len())
                    };
                    if buf.is_null() {
                        return Err(Error::Alloc("cpu buffer over mmap".into()));
                    }
                    // SAFETY: buf is a fresh buffer.
                    unsafe {
                        sys::ggml_backend_buffer_set_usage(
                            buf,
                            sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
                        )
                    };
                    buffers.push(Buffer(buf));
                    for (i, t) in tensors {
                        let off = infos[i].file_offset as usize;
                        // SAFETY: off + nbytes <= file size was checked when the file was opened, so
                        // the address lies inside buf.
                        let st = unsafe {
                            sys::ggml_backend_tensor_alloc(buf, t, m.as_ptr().add(off) as *mut _)
                        };
                        if st != sys::GGML_STATUS_SUCCESS {
                            return Err(Error::Alloc(format!("placing {} in mmap", infos[i].name)));
                        }
                    }
                    mmap = Some(m);
                }
                Some(buft) => {
                    let buf =
                        alloc_for(buft, &tensors.iter().map(|&(_, t)| t).collect::<Vec<_>>())?;
                    // SAFETY: buf is a fresh buffer.
                    unsafe {
                        sys::ggml_backend_buffer_set_usage(
                            buf.0,
                            sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
                        )
                    };
                    for (i, t) in tensors {
                        let data = file.tensor_data(&infos[i]);
                        // SAFETY: t is allocated in buf and data has exactly its nbytes (checked above);
                        // repacking buffer types convert the layout inside set_tensor.
                        unsafe {
                            sys::ggml_backend_tensor_set(t, data.as_ptr().cast(), 0, data.len())
                        };
                        done += data.len() as u64;
                        progress(done, total);
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
            for (i, t) in tensors {
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
                by_name,
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
                _mmap: None,
                by_name,
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
