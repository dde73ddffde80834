//! `Context`: an owned `llama_context` — its KV memory, the one `llama_decode` call (token and
//! embedding batches both go through `decode`), logits and
//! embeddings rows, per-sequence state and the abort hook that cancellation uses.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Arc;

use llama_cpp_sys_2 as sys;

use super::{Batch, Model, Pos, SeqId};
use crate::engine::kv_types::{FlashAttention, KvConfig, KvType};
use crate::error::{Error, Result};

pub struct ContextConfig {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_seq_max: u32,
    pub n_threads: i32,
    pub embeddings: bool,
    pub pooling_type: i32,
    pub n_outputs_max: u32,
    /// KV element types and flash attention, already checked together (engine/kv_types.rs).
    pub kv: KvConfig,
    /// Run the CPU backend's reference kernels: one kernel per row whatever the batch
    /// (determinism_shim.cpp, docs/determinism.md).
    pub reference_kernels: bool,
}

extern "C" {
    fn lb_set_cpu_reference_kernels(ctx: *mut sys::llama_context, on: bool) -> std::ffi::c_int;
}

fn ggml_type(t: KvType) -> sys::ggml_type {
    match t {
        KvType::F16 => sys::GGML_TYPE_F16,
        KvType::Q8_0 => sys::GGML_TYPE_Q8_0,
        KvType::Q4_0 => sys::GGML_TYPE_Q4_0,
    }
}

fn flash_attn_type(f: FlashAttention) -> sys::llama_flash_attn_type {
    match f {
        FlashAttention::Auto => sys::LLAMA_FLASH_ATTN_TYPE_AUTO,
        FlashAttention::On => sys::LLAMA_FLASH_ATTN_TYPE_ENABLED,
        FlashAttention::Off => sys::LLAMA_FLASH_ATTN_TYPE_DISABLED,
    }
}

pub struct Context {
    ptr: NonNull<sys::llama_context>,
    /// Keeps the weights alive for as long as the context uses them.
    pub model: Arc<Model>,
    /// Polled by ggml between graph nodes: the cancellation flag of the job now running.
    abort_slot: Box<AbortSlot>,
    /// Keeps the flag `abort_slot` points to alive while it is installed.
    cancel_flag: Option<Arc<AtomicBool>>,
    n_outputs_max: u32,
}

// SAFETY: a llama_context may be used from any thread as long as only one thread uses it at a
// time. A `Context` is owned by its session's engine, behind a mutex that every caller holds
// (`&mut`/`&` access only happens under it), so it can move to the worker thread.
unsafe impl Send for Context {}

/// Where the abort callback finds the running job's cancellation flag (null: not cancellable).
/// A pointer rather than one per-context flag, so cancelling a queued job can never stop the job
/// running before it.
#[derive(Default)]
struct AbortSlot {
    flag: AtomicPtr<AtomicBool>,
}

unsafe extern "C" fn abort_callback(data: *mut c_void) -> bool {
    // SAFETY: `data` is the context's boxed `AbortSlot`, which outlives the context (it is
    // dropped after `llama_free`); the flag it points to is kept alive by `cancel_flag` for as
    // long as the pointer is installed.
    let flag = unsafe { (*(data as *const AbortSlot)).flag.load(Ordering::Acquire) };
    !flag.is_null() && unsafe { (*flag).load(Ordering::Acquire) }
}

impl Context {
    pub fn new(model: Arc<Model>, cfg: &ContextConfig) -> Result<Context> {
        // SAFETY: returns a plain struct of defaults.
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
        // Checked here, before llama.cpp sees them, so a type the heads cannot hold is an
        // ERR_INVALID_ARG naming the option rather than a null context.
        let (head_k, head_v) = model.head_sizes();
        cfg.kv.check_heads(head_k, head_v)?;
        p.type_k = ggml_type(cfg.kv.type_k);
        p.type_v = ggml_type(cfg.kv.type_v);
        p.flash_attn_type = flash_attn_type(cfg.kv.flash_attention);
        p.no_perf = true;
        let abort_slot = Box::<AbortSlot>::default();
        p.abort_callback = Some(abort_callback);
        p.abort_callback_data = (&*abort_slot as *const AbortSlot) as *mut c_void;
        // SAFETY: the model is live (we hold an Arc to it for the context's lifetime) and the
        // abort data pointer stays valid until after `llama_free` (see `abort_callback`).
        let ptr = unsafe { sys::llama_init_from_model(model.as_ptr(), p) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            let kv = if cfg.kv.type_k.is_quantized() || cfg.kv.type_v.is_quantized() {
                // llama.cpp also refuses quantized caches some models cannot use (e.g. K and V
                // of different types on a model with MLA attention).
                format!(
                    "; or typeK '{}' / typeV '{}' do not suit this model: try 'f16'",
                    cfg.kv.type_k.name(),
                    cfg.kv.type_v.name()
                )
            } else {
                String::new()
            };
            Error::ContextCreate(format!(
                "llama_init_from_model returned null (out of memory, or nCtx/nBatch too large for this model{kv})"
            ))
        })?;
        let ctx = Context {
            ptr,
            model,
            abort_slot,
            cancel_flag: None,
            n_outputs_max: cfg.n_outputs_max,
        };
        if cfg.reference_kernels {
            // SAFETY: the context is live; the shim only reads its scheduler's backend list and
            // sets a flag on its CPU backend, which the next graph computation reads.
            let status = unsafe { lb_set_cpu_reference_kernels(ctx.raw(), true) };
            if status != 0 {
                // Every llama_context has a CPU backend and every ggml-cpu of this vendored
                // version exports the setter, so this is a build that does not match.
                return Err(Error::ContextCreate(format!(
                    "deterministic: cannot switch the CPU backend to its reference kernels \
                     (status {status}: 1 no CPU backend, 2 no ggml_backend_cpu_set_use_ref)"
                )));
            }
        }
        Ok(ctx)
    }

    fn raw(&self) -> *mut sys::llama_context {
        self.ptr.as_ptr()
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
        // SAFETY: reads a field of the live context (also for the four getters below).
        unsafe { sys::llama_n_ctx(self.raw()) }
    }

    pub fn n_batch(&self) -> u32 {
        // SAFETY: see `n_ctx`.
        unsafe { sys::llama_n_batch(self.raw()) }
    }

    pub fn n_seq_max(&self) -> u32 {
        // SAFETY: see `n_ctx`.
        unsafe { sys::llama_n_seq_max(self.raw()) }
    }

    /// Threads llama.cpp uses for single-token decodes (also how wide our per-branch work goes).
    pub fn n_threads(&self) -> usize {
        // SAFETY: see `n_ctx`.
        unsafe { sys::llama_n_threads(self.raw()) }.max(1) as usize
    }

    /// The pooling the context was created with (`LLAMA_POOLING_TYPE_*`).
    pub fn pooling_type(&self) -> i32 {
        // SAFETY: see `n_ctx`.
        unsafe { sys::llama_pooling_type(self.raw()) as i32 }
    }

    pub fn n_vocab(&self) -> i32 {
        self.model.n_vocab
    }

    /// Output rows one decode may request (llama.cpp sizes its output buffer by it).
    pub fn n_outputs_max(&self) -> u32 {
        self.n_outputs_max
    }

    fn memory(&self) -> sys::llama_memory_t {
        // SAFETY: the context's memory lives as long as the context.
        unsafe { sys::llama_get_memory(self.raw()) }
    }

    // The memory calls below take any sequence id in [0, n_seq_max) and any positions; callers
    // validate ids where they enter from JS (llama.cpp asserts on out-of-range ids).

    /// Highest position stored for `seq`, or -1 when it holds no cells.
    pub fn seq_pos_max(&self, seq: SeqId) -> Pos {
        // SAFETY: see the note above.
        unsafe { sys::llama_memory_seq_pos_max(self.memory(), seq) }
    }

    /// Lowest position stored for `seq`, or -1 when it holds no cells.
    pub fn seq_pos_min(&self, seq: SeqId) -> Pos {
        // SAFETY: see the note above.
        unsafe { sys::llama_memory_seq_pos_min(self.memory(), seq) }
    }

    /// Removes positions `[p0, p1)` of `seq` (negative = open end). Returns false when llama.cpp
    /// cannot remove a partial range (e.g. beyond an SWA window).
    pub fn seq_rm(&self, seq: SeqId, p0: Pos, p1: Pos) -> bool {
        // SAFETY: see the note above.
        unsafe { sys::llama_memory_seq_rm(self.memory(), seq, p0, p1) }
    }

    /// Tags `dst` on `src`'s cells in positions `[p0, p1)` (shared, not copied, under unified KV).
    pub fn seq_cp(&self, src: SeqId, dst: SeqId, p0: Pos, p1: Pos) {
        // SAFETY: see the note above.
        unsafe { sys::llama_memory_seq_cp(self.memory(), src, dst, p0, p1) }
    }

    /// Removes every cell not tagged with `seq`.
    pub fn seq_keep(&self, seq: SeqId) {
        // SAFETY: see the note above.
        unsafe { sys::llama_memory_seq_keep(self.memory(), seq) }
    }

    pub fn clear_memory(&self) {
        // SAFETY: clears the live context's memory.
        unsafe { sys::llama_memory_clear(self.memory(), true) }
    }

    /// Runs one `llama_decode` over `batch` — the only call of it in the addon. The decode
    /// engine (engine/decode.rs) has already checked sizes, sequence ids, positions and outputs;
    /// the size checks are repeated here because llama.cpp aborts the process on them.
    pub fn decode(&mut self, batch: &mut Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        if batch.len() > self.n_batch() as usize || batch.n_outputs() > self.n_outputs_max as usize
        {
            return Err(Error::Internal(format!(
                "batch of {} tokens ({} outputs) exceeds n_batch {} or n_outputs_max {}",
                batch.len(),
                batch.n_outputs(),
                self.n_batch(),
                self.n_outputs_max
            )));
        }
        let raw = batch.as_raw();
        // SAFETY: `raw` points into `batch`, which is not touched until the call returns; its
        // size, ids and positions were validated by the caller (see above).
        let rc = unsafe { sys::llama_decode(self.raw(), raw) };
        match rc {
            0 => Ok(()),
            1 => Err(Error::KvFull(format!(
                "no free KV slot for {} tokens in a {}-cell cache",
                batch.len(),
                self.n_ctx()
            ))),
            // Only our abort callback makes llama.cpp return 2. It has already removed the
            // aborted ubatch's cells; the decode engine removes those of earlier decodes.
            2 => Err(Error::Aborted),
            -1 => Err(Error::Decode {
                code: rc,
                what: "invalid batch (positions or sequence ids inconsistent with the KV cache)"
                    .into(),
            }),
            _ => Err(Error::Decode {
                code: rc,
                what: "fatal error inside llama.cpp".into(),
            }),
        }
    }

    /// Decodes a batch of embedding rows (an image's, from `Projector::encode`) through
    /// [`Context::decode`]. With `non_causal` (what the projector asks for its model, e.g. Gemma
    /// 3's image tokens attend to each other both ways) attention is non-causal for this decode
    /// only; llama.cpp aborts the process when such a batch is larger than one ubatch, so that is
    /// refused here (the engine checks it earlier, with the option to change).
    pub fn decode_embd(&mut self, batch: &mut Batch, non_causal: bool) -> Result<()> {
        let n_embd = self.model.n_embd_inp();
        if batch.embd_len() != batch.len() * n_embd {
            return Err(Error::Internal(format!(
                "embedding batch of {} floats for {} rows of width {n_embd}",
                batch.embd_len(),
                batch.len()
            )));
        }
        // SAFETY: reads a field of the live context.
        let n_ubatch = unsafe { sys::llama_n_ubatch(self.raw()) } as usize;
        if non_causal && batch.len() > n_ubatch {
            return Err(Error::Internal(format!(
                "{} non-causal embedding rows exceed n_ubatch {n_ubatch}",
                batch.len()
            )));
        }
        if non_causal {
            // SAFETY: a flag of the live context, read by the next decode; set back below.
            unsafe { sys::llama_set_causal_attn(self.raw(), false) };
        }
        let result = self.decode(batch);
        if non_causal {
            // SAFETY: as above; every other decode of the addon is causal.
            unsafe { sys::llama_set_causal_attn(self.raw(), true) };
        }
        result
    }

    /// The logits row for batch index `i` of the last decode (`-1` = the last output), or
    /// `NoLogits` if that index did not request logits (llama.cpp returns null for it).
    pub fn logits_row(&self, i: i32) -> Result<&[f32]> {
        let row = self.logits_row_ptr(i)?;
        // SAFETY: llama.cpp owns `n_vocab` floats at `row` until the next decode, which needs
        // `&mut self` and so cannot happen while the returned borrow lives.
        Ok(unsafe { std::slice::from_raw_parts(row.as_ptr(), self.n_vocab() as usize) })
    }

    /// Pointer to the logits row of batch index `i` of the last decode (`n_vocab` floats, owned
    /// by llama.cpp and valid until the next decode), for the zero-copy JS view.
    pub fn logits_row_ptr(&self, i: i32) -> Result<NonNull<f32>> {
        // SAFETY: llama.cpp checks `i` against the last batch and returns null when it is not
        // an output row (it only aborts for that in debug builds, which we never ship).
        let p = unsafe { sys::llama_get_logits_ith(self.raw(), i) };
        NonNull::new(p).ok_or(Error::NoLogits)
    }

    /// Serialises the cells of `seq` (llama.cpp's per-sequence state format).
    pub fn seq_state(&self, seq: SeqId) -> Result<Vec<u8>> {
        // SAFETY: measures the live context's state of `seq`.
        let size = unsafe { sys::llama_state_seq_get_size(self.raw(), seq) };
        if size == 0 {
            return Err(Error::State(format!(
                "llama.cpp could not measure the state of sequence {seq}"
            )));
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` is writable for `size` bytes.
        let written =
            unsafe { sys::llama_state_seq_get_data(self.raw(), buf.as_mut_ptr(), size, seq) };
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
        // SAFETY: `data` is readable for its length; llama.cpp validates the contents and
        // returns 0 for data it rejects (the header was checked by the caller).
        unsafe { sys::llama_state_seq_set_data(self.raw(), data.as_ptr(), data.len(), seq) }
    }

    /// Pooled embedding of `seq` from the last decode (`n_embd_out` floats), if there is one.
    pub fn embeddings_seq(&self, seq: SeqId) -> Option<&[f32]> {
        // SAFETY: returns null or a row owned by llama.cpp until the next decode.
        let p = unsafe { sys::llama_get_embeddings_seq(self.raw(), seq) };
        self.embedding_slice(p)
    }

    /// Per-token embedding of output row `i` (-1 = the last) from the last decode, if there is one.
    pub fn embeddings_ith(&self, i: i32) -> Option<&[f32]> {
        // SAFETY: as `embeddings_seq`.
        let p = unsafe { sys::llama_get_embeddings_ith(self.raw(), i) };
        self.embedding_slice(p)
    }

    fn embedding_slice(&self, p: *mut f32) -> Option<&[f32]> {
        let n = self.model.n_embd_out();
        // SAFETY: a non-null row holds `n_embd_out` floats and outlives the borrow of `self`
        // (the next decode needs `&mut self`).
        (!p.is_null() && n > 0).then(|| unsafe { std::slice::from_raw_parts(p, n as usize) })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if !self.model.can_free() {
            // An RPC server holding its KV buffers is gone: freeing would wait for it forever
            // (see `Model::set_free_check`). Leaked, with the slot its abort callback reads.
            std::mem::forget(std::mem::take(&mut self.abort_slot));
            return;
        }
        // SAFETY: the context is not used after this; `abort_slot` is dropped after it.
        unsafe { sys::llama_free(self.raw()) }
    }
}

/// `llama_pooling_type` values we distinguish.
pub const POOLING_NONE: i32 = sys::LLAMA_POOLING_TYPE_NONE;
pub const POOLING_RANK: i32 = sys::LLAMA_POOLING_TYPE_RANK;
pub const POOLING_MEAN: i32 = sys::LLAMA_POOLING_TYPE_MEAN;

/// First bytes of every buffer `llama_state_seq_get_data` writes (llama.cpp's `io_magic`).
pub const SEQ_STATE_MAGIC: u32 = 0xaf14_3cd8;
/// Header of llama.cpp's sequence state files (`llama_state_seq_save_file`): magic 'ggsq' and
/// format version (llama.h's `LLAMA_STATE_SEQ_MAGIC` / `LLAMA_STATE_SEQ_VERSION`, which bindgen
/// does not export). The file is this header, a token count, the tokens, then the state bytes
/// of `llama_state_seq_get_data` without its 8-byte (magic, seq id) prefix.
pub const SEQ_FILE_MAGIC: u32 = 0x6767_7371;
pub const SEQ_FILE_VERSION: u32 = 4;
