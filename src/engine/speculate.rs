//! Speculative decoding's one native step: `commit_drafts` commits each branch's sampled token
//! together with a draft of the tokens that may follow it (from any draft source), in ONE
//! decode with an output row per token, and keeps the longest prefix of the draft that the
//! branch's own sampler chain agrees with.
//!
//! Verification samples each row with the branch's chain, grammar, biases and steer, exactly as
//! a plain step would sample the snapshot, and accepts the draft token only when the sample
//! equals it. A draft is one token per position (a point mass), so "sample and compare" is the
//! speculative-sampling acceptance rule for it: a token is accepted with the target's own
//! probability, and the first sample that differs is a draw from the target's distribution with
//! the draft token taken out; that sample is returned as `next`, the token the caller commits
//! next (sampling again would skew the distribution). Greedy chains reduce to an argmax check.
//!
//! After the call a branch is exactly where plain commits of the accepted tokens would have left
//! it: position, snapshot (the row after the last accepted token), penalty window, grammar and
//! both perplexities. Rejected cells are removed from the branch's own sequence only, so a
//! draft never reaches a sibling's KV. A failed or cancelled call changes nothing.

use super::branch::BranchState;
use super::decode::{decode_runs, Output, Run};
use super::handles::Handle;
use super::kv::KvBackend;
use super::metrics;
use super::pool::Pool;
use super::profile::Phases;
use super::step::mark;
use super::store::BranchStore;
use crate::error::{Error, Result};
use crate::llama::{Pos, Token};

/// One branch's part of a speculative step.
#[derive(Debug, Clone)]
pub struct Drafted {
    pub branch: Handle,
    /// The token sampled from the branch's snapshot: committed whatever the draft holds.
    pub token: Token,
    /// Tokens proposed to follow `token`; may be empty (a plain commit for this branch).
    pub draft: Vec<Token>,
}

/// What verification kept of one branch's draft. An item with an empty draft is exactly a
/// plain commit, so rows that do not speculate share the step's decode unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// How many draft tokens were accepted (a prefix of the draft), after `token`.
    pub accepted: usize,
    /// The token sampled from the new snapshot (where the draft and the branch parted, or past
    /// the whole draft): the branch's next token, to commit in the following step. An
    /// end-of-generation token is never accepted from a draft; it comes back here. `None` for
    /// an empty draft (a plain commit: the caller samples next as usual) and when every
    /// candidate is masked.
    pub next: Option<Token>,
}

impl BranchStore {
    /// Commits every item's token and verifies its draft in one decode (see the module docs).
    /// `is_eog` names end-of-generation tokens, at which verification stops. Tokens must be ids
    /// in `[0, n_vocab)`.
    pub fn commit_drafts<K: KvBackend>(
        &mut self,
        kv: &mut K,
        pool: &Pool,
        items: &[Drafted],
        is_eog: &(dyn Fn(Token) -> bool + Sync),
        cancel: &dyn Fn() -> bool,
    ) -> Result<Vec<Verified>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let rows_asked = items.iter().map(|i| 1 + i.draft.len()).sum();
        let mut profile = Phases::start("commit_drafts", rows_asked);
        let handles: Vec<Handle> = items.iter().map(|i| i.branch).collect();
        Self::check_distinct(&handles)?;
        let sequences: Vec<Vec<Token>> = items
            .iter()
            .map(|i| {
                std::iter::once(i.token)
                    .chain(i.draft.iter().copied())
                    .collect()
            })
            .collect();
        let mut runs = Vec::with_capacity(items.len());
        for (item, tokens) in items.iter().zip(&sequences) {
            let b = self.get_mut(item.branch)?;
            b.check_has_prefix()?;
            b.check_grammar(item.token)?;
            runs.push(Run {
                seq: b.seq,
                start: b.position,
                tokens,
                output: Output::Each,
            });
        }
        // Every row is copied out before verification touches any sampler: a later chunk may
        // still fail, and sampler state (penalties, grammar, RNG) cannot be rolled back.
        let mut rows: Vec<Vec<Vec<f32>>> = sequences
            .iter()
            .map(|s| vec![Vec::new(); s.len()])
            .collect();
        let limits = self.limits(kv);
        decode_runs(
            kv,
            &mut self.batch,
            &runs,
            limits,
            cancel,
            &mut |kv, outputs| {
                mark(&mut profile, "llama_decode");
                let mut copies = Vec::with_capacity(outputs.len());
                for (o, dest) in outputs.iter().zip(slots(&mut rows, outputs)) {
                    copies.push((dest, kv.logits_row(o.row)?));
                }
                pool.for_each(&mut copies, 2, |(dest, row)| {
                    dest.clear();
                    dest.extend_from_slice(row);
                });
                mark(&mut profile, "copy rows");
                Ok(())
            },
        )?;
        // Apply: nothing below can fail.
        let branches = self
            .branches
            .get_many_mut(&handles)
            .ok_or(Error::BranchDisposed)?;
        let mut work: Vec<_> = branches
            .into_iter()
            .zip(items)
            .zip(&rows)
            .map(|((b, item), rows)| (b, item, rows.as_slice(), None))
            .collect();
        pool.for_each(&mut work, 1, |(b, item, rows, verified)| {
            *verified = Some(verify(b, item, rows, is_eog));
        });
        let verified: Vec<Verified> = work
            .into_iter()
            .map(|(_, _, _, v)| v.expect("every item verified"))
            .collect();
        mark(&mut profile, "verify");
        for (item, v) in items.iter().zip(&verified) {
            let Some(b) = self.branches.get_mut(item.branch) else {
                continue;
            };
            let kept = 1 + v.accepted;
            b.position += kept as Pos;
            self.segments.append(&mut b.runs, kept as u32);
            if v.accepted < item.draft.len() {
                kv.seq_rm(b.seq, b.position, -1);
            }
        }
        Ok(verified)
    }
}

/// The destination row buffer of each output, in `outputs` order.
fn slots<'a>(
    rows: &'a mut [Vec<Vec<f32>>],
    outputs: &[super::decode::RunOutput],
) -> Vec<&'a mut Vec<f32>> {
    let order: std::collections::HashMap<(usize, usize), usize> = outputs
        .iter()
        .enumerate()
        .map(|(k, o)| ((o.run, o.index), k))
        .collect();
    let mut picked: Vec<(usize, &'a mut Vec<f32>)> = rows
        .iter_mut()
        .enumerate()
        .flat_map(|(run, run_rows)| {
            run_rows
                .iter_mut()
                .enumerate()
                .map(move |(index, row)| ((run, index), row))
        })
        .filter_map(|(key, row)| order.get(&key).map(|&k| (k, row)))
        .collect();
    picked.sort_unstable_by_key(|(k, _)| *k);
    picked.into_iter().map(|(_, row)| row).collect()
}

/// Accepts `item.token`, then each draft token while the branch samples it from the row before
/// it; leaves the snapshot at the row after the last accepted token.
fn verify(
    b: &mut BranchState,
    item: &Drafted,
    rows: &[Vec<f32>],
    is_eog: &(dyn Fn(Token) -> bool + Sync),
) -> Verified {
    let surprisal = b.surprisal_of(item.token);
    b.apply_accept(item.token, surprisal);
    if item.draft.is_empty() {
        // A plain commit: the caller samples the next token itself, as after `commit`.
        b.capture(&rows[0]);
        return Verified {
            accepted: 0,
            next: None,
        };
    }
    let mut scratch = Vec::new();
    let mut accepted = 0;
    let next = loop {
        let row = &rows[accepted];
        let sampled = b.sample_row(row, &mut scratch);
        match (sampled, item.draft.get(accepted)) {
            (Some(s), Some(&d)) if s == d && !is_eog(s) => {
                b.apply_accept(d, surprisal_in(row, d));
                accepted += 1;
            }
            (sampled, _) => break sampled,
        }
    };
    b.capture(&rows[accepted]);
    // `capture` keeps the sampled `next` and its candidates: committing it later counts its
    // sampling perplexity as a plain step would.
    Verified { accepted, next }
}

/// Model surprisal (nats) of `token` under `row`.
fn surprisal_in(row: &[f32], token: Token) -> f64 {
    match row.get(token as usize) {
        Some(&l) if l.is_finite() => (metrics::log_sum_exp(row) - l as f64).max(0.0),
        _ => f64::INFINITY,
    }
}
