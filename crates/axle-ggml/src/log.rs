//! Routes ggml's and libllama's log output: silent unless `AXLE_GGML_LOG` is set, so that a
//! malformed file gives the user our one-line error and not ggml's internal chatter.
use llama_cpp_sys_2 as sys;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Once;

static INIT: Once = Once::new();

unsafe extern "C" fn log_callback(level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    if text.is_null() || std::env::var_os("AXLE_GGML_LOG").is_none() {
        return;
    }
    let _ = level;
    // SAFETY: ggml passes a valid NUL-terminated string for the duration of the call.
    let s = unsafe { CStr::from_ptr(text) };
    eprint!("{}", s.to_string_lossy());
}

/// Installs the quiet log callback for ggml and libllama (idempotent).
pub fn quiet_logs() {
    INIT.call_once(|| {
        // SAFETY: the callback is a plain function valid for the whole program; user data is unused.
        unsafe {
            sys::ggml_log_set(Some(log_callback), std::ptr::null_mut());
            sys::llama_log_set(Some(log_callback), std::ptr::null_mut());
        }
    });
}
