//! Saved-state files on `SessionContext`: this context's fingerprint (what a file must have been
//! saved under to load here), and the prefix cache's entry files (lib/scheduler/cache-file.js)
//! read and written as jobs on the context's worker, off the JS thread. The container is
//! engine/saved_state/, the entry payload engine/prefix_file.rs.

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::context::{Engine, SessionContext};
use super::convert::{Arg, Result};
use super::images::{spans_from, ImageSpanObject};
use crate::engine::fingerprint::Fingerprint;
use crate::engine::kv_types::KvConfig;
use crate::engine::media::IMAGE_POSITION;
use crate::engine::prefix_file::{
    parse_prefix_file, prefix_file_bytes, prefix_file_size, read_prefix_tokens, Prefix,
};
use crate::engine::saved_state::{check_path, read_file, write_atomically, Limits};
use crate::error::Error;
use crate::llama::{Model, SEQ_FILE_VERSION, SEQ_STATE_MAGIC};

/// This context's fingerprint: the model (size, parameters, GGUF metadata), llama.cpp's
/// sequence-state format and the KV settings that change a state's bytes.
pub(super) fn fingerprint_of(model: &Model, kv: &KvConfig) -> Fingerprint {
    Fingerprint::new(
        model.size_bytes(),
        model.n_params(),
        &model.metadata(),
        &model.description(),
        SEQ_FILE_VERSION,
        format!(
            "typeK={} typeV={} flashAttention={}{}",
            kv.type_k.name(),
            kv.type_v.name(),
            kv.flash_attention.name(),
            // Only deterministic contexts say so, so every file written before the option
            // existed keeps its fingerprint.
            if kv.deterministic {
                " deterministic"
            } else {
                ""
            }
        ),
    )
}

/// What identifies the states this context writes (its fingerprint), for the prefix cache's file
/// names: two contexts with equal identities read each other's files.
#[napi(object)]
pub struct StateIdentity {
    /// The model's hash (size, parameters, every GGUF metadata pair), 16 hex digits.
    pub model: String,
    /// llama.cpp's sequence state format version.
    pub state_format: u32,
    /// The KV settings that change a state's bytes (`typeK=… typeV=… flashAttention=…`).
    pub kv: String,
}

/// A prefix-cache entry file read whole (`_prefixFileRead`).
#[napi(object)]
pub struct PrefixFile {
    /// The prefix; -1 at an image's positions.
    pub tokens: Vec<i32>,
    /// The images in the prefix.
    pub images: Vec<ImageSpanObject>,
    /// The sequence state, for `_branchRestore`.
    pub state: Buffer,
    /// Size of the file.
    pub bytes: f64,
}

/// A prefix-cache entry file's head (`_prefixFileTokens`).
#[napi(object)]
pub struct PrefixFileHead {
    /// The prefix; -1 at an image's positions.
    pub tokens: Vec<i32>,
    /// The images in the prefix.
    pub images: Vec<ImageSpanObject>,
    /// Size of the file.
    pub bytes: f64,
}

#[napi]
impl SessionContext {
    /// The identity of the states this context's sequences hold (see `StateIdentity`).
    #[napi(js_name = "_stateIdentity")]
    pub fn _state_identity(&self) -> Result<StateIdentity> {
        let fingerprint = fingerprint_of(&self.model, &self.info.kv);
        Ok(StateIdentity {
            model: format!("{:016x}", fingerprint.model),
            state_format: fingerprint.state_format,
            kv: fingerprint.kv,
        })
    }

    /// The size in bytes of the entry file `_prefixFileWrite` writes for `nTokens` tokens (with
    /// `images` among them) and a state of `stateBytes` bytes (the prefix cache's disk budget
    /// counts it before writing).
    #[napi(js_name = "_prefixFileSize")]
    pub fn _prefix_file_size(
        &self,
        n_tokens: u32,
        state_bytes: f64,
        images: Option<Vec<ImageSpanObject>>,
    ) -> f64 {
        let fingerprint = fingerprint_of(&self.model, &self.info.kv);
        let images: Vec<_> = images
            .unwrap_or_default()
            .iter()
            .map(ImageSpanObject::span)
            .collect();
        prefix_file_size(
            &fingerprint,
            n_tokens as usize,
            &images,
            state_bytes.max(0.0) as usize,
        ) as f64
    }

    /// Writes the prefix `tokens` (-1 at the positions of its `images`) with its `state` (from
    /// `_branchStateSync`) to `path` as a saved-state container, atomically; resolves the file's
    /// size. A failed write (a full,
    /// read-only or missing folder) rejects with ERR_INVALID_ARG and the system's reason, and
    /// leaves no temporary file.
    #[napi(js_name = "_prefixFileWrite", ts_return_type = "Promise<number>")]
    pub fn _prefix_file_write<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "string")] path: Arg<String>,
        #[napi(ts_arg_type = "number[]")] tokens: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "Buffer")] state: Arg<Buffer>,
        #[napi(ts_arg_type = "ImageSpanObject[] | undefined")] images: Arg<
            Option<Vec<ImageSpanObject>>,
        >,
    ) -> Result<Object<'env>> {
        let fingerprint = fingerprint_of(&self.model, &self.info.kv);
        self.spawn_keeping_logits(env, || {
            let path = path.get("_prefixFileWrite: path", "a file path")?;
            check_path("_prefixFileWrite", &path)?;
            let values = tokens.get("_prefixFileWrite: tokens", "token ids")?;
            let images = images.get("_prefixFileWrite: images", "image spans")?;
            let images = spans_from(images, values.len() as i64, "_prefixFileWrite")?;
            // An image's positions hold -1 (Prefix checks they agree with `images`).
            let tokens = values
                .iter()
                .map(|&v| match v == IMAGE_POSITION as f64 {
                    true => Ok(IMAGE_POSITION),
                    false => self.token(v),
                })
                .collect::<crate::error::Result<Vec<_>>>()?;
            let prefix = Prefix { tokens, images };
            let state = state.get("_prefixFileWrite: state", "a Buffer")?.to_vec();
            if state.len() < 8 || state[..4] != SEQ_STATE_MAGIC.to_le_bytes() {
                return Err(Error::invalid(
                    "_prefixFileWrite: the buffer is not a sequence state (wrong header)",
                ));
            }
            Ok(move |_: &mut Engine| {
                let bytes = prefix_file_bytes(&fingerprint, &prefix, &state)?;
                write_atomically(&path, &bytes)?;
                Ok(bytes.len() as f64)
            })
        })
    }

    /// Reads and checks a whole entry file: ERR_STATE_CORRUPT (truncated, corrupt, not such a
    /// file), ERR_STATE_MISMATCH (saved by a context with another fingerprint), ERR_INVALID_ARG
    /// (it cannot be opened; the message has the system's reason).
    #[napi(js_name = "_prefixFileRead", ts_return_type = "Promise<PrefixFile>")]
    pub fn _prefix_file_read<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "string")] path: Arg<String>,
    ) -> Result<Object<'env>> {
        let here = fingerprint_of(&self.model, &self.info.kv);
        let limits = self.prefix_limits();
        self.spawn_keeping_logits(env, || {
            let path = path.get("_prefixFileRead: path", "a file path")?;
            check_path("_prefixFileRead", &path)?;
            Ok(move |_: &mut Engine| {
                let bytes = read_file(&path)?;
                let (prefix, state) = parse_prefix_file(&path, &bytes, &limits, &here)?;
                Ok(PrefixFile {
                    images: prefix.images.iter().map(ImageSpanObject::of).collect(),
                    tokens: prefix.tokens,
                    state: Buffer::from(state),
                    bytes: bytes.len() as f64,
                })
            })
        })
    }

    /// An entry file's tokens from its head (a folder's listing), its fingerprint checked; the
    /// checksum is verified by `_prefixFileRead`. Errors as `_prefixFileRead`.
    #[napi(
        js_name = "_prefixFileTokens",
        ts_return_type = "Promise<PrefixFileHead>"
    )]
    pub fn _prefix_file_tokens<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "string")] path: Arg<String>,
    ) -> Result<Object<'env>> {
        let here = fingerprint_of(&self.model, &self.info.kv);
        let limits = self.prefix_limits();
        self.spawn_keeping_logits(env, || {
            let path = path.get("_prefixFileTokens: path", "a file path")?;
            check_path("_prefixFileTokens", &path)?;
            Ok(move |_: &mut Engine| {
                let (prefix, size) = read_prefix_tokens(&path, &limits, &here)?;
                Ok(PrefixFileHead {
                    images: prefix.images.iter().map(ImageSpanObject::of).collect(),
                    tokens: prefix.tokens,
                    bytes: size as f64,
                })
            })
        })
    }
}

impl SessionContext {
    fn prefix_limits(&self) -> Limits {
        Limits {
            n_ctx: self.info.n_ctx,
            n_vocab: self.info.n_vocab,
        }
    }
}
