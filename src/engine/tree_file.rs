//! Branch tree files (`store.saveTree` / `BranchStore.restoreTree`): the payload of a
//! saved-state container (engine/saved_state/: header, fingerprint, checksum, atomic write),
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
//! Every read is bounds-checked and sampler values go through the validators of the options a
//! user sets (`SamplingConfig::check`): a bad file is `ERR_STATE_CORRUPT`, never a panic.
//!
//! The images section is written only when an image is saved, so a tree without images is the
//! same bytes as before it existed and older files still read (no new container version). Its
//! spans are checked as every saved span is (media.rs `read_spans`); a child's images in the
//! cells it shares with its parent must be its parent's there.

use super::fingerprint::Fingerprint;
use super::media::{images_below, read_spans, write_spans, ImageSpan};
use super::sampling::config::{self, Dry, Mirostat, Penalties, Xtc};
use super::sampling::SamplingConfig;
use super::saved_state::{container_bytes, parse_container, Limits, Payload, Reader, Writer};
use crate::error::Result;
use crate::llama::{Pos, Token};

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

/// (token, bias) pairs: a config's logit biases, a branch's steer.
fn write_pairs(w: &mut Writer, pairs: &[(Token, f32)]) {
    w.u32(pairs.len() as u32);
    for &(t, b) in pairs {
        w.i32(t);
        w.f32(b);
    }
}

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
    write_pairs(w, &c.logit_bias);
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
                row.iter().for_each(|&x| w.f32(x));
            }
        }
        w.f64(b.model_ppl.0);
        w.u32(b.model_ppl.1);
        w.f64(b.sampling_ppl.0);
        w.u32(b.sampling_ppl.1);
        write_pairs(&mut w, &b.steer);
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
    let mut sections: Vec<(&str, &[u8])> = vec![("meta", tree.meta.as_bytes()), ("branches", &w.0)];
    // Only when a branch holds an image: a count (the branches'), then each branch's spans.
    let mut images = Writer::default();
    if tree.branches.iter().any(|b| !b.images.is_empty()) {
        images.u32(tree.branches.len() as u32);
        tree.branches
            .iter()
            .for_each(|b| write_spans(&mut images, &b.images));
        sections.push(("images", &images.0));
    }
    container_bytes(Payload::Tree, &tree.fingerprint, &sections)
}

// ---------------------------------------------------------------------------------------------
// Parsing

fn read_pairs(r: &mut Reader) -> Result<Vec<(Token, f32)>> {
    let n = r.count(8)?;
    (0..n).map(|_| Ok((r.i32()?, r.f32()?))).collect()
}

/// What `write_config` wrote, then through the validators a user's options go through.
fn read_config(r: &mut Reader, l: &Limits) -> Result<SamplingConfig> {
    let config = SamplingConfig {
        temperature: r.f32()?,
        top_k: r.i32()?,
        top_p: r.f32()?,
        min_p: r.f32()?,
        typical_p: r.f32()?,
        // Every u32 is a seed (RANDOM_SEED included).
        seed: r.u32()?,
        penalties: r.opt(|r| {
            Ok(Penalties {
                repeat: r.f32()?,
                frequency: r.f32()?,
                presence: r.f32()?,
                last_n: r.i32()?,
            })
        })?,
        mirostat: r.opt(|r| {
            Ok(Mirostat {
                mode: r.u8()?,
                tau: r.f32()?,
                eta: r.f32()?,
            })
        })?,
        dry: r.opt(|r| {
            Ok(Dry {
                multiplier: r.f32()?,
                base: r.f32()?,
                allowed_length: r.i32()?,
                penalty_last_n: r.i32()?,
                sequence_breakers: r.strs()?,
            })
        })?,
        xtc: r.opt(|r| {
            Ok(Xtc {
                probability: r.f32()?,
                threshold: r.f32()?,
            })
        })?,
        top_n_sigma: r.opt(|r| r.f32())?,
        logit_bias: read_pairs(r)?,
        grammar: r.opt(|r| r.str())?,
    };
    r.valid(config.check(l.n_vocab))?;
    Ok(config)
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
    let position = r.i32()?;
    if position < 0 || position as i64 > l.n_ctx as i64 {
        return Err(r.bad(format!(
            "branch {index} is at position {position}, outside this context's [0, nCtx = {}]",
            l.n_ctx
        )));
    }
    let (fork_head, n_batch, shared, cells) = (r.i32()?, r.u32()?, r.u32()?, r.u32()?);
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
            SavedLogits::Own((0..n).map(|_| r.f32()).collect::<Result<_>>()?)
        }
        x => return Err(r.bad(format!("logits kind {x}"))),
    };
    let (model_ppl, sampling_ppl) = ((r.f64()?, r.u32()?), (r.f64()?, r.u32()?));
    let steer = read_pairs(r)?;
    for &(t, b) in &steer {
        r.valid(config::token_bias(t as f64, b as f64, l.n_vocab, "steer"))?;
    }
    Ok(SavedBranch {
        parent,
        position,
        fork_head,
        n_batch,
        shared,
        cells,
        logits,
        model_ppl,
        sampling_ppl,
        steer,
        sampling: SavedSampling {
            config: read_config(r, l)?,
            seed: r.u32()?,
            draws: r.u64()?,
            accepted: r.tokens(l.n_vocab)?,
            grammar: r.opt(|r| {
                Ok(SavedGrammar {
                    gbnf: r.str()?,
                    trigger_patterns: r.strs()?,
                    trigger_tokens: r.tokens(l.n_vocab)?,
                    accepted: r.tokens(l.n_vocab)?,
                })
            })?,
        },
        kv: r.bytes()?.to_vec(),
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
        let (b, shared) = (&branches[i], branches[i].shared as Pos);
        let spans = read_spans(r, b.position)?;
        let theirs = b.parent.map(|p| &branches[p as usize].images);
        if theirs.is_some_and(|theirs| images_below(theirs, shared) != images_below(&spans, shared))
        {
            return Err(r.bad(format!(
                "branch {i}'s images in the {shared} cells it shares with its parent are not its parent's"
            )));
        }
        branches[i].images = spans;
    }
    r.end("the last branch's images")
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
    r.end("the last branch")?;
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
    use crate::engine::saved_state::checksum;
    use std::sync::Arc;

    /// A root, and a child with steer, a grammar, every sampler and images beside its parent's.
    fn sample_tree() -> TreeFile {
        let sampling = SavedSampling {
            config: SamplingConfig {
                penalties: Some(Penalties::from_options(Some(1.1), None, Some(0.2), None).unwrap()),
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
        let c = &mut child.sampling.config;
        (c.temperature, c.top_k, c.seed, c.top_n_sigma) = (0.0, 7, 99, Some(1.5));
        // Built as a user's options would be: every sampler on.
        c.mirostat = Mirostat::from_options(Some(1.0), Some(4.0), Some(0.2)).unwrap();
        let breakers = Some(vec!["x".into(), "\n".into()]);
        c.dry = Dry::from_options(Some(0.5), Some(1.5), Some(3.0), None, breakers).unwrap();
        c.xtc = Xtc::from_options(Some(0.3), Some(0.2)).unwrap();
        c.grammar = Some("root ::= \"b\"".into());
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
    fn a_tree_round_trips_in_the_layout_saved_trees_have() {
        let tree = sample_tree();
        let bytes = tree_file_bytes(&tree);
        assert_eq!(parse(&bytes, &LIMITS).unwrap(), tree);
        // Pinned: files saved by earlier builds must still read, so these bytes never change.
        assert_eq!(
            (bytes.len(), checksum(&bytes)),
            (911, 0x072f_8009_fdff_5103)
        );
    }

    /// `tree`'s file with its section `name` edited (in a sound container: the payload's checks).
    fn with_section(tree: &TreeFile, name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let bytes = tree_file_bytes(tree);
        let sections = parse_container("t", &bytes, Payload::Tree, &tree.fingerprint).unwrap();
        let mut all = ["meta", "branches", "images"].map(|n| {
            let mut r = sections.reader(n).unwrap();
            (n, r.take(r.remaining()).unwrap().to_vec())
        });
        edit(&mut all.iter_mut().find(|(n, _)| *n == name).unwrap().1);
        let all = all.each_ref().map(|(n, b)| (*n, &b[..]));
        container_bytes(Payload::Tree, &tree.fingerprint, &all)
    }

    #[test]
    fn every_cut_section_and_every_flipped_byte_is_corrupt() {
        let (tree, bytes) = (sample_tree(), tree_file_bytes(&sample_tree()));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            let e = parse(&bad, &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "byte {i} flipped: {e}");
        }
        for name in ["branches", "images"] {
            let mut len = 0;
            with_section(&tree, name, |b| len = b.len());
            for n in 0..len {
                let e = parse(&with_section(&tree, name, |b| b.truncate(n)), &LIMITS);
                assert_eq!(
                    e.unwrap_err().code(),
                    "ERR_STATE_CORRUPT",
                    "{name} cut at {n}"
                );
            }
        }
    }

    #[test]
    fn contents_are_checked_against_the_restoring_context() {
        let bytes = tree_file_bytes(&sample_tree());
        let e = |n_ctx, n_vocab| parse(&bytes, &Limits { n_ctx, n_vocab }).unwrap_err();
        assert!(e(64, 8).to_string().contains("vocabulary"));
        assert!(e(11, 16).to_string().contains("position 12"));
    }

    #[test]
    fn bad_values_are_corrupt_saying_why() {
        type Spoil = fn(&mut [SavedBranch]);
        let cases: [(Spoil, &str); 8] = [
            (|b| b[1].parent = Some(1), "not an earlier branch"),
            // Sampler values go through the validators a user's options go through.
            (
                |b| b[1].sampling.config.top_p = 1.5,
                "topP must be in (0, 1]",
            ),
            (
                |b| b[0].sampling.config.logit_bias[0].0 = 16,
                "logitBias token",
            ),
            (|b| b[1].steer[0].1 = f32::NAN, "steer bias must be"),
            (
                |b| b[1].sampling.config.mirostat.as_mut().unwrap().mode = 0,
                "advanced.mirostat is on with values that turn it off",
            ),
            // Image spans: inside the branch, ordered, SHA-256 ids, the parent's where shared.
            (
                |b| b[0].images = vec![span(8, 3, 'a')],
                "inside the 10 positions",
            ),
            (|b| b[1].images[1] = span(10, 2, 'A'), "not a SHA-256"),
            (|b| drop(b[1].images.remove(0)), "not its parent's"),
        ];
        for (spoil, why) in cases {
            let mut tree = sample_tree();
            spoil(&mut tree.branches);
            let e = parse(&tree_file_bytes(&tree), &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "{e}");
            assert!(e.to_string().contains(why), "{e} should say {why}");
            assert!(e.to_string().contains(" section)"), "{e} should say where");
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
    fn a_tree_without_images_has_no_images_section() {
        let mut plain = sample_tree();
        plain.branches.iter_mut().for_each(|b| b.images.clear());
        let bytes = tree_file_bytes(&plain);
        let sections = parse_container("t", &bytes, Payload::Tree, &plain.fingerprint).unwrap();
        assert!(sections.reader("images").is_err(), "no images, no section");
        assert_eq!(parse(&bytes, &LIMITS).unwrap(), plain);
    }

    #[test]
    fn an_images_section_that_does_not_fit_the_branches_is_corrupt() {
        let tree = sample_tree();
        type Edit = fn(&mut Vec<u8>);
        let cases: [(Edit, &str); 3] = [
            (
                |b| b[..4].copy_from_slice(&1u32.to_le_bytes()),
                "images for 1 branches",
            ),
            (
                |b| b[8..12].copy_from_slice(&u32::MAX.to_le_bytes()),
                "at position 4294967295",
            ),
            (|b| b.push(0), "trailing bytes"),
        ];
        for (edit, why) in cases {
            let e = parse(&with_section(&tree, "images", edit), &LIMITS).unwrap_err();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "{e}");
            assert!(e.to_string().contains(why), "{e} should say {why}");
        }
    }
}
