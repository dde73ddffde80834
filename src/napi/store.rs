//! The store members of `SessionContext` behind lib/BranchStore.js: batched produce, commit and
//! prefill, retainOnly, leases and KV pressure.

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::branch::Produced;
use super::cancel::{run_cancellable, CancelArg};
use super::context::{Engine, SessionContext};
use super::convert::{js, Arg, Result};
use crate::engine::speculate::Drafted;
use crate::error::Error;

/// What a speculative step kept of one branch's draft.
#[napi(object)]
pub struct VerifiedDraft {
    /// The draft tokens the branch accepted (a prefix of its draft), after its token.
    pub accepted: Vec<Produced>,
    /// The token sampled where the draft and the branch parted (or past the whole draft): the
    /// branch's next token, to commit next instead of sampling again. `null` for an empty
    /// draft (a plain commit: sample next as usual) and when every candidate is masked.
    pub next: Option<Produced>,
}

/// KV cache usage, counting cells shared by forks once.
#[napi(object)]
pub struct KvPressureInfo {
    /// Total KV cells of the context.
    pub n_ctx: u32,
    /// Cells held by live branches and by unleased sequences with content.
    pub cells_used: u32,
    /// `nCtx - cellsUsed`.
    pub remaining: u32,
}

#[napi]
impl SessionContext {
    /// Samples several branches in one native call.
    #[napi(js_name = "_storeProduce")]
    pub fn _store_produce(&self, handles: Vec<f64>) -> Result<Vec<Produced>> {
        let handles = self.ids.from_js_all(&handles).map_err(js)?;
        let sampled = self.sync("store.produce", |e| {
            Ok(e.store.sample_many(&handles, &e.pool))
        })?;
        handles
            .iter()
            .zip(sampled)
            .map(|(&h, sampled)| {
                let token = sampled.map_err(js)?.ok_or_else(|| {
                    js(Error::Grammar(format!(
                        "branch {}: every candidate is masked (grammar, bias or steer)",
                        self.ids.to_js(h)
                    )))
                })?;
                Ok(self.produced(token))
            })
            .collect()
    }

    /// One token per branch: each is accepted into its branch, then ONE decode for all.
    #[napi(js_name = "_storeCommit", ts_return_type = "Promise<void>")]
    pub fn _store_commit<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number[]")] handles: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "number[]")] tokens: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "CancelToken | undefined")] cancel: CancelArg,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let flag = cancel.get("_storeCommit")?;
            let handles = self.ids.from_js_all(
                &handles.get("_storeCommit: handles", "an array of branch handles")?,
            )?;
            let tokens =
                self.tokens(&tokens.get("_storeCommit: tokens", "an array of token ids")?)?;
            if handles.len() != tokens.len() {
                return Err(Error::invalid(
                    "handles and tokens must have the same length",
                ));
            }
            let items: Vec<_> = handles.into_iter().zip(tokens).collect();
            Ok(move |e: &mut Engine| {
                run_cancellable(e, flag, |e, cancel| {
                    e.store.commit(&mut e.ctx, &e.pool, &items, true, cancel)
                })
            })
        })
    }

    /// One token per branch plus a draft of tokens to follow it, in ONE decode with a row per
    /// token; each branch keeps the longest prefix of its draft its own sampler agrees with.
    #[napi(
        js_name = "_storeCommitDrafts",
        ts_return_type = "Promise<VerifiedDraft[]>"
    )]
    pub fn _store_commit_drafts<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number[]")] handles: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "number[]")] tokens: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "number[][]")] drafts: Arg<Vec<Vec<f64>>>,
        #[napi(ts_arg_type = "CancelToken | undefined")] cancel: CancelArg,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let method = "_storeCommitDrafts";
            let flag = cancel.get(method)?;
            let handles = self.ids.from_js_all(
                &handles.get("_storeCommitDrafts: handles", "an array of branch handles")?,
            )?;
            let tokens =
                self.tokens(&tokens.get("_storeCommitDrafts: tokens", "an array of token ids")?)?;
            let drafts = drafts.get("_storeCommitDrafts: drafts", "an array of token-id arrays")?;
            if handles.len() != tokens.len() || handles.len() != drafts.len() {
                return Err(Error::invalid(
                    "handles, tokens and drafts must have the same length",
                ));
            }
            let items = handles
                .into_iter()
                .zip(tokens)
                .zip(drafts)
                .map(|((branch, token), draft)| {
                    Ok(Drafted {
                        branch,
                        token,
                        draft: self.tokens(&draft)?,
                    })
                })
                .collect::<crate::error::Result<Vec<_>>>()?;
            let model = self.model.clone();
            Ok(move |e: &mut Engine| {
                let is_eog = |t| model.is_eog(t);
                let verified = run_cancellable(e, flag, |e, cancel| {
                    e.store
                        .commit_drafts(&mut e.ctx, &e.pool, &items, &is_eog, cancel)
                })?;
                let produced = |token| Produced {
                    token,
                    text: model.token_to_text(token),
                    is_stop: model.is_eog(token),
                };
                Ok(items
                    .iter()
                    .zip(verified)
                    .map(|(item, v)| VerifiedDraft {
                        accepted: item.draft[..v.accepted]
                            .iter()
                            .map(|&t| produced(t))
                            .collect(),
                        next: v.next.map(produced),
                    })
                    .collect::<Vec<_>>())
            })
        })
    }

    /// Token runs for several branches, bin-packed into nBatch-sized decodes; no accept.
    /// `scoreFrom[i]` (an index into entry i's tokens, or null) also scores those tokens from
    /// there on; resolves each entry's per-token log-probabilities (null where not asked).
    #[napi(
        js_name = "_storePrefill",
        ts_return_type = "Promise<Array<number[] | null>>"
    )]
    pub fn _store_prefill<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number[]")] handles: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "number[][]")] token_arrays: Arg<Vec<Vec<f64>>>,
        #[napi(ts_arg_type = "CancelToken | undefined")] cancel: CancelArg,
        #[napi(ts_arg_type = "Array<number | null> | undefined")] score_from: Arg<
            Option<Vec<Option<f64>>>,
        >,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let flag = cancel.get("_storePrefill")?;
            let handles = self.ids.from_js_all(
                &handles.get("_storePrefill: handles", "an array of branch handles")?,
            )?;
            let arrays =
                token_arrays.get("_storePrefill: tokens", "an array of token-id arrays")?;
            if handles.len() != arrays.len() {
                return Err(Error::invalid(
                    "handles and token arrays must have the same length",
                ));
            }
            let score_from = match score_from.get(
                "_storePrefill: scoreFrom",
                "an array of token indices or nulls",
            )? {
                None => vec![None; handles.len()],
                Some(v) if v.len() != handles.len() => {
                    return Err(Error::invalid(
                        "give one score start (a token index or null) per prefill entry",
                    ))
                }
                Some(v) => v
                    .into_iter()
                    .map(|k| match k {
                        None => Ok(None),
                        Some(k) if k >= 0.0 && k.fract() == 0.0 && k <= u32::MAX as f64 => {
                            Ok(Some(k as usize))
                        }
                        Some(k) => Err(Error::invalid(format!(
                            "a score start must be a token index (an integer >= 0), got {k}"
                        ))),
                    })
                    .collect::<crate::error::Result<Vec<_>>>()?,
            };
            let items = handles
                .into_iter()
                .zip(arrays)
                .map(|(h, t)| Ok((h, self.tokens(&t)?)))
                .collect::<crate::error::Result<Vec<_>>>()?;
            Ok(move |e: &mut Engine| {
                run_cancellable(e, flag, |e, cancel| {
                    e.store
                        .prefill_scored(&mut e.ctx, &items, &score_from, None, cancel)
                })
            })
        })
    }

    /// Keeps only `winner` (one `seq_keep` pass), in call order; resolves the freed handles.
    #[napi(js_name = "_storeRetainOnly", ts_return_type = "Promise<number[]>")]
    pub fn _store_retain_only<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] handle: Arg<f64>,
    ) -> Result<Object<'env>> {
        self.free_in_order(env, "_storeRetainOnly: handle", handle, |e, h| {
            e.store.retain_only(&e.ctx, h)
        })
    }

    #[napi(js_name = "_storeAvailable")]
    pub fn _store_available(&self) -> Result<u32> {
        self.sync("available", |e| Ok(e.store.available(&e.ctx)))
    }

    /// KV usage; with `without`, as if those branches were pruned (nothing is).
    #[napi(js_name = "_storeKvPressure")]
    pub fn _store_kv_pressure(&self, without: Option<Vec<f64>>) -> Result<KvPressureInfo> {
        let without = without
            .map(|handles| self.ids.from_js_all(&handles))
            .transpose()
            .map_err(js)?;
        self.sync("kvPressure", |e| {
            let p = match &without {
                Some(handles) => e.store.kv_pressure_without(&e.ctx, handles)?,
                None => e.store.kv_pressure(&e.ctx),
            };
            Ok(KvPressureInfo {
                n_ctx: p.n_ctx,
                cells_used: p.cells_used,
                remaining: p.remaining,
            })
        })
    }

    #[napi(js_name = "_storeLiveHandles")]
    pub fn _store_live_handles(&self) -> Result<Vec<f64>> {
        let ids = self.ids;
        self.sync(
            "liveHandles",
            |e| Ok(ids.to_js_all(&e.store.live_handles())),
        )
    }
}
