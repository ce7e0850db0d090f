//! Routes ggml's and libllama's log output: silent unless `AXLE_GGML_LOG` is set, so that a
//! malformed file gives the user our one-line error and not ggml's internal chatter.
use llama_cpp_sys_2 as sys;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Once;

static INIT: Once = Once::new();

thread_local! {
    /// The error lines ggml logged on this thread since [`take_errors`] was last called (the GGUF
    /// parser says there what it could not read).
    static ERRORS: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Most bytes of error text kept per thread.
const MAX_ERROR_TEXT: usize = 2048;

unsafe extern "C" fn log_callback(level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: ggml passes a valid NUL-terminated string for the duration of the call.
    let s = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if level == sys::GGML_LOG_LEVEL_ERROR {
        ERRORS.with(|e| {
            let mut e = e.borrow_mut();
            if e.len() < MAX_ERROR_TEXT {
                e.push_str(&s);
            }
        });
    }
    if crate::env::var_os("AXLE_GGML_LOG").is_some() {
        eprint!("{s}");
    }
}

/// The error text ggml logged on this thread since the last call, as one line (None if none).
pub fn take_errors() -> Option<String> {
    let text = ERRORS.with(|e| std::mem::take(&mut *e.borrow_mut()));
    let line = text
        .lines()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    (!line.is_empty()).then_some(line)
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
