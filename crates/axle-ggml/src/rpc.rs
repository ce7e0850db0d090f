//! ggml's RPC backend: devices of other processes or machines, reached over TCP.
//!
//! The backend is a loadable library (`libggml-rpc.so`, built from the vendored ggml by
//! `scripts/build-backend.sh rpc`) that [`crate::load_dynamic_backends`] picks up beside the
//! other backends. Its two entry points come through ggml's registry by name, as llama.cpp gets
//! them: `ggml_backend_rpc_add_server` makes a server's devices ordinary ggml devices
//! ([`attach_server`]), `ggml_backend_rpc_start_server` serves this process's own devices to
//! others ([`serve`], what llama.cpp's `rpc-server` program does).
use crate::{Device, Error, Result};
use llama_cpp_sys_2 as sys;
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

/// `ggml_backend_rpc_add_server(endpoint) -> reg` (ggml-rpc.h).
type AddServerFn = unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t;
/// `ggml_backend_rpc_start_server(endpoint, cache_dir, n_threads, n_devices, devices)`.
type StartServerFn =
    unsafe extern "C" fn(*const c_char, *const c_char, usize, usize, *mut sys::ggml_backend_dev_t);

/// The RPC backend's registry entry, or a clear error saying how to get it.
fn rpc_registry() -> Result<sys::ggml_backend_reg_t> {
    crate::load_dynamic_backends();
    // SAFETY: a registry query by a NUL-terminated name; NULL when no such backend is loaded.
    let reg = unsafe { sys::ggml_backend_reg_by_name(c"RPC".as_ptr()) };
    if reg.is_null() {
        let dirs: Vec<String> = crate::backend_search_dirs()
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        return Err(Error::NoDevice(format!(
            "ggml's RPC backend is not loaded: build libggml-rpc.so with \
             `scripts/build-backend.sh rpc` (searched: {})",
            dirs.join(", ")
        )));
    }
    Ok(reg)
}

/// A function of the RPC backend by name.
fn rpc_function(name: &std::ffi::CStr) -> Result<*mut std::ffi::c_void> {
    let reg = rpc_registry()?;
    // SAFETY: a registered backend; NULL when it does not provide the name.
    let f = unsafe { sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr()) };
    if f.is_null() {
        return Err(Error::NoDevice(format!(
            "the loaded RPC backend has no {}",
            name.to_string_lossy()
        )));
    }
    Ok(f)
}

/// Devices attached so far, by endpoint (ggml registers a server's devices once per process).
static ATTACHED: Mutex<Option<HashMap<String, Vec<Device>>>> = Mutex::new(None);

/// Attaches the devices an RPC server (`host:port`) serves and returns them: they join ggml's
/// registry as `RPC0`, `RPC1`, ... (in attachment order) and take layers like local devices.
/// Attaching the same endpoint again returns the same devices.
pub fn attach_server(endpoint: &str) -> Result<Vec<Device>> {
    let mut attached = ATTACHED.lock().unwrap_or_else(|e| e.into_inner());
    let attached = attached.get_or_insert_with(HashMap::new);
    if let Some(devices) = attached.get(endpoint) {
        return Ok(devices.clone());
    }
    let f = rpc_function(c"ggml_backend_rpc_add_server")?;
    // ggml's client aborts the process when it cannot connect: check first, with a timeout.
    let unreachable = |why: String| Error::NoDevice(format!("RPC server {endpoint}: {why}"));
    let addrs: Vec<_> = endpoint
        .to_socket_addrs()
        .map_err(|e| unreachable(format!("not a host:port address ({e})")))?
        .collect();
    let reachable = addrs
        .iter()
        .any(|a| TcpStream::connect_timeout(a, Duration::from_secs(5)).is_ok());
    if !reachable {
        return Err(unreachable("nothing accepts connections there".into()));
    }
    // SAFETY: the RPC backend documents this symbol with the AddServerFn signature.
    let add: AddServerFn = unsafe { std::mem::transmute(f) };
    let c = CString::new(endpoint).map_err(|_| unreachable("contains a NUL byte".into()))?;
    // SAFETY: a valid C string; the result is checked for null (a server with no devices).
    let reg = unsafe { add(c.as_ptr()) };
    if reg.is_null() {
        return Err(unreachable("it serves no devices".into()));
    }
    // SAFETY: a fresh registry entry of the RPC backend, registered once (memoized above), so
    // that its devices are found by name like any other; device queries below its count.
    let devices = unsafe {
        sys::ggml_backend_register(reg);
        (0..sys::ggml_backend_reg_dev_count(reg))
            .map(|i| Device(sys::ggml_backend_reg_dev_get(reg, i)))
            .collect::<Vec<_>>()
    };
    attached.insert(endpoint.to_string(), devices.clone());
    Ok(devices)
}

/// Whether `device` is served over RPC (its arithmetic is whatever the server's device does).
pub fn is_remote(device: &Device) -> bool {
    // SAFETY: valid device; its registry and that registry's name are static.
    let name = unsafe {
        let reg = sys::ggml_backend_dev_backend_reg(device.0);
        if reg.is_null() {
            return false;
        }
        crate::backend::cstr(sys::ggml_backend_reg_name(reg))
    };
    name.starts_with("RPC")
}

/// Serves `devices` of this process over TCP at `endpoint` (`host:port`) until the process ends,
/// with `threads` CPU threads for a CPU device; `cache_dir` keeps large tensors sent before, so
/// that a client reloading a model sends only their hashes. Never returns unless it fails to
/// start.
pub fn serve(
    endpoint: &str,
    devices: &[Device],
    threads: usize,
    cache_dir: Option<&std::path::Path>,
) -> Result<()> {
    if devices.is_empty() {
        return Err(Error::NoDevice("no device to serve".into()));
    }
    let f = rpc_function(c"ggml_backend_rpc_start_server")?;
    // SAFETY: the RPC backend documents this symbol with the StartServerFn signature.
    let start: StartServerFn = unsafe { std::mem::transmute(f) };
    let bad = |what: &str| Error::NoDevice(format!("RPC server: {what} contains a NUL byte"));
    let c_endpoint = CString::new(endpoint).map_err(|_| bad("the endpoint"))?;
    let c_cache = cache_dir
        .map(|d| CString::new(d.as_os_str().to_string_lossy().as_bytes()))
        .transpose()
        .map_err(|_| bad("the cache folder"))?;
    let mut raws: Vec<sys::ggml_backend_dev_t> = devices.iter().map(|d| d.0).collect();
    // SAFETY: valid C strings (or NULL for no cache) and live registry devices that outlive the
    // call; the server runs its accept loop on this thread.
    unsafe {
        start(
            c_endpoint.as_ptr(),
            c_cache.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            threads.max(1),
            raws.len(),
            raws.as_mut_ptr(),
        )
    };
    Err(Error::NoDevice(format!(
        "the RPC server at {endpoint} stopped (is the port in use?)"
    )))
}
