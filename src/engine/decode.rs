//! The one decode engine. Every write to the KV cache that runs the model — raw decodes,
//! `decodeAndCapture`, branch and store commit/prefill, embeddings and the benchmark's raw
//! series — goes through [`decode_runs`]: it validates a plan of runs, packs it into chunked
//! `llama_decode` calls, checks for cancellation between chunks, hands each chunk's output rows
//! to the caller before the next decode overwrites them, and on any failure removes what it
//! wrote from every sequence it touched, so a failed call leaves the KV cache as it found it.

use super::kv::KvBackend;
use super::plan::{self, Chunk, Limits, RunSize};
use crate::error::{Error, Result};
use crate::llama::{Batch, Pos, SeqId, Token};

/// Which rows of a run ask for an output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    None,
    /// The run's last token: its logits are handed to the caller.
    Last,
    /// Every token (embeddings); nothing is handed back, the caller reads the context after.
    All,
    /// Every token, each row handed back (verifying a draft): the run must fit one decode.
    Each,
}

/// Tokens for one sequence, continuing it at `start`.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    pub seq: SeqId,
    pub start: Pos,
    pub tokens: &'a [Token],
    pub output: Output,
}

impl Run<'_> {
    fn size(&self) -> RunSize {
        let outputs = match self.output {
            Output::None => 0,
            Output::Last => usize::from(!self.tokens.is_empty()),
            Output::All | Output::Each => self.tokens.len(),
        };
        RunSize {
            tokens: self.tokens.len(),
            outputs,
        }
    }
}

/// An output from the chunk just decoded: token `index` of run `run` (its last token for
/// `Output::Last`); `row` is its batch index, to read with `KvBackend::logits_row` inside the
/// callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOutput {
    pub run: usize,
    pub index: usize,
    pub row: i32,
}

/// The limits of `kv`, with `split_pairs` from the context's calibration.
pub fn limits_of(kv: &impl KvBackend, split_pairs: bool) -> Limits {
    Limits {
        tokens: kv.n_batch() as usize,
        outputs: kv.n_outputs_max() as usize,
        split_pairs,
    }
}

/// Decodes `runs` (see the module docs). `on_outputs` gets each chunk's `Output::Last` rows
/// right after that chunk's decode; an error from it fails the call like a decode error.
/// `cancel` is polled before every decode (llama.cpp's own abort hook covers the decode itself).
pub fn decode_runs<K: KvBackend>(
    kv: &mut K,
    batch: &mut Batch,
    runs: &[Run],
    limits: Limits,
    cancel: &dyn Fn() -> bool,
    on_outputs: &mut dyn FnMut(&K, &[RunOutput]) -> Result<()>,
) -> Result<()> {
    validate(kv, runs)?;
    if let Some(run) = runs
        .iter()
        .find(|r| r.output == Output::Each && r.tokens.len() > limits.tokens.min(limits.outputs))
    {
        return Err(Error::invalid(format!(
            "{} tokens with an output row each (a draft to verify, tokens to score) do not fit one decode (nBatch {}, {} output rows, option nOutputs); send fewer",
            run.tokens.len(),
            limits.tokens,
            limits.outputs
        )));
    }
    let sizes: Vec<RunSize> = runs.iter().map(Run::size).collect();
    let result = run_chunks(
        kv,
        batch,
        runs,
        &plan::pack(&sizes, limits),
        limits,
        cancel,
        on_outputs,
    );
    if result.is_err() {
        roll_back(kv, runs);
    }
    result
}

/// Everything llama.cpp would abort on or reject after a partial write is refused up front.
fn validate(kv: &impl KvBackend, runs: &[Run]) -> Result<()> {
    let n_ctx = kv.n_ctx() as u64;
    let mut seqs: Vec<SeqId> = runs.iter().map(|r| r.seq).collect();
    seqs.sort_unstable();
    if let Some(w) = seqs.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::Internal(format!(
            "sequence {} appears twice in one decode plan",
            w[0]
        )));
    }
    for run in runs.iter().filter(|r| !r.tokens.is_empty()) {
        let pos_max = kv.seq_pos_max(run.seq);
        if run.start < 0 || (pos_max >= 0 && run.start != pos_max + 1) {
            return Err(Error::invalid(format!(
                "sequence {} ends at position {pos_max}; the next decode must start at {} (got {})",
                run.seq,
                pos_max + 1,
                run.start
            )));
        }
        let end = run.start as u64 + run.tokens.len() as u64;
        if end > n_ctx {
            return Err(Error::KvFull(format!(
                "sequence {} at position {} with {} more tokens would pass nCtx = {n_ctx}",
                run.seq,
                run.start,
                run.tokens.len()
            )));
        }
    }
    Ok(())
}

fn run_chunks<K: KvBackend>(
    kv: &mut K,
    batch: &mut Batch,
    runs: &[Run],
    chunks: &[Chunk],
    limits: Limits,
    cancel: &dyn Fn() -> bool,
    on_outputs: &mut dyn FnMut(&K, &[RunOutput]) -> Result<()>,
) -> Result<()> {
    let mut outputs = Vec::new();
    for chunk in chunks {
        match chunk {
            Chunk::Packed(members) => {
                batch.clear();
                outputs.clear();
                for &i in members {
                    let first_row = batch.len() as i32;
                    let n = runs[i].tokens.len();
                    push_tokens(batch, &runs[i], 0, n);
                    match runs[i].output {
                        Output::Last => outputs.push(RunOutput {
                            run: i,
                            index: n - 1,
                            row: batch.len() as i32 - 1,
                        }),
                        Output::Each => outputs.extend((0..n).map(|index| RunOutput {
                            run: i,
                            index,
                            row: first_row + index as i32,
                        })),
                        Output::None | Output::All => {}
                    }
                }
                decode_one(kv, batch, cancel)?;
                if !outputs.is_empty() {
                    on_outputs(kv, &outputs)?;
                }
            }
            Chunk::Oversized(i) => {
                let run = &runs[*i];
                let piece = match run.output {
                    Output::All | Output::Each => limits.tokens.min(limits.outputs),
                    _ => limits.tokens,
                };
                for (offset, count) in plan::sub_batches(run.tokens.len(), piece) {
                    batch.clear();
                    push_tokens(batch, run, offset, count);
                    decode_one(kv, batch, cancel)?;
                }
                if run.output == Output::Last {
                    on_outputs(
                        kv,
                        &[RunOutput {
                            run: *i,
                            index: run.tokens.len() - 1,
                            row: batch.len() as i32 - 1,
                        }],
                    )?;
                }
            }
        }
    }
    Ok(())
}

fn push_tokens(batch: &mut Batch, run: &Run, offset: usize, count: usize) {
    let last = run.tokens.len() - 1;
    for j in offset..offset + count {
        let output = match run.output {
            Output::None => false,
            Output::Last => j == last,
            Output::All | Output::Each => true,
        };
        batch.push(run.tokens[j], run.start + j as Pos, run.seq, output);
    }
}

fn decode_one(kv: &mut impl KvBackend, batch: &mut Batch, cancel: &dyn Fn() -> bool) -> Result<()> {
    if cancel() {
        return Err(Error::Aborted);
    }
    kv.decode(batch)
}

/// Removes every cell at or after each run's start: all of them were written by this call
/// (validation made `start` the sequence's end), and cells of other sequences are untouched.
fn roll_back(kv: &impl KvBackend, runs: &[Run]) {
    for run in runs.iter().filter(|r| !r.tokens.is_empty()) {
        kv.seq_rm(run.seq, run.start, -1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::FakeKv;

    fn limits(tokens: usize) -> Limits {
        Limits {
            tokens,
            outputs: 8,
            split_pairs: false,
        }
    }

    fn no_cancel() -> bool {
        false
    }

    #[test]
    fn runs_are_chunked_and_outputs_handed_back_per_chunk() {
        let mut kv = FakeKv::new(64, 4);
        let mut batch = Batch::default();
        let (a, b, c) = ([1, 2, 3], [4, 5], [6; 9]);
        let runs = [
            Run {
                seq: 0,
                start: 0,
                tokens: &a,
                output: Output::Last,
            },
            Run {
                seq: 1,
                start: 0,
                tokens: &b,
                output: Output::Last,
            },
            Run {
                seq: 2,
                start: 0,
                tokens: &c,
                output: Output::Last,
            },
        ];
        let mut seen = Vec::new();
        decode_runs(
            &mut kv,
            &mut batch,
            &runs,
            limits(4),
            &no_cancel,
            &mut |kv, outs| {
                for o in outs {
                    seen.push((o.run, kv.logits_row(o.row)?[0]));
                }
                Ok(())
            },
        )
        .unwrap();
        // [a] alone (3 + 2 > 4), then [b], then c in sub-batches of 4, 4, 1.
        assert_eq!(kv.decode_sizes(), vec![3, 2, 4, 4, 1]);
        let runs_seen: Vec<usize> = seen.iter().map(|s| s.0).collect();
        assert_eq!(runs_seen, vec![0, 1, 2]);
        for (run, first_logit) in seen {
            let (seq, last_pos, token) = [(0, 2, 3), (1, 1, 5), (2, 8, 6)][run];
            assert_eq!(first_logit, FakeKv::logit0(seq, last_pos, token));
        }
        assert_eq!(
            (kv.seq_pos_max(0), kv.seq_pos_max(1), kv.seq_pos_max(2)),
            (2, 1, 8)
        );
    }

    #[test]
    fn a_failure_in_any_chunk_removes_everything_the_call_wrote() {
        for fail_at in 0..4 {
            let mut kv = FakeKv::new(64, 4);
            let mut batch = Batch::default();
            let prefix = [7, 7];
            decode_runs(
                &mut kv,
                &mut batch,
                &[Run {
                    seq: 0,
                    start: 0,
                    tokens: &prefix,
                    output: Output::None,
                }],
                limits(8),
                &no_cancel,
                &mut |_, _| Ok(()),
            )
            .unwrap();
            kv.seq_cp(0, 1, -1, -1);
            let before = kv.snapshot();
            kv.fail_decode_after(fail_at);
            let (a, b) = ([1; 5], [2; 6]);
            let runs = [
                Run {
                    seq: 0,
                    start: 2,
                    tokens: &a,
                    output: Output::Last,
                },
                Run {
                    seq: 1,
                    start: 2,
                    tokens: &b,
                    output: Output::Last,
                },
            ];
            let err = decode_runs(
                &mut kv,
                &mut batch,
                &runs,
                limits(4),
                &no_cancel,
                &mut |_, _| Ok(()),
            )
            .unwrap_err();
            assert_eq!(err.code(), "ERR_DECODE", "fail_at {fail_at}");
            assert_eq!(
                kv.snapshot(),
                before,
                "fail_at {fail_at}: the KV is as before"
            );
        }
    }

    #[test]
    fn cancel_between_chunks_and_a_failing_callback_roll_back_too() {
        let mut kv = FakeKv::new(64, 2);
        let mut batch = Batch::default();
        let tokens = [3; 10];
        let runs = [Run {
            seq: 0,
            start: 0,
            tokens: &tokens,
            output: Output::Last,
        }];
        let calls = std::cell::Cell::new(0);
        let cancel_second = || {
            calls.set(calls.get() + 1);
            calls.get() > 1
        };
        let err = decode_runs(
            &mut kv,
            &mut batch,
            &runs,
            limits(4),
            &cancel_second,
            &mut |_, _| Ok(()),
        )
        .unwrap_err();
        assert_eq!(err, Error::Aborted);
        assert_eq!(kv.seq_pos_max(0), -1);
        let err = decode_runs(
            &mut kv,
            &mut batch,
            &runs,
            limits(4),
            &no_cancel,
            &mut |_, _| Err(Error::NoLogits),
        )
        .unwrap_err();
        assert_eq!(err, Error::NoLogits);
        assert_eq!(kv.seq_pos_max(0), -1);
    }

    #[test]
    fn plans_llama_cpp_would_reject_are_refused_before_any_write() {
        let mut kv = FakeKv::new(8, 2);
        let mut batch = Batch::default();
        let t = [1, 2];
        let ok = |runs: &[Run], kv: &mut FakeKv, batch: &mut Batch| {
            decode_runs(kv, batch, runs, limits(4), &no_cancel, &mut |_, _| Ok(()))
        };
        ok(
            &[Run {
                seq: 0,
                start: 0,
                tokens: &t,
                output: Output::Last,
            }],
            &mut kv,
            &mut batch,
        )
        .unwrap();
        let gap = ok(
            &[Run {
                seq: 0,
                start: 5,
                tokens: &t,
                output: Output::Last,
            }],
            &mut kv,
            &mut batch,
        );
        assert_eq!(gap.unwrap_err().code(), "ERR_INVALID_ARG");
        let long = [1; 7];
        let full = ok(
            &[Run {
                seq: 0,
                start: 2,
                tokens: &long,
                output: Output::Last,
            }],
            &mut kv,
            &mut batch,
        );
        assert_eq!(full.unwrap_err().code(), "ERR_KV_FULL");
        let twice = ok(
            &[
                Run {
                    seq: 1,
                    start: 0,
                    tokens: &t,
                    output: Output::Last,
                },
                Run {
                    seq: 1,
                    start: 0,
                    tokens: &t,
                    output: Output::Last,
                },
            ],
            &mut kv,
            &mut batch,
        );
        assert_eq!(twice.unwrap_err().code(), "ERR_INTERNAL");
        assert_eq!(
            kv.decode_sizes(),
            vec![2],
            "nothing but the first decode ran"
        );
        assert_eq!(kv.seq_pos_max(0), 1);
    }

    #[test]
    fn all_outputs_respect_the_output_limit() {
        let mut kv = FakeKv::new(64, 1);
        let mut batch = Batch::default();
        let tokens = [5; 20];
        let runs = [Run {
            seq: 0,
            start: 0,
            tokens: &tokens,
            output: Output::All,
        }];
        let l = Limits {
            tokens: 16,
            outputs: 8,
            split_pairs: false,
        };
        decode_runs(
            &mut kv,
            &mut batch,
            &runs,
            l,
            &no_cancel,
            &mut |_, _| Ok(()),
        )
        .unwrap();
        assert_eq!(kv.decode_sizes(), vec![8, 8, 4]);
    }
}
