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

/// log Σ exp(x) over finite entries, or -inf if there are none.
fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return f64::NEG_INFINITY;
    }
    let sum: f64 = logits
        .iter()
        .filter(|x| x.is_finite())
        .map(|&x| ((x - max) as f64).exp())
        .sum();
    max as f64 + sum.ln()
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

/// Shannon entropy of softmax(logits).
pub fn entropy(logits: &[f32], base: Base) -> f64 {
    let log_z = log_sum_exp(logits);
    if !log_z.is_finite() {
        return f64::INFINITY;
    }
    let mut h = 0.0f64;
    for &z in logits.iter().filter(|z| z.is_finite()) {
        let log_p = z as f64 - log_z;
        h -= log_p.exp() * log_p;
    }
    base.convert(h.max(0.0))
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
        assert!(close(entropy(&vec![1.5f32; 8], Base::Bits), 3.0));
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
}
