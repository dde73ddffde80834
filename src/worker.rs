//! Off-main-thread execution. Each context owns one worker thread that runs its jobs in call
//! order (FIFO), so operations on one context never reorder and never block the event loop.
//! Results settle JS promises through napi deferreds; errors keep their stable `code`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use napi::bindgen_prelude::*;
use napi::{Env, JsDeferred};

use crate::error::Error;

/// Converts our error into a JS `Error` carrying `code`, usable as a rejection or a throw.
pub fn js_error(env: &Env, e: &Error) -> napi::Error {
    let raw =
        unsafe { JsError::from(napi::Error::new(e.code(), e.to_string())).into_value(env.raw()) };
    match unsafe { Unknown::from_napi_value(env.raw(), raw) } {
        Ok(value) => napi::Error::from(value),
        Err(_) => napi::Error::new(Status::GenericFailure, e.to_string()),
    }
}

/// Marker prefix carrying the stable code through napi's fixed `Status` error type;
/// `lib/errors.js` moves it into `error.code` (the one place sync errors are finished).
pub fn to_js(e: Error) -> napi::Error {
    napi::Error::new(Status::GenericFailure, format!("[{}] {}", e.code(), e))
}

type Job = Box<dyn FnOnce() + Send>;

/// Shared by the JS object, the worker thread and every queued job.
pub struct Shared<E> {
    pub engine: Mutex<Option<E>>,
    /// Jobs queued or running; synchronous calls refuse to run while it is non-zero.
    pub pending: AtomicUsize,
    pub disposed: AtomicBool,
}

impl<E> Default for Shared<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> Shared<E> {
    pub fn new() -> Self {
        Shared {
            engine: Mutex::new(None),
            pending: AtomicUsize::new(0),
            disposed: AtomicBool::new(false),
        }
    }

    /// Runs `f` on the engine now, on the calling (JS) thread. Refuses rather than blocks when an
    /// asynchronous operation is still pending, so a sync call never sees half-applied state.
    pub fn with_engine<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut E) -> crate::error::Result<T>,
    ) -> crate::error::Result<T> {
        if self.disposed.load(Ordering::Acquire) {
            return Err(Error::ContextDisposed);
        }
        if self.pending.load(Ordering::Acquire) > 0 {
            return Err(Error::ContextBusy(what));
        }
        let mut guard = self
            .engine
            .try_lock()
            .map_err(|_| Error::ContextBusy(what))?;
        let engine = guard.as_mut().ok_or(Error::ContextDisposed)?;
        f(engine)
    }
}

pub struct Worker {
    sender: Option<mpsc::Sender<Job>>,
}

impl Worker {
    /// Starts the thread; `init` runs first on it (e.g. loading the model).
    pub fn spawn<E: Send + 'static>(
        shared: Arc<Shared<E>>,
        name: String,
        init: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Worker> {
        let (sender, receiver) = mpsc::channel::<Job>();
        std::thread::Builder::new().name(name).spawn(move || {
            init();
            while let Ok(job) = receiver.recv() {
                job();
            }
            // The JS side disposed (or was collected): free llama.cpp state here, after the
            // last queued job, never under a running decode.
            let engine = shared.engine.lock().map(|mut g| g.take());
            drop(engine);
        })?;
        Ok(Worker {
            sender: Some(sender),
        })
    }

    /// Queues `work` and returns a Promise settled with its result.
    pub fn submit<'env, E, T, F>(
        &self,
        env: &'env Env,
        shared: &Arc<Shared<E>>,
        work: F,
    ) -> napi::Result<Object<'env>>
    where
        E: Send + 'static,
        T: ToNapiValue + Send + 'static,
        F: FnOnce(&mut E) -> crate::error::Result<T> + Send + 'static,
    {
        type Resolver<T> = Box<dyn FnOnce(Env) -> napi::Result<T> + Send>;
        let (deferred, promise): (JsDeferred<T, Resolver<T>>, Object<'env>) =
            env.create_deferred()?;
        let settle = move |result: crate::error::Result<T>| {
            deferred.resolve(Box::new(move |env: Env| {
                result.map_err(|e| js_error(&env, &e))
            }));
        };
        if shared.disposed.load(Ordering::Acquire) {
            settle(Err(Error::ContextDisposed));
            return Ok(promise);
        }
        let Some(sender) = &self.sender else {
            settle(Err(Error::ContextDisposed));
            return Ok(promise);
        };
        shared.pending.fetch_add(1, Ordering::AcqRel);
        let job_shared = shared.clone();
        let job: Job = Box::new(move || {
            let result = if job_shared.disposed.load(Ordering::Acquire) {
                Err(Error::ContextDisposed)
            } else {
                match job_shared.engine.lock() {
                    Ok(mut guard) => match guard.as_mut() {
                        Some(engine) => run_guarded(|| work(engine)),
                        None => Err(Error::ContextDisposed),
                    },
                    Err(_) => Err(Error::Internal(
                        "context lock poisoned by an earlier panic".into(),
                    )),
                }
            };
            // Decrement before settling so the promise's continuation may call sync methods.
            job_shared.pending.fetch_sub(1, Ordering::AcqRel);
            settle(result);
        });
        if sender.send(job).is_err() {
            shared.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(napi::Error::from_reason(
                "the context's worker thread has stopped",
            ));
        }
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
