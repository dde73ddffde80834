//! Bytes in and out: the little-endian primitives a saved-state payload writes its sections
//! with, and the bounds-checked reader that turns every bad byte into `ERR_STATE_CORRUPT`.

use super::Payload;
use crate::error::{Error, Result};
use crate::llama::Token;

/// A little-endian byte writer.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f32(&mut self, v: f32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    pub fn tokens(&mut self, t: &[Token]) {
        self.u32(t.len() as u32);
        for &x in t {
            self.i32(x);
        }
    }
    pub fn strs(&mut self, v: &[String]) {
        self.u32(v.len() as u32);
        for s in v {
            self.str(s);
        }
    }
    pub fn opt<T>(&mut self, v: &Option<T>, f: impl FnOnce(&mut Writer, &T)) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                f(self, x);
            }
        }
    }
}

/// A bounds-checked little-endian reader over one section (or the head): every failure is
/// `ERR_STATE_CORRUPT` naming the file, the section and the byte, never a panic.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// "<path> is not a usable <noun>", for messages.
    file: String,
    /// The section read ('' for the head).
    section: String,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], path: &str, payload: Payload, section: &str) -> Reader<'a> {
        Reader {
            bytes,
            at: 0,
            file: format!("{path} is not a usable {}", payload.noun()),
            section: section.to_string(),
        }
    }
    pub fn bad(&self, why: impl std::fmt::Display) -> Error {
        let place = if self.section.is_empty() {
            format!("at byte {}", self.at)
        } else {
            format!("at byte {} of its {} section", self.at, self.section)
        };
        Error::StateCorrupt(format!("{} ({why}, {place})", self.file))
    }
    /// True when every byte was read (payloads refuse trailing bytes).
    pub fn done(&self) -> bool {
        self.at == self.bytes.len()
    }
    /// Payloads refuse trailing bytes: corruption when any is left after `what`.
    pub fn end(&self, what: &str) -> Result<()> {
        match self.done() {
            true => Ok(()),
            false => Err(self.bad(format!("trailing bytes after {what}"))),
        }
    }
    /// Where the next read starts.
    pub fn pos(&self) -> usize {
        self.at
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() - self.at < n {
            return Err(self.bad("truncated"));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn f32(&mut self) -> Result<f32> {
        Ok(f32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    /// A count of items of at least `item` bytes each, checked against what is left (so a
    /// corrupt count never allocates more than the file holds).
    pub fn count(&mut self, item: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item.max(1)) > self.bytes.len() - self.at {
            return Err(self.bad(format!("a count of {n} runs past the end")));
        }
        Ok(n)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.count(1)?;
        self.take(n)
    }
    pub fn str(&mut self) -> Result<String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| self.bad("text that is not UTF-8"))
    }
    pub fn strs(&mut self) -> Result<Vec<String>> {
        let n = self.count(4)?;
        (0..n).map(|_| self.str()).collect()
    }
    pub fn token(&mut self, n_vocab: i32) -> Result<Token> {
        let t = self.i32()?;
        if t < 0 || t >= n_vocab {
            return Err(self.bad(format!("token {t} is outside this model's vocabulary")));
        }
        Ok(t)
    }
    pub fn tokens(&mut self, n_vocab: i32) -> Result<Vec<Token>> {
        let n = self.count(4)?;
        (0..n).map(|_| self.token(n_vocab)).collect()
    }
    pub fn flag(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            x => Err(self.bad(format!("flag {x}"))),
        }
    }
    /// What `Writer::opt` wrote: a flag, then the value when it is set.
    pub fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<Option<T>> {
        match self.flag()? {
            true => f(self).map(Some),
            false => Ok(None),
        }
    }
    /// A value a validator refused (`check`'s error, reworded as corruption of this file).
    pub fn valid<T>(&self, checked: Result<T>) -> Result<T> {
        checked.map_err(|e| self.bad(e))
    }
}
