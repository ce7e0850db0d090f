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

/// The SIMD features ggml's CPU backend was compiled with.
pub fn cpu_features() -> Vec<CpuFeature> {
    // SAFETY: pure queries of compile-time flags.
    unsafe {
        vec![
            CpuFeature {
                name: "SSE3",
                enabled: sys::ggml_cpu_has_sse3() != 0,
            },
            CpuFeature {
                name: "AVX",
                enabled: sys::ggml_cpu_has_avx() != 0,
            },
            CpuFeature {
                name: "AVX2",
                enabled: sys::ggml_cpu_has_avx2() != 0,
            },
            CpuFeature {
                name: "F16C",
                enabled: sys::ggml_cpu_has_f16c() != 0,
            },
            CpuFeature {
                name: "FMA",
                enabled: sys::ggml_cpu_has_fma() != 0,
            },
            CpuFeature {
                name: "BMI2",
                enabled: sys::ggml_cpu_has_bmi2() != 0,
            },
            CpuFeature {
                name: "AVX512",
                enabled: sys::ggml_cpu_has_avx512() != 0,
            },
            CpuFeature {
                name: "AVX_VNNI",
                enabled: sys::ggml_cpu_has_avx_vnni() != 0,
            },
            CpuFeature {
                name: "NEON",
                enabled: sys::ggml_cpu_has_neon() != 0,
            },
        ]
    }
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
