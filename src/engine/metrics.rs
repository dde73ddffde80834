//! Information measures over logits, in nats (bits = nats / ln 2). Non-finite logits are ignored
//! (a grammar mask sets them to -inf); results are clamped at 0 and `INFINITY` means "undefined".

pub const LN2: f64 = std::f64::consts::LN_2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    Nats,
    Bits,
}

impl Base {
    pub fn parse(s: &str) -> Option<Base> {
        match s {
            "nats" => Some(Base::Nats),
            "bits" => Some(Base::Bits),
            _ => None,
        }
    }

    fn convert(self, nats: f64) -> f64 {
        match self {
            Base::Nats => nats,
            Base::Bits => nats / LN2,
        }
    }
}

/// Width of the independent accumulators below: wide enough for LLVM to keep a full AVX-512
/// register (or two AVX2 ones) busy without a loop-carried dependency.
const LANES: usize = 16;

/// Largest finite entry (NaN and ±inf skipped), or -inf if there is none. Branch-free per lane,
/// so it vectorizes; the scan of a 262k-entry logits row is memory-bound.
pub fn finite_max(logits: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a = if x.is_finite() && x > *a { x } else { *a };
        }
    }
    let mut max = acc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for &x in tail {
        if x.is_finite() && x > max {
            max = x;
        }
    }
    max
}

/// a·b + c, fused where the target has FMA (elsewhere `mul_add` would be a libm call).
#[inline(always)]
fn mul_add(a: f32, b: f32, c: f32) -> f32 {
    if cfg!(any(target_feature = "fma", target_arch = "aarch64")) {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// e^x for x <= 0 (single precision, relative error ~2e-7); 0 below the f32 range. Written
/// without branches or calls so that the loops using it vectorize (libm's `exp` does not).
#[inline(always)]
fn exp_non_positive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let clamped = x.max(-87.0);
    let shifted = mul_add(clamped, LOG2E, ROUND);
    let n = shifted - ROUND;
    let r = mul_add(-n, LN2_LO, mul_add(-n, LN2_HI, clamped));
    // Minimax polynomial for e^r on [-ln2/2, ln2/2] (Cephes expf coefficients).
    let mut p = 1.987_569_1e-4f32;
    p = mul_add(p, r, 1.398_199_9e-3);
    p = mul_add(p, r, 8.333_452e-3);
    p = mul_add(p, r, 4.166_579_6e-2);
    p = mul_add(p, r, 1.666_666_5e-1);
    p = mul_add(p, r, 0.5);
    let e_r = mul_add(p, r * r, r + 1.0);
    // 2^n from the integer sitting in the low bits of `shifted` (n in [-126, 0]).
    let n_bits = shifted
        .to_bits()
        .wrapping_sub(ROUND.to_bits())
        .wrapping_add(127);
    let pow2 = f32::from_bits(n_bits << 23);
    if x < -87.0 {
        0.0
    } else {
        e_r * pow2
    }
}

/// Σ e^(x - max) and (with `WEIGHTED`) Σ e^(x - max)·(x - max) over finite entries, for
/// `max = finite_max(logits)`. Lanes accumulate in f32 over short blocks and blocks in f64, so
/// the result keeps ~1e-7 relative accuracy over a 262k-entry row.
fn exp_sums<const WEIGHTED: bool>(logits: &[f32], max: f32) -> (f64, f64) {
    const BLOCK: usize = LANES * 32;
    // Non-finite entries become a difference whose exponential is exactly 0.
    let diff = |x: f32| if x.is_finite() { x - max } else { -100.0 };
    let (mut sum, mut weighted) = (0.0f64, 0.0f64);
    let blocks = logits.chunks_exact(BLOCK);
    let tail = blocks.remainder();
    for block in blocks {
        let mut s = [0.0f32; LANES];
        let mut w = [0.0f32; LANES];
        for chunk in block.chunks_exact(LANES) {
            for i in 0..LANES {
                let d = diff(chunk[i]);
                let e = exp_non_positive(d);
                s[i] += e;
                if WEIGHTED {
                    w[i] += e * d;
                }
            }
        }
        sum += s.iter().map(|&v| v as f64).sum::<f64>();
        weighted += w.iter().map(|&v| v as f64).sum::<f64>();
    }
    for &x in tail {
        let d = diff(x);
        let e = exp_non_positive(d);
        sum += e as f64;
        weighted += (e * d) as f64;
    }
    (sum, weighted)
}

/// log Σ exp(x) over finite entries, or -inf if there are none.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = finite_max(logits);
    if !max.is_finite() {
        return f64::NEG_INFINITY;
    }
    let (sum, _) = exp_sums::<false>(logits, max);
    max as f64 + sum.ln()
}

/// Copies `row` into `dst` (replacing its contents) and returns `log_sum_exp(row)`, reading
/// `row` from memory once: block by block, the copy, the block's maximum and its exponential
/// sum run over data still in cache, the sum rescaled when the running maximum grows. A batched
/// step copies one vocabulary-sized row per branch; a separate normalizer pass over the stored
/// row would read it twice more.
pub fn copy_log_sum_exp(row: &[f32], dst: &mut Vec<f32>) -> f64 {
    const BLOCK: usize = 4096;
    dst.clear();
    dst.reserve(row.len());
    let mut max = f32::NEG_INFINITY;
    let mut sum = 0.0f64;
    for block in row.chunks(BLOCK) {
        dst.extend_from_slice(block);
        let block_max = finite_max(block);
        if !block_max.is_finite() {
            continue;
        }
        if block_max > max {
            if max.is_finite() {
                sum *= ((max - block_max) as f64).exp();
            }
            max = block_max;
        }
        sum += exp_sums::<false>(block, max).0;
    }
    if max.is_finite() {
        max as f64 + sum.ln()
    } else {
        f64::NEG_INFINITY
    }
}

/// -log p(token) under softmax(logits).
pub fn surprisal(logits: &[f32], token: usize, base: Base) -> f64 {
    let Some(&picked) = logits.get(token) else {
        return f64::INFINITY;
    };
    if !picked.is_finite() {
        return f64::INFINITY;
    }
    let log_z = log_sum_exp(logits);
    base.convert((log_z - picked as f64).max(0.0))
}

/// Shannon entropy of softmax(logits): with d = x - max and S = Σ e^d,
/// H = -Σ (e^d / S)(d - ln S) = ln S - Σ e^d·d / S (one pass over the row).
pub fn entropy(logits: &[f32], base: Base) -> f64 {
    let max = finite_max(logits);
    if !max.is_finite() {
        return f64::INFINITY;
    }
    let (sum, weighted) = exp_sums::<true>(logits, max);
    base.convert((sum.ln() - weighted / sum).max(0.0))
}

/// The natural-log probability of `token` under softmax(logits) and the `top` most likely
/// tokens with theirs, most likely first (ties: the lower id first). One pass for the
/// normaliser, one partial selection for the top: no sort of the whole vocabulary.
pub fn token_logprobs(logits: &[f32], token: usize, top: usize) -> (f64, Vec<(usize, f64)>) {
    token_logprobs_given(logits, log_sum_exp(logits), token, top)
}

/// `token_logprobs` with the log-normalizer `log_z` (= `log_sum_exp(logits)`) already known.
pub fn token_logprobs_given(
    logits: &[f32],
    log_z: f64,
    token: usize,
    top: usize,
) -> (f64, Vec<(usize, f64)>) {
    let of = |i: usize| match logits.get(i) {
        Some(&x) if x.is_finite() => x as f64 - log_z,
        _ => f64::NEG_INFINITY,
    };
    let top = top.min(logits.len());
    let key = |i: usize| {
        if logits[i].is_nan() {
            f32::NEG_INFINITY
        } else {
            logits[i]
        }
    };
    // Descending logit, NaN last, then ascending id: a total order, so the result is stable.
    let before = |a: usize, b: usize| key(b).total_cmp(&key(a)).then(a.cmp(&b)).is_lt();
    // One pass keeping the best `top` in order: with a vocabulary of 262k and top ≤ 20 almost
    // every token fails the first comparison, and nothing vocabulary-sized is allocated (this
    // runs for every generated token of a request with logprobs).
    let mut best: Vec<usize> = Vec::with_capacity(top + 1);
    if top > 0 {
        for i in 0..logits.len() {
            if best.len() == top && !before(i, best[top - 1]) {
                continue;
            }
            let at = best.partition_point(|&b| before(b, i));
            best.insert(at, i);
            best.truncate(top);
        }
    }
    (of(token), best.into_iter().map(|i| (i, of(i))).collect())
}

/// Running perplexity: exp(mean surprisal) of the accepted tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Perplexity {
    nll_sum: f64,
    count: u32,
}

impl Perplexity {
    /// Non-finite surprisals (token outside the candidate set) are not counted.
    pub fn add(&mut self, surprisal_nats: f64) {
        if surprisal_nats.is_finite() {
            self.nll_sum += surprisal_nats.max(0.0);
            self.count += 1;
        }
    }

    pub fn value(&self) -> f64 {
        if self.count == 0 {
            f64::INFINITY
        } else {
            (self.nll_sum / self.count as f64).exp()
        }
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn reset(&mut self) {
        *self = Perplexity::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-5
    }

    #[test]
    fn uniform_distribution() {
        let logits = vec![0.0f32; 100];
        assert!(close(surprisal(&logits, 3, Base::Nats), (100f64).ln()));
        assert!(close(entropy(&logits, Base::Nats), (100f64).ln()));
        assert!(close(entropy(&[1.5f32; 8], Base::Bits), 3.0));
    }

    #[test]
    fn peaked_and_degenerate_cases() {
        let mut logits = vec![-50.0f32; 10];
        logits[4] = 50.0;
        assert!(surprisal(&logits, 4, Base::Nats) < 1e-6);
        assert!(surprisal(&logits, 5, Base::Nats) > 15.0);
        assert!(entropy(&logits, Base::Nats) < 1e-6);
        assert_eq!(surprisal(&logits, 10, Base::Nats), f64::INFINITY);
        assert_eq!(surprisal(&[], 0, Base::Nats), f64::INFINITY);
        assert_eq!(entropy(&[], Base::Nats), f64::INFINITY);
        assert_eq!(entropy(&[f32::NEG_INFINITY; 3], Base::Nats), f64::INFINITY);
    }

    #[test]
    fn masked_tokens_are_ignored() {
        let logits = [0.0f32, f32::NEG_INFINITY, 0.0, f32::NAN];
        assert!(close(entropy(&logits, Base::Nats), 2f64.ln()));
        // Past the vectorized blocks too, with +inf among them.
        let mut long = vec![f32::NEG_INFINITY; 1000];
        long[3] = 1.0;
        long[700] = 1.0;
        long[5] = f32::INFINITY;
        long[999] = f32::NAN;
        assert!(close(entropy(&long, Base::Bits), 1.0));
        assert!(close(surprisal(&long, 700, Base::Bits), 1.0));
        assert_eq!(surprisal(&logits, 1, Base::Nats), f64::INFINITY);
        assert!(close(surprisal(&logits, 0, Base::Bits), 1.0));
        assert_eq!(entropy(&[3.0f32], Base::Nats), 0.0);
    }

    #[test]
    fn large_logits_stay_finite() {
        let logits = [500.0f32, -500.0, 250.0];
        assert!(surprisal(&logits, 1, Base::Nats).is_finite());
        assert!(entropy(&logits, Base::Nats) >= 0.0);
    }

    #[test]
    fn fast_exp_is_accurate() {
        for i in 0..=20000 {
            let x = -(i as f32) * 0.0045;
            let got = exp_non_positive(x) as f64;
            let want = (x as f64).exp();
            assert!(
                (got - want).abs() <= want * 4e-7 + 1e-37,
                "x={x}: {got} vs {want}"
            );
        }
        assert_eq!(exp_non_positive(-200.0), 0.0);
        assert_eq!(exp_non_positive(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn fast_sums_match_f64_reference_on_a_vocab_sized_row() {
        let logits = vocab_sized_logits();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
        let log_z = max + sum.ln();
        assert!((log_sum_exp(&logits) - log_z).abs() < 1e-5);
        let h: f64 = -logits
            .iter()
            .map(|&x| {
                let lp = x as f64 - log_z;
                lp.exp() * lp
            })
            .sum::<f64>();
        assert!((entropy(&logits, Base::Nats) - h).abs() < 1e-5);
        assert!((surprisal(&logits, 7, Base::Nats) - (log_z - logits[7] as f64)).abs() < 1e-5);
        let mut copy = vec![9.0; 3];
        let fused = copy_log_sum_exp(&logits, &mut copy);
        assert_eq!(copy, logits);
        assert!((fused - log_sum_exp(&logits)).abs() < 1e-6 * fused.abs().max(1.0));
    }

    #[test]
    fn perplexity_accumulates() {
        let mut p = Perplexity::default();
        assert_eq!(p.value(), f64::INFINITY);
        p.add(f64::INFINITY);
        assert_eq!(p.count(), 0);
        p.add(2f64.ln());
        p.add(-1.0);
        assert_eq!(p.count(), 2);
        assert!(close(p.value(), 2f64.sqrt()));
        p.reset();
        assert_eq!(p.count(), 0);
    }

    /// A reproducible 262,144-entry logits row with a realistic spread, for tests.
    fn vocab_sized_logits() -> Vec<f32> {
        (0..262_144u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) % 4000) as f32 * 0.01 - 25.0)
            .collect()
    }

    #[test]
    fn token_logprobs_normalise_and_rank() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, f32::NEG_INFINITY];
        let (lp, top) = token_logprobs(&logits, 2, 3);
        let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
        assert!(close(lp, 2.0 - z.ln()));
        // Ties (ids 1 and 3) in id order, then id 2.
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        assert!(close(top[0].1, 3.0 - z.ln()));
        let total: f64 = (0..5).map(|i| token_logprobs(&logits, i, 0).0.exp()).sum();
        assert!(close(total, 1.0));
        assert_eq!(token_logprobs(&logits, 4, 0).0, f64::NEG_INFINITY);
        assert_eq!(token_logprobs(&logits, 99, 0).0, f64::NEG_INFINITY);
        assert_eq!(
            token_logprobs(&logits, 0, 50).1.len(),
            5,
            "top is capped at the vocabulary"
        );
        assert!(token_logprobs(&logits, 0, 0).1.is_empty());
    }

    #[test]
    fn token_logprobs_top_matches_a_full_sort() {
        // Pseudo-random logits with many ties and a NaN, against sorting every id.
        let logits: Vec<f32> = (0..2000u32)
            .map(|i| match i {
                777 => f32::NAN,
                _ => ((i.wrapping_mul(2_654_435_761) >> 20) % 97) as f32 / 7.0,
            })
            .collect();
        let key = |i: usize| {
            if logits[i].is_nan() {
                f32::NEG_INFINITY
            } else {
                logits[i]
            }
        };
        let mut all: Vec<usize> = (0..logits.len()).collect();
        all.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
        for top in [1, 5, 20] {
            let got: Vec<usize> = token_logprobs(&logits, 0, top)
                .1
                .into_iter()
                .map(|t| t.0)
                .collect();
            assert_eq!(got, all[..top]);
        }
    }
}

#[cfg(test)]
mod fused_timing {
    use super::*;

    /// `cargo test --release --lib fused_copy_timing -- --ignored --nocapture`: one vocabulary
    /// row copied with its normalizer fused, against the copy plus the two passes it replaces.
    #[test]
    #[ignore]
    fn fused_copy_timing() {
        let rows: Vec<Vec<f32>> = (0..64)
            .map(|r| (0..262_144).map(|i| ((i * 7919 + r * 31) % 1000) as f32 / 97.0).collect())
            .collect();
        let mut dst = Vec::new();
        let t = std::time::Instant::now();
        let mut acc = 0.0;
        for _ in 0..5 {
            for row in &rows {
                dst.clear();
                dst.extend_from_slice(row);
                acc += log_sum_exp(&dst);
            }
        }
        let separate = t.elapsed();
        let t = std::time::Instant::now();
        for _ in 0..5 {
            for row in &rows {
                acc += copy_log_sum_exp(row, &mut dst);
            }
        }
        let fused = t.elapsed();
        println!(
            "per row: copy + log_sum_exp {:.1} us, fused {:.1} us ({acc:.0})",
            separate.as_secs_f64() * 1e6 / 320.0,
            fused.as_secs_f64() * 1e6 / 320.0
        );
    }
}
