//! Plans that depend on the machine are measured where the code runs, not hard-coded. Today
//! that is one question: is a decode of two single-token rows slower than two 1-row decodes?
//! On one 2-core host it was (22.4 vs 19.6 ms per step), on another of the same kind it was
//! not (37.9 vs 42.2 ms), and on a GPU it surely is not. Answered once per model, thread count
//! and device by a few decodes when a context is created, and cached for the process.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use super::decode::{decode_runs, Output, Run};
use super::kv::KvBackend;
use super::plan::Limits;
use crate::error::Result;
use crate::llama::{Batch, Pos, Token};

/// Repetitions of each variant; the fastest of each counts (the least disturbed by noise).
const REPS: usize = 3;
/// Two 1-row decodes must beat one 2-row decode by this factor to be chosen: batching is the
/// default, and differences inside the noise should not flip it.
const MARGIN: f64 = 0.95;

/// The cached answer for `key`, measured with `measure` the first time.
pub fn cached(key: &str, measure: impl FnOnce() -> Result<bool>) -> Result<bool> {
    static CACHE: OnceLock<Mutex<HashMap<String, bool>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(known) = cache.lock().ok().and_then(|c| c.get(key).copied()) {
        return Ok(known);
    }
    let answer = measure()?;
    if let Ok(mut c) = cache.lock() {
        c.insert(key.to_string(), answer);
    }
    Ok(answer)
}

/// Measures on sequences 0 and 1 of `kv`, which must be empty, and leaves them empty.
/// `token` is any valid id.
pub fn pair_split_is_faster(kv: &mut impl KvBackend, token: Token) -> Result<bool> {
    let mut batch = Batch::default();
    let result = measure(kv, &mut batch, token);
    kv.seq_rm(0, -1, -1);
    kv.seq_rm(1, -1, -1);
    let (pair, singles) = result?;
    Ok(singles < pair * MARGIN)
}

/// Fastest (2-row decode, two 1-row decodes) seconds.
fn measure(kv: &mut impl KvBackend, batch: &mut Batch, token: Token) -> Result<(f64, f64)> {
    let prompt = [token; 8];
    let start = prompt.len() as Pos;
    let no_cancel = || false;
    let (tokens, outputs) = (kv.n_batch() as usize, kv.n_outputs_max() as usize);
    let limits = |split_pairs| Limits {
        tokens,
        outputs,
        split_pairs,
    };
    let warm_up = [Run {
        seq: 0,
        start: 0,
        tokens: &prompt,
        output: Output::Last,
    }];
    decode_runs(
        kv,
        batch,
        &warm_up,
        limits(false),
        &no_cancel,
        &mut |_, _| Ok(()),
    )?;
    kv.seq_cp(0, 1, -1, -1);
    let step = [
        Run {
            seq: 0,
            start,
            tokens: &prompt[..1],
            output: Output::Last,
        },
        Run {
            seq: 1,
            start,
            tokens: &prompt[..1],
            output: Output::Last,
        },
    ];
    let (mut pair, mut singles) = (f64::MAX, f64::MAX);
    for _ in 0..REPS {
        for (split, best) in [(false, &mut pair), (true, &mut singles)] {
            let started = Instant::now();
            decode_runs(kv, batch, &step, limits(split), &no_cancel, &mut |_, _| {
                Ok(())
            })?;
            *best = best.min(started.elapsed().as_secs_f64());
            kv.seq_rm(0, start, -1);
            kv.seq_rm(1, start, -1);
        }
    }
    Ok((pair, singles))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::FakeKv;

    #[test]
    fn measuring_leaves_the_sequences_empty_and_answers_are_cached() {
        let mut kv = FakeKv::new(64, 2);
        pair_split_is_faster(&mut kv, 3).unwrap();
        assert_eq!(kv.cells_used(), 0);
        assert!(cached("test-key", || Ok(true)).unwrap());
        assert!(cached("test-key", || panic!("measured twice")).unwrap());
    }
}
