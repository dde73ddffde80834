//! Process-wide llama.cpp state: backend initialisation, the log filter and system info.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

use llama_cpp_sys_2 as sys;

/// llama.cpp log level threshold: messages at or above it are printed to stderr.
/// `i32::MAX` = silent (the default). Set with `LLAMA_BRANCH_LOG=debug|info|warn|error` or
/// `setLogLevel()`.
static LOG_THRESHOLD: AtomicI32 = AtomicI32::new(i32::MAX);
/// Level of the previous message, for llama.cpp's CONT (continuation) level.
static LAST_LEVEL: AtomicI32 = AtomicI32::new(0);
static INIT: Once = Once::new();

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
    if level >= LOG_THRESHOLD.load(Ordering::Relaxed) && !text.is_null() {
        // SAFETY: llama.cpp passes a NUL-terminated message that lives for this call.
        eprint!("{}", unsafe { CStr::from_ptr(text) }.to_string_lossy());
    }
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
            sys::llama_backend_init();
        }
    });
}

/// llama.cpp's description of the CPU features and backends compiled in.
pub fn system_info() -> String {
    init_backend();
    // SAFETY: llama.cpp rebuilds a static string and returns a pointer to it; the text is copied
    // before returning. Only the JS thread calls this, so two calls never race on that string.
    unsafe {
        CStr::from_ptr(sys::llama_print_system_info())
            .to_string_lossy()
            .into_owned()
    }
}
