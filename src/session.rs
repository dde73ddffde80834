//! `SessionContext`: the JS-facing class. Owns a llama.cpp context and its `BranchStore` behind
//! one mutex (every llama.cpp call happens under it), plus the worker thread that runs the heavy
//! calls. Methods prefixed with `_` are the private surface used by `lib/Branch.js` and
//! `lib/BranchStore.js`; the rest is public.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use napi::bindgen_prelude::*;
use napi::{Env, JsDeferred};
use napi_derive::napi;

use crate::cancel::{flag_of, run_cancellable, CancelToken};
use crate::error::{Error, Result};
use crate::ffi::{self, Context, ContextConfig, Model, Token};
use crate::handles::Handle;
use crate::logits_view::LogitsView;
use crate::metrics::{self, Base};
use crate::sampling::{self, RawSampling, SamplingConfig};
use crate::store::{BranchStore, CreateOptions};
use crate::worker::{js_error, to_js, Shared, Worker};

mod api;
mod chat;
mod raw;

pub struct Engine {
    pub ctx: Context,
    pub store: BranchStore,
}

// ---------------------------------------------------------------------------------------------
// Options and plain JS objects

#[napi(object)]
pub struct ContextOptions {
    pub model_path: String,
    pub n_ctx: Option<f64>,
    pub n_batch: Option<f64>,
    pub n_threads: Option<f64>,
    pub n_seq_max: Option<f64>,
    pub embeddings: Option<bool>,
    pub pooling_type: Option<f64>,
    pub use_mmap: Option<bool>,
    /// llama.cpp log level: "none" (default), "error", "warn", "info", "debug".
    pub log_level: Option<String>,
}

#[napi(object)]
pub struct PenaltyParams {
    pub repeat: Option<f64>,
    pub frequency: Option<f64>,
    pub presence: Option<f64>,
    pub last_n: Option<f64>,
}

#[napi(object)]
pub struct MirostatParams {
    pub mode: Option<f64>,
    pub tau: Option<f64>,
    pub eta: Option<f64>,
}

#[napi(object)]
pub struct DryParams {
    pub multiplier: Option<f64>,
    pub base: Option<f64>,
    pub allowed_length: Option<f64>,
    pub penalty_last_n: Option<f64>,
    pub sequence_breakers: Option<Vec<String>>,
}

#[napi(object)]
pub struct XtcParams {
    pub probability: Option<f64>,
    pub threshold: Option<f64>,
}

#[napi(object)]
pub struct AdvancedSamplingParams {
    pub typical_p: Option<f64>,
    pub mirostat: Option<MirostatParams>,
    pub dry: Option<DryParams>,
    pub xtc: Option<XtcParams>,
    pub top_n_sigma: Option<f64>,
}

#[napi(object)]
pub struct TokenBias {
    pub token: f64,
    pub bias: f64,
}

#[napi(object)]
pub struct SamplingParams {
    pub temperature: Option<f64>,
    pub top_k: Option<f64>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub seed: Option<f64>,
    pub grammar: Option<String>,
    pub penalties: Option<PenaltyParams>,
    pub advanced: Option<AdvancedSamplingParams>,
    pub logit_bias: Option<Vec<TokenBias>>,
}

impl SamplingParams {
    fn to_raw(&self) -> RawSampling {
        let p = self.penalties.as_ref();
        let a = self.advanced.as_ref();
        RawSampling {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            grammar: self.grammar.clone(),
            repeat: p.and_then(|p| p.repeat),
            frequency: p.and_then(|p| p.frequency),
            presence: p.and_then(|p| p.presence),
            last_n: p.and_then(|p| p.last_n),
            typical_p: a.and_then(|a| a.typical_p),
            mirostat: a
                .and_then(|a| a.mirostat.as_ref())
                .map(|m| (m.mode, m.tau, m.eta)),
            dry: a.and_then(|a| a.dry.as_ref()).map(|d| {
                (
                    d.multiplier,
                    d.base,
                    d.allowed_length,
                    d.penalty_last_n,
                    d.sequence_breakers.clone(),
                )
            }),
            xtc: a
                .and_then(|a| a.xtc.as_ref())
                .map(|x| (x.probability, x.threshold)),
            top_n_sigma: a.and_then(|a| a.top_n_sigma),
            logit_bias: self
                .logit_bias
                .as_ref()
                .map(|v| v.iter().map(|b| (b.token, b.bias)).collect())
                .unwrap_or_default(),
        }
    }
}

#[napi(object)]
pub struct Produced {
    pub token: i32,
    pub text: String,
    pub is_stop: bool,
}

#[napi(object)]
pub struct KvPressureInfo {
    pub n_ctx: u32,
    pub cells_used: u32,
    pub remaining: u32,
}

#[napi(object)]
pub struct BranchInfo {
    pub seq_id: i32,
    pub position: i32,
    pub fork_head: i32,
    pub parent: u32,
    pub children: Vec<u32>,
    pub perplexity: f64,
    pub sampling_perplexity: f64,
    pub has_logits: bool,
    pub stochastic: bool,
    pub has_grammar: bool,
}

// ---------------------------------------------------------------------------------------------
// Validation helpers for numbers arriving from JS as f64

fn int_in(name: &str, v: f64, min: i64, max: i64) -> Result<i64> {
    if !v.is_finite() || v.fract() != 0.0 || v < min as f64 || v > max as f64 {
        return Err(Error::invalid(format!(
            "{name} must be an integer in [{min}, {max}], got {v}"
        )));
    }
    Ok(v as i64)
}

fn opt_int(name: &str, v: Option<f64>, default: i64, min: i64, max: i64) -> Result<i64> {
    v.map_or(Ok(default), |v| int_in(name, v, min, max))
}

fn tokens_from(values: &[f64], n_vocab: i32) -> Result<Vec<Token>> {
    values
        .iter()
        .map(|&t| sampling::check_token(t, n_vocab, ""))
        .collect()
}

fn handle_from(v: f64) -> Result<Handle> {
    if !v.is_finite() || v.fract() != 0.0 || v < 0.0 || v > u32::MAX as f64 {
        return Err(Error::invalid(format!(
            "branch handle must be a non-negative integer, got {v}"
        )));
    }
    Ok(v as Handle)
}

fn seq_from(v: f64, n_seq_max: u32) -> Result<i32> {
    Ok(int_in("seqId", v, 0, n_seq_max as i64 - 1).map_err(|_| {
        Error::invalid(format!(
            "seqId must be an integer in [0, {}] (nSeqMax = {n_seq_max}), got {v}",
            n_seq_max - 1
        ))
    })? as i32)
}

/// `[p0, p1)` from optional JS numbers; -1 (or absent) means "from the start" / "to the end".
fn position_range(p0: Option<f64>, p1: Option<f64>) -> Result<(i32, i32)> {
    let p0 = opt_int("p0", p0, -1, -1, i32::MAX as i64)? as i32;
    let p1 = opt_int("p1", p1, -1, -1, i32::MAX as i64)? as i32;
    if p0 >= 0 && p1 >= 0 && p1 <= p0 {
        return Err(Error::invalid(format!(
            "the position range [{p0}, {p1}) is empty; p1 must be greater than p0 (or -1 for the end)"
        )));
    }
    Ok((p0, p1))
}

fn base_from(base: Option<String>) -> Result<Base> {
    match base {
        None => Ok(Base::Nats),
        Some(b) => Base::parse(&b).ok_or_else(|| {
            Error::invalid(format!("base must be \"nats\" or \"bits\", got \"{b}\""))
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// Model sharing: contexts on the same file and load settings share one llama_model.

type ModelKey = (String, bool);

fn model_cache() -> &'static Mutex<HashMap<ModelKey, Weak<Model>>> {
    static CACHE: OnceLock<Mutex<HashMap<ModelKey, Weak<Model>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn acquire_model(path: &str, use_mmap: bool) -> Result<Arc<Model>> {
    // Holding the lock across a load makes a second caller wait and then share the result.
    let mut cache = model_cache()
        .lock()
        .map_err(|_| Error::Internal("model cache lock poisoned".into()))?;
    let key = (path.to_string(), use_mmap);
    if let Some(model) = cache.get(&key).and_then(Weak::upgrade) {
        return Ok(model);
    }
    let model = Arc::new(Model::load(path, use_mmap, 999)?);
    cache.retain(|_, w| w.strong_count() > 0);
    cache.insert(key, Arc::downgrade(&model));
    Ok(model)
}

fn check_model_file(path: &str) -> Result<()> {
    use std::io::Read;
    let p = Path::new(path);
    if !p.is_file() {
        return Err(Error::ModelNotFound(path.to_string()));
    }
    let mut magic = [0u8; 4];
    let ok = std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok();
    if !ok || &magic != b"GGUF" {
        return Err(Error::ModelLoad(format!(
            "{path} (the file does not start with the GGUF magic bytes)"
        )));
    }
    Ok(())
}

struct Resolved {
    path: String,
    use_mmap: bool,
    config: ContextConfig,
}

fn resolve_options(o: &ContextOptions) -> Result<Resolved> {
    let path = o
        .model_path
        .strip_prefix("file://")
        .unwrap_or(&o.model_path)
        .to_string();
    if path.is_empty() {
        return Err(Error::invalid(
            "options.modelPath is required (a path to a .gguf file)",
        ));
    }
    let n_ctx = opt_int("nCtx", o.n_ctx, 2048, 16, 1 << 24)? as u32;
    let n_batch = opt_int("nBatch", o.n_batch, 512, 1, 1 << 20)? as u32;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as i64;
    let n_threads = opt_int("nThreads", o.n_threads, cores, 1, 1024)? as i32;
    let n_seq_max = opt_int("nSeqMax", o.n_seq_max, 1, 1, 256)? as u32;
    let embeddings = o.embeddings.unwrap_or(false);
    let pooling_type = opt_int(
        "poolingType",
        o.pooling_type,
        if embeddings { 1 } else { 0 },
        -1,
        4,
    )? as i32;
    if let Some(level) = &o.log_level {
        let level = ffi::parse_log_level(level).ok_or_else(|| {
            Error::invalid(format!(
                "logLevel must be one of none, error, warn, info, debug; got \"{level}\""
            ))
        })?;
        ffi::set_log_threshold(level);
    }
    // Logits rows per decode never exceed the number of sequences (one per branch), except for
    // embedding contexts, which output every token. Sizing this by n_batch would reserve
    // n_batch × n_vocab floats of compute buffer (≈ 0.5 GB for a 262k vocabulary).
    let n_outputs_max = if embeddings {
        n_batch
    } else {
        n_seq_max.max(1)
    };
    Ok(Resolved {
        path,
        use_mmap: o.use_mmap.unwrap_or(true),
        config: ContextConfig {
            n_ctx,
            n_batch,
            n_seq_max,
            n_threads,
            embeddings,
            pooling_type,
            n_outputs_max,
        },
    })
}

/// Loads (or shares) the model and creates a context off the main thread.
#[napi(js_name = "createContext")]
pub fn create_context<'env>(env: &'env Env, options: ContextOptions) -> napi::Result<Object<'env>> {
    type Resolver = Box<dyn FnOnce(Env) -> napi::Result<SessionContext> + Send>;
    let (deferred, promise): (JsDeferred<SessionContext, Resolver>, Object<'env>) =
        env.create_deferred()?;
    let resolved = match resolve_options(&options) {
        Ok(r) => r,
        Err(e) => {
            deferred.resolve(Box::new(move |env| Err(js_error(&env, &e))));
            return Ok(promise);
        }
    };
    let shared: Arc<Shared<Engine>> = Arc::new(Shared::new());
    let worker = Worker::spawn(shared.clone(), "llama-branch-ctx".into(), || {})
        .map_err(|e| napi::Error::from_reason(format!("cannot start worker thread: {e}")))?;
    let load = move || -> Result<SessionContext> {
        check_model_file(&resolved.path)?;
        let model = acquire_model(&resolved.path, resolved.use_mmap)?;
        let ctx = Context::new(model.clone(), &resolved.config)?;
        let info = ContextInfo {
            n_ctx: ctx.n_ctx(),
            n_batch: ctx.n_batch(),
            n_seq_max: ctx.n_seq_max(),
            n_vocab: model.n_vocab,
            embeddings: resolved.config.embeddings,
        };
        let api = api::ApiState::new(ctx.pooling_type(), model.clone());
        let store = BranchStore::new(info.n_seq_max);
        *shared
            .engine
            .lock()
            .map_err(|_| Error::Internal("lock poisoned".into()))? = Some(Engine { ctx, store });
        Ok(SessionContext {
            shared,
            worker: Some(worker),
            model,
            info,
            turn_separator: OnceLock::new(),
            logits_view: Default::default(),
            api,
        })
    };
    // The load runs on a short-lived loader thread. On success the session (which owns the
    // worker) travels to JS through the resolver; a failed load drops the worker, whose thread
    // then exits.
    std::thread::Builder::new()
        .name("llama-branch-load".into())
        .spawn(move || {
            let result = crate::worker::run_guarded(load);
            deferred.resolve(Box::new(move |env| result.map_err(|e| js_error(&env, &e))));
        })
        .map_err(|e| napi::Error::from_reason(format!("cannot start loader thread: {e}")))?;
    Ok(promise)
}

#[napi(js_name = "setLogLevel")]
pub fn set_log_level(level: String) -> napi::Result<()> {
    let l = ffi::parse_log_level(&level).ok_or_else(|| {
        to_js(Error::invalid(format!(
            "logLevel must be one of none, error, warn, info, debug; got \"{level}\""
        )))
    })?;
    ffi::set_log_threshold(l);
    Ok(())
}

#[napi(js_name = "systemInfo")]
pub fn system_info() -> String {
    ffi::init_backend();
    ffi::system_info()
}

/// Called by the JS loader (lib/loader.js) right after loading the addon, with the folder of the
/// .node: a prebuilt's backend modules sit there. Returns the number of compute devices.
#[napi(js_name = "_setBackendDir")]
pub fn set_backend_dir(dir: String) -> u32 {
    ffi::init_backend_from_dir(&dir) as u32
}

#[derive(Clone, Copy)]
struct ContextInfo {
    n_ctx: u32,
    n_batch: u32,
    n_seq_max: u32,
    n_vocab: i32,
    embeddings: bool,
}

#[napi]
pub struct SessionContext {
    shared: Arc<Shared<Engine>>,
    worker: Option<Worker>,
    model: Arc<Model>,
    info: ContextInfo,
    /// getTurnSeparator(), computed on first use.
    turn_separator: OnceLock<Vec<Token>>,
    /// The zero-copy view handed out by `getLogits()` (JS thread only).
    logits_view: std::cell::RefCell<LogitsView>,
    /// Sample chain, grammar handles and perplexity trackers (src/session/api.rs).
    api: api::ApiState,
}

impl SessionContext {
    fn sync<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Engine) -> Result<T>,
    ) -> napi::Result<T> {
        self.shared
            .with_engine(what, |e| crate::worker::run_guarded(|| f(e)))
            .map_err(to_js)
    }

    fn live(&self) -> napi::Result<()> {
        if self.shared.disposed.load(Ordering::Acquire) {
            return Err(to_js(Error::ContextDisposed));
        }
        Ok(())
    }

    /// Queues `work` on the worker thread. Any outstanding `getLogits()` view is revoked first,
    /// here on the JS thread, since the job may decode (or otherwise rewrite the logits).
    fn submit<'env, T, F>(&self, env: &'env Env, work: F) -> napi::Result<Object<'env>>
    where
        T: ToNapiValue + Send + 'static,
        F: FnOnce(&mut Engine) -> Result<T> + Send + 'static,
    {
        self.revoke_logits_view(env);
        self.submit_keeping_logits(env, work)
    }

    /// `submit` for jobs that never touch the context's logits (tokenizer work on the model).
    fn submit_keeping_logits<'env, T, F>(
        &self,
        env: &'env Env,
        work: F,
    ) -> napi::Result<Object<'env>>
    where
        T: ToNapiValue + Send + 'static,
        F: FnOnce(&mut Engine) -> Result<T> + Send + 'static,
    {
        match &self.worker {
            Some(w) => w.submit(env, &self.shared, work),
            None => {
                type Resolver<T> = Box<dyn FnOnce(Env) -> napi::Result<T> + Send>;
                let (deferred, promise): (JsDeferred<T, Resolver<T>>, Object<'env>) =
                    env.create_deferred()?;
                deferred.resolve(Box::new(|env| Err(js_error(&env, &Error::ContextDisposed))));
                Ok(promise)
            }
        }
    }

    fn revoke_logits_view(&self, env: &Env) {
        if let Ok(mut view) = self.logits_view.try_borrow_mut() {
            view.revoke(env);
        }
    }

    fn tokens(&self, values: &[f64]) -> napi::Result<Vec<Token>> {
        tokens_from(values, self.info.n_vocab).map_err(to_js)
    }

    fn token(&self, v: f64) -> napi::Result<Token> {
        sampling::check_token(v, self.info.n_vocab, "").map_err(to_js)
    }

    fn config(&self, params: Option<SamplingParams>) -> napi::Result<SamplingConfig> {
        let raw = params.map(|p| p.to_raw()).unwrap_or_default();
        SamplingConfig::from_raw(&raw, self.info.n_vocab).map_err(to_js)
    }
}

/// Refuses raw KV writes on a sequence a live branch leases: the branch's position must keep
/// mirroring its KV, so such edits go through the branch API.
fn ensure_unleased(engine: &Engine, seq: i32, what: &str) -> Result<()> {
    if let Some(h) = engine.store.owner_of(seq) {
        return Err(Error::invalid(format!(
            "sequence {seq} is leased by live branch {h}; {what} would desynchronise it. Use the branch API (prefill/commit/prune) or prune the branch first"
        )));
    }
    Ok(())
}

/// Raw decode of `tokens` into `seq` at `position`, chunked by n_batch; logits on the last token.
/// On failure or cancellation the cells written by earlier chunks are removed again.
fn raw_decode(
    engine: &mut Engine,
    tokens: &[Token],
    position: i32,
    seq: i32,
    cancel: &dyn Fn() -> bool,
) -> Result<()> {
    let ctx = &mut engine.ctx;
    let pos_max = ctx.seq_pos_max(seq);
    if pos_max >= 0 && position != pos_max + 1 {
        return Err(Error::invalid(format!("sequence {seq} ends at position {pos_max}; the next decode must start at {} (got {position})", pos_max + 1)));
    }
    if position as u64 + tokens.len() as u64 > ctx.n_ctx() as u64 {
        return Err(Error::KvFull(format!(
            "positions {position}..{} would pass nCtx = {}",
            position as usize + tokens.len(),
            ctx.n_ctx()
        )));
    }
    let n_batch = ctx.n_batch() as usize;
    let mut batch = ffi::Batch::default();
    for (start, count) in crate::plan::sub_batches(tokens.len(), n_batch) {
        if cancel() {
            ctx.seq_rm(seq, position, -1);
            return Err(Error::Aborted);
        }
        batch.clear();
        for j in start..start + count {
            batch.push(tokens[j], position + j as i32, seq, j + 1 == tokens.len());
        }
        if let Err(e) = ctx.decode(&mut batch) {
            ctx.seq_rm(seq, position, -1);
            return Err(e);
        }
    }
    Ok(())
}

#[napi]
impl SessionContext {
    // -------------------------------------------------------------------------------------
    // Properties and lifecycle

    #[napi(getter)]
    pub fn vocab_size(&self) -> napi::Result<i32> {
        self.live()?;
        Ok(self.info.n_vocab)
    }

    #[napi(getter)]
    pub fn memory_size(&self) -> napi::Result<f64> {
        self.live()?;
        Ok(self.model.size_bytes() as f64)
    }

    #[napi(getter)]
    pub fn n_ctx(&self) -> napi::Result<u32> {
        self.live()?;
        Ok(self.info.n_ctx)
    }

    #[napi(getter)]
    pub fn n_batch(&self) -> napi::Result<u32> {
        self.live()?;
        Ok(self.info.n_batch)
    }

    #[napi(getter)]
    pub fn n_seq_max(&self) -> napi::Result<u32> {
        self.live()?;
        Ok(self.info.n_seq_max)
    }

    #[napi(getter)]
    pub fn disposed(&self) -> bool {
        self.shared.disposed.load(Ordering::Acquire)
    }

    #[napi(getter)]
    pub fn model_description(&self) -> napi::Result<String> {
        self.live()?;
        Ok(self.model.description())
    }

    /// Frees the context. Idempotent. A running operation finishes first; queued ones reject.
    #[napi]
    pub fn dispose(&mut self, env: &Env) {
        if self.shared.disposed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.revoke_logits_view(env);
        if let Some(mut w) = self.worker.take() {
            w.close();
        }
        self.api.clear();
        // Free now when nothing is in flight; otherwise the worker frees it after its last job.
        if self.shared.pending.load(Ordering::Acquire) == 0 {
            if let Ok(mut guard) = self.shared.engine.try_lock() {
                guard.take();
            }
        }
    }

    // -------------------------------------------------------------------------------------
    // Tokenizer

    #[napi(ts_return_type = "Promise<number[]>")]
    pub fn tokenize<'env>(
        &self,
        env: &'env Env,
        text: String,
        add_special: Option<bool>,
    ) -> napi::Result<Object<'env>> {
        let model = self.model.clone();
        self.submit_keeping_logits(env, move |_| {
            let tokens = model.tokenize(&text, add_special.unwrap_or(true), true)?;
            Ok(tokens)
        })
    }

    #[napi(ts_return_type = "Promise<string>")]
    pub fn detokenize<'env>(&self, env: &'env Env, tokens: Vec<f64>) -> napi::Result<Object<'env>> {
        let tokens = self.tokens(&tokens)?;
        let model = self.model.clone();
        self.submit_keeping_logits(env, move |_| Ok(model.detokenize(&tokens)))
    }

    #[napi]
    pub fn tokenize_sync(&self, text: String, add_special: Option<bool>) -> napi::Result<Vec<i32>> {
        self.live()?;
        self.model
            .tokenize(&text, add_special.unwrap_or(true), true)
            .map_err(to_js)
    }

    #[napi]
    pub fn token_to_text(&self, token: f64) -> napi::Result<String> {
        self.live()?;
        Ok(self.model.token_to_text(self.token(token)?))
    }

    #[napi]
    pub fn is_stop_token(&self, token: f64) -> napi::Result<bool> {
        self.live()?;
        Ok(self.model.is_eog(self.token(token)?))
    }

    #[napi]
    pub fn get_eog_token(&self) -> napi::Result<i32> {
        self.live()?;
        self.model
            .eog_token()
            .ok_or_else(|| to_js(Error::Unsupported("Model has no EOT or EOS token".into())))
    }

    #[napi]
    pub fn get_bos_token(&self) -> napi::Result<Option<i32>> {
        self.live()?;
        Ok(self.model.bos_token())
    }

    // -------------------------------------------------------------------------------------
    // Raw generation and KV (sequences not leased by a branch)

    #[napi(ts_return_type = "Promise<void>")]
    pub fn decode<'env>(
        &self,
        env: &'env Env,
        tokens: Vec<f64>,
        position: f64,
        seq_id: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> napi::Result<Object<'env>> {
        let tokens = self.tokens(&tokens)?;
        if tokens.is_empty() {
            return Err(to_js(Error::invalid("decode needs at least one token")));
        }
        let position =
            int_in("position", position, 0, self.info.n_ctx as i64).map_err(to_js)? as i32;
        let seq = seq_from(seq_id.unwrap_or(0.0), self.info.n_seq_max).map_err(to_js)?;
        let flag = flag_of(cancel);
        self.submit(env, move |engine| {
            run_cancellable(engine, flag, |engine, cancel| {
                ensure_unleased(engine, seq, "a raw decode")?;
                raw_decode(engine, &tokens, position, seq, cancel)
            })
        })
    }

    /// Zero-copy view of the logits row of the last decode (length vocabSize), revoked by the
    /// next operation that may rewrite it (see `LogitsView`).
    #[napi(ts_return_type = "Float32Array")]
    pub fn get_logits<'env>(&self, env: &'env Env, this: This) -> napi::Result<Unknown<'env>> {
        let row = self.sync("getLogits", |e| e.ctx.logits_row_ptr(-1))?;
        let mut view = self
            .logits_view
            .try_borrow_mut()
            .map_err(|_| to_js(Error::ContextBusy("getLogits")))?;
        // SAFETY: the row stays valid until the next decode or dispose, and both revoke the view
        // before they run; `this` keeps the context alive while the view is reachable.
        let array = unsafe { view.view(env, row, self.info.n_vocab as usize, this.raw())? };
        unsafe { Unknown::from_napi_value(env.raw(), array) }
    }

    #[napi]
    pub fn greedy_sample(&self) -> napi::Result<i32> {
        self.sync("greedySample", |e| {
            let logits = e.ctx.logits_at(-1)?;
            let mut best = 0usize;
            for (i, &l) in logits.iter().enumerate() {
                if l > logits[best] {
                    best = i;
                }
            }
            Ok(best as i32)
        })
    }

    #[napi]
    pub fn model_entropy(
        &self,
        base: Option<String>,
        logits: Option<Float32Array>,
    ) -> napi::Result<f64> {
        let base = base_from(base).map_err(to_js)?;
        match logits {
            Some(l) => {
                api::check_logits_arg(self, l.len())?;
                Ok(metrics::entropy(&l, base))
            }
            None => self.sync("modelEntropy", |e| {
                Ok(metrics::entropy(e.ctx.logits_at(-1)?, base))
            }),
        }
    }

    #[napi]
    pub fn model_surprisal(
        &self,
        token: f64,
        base: Option<String>,
        logits: Option<Float32Array>,
    ) -> napi::Result<f64> {
        let base = base_from(base).map_err(to_js)?;
        let token = self.token(token)?;
        match logits {
            Some(l) => {
                api::check_logits_arg(self, l.len())?;
                Ok(metrics::surprisal(&l, token as usize, base))
            }
            None => self.sync("modelSurprisal", |e| {
                Ok(metrics::surprisal(
                    e.ctx.logits_at(-1)?,
                    token as usize,
                    base,
                ))
            }),
        }
    }

    /// Highest position in the sequence, or -1 when it is empty.
    #[napi]
    pub fn kv_seq_pos_max(&self, seq_id: f64) -> napi::Result<i32> {
        let seq = seq_from(seq_id, self.info.n_seq_max).map_err(to_js)?;
        self.sync("kvSeqPosMax", |e| Ok(e.ctx.seq_pos_max(seq)))
    }

    #[napi]
    pub fn kv_cache_size(&self, seq_id: Option<f64>) -> napi::Result<i32> {
        self.kv_seq_pos_max(seq_id.unwrap_or(0.0))
    }

    #[napi(ts_return_type = "Promise<void>")]
    pub fn kv_cache_clear<'env>(&self, env: &'env Env) -> napi::Result<Object<'env>> {
        self.live()?;
        self.submit(env, |engine| {
            if !engine.store.is_empty() {
                return Err(Error::invalid(format!(
                    "{} live branch(es) use the KV cache; prune them (or use store.retainOnly) before clearing it",
                    engine.store.len()
                )));
            }
            engine.store.clear(&engine.ctx);
            engine.ctx.clear_memory();
            Ok(())
        })
    }

    #[napi(ts_return_type = "Promise<void>")]
    pub fn kv_cache_remove<'env>(
        &self,
        env: &'env Env,
        seq_id: f64,
        start: f64,
        end: f64,
    ) -> napi::Result<Object<'env>> {
        let seq = seq_from(seq_id, self.info.n_seq_max).map_err(to_js)?;
        let start = int_in("start", start, -1, i32::MAX as i64).map_err(to_js)? as i32;
        let end = int_in("end", end, -1, i32::MAX as i64).map_err(to_js)? as i32;
        self.submit(env, move |engine| {
            ensure_unleased(engine, seq, "kvCacheRemove")?;
            if !engine.ctx.seq_rm(seq, start, end) {
                return Err(Error::State(format!("llama.cpp could not remove positions [{start}, {end}) of sequence {seq} (partial removal is not supported for this model's memory)")));
            }
            Ok(())
        })
    }

    /// Makes `dst` hold exactly `src`'s cells in positions `[p0, p1)` (default: all), shared.
    #[napi]
    pub fn kv_seq_copy(
        &self,
        src: f64,
        dst: f64,
        p0: Option<f64>,
        p1: Option<f64>,
    ) -> napi::Result<()> {
        let src = seq_from(src, self.info.n_seq_max).map_err(to_js)?;
        let dst = seq_from(dst, self.info.n_seq_max).map_err(to_js)?;
        let (p0, p1) = position_range(p0, p1).map_err(to_js)?;
        if src == dst {
            return Err(to_js(Error::invalid(format!(
                "kvSeqCopy: src and dst are both sequence {src}; pick two different sequences"
            ))));
        }
        self.sync("kvSeqCopy", |e| {
            ensure_unleased(e, dst, "kvSeqCopy into it")?;
            e.ctx.seq_rm(dst, -1, -1);
            e.ctx.seq_cp(src, dst, p0, p1);
            Ok(())
        })
    }

    // -------------------------------------------------------------------------------------
    // Branches (private surface for lib/Branch.js)

    #[napi(js_name = "_branchCreate")]
    pub fn _branch_create(
        &self,
        position: f64,
        params: Option<SamplingParams>,
        n_batch: Option<f64>,
        seq_id: Option<f64>,
    ) -> napi::Result<u32> {
        let config = self.config(params)?;
        let position =
            int_in("position", position, 0, self.info.n_ctx as i64).map_err(to_js)? as i32;
        let n_batch = n_batch
            .map(|n| int_in("nBatch", n, 1, self.info.n_batch as i64))
            .transpose()
            .map_err(to_js)?
            .map(|n| n as u32);
        let seq = seq_id
            .map(|s| seq_from(s, self.info.n_seq_max))
            .transpose()
            .map_err(to_js)?;
        self.sync("Branch.create", |e| {
            e.store.create(
                &e.ctx,
                CreateOptions {
                    position,
                    seq,
                    config,
                    n_batch,
                },
            )
        })
    }

    #[napi(js_name = "_branchFork")]
    pub fn _branch_fork(&self, handle: f64, seq_id: Option<f64>) -> napi::Result<u32> {
        let h = handle_from(handle).map_err(to_js)?;
        let seq = seq_id
            .map(|s| seq_from(s, self.info.n_seq_max))
            .transpose()
            .map_err(to_js)?;
        self.sync("fork", |e| e.store.fork(&e.ctx, h, seq))
    }

    /// Returns every handle freed (so the JS wrappers can be marked disposed).
    #[napi(js_name = "_branchPrune")]
    pub fn _branch_prune(&self, handle: f64) -> napi::Result<Vec<u32>> {
        let h = handle_from(handle).map_err(to_js)?;
        self.sync("prune", |e| e.store.prune(&e.ctx, h))
    }

    #[napi(js_name = "_branchPruneSubtree")]
    pub fn _branch_prune_subtree(&self, handle: f64) -> napi::Result<Vec<u32>> {
        let h = handle_from(handle).map_err(to_js)?;
        self.sync("pruneSubtree", |e| e.store.prune_subtree(&e.ctx, h))
    }

    /// Frees the branch but keeps its KV; returns the sequence id now usable with raw calls.
    #[napi(js_name = "_branchDestroy")]
    pub fn _branch_destroy(&self, handle: f64) -> napi::Result<i32> {
        let h = handle_from(handle).map_err(to_js)?;
        self.sync("destroy", |e| e.store.destroy(h).map(|(_, seq)| seq))
    }

    #[napi(js_name = "_branchIsLive")]
    pub fn _branch_is_live(&self, handle: f64) -> napi::Result<bool> {
        let h = handle_from(handle).map_err(to_js)?;
        self.sync("disposed", |e| Ok(e.store.is_live(h)))
    }

    #[napi(js_name = "_branchInfo")]
    pub fn _branch_info(&self, handle: f64) -> napi::Result<BranchInfo> {
        let h = handle_from(handle).map_err(to_js)?;
        self.sync("branch getter", |e| {
            let b = e.store.get(h)?;
            Ok(BranchInfo {
                seq_id: b.seq,
                position: b.position,
                fork_head: b.fork_head,
                parent: b.parent.unwrap_or(0),
                children: b.children.clone(),
                perplexity: b.model_ppl.value(),
                sampling_perplexity: b.sampling_ppl.value(),
                has_logits: b.has_logits(),
                stochastic: b.is_stochastic(),
                has_grammar: b.has_grammar(),
            })
        })
    }

    #[napi(js_name = "_branchPosition")]
    pub fn _branch_position(&self, handle: f64) -> napi::Result<i32> {
        let h = handle_from(handle).map_err(to_js)?;
        self.sync("position", |e| Ok(e.store.get(h)?.position))
    }

    #[napi(js_name = "_branchCaptureLogits")]
    pub fn _branch_capture_logits(&self, handle: f64) -> napi::Result<()> {
        let h = handle_from(handle).map_err(to_js)?;
        self.sync("captureLogits", |e| e.store.capture_logits(&e.ctx, h))
    }

    #[napi(js_name = "_branchGetLogits")]
    pub fn _branch_get_logits(&self, handle: f64) -> napi::Result<Float32Array> {
        let h = handle_from(handle).map_err(to_js)?;
        self.sync("getLogits", |e| {
            Ok(Float32Array::new(e.store.get(h)?.logits()?.to_vec()))
        })
    }

    #[napi(js_name = "_branchEntropy")]
    pub fn _branch_entropy(&self, handle: f64, base: Option<String>) -> napi::Result<f64> {
        let h = handle_from(handle).map_err(to_js)?;
        let base = base_from(base).map_err(to_js)?;
        self.sync("entropy", |e| {
            Ok(metrics::entropy(e.store.get(h)?.logits()?, base))
        })
    }

    #[napi(js_name = "_branchSample")]
    pub fn _branch_sample(&self, handle: f64) -> napi::Result<i32> {
        let h = handle_from(handle).map_err(to_js)?;
        self.sync("sample", |e| {
            e.store.sample(h)?.ok_or_else(|| {
                Error::Grammar(
                    "no token is allowed: every candidate is masked (grammar, bias or steer)"
                        .into(),
                )
            })
        })
    }

    #[napi(js_name = "_branchAccept")]
    pub fn _branch_accept(&self, handle: f64, token: f64) -> napi::Result<()> {
        let h = handle_from(handle).map_err(to_js)?;
        let token = self.token(token)?;
        self.sync("accept", |e| e.store.accept(h, token))
    }

    #[napi(js_name = "_branchProduce")]
    pub fn _branch_produce(&self, handle: f64) -> napi::Result<Produced> {
        let h = handle_from(handle).map_err(to_js)?;
        let model = self.model.clone();
        self.sync("produce", |e| {
            let token = e.store.sample(h)?.ok_or_else(|| {
                Error::Grammar(
                    "no token is allowed: every candidate is masked (grammar, bias or steer)"
                        .into(),
                )
            })?;
            Ok(Produced {
                token,
                text: model.token_to_text(token),
                is_stop: model.is_eog(token),
            })
        })
    }

    /// Samples several branches in one native call.
    #[napi(js_name = "_storeProduce")]
    pub fn _store_produce(&self, handles: Vec<f64>) -> napi::Result<Vec<Produced>> {
        let handles: Vec<Handle> = handles
            .into_iter()
            .map(handle_from)
            .collect::<Result<_>>()
            .map_err(to_js)?;
        let model = self.model.clone();
        self.sync("store.produce", |e| {
            let threads = e.ctx.n_threads();
            let sampled = e.store.sample_many(&handles, threads);
            handles
                .iter()
                .zip(sampled)
                .map(|(&h, sampled)| {
                    let token = sampled?.ok_or_else(|| {
                        Error::Grammar(format!(
                            "branch {h}: every candidate is masked (grammar, bias or steer)"
                        ))
                    })?;
                    Ok(Produced {
                        token,
                        text: model.token_to_text(token),
                        is_stop: model.is_eog(token),
                    })
                })
                .collect()
        })
    }

    #[napi(js_name = "_branchSteer")]
    pub fn _branch_steer(&self, handle: f64, biases: Vec<TokenBias>) -> napi::Result<()> {
        let h = handle_from(handle).map_err(to_js)?;
        let mut list = Vec::with_capacity(biases.len());
        for b in &biases {
            let token =
                sampling::check_token(b.token, self.info.n_vocab, "steer token").map_err(to_js)?;
            if b.bias.is_nan() || b.bias == f64::INFINITY {
                return Err(to_js(Error::invalid(format!(
                    "steer bias must be a finite number or -Infinity, got {}",
                    b.bias
                ))));
            }
            list.push((token, b.bias as f32));
        }
        self.sync("steer", |e| e.store.set_steer(h, list))
    }

    #[napi(js_name = "_branchReseed")]
    pub fn _branch_reseed(&self, handle: f64, seed: f64) -> napi::Result<()> {
        let h = handle_from(handle).map_err(to_js)?;
        let seed = int_in("seed", seed, 0, u32::MAX as i64).map_err(to_js)? as u32;
        let n_vocab = self.info.n_vocab;
        self.sync("reseedSampler", |e| e.store.reseed(h, seed, n_vocab))
    }

    #[napi(js_name = "_branchSetSamplerParams")]
    pub fn _branch_set_sampler_params(
        &self,
        handle: f64,
        params: SamplingParams,
    ) -> napi::Result<()> {
        let h = handle_from(handle).map_err(to_js)?;
        let config = self.config(Some(params))?;
        self.sync("setSamplerParams", |e| {
            e.store.set_sampling(&e.ctx, h, config)
        })
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
    ) -> napi::Result<()> {
        let h = handle_from(handle).map_err(to_js)?;
        let tokens = self.tokens(&trigger_tokens.unwrap_or_default())?;
        let patterns = trigger_patterns.unwrap_or_default();
        let model = self.model.clone();
        self.sync("setGrammar", |e| {
            let sampler = match grammar.filter(|g| !g.is_empty()) {
                None => None,
                Some(g) => {
                    let lazy = (!patterns.is_empty() || !tokens.is_empty())
                        .then_some((patterns.as_slice(), tokens.as_slice()));
                    Some(ffi::grammar_sampler(&model, &g, "root", lazy)?)
                }
            };
            e.store.set_grammar(h, sampler)
        })
    }

    #[napi(
        js_name = "_branchDecodeAndCaptureOne",
        ts_return_type = "Promise<void>"
    )]
    pub fn _branch_decode_and_capture_one<'env>(
        &self,
        env: &'env Env,
        handle: f64,
        token: f64,
        cancel: Option<&CancelToken>,
    ) -> napi::Result<Object<'env>> {
        let h = handle_from(handle).map_err(to_js)?;
        let token = self.token(token)?;
        let flag = flag_of(cancel);
        self.submit(env, move |e| {
            run_cancellable(e, flag, |e, cancel| {
                e.store.commit(&mut e.ctx, &[(h, token)], false, cancel)
            })
        })
    }

    /// Prefill of one branch, chunked by that branch's own nBatch.
    #[napi(js_name = "_branchPrefill", ts_return_type = "Promise<void>")]
    pub fn _branch_prefill<'env>(
        &self,
        env: &'env Env,
        handle: f64,
        tokens: Vec<f64>,
        cancel: Option<&CancelToken>,
    ) -> napi::Result<Object<'env>> {
        let h = handle_from(handle).map_err(to_js)?;
        let tokens = self.tokens(&tokens)?;
        let flag = flag_of(cancel);
        self.submit(env, move |e| {
            run_cancellable(e, flag, |e, cancel| {
                let limit = e.store.get(h)?.n_batch;
                e.store
                    .prefill(&mut e.ctx, &[(h, tokens)], Some(limit), cancel)
            })
        })
    }

    #[napi(js_name = "_storeCommit", ts_return_type = "Promise<void>")]
    pub fn _store_commit<'env>(
        &self,
        env: &'env Env,
        handles: Vec<f64>,
        tokens: Vec<f64>,
        cancel: Option<&CancelToken>,
    ) -> napi::Result<Object<'env>> {
        if handles.len() != tokens.len() {
            return Err(to_js(Error::invalid(
                "handles and tokens must have the same length",
            )));
        }
        let handles: Vec<Handle> = handles
            .into_iter()
            .map(handle_from)
            .collect::<Result<_>>()
            .map_err(to_js)?;
        let tokens = self.tokens(&tokens)?;
        let items: Vec<(Handle, Token)> = handles.into_iter().zip(tokens).collect();
        let flag = flag_of(cancel);
        self.submit(env, move |e| {
            run_cancellable(e, flag, |e, cancel| {
                e.store.commit(&mut e.ctx, &items, true, cancel)
            })
        })
    }

    #[napi(js_name = "_storePrefill", ts_return_type = "Promise<void>")]
    pub fn _store_prefill<'env>(
        &self,
        env: &'env Env,
        handles: Vec<f64>,
        token_arrays: Vec<Vec<f64>>,
        cancel: Option<&CancelToken>,
    ) -> napi::Result<Object<'env>> {
        if handles.len() != token_arrays.len() {
            return Err(to_js(Error::invalid(
                "handles and token arrays must have the same length",
            )));
        }
        let handles: Vec<Handle> = handles
            .into_iter()
            .map(handle_from)
            .collect::<Result<_>>()
            .map_err(to_js)?;
        let mut items = Vec::with_capacity(handles.len());
        for (h, t) in handles.into_iter().zip(token_arrays) {
            items.push((h, self.tokens(&t)?));
        }
        let flag = flag_of(cancel);
        self.submit(env, move |e| {
            run_cancellable(e, flag, |e, cancel| {
                e.store.prefill(&mut e.ctx, &items, None, cancel)
            })
        })
    }

    #[napi(js_name = "_storeRetainOnly")]
    pub fn _store_retain_only(&self, handle: f64) -> napi::Result<Vec<u32>> {
        let h = handle_from(handle).map_err(to_js)?;
        self.sync("retainOnly", |e| e.store.retain_only(&e.ctx, h))
    }

    #[napi(js_name = "_storeAvailable")]
    pub fn _store_available(&self) -> napi::Result<u32> {
        self.sync("available", |e| Ok(e.store.available(&e.ctx)))
    }

    #[napi(js_name = "_storeKvPressure")]
    pub fn _store_kv_pressure(&self) -> napi::Result<KvPressureInfo> {
        self.sync("kvPressure", |e| {
            let p = e.store.kv_pressure(&e.ctx);
            Ok(KvPressureInfo {
                n_ctx: p.n_ctx,
                cells_used: p.cells_used,
                remaining: p.remaining,
            })
        })
    }

    #[napi(js_name = "_storeLiveHandles")]
    pub fn _store_live_handles(&self) -> napi::Result<Vec<u32>> {
        self.sync("liveHandles", |e| Ok(e.store.live_handles()))
    }

    /// Bench only (`bench/run.js`): the physical limit for N-branch greedy generation. Decodes
    /// `prompt` into seq 0, shares it with seqs 1..n, then runs `steps` steps of one token per
    /// sequence with a plain argmax per row (no sampler chain, no bookkeeping), each step as
    /// decodes of at most `rows_per_decode` rows (default n). Resolves the milliseconds spent in
    /// the step loop. Needs a context without live branches.
    #[napi(js_name = "_benchRawGenerate", ts_return_type = "Promise<number>")]
    pub fn _bench_raw_generate<'env>(
        &self,
        env: &'env Env,
        prompt: Vec<f64>,
        n: u32,
        steps: u32,
        rows_per_decode: Option<u32>,
    ) -> napi::Result<Object<'env>> {
        let prompt = self.tokens(&prompt)?;
        let group = rows_per_decode.unwrap_or(n).clamp(1, n.max(1)) as usize;
        if n == 0 || n > self.info.n_seq_max || n > self.info.n_batch {
            return Err(to_js(Error::invalid(format!(
                "n must be in [1, min(nSeqMax, nBatch)], got {n}"
            ))));
        }
        self.submit(env, move |e| {
            if !e.store.is_empty() {
                return Err(Error::invalid(
                    "_benchRawGenerate needs a context without live branches",
                ));
            }
            e.ctx.clear_memory();
            raw_decode(e, &prompt, 0, 0, &|| false)?;
            let ctx = &mut e.ctx;
            let first = ctx.logits_at(-1)?;
            let mut order: Vec<usize> = (0..first.len()).collect();
            order.select_nth_unstable_by(n as usize - 1, |&a, &b| first[b].total_cmp(&first[a]));
            let mut next: Vec<Token> = order[..n as usize].iter().map(|&i| i as Token).collect();
            for s in 1..n as i32 {
                ctx.seq_cp(0, s, -1, -1);
            }
            let start = std::time::Instant::now();
            let mut batch = ffi::Batch::default();
            for step in 0..steps as i32 {
                for (c, chunk) in next.chunks_mut(group).enumerate() {
                    batch.clear();
                    for (i, &t) in chunk.iter().enumerate() {
                        batch.push(t, prompt.len() as i32 + step, (c * group + i) as i32, true);
                    }
                    ctx.decode(&mut batch)?;
                    for (row, t) in chunk.iter_mut().enumerate() {
                        // Argmax as a vectorized max plus a search for it (the fastest plain form).
                        let logits = ctx.logits_at(row as i32)?;
                        let max = metrics::finite_max(logits);
                        *t = logits.iter().position(|&l| l == max).unwrap_or(0) as Token;
                    }
                }
            }
            let ms = start.elapsed().as_secs_f64() * 1000.0;
            ctx.clear_memory();
            Ok(ms)
        })
    }

    /// Used by lib/ to refuse work on a context whose async operation is still running.
    #[napi(getter, js_name = "_pending")]
    pub fn _pending(&self) -> u32 {
        self.shared.pending.load(Ordering::Acquire) as u32
    }

    #[napi(getter, js_name = "_embeddings")]
    pub fn _embeddings(&self) -> bool {
        self.info.embeddings
    }
}
