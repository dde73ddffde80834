//! llama.cpp's multimodal library (tools/mtmd, the sys crate's `mtmd` feature): `Projector` (an
//! `mtmd_context`: a vision encoder and projector loaded beside a text model), `Bitmap` (a decoded
//! image) and `Chunks` (a tokenized prompt of text runs and image chunks). Decoding an image's
//! embeddings into a sequence goes through `Context::decode_embd`, never through mtmd's helper
//! (which would call `llama_decode` itself).

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use llama_cpp_sys_2 as sys;

use super::backend::{capture_logs, init_mtmd_log};
use super::{Model, Pos, Token};
use crate::error::{Error, Result};

/// A projector loaded beside the model it projects into.
pub struct Projector {
    ptr: NonNull<sys::mtmd_context>,
    /// The text model the projector was checked against and reads; held so it outlives the
    /// projector.
    _model: Arc<Model>,
    n_embd: usize,
}

// SAFETY: an mtmd_context may be used from any thread, one thread at a time for encodes. A
// `Projector` is owned by its session's engine behind the mutex every caller holds.
unsafe impl Send for Projector {}

impl Projector {
    /// Loads `path` for `model`. A file whose output width is not the model's embedding width is
    /// `ProjectorMismatch`; any other refusal (missing file, not a projector, an architecture
    /// this llama.cpp does not know) is `ProjectorLoad` with llama.cpp's reason.
    pub fn load(path: &str, model: Arc<Model>, n_threads: i32, use_gpu: bool) -> Result<Projector> {
        init_mtmd_log();
        if !std::path::Path::new(path).is_file() {
            return Err(Error::ProjectorLoad(format!(
                "{path}: no such file; pass the path of the model's mmproj .gguf"
            )));
        }
        let c_path = CString::new(path)
            .map_err(|_| Error::invalid("options.mmprojPath contains a NUL byte"))?;
        // SAFETY: returns a plain struct of defaults.
        let mut p = unsafe { sys::mtmd_context_params_default() };
        p.use_gpu = use_gpu;
        p.n_threads = n_threads;
        p.print_timings = false;
        p.warmup = false;
        // SAFETY: `c_path` is NUL-terminated and the model is live (held by `model` for the
        // projector's lifetime); mtmd catches its own exceptions and returns null on failure.
        let (ptr, logged) = capture_logs(|| unsafe {
            sys::mtmd_init_from_file(c_path.as_ptr(), model.as_ptr(), p)
        });
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(if logged.contains("mismatch between text model") {
                Error::ProjectorMismatch(format!(
                    "{path} does not project into this model ({logged}); use the mmproj file published with this model"
                ))
            } else {
                Error::ProjectorLoad(format!(
                    "{path}: {}; pass an mmproj .gguf that llama.cpp's mtmd supports",
                    if logged.is_empty() {
                        "llama.cpp refused it"
                    } else {
                        &logged
                    }
                ))
            });
        };
        let projector = Projector {
            ptr,
            n_embd: model.n_embd_inp(),
            _model: model,
        };
        // SAFETY (both): reads flags of the live mtmd context.
        if !unsafe { sys::mtmd_support_vision(projector.ptr.as_ptr()) } {
            return Err(Error::ProjectorLoad(format!(
                "{path} has no vision encoder (an audio projector?); pass an image projector"
            )));
        }
        if unsafe { sys::mtmd_decode_use_mrope(projector.ptr.as_ptr()) } {
            return Err(Error::ImageUnsupported(format!(
                "{path} is for a model with M-RoPE image positions (Qwen-VL style), which llama-branch does not support yet; use a model whose images take one position per token (e.g. Gemma 3)"
            )));
        }
        Ok(projector)
    }

    fn raw(&self) -> *mut sys::mtmd_context {
        self.ptr.as_ptr()
    }

    /// Width of each image token's embedding (the model's input embedding width).
    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// Decodes an image file's bytes (formats stb_image reads: PNG, JPEG, GIF, BMP, ...). The
    /// caller has already checked the format and size limits. The bitmap's id is the SHA-256 of
    /// the bytes.
    pub fn decode_image(&self, bytes: &[u8]) -> Result<Bitmap> {
        // SAFETY: a plain struct of defaults.
        let opt = unsafe { sys::mtmd_helper_init_opt_default() };
        // SAFETY: `bytes` is readable for its length for this call; the helper is thread-safe and
        // copies what it keeps.
        let (wrapper, logged) = capture_logs(|| unsafe {
            sys::mtmd_helper_bitmap_init_from_buf(
                self.raw(),
                bytes.as_ptr(),
                bytes.len(),
                false,
                opt,
            )
        });
        if !wrapper.video_ctx.is_null() {
            // SAFETY: a video context the helper handed us; never used otherwise.
            unsafe { sys::mtmd_helper_video_free(wrapper.video_ctx) };
        }
        let ptr =
            NonNull::new(wrapper.bitmap).ok_or_else(|| {
                Error::ImageDecode(format!(
                "the image could not be decoded ({}); send a complete PNG, JPEG, GIF or BMP file",
                if logged.is_empty() { "corrupt or truncated" } else { &logged }
            ))
            })?;
        let bitmap = Bitmap { ptr };
        // SAFETY: reads a flag of the bitmap we own.
        if unsafe { sys::mtmd_bitmap_is_audio(bitmap.ptr.as_ptr()) } {
            return Err(Error::ImageFormat(
                "the bytes are audio, not an image; send a PNG, JPEG, GIF or BMP file".into(),
            ));
        }
        Ok(bitmap)
    }

    /// Tokenizes `parts` in order: text (special tokens parsed) and images, each image wrapped
    /// in the markers the model expects. `add_special` adds the model's BOS.
    pub fn tokenize(&self, parts: &[Part], add_special: bool) -> Result<Chunks> {
        let texts: Vec<sys::mtmd_input_text> = parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => sys::mtmd_input_text {
                    text: t.as_ptr() as *const std::os::raw::c_char,
                    text_len: t.len(),
                    add_special: false,
                    parse_special: true,
                },
                Part::Image(_) => sys::mtmd_input_text {
                    text: std::ptr::null(),
                    text_len: 0,
                    add_special: false,
                    parse_special: false,
                },
            })
            .collect();
        let inputs: Vec<sys::mtmd_input_part> = parts
            .iter()
            .zip(&texts)
            .map(|(p, t)| match p {
                Part::Text(_) => sys::mtmd_input_part {
                    text: t,
                    bitmap: std::ptr::null(),
                },
                Part::Image(b) => sys::mtmd_input_part {
                    text: std::ptr::null(),
                    bitmap: b.ptr.as_ptr(),
                },
            })
            .collect();
        let refs: Vec<*const sys::mtmd_input_part> = inputs.iter().map(|p| p as *const _).collect();
        // SAFETY: returns a new, empty list we own (freed by `Chunks`' Drop).
        let out = NonNull::new(unsafe { sys::mtmd_input_chunks_init() })
            .ok_or_else(|| Error::Internal("mtmd_input_chunks_init returned null".into()))?;
        let chunks = Chunks { ptr: out };
        // SAFETY: every part points at text (with its length) or a bitmap that outlives this
        // call; `refs` holds `parts.len()` valid pointers; tokenize is thread-safe.
        let (rc, logged) = capture_logs(|| unsafe {
            sys::mtmd_tokenize_from_parts(
                self.raw(),
                chunks.ptr.as_ptr(),
                refs.as_ptr(),
                refs.len(),
                add_special,
            )
        });
        if rc != 0 {
            return Err(Error::ImageDecode(format!(
                "the projector could not preprocess the image (code {rc}{}); send a different image",
                if logged.is_empty() { String::new() } else { format!(": {logged}") }
            )));
        }
        Ok(chunks)
    }

    /// Whether the model decodes image chunk `i` of `chunks` with non-causal attention.
    pub fn non_causal(&self, chunks: &Chunks, i: usize) -> bool {
        // SAFETY: `chunk` is a live chunk of `chunks`; reads flags only.
        unsafe { sys::mtmd_decode_use_non_causal(self.raw(), chunks.chunk(i)) }
    }

    /// Runs the vision encoder on image chunk `i`: its embeddings, `n_tokens × n_embd` floats.
    pub fn encode(&mut self, chunks: &Chunks, i: usize) -> Result<Vec<f32>> {
        let Piece::Image { n_tokens, .. } = chunks.piece(i) else {
            return Err(Error::Internal(format!("chunk {i} is not an image")));
        };
        let chunk = chunks.chunk(i);
        // SAFETY: `chunk` is a live image chunk of `chunks`; `&mut self` keeps encodes of this
        // projector one at a time.
        let (rc, logged) = capture_logs(|| unsafe { sys::mtmd_encode_chunk(self.raw(), chunk) });
        if rc != 0 {
            return Err(Error::ImageDecode(format!(
                "the vision encoder failed on the image (code {rc}{})",
                if logged.is_empty() {
                    String::new()
                } else {
                    format!(": {logged}")
                }
            )));
        }
        // SAFETY: after a successful encode mtmd holds n_tokens × n_embd floats there, valid
        // until the next encode (which needs `&mut self`); copied out at once.
        let out = unsafe { sys::mtmd_get_output_embd(self.raw()) };
        if out.is_null() {
            return Err(Error::Internal("mtmd returned no embeddings".into()));
        }
        // SAFETY: see above.
        Ok(unsafe { std::slice::from_raw_parts(out, n_tokens * self.n_embd) }.to_vec())
    }
}

impl Drop for Projector {
    fn drop(&mut self) {
        // SAFETY: the context is not used after this; the model it read is still alive (`model`
        // is dropped after this body).
        unsafe { sys::mtmd_free(self.raw()) }
    }
}

/// A decoded image (RGB), ready to tokenize.
pub struct Bitmap {
    ptr: NonNull<sys::mtmd_bitmap>,
}

// SAFETY: a bitmap is plain owned pixel data; nothing in it is tied to a thread.
unsafe impl Send for Bitmap {}

impl Bitmap {
    /// An image from RGB pixels decoded elsewhere (`pixels`: `nx × ny × 3` bytes, rows top
    /// first), named `id` (the SHA-256 hex of its file's bytes, as `decode_image` names them).
    pub fn from_rgb(nx: u32, ny: u32, pixels: &[u8], id: &str) -> Result<Bitmap> {
        if pixels.len() as u64 != u64::from(nx) * u64::from(ny) * 3 {
            return Err(Error::ImageDecode(format!(
                "{} bytes of pixels for a {nx}×{ny} RGB image; send a complete image file",
                pixels.len()
            )));
        }
        let id = CString::new(id).map_err(|_| Error::invalid("an image id contains a NUL byte"))?;
        // SAFETY: `pixels` holds nx × ny × 3 bytes (checked above), which mtmd copies.
        let ptr = NonNull::new(unsafe { sys::mtmd_bitmap_init(nx, ny, pixels.as_ptr()) })
            .ok_or_else(|| Error::ImageDecode("the image could not be allocated".into()))?;
        // SAFETY: a bitmap we own; mtmd copies the id.
        unsafe { sys::mtmd_bitmap_set_id(ptr.as_ptr(), id.as_ptr()) };
        Ok(Bitmap { ptr })
    }

    /// Width and height in pixels.
    pub fn size(&self) -> (u32, u32) {
        // SAFETY: reads fields of the bitmap we own.
        unsafe {
            (
                sys::mtmd_bitmap_get_nx(self.ptr.as_ptr()),
                sys::mtmd_bitmap_get_ny(self.ptr.as_ptr()),
            )
        }
    }
}

impl Drop for Bitmap {
    fn drop(&mut self) {
        // SAFETY: we own the bitmap; chunks tokenized from it copied what they need.
        unsafe { sys::mtmd_bitmap_free(self.ptr.as_ptr()) }
    }
}

/// One input of `Projector::tokenize`.
pub enum Part<'a> {
    Text(&'a str),
    Image(&'a Bitmap),
}

/// What one chunk of a tokenized prompt is.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(Vec<Token>),
    /// `n_tokens` embedding rows taking `n_pos` positions; `id` is the SHA-256 (hex) of the
    /// image file's bytes.
    Image {
        n_tokens: usize,
        n_pos: Pos,
        id: String,
    },
}

/// A tokenized prompt: text runs and image chunks, in order.
pub struct Chunks {
    ptr: NonNull<sys::mtmd_input_chunks>,
}

// SAFETY: the list is never modified after `mtmd_tokenize_from_parts` fills it: every later call
// takes it (and its chunks) by const pointer, and reads of it from several threads are reads of
// plain owned data.
unsafe impl Send for Chunks {}
// SAFETY: see above.
unsafe impl Sync for Chunks {}

impl Chunks {
    pub fn len(&self) -> usize {
        // SAFETY: reads the size of the list we own.
        unsafe { sys::mtmd_input_chunks_size(self.ptr.as_ptr()) }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn chunk(&self, i: usize) -> *const sys::mtmd_input_chunk {
        assert!(i < self.len(), "chunk index {i} out of range");
        // SAFETY: `i` is in range; the chunk lives as long as the list.
        unsafe { sys::mtmd_input_chunks_get(self.ptr.as_ptr(), i) }
    }

    /// What chunk `i` holds.
    pub fn piece(&self, i: usize) -> Piece {
        let chunk = self.chunk(i);
        // SAFETY: `chunk` is live (see `chunk`); the getters read its fields, and the token
        // array returned holds `n` tokens while the list lives (copied out here).
        unsafe {
            if sys::mtmd_input_chunk_get_type(chunk) == sys::MTMD_INPUT_CHUNK_TYPE_TEXT {
                let mut n = 0usize;
                let p = sys::mtmd_input_chunk_get_tokens_text(chunk, &mut n);
                let tokens = if p.is_null() || n == 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(p, n).to_vec()
                };
                Piece::Text(tokens)
            } else {
                let id = sys::mtmd_input_chunk_get_id(chunk);
                let id = if id.is_null() {
                    String::new()
                } else {
                    std::ffi::CStr::from_ptr(id).to_string_lossy().into_owned()
                };
                Piece::Image {
                    n_tokens: sys::mtmd_input_chunk_get_n_tokens(chunk),
                    n_pos: sys::mtmd_input_chunk_get_n_pos(chunk),
                    id,
                }
            }
        }
    }
}

impl Drop for Chunks {
    fn drop(&mut self) {
        // SAFETY: we own the list and every chunk in it; nothing borrows them past this.
        unsafe { sys::mtmd_input_chunks_free(self.ptr.as_ptr()) }
    }
}
