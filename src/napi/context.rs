//! The `SessionContext` class: the per-context engine behind its worker, how members reach it
//! (synchronously on the JS thread, or queued in call order), lifecycle and properties. The
//! context is created in load.rs; every other JS domain adds its members in its own file.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::convert::{self, js, Arg, BranchIds, Result};
use super::devices::OffloadInfo;
use super::logits_view::LogitsView;
use super::metrics::Trackers;
use super::sampling::SamplingHandles;
use super::worker::{self, rejected, Shared, Worker};
use crate::engine::decode::{decode_runs, Output, Run, RunOutput};
use crate::engine::handles::Handle;
use crate::engine::kv_types::KvConfig;
use crate::engine::pool::Pool;
use crate::engine::store::BranchStore;
use crate::engine::warmup::warm_up_sizes;
use crate::error::Error;
use crate::llama::{Batch, Context, Model, Token};

/// What the worker owns: the llama.cpp context, its branches and its thread pool.
pub struct Engine {
    pub ctx: Context,
    pub store: BranchStore,
    pub pool: Pool,
    /// Scratch for raw decodes (branch decodes use the store's).
    batch: Batch,
    /// Branches whose JS objects were garbage-collected while the context was busy.
    released: Released,
    /// The image projector loaded beside the model (`mmprojPath`), and its size limits.
    pub images: super::images::Images,
}

/// Handles of garbage-collected branches waiting to be freed: the JS finalizer may run at any
/// time, but the free must not run in the middle of a queued operation or make a later
/// synchronous call busy, so it is recorded here and done before the next operation starts.
pub type Released = Arc<Mutex<Vec<crate::engine::handles::Handle>>>;

impl Engine {
    pub(super) fn new(
        ctx: Context,
        store: BranchStore,
        pool: Pool,
        released: Released,
        images: super::images::Images,
    ) -> Engine {
        Engine {
            ctx,
            store,
            pool,
            batch: Batch::default(),
            released,
            images,
        }
    }

    /// Frees the branches garbage-collected since the last operation (see `Released`).
    fn free_released(&mut self) {
        let handles = match self.released.lock() {
            Ok(mut list) => std::mem::take(&mut *list),
            Err(_) => return,
        };
        for h in handles {
            if self.store.is_live(h) {
                // A branch the store still holds can always be pruned (one a parked child
                // needs is kept parked out of sight: engine/park.rs); nothing to report.
                let _ = self.store.prune(&self.ctx, h);
            }
        }
    }

    /// A raw decode (sequences no branch leases) through the one decode engine, with the
    /// context's limits and plan.
    pub fn decode(
        &mut self,
        runs: &[Run],
        cancel: &dyn Fn() -> bool,
        on_outputs: &mut dyn FnMut(&Context, &[RunOutput]) -> crate::error::Result<()>,
    ) -> crate::error::Result<()> {
        let limits = self.store.limits(&self.ctx);
        decode_runs(
            &mut self.ctx,
            &mut self.batch,
            runs,
            limits,
            cancel,
            on_outputs,
        )
    }
}

/// Context ids tag branch handles (see `BranchIds`).
fn next_context_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) % (convert::MAX_CONTEXT_ID - 1) + 1
}

#[derive(Clone, Copy)]
pub struct ContextInfo {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_seq_max: u32,
    /// Logits rows one decode may return.
    pub n_outputs: u32,
    pub n_vocab: i32,
    pub embeddings: bool,
    /// `llama_pooling_type` of the context (fixed at creation).
    pub pooling: i32,
    /// `typeK`, `typeV` and `flashAttention` as resolved.
    pub kv: KvConfig,
    /// The model's attention is causal: false for an encoder (embeddings only, no text).
    pub causal: bool,
}

#[napi]
pub struct SessionContext {
    pub(super) shared: Arc<Shared<Engine>>,
    worker: Option<Worker>,
    pub(super) info: ContextInfo,
    pub(super) ids: BranchIds,
    /// getTurnSeparator(), computed on first use.
    pub(super) turn_separator: OnceLock<Vec<Token>>,
    /// `options.chatTemplate`: the template chat calls use unless they name one.
    pub(super) chat_template: Option<String>,
    /// The zero-copy view handed out by `getLogits()` (JS thread only).
    pub(super) logits_view: RefCell<LogitsView>,
    /// `ctx.sample()`'s chain and the grammar sampler handles (napi/sampling.rs).
    pub(super) sampling: SamplingHandles,
    /// Perplexity tracker handles (napi/metrics.rs).
    pub(super) trackers: Trackers,
    /// Garbage-collected branches to free before the next operation (shared with the engine).
    pub(super) released: Released,
    /// Where the model's layers were placed (`ctx.offload`).
    pub(super) offload: OffloadInfo,
    /// Whether a projector was loaded, and its encoder counters (read without the engine).
    pub(super) image_counters: Option<Arc<super::images::Counters>>,
    /// Declared last so the weights outlive every sampler above when the object is collected.
    pub(super) model: Arc<Model>,
}

impl SessionContext {
    pub(super) fn new(
        shared: Arc<Shared<Engine>>,
        worker: Worker,
        info: ContextInfo,
        released: Released,
        model: Arc<Model>,
        offload: OffloadInfo,
        chat_template: Option<String>,
    ) -> SessionContext {
        SessionContext {
            shared,
            worker: Some(worker),
            info,
            ids: BranchIds::new(next_context_id()),
            turn_separator: OnceLock::new(),
            chat_template,
            logits_view: Default::default(),
            sampling: SamplingHandles::default(),
            trackers: Trackers::default(),
            released,
            offload,
            image_counters: None,
            model,
        }
    }

    /// Runs `f` on the engine now, on the JS thread (see `Shared::with_engine`).
    pub(super) fn sync<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Engine) -> crate::error::Result<T>,
    ) -> Result<T> {
        self.shared
            .with_engine(what, |e| {
                e.free_released();
                f(e)
            })
            .map_err(js)
    }

    pub(super) fn live(&self) -> crate::error::Result<()> {
        if self.shared.disposed.load(Ordering::Acquire) {
            return Err(Error::ContextDisposed);
        }
        self.shared.check_lost()
    }

    /// Queues work on the worker and returns its Promise. `prepare` checks the arguments on the
    /// JS thread and returns the job; its error rejects the Promise (never a throw). Any
    /// outstanding `getLogits()` view is revoked first, since the job may rewrite the logits.
    pub(super) fn spawn<'env, T, W>(
        &self,
        env: &'env Env,
        prepare: impl FnOnce() -> crate::error::Result<W>,
    ) -> Result<Object<'env>>
    where
        T: ToNapiValue + Send + 'static,
        W: FnOnce(&mut Engine) -> crate::error::Result<T> + Send + 'static,
    {
        self.revoke_logits_view(env);
        self.spawn_keeping_logits(env, prepare)
    }

    /// `spawn` for jobs that never touch the context's logits (tokenizer work, state reads).
    pub(super) fn spawn_keeping_logits<'env, T, W>(
        &self,
        env: &'env Env,
        prepare: impl FnOnce() -> crate::error::Result<W>,
    ) -> Result<Object<'env>>
    where
        T: ToNapiValue + Send + 'static,
        W: FnOnce(&mut Engine) -> crate::error::Result<T> + Send + 'static,
    {
        let work = match self.live().and_then(|_| prepare()) {
            Ok(work) => work,
            Err(e) => return rejected::<T>(env, e),
        };
        match &self.worker {
            Some(w) => w.submit(env, &self.shared, |e: &mut Engine| {
                e.free_released();
                work(e)
            }),
            None => rejected::<T>(env, Error::ContextDisposed),
        }
    }

    /// Frees branches in call order: now, on the JS thread, when no operation is queued (the
    /// same place in the order the worker would give it), otherwise after the queued ones.
    /// `free(engine, branch)` is one store operation (prune, prune a subtree, retain one); the
    /// Promise resolves with the handles it freed. A bad handle rejects without queueing.
    pub(super) fn free_in_order<'env>(
        &self,
        env: &'env Env,
        method: &'static str,
        handle: Arg<f64>,
        free: fn(&mut Engine, Handle) -> crate::error::Result<Vec<Handle>>,
    ) -> Result<Object<'env>> {
        let ids = self.ids;
        let branch = match self
            .live()
            .and_then(|_| ids.from_js(handle.get(method, "a branch handle")?))
        {
            Ok(branch) => branch,
            Err(e) => return rejected::<Vec<f64>>(env, e),
        };
        let (settle, promise) = worker::deferred::<Vec<f64>>(env)?;
        match &self.worker {
            Some(w) => w.run_now_or_enqueue(
                &self.shared,
                move |e: &mut Engine| {
                    e.free_released();
                    Ok(ids.to_js_all(&free(e, branch)?))
                },
                settle,
            ),
            None => settle(Err(Error::ContextDisposed)),
        }
        Ok(promise)
    }

    pub(super) fn revoke_logits_view(&self, env: &Env) {
        if let Ok(mut view) = self.logits_view.try_borrow_mut() {
            view.revoke(env);
        }
    }

    pub(super) fn tokens(&self, values: &[f64]) -> crate::error::Result<Vec<Token>> {
        convert::tokens_from(values, self.info.n_vocab)
    }

    pub(super) fn token(&self, v: f64) -> crate::error::Result<Token> {
        crate::engine::sampling::config::token(v, self.info.n_vocab, "")
    }
}

#[napi]
impl SessionContext {
    #[napi(getter)]
    pub fn vocab_size(&self) -> Result<i32> {
        self.live().map_err(js)?;
        Ok(self.info.n_vocab)
    }

    #[napi(getter)]
    pub fn memory_size(&self) -> Result<f64> {
        self.live().map_err(js)?;
        Ok(self.model.size_bytes() as f64)
    }

    #[napi(getter)]
    pub fn n_ctx(&self) -> Result<u32> {
        self.live().map_err(js)?;
        Ok(self.info.n_ctx)
    }

    #[napi(getter)]
    pub fn n_batch(&self) -> Result<u32> {
        self.live().map_err(js)?;
        Ok(self.info.n_batch)
    }

    #[napi(getter)]
    pub fn n_seq_max(&self) -> Result<u32> {
        self.live().map_err(js)?;
        Ok(self.info.n_seq_max)
    }

    #[napi(getter)]
    pub fn n_outputs(&self) -> Result<u32> {
        self.live().map_err(js)?;
        Ok(self.info.n_outputs)
    }

    #[napi(getter, ts_return_type = "'f16' | 'q8_0' | 'q4_0'")]
    pub fn type_k(&self) -> Result<&'static str> {
        self.live().map_err(js)?;
        Ok(self.info.kv.type_k.name())
    }

    #[napi(getter, ts_return_type = "'f16' | 'q8_0' | 'q4_0'")]
    pub fn type_v(&self) -> Result<&'static str> {
        self.live().map_err(js)?;
        Ok(self.info.kv.type_v.name())
    }

    #[napi(getter, ts_return_type = "'auto' | 'on' | 'off'")]
    pub fn flash_attention(&self) -> Result<&'static str> {
        self.live().map_err(js)?;
        Ok(self.info.kv.flash_attention.name())
    }

    /// Whether the context was created with `deterministic: true` (docs/determinism.md).
    #[napi(getter)]
    pub fn deterministic(&self) -> Result<bool> {
        self.live().map_err(js)?;
        Ok(self.info.kv.deterministic)
    }

    /// Where the model's layers went: `{ layers, totalLayers, devices }` (layers on non-CPU
    /// devices, out of the model's layers plus its output layer).
    #[napi(getter)]
    pub fn offload(&self) -> OffloadInfo {
        self.offload.clone()
    }

    /// Whether the context was lost (an RPC server it uses died); every call then fails with
    /// `ERR_CONTEXT_LOST`.
    #[napi(getter)]
    pub fn lost(&self) -> bool {
        self.shared.check_lost().is_err()
    }

    #[napi(getter)]
    pub fn disposed(&self) -> bool {
        self.shared.disposed.load(Ordering::Acquire)
    }

    /// The model's sliding-window attention span in positions (0 when it has none): `forkAt`
    /// below a branch's position is refused once the branch is past it.
    #[napi(getter)]
    pub fn sliding_window(&self) -> Result<u32> {
        self.live().map_err(js)?;
        Ok(self.model.n_swa())
    }

    #[napi(getter)]
    pub fn model_description(&self) -> Result<String> {
        self.live().map_err(js)?;
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
        self.sampling.clear();
        self.trackers.clear();
        // Free now when nothing is in flight; otherwise the worker frees it after its last job.
        if self.shared.queued() == 0 {
            if let Ok(mut guard) = self.shared.engine.try_lock() {
                guard.take();
            }
        }
    }

    /// Whether pairs of single-token branches decode as two 1-row batches on this machine
    /// (measured when the context was created).
    /// The token counts a warm-up decodes once each (engine/warmup.rs), ascending, up to
    /// `maxTokens` (default and cap: nBatch, or nCtx when smaller).
    #[napi(js_name = "_warmUpSizes")]
    pub fn _warm_up_sizes(&self, max_tokens: Option<u32>) -> Vec<u32> {
        let cap = self.info.n_batch.min(self.info.n_ctx);
        warm_up_sizes(max_tokens.unwrap_or(cap).min(cap))
    }

    /// Warm-up decodes on a scratch sequence (one no branch leases and that holds no cells):
    /// for each of `sizes`, that many throwaway tokens in one decode, every row's logits asked
    /// for when the output buffer allows (as a step of that many branches does), each removed
    /// again before the next. With `after` > 0 the sequence first gets `after` untimed cells, so
    /// that the timed decodes attend over a longer cache (attention kernels change with its
    /// length). Resolves with each decode's milliseconds, -1 for one that could not run (no
    /// scratch sequence, or too few free cells); nothing is left behind either way.
    #[napi(
        js_name = "_warmUp",
        ts_args_type = "sizes: number[], after?: number",
        ts_return_type = "Promise<number[]>"
    )]
    pub fn _warm_up<'env>(
        &self,
        env: &'env Env,
        sizes: Arg<Vec<f64>>,
        after: Arg<Option<f64>>,
    ) -> Result<Object<'env>> {
        let ContextInfo {
            n_batch,
            n_outputs,
            n_ctx,
            ..
        } = self.info;
        self.spawn(env, move || {
            let sizes = sizes
                .get("_warmUp: sizes", "an array of token counts")?
                .into_iter()
                .map(|n| convert::int_in("_warmUp: size", n, 1, n_batch as i64).map(|n| n as u32))
                .collect::<crate::error::Result<Vec<u32>>>()?;
            let after = match after.get("_warmUp: after", "a number of cells")? {
                Some(a) => convert::int_in("_warmUp: after", a, 0, n_ctx as i64)? as u32,
                None => 0,
            };
            let largest = sizes.iter().copied().max().unwrap_or(0);
            if after.saturating_add(largest) > n_ctx {
                return Err(Error::invalid(format!(
                    "_warmUp: after + size must be at most {n_ctx} (nCtx), got {largest} after {after}"
                )));
            }
            Ok(move |e: &mut Engine| {
                let Some(seq) = e.store.scratch_sequence(&e.ctx) else {
                    return Ok(vec![-1.0; sizes.len()]);
                };
                // Token 0 exists in every vocabulary; what the rows compute is thrown away.
                let filler = vec![0 as Token; after.max(largest) as usize];
                let run = |start: u32, tokens: u32, output: Output| Run {
                    seq,
                    start: start as i32,
                    tokens: &filler[..tokens as usize],
                    output,
                };
                let mut timings = vec![-1.0; sizes.len()];
                let mut result = Ok(());
                if after > 0 {
                    result = e.decode(&[run(0, after, Output::None)], &|| false, &mut |_, _| Ok(()));
                }
                for (i, &tokens) in sizes.iter().enumerate() {
                    if result.is_err() {
                        break;
                    }
                    let output = if tokens <= n_outputs {
                        Output::Each
                    } else {
                        Output::Last
                    };
                    let started = std::time::Instant::now();
                    result = e.decode(&[run(after, tokens, output)], &|| false, &mut |_, _| Ok(()));
                    if result.is_ok() {
                        timings[i] = started.elapsed().as_secs_f64() * 1000.0;
                    }
                    e.ctx.seq_rm(seq, after as i32, -1);
                }
                e.ctx.seq_rm(seq, -1, -1);
                match result {
                    Ok(()) | Err(Error::KvFull(_)) => Ok(timings),
                    Err(err) => Err(err),
                }
            })
        })
    }

    #[napi(getter, js_name = "_splitPairs")]
    pub fn _split_pairs(&self) -> Result<bool> {
        self.sync("_splitPairs", |e| Ok(e.store.split_pairs()))
    }

    /// Throws the error `code` names, with the message defined in `error.rs`: for the few checks
    /// lib/ makes before reaching native code (a wrapper already disposed), so that JS never
    /// repeats a message.
    #[napi(js_name = "_throwCoded")]
    pub fn _throw_coded(&self, code: String) -> Result<()> {
        let error = match code.as_str() {
            "ERR_BRANCH_DISPOSED" => Error::BranchDisposed,
            "ERR_CONTEXT_DISPOSED" => Error::ContextDisposed,
            other => Error::Internal(format!("_throwCoded does not know {other}")),
        };
        Err(js(error))
    }

    #[napi(getter, js_name = "_embeddings")]
    pub fn _embeddings(&self) -> bool {
        self.info.embeddings
    }
}
