//! Off-main-thread execution and ordering. Each context owns one worker thread that runs every
//! queued operation on the context in call order (FIFO) — decodes, state loads, prunes,
//! `retainOnly` — so operations on one context never reorder, and awaited code never blocks the
//! event loop. A synchronous call that finds operations queued waits for them (in order, as if
//! they had been synchronous too) and then runs on the JS thread. Results settle JS promises
//! through napi deferreds; errors keep their stable `code`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};

use napi::bindgen_prelude::*;
use napi::{Env, JsDeferred};

use super::convert::{error_value, internal, Result};
use crate::error::Error;

type Job = Box<dyn FnOnce() + Send>;

/// Shared by the JS object, the worker thread and every queued job.
pub struct Shared<E> {
    pub engine: Mutex<Option<E>>,
    /// Jobs queued or running.
    queued: Mutex<usize>,
    /// Signalled when `queued` drops to zero.
    idle: Condvar,
    pub disposed: AtomicBool,
}

impl<E> Default for Shared<E> {
    fn default() -> Self {
        Shared {
            engine: Mutex::new(None),
            queued: Mutex::new(0),
            idle: Condvar::new(),
            disposed: AtomicBool::new(false),
        }
    }
}

/// The count even if a thread panicked while holding it (it is a plain integer).
fn count(m: &Mutex<usize>) -> MutexGuard<'_, usize> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<E> Shared<E> {
    /// Jobs queued or running.
    pub fn queued(&self) -> usize {
        *count(&self.queued)
    }

    fn job_queued(&self) {
        *count(&self.queued) += 1;
    }

    fn job_done(&self) {
        let mut queued = count(&self.queued);
        *queued -= 1;
        if *queued == 0 {
            self.idle.notify_all();
        }
    }

    /// Blocks until every job queued so far has run. Only the JS thread queues jobs, so while it
    /// waits here nothing new is queued and the wait ends.
    fn wait_idle(&self) {
        let mut queued = count(&self.queued);
        while *queued > 0 {
            queued = self
                .idle
                .wait(queued)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Runs `f` on the engine now, on the calling (JS) thread, after every operation queued
    /// before it: a synchronous call waits for them (blocking the event loop meanwhile, as a
    /// synchronous call must) rather than seeing half-applied state or failing.
    pub fn with_engine<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut E) -> crate::error::Result<T>,
    ) -> crate::error::Result<T> {
        if self.disposed.load(Ordering::Acquire) {
            return Err(Error::ContextDisposed);
        }
        self.wait_idle();
        let mut guard = self
            .engine
            .try_lock()
            .map_err(|_| Error::ContextBusy(what))?;
        let engine = guard.as_mut().ok_or(Error::ContextDisposed)?;
        run_guarded(|| f(engine))
    }

    /// Runs `work` on the engine (on the worker thread), or says why it cannot.
    fn run_job<T>(
        &self,
        work: impl FnOnce(&mut E) -> crate::error::Result<T>,
    ) -> crate::error::Result<T> {
        if self.disposed.load(Ordering::Acquire) {
            return Err(Error::ContextDisposed);
        }
        let mut guard = self
            .engine
            .lock()
            .map_err(|_| Error::Internal("context lock poisoned by an earlier panic".into()))?;
        let engine = guard.as_mut().ok_or(Error::ContextDisposed)?;
        run_guarded(|| work(engine))
    }
}

type Resolver<T> = Box<dyn FnOnce(Env) -> napi::Result<T> + Send>;

/// A promise and the function that settles it (from any thread) with our result.
pub fn deferred<'env, T: ToNapiValue + Send + 'static>(
    env: &'env Env,
) -> Result<(
    impl FnOnce(crate::error::Result<T>) + Send + 'static,
    Object<'env>,
)> {
    let (deferred, promise): (JsDeferred<T, Resolver<T>>, Object<'env>) =
        env.create_deferred().map_err(internal)?;
    let settle = move |result: crate::error::Result<T>| {
        deferred.resolve(Box::new(move |env: Env| {
            result.map_err(|e| error_value(&env, &e))
        }));
    };
    Ok((settle, promise))
}

/// A promise already rejected with `e`.
pub fn rejected<'env, T: ToNapiValue + Send + 'static>(
    env: &'env Env,
    e: Error,
) -> Result<Object<'env>> {
    let (settle, promise) = deferred::<T>(env)?;
    settle(Err(e));
    Ok(promise)
}

pub struct Worker {
    sender: Option<mpsc::Sender<Job>>,
}

impl Worker {
    /// Starts the thread. When the last sender is gone (dispose, or the JS object collected) it
    /// drains the queue and frees the engine there, never under a running decode.
    pub fn spawn<E: Send + 'static>(
        shared: Arc<Shared<E>>,
        name: String,
    ) -> std::io::Result<Worker> {
        let (sender, receiver) = mpsc::channel::<Job>();
        std::thread::Builder::new().name(name).spawn(move || {
            while let Ok(job) = receiver.recv() {
                job();
            }
            let engine = shared.engine.lock().map(|mut g| g.take());
            drop(engine);
        })?;
        Ok(Worker {
            sender: Some(sender),
        })
    }

    /// Queues `work` after everything queued before it; `settle` receives its result.
    pub fn enqueue<E, T>(
        &self,
        shared: &Arc<Shared<E>>,
        work: impl FnOnce(&mut E) -> crate::error::Result<T> + Send + 'static,
        settle: impl FnOnce(crate::error::Result<T>) + Send + 'static,
    ) where
        E: Send + 'static,
        T: Send + 'static,
    {
        let Some(sender) = &self.sender else {
            settle(Err(Error::ContextDisposed));
            return;
        };
        if shared.disposed.load(Ordering::Acquire) {
            settle(Err(Error::ContextDisposed));
            return;
        }
        shared.job_queued();
        let job_shared = shared.clone();
        let job: Job = Box::new(move || {
            let result = job_shared.run_job(work);
            // Counted done before settling, so the promise's continuation never waits on itself.
            job_shared.job_done();
            settle(result);
        });
        if let Err(mpsc::SendError(job)) = sender.send(job) {
            // The thread is gone (it only stops after `close`): run the job here so its result
            // (ContextDisposed) still settles the promise.
            job();
        }
    }

    /// Runs `work` at once on the calling thread when nothing is queued or running (so it takes
    /// the same place in the order as a queued job would), otherwise queues it.
    pub fn run_now_or_enqueue<E, T>(
        &self,
        shared: &Arc<Shared<E>>,
        work: impl FnOnce(&mut E) -> crate::error::Result<T> + Send + 'static,
        settle: impl FnOnce(crate::error::Result<T>) + Send + 'static,
    ) where
        E: Send + 'static,
        T: Send + 'static,
    {
        // Only the JS thread enqueues, so an empty queue cannot fill up under us here.
        if self.sender.is_some() && shared.queued() == 0 {
            settle(shared.run_job(work));
        } else {
            self.enqueue(shared, work, settle);
        }
    }

    /// Queues `work` and returns a Promise settled with its result.
    pub fn submit<'env, E, T>(
        &self,
        env: &'env Env,
        shared: &Arc<Shared<E>>,
        work: impl FnOnce(&mut E) -> crate::error::Result<T> + Send + 'static,
    ) -> Result<Object<'env>>
    where
        E: Send + 'static,
        T: ToNapiValue + Send + 'static,
    {
        let (settle, promise) = deferred::<T>(env)?;
        self.enqueue(shared, work, settle);
        Ok(promise)
    }

    /// Stops accepting jobs; the thread drains the queue, then frees the engine.
    pub fn close(&mut self) {
        self.sender = None;
    }
}

/// A panic in Rust code must not take the process down; report it as an internal error.
pub fn run_guarded<T>(f: impl FnOnce() -> crate::error::Result<T>) -> crate::error::Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Error::Internal(format!("panic: {msg}")))
        }
    }
}
