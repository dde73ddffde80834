//! Raw decoding and KV members of `SessionContext`, for sequences no branch leases: `decode`,
//! the zero-copy `getLogits()`, `decodeAndCapture`, and the KV cache calls.
//!
//! Lease rule: a raw write to a sequence a live branch leases is refused (the branch's position
//! must keep mirroring its KV; use the branch API); whole-cache writes refuse while any (other)
//! branch lives.

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::cancel::{run_cancellable, CancelArg};
use super::context::{Engine, SessionContext};
use super::convert::{int_in, js, position_from, position_range, seq_from, Arg, Result};
use crate::engine::decode::{Output, Run};
use crate::error::Error;
use crate::llama::{Pos, SeqId, Token};

/// Refuses raw KV writes on a sequence a live branch leases.
pub(super) fn ensure_unleased(engine: &Engine, seq: SeqId, what: &str) -> crate::error::Result<()> {
    if engine.store.owner_of(seq).is_some() {
        return Err(Error::invalid(format!(
            "sequence {seq} is leased by a live branch; {what} would desynchronise it. Use the branch API (prefill/commit/prune) or prune the branch first"
        )));
    }
    Ok(())
}

/// Raw decode of `tokens` into `seq` at `position`, chunked by nBatch, logits on the last token;
/// all-or-nothing (see the decode engine).
fn raw_decode(
    engine: &mut Engine,
    tokens: &[Token],
    position: Pos,
    seq: SeqId,
    cancel: &dyn Fn() -> bool,
) -> crate::error::Result<()> {
    let run = [Run {
        seq,
        start: position,
        tokens,
        output: Output::Last,
    }];
    engine.decode(&run, cancel, &mut |_, _| Ok(()))
}

/// The arguments of `decode`/`decodeAndCapture`: tokens (at least one), position, sequence.
fn decode_args(
    ctx: &SessionContext,
    tokens: Arg<Vec<f64>>,
    position: Arg<f64>,
    seq_id: Arg<Option<f64>>,
    what: &str,
) -> crate::error::Result<(Vec<Token>, Pos, SeqId)> {
    let tokens = ctx.tokens(&tokens.get(&format!("{what}: tokens"), "an array of token ids")?)?;
    if tokens.is_empty() {
        return Err(Error::invalid(format!("{what} needs at least one token")));
    }
    let position = position_from(
        position.get(&format!("{what}: position"), "a number")?,
        ctx.info.n_ctx,
    )?;
    let seq = seq_from(
        seq_id
            .get(&format!("{what}: seqId"), "a sequence id")?
            .unwrap_or(0.0),
        ctx.info.n_seq_max,
    )?;
    Ok((tokens, position, seq))
}

#[napi]
impl SessionContext {
    #[napi(
        ts_args_type = "tokens: number[], position: number, seqId?: number, cancel?: CancelToken",
        ts_return_type = "Promise<void>"
    )]
    pub fn decode<'env>(
        &self,
        env: &'env Env,
        tokens: Arg<Vec<f64>>,
        position: Arg<f64>,
        seq_id: Arg<Option<f64>>,
        cancel: CancelArg,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let flag = cancel.get("decode")?;
            let (tokens, position, seq) = decode_args(self, tokens, position, seq_id, "decode")?;
            Ok(move |e: &mut Engine| {
                run_cancellable(e, flag, |e, cancel| {
                    ensure_unleased(e, seq, "a raw decode")?;
                    raw_decode(e, &tokens, position, seq, cancel)
                })
            })
        })
    }

    /// Raw decode (as `decode`) that also returns a copy of the last token's logits, taken on
    /// the worker right after the decode. `lib/raw.js` copies it into the caller's buffer.
    #[napi(
        js_name = "_decodeAndCapture",
        ts_args_type = "tokens: number[], position: number, seqId?: number",
        ts_return_type = "Promise<Float32Array>"
    )]
    pub fn _decode_and_capture<'env>(
        &self,
        env: &'env Env,
        tokens: Arg<Vec<f64>>,
        position: Arg<f64>,
        seq_id: Arg<Option<f64>>,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let (tokens, position, seq) =
                decode_args(self, tokens, position, seq_id, "decodeAndCapture")?;
            Ok(move |e: &mut Engine| {
                ensure_unleased(e, seq, "decodeAndCapture")?;
                raw_decode(e, &tokens, position, seq, &|| false)?;
                Ok(Float32Array::new(e.ctx.logits_row(-1)?.to_vec()))
            })
        })
    }

    /// Zero-copy view of the logits row of the last decode (length vocabSize), revoked by the
    /// next operation that may rewrite it (see `LogitsView`).
    #[napi(ts_return_type = "Float32Array")]
    pub fn get_logits<'env>(&self, env: &'env Env, this: This) -> Result<Unknown<'env>> {
        let row = self.sync("getLogits", |e| e.ctx.logits_row_ptr(-1))?;
        let mut view = self
            .logits_view
            .try_borrow_mut()
            .map_err(|_| js(Error::ContextBusy("getLogits")))?;
        // SAFETY: the row stays valid until the next decode or dispose, and both revoke the view
        // before they run; `this` keeps the context alive while the view is reachable.
        let array = unsafe { view.view(env, row, self.info.n_vocab as usize, this.raw()) }?;
        // SAFETY: `array` was just created in this env.
        unsafe { Unknown::from_napi_value(env.raw(), array) }.map_err(super::convert::internal)
    }

    /// Highest position in the sequence, or -1 when it is empty.
    #[napi]
    pub fn kv_seq_pos_max(&self, seq_id: f64) -> Result<i32> {
        let seq = seq_from(seq_id, self.info.n_seq_max).map_err(js)?;
        self.sync("kvSeqPosMax", |e| Ok(e.ctx.seq_pos_max(seq)))
    }

    #[napi]
    pub fn kv_cache_size(&self, seq_id: Option<f64>) -> Result<i32> {
        self.kv_seq_pos_max(seq_id.unwrap_or(0.0))
    }

    #[napi(ts_return_type = "Promise<void>")]
    pub fn kv_cache_clear<'env>(&self, env: &'env Env) -> Result<Object<'env>> {
        self.spawn(env, || {
            Ok(|e: &mut Engine| {
                if !e.store.is_empty() {
                    return Err(Error::invalid(format!(
                        "{} live branch(es) use the KV cache; prune them (or use store.retainOnly) before clearing it",
                        e.store.len()
                    )));
                }
                e.store.clear(&e.ctx);
                e.ctx.clear_memory();
                Ok(())
            })
        })
    }

    #[napi(ts_return_type = "Promise<void>")]
    pub fn kv_cache_remove<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] seq_id: Arg<f64>,
        #[napi(ts_arg_type = "number")] start: Arg<f64>,
        #[napi(ts_arg_type = "number")] end: Arg<f64>,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let seq = seq_from(seq_id.get("kvCacheRemove: seqId", "a sequence id")?, self.info.n_seq_max)?;
            let start = int_in("start", start.get("kvCacheRemove: start", "a number")?, -1, i32::MAX as i64)? as Pos;
            let end = int_in("end", end.get("kvCacheRemove: end", "a number")?, -1, i32::MAX as i64)? as Pos;
            Ok(move |e: &mut Engine| {
                ensure_unleased(e, seq, "kvCacheRemove")?;
                if !e.ctx.seq_rm(seq, start, end) {
                    return Err(Error::State(format!("llama.cpp could not remove positions [{start}, {end}) of sequence {seq} (partial removal is not supported for this model's memory)")));
                }
                Ok(())
            })
        })
    }

    /// Makes `dst` hold exactly `src`'s cells in positions `[p0, p1)` (default: all), shared.
    #[napi]
    pub fn kv_seq_copy(&self, src: f64, dst: f64, p0: Option<f64>, p1: Option<f64>) -> Result<()> {
        let src = seq_from(src, self.info.n_seq_max).map_err(js)?;
        let dst = seq_from(dst, self.info.n_seq_max).map_err(js)?;
        let (p0, p1) = position_range(p0, p1).map_err(js)?;
        if src == dst {
            return Err(js(Error::invalid(format!(
                "kvSeqCopy: src and dst are both sequence {src}; pick two different sequences"
            ))));
        }
        self.sync("kvSeqCopy", |e| {
            // A branch created ahead of its prefix on `dst` receives it here (the reference's
            // order: Branch.create(ctx, dst, n), then kvSeqCopy(src, dst)).
            if let Some(h) = e.store.owner_of(dst) {
                return e.store.adopt_copy(&e.ctx, h, src, p0, p1);
            }
            e.ctx.seq_rm(dst, -1, -1);
            e.ctx.seq_cp(src, dst, p0, p1);
            Ok(())
        })
    }

    /// Removes every sequence's cells except `seqId`'s.
    #[napi]
    pub fn kv_seq_keep(&self, seq_id: f64) -> Result<()> {
        let seq = seq_from(seq_id, self.info.n_seq_max).map_err(js)?;
        self.sync("kvSeqKeep", |e| {
            let others = e
                .store
                .live_handles()
                .into_iter()
                .filter(|&h| e.store.get(h).is_ok_and(|b| b.seq != seq || b.is_parked()))
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
        #[napi(ts_arg_type = "number[]")] sinks: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "number[]")] tail: Arg<Vec<f64>>,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let mut tokens = self.tokens(&sinks.get("clearAndReseed: sinks", "an array of token ids")?)?;
            tokens.extend(self.tokens(&tail.get("clearAndReseed: tail", "an array of token ids")?)?);
            if tokens.is_empty() {
                return Err(Error::invalid(
                    "clearAndReseed needs at least one token in sinks or tail",
                ));
            }
            if tokens.len() > self.info.n_ctx as usize {
                return Err(Error::KvFull(format!(
                    "{} reseed tokens do not fit in nCtx = {}",
                    tokens.len(),
                    self.info.n_ctx
                )));
            }
            Ok(move |e: &mut Engine| {
                if !e.store.is_empty() {
                    return Err(Error::invalid(format!(
                        "{} live branch(es) use the KV cache; prune them (or use store.retainOnly) before clearAndReseed",
                        e.store.len()
                    )));
                }
                e.store.clear(&e.ctx);
                e.ctx.clear_memory();
                raw_decode(e, &tokens, 0, 0, &|| false)
            })
        })
    }
}
