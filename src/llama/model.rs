//! `Model`: an owned `llama_model` and its vocabulary (tokenizer, special tokens, metadata).

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use super::{init_backend, Device, Token};
use crate::error::{Error, Result};

pub struct Model {
    ptr: NonNull<sys::llama_model>,
    vocab: NonNull<sys::llama_vocab>,
    pub n_vocab: i32,
    /// For weights on RPC servers: whether those servers still answer (see `set_free_check`).
    free_check: Option<FreeCheck>,
}

/// Tells whether every device holding a model's buffers can still be reached.
type FreeCheck = Box<dyn Fn() -> bool + Send + Sync>;

// SAFETY: the weights and vocabulary are immutable after load. llama.cpp reads them from any
// number of contexts and threads at once (tokenization and piece lookup are documented as
// thread-safe); nothing here mutates the model after `load` returns.
unsafe impl Send for Model {}
// SAFETY: see `Send`: every method takes `&self` and only reads.
unsafe impl Sync for Model {}

/// How the weights are placed when a model loads.
pub struct ModelParams {
    pub use_mmap: bool,
    /// Layers to offload to the non-CPU devices (ignored when there are none).
    pub n_gpu_layers: i32,
    /// The devices to place layers on, in order; `None` = llama.cpp's default (every local GPU).
    pub devices: Option<Vec<Device>>,
    pub split_mode: SplitMode,
    pub main_gpu: i32,
    /// Fraction of the offloaded layers per device (same length as the device list), or empty.
    pub tensor_split: Vec<f32>,
    /// Let the CPU backend repack weights into its interleaved layouts (llama.cpp's
    /// `use_extra_bufts`). Off for deterministic contexts: the repacked kernels take rows in
    /// groups of 4 and the rest one by one, which round differently (docs/determinism.md).
    pub repack_weights: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitMode {
    None,
    Layer,
    Row,
}

impl Model {
    pub fn load(path: &str, params: &ModelParams) -> Result<Model> {
        init_backend();
        let c_path = CString::new(path)
            .map_err(|_| Error::invalid("modelPath must not contain NUL bytes"))?;
        // SAFETY: returns a plain struct of defaults.
        let mut p = unsafe { sys::llama_model_default_params() };
        p.load_mode = if params.use_mmap {
            sys::LLAMA_LOAD_MODE_MMAP
        } else {
            sys::LLAMA_LOAD_MODE_NONE
        };
        p.n_gpu_layers = params.n_gpu_layers;
        p.split_mode = match params.split_mode {
            SplitMode::None => sys::LLAMA_SPLIT_MODE_NONE,
            SplitMode::Layer => sys::LLAMA_SPLIT_MODE_LAYER,
            SplitMode::Row => sys::LLAMA_SPLIT_MODE_ROW,
        };
        p.main_gpu = params.main_gpu;
        p.use_extra_bufts = params.repack_weights;
        // NULL-terminated, as llama_model_params.devices requires; lives until the load returns.
        let mut devices: Vec<sys::ggml_backend_dev_t> = Vec::new();
        if let Some(list) = &params.devices {
            devices.extend(list.iter().map(|d| d.as_ptr()));
            devices.push(std::ptr::null_mut());
            p.devices = devices.as_mut_ptr();
        }
        // llama.cpp reads llama_max_devices() floats from tensor_split.
        // SAFETY: a constant of the build.
        let max_devices = unsafe { sys::llama_max_devices() };
        let mut split = vec![0f32; max_devices.max(params.tensor_split.len())];
        split[..params.tensor_split.len()].copy_from_slice(&params.tensor_split);
        if !params.tensor_split.is_empty() {
            p.tensor_split = split.as_ptr();
        }
        // SAFETY: `c_path` is NUL-terminated; `devices` and `split` outlive the call (llama.cpp
        // copies both); null means failure.
        let ptr = unsafe { sys::llama_model_load_from_file(c_path.as_ptr(), p) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::ModelLoad(path.to_string()))?;
        // SAFETY: `ptr` is a live model; its vocabulary lives as long as it does.
        let vocab = unsafe { sys::llama_model_get_vocab(ptr.as_ptr()) };
        let vocab = NonNull::new(vocab.cast_mut())
            .ok_or_else(|| Error::ModelLoad(format!("{path} (the model has no vocabulary)")))?;
        // SAFETY: `vocab` is live (see above).
        let n_vocab = unsafe { sys::llama_vocab_n_tokens(vocab.as_ptr()) };
        Ok(Model {
            ptr,
            vocab,
            n_vocab,
            free_check: None,
        })
    }

    pub(super) fn as_ptr(&self) -> *mut sys::llama_model {
        self.ptr.as_ptr()
    }

    pub(super) fn vocab(&self) -> *const sys::llama_vocab {
        self.vocab.as_ptr()
    }

    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<Token>> {
        let len = i32::try_from(text.len())
            .map_err(|_| Error::Tokenize("text is too long to tokenize (over 2 GiB)".into()))?;
        let run = |out: &mut Vec<Token>| {
            // SAFETY: `text` is valid for `len` bytes (not necessarily NUL-terminated, which
            // llama_tokenize does not need) and `out` for `out.len()` tokens.
            unsafe {
                sys::llama_tokenize(
                    self.vocab(),
                    text.as_ptr().cast(),
                    len,
                    out.as_mut_ptr(),
                    out.len() as i32,
                    add_special,
                    parse_special,
                )
            }
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

    /// Raw bytes of one token's piece (may be a partial UTF-8 sequence). `token` must be in
    /// `[0, n_vocab)`: callers validate ids where they enter from JS.
    pub fn token_bytes(&self, token: Token, special: bool) -> Vec<u8> {
        debug_assert!(token >= 0 && token < self.n_vocab);
        let mut buf = vec![0u8; 64];
        loop {
            // SAFETY: `buf` is writable for `buf.len()` bytes; the id is in range (above).
            let n = unsafe {
                sys::llama_token_to_piece(
                    self.vocab(),
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

    /// Text of `tokens` (ids in range, as for `token_bytes`).
    pub fn detokenize(&self, tokens: &[Token]) -> String {
        if tokens.is_empty() {
            return String::new();
        }
        let mut buf = vec![0u8; tokens.len() * 8 + 16];
        loop {
            // SAFETY: `tokens` and `buf` are valid for the lengths passed.
            let n = unsafe {
                sys::llama_detokenize(
                    self.vocab(),
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
        // SAFETY: a vocabulary lookup of an id checked to be in range.
        token >= 0
            && token < self.n_vocab
            && unsafe { sys::llama_vocab_is_eog(self.vocab(), token) }
    }

    /// End-of-turn token, falling back to end-of-sequence.
    pub fn eog_token(&self) -> Option<Token> {
        // SAFETY: plain vocabulary queries (-1 when the model has no such token).
        let (eot, eos) = unsafe {
            (
                sys::llama_vocab_eot(self.vocab()),
                sys::llama_vocab_eos(self.vocab()),
            )
        };
        [eot, eos].into_iter().find(|&t| t >= 0)
    }

    pub fn bos_token(&self) -> Option<Token> {
        // SAFETY: plain vocabulary query (-1 when the model has none).
        let bos = unsafe { sys::llama_vocab_bos(self.vocab()) };
        (bos >= 0).then_some(bos)
    }

    pub fn size_bytes(&self) -> u64 {
        // SAFETY: reads the model's metadata.
        unsafe { sys::llama_model_size(self.as_ptr()) }
    }

    pub fn n_embd(&self) -> i32 {
        // SAFETY: reads the model's metadata.
        unsafe { sys::llama_model_n_embd(self.as_ptr()) }
    }

    /// Width of the embedding rows a batch may feed in place of tokens (an image's).
    pub fn n_embd_inp(&self) -> usize {
        // SAFETY: reads the model's metadata.
        unsafe { sys::llama_model_n_embd_inp(self.as_ptr()) }.max(0) as usize
    }

    /// Width of the embeddings llama.cpp returns (usually `n_embd`).
    pub fn n_embd_out(&self) -> i32 {
        // SAFETY: reads the model's metadata.
        unsafe { sys::llama_model_n_embd_out(self.as_ptr()) }
    }

    /// Sliding-window attention span in positions (0 when the model has none).
    pub fn n_swa(&self) -> u32 {
        // SAFETY: reads the model's metadata.
        unsafe { sys::llama_model_n_swa(self.as_ptr()) }.max(0) as u32
    }

    /// Layers of the model's body (what `nGpuLayers` counts).
    pub fn n_layer(&self) -> i32 {
        // SAFETY: reads the model's metadata.
        unsafe { sys::llama_model_n_layer(self.as_ptr()) }
    }

    /// Parameters in the weights (part of a state fingerprint).
    pub fn n_params(&self) -> u64 {
        // SAFETY: reads the model's metadata.
        unsafe { sys::llama_model_n_params(self.as_ptr()) }
    }

    /// Every GGUF metadata pair (key, value as llama.cpp prints it), in the file's order: what
    /// a state fingerprint hashes, so a state never meets a model it was not computed by.
    pub fn metadata(&self) -> Vec<(String, String)> {
        // SAFETY: reads the model's metadata.
        let n = unsafe { sys::llama_model_meta_count(self.as_ptr()) }.max(0);
        let read = |i: i32, key: bool| -> String {
            let mut buf = vec![0u8; 256];
            for _ in 0..2 {
                // SAFETY: llama.cpp writes at most `buf.len()` bytes (NUL included) and returns
                // the whole value's length (or -1 for an index out of range).
                let len = unsafe {
                    if key {
                        sys::llama_model_meta_key_by_index(
                            self.as_ptr(),
                            i,
                            buf.as_mut_ptr().cast(),
                            buf.len(),
                        )
                    } else {
                        sys::llama_model_meta_val_str_by_index(
                            self.as_ptr(),
                            i,
                            buf.as_mut_ptr().cast(),
                            buf.len(),
                        )
                    }
                };
                if len < 0 {
                    return String::new();
                }
                let len = len as usize;
                if len < buf.len() {
                    buf.truncate(len);
                    break;
                }
                // Longer than the buffer: read again at its full length (values are printed
                // summaries, a few KiB at most).
                buf = vec![0u8; len + 1];
            }
            if let Some(end) = buf.iter().position(|&b| b == 0) {
                buf.truncate(end);
            }
            String::from_utf8_lossy(&buf).into_owned()
        };
        (0..n).map(|i| (read(i, true), read(i, false))).collect()
    }

    /// A metadata value of the GGUF as text (None when the key is absent).
    fn meta(&self, key: &str) -> Option<String> {
        let key = std::ffi::CString::new(key).ok()?;
        let mut buf = vec![0u8; 128];
        // SAFETY: `key` is NUL-terminated; llama.cpp writes at most `buf.len()` bytes (NUL
        // included) and returns the value's length, or -1 when the key is absent.
        let n = unsafe {
            sys::llama_model_meta_val_str(
                self.as_ptr(),
                key.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return None;
        }
        buf.truncate((n as usize).min(buf.len() - 1));
        Some(String::from_utf8_lossy(&buf).into_owned())
    }

    /// The architecture's name when its attention is not causal (`<arch>.attention.causal` false:
    /// BERT-type encoders such as nomic-bert), which make embeddings, not text; None otherwise.
    pub fn encoder_arch(&self) -> Option<String> {
        let arch = self.meta("general.architecture").unwrap_or_default();
        let causal = self.meta(&format!("{arch}.attention.causal"));
        (causal.as_deref().map(str::trim) == Some("false")).then_some(arch)
    }

    /// Values per attention head in K and in V: the GGUF's `<arch>.attention.key_length` and
    /// `value_length` where given, else `n_embd / n_head` (how llama.cpp reads them).
    pub fn head_sizes(&self) -> (u32, u32) {
        // SAFETY: reads the model's metadata.
        let n_head = unsafe { sys::llama_model_n_head(self.as_ptr()) }.max(1);
        let fallback = (self.n_embd() / n_head).max(0) as u32;
        let arch = self.meta("general.architecture").unwrap_or_default();
        let read = |what: &str| {
            self.meta(&format!("{arch}.attention.{what}"))
                .and_then(|v| v.trim().parse::<u32>().ok())
                .unwrap_or(fallback)
        };
        (read("key_length"), read("value_length"))
    }

    pub fn description(&self) -> String {
        let mut buf = vec![0u8; 256];
        // SAFETY: writes at most `buf.len()` bytes (NUL included) and returns the length.
        let n = unsafe { sys::llama_model_desc(self.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        buf.truncate(n.clamp(0, buf.len() as i32 - 1) as usize);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The chat template stored in the GGUF, if any.
    pub fn chat_template(&self) -> Option<String> {
        // SAFETY: returns a NUL-terminated string owned by the model, or null.
        let p = unsafe { sys::llama_model_chat_template(self.as_ptr(), std::ptr::null()) };
        // SAFETY: non-null, NUL-terminated and alive as long as `self`; copied at once.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

impl Model {
    /// Installs `check`, asked before the model or a context on it is freed. Freeing buffers on
    /// an RPC server sends it commands and waits for answers; once the server is gone, ggml-rpc's
    /// dispatcher thread is parked (see devices.rs) and that wait never ends, which would hang
    /// whichever thread drops the model (the JS thread, in a finalizer). So when `check` says a
    /// server is gone, the model (or context) is leaked instead of freed.
    pub fn set_free_check(&mut self, check: impl Fn() -> bool + Send + Sync + 'static) {
        self.free_check = Some(Box::new(check));
    }

    /// Whether freeing this model, or a context on it, can complete.
    pub fn can_free(&self) -> bool {
        self.free_check.as_ref().is_none_or(|check| check())
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        if !self.can_free() {
            return; // leaked: see `set_free_check`
        }
        // SAFETY: every context using the weights holds an `Arc<Model>`, so none is left.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) }
    }
}
