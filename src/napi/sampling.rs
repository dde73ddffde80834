//! Sampling from JS: the `SamplingParams` objects and their one conversion into a validated
//! `SamplingConfig` (napi params → config → chain), `ctx.sample(params)` with its persistent
//! chain, grammar sampler handles and `jsonSchemaToGrammar`.
//!
//! Calls that read or write the context's logits (`sample`, `applySampler`) go through
//! `SessionContext::sync`, so they run after any queued operation. Grammar handles otherwise own
//! no context state, so they work at any time, behind their own lock.

use std::sync::{Mutex, MutexGuard};

use napi::bindgen_prelude::*;
use napi::{Env, JsValue, ValueType};
use napi_derive::napi;

use super::context::SessionContext;
use super::convert::{js, Arg, Result};
use super::worker::{deferred, rejected, run_guarded};
use crate::engine::branch::{BranchSampling, GrammarSpec};
use crate::engine::handles::{Handle, HandleTable};
use crate::engine::sampling::config::{self, Dry, Mirostat, Penalties, Xtc};
use crate::engine::sampling::{pick, Chain, SamplingConfig};
use crate::error::Error;
use crate::llama::{self, Sampler, TokenData};

/// Repetition penalties. Present (even `{}`) = enabled with these defaults.
#[napi(object)]
pub struct PenaltyParams {
    /// Repeat penalty, > 0; 1 = off. Default 1.
    pub repeat: Option<f64>,
    /// Frequency penalty. Default 0.
    pub frequency: Option<f64>,
    /// Presence penalty. Default 0.
    pub presence: Option<f64>,
    /// Window in tokens; -1 = the whole context. Default 64.
    pub last_n: Option<f64>,
}

/// Mirostat sampling (replaces temperature/dist as the final stage).
#[napi(object)]
pub struct MirostatParams {
    /// 0 = off, 1 = Mirostat, 2 = Mirostat 2.0. Default 2 when this object is present.
    #[napi(ts_type = "0 | 1 | 2")]
    pub mode: Option<f64>,
    /// Target surprise, > 0. Default 5.
    pub tau: Option<f64>,
    /// Learning rate, > 0. Default 0.1.
    pub eta: Option<f64>,
}

/// DRY ("don't repeat yourself") penalty. Enabled when `multiplier` > 0.
#[napi(object)]
pub struct DryParams {
    /// >= 0; 0 = off. Default 0.8.
    pub multiplier: Option<f64>,
    /// >= 1. Default 1.75.
    pub base: Option<f64>,
    /// Default 2.
    pub allowed_length: Option<f64>,
    /// -1 = the whole context. Default -1.
    pub penalty_last_n: Option<f64>,
    /// Default `["\n", ":", "\"", "*"]`.
    pub sequence_breakers: Option<Vec<String>>,
}

/// XTC ("exclude top choices"). Enabled when `probability` > 0.
#[napi(object)]
pub struct XtcParams {
    /// In [0, 1]. Default 0.5.
    pub probability: Option<f64>,
    /// In [0, 1]. Default 0.1.
    pub threshold: Option<f64>,
}

/// Less common samplers.
#[napi(object)]
pub struct AdvancedSamplingParams {
    /// Locally typical sampling, in (0, 1]; 1 = off. Default 1.
    pub typical_p: Option<f64>,
    /// Mirostat in place of temperature + dist; off when absent.
    pub mirostat: Option<MirostatParams>,
    /// DRY penalty; off when absent.
    pub dry: Option<DryParams>,
    /// XTC; off when absent.
    pub xtc: Option<XtcParams>,
    /// Top-n-sigma, > 0. Default off.
    pub top_n_sigma: Option<f64>,
}

/// A static or dynamic logit bias. `bias` is added to the token's logit; `-Infinity` bans it.
#[napi(object)]
pub struct TokenBias {
    pub token: f64,
    pub bias: f64,
}

/// A branch's sampler chain, as `Branch.create` and `setSamplerParams` take it (and `ctx.sample`,
/// without `grammar`). Invalid values are errors (`ERR_INVALID_ARG`), never silently clamped.
///
/// Order: logit bias + steer → grammar → penalties → DRY → top-n-sigma → top-k → typical → top-p →
/// min-p → XTC → greedy | temperature + dist | temperature + mirostat.
#[napi(object)]
pub struct SamplingParams {
    /// Default 0.8. `<= 0` = greedy (argmax), unless mirostat is enabled.
    pub temperature: Option<f64>,
    /// Integer >= 0; 0 = off. Default 40.
    pub top_k: Option<f64>,
    /// In (0, 1]; 1 = off. Default 0.95.
    pub top_p: Option<f64>,
    /// In [0, 1]; 0 = off. Default 0.05.
    pub min_p: Option<f64>,
    /// RNG seed, integer in [0, 2^32). `-1` or absent = random.
    pub seed: Option<f64>,
    /// GBNF grammar (root rule `root`) constraining the branch's tokens.
    pub grammar: Option<String>,
    /// Repetition penalties; off when absent.
    pub penalties: Option<PenaltyParams>,
    /// Less common samplers (typical, Mirostat, DRY, XTC, top-n-sigma); each off when absent.
    pub advanced: Option<AdvancedSamplingParams>,
    /// Static per-token biases (kept by forks).
    pub logit_bias: Option<Vec<TokenBias>>,
}

impl SamplingParams {
    /// The one conversion of JS sampling options: each field through its sampler's validator.
    pub fn to_config(&self, n_vocab: i32) -> crate::error::Result<SamplingConfig> {
        let mut c = SamplingConfig::default();
        if let Some(t) = self.temperature {
            c.temperature = config::finite("temperature", t)?;
        }
        if let Some(k) = self.top_k {
            c.top_k = config::integer("topK", k, 0)?;
        }
        if let Some(p) = self.top_p {
            c.top_p = config::probability("topP", p, false)?;
        }
        if let Some(p) = self.min_p {
            c.min_p = config::probability("minP", p, true)?;
        }
        if let Some(s) = self.seed {
            c.seed = config::seed(s)?;
        }
        if let Some(p) = &self.penalties {
            c.penalties = Some(Penalties::from_options(
                p.repeat,
                p.frequency,
                p.presence,
                p.last_n,
            )?);
        }
        if let Some(a) = &self.advanced {
            if let Some(p) = a.typical_p {
                c.typical_p = config::probability("advanced.typicalP", p, false)?;
            }
            if let Some(m) = &a.mirostat {
                c.mirostat = Mirostat::from_options(m.mode, m.tau, m.eta)?;
            }
            if let Some(d) = &a.dry {
                c.dry = Dry::from_options(
                    d.multiplier,
                    d.base,
                    d.allowed_length,
                    d.penalty_last_n,
                    d.sequence_breakers.clone(),
                )?;
            }
            if let Some(x) = &a.xtc {
                c.xtc = Xtc::from_options(x.probability, x.threshold)?;
            }
            if let Some(n) = a.top_n_sigma {
                c.top_n_sigma = Some(config::top_n_sigma(n)?);
            }
        }
        for b in self.logit_bias.iter().flatten() {
            let pair = config::token_bias(b.token, b.bias, n_vocab, "logitBias")?;
            c.logit_bias.push(pair);
        }
        c.grammar = self.grammar.clone().filter(|g| !g.is_empty());
        Ok(c)
    }
}

impl SessionContext {
    /// Refuses to make a branch on an encoder: its non-causal attention pools vectors, and a
    /// branch sampled from it would write noise (nomic-embed answered "[unused18]").
    pub(super) fn check_generates(&self) -> crate::error::Result<()> {
        if self.info.causal {
            return Ok(());
        }
        let arch = self.model.encoder_arch().unwrap_or_default();
        Err(crate::error::Error::Unsupported(format!(
            "this model ({arch}) is an encoder: its attention is not causal, so it makes embeddings, not text; \
             create the context with embeddings: true and call encode() / getEmbeddings() (serve --embeddings), \
             or load a text model to generate"
        )))
    }

    /// A branch's chain (and grammar, when the params have one) from optional JS params.
    pub(super) fn branch_sampling(
        &self,
        params: Option<&SamplingParams>,
    ) -> crate::error::Result<BranchSampling> {
        let config = match params {
            Some(p) => p.to_config(self.info.n_vocab)?,
            None => SamplingConfig::default(),
        };
        self.branch_sampling_from(config)
    }

    pub(super) fn branch_sampling_from(
        &self,
        config: SamplingConfig,
    ) -> crate::error::Result<BranchSampling> {
        let grammar = match config.grammar.as_deref() {
            Some(g) => Some((
                Sampler::grammar(&self.model, g, None)?,
                GrammarSpec {
                    gbnf: g.to_string(),
                    ..GrammarSpec::default()
                },
            )),
            None => None,
        };
        let chain = Chain::build(
            config,
            Some(&self.model),
            self.info.n_vocab,
            self.info.n_ctx,
        )?;
        Ok(BranchSampling::new(chain, grammar))
    }
}

/// `ctx.sample(params)`'s chain, kept between calls while the resolved params stay equal.
struct SampleState {
    chain: Chain,
    candidates: Vec<TokenData>,
    bias_scratch: Vec<f32>,
}

/// `ctx.sample()`'s chain and the grammar sampler handles of one context.
#[derive(Default)]
pub struct SamplingHandles {
    sample: Mutex<Option<SampleState>>,
    grammars: Mutex<HandleTable<Sampler>>,
}

impl SamplingHandles {
    /// Frees the sample chain and every grammar sampler (on `dispose()`).
    pub fn clear(&self) {
        if let Ok(mut s) = self.sample.lock() {
            s.take();
        }
        if let Ok(mut g) = self.grammars.lock() {
            *g = HandleTable::default();
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> crate::error::Result<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::Internal("a handle table lock was poisoned by an earlier panic".into()))
}

/// A grammar-sampler or tracker handle from JS: an integer in [1, 2^32).
pub(super) fn handle_arg(v: f64, kind: &str) -> crate::error::Result<Handle> {
    if !v.is_finite() || v.fract() != 0.0 || v < 1.0 || v > u32::MAX as f64 {
        return Err(Error::invalid(format!(
            "{kind} handle must be a positive integer, got {v}"
        )));
    }
    Ok(v as Handle)
}

pub(super) fn unknown_handle(kind: &str, h: Handle, create: &str) -> Error {
    Error::invalid(format!(
        "unknown {kind} handle {h} (never created on this context, or already freed); create one with {create}()"
    ))
}

pub(super) fn insert<T>(
    table: &mut HandleTable<T>,
    value: T,
    kind: &str,
    free: &str,
) -> crate::error::Result<u32> {
    table.insert(value).ok_or_else(|| {
        Error::invalid(format!(
            "too many live {kind}s on this context (65535); free unused ones with {free}()"
        ))
    })
}

const GRAMMAR: &str = "grammar sampler";

impl SessionContext {
    pub(super) fn check_vocab_row(&self, len: usize, what: &str) -> crate::error::Result<()> {
        self.live()?;
        if len != self.info.n_vocab as usize {
            return Err(Error::invalid(format!(
                "{what} must be a Float32Array of length vocabSize = {}, got length {len}",
                self.info.n_vocab
            )));
        }
        Ok(())
    }

    fn with_grammar<T>(
        &self,
        handle: f64,
        f: impl FnOnce(&mut Sampler) -> crate::error::Result<T>,
    ) -> Result<T> {
        self.live().map_err(js)?;
        let h = handle_arg(handle, GRAMMAR).map_err(js)?;
        let mut table = lock(&self.sampling.grammars).map_err(js)?;
        let grammar = table
            .get_mut(h)
            .ok_or_else(|| js(unknown_handle(GRAMMAR, h, "createSampler")))?;
        f(grammar).map_err(js)
    }
}

#[napi]
impl SessionContext {
    /// Without params: argmax of the context's last logits row (same as `greedySample()`).
    /// With params: samples through a chain kept per context and rebuilt only when the resolved
    /// params differ from the previous call's; the chosen token is accepted into it.
    #[napi(ts_args_type = "params?: SamplingParams")]
    pub fn sample(&self, env: &Env, params: Option<Unknown<'_>>) -> Result<i32> {
        // Read the params by hand: napi-rs would turn a number or string into default params.
        let params = match params
            .as_ref()
            .map(|p| p.get_type())
            .transpose()
            .map_err(super::convert::internal)?
        {
            None | Some(ValueType::Undefined) | Some(ValueType::Null) => {
                return self.greedy_sample();
            }
            Some(ValueType::Object) => {
                let raw = params.map(|p| p.raw()).unwrap_or(std::ptr::null_mut());
                // SAFETY: `raw` is the live object napi-rs handed us for this call.
                unsafe { SamplingParams::from_napi_value(env.raw(), raw) }
                    .map_err(|e| js(Error::invalid(format!("sample(params): {}", e.reason))))?
            }
            Some(other) => {
                return Err(js(Error::invalid(format!(
                    "sample(params): params must be a SamplingParams object or undefined, got {other}"
                ))));
            }
        };
        if params.grammar.as_deref().is_some_and(|g| !g.is_empty()) {
            return Err(js(Error::invalid(
                "ctx.sample() does not take a grammar: use createSampler() + applySampler() on getLogits(), or a Branch with a grammar",
            )));
        }
        let config = params.to_config(self.info.n_vocab).map_err(js)?;
        self.sync("sample", |e| {
            let logits = e.ctx.logits_row(-1)?;
            let mut state = lock(&self.sampling.sample)?;
            if state.as_ref().is_none_or(|s| s.chain.config() != &config) {
                *state = Some(SampleState {
                    chain: Chain::build(
                        config.clone(),
                        Some(&self.model),
                        self.info.n_vocab,
                        self.info.n_ctx,
                    )?,
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
            let logits = pick::biased(logits, &[&config.logit_bias], bias_scratch);
            let token = pick::sample(chain, None, logits, candidates).ok_or_else(|| {
                Error::Grammar("no token is allowed: logitBias masks every candidate".into())
            })?;
            chain.accept(token);
            Ok(token)
        })
    }

    /// Parses a GBNF grammar (root rule `root`) into a new sampler handle.
    #[napi]
    pub fn create_sampler(&self, grammar: String) -> Result<u32> {
        self.live().map_err(js)?;
        if grammar.trim().is_empty() {
            return Err(js(Error::Grammar(
                "the grammar is empty; pass GBNF text with a `root` rule".into(),
            )));
        }
        let sampler = Sampler::grammar(&self.model, &grammar, None).map_err(js)?;
        let mut table = lock(&self.sampling.grammars).map_err(js)?;
        insert(&mut table, sampler, GRAMMAR, "freeSamplerHandle").map_err(js)
    }

    /// Sets every logit the grammar forbids in its current state to -Infinity, in place.
    #[napi]
    pub fn apply_sampler(&self, handle: f64, mut logits: Float32Array) -> Result<()> {
        self.check_vocab_row(logits.len(), "logits").map_err(js)?;
        // After any queued operation (see the module docs): a queued decode may rewrite a view.
        self.sync("applySampler", |_| Ok(()))?;
        self.with_grammar(handle, |grammar| {
            // SAFETY: the array is alive for this call and only this thread touches it; the
            // context is idle (see above), so the worker is not writing a logits view of it.
            let data = unsafe { logits.as_mut() };
            let mut candidates = Vec::with_capacity(data.len());
            pick::all_candidates(data, &mut candidates);
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
    pub fn accept_sampler_token(&self, handle: f64, token: f64) -> Result<()> {
        self.live().map_err(js)?;
        handle_arg(handle, GRAMMAR).map_err(js)?;
        let token = self.token(token).map_err(js)?;
        self.with_grammar(handle, |grammar| {
            // llama.cpp throws (or aborts, for an end-of-generation token) on a forbidden token.
            if !pick::grammar_allows(grammar, token, 0.0) {
                return Err(Error::GrammarRejected(token));
            }
            grammar.accept(token)
        })
    }

    /// A new handle with a copy of the grammar's current parse state.
    #[napi]
    pub fn clone_sampler(&self, handle: f64) -> Result<u32> {
        let copy = self.with_grammar(handle, |g| g.try_clone())?;
        let mut table = lock(&self.sampling.grammars).map_err(js)?;
        insert(&mut table, copy, GRAMMAR, "freeSamplerHandle").map_err(js)
    }

    /// Frees a grammar sampler. An unknown or already freed handle is an error.
    #[napi]
    pub fn free_sampler_handle(&self, handle: f64) -> Result<()> {
        self.live().map_err(js)?;
        let h = handle_arg(handle, GRAMMAR).map_err(js)?;
        let mut table = lock(&self.sampling.grammars).map_err(js)?;
        table
            .remove(h)
            .map(drop)
            .ok_or_else(|| js(unknown_handle(GRAMMAR, h, "createSampler")))
    }
}

/// Converts a JSON schema (JSON text) to GBNF on the calling thread (`jsonSchemaToGrammarSync`).
#[napi(js_name = "jsonSchemaToGrammarSync")]
pub fn json_schema_to_grammar_sync(schema: String) -> Result<String> {
    run_guarded(|| llama::json_schema_to_grammar(&schema)).map_err(js)
}

/// Converts a JSON schema (JSON text) to GBNF off the main thread. Rejects with a coded error.
#[napi(js_name = "jsonSchemaToGrammar", ts_return_type = "Promise<string>")]
pub fn json_schema_to_grammar<'env>(
    env: &'env Env,
    #[napi(ts_arg_type = "string")] schema: Arg<String>,
) -> Result<Object<'env>> {
    let schema = match schema.get("jsonSchemaToGrammar: schema", "JSON text") {
        Ok(s) => s,
        Err(e) => return rejected::<String>(env, e),
    };
    let (settle, promise) = deferred::<String>(env)?;
    std::thread::Builder::new()
        .name("llama-branch-schema".into())
        .spawn(move || settle(run_guarded(|| llama::json_schema_to_grammar(&schema))))
        .map_err(|e| js(Error::Internal(format!("cannot start a thread: {e}"))))?;
    Ok(promise)
}
