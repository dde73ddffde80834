//! `Chain`: the llama.cpp sampler chain built from a `SamplingConfig`, in the documented order:
//!   penalties → DRY → top-n-sigma → top-k → typical → top-p → min-p → XTC →
//!   terminal (greedy | temperature → dist | temperature → mirostat v1/v2)
//! When top-k can be done by our own preselection (`SamplingConfig::fast_top_k`), the chain has
//! no top-k stage and `pick::sample` does it first.

use super::config::{SamplingConfig, RANDOM_SEED as RANDOM_SEED_OF_LLAMA};
use crate::error::{Error, Result};
use crate::llama::{Model, Sampler, Token};

/// Which stage ends the chain (what `reseed` must replace).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Terminal {
    Greedy,
    Dist,
    Mirostat,
}

pub struct Chain {
    pub(super) sampler: Sampler,
    terminal: Terminal,
    /// Set when top-k is done by preselection (and absent from `sampler`).
    pub(super) fast_top_k: Option<usize>,
    config: SamplingConfig,
    /// Times the chain was applied since its random stage was seeded: llama.cpp's `dist`
    /// draws exactly once per apply, so (seed, draws) is the RNG's state, which a saved tree
    /// carries (llama.cpp cannot serialise a sampler).
    pub(super) draws: u64,
}

fn terminal_stage(config: &SamplingConfig, n_vocab: i32, seed: u32) -> Result<Sampler> {
    match &config.mirostat {
        Some(m) if m.mode == 1 => Sampler::mirostat(n_vocab, seed, m.tau, m.eta),
        Some(m) => Sampler::mirostat_v2(seed, m.tau, m.eta),
        None if config.temperature <= 0.0 => Sampler::greedy(),
        None => Sampler::dist(seed),
    }
}

impl Chain {
    /// Builds the chain for `config`. `model` is needed by DRY (its vocabulary); windows of -1
    /// become `n_ctx`.
    pub fn build(
        config: SamplingConfig,
        model: Option<&Model>,
        n_vocab: i32,
        n_ctx: u32,
    ) -> Result<Chain> {
        let mut chain = Sampler::chain()?;
        let fast_top_k = config.fast_top_k();
        let whole = |n: i32| if n < 0 { n_ctx as i32 } else { n };
        if let Some(p) = &config.penalties {
            chain.chain_push(Sampler::penalties(
                n_vocab,
                whole(p.last_n),
                p.repeat,
                p.frequency,
                p.presence,
            )?);
        }
        if let Some(d) = &config.dry {
            let model = model.ok_or_else(|| {
                Error::Internal("DRY sampling needs the model's vocabulary".into())
            })?;
            chain.chain_push(Sampler::dry(
                model,
                d.multiplier,
                d.base,
                d.allowed_length,
                whole(d.penalty_last_n),
                &d.sequence_breakers,
            )?);
        }
        if config.mirostat.is_none() {
            if let Some(n) = config.top_n_sigma {
                chain.chain_push(Sampler::top_n_sigma(n)?);
            }
            if config.top_k > 0 && fast_top_k.is_none() {
                chain.chain_push(Sampler::top_k(config.top_k)?);
            }
            if config.typical_p < 1.0 {
                chain.chain_push(Sampler::typical(config.typical_p)?);
            }
            if config.top_p < 1.0 {
                chain.chain_push(Sampler::top_p(config.top_p)?);
            }
            if config.min_p > 0.0 {
                chain.chain_push(Sampler::min_p(config.min_p)?);
            }
            if let Some(x) = &config.xtc {
                chain.chain_push(Sampler::xtc(x.probability, x.threshold, config.seed)?);
            }
        }
        if config.temperature > 0.0 || config.mirostat.is_some() {
            let t = if config.temperature > 0.0 {
                config.temperature
            } else {
                1.0
            };
            chain.chain_push(Sampler::temperature(t)?);
        }
        chain.chain_push(terminal_stage(&config, n_vocab, config.seed)?);
        let terminal = match (&config.mirostat, config.temperature <= 0.0) {
            (Some(_), _) => Terminal::Mirostat,
            (None, true) => Terminal::Greedy,
            (None, false) => Terminal::Dist,
        };
        Ok(Chain {
            sampler: chain,
            terminal,
            fast_top_k,
            config,
            draws: 0,
        })
    }

    /// A chain in the state a saved one was in: built from `config` with the seed its random
    /// stage actually used, applied `draws` times (one RNG draw each) and given `accepted` (the
    /// penalty and DRY windows). Refuses what (seed, draws, tokens) cannot reproduce: mirostat
    /// (its running estimate depends on the logits it saw) and XTC (draws only on some applies).
    pub fn restore(
        config: SamplingConfig,
        model: Option<&Model>,
        n_vocab: i32,
        n_ctx: u32,
        seed: u32,
        draws: u64,
        accepted: &[Token],
    ) -> Result<Chain> {
        Chain::check_restorable(&config)?;
        let original_seed = config.seed;
        let mut chain = Chain::build(SamplingConfig { seed, ..config }, model, n_vocab, n_ctx)?;
        chain.config.seed = original_seed;
        if chain.terminal != Terminal::Greedy {
            // One candidate: every stage before the terminal keeps it, and `dist` still draws.
            let mut one = [crate::llama::TokenData {
                id: 0,
                logit: 0.0,
                p: 0.0,
            }];
            for _ in 0..draws {
                one[0] = crate::llama::TokenData {
                    id: 0,
                    logit: 0.0,
                    p: 0.0,
                };
                chain.sampler.apply(&mut one, true);
            }
            chain.draws = draws;
        }
        for &t in accepted {
            chain.accept(t);
        }
        Ok(chain)
    }

    /// `ERR_UNSUPPORTED` for a configuration whose state cannot be saved (see `restore`).
    pub fn check_restorable(config: &SamplingConfig) -> Result<()> {
        let what = if config.mirostat.is_some() {
            "mirostat (its running estimate depends on every logits row it saw)"
        } else if config.xtc.is_some() {
            "XTC (its random draws depend on the candidates it saw)"
        } else {
            return Ok(());
        };
        Err(Error::Unsupported(format!(
            "a branch sampling with {what} cannot be saved in a tree and continue exactly; use the other samplers, or set this branch's params without it before saving"
        )))
    }

    /// The seed the random stage uses and the draws made since it was seeded (greedy chains:
    /// llama.cpp's default seed, 0 draws).
    pub fn rng_state(&self) -> (u32, u64) {
        if self.terminal == Terminal::Greedy {
            return (RANDOM_SEED_OF_LLAMA, 0);
        }
        (self.sampler.seed(), self.draws)
    }

    /// A greedy chain (no model needed): the default of tests and of raw sampling.
    pub fn greedy(n_vocab: i32) -> Result<Chain> {
        let config = SamplingConfig {
            temperature: 0.0,
            ..SamplingConfig::default()
        };
        Chain::build(config, None, n_vocab, 0)
    }

    pub fn try_clone(&self) -> Result<Chain> {
        Ok(Chain {
            sampler: self.sampler.try_clone()?,
            terminal: self.terminal,
            fast_top_k: self.fast_top_k,
            config: self.config.clone(),
            draws: self.draws,
        })
    }

    pub fn config(&self) -> &SamplingConfig {
        &self.config
    }

    pub fn is_stochastic(&self) -> bool {
        self.terminal != Terminal::Greedy
    }

    /// Replaces the random terminal stage with one seeded by `seed`; greedy chains are unchanged.
    pub fn reseed(&mut self, seed: u32, n_vocab: i32) -> Result<()> {
        if self.terminal == Terminal::Greedy {
            return Ok(());
        }
        let fresh = terminal_stage(&self.config, n_vocab, seed)?;
        self.sampler.chain_replace_last(fresh);
        self.draws = 0;
        Ok(())
    }

    /// Advances the penalty window and stateful stages. The chain holds no grammar (that is a
    /// separate sampler), so llama.cpp has nothing to reject here.
    pub fn accept(&mut self, token: Token) {
        let accepted = self.sampler.accept(token);
        debug_assert!(
            accepted.is_ok(),
            "a grammar-free chain refused token {token}"
        );
    }
}
