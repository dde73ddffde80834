//! The only place that talks to llama.cpp directly: small RAII wrappers over the raw pointers.
//! Everything above this module is safe Rust. Wrappers validate what llama.cpp would otherwise
//! abort on (indices, missing logits rows) and turn failures into `Error`s.

use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};
use std::sync::{Arc, Once, OnceLock};

use llama_cpp_sys_2 as sys;

use crate::error::{Error, Result};
use crate::leases::SeqId;

pub type Token = i32;
pub type Pos = i32;

// ---------------------------------------------------------------------------------------------
// Process-wide init and logging

/// llama.cpp log level threshold: messages at or above it are printed to stderr.
/// 0 = silent (default). Set with `LLAMA_BRANCH_LOG=debug|info|warn|error` or `setLogLevel()`.
static LOG_THRESHOLD: AtomicI32 = AtomicI32::new(i32::MAX);
/// Level of the previous message, for llama.cpp's CONT (continuation) level.
static LAST_LEVEL: AtomicI32 = AtomicI32::new(0);
static INIT: Once = Once::new();

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

unsafe extern "C" fn log_callback(level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    let mut level = level as i32;
    if level == sys::GGML_LOG_LEVEL_CONT as i32 {
        level = LAST_LEVEL.load(Ordering::Relaxed);
    } else {
        LAST_LEVEL.store(level, Ordering::Relaxed);
    }
    if level >= LOG_THRESHOLD.load(Ordering::Relaxed) && !text.is_null() {
        eprint!("{}", CStr::from_ptr(text).to_string_lossy());
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
        unsafe {
            sys::llama_log_set(Some(log_callback), std::ptr::null_mut());
            #[cfg(feature = "dynamic-backends")]
            let loaded = load_backend_modules();
            #[cfg(not(feature = "dynamic-backends"))]
            let loaded = true;
            // With no backend registered, llama_backend_init() calls ggml_backend_load_all(),
            // which loads modules from the build machine's OUT_DIR, node's folder or the working
            // directory: never run code from there. The loader reports the 0 devices instead.
            if loaded {
                sys::llama_backend_init();
            }
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
    unsafe { sys::ggml_backend_dev_count() }
}

/// Loads the backend modules from `BACKEND_DIR`, each kind's best variant for this machine (the
/// CPU variants score themselves against the CPU's features), and says whether any registered.
/// `ggml_backend_load_all()` would search the build machine's OUT_DIR, node's own folder and the
/// working directory instead. Without a folder nothing loads.
#[cfg(feature = "dynamic-backends")]
unsafe fn load_backend_modules() -> bool {
    if let Some(dir) = BACKEND_DIR
        .get()
        .and_then(|d| CString::new(d.as_str()).ok())
    {
        sys::ggml_backend_load_all_from_path(dir.as_ptr());
    }
    sys::ggml_backend_reg_count() > 0
}

pub fn system_info() -> String {
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
    if unsafe { dladdr(reg as *const c_void, &mut info) } == 0 || info.fname.is_null() {
        return None;
    }
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

// ---------------------------------------------------------------------------------------------
// Model

pub struct Model {
    ptr: NonNull<sys::llama_model>,
    vocab: *const sys::llama_vocab,
    pub n_vocab: i32,
}

// The model is immutable after load; llama.cpp documents tokenization as thread-safe and
// contexts only read the weights.
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

impl Model {
    pub fn load(path: &str, use_mmap: bool, n_gpu_layers: i32) -> Result<Model> {
        init_backend();
        let c_path = CString::new(path)
            .map_err(|_| Error::invalid("modelPath must not contain NUL bytes"))?;
        let mut params = unsafe { sys::llama_model_default_params() };
        params.load_mode = if use_mmap {
            sys::LLAMA_LOAD_MODE_MMAP
        } else {
            sys::LLAMA_LOAD_MODE_NONE
        };
        params.n_gpu_layers = n_gpu_layers;
        let ptr = unsafe { sys::llama_model_load_from_file(c_path.as_ptr(), params) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::ModelLoad(path.to_string()))?;
        let vocab = unsafe { sys::llama_model_get_vocab(ptr.as_ptr()) };
        let n_vocab = unsafe { sys::llama_vocab_n_tokens(vocab) };
        Ok(Model {
            ptr,
            vocab,
            n_vocab,
        })
    }

    pub fn as_ptr(&self) -> *mut sys::llama_model {
        self.ptr.as_ptr()
    }

    pub fn vocab(&self) -> *const sys::llama_vocab {
        self.vocab
    }

    pub fn check_token(&self, token: i64) -> Result<Token> {
        if token < 0 || token >= self.n_vocab as i64 {
            return Err(Error::TokenOutOfRange {
                token,
                n_vocab: self.n_vocab,
            });
        }
        Ok(token as Token)
    }

    pub fn check_tokens(&self, tokens: &[i64]) -> Result<Vec<Token>> {
        tokens.iter().map(|&t| self.check_token(t)).collect()
    }

    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<Token>> {
        let len = i32::try_from(text.len())
            .map_err(|_| Error::Tokenize("text is too long to tokenize (over 2 GiB)".into()))?;
        let run = |out: &mut Vec<Token>| unsafe {
            sys::llama_tokenize(
                self.vocab,
                text.as_ptr().cast(),
                len,
                out.as_mut_ptr(),
                out.len() as i32,
                add_special,
                parse_special,
            )
        };
        let mut out = vec![0 as Token; text.len() + 2];
        let mut n = run(&mut out);
        if n < 0 {
            // Negative = the number of tokens needed.
            out.resize((-n) as usize, 0);
            n = run(&mut out);
        }
        if n < 0 {
            return Err(Error::Tokenize(format!("llama_tokenize failed ({n})")));
        }
        out.truncate(n as usize);
        Ok(out)
    }

    /// Raw bytes of one token's piece (may be a partial UTF-8 sequence).
    pub fn token_bytes(&self, token: Token, special: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        loop {
            let n = unsafe {
                sys::llama_token_to_piece(
                    self.vocab,
                    token,
                    buf.as_mut_ptr().cast(),
                    buf.len() as i32,
                    0,
                    special,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize((-n) as usize, 0);
        }
    }

    pub fn token_to_text(&self, token: Token) -> String {
        String::from_utf8_lossy(&self.token_bytes(token, true)).into_owned()
    }

    pub fn detokenize(&self, tokens: &[Token]) -> String {
        if tokens.is_empty() {
            return String::new();
        }
        let mut buf = vec![0u8; tokens.len() * 8 + 16];
        loop {
            let n = unsafe {
                sys::llama_detokenize(
                    self.vocab,
                    tokens.as_ptr(),
                    tokens.len() as i32,
                    buf.as_mut_ptr().cast(),
                    buf.len() as i32,
                    false,
                    true,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return String::from_utf8_lossy(&buf).into_owned();
            }
            buf.resize((-n) as usize, 0);
        }
    }

    pub fn is_eog(&self, token: Token) -> bool {
        token >= 0 && token < self.n_vocab && unsafe { sys::llama_vocab_is_eog(self.vocab, token) }
    }

    /// End-of-turn token, falling back to end-of-sequence.
    pub fn eog_token(&self) -> Option<Token> {
        let eot = unsafe { sys::llama_vocab_eot(self.vocab) };
        if eot >= 0 {
            return Some(eot);
        }
        let eos = unsafe { sys::llama_vocab_eos(self.vocab) };
        (eos >= 0).then_some(eos)
    }

    pub fn bos_token(&self) -> Option<Token> {
        let bos = unsafe { sys::llama_vocab_bos(self.vocab) };
        (bos >= 0).then_some(bos)
    }

    pub fn size_bytes(&self) -> u64 {
        unsafe { sys::llama_model_size(self.ptr.as_ptr()) }
    }

    pub fn n_embd(&self) -> i32 {
        unsafe { sys::llama_model_n_embd(self.ptr.as_ptr()) }
    }

    pub fn description(&self) -> String {
        let mut buf = vec![0u8; 256];
        let n =
            unsafe { sys::llama_model_desc(self.ptr.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        buf.truncate(n.max(0) as usize);
        String::from_utf8_lossy(&buf).into_owned()
    }

    pub fn chat_template(&self) -> Option<String> {
        let p = unsafe { sys::llama_model_chat_template(self.ptr.as_ptr(), std::ptr::null()) };
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p).to_string_lossy().into_owned() })
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) }
    }
}

// ---------------------------------------------------------------------------------------------
// Context

pub struct ContextConfig {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_seq_max: u32,
    pub n_threads: i32,
    pub embeddings: bool,
    pub pooling_type: i32,
    pub n_outputs_max: u32,
}

pub struct Context {
    ptr: NonNull<sys::llama_context>,
    /// Keeps the weights alive for as long as the context uses them.
    pub model: Arc<Model>,
    /// Polled by ggml between graph nodes: the cancellation flag of the job now running.
    abort_slot: Box<AbortSlot>,
    /// Keeps the flag `abort_slot` points to alive while it is installed.
    cancel_flag: Option<Arc<AtomicBool>>,
}

// A context is used by one thread at a time: the session's mutex guarantees it.
unsafe impl Send for Context {}

/// Where the abort callback finds the running job's cancellation flag (null: not cancellable).
/// A pointer rather than one per-context flag, so cancelling a queued job can never stop the job
/// running before it.
#[derive(Default)]
struct AbortSlot {
    flag: AtomicPtr<AtomicBool>,
}

unsafe extern "C" fn abort_callback(data: *mut c_void) -> bool {
    let flag = (*(data as *const AbortSlot)).flag.load(Ordering::Acquire);
    !flag.is_null() && (*flag).load(Ordering::Acquire)
}

impl Context {
    pub fn new(model: Arc<Model>, cfg: &ContextConfig) -> Result<Context> {
        let mut p = unsafe { sys::llama_context_default_params() };
        p.n_ctx = cfg.n_ctx;
        p.n_batch = cfg.n_batch;
        p.n_ubatch = cfg.n_batch;
        p.n_seq_max = cfg.n_seq_max;
        p.n_threads = cfg.n_threads;
        p.n_threads_batch = cfg.n_threads;
        p.embeddings = cfg.embeddings;
        p.pooling_type = cfg.pooling_type;
        // One shared cell pool: fork is a metadata-only seq_cp and every branch may use all of n_ctx.
        p.kv_unified = true;
        p.n_outputs_max = cfg.n_outputs_max;
        p.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_AUTO;
        p.no_perf = true;
        let abort_slot = Box::<AbortSlot>::default();
        p.abort_callback = Some(abort_callback);
        p.abort_callback_data = (&*abort_slot as *const AbortSlot) as *mut c_void;
        let ptr = unsafe { sys::llama_init_from_model(model.as_ptr(), p) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            Error::ContextCreate("llama_init_from_model returned null (out of memory, or nCtx/nBatch too large for this model)".into())
        })?;
        Ok(Context {
            ptr,
            model,
            abort_slot,
            cancel_flag: None,
        })
    }

    /// While `flag` is installed, setting it to true stops the running `llama_decode` at the next
    /// graph node (it then returns 2 and `decode` reports `Aborted`). `None` uninstalls it.
    pub fn set_cancel_flag(&mut self, flag: Option<Arc<AtomicBool>>) {
        let ptr = flag
            .as_ref()
            .map_or(std::ptr::null_mut(), |f| Arc::as_ptr(f) as *mut AtomicBool);
        self.abort_slot.flag.store(ptr, Ordering::Release);
        // Replaced only after the slot points elsewhere, so the callback never reads a freed flag.
        self.cancel_flag = flag;
    }

    pub fn n_ctx(&self) -> u32 {
        unsafe { sys::llama_n_ctx(self.ptr.as_ptr()) }
    }

    pub fn n_batch(&self) -> u32 {
        unsafe { sys::llama_n_batch(self.ptr.as_ptr()) }
    }

    pub fn n_seq_max(&self) -> u32 {
        unsafe { sys::llama_n_seq_max(self.ptr.as_ptr()) }
    }

    pub fn n_vocab(&self) -> i32 {
        self.model.n_vocab
    }

    fn memory(&self) -> sys::llama_memory_t {
        unsafe { sys::llama_get_memory(self.ptr.as_ptr()) }
    }

    /// Highest position stored for `seq`, or -1 when it holds no cells.
    pub fn seq_pos_max(&self, seq: SeqId) -> Pos {
        unsafe { sys::llama_memory_seq_pos_max(self.memory(), seq) }
    }

    pub fn seq_pos_min(&self, seq: SeqId) -> Pos {
        unsafe { sys::llama_memory_seq_pos_min(self.memory(), seq) }
    }

    /// Removes positions `[p0, p1)` of `seq` (p1 < 0 = to the end). Returns false when llama.cpp
    /// cannot remove a partial range (e.g. beyond an SWA window).
    pub fn seq_rm(&self, seq: SeqId, p0: Pos, p1: Pos) -> bool {
        unsafe { sys::llama_memory_seq_rm(self.memory(), seq, p0, p1) }
    }

    pub fn seq_cp(&self, src: SeqId, dst: SeqId, p0: Pos, p1: Pos) {
        unsafe { sys::llama_memory_seq_cp(self.memory(), src, dst, p0, p1) }
    }

    pub fn seq_keep(&self, seq: SeqId) {
        unsafe { sys::llama_memory_seq_keep(self.memory(), seq) }
    }

    pub fn clear_memory(&self) {
        unsafe { sys::llama_memory_clear(self.memory(), true) }
    }

    /// Runs one `llama_decode` over `batch`. The caller has already checked sizes, seq ids and
    /// positions; this returns llama.cpp's code mapped to an error.
    pub fn decode(&mut self, batch: &mut Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        if batch.len() > self.n_batch() as usize {
            return Err(Error::Internal(format!(
                "batch of {} tokens exceeds n_batch {}",
                batch.len(),
                self.n_batch()
            )));
        }
        let raw = batch.as_raw();
        let rc = unsafe { sys::llama_decode(self.ptr.as_ptr(), raw) };
        match rc {
            0 => Ok(()),
            1 => Err(Error::KvFull(format!(
                "no free KV slot for {} tokens in a {}-cell cache",
                batch.len(),
                self.n_ctx()
            ))),
            // Only our abort callback makes llama.cpp return 2. It has already removed the
            // aborted ubatch's cells; callers remove those of earlier decodes of the same call.
            2 => Err(Error::Aborted),
            _ => Err(Error::Decode {
                code: rc,
                what: decode_code_meaning(rc).into(),
            }),
        }
    }

    /// The logits row for batch index `i` of the last decode, or `NoLogits` if that index did not
    /// request logits (llama.cpp would return null or abort in debug builds).
    pub fn logits_at(&self, i: i32) -> Result<&[f32]> {
        let p = unsafe { sys::llama_get_logits_ith(self.ptr.as_ptr(), i) };
        if p.is_null() {
            return Err(Error::NoLogits);
        }
        Ok(unsafe { std::slice::from_raw_parts(p, self.n_vocab() as usize) })
    }

    pub fn as_ptr(&self) -> *mut sys::llama_context {
        self.ptr.as_ptr()
    }

    /// Threads llama.cpp uses for single-token decodes (also how wide our per-branch work goes).
    pub fn n_threads(&self) -> usize {
        unsafe { sys::llama_n_threads(self.ptr.as_ptr()) }.max(1) as usize
    }
}

fn decode_code_meaning(rc: i32) -> &'static str {
    match rc {
        2 => "aborted",
        -1 => "invalid batch (positions or sequence ids inconsistent with the KV cache)",
        _ => "fatal error inside llama.cpp",
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        unsafe { sys::llama_free(self.ptr.as_ptr()) }
    }
}

// ---------------------------------------------------------------------------------------------
// Batch

/// Owned parallel arrays behind a `llama_batch` view. Each token belongs to exactly one sequence.
#[derive(Default)]
pub struct Batch {
    tokens: Vec<Token>,
    positions: Vec<Pos>,
    n_seq_id: Vec<i32>,
    seq_ids: Vec<SeqId>,
    seq_id_ptrs: Vec<*mut SeqId>,
    logits: Vec<i8>,
}

unsafe impl Send for Batch {}

impl Batch {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.n_seq_id.clear();
        self.seq_ids.clear();
        self.logits.clear();
    }

    pub fn push(&mut self, token: Token, pos: Pos, seq: SeqId, want_logits: bool) {
        self.tokens.push(token);
        self.positions.push(pos);
        self.n_seq_id.push(1);
        self.seq_ids.push(seq);
        self.logits.push(want_logits as i8);
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The pointer table is rebuilt here, after all pushes, so no reallocation can dangle it.
    fn as_raw(&mut self) -> sys::llama_batch {
        self.seq_id_ptrs.clear();
        let base = self.seq_ids.as_mut_ptr();
        self.seq_id_ptrs
            .extend((0..self.seq_ids.len()).map(|i| unsafe { base.add(i) }));
        sys::llama_batch {
            n_tokens: self.tokens.len() as i32,
            token: self.tokens.as_mut_ptr(),
            embd: std::ptr::null_mut(),
            pos: self.positions.as_mut_ptr(),
            n_seq_id: self.n_seq_id.as_mut_ptr(),
            seq_id: self.seq_id_ptrs.as_mut_ptr(),
            logits: self.logits.as_mut_ptr(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Samplers

/// An owned `llama_sampler` (a chain, a grammar, or one stage).
pub struct Sampler {
    ptr: NonNull<sys::llama_sampler>,
}

unsafe impl Send for Sampler {}

pub type TokenData = sys::llama_token_data;

impl Sampler {
    /// Takes ownership of a pointer returned by a `llama_sampler_init_*` function.
    pub fn from_raw(ptr: *mut sys::llama_sampler, what: &str) -> Result<Sampler> {
        NonNull::new(ptr).map(|ptr| Sampler { ptr }).ok_or_else(|| {
            Error::Internal(format!("llama.cpp failed to create the {what} sampler"))
        })
    }

    pub fn new_chain() -> Sampler {
        let mut params = unsafe { sys::llama_sampler_chain_default_params() };
        params.no_perf = true;
        let ptr = unsafe { sys::llama_sampler_chain_init(params) };
        Sampler {
            ptr: NonNull::new(ptr).expect("llama_sampler_chain_init returned null"),
        }
    }

    /// Appends a stage to this chain; the chain takes ownership of it.
    pub fn chain_push(&mut self, stage: Sampler) {
        let raw = stage.ptr.as_ptr();
        std::mem::forget(stage);
        unsafe { sys::llama_sampler_chain_add(self.ptr.as_ptr(), raw) }
    }

    pub fn chain_len(&self) -> i32 {
        unsafe { sys::llama_sampler_chain_n(self.ptr.as_ptr()) }
    }

    /// Replaces stage `i` of this chain with `stage` (used to reseed the terminal sampler).
    pub fn chain_replace_last(&mut self, stage: Sampler) {
        let n = self.chain_len();
        if n > 0 {
            let removed = unsafe { sys::llama_sampler_chain_remove(self.ptr.as_ptr(), n - 1) };
            if !removed.is_null() {
                unsafe { sys::llama_sampler_free(removed) };
            }
        }
        self.chain_push(stage);
    }

    pub fn try_clone(&self) -> Result<Sampler> {
        let ptr = unsafe { sys::llama_sampler_clone(self.ptr.as_ptr()) };
        Sampler::from_raw(ptr, "cloned")
    }

    /// Applies this sampler to the candidates in place; returns the selected index if it picked one.
    pub fn apply(&mut self, candidates: &mut [TokenData], sorted: bool) -> Candidates {
        let mut arr = sys::llama_token_data_array {
            data: candidates.as_mut_ptr(),
            size: candidates.len(),
            selected: -1,
            sorted,
        };
        unsafe { sys::llama_sampler_apply(self.ptr.as_ptr(), &mut arr) };
        Candidates {
            size: arr.size,
            selected: arr.selected,
            sorted: arr.sorted,
        }
    }

    /// Accepts a token, catching any C++ exception llama.cpp throws (a grammar that rejects it).
    pub fn accept(&mut self, token: Token) -> Result<()> {
        let status = unsafe { sys::llama_rs_sampler_accept(self.ptr.as_ptr(), token) };
        if status == sys::LLAMA_RS_STATUS_OK {
            Ok(())
        } else {
            Err(Error::GrammarRejected(token))
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        unsafe { sys::llama_sampler_free(self.ptr.as_ptr()) }
    }
}

/// What a sampler left in the candidate array: the first `size` entries are live.
#[derive(Debug, Clone, Copy)]
pub struct Candidates {
    pub size: usize,
    pub selected: i64,
    pub sorted: bool,
}

pub fn to_cstrings(items: &[String], what: &str) -> Result<Vec<CString>> {
    items
        .iter()
        .map(|s| {
            CString::new(s.as_str())
                .map_err(|_| Error::invalid(format!("{what} must not contain NUL bytes")))
        })
        .collect()
}

/// GBNF grammar sampler; `None` + error text when the grammar does not parse.
pub fn grammar_sampler(
    model: &Model,
    gbnf: &str,
    root: &str,
    lazy: Option<(&[String], &[Token])>,
) -> Result<Sampler> {
    let c_gbnf = CString::new(gbnf)
        .map_err(|_| Error::Grammar("grammar must not contain NUL bytes".into()))?;
    let c_root = CString::new(root)
        .map_err(|_| Error::Grammar("root rule name must not contain NUL bytes".into()))?;
    let ptr = match lazy {
        None => unsafe {
            sys::llama_rs_sampler_init_grammar(model.vocab(), c_gbnf.as_ptr(), c_root.as_ptr())
        },
        Some((patterns, tokens)) => {
            let c_patterns = to_cstrings(patterns, "trigger patterns")?;
            let mut pattern_ptrs: Vec<*const c_char> =
                c_patterns.iter().map(|c| c.as_ptr()).collect();
            unsafe {
                sys::llama_rs_sampler_init_grammar_lazy_patterns(
                    model.vocab(),
                    c_gbnf.as_ptr(),
                    c_root.as_ptr(),
                    pattern_ptrs.as_mut_ptr(),
                    pattern_ptrs.len(),
                    tokens.as_ptr(),
                    tokens.len(),
                )
            }
        }
    };
    NonNull::new(ptr)
        .map(|ptr| Sampler { ptr })
        .ok_or_else(|| Error::Grammar("the GBNF grammar (or a lazy trigger pattern) failed to parse; enable logging with LLAMA_BRANCH_LOG=error for the parser's message".into()))
}

pub fn json_schema_to_grammar(schema: &str) -> Result<String> {
    let c_schema = CString::new(schema)
        .map_err(|_| Error::Grammar("schema must not contain NUL bytes".into()))?;
    let mut out: *mut c_char = std::ptr::null_mut();
    let status =
        unsafe { sys::llama_rs_json_schema_to_grammar(c_schema.as_ptr(), false, &mut out) };
    if status != sys::LLAMA_RS_STATUS_OK || out.is_null() {
        return Err(Error::Grammar(
            "the JSON schema could not be parsed or converted to a grammar".into(),
        ));
    }
    let grammar = unsafe { CStr::from_ptr(out).to_string_lossy().into_owned() };
    unsafe { sys::llama_rs_string_free(out) };
    if grammar.trim().is_empty() {
        return Err(Error::Grammar(
            "the JSON schema produced an empty grammar".into(),
        ));
    }
    Ok(grammar)
}

// ---------------------------------------------------------------------------------------------
// Raw logits access and per-sequence state (save/load of one sequence's KV cells)

/// First bytes of every buffer `llama_state_seq_get_data` writes (llama.cpp's `io_magic`).
pub const SEQ_STATE_MAGIC: u32 = 0xaf14_3cd8;
/// Header of llama.cpp's sequence state files (`llama_state_seq_save_file`): magic 'ggsq' and
/// format version (llama.h's `LLAMA_STATE_SEQ_MAGIC` / `LLAMA_STATE_SEQ_VERSION`, which bindgen
/// does not export). The file is this header, a token count, the tokens, then the state bytes
/// of `llama_state_seq_get_data` without its 8-byte (magic, seq id) prefix.
pub const SEQ_FILE_MAGIC: u32 = 0x6767_7371;
pub const SEQ_FILE_VERSION: u32 = 4;

impl Context {
    /// Pointer to the logits row of batch index `i` of the last decode (`n_vocab` floats, owned by
    /// llama.cpp and valid until the next decode), for the zero-copy JS view.
    pub fn logits_row_ptr(&self, i: i32) -> Result<NonNull<f32>> {
        let p = unsafe { sys::llama_get_logits_ith(self.ptr.as_ptr(), i) };
        NonNull::new(p).ok_or(Error::NoLogits)
    }

    /// Serialises the cells of `seq` (llama.cpp's per-sequence state format).
    pub fn seq_state(&self, seq: SeqId) -> Result<Vec<u8>> {
        let size = unsafe { sys::llama_state_seq_get_size(self.ptr.as_ptr(), seq) };
        if size == 0 {
            return Err(Error::State(format!(
                "llama.cpp could not measure the state of sequence {seq}"
            )));
        }
        let mut buf = vec![0u8; size];
        let written = unsafe {
            sys::llama_state_seq_get_data(self.ptr.as_ptr(), buf.as_mut_ptr(), size, seq)
        };
        if written != size {
            return Err(Error::State(format!(
                "llama.cpp wrote {written} of {size} bytes of the state of sequence {seq}"
            )));
        }
        Ok(buf)
    }

    /// Replaces the cells of `seq` with a state from [`Context::seq_state`]. Returns the bytes
    /// llama.cpp consumed (0 = refused; llama.cpp may have emptied `seq` by then).
    pub fn set_seq_state(&self, seq: SeqId, data: &[u8]) -> usize {
        unsafe { sys::llama_state_seq_set_data(self.ptr.as_ptr(), data.as_ptr(), data.len(), seq) }
    }
}

// ---------------------------------------------------------------------------------------------
// Embeddings

/// `llama_pooling_type` values we distinguish.
pub const POOLING_NONE: i32 = sys::LLAMA_POOLING_TYPE_NONE;
pub const POOLING_RANK: i32 = sys::LLAMA_POOLING_TYPE_RANK;

impl Context {
    /// The pooling the context was created with (`LLAMA_POOLING_TYPE_*`).
    pub fn pooling_type(&self) -> i32 {
        unsafe { sys::llama_pooling_type(self.ptr.as_ptr()) as i32 }
    }

    /// Pooled embedding of `seq` from the last decode (`n_embd_out` floats), if there is one.
    pub fn embeddings_seq(&self, seq: SeqId) -> Option<&[f32]> {
        let p = unsafe { sys::llama_get_embeddings_seq(self.ptr.as_ptr(), seq) };
        self.embedding_slice(p)
    }

    /// Per-token embedding of output row `i` (-1 = the last) from the last decode, if there is one.
    pub fn embeddings_ith(&self, i: i32) -> Option<&[f32]> {
        let p = unsafe { sys::llama_get_embeddings_ith(self.ptr.as_ptr(), i) };
        self.embedding_slice(p)
    }

    fn embedding_slice(&self, p: *mut f32) -> Option<&[f32]> {
        let n = self.model.n_embd_out();
        (!p.is_null() && n > 0).then(|| unsafe { std::slice::from_raw_parts(p, n as usize) })
    }
}

impl Model {
    /// Width of the embeddings llama.cpp returns (usually `n_embd`).
    pub fn n_embd_out(&self) -> i32 {
        unsafe { sys::llama_model_n_embd_out(self.ptr.as_ptr()) }
    }
}
