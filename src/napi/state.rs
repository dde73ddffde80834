//! Per-sequence state on `SessionContext`: save/load of one sequence's KV cells, in memory and
//! in files. Lease rule (as for raw decodes): reading a sequence's state works on any sequence;
//! loading into one refuses a sequence leased by a live branch (its position must keep
//! mirroring its KV).

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::context::{Engine, SessionContext};
use super::convert::{js, seq_from, Arg, Result};
use super::images::{spans_from, ImageSpanObject};
use super::raw::ensure_unleased;
use crate::engine::saved_state::check_path;
use crate::engine::state_file::{parse_state_file, state_file_bytes};
use crate::error::Error;
use crate::llama::{self, SeqId};

/// Replaces the cells of `seq` by running `load`; on any failure the sequence gets its previous
/// cells back (llama.cpp's loaders empty the destination before they validate the data).
fn load_atomically<T>(
    ctx: &llama::Context,
    seq: SeqId,
    load: impl FnOnce(&llama::Context) -> crate::error::Result<T>,
) -> crate::error::Result<T> {
    let backup = if ctx.seq_pos_max(seq) >= 0 {
        Some(ctx.seq_state(seq)?)
    } else {
        None
    };
    ctx.seq_rm(seq, -1, -1);
    let result = load(ctx).and_then(|value| {
        let (min, max) = (ctx.seq_pos_min(seq), ctx.seq_pos_max(seq));
        if max >= 0 && (min < 0 || max >= ctx.n_ctx() as i32) {
            return Err(Error::State(format!(
                "the loaded state holds positions {min}..{max}, outside this context's [0, nCtx = {})",
                ctx.n_ctx()
            )));
        }
        Ok(value)
    });
    if result.is_err() {
        ctx.seq_rm(seq, -1, -1);
        if let Some(previous) = backup {
            ctx.set_seq_state(seq, &previous);
        }
    }
    result
}

fn ensure_not_empty(engine: &Engine, seq: SeqId) -> crate::error::Result<()> {
    if engine.ctx.seq_pos_max(seq) < 0 {
        return Err(Error::invalid(format!(
            "sequence {seq} is empty: there is no state to save; decode into it first"
        )));
    }
    Ok(())
}

/// Loads a `kvCacheSave` buffer into `seq` (inside [`load_atomically`]).
fn load_state(
    ctx: &llama::Context,
    seq: SeqId,
    data: &[u8],
    what: &str,
) -> crate::error::Result<()> {
    let read = ctx.set_seq_state(seq, data);
    if read == 0 {
        return Err(Error::State(format!(
            "{what}: llama.cpp rejected the state: it is truncated, corrupt, from another model or context configuration, or too large for the free KV cells; sequence {seq} is unchanged"
        )));
    }
    if read != data.len() {
        return Err(Error::State(format!(
            "{what}: the state has {} unexpected trailing bytes; sequence {seq} is unchanged",
            data.len() - read
        )));
    }
    Ok(())
}

fn read_file(path: &str) -> crate::error::Result<Vec<u8>> {
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::invalid(format!("cannot open the state file {path}: {e}")))?;
    if !meta.is_file() {
        return Err(Error::invalid(format!(
            "cannot open the state file {path}: not a regular file"
        )));
    }
    std::fs::read(path)
        .map_err(|e| Error::invalid(format!("cannot open the state file {path}: {e}")))
}

/// What {@link SessionContext.kvCacheReadFile} resolves.
#[napi(object)]
pub struct KvFileContents {
    /// The tokens stored with the state.
    pub tokens: Vec<i32>,
    /// Size of the file, in bytes.
    pub bytes_read: f64,
}

#[napi]
impl SessionContext {
    /// The state of one sequence (its KV cells) as a Buffer for `kvCacheLoad`.
    #[napi(ts_args_type = "seqId?: number", ts_return_type = "Promise<Buffer>")]
    pub fn kv_cache_save<'env>(
        &self,
        env: &'env Env,
        seq_id: Arg<Option<f64>>,
    ) -> Result<Object<'env>> {
        self.spawn_keeping_logits(env, || {
            let seq = seq_from(
                seq_id
                    .get("kvCacheSave: seqId", "a sequence id")?
                    .unwrap_or(0.0),
                self.info.n_seq_max,
            )?;
            Ok(move |e: &mut Engine| {
                ensure_not_empty(e, seq)?;
                Ok(Buffer::from(e.ctx.seq_state(seq)?))
            })
        })
    }

    /// Replaces sequence `seqId`'s cells with a state from `kvCacheSave`.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn kv_cache_load<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] seq_id: Arg<f64>,
        #[napi(ts_arg_type = "Buffer | Uint8Array")] state: Arg<Buffer>,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let seq = seq_from(seq_id.get("kvCacheLoad: seqId", "a sequence id")?, self.info.n_seq_max)?;
            let data = state.get("kvCacheLoad: state", "a Buffer from kvCacheSave")?.to_vec();
            if data.is_empty() {
                return Err(Error::invalid(
                    "kvCacheLoad: the state buffer is empty; pass a Buffer from kvCacheSave",
                ));
            }
            if data.len() < 8 || data[..4] != llama::SEQ_STATE_MAGIC.to_le_bytes() {
                return Err(Error::State(
                    "kvCacheLoad: the buffer is not a sequence state from kvCacheSave (wrong header)"
                        .into(),
                ));
            }
            Ok(move |e: &mut Engine| {
                ensure_unleased(e, seq, "kvCacheLoad")?;
                load_atomically(&e.ctx, seq, |ctx| load_state(ctx, seq, &data, "kvCacheLoad"))
            })
        })
    }

    /// Writes sequence `seqId`'s state and `tokens` to `path`; resolves the bytes written.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn kv_cache_write_file<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] seq_id: Arg<f64>,
        #[napi(ts_arg_type = "string")] path: Arg<String>,
        #[napi(ts_arg_type = "number[]")] tokens: Arg<Vec<f64>>,
    ) -> Result<Object<'env>> {
        self.spawn_keeping_logits(env, || {
            let seq = seq_from(
                seq_id.get("kvCacheWriteFile: seqId", "a sequence id")?,
                self.info.n_seq_max,
            )?;
            let path = path.get("kvCacheWriteFile: path", "a file path")?;
            check_path("kvCacheWriteFile", &path)?;
            let tokens =
                self.tokens(&tokens.get("kvCacheWriteFile: tokens", "an array of token ids")?)?;
            if tokens.len() > self.info.n_ctx as usize {
                return Err(Error::invalid(format!(
                    "kvCacheWriteFile: {} tokens exceed nCtx = {}",
                    tokens.len(),
                    self.info.n_ctx
                )));
            }
            Ok(move |e: &mut Engine| {
                ensure_not_empty(e, seq)?;
                let bytes = state_file_bytes(&tokens, &e.ctx.seq_state(seq)?);
                std::fs::write(&path, &bytes).map_err(|err| {
                    Error::invalid(format!("cannot write the state file {path}: {err}"))
                })?;
                Ok(bytes.len() as f64)
            })
        })
    }

    /// Loads a `kvCacheWriteFile` file into sequence `seqId`; resolves `{tokens, bytesRead}`.
    #[napi(ts_return_type = "Promise<KvFileContents>")]
    pub fn kv_cache_read_file<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] seq_id: Arg<f64>,
        #[napi(ts_arg_type = "string")] path: Arg<String>,
    ) -> Result<Object<'env>> {
        let (n_ctx, n_vocab) = (self.info.n_ctx, self.info.n_vocab);
        self.spawn(env, || {
            let seq = seq_from(
                seq_id.get("kvCacheReadFile: seqId", "a sequence id")?,
                self.info.n_seq_max,
            )?;
            let path = path.get("kvCacheReadFile: path", "a file path")?;
            check_path("kvCacheReadFile", &path)?;
            Ok(move |e: &mut Engine| {
                ensure_unleased(e, seq, "kvCacheReadFile")?;
                let bytes = read_file(&path)?;
                let (tokens, state) = parse_state_file(&path, &bytes, seq, n_ctx, n_vocab)?;
                load_atomically(&e.ctx, seq, |ctx| {
                    load_state(ctx, seq, &state, &format!("kvCacheReadFile({path})"))
                })?;
                Ok(KvFileContents {
                    tokens,
                    bytes_read: bytes.len() as f64,
                })
            })
        })
    }
}

#[napi]
impl SessionContext {
    /// The state of a branch's sequence (its KV cells) as a Buffer, on the calling thread: the
    /// prefix cache copies an entry it evicts while the scheduler decides what fits, where an
    /// awaited job would leave the context busy for the synchronous calls around it.
    #[napi(js_name = "_branchStateSync")]
    pub fn _branch_state_sync(&self, handle: f64) -> Result<Buffer> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let state = self.sync("branch state", |e| {
            // A branch holding images is copied too: its cells hold them, and the prefix cache
            // keeps the images' places beside the bytes (`_branchRestore`'s `images`).
            let b = e.store.get(h)?;
            b.check_not_parked()?;
            let seq = b.seq;
            ensure_not_empty(e, seq)?;
            e.ctx.seq_state(seq)
        })?;
        Ok(Buffer::from(state))
    }

    /// A new root branch holding a state from `_branchStateSync` (on a vacant sequence, after
    /// the queued operations), cut to its first `keep` positions when `keep` > 0 (the prefix
    /// cache restores a prompt's entry one token short, so the prompt's last token gives the
    /// logits a state does not carry). `images`: where the state's images sit (an entry with
    /// images), those wholly below the cut kept; a cut inside one is ERR_IMAGE_POSITIONS.
    /// Resolves the handle; a state llama.cpp refuses leaves nothing behind and rejects with
    /// ERR_STATE.
    #[napi(js_name = "_branchRestore", ts_return_type = "Promise<number>")]
    pub fn _branch_restore<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "Buffer")] state: Arg<Buffer>,
        #[napi(ts_arg_type = "number")] keep: Arg<f64>,
        #[napi(ts_arg_type = "ImageSpanObject[] | undefined")] images: Arg<
            Option<Vec<ImageSpanObject>>,
        >,
    ) -> Result<Object<'env>> {
        let ids = self.ids;
        self.spawn(env, || {
            let data = state.get("_branchRestore: state", "a Buffer")?.to_vec();
            let keep = keep.get("_branchRestore: keep", "a number")?;
            let images = images.get("_branchRestore: images", "image spans")?;
            let images = spans_from(images, self.info.n_ctx as i64, "_branchRestore")?;
            if data.len() < 8 || data[..4] != llama::SEQ_STATE_MAGIC.to_le_bytes() {
                return Err(Error::State(
                    "_branchRestore: the buffer is not a sequence state (wrong header)".into(),
                ));
            }
            if !(keep.is_finite() && keep >= 0.0 && keep.fract() == 0.0 && keep <= self.info.n_ctx as f64) {
                return Err(Error::invalid(format!("_branchRestore: keep must be an integer in [0, nCtx = {}]", self.info.n_ctx)));
            }
            let keep = keep as i32;
            let sampling = self.branch_sampling(None)?;
            Ok(move |e: &mut Engine| {
                let ctx = &e.ctx;
                if keep > 0 {
                    crate::engine::media::check_not_inside(&images, keep)?;
                }
                let h = e.store.create_loaded(ctx, sampling, |seq| {
                    load_state(ctx, seq, &data, "restoring a cached prefix")?;
                    let (min, max) = (ctx.seq_pos_min(seq), ctx.seq_pos_max(seq));
                    if min < 0 || max >= ctx.n_ctx() as i32 {
                        return Err(Error::State(format!("the restored state holds positions {min}..{max}, outside this context's [0, nCtx = {})", ctx.n_ctx())));
                    }
                    // A cut that llama.cpp refuses (or one past the state's end) is an error.
                    if keep > 0 && (keep > max + 1 || !ctx.seq_rm(seq, keep, -1)) {
                        return Err(Error::State(format!("the restored state ends at position {max}: it cannot be cut to its first {keep} positions")));
                    }
                    match images.last() {
                        Some(s) if s.start + s.n_pos > max + 1 => Err(Error::State(format!(
                            "the restored state ends at position {max}, before its image at [{}, {})",
                            s.start,
                            s.start + s.n_pos
                        ))),
                        _ => Ok(()),
                    }
                })?;
                let end = if keep > 0 { keep } else { i32::MAX };
                e.store.take_images(h, crate::engine::media::images_below(&images, end))?;
                Ok(ids.to_js(h))
            })
        })
    }
}
