//! Raw KV and state members of `SessionContext`: whole-cache reseeding, keeping one sequence,
//! per-sequence state save/load (in memory and in files) and the atomic decode + logits copy.
//!
//! Lease rule (same as `decode` / `kvCacheRemove`): reading a sequence's state works on any
//! sequence; writing one refuses a sequence leased by a live branch (its position must keep
//! mirroring its KV); whole-cache writes refuse while any (other) branch lives.

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::{ensure_unleased, int_in, raw_decode, seq_from, Engine, SessionContext};
use crate::error::{Error, Result};
use crate::ffi::{self, Token};
use crate::worker::to_js;

#[napi(object)]
pub struct KvFileContents {
    /// The tokens stored next to the state by `kvCacheWriteFile`.
    pub tokens: Vec<i32>,
    /// Size of the file read, in bytes.
    pub bytes_read: f64,
}

/// Replaces the cells of `seq` by running `load`; on any failure the sequence gets its previous
/// cells back (llama.cpp's loaders empty the destination before they validate the data).
fn load_atomically<T>(
    ctx: &ffi::Context,
    seq: i32,
    load: impl FnOnce(&ffi::Context) -> Result<T>,
) -> Result<T> {
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

fn ensure_not_empty(engine: &Engine, seq: i32) -> Result<()> {
    if engine.ctx.seq_pos_max(seq) < 0 {
        return Err(Error::invalid(format!(
            "sequence {seq} is empty: there is no state to save; decode into it first"
        )));
    }
    Ok(())
}

fn check_path(path: &str) -> Result<()> {
    if path.is_empty() {
        return Err(Error::invalid("path must be a non-empty file path"));
    }
    Ok(())
}

/// Loads a `kvCacheSave` buffer into `seq` (inside [`load_atomically`]).
fn load_state(ctx: &ffi::Context, seq: i32, data: &[u8], what: &str) -> Result<()> {
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

/// The file layout of llama.cpp's `llama_state_seq_save_file` (so files interoperate with
/// llama.cpp tools), written and parsed here rather than by llama.cpp, whose file loader
/// asserts (aborts the process) on some truncated files.
fn state_file_bytes(tokens: &[Token], state: &[u8]) -> Vec<u8> {
    let body = &state[8..]; // without the in-memory (magic, seq id) prefix
    let mut out = Vec::with_capacity(12 + 4 * tokens.len() + body.len());
    out.extend_from_slice(&ffi::SEQ_FILE_MAGIC.to_le_bytes());
    out.extend_from_slice(&ffi::SEQ_FILE_VERSION.to_le_bytes());
    out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// Parses a state file into its tokens and an in-memory state buffer for [`load_state`].
fn parse_state_file(
    path: &str,
    bytes: &[u8],
    seq: i32,
    n_ctx: u32,
    n_vocab: i32,
) -> Result<(Vec<Token>, Vec<u8>)> {
    let not_state = |why: &str| {
        Error::State(format!(
            "{path} is not a usable sequence state file written by kvCacheWriteFile ({why})"
        ))
    };
    if bytes.len() < 12 {
        return Err(not_state("shorter than its 12-byte header"));
    }
    let word = |i: usize| u32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap());
    if word(0) != ffi::SEQ_FILE_MAGIC {
        return Err(not_state("wrong magic number"));
    }
    if word(1) != ffi::SEQ_FILE_VERSION {
        return Err(not_state(&format!(
            "format version {}, this build reads version {}",
            word(1),
            ffi::SEQ_FILE_VERSION
        )));
    }
    let n_tokens = word(2) as usize;
    if n_tokens > n_ctx as usize {
        return Err(not_state(&format!(
            "it lists {n_tokens} tokens, more than nCtx = {n_ctx}"
        )));
    }
    let state_at = 12 + 4 * n_tokens;
    if state_at >= bytes.len() {
        return Err(not_state("truncated before its state data"));
    }
    let tokens = bytes[12..state_at]
        .chunks_exact(4)
        .map(|b| {
            let t = i32::from_le_bytes(b.try_into().unwrap());
            if t < 0 || t >= n_vocab {
                Err(not_state(&format!(
                    "token {t} is outside this model's vocabulary"
                )))
            } else {
                Ok(t)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let mut state = Vec::with_capacity(8 + bytes.len() - state_at);
    state.extend_from_slice(&ffi::SEQ_STATE_MAGIC.to_le_bytes());
    state.extend_from_slice(&seq.to_le_bytes());
    state.extend_from_slice(&bytes[state_at..]);
    Ok((tokens, state))
}

fn read_file(path: &str) -> Result<Vec<u8>> {
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

#[napi]
impl SessionContext {
    /// Removes every sequence's cells except `seqId`'s.
    #[napi]
    pub fn kv_seq_keep(&self, seq_id: f64) -> napi::Result<()> {
        let seq = seq_from(seq_id, self.info.n_seq_max).map_err(to_js)?;
        self.sync("kvSeqKeep", |e| {
            let others = e
                .store
                .live_handles()
                .into_iter()
                .filter(|&h| e.store.get(h).is_ok_and(|b| b.seq != seq))
                .count();
            if others > 0 {
                return Err(Error::invalid(format!(
                    "kvSeqKeep({seq}) would delete the KV of {others} live branch(es) on other sequences; prune them first (or use store.retainOnly)"
                )));
            }
            e.ctx.seq_keep(seq);
            Ok(())
        })
    }

    /// Clears the whole KV cache, then decodes `sinks` at position 0 and `tail` right after
    /// them into sequence 0 (logits for the last token).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn clear_and_reseed<'env>(
        &self,
        env: &'env Env,
        sinks: Vec<f64>,
        tail: Vec<f64>,
    ) -> napi::Result<Object<'env>> {
        let mut tokens = self.tokens(&sinks)?;
        tokens.extend(self.tokens(&tail)?);
        if tokens.is_empty() {
            return Err(to_js(Error::invalid(
                "clearAndReseed needs at least one token in sinks or tail",
            )));
        }
        if tokens.len() > self.info.n_ctx as usize {
            return Err(to_js(Error::KvFull(format!(
                "{} reseed tokens do not fit in nCtx = {}",
                tokens.len(),
                self.info.n_ctx
            ))));
        }
        self.submit(env, move |engine| {
            if !engine.store.is_empty() {
                return Err(Error::invalid(format!(
                    "{} live branch(es) use the KV cache; prune them (or use store.retainOnly) before clearAndReseed",
                    engine.store.len()
                )));
            }
            engine.store.clear(&engine.ctx);
            engine.ctx.clear_memory();
            raw_decode(engine, &tokens, 0, 0, &|| false)
        })
    }

    /// The state of one sequence (its KV cells) as a Buffer for `kvCacheLoad`.
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn kv_cache_save<'env>(
        &self,
        env: &'env Env,
        seq_id: Option<f64>,
    ) -> napi::Result<Object<'env>> {
        let seq = seq_from(seq_id.unwrap_or(0.0), self.info.n_seq_max).map_err(to_js)?;
        self.submit_keeping_logits(env, move |engine| {
            ensure_not_empty(engine, seq)?;
            Ok(Buffer::from(engine.ctx.seq_state(seq)?))
        })
    }

    /// Replaces sequence `seqId`'s cells with a state from `kvCacheSave`.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn kv_cache_load<'env>(
        &self,
        env: &'env Env,
        seq_id: f64,
        state: Buffer,
    ) -> napi::Result<Object<'env>> {
        let seq = seq_from(seq_id, self.info.n_seq_max).map_err(to_js)?;
        let data = state.to_vec();
        if data.is_empty() {
            return Err(to_js(Error::invalid(
                "kvCacheLoad: the state buffer is empty; pass a Buffer from kvCacheSave",
            )));
        }
        if data.len() < 8 || data[..4] != ffi::SEQ_STATE_MAGIC.to_le_bytes() {
            return Err(to_js(Error::State(
                "kvCacheLoad: the buffer is not a sequence state from kvCacheSave (wrong header)"
                    .into(),
            )));
        }
        self.submit(env, move |engine| {
            ensure_unleased(engine, seq, "kvCacheLoad")?;
            load_atomically(&engine.ctx, seq, |ctx| {
                load_state(ctx, seq, &data, "kvCacheLoad")
            })
        })
    }

    /// Writes sequence `seqId`'s state and `tokens` to `path`; resolves the bytes written.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn kv_cache_write_file<'env>(
        &self,
        env: &'env Env,
        seq_id: f64,
        path: String,
        tokens: Vec<f64>,
    ) -> napi::Result<Object<'env>> {
        let seq = seq_from(seq_id, self.info.n_seq_max).map_err(to_js)?;
        check_path(&path).map_err(to_js)?;
        let tokens = self.tokens(&tokens)?;
        if tokens.len() > self.info.n_ctx as usize {
            return Err(to_js(Error::invalid(format!(
                "kvCacheWriteFile: {} tokens exceed nCtx = {}",
                tokens.len(),
                self.info.n_ctx
            ))));
        }
        self.submit_keeping_logits(env, move |engine| {
            ensure_not_empty(engine, seq)?;
            let bytes = state_file_bytes(&tokens, &engine.ctx.seq_state(seq)?);
            std::fs::write(&path, &bytes)
                .map_err(|e| Error::invalid(format!("cannot write the state file {path}: {e}")))?;
            Ok(bytes.len() as f64)
        })
    }

    /// Loads a `kvCacheWriteFile` file into sequence `seqId`; resolves `{tokens, bytesRead}`.
    #[napi(ts_return_type = "Promise<KvFileContents>")]
    pub fn kv_cache_read_file<'env>(
        &self,
        env: &'env Env,
        seq_id: f64,
        path: String,
    ) -> napi::Result<Object<'env>> {
        let seq = seq_from(seq_id, self.info.n_seq_max).map_err(to_js)?;
        check_path(&path).map_err(to_js)?;
        let (n_ctx, n_vocab) = (self.info.n_ctx, self.info.n_vocab);
        self.submit(env, move |engine| {
            ensure_unleased(engine, seq, "kvCacheReadFile")?;
            let bytes = read_file(&path)?;
            let (tokens, state) = parse_state_file(&path, &bytes, seq, n_ctx, n_vocab)?;
            load_atomically(&engine.ctx, seq, |ctx| {
                load_state(ctx, seq, &state, &format!("kvCacheReadFile({path})"))
            })?;
            Ok(KvFileContents {
                tokens,
                bytes_read: bytes.len() as f64,
            })
        })
    }

    /// Raw decode (as `decode`) that also returns a copy of the last token's logits, taken on
    /// the worker right after the decode. `lib/raw.js` copies it into the caller's buffer.
    #[napi(
        js_name = "_decodeAndCapture",
        ts_return_type = "Promise<Float32Array>"
    )]
    pub fn _decode_and_capture<'env>(
        &self,
        env: &'env Env,
        tokens: Vec<f64>,
        position: f64,
        seq_id: f64,
    ) -> napi::Result<Object<'env>> {
        let tokens = self.tokens(&tokens)?;
        if tokens.is_empty() {
            return Err(to_js(Error::invalid(
                "decodeAndCapture needs at least one token",
            )));
        }
        let position =
            int_in("position", position, 0, self.info.n_ctx as i64).map_err(to_js)? as i32;
        let seq = seq_from(seq_id, self.info.n_seq_max).map_err(to_js)?;
        self.submit(env, move |engine| {
            ensure_unleased(engine, seq, "decodeAndCapture")?;
            raw_decode(engine, &tokens, position, seq, &|| false)?;
            Ok(Float32Array::new(engine.ctx.logits_at(-1)?.to_vec()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_state(seq: i32, body: &[u8]) -> Vec<u8> {
        let mut s = ffi::SEQ_STATE_MAGIC.to_le_bytes().to_vec();
        s.extend_from_slice(&seq.to_le_bytes());
        s.extend_from_slice(body);
        s
    }

    #[test]
    fn state_file_round_trips_tokens_and_state_for_any_destination() {
        let file = state_file_bytes(&[1, 2, 3], &fake_state(0, b"cells"));
        assert_eq!(
            &file[..4],
            b"qsgg",
            "llama.cpp's 'ggsq' magic, little-endian"
        );
        assert_eq!(file.len(), 12 + 3 * 4 + 5);
        let (tokens, state) = parse_state_file("f", &file, 2, 16, 10).unwrap();
        assert_eq!(tokens, vec![1, 2, 3]);
        assert_eq!(state, fake_state(2, b"cells"));
    }

    #[test]
    fn state_file_without_tokens_parses() {
        let file = state_file_bytes(&[], &fake_state(0, b"x"));
        let (tokens, state) = parse_state_file("f", &file, 0, 16, 10).unwrap();
        assert!(tokens.is_empty());
        assert_eq!(state, fake_state(0, b"x"));
    }

    #[test]
    fn malformed_state_files_are_state_errors() {
        let good = state_file_bytes(&[1, 2], &fake_state(0, b"cells"));
        let parse = |bytes: &[u8]| parse_state_file("f", bytes, 0, 16, 10).unwrap_err();
        let mut wrong_magic = good.clone();
        wrong_magic[0] ^= 1;
        let mut wrong_version = good.clone();
        wrong_version[4] = 9;
        let mut too_many = good.clone();
        too_many[8..12].copy_from_slice(&17u32.to_le_bytes());
        let mut bad_token = good.clone();
        bad_token[12..16].copy_from_slice(&10i32.to_le_bytes());
        let cases: Vec<(&[u8], &str)> = vec![
            (&good[..11], "header"),
            (&wrong_magic, "magic"),
            (&wrong_version, "version 9"),
            (&too_many, "more than nCtx"),
            (&good[..20], "truncated"),
            (&bad_token, "vocabulary"),
        ];
        for (bytes, why) in cases {
            let e = parse(bytes);
            assert_eq!(e.code(), "ERR_STATE");
            assert!(e.to_string().contains(why), "{e} should mention {why}");
        }
    }
}
