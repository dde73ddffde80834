//! The benchmark's raw series (`bench/run.js`): N-branch greedy generation with nothing but
//! the decode engine and a plain argmax per row — the physical limit `store.commit` is compared
//! against. It decodes with the same plan as the store (including the measured split of pairs).

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::context::{Engine, SessionContext};
use super::convert::{Arg, Result};
use crate::engine::decode::{Output, Run};
use crate::engine::metrics;
use crate::error::Error;
use crate::llama::{Pos, SeqId, Token};

/// Argmax as a vectorized max plus a search for it (the fastest plain form).
fn argmax(logits: &[f32]) -> Token {
    let max = metrics::finite_max(logits);
    logits.iter().position(|&l| l == max).unwrap_or(0) as Token
}

/// Decodes `prompt` into sequence 0, shares it with 1..n, then times `steps` steps of one
/// greedy token per sequence. Milliseconds spent in the step loop.
fn raw_generate(
    e: &mut Engine,
    prompt: &[Token],
    n: usize,
    steps: usize,
) -> crate::error::Result<f64> {
    e.ctx.clear_memory();
    let prefill = [Run {
        seq: 0,
        start: 0,
        tokens: prompt,
        output: Output::Last,
    }];
    e.decode(&prefill, &|| false, &mut |_, _| Ok(()))?;
    // The top-n first tokens, so the branches differ from the first step.
    let first = e.ctx.logits_row(-1)?;
    let mut order: Vec<usize> = (0..first.len()).collect();
    order.select_nth_unstable_by(n - 1, |&a, &b| first[b].total_cmp(&first[a]));
    let mut next: Vec<Token> = order[..n].iter().map(|&i| i as Token).collect();
    for s in 1..n as SeqId {
        e.ctx.seq_cp(0, s, -1, -1);
    }
    let start = std::time::Instant::now();
    for step in 0..steps {
        let tokens = next.clone();
        let runs: Vec<Run> = tokens
            .iter()
            .enumerate()
            .map(|(s, t)| Run {
                seq: s as SeqId,
                start: (prompt.len() + step) as Pos,
                tokens: std::slice::from_ref(t),
                output: Output::Last,
            })
            .collect();
        e.decode(&runs, &|| false, &mut |kv, outputs| {
            for o in outputs {
                next[o.run] = argmax(kv.logits_row(o.row)?);
            }
            Ok(())
        })?;
    }
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    e.ctx.clear_memory();
    Ok(ms)
}

#[napi]
impl SessionContext {
    /// Bench only: see `raw_generate`. Needs a context without live branches.
    #[napi(js_name = "_benchRawGenerate", ts_return_type = "Promise<number>")]
    pub fn _bench_raw_generate<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number[]")] prompt: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "number")] n: Arg<u32>,
        #[napi(ts_arg_type = "number")] steps: Arg<u32>,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let prompt = self.tokens(&prompt.get("_benchRawGenerate: prompt", "an array of token ids")?)?;
            let n = n.get("_benchRawGenerate: n", "a number")? as usize;
            let steps = steps.get("_benchRawGenerate: steps", "a number")? as usize;
            let limit = self.info.n_seq_max.min(self.info.n_batch) as usize;
            if n == 0 || n > limit || prompt.is_empty() {
                return Err(Error::invalid(format!(
                    "n must be in [1, min(nSeqMax, nBatch) = {limit}] and the prompt non-empty, got n = {n}"
                )));
            }
            Ok(move |e: &mut Engine| {
                if !e.store.is_empty() {
                    return Err(Error::invalid(
                        "_benchRawGenerate needs a context without live branches",
                    ));
                }
                raw_generate(e, &prompt, n, steps)
            })
        })
    }
}
