'use strict';

/**
 * The prefix cache's files: one stored prefix (its tokens and sequence state) per file, and the
 * folder they live in. This is the whole boundary between the cache's policy (./prefix-cache.js)
 * and its saved-state format: `fingerprintOf` (./prefix-cache.js `tiersOn`), `makeFolder`, `entrySize`,
 * `writeEntryFile`, `readEntryFile`, `listEntryFiles`, `removeEntryFile` (and `entryName`, for
 * tests and tools). Files are named by `name` strings the cache only passes back.
 *
 * The format is the one saved-state container that branch tree files use too, written and
 * checked in Rust (src/engine/saved_state/, the entry payload src/engine/prefix_file.rs) by jobs
 * on the context's worker thread (`_prefixFileWrite`, `_prefixFileRead`, `_prefixFileTokens`),
 * never on the event loop. Nothing stored is trusted:
 * - every file carries the fingerprint of the context that wrote it (the model's size,
 *   parameter count and GGUF metadata, llama.cpp's state format version, the KV element types
 *   and attention layout); a file with another fingerprint is never loaded (ERR_STATE_MISMATCH);
 * - a file is written to a temporary name, fsynced, renamed, and its folder fsynced: a reader
 *   never sees half of one, and a writer killed mid-write leaves a temporary file that a later
 *   listing removes;
 * - a checksum of the file's bytes ends it and is checked before a load: a truncated or
 *   corrupted file, or one of another format (the 'LBKV' files of earlier versions), is never
 *   loaded (ERR_STATE_CORRUPT).
 * A file's name is a hash of the fingerprint and its tokens (`entryName`), so two processes on
 * one folder write the same prefix to the same name. A prefix with images: the cache's tokens
 * key each image by its bytes (./image-keys.js); the file holds -1 at its positions and the
 * images (place and id) in a section of their own, and reading keys them again.
 */

const fs = require('node:fs');
const path = require('node:path');
const crypto = require('node:crypto');
const { nativeOf } = require('../Context');
const { makeError } = require('../errors');
const { toFile, fromFile } = require('./image-keys');

/** @typedef {import('./image-keys').ImageSpan} ImageSpan */

const SUFFIX = '.lbkv';
/** A temporary file older than this was left by a writer that died: removed at the next listing. */
const STALE_TEMP_MS = 10 * 60 * 1000;

/**
 * The states a context writes and reads: `native`, its native context, whose worker jobs read
 * and write the files (`_prefixFileWrite`, `_prefixFileRead`, `_prefixFileTokens`, checking each
 * file's fingerprint against its own) and `_prefixFileSize`; and `id`, a hash of its fingerprint
 * that names the files. Two contexts with the same `id` read each other's files.
 * @typedef {{ native: any, id: Buffer }} EntryFingerprint
 */

/**
 * The fingerprint of the states `ctx` writes (see EntryFingerprint).
 * @param {import('../Context').SessionContext} ctx
 * @returns {EntryFingerprint}
 */
function fingerprintOf(ctx) {
  const native = nativeOf(ctx);
  // The fingerprint every saved state carries (src/engine/fingerprint.rs): one definition.
  const { model, stateFormat, kv } = native._stateIdentity();
  const fields = { format: 'llama-branch-state/1', model, stateFormat, kv };
  return { native, id: crypto.createHash('sha256').update(JSON.stringify(fields)).digest() };
}

/**
 * The file name of the prefix `tokens` stored under `fingerprint` (no folder).
 * @param {EntryFingerprint} fingerprint
 * @param {number[]} tokens
 */
function entryName(fingerprint, tokens) {
  const hash = crypto.createHash('sha256').update(fingerprint.id).update(Int32Array.from(tokens));
  return hash.digest('hex').slice(0, 40) + SUFFIX;
}

/**
 * The size in bytes of the file `writeEntryFile` writes for `tokens`, `state` and `images`.
 * @param {EntryFingerprint} fingerprint
 * @param {number[]} tokens
 * @param {Buffer} state
 * @param {ImageSpan[]} [images]
 */
function entrySize(fingerprint, tokens, state, images = []) {
  return fingerprint.native._prefixFileSize(tokens.length, state.length, images);
}

/** Creates the cache folder (and its parents) if it is not there; throws the file system's error. */
function makeFolder(dir) {
  fs.mkdirSync(dir, { recursive: true });
}

/**
 * Runs a native file job on `file`; a file that is not there rejects with the file system's
 * ENOENT (as `fs` would: another process removed it), whatever the native message says.
 * @template T
 * @param {string} file
 * @param {() => Promise<T>} job
 * @returns {Promise<T>}
 */
async function onFile(file, job) {
  try {
    return await job();
  } catch (err) {
    if (/** @type {any} */ (err).code === 'ERR_INVALID_ARG') await fs.promises.stat(file); // ENOENT if gone
    throw err;
  }
}

/**
 * Reads and checks a whole cache file on the context's worker: its checksum, format and
 * fingerprint. Resolves `{ tokens, images, state }` (image positions keyed again, ./image-keys.js); rejects with ERR_STATE_CORRUPT (truncated,
 * corrupted, not a cache file) or ERR_STATE_MISMATCH (a state from another model or KV
 * settings), or the file system's error (ENOENT; ERR_INVALID_ARG with its reason).
 * @param {string} file
 * @param {EntryFingerprint} fingerprint the reading context's (see fingerprintOf)
 * @returns {Promise<{ tokens: number[], images: ImageSpan[], state: Buffer }>}
 */
async function readEntryFile(file, fingerprint) {
  const { tokens, images, state } = await onFile(file, () => fingerprint.native._prefixFileRead(file));
  return { tokens: fromFile(tokens, images), images, state };
}

/**
 * Writes the prefix `tokens` (with `images` among them) and its `state` to `dir`/`entryName(...)` durably, on the
 * context's worker: a temporary file, fsynced, renamed into place, the folder fsynced. Resolves
 * the file's name and size in bytes; rejects with the file system's reason (a disk filling up, a
 * read-only or deleted folder), having removed its temporary file.
 * @param {string} dir
 * @param {EntryFingerprint} fingerprint
 * @param {number[]} tokens
 * @param {Buffer} state
 * @param {ImageSpan[]} [images]
 * @returns {Promise<{ name: string, size: number }>}
 */
async function writeEntryFile(dir, fingerprint, tokens, state, images = []) {
  const name = entryName(fingerprint, tokens);
  const size = await fingerprint.native._prefixFileWrite(path.join(dir, name), toFile(tokens), state, images);
  return { name, size };
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

/** The tokens and images in the head of `file` (its state is not read), checked against its name. */
async function readEntryHead(file, name, fingerprint, maxTokens) {
  const head = await onFile(file, () => fingerprint.native._prefixFileTokens(file));
  const tokens = fromFile(head.tokens, head.images);
  if (tokens.length > maxTokens || entryName(fingerprint, tokens) !== name)
    throw makeError('ERR_STATE_CORRUPT', `${file} does not match its name or this context's nCtx; it is skipped`);
  return { name, tokens, images: head.images, size: head.bytes };
}

/**
 * Lists `dir`'s cache files, reading only their heads (states load on demand with
 * `readEntryFile`), and removes temporary files that writers killed mid-write left. `skip(name)`:
 * files the caller knows already, not read again. Resolves null when the folder has not changed
 * since `stamp` (a previous listing's), else `{ stamp, found, refused }`: `found` the files with
 * their tokens and size, `refused` the files that cannot be used with why (ERR_STATE_CORRUPT,
 * ERR_STATE_MISMATCH). Rejects when the folder cannot be read.
 * @param {string} dir
 * @param {EntryFingerprint} fingerprint
 * @param {{ maxTokens: number, skip: (name: string) => boolean, stamp?: number }} options
 * @returns {Promise<{ stamp: number, found: { name: string, tokens: number[], images: ImageSpan[], size: number }[], refused: { name: string, error: Error }[] } | null>}
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
