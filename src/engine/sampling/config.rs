//! Validated sampling parameters. Each sampler's validator lives with its struct; the napi layer
//! maps JS options onto them field by field (napi/sampling.rs). Invalid values are errors, never
//! silent clamps.

use crate::error::{Error, Result};
use crate::llama::Token;

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

impl SamplingConfig {
    /// Top-k can be done by our preselection only when nothing before it needs the whole vocabulary.
    pub fn fast_top_k(&self) -> Option<usize> {
        let eligible = self.top_k > 0
            && self.penalties.is_none()
            && self.dry.is_none()
            && self.top_n_sigma.is_none()
            && self.mirostat.is_none();
        eligible.then_some(self.top_k as usize)
    }

    /// Checks a config that was not built from options (a saved tree's) with the validators its
    /// options go through; a sampler kept on must have values that keep it on.
    pub fn check(&self, n_vocab: i32) -> Result<()> {
        let some = |v: f32| Some(v as f64);
        let on = |name: &str, kept: bool| match kept {
            true => Ok(()),
            false => Err(Error::invalid(format!(
                "{name} is on with values that turn it off"
            ))),
        };
        finite("temperature", self.temperature as f64)?;
        integer("topK", self.top_k as f64, 0)?;
        probability("topP", self.top_p as f64, false)?;
        probability("minP", self.min_p as f64, true)?;
        probability("advanced.typicalP", self.typical_p as f64, false)?;
        if let Some(p) = &self.penalties {
            let last_n = Some(p.last_n as f64);
            Penalties::from_options(some(p.repeat), some(p.frequency), some(p.presence), last_n)?;
        }
        if let Some(m) = &self.mirostat {
            let kept = Mirostat::from_options(Some(m.mode as f64), some(m.tau), some(m.eta))?;
            on("advanced.mirostat", kept.is_some())?;
        }
        if let Some(d) = &self.dry {
            let (allowed, last_n) = (d.allowed_length as f64, d.penalty_last_n as f64);
            let breakers = Some(d.sequence_breakers.clone());
            let kept = Dry::from_options(
                some(d.multiplier),
                some(d.base),
                Some(allowed),
                Some(last_n),
                breakers,
            )?;
            on("advanced.dry", kept.is_some())?;
        }
        if let Some(x) = &self.xtc {
            let kept = Xtc::from_options(some(x.probability), some(x.threshold))?;
            on("advanced.xtc", kept.is_some())?;
        }
        if let Some(n) = self.top_n_sigma {
            top_n_sigma(n as f64)?;
        }
        for &(t, b) in &self.logit_bias {
            token_bias(t as f64, b as f64, n_vocab, "logitBias")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Validators: one per JS field, named after it (`name` is the field's path in messages).

pub fn finite(name: &str, v: f64) -> Result<f32> {
    if !v.is_finite() {
        return Err(Error::invalid(format!(
            "{name} must be a finite number, got {v}"
        )));
    }
    Ok(v as f32)
}

pub fn integer(name: &str, v: f64, min: i64) -> Result<i32> {
    if !v.is_finite() || v.fract() != 0.0 || v < min as f64 || v > i32::MAX as f64 {
        return Err(Error::invalid(format!(
            "{name} must be an integer >= {min}, got {v}"
        )));
    }
    Ok(v as i32)
}

/// A probability in (0, 1], or [0, 1] with `allow_zero`.
pub fn probability(name: &str, v: f64, allow_zero: bool) -> Result<f32> {
    let ok = v.is_finite() && v <= 1.0 && if allow_zero { v >= 0.0 } else { v > 0.0 };
    if !ok {
        let range = if allow_zero { "[0, 1]" } else { "(0, 1]" };
        return Err(Error::invalid(format!(
            "{name} must be in {range}, got {v}"
        )));
    }
    Ok(v as f32)
}

/// A window length: an integer >= 0, or -1 for "the whole context".
fn window(name: &str, v: f64) -> Result<i32> {
    if v == -1.0 {
        Ok(-1)
    } else {
        integer(name, v, 0)
    }
}

/// `seed`: an integer in [0, 2^32), or -1 for a random one.
pub fn seed(v: f64) -> Result<u32> {
    if !v.is_finite() || v.fract() != 0.0 || !(-1.0..=u32::MAX as f64).contains(&v) {
        return Err(Error::invalid(format!(
            "seed must be an integer in [0, 2^32) (or -1 for random), got {v}"
        )));
    }
    Ok(if v < 0.0 { RANDOM_SEED } else { v as u32 })
}

/// A token id from JS: an integer in `[0, n_vocab)`. With a `what` label (logitBias, steer) the
/// error is an argument error naming the field; without, `ERR_TOKEN_OUT_OF_RANGE`.
pub fn token(v: f64, n_vocab: i32, what: &str) -> Result<Token> {
    if v.is_finite() && v.fract() == 0.0 && v >= 0.0 && v < n_vocab as f64 {
        return Ok(v as Token);
    }
    // A fraction or NaN is reported as itself, not as the truncated id it would become.
    let err = if v.is_finite() && v.fract() == 0.0 {
        Error::TokenOutOfRange {
            token: v as i64,
            n_vocab,
        }
    } else {
        Error::TokenNotInteger(v, n_vocab)
    };
    Err(if what.is_empty() {
        err
    } else {
        Error::invalid(format!("{what}: {err}"))
    })
}

/// A logit bias: a number or -Infinity (a ban); NaN and +Infinity are refused.
pub fn bias(name: &str, v: f64) -> Result<f32> {
    if v.is_nan() || v == f64::INFINITY {
        return Err(Error::invalid(format!(
            "{name} must be a finite number or -Infinity, got {v}"
        )));
    }
    Ok(v as f32)
}

/// A (token, bias) pair of `what` (logitBias, steer): its token and its bias validated.
pub fn token_bias(
    token_id: f64,
    bias_value: f64,
    n_vocab: i32,
    what: &str,
) -> Result<(Token, f32)> {
    Ok((
        token(token_id, n_vocab, &format!("{what} token"))?,
        bias(&format!("{what} bias"), bias_value)?,
    ))
}

impl Penalties {
    pub fn from_options(
        repeat: Option<f64>,
        frequency: Option<f64>,
        presence: Option<f64>,
        last_n: Option<f64>,
    ) -> Result<Penalties> {
        let repeat = repeat
            .map(|v| finite("penalties.repeat", v))
            .transpose()?
            .unwrap_or(1.0);
        if repeat <= 0.0 {
            return Err(Error::invalid(format!(
                "penalties.repeat must be > 0 (1 = off), got {repeat}"
            )));
        }
        Ok(Penalties {
            repeat,
            frequency: frequency
                .map(|v| finite("penalties.frequency", v))
                .transpose()?
                .unwrap_or(0.0),
            presence: presence
                .map(|v| finite("penalties.presence", v))
                .transpose()?
                .unwrap_or(0.0),
            last_n: last_n
                .map(|v| window("penalties.lastN", v))
                .transpose()?
                .unwrap_or(64),
        })
    }
}

impl Mirostat {
    /// `None` for mode 0 (off).
    pub fn from_options(
        mode: Option<f64>,
        tau: Option<f64>,
        eta: Option<f64>,
    ) -> Result<Option<Mirostat>> {
        let mode = match mode {
            None | Some(2.0) => 2u8,
            Some(1.0) => 1,
            Some(0.0) => return Ok(None),
            Some(m) => {
                return Err(Error::invalid(format!(
                    "advanced.mirostat.mode must be 0 (off), 1 or 2, got {m}"
                )))
            }
        };
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
        Ok(Some(Mirostat { mode, tau, eta }))
    }
}

impl Dry {
    /// `None` when the multiplier is 0 (off).
    pub fn from_options(
        multiplier: Option<f64>,
        base: Option<f64>,
        allowed_length: Option<f64>,
        penalty_last_n: Option<f64>,
        sequence_breakers: Option<Vec<String>>,
    ) -> Result<Option<Dry>> {
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
        let allowed_length = allowed_length
            .map(|v| integer("advanced.dry.allowedLength", v, 0))
            .transpose()?
            .unwrap_or(2);
        let penalty_last_n = penalty_last_n
            .map(|v| window("advanced.dry.penaltyLastN", v))
            .transpose()?
            .unwrap_or(-1);
        let sequence_breakers = sequence_breakers.unwrap_or_else(|| {
            ["\n", ":", "\"", "*"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        });
        Ok((multiplier > 0.0).then_some(Dry {
            multiplier,
            base,
            allowed_length,
            penalty_last_n,
            sequence_breakers,
        }))
    }
}

impl Xtc {
    /// `None` when the probability is 0 (off).
    pub fn from_options(p: Option<f64>, threshold: Option<f64>) -> Result<Option<Xtc>> {
        let threshold = probability("advanced.xtc.threshold", threshold.unwrap_or(0.1), true)?;
        let probability = probability("advanced.xtc.probability", p.unwrap_or(0.5), true)?;
        Ok((probability > 0.0).then_some(Xtc {
            probability,
            threshold,
        }))
    }
}

/// `advanced.topNSigma`: > 0.
pub fn top_n_sigma(v: f64) -> Result<f32> {
    let n = finite("advanced.topNSigma", v)?;
    if n <= 0.0 {
        return Err(Error::invalid(format!(
            "advanced.topNSigma must be > 0, got {n}"
        )));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validators_reject_bad_values() {
        assert!(finite("temperature", f64::NAN).is_err());
        assert!(integer("topK", -1.0, 0).is_err());
        assert!(integer("topK", 2.5, 0).is_err());
        assert!(probability("topP", 0.0, false).is_err());
        assert!(probability("topP", 1.5, false).is_err());
        assert!(probability("minP", -0.1, true).is_err());
        assert!(seed(1.5).is_err());
        assert!(Mirostat::from_options(Some(3.0), None, None).is_err());
        assert!(Penalties::from_options(Some(0.0), None, None, None).is_err());
        assert!(Penalties::from_options(None, None, None, Some(-2.0)).is_err());
        assert!(token(100.0, 100, "logitBias token").is_err());
        assert!(bias("logitBias bias", f64::NAN).is_err());
        assert!(Dry::from_options(Some(-1.0), None, None, None, None).is_err());
        assert!(Xtc::from_options(Some(2.0), None).is_err());
        assert!(top_n_sigma(0.0).is_err());
    }

    #[test]
    fn defaults_and_special_values() {
        let c = SamplingConfig::default();
        assert_eq!(
            (c.temperature, c.top_k, c.top_p, c.min_p),
            (0.8, 40, 0.95, 0.05)
        );
        assert_eq!(c.fast_top_k(), Some(40));
        let p = Penalties::from_options(Some(1.3), None, None, Some(-1.0)).unwrap();
        assert_eq!(p.last_n, -1);
        assert_eq!(seed(-1.0).unwrap(), RANDOM_SEED);
        let c = SamplingConfig {
            penalties: Some(p),
            ..SamplingConfig::default()
        };
        assert_eq!(c.fast_top_k(), None, "penalties need the whole vocabulary");
        assert_eq!(bias("b", f64::NEG_INFINITY).unwrap(), f32::NEG_INFINITY);
        assert_eq!(Mirostat::from_options(Some(0.0), None, None).unwrap(), None);
        assert_eq!(Xtc::from_options(Some(0.0), None).unwrap(), None);
    }

    #[test]
    fn a_config_not_built_from_options_is_checked_by_their_validators() {
        let dry = Dry::from_options(None, None, None, None, None).unwrap();
        let ok = SamplingConfig {
            dry,
            logit_bias: vec![(9, f32::NEG_INFINITY)],
            ..SamplingConfig::default()
        };
        assert!(ok.check(10).is_ok());
        type Spoil = fn(&mut SamplingConfig);
        let cases: [(Spoil, &str); 5] = [
            (|c| c.temperature = f32::NAN, "temperature"),
            (|c| c.min_p = -0.5, "minP"),
            (|c| c.logit_bias[0].0 = 10, "logitBias token"),
            (|c| c.top_n_sigma = Some(0.0), "advanced.topNSigma"),
            (
                |c| c.dry.as_mut().unwrap().multiplier = 0.0,
                "advanced.dry is on with values that turn it off",
            ),
        ];
        for (spoil, why) in cases {
            let mut c = ok.clone();
            spoil(&mut c);
            let e = c.check(10).unwrap_err();
            assert_eq!(e.code(), "ERR_INVALID_ARG");
            assert!(e.to_string().contains(why), "{e} should say {why}");
        }
        let pair = token_bias(3.0, -1.5, 10, "steer").unwrap();
        assert_eq!(pair, (3, -1.5));
        let e = token_bias(3.0, f64::INFINITY, 10, "steer").unwrap_err();
        assert!(e.to_string().starts_with("steer bias must be"), "{e}");
    }

    #[test]
    fn token_errors_name_the_problem() {
        assert_eq!(token(5.0, 10, "").unwrap(), 5);
        assert_eq!(
            token(10.0, 10, "").unwrap_err().code(),
            "ERR_TOKEN_OUT_OF_RANGE"
        );
        assert_eq!(
            token(1.5, 10, "").unwrap_err().code(),
            "ERR_TOKEN_OUT_OF_RANGE"
        );
        let labelled = token(-1.0, 10, "steer token").unwrap_err();
        assert_eq!(labelled.code(), "ERR_INVALID_ARG");
        assert!(labelled.to_string().starts_with("steer token: "));
    }
}
