//! The branch members of `SessionContext` behind lib/Branch.js: create, fork, free, sample,
//! accept, steer, per-branch decodes and getters. Handles are `BranchIds`-encoded.

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::cancel::{run_cancellable, CancelArg};
use super::context::{Engine, SessionContext};
use super::convert::{base_from, int_in, js, position_from, seq_from, Arg, Result};
use super::sampling::{SamplingParams, TokenBias};
use crate::engine::metrics;
use crate::engine::sampling::config;
use crate::engine::store::{CreateOptions, ForkOptions};
use crate::error::Error;
use crate::llama::Token;

/// The most alternatives a logprobs request may ask for (OpenAI's limit).
const MAX_TOP_LOGPROBS: i64 = 20;

/// A sampled token, not yet committed.
#[napi(object)]
pub struct Produced {
    pub token: i32,
    /// The token's text piece.
    pub text: String,
    /// True for end-of-generation tokens.
    pub is_stop: bool,
}

/// One of the most likely tokens at a position, with its log-probability.
#[napi(object)]
pub struct TopLogprob {
    pub token: i32,
    /// Natural log of its probability under the model's distribution (before sampling).
    pub logprob: f64,
}

/// A token's log-probability at the branch's position, and the most likely tokens there.
#[napi(object)]
pub struct TokenLogprob {
    pub token: i32,
    /// Natural log of the token's probability under the model's distribution (raw logits,
    /// before any sampler or grammar); `-Infinity` for a token the model rules out.
    pub logprob: f64,
    /// The `top` most likely tokens, most likely first.
    pub top: Vec<TopLogprob>,
}

#[napi(object)]
pub struct BranchInfo {
    /// -1 while parked (a parked branch holds no sequence).
    pub seq_id: i32,
    pub position: i32,
    pub fork_head: i32,
    /// 0 for a root.
    pub parent: f64,
    pub children: Vec<f64>,
    pub perplexity: f64,
    pub sampling_perplexity: f64,
    pub has_logits: bool,
    pub stochastic: bool,
    pub has_grammar: bool,
    /// Whether the branch is parked (engine/park.rs).
    pub parked: bool,
}

fn all_masked() -> Error {
    Error::Grammar("no token is allowed: every candidate is masked (grammar, bias or steer)".into())
}

impl SessionContext {
    pub(super) fn produced(&self, token: Token) -> Produced {
        Produced {
            token,
            text: self.model.token_to_text(token),
            is_stop: self.model.is_eog(token),
        }
    }
}

#[napi]
impl SessionContext {
    #[napi(js_name = "_branchCreate")]
    pub fn _branch_create(
        &self,
        position: f64,
        params: Option<SamplingParams>,
        n_batch: Option<f64>,
        seq_id: Option<f64>,
    ) -> Result<f64> {
        self.check_generates().map_err(js)?;
        let sampling = self.branch_sampling(params.as_ref()).map_err(js)?;
        let position = position_from(position, self.info.n_ctx).map_err(js)?;
        let n_batch = n_batch
            .map(|n| int_in("nBatch", n, 1, self.info.n_batch as i64).map(|n| n as u32))
            .transpose()
            .map_err(js)?;
        let seq = seq_id
            .map(|s| seq_from(s, self.info.n_seq_max))
            .transpose()
            .map_err(js)?;
        let opts = CreateOptions {
            position,
            seq,
            sampling,
            n_batch,
        };
        let h = self.sync("Branch.create", |e| e.store.create(&e.ctx, opts))?;
        Ok(self.ids.to_js(h))
    }

    /// A child sharing the parent's cells; with `position`, only those below it (the child then
    /// has no logits and a fresh sampler chain from the parent's parameters).
    #[napi(js_name = "_branchFork")]
    pub fn _branch_fork(
        &self,
        handle: f64,
        seq_id: Option<f64>,
        position: Option<f64>,
    ) -> Result<f64> {
        let parent = self.ids.from_js(handle).map_err(js)?;
        let seq = seq_id
            .map(|s| seq_from(s, self.info.n_seq_max))
            .transpose()
            .map_err(js)?;
        let position = position
            .map(|p| position_from(p, self.info.n_ctx))
            .transpose()
            .map_err(js)?;
        let h = self.sync("fork", |e| {
            let p = e.store.get(parent)?;
            let sampling = match position {
                Some(at) if at != p.position => {
                    Some(self.branch_sampling_from(p.config().clone())?)
                }
                _ => None,
            };
            let opts = ForkOptions {
                seq,
                position,
                sampling,
            };
            e.store.fork(&e.ctx, parent, opts)
        })?;
        Ok(self.ids.to_js(h))
    }

    /// Frees the branch and its KV tags (its children are re-parented), in call order with the
    /// context's queued operations. Resolves the freed handles.
    #[napi(js_name = "_branchPrune", ts_return_type = "Promise<number[]>")]
    pub fn _branch_prune<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] handle: Arg<f64>,
    ) -> Result<Object<'env>> {
        self.free_in_order(env, "_branchPrune: handle", handle, |e, h| {
            e.store.prune(&e.ctx, h)
        })
    }

    /// Frees the branch and all its descendants, in call order (as `_branchPrune`).
    #[napi(js_name = "_branchPruneSubtree", ts_return_type = "Promise<number[]>")]
    pub fn _branch_prune_subtree<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] handle: Arg<f64>,
    ) -> Result<Object<'env>> {
        self.free_in_order(env, "_branchPruneSubtree: handle", handle, |e, h| {
            e.store.prune_subtree(&e.ctx, h)
        })
    }

    /// `_branchPrune` on the calling thread, after any queued operation; returns the freed handles.
    #[napi(js_name = "_branchPruneSync")]
    pub fn _branch_prune_sync(&self, handle: f64) -> Result<Vec<f64>> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let freed = self.sync("pruneSync", |e| e.store.prune(&e.ctx, h))?;
        Ok(self.ids.to_js_all(&freed))
    }

    /// `_branchPruneSubtree` on the calling thread, after any queued operation.
    #[napi(js_name = "_branchPruneSubtreeSync")]
    pub fn _branch_prune_subtree_sync(&self, handle: f64) -> Result<Vec<f64>> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let freed = self.sync("pruneSubtreeSync", |e| e.store.prune_subtree(&e.ctx, h))?;
        Ok(self.ids.to_js_all(&freed))
    }

    /// Frees a branch whose JS object was garbage-collected without being freed, before the
    /// context's next operation (see `Released`). Silent: there is nobody to tell, and a branch
    /// already freed is fine.
    #[napi(js_name = "_branchRelease")]
    pub fn _branch_release(&self, handle: f64) {
        if let (Ok(h), Ok(mut list)) = (self.ids.from_js(handle), self.released.lock()) {
            list.push(h);
        }
    }

    /// Frees the branch but keeps its KV; returns the sequence id now usable with raw calls.
    #[napi(js_name = "_branchDestroy")]
    pub fn _branch_destroy(&self, handle: f64) -> Result<i32> {
        let h = self.ids.from_js(handle).map_err(js)?;
        self.sync("destroy", |e| e.store.destroy(&e.ctx, h))
    }

    #[napi(js_name = "_branchInfo")]
    pub fn _branch_info(&self, handle: f64) -> Result<BranchInfo> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let ids = self.ids;
        self.sync("branch getter", |e| {
            let b = e.store.get(h)?;
            Ok(BranchInfo {
                seq_id: if b.is_parked() { -1 } else { b.seq },
                position: b.position,
                fork_head: b.fork_head,
                parent: ids.to_js_opt(b.parent),
                children: ids.to_js_all(&b.children),
                perplexity: b.model_ppl.value(),
                sampling_perplexity: b.sampling_ppl.value(),
                has_logits: b.has_logits(),
                stochastic: b.is_stochastic(),
                has_grammar: b.has_grammar(),
                parked: b.is_parked(),
            })
        })
    }

    #[napi(js_name = "_branchPosition")]
    pub fn _branch_position(&self, handle: f64) -> Result<i32> {
        let h = self.ids.from_js(handle).map_err(js)?;
        self.sync("position", |e| Ok(e.store.get(h)?.position))
    }

    #[napi(js_name = "_branchCaptureLogits")]
    pub fn _branch_capture_logits(&self, handle: f64) -> Result<()> {
        let h = self.ids.from_js(handle).map_err(js)?;
        self.sync("captureLogits", |e| e.store.capture_logits(&e.ctx, h))
    }

    #[napi(js_name = "_branchGetLogits")]
    pub fn _branch_get_logits(&self, handle: f64) -> Result<Float32Array> {
        let h = self.ids.from_js(handle).map_err(js)?;
        self.sync("getLogits", |e| {
            Ok(Float32Array::new(e.store.get(h)?.logits()?.to_vec()))
        })
    }

    #[napi(js_name = "_branchLogprob")]
    pub fn _branch_logprob(&self, handle: f64, token: f64, top: f64) -> Result<TokenLogprob> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let token = self.token(token).map_err(js)?;
        let top = int_in("top", top, 0, MAX_TOP_LOGPROBS).map_err(js)? as usize;
        self.sync("logprob", |e| {
            let (logprob, best) = e.store.get(h)?.token_logprobs(token as usize, top)?;
            Ok(TokenLogprob {
                token,
                logprob,
                top: best
                    .into_iter()
                    .map(|(t, logprob)| TopLogprob {
                        token: t as i32,
                        logprob,
                    })
                    .collect(),
            })
        })
    }

    #[napi(js_name = "_branchEntropy")]
    pub fn _branch_entropy(&self, handle: f64, base: Option<String>) -> Result<f64> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let base = base_from(base).map_err(js)?;
        self.sync("entropy", |e| {
            Ok(metrics::entropy(e.store.get(h)?.logits()?, base))
        })
    }

    #[napi(js_name = "_branchSample")]
    pub fn _branch_sample(&self, handle: f64) -> Result<i32> {
        let h = self.ids.from_js(handle).map_err(js)?;
        self.sync("sample", |e| e.store.sample(h)?.ok_or_else(all_masked))
    }

    #[napi(js_name = "_branchAccept")]
    pub fn _branch_accept(&self, handle: f64, token: f64) -> Result<()> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let token = self.token(token).map_err(js)?;
        self.sync("accept", |e| e.store.accept(h, token))
    }

    #[napi(js_name = "_branchProduce")]
    pub fn _branch_produce(&self, handle: f64) -> Result<Produced> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let token = self.sync("produce", |e| e.store.sample(h)?.ok_or_else(all_masked))?;
        Ok(self.produced(token))
    }

    #[napi(js_name = "_branchSteer")]
    pub fn _branch_steer(&self, handle: f64, biases: Vec<TokenBias>) -> Result<()> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let list = biases
            .iter()
            .map(|b| config::token_bias(b.token, b.bias, self.info.n_vocab, "steer"))
            .collect::<crate::error::Result<Vec<_>>>()
            .map_err(js)?;
        self.sync("steer", |e| e.store.set_steer(h, list))
    }

    #[napi(js_name = "_branchReseed")]
    pub fn _branch_reseed(&self, handle: f64, seed: f64) -> Result<()> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let seed = int_in("seed", seed, 0, u32::MAX as i64).map_err(js)? as u32;
        let n_vocab = self.info.n_vocab;
        self.sync("reseedSampler", |e| e.store.reseed(h, seed, n_vocab))
    }

    #[napi(js_name = "_branchSetSamplerParams")]
    pub fn _branch_set_sampler_params(&self, handle: f64, params: SamplingParams) -> Result<()> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let sampling = self.branch_sampling(Some(&params)).map_err(js)?;
        self.sync("setSamplerParams", |e| e.store.set_sampling(h, sampling))
    }

    /// `grammar` empty or null removes it. With triggers the grammar is lazy: unconstrained until
    /// a trigger pattern (regex over generated text) or trigger token appears.
    #[napi(js_name = "_branchSetGrammar")]
    pub fn _branch_set_grammar(
        &self,
        handle: f64,
        grammar: Option<String>,
        trigger_patterns: Option<Vec<String>>,
        trigger_tokens: Option<Vec<f64>>,
    ) -> Result<()> {
        let h = self.ids.from_js(handle).map_err(js)?;
        let tokens = self
            .tokens(&trigger_tokens.unwrap_or_default())
            .map_err(js)?;
        let patterns = trigger_patterns.unwrap_or_default();
        let sampler = match grammar.filter(|g| !g.is_empty()) {
            None => None,
            Some(g) => {
                let lazy = (!patterns.is_empty() || !tokens.is_empty())
                    .then_some((patterns.as_slice(), tokens.as_slice()));
                let sampler = crate::llama::Sampler::grammar(&self.model, &g, lazy).map_err(js)?;
                let spec = crate::engine::branch::GrammarSpec {
                    gbnf: g,
                    trigger_patterns: patterns,
                    trigger_tokens: tokens,
                };
                Some((sampler, spec))
            }
        };
        self.sync("setGrammar", |e| e.store.set_grammar(h, sampler))
    }

    /// Decodes one token without accepting it (no sampler, grammar or perplexity update).
    #[napi(
        js_name = "_branchDecodeAndCaptureOne",
        ts_return_type = "Promise<void>"
    )]
    pub fn _branch_decode_and_capture_one<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] handle: Arg<f64>,
        #[napi(ts_arg_type = "number")] token: Arg<f64>,
        #[napi(ts_arg_type = "CancelToken | undefined")] cancel: CancelArg,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let flag = cancel.get("_branchDecodeAndCaptureOne")?;
            let h = self
                .ids
                .from_js(handle.get("_branchDecodeAndCaptureOne: handle", "a branch handle")?)?;
            let token =
                self.token(token.get("_branchDecodeAndCaptureOne: token", "a token id")?)?;
            Ok(move |e: &mut Engine| {
                run_cancellable(e, flag, |e, cancel| {
                    e.store
                        .commit(&mut e.ctx, &e.pool, &[(h, token)], false, cancel)
                })
            })
        })
    }

    /// Prefill of one branch, chunked by that branch's own nBatch.
    #[napi(js_name = "_branchPrefill", ts_return_type = "Promise<void>")]
    pub fn _branch_prefill<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] handle: Arg<f64>,
        #[napi(ts_arg_type = "number[]")] tokens: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "CancelToken | undefined")] cancel: CancelArg,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let flag = cancel.get("_branchPrefill")?;
            let h = self
                .ids
                .from_js(handle.get("_branchPrefill: handle", "a branch handle")?)?;
            let tokens =
                self.tokens(&tokens.get("_branchPrefill: tokens", "an array of token ids")?)?;
            Ok(move |e: &mut Engine| {
                run_cancellable(e, flag, |e, cancel| {
                    let limit = e.store.get(h)?.n_batch;
                    e.store
                        .prefill(&mut e.ctx, &[(h, tokens)], Some(limit), cancel)
                })
            })
        })
    }
}
