//! Decoding for branches: `commit` (one sampled token per branch, accepted, in one decode) and
//! `prefill` (token runs the model did not sample). Both follow the same shape:
//! validate once → decode through the one decode engine (new rows go to each branch's pending
//! buffer) → apply, which cannot fail. A failed or cancelled call changes no branch and leaves
//! the KV cache as it was.

use super::branch::BranchState;
use super::decode::{decode_runs, Output, Run, RunOutput};
use super::handles::{Handle, HandleTable};
use super::kv::KvBackend;
use super::metrics::{self, Base};
use super::pool::Pool;
use super::profile::Phases;
use super::store::BranchStore;
use crate::error::{Error, Result};
use crate::llama::{Pos, Token};

impl BranchStore {
    /// Refuses a call naming a branch twice: its tokens would race for one position.
    pub(super) fn check_distinct(handles: &[Handle]) -> Result<()> {
        let mut seen = handles.to_vec();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!(
                "branch {} appears more than once in one call; give each branch one entry",
                w[0]
            )));
        }
        Ok(())
    }

    /// One token per branch in one decode (chunked only past nBatch). With `accept`, each token
    /// is also accepted into its branch's sampler, grammar and metrics, against the logits it
    /// was sampled from; tokens must be ids in `[0, n_vocab)`.
    pub fn commit<K: KvBackend>(
        &mut self,
        kv: &mut K,
        pool: &Pool,
        items: &[(Handle, Token)],
        accept: bool,
        cancel: &dyn Fn() -> bool,
    ) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let mut profile = Phases::start("commit", items.len());
        let handles: Vec<Handle> = items.iter().map(|i| i.0).collect();
        Self::check_distinct(&handles)?;
        // Validate once: every branch live, its grammar allowing its token.
        let mut runs = Vec::with_capacity(items.len());
        for (h, token) in items {
            let b = self.get_mut(*h)?;
            b.check_has_prefix()?;
            if accept {
                b.check_grammar(*token)?;
            }
            runs.push(Run {
                seq: b.seq,
                start: b.position,
                tokens: std::slice::from_ref(token),
                output: Output::Last,
            });
        }
        let limits = self.limits(kv);
        mark(&mut profile, "validate");
        let mut surprisals = vec![f64::INFINITY; items.len()];
        let (branches, batch) = (&mut self.branches, &mut self.batch);
        decode_runs(kv, batch, &runs, limits, cancel, &mut |kv, outputs| {
            mark(&mut profile, "llama_decode");
            if profile.is_some() {
                // llama_decode returns once the graph is queued; the first logits read waits for
                // the device and the copy of every output row to the host.
                if let Some(first) = outputs.first() {
                    kv.logits_row(first.row)?;
                }
                mark(&mut profile, "device wait + logits to host");
            }
            let rows = RowsOfStep {
                items,
                accept,
                surprisals: &mut surprisals,
            };
            rows.take(kv, branches, pool, outputs)?;
            mark(&mut profile, "copy rows + surprisal");
            Ok(())
        })?;
        // Apply: nothing below can fail.
        for (&(h, token), &surprisal) in items.iter().zip(&surprisals) {
            let Some(b) = self.branches.get_mut(h) else {
                continue;
            };
            if accept {
                b.apply_accept(token, surprisal);
            }
            b.commit_pending();
            b.position += 1;
            self.segments.append(&mut b.runs, 1);
        }
        mark(&mut profile, "accept + bookkeeping");
        Ok(())
    }

    /// Variable-length runs (no accept: for tokens the model did not sample), packed into
    /// decodes of at most `limit` tokens (default nBatch). All-or-nothing: on failure every
    /// branch is unchanged. Tokens must be ids in `[0, n_vocab)`.
    pub fn prefill<K: KvBackend>(
        &mut self,
        kv: &mut K,
        items: &[(Handle, Vec<Token>)],
        limit: Option<u32>,
        cancel: &dyn Fn() -> bool,
    ) -> Result<()> {
        let unscored = vec![None; items.len()];
        self.prefill_scored(kv, items, &unscored, limit, cancel)
            .map(drop)
    }

    /// `prefill` that also scores: for an item whose `score_from[i]` is `Some(k)`, the model
    /// log-probability (nats, before any sampler) of each of `tokens[k..]`, in order, each under
    /// the logits of the token before it — the first from the branch's snapshot when `k` is 0
    /// (per token, not only the sum: a `select` over options that share a prefix reads every
    /// option's sum off one scored path). A
    /// scored run asks for a logits row per token, so it decodes whole in one decode (at most
    /// `ctx.nOutputs` and nBatch tokens); the scored runs of one call share decodes as far as
    /// those limits allow. This is how a program's `select` scores every option in one decode.
    pub fn prefill_scored<K: KvBackend>(
        &mut self,
        kv: &mut K,
        items: &[(Handle, Vec<Token>)],
        score_from: &[Option<usize>],
        limit: Option<u32>,
        cancel: &dyn Fn() -> bool,
    ) -> Result<Vec<Option<Vec<f64>>>> {
        if score_from.len() != items.len() {
            return Err(Error::invalid(
                "give one score start (or none) per prefill entry",
            ));
        }
        let handles: Vec<Handle> = items.iter().map(|i| i.0).collect();
        Self::check_distinct(&handles)?;
        let mut runs = Vec::with_capacity(items.len());
        // Per item: the scored tokens' log-probabilities so far, starting with the first scored
        // token's when that token is scored from the snapshot the branch holds now.
        let mut scores: Vec<Option<Vec<f64>>> = Vec::with_capacity(items.len());
        for ((h, tokens), from) in items.iter().zip(score_from) {
            let b = self.get(*h)?;
            b.check_has_prefix()?;
            let scored = match *from {
                Some(k) if k >= tokens.len() => {
                    return Err(Error::invalid(format!(
                        "a score start of {k} is past the entry's {} tokens; score at least one token",
                        tokens.len()
                    )))
                }
                Some(0) if !b.has_logits() => {
                    return Err(Error::invalid(
                        "the branch holds no logits to score its first token from: prefill or commit a token first (or score from index 1)",
                    ))
                }
                Some(0) => Some(vec![-b.surprisal_of(tokens[0])]),
                Some(_) => Some(Vec::with_capacity(tokens.len())),
                None => None,
            };
            let output = if scored.is_some() {
                Output::Each
            } else {
                Output::Last
            };
            scores.push(scored);
            runs.push(Run {
                seq: b.seq,
                start: b.position,
                tokens,
                output,
            });
        }
        let mut limits = self.limits(kv);
        if let Some(limit) = limit {
            limits.tokens = limits.tokens.min(limit.max(1) as usize);
        }
        let (branches, batch) = (&mut self.branches, &mut self.batch);
        decode_runs(kv, batch, &runs, limits, cancel, &mut |kv, outputs| {
            for o in outputs {
                let row = kv.logits_row(o.row)?;
                let tokens = &items[o.run].1;
                if o.index + 1 == tokens.len() {
                    branches
                        .get_mut(handles[o.run])
                        .ok_or(Error::BranchDisposed)?
                        .set_pending(row);
                }
                let next = o.index + 1;
                if let (Some(scored), Some(from)) = (scores[o.run].as_mut(), score_from[o.run]) {
                    if next < tokens.len() && next >= from {
                        scored.push(-metrics::surprisal(row, tokens[next] as usize, Base::Nats));
                    }
                }
            }
            Ok(())
        })?;
        for (h, tokens) in items.iter().filter(|(_, t)| !t.is_empty()) {
            let Some(b) = self.branches.get_mut(*h) else {
                continue;
            };
            b.commit_pending();
            b.position += tokens.len() as Pos;
            self.segments.append(&mut b.runs, tokens.len() as u32);
        }
        Ok(scores)
    }
}

/// What `commit` does with each decoded chunk's rows.
struct RowsOfStep<'a> {
    items: &'a [(Handle, Token)],
    accept: bool,
    /// Per item: the model surprisal of its token under the logits it was sampled from.
    surprisals: &'a mut [f64],
}

impl RowsOfStep<'_> {
    /// On the pool: each accepted token's surprisal under its branch's current snapshot, and a
    /// copy of the new row into the branch's pending buffer (both full-vocabulary passes).
    fn take<K: KvBackend>(
        self,
        kv: &K,
        branches: &mut HandleTable<BranchState>,
        pool: &Pool,
        outputs: &[RunOutput],
    ) -> Result<()> {
        let rows = outputs
            .iter()
            .map(|o| kv.logits_row(o.row))
            .collect::<Result<Vec<_>>>()?;
        let chunk: Vec<Handle> = outputs.iter().map(|o| self.items[o.run].0).collect();
        let targets = branches.get_many_mut(&chunk).ok_or(Error::BranchDisposed)?;
        let mut work: Vec<_> = targets
            .into_iter()
            .zip(rows)
            .zip(outputs)
            .map(|((b, row), o)| (b, row, self.items[o.run].1, f64::INFINITY, o.run))
            .collect();
        let accept = self.accept;
        pool.for_each(&mut work, 2, |(b, row, token, surprisal, _)| {
            if accept {
                *surprisal = b.surprisal_of(*token);
            }
            b.set_pending(row);
        });
        for (_, _, _, surprisal, run) in work {
            self.surprisals[run] = surprisal;
        }
        Ok(())
    }
}

pub(super) fn mark(profile: &mut Option<Phases>, name: &'static str) {
    if let Some(p) = profile.as_mut() {
        p.mark(name);
    }
}
