//! Cancellation of queued and running operations. `lib/cancel.js` creates one `CancelToken` per
//! operation that was given an `AbortSignal` and calls `cancel()` when the signal aborts; the
//! worker checks the token before the job starts and between decodes, and llama.cpp polls it
//! between graph nodes through the context's abort callback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::type_of;
use napi_derive::napi;

use super::context::Engine;
use crate::error::{Error, Result};

#[napi]
pub struct CancelToken {
    flag: Arc<AtomicBool>,
}

impl Default for CancelToken {
    fn default() -> Self {
        Self::new()
    }
}

#[napi]
impl CancelToken {
    #[napi(constructor)]
    pub fn new() -> Self {
        CancelToken {
            flag: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Requests cancellation; idempotent and safe at any time (the job may already be done).
    #[napi]
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
    }

    #[napi(getter)]
    pub fn cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

/// The optional `CancelToken` argument of a cancellable method, converted in the method body
/// (like `Arg`) so that a wrong value rejects its Promise instead of throwing.
pub struct CancelArg(napi::Result<Option<Arc<AtomicBool>>>);

impl FromNapiValue for CancelArg {
    unsafe fn from_napi_value(
        env: napi::sys::napi_env,
        value: napi::sys::napi_value,
    ) -> napi::Result<Self> {
        let flag = match type_of!(env, value) {
            Ok(ValueType::Undefined | ValueType::Null) => Ok(None),
            // SAFETY: napi-rs calls us with a live env and value; `from_napi_ref` checks that
            // the value wraps a CancelToken before it hands out the reference.
            _ => unsafe { <CancelToken as FromNapiRef>::from_napi_ref(env, value) }
                .map(|token| Some(token.flag.clone())),
        };
        Ok(CancelArg(flag))
    }
}

impl CancelArg {
    /// The token's flag (taken on the JS thread so the job can carry it to the worker).
    pub fn get(self, what: &str) -> Result<Option<Arc<AtomicBool>>> {
        self.0.map_err(|_| {
            Error::invalid(format!(
                "{what}: the cancel argument must be a CancelToken or undefined"
            ))
        })
    }
}

/// Runs `work` on the engine under `flag`: refuses with `Aborted` (touching nothing) if it was
/// cancelled while queued, and otherwise lets a cancel stop the decodes `work` runs. `work` gets
/// the check to call between decodes.
pub fn run_cancellable<T>(
    engine: &mut Engine,
    flag: Option<Arc<AtomicBool>>,
    work: impl FnOnce(&mut Engine, &dyn Fn() -> bool) -> Result<T>,
) -> Result<T> {
    let Some(flag) = flag else {
        // Uninstall whatever a job that panicked may have left behind.
        engine.ctx.set_cancel_flag(None);
        return work(engine, &|| false);
    };
    if flag.load(Ordering::Acquire) {
        return Err(Error::Aborted);
    }
    engine.ctx.set_cancel_flag(Some(flag.clone()));
    let result = work(engine, &|| flag.load(Ordering::Acquire));
    engine.ctx.set_cancel_flag(None);
    result
}
