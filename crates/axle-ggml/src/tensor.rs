//! The small safe tensor API that model files are written in: a [`Context`] owns tensor metadata,
//! [`Tensor`] is a copyable handle that cannot outlive it, ops are methods on the context, and a
//! [`Graph`] collects the ops to run. Memory for tensors comes from backend buffers (see
//! [`crate::GraphScheduler`] and [`crate::TensorStore`]), never from the context itself.
use crate::{DType, Error, Result};
use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, c_void, CStr, CString};
use std::marker::PhantomData;
use std::ptr::NonNull;

/// An owned ggml context holding tensor and graph metadata only (`no_alloc`).
#[derive(Debug)]
pub struct Context {
    ptr: NonNull<sys::ggml_context>,
    /// The graph built in this context, if any (so a cached context can be run again).
    graph: std::cell::Cell<Option<NonNull<sys::ggml_cgraph>>>,
}

// SAFETY: a ggml context is plain memory with no thread affinity; `Context` is not Sync, so it is
// only ever used from one thread at a time.
unsafe impl Send for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: ptr came from ggml_init and is freed exactly once.
        unsafe { sys::ggml_free(self.ptr.as_ptr()) }
    }
}

/// A handle to a tensor of a [`Context`], valid for the context's lifetime `'a`.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    ptr: NonNull<sys::ggml_tensor>,
    _ctx: PhantomData<&'a Context>,
}

/// A computation graph built in a [`Context`].
#[derive(Debug)]
pub struct Graph<'a> {
    ptr: NonNull<sys::ggml_cgraph>,
    _ctx: PhantomData<&'a Context>,
}

/// Gated linear unit variants of `glu_split`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GluOp {
    /// silu(gate) * up (Llama, Qwen, Mistral).
    SwiGlu,
    /// gelu_tanh(gate) * up (Gemma).
    GeGlu,
    /// gpt-oss's clamped SwiGLU: `gate * sigmoid(1.702 gate) * (up + 1)`, gate clamped above
    /// at 7 and up to +-7 (the constants of llama.cpp's gpt-oss graph).
    SwiGluOai,
}

/// Position sections of multi-section RoPE ([`Context::rope_multi`]).
pub const MROPE_SECTIONS: usize = 4;

/// RoPE mode of interleaved multi-section RoPE (Qwen3-VL, Qwen3.5).
pub const ROPE_TYPE_IMROPE: i32 = 40;

/// Rotary embedding parameters, as `ggml_rope_ext` takes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// Dimensions rotated (n_rot).
    pub n_dims: i32,
    /// 0 = normal (interleaved pairs, Llama), 2 = NeoX (halves, Qwen/Gemma).
    pub mode: i32,
    /// Original training context (YaRN).
    pub n_ctx_orig: i32,
    /// Base frequency.
    pub freq_base: f32,
    /// 1 / linear scaling factor.
    pub freq_scale: f32,
    /// YaRN extrapolation mix (0 disables).
    pub ext_factor: f32,
    /// Magnitude scaling.
    pub attn_factor: f32,
    /// YaRN low correction dim.
    pub beta_fast: f32,
    /// YaRN high correction dim.
    pub beta_slow: f32,
}

impl<'a> Tensor<'a> {
    pub(crate) fn from_raw(ptr: *mut sys::ggml_tensor) -> Tensor<'a> {
        Tensor {
            ptr: NonNull::new(ptr).expect("ggml returned a null tensor"),
            _ctx: PhantomData,
        }
    }

    pub(crate) fn raw(self) -> *mut sys::ggml_tensor {
        self.ptr.as_ptr()
    }

    fn get(&self) -> &sys::ggml_tensor {
        // SAFETY: the tensor lives in a context that outlives 'a (the handle's lifetime).
        unsafe { self.ptr.as_ref() }
    }

    /// Shape, ggml order (ne0 contiguous), always 4 entries.
    pub fn ne(&self) -> [i64; 4] {
        self.get().ne
    }

    /// Strides in bytes.
    pub fn nb(&self) -> [usize; 4] {
        self.get().nb
    }

    /// Whether elements are adjacent within rows and rows within planes (ggml's
    /// `ggml_is_padded_1d`, which element-wise ops such as scale assert).
    pub fn rows_packed(&self) -> bool {
        let (t, ne, nb) = (self.get(), self.ne(), self.nb());
        // SAFETY: a plain function of the type id.
        let elem = unsafe { sys::ggml_type_size(t.type_) };
        nb[0] == elem && nb[2] == nb[1] * ne[1] as usize && nb[3] == nb[2] * ne[2] as usize
    }

    /// The node's `i`th 32-bit op parameter (0 past the end of ggml's op parameters).
    pub fn op_param_i32(&self, i: usize) -> i32 {
        self.get().op_params.get(i).copied().unwrap_or(0)
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        DType(self.get().type_)
    }

    /// Size of the tensor data in bytes.
    pub fn nbytes(&self) -> usize {
        // SAFETY: valid tensor.
        unsafe { sys::ggml_nbytes(self.raw()) }
    }

    /// Number of elements.
    pub fn nelements(&self) -> i64 {
        self.ne().iter().product()
    }

    /// The tensor's name.
    pub fn name(&self) -> String {
        // SAFETY: valid tensor; the name is a NUL-terminated array inside it.
        unsafe { CStr::from_ptr(sys::ggml_get_name(self.raw())) }
            .to_string_lossy()
            .into_owned()
    }

    /// Names the tensor (for debugging and dumps). Returns the same handle.
    pub fn named(self, name: &str) -> Tensor<'a> {
        if let Ok(c) = CString::new(name) {
            // SAFETY: valid tensor and C string; ggml copies at most 63 bytes.
            unsafe { sys::ggml_set_name(self.raw(), c.as_ptr()) };
        }
        self
    }

    /// Marks the tensor as a graph input (its memory is not reused for intermediates).
    pub fn as_input(self) -> Tensor<'a> {
        // SAFETY: valid tensor.
        unsafe { sys::ggml_set_input(self.raw()) };
        self
    }

    /// Marks the tensor as a graph output (kept after compute).
    pub fn as_output(self) -> Tensor<'a> {
        // SAFETY: valid tensor.
        unsafe { sys::ggml_set_output(self.raw()) };
        self
    }

    /// Whether the data lies in host memory in ggml's plain layout: not on a device, and not in
    /// a CPU repacking buffer (which marks its tensors with `extra` and multiplies them with its
    /// own GEMM/GEMV kernels).
    pub fn is_plain_host(&self) -> bool {
        let t = self.get();
        if t.buffer.is_null() || !t.extra.is_null() {
            return false;
        }
        // SAFETY: a non-null buffer of a live tensor.
        unsafe { sys::ggml_backend_buffer_is_host(t.buffer) }
    }

    /// Whether the data lies in an accelerator's memory (a buffer that is not host memory; for a
    /// view not yet allocated, that of the tensor it views).
    pub fn is_on_device(&self) -> bool {
        let t = self.home();
        if t.buffer.is_null() {
            return false;
        }
        // SAFETY: a non-null buffer of a live tensor.
        !unsafe { sys::ggml_backend_buffer_is_host(t.buffer) }
    }

    /// Whether the data lies in a CUDA device's memory (its buffer, or that of the tensor it
    /// views, is named `CUDA<n>`).
    pub fn is_on_cuda(&self) -> bool {
        let t = self.home();
        if t.buffer.is_null() {
            return false;
        }
        // SAFETY: a non-null buffer of a live tensor; ggml returns a static name.
        let name = unsafe { std::ffi::CStr::from_ptr(sys::ggml_backend_buffer_name(t.buffer)) };
        name.to_bytes().starts_with(b"CUDA")
    }

    /// The tensor itself, or for a view made in a graph (which gets its buffer at allocation)
    /// the allocated tensor it views.
    fn home(&self) -> &sys::ggml_tensor {
        let mut t = self.get();
        while t.buffer.is_null() && !t.view_src.is_null() {
            // SAFETY: a view's source is a live tensor of the same or an outliving context.
            t = unsafe { &*t.view_src };
        }
        t
    }

    /// The type of the buffer that holds the data (its own, or that of the tensor it views);
    /// `None` before memory is assigned.
    pub fn buffer_type(&self) -> Option<crate::BufferType> {
        let t = self.home();
        if t.buffer.is_null() {
            return None;
        }
        // SAFETY: a non-null buffer of a live tensor; its type is a static descriptor.
        Some(crate::BufferType(unsafe {
            sys::ggml_backend_buffer_get_type(t.buffer)
        }))
    }

    /// Whether backend memory has been assigned.
    pub fn is_allocated(&self) -> bool {
        !self.get().buffer.is_null()
            || (!self.get().view_src.is_null() && !self.get().data.is_null())
    }

    fn check_io(&self, bytes: usize) -> Result<()> {
        if !self.is_allocated() {
            return Err(Error::Alloc(format!(
                "tensor `{}` has no backend memory",
                self.name()
            )));
        }
        if bytes != self.nbytes() {
            return Err(Error::DataSize {
                name: self.name(),
                tensor: self.nbytes(),
                given: bytes,
            });
        }
        Ok(())
    }

    /// Copies host data into the tensor (whole tensor; `data` must match its size in bytes).
    pub fn write<T: Copy>(&self, data: &[T]) -> Result<()> {
        let bytes = std::mem::size_of_val(data);
        self.check_io(bytes)?;
        // SAFETY: the tensor is allocated in a backend buffer and `bytes` equals its size.
        unsafe { sys::ggml_backend_tensor_set(self.raw(), data.as_ptr().cast(), 0, bytes) };
        Ok(())
    }

    /// Copies the tensor's data out to host memory (whole tensor).
    pub fn read<T: Copy + Default>(&self, out: &mut Vec<T>) -> Result<()> {
        let n = self.nbytes() / std::mem::size_of::<T>();
        out.clear();
        out.resize(n, T::default());
        self.check_io(n * std::mem::size_of::<T>())?;
        // SAFETY: allocated tensor, `out` holds exactly nbytes.
        unsafe {
            sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), 0, self.nbytes())
        };
        Ok(())
    }

    /// Copies an f32 tensor's data out to host memory (whole tensor) without zero-filling `out`
    /// first: a decode step's logits (1 MB for a 262k vocabulary) are written once, not twice.
    pub fn read_f32(&self, out: &mut Vec<f32>) -> Result<()> {
        let n = self.nbytes() / std::mem::size_of::<f32>();
        self.check_io(n * std::mem::size_of::<f32>())?;
        out.clear();
        out.reserve(n);
        // SAFETY: the tensor is allocated and holds exactly `n` f32 values (checked above);
        // `out` has room for `n` values; the copy is synchronous and initializes all of them
        // (every bit pattern is a valid f32), so the length can then be set.
        unsafe {
            sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), 0, self.nbytes());
            out.set_len(n);
        }
        Ok(())
    }

    /// Checks that bytes `offset..end` lie in the tensor's allocated memory.
    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        if !self.is_allocated() || offset + len > self.nbytes() {
            return Err(Error::DataSize {
                name: self.name(),
                tensor: self.nbytes(),
                given: offset + len,
            });
        }
        Ok(())
    }

    /// Copies `out.len()` raw bytes out of the tensor from byte `offset`.
    pub fn read_bytes_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        // SAFETY: bounds checked above; tensor is allocated.
        unsafe {
            sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), offset, out.len())
        };
        Ok(())
    }

    /// Copies raw bytes into part of the tensor at byte `offset`.
    pub fn write_bytes_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        // SAFETY: bounds checked above; tensor is allocated.
        unsafe {
            sys::ggml_backend_tensor_set(self.raw(), data.as_ptr().cast(), offset, data.len())
        };
        Ok(())
    }
}

impl<'a> Graph<'a> {
    /// Adds `t` and everything it depends on to the graph.
    pub fn expand(&mut self, t: Tensor<'a>) {
        // SAFETY: graph and tensor belong to live contexts of lifetime 'a.
        unsafe { sys::ggml_build_forward_expand(self.ptr.as_ptr(), t.raw()) }
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_cgraph {
        self.ptr.as_ptr()
    }
}

impl Context {
    /// A metadata-only context with room for `n_tensors` tensors and, if `graph_nodes > 0`, one graph.
    pub fn new(n_tensors: usize, graph_nodes: usize) -> Result<Context> {
        crate::quiet_logs();
        // SAFETY: pure size computations.
        let mut size = unsafe { sys::ggml_tensor_overhead() } * n_tensors;
        if graph_nodes > 0 {
            // SAFETY: pure size computation.
            size += unsafe { sys::ggml_graph_overhead_custom(graph_nodes, false) };
        }
        let params = sys::ggml_init_params {
            mem_size: size,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: valid params; ggml allocates its own metadata arena.
        let ptr = unsafe { sys::ggml_init(params) };
        NonNull::new(ptr)
            .map(|ptr| Context {
                ptr,
                graph: std::cell::Cell::new(None),
            })
            .ok_or_else(|| Error::Alloc(format!("ggml_init({size} bytes)")))
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_context {
        self.ptr.as_ptr()
    }

    /// A new graph with room for `nodes` nodes.
    pub fn graph(&self, nodes: usize) -> Graph<'_> {
        // SAFETY: the context was sized for a graph of this many nodes by `new`.
        let g = unsafe { sys::ggml_new_graph_custom(self.raw(), nodes, false) };
        let ptr = NonNull::new(g).expect("ggml_new_graph_custom returned null");
        self.graph.set(Some(ptr));
        Graph {
            ptr,
            _ctx: PhantomData,
        }
    }

    /// The graph last built in this context (to run a cached graph again).
    pub fn existing_graph(&self) -> Option<Graph<'_>> {
        self.graph.get().map(|ptr| Graph {
            ptr,
            _ctx: PhantomData,
        })
    }

    /// A tensor of this context by name.
    pub fn find(&self, name: &str) -> Option<Tensor<'_>> {
        let c = CString::new(name).ok()?;
        // SAFETY: valid context and C string; returns NULL when absent.
        let t = unsafe { sys::ggml_get_tensor(self.raw(), c.as_ptr()) };
        (!t.is_null()).then(|| Tensor::from_raw(t))
    }

    /// A new tensor of the given type and shape (1 to 4 dims, ggml order).
    pub fn tensor(&self, dtype: DType, shape: &[i64]) -> Tensor<'_> {
        assert!((1..=4).contains(&shape.len()), "tensor rank must be 1..=4");
        // SAFETY: valid context, shape has 1..=4 entries.
        Tensor::from_raw(unsafe {
            sys::ggml_new_tensor(self.raw(), dtype.0, shape.len() as i32, shape.as_ptr())
        })
    }

    /// An input tensor: a new tensor marked as graph input.
    pub fn input(&self, dtype: DType, shape: &[i64], name: &str) -> Tensor<'_> {
        self.tensor(dtype, shape).named(name).as_input()
    }

    /// All tensors of this context, in creation order.
    pub fn tensors(&self) -> Vec<Tensor<'_>> {
        let mut out = Vec::new();
        // SAFETY: valid context; iteration follows ggml's object list.
        let mut t = unsafe { sys::ggml_get_first_tensor(self.raw()) };
        while !t.is_null() {
            out.push(Tensor::from_raw(t));
            // SAFETY: t is a tensor of this context.
            t = unsafe { sys::ggml_get_next_tensor(self.raw(), t) };
        }
        out
    }
}

// The ops. Each wraps one ggml builder; ggml validates shapes with asserts, so the model code must
// pass well-formed shapes (which it derives from validated hyperparameters).
impl Context {
    /// A custom op of ours with F32 output of shape `ne` over `srcs`, run by every thread of the
    /// step: `op(dst, ith, nth, word)`.
    ///
    /// # Safety
    /// `op` must only read `srcs` within their shapes and strides and write `dst`'s `ne` values;
    /// whatever it does with `word` must be valid for the graph's lifetime.
    pub(crate) unsafe fn custom_f32<'a>(
        &'a self,
        ne: [i64; 4],
        srcs: &[Tensor<'a>],
        op: unsafe extern "C" fn(*mut sys::ggml_tensor, c_int, c_int, *mut c_void),
        word: *mut c_void,
    ) -> Tensor<'a> {
        let mut args: Vec<_> = srcs.iter().map(|t| t.raw()).collect();
        // SAFETY: live tensors of this context; the op's contract is the caller's.
        let t = unsafe {
            sys::ggml_custom_4d(
                self.raw(),
                sys::GGML_TYPE_F32,
                ne[0],
                ne[1],
                ne[2],
                ne[3],
                args.as_mut_ptr(),
                args.len() as i32,
                Some(op),
                -1, // GGML_N_TASKS_MAX: every thread of the step
                word,
            )
        };
        Tensor::from_raw(t)
    }
}

impl Context {
    /// Matrix product: `a` [k, m] x `b` [k, n] -> [m, n] (a is usually the weight).
    pub fn mul_mat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: tensors and context are live for 'a.
        Tensor::from_raw(unsafe { sys::ggml_mul_mat(self.raw(), a.raw(), b.raw()) })
    }
    /// `a^T @ b` marked for Axle's column-invariant kernel (see [`crate::column_invariant`]): on a
    /// CUDA backend that carries it, every column gets the bits of a one-column product, in one
    /// pass over the weights per 8 columns (per 16 for Q4_0 on tensor cores). Elsewhere the mark
    /// is ignored and this is [`Context::mul_mat`]; check
    /// [`Device::column_invariant_products`](crate::Device) first.
    pub fn mul_mat_column_invariant<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        let y = self.mul_mat(a, b);
        // SAFETY: `y` is a live MUL_MAT node of this context; the hint only writes op_params[1],
        // which backends without Axle's kernel ignore for values they do not know.
        unsafe {
            sys::ggml_mul_mat_set_hint(y.raw(), crate::column_invariant::HINT as sys::ggml_op_hint)
        };
        y
    }
    /// `a^T @ b` (1 to 8 columns) marked for Axle's replay of ggml's tiled MMQ kernel (see
    /// [`crate::wide_replay`]): on a CUDA backend that carries it, every column gets the bits it
    /// gets in an MMQ op of 9 to 128 columns, in one pass over the weights. Elsewhere the mark is
    /// ignored and this is [`Context::mul_mat`]; check
    /// [`Device::wide_replay_products`](crate::Device) first.
    pub fn mul_mat_wide_replay<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        let y = self.mul_mat(a, b);
        // SAFETY: `y` is a live MUL_MAT node of this context; the hint only writes op_params[1],
        // which backends without Axle's kernel ignore for values they do not know.
        unsafe {
            sys::ggml_mul_mat_set_hint(y.raw(), crate::wide_replay::HINT as sys::ggml_op_hint)
        };
        y
    }
    /// `a^T @ b` for a product with a few columns, through a kernel that unpacks each weight block
    /// once for all columns, or with many (prefill) through a tiled kernel (see
    /// [`crate::few_columns`]); each column's numbers are bit-identical to ggml's one-column
    /// product. `None` where the kernel does not apply (weight type, column
    /// count, layout, memory, CPU): use [`Context::mul_mat`] then.
    pub fn mul_mat_few<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Option<Tensor<'a>> {
        if !crate::few_columns::applies(a, b) {
            return None;
        }
        // SAFETY: `applies` checked the shapes and memory the op's body relies on; it takes no
        // user data.
        Some(unsafe {
            self.custom_f32(
                [a.ne()[1], b.ne()[1], 1, 1],
                &[a, b],
                crate::few_columns::op,
                std::ptr::null_mut(),
            )
        })
    }
    /// Elementwise sum with broadcasting of `b`.
    pub fn add<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_add(self.raw(), a.raw(), b.raw()) })
    }
    /// Elementwise product with broadcasting of `b`.
    pub fn mul<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_mul(self.raw(), a.raw(), b.raw()) })
    }
    /// Multiplies by a scalar.
    pub fn scale<'a>(&'a self, a: Tensor<'a>, s: f32) -> Tensor<'a> {
        // ggml's scale asserts rows laid out back to back (a product of F16 or F32 weights can
        // come as a view that is not): such an input is made contiguous first.
        let a = if a.rows_packed() { a } else { self.cont(a) };
        // SAFETY: as above; `a`'s rows are packed, as ggml_scale asserts.
        Tensor::from_raw(unsafe { sys::ggml_scale(self.raw(), a.raw(), s) })
    }
    /// tanh, elementwise.
    pub fn tanh<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_tanh(self.raw(), a.raw()) })
    }
    /// Elementwise quotient with broadcasting of `b`.
    pub fn div<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_div(self.raw(), a.raw(), b.raw()) })
    }
    /// SiLU (x * sigmoid(x)), elementwise.
    pub fn silu<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_silu(self.raw(), a.raw()) })
    }
    /// GELU (tanh approximation), elementwise.
    pub fn gelu<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_gelu(self.raw(), a.raw()) })
    }
    /// `a` repeated (broadcast by tiling) to the shape `ne`.
    pub fn repeat_4d<'a>(&'a self, a: Tensor<'a>, ne: [i64; 4]) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts each dimension of `ne` is a multiple of `a`'s.
        Tensor::from_raw(unsafe {
            sys::ggml_repeat_4d(self.raw(), a.raw(), ne[0], ne[1], ne[2], ne[3])
        })
    }
    /// softplus(x) = log(1 + exp(x)), elementwise.
    pub fn softplus<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_softplus(self.raw(), a.raw()) })
    }
    /// Swaps dimensions 0 and 1 (a view).
    pub fn transpose<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_transpose(self.raw(), a.raw()) })
    }
    /// Depthwise causal convolution: `sx` [d_conv - 1 + n, channels, n_seqs] (the window's
    /// previous inputs, then the new ones, time first), kernel `c` [d_conv, channels];
    /// returns [channels, n, n_seqs].
    pub fn ssm_conv<'a>(&'a self, sx: Tensor<'a>, c: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts the shapes agree.
        Tensor::from_raw(unsafe { sys::ggml_ssm_conv(self.raw(), sx.raw(), c.raw()) })
    }
    /// Gated delta rule (linear attention) over a sequence's tokens, one token after another:
    /// q, k [S, H_k, n, n_seqs], v [S, H_v, n, n_seqs], gate and beta [1, H_v, n, n_seqs], initial
    /// state [S, S, H_v, n_seqs]. Returns the outputs [S, H_v, n, n_seqs] followed by the last
    /// min(n, `snapshots`) states, most recent first, in one flat F32 tensor.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta_net<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        gate: Tensor<'a>,
        beta: Tensor<'a>,
        state: Tensor<'a>,
        snapshots: i64,
    ) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts the shapes agree.
        Tensor::from_raw(unsafe {
            sys::ggml_gated_delta_net(
                self.raw(),
                q.raw(),
                k.raw(),
                v.raw(),
                gate.raw(),
                beta.raw(),
                state.raw(),
                snapshots,
            )
        })
    }
    /// A tensor of `a`'s shape filled with `value`.
    pub fn fill<'a>(&'a self, a: Tensor<'a>, value: f32) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_fill(self.raw(), a.raw(), value) })
    }
    /// Logistic sigmoid, elementwise.
    pub fn sigmoid<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_sigmoid(self.raw(), a.raw()) })
    }
    /// Softmax over dim 0 of each row.
    pub fn soft_max<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_soft_max(self.raw(), a.raw()) })
    }
    /// Sum of each row (dim 0) -> [1, ...].
    pub fn sum_rows<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_sum_rows(self.raw(), a.raw()) })
    }
    /// Clamps every element into [min, max].
    pub fn clamp<'a>(&'a self, a: Tensor<'a>, min: f32, max: f32) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_clamp(self.raw(), a.raw(), min, max) })
    }
    /// I32 indices of the `k` largest elements of each row, largest first (argsort + view).
    pub fn argsort_top_k<'a>(&'a self, a: Tensor<'a>, k: i64) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts k <= the row length.
        Tensor::from_raw(unsafe { sys::ggml_argsort_top_k(self.raw(), a.raw(), k as i32) })
    }
    /// Indirect product (mixture of experts): `as_` [k, m, n_as] holds one matrix per expert,
    /// `b` [k, n_b, n_tokens], `ids` I32 [n_used, n_tokens] the experts of each token; returns
    /// [m, n_used, n_tokens], column (i, t) = as_[ids[i, t]] @ b[i % n_b, t].
    pub fn mul_mat_id<'a>(&'a self, as_: Tensor<'a>, b: Tensor<'a>, ids: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts the shapes agree.
        Tensor::from_raw(unsafe { sys::ggml_mul_mat_id(self.raw(), as_.raw(), b.raw(), ids.raw()) })
    }
    /// RMS norm over dim 0 (no weight).
    pub fn rms_norm<'a>(&'a self, a: Tensor<'a>, eps: f32) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_rms_norm(self.raw(), a.raw(), eps) })
    }
    /// Rows of `a` selected by the I32 indices `ids`.
    pub fn get_rows<'a>(&'a self, a: Tensor<'a>, ids: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_get_rows(self.raw(), a.raw(), ids.raw()) })
    }
    /// Rows of `a` at the I32 indices `ids`, with their values' bits: `a`'s F16 rows copied as
    /// they are where `a` lies on a CUDA device ([`Tensor::is_on_cuda`]), whose get_rows kernel
    /// writes F16 from F16; elsewhere [`Context::get_rows`] (F32) and a cast back, exact for F16.
    /// The direct copy moves a third of the bytes and skips the cast's kernel, which matters
    /// where every step gathers every sequence's KV slots.
    pub fn gather_rows<'a>(&'a self, a: Tensor<'a>, ids: Tensor<'a>) -> Tensor<'a> {
        let rows = self.get_rows(a, ids);
        if a.dtype() != DType::F16 || !a.is_on_cuda() {
            return self.cast(rows, a.dtype());
        }
        // SAFETY: `rows` was just created by this context and is not allocated yet; giving it
        // F16 elements and the matching contiguous strides changes only how much memory the
        // allocator gives it and what CUDA's get_rows writes (it dispatches on the destination's
        // type, F16 included).
        unsafe {
            let t = &mut *rows.raw();
            t.type_ = DType::F16.raw();
            t.nb[0] = 2;
            for d in 1..4 {
                t.nb[d] = t.nb[d - 1] * t.ne[d - 1] as usize;
            }
        }
        rows
    }
    /// Writes rows of `src` into `dst` at the I64 row indices `ids`; returns a view of `dst`.
    pub fn set_rows<'a>(&'a self, dst: Tensor<'a>, src: Tensor<'a>, ids: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_set_rows(self.raw(), dst.raw(), src.raw(), ids.raw()) })
    }
    /// Same data, new contiguous shape.
    pub fn reshape<'a>(&'a self, a: Tensor<'a>, shape: &[i64]) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts the element count matches.
        let r = unsafe {
            match *shape {
                [a0] => sys::ggml_reshape_1d(self.raw(), a.raw(), a0),
                [a0, a1] => sys::ggml_reshape_2d(self.raw(), a.raw(), a0, a1),
                [a0, a1, a2] => sys::ggml_reshape_3d(self.raw(), a.raw(), a0, a1, a2),
                [a0, a1, a2, a3] => sys::ggml_reshape_4d(self.raw(), a.raw(), a0, a1, a2, a3),
                _ => panic!("reshape rank must be 1..=4"),
            }
        };
        Tensor::from_raw(r)
    }
    /// A strided view: `shape` with byte strides `strides` (one fewer than the rank) at byte `offset`.
    pub fn view<'a>(
        &'a self,
        a: Tensor<'a>,
        shape: &[i64],
        strides: &[usize],
        offset: usize,
    ) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts the view lies inside the source.
        let r = unsafe {
            match (shape, strides) {
                ([n0], []) => sys::ggml_view_1d(self.raw(), a.raw(), *n0, offset),
                ([n0, n1], [s1]) => sys::ggml_view_2d(self.raw(), a.raw(), *n0, *n1, *s1, offset),
                ([n0, n1, n2], [s1, s2]) => {
                    sys::ggml_view_3d(self.raw(), a.raw(), *n0, *n1, *n2, *s1, *s2, offset)
                }
                ([n0, n1, n2, n3], [s1, s2, s3]) => sys::ggml_view_4d(
                    self.raw(),
                    a.raw(),
                    *n0,
                    *n1,
                    *n2,
                    *n3,
                    *s1,
                    *s2,
                    *s3,
                    offset,
                ),
                _ => panic!("view: rank must be 1..=4 with rank-1 strides"),
            }
        };
        Tensor::from_raw(r)
    }
    /// Permutes dimensions (ggml semantics: axis i of `a` goes to position `axes[i]`).
    pub fn permute<'a>(&'a self, a: Tensor<'a>, axes: [i32; 4]) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe {
            sys::ggml_permute(self.raw(), a.raw(), axes[0], axes[1], axes[2], axes[3])
        })
    }
    /// Converts to `dtype` (F16 <-> F32 round trips are exact for F16 values).
    pub fn cast<'a>(&'a self, a: Tensor<'a>, dtype: DType) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts the conversion is supported.
        Tensor::from_raw(unsafe { sys::ggml_cast(self.raw(), a.raw(), dtype.raw()) })
    }
    /// Concatenation along dimension `dim`.
    pub fn concat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, dim: i32) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts the other dimensions match.
        Tensor::from_raw(unsafe { sys::ggml_concat(self.raw(), a.raw(), b.raw(), dim) })
    }
    /// `a` with `cols` zero columns appended (dimension 1).
    pub fn pad_cols<'a>(&'a self, a: Tensor<'a>, cols: i64) -> Tensor<'a> {
        let cols = i32::try_from(cols).expect("padding fits in i32");
        // SAFETY: as above; ggml_pad appends zeros at the end of each dimension.
        Tensor::from_raw(unsafe { sys::ggml_pad(self.raw(), a.raw(), 0, cols, 0, 0) })
    }
    /// Index of the largest element of each row (I32 [rows]).
    pub fn argmax<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts `a` is F32 and 2-D.
        Tensor::from_raw(unsafe { sys::ggml_argmax(self.raw(), a.raw()) })
    }
    /// A contiguous copy.
    pub fn cont<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_cont(self.raw(), a.raw()) })
    }
    /// Gated linear unit of two tensors: act(gate) * up.
    pub fn glu<'a>(&'a self, gate: Tensor<'a>, up: Tensor<'a>, op: GluOp) -> Tensor<'a> {
        let op = match op {
            GluOp::SwiGlu => sys::GGML_GLU_OP_SWIGLU,
            GluOp::GeGlu => sys::GGML_GLU_OP_GEGLU,
            GluOp::SwiGluOai => {
                // SAFETY: as above.
                return Tensor::from_raw(unsafe {
                    sys::ggml_swiglu_oai(self.raw(), gate.raw(), up.raw(), 1.702, 7.0)
                });
            }
        };
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_glu_split(self.raw(), gate.raw(), up.raw(), op) })
    }
    /// The gated unit of `a` [2 n, ...] whose rows hold the gate and then the up projection (a
    /// product with a fused gate-up weight): `op(a[..n]) * a[n..]`, [n, ...]. The same
    /// arithmetic as [`Context::glu`] of the two halves.
    pub fn glu_halves<'a>(&'a self, a: Tensor<'a>, op: GluOp) -> Tensor<'a> {
        let op = match op {
            GluOp::SwiGlu => sys::GGML_GLU_OP_SWIGLU,
            GluOp::GeGlu => sys::GGML_GLU_OP_GEGLU,
            GluOp::SwiGluOai => {
                let [n2, rest @ ..] = a.ne();
                let half = |i: usize| {
                    let mut shape = vec![n2 / 2];
                    shape.extend_from_slice(&rest[..1]);
                    self.view(a, &shape, &[a.nb()[1]], i * a.dtype().row_size(n2 / 2))
                };
                return self.glu(half(0), half(1), GluOp::SwiGluOai);
            }
        };
        // SAFETY: as above; ggml checks that `a` has an even first dimension.
        Tensor::from_raw(unsafe { sys::ggml_glu(self.raw(), a.raw(), op, false) })
    }
    /// Rotary position embedding of `a` [head_dim, n_head, n_tokens] at I32 positions `pos`,
    /// with optional per-dimension frequency factors (llama3 / longrope).
    pub fn rope<'a>(
        &'a self,
        a: Tensor<'a>,
        pos: Tensor<'a>,
        factors: Option<Tensor<'a>>,
        p: &RopeParams,
    ) -> Tensor<'a> {
        self.rope_with(a, pos, factors, None, p)
    }
    /// Multi-section rotary embedding (M-RoPE; `p.mode` says which kind): `pos` holds
    /// [`MROPE_SECTIONS`] positions per token, section-major; `sections` splits the rotated pairs.
    pub fn rope_multi<'a>(
        &'a self,
        a: Tensor<'a>,
        pos: Tensor<'a>,
        sections: [i32; MROPE_SECTIONS],
        p: &RopeParams,
    ) -> Tensor<'a> {
        self.rope_with(a, pos, None, Some(sections), p)
    }
    /// Both rotary forms: `ggml_rope_ext` is `ggml_rope_multi` without sections (ggml builds both
    /// with the same function, and ignores sections outside the M-RoPE modes).
    fn rope_with<'a>(
        &'a self,
        a: Tensor<'a>,
        pos: Tensor<'a>,
        factors: Option<Tensor<'a>>,
        sections: Option<[i32; MROPE_SECTIONS]>,
        p: &RopeParams,
    ) -> Tensor<'a> {
        let f = factors.map_or(std::ptr::null_mut(), |t| t.raw());
        let mut sections = sections;
        let sections_ptr = sections
            .as_mut()
            .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
        // SAFETY: as above; a null factor tensor means none, null sections mean none (ggml reads
        // four section sizes otherwise, from `sections`, which outlives the call).
        Tensor::from_raw(unsafe {
            sys::ggml_rope_multi(
                self.raw(),
                a.raw(),
                pos.raw(),
                f,
                p.n_dims,
                sections_ptr,
                p.mode,
                p.n_ctx_orig,
                p.freq_base,
                p.freq_scale,
                p.ext_factor,
                p.attn_factor,
                p.beta_fast,
                p.beta_slow,
            )
        })
    }
    /// Fused attention: q [d, n_q, n_head], k/v [d, n_kv, n_head_kv] (F16), mask F16 [n_kv, n_q];
    /// returns [d_v, n_head, n_q] accumulated in F32.
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        mask: Tensor<'a>,
        scale: f32,
        softcap: f32,
    ) -> Tensor<'a> {
        // SAFETY: as above.
        let t = unsafe {
            sys::ggml_flash_attn_ext(
                self.raw(),
                q.raw(),
                k.raw(),
                v.raw(),
                mask.raw(),
                scale,
                0.0,
                softcap,
            )
        };
        // SAFETY: t is a fresh flash-attn node.
        unsafe { sys::ggml_prec_set_acc(t, sys::GGML_PREC_F32) };
        Tensor::from_raw(t)
    }
    /// Attention sinks (gpt-oss): one learned logit per head [n_head] (F32) that joins every
    /// row's softmax without a value, attached to the flash-attention node `fa` (before any
    /// view or reshape of it).
    pub fn flash_attn_add_sinks<'a>(&'a self, fa: Tensor<'a>, sinks: Tensor<'a>) {
        // SAFETY: fa is a flash-attn node of this context and sinks a live F32 tensor; the call
        // only sets the node's sink source.
        unsafe { sys::ggml_flash_attn_ext_add_sinks(fa.raw(), sinks.raw()) }
    }
    /// `a + b[:, ids]`: adds to each row slot of `a` [n, n_used, t] the column of `b`
    /// [n, n_expert] chosen by `ids` [n_used, t] (per-expert biases of the chosen experts).
    pub fn add_id<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, ids: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        Tensor::from_raw(unsafe { sys::ggml_add_id(self.raw(), a.raw(), b.raw(), ids.raw()) })
    }
}
