//! Process-wide llama.cpp state: backend initialisation, the log filter and system info.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use llama_cpp_sys_2 as sys;

/// llama.cpp log level threshold: messages at or above it are printed to stderr.
/// `i32::MAX` = silent (the default). Set with `LLAMA_BRANCH_LOG=debug|info|warn|error` or
/// `setLogLevel()`.
static LOG_THRESHOLD: AtomicI32 = AtomicI32::new(i32::MAX);
/// Level of the previous message, for llama.cpp's CONT (continuation) level.
static LAST_LEVEL: AtomicI32 = AtomicI32::new(0);
static INIT: Once = Once::new();
/// While `capture_logs` runs: the error and warning lines llama.cpp logs (why a load failed).
static CAPTURED: Mutex<Option<String>> = Mutex::new(None);

/// The ggml log level named `name` (`i32::MAX` for "none"), or `None` for an unknown name.
pub fn parse_log_level(name: &str) -> Option<i32> {
    match name.to_ascii_lowercase().as_str() {
        "none" | "off" | "silent" | "" => Some(i32::MAX),
        "debug" => Some(sys::GGML_LOG_LEVEL_DEBUG as i32),
        "info" => Some(sys::GGML_LOG_LEVEL_INFO as i32),
        "warn" | "warning" => Some(sys::GGML_LOG_LEVEL_WARN as i32),
        "error" => Some(sys::GGML_LOG_LEVEL_ERROR as i32),
        _ => None,
    }
}

pub fn set_log_threshold(level: i32) {
    LOG_THRESHOLD.store(level, Ordering::Relaxed);
}

/// The current log threshold (a ggml log level; `i32::MAX` = silent).
pub fn log_threshold() -> i32 {
    LOG_THRESHOLD.load(Ordering::Relaxed)
}

/// The verbosity of llama.cpp's `common` logger (used by the chat layer) that matches the
/// current threshold: -1 silent, 1 error, 2 warn, 3 info, 5 debug.
pub fn common_log_verbosity() -> i32 {
    let level = log_threshold();
    if level <= sys::GGML_LOG_LEVEL_DEBUG as i32 {
        5
    } else if level <= sys::GGML_LOG_LEVEL_INFO as i32 {
        3
    } else if level <= sys::GGML_LOG_LEVEL_WARN as i32 {
        2
    } else if level <= sys::GGML_LOG_LEVEL_ERROR as i32 {
        1
    } else {
        -1
    }
}

unsafe extern "C" fn log_callback(level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    let mut level = level as i32;
    if level == sys::GGML_LOG_LEVEL_CONT as i32 {
        level = LAST_LEVEL.load(Ordering::Relaxed);
    } else {
        LAST_LEVEL.store(level, Ordering::Relaxed);
    }
    if level >= sys::GGML_LOG_LEVEL_WARN as i32 && !text.is_null() {
        if let Ok(mut captured) = CAPTURED.lock() {
            if let Some(lines) = captured.as_mut() {
                // SAFETY: as below, a NUL-terminated message that lives for this call.
                lines.push_str(&unsafe { CStr::from_ptr(text) }.to_string_lossy());
            }
        }
    }
    if level >= LOG_THRESHOLD.load(Ordering::Relaxed) && !text.is_null() {
        // SAFETY: llama.cpp passes a NUL-terminated message that lives for this call.
        eprint!("{}", unsafe { CStr::from_ptr(text) }.to_string_lossy());
    }
}

/// Runs `f` and returns what llama.cpp logged at warning level or above meanwhile (lines joined
/// by "; "), to say why a load failed. Captures are process-wide: one running at the same time on
/// another thread may add its lines too.
pub(super) fn capture_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    *CAPTURED.lock().unwrap_or_else(|e| e.into_inner()) = Some(String::new());
    let value = f();
    let logged = CAPTURED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .unwrap_or_default();
    (value, logged.trim().replace('\n', "; "))
}

/// Routes the multimodal library's log (tools/mtmd keeps its own logger) through the same filter
/// as llama.cpp's, once.
pub(super) fn init_mtmd_log() {
    static MTMD_LOG: Once = Once::new();
    MTMD_LOG.call_once(|| {
        // SAFETY: installs a plain function that only reads atomics, the capture buffer and the
        // message it is given; once per process, before the first projector is loaded.
        unsafe { sys::mtmd_helper_log_set(Some(log_callback), std::ptr::null_mut()) }
    });
}

/// Installs the log filter (before anything can log) and initialises the backend, once.
pub fn init_backend() {
    INIT.call_once(|| {
        if let Some(level) = std::env::var("LLAMA_BRANCH_LOG")
            .ok()
            .and_then(|v| parse_log_level(&v))
        {
            set_log_threshold(level);
        }
        // SAFETY: runs once per process, before any other llama.cpp call of ours; the callback
        // is a plain function that only reads atomics and the message it is given.
        unsafe {
            sys::llama_log_set(Some(log_callback), std::ptr::null_mut());
        }
        // With no backend registered, llama_backend_init() calls ggml_backend_load_all(), which
        // loads modules from the build machine's OUT_DIR, node's folder or the working
        // directory: never run code from there. The JS loader reports the 0 devices instead.
        if load_backend_modules() {
            // SAFETY: as above, once per process and before any other llama.cpp call of ours.
            unsafe { sys::llama_backend_init() };
        }
    });
}

/// Folder holding ggml's backend modules (`libggml-cpu-<variant>.so`, ...) in a
/// `dynamic-backends` build: the folder of the loaded .node, which the JS loader tells the addon
/// (`_setBackendDir`) before any llama.cpp call.
static BACKEND_DIR: OnceLock<String> = OnceLock::new();

/// Records where the backend modules are (the first call wins; a build without
/// `dynamic-backends` has its CPU backend compiled in and ignores it), initialises the backend
/// and returns the number of compute devices registered. 0 means no backend module loaded:
/// nothing can run, and the loader reports it.
pub fn init_backend_from_dir(dir: &str) -> usize {
    let _ = BACKEND_DIR.set(dir.to_owned());
    init_backend();
    // SAFETY: reads ggml's device registry, filled by init_backend() above on this thread.
    unsafe { sys::ggml_backend_dev_count() }
}

/// Loads the backend modules from `BACKEND_DIR`, each kind's best variant for this machine (the
/// CPU variants score themselves against the CPU's features), and says whether any registered.
/// `ggml_backend_load_all()` would search the build machine's OUT_DIR, node's own folder and the
/// working directory instead. Without a folder nothing loads.
#[cfg(feature = "dynamic-backends")]
fn load_backend_modules() -> bool {
    if let Some(dir) = BACKEND_DIR
        .get()
        .and_then(|d| std::ffi::CString::new(d.as_str()).ok())
    {
        // SAFETY: `dir` is a NUL-terminated path that outlives the call; ggml copies what it keeps.
        unsafe { sys::ggml_backend_load_all_from_path(dir.as_ptr()) };
    }
    // SAFETY: reads ggml's backend registry; no other thread registers backends.
    unsafe { sys::ggml_backend_reg_count() > 0 }
}

/// Loads one more backend module (a GPU backend shipped in its own package) into a
/// `dynamic-backends` build; returns the devices it registered, or why it did not load: the
/// dynamic loader's message (e.g. `libvulkan.so.1: cannot open shared object file`), or what ggml
/// logged while the module initialised (no driver, no device). Never aborts: a module that fails
/// is not registered.
#[cfg(all(feature = "dynamic-backends", unix))]
pub fn load_module(path: &str) -> std::result::Result<usize, String> {
    /// Each path's outcome: ggml's registry has no de-duplication, and every JS realm (a
    /// worker thread requiring the package) asks again.
    static LOADED: Mutex<Vec<(String, std::result::Result<usize, String>)>> =
        Mutex::new(Vec::new());
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, outcome)) = loaded.iter().find(|(p, _)| p == path) {
        return outcome.clone();
    }
    let outcome = load_module_once(path);
    loaded.push((path.to_owned(), outcome.clone()));
    outcome
}

#[cfg(all(feature = "dynamic-backends", unix))]
fn load_module_once(path: &str) -> std::result::Result<usize, String> {
    extern "C" {
        fn dlopen(file: *const c_char, mode: i32) -> *mut c_void;
        fn dlerror() -> *const c_char;
    }
    const RTLD_NOW: i32 = 2;
    init_backend();
    let file = std::ffi::CString::new(path)
        .map_err(|_| "the module path contains a NUL byte".to_string())?;
    // ggml's own loader only logs a dlopen failure; asking first gives the reason. The handle
    // stays open: a module that loads stays loaded for the process anyway (ggml keeps it).
    // SAFETY: `file` is a NUL-terminated path; dlopen runs the module's initialisers, which only
    // set up static state; dlerror returns the thread's last loader message.
    let handle = unsafe { dlopen(file.as_ptr(), RTLD_NOW) };
    if handle.is_null() {
        // SAFETY: dlerror's message is NUL-terminated and valid until the next loader call here.
        let message = unsafe { dlerror() };
        return Err(if message.is_null() {
            "the dynamic loader refused it without a message".to_string()
        } else {
            // SAFETY: non-null, NUL-terminated (see above).
            unsafe { CStr::from_ptr(message) }
                .to_string_lossy()
                .into_owned()
        });
    }
    // SAFETY: registers the module's backend in ggml's registry, once per path (`LOADED`, whose
    // lock is held); the loader calls this right after the addon loads, before a context exists
    // in this realm (a worker thread's realm finds the path in `LOADED` and registers nothing).
    let (reg, logged) = capture_logs(|| unsafe { sys::ggml_backend_load(file.as_ptr()) });
    if reg.is_null() {
        return Err(if logged.is_empty() {
            "it loaded, but its backend did not initialise (no driver? LLAMA_BRANCH_LOG=debug shows more)".to_string()
        } else {
            format!("it loaded, but its backend did not initialise: {logged}")
        });
    }
    // SAFETY: `reg` is the registration record ggml just returned; it lives for the process.
    Ok(unsafe { sys::ggml_backend_reg_dev_count(reg) })
}

#[cfg(not(all(feature = "dynamic-backends", unix)))]
pub fn load_module(_path: &str) -> std::result::Result<usize, String> {
    Err("this build has its backends compiled in; backend modules load only into a prebuilt (dynamic-backends) build".to_string())
}

/// A build without `dynamic-backends` has its backends compiled in and registered statically.
#[cfg(not(feature = "dynamic-backends"))]
fn load_backend_modules() -> bool {
    true
}

/// llama.cpp's description of the CPU features and backends compiled in.
pub fn system_info() -> String {
    init_backend();
    // SAFETY: llama.cpp rebuilds a static string and returns a pointer to it; the text is copied
    // before returning. Only the JS thread calls this, so two calls never race on that string.
    let info = unsafe {
        CStr::from_ptr(sys::llama_print_system_info())
            .to_string_lossy()
            .into_owned()
    };
    match cpu_variant() {
        Some(variant) => format!("{info}CPU_VARIANT = {variant} | "),
        None => info,
    }
}

/// The CPU backend variant ggml chose at run time ("haswell", "zen4", ...): the module that
/// holds the CPU backend's registration record, whose file is libggml-cpu-<variant>.so. None in
/// a build with the CPU backend compiled in (it targets the build machine's CPU).
#[cfg(all(feature = "dynamic-backends", unix))]
fn cpu_variant() -> Option<String> {
    #[repr(C)]
    struct DlInfo {
        fname: *const c_char,
        fbase: *mut c_void,
        sname: *const c_char,
        saddr: *mut c_void,
    }
    extern "C" {
        fn dladdr(addr: *const c_void, info: *mut DlInfo) -> i32;
    }
    // SAFETY: looks a name up in ggml's registry; the result is null or a registration record
    // that lives as long as its module stays loaded (for the process).
    let reg = unsafe { sys::ggml_backend_reg_by_name(c"CPU".as_ptr()) };
    if reg.is_null() {
        return None;
    }
    let mut info = DlInfo {
        fname: std::ptr::null(),
        fbase: std::ptr::null_mut(),
        sname: std::ptr::null(),
        saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and fills `info`, whose layout is Dl_info.
    if unsafe { dladdr(reg as *const c_void, &mut info) } == 0 || info.fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname points at the loader's NUL-terminated copy of the module's path.
    let path = unsafe { CStr::from_ptr(info.fname) }.to_string_lossy();
    let file = std::path::Path::new(&*path).file_stem()?.to_string_lossy();
    Some(
        file.strip_prefix("libggml-cpu-")
            .or_else(|| file.strip_prefix("ggml-cpu-"))
            .unwrap_or(&file)
            .to_string(),
    )
}

#[cfg(not(all(feature = "dynamic-backends", unix)))]
fn cpu_variant() -> Option<String> {
    None
}
