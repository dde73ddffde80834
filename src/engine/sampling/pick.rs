//! Picking a token from a logits row: the per-branch pipeline
//!   snapshot logits → static logit bias + steer biases → grammar mask → the chain (`Chain`)
//! with its fast path: when the chain starts with a plain top-k (no penalties, DRY, top-n-sigma or
//! mirostat, which need the whole vocabulary), the top-k is done here in one O(n_vocab) scan and
//! the rest of the chain runs on k candidates instead of 262k. With a grammar, the grammar is
//! applied to a wider preselection first and we fall back to the whole vocabulary only if fewer
//! than k legal tokens are found there, so the result is the same as masking everything.

use super::chain::Chain;
use crate::llama::{Sampler, Token, TokenData};

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

/// Runs the whole pipeline on `logits` (already biased). `candidates` is the branch's scratch,
/// left holding the final candidate set (for the sampling perplexity of a later accept).
/// `None` when every candidate is masked.
pub fn sample(
    chain: &mut Chain,
    grammar: Option<&mut Sampler>,
    logits: &[f32],
    candidates: &mut Vec<TokenData>,
) -> Option<Token> {
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
        return None;
    }
    chain.draws += 1;
    let result = chain.sampler.apply(candidates, sorted);
    candidates.truncate(result.size);
    let picked = usize::try_from(result.selected)
        .ok()
        .and_then(|i| candidates.get(i))?;
    picked.logit.is_finite().then_some(picked.id)
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
    fn top_k_skips_masked_and_nan() {
        let logits = [f32::NEG_INFINITY, 1.0, f32::NAN, 3.0, f32::NEG_INFINITY];
        let mut out = Vec::new();
        top_k_into(&logits, 4, &mut out);
        assert_eq!(out.iter().map(|c| c.id).collect::<Vec<_>>(), vec![3, 1]);
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
