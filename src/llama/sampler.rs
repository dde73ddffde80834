//! `Sampler`: an owned `llama_sampler` (a chain, a grammar, or one stage), the constructors of
//! every stage we use, grammar samplers and JSON-schema conversion. Which stages a chain gets,
//! and in what order, is decided by `engine::sampling`.

use std::ffi::{c_char, CStr, CString};
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use super::{Model, Token};
use crate::error::{Error, Result};

pub struct Sampler {
    ptr: NonNull<sys::llama_sampler>,
}

// SAFETY: a sampler is plain heap state with no thread affinity; each one is owned by exactly
// one branch, handle or chain and used by one thread at a time (`&mut self` for every mutation).
unsafe impl Send for Sampler {}

pub type TokenData = sys::llama_token_data;

/// What a sampler left in the candidate array: the first `size` entries are live.
#[derive(Debug, Clone, Copy)]
pub struct Candidates {
    pub size: usize,
    pub selected: i64,
    pub sorted: bool,
}

fn owned(ptr: *mut sys::llama_sampler, what: &str) -> Result<Sampler> {
    NonNull::new(ptr)
        .map(|ptr| Sampler { ptr })
        .ok_or_else(|| Error::Internal(format!("llama.cpp failed to create the {what} sampler")))
}

fn c_strings(items: &[String], what: &str) -> Result<Vec<CString>> {
    items
        .iter()
        .map(|s| {
            CString::new(s.as_str())
                .map_err(|_| Error::invalid(format!("{what} must not contain NUL bytes")))
        })
        .collect()
}

// Stage constructors. Each returns a new, owned sampler; llama.cpp copies every argument
// (including strings) during construction, so nothing borrowed outlives the call.
impl Sampler {
    pub fn chain() -> Result<Sampler> {
        // SAFETY: returns a plain struct of defaults.
        let mut params = unsafe { sys::llama_sampler_chain_default_params() };
        params.no_perf = true;
        // SAFETY: see the note on the constructors.
        owned(unsafe { sys::llama_sampler_chain_init(params) }, "chain")
    }

    pub fn greedy() -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        owned(unsafe { sys::llama_sampler_init_greedy() }, "greedy")
    }

    pub fn dist(seed: u32) -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        owned(unsafe { sys::llama_sampler_init_dist(seed) }, "dist")
    }

    pub fn temperature(t: f32) -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        owned(unsafe { sys::llama_sampler_init_temp(t) }, "temperature")
    }

    pub fn top_k(k: i32) -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        owned(unsafe { sys::llama_sampler_init_top_k(k) }, "top-k")
    }

    pub fn top_p(p: f32) -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        owned(unsafe { sys::llama_sampler_init_top_p(p, 1) }, "top-p")
    }

    pub fn min_p(p: f32) -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        owned(unsafe { sys::llama_sampler_init_min_p(p, 1) }, "min-p")
    }

    pub fn typical(p: f32) -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        owned(unsafe { sys::llama_sampler_init_typical(p, 1) }, "typical")
    }

    pub fn top_n_sigma(n: f32) -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        owned(
            unsafe { sys::llama_sampler_init_top_n_sigma(n) },
            "top-n-sigma",
        )
    }

    pub fn xtc(probability: f32, threshold: f32, seed: u32) -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        let p = unsafe { sys::llama_sampler_init_xtc(probability, threshold, 1, seed) };
        owned(p, "xtc")
    }

    pub fn penalties(
        n_vocab: i32,
        last_n: i32,
        repeat: f32,
        frequency: f32,
        presence: f32,
    ) -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        let p = unsafe {
            sys::llama_sampler_init_penalties(n_vocab, last_n, repeat, frequency, presence)
        };
        owned(p, "penalties")
    }

    pub fn mirostat(n_vocab: i32, seed: u32, tau: f32, eta: f32) -> Result<Sampler> {
        // SAFETY: see the note on the constructors (m = 100, llama.cpp's documented default).
        let p = unsafe { sys::llama_sampler_init_mirostat(n_vocab, seed, tau, eta, 100) };
        owned(p, "mirostat")
    }

    pub fn mirostat_v2(seed: u32, tau: f32, eta: f32) -> Result<Sampler> {
        // SAFETY: see the note on the constructors.
        owned(
            unsafe { sys::llama_sampler_init_mirostat_v2(seed, tau, eta) },
            "mirostat v2",
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn dry(
        model: &Model,
        multiplier: f32,
        base: f32,
        allowed_length: i32,
        last_n: i32,
        sequence_breakers: &[String],
    ) -> Result<Sampler> {
        let breakers = c_strings(sequence_breakers, "advanced.dry.sequenceBreakers")?;
        let mut ptrs: Vec<*const c_char> = breakers.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: the breaker strings live until after the call, which copies them; the
        // vocabulary is the model's (we borrow the model for the call).
        let p = unsafe {
            sys::llama_sampler_init_dry(
                model.vocab(),
                multiplier,
                base,
                allowed_length,
                last_n,
                ptrs.as_mut_ptr(),
                ptrs.len(),
            )
        };
        owned(p, "dry")
    }

    /// A GBNF grammar sampler (root rule `root`); lazy when `triggers` are given: unconstrained
    /// until a trigger pattern (regex over generated text) or trigger token appears.
    /// Parsing errors (including C++ exceptions from trigger regexes) become `ERR_GRAMMAR`.
    pub fn grammar(
        model: &Model,
        gbnf: &str,
        triggers: Option<(&[String], &[Token])>,
    ) -> Result<Sampler> {
        let c_gbnf = CString::new(gbnf)
            .map_err(|_| Error::Grammar("grammar must not contain NUL bytes".into()))?;
        let root = c"root";
        let ptr = match triggers {
            // SAFETY: both strings are NUL-terminated and outlive the call; the `llama_rs_`
            // wrapper catches C++ exceptions and returns null for a grammar that fails to parse.
            None => unsafe {
                sys::llama_rs_sampler_init_grammar(model.vocab(), c_gbnf.as_ptr(), root.as_ptr())
            },
            Some((patterns, tokens)) => {
                let c_patterns = c_strings(patterns, "trigger patterns")?;
                let mut pattern_ptrs: Vec<*const c_char> =
                    c_patterns.iter().map(|c| c.as_ptr()).collect();
                // SAFETY: as above; the pattern strings and token slice outlive the call.
                unsafe {
                    sys::llama_rs_sampler_init_grammar_lazy_patterns(
                        model.vocab(),
                        c_gbnf.as_ptr(),
                        root.as_ptr(),
                        pattern_ptrs.as_mut_ptr(),
                        pattern_ptrs.len(),
                        tokens.as_ptr(),
                        tokens.len(),
                    )
                }
            }
        };
        NonNull::new(ptr)
            .map(|ptr| Sampler { ptr })
            .ok_or_else(|| Error::Grammar("the GBNF grammar (or a lazy trigger pattern) failed to parse; enable logging with LLAMA_BRANCH_LOG=error for the parser's message".into()))
    }

    /// Appends a stage to this chain; the chain takes ownership of it.
    pub fn chain_push(&mut self, stage: Sampler) {
        let raw = stage.ptr.as_ptr();
        std::mem::forget(stage);
        // SAFETY: `self` is a chain (built by `Sampler::chain`), and ownership of `raw` moves
        // into it (the `forget` above stops our Drop from freeing it).
        unsafe { sys::llama_sampler_chain_add(self.ptr.as_ptr(), raw) }
    }

    /// Replaces the last stage of this chain with `stage` (used to reseed the terminal sampler).
    pub fn chain_replace_last(&mut self, stage: Sampler) {
        // SAFETY: `self` is a chain; `llama_sampler_chain_remove` hands ownership of the removed
        // stage back to us, and we free it once.
        unsafe {
            let n = sys::llama_sampler_chain_n(self.ptr.as_ptr());
            if n > 0 {
                let removed = sys::llama_sampler_chain_remove(self.ptr.as_ptr(), n - 1);
                if !removed.is_null() {
                    sys::llama_sampler_free(removed);
                }
            }
        }
        self.chain_push(stage);
    }

    /// The seed its random stage actually uses (a chain: its last seeded stage); llama.cpp's
    /// default seed (`0xFFFFFFFF`) when nothing in it is random.
    pub fn seed(&self) -> u32 {
        // SAFETY: reads the live sampler (a chain is walked by llama.cpp).
        unsafe { sys::llama_sampler_get_seed(self.ptr.as_ptr()) }
    }

    /// An independent copy with the same state (RNG, penalty window, grammar parse state).
    pub fn try_clone(&self) -> Result<Sampler> {
        // SAFETY: clones the live sampler into a new owned one.
        owned(
            unsafe { sys::llama_sampler_clone(self.ptr.as_ptr()) },
            "cloned",
        )
    }

    /// Applies this sampler to the candidates in place; `selected` is set when it picked one.
    pub fn apply(&mut self, candidates: &mut [TokenData], sorted: bool) -> Candidates {
        let mut arr = sys::llama_token_data_array {
            data: candidates.as_mut_ptr(),
            size: candidates.len(),
            selected: -1,
            sorted,
        };
        // SAFETY: `arr` describes `candidates` exactly; samplers only shrink `size`, reorder
        // in place and set `selected`.
        unsafe { sys::llama_sampler_apply(self.ptr.as_ptr(), &mut arr) };
        Candidates {
            size: arr.size,
            selected: arr.selected,
            sorted: arr.sorted,
        }
    }

    /// Accepts a token, catching any C++ exception llama.cpp throws (a grammar that rejects it).
    pub fn accept(&mut self, token: Token) -> Result<()> {
        // SAFETY: the `llama_rs_` wrapper catches C++ exceptions and reports them as a status.
        let status = unsafe { sys::llama_rs_sampler_accept(self.ptr.as_ptr(), token) };
        if status == sys::LLAMA_RS_STATUS_OK {
            Ok(())
        } else {
            Err(Error::GrammarRejected(token))
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: we own the sampler (stages moved into a chain were forgotten, see chain_push).
        unsafe { sys::llama_sampler_free(self.ptr.as_ptr()) }
    }
}

/// GBNF for a JSON schema (llama.cpp's converter, through its exception-safe C wrapper).
pub fn json_schema_to_grammar(schema: &str) -> Result<String> {
    super::init_backend();
    let c_schema = CString::new(schema)
        .map_err(|_| Error::Grammar("schema must not contain NUL bytes".into()))?;
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: `c_schema` is NUL-terminated; on success `out` receives a malloc'd string that we
    // free with the wrapper's own free function below.
    let status =
        unsafe { sys::llama_rs_json_schema_to_grammar(c_schema.as_ptr(), false, &mut out) };
    if status != sys::LLAMA_RS_STATUS_OK || out.is_null() {
        return Err(Error::Grammar(
            "the JSON schema could not be parsed or converted to a grammar".into(),
        ));
    }
    // SAFETY: `out` is a NUL-terminated string we own; copied, then freed once.
    let grammar = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    unsafe { sys::llama_rs_string_free(out) };
    if grammar.trim().is_empty() {
        return Err(Error::Grammar(
            "the JSON schema produced an empty grammar".into(),
        ));
    }
    Ok(grammar)
}
