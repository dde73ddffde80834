//! Sampling: validated parameters, the llama.cpp sampler chain built from them, and the
//! per-branch sampling pipeline.
//!
//! Pipeline for one `sample()` (documented order):
//!   snapshot logits → static logit bias + steer biases → grammar mask →
//!   penalties → DRY → top-n-sigma → top-k → typical → top-p → min-p → XTC →
//!   terminal (greedy | temperature → dist | temperature → mirostat v1/v2)
//!
//! Fast path: when the chain starts with a plain top-k (no penalties, DRY, top-n-sigma or
//! mirostat, which need the whole vocabulary), the top-k is done here in one O(n_vocab) scan and
//! the rest of the chain runs on k candidates instead of 262k. With a grammar, the grammar is
//! applied to a wider preselection first and we fall back to the whole vocabulary only if fewer
//! than k legal tokens are found there, so the result is the same as masking everything.

use llama_cpp_sys_2 as sys;

use crate::error::{Error, Result};
use crate::ffi::{Model, Sampler, Token, TokenData};

#[derive(Debug, Clone, PartialEq)]
pub struct Penalties {
    pub repeat: f32,
    pub frequency: f32,
    pub presence: f32,
    /// Window in tokens; -1 = the whole context.
    pub last_n: i32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Mirostat {
    pub mode: u8,
    pub tau: f32,
    pub eta: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Dry {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: i32,
    pub penalty_last_n: i32,
    pub sequence_breakers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Xtc {
    pub probability: f32,
    pub threshold: f32,
}

/// Fully resolved and validated sampling parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingConfig {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub typical_p: f32,
    pub seed: u32,
    pub penalties: Option<Penalties>,
    pub mirostat: Option<Mirostat>,
    pub dry: Option<Dry>,
    pub xtc: Option<Xtc>,
    pub top_n_sigma: Option<f32>,
    pub logit_bias: Vec<(Token, f32)>,
    pub grammar: Option<String>,
}

/// `LLAMA_DEFAULT_SEED`: llama.cpp draws a random seed.
pub const RANDOM_SEED: u32 = 0xFFFF_FFFF;

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            seed: RANDOM_SEED,
            penalties: None,
            mirostat: None,
            dry: None,
            xtc: None,
            top_n_sigma: None,
            logit_bias: Vec::new(),
            grammar: None,
        }
    }
}

fn finite(name: &str, v: f64) -> Result<f32> {
    if !v.is_finite() {
        return Err(Error::invalid(format!(
            "{name} must be a finite number, got {v}"
        )));
    }
    Ok(v as f32)
}

fn integer(name: &str, v: f64, min: i64) -> Result<i32> {
    if !v.is_finite() || v.fract() != 0.0 || v < min as f64 || v > i32::MAX as f64 {
        return Err(Error::invalid(format!(
            "{name} must be an integer >= {min}, got {v}"
        )));
    }
    Ok(v as i32)
}

fn probability(name: &str, v: f64, allow_zero: bool) -> Result<f32> {
    let ok = v.is_finite() && v <= 1.0 && if allow_zero { v >= 0.0 } else { v > 0.0 };
    if !ok {
        let range = if allow_zero { "[0, 1]" } else { "(0, 1]" };
        return Err(Error::invalid(format!(
            "{name} must be in {range}, got {v}"
        )));
    }
    Ok(v as f32)
}

/// Raw DRY fields: multiplier, base, allowedLength, penaltyLastN, sequenceBreakers.
pub type RawDry = (
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<Vec<String>>,
);

/// Raw, unvalidated values as read from JS (each `None` = use the default).
#[derive(Debug, Clone, Default)]
pub struct RawSampling {
    pub temperature: Option<f64>,
    pub top_k: Option<f64>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub seed: Option<f64>,
    pub grammar: Option<String>,
    pub repeat: Option<f64>,
    pub frequency: Option<f64>,
    pub presence: Option<f64>,
    pub last_n: Option<f64>,
    pub typical_p: Option<f64>,
    pub mirostat: Option<(Option<f64>, Option<f64>, Option<f64>)>,
    pub dry: Option<RawDry>,
    pub xtc: Option<(Option<f64>, Option<f64>)>,
    pub top_n_sigma: Option<f64>,
    pub logit_bias: Vec<(f64, f64)>,
}

impl SamplingConfig {
    /// Validates every field; invalid values are errors, never silent clamps.
    pub fn from_raw(raw: &RawSampling, n_vocab: i32) -> Result<SamplingConfig> {
        let mut c = SamplingConfig::default();
        if let Some(t) = raw.temperature {
            c.temperature = finite("temperature", t)?;
        }
        if let Some(k) = raw.top_k {
            c.top_k = integer("topK", k, 0)?;
        }
        if let Some(p) = raw.top_p {
            c.top_p = probability("topP", p, false)?;
        }
        if let Some(p) = raw.min_p {
            c.min_p = probability("minP", p, true)?;
        }
        if let Some(p) = raw.typical_p {
            c.typical_p = probability("advanced.typicalP", p, false)?;
        }
        if let Some(s) = raw.seed {
            if !s.is_finite() || s.fract() != 0.0 || !(-1.0..=u32::MAX as f64).contains(&s) {
                return Err(Error::invalid(format!(
                    "seed must be an integer in [0, 2^32) (or -1 for random), got {s}"
                )));
            }
            c.seed = if s < 0.0 { RANDOM_SEED } else { s as u32 };
        }
        if raw.repeat.is_some()
            || raw.frequency.is_some()
            || raw.presence.is_some()
            || raw.last_n.is_some()
        {
            let repeat = raw
                .repeat
                .map(|v| finite("penalties.repeat", v))
                .transpose()?
                .unwrap_or(1.0);
            if repeat <= 0.0 {
                return Err(Error::invalid(format!(
                    "penalties.repeat must be > 0 (1 = off), got {repeat}"
                )));
            }
            let last_n = match raw.last_n {
                Some(-1.0) => -1,
                Some(v) => integer("penalties.lastN", v, 0)?,
                None => 64,
            };
            c.penalties = Some(Penalties {
                repeat,
                frequency: raw
                    .frequency
                    .map(|v| finite("penalties.frequency", v))
                    .transpose()?
                    .unwrap_or(0.0),
                presence: raw
                    .presence
                    .map(|v| finite("penalties.presence", v))
                    .transpose()?
                    .unwrap_or(0.0),
                last_n,
            });
        }
        if let Some((mode, tau, eta)) = raw.mirostat {
            let mode = match mode {
                None | Some(2.0) => 2u8,
                Some(1.0) => 1,
                Some(0.0) => 0,
                Some(m) => {
                    return Err(Error::invalid(format!(
                        "advanced.mirostat.mode must be 0 (off), 1 or 2, got {m}"
                    )))
                }
            };
            if mode != 0 {
                let tau = tau
                    .map(|v| finite("advanced.mirostat.tau", v))
                    .transpose()?
                    .unwrap_or(5.0);
                let eta = eta
                    .map(|v| finite("advanced.mirostat.eta", v))
                    .transpose()?
                    .unwrap_or(0.1);
                if tau <= 0.0 || eta <= 0.0 {
                    return Err(Error::invalid("advanced.mirostat.tau and eta must be > 0"));
                }
                c.mirostat = Some(Mirostat { mode, tau, eta });
            }
        }
        if let Some((multiplier, base, allowed, last_n, breakers)) = &raw.dry {
            let multiplier = multiplier
                .map(|v| finite("advanced.dry.multiplier", v))
                .transpose()?
                .unwrap_or(0.8);
            let base = base
                .map(|v| finite("advanced.dry.base", v))
                .transpose()?
                .unwrap_or(1.75);
            if multiplier < 0.0 || base < 1.0 {
                return Err(Error::invalid(
                    "advanced.dry.multiplier must be >= 0 and advanced.dry.base >= 1",
                ));
            }
            let allowed_length = allowed
                .map(|v| integer("advanced.dry.allowedLength", v, 0))
                .transpose()?
                .unwrap_or(2);
            let penalty_last_n = match last_n {
                Some(v) if *v == -1.0 => -1,
                Some(v) => integer("advanced.dry.penaltyLastN", *v, 0)?,
                None => -1,
            };
            let sequence_breakers = breakers.clone().unwrap_or_else(|| {
                ["\n", ":", "\"", "*"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            });
            if multiplier > 0.0 {
                c.dry = Some(Dry {
                    multiplier,
                    base,
                    allowed_length,
                    penalty_last_n,
                    sequence_breakers,
                });
            }
        }
        if let Some((p, t)) = raw.xtc {
            let probability = probability("advanced.xtc.probability", p.unwrap_or(0.5), true)?;
            let threshold = probability_open("advanced.xtc.threshold", t.unwrap_or(0.1))?;
            if probability > 0.0 {
                c.xtc = Some(Xtc {
                    probability,
                    threshold,
                });
            }
        }
        if let Some(n) = raw.top_n_sigma {
            let n = finite("advanced.topNSigma", n)?;
            if n <= 0.0 {
                return Err(Error::invalid(format!(
                    "advanced.topNSigma must be > 0, got {n}"
                )));
            }
            c.top_n_sigma = Some(n);
        }
        for &(token, bias) in &raw.logit_bias {
            let token = check_token(token, n_vocab, "logitBias token")?;
            if bias.is_nan() || bias == f64::INFINITY {
                return Err(Error::invalid(format!(
                    "logitBias bias must be a number or -Infinity, got {bias}"
                )));
            }
            c.logit_bias.push((token, bias as f32));
        }
        c.grammar = raw.grammar.clone().filter(|g| !g.is_empty());
        Ok(c)
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 && self.mirostat.is_none()
    }

    /// Top-k can be done by our preselection only when nothing before it needs the whole vocabulary.
    fn fast_top_k(&self) -> Option<usize> {
        let eligible = self.top_k > 0
            && self.penalties.is_none()
            && self.dry.is_none()
            && self.top_n_sigma.is_none()
            && self.mirostat.is_none();
        eligible.then_some(self.top_k as usize)
    }
}

fn probability_open(name: &str, v: f64) -> Result<f32> {
    if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
        return Err(Error::invalid(format!("{name} must be in [0, 1], got {v}")));
    }
    Ok(v as f32)
}

pub fn check_token(token: f64, n_vocab: i32, what: &str) -> Result<Token> {
    if token.is_finite() && token.fract() == 0.0 && token >= 0.0 && token < n_vocab as f64 {
        return Ok(token as Token);
    }
    // A fraction or NaN is reported as itself, not as the truncated id it would become.
    let err = if token.is_finite() && token.fract() == 0.0 {
        Error::TokenOutOfRange {
            token: token as i64,
            n_vocab,
        }
    } else {
        Error::TokenNotInteger(token, n_vocab)
    };
    // With a context label (logitBias, steer) the caller gets an argument error naming the field.
    Err(if what.is_empty() {
        err
    } else {
        Error::invalid(format!("{what}: {err}"))
    })
}

/// Which stage ends the chain (what `reseed` must replace).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Terminal {
    Greedy,
    Dist,
    Mirostat,
}

/// A built chain plus what we need to know about its shape.
pub struct Chain {
    sampler: Sampler,
    terminal: Terminal,
    /// Set when top-k is done by preselection (and absent from `sampler`).
    fast_top_k: Option<usize>,
    config: SamplingConfig,
}

fn stage(ptr: *mut sys::llama_sampler, what: &str) -> Result<Sampler> {
    Sampler::from_raw(ptr, what)
}

fn terminal_stage(config: &SamplingConfig, n_vocab: i32, seed: u32) -> Result<Sampler> {
    unsafe {
        match &config.mirostat {
            Some(m) if m.mode == 1 => stage(
                sys::llama_sampler_init_mirostat(n_vocab, seed, m.tau, m.eta, 100),
                "mirostat",
            ),
            Some(m) => stage(
                sys::llama_sampler_init_mirostat_v2(seed, m.tau, m.eta),
                "mirostat v2",
            ),
            None if config.temperature <= 0.0 => stage(sys::llama_sampler_init_greedy(), "greedy"),
            None => stage(sys::llama_sampler_init_dist(seed), "dist"),
        }
    }
}

impl Chain {
    pub fn build(config: SamplingConfig, model: &Model, n_ctx: u32) -> Result<Chain> {
        let n_vocab = model.n_vocab;
        let mut chain = Sampler::new_chain();
        let fast_top_k = config.fast_top_k();
        unsafe {
            if let Some(p) = &config.penalties {
                let last_n = if p.last_n < 0 { n_ctx as i32 } else { p.last_n };
                chain.chain_push(stage(
                    sys::llama_sampler_init_penalties(
                        n_vocab,
                        last_n,
                        p.repeat,
                        p.frequency,
                        p.presence,
                    ),
                    "penalties",
                )?);
            }
            if let Some(d) = &config.dry {
                let breakers =
                    crate::ffi::to_cstrings(&d.sequence_breakers, "advanced.dry.sequenceBreakers")?;
                let mut ptrs: Vec<*const std::ffi::c_char> =
                    breakers.iter().map(|c| c.as_ptr()).collect();
                let last_n = if d.penalty_last_n < 0 {
                    n_ctx as i32
                } else {
                    d.penalty_last_n
                };
                chain.chain_push(stage(
                    sys::llama_sampler_init_dry(
                        model.vocab(),
                        d.multiplier,
                        d.base,
                        d.allowed_length,
                        last_n,
                        ptrs.as_mut_ptr(),
                        ptrs.len(),
                    ),
                    "dry",
                )?);
            }
            if config.mirostat.is_none() {
                if let Some(n) = config.top_n_sigma {
                    chain.chain_push(stage(
                        sys::llama_sampler_init_top_n_sigma(n),
                        "top-n-sigma",
                    )?);
                }
                if config.top_k > 0 && fast_top_k.is_none() {
                    chain.chain_push(stage(sys::llama_sampler_init_top_k(config.top_k), "top-k")?);
                }
                if config.typical_p < 1.0 {
                    chain.chain_push(stage(
                        sys::llama_sampler_init_typical(config.typical_p, 1),
                        "typical",
                    )?);
                }
                if config.top_p < 1.0 {
                    chain.chain_push(stage(
                        sys::llama_sampler_init_top_p(config.top_p, 1),
                        "top-p",
                    )?);
                }
                if config.min_p > 0.0 {
                    chain.chain_push(stage(
                        sys::llama_sampler_init_min_p(config.min_p, 1),
                        "min-p",
                    )?);
                }
                if let Some(x) = &config.xtc {
                    chain.chain_push(stage(
                        sys::llama_sampler_init_xtc(x.probability, x.threshold, 1, config.seed),
                        "xtc",
                    )?);
                }
            }
            if config.temperature > 0.0 || config.mirostat.is_some() {
                let t = if config.temperature > 0.0 {
                    config.temperature
                } else {
                    1.0
                };
                chain.chain_push(stage(sys::llama_sampler_init_temp(t), "temperature")?);
            }
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
        })
    }

    pub fn try_clone(&self) -> Result<Chain> {
        Ok(Chain {
            sampler: self.sampler.try_clone()?,
            terminal: self.terminal,
            fast_top_k: self.fast_top_k,
            config: self.config.clone(),
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
        Ok(())
    }

    pub fn accept(&mut self, token: Token) -> Result<()> {
        self.sampler.accept(token)
    }
}

/// Second preselection width for grammar-constrained sampling (see `sample`).
const PRESELECT_WIDE: usize = 32768;

/// Writes the `k` highest-logit candidates of `logits` into `out`, sorted by logit descending
/// (ties: lower token id first). One pass with a lazily tightened threshold; NaNs are skipped.
pub fn top_k_into(logits: &[f32], k: usize, out: &mut Vec<TokenData>) {
    out.clear();
    if k == 0 {
        return;
    }
    let by_rank = |a: &TokenData, b: &TokenData| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
    let spill = (2 * k).max(64);
    let mut threshold = f32::NEG_INFINITY;
    // Blocks whose maximum cannot pass the threshold are skipped after one vectorized max; once
    // the threshold has tightened (after the first few blocks) almost every block is skipped.
    const BLOCK: usize = 64;
    for (b, block) in logits.chunks(BLOCK).enumerate() {
        let block_max = block_max(block);
        if !(block_max > threshold || out.len() < k) {
            continue;
        }
        for (j, &l) in block.iter().enumerate() {
            // `>=` on the first fill keeps -inf entries out; ties at the threshold may be dropped,
            // which only affects which of several equal logits survives.
            if l > threshold || (out.len() < k && l == threshold && l.is_finite()) {
                out.push(TokenData {
                    id: (b * BLOCK + j) as Token,
                    logit: l,
                    p: 0.0,
                });
                if out.len() >= spill {
                    out.select_nth_unstable_by(k - 1, by_rank);
                    out.truncate(k);
                    threshold = out[k - 1].logit;
                }
            }
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, by_rank);
        out.truncate(k);
    }
    out.sort_unstable_by(by_rank);
}

/// Maximum of a block (NaN ignored), in independent lanes so that it vectorizes.
#[inline(always)]
fn block_max(block: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = block.chunks_exact(LANES);
    let mut max = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    for chunk in chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = if x > *m { x } else { *m };
        }
    }
    for m in lanes {
        max = if m > max { m } else { max };
    }
    max
}

/// Fills `out` with every token as a candidate (token-id order).
pub fn all_candidates(logits: &[f32], out: &mut Vec<TokenData>) {
    out.clear();
    out.extend(logits.iter().enumerate().map(|(i, &l)| TokenData {
        id: i as Token,
        logit: l,
        p: 0.0,
    }));
}

/// The outcome of sampling. The distribution it was drawn from stays in the branch's candidate
/// buffer (for the sampling perplexity of a later accept).
pub struct Sampled {
    pub token: Token,
}

/// Runs the whole pipeline on `logits` (already biased). `candidates` is the branch's scratch,
/// left holding the final candidate set.
pub fn sample(
    chain: &mut Chain,
    grammar: Option<&mut Sampler>,
    logits: &[f32],
    candidates: &mut Vec<TokenData>,
) -> Result<Option<Sampled>> {
    let mut sorted = false;
    match (chain.fast_top_k, grammar) {
        (Some(k), None) => {
            top_k_into(logits, k, candidates);
            sorted = true;
        }
        (Some(k), Some(grammar)) => {
            // Mask a preselection instead of the whole vocabulary. Stage 1: if the top 4k hold at
            // least k legal tokens, they are exactly the top k legal tokens of the vocabulary.
            // Stage 2 (a state that allows few tokens, e.g. the start of a JSON object): the legal
            // tokens among the top PRESELECT_WIDE; tokens ranked lower carry negligible probability
            // next to them. Only when no legal token ranks that high is everything masked.
            let stages = [(4 * k).max(256), PRESELECT_WIDE, logits.len()];
            for (stage, &width) in stages.iter().enumerate() {
                let width = width.min(logits.len());
                if width == logits.len() {
                    all_candidates(logits, candidates);
                    grammar.apply(candidates, false);
                } else {
                    top_k_into(logits, width, candidates);
                    grammar.apply(candidates, true);
                }
                candidates.retain(|c| c.logit.is_finite());
                let enough = if stage == 0 {
                    candidates.len() >= k
                } else {
                    !candidates.is_empty()
                };
                if enough || width == logits.len() {
                    break;
                }
            }
            candidates.sort_unstable_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
            candidates.truncate(k);
            sorted = true;
        }
        (None, grammar) => {
            all_candidates(logits, candidates);
            if let Some(grammar) = grammar {
                grammar.apply(candidates, false);
            }
        }
    }
    if !candidates.iter().any(|c| c.logit.is_finite()) {
        candidates.clear();
        return Ok(None);
    }
    let result = chain.sampler.apply(candidates, sorted);
    candidates.truncate(result.size);
    if result.selected < 0 || result.selected as usize >= candidates.len() {
        return Ok(None);
    }
    let picked = candidates[result.selected as usize];
    if !picked.logit.is_finite() {
        return Ok(None);
    }
    Ok(Some(Sampled { token: picked.id }))
}

/// True when the grammar (in its current state) allows `token`.
pub fn grammar_allows(grammar: &mut Sampler, token: Token, logit: f32) -> bool {
    let mut one = [TokenData {
        id: token,
        logit: if logit.is_finite() { logit } else { 0.0 },
        p: 0.0,
    }];
    grammar.apply(&mut one, false);
    one[0].logit.is_finite()
}

/// Adds biases to a copy of the logits (only when there are any, so the common case stays copy-free).
pub fn biased<'a>(
    logits: &'a [f32],
    biases: &[&[(Token, f32)]],
    scratch: &'a mut Vec<f32>,
) -> &'a [f32] {
    if biases.iter().all(|b| b.is_empty()) {
        return logits;
    }
    scratch.clear();
    scratch.extend_from_slice(logits);
    for list in biases {
        for &(token, bias) in *list {
            if let Some(l) = scratch.get_mut(token as usize) {
                *l += bias;
            }
        }
    }
    scratch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_matches_a_full_sort() {
        let logits: Vec<f32> = (0..5000)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.01 - 3.0)
            .collect();
        for k in [1usize, 5, 40, 100] {
            let mut out = Vec::new();
            top_k_into(&logits, k, &mut out);
            let mut all: Vec<(f32, i32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (l, i as i32))
                .collect();
            all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let expect: Vec<f32> = all.iter().take(k).map(|x| x.0).collect();
            let got: Vec<f32> = out.iter().map(|c| c.logit).collect();
            assert_eq!(got, expect, "k={k}");
        }
    }

    #[test]
    #[ignore]
    fn time_top_k() {
        let logits = crate::metrics::vocab_sized_logits();
        let mut out = Vec::new();
        let mut best = f64::MAX;
        for _ in 0..200 {
            let t = std::time::Instant::now();
            top_k_into(std::hint::black_box(&logits), 40, &mut out);
            best = best.min(t.elapsed().as_secs_f64() * 1e6);
        }
        eprintln!("top-40 of 262k: {best:.1} µs");
    }

    #[test]
    fn top_k_skips_masked_and_nan() {
        let logits = [f32::NEG_INFINITY, 1.0, f32::NAN, 3.0, f32::NEG_INFINITY];
        let mut out = Vec::new();
        top_k_into(&logits, 4, &mut out);
        assert_eq!(out.iter().map(|c| c.id).collect::<Vec<_>>(), vec![3, 1]);
    }

    #[test]
    fn validation_rejects_bad_values() {
        let n_vocab = 100;
        let bad = [
            RawSampling {
                temperature: Some(f64::NAN),
                ..Default::default()
            },
            RawSampling {
                top_k: Some(-1.0),
                ..Default::default()
            },
            RawSampling {
                top_k: Some(2.5),
                ..Default::default()
            },
            RawSampling {
                top_p: Some(0.0),
                ..Default::default()
            },
            RawSampling {
                top_p: Some(1.5),
                ..Default::default()
            },
            RawSampling {
                min_p: Some(-0.1),
                ..Default::default()
            },
            RawSampling {
                seed: Some(1.5),
                ..Default::default()
            },
            RawSampling {
                mirostat: Some((Some(3.0), None, None)),
                ..Default::default()
            },
            RawSampling {
                repeat: Some(0.0),
                ..Default::default()
            },
            RawSampling {
                logit_bias: vec![(100.0, 1.0)],
                ..Default::default()
            },
            RawSampling {
                logit_bias: vec![(1.0, f64::NAN)],
                ..Default::default()
            },
            RawSampling {
                last_n: Some(-2.0),
                ..Default::default()
            },
        ];
        for raw in bad {
            assert!(SamplingConfig::from_raw(&raw, n_vocab).is_err(), "{raw:?}");
        }
    }

    #[test]
    fn defaults_and_special_values() {
        let c = SamplingConfig::from_raw(&RawSampling::default(), 10).unwrap();
        assert_eq!(
            (c.temperature, c.top_k, c.top_p, c.min_p),
            (0.8, 40, 0.95, 0.05)
        );
        assert_eq!(c.fast_top_k(), Some(40));
        let c = SamplingConfig::from_raw(
            &RawSampling {
                last_n: Some(-1.0),
                repeat: Some(1.3),
                seed: Some(-1.0),
                ..Default::default()
            },
            10,
        )
        .unwrap();
        assert_eq!(c.penalties.as_ref().unwrap().last_n, -1);
        assert_eq!(c.seed, RANDOM_SEED);
        assert_eq!(c.fast_top_k(), None, "penalties need the whole vocabulary");
        let c = SamplingConfig::from_raw(
            &RawSampling {
                logit_bias: vec![(3.0, f64::NEG_INFINITY)],
                ..Default::default()
            },
            10,
        )
        .unwrap();
        assert_eq!(c.logit_bias, vec![(3, f32::NEG_INFINITY)]);
    }

    #[test]
    fn biases_apply_to_a_copy() {
        let logits = [0.0f32, 1.0, 2.0];
        let mut scratch = Vec::new();
        let out = biased(
            &logits,
            &[&[(0, 5.0)], &[(2, f32::NEG_INFINITY), (9, 1.0)]],
            &mut scratch,
        )
        .to_vec();
        assert_eq!(out, vec![5.0, 1.0, f32::NEG_INFINITY]);
        assert_eq!(logits, [0.0, 1.0, 2.0]);
    }
}
