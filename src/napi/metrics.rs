//! Metrics on `SessionContext`: entropy and surprisal of the context's logits (or a row the
//! caller passes), and perplexity tracker handles. Trackers own no context state, so they work
//! at any time, behind their own lock.

use std::sync::Mutex;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::context::SessionContext;
use super::convert::{base_from, js, Result};
use super::sampling::{handle_arg, insert, lock, unknown_handle};
use crate::engine::handles::HandleTable;
use crate::engine::metrics::{self, Perplexity};

const TRACKER: &str = "perplexity tracker";

/// The perplexity trackers of one context.
#[derive(Default)]
pub struct Trackers(Mutex<HandleTable<Perplexity>>);

impl Trackers {
    /// Frees every tracker (on `dispose()`).
    pub fn clear(&self) {
        if let Ok(mut t) = self.0.lock() {
            *t = HandleTable::default();
        }
    }
}

impl SessionContext {
    fn with_tracker<T>(&self, handle: f64, f: impl FnOnce(&mut Perplexity) -> T) -> Result<T> {
        self.live().map_err(js)?;
        let h = handle_arg(handle, TRACKER).map_err(js)?;
        let mut table = lock(&self.trackers.0).map_err(js)?;
        let tracker = table
            .get_mut(h)
            .ok_or_else(|| js(unknown_handle(TRACKER, h, "createPerplexityTracker")))?;
        Ok(f(tracker))
    }

    fn insert_tracker(&self, tracker: Perplexity) -> Result<u32> {
        let mut table = lock(&self.trackers.0).map_err(js)?;
        insert(&mut table, tracker, TRACKER, "freePerplexityTracker").map_err(js)
    }
}

#[napi]
impl SessionContext {
    /// Argmax of the context's last logits row.
    #[napi]
    pub fn greedy_sample(&self) -> Result<i32> {
        self.sync("greedySample", |e| {
            let logits = e.ctx.logits_row(-1)?;
            let max = metrics::finite_max(logits);
            Ok(logits.iter().position(|&l| l == max).unwrap_or(0) as i32)
        })
    }

    #[napi]
    pub fn model_entropy(&self, base: Option<String>, logits: Option<Float32Array>) -> Result<f64> {
        let base = base_from(base).map_err(js)?;
        match logits {
            Some(l) => {
                self.check_vocab_row(l.len(), "logits").map_err(js)?;
                Ok(metrics::entropy(&l, base))
            }
            None => self.sync("modelEntropy", |e| {
                Ok(metrics::entropy(e.ctx.logits_row(-1)?, base))
            }),
        }
    }

    #[napi]
    pub fn model_surprisal(
        &self,
        token: f64,
        base: Option<String>,
        logits: Option<Float32Array>,
    ) -> Result<f64> {
        let base = base_from(base).map_err(js)?;
        let token = self.token(token).map_err(js)? as usize;
        match logits {
            Some(l) => {
                self.check_vocab_row(l.len(), "logits").map_err(js)?;
                Ok(metrics::surprisal(&l, token, base))
            }
            None => self.sync("modelSurprisal", |e| {
                Ok(metrics::surprisal(e.ctx.logits_row(-1)?, token, base))
            }),
        }
    }

    #[napi]
    pub fn create_perplexity_tracker(&self) -> Result<u32> {
        self.live().map_err(js)?;
        self.insert_tracker(Perplexity::default())
    }

    /// Adds one surprisal in nats. Non-finite values are ignored (not counted); negative values
    /// count as 0.
    #[napi]
    pub fn add_surprisal(&self, handle: f64, surprisal: f64) -> Result<()> {
        self.with_tracker(handle, |t| t.add(surprisal))
    }

    /// `exp(mean surprisal)`; `Infinity` while nothing has been counted.
    #[napi]
    pub fn get_perplexity(&self, handle: f64) -> Result<f64> {
        self.with_tracker(handle, |t| t.value())
    }

    #[napi]
    pub fn get_perplexity_count(&self, handle: f64) -> Result<u32> {
        self.with_tracker(handle, |t| t.count())
    }

    #[napi]
    pub fn reset_perplexity_tracker(&self, handle: f64) -> Result<()> {
        self.with_tracker(handle, |t| t.reset())
    }

    #[napi]
    pub fn clone_perplexity_tracker(&self, handle: f64) -> Result<u32> {
        let copy = self.with_tracker(handle, |t| *t)?;
        self.insert_tracker(copy)
    }

    /// Frees a tracker. An unknown or already freed handle is an error.
    #[napi]
    pub fn free_perplexity_tracker(&self, handle: f64) -> Result<()> {
        self.live().map_err(js)?;
        let h = handle_arg(handle, TRACKER).map_err(js)?;
        let mut table = lock(&self.trackers.0).map_err(js)?;
        table
            .remove(h)
            .map(drop)
            .ok_or_else(|| js(unknown_handle(TRACKER, h, "createPerplexityTracker")))
    }
}
