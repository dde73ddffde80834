//! Branch tree files (`store.saveTree` / `BranchStore.restoreTree`): the bytes, written and
//! parsed here without llama.cpp. Pure: unit-tested on bytes.
//!
//! Layout (little-endian):
//! ```text
//! "LBTREE\0\0"  u32 version  u32 flags (0)
//! fingerprint: u64 model, str model name, u32 state format, str kv settings
//! str meta (the caller's own text)
//! u32 branch count, then each branch (parents before children, see `SavedBranch`)
//! u64 checksum of every byte before it
//! ```
//! `str` is a u32 length and UTF-8 bytes; vectors are a u32 count and their items. Every read
//! is bounds-checked: a truncated or corrupt file is `ERR_STATE`, never a panic, and the
//! checksum is verified before anything else is parsed.

use super::fingerprint::Fingerprint;
use super::sampling::config::{Dry, Mirostat, Penalties, Xtc};
use super::sampling::SamplingConfig;
use crate::error::{Error, Result};
use crate::llama::Token;

const MAGIC: &[u8; 8] = b"LBTREE\0\0";
pub const VERSION: u32 = 1;
const NO_PARENT: u32 = u32::MAX;

/// How a saved branch's logits snapshot is stored.
#[derive(Debug, Clone, PartialEq)]
pub enum SavedLogits {
    None,
    /// Equal to its parent's (a fork that has not moved since): stored once, in the parent.
    SameAsParent,
    Own(Vec<f32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct SavedGrammar {
    pub gbnf: String,
    pub trigger_patterns: Vec<String>,
    pub trigger_tokens: Vec<Token>,
    /// Tokens accepted since the grammar was built, replayed on restore.
    pub accepted: Vec<Token>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SavedSampling {
    pub config: SamplingConfig,
    /// The seed the random stage actually used (a random seed is resolved by then).
    pub seed: u32,
    /// Chain applications since that seed (one RNG draw each).
    pub draws: u64,
    /// Tokens the chain accepted since it was built (penalty and DRY windows).
    pub accepted: Vec<Token>,
    pub grammar: Option<SavedGrammar>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SavedBranch {
    /// Index of the parent among the saved branches (always an earlier one); None for the root.
    pub parent: Option<u32>,
    pub position: i32,
    pub fork_head: i32,
    pub n_batch: u32,
    /// Cells `[0, shared)` come from the parent's restored sequence; `kv` holds the rest.
    pub shared: u32,
    /// Cells the branch holds in all (its position, unless its sequence starts later).
    pub cells: u32,
    /// llama.cpp's state of the branch's own cells (`Context::seq_state`); empty when it has none.
    pub kv: Vec<u8>,
    pub logits: SavedLogits,
    pub model_ppl: (f64, u32),
    pub sampling_ppl: (f64, u32),
    pub steer: Vec<(Token, f32)>,
    pub sampling: SavedSampling,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TreeFile {
    pub fingerprint: Fingerprint,
    pub meta: String,
    pub branches: Vec<SavedBranch>,
}

/// A fast checksum for corruption (not an adversary): four independent 64-bit lanes over 8-byte
/// words, so it runs at memory speed on files of hundreds of MiB.
pub fn checksum(bytes: &[u8]) -> u64 {
    const P: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut lanes = [
        0x243f_6a88_85a3_08d3u64,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    ];
    let mut blocks = bytes.chunks_exact(32);
    for block in &mut blocks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(block[i * 8..i * 8 + 8].try_into().unwrap());
            *lane = (*lane ^ w).wrapping_mul(P).rotate_left(29);
        }
    }
    let mut h = bytes.len() as u64;
    for lane in lanes {
        h = (h ^ lane).wrapping_mul(P).rotate_left(31);
    }
    super::fingerprint::fnv1a64(blocks.remainder()) ^ h
}

// ---------------------------------------------------------------------------------------------
// Writing

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f32(&mut self, v: f32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn tokens(&mut self, t: &[Token]) {
        self.u32(t.len() as u32);
        for &x in t {
            self.i32(x);
        }
    }
    fn strs(&mut self, v: &[String]) {
        self.u32(v.len() as u32);
        for s in v {
            self.str(s);
        }
    }
    fn opt<T>(&mut self, v: &Option<T>, f: impl FnOnce(&mut W, &T)) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                f(self, x);
            }
        }
    }
}

fn write_config(w: &mut W, c: &SamplingConfig) {
    w.f32(c.temperature);
    w.i32(c.top_k);
    w.f32(c.top_p);
    w.f32(c.min_p);
    w.f32(c.typical_p);
    w.u32(c.seed);
    w.opt(&c.penalties, |w, p| {
        w.f32(p.repeat);
        w.f32(p.frequency);
        w.f32(p.presence);
        w.i32(p.last_n);
    });
    w.opt(&c.mirostat, |w, m| {
        w.u8(m.mode);
        w.f32(m.tau);
        w.f32(m.eta);
    });
    w.opt(&c.dry, |w, d| {
        w.f32(d.multiplier);
        w.f32(d.base);
        w.i32(d.allowed_length);
        w.i32(d.penalty_last_n);
        w.strs(&d.sequence_breakers);
    });
    w.opt(&c.xtc, |w, x| {
        w.f32(x.probability);
        w.f32(x.threshold);
    });
    w.opt(&c.top_n_sigma, |w, n| w.f32(*n));
    w.u32(c.logit_bias.len() as u32);
    for &(t, b) in &c.logit_bias {
        w.i32(t);
        w.f32(b);
    }
    w.opt(&c.grammar, |w, g| w.str(g));
}

/// The whole file, checksum included.
pub fn tree_file_bytes(tree: &TreeFile) -> Vec<u8> {
    let kv: usize = tree.branches.iter().map(|b| b.kv.len()).sum();
    let mut w = W(Vec::with_capacity(kv + 4096 * (tree.branches.len() + 1)));
    w.0.extend_from_slice(MAGIC);
    w.u32(VERSION);
    w.u32(0);
    let f = &tree.fingerprint;
    w.u64(f.model);
    w.str(&f.model_name);
    w.u32(f.state_format);
    w.str(&f.kv);
    w.str(&tree.meta);
    w.u32(tree.branches.len() as u32);
    for b in &tree.branches {
        w.u32(b.parent.unwrap_or(NO_PARENT));
        w.i32(b.position);
        w.i32(b.fork_head);
        w.u32(b.n_batch);
        w.u32(b.shared);
        w.u32(b.cells);
        match &b.logits {
            SavedLogits::None => w.u8(0),
            SavedLogits::SameAsParent => w.u8(2),
            SavedLogits::Own(row) => {
                w.u8(1);
                w.u32(row.len() as u32);
                for &x in row {
                    w.f32(x);
                }
            }
        }
        w.f64(b.model_ppl.0);
        w.u32(b.model_ppl.1);
        w.f64(b.sampling_ppl.0);
        w.u32(b.sampling_ppl.1);
        w.u32(b.steer.len() as u32);
        for &(t, x) in &b.steer {
            w.i32(t);
            w.f32(x);
        }
        let s = &b.sampling;
        write_config(&mut w, &s.config);
        w.u32(s.seed);
        w.u64(s.draws);
        w.tokens(&s.accepted);
        w.opt(&s.grammar, |w, g| {
            w.str(&g.gbnf);
            w.strs(&g.trigger_patterns);
            w.tokens(&g.trigger_tokens);
            w.tokens(&g.accepted);
        });
        w.bytes(&b.kv);
    }
    let sum = checksum(&w.0);
    w.u64(sum);
    w.0
}

// ---------------------------------------------------------------------------------------------
// Parsing

/// Limits a parse checks everything against (the restoring context's).
pub struct Limits {
    pub n_ctx: u32,
    pub n_vocab: i32,
}

struct R<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a str,
}

impl<'a> R<'a> {
    fn bad(&self, why: impl std::fmt::Display) -> Error {
        Error::State(format!(
            "{} is not a usable branch tree file ({why}, at byte {})",
            self.path, self.at
        ))
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() - self.at < n {
            return Err(self.bad("truncated"));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn f32(&mut self) -> Result<f32> {
        Ok(f32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    /// A count of items of at least `item` bytes each, checked against what is left (so a
    /// corrupt count never allocates more than the file holds).
    fn count(&mut self, item: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item.max(1)) > self.bytes.len() - self.at {
            return Err(self.bad(format!("a count of {n} runs past the end")));
        }
        Ok(n)
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.count(1)?;
        self.take(n)
    }
    fn str(&mut self) -> Result<String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| self.bad("text that is not UTF-8"))
    }
    fn strs(&mut self) -> Result<Vec<String>> {
        let n = self.count(4)?;
        (0..n).map(|_| self.str()).collect()
    }
    fn token(&mut self, n_vocab: i32) -> Result<Token> {
        let t = self.i32()?;
        if t < 0 || t >= n_vocab {
            return Err(self.bad(format!("token {t} is outside this model's vocabulary")));
        }
        Ok(t)
    }
    fn tokens(&mut self, n_vocab: i32) -> Result<Vec<Token>> {
        let n = self.count(4)?;
        (0..n).map(|_| self.token(n_vocab)).collect()
    }
    fn flag(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            x => Err(self.bad(format!("flag {x}"))),
        }
    }
    fn finite(&mut self, what: &str) -> Result<f32> {
        let v = self.f32()?;
        if !v.is_finite() {
            return Err(self.bad(format!("{what} is {v}")));
        }
        Ok(v)
    }
    /// A window: -1 (the whole context) or a length (what the option validators allow).
    fn window(&mut self, what: &str) -> Result<i32> {
        let v = self.i32()?;
        if v < -1 {
            return Err(self.bad(format!("{what} is {v}")));
        }
        Ok(v)
    }
}

fn read_config(r: &mut R, l: &Limits) -> Result<SamplingConfig> {
    let temperature = r.finite("temperature")?;
    let top_k = r.i32()?;
    if top_k < 0 {
        return Err(r.bad(format!("topK is {top_k}")));
    }
    let unit = |r: &mut R, what: &str| -> Result<f32> {
        let v = r.finite(what)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(r.bad(format!("{what} is {v}")));
        }
        Ok(v)
    };
    let top_p = unit(r, "topP")?;
    let min_p = unit(r, "minP")?;
    let typical_p = unit(r, "typicalP")?;
    let seed = r.u32()?;
    let penalties = if r.flag()? {
        Some(Penalties {
            repeat: r.finite("penalties.repeat")?,
            frequency: r.finite("penalties.frequency")?,
            presence: r.finite("penalties.presence")?,
            last_n: r.window("penalties.lastN")?,
        })
    } else {
        None
    };
    let mirostat = if r.flag()? {
        Some(Mirostat {
            mode: r.u8()?,
            tau: r.finite("mirostat.tau")?,
            eta: r.finite("mirostat.eta")?,
        })
    } else {
        None
    };
    let dry = if r.flag()? {
        Some(Dry {
            multiplier: r.finite("dry.multiplier")?,
            base: r.finite("dry.base")?,
            allowed_length: r.window("dry.allowedLength")?,
            penalty_last_n: r.window("dry.penaltyLastN")?,
            sequence_breakers: r.strs()?,
        })
    } else {
        None
    };
    let xtc = if r.flag()? {
        Some(Xtc {
            probability: r.finite("xtc.probability")?,
            threshold: r.finite("xtc.threshold")?,
        })
    } else {
        None
    };
    let top_n_sigma = if r.flag()? {
        Some(r.finite("topNSigma")?)
    } else {
        None
    };
    let n = r.count(8)?;
    let mut logit_bias = Vec::with_capacity(n);
    for _ in 0..n {
        let t = r.token(l.n_vocab)?;
        let b = r.f32()?;
        if b.is_nan() || b == f32::INFINITY {
            return Err(r.bad(format!("logit bias {b}")));
        }
        logit_bias.push((t, b));
    }
    let grammar = if r.flag()? { Some(r.str()?) } else { None };
    Ok(SamplingConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        typical_p,
        seed,
        penalties,
        mirostat,
        dry,
        xtc,
        top_n_sigma,
        logit_bias,
        grammar,
    })
}

fn read_branch(r: &mut R, l: &Limits, index: usize) -> Result<SavedBranch> {
    let parent = match r.u32()? {
        NO_PARENT if index == 0 => None,
        p if (p as usize) < index => Some(p),
        p => {
            return Err(r.bad(format!(
                "branch {index} names parent {p}, which is not an earlier branch"
            )))
        }
    };
    if index > 0 && parent.is_none() {
        return Err(r.bad(format!("branch {index} has no parent")));
    }
    let position = r.i32()?;
    if position < 0 || position as i64 > l.n_ctx as i64 {
        return Err(r.bad(format!(
            "branch {index} is at position {position}, outside this context's [0, nCtx = {}]",
            l.n_ctx
        )));
    }
    let fork_head = r.i32()?;
    let n_batch = r.u32()?;
    let shared = r.u32()?;
    let cells = r.u32()?;
    if shared > cells || cells as i64 > position as i64 || (parent.is_none() && shared > 0) {
        return Err(r.bad(format!(
            "branch {index} shares {shared} of its {cells} cells at position {position}"
        )));
    }
    let logits = match r.u8()? {
        0 => SavedLogits::None,
        2 if parent.is_some() => SavedLogits::SameAsParent,
        1 => {
            let n = r.count(4)?;
            if n != l.n_vocab as usize {
                return Err(r.bad(format!(
                    "a logits row of {n} values, this model's vocabulary has {}",
                    l.n_vocab
                )));
            }
            let raw = r.take(4 * n)?;
            SavedLogits::Own(
                raw.chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
            )
        }
        x => return Err(r.bad(format!("logits kind {x}"))),
    };
    let model_ppl = (r.f64()?, r.u32()?);
    let sampling_ppl = (r.f64()?, r.u32()?);
    let n = r.count(8)?;
    let mut steer = Vec::with_capacity(n);
    for _ in 0..n {
        let t = r.token(l.n_vocab)?;
        let b = r.f32()?;
        if b.is_nan() || b == f32::INFINITY {
            return Err(r.bad(format!("steer bias {b}")));
        }
        steer.push((t, b));
    }
    let config = read_config(r, l)?;
    let seed = r.u32()?;
    let draws = r.u64()?;
    let accepted = r.tokens(l.n_vocab)?;
    let grammar = if r.flag()? {
        Some(SavedGrammar {
            gbnf: r.str()?,
            trigger_patterns: r.strs()?,
            trigger_tokens: r.tokens(l.n_vocab)?,
            accepted: r.tokens(l.n_vocab)?,
        })
    } else {
        None
    };
    let kv = r.bytes()?.to_vec();
    Ok(SavedBranch {
        parent,
        position,
        fork_head,
        n_batch,
        shared,
        cells,
        kv,
        logits,
        model_ppl,
        sampling_ppl,
        steer,
        sampling: SavedSampling {
            config,
            seed,
            draws,
            accepted,
            grammar,
        },
    })
}

/// Reads the fingerprint only (after the checksum): what a caller compares before parsing the
/// rest against its own limits.
pub fn parse_tree_file(path: &str, bytes: &[u8], limits: &Limits) -> Result<TreeFile> {
    let mut r = R { bytes, at: 0, path };
    if bytes.len() < MAGIC.len() + 8 + 8 || &bytes[..8] != MAGIC {
        return Err(r.bad("no branch tree header"));
    }
    r.at = 8;
    let version = r.u32()?;
    if version != VERSION {
        return Err(r.bad(format!(
            "format version {version}, this build reads version {VERSION}"
        )));
    }
    let body = bytes.len() - 8;
    let stored = u64::from_le_bytes(bytes[body..].try_into().unwrap());
    if checksum(&bytes[..body]) != stored {
        return Err(r.bad("its checksum does not match: the file is truncated or corrupt"));
    }
    let mut r = R {
        bytes: &bytes[..body],
        at: r.at,
        path,
    };
    let _flags = r.u32()?;
    let fingerprint = Fingerprint {
        model: r.u64()?,
        model_name: r.str()?,
        state_format: r.u32()?,
        kv: r.str()?,
    };
    let meta = r.str()?;
    let n = r.count(32)?;
    if n == 0 {
        return Err(r.bad("no branches"));
    }
    let branches = (0..n)
        .map(|i| read_branch(&mut r, limits, i))
        .collect::<Result<Vec<_>>>()?;
    if r.at != body {
        return Err(r.bad("trailing bytes after the last branch"));
    }
    Ok(TreeFile {
        fingerprint,
        meta,
        branches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_tree() -> TreeFile {
        let sampling = SavedSampling {
            config: SamplingConfig {
                penalties: Some(Penalties {
                    repeat: 1.1,
                    frequency: 0.0,
                    presence: 0.2,
                    last_n: 64,
                }),
                logit_bias: vec![(3, -1.0), (4, f32::NEG_INFINITY)],
                ..SamplingConfig::default()
            },
            seed: 42,
            draws: 7,
            accepted: vec![1, 2, 3],
            grammar: None,
        };
        let mut child = SavedBranch {
            parent: Some(0),
            position: 12,
            fork_head: 10,
            n_batch: 8,
            shared: 10,
            cells: 12,
            kv: vec![9; 40],
            logits: SavedLogits::SameAsParent,
            model_ppl: (1.5, 2),
            sampling_ppl: (0.5, 2),
            steer: vec![(5, 2.0)],
            sampling: sampling.clone(),
        };
        child.sampling.grammar = Some(SavedGrammar {
            gbnf: "root ::= \"a\"".into(),
            trigger_patterns: vec!["x".into()],
            trigger_tokens: vec![7],
            accepted: vec![2],
        });
        let root = SavedBranch {
            parent: None,
            position: 10,
            fork_head: 0,
            n_batch: 8,
            shared: 0,
            cells: 10,
            kv: vec![1, 2, 3, 4],
            logits: SavedLogits::Own((0..16).map(|i| i as f32 * 0.5).collect()),
            model_ppl: (0.0, 0),
            sampling_ppl: (0.0, 0),
            steer: vec![],
            sampling,
        };
        TreeFile {
            fingerprint: Fingerprint::new(1, 2, &[], "test model", 4, "typeK=f16".into()),
            meta: "{\"step\":3}".into(),
            branches: vec![root, child],
        }
    }

    const LIMITS: Limits = Limits {
        n_ctx: 64,
        n_vocab: 16,
    };

    #[test]
    fn a_tree_round_trips() {
        let tree = sample_tree();
        let bytes = tree_file_bytes(&tree);
        assert_eq!(parse_tree_file("t", &bytes, &LIMITS).unwrap(), tree);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_a_state_error() {
        let bytes = tree_file_bytes(&sample_tree());
        for n in 0..bytes.len() {
            let e = parse_tree_file("t", &bytes[..n], &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE", "truncated to {n}: {e}");
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            let e = parse_tree_file("t", &bad, &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE", "byte {i} flipped: {e}");
        }
    }

    #[test]
    fn contents_are_checked_against_the_restoring_context() {
        let bytes = tree_file_bytes(&sample_tree());
        let small_vocab = Limits {
            n_ctx: 64,
            n_vocab: 8,
        };
        let e = parse_tree_file("t", &bytes, &small_vocab).unwrap_err();
        assert!(e.to_string().contains("vocabulary"), "{e}");
        let small_ctx = Limits {
            n_ctx: 11,
            n_vocab: 16,
        };
        let e = parse_tree_file("t", &bytes, &small_ctx).unwrap_err();
        assert!(e.to_string().contains("position 12"), "{e}");
    }

    #[test]
    fn a_parent_must_come_first() {
        let mut tree = sample_tree();
        tree.branches[1].parent = Some(1);
        let e = parse_tree_file("t", &tree_file_bytes(&tree), &LIMITS).unwrap_err();
        assert!(e.to_string().contains("not an earlier branch"), "{e}");
    }
}
