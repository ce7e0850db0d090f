//! Backends (CPU with a persistent thread pool, or any ggml device: CUDA, Metal, ...), buffer
//! types, and the scheduler that allocates a graph's intermediates and runs it across backends.
//! Nothing here names a specific accelerator: a build with the matching `llama-cpp-sys-2` feature
//! (cuda, metal, vulkan) registers its device and Axle picks it up through [`Device::all`].
use crate::{DType, Error, Graph, Result, Tensor};
use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, CStr, CString};

pub(crate) fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns static or device-owned NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// What kind of device a backend runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// A discrete GPU.
    Gpu,
    /// An integrated GPU.
    IntegratedGpu,
    /// An accelerator (BLAS, AMX, ...) that only takes some ops.
    Accelerator,
    /// Several devices joined into one, tensors split between them ([`crate::meta`]).
    Split,
    /// Anything else ggml may add.
    Other,
}

/// A ggml backend device (owned by ggml's registry for the whole program).
#[derive(Clone, Copy)]
pub struct Device(pub(crate) sys::ggml_backend_dev_t);

// SAFETY: devices are immutable registry entries that live for the whole program.
unsafe impl Send for Device {}
// SAFETY: as above; all accessors are read-only.
unsafe impl Sync for Device {}

/// Whether `file_name` names a loadable ggml device backend (`libggml-cuda.so`,
/// `libggml-vulkan.so`, `ggml-cuda.dll`, ...), not ggml's core libraries or a CPU variant (the
/// CPU backend is linked in).
fn is_device_backend_file(file_name: &str) -> bool {
    let stem = file_name.strip_prefix("lib").unwrap_or(file_name);
    let Some(rest) = stem.strip_prefix("ggml-") else {
        return false;
    };
    let name = rest.split('.').next().unwrap_or("");
    let shared = [".so", ".dylib", ".dll"]
        .iter()
        .any(|ext| file_name.ends_with(ext) || file_name.contains(&format!("{ext}.")));
    shared && !name.is_empty() && name != "base" && !name.starts_with("cpu")
}

/// Folders searched for loadable backends: `$AXLE_BACKENDS_DIR` (a `:`-separated list) if set,
/// else the executable's folder and its `backends/` subfolder.
pub fn backend_search_dirs() -> Vec<std::path::PathBuf> {
    if let Some(v) = crate::env::var_os("AXLE_BACKENDS_DIR") {
        return std::env::split_paths(&v).collect();
    }
    let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()))
    else {
        return Vec::new();
    };
    vec![exe_dir.join("backends"), exe_dir]
}

/// A backend library file and what loading it gave: the backend's name, or why ggml refused it.
pub type LoadedBackend = (std::path::PathBuf, std::result::Result<String, String>);

/// Loads the device backends built as shared libraries (`libggml-cuda.so` from
/// `scripts/build-backend.sh cuda`, or Vulkan, ROCm, ...) from [`backend_search_dirs`], once per
/// process, and returns what was loaded (file, and the error for files ggml refused). The CPU
/// backend is linked in and always registered; without such files the program stays CPU-only.
pub fn load_dynamic_backends() -> &'static [LoadedBackend] {
    static LOADED: std::sync::OnceLock<Vec<LoadedBackend>> = std::sync::OnceLock::new();
    LOADED.get_or_init(|| {
        crate::quiet_logs();
        let mut out = Vec::new();
        for dir in backend_search_dirs() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut files: Vec<_> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(is_device_backend_file)
                })
                .collect();
            files.sort();
            for path in files {
                let Ok(c) = CString::new(path.as_os_str().to_string_lossy().as_bytes()) else {
                    continue;
                };
                // SAFETY: a valid C path; ggml dlopens it, checks its backend API version and
                // registers it, or returns NULL (wrong version, missing symbols or libraries).
                let reg = unsafe { sys::ggml_backend_load(c.as_ptr()) };
                let result = if reg.is_null() {
                    Err("ggml could not load it (missing CUDA libraries, or built from another ggml)".to_string())
                } else {
                    // SAFETY: a registered backend's name is a static string.
                    Ok(cstr(unsafe { sys::ggml_backend_reg_name(reg) }))
                };
                out.push((path, result));
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::is_device_backend_file;

    #[test]
    fn device_backend_files() {
        for yes in [
            "libggml-cuda.so",
            "libggml-vulkan.so",
            "ggml-cuda.dll",
            "libggml-metal.dylib",
            "libggml-cuda.so.0",
        ] {
            assert!(is_device_backend_file(yes), "{yes}");
        }
        for no in [
            "libggml-base.so",
            "libggml-cpu-haswell.so",
            "libggml.so",
            "libllama.so",
            "libggml-cuda.a",
            "ggml-cuda.txt",
        ] {
            assert!(!is_device_backend_file(no), "{no}");
        }
    }
}

/// Turns off ggml's programmatic dependent launch (PDL) on CUDA for the rest of the process, by
/// setting `GGML_CUDA_PDL=0`, unless the environment already sets `GGML_CUDA_PDL` (the user's
/// choice wins). With PDL (Hopper and newer, ggml's default) a kernel may start before the one
/// ahead of it has finished; ggml reads the variable when each kernel is first launched, so this
/// only takes full effect before any step has run. Returns whether PDL is now off.
///
/// Why: on an H200, two model families computed with a race under PDL (different bits from run
/// to run and between libllama and Axle), and refusing PDL to one kernel, the flash-attention
/// vector kernel, was enough to make them exact (`scripts/gpu-pdl-bisect.sh`, docs/gpu.md).
/// Off for every kernel it costs decode speed: 11% on a Llama-3-8B-shaped file, 23% on SmolLM2.
pub fn serialize_cuda_launches() -> bool {
    match crate::env::var("GGML_CUDA_PDL") {
        Some(v) => v.trim() == "0",
        None => {
            // Process-wide; called while a model loads, before its steps run.
            std::env::set_var("GGML_CUDA_PDL", "0");
            true
        }
    }
}

impl Device {
    /// The registered device called `name` (ggml's name, any case: `cuda0`, `CUDA0`, `cpu`).
    pub fn find(name: &str) -> Option<Device> {
        Device::all()
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
    }

    /// The first registered GPU (discrete before integrated), if any.
    pub fn first_gpu() -> Option<Device> {
        let all = Device::all();
        all.iter()
            .find(|d| d.kind() == DeviceKind::Gpu)
            .or_else(|| all.iter().find(|d| d.kind() == DeviceKind::IntegratedGpu))
            .copied()
    }

    /// All registered devices.
    pub fn all() -> Vec<Device> {
        crate::quiet_logs();
        // SAFETY: registry queries with indices below the count.
        let n = unsafe { sys::ggml_backend_dev_count() };
        (0..n)
            .map(|i| Device(unsafe { sys::ggml_backend_dev_get(i) }))
            .collect()
    }

    /// The CPU device.
    pub fn cpu() -> Result<Device> {
        // SAFETY: registry query.
        let d = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
        if d.is_null() {
            return Err(Error::NoDevice("no CPU device registered".into()));
        }
        Ok(Device(d))
    }

    /// The device's short name ("CPU", "CUDA0").
    pub fn name(&self) -> String {
        // SAFETY: valid device.
        cstr(unsafe { sys::ggml_backend_dev_name(self.0) })
    }

    /// A human description (CPU model, GPU name).
    pub fn description(&self) -> String {
        // SAFETY: valid device.
        cstr(unsafe { sys::ggml_backend_dev_description(self.0) })
    }

    /// The device kind.
    pub fn kind(&self) -> DeviceKind {
        // SAFETY: valid device.
        match unsafe { sys::ggml_backend_dev_type(self.0) } {
            sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            sys::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
            sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
            sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accelerator,
            sys::GGML_BACKEND_DEVICE_TYPE_META => DeviceKind::Split,
            _ => DeviceKind::Other,
        }
    }

    /// (free, total) memory in bytes.
    pub fn memory(&self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid device, valid out pointers.
        unsafe { sys::ggml_backend_dev_memory(self.0, &mut free, &mut total) };
        (free, total)
    }

    /// The device's default buffer type.
    pub fn buffer_type(&self) -> BufferType {
        // SAFETY: valid device.
        BufferType(unsafe { sys::ggml_backend_dev_buffer_type(self.0) })
    }

    /// Whether this device's backend multiplies `dtype` weights through Axle's column-invariant
    /// kernel when a product asks for it ([`Context::mul_mat_column_invariant`]): a CUDA backend
    /// built by `scripts/build-backend.sh` exports the query, other backends do not.
    /// Devices without a registry (ggml's combined tensor-split device) answer no.
    pub fn column_invariant_products(&self, dtype: DType) -> bool {
        self.axle_kernel_takes(c"axle_column_invariant_mmvq", dtype)
    }

    /// Whether this device's backend gives products of 1 to 8 columns of `dtype` weights the
    /// numbers of its tiled MMQ kernel when a product asks for it
    /// ([`Context::mul_mat_wide_replay`], see [`crate::wide_replay`]): a CUDA backend built by
    /// `scripts/build-backend.sh` exports the query, other backends do not.
    pub fn wide_replay_products(&self, dtype: DType) -> bool {
        self.axle_kernel_takes(c"axle_wide_replay_mmq", dtype)
    }

    /// Whether this device's backend runs Axle's paged attention
    /// ([`Context::paged_attention`](crate::Context)) for heads of `head_dim` with `group` query
    /// heads per KV head: a CUDA backend built by `scripts/build-backend.sh` exports the query,
    /// other backends do not (the CPU runs the op's reference body).
    pub fn paged_attention(&self, head_dim: usize, group: usize) -> bool {
        let Some(f) = self.axle_query(c"axle_paged_attention") else {
            return false;
        };
        // SAFETY: paged-attention.cu exports this name as `extern "C" bool f(int, int)`, a query
        // without side effects.
        let f: unsafe extern "C" fn(c_int, c_int) -> bool = unsafe { std::mem::transmute(f) };
        // SAFETY: as above; any arguments are valid.
        unsafe { f(head_dim as c_int, group as c_int) }
    }

    /// Asks the backend's registry for the query `name` that Axle's CUDA kernels export
    /// (`extern "C" bool f(ggml_type)`) and calls it; no where the registry lacks it.
    fn axle_kernel_takes(&self, name: &std::ffi::CStr, dtype: DType) -> bool {
        let Some(f) = self.axle_query(name) else {
            return false;
        };
        // SAFETY: Axle's CUDA kernels (crates/axle-kernels/cuda/*.cu) export these names as
        // `extern "C" bool f(ggml_type)`, queries without side effects.
        let f: unsafe extern "C" fn(sys::ggml_type) -> bool = unsafe { std::mem::transmute(f) };
        // SAFETY: as above; any type id is a valid argument.
        unsafe { f(dtype.0) }
    }

    /// The function the backend's registry exports as `name` (Axle's kernels' capability
    /// queries), or `None` where the device has no registry or the registry no such name.
    fn axle_query(&self, name: &std::ffi::CStr) -> Option<*mut std::ffi::c_void> {
        // SAFETY: valid device; a device may have no registry (ggml's meta device), which
        // get_proc_address would assert on.
        let reg = unsafe { sys::ggml_backend_dev_backend_reg(self.0) };
        if reg.is_null() {
            return None;
        }
        // SAFETY: valid registry; it returns NULL for a name it does not provide.
        let f = unsafe { sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr()) };
        (!f.is_null()).then_some(f)
    }

    /// The CPU's extra buffer types (the repacking ones that make Q4_0/Q4_K/IQ4_NL matmuls fast).
    pub fn extra_buffer_types(&self) -> Vec<BufferType> {
        let name = c"ggml_backend_dev_get_extra_bufts";
        // SAFETY: valid device; the registry returns NULL when the function is not provided.
        let f = unsafe {
            let reg = sys::ggml_backend_dev_backend_reg(self.0);
            sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr())
        };
        if f.is_null() {
            return Vec::new();
        }
        // SAFETY: the registry documents this symbol with the ggml_backend_dev_get_extra_bufts_t signature.
        let f: sys::ggml_backend_dev_get_extra_bufts_t = unsafe { std::mem::transmute(f) };
        let mut out = Vec::new();
        if let Some(f) = f {
            // SAFETY: returns a NULL-terminated array owned by the backend.
            let mut p = unsafe { f(self.0) };
            // SAFETY: walk until the NULL terminator.
            while !p.is_null() && unsafe { !(*p).is_null() } {
                out.push(BufferType(unsafe { *p }));
                p = unsafe { p.add(1) };
            }
        }
        out
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        self.0 == other.0
    }
}

impl Eq for Device {}

/// A ggml buffer type (where tensor memory lives, and in which layout).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferType(pub(crate) sys::ggml_backend_buffer_type_t);

// SAFETY: buffer types are static descriptors owned by their backend registry.
unsafe impl Send for BufferType {}
// SAFETY: as above.
unsafe impl Sync for BufferType {}

impl BufferType {
    /// The plain host (CPU) buffer type.
    pub fn cpu() -> BufferType {
        // SAFETY: static descriptor.
        BufferType(unsafe { sys::ggml_backend_cpu_buffer_type() })
    }

    /// The buffer type's name ("CPU", "CPU_REPACK", "CUDA0").
    pub fn name(&self) -> String {
        // SAFETY: valid buffer type.
        cstr(unsafe { sys::ggml_backend_buft_name(self.0) })
    }

    /// Whether it holds tensors split over several devices ([`crate::meta`]): such tensors must
    /// be allocated from their context (see `TensorStore`).
    pub fn is_split(&self) -> bool {
        // SAFETY: valid buffer type; the device may be NULL (host buffer types of some backends).
        let dev = unsafe { sys::ggml_backend_buft_get_device(self.0) };
        !dev.is_null() && Device(dev).kind() == DeviceKind::Split
    }

    /// Whether it is memory of the CPU device (plain or repacked host memory).
    pub fn is_cpu(&self) -> bool {
        // SAFETY: valid buffer type; the device may be NULL.
        let dev = unsafe { sys::ggml_backend_buft_get_device(self.0) };
        !dev.is_null() && Device(dev).kind() == DeviceKind::Cpu
    }
}

impl std::fmt::Debug for BufferType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// A persistent ggml thread pool, freed when dropped. Its owner (a CPU backend, the oracle's
/// context) holds it in a field, so the pool is freed after the owner's own drop has freed what
/// uses it.
#[derive(Debug)]
pub(crate) struct ThreadPool(*mut sys::ggml_threadpool);

impl ThreadPool {
    /// A pool of `n_threads` threads, or None where ggml could not start one.
    pub(crate) fn new(n_threads: i32) -> Option<ThreadPool> {
        // SAFETY: plain init calls; the result is checked for null.
        let raw = unsafe {
            let mut params = sys::ggml_threadpool_params_default(n_threads);
            sys::ggml_threadpool_new(&mut params)
        };
        (!raw.is_null()).then_some(ThreadPool(raw))
    }

    /// The pool, for ggml and libllama calls.
    pub(crate) fn raw(&self) -> *mut sys::ggml_threadpool {
        self.0
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_threadpool_new (not null) and is freed once.
        unsafe { sys::ggml_threadpool_free(self.0) }
    }
}

/// A backend instance: a device ready to run graphs.
#[derive(Debug)]
pub struct Backend {
    raw: sys::ggml_backend_t,
    /// The CPU backend's threads; dropped after the backend that uses them.
    threadpool: Option<ThreadPool>,
    device: Device,
}

// SAFETY: a backend is used by one thread at a time (the engine thread); ggml backends have no
// thread affinity. Backend is not Sync.
unsafe impl Send for Backend {}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: raw came from a backend init and is freed once; the thread pool, a field, is
        // freed after this.
        unsafe { sys::ggml_backend_free(self.raw) }
    }
}

impl Backend {
    /// The CPU backend with a persistent pool of `n_threads` threads (reused across graphs).
    pub fn cpu(n_threads: usize) -> Result<Backend> {
        crate::quiet_logs();
        let n_threads = n_threads.max(1) as i32;
        // SAFETY: plain init calls; results checked for null.
        unsafe {
            let raw = sys::ggml_backend_cpu_init();
            if raw.is_null() {
                return Err(Error::NoDevice("ggml_backend_cpu_init failed".into()));
            }
            sys::ggml_backend_cpu_set_n_threads(raw, n_threads);
            let threadpool = ThreadPool::new(n_threads);
            if let Some(tp) = &threadpool {
                sys::ggml_backend_cpu_set_threadpool(raw, tp.raw());
            }
            Ok(Backend {
                raw,
                threadpool,
                device: Device(sys::ggml_backend_get_device(raw)),
            })
        }
    }

    /// A backend on any device.
    pub fn on(device: Device) -> Result<Backend> {
        // SAFETY: valid device; NULL params means defaults.
        let raw = unsafe { sys::ggml_backend_dev_init(device.0, std::ptr::null()) };
        if raw.is_null() {
            return Err(Error::NoDevice(format!(
                "cannot initialise {}",
                device.name()
            )));
        }
        Ok(Backend {
            raw,
            threadpool: None,
            device,
        })
    }

    /// Puts the CPU backend's threads to sleep until its next graph (which wakes them): after
    /// a graph, ggml's workers poll for new work for a while, taking cores that another runner
    /// (a draft model's) needs. No-op for other backends.
    pub fn pause_threads(&self) {
        if let Some(tp) = &self.threadpool {
            // SAFETY: a live pool (owned by this backend); ggml takes the pool's mutex, and a
            // paused pool resumes itself at its next graph.
            unsafe { sys::ggml_threadpool_pause(tp.raw()) }
        }
    }

    /// The backend's device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The backend's name.
    pub fn name(&self) -> String {
        // SAFETY: valid backend.
        cstr(unsafe { sys::ggml_backend_name(self.raw) })
    }

    /// Whether `buft`'s memory can feed a mul_mat of a weight shaped like `weight` on this
    /// device, or a mul_mat_id of a 3-D (expert) weight (how the CPU decides which weights a
    /// repacking buffer type can take).
    pub fn supports_matmul_weight(
        &self,
        buft: BufferType,
        weight: crate::DType,
        shape: &[i64],
    ) -> bool {
        let Ok(ctx) = crate::Context::new(4, 0) else {
            return false;
        };
        let w = ctx.tensor(weight, shape);
        let op = match *shape {
            // Expert weights [k, m, n_expert]: the indirect product, two experts per column.
            [k, _, _] => {
                let x = ctx.tensor(crate::DType::F32, &[k, 1, 512]);
                let ids = ctx.tensor(crate::DType::I32, &[2, 512]);
                ctx.mul_mat_id(w, x, ids)
            }
            _ => ctx.mul_mat(w, ctx.tensor(crate::DType::F32, &[shape[0], 512])),
        };
        // SAFETY: a zero-size buffer of `buft` is a dummy that only carries the type; it is attached
        // to a metadata-only tensor for the query and freed right after.
        unsafe {
            let dummy = sys::ggml_backend_buft_alloc_buffer(buft.0, 0);
            if dummy.is_null() {
                return false;
            }
            (*w.raw()).buffer = dummy;
            let ok = sys::ggml_backend_dev_supports_op(self.device.0, op.raw());
            (*w.raw()).buffer = std::ptr::null_mut();
            sys::ggml_backend_buffer_free(dummy);
            ok
        }
    }
}

/// The graph scheduler: allocates intermediates in compute buffers and runs a graph, splitting it
/// across backends by where weights live (the last backend must be the CPU).
///
/// It has one or more slots, each a ggml scheduler of its own over the same backends, with its own
/// compute buffers: a graph allocated in one slot stays valid while graphs run in the others. (One
/// ggml scheduler cannot keep two graphs: it rewires a graph's inputs to copies that it frees when
/// it schedules the next.) Keeping each step shape's graph in a slot lets an accelerator's backend
/// replay what it recorded for it (CUDA graphs) when steps alternate shapes, as speculative decoding
/// does.
#[derive(Debug)]
pub struct GraphScheduler {
    /// Each slot's ggml scheduler and the graph size it was made for.
    slots: Vec<(sys::ggml_backend_sched_t, usize)>,
    _backends: Vec<Backend>,
}

// SAFETY: used from one thread at a time (the engine thread); not Sync.
unsafe impl Send for GraphScheduler {}

impl Drop for GraphScheduler {
    fn drop(&mut self) {
        for &(raw, _) in &self.slots {
            // SAFETY: each raw came from ggml_backend_sched_new, freed once, before its backends
            // (held below).
            unsafe { sys::ggml_backend_sched_free(raw) }
        }
    }
}

impl GraphScheduler {
    /// Puts every CPU backend's threads to sleep until their next graph
    /// ([`Backend::pause_threads`]).
    pub fn pause_threads(&self) {
        for b in &self._backends {
            b.pause_threads();
        }
    }

    /// A scheduler over `backends` (highest priority first, CPU last) with one slot for graphs of
    /// up to `max_nodes`.
    pub fn new(backends: Vec<Backend>, max_nodes: usize) -> Result<GraphScheduler> {
        let raw = Self::create(&backends, max_nodes)?;
        Ok(GraphScheduler {
            slots: vec![(raw, max_nodes)],
            _backends: backends,
        })
    }

    /// A ggml scheduler over `backends` (which must outlive it).
    fn create(backends: &[Backend], max_nodes: usize) -> Result<sys::ggml_backend_sched_t> {
        let mut raws: Vec<sys::ggml_backend_t> = backends.iter().map(|b| b.raw).collect();
        // SAFETY: raws holds live backends, kept alive by the caller for the scheduler's life;
        // NULL bufts = defaults; the result is checked.
        let raw = unsafe {
            sys::ggml_backend_sched_new(
                raws.as_mut_ptr(),
                std::ptr::null_mut(),
                raws.len() as i32,
                max_nodes,
                false,
                true,
            )
        };
        if raw.is_null() {
            return Err(Error::Alloc("ggml_backend_sched_new".into()));
        }
        Ok(raw)
    }

    /// Slots made so far.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Adds a slot for graphs of up to `max_nodes`; returns its index.
    pub fn add_slot(&mut self, max_nodes: usize) -> Result<usize> {
        let raw = Self::create(&self._backends, max_nodes)?;
        self.slots.push((raw, max_nodes));
        Ok(self.slots.len() - 1)
    }

    /// The graph size slot `slot` was made for.
    pub fn capacity(&self, slot: usize) -> usize {
        self.slots[slot].1
    }

    /// Makes room in `slot` for graphs of up to `max_nodes` (a new scheduler over the same
    /// backends; any graph allocated by the old one must be allocated again). The scheduler
    /// clears tables of its size at every allocation, so it is worth keeping no larger than the
    /// graphs need.
    pub fn resize(&mut self, slot: usize, max_nodes: usize) -> Result<()> {
        let raw = Self::create(&self._backends, max_nodes)?;
        let old = std::mem::replace(&mut self.slots[slot], (raw, max_nodes));
        // SAFETY: the old scheduler is ours, freed once; nothing allocated by it is used again
        // (the caller allocates its next graph on the new one).
        unsafe { sys::ggml_backend_sched_free(old.0) };
        Ok(())
    }

    /// Assigns memory to every node of `graph` in `slot` (call before writing inputs); the
    /// slot's previous graph is dropped.
    pub fn alloc(&mut self, slot: usize, graph: &mut Graph<'_>) -> Result<()> {
        let raw = self.slots[slot].0;
        // SAFETY: live scheduler and graph. Reset drops the previous graph's assignment.
        unsafe {
            sys::ggml_backend_sched_reset(raw);
            if !sys::ggml_backend_sched_alloc_graph(raw, graph.raw()) {
                return Err(Error::Alloc("ggml_backend_sched_alloc_graph".into()));
            }
        }
        Ok(())
    }

    /// Runs a graph allocated in `slot` to completion.
    ///
    /// With `AXLE_TRACE_NODES=FILE` in the environment (read once per process), every node is
    /// computed by itself and FILE gets one line per node (graph number, node index, op, type,
    /// shape, a hash of its bytes), for finding the first node where two runs part (a debugging
    /// aid: slow).
    pub fn compute(&mut self, slot: usize, graph: &mut Graph<'_>) -> Result<()> {
        let sched = self.slots[slot].0;
        let mut trace = NodeTrace::from_env();
        if let Some(t) = trace.as_mut() {
            // SAFETY: `t` outlives the compute below, after which the callback is removed.
            unsafe {
                sys::ggml_backend_sched_set_eval_callback(
                    sched,
                    Some(NodeTrace::callback),
                    (t as *mut NodeTrace).cast(),
                )
            };
        }
        // SAFETY: graph was allocated by `alloc` in this slot.
        let st = unsafe { sys::ggml_backend_sched_graph_compute(sched, graph.raw()) };
        if trace.is_some() {
            // SAFETY: live scheduler; removes the callback before `trace` is dropped.
            unsafe { sys::ggml_backend_sched_set_eval_callback(sched, None, std::ptr::null_mut()) };
        }
        if st != sys::GGML_STATUS_SUCCESS {
            return Err(Error::Compute(st));
        }
        Ok(())
    }
}

/// The state of an `AXLE_TRACE_NODES` trace ([`GraphScheduler::compute`]).
struct NodeTrace {
    out: &'static std::sync::Mutex<std::fs::File>,
    graph: u64,
    node: u64,
    bytes: Vec<u8>,
}

/// Graphs traced so far in this process.
static TRACED_GRAPHS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl NodeTrace {
    /// A trace of the next graph, where the process started with `AXLE_TRACE_NODES` set. The
    /// variable is read and the file opened once (compute is on every step's path); a file that
    /// cannot be opened is said once on stderr, and nothing is traced.
    fn from_env() -> Option<NodeTrace> {
        static OUT: std::sync::OnceLock<Option<std::sync::Mutex<std::fs::File>>> =
            std::sync::OnceLock::new();
        let out = OUT
            .get_or_init(|| {
                let path = crate::env::var_os("AXLE_TRACE_NODES")?;
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path);
                match file {
                    Ok(f) => Some(std::sync::Mutex::new(f)),
                    Err(e) => {
                        let path = path.to_string_lossy();
                        eprintln!("AXLE_TRACE_NODES: cannot open {path}: {e}; not tracing");
                        None
                    }
                }
            })
            .as_ref()?;
        let graph = TRACED_GRAPHS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(NodeTrace {
            out,
            graph,
            node: 0,
            bytes: Vec::new(),
        })
    }

    /// ggml's eval callback: asks for every node, then hashes each computed node's bytes.
    unsafe extern "C" fn callback(
        t: *mut sys::ggml_tensor,
        ask: bool,
        user_data: *mut std::os::raw::c_void,
    ) -> bool {
        use std::io::Write;
        // SAFETY: user_data is the NodeTrace set in `compute`, alive during it; ggml hands a
        // computed, allocated node.
        let (trace, t) = unsafe { (&mut *(user_data as *mut NodeTrace), &*t) };
        // Views, reshapes and permutes compute nothing (and a weight's view is a node too).
        let moves_no_data = [
            sys::GGML_OP_VIEW,
            sys::GGML_OP_RESHAPE,
            sys::GGML_OP_PERMUTE,
            sys::GGML_OP_TRANSPOSE,
            sys::GGML_OP_NONE,
        ];
        let computes = !moves_no_data.contains(&t.op);
        if ask || !computes {
            // Asked: whether to hand this node back after computing it (a false here never
            // stops the graph; ggml only stops on a false for a node it handed back).
            return computes;
        }
        // SAFETY: as above; reads the node's bytes into host memory.
        let (op, name) = unsafe {
            let n = sys::ggml_nbytes(t);
            trace.bytes.resize(n, 0);
            sys::ggml_backend_tensor_get(t, trace.bytes.as_mut_ptr().cast(), 0, n);
            (
                std::ffi::CStr::from_ptr(sys::ggml_op_desc(t)).to_string_lossy(),
                std::ffi::CStr::from_ptr(t.name.as_ptr()).to_string_lossy(),
            )
        };
        let hash = trace.bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        if let Ok(mut out) = trace.out.lock() {
            let _ = writeln!(
                out,
                "{} {} {} {} {:?} {:016x} {}",
                trace.graph, trace.node, op, t.type_, t.ne, hash, name
            );
        }
        trace.node += 1;
        true
    }
}

/// Host memory a device copies into at full speed (CUDA's page-locked memory), for reading step
/// results back: a copy into ordinary (pageable) memory goes through the driver's own staging
/// buffers in pieces, several times slower for a step's logits. Grows to the
/// largest read asked of it.
pub struct PinnedHost {
    buft: BufferType,
    buf: sys::ggml_backend_buffer_t,
    size: usize,
}

// SAFETY: the buffer is only touched through &mut self (reads into it) and freed once in Drop.
unsafe impl Send for PinnedHost {}

impl std::fmt::Debug for PinnedHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedHost")
            .field("buffer_type", &self.buft)
            .field("size", &self.size)
            .finish()
    }
}

impl PinnedHost {
    /// Staging memory for `device`, or None when the device has no host buffer type of its own
    /// (the CPU, or a backend without one): plain reads are then as fast as they get.
    pub fn for_device(device: &Device) -> Option<PinnedHost> {
        // SAFETY: valid device; a null result means "none".
        let buft = unsafe { sys::ggml_backend_dev_host_buffer_type(device.0) };
        (!buft.is_null()).then(|| PinnedHost {
            buft: BufferType(buft),
            buf: std::ptr::null_mut(),
            size: 0,
        })
    }

    /// Copies the f32 tensor `t` (allocated) into `out` through the staging memory.
    pub fn read_f32(&mut self, t: &Tensor<'_>, out: &mut Vec<f32>) -> Result<()> {
        let bytes = t.nbytes();
        let n = bytes / std::mem::size_of::<f32>();
        if !t.is_allocated() || n * std::mem::size_of::<f32>() != bytes {
            return t.read(out);
        }
        if self.size < bytes {
            if !self.buf.is_null() {
                // SAFETY: allocated below by ggml, freed once, not in use (reads are synchronous).
                unsafe { sys::ggml_backend_buffer_free(self.buf) };
                self.buf = std::ptr::null_mut();
                self.size = 0;
            }
            // SAFETY: a valid buffer type; the result is checked for null.
            let buf = unsafe { sys::ggml_backend_buft_alloc_buffer(self.buft.0, bytes) };
            if buf.is_null() {
                return t.read(out);
            }
            self.buf = buf;
            self.size = bytes;
        }
        // SAFETY: the buffer holds at least `bytes` bytes at its base; the tensor is allocated
        // and `bytes` is its size; the copy is synchronous.
        let base = unsafe { sys::ggml_backend_buffer_get_base(self.buf) };
        unsafe { sys::ggml_backend_tensor_get(t.raw(), base, 0, bytes) };
        out.clear();
        out.reserve(n);
        // SAFETY: `base` holds `bytes` initialized bytes (just written); `out` has room for `n`
        // f32 values (`bytes` bytes) and does not overlap it; after the copy its first `n` values
        // are initialized (every bit pattern is a valid f32), so the length can be set without
        // zero-filling first (that would touch the 512 KB of a decode step's logits twice).
        unsafe {
            std::ptr::copy_nonoverlapping(base.cast::<u8>(), out.as_mut_ptr().cast::<u8>(), bytes);
            out.set_len(n);
        }
        Ok(())
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if !self.buf.is_null() {
            // SAFETY: allocated by ggml in `read`, freed once.
            unsafe { sys::ggml_backend_buffer_free(self.buf) };
        }
    }
}
