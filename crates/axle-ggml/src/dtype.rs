//! Tensor element types, as ggml names them.
use llama_cpp_sys_2 as sys;
use std::ffi::CStr;

/// A ggml tensor type (f32, f16, and the quantized block formats).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DType(pub(crate) sys::ggml_type);

impl DType {
    /// 32-bit float.
    pub const F32: DType = DType(sys::GGML_TYPE_F32);
    /// 16-bit float.
    pub const F16: DType = DType(sys::GGML_TYPE_F16);
    /// bfloat16.
    pub const BF16: DType = DType(sys::GGML_TYPE_BF16);
    /// 32-bit signed integer.
    pub const I32: DType = DType(sys::GGML_TYPE_I32);
    /// 64-bit signed integer.
    pub const I64: DType = DType(sys::GGML_TYPE_I64);
    /// 4-bit blocks of 32 with a scale.
    pub const Q4_0: DType = DType(sys::GGML_TYPE_Q4_0);
    /// 4-bit blocks of 32 with a scale and a minimum.
    pub const Q4_1: DType = DType(sys::GGML_TYPE_Q4_1);
    /// 5-bit blocks of 32 with a scale.
    pub const Q5_0: DType = DType(sys::GGML_TYPE_Q5_0);
    /// 5-bit blocks of 32 with a scale and a minimum.
    pub const Q5_1: DType = DType(sys::GGML_TYPE_Q5_1);
    /// 8-bit blocks of 32 with a scale.
    pub const Q8_0: DType = DType(sys::GGML_TYPE_Q8_0);
    /// 4-bit super-blocks of 256 (k-quant).
    pub const Q4_K: DType = DType(sys::GGML_TYPE_Q4_K);
    /// 5-bit super-blocks of 256 (k-quant).
    pub const Q5_K: DType = DType(sys::GGML_TYPE_Q5_K);
    /// 6-bit super-blocks of 256 (k-quant).
    pub const Q6_K: DType = DType(sys::GGML_TYPE_Q6_K);
    /// 4-bit floats (E2M1) in blocks of 32 with a shared power-of-two scale (E8M0).
    pub const MXFP4: DType = DType(sys::GGML_TYPE_MXFP4);

    /// The type with ggml's raw id, if ggml knows it.
    pub fn from_raw(id: u32) -> Option<DType> {
        (id < sys::GGML_TYPE_COUNT).then_some(DType(id))
    }

    /// ggml's raw id.
    pub fn raw(self) -> u32 {
        self.0
    }

    /// ggml's name for the type ("q4_K", "f16", ...).
    pub fn name(self) -> String {
        // SAFETY: ggml_type_name returns a static NUL-terminated string for every id below
        // GGML_TYPE_COUNT (DType can only hold such ids), or NULL for removed ones.
        let p = unsafe { sys::ggml_type_name(self.0) };
        if p.is_null() {
            return format!("type{}", self.0);
        }
        // SAFETY: non-null static C string from ggml.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Whether ggml's CPU backend multiplies weights of this type with its tiled GEMM once the
    /// other operand has 8 or more columns (the K-quants and the IQ formats). That kernel rounds
    /// differently from the per-row dot product used below 8 columns.
    pub fn has_cpu_tiled_gemm(self) -> bool {
        matches!(
            self.0,
            sys::GGML_TYPE_Q2_K
                | sys::GGML_TYPE_Q3_K
                | sys::GGML_TYPE_Q4_K
                | sys::GGML_TYPE_Q5_K
                | sys::GGML_TYPE_Q6_K
                | sys::GGML_TYPE_IQ4_XS
                | sys::GGML_TYPE_IQ2_XXS
                | sys::GGML_TYPE_IQ2_XS
                | sys::GGML_TYPE_IQ2_S
                | sys::GGML_TYPE_IQ3_XXS
                | sys::GGML_TYPE_IQ3_S
                | sys::GGML_TYPE_IQ1_S
                | sys::GGML_TYPE_IQ1_M
        )
    }

    /// Whether ggml's CUDA backend multiplies weights of this type with its tiled MMQ kernel (on
    /// GPUs with int8 tensor cores, from 9 columns on; the mat-vec kernel below that).
    pub fn has_cuda_mmq(self) -> bool {
        matches!(
            self.0,
            sys::GGML_TYPE_Q4_0
                | sys::GGML_TYPE_Q4_1
                | sys::GGML_TYPE_Q5_0
                | sys::GGML_TYPE_Q5_1
                | sys::GGML_TYPE_Q8_0
                | sys::GGML_TYPE_Q2_K
                | sys::GGML_TYPE_Q3_K
                | sys::GGML_TYPE_Q4_K
                | sys::GGML_TYPE_Q5_K
                | sys::GGML_TYPE_Q6_K
                | sys::GGML_TYPE_IQ1_S
                | sys::GGML_TYPE_IQ2_XXS
                | sys::GGML_TYPE_IQ2_XS
                | sys::GGML_TYPE_IQ2_S
                | sys::GGML_TYPE_IQ3_XXS
                | sys::GGML_TYPE_IQ3_S
                | sys::GGML_TYPE_IQ4_XS
                | sys::GGML_TYPE_IQ4_NL
                | sys::GGML_TYPE_MXFP4
        )
    }

    /// Whether the type is a float format (F32, F16, BF16).
    pub fn is_float(self) -> bool {
        matches!(
            self.0,
            sys::GGML_TYPE_F32 | sys::GGML_TYPE_F16 | sys::GGML_TYPE_BF16
        )
    }

    /// Whether the type is a quantized block format.
    pub fn is_quantized(self) -> bool {
        // SAFETY: pure function of a valid type id.
        unsafe { sys::ggml_is_quantized(self.0) }
    }

    /// Elements per block (1 for plain float types).
    pub fn block_size(self) -> i64 {
        // SAFETY: pure function of a valid type id.
        unsafe { sys::ggml_blck_size(self.0) }
    }

    /// Bytes taken by a row of `n` elements of this type.
    pub fn row_size(self, n: i64) -> usize {
        // SAFETY: pure function of its arguments.
        unsafe { sys::ggml_row_size(self.0, n) }
    }
}

impl std::fmt::Debug for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}
