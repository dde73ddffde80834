//! Branch tree files (`store.saveTree` / `BranchStore.restoreTree`): the payload of a
//! saved-state container (engine/saved_state.rs: header, fingerprint, checksum, atomic write),
//! written and parsed here without llama.cpp. Pure: unit-tested on bytes.
//!
//! Sections (little-endian, primitives of `saved_state::{Writer, Reader}`):
//! ```text
//! meta      the caller's own text (UTF-8)
//! branches  u32 count, then each branch (parents before children, see `SavedBranch`)
//! images    only when a branch's cells hold an image: u32 count (= the branches'), then for
//!           each branch in the same order u32 count and each image's u32 start, u32 positions
//!           and str id (the SHA-256 of its file, 64 lowercase hex digits)
//! ```
//! Every read is bounds-checked and every sampler value goes through the validator that checks
//! it when a user sets it (sampling/config.rs): a bad file is `ERR_STATE_CORRUPT`, never a panic.
//!
//! The images section is a section of its own, written only when an image is saved, so a tree
//! without images is the same bytes as before it existed and files saved before it still read
//! (no new container version). Its spans are checked like the rest: inside the branch's
//! positions, ordered, apart, each id a SHA-256; a child's images in the cells it shares with
//! its parent are its parent's there.

use super::fingerprint::Fingerprint;
use super::media::{read_spans, write_spans, ImageSpan};
use super::sampling::config::{self, Dry, Mirostat, Penalties, Xtc};
use super::sampling::SamplingConfig;
use super::saved_state::{container_bytes, parse_container, Payload, Reader, Writer};
use crate::error::Result;
use crate::llama::Token;

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
    /// The images whose positions the branch's cells hold, in order (engine/media.rs).
    pub images: Vec<ImageSpan>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TreeFile {
    pub fingerprint: Fingerprint,
    pub meta: String,
    pub branches: Vec<SavedBranch>,
}

// ---------------------------------------------------------------------------------------------
// Writing

fn write_config(w: &mut Writer, c: &SamplingConfig) {
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
    let mut w = Writer(Vec::with_capacity(kv + 4096 * (tree.branches.len() + 1)));
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
    let images = images_section(&tree.branches);
    let mut sections: Vec<(&str, &[u8])> = vec![("meta", tree.meta.as_bytes()), ("branches", &w.0)];
    if let Some(images) = &images {
        sections.push(("images", images));
    }
    container_bytes(Payload::Tree, &tree.fingerprint, &sections)
}

/// The images section (None when no branch holds an image: the section is left out).
fn images_section(branches: &[SavedBranch]) -> Option<Vec<u8>> {
    if branches.iter().all(|b| b.images.is_empty()) {
        return None;
    }
    let mut w = Writer::default();
    w.u32(branches.len() as u32);
    for b in branches {
        write_spans(&mut w, &b.images);
    }
    Some(w.0)
}

// ---------------------------------------------------------------------------------------------
// Parsing

/// Limits a parse checks everything against (the restoring context's).
pub struct Limits {
    pub n_ctx: u32,
    pub n_vocab: i32,
}

/// A float the validator `check` accepts (the same one a user's option goes through).
fn checked(r: &mut Reader, check: impl FnOnce(f64) -> Result<f32>) -> Result<f32> {
    let v = r.f32()?;
    r.valid(check(v as f64))
}

/// (token, bias) pairs, each through the validators of `what`'s token and bias.
fn biases(r: &mut Reader, l: &Limits, what: &str) -> Result<Vec<(Token, f32)>> {
    let n = r.count(8)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (t, b) = (r.i32()?, r.f32()?);
        let t = r.valid(config::token(t as f64, l.n_vocab, &format!("{what} token")))?;
        out.push((t, r.valid(config::bias(&format!("{what} bias"), b as f64))?));
    }
    Ok(out)
}

/// A sampler saved as on whose values its validator turns off is as corrupt as a refused one.
fn on<T>(r: &Reader, what: &str, v: Option<T>) -> Result<T> {
    v.ok_or_else(|| {
        r.bad(format!(
            "{what} is saved as on with values that turn it off"
        ))
    })
}

fn read_config(r: &mut Reader, l: &Limits) -> Result<SamplingConfig> {
    let temperature = checked(r, |v| config::finite("temperature", v))?;
    let top_k = r.i32()?;
    let top_k = r.valid(config::integer("topK", top_k as f64, 0))?;
    let top_p = checked(r, |v| config::probability("topP", v, false))?;
    let min_p = checked(r, |v| config::probability("minP", v, true))?;
    let typical_p = checked(r, |v| config::probability("advanced.typicalP", v, false))?;
    // Every u32 is a seed (RANDOM_SEED included).
    let seed = r.u32()?;
    let penalties = if r.flag()? {
        let (repeat, frequency, presence) = (r.f32()?, r.f32()?, r.f32()?);
        let last_n = r.i32()?;
        Some(r.valid(Penalties::from_options(
            Some(repeat as f64),
            Some(frequency as f64),
            Some(presence as f64),
            Some(last_n as f64),
        ))?)
    } else {
        None
    };
    let mirostat = if r.flag()? {
        let (mode, tau, eta) = (r.u8()?, r.f32()?, r.f32()?);
        let m = r.valid(Mirostat::from_options(
            Some(mode as f64),
            Some(tau as f64),
            Some(eta as f64),
        ))?;
        Some(on(r, "advanced.mirostat", m)?)
    } else {
        None
    };
    let dry = if r.flag()? {
        let (multiplier, base) = (r.f32()?, r.f32()?);
        let (allowed_length, penalty_last_n) = (r.i32()?, r.i32()?);
        let breakers = r.strs()?;
        let d = r.valid(Dry::from_options(
            Some(multiplier as f64),
            Some(base as f64),
            Some(allowed_length as f64),
            Some(penalty_last_n as f64),
            Some(breakers),
        ))?;
        Some(on(r, "advanced.dry", d)?)
    } else {
        None
    };
    let xtc = if r.flag()? {
        let (probability, threshold) = (r.f32()?, r.f32()?);
        let x = r.valid(Xtc::from_options(
            Some(probability as f64),
            Some(threshold as f64),
        ))?;
        Some(on(r, "advanced.xtc", x)?)
    } else {
        None
    };
    let top_n_sigma = if r.flag()? {
        Some(checked(r, config::top_n_sigma)?)
    } else {
        None
    };
    let logit_bias = biases(r, l, "logitBias")?;
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

fn read_branch(r: &mut Reader, l: &Limits, index: usize) -> Result<SavedBranch> {
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
    let steer = biases(r, l, "steer")?;
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
        images: Vec::new(),
    })
}

/// Reads the images section into `branches` (parsed already), checked against each branch's
/// position and, in the cells a child shares with its parent, against the parent's images.
fn read_images(r: &mut Reader, branches: &mut [SavedBranch]) -> Result<()> {
    let n = r.count(4)?;
    if n != branches.len() {
        return Err(r.bad(format!(
            "images for {n} branches, the tree has {}",
            branches.len()
        )));
    }
    for i in 0..n {
        let b = &branches[i];
        let spans = read_spans(r, b.position)?;
        if let Some(p) = b.parent {
            let shared = b.shared as i64;
            let below = |s: &&ImageSpan| (s.start as i64 + s.n_pos as i64) <= shared;
            let mine = spans.iter().filter(below);
            let theirs = branches[p as usize].images.iter().filter(below);
            if !mine.eq(theirs) {
                return Err(r.bad(format!(
                    "branch {i}'s images in the {shared} cells it shares with its parent are not its parent's"
                )));
            }
        }
        branches[i].images = spans;
    }
    if !r.done() {
        return Err(r.bad("trailing bytes after the last branch's images"));
    }
    Ok(())
}

/// Parses a tree file saved by a context with fingerprint `here` (else `ERR_STATE_MISMATCH`),
/// checking everything against the restoring context's `limits`.
pub fn parse_tree_file(
    path: &str,
    bytes: &[u8],
    limits: &Limits,
    here: &Fingerprint,
) -> Result<TreeFile> {
    let sections = parse_container(path, bytes, Payload::Tree, here)?;
    let mut r = sections.reader("meta")?;
    let meta = r.take(r.remaining())?;
    let meta = String::from_utf8(meta.to_vec()).map_err(|_| r.bad("text that is not UTF-8"))?;
    let mut r = sections.reader("branches")?;
    let n = r.count(32)?;
    if n == 0 {
        return Err(r.bad("no branches"));
    }
    let mut branches = (0..n)
        .map(|i| read_branch(&mut r, limits, i))
        .collect::<Result<Vec<_>>>()?;
    if !r.done() {
        return Err(r.bad("trailing bytes after the last branch"));
    }
    // Absent: no branch holds an image (and every file saved before images could be).
    if let Ok(mut r) = sections.reader("images") {
        read_images(&mut r, &mut branches)?;
    }
    Ok(TreeFile {
        fingerprint: sections.fingerprint().clone(),
        meta,
        branches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::Pos;
    use std::sync::Arc;

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
            images: vec![span(2, 3, 'a'), span(10, 2, '0')],
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
            images: vec![span(2, 3, 'a')],
        };
        TreeFile {
            fingerprint: Fingerprint::new(1, 2, &[], "test model", 4, "typeK=f16".into()),
            meta: "{\"step\":3}".into(),
            branches: vec![root, child],
        }
    }

    /// An image at `[start, start + n_pos)` whose id is `digit` 64 times.
    fn span(start: Pos, n_pos: Pos, digit: char) -> ImageSpan {
        ImageSpan {
            start,
            n_pos,
            id: Arc::from(digit.to_string().repeat(64).as_str()),
        }
    }

    const LIMITS: Limits = Limits {
        n_ctx: 64,
        n_vocab: 16,
    };

    fn parse(bytes: &[u8], limits: &Limits) -> Result<TreeFile> {
        parse_tree_file("t", bytes, limits, &sample_tree().fingerprint)
    }

    #[test]
    fn a_tree_round_trips() {
        let tree = sample_tree();
        let bytes = tree_file_bytes(&tree);
        assert_eq!(parse(&bytes, &LIMITS).unwrap(), tree);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_corrupt() {
        let bytes = tree_file_bytes(&sample_tree());
        for n in 0..bytes.len() {
            let e = parse(&bytes[..n], &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "truncated to {n}: {e}");
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            let e = parse(&bad, &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "byte {i} flipped: {e}");
        }
    }

    #[test]
    fn contents_are_checked_against_the_restoring_context() {
        let bytes = tree_file_bytes(&sample_tree());
        let small_vocab = Limits {
            n_ctx: 64,
            n_vocab: 8,
        };
        let e = parse(&bytes, &small_vocab).unwrap_err();
        assert!(e.to_string().contains("vocabulary"), "{e}");
        let small_ctx = Limits {
            n_ctx: 11,
            n_vocab: 16,
        };
        let e = parse(&bytes, &small_ctx).unwrap_err();
        assert!(e.to_string().contains("position 12"), "{e}");
    }

    #[test]
    fn a_parent_must_come_first() {
        let mut tree = sample_tree();
        tree.branches[1].parent = Some(1);
        let e = parse(&tree_file_bytes(&tree), &LIMITS).unwrap_err();
        assert!(e.to_string().contains("not an earlier branch"), "{e}");
    }

    #[test]
    fn sampler_values_go_through_the_option_validators() {
        type Spoil = fn(&mut SamplingConfig);
        let cases: [(Spoil, &str); 4] = [
            (|c| c.top_p = 1.5, "topP must be in (0, 1]"),
            (
                |c| c.temperature = f32::NAN,
                "temperature must be a finite number",
            ),
            (
                |c| c.logit_bias[0].1 = f32::INFINITY,
                "logitBias bias must be",
            ),
            (
                |c| c.penalties.as_mut().unwrap().last_n = -2,
                "penalties.lastN must be an integer",
            ),
        ];
        for (spoil, why) in cases {
            let mut tree = sample_tree();
            spoil(&mut tree.branches[1].sampling.config);
            let e = parse(&tree_file_bytes(&tree), &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT");
            assert!(e.to_string().contains(why), "{e} should say {why}");
        }
    }

    #[test]
    fn a_tree_from_another_context_is_a_mismatch() {
        let bytes = tree_file_bytes(&sample_tree());
        let other = Fingerprint::new(1, 2, &[], "test model", 4, "typeK=q8_0".into());
        let e = parse_tree_file("t", &bytes, &LIMITS, &other).unwrap_err();
        assert_eq!(e.code(), "ERR_STATE_MISMATCH");
    }

    #[test]
    fn images_round_trip_and_a_tree_without_them_has_no_images_section() {
        let tree = sample_tree();
        let parsed = parse(&tree_file_bytes(&tree), &LIMITS).unwrap();
        assert_eq!(parsed.branches[0].images, vec![span(2, 3, 'a')]);
        assert_eq!(parsed.branches[1].images, tree.branches[1].images);
        let mut plain = sample_tree();
        for b in &mut plain.branches {
            b.images.clear();
        }
        let bytes = tree_file_bytes(&plain);
        let sections = parse_container("t", &bytes, Payload::Tree, &plain.fingerprint).unwrap();
        assert!(sections.reader("images").is_err(), "no images, no section");
        assert_eq!(parse(&bytes, &LIMITS).unwrap(), plain);
    }

    #[test]
    fn bad_image_spans_are_corrupt() {
        type Spoil = fn(&mut [SavedBranch]);
        let cases: [(Spoil, &str); 9] = [
            (
                |b| b[0].images = vec![span(8, 3, 'a')],
                "inside the 10 positions",
            ),
            (
                |b| b[0].images = vec![span(-1, 3, 'a')],
                "at position 4294967295",
            ),
            (|b| b[0].images = vec![span(2, 0, 'a')], "[2, 2)"),
            (|b| b[1].images[1].start = 3, "not ordered, apart"),
            (|b| b[1].images.reverse(), "not ordered, apart"),
            (|b| b[0].images[0].id = Arc::from("ab"), "not a SHA-256"),
            (|b| b[1].images[1] = span(10, 2, 'A'), "not a SHA-256"),
            (|b| b[1].images[1] = span(10, 2, 'g'), "not a SHA-256"),
            (|b| drop(b[1].images.remove(0)), "not its parent's"),
        ];
        for (spoil, why) in cases {
            let mut tree = sample_tree();
            spoil(&mut tree.branches);
            let e = parse(&tree_file_bytes(&tree), &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "{e}");
            assert!(e.to_string().contains(why), "{e} should say {why}");
            assert!(e.to_string().contains("images section"), "{e}");
        }
    }

    #[test]
    fn an_images_section_that_does_not_fit_the_branches_is_corrupt() {
        let tree = sample_tree();
        let bytes = tree_file_bytes(&tree);
        let sections = parse_container("t", &bytes, Payload::Tree, &tree.fingerprint).unwrap();
        let all = |name| {
            let mut r = sections.reader(name).unwrap();
            r.take(r.remaining()).unwrap().to_vec()
        };
        let (meta, branches, images) = (all("meta"), all("branches"), all("images"));
        let with = |images: &[u8]| {
            container_bytes(
                Payload::Tree,
                &tree.fingerprint,
                &[("meta", &meta), ("branches", &branches), ("images", images)],
            )
        };
        assert_eq!(parse(&with(&images), &LIMITS).unwrap(), tree);
        let mut one_branch = images.clone();
        one_branch[..4].copy_from_slice(&1u32.to_le_bytes());
        let mut huge_start = images.clone();
        huge_start[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut longer = images.clone();
        longer.push(0);
        for (bad, why) in [
            (one_branch, "images for 1 branches"),
            (huge_start, "at position 4294967295"),
            (longer, "trailing bytes"),
            (vec![], "truncated"),
        ] {
            let e = parse(&with(&bad), &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "{e}");
            assert!(e.to_string().contains(why), "{e} should say {why}");
        }
        for n in 0..images.len() {
            let e = parse(&with(&images[..n]), &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "cut at {n}: {e}");
        }
    }
}
