'use strict';

/**
 * The prefix cache's files: the bytes of one stored prefix (its tokens and sequence state) and
 * the folder they live in. This is the whole boundary between the cache's policy
 * (./cache-tiers.js) and its saved-state format: `fingerprintOf`, `entryName`, `writeEntryFile`,
 * `readEntryFile`, `listEntryFiles`, `removeEntryFile`. Keep it that narrow: the format behind it
 * may change (a saved-state container written on the context's worker) without the cache knowing.
 *
 * Nothing stored is trusted:
 * - every state carries a fingerprint of what produced it (the model's size, parameter count
 *   and GGUF metadata, llama.cpp's state format version, the KV element types and attention
 *   layout); a file with another fingerprint is never loaded (ERR_CACHE_MISMATCH);
 * - a file is written to a temporary name, fsynced, then renamed: a reader never sees half of
 *   one, and a writer killed mid-write leaves a temporary file that a later listing removes;
 * - a SHA-256 over the file's bytes is its last 32 bytes, checked before a load: a truncated or
 *   corrupted file is never loaded (ERR_CACHE_CORRUPT).
 *
 * File layout (little-endian): 'LBKV', version u32, fingerprint (32 bytes), token count u32,
 * tokens (i32 each), state length (u32 low, u32 high), the state, SHA-256 of all before (32).
 * A file's name is a hash of the fingerprint and its tokens (`entryName`), so two processes on
 * one folder write the same prefix to the same name.
 */

const fs = require('node:fs');
const path = require('node:path');
const crypto = require('node:crypto');
const { nativeOf } = require('../Context');
const { makeError } = require('../errors');
const { SchedulerErrorCode: Code } = require('./errors');

const MAGIC = 0x564b424c; // 'LBKV' read as a little-endian u32
const VERSION = 1;
const SUFFIX = '.lbkv';
/** Fixed header bytes before the tokens. */
const HEAD = 4 + 4 + 32 + 4;
/** A temporary file older than this was left by a writer that died: removed at the next listing. */
const STALE_TEMP_MS = 10 * 60 * 1000;

/** SHA-256 of `data`, computed off the main thread (WebCrypto runs it in libuv's pool). */
async function sha256(data) {
  return Buffer.from(await crypto.webcrypto.subtle.digest('SHA-256', data));
}

/**
 * What identifies the states `ctx` writes: 32 bytes (see the file header). Two contexts with
 * the same fingerprint read each other's states.
 * @param {import('../Context').SessionContext} ctx
 */
function fingerprintOf(ctx) {
  // The fingerprint a saved branch tree carries (src/engine/fingerprint.rs): one definition.
  const { model, stateFormat, kv } = nativeOf(ctx)._stateIdentity();
  const fields = { format: `llama-branch-kv/${VERSION}`, model, stateFormat, kv };
  return crypto.createHash('sha256').update(JSON.stringify(fields)).digest();
}

/**
 * The file name of the prefix `tokens` stored under `fingerprint` (no folder).
 * @param {Buffer} fingerprint
 * @param {number[]} tokens
 */
function entryName(fingerprint, tokens) {
  const hash = crypto.createHash('sha256').update(fingerprint).update(Int32Array.from(tokens));
  return hash.digest('hex').slice(0, 40) + SUFFIX;
}

/** The size in bytes of the file `writeEntryFile` writes for `tokens` and `state`. */
function entrySize(tokens, state) {
  return HEAD + 4 * tokens.length + 8 + state.length + 32;
}

/** Creates the cache folder (and its parents) if it is not there; throws the file system's error. */
function makeFolder(dir) {
  fs.mkdirSync(dir, { recursive: true });
}

/** The bytes of a cache file (without its checksum) for `tokens` and `state`. */
function fileBody(fingerprint, tokens, state) {
  const head = Buffer.alloc(HEAD + 4 * tokens.length + 8);
  head.writeUInt32LE(MAGIC, 0);
  head.writeUInt32LE(VERSION, 4);
  fingerprint.copy(head, 8);
  head.writeUInt32LE(tokens.length, 40);
  for (let i = 0; i < tokens.length; i++) head.writeInt32LE(tokens[i], HEAD + 4 * i);
  const at = HEAD + 4 * tokens.length;
  head.writeUInt32LE(state.length % 2 ** 32, at);
  head.writeUInt32LE(Math.floor(state.length / 2 ** 32), at + 4);
  return Buffer.concat([head, state]);
}

/**
 * Reads a header (magic, version, fingerprint, tokens) from the first bytes of a file; throws
 * ERR_CACHE_CORRUPT / ERR_CACHE_MISMATCH.
 */
function parseHeader(bytes, fingerprint, file) {
  const corrupt = (why) =>
    makeError(Code.CACHE_CORRUPT, `${file} is not a usable prefix-cache file (${why}); it is skipped`);
  if (bytes.length < HEAD) throw corrupt('shorter than its header');
  if (bytes.readUInt32LE(0) !== MAGIC) throw corrupt('wrong magic number');
  if (bytes.readUInt32LE(4) !== VERSION)
    throw corrupt(`format version ${bytes.readUInt32LE(4)}, this build reads ${VERSION}`);
  if (!bytes.subarray(8, 40).equals(fingerprint))
    throw makeError(
      Code.CACHE_MISMATCH,
      `${file} holds a state from another model or KV layout (its fingerprint differs: other weights, llama.cpp state version, typeK/typeV or flash attention); it is not loaded. Use a separate cache folder per model and settings`,
    );
  const n = bytes.readUInt32LE(40);
  if (bytes.length < HEAD + 4 * n + 8) throw corrupt('truncated in its tokens');
  const tokens = new Array(n);
  for (let i = 0; i < n; i++) tokens[i] = bytes.readInt32LE(HEAD + 4 * i);
  const at = HEAD + 4 * n;
  const stateLength = bytes.readUInt32LE(at) + bytes.readUInt32LE(at + 4) * 2 ** 32;
  return { tokens, stateAt: at + 8, stateLength };
}

/**
 * Reads and checks a whole cache file: its checksum, header and fingerprint. Resolves
 * `{ tokens, state }`; rejects with ERR_CACHE_CORRUPT (truncated, corrupted, not a cache file)
 * or ERR_CACHE_MISMATCH (a state from another model or KV settings), or the file system's error.
 * @param {string} file
 * @param {Buffer} fingerprint what the reading context writes (see fingerprintOf)
 * @returns {Promise<{ tokens: number[], state: Buffer }>}
 */
async function readEntryFile(file, fingerprint) {
  const bytes = await fs.promises.readFile(file);
  if (bytes.length < HEAD + 8 + 32) throw makeError(Code.CACHE_CORRUPT, `${file} is truncated; it is skipped`);
  const body = bytes.subarray(0, bytes.length - 32);
  if (!(await sha256(body)).equals(bytes.subarray(bytes.length - 32)))
    throw makeError(Code.CACHE_CORRUPT, `${file} fails its checksum (truncated or corrupted); it is skipped`);
  const { tokens, stateAt, stateLength } = parseHeader(body, fingerprint, file);
  if (stateAt + stateLength !== body.length)
    throw makeError(Code.CACHE_CORRUPT, `${file} has a state of the wrong length; it is skipped`);
  return { tokens, state: body.subarray(stateAt) };
}

/** fsync of a folder (its entries), where the platform allows it (not on Windows). */
async function syncFolder(dir) {
  let fh;
  try {
    fh = await fs.promises.open(dir, 'r');
    await fh.sync();
  } catch {
    // best effort: the file itself is synced
  } finally {
    if (fh) await fh.close().catch(() => {});
  }
}

/**
 * Writes the prefix `tokens` with its `state` to `dir`/`entryName(...)` durably: a temporary
 * file, fsynced, renamed into place, the folder fsynced. Resolves the file's size in bytes;
 * rejects with the file system's error (a disk filling up, a read-only or deleted folder), having
 * removed its temporary file.
 * @param {string} dir
 * @param {Buffer} fingerprint
 * @param {number[]} tokens
 * @param {Buffer} state
 * @returns {Promise<number>}
 */
async function writeEntryFile(dir, fingerprint, tokens, state) {
  const bytes = fileBody(fingerprint, tokens, state);
  const sum = await sha256(bytes);
  const name = entryName(fingerprint, tokens);
  const temp = path.join(
    dir,
    `.${name.slice(0, -SUFFIX.length)}.${process.pid}.${crypto.randomBytes(4).toString('hex')}.tmp`,
  );
  try {
    const fh = await fs.promises.open(temp, 'w');
    try {
      // writeFile writes every byte or throws (a disk filling up mid-write: ENOSPC); writev
      // returns a short count without an error, and that file was renamed into place truncated.
      await fh.writeFile(bytes);
      await fh.writeFile(sum);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await fs.promises.rename(temp, path.join(dir, name));
    await syncFolder(dir); // the rename itself survives a crash
  } catch (err) {
    await fs.promises.unlink(temp).catch(() => {}); // a partial file (disk full) goes too
    throw err;
  }
  return bytes.length + sum.length;
}

/** Removes `dir`/`name` if it is there (another process may have removed it already). */
async function removeEntryFile(dir, name) {
  await fs.promises.unlink(path.join(dir, name)).catch(() => {});
}

async function removeStale(file) {
  try {
    const { mtimeMs } = await fs.promises.stat(file);
    if (Date.now() - mtimeMs > STALE_TEMP_MS) await fs.promises.unlink(file);
  } catch {
    // gone already, or not ours to remove
  }
}

/** The tokens in the header of `file` (it is not read further), checked against its name. */
async function readEntryHead(file, name, fingerprint, maxTokens) {
  const fh = await fs.promises.open(file, 'r');
  let head;
  let size;
  try {
    size = (await fh.stat()).size;
    const first = Buffer.alloc(HEAD);
    await fh.read(first, 0, HEAD, 0);
    const n = first.readUInt32LE(40);
    if (first.readUInt32LE(0) === MAGIC && n <= maxTokens) {
      head = Buffer.alloc(HEAD + 4 * n + 8);
      await fh.read(head, 0, head.length, 0);
    } else {
      head = first;
    }
  } finally {
    await fh.close();
  }
  const { tokens } = parseHeader(head, fingerprint, file);
  if (tokens.length > maxTokens || entryName(fingerprint, tokens) !== name)
    throw makeError(Code.CACHE_CORRUPT, `${file} does not match its name or this context's nCtx; it is skipped`);
  return { name, tokens, size };
}

/**
 * Lists `dir`'s cache files, reading only their headers (states load on demand with
 * `readEntryFile`), and removes temporary files that writers killed mid-write left. `skip(name)`:
 * files the caller knows already, not read again. Resolves null when the folder has not changed
 * since `stamp` (a previous listing's), else `{ stamp, found, refused }`: `found` the files with
 * their tokens and size, `refused` the files that cannot be used with why (ERR_CACHE_CORRUPT,
 * ERR_CACHE_MISMATCH). Rejects when the folder cannot be read.
 * @param {string} dir
 * @param {Buffer} fingerprint
 * @param {{ maxTokens: number, skip: (name: string) => boolean, stamp?: number }} options
 * @returns {Promise<{ stamp: number, found: { name: string, tokens: number[], size: number }[], refused: { name: string, error: Error }[] } | null>}
 */
async function listEntryFiles(dir, fingerprint, { maxTokens, skip, stamp = -1 }) {
  const { mtimeMs } = await fs.promises.stat(dir);
  if (mtimeMs === stamp) return null;
  const names = await fs.promises.readdir(dir);
  const found = [];
  const refused = [];
  for (const name of names) {
    const file = path.join(dir, name);
    if (name.endsWith('.tmp')) {
      await removeStale(file);
      continue;
    }
    if (!name.endsWith(SUFFIX) || skip(name)) continue;
    try {
      found.push(await readEntryHead(file, name, fingerprint, maxTokens));
    } catch (err) {
      if (/** @type {any} */ (err).code === 'ENOENT') continue; // removed by another process meanwhile
      refused.push({ name, error: /** @type {Error} */ (err) });
    }
  }
  return { stamp: mtimeMs, found, refused };
}

module.exports = {
  fingerprintOf,
  entryName,
  entrySize,
  makeFolder,
  writeEntryFile,
  readEntryFile,
  listEntryFiles,
  removeEntryFile,
};
