//! Backend devices: the local ones ggml registered (CPU, GPUs), llama.cpp's RPC backend (client
//! devices for remote servers, and the server), GGUF metadata read before a load, and the hook
//! that keeps ggml-rpc's abort on a dead server from ending the process.
//!
//! RPC functions are reached through ggml's backend registry (`ggml_backend_reg_by_name("RPC")`
//! and its proc addresses), never as direct symbols, so a build without the RPC backend still
//! links and reports `ERR_UNSUPPORTED`.

use std::ffi::{c_char, CStr, CString};
use std::sync::OnceLock;

use llama_cpp_sys_2 as sys;

use super::init_backend;
use crate::error::{Error, Result};

/// What kind of device a backend device is, as JS sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
    Rpc,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
            DeviceKind::Rpc => "rpc",
        }
    }
}

/// A ggml backend device. ggml owns every device for the life of the process (registered
/// devices and RPC client devices are never freed), so the pointer is valid forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device(sys::ggml_backend_dev_t);

// SAFETY: a device is an immutable, process-lifetime object; ggml's device queries (name,
// description, type, memory) may be called from any thread.
unsafe impl Send for Device {}
// SAFETY: see `Send`.
unsafe impl Sync for Device {}

pub struct DeviceInfo {
    pub name: String,
    pub description: String,
    pub kind: DeviceKind,
    pub memory_free: u64,
    pub memory_total: u64,
}

fn owned(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns NUL-terminated strings owned by the device, alive for the process.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Device {
    pub(super) fn as_ptr(self) -> sys::ggml_backend_dev_t {
        self.0
    }

    pub fn name(self) -> String {
        // SAFETY: a live device (see `Device`).
        owned(unsafe { sys::ggml_backend_dev_name(self.0) })
    }

    pub fn description(self) -> String {
        // SAFETY: a live device (see `Device`).
        owned(unsafe { sys::ggml_backend_dev_description(self.0) })
    }

    fn is_rpc(self) -> bool {
        // SAFETY: a live device; its registry lives for the process; names are NUL-terminated.
        let reg = unsafe { sys::ggml_backend_dev_backend_reg(self.0) };
        !reg.is_null() && owned(unsafe { sys::ggml_backend_reg_name(reg) }) == "RPC"
    }

    pub fn kind(self) -> DeviceKind {
        if self.is_rpc() {
            return DeviceKind::Rpc;
        }
        // SAFETY: a live device (see `Device`).
        match unsafe { sys::ggml_backend_dev_type(self.0) } {
            sys::GGML_BACKEND_DEVICE_TYPE_CPU | sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => {
                DeviceKind::Cpu
            }
            _ => DeviceKind::Gpu,
        }
    }

    /// Name, kind and memory. For an RPC device the memory query is a round trip to its server
    /// (which must have been probed: ggml-rpc aborts on a dead connection, see `install_abort_hook`).
    pub fn info(self) -> DeviceInfo {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: a live device; both out-pointers are valid for the call.
        unsafe { sys::ggml_backend_dev_memory(self.0, &mut free, &mut total) };
        DeviceInfo {
            name: self.name(),
            description: self.description(),
            kind: self.kind(),
            memory_free: free as u64,
            memory_total: total as u64,
        }
    }
}

/// The devices ggml registered in this process (CPU first, then GPUs; RPC servers are not
/// registered globally, see `rpc_add_server`).
pub fn local_devices() -> Vec<Device> {
    init_backend();
    // SAFETY: plain registry queries; index < count.
    let n = unsafe { sys::ggml_backend_dev_count() };
    (0..n)
        .map(|i| Device(unsafe { sys::ggml_backend_dev_get(i) }))
        .filter(|d| !d.0.is_null())
        .collect()
}

/// ggml's RPC registry, when the build has the RPC backend.
fn rpc_reg() -> Option<sys::ggml_backend_reg_t> {
    init_backend();
    // SAFETY: a registry lookup by a NUL-terminated name; null when absent.
    let reg = unsafe { sys::ggml_backend_reg_by_name(c"RPC".as_ptr()) };
    (!reg.is_null()).then_some(reg)
}

fn rpc_proc(name: &CStr) -> Result<*mut std::ffi::c_void> {
    let reg = rpc_reg().ok_or_else(|| {
        Error::Unsupported(
            "this build of llama-branch has no RPC backend (rebuild with `npm run build`)".into(),
        )
    })?;
    // SAFETY: `reg` is a live registry; the name is NUL-terminated.
    let f = unsafe { sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr()) };
    if f.is_null() {
        return Err(Error::Unsupported(format!(
            "the RPC backend does not export {}",
            name.to_string_lossy()
        )));
    }
    Ok(f)
}

type AddServerFn = unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t;
type StartServerFn =
    unsafe extern "C" fn(*const c_char, *const c_char, usize, usize, *mut sys::ggml_backend_dev_t);

/// The devices of the RPC server at `endpoint` ("host:port"). ggml-rpc connects (once per
/// endpoint per process) and ABORTS THE PROCESS on a malformed endpoint or one that does not
/// answer: callers must have parsed the endpoint and probed the server first.
pub fn rpc_add_server(endpoint: &str) -> Result<Vec<Device>> {
    let f = rpc_proc(c"ggml_backend_rpc_add_server")?;
    // SAFETY: the registry returned this address for this exact name, whose signature is
    // `ggml_backend_reg_t (const char *)` (ggml-rpc.h).
    let add: AddServerFn = unsafe { std::mem::transmute::<*mut std::ffi::c_void, AddServerFn>(f) };
    let c = CString::new(endpoint).map_err(|_| Error::invalid("endpoint contains a NUL byte"))?;
    // SAFETY: `c` is NUL-terminated and outlives the call (ggml copies it).
    let reg = unsafe { add(c.as_ptr()) };
    if reg.is_null() {
        return Err(Error::RpcUnreachable(format!(
            "{endpoint} answered but reports no devices"
        )));
    }
    // SAFETY: `reg` is a live registry (never freed); index < count.
    let n = unsafe { sys::ggml_backend_reg_dev_count(reg) };
    Ok((0..n)
        .map(|i| Device(unsafe { sys::ggml_backend_reg_dev_get(reg, i) }))
        .filter(|d| !d.0.is_null())
        .collect())
}

/// Whether this build can serve and use RPC.
pub fn rpc_available() -> bool {
    rpc_reg().is_some()
}

/// Runs llama.cpp's RPC server on `devices`, on the calling thread. Blocks for as long as the
/// server runs (forever, unless it cannot bind or accept); returns when it stops.
pub fn rpc_start_server(
    endpoint: &str,
    cache_dir: Option<&str>,
    n_threads: usize,
    devices: &[Device],
) -> Result<()> {
    let f = rpc_proc(c"ggml_backend_rpc_start_server")?;
    // SAFETY: the registry returned this address for this exact name, whose signature is
    // `void (const char *, const char *, size_t, size_t, ggml_backend_dev_t *)` (ggml-rpc.h).
    let start: StartServerFn =
        unsafe { std::mem::transmute::<*mut std::ffi::c_void, StartServerFn>(f) };
    let c_endpoint =
        CString::new(endpoint).map_err(|_| Error::invalid("host contains a NUL byte"))?;
    let c_cache = cache_dir
        .map(CString::new)
        .transpose()
        .map_err(|_| Error::invalid("cacheDir contains a NUL byte"))?;
    let mut devs: Vec<sys::ggml_backend_dev_t> = devices.iter().map(|d| d.0).collect();
    if devs.is_empty() {
        return Err(Error::Device("no local device to serve".into()));
    }
    // SAFETY: every pointer is valid for the call's whole duration (this frame outlives it);
    // `devs` holds `devs.len()` live devices.
    unsafe {
        start(
            c_endpoint.as_ptr(),
            c_cache.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            n_threads,
            devs.len(),
            devs.as_mut_ptr(),
        )
    };
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// ggml's abort hook.

/// Called (once per failure) with ggml's message when an RPC connection fails.
static ON_RPC_ABORT: OnceLock<fn(String)> = OnceLock::new();

/// Messages of the GGML_ABORTs ggml-rpc raises for a connection (ggml-rpc.cpp): a server that
/// died or answered garbage, a failed connect or handshake.
fn is_rpc_abort(message: &str) -> bool {
    message.contains("ggml-rpc")
        || message.contains("RPC server")
        || message.contains("RPC handshake")
        || message.contains("Failed to connect to")
}

unsafe extern "C" fn abort_hook(message: *const c_char) {
    let message = owned(message);
    if is_rpc_abort(&message) {
        if let Some(notify) = ON_RPC_ABORT.get() {
            notify(message);
            // ggml calls abort() when this returns. This thread (ggml-rpc's dispatcher for the
            // dead endpoint, or a thread waiting for its handshake) never returns instead: it
            // is parked for the rest of the process, and whatever it held is leaked.
            loop {
                std::thread::park();
            }
        }
    }
    // Any other abort proceeds as ggml's default would, message first.
    eprintln!("{message}");
}

/// Installs the abort hook once; `notify` learns of each RPC failure (on the failing thread,
/// which is then parked forever).
pub fn install_abort_hook(notify: fn(String)) {
    if ON_RPC_ABORT.set(notify).is_ok() {
        // SAFETY: the hook is a plain function that outlives every ggml call.
        unsafe { sys::ggml_set_abort_callback(Some(abort_hook)) };
    }
}

// ---------------------------------------------------------------------------------------------
// GGUF metadata, read before a load.

/// The model's layer count (`<arch>.block_count`) from the GGUF header, without loading tensors.
pub fn gguf_block_count(path: &str) -> Option<u32> {
    init_backend();
    let c_path = CString::new(path).ok()?;
    let params = sys::gguf_init_params {
        no_alloc: true,
        ctx: std::ptr::null_mut(),
    };
    // SAFETY: a NUL-terminated path; no tensor data is allocated; null on failure.
    let ctx = unsafe { sys::gguf_init_from_file(c_path.as_ptr(), params) };
    if ctx.is_null() {
        return None;
    }
    let read_u32 = |key: &str| -> Option<u32> {
        let c_key = CString::new(key).ok()?;
        // SAFETY: `ctx` is live until `gguf_free` below; the key is NUL-terminated.
        let id = unsafe { sys::gguf_find_key(ctx, c_key.as_ptr()) };
        // SAFETY: `id` is a valid key index; the type is checked before the typed read, which
        // would otherwise abort.
        (id >= 0 && unsafe { sys::gguf_get_kv_type(ctx, id) } == sys::GGUF_TYPE_UINT32)
            .then(|| unsafe { sys::gguf_get_val_u32(ctx, id) })
    };
    let arch = {
        // SAFETY: as above; the string is read only after its type is checked.
        let id = unsafe { sys::gguf_find_key(ctx, c"general.architecture".as_ptr()) };
        (id >= 0 && unsafe { sys::gguf_get_kv_type(ctx, id) } == sys::GGUF_TYPE_STRING)
            .then(|| owned(unsafe { sys::gguf_get_val_str(ctx, id) }))
    };
    let n = arch.and_then(|a| read_u32(&format!("{a}.block_count")));
    // SAFETY: `ctx` is live and freed once.
    unsafe { sys::gguf_free(ctx) };
    n
}
