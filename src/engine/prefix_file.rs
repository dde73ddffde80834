//! Prefix-cache entry files (the Scheduler's disk tier, lib/scheduler/cache-file.js): the
//! payload of a saved-state container (engine/saved_state.rs). Pure: unit-tested on bytes.
//!
//! Sections:
//! ```text
//! tokens  the prefix, i32 each (little-endian)
//! state   the sequence state of those tokens' cells, as `Context::seq_state` makes it
//! ```

use super::fingerprint::Fingerprint;
use super::saved_state::{
    container_bytes, container_size, parse_container, read_section, Payload, Reader,
};
use crate::error::Result;
use crate::llama::Token;

/// The whole file for the prefix `tokens` holding `state`.
pub fn prefix_file_bytes(fingerprint: &Fingerprint, tokens: &[Token], state: &[u8]) -> Vec<u8> {
    let tokens: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    container_bytes(
        Payload::Prefix,
        fingerprint,
        &[("tokens", &tokens), ("state", state)],
    )
}

/// The size of the file `prefix_file_bytes` writes for `n_tokens` tokens and `state_len` bytes.
pub fn prefix_file_size(fingerprint: &Fingerprint, n_tokens: usize, state_len: usize) -> usize {
    container_size(
        Payload::Prefix,
        fingerprint,
        &[("tokens", 4 * n_tokens), ("state", state_len)],
    )
}

/// What the reading context allows in a file.
pub struct PrefixLimits {
    pub n_ctx: u32,
    pub n_vocab: i32,
}

fn read_tokens(mut r: Reader, limits: &PrefixLimits) -> Result<Vec<Token>> {
    if !r.remaining().is_multiple_of(4) || r.remaining() / 4 > limits.n_ctx as usize {
        return Err(r.bad(format!(
            "{} bytes of tokens, not whole tokens within nCtx = {}",
            r.remaining(),
            limits.n_ctx
        )));
    }
    (0..r.remaining() / 4)
        .map(|_| r.token(limits.n_vocab))
        .collect()
}

/// A whole entry file checked against the reading context: its tokens and state.
pub fn parse_prefix_file(
    path: &str,
    bytes: &[u8],
    limits: &PrefixLimits,
    here: &Fingerprint,
) -> Result<(Vec<Token>, Vec<u8>)> {
    let sections = parse_container(path, bytes, Payload::Prefix, here)?;
    let tokens = read_tokens(sections.reader("tokens")?, limits)?;
    let mut state = sections.reader("state")?;
    if state.remaining() == 0 {
        return Err(state.bad("an empty state"));
    }
    let state = state.take(state.remaining())?.to_vec();
    Ok((tokens, state))
}

/// An entry file's tokens and size, from its head only (a folder's listing; the checksum is
/// verified when the state is read with `parse_prefix_file`).
pub fn read_prefix_tokens(
    path: &str,
    limits: &PrefixLimits,
    here: &Fingerprint,
) -> Result<(Vec<Token>, usize)> {
    let (tokens, size) = read_section(path, Payload::Prefix, here, "tokens")?;
    let r = Reader::new(&tokens, path, Payload::Prefix, "tokens");
    Ok((read_tokens(r, limits)?, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: PrefixLimits = PrefixLimits {
        n_ctx: 8,
        n_vocab: 100,
    };

    fn fp() -> Fingerprint {
        Fingerprint::new(1, 2, &[], "m", 4, "typeK=f16".into())
    }

    #[test]
    fn an_entry_round_trips_and_its_tokens_are_checked() {
        let bytes = prefix_file_bytes(&fp(), &[5, 6, 7], b"state bytes");
        assert_eq!(prefix_file_size(&fp(), 3, 11), bytes.len());
        let (tokens, state) = parse_prefix_file("f", &bytes, &LIMITS, &fp()).unwrap();
        assert_eq!((tokens, state), (vec![5, 6, 7], b"state bytes".to_vec()));
        let small = PrefixLimits {
            n_ctx: 2,
            n_vocab: 100,
        };
        let e = parse_prefix_file("f", &bytes, &small, &fp()).unwrap_err();
        assert_eq!(e.code(), "ERR_STATE_CORRUPT");
        let bad = prefix_file_bytes(&fp(), &[5, 100], b"s");
        let e = parse_prefix_file("f", &bad, &LIMITS, &fp()).unwrap_err();
        assert!(e.to_string().contains("vocabulary"), "{e}");
        let empty = prefix_file_bytes(&fp(), &[5], b"");
        let e = parse_prefix_file("f", &empty, &LIMITS, &fp()).unwrap_err();
        assert!(e.to_string().contains("empty state"), "{e}");
    }

    #[test]
    fn the_head_of_a_file_gives_its_tokens() {
        let path = std::env::temp_dir().join(format!("lb-prefix-{}.lbkv", std::process::id()));
        let path = path.to_str().unwrap();
        let bytes = prefix_file_bytes(&fp(), &[1, 2, 3], &[9; 100_000]);
        std::fs::write(path, &bytes).unwrap();
        let read = read_prefix_tokens(path, &LIMITS, &fp()).unwrap();
        assert_eq!(read, (vec![1, 2, 3], bytes.len()));
        std::fs::remove_file(path).unwrap();
    }
}
