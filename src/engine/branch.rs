//! `BranchState`: one line of generation as the store keeps it — its lease, position and place
//! in the tree, its sampler chain and grammar, its logits snapshot and its perplexities.

use super::handles::Handle;
use super::metrics::{self, Base, Perplexity};
use super::sampling::{pick, Chain, SamplingConfig};
use super::segments::RunRef;
use crate::error::{Error, Result};
use crate::llama::{Pos, Sampler, SeqId, Token, TokenData};

/// What a grammar was built from, so a saved tree can build it again (`engine::tree`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GrammarSpec {
    pub gbnf: String,
    /// Lazy grammars: the trigger patterns and tokens (both empty: not lazy).
    pub trigger_patterns: Vec<String>,
    pub trigger_tokens: Vec<Token>,
}

/// The tokens accepted since the chain and the grammar were built. llama.cpp cannot serialise a
/// sampler's state, but the penalty/DRY windows and a grammar's parse state are functions of
/// these tokens, so a saved tree replays them (the RNG is `Chain::draws`).
#[derive(Debug, Clone, Default)]
pub struct History {
    pub chain: Vec<Token>,
    pub grammar: Vec<Token>,
}

/// What a branch samples with: its chain and, optionally, a grammar.
pub struct BranchSampling {
    pub chain: Chain,
    pub grammar: Option<Sampler>,
    /// The source of `grammar` (None for a grammar set without one: such a branch cannot be saved).
    pub grammar_spec: Option<GrammarSpec>,
    pub history: History,
}

impl BranchSampling {
    pub fn new(chain: Chain, grammar: Option<(Sampler, GrammarSpec)>) -> BranchSampling {
        let (grammar, grammar_spec) = match grammar {
            Some((g, spec)) => (Some(g), Some(spec)),
            None => (None, None),
        };
        BranchSampling {
            chain,
            grammar,
            grammar_spec,
            history: History::default(),
        }
    }

    pub fn try_clone(&self) -> Result<BranchSampling> {
        Ok(BranchSampling {
            chain: self.chain.try_clone()?,
            grammar: self.grammar.as_ref().map(Sampler::try_clone).transpose()?,
            grammar_spec: self.grammar_spec.clone(),
            history: self.history.clone(),
        })
    }
}

pub struct BranchState {
    pub seq: SeqId,
    /// The next position to write: its sequence ends at `position - 1`.
    pub position: Pos,
    pub fork_head: Pos,
    pub parent: Option<Handle>,
    pub children: Vec<Handle>,
    /// Chunk size of this branch's own prefills.
    pub n_batch: u32,
    pub model_ppl: Perplexity,
    pub sampling_ppl: Perplexity,
    pub(super) sampling: BranchSampling,
    pub(super) steer: Vec<(Token, f32)>,
    logits: Vec<f32>,
    /// Receives a new logits row during a decode; swapped in only when the whole call succeeds.
    pending_logits: Vec<f32>,
    /// log Σ exp(pending_logits), computed while copying the row in (see `set_pending`).
    pending_log_z: f64,
    has_logits: bool,
    /// log Σ exp(logits) of the snapshot, computed on first use: a token's logprob and its
    /// accept (perplexity) both need it, and it is one pass over the whole vocabulary.
    log_z: std::cell::Cell<Option<f64>>,
    candidates: Vec<TokenData>,
    last_sampled: Option<Token>,
    /// The KV cells this branch holds, for exact accounting (see `segments`).
    pub(super) runs: Vec<RunRef>,
    /// Created at `position` on an empty sequence whose prefix the caller copies in later
    /// (`ctx.kvSeqCopy(src, seq)`); nothing may decode or fork from it until then.
    pub(super) awaits_prefix: bool,
    /// The images whose positions this branch's cells hold, in order (engine/media.rs).
    pub images: Vec<super::media::ImageSpan>,
    /// Set while parked (engine/park.rs): no sequence, no cells; `seq` and `runs` mean nothing.
    pub(super) parked: Option<super::park::Parked>,
}

impl BranchState {
    pub(super) fn new(
        seq: SeqId,
        position: Pos,
        n_batch: u32,
        sampling: BranchSampling,
        n_vocab: usize,
        runs: Vec<RunRef>,
    ) -> BranchState {
        BranchState {
            seq,
            position,
            fork_head: 0,
            parent: None,
            children: Vec::new(),
            n_batch,
            model_ppl: Perplexity::default(),
            sampling_ppl: Perplexity::default(),
            sampling,
            steer: Vec::new(),
            logits: vec![0.0; n_vocab],
            pending_logits: Vec::new(),
            pending_log_z: f64::NEG_INFINITY,
            has_logits: false,
            log_z: std::cell::Cell::new(None),
            candidates: Vec::new(),
            last_sampled: None,
            runs,
            awaits_prefix: false,
            images: Vec::new(),
            parked: None,
        }
    }

    /// Every operation that reads or writes the branch's KV checks this first:
    /// `ERR_BRANCH_PARKED` while parked, `ERR_INVALID_ARG` saying the supported order while the
    /// prefix has not arrived.
    pub(super) fn check_has_prefix(&self) -> Result<()> {
        self.check_not_parked()?;
        if self.awaits_prefix {
            return Err(Error::invalid(format!(
                "the branch on sequence {seq} was created at position {pos} on an empty sequence and its prefix has not arrived: copy it in first with ctx.kvSeqCopy(src, {seq}) (or decode the prefix into sequence {seq} before creating the branch)",
                seq = self.seq,
                pos = self.position
            )));
        }
        Ok(())
    }

    /// A child at `position` with copies of this branch's state; `with_snapshot` says whether
    /// the child continues exactly where this branch is (logits and perplexities carry over) or
    /// at an earlier position (no logits: they describe a token the child does not have).
    pub(super) fn fork(
        &self,
        seq: SeqId,
        position: Pos,
        sampling: BranchSampling,
        runs: Vec<RunRef>,
        parent: Handle,
    ) -> BranchState {
        let at_end = position == self.position;
        let mut child = BranchState::new(seq, position, self.n_batch, sampling, 0, runs);
        child.fork_head = position;
        child.parent = Some(parent);
        child.images = super::media::images_below(&self.images, position);
        if at_end {
            child.logits = self.logits.clone();
            child.has_logits = self.has_logits;
            child.log_z = self.log_z.clone();
            child.model_ppl = self.model_ppl;
            child.sampling_ppl = self.sampling_ppl;
        } else {
            child.logits = vec![0.0; self.logits.len()];
        }
        child
    }

    /// `ERR_BRANCH_PARKED` while parked: its cells (and, once spilled, its snapshot) are elsewhere.
    pub fn check_not_parked(&self) -> Result<()> {
        match self.parked {
            Some(_) => Err(Error::BranchParked(
                "the branch is parked: it holds no sequence or KV cells until branch.resume() (or store.resume([...])) brings them back".into(),
            )),
            None => Ok(()),
        }
    }

    pub fn is_parked(&self) -> bool {
        self.parked.is_some()
    }

    /// The KV cells the branch holds (its runs count them exactly; 0 while parked).
    pub(super) fn held(&self) -> i32 {
        self.runs.iter().map(|r| r.used as i32).sum()
    }

    /// `ERR_STATE` unless the branch's sequence still ends at its position (raw KV calls may
    /// have changed it); `what` says what such a branch cannot do.
    pub(super) fn check_cells_end(&self, kv: &impl super::kv::KvBackend, what: &str) -> Result<()> {
        if kv.seq_pos_max(self.seq) + 1 != self.position
            && !(self.position == 0 && self.held() == 0)
        {
            return Err(Error::State(format!(
                "the cells of sequence {} no longer end at its branch's position {} (raw KV calls changed them); {what}",
                self.seq, self.position
            )));
        }
        Ok(())
    }

    pub fn has_logits(&self) -> bool {
        self.has_logits
    }

    pub fn logits(&self) -> Result<&[f32]> {
        self.check_not_parked()?;
        if self.has_logits {
            Ok(&self.logits)
        } else {
            Err(Error::NoLogits)
        }
    }

    pub fn is_stochastic(&self) -> bool {
        self.sampling.chain.is_stochastic()
    }

    pub fn has_grammar(&self) -> bool {
        self.sampling.grammar.is_some()
    }

    pub fn config(&self) -> &SamplingConfig {
        self.sampling.chain.config()
    }

    /// Samples from the snapshot (no KV write, no accept). `Ok(None)`: every token is masked.
    /// `scratch` receives the biased copy when there are biases.
    pub(super) fn sample(&mut self, scratch: &mut Vec<f32>) -> Result<Option<Token>> {
        self.check_not_parked()?;
        if !self.has_logits {
            return Err(Error::NoLogits);
        }
        let logits = std::mem::take(&mut self.logits);
        let sampled = self.sample_row(&logits, scratch);
        self.logits = logits;
        Ok(sampled)
    }

    /// `sample` from `row` instead of the snapshot (a draft's verification rows): the chain,
    /// grammar, biases and steer in their current state, `last_sampled` and the candidates left
    /// as `sample` leaves them for the accept that may follow.
    pub(super) fn sample_row(&mut self, row: &[f32], scratch: &mut Vec<f32>) -> Option<Token> {
        let static_bias = self.sampling.chain.config().logit_bias.as_slice();
        let logits = pick::biased(row, &[static_bias, &self.steer], scratch);
        self.last_sampled = pick::sample(
            &mut self.sampling.chain,
            self.sampling.grammar.as_mut(),
            logits,
            &mut self.candidates,
        );
        self.last_sampled
    }

    /// `ERR_GRAMMAR_REJECTED` when the grammar forbids `token` in its current state; nothing
    /// changes either way.
    pub(super) fn check_grammar(&mut self, token: Token) -> Result<()> {
        let logit = if self.has_logits {
            self.logits[token as usize]
        } else {
            0.0
        };
        let allowed = match self.sampling.grammar.as_mut() {
            Some(g) => pick::grammar_allows(g, token, logit),
            None => true,
        };
        if allowed {
            Ok(())
        } else {
            Err(Error::GrammarRejected(token))
        }
    }

    /// Model surprisal (nats) of `token` under the snapshot; infinite (not counted) without one.
    pub(super) fn surprisal_of(&self, token: Token) -> f64 {
        if !self.has_logits {
            return f64::INFINITY;
        }
        match self.logits.get(token as usize) {
            Some(&l) if l.is_finite() => (self.log_normalizer() - l as f64).max(0.0),
            _ => f64::INFINITY,
        }
    }

    /// log Σ exp(logits) of the snapshot (cached until the snapshot changes).
    pub fn log_normalizer(&self) -> f64 {
        if let Some(z) = self.log_z.get() {
            return z;
        }
        let z = metrics::log_sum_exp(&self.logits);
        self.log_z.set(Some(z));
        z
    }

    /// The natural-log probability of `token` under the snapshot and the `top` most likely
    /// tokens with theirs (see `metrics::token_logprobs`).
    pub fn token_logprobs(&self, token: usize, top: usize) -> Result<(f64, Vec<(usize, f64)>)> {
        let logits = self.logits()?;
        Ok(metrics::token_logprobs_given(
            logits,
            self.log_normalizer(),
            token,
            top,
        ))
    }

    /// Advances the grammar and the penalty window and records both perplexities. Call only
    /// after `check_grammar` passed for `token`: it cannot fail then.
    pub(super) fn apply_accept(&mut self, token: Token, model_surprisal: f64) {
        if let Some(g) = self.sampling.grammar.as_mut() {
            let accepted = g.accept(token);
            debug_assert!(accepted.is_ok(), "grammar refused a token it allowed");
            self.sampling.history.grammar.push(token);
        }
        self.sampling.chain.accept(token);
        self.sampling.history.chain.push(token);
        self.model_ppl.add(model_surprisal);
        if self.last_sampled == Some(token) && !self.candidates.is_empty() {
            let logits: Vec<f32> = self.candidates.iter().map(|c| c.logit).collect();
            if let Some(i) = self.candidates.iter().position(|c| c.id == token) {
                self.sampling_ppl
                    .add(metrics::surprisal(&logits, i, Base::Nats));
            }
        }
        self.last_sampled = None;
    }

    /// Stores a new logits row from a decode in progress (not visible until `commit_pending`).
    pub(super) fn set_pending(&mut self, row: &[f32]) {
        // The normalizer comes with the copy: the next accept's surprisal and any logprob need it,
        // and computing it later would read the whole row from memory twice more.
        self.pending_log_z = metrics::copy_log_sum_exp(row, &mut self.pending_logits);
    }

    /// Makes the pending row the snapshot, after the whole call succeeded.
    pub(super) fn commit_pending(&mut self) {
        std::mem::swap(&mut self.logits, &mut self.pending_logits);
        self.has_logits = true;
        self.log_z.set(Some(self.pending_log_z));
    }

    /// The snapshot, if there is one (what a saved tree stores).
    pub(super) fn snapshot(&self) -> Option<&[f32]> {
        self.has_logits.then_some(self.logits.as_slice())
    }

    /// Installs a saved snapshot (or none) on a restored branch.
    pub(super) fn restore_snapshot(&mut self, logits: Option<Vec<f32>>, n_vocab: usize) {
        self.log_z.set(None);
        match logits {
            Some(row) => {
                self.logits = row;
                self.has_logits = true;
            }
            None => {
                self.logits = vec![0.0; n_vocab];
                self.has_logits = false;
            }
        }
    }

    /// Moves the snapshot row and its cached normalizer out (a spilled park writes them to disk).
    pub(super) fn take_logits(&mut self) -> (Vec<f32>, Option<f64>) {
        (std::mem::take(&mut self.logits), self.log_z.get())
    }

    /// Puts back what `take_logits` moved out, bit for bit (the normalizer is not recomputed:
    /// a recomputed sum may differ in its last bits, and with it the perplexities).
    pub(super) fn put_logits(&mut self, row: Vec<f32>, log_z: Option<f64>) {
        self.logits = row;
        self.log_z.set(log_z);
    }

    /// Frees the per-decode scratch a parked branch does not need: the pending row, and the
    /// candidates unless a sampled token still waits for its accept (its sampling perplexity
    /// reads them).
    pub(super) fn free_scratch(&mut self) {
        self.pending_logits = Vec::new();
        if self.last_sampled.is_none() {
            self.candidates = Vec::new();
        }
    }

    /// Bytes of host memory the snapshot and the kept candidates take.
    pub(super) fn snapshot_bytes(&self) -> u64 {
        (self.logits.capacity() * 4 + self.candidates.capacity() * std::mem::size_of::<TokenData>())
            as u64
    }

    /// Copies a logits row into the snapshot directly (after a raw decode).
    pub(super) fn capture(&mut self, row: &[f32]) {
        let log_z = metrics::copy_log_sum_exp(row, &mut self.logits);
        self.has_logits = true;
        self.log_z.set(Some(log_z));
    }
}
