//! The per-branch sampling state of `BranchStore`: sampling from a snapshot, accepting tokens,
//! and replacing the chain, grammar, steer or seed. No KV is touched here (engine/store.rs has
//! the leases, tree and cells).

use super::branch::BranchSampling;
use super::handles::Handle;
use super::kv::KvBackend;
use super::store::BranchStore;
use crate::error::{Error, Result};
use crate::llama::Token;

impl BranchStore {
    /// Samples from the branch's snapshot (no KV write, no accept). `Ok(None)`: every token is masked.
    pub fn sample(&mut self, h: Handle) -> Result<Option<Token>> {
        let b = self.branches.get_mut(h).ok_or(Error::BranchDisposed)?;
        b.sample(&mut self.bias_scratch)
    }

    /// `sample` for several branches, spread over the pool (each branch has its own sampler
    /// state, so the order does not matter). One result per handle, in order.
    pub fn sample_many(
        &mut self,
        handles: &[Handle],
        pool: &super::pool::Pool,
    ) -> Vec<Result<Option<Token>>> {
        let _profile = super::profile::Phases::start("produce", handles.len());
        let Some(branches) = self.branches.get_many_mut(handles) else {
            // A stale or repeated handle: sample one by one, each gets its own result.
            return handles.iter().map(|&h| self.sample(h)).collect();
        };
        let mut work: Vec<_> = branches.into_iter().map(|b| (b, Ok(None))).collect();
        pool.for_each(&mut work, 4, |(b, result)| {
            *result = b.sample(&mut Vec::new());
        });
        work.into_iter().map(|(_, r)| r).collect()
    }

    /// Advances the grammar and the penalty window, and records both perplexities.
    pub fn accept(&mut self, h: Handle, token: Token) -> Result<()> {
        let b = self.get_mut(h)?;
        b.check_grammar(token)?;
        let surprisal = b.surprisal_of(token);
        b.apply_accept(token, surprisal);
        Ok(())
    }

    /// Copies the context's last logits row into the branch (right after a raw decode for it).
    pub fn capture_logits(&mut self, kv: &impl KvBackend, h: Handle) -> Result<()> {
        let row = kv.logits_row(-1)?;
        let b = self.get_mut(h)?;
        b.check_not_parked()?;
        b.capture(row);
        Ok(())
    }

    pub fn set_steer(&mut self, h: Handle, biases: Vec<(Token, f32)>) -> Result<()> {
        self.get_mut(h)?.steer = biases;
        Ok(())
    }

    pub fn reseed(&mut self, h: Handle, seed: u32, n_vocab: i32) -> Result<()> {
        self.get_mut(h)?.sampling.chain.reseed(seed, n_vocab)
    }

    /// Replaces the sampler chain (the penalty window and RNG start fresh); a new grammar, when
    /// given, replaces the old one.
    pub fn set_sampling(&mut self, h: Handle, sampling: BranchSampling) -> Result<()> {
        let b = self.get_mut(h)?;
        b.sampling.chain = sampling.chain;
        b.sampling.history.chain.clear();
        if sampling.grammar.is_some() {
            b.sampling.grammar = sampling.grammar;
            b.sampling.grammar_spec = sampling.grammar_spec;
            b.sampling.history.grammar.clear();
        }
        Ok(())
    }

    /// Installs (or with `None`, removes) a grammar; lazy grammars wait for a trigger.
    pub fn set_grammar(
        &mut self,
        h: Handle,
        grammar: Option<(crate::llama::Sampler, super::branch::GrammarSpec)>,
    ) -> Result<()> {
        let s = &mut self.get_mut(h)?.sampling;
        (s.grammar, s.grammar_spec) = match grammar {
            Some((g, spec)) => (Some(g), Some(spec)),
            None => (None, None),
        };
        s.history.grammar.clear();
        Ok(())
    }
}
