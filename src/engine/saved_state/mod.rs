//! The one saved-state container: every file llama-branch writes a state into (a branch tree
//! from `store.saveTree`, a prefix-cache entry from the Scheduler's disk tier) is this layout
//! with its own payload in named sections. Here, once: the header, the version, the
//! fingerprint check (`ERR_STATE_MISMATCH`), the checksum and every bounds check
//! (`ERR_STATE_CORRUPT`), the atomic write. Pure apart from the file calls at the end:
//! unit-tested on bytes without a model.
//!
//! Layout (little-endian):
//! ```text
//! "LBSTATE\0"  u32 version  str payload ("tree", "prefix")
//! fingerprint: u64 model, str model name, u32 state format, str kv settings
//! u32 section count, then each section's str name and u64 length
//! the sections' bytes, in that order
//! u64 checksum of every byte before it
//! ```
//! `str` is a u32 length and UTF-8 bytes. Everything up to the section table is the head: small,
//! so a folder of large files can be listed by reading heads only (`parse_head`).

use std::io::{Read, Write};
use std::path::Path;

use super::fingerprint::Fingerprint;
use crate::error::{Error, Result};

mod bytes;
pub use bytes::{Reader, Writer};

const MAGIC: &[u8; 8] = b"LBSTATE\0";
pub const VERSION: u32 = 1;
/// Bytes at most before the first section: a head longer than this is not ours.
const MAX_HEAD: usize = 64 * 1024;

/// What the reading context allows in a payload.
pub struct Limits {
    pub n_ctx: u32,
    pub n_vocab: i32,
}

/// What a container holds: its payload tag in the file, and how messages name such a file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Payload {
    Tree,
    Prefix,
    Parked,
}

impl Payload {
    fn tag(self) -> &'static str {
        match self {
            Payload::Tree => "tree",
            Payload::Prefix => "prefix",
            Payload::Parked => "parked",
        }
    }
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Payload::Tree => "branch tree file",
            Payload::Prefix => "prefix-cache file",
            Payload::Parked => "parked branch's spill file",
        }
    }
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
// The container

/// The whole file for `payload`'s `sections` (name, bytes) under `fingerprint`, checksum included.
pub fn container_bytes(
    payload: Payload,
    fingerprint: &Fingerprint,
    sections: &[(&str, &[u8])],
) -> Vec<u8> {
    let body: usize = sections.iter().map(|(_, b)| b.len()).sum();
    let mut w = Writer(Vec::with_capacity(body + 1024));
    w.0.extend_from_slice(MAGIC);
    w.u32(VERSION);
    w.str(payload.tag());
    w.u64(fingerprint.model);
    w.str(&fingerprint.model_name);
    w.u32(fingerprint.state_format);
    w.str(&fingerprint.kv);
    w.u32(sections.len() as u32);
    for (name, bytes) in sections {
        w.str(name);
        w.u64(bytes.len() as u64);
    }
    for (_, bytes) in sections {
        w.0.extend_from_slice(bytes);
    }
    let sum = checksum(&w.0);
    w.u64(sum);
    w.0
}

/// The size of the file `container_bytes` makes for sections of these (name, length)s.
pub fn container_size(
    payload: Payload,
    fingerprint: &Fingerprint,
    sections: &[(&str, usize)],
) -> usize {
    let str_len = |s: &str| 4 + s.len();
    let head = MAGIC.len() + 4 + str_len(payload.tag()) + 8 + str_len(&fingerprint.model_name) + 4;
    let table: usize = sections
        .iter()
        .map(|(name, len)| str_len(name) + 8 + len)
        .sum();
    head + str_len(&fingerprint.kv) + 4 + table + 8
}

/// A container's head: its fingerprint and where each section lies in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    pub fingerprint: Fingerprint,
    /// Each section's name, offset and length, in file order.
    pub sections: Vec<(String, usize, usize)>,
    /// Where the sections end (the checksum follows).
    pub end: usize,
}

/// The head of a container from the first bytes of a file (`file_len` in all): magic, version,
/// payload and a section table that fits the file. Not the checksum, nor the fingerprint.
fn read_head(path: &str, first: &[u8], file_len: usize, payload: Payload) -> Result<Head> {
    let mut r = Reader::new(first, path, payload, "");
    if first.len() < MAGIC.len() || &first[..MAGIC.len()] != MAGIC {
        return Err(r.bad("no saved-state header: not a llama-branch state file, or one written by an older version"));
    }
    r.take(MAGIC.len())?;
    let version = r.u32()?;
    if version != VERSION {
        return Err(r.bad(format!(
            "format version {version}, this build reads version {VERSION}"
        )));
    }
    let tag = r.str()?;
    if tag != payload.tag() {
        return Err(r.bad(format!(
            "it holds a '{tag}' payload, not a '{}'",
            payload.tag()
        )));
    }
    let fingerprint = Fingerprint {
        model: r.u64()?,
        model_name: r.str()?,
        state_format: r.u32()?,
        kv: r.str()?,
    };
    let n = r.count(12)?;
    let mut sections = Vec::with_capacity(n);
    let mut table = Vec::with_capacity(n);
    for _ in 0..n {
        table.push((r.str()?, r.u64()?));
    }
    let mut at = r.pos();
    for (name, len) in table {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > file_len.saturating_sub(at + 8) {
            return Err(r.bad(format!(
                "section {name} of {len} bytes runs past the end: the file is truncated"
            )));
        }
        sections.push((name, at, len));
        at += len;
    }
    Ok(Head {
        fingerprint,
        sections,
        end: at,
    })
}

/// A checked container: its sections' bytes by name.
pub struct Sections<'a> {
    bytes: &'a [u8],
    head: Head,
    path: &'a str,
    payload: Payload,
}

impl<'a> Sections<'a> {
    /// The fingerprint the file was saved under (equal to the reader's).
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.head.fingerprint
    }

    /// A reader over section `name`; a missing section is corruption.
    pub fn reader(&self, name: &str) -> Result<Reader<'a>> {
        let (_, at, len) = self
            .head
            .sections
            .iter()
            .find(|(n, _, _)| n == name)
            .ok_or_else(|| {
                Error::StateCorrupt(format!(
                    "{} is not a usable {} (it has no {name} section)",
                    self.path,
                    self.payload.noun()
                ))
            })?;
        Ok(Reader::new(
            &self.bytes[*at..at + len],
            self.path,
            self.payload,
            name,
        ))
    }
}

/// Checks a whole container against this context's fingerprint (`here`): magic, version,
/// checksum (a truncated or corrupt file is `ERR_STATE_CORRUPT`), payload, fingerprint (another
/// model or KV layout is `ERR_STATE_MISMATCH`, checked after the checksum so that a damaged file
/// is never called foreign).
pub fn parse_container<'a>(
    path: &'a str,
    bytes: &'a [u8],
    payload: Payload,
    here: &Fingerprint,
) -> Result<Sections<'a>> {
    let head = read_head(
        path,
        &bytes[..bytes.len().min(MAX_HEAD)],
        bytes.len(),
        payload,
    )?;
    let r = Reader::new(bytes, path, payload, "");
    if bytes.len() != head.end + 8 {
        return Err(r.bad(format!(
            "{} bytes where its sections and checksum take {}: the file is truncated or corrupt",
            bytes.len(),
            head.end + 8
        )));
    }
    let stored = u64::from_le_bytes(bytes[head.end..].try_into().unwrap());
    if checksum(&bytes[..head.end]) != stored {
        return Err(r.bad("its checksum does not match: the file is truncated or corrupt"));
    }
    head.fingerprint.check_matches(here, path)?;
    Ok(Sections {
        bytes,
        head,
        path,
        payload,
    })
}

// ---------------------------------------------------------------------------------------------
// Files

/// Checks a path argument before any file call (`where_` names the call in the message).
pub fn check_path(where_: &str, path: &str) -> Result<()> {
    if path.is_empty() {
        return Err(Error::invalid(format!(
            "{where_}: path must be a non-empty file path"
        )));
    }
    Ok(())
}

fn cannot(path: &str, err: impl std::fmt::Display) -> Error {
    Error::invalid(format!("cannot open the state file {path}: {err}"))
}

/// Opens a regular file for reading (a folder or a device is an argument error).
fn open_regular(path: &str) -> Result<(std::fs::File, usize)> {
    let file = std::fs::File::open(path).map_err(|e| cannot(path, e))?;
    let meta = file.metadata().map_err(|e| cannot(path, e))?;
    if !meta.is_file() {
        return Err(cannot(path, "not a regular file"));
    }
    Ok((file, meta.len() as usize))
}

/// Reads a whole state file (then `parse_container`).
pub fn read_file(path: &str) -> Result<Vec<u8>> {
    let (mut file, len) = open_regular(path)?;
    let mut bytes = Vec::with_capacity(len);
    file.read_to_end(&mut bytes).map_err(|e| cannot(path, e))?;
    Ok(bytes)
}

/// The head of a state file and the bytes of its section `name`, without reading the rest or
/// verifying the checksum (a later full read does): for listing a folder of large files. The
/// fingerprint is checked (`ERR_STATE_MISMATCH`). Resolves the section and the file's size.
pub fn read_section(
    path: &str,
    payload: Payload,
    here: &Fingerprint,
    name: &str,
) -> Result<(Vec<u8>, usize)> {
    let (mut file, len) = open_regular(path)?;
    let mut first = vec![0; len.min(MAX_HEAD)];
    file.read_exact(&mut first).map_err(|e| cannot(path, e))?;
    let head = read_head(path, &first, len, payload)?;
    head.fingerprint.check_matches(here, path)?;
    let (_, at, n) = head
        .sections
        .iter()
        .find(|(n, _, _)| n == name)
        .cloned()
        .ok_or_else(|| {
            Error::StateCorrupt(format!(
                "{path} is not a usable {} (it has no {name} section)",
                payload.noun()
            ))
        })?;
    let mut out = vec![0; n];
    if at + n <= first.len() {
        out.copy_from_slice(&first[at..at + n]);
    } else {
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(at as u64))
            .and_then(|_| file.read_exact(&mut out))
            .map_err(|e| cannot(path, e))?;
    }
    Ok((out, len))
}

/// Writes `bytes` to `path` so that `path` is either its old self or the whole new file: a
/// temporary file beside it (`.<name>.<pid>-<nanos>.tmp`, which a folder's reader may remove
/// once stale), fsync, rename over it, fsync of the folder so that the rename survives a crash
/// (best effort: not every platform can sync a folder). A failure removes the temporary file.
pub fn write_atomically(path: &str, bytes: &[u8]) -> Result<()> {
    let fail =
        |e: std::io::Error| Error::invalid(format!("cannot write the state file {path}: {e}"));
    let target = Path::new(path);
    let name = target
        .file_name()
        .ok_or_else(|| Error::invalid(format!("{path} names no file")))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = target.with_file_name(format!(
        ".{}.{}-{nanos}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    // write_all writes every byte or fails (a disk filling up mid-write: ENOSPC), so no short
    // file is ever renamed into place.
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, target)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(kv: &str) -> Fingerprint {
        Fingerprint::new(1, 2, &[], "test model", 4, kv.into())
    }

    fn sample() -> Vec<u8> {
        let a: Vec<u8> = (0..100u8).collect();
        container_bytes(
            Payload::Prefix,
            &fp("typeK=f16"),
            &[("tokens", &[1, 2, 3, 4]), ("state", &a), ("empty", &[])],
        )
    }

    fn parse(bytes: &[u8]) -> Result<Sections<'_>> {
        parse_container("f", bytes, Payload::Prefix, &fp("typeK=f16"))
    }

    #[test]
    fn sections_round_trip() {
        let bytes = sample();
        let sizes = [("tokens", 4), ("state", 100), ("empty", 0)];
        assert_eq!(
            container_size(Payload::Prefix, &fp("typeK=f16"), &sizes),
            bytes.len()
        );
        let s = parse(&bytes).unwrap();
        assert_eq!(s.reader("tokens").unwrap().take(4).unwrap(), &[1, 2, 3, 4]);
        let mut state = s.reader("state").unwrap();
        assert_eq!(
            state.take(100).unwrap(),
            &(0..100u8).collect::<Vec<_>>()[..]
        );
        assert!(state.done());
        assert!(s.reader("empty").unwrap().done());
        let e = s.reader("missing").err().unwrap();
        assert_eq!(e.code(), "ERR_STATE_CORRUPT");
    }

    #[test]
    fn a_bad_magic_or_another_version_or_payload_is_corrupt() {
        let mut bad_magic = sample();
        bad_magic[0] = b'X';
        let mut old = sample();
        old[8..12].copy_from_slice(&2u32.to_le_bytes());
        let tree = container_bytes(Payload::Tree, &fp("typeK=f16"), &[]);
        let lbkv = b"LBKV\x01\0\0\0 an old prefix-cache file".to_vec();
        for (bytes, why) in [
            (bad_magic, "no saved-state header"),
            (old, "version 2"),
            (tree, "'tree' payload"),
            (lbkv, "no saved-state header"),
        ] {
            let e = parse(&bytes).err().unwrap();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "{e}");
            assert!(e.to_string().contains(why), "{e} should say {why}");
            assert!(e.to_string().contains("prefix-cache file"), "{e}");
        }
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_corrupt() {
        let bytes = sample();
        for n in 0..bytes.len() {
            let e = parse(&bytes[..n]).err().unwrap();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "truncated to {n}: {e}");
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            let e = parse(&bad).err().unwrap();
            assert_eq!(e.code(), "ERR_STATE_CORRUPT", "byte {i} flipped: {e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(parse(&longer).err().unwrap().code(), "ERR_STATE_CORRUPT");
    }

    #[test]
    fn another_fingerprint_is_a_mismatch_naming_it() {
        let bytes = sample();
        let e = parse_container("f", &bytes, Payload::Prefix, &fp("typeK=q8_0"))
            .err()
            .unwrap();
        assert_eq!(e.code(), "ERR_STATE_MISMATCH");
        assert!(e.to_string().contains("typeK=q8_0"), "{e}");
    }

    #[test]
    fn a_section_is_read_from_the_head_of_a_file_and_the_writer_is_atomic() {
        let dir = std::env::temp_dir().join(format!("lb-saved-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("entry.lbkv");
        let path = path.to_str().unwrap();
        let bytes = sample();
        write_atomically(path, &bytes).unwrap();
        write_atomically(path, &bytes).unwrap(); // over an existing file
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        assert_eq!(read_file(path).unwrap(), bytes);
        let (tokens, len) =
            read_section(path, Payload::Prefix, &fp("typeK=f16"), "tokens").unwrap();
        assert_eq!((tokens, len), (vec![1, 2, 3, 4], bytes.len()));
        let e = read_section(path, Payload::Prefix, &fp("typeK=q8_0"), "tokens").unwrap_err();
        assert_eq!(e.code(), "ERR_STATE_MISMATCH");
        std::fs::write(path, &bytes[..20]).unwrap();
        let e = read_section(path, Payload::Prefix, &fp("typeK=f16"), "tokens").unwrap_err();
        assert_eq!(e.code(), "ERR_STATE_CORRUPT");
        let e = read_file(dir.to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = write_atomically(dir.join("missing/x").to_str().unwrap(), &bytes).unwrap_err();
        assert_eq!(e.code(), "ERR_INVALID_ARG");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
