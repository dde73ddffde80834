//! The rest of the context-level surface: `ctx.sample(params)` with its persistent chain,
//! grammar sampler handles, perplexity tracker handles, embeddings, and `jsonSchemaToGrammar`.
//!
//! Busy rule: calls that read or write the context's logits/embeddings (`sample`,
//! `applySampler`, `getEmbeddings`) go through `SessionContext::sync` and throw
//! `ERR_CONTEXT_BUSY` while an async operation is pending. Grammar handles (other than
//! `applySampler`) and perplexity trackers own no llama.cpp context state, so they work at any
//! time; they live in `ApiState` behind their own locks instead of inside `Engine`.

use std::sync::{Arc, Mutex, MutexGuard};

use napi::bindgen_prelude::*;
use napi::{Env, JsValue, Task, ValueType};
use napi_derive::napi;

use super::{ensure_unleased, SamplingParams, SessionContext};
use crate::error::{Error, Result};
use crate::ffi::{self, Model, Sampler, Token, TokenData};
use crate::handles::{Handle, HandleTable};
use crate::metrics::Perplexity;
use crate::sampling::{self, Chain, SamplingConfig};
use crate::worker::to_js;

/// `ctx.sample(params)`'s chain, kept between calls while the resolved params stay equal.
struct SampleState {
    chain: Chain,
    candidates: Vec<TokenData>,
    bias_scratch: Vec<f32>,
}

/// Per-context state of this module. Freed by `dispose()` (and with the context object).
pub(super) struct ApiState {
    /// `llama_pooling_type` of the context (fixed at creation).
    pooling: i32,
    sample: Mutex<Option<SampleState>>,
    grammars: Mutex<HandleTable<Sampler>>,
    trackers: Mutex<HandleTable<Perplexity>>,
    /// Declared last so the weights outlive the samplers above when the context is collected.
    _model: Arc<Model>,
}

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::Internal("api state lock poisoned by an earlier panic".into()))
}

impl ApiState {
    pub(super) fn new(pooling: i32, model: Arc<Model>) -> ApiState {
        ApiState {
            _model: model,
            pooling,
            sample: Mutex::new(None),
            grammars: Mutex::new(HandleTable::default()),
            trackers: Mutex::new(HandleTable::default()),
        }
    }

    /// Frees the sample chain, every grammar sampler and every tracker (on `dispose()`).
    pub(super) fn clear(&self) {
        if let Ok(mut s) = self.sample.lock() {
            s.take();
        }
        if let Ok(mut g) = self.grammars.lock() {
            *g = HandleTable::default();
        }
        if let Ok(mut t) = self.trackers.lock() {
            *t = HandleTable::default();
        }
    }
}

/// A grammar-sampler or tracker handle from JS: an integer in [1, 2^32).
fn handle_arg(v: f64, kind: &str) -> Result<Handle> {
    if !v.is_finite() || v.fract() != 0.0 || v < 1.0 || v > u32::MAX as f64 {
        return Err(Error::invalid(format!(
            "{kind} handle must be a positive integer, got {v}"
        )));
    }
    Ok(v as Handle)
}

fn unknown(kind: &str, h: Handle, create: &str) -> Error {
    Error::invalid(format!(
        "unknown {kind} handle {h} (never created on this context, or already freed); create one with {create}()"
    ))
}

fn insert<T>(table: &mut HandleTable<T>, value: T, kind: &str, free: &str) -> Result<u32> {
    table.insert(value).ok_or_else(|| {
        Error::invalid(format!(
            "too many live {kind}s on this context (65535); free unused ones with {free}()"
        ))
    })
}

const GRAMMAR: &str = "grammar sampler";
const TRACKER: &str = "perplexity tracker";

/// Scales `v` to unit L2 norm; a (near-)zero vector is left as it is.
fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 1e-8 {
        for x in v.iter_mut() {
            *x = (*x as f64 / norm) as f32;
        }
    }
}

impl SessionContext {
    fn check_vocab_row(&self, len: usize, what: &str) -> Result<()> {
        if len != self.info.n_vocab as usize {
            return Err(Error::invalid(format!(
                "{what} must be a Float32Array of length vocabSize = {}, got length {len}",
                self.info.n_vocab
            )));
        }
        Ok(())
    }

    fn require_embeddings(&self, what: &str) -> Result<()> {
        if !self.info.embeddings {
            return Err(Error::Unsupported(format!(
                "{what} needs an embedding context; create one with createContext({{ modelPath, embeddings: true }})"
            )));
        }
        Ok(())
    }
}

/// Used by `modelEntropy` / `modelSurprisal` for their optional logits argument.
pub(super) fn check_logits_arg(ctx: &SessionContext, len: usize) -> napi::Result<()> {
    ctx.live()?;
    ctx.check_vocab_row(len, "logits").map_err(to_js)
}

#[napi]
impl SessionContext {
    // -------------------------------------------------------------------------------------
    // Sampling from the context's logits

    /// Without params: argmax of the context's last logits row (same as `greedySample()`).
    /// With params: samples through a chain kept per context and rebuilt only when the resolved
    /// params differ from the previous call's; the chosen token is accepted into it.
    #[napi]
    pub fn sample(&self, env: &Env, params: Option<Unknown<'_>>) -> napi::Result<i32> {
        // Read the params by hand: napi-rs would turn a number or string into default params.
        let params = match params.as_ref().map(|p| p.get_type()).transpose()? {
            None | Some(ValueType::Undefined) | Some(ValueType::Null) => {
                return self.greedy_sample();
            }
            Some(ValueType::Object) => {
                let raw = params.map(|p| p.raw()).unwrap_or(std::ptr::null_mut());
                unsafe { SamplingParams::from_napi_value(env.raw(), raw)? }
            }
            Some(other) => {
                return Err(to_js(Error::invalid(format!(
                    "sample(params): params must be a SamplingParams object or undefined, got {other}"
                ))));
            }
        };
        if params.grammar.as_deref().is_some_and(|g| !g.is_empty()) {
            return Err(to_js(Error::invalid(
                "ctx.sample() does not take a grammar: use createSampler() + applySampler() on getLogits(), or a Branch with a grammar",
            )));
        }
        let config: SamplingConfig = self.config(Some(params))?;
        let model = self.model.clone();
        let n_ctx = self.info.n_ctx;
        self.sync("sample", |e| {
            let logits = e.ctx.logits_at(-1)?;
            let mut state = lock(&self.api.sample)?;
            if state.as_ref().is_none_or(|s| s.chain.config() != &config) {
                *state = Some(SampleState {
                    chain: Chain::build(config.clone(), &model, n_ctx)?,
                    candidates: Vec::new(),
                    bias_scratch: Vec::new(),
                });
            }
            let Some(SampleState {
                chain,
                candidates,
                bias_scratch,
            }) = state.as_mut()
            else {
                return Err(Error::Internal("sample chain missing".into()));
            };
            let logits = sampling::biased(logits, &[&config.logit_bias], bias_scratch);
            let token = sampling::sample(chain, None, logits, candidates)?
                .ok_or_else(|| {
                    Error::Grammar("no token is allowed: logitBias masks every candidate".into())
                })?
                .token;
            chain.accept(token)?;
            Ok(token)
        })
    }

    // -------------------------------------------------------------------------------------
    // Grammar sampler handles

    /// Parses a GBNF grammar (root rule `root`) into a new sampler handle.
    #[napi]
    pub fn create_sampler(&self, grammar: String) -> napi::Result<u32> {
        self.live()?;
        if grammar.trim().is_empty() {
            return Err(to_js(Error::Grammar(
                "the grammar is empty; pass GBNF text with a `root` rule".into(),
            )));
        }
        let sampler = ffi::grammar_sampler(&self.model, &grammar, "root", None).map_err(to_js)?;
        let mut table = lock(&self.api.grammars).map_err(to_js)?;
        insert(&mut table, sampler, GRAMMAR, "freeSamplerHandle").map_err(to_js)
    }

    /// Sets every logit the grammar forbids in its current state to -Infinity, in place.
    #[napi]
    pub fn apply_sampler(&self, handle: f64, mut logits: Float32Array) -> napi::Result<()> {
        let h = handle_arg(handle, GRAMMAR).map_err(to_js)?;
        self.check_vocab_row(logits.len(), "logits")
            .map_err(to_js)?;
        self.sync("applySampler", |_| {
            let mut table = lock(&self.api.grammars)?;
            let grammar = table
                .get_mut(h)
                .ok_or_else(|| unknown(GRAMMAR, h, "createSampler"))?;
            // SAFETY: the array is alive for this call and only this thread touches it; the busy
            // rule keeps the worker from writing a logits view of it meanwhile.
            let data = unsafe { logits.as_mut() };
            let mut candidates = Vec::with_capacity(data.len());
            sampling::all_candidates(data, &mut candidates);
            grammar.apply(&mut candidates, false);
            for c in &candidates {
                data[c.id as usize] = c.logit;
            }
            Ok(())
        })
    }

    /// Advances the grammar by `token`; a token the grammar forbids is refused
    /// (`ERR_GRAMMAR_REJECTED`) and leaves the grammar unchanged.
    #[napi]
    pub fn accept_sampler_token(&self, handle: f64, token: f64) -> napi::Result<()> {
        self.live()?;
        let h = handle_arg(handle, GRAMMAR).map_err(to_js)?;
        let token: Token = self.token(token)?;
        let mut table = lock(&self.api.grammars).map_err(to_js)?;
        let grammar = table
            .get_mut(h)
            .ok_or_else(|| to_js(unknown(GRAMMAR, h, "createSampler")))?;
        // llama.cpp throws (or aborts, for an end-of-generation token) on a forbidden token.
        if !sampling::grammar_allows(grammar, token, 0.0) {
            return Err(to_js(Error::GrammarRejected(token)));
        }
        grammar.accept(token).map_err(to_js)
    }

    /// A new handle with a copy of the grammar's current parse state.
    #[napi]
    pub fn clone_sampler(&self, handle: f64) -> napi::Result<u32> {
        self.live()?;
        let h = handle_arg(handle, GRAMMAR).map_err(to_js)?;
        let mut table = lock(&self.api.grammars).map_err(to_js)?;
        let copy = table
            .get(h)
            .ok_or_else(|| unknown(GRAMMAR, h, "createSampler"))
            .and_then(|g| g.try_clone())
            .map_err(to_js)?;
        insert(&mut table, copy, GRAMMAR, "freeSamplerHandle").map_err(to_js)
    }

    /// Frees a grammar sampler. An unknown or already freed handle is an error.
    #[napi]
    pub fn free_sampler_handle(&self, handle: f64) -> napi::Result<()> {
        self.live()?;
        let h = handle_arg(handle, GRAMMAR).map_err(to_js)?;
        let mut table = lock(&self.api.grammars).map_err(to_js)?;
        table
            .remove(h)
            .map(drop)
            .ok_or_else(|| to_js(unknown(GRAMMAR, h, "createSampler")))
    }

    // -------------------------------------------------------------------------------------
    // Perplexity trackers

    fn with_tracker<T>(
        &self,
        handle: f64,
        f: impl FnOnce(&mut Perplexity) -> T,
    ) -> napi::Result<T> {
        self.live()?;
        let h = handle_arg(handle, TRACKER).map_err(to_js)?;
        let mut table = lock(&self.api.trackers).map_err(to_js)?;
        let tracker = table
            .get_mut(h)
            .ok_or_else(|| to_js(unknown(TRACKER, h, "createPerplexityTracker")))?;
        Ok(f(tracker))
    }

    #[napi]
    pub fn create_perplexity_tracker(&self) -> napi::Result<u32> {
        self.live()?;
        let mut table = lock(&self.api.trackers).map_err(to_js)?;
        insert(
            &mut table,
            Perplexity::default(),
            TRACKER,
            "freePerplexityTracker",
        )
        .map_err(to_js)
    }

    /// Adds one surprisal in nats. Non-finite values are ignored (not counted); negative values
    /// count as 0.
    #[napi]
    pub fn add_surprisal(&self, handle: f64, surprisal: f64) -> napi::Result<()> {
        self.with_tracker(handle, |t| t.add(surprisal))
    }

    /// `exp(mean surprisal)`; `Infinity` while nothing has been counted.
    #[napi]
    pub fn get_perplexity(&self, handle: f64) -> napi::Result<f64> {
        self.with_tracker(handle, |t| t.value())
    }

    #[napi]
    pub fn get_perplexity_count(&self, handle: f64) -> napi::Result<u32> {
        self.with_tracker(handle, |t| t.count())
    }

    #[napi]
    pub fn reset_perplexity_tracker(&self, handle: f64) -> napi::Result<()> {
        self.with_tracker(handle, |t| t.reset())
    }

    #[napi]
    pub fn clone_perplexity_tracker(&self, handle: f64) -> napi::Result<u32> {
        let copy = self.with_tracker(handle, |t| *t)?;
        let mut table = lock(&self.api.trackers).map_err(to_js)?;
        insert(&mut table, copy, TRACKER, "freePerplexityTracker").map_err(to_js)
    }

    /// Frees a tracker. An unknown or already freed handle is an error.
    #[napi]
    pub fn free_perplexity_tracker(&self, handle: f64) -> napi::Result<()> {
        self.live()?;
        let h = handle_arg(handle, TRACKER).map_err(to_js)?;
        let mut table = lock(&self.api.trackers).map_err(to_js)?;
        table
            .remove(h)
            .map(drop)
            .ok_or_else(|| to_js(unknown(TRACKER, h, "createPerplexityTracker")))
    }

    // -------------------------------------------------------------------------------------
    // Embeddings (contexts created with `embeddings: true`)

    /// Replaces sequence 0 with `tokens` (positions 0..n-1, one decode) and computes their
    /// embeddings. At most `nBatch` tokens.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn encode<'env>(&self, env: &'env Env, tokens: Vec<f64>) -> napi::Result<Object<'env>> {
        self.live()?;
        self.require_embeddings("encode").map_err(to_js)?;
        let tokens = self.tokens(&tokens)?;
        if tokens.is_empty() {
            return Err(to_js(Error::invalid("encode needs at least one token")));
        }
        let limit = self.info.n_batch.min(self.info.n_ctx) as usize;
        if tokens.len() > limit {
            return Err(to_js(Error::invalid(format!(
                "encode takes at most {limit} tokens (nBatch; nothing is truncated), got {}: shorten the input or create the context with a larger nBatch",
                tokens.len()
            ))));
        }
        self.submit(env, move |e| {
            ensure_unleased(e, 0, "encode")?;
            e.ctx.seq_rm(0, -1, -1);
            let mut batch = ffi::Batch::default();
            for (i, &t) in tokens.iter().enumerate() {
                batch.push(t, i as i32, 0, true);
            }
            if let Err(err) = e.ctx.decode(&mut batch) {
                e.ctx.seq_rm(0, -1, -1);
                return Err(err);
            }
            Ok(())
        })
    }

    /// The embedding of the last `encode`: pooled over sequence 0, or the last token's when the
    /// context has no pooling. L2-normalised unless `normalize` is false.
    #[napi]
    pub fn get_embeddings(&self, normalize: Option<bool>) -> napi::Result<Float32Array> {
        self.live()?;
        self.require_embeddings("getEmbeddings").map_err(to_js)?;
        let pooling = self.api.pooling;
        if pooling == ffi::POOLING_RANK {
            return Err(to_js(Error::Unsupported(
                "getEmbeddings does not support poolingType RANK (reranker scores); use MEAN, CLS, LAST or NONE".into(),
            )));
        }
        self.sync("getEmbeddings", |e| {
            let row = if pooling == ffi::POOLING_NONE {
                e.ctx.embeddings_ith(-1)
            } else {
                e.ctx.embeddings_seq(0)
            };
            let mut v = row
                .ok_or_else(|| {
                    Error::NoOutput("no embeddings yet: call encode(tokens) first".into())
                })?
                .to_vec();
            if normalize.unwrap_or(true) {
                l2_normalize(&mut v);
            }
            Ok(Float32Array::new(v))
        })
    }

    /// Length of the vectors `getEmbeddings()` returns (the model's embedding width).
    #[napi]
    pub fn get_embedding_dimension(&self) -> napi::Result<i32> {
        self.live()?;
        Ok(self.model.n_embd_out())
    }

    /// True when the context pools token embeddings into one vector per sequence.
    #[napi]
    pub fn has_pooling(&self) -> napi::Result<bool> {
        self.live()?;
        Ok(self.api.pooling != ffi::POOLING_NONE)
    }
}

// ---------------------------------------------------------------------------------------------
// jsonSchemaToGrammar, on the libuv thread pool

// Reached only through the JS export, which test builds do not register.
#[cfg_attr(test, allow(dead_code))]
pub struct SchemaToGrammar {
    schema: String,
}

impl Task for SchemaToGrammar {
    type Output = String;
    type JsValue = String;

    fn compute(&mut self) -> napi::Result<String> {
        ffi::init_backend();
        crate::worker::run_guarded(|| ffi::json_schema_to_grammar(&self.schema)).map_err(to_js)
    }

    fn resolve(&mut self, _env: Env, grammar: String) -> napi::Result<String> {
        Ok(grammar)
    }
}

/// Converts a JSON schema (JSON text) to GBNF off the main thread.
#[cfg_attr(test, allow(dead_code))]
#[napi(js_name = "jsonSchemaToGrammar")]
pub fn json_schema_to_grammar(schema: String) -> AsyncTask<SchemaToGrammar> {
    AsyncTask::new(SchemaToGrammar { schema })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_must_be_positive_integers() {
        for bad in [0.0, -1.0, 1.5, f64::NAN, f64::INFINITY, 2f64.powi(32)] {
            assert!(handle_arg(bad, "x").is_err(), "{bad}");
        }
        assert_eq!(handle_arg(7.0, "x").unwrap(), 7);
    }

    #[test]
    fn normalisation_gives_unit_norm_and_keeps_zero_vectors() {
        let mut v = [3.0f32, 4.0];
        l2_normalize(&mut v);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
        let mut z = [0.0f32; 3];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }
}
