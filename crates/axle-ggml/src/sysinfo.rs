//! What this build of ggml can use on this machine (for `axle doctor` and bench artifacts).
use llama_cpp_sys_2 as sys;
use std::ffi::CStr;

/// One CPU feature ggml checks for.
#[derive(Debug, Clone)]
pub struct CpuFeature {
    /// Feature name.
    pub name: &'static str,
    /// Whether ggml was built to use it (and the CPU has it).
    pub enabled: bool,
}

/// The features ggml checks for, with its query of each.
const CPU_FEATURES: [(&str, unsafe extern "C" fn() -> std::os::raw::c_int); 9] = [
    ("SSE3", sys::ggml_cpu_has_sse3),
    ("AVX", sys::ggml_cpu_has_avx),
    ("AVX2", sys::ggml_cpu_has_avx2),
    ("F16C", sys::ggml_cpu_has_f16c),
    ("FMA", sys::ggml_cpu_has_fma),
    ("BMI2", sys::ggml_cpu_has_bmi2),
    ("AVX512", sys::ggml_cpu_has_avx512),
    ("AVX_VNNI", sys::ggml_cpu_has_avx_vnni),
    ("NEON", sys::ggml_cpu_has_neon),
];

/// The SIMD features ggml's CPU backend was compiled with.
pub fn cpu_features() -> Vec<CpuFeature> {
    CPU_FEATURES
        .iter()
        .map(|&(name, has)| CpuFeature {
            name,
            // SAFETY: pure queries of compile-time flags, no arguments.
            enabled: unsafe { has() } != 0,
        })
        .collect()
}

/// llama.cpp's one-line system info string (backends and their features).
pub fn system_info() -> String {
    crate::quiet_logs();
    // SAFETY: returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::llama_print_system_info()) }
        .to_string_lossy()
        .into_owned()
}

/// Memory the system can still give this process without swapping (`MemAvailable` of
/// `/proc/meminfo`), in bytes; None where that is not known (not Linux).
pub fn host_available_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: usize = text
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}
