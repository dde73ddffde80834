//! Prefix-cache entry files (the Scheduler's disk tier, lib/scheduler/cache-file.js): the
//! payload of a saved-state container (engine/saved_state.rs). Pure: unit-tested on bytes.
//!
//! Sections:
//! ```text
//! tokens  the prefix, i32 each (little-endian); IMAGE_POSITION (-1) at an image's positions
//! images  only when the prefix holds images: each one's start, positions and id (media.rs)
//! state   the sequence state of those tokens' cells, as `Context::seq_state` makes it
//! ```

use super::fingerprint::Fingerprint;
use super::media::{read_spans, spans_problem, write_spans, ImageSpan, IMAGE_POSITION};
use super::saved_state::{
    container_bytes, container_size, parse_container, read_section, Limits, Payload, Reader, Writer,
};
use crate::error::{Error, Result};
use crate::llama::{Pos, Token};

/// A prefix's tokens and the images among them.
#[derive(Debug, Clone, PartialEq)]
pub struct Prefix {
    pub tokens: Vec<Token>,
    pub images: Vec<ImageSpan>,
}

impl Prefix {
    /// Why the tokens and images disagree (None: they agree): IMAGE_POSITION exactly at the
    /// images' positions, valid spans.
    fn problem(&self) -> Option<String> {
        if let Some(why) = spans_problem(&self.images, self.tokens.len() as Pos) {
            return Some(why);
        }
        let mut at_image = vec![false; self.tokens.len()];
        for s in &self.images {
            at_image[s.start as usize..(s.start + s.n_pos) as usize].fill(true);
        }
        let wrong = self
            .tokens
            .iter()
            .zip(&at_image)
            .position(|(&t, &image)| (t == IMAGE_POSITION) != image);
        wrong.map(|i| {
            format!("position {i}: an image's positions hold {IMAGE_POSITION} and only they do")
        })
    }
}

/// The images section of a prefix holding `images` (None without images: no section).
fn images_section(images: &[ImageSpan]) -> Option<Vec<u8>> {
    (!images.is_empty()).then(|| {
        let mut w = Writer::default();
        write_spans(&mut w, images);
        w.0
    })
}

/// The whole file for `prefix` holding `state`; ERR_INVALID_ARG when its tokens and images
/// disagree.
pub fn prefix_file_bytes(
    fingerprint: &Fingerprint,
    prefix: &Prefix,
    state: &[u8],
) -> Result<Vec<u8>> {
    if let Some(why) = prefix.problem() {
        return Err(Error::invalid(format!("_prefixFileWrite: {why}")));
    }
    let tokens: Vec<u8> = prefix.tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let images = images_section(&prefix.images);
    let mut sections: Vec<(&str, &[u8])> = vec![("tokens", &tokens)];
    if let Some(images) = &images {
        sections.push(("images", images));
    }
    sections.push(("state", state));
    Ok(container_bytes(Payload::Prefix, fingerprint, &sections))
}

/// The size of the file `prefix_file_bytes` writes for a prefix of `n_tokens` tokens with
/// `images` among them and `state_len` bytes of state.
pub fn prefix_file_size(
    fingerprint: &Fingerprint,
    n_tokens: usize,
    images: &[ImageSpan],
    state_len: usize,
) -> usize {
    let mut sections = vec![("tokens", 4 * n_tokens)];
    if let Some(images) = images_section(images) {
        sections.push(("images", images.len()));
    }
    sections.push(("state", state_len));
    container_size(Payload::Prefix, fingerprint, &sections)
}

fn read_tokens(mut r: Reader, limits: &Limits) -> Result<Vec<Token>> {
    if !r.remaining().is_multiple_of(4) || r.remaining() / 4 > limits.n_ctx as usize {
        return Err(r.bad(format!(
            "{} bytes of tokens, not whole tokens within nCtx = {}",
            r.remaining(),
            limits.n_ctx
        )));
    }
    (0..r.remaining() / 4)
        .map(|_| match r.i32()? {
            IMAGE_POSITION => Ok(IMAGE_POSITION),
            t if (0..limits.n_vocab).contains(&t) => Ok(t),
            t => Err(r.bad(format!("token {t} is outside this model's vocabulary"))),
        })
        .collect()
}

/// The prefix of `tokens` (read) and the file's `images` section (None: it has none), checked
/// against each other (`bad` words an error as corruption of the file).
fn prefix_of(tokens: Vec<Token>, images: Option<Reader>, bad: &Reader) -> Result<Prefix> {
    let images = match images {
        Some(mut r) => read_spans(&mut r, tokens.len() as Pos)?,
        None => Vec::new(),
    };
    let prefix = Prefix { tokens, images };
    match prefix.problem() {
        Some(why) => Err(bad.bad(why)),
        None => Ok(prefix),
    }
}

/// A whole entry file checked against the reading context: its prefix and state.
pub fn parse_prefix_file(
    path: &str,
    bytes: &[u8],
    limits: &Limits,
    here: &Fingerprint,
) -> Result<(Prefix, Vec<u8>)> {
    let sections = parse_container(path, bytes, Payload::Prefix, here)?;
    let r = sections.reader("tokens")?;
    let tokens = read_tokens(sections.reader("tokens")?, limits)?;
    let images = sections.reader("images").ok();
    let prefix = prefix_of(tokens, images, &r)?;
    let mut state = sections.reader("state")?;
    if state.remaining() == 0 {
        return Err(state.bad("an empty state"));
    }
    let state = state.take(state.remaining())?.to_vec();
    Ok((prefix, state))
}

/// An entry file's prefix and size, from its head only (a folder's listing; the checksum is
/// verified when the state is read with `parse_prefix_file`).
pub fn read_prefix_tokens(
    path: &str,
    limits: &Limits,
    here: &Fingerprint,
) -> Result<(Prefix, usize)> {
    let (tokens, size) = read_section(path, Payload::Prefix, here, "tokens")?;
    let r = Reader::new(&tokens, path, Payload::Prefix, "tokens");
    let tokens = read_tokens(
        Reader::new(&tokens, path, Payload::Prefix, "tokens"),
        limits,
    )?;
    // Only a prefix with images has the section: read it then (a second read of the head).
    let images = match tokens.contains(&IMAGE_POSITION) {
        true => Some(read_section(path, Payload::Prefix, here, "images")?.0),
        false => None,
    };
    let images = images
        .as_deref()
        .map(|b| Reader::new(b, path, Payload::Prefix, "images"));
    Ok((prefix_of(tokens, images, &r)?, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        n_ctx: 8,
        n_vocab: 100,
    };

    fn fp() -> Fingerprint {
        Fingerprint::new(1, 2, &[], "m", 4, "typeK=f16".into())
    }

    #[test]
    fn an_entry_round_trips_and_its_tokens_are_checked() {
        let bytes = prefix_file_bytes(&fp(), &text(&[5, 6, 7]), b"state bytes").unwrap();
        assert_eq!(prefix_file_size(&fp(), 3, &[], 11), bytes.len());
        let (prefix, state) = parse_prefix_file("f", &bytes, &LIMITS, &fp()).unwrap();
        assert_eq!((prefix, state), (text(&[5, 6, 7]), b"state bytes".to_vec()));
        let small = Limits {
            n_ctx: 2,
            n_vocab: 100,
        };
        let e = parse_prefix_file("f", &bytes, &small, &fp()).unwrap_err();
        assert_eq!(e.code(), "ERR_STATE_CORRUPT");
        let bad = prefix_file_bytes(&fp(), &text(&[5, 100]), b"s").unwrap();
        let e = parse_prefix_file("f", &bad, &LIMITS, &fp()).unwrap_err();
        assert!(e.to_string().contains("vocabulary"), "{e}");
        let empty = prefix_file_bytes(&fp(), &text(&[5]), b"").unwrap();
        let e = parse_prefix_file("f", &empty, &LIMITS, &fp()).unwrap_err();
        assert!(e.to_string().contains("empty state"), "{e}");
    }

    #[test]
    fn the_head_of_a_file_gives_its_tokens() {
        let path = std::env::temp_dir().join(format!("lb-prefix-{}.lbkv", std::process::id()));
        let path = path.to_str().unwrap();
        let bytes = prefix_file_bytes(&fp(), &text(&[1, 2, 3]), &[9; 100_000]).unwrap();
        std::fs::write(path, &bytes).unwrap();
        let read = read_prefix_tokens(path, &LIMITS, &fp()).unwrap();
        assert_eq!(read, (text(&[1, 2, 3]), bytes.len()));
        let bytes = prefix_file_bytes(&fp(), &with_image(), &[9; 1000]).unwrap();
        std::fs::write(path, &bytes).unwrap();
        let read = read_prefix_tokens(path, &LIMITS, &fp()).unwrap();
        assert_eq!(read, (with_image(), bytes.len()));
        std::fs::remove_file(path).unwrap();
    }

    fn text(tokens: &[Token]) -> Prefix {
        Prefix {
            tokens: tokens.to_vec(),
            images: Vec::new(),
        }
    }

    fn with_image() -> Prefix {
        Prefix {
            tokens: vec![5, -1, -1, -1, 6],
            images: vec![ImageSpan {
                start: 1,
                n_pos: 3,
                id: "ab".repeat(32).into(),
            }],
        }
    }

    #[test]
    fn an_entry_with_an_image_round_trips_and_its_positions_must_agree() {
        let bytes = prefix_file_bytes(&fp(), &with_image(), b"s").unwrap();
        assert_eq!(
            prefix_file_size(&fp(), 5, &with_image().images, 1),
            bytes.len()
        );
        let (prefix, _) = parse_prefix_file("f", &bytes, &LIMITS, &fp()).unwrap();
        assert_eq!(prefix, with_image());
        for bad in [
            Prefix {
                tokens: vec![5, -1, -1, 7, 6],
                ..with_image()
            },
            Prefix {
                tokens: vec![-1, -1, -1, -1, 6],
                ..with_image()
            },
            Prefix {
                images: vec![],
                ..with_image()
            },
        ] {
            let e = prefix_file_bytes(&fp(), &bad, b"s").unwrap_err();
            assert_eq!(e.code(), "ERR_INVALID_ARG", "{bad:?}");
        }
        // Written without its images section: corrupt, not a text prefix.
        let tokens: Vec<u8> = with_image()
            .tokens
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        let bytes = container_bytes(
            Payload::Prefix,
            &fp(),
            &[("tokens", &tokens), ("state", b"s")],
        );
        let e = parse_prefix_file("f", &bytes, &LIMITS, &fp()).unwrap_err();
        assert_eq!(e.code(), "ERR_STATE_CORRUPT");
    }
}
