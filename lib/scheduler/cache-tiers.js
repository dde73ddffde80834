'use strict';

/**
 * The prefix cache's lower tiers: a prompt prefix evicted from the KV cells keeps its sequence
 * state (the cells' bytes, from the native `_branchStateSync`) in host RAM, and the least
 * recently used of those spill to files in a folder. A later prompt that starts with a stored
 * prefix gets it back (`_branchRestore`) instead of prefilling it. One LRU order runs across
 * the tiers: KV (./prefix-cache.js) → RAM → disk → gone. The folder outlives the process: a
 * scheduler started again on it (or a second one beside it) finds the files and loads them on
 * demand.
 *
 * The files' bytes and folder are ./cache-file.js's: a file with another fingerprint is never
 * loaded (skipped with the reason as a warning), a truncated or corrupted one is skipped (and
 * removed); a failed write (disk full, a read-only or deleted folder) turns the disk tier off
 * with a warning: the cache goes on in RAM.
 */

const path = require('node:path');
const { RadixTree } = require('./radix');
const { nativeOf } = require('../Context');
const { makeError } = require('../errors');
const file = require('./cache-file');

/** Prefixes shorter than this are not worth a state copy (the prefix cache's MIN_PARTIAL_REUSE). */
const MIN_TOKENS = 16;
/** A restore must save at least this many tokens of prefill over what the KV cells already hold. */
const MIN_GAIN = 16;
/** How often (at most) the folder is listed again for files another process wrote. */
const RESCAN_MS = 1000;

const UNITS = { b: 1, k: 1e3, kb: 1e3, kib: 1024, m: 1e6, mb: 1e6, mib: 1024 ** 2, g: 1e9, gb: 1e9, gib: 1024 ** 3 };
Object.assign(UNITS, { t: 1e12, tb: 1e12, tib: 1024 ** 4 });

/**
 * A size in bytes from a number or a string such as '2GiB', '512MiB', '20GB', '1.5g'.
 * @param {unknown} value
 * @param {string} name the option, for the error
 * @returns {number}
 */
function parseBytes(value, name) {
  if (typeof value === 'number' && Number.isFinite(value) && value >= 0) return Math.floor(value);
  const m = typeof value === 'string' ? /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(value) : null;
  const unit = m ? UNITS[(m[2] || 'b').toLowerCase()] : undefined;
  if (!m || unit === undefined)
    throw makeError(
      'ERR_INVALID_ARG',
      `${name} must be a size in bytes: a number or a string such as '2GiB' or '500MB'`,
    );
  return Math.floor(Number(m[1]) * unit);
}

/** One stored prefix: its tokens and where its state is (RAM, a file, or both). */
class TierEntry {
  constructor(key, tokens) {
    this.key = key;
    this.tokens = tokens;
    /** @type {Buffer | null} the state in RAM */
    this.ram = null;
    /** Size of its file, 0 when it has none. */
    this.disk = 0;
    /** The state on its way to the file (readable meanwhile). */
    this.writing = null;
    this.lastUsed = 0;
    /** A client's cache key (prompt_cache_key / session_id): kept in RAM before unkeyed entries. */
    this.hinted = false;
  }
}

class CacheTiers {
  /**
   * @param {import('../Context').SessionContext} ctx
   * @param {{ ramBytes: number, dir: string | null, diskBytes: number, warn: (message: string) => void,
   *   wrapBranch: (handle: number) => any }} options
   */
  constructor(ctx, { ramBytes, dir, diskBytes, warn, wrapBranch }) {
    this._ctx = ctx;
    this._native = nativeOf(ctx);
    this._ramBytes = ramBytes;
    this._dir = dir;
    this._diskBytes = dir ? diskBytes : 0;
    this._warn = warn;
    this._wrap = wrapBranch;
    this._fingerprint = file.fingerprintOf(ctx);
    this._tree = new RadixTree();
    /** @type {Map<string, TierEntry>} */
    this._byKey = new Map();
    this._clock = 0;
    this._ramUsed = 0;
    this._diskUsed = 0;
    /** Writes run one at a time, in order. */
    this._writes = Promise.resolve();
    this._scannedAt = -Infinity;
    /** The folder as of its last listing (see listEntryFiles). */
    this._listed = -1;
    /** Files seen and refused (fingerprint, corruption): warned once each. */
    this._refused = new Set();
    this.diskOn = Boolean(dir);
    this.counters = {
      ramHits: 0,
      diskHits: 0,
      restoredTokens: 0,
      spills: 0,
      diskWrites: 0,
      diskFailures: 0,
      skipped: 0,
    };
    if (dir) {
      try {
        file.makeFolder(dir);
      } catch (e) {
        this._diskOff(`cannot create the cache folder ${dir}: ${/** @type {Error} */ (e).message}`);
      }
    }
  }

  /** Bytes and entries per tier. */
  stats() {
    let ramEntries = 0;
    let diskEntries = 0;
    for (const e of this._byKey.values()) {
      if (e.ram) ramEntries++;
      if (e.disk) diskEntries++;
    }
    return {
      ramBytes: this._ramUsed,
      diskBytes: this._diskUsed,
      ramEntries,
      diskEntries,
      diskOn: this.diskOn,
      ...this.counters,
    };
  }

  _keyOf(tokens) {
    return file.entryName(this._fingerprint, tokens);
  }

  _entry(tokens) {
    const key = this._keyOf(tokens);
    let e = this._byKey.get(key);
    if (!e) {
      e = new TierEntry(key, tokens);
      this._byKey.set(key, e);
      this._tree.insert(tokens, e);
    }
    return e;
  }

  _forget(e) {
    if (this._byKey.get(e.key) !== e) return;
    this._byKey.delete(e.key);
    if (this._tree.get(e.tokens) === e) this._tree.delete(e.tokens);
    if (e.ram) this._ramUsed -= e.ram.length;
    if (e.disk) this._diskUsed -= e.disk;
    e.ram = null;
    e.disk = 0;
  }

  _diskOff(reason) {
    if (!this.diskOn) return;
    this.diskOn = false;
    this.counters.diskFailures++;
    this._warn(`prefix cache: the disk tier is off, the cache goes on in RAM only: ${reason}`);
  }

  /**
   * Keeps the state of an evicted KV entry (`tokens` held by `branch`): in RAM, the least
   * recently used RAM entries going to disk (or away) past the RAM budget. Synchronous: the
   * state is copied now, before the branch is freed.
   * @param {number[]} tokens
   * @param {any} branch
   * @param {boolean} hinted a client asked to keep it warm
   */
  keep(tokens, branch, hinted = false) {
    if (tokens.length < MIN_TOKENS || (this._ramBytes === 0 && !this.diskOn) || this._ctx.disposed) return;
    const e = this._entry(tokens);
    e.lastUsed = ++this._clock;
    e.hinted = e.hinted || hinted;
    if (e.ram || e.writing || e.disk) return; // stored already (a restored entry evicted again)
    let state;
    try {
      state = this._native._branchStateSync(branch.handle);
    } catch (err) {
      this._forget(e);
      this._warn(`prefix cache: could not copy an evicted prefix's state: ${/** @type {Error} */ (err).message}`);
      return;
    }
    this.counters.spills++;
    if (state.length <= this._ramBytes) {
      e.ram = state;
      this._ramUsed += state.length;
      this._fitRam(e);
    } else {
      this._spill(e, state);
    }
  }

  /** Moves least-recently-used RAM entries (hinted ones last) to disk until RAM fits its budget. */
  _fitRam(keep) {
    while (this._ramUsed > this._ramBytes) {
      let victim = null;
      for (const e of this._byKey.values()) {
        if (!e.ram || e === keep) continue;
        if (!victim || (e.hinted === victim.hinted ? e.lastUsed < victim.lastUsed : victim.hinted)) victim = e;
      }
      victim = victim || (keep.ram ? keep : null);
      if (!victim) return;
      const state = /** @type {Buffer} */ (victim.ram);
      this._ramUsed -= state.length;
      victim.ram = null;
      if (victim.disk) continue; // its file is there already
      this._spill(victim, state);
    }
  }

  /** Writes `state` to `e`'s file in the background (or drops it when there is no disk tier). */
  _spill(e, state) {
    if (!this.diskOn || this._diskBytes === 0) {
      if (!e.ram && !e.disk) this._forget(e);
      return;
    }
    e.writing = state;
    this._writes = this._writes.then(() => this._write(e, state));
  }

  async _write(e, state) {
    try {
      if (!this.diskOn || this._byKey.get(e.key) !== e) return;
      this._fitDisk(file.entrySize(e.tokens, state));
      const size = await file.writeEntryFile(/** @type {string} */ (this._dir), this._fingerprint, e.tokens, state);
      if (this._byKey.get(e.key) === e) {
        if (!e.disk) this._diskUsed += size;
        e.disk = size;
        this.counters.diskWrites++;
      }
    } catch (err) {
      this._diskOff(`writing to ${this._dir} failed: ${/** @type {Error} */ (err).message}`);
    } finally {
      e.writing = null;
      if (!e.ram && !e.disk) this._forget(e);
    }
  }

  /** Removes least-recently-used files until `incoming` more bytes fit the disk budget. */
  _fitDisk(incoming) {
    while (this._diskUsed + incoming > this._diskBytes) {
      let victim = null;
      for (const e of this._byKey.values()) if (e.disk && (!victim || e.lastUsed < victim.lastUsed)) victim = e;
      if (!victim) return;
      this._diskUsed -= victim.disk;
      victim.disk = 0;
      file.removeEntryFile(/** @type {string} */ (this._dir), victim.key);
      if (!victim.ram && !victim.writing) this._forget(victim);
    }
  }

  /**
   * Lists the folder for files this process does not know yet (written before a restart, or
   * by another process on the same folder): their headers only; states load on demand.
   */
  async scan() {
    if (!this.diskOn || performance.now() - this._scannedAt < RESCAN_MS) return;
    this._scannedAt = performance.now();
    const dir = /** @type {string} */ (this._dir);
    let listed;
    try {
      const skip = (/** @type {string} */ name) => this._refused.has(name) || this._byKey.has(name);
      listed = await file.listEntryFiles(dir, this._fingerprint, {
        maxTokens: this._ctx.nCtx,
        skip,
        stamp: this._listed,
      });
    } catch (err) {
      this._diskOff(`the cache folder ${dir} cannot be read: ${/** @type {Error} */ (err).message}`);
      return;
    }
    if (!listed) return;
    this._listed = listed.stamp;
    for (const { name, tokens, size } of listed.found) {
      if (this._byKey.has(name)) continue;
      const e = this._entry(tokens);
      e.disk = size;
      this._diskUsed += size;
    }
    for (const { name, error } of listed.refused) {
      this._refused.add(name);
      this.counters.skipped++;
      this._warn(`prefix cache: ${error.message}`);
    }
    this._fitDisk(0);
  }

  /**
   * The longest stored prefix of `tokens` worth restoring over `have` tokens the KV cells
   * already hold, or null.
   * @param {number[]} tokens
   * @param {number} have
   * @returns {TierEntry | null}
   */
  lookup(tokens, have) {
    const { prefix } = this._tree.match(tokens);
    if (!prefix || prefix.length < have + MIN_GAIN) return null;
    return prefix.value;
  }

  /**
   * A root branch holding `e`'s state cut to `keep` positions, or null when it cannot be had
   * (its file is gone, corrupted or from other settings: skipped, with a warning).
   * @param {TierEntry} e
   * @param {number} keep
   */
  async restore(e, keep) {
    let state = e.ram || e.writing;
    const tier = state ? 'ram' : 'disk';
    if (!state) {
      const dir = /** @type {string} */ (this._dir);
      const where = path.join(dir, e.key);
      try {
        const read = await file.readEntryFile(where, this._fingerprint);
        if (read.tokens.length !== e.tokens.length || read.tokens.some((t, i) => t !== e.tokens[i]))
          throw makeError('ERR_STATE_CORRUPT', `${where} holds other tokens than its name says; it is skipped`);
        state = read.state;
      } catch (err) {
        const code = /** @type {any} */ (err).code;
        if (code !== 'ENOENT') {
          this.counters.skipped++;
          this._warn(`prefix cache: ${/** @type {Error} */ (err).message}`);
        }
        if (code === 'ERR_STATE_CORRUPT') file.removeEntryFile(dir, e.key);
        this._refused.add(e.key);
        this._forget(e);
        return null;
      }
    }
    let handle;
    try {
      handle = await this._native._branchRestore(state, keep);
    } catch (err) {
      this.counters.skipped++;
      this._warn(
        `prefix cache: a stored prefix could not be restored, it is prefilled instead: ${/** @type {Error} */ (err).message}`,
      );
      this._forget(e);
      return null;
    }
    // The RAM copy stays, and a state read from disk gets one (an inclusive cache): evicted
    // again, the entry costs no new copy.
    e.lastUsed = ++this._clock;
    if (!e.ram && this._byKey.get(e.key) === e && state.length <= this._ramBytes) {
      e.ram = state;
      this._ramUsed += state.length;
      this._fitRam(e);
    }
    if (tier === 'ram') this.counters.ramHits++;
    else this.counters.diskHits++;
    this.counters.restoredTokens += keep;
    return { branch: this._wrap(handle), tier };
  }

  /** Writes every RAM entry without a file to disk (a scheduler closing), then waits for all writes. */
  async flush() {
    for (const e of this._byKey.values()) if (e.ram && !e.disk && !e.writing) this._spill(e, e.ram);
    await this._writes;
  }
}

module.exports = { CacheTiers, parseBytes, MIN_TOKENS };
