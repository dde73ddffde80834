//! Conversions at the JS boundary: our errors into JS errors that carry `code`, lazily converted
//! arguments, and validation of the numbers JS passes (always f64) into ids and positions.

use napi::bindgen_prelude::*;
use napi::Env;

use crate::engine::handles::Handle;
use crate::engine::metrics::Base;
use crate::engine::sampling::config;
use crate::error::Error;
use crate::llama::{Pos, SeqId, Token};

/// A napi error status that is our stable code: napi-rs passes it to `napi_create_error` as the
/// error's `code`, so a thrown error reaches JS with `error.code` already set.
#[derive(Debug, Clone, Copy)]
pub struct Code(pub &'static str);

impl AsRef<str> for Code {
    fn as_ref(&self) -> &str {
        self.0
    }
}

/// The result type of every `#[napi]` member (the name `Result` is what napi-rs's macro looks
/// for to throw the error).
pub type Result<T> = std::result::Result<T, napi::Error<Code>>;

/// Our error as a napi error: code and message, ready to throw.
pub fn js(e: Error) -> napi::Error<Code> {
    napi::Error::new(Code(e.code()), e.to_string())
}

/// A failure of napi itself (creating a value, a promise) as an internal error.
pub fn internal(e: napi::Error) -> napi::Error<Code> {
    js(napi_failed(e))
}

/// A failure of a napi call inside our own code, as an internal error.
pub fn napi_failed(e: napi::Error) -> Error {
    Error::Internal(format!("napi call failed: {}", e.reason))
}

/// Our error as a JS `Error` value (for rejections, which settle outside a `#[napi]` return).
pub fn error_value(env: &Env, e: &Error) -> napi::Error {
    let js_error = napi::JsError::from(napi::Error::new(Code(e.code()), e.to_string()));
    // SAFETY: `env` is the live env of the JS thread this runs on.
    let raw = unsafe { js_error.into_value(env.raw()) };
    // SAFETY: `raw` was just created in this env.
    match unsafe { Unknown::from_napi_value(env.raw(), raw) } {
        Ok(value) => napi::Error::from(value),
        Err(_) => napi::Error::new(Status::GenericFailure, e.to_string()),
    }
}

/// An argument whose conversion from JS is deferred to the method body, so that a value of the
/// wrong type becomes our coded error where the method chooses — a rejection, for methods that
/// return a Promise — instead of napi-rs's early throw with its own status name.
pub struct Arg<T>(napi::Result<T>);

impl<T: FromNapiValue> FromNapiValue for Arg<T> {
    unsafe fn from_napi_value(
        env: napi::sys::napi_env,
        value: napi::sys::napi_value,
    ) -> napi::Result<Self> {
        // SAFETY: forwarded unchanged from napi-rs, which calls us with a live env and value.
        Ok(Arg(unsafe { T::from_napi_value(env, value) }))
    }
}

impl<T> Arg<T> {
    /// The converted value, or `ERR_INVALID_ARG` naming the argument and the expected type.
    pub fn get(self, name: &str, expected: &str) -> crate::error::Result<T> {
        self.0.map_err(|e| {
            Error::invalid(format!(
                "{name} must be {expected} ({}); check the argument types against index.d.ts",
                e.reason
            ))
        })
    }
}

pub fn int_in(name: &str, v: f64, min: i64, max: i64) -> crate::error::Result<i64> {
    if !v.is_finite() || v.fract() != 0.0 || v < min as f64 || v > max as f64 {
        return Err(Error::invalid(format!(
            "{name} must be an integer in [{min}, {max}], got {v}"
        )));
    }
    Ok(v as i64)
}

pub fn opt_int(
    name: &str,
    v: Option<f64>,
    default: i64,
    min: i64,
    max: i64,
) -> crate::error::Result<i64> {
    v.map_or(Ok(default), |v| int_in(name, v, min, max))
}

/// Token ids from JS numbers, each in `[0, n_vocab)`.
pub fn tokens_from(values: &[f64], n_vocab: i32) -> crate::error::Result<Vec<Token>> {
    values
        .iter()
        .map(|&t| config::token(t, n_vocab, ""))
        .collect()
}

pub fn seq_from(v: f64, n_seq_max: u32) -> crate::error::Result<SeqId> {
    Ok(int_in("seqId", v, 0, n_seq_max as i64 - 1).map_err(|_| {
        Error::invalid(format!(
            "seqId must be an integer in [0, {}] (nSeqMax = {n_seq_max}), got {v}; create the context with a larger nSeqMax for more sequences",
            n_seq_max - 1
        ))
    })? as SeqId)
}

pub fn position_from(v: f64, n_ctx: u32) -> crate::error::Result<Pos> {
    Ok(int_in("position", v, 0, n_ctx as i64)? as Pos)
}

/// `[p0, p1)` from optional JS numbers; -1 (or absent) means "from the start" / "to the end".
pub fn position_range(p0: Option<f64>, p1: Option<f64>) -> crate::error::Result<(Pos, Pos)> {
    let p0 = opt_int("p0", p0, -1, -1, i32::MAX as i64)? as Pos;
    let p1 = opt_int("p1", p1, -1, -1, i32::MAX as i64)? as Pos;
    if p0 >= 0 && p1 >= 0 && p1 <= p0 {
        return Err(Error::invalid(format!(
            "the position range [{p0}, {p1}) is empty; p1 must be greater than p0 (or -1 for the end)"
        )));
    }
    Ok((p0, p1))
}

pub fn base_from(base: Option<String>) -> crate::error::Result<Base> {
    match base {
        None => Ok(Base::Nats),
        Some(b) => Base::parse(&b).ok_or_else(|| {
            Error::invalid(format!("base must be \"nats\" or \"bits\", got \"{b}\""))
        }),
    }
}

/// Branch handles as JS sees them: the context's id in the high bits and the store's handle in
/// the low 32, so a branch of another context is recognised (`ERR_FOREIGN_BRANCH`) instead of
/// addressing whatever branch has the same slot here. Exact in an f64 for ids below 2^21.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BranchIds {
    context: u32,
}

const HANDLE_SPAN: f64 = 4_294_967_296.0;
/// Context ids cycle below this, keeping every JS handle an exact integer.
pub const MAX_CONTEXT_ID: u32 = 1 << 21;

impl BranchIds {
    pub fn new(context: u32) -> BranchIds {
        BranchIds { context }
    }

    pub fn to_js(self, h: Handle) -> f64 {
        self.context as f64 * HANDLE_SPAN + h as f64
    }

    /// 0 (JS: no branch) for `None`.
    pub fn to_js_opt(self, h: Option<Handle>) -> f64 {
        h.map_or(0.0, |h| self.to_js(h))
    }

    pub fn to_js_all(self, hs: &[Handle]) -> Vec<f64> {
        hs.iter().map(|&h| self.to_js(h)).collect()
    }

    pub fn from_js(self, v: f64) -> crate::error::Result<Handle> {
        if v == 0.0 {
            // The null handle (what `parent` reports for a root) names no live branch.
            return Err(Error::BranchDisposed);
        }
        if !v.is_finite() || v.fract() != 0.0 || v < 1.0 || v >= MAX_CONTEXT_ID as f64 * HANDLE_SPAN
        {
            return Err(Error::invalid(format!(
                "branch handle must be a handle from this library (a positive integer), got {v}"
            )));
        }
        let context = (v / HANDLE_SPAN).floor();
        if context != self.context as f64 {
            return Err(Error::ForeignBranch(format!("branch handle {v}")));
        }
        Ok((v - context * HANDLE_SPAN) as Handle)
    }

    pub fn from_js_all(self, values: &[f64]) -> crate::error::Result<Vec<Handle>> {
        values.iter().map(|&v| self.from_js(v)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_handles_round_trip_and_foreign_ones_are_recognised() {
        let ids = BranchIds::new(7);
        for h in [1u32, 0x0001_0002, u32::MAX] {
            assert_eq!(ids.from_js(ids.to_js(h)).unwrap(), h);
        }
        let other = BranchIds::new(8).to_js(5);
        assert_eq!(ids.from_js(other).unwrap_err().code(), "ERR_FOREIGN_BRANCH");
        assert_eq!(ids.from_js(0.0).unwrap_err().code(), "ERR_BRANCH_DISPOSED");
        for bad in [-1.0, 1.5, f64::NAN, f64::INFINITY] {
            assert_eq!(
                ids.from_js(bad).unwrap_err().code(),
                "ERR_INVALID_ARG",
                "{bad}"
            );
        }
        let last = BranchIds::new(MAX_CONTEXT_ID - 1);
        assert_eq!(last.from_js(last.to_js(u32::MAX)).unwrap(), u32::MAX);
    }

    #[test]
    fn ranges_and_seq_ids_are_checked() {
        assert!(position_range(Some(5.0), Some(5.0)).is_err());
        assert_eq!(position_range(None, None).unwrap(), (-1, -1));
        assert!(seq_from(4.0, 4)
            .unwrap_err()
            .to_string()
            .contains("nSeqMax = 4"));
        assert_eq!(seq_from(3.0, 4).unwrap(), 3);
    }
}
