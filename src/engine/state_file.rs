//! Sequence state files: the layout of llama.cpp's `llama_state_seq_save_file` (so files
//! interoperate with llama.cpp tools), written and parsed here rather than by llama.cpp, whose
//! file loader asserts (aborts the process) on some truncated files. Pure: unit-tested on bytes.

use crate::error::{Error, Result};
use crate::llama::{SeqId, Token, SEQ_FILE_MAGIC, SEQ_FILE_VERSION, SEQ_STATE_MAGIC};

/// The bytes of a state file holding `tokens` and a state from `Context::seq_state`.
pub fn state_file_bytes(tokens: &[Token], state: &[u8]) -> Vec<u8> {
    let body = &state[8..]; // without the in-memory (magic, seq id) prefix
    let mut out = Vec::with_capacity(12 + 4 * tokens.len() + body.len());
    out.extend_from_slice(&SEQ_FILE_MAGIC.to_le_bytes());
    out.extend_from_slice(&SEQ_FILE_VERSION.to_le_bytes());
    out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// Parses a state file into its tokens and an in-memory state buffer (as `Context::seq_state`
/// makes) for sequence `seq`.
pub fn parse_state_file(
    path: &str,
    bytes: &[u8],
    seq: SeqId,
    n_ctx: u32,
    n_vocab: i32,
) -> Result<(Vec<Token>, Vec<u8>)> {
    let not_state = |why: &str| {
        Error::State(format!(
            "{path} is not a usable sequence state file written by kvCacheWriteFile ({why})"
        ))
    };
    if bytes.len() < 12 {
        return Err(not_state("shorter than its 12-byte header"));
    }
    let word = |i: usize| u32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap());
    if word(0) != SEQ_FILE_MAGIC {
        return Err(not_state("wrong magic number"));
    }
    if word(1) != SEQ_FILE_VERSION {
        return Err(not_state(&format!(
            "format version {}, this build reads version {}",
            word(1),
            SEQ_FILE_VERSION
        )));
    }
    let n_tokens = word(2) as usize;
    if n_tokens > n_ctx as usize {
        return Err(not_state(&format!(
            "it lists {n_tokens} tokens, more than nCtx = {n_ctx}"
        )));
    }
    let state_at = 12 + 4 * n_tokens;
    if state_at >= bytes.len() {
        return Err(not_state("truncated before its state data"));
    }
    let tokens = bytes[12..state_at]
        .chunks_exact(4)
        .map(|b| {
            let t = i32::from_le_bytes(b.try_into().unwrap());
            if t < 0 || t >= n_vocab {
                Err(not_state(&format!(
                    "token {t} is outside this model's vocabulary"
                )))
            } else {
                Ok(t)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let mut state = Vec::with_capacity(8 + bytes.len() - state_at);
    state.extend_from_slice(&SEQ_STATE_MAGIC.to_le_bytes());
    state.extend_from_slice(&seq.to_le_bytes());
    state.extend_from_slice(&bytes[state_at..]);
    Ok((tokens, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_state(seq: i32, body: &[u8]) -> Vec<u8> {
        let mut s = SEQ_STATE_MAGIC.to_le_bytes().to_vec();
        s.extend_from_slice(&seq.to_le_bytes());
        s.extend_from_slice(body);
        s
    }

    #[test]
    fn state_file_round_trips_tokens_and_state_for_any_destination() {
        let file = state_file_bytes(&[1, 2, 3], &fake_state(0, b"cells"));
        assert_eq!(
            &file[..4],
            b"qsgg",
            "llama.cpp's 'ggsq' magic, little-endian"
        );
        assert_eq!(file.len(), 12 + 3 * 4 + 5);
        let (tokens, state) = parse_state_file("f", &file, 2, 16, 10).unwrap();
        assert_eq!(tokens, vec![1, 2, 3]);
        assert_eq!(state, fake_state(2, b"cells"));
    }

    #[test]
    fn state_file_without_tokens_parses() {
        let file = state_file_bytes(&[], &fake_state(0, b"x"));
        let (tokens, state) = parse_state_file("f", &file, 0, 16, 10).unwrap();
        assert!(tokens.is_empty());
        assert_eq!(state, fake_state(0, b"x"));
    }

    #[test]
    fn malformed_state_files_are_state_errors() {
        let good = state_file_bytes(&[1, 2], &fake_state(0, b"cells"));
        let parse = |bytes: &[u8]| parse_state_file("f", bytes, 0, 16, 10).unwrap_err();
        let mut wrong_magic = good.clone();
        wrong_magic[0] ^= 1;
        let mut wrong_version = good.clone();
        wrong_version[4] = 9;
        let mut too_many = good.clone();
        too_many[8..12].copy_from_slice(&17u32.to_le_bytes());
        let mut bad_token = good.clone();
        bad_token[12..16].copy_from_slice(&10i32.to_le_bytes());
        let cases: Vec<(&[u8], &str)> = vec![
            (&good[..11], "header"),
            (&wrong_magic, "magic"),
            (&wrong_version, "version 9"),
            (&too_many, "more than nCtx"),
            (&good[..20], "truncated"),
            (&bad_token, "vocabulary"),
        ];
        for (bytes, why) in cases {
            let e = parse(bytes);
            assert_eq!(e.code(), "ERR_STATE");
            assert!(e.to_string().contains(why), "{e} should mention {why}");
        }
    }
}
