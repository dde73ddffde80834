'use strict';

/**
 * The Scheduler's prefix cache, in tiers: prompt prefixes kept as branches in the KV cells (a
 * prompt starting with one forks it instead of prefilling it), their sequence states in RAM once
 * evicted from the cells (`cacheRam`), then in files (`cacheDir`, `cacheDisk`; the bytes are
 * ./cache-file.js's), which a scheduler started again on the folder, or one beside it, loads on
 * demand. The shape of sglang's radix cache with hierarchical tiers, not its code. One of each:
 * - one tree (./radix.js) holds every entry by its tokens, whatever tier holds its state;
 * - one entry type (`CacheEntry`): its state in the KV cells (`branch`), in RAM (`ram`), in a
 *   file (`file`), or several (a state restored from RAM keeps its copy: evicted again, free);
 * - one clock: `lastUsed` is an entry's last pin or unpin, kept down the tiers: one LRU order;
 * - one victim rule (`victim`) and one loop that demotes victims until something fits
 *   (`makeRoom`: the KV cells by the Scheduler's measure, RAM and disk by their budgets);
 * - one pair of transitions: `demote` (KV → RAM → disk → gone; a state larger than RAM goes
 *   straight to disk) and `promote` (a stored state back into the KV cells: `restoreOne`).
 * A prompt with images keys each image by its bytes (./image-keys.js): the same image is a hit,
 * and a start never ends inside an image (`edge`); an entry knows its images' places (`images`),
 * which a state restored from RAM or a file needs. Nothing stored is trusted: a foreign, truncated or corrupted file is skipped with a warning; a
 * failed write turns the disk tier off with a warning (the cache goes on in RAM).
 * Branches and the tiers' natives are duck-typed (`CachedBranch`, `Tiers`): the cache is
 * unit-tested with fakes and real files (test/unit/prefix-cache.test.js).
 */

const path = require('node:path');
const { RadixTree } = require('./radix');
const { release } = require('../Context');
const { makeError } = require('../errors');
const files = require('./cache-file');
const { edge, imagesBelow } = require('./image-keys');

/**
 * A prompt shares at least this many leading tokens with a cached entry before it forks that
 * entry part-way (forkAt), and shorter states are not kept below the KV cells: shorter runs (a
 * BOS token, a first word) save almost no prefill, yet would keep an unrelated entry in use.
 */
const MIN_PARTIAL_REUSE = 16;
/** A restore must save at least this many tokens of prefill over what the KV cells already hold. */
const MIN_GAIN = 16;
/** How often (at most) the folder is listed again for files another process wrote. */
const RESCAN_MS = 1000;

/**
 * @typedef {{ position: number, disposed?: boolean, prune(): Promise<void>, fork(): any, forkAt(position: number): any }} CachedBranch
 * @typedef {'kv' | 'ram' | 'disk'} Medium
 * @typedef {NonNullable<import('../types').SchedulerStats['cacheTiers']>} TierStats
 * @typedef {{ type: 'stored' | 'removed', tokens: number[], medium: Medium, tiers: Medium[] } | { type: 'cleared', medium: 'kv' }} CacheChange
 * What the lower tiers are made of (./cache-tiers.js binds them to a context): budgets in bytes,
 * the folder (null: RAM only), `copyState(branch)` (its sequence state now, null when the context
 * is gone), `restoreState(state, keep)` (a root branch holding the state cut to `keep` positions).
 * @typedef {{ ramBytes: number, dir: string | null, diskBytes: number, warn: (message: string) => void,
 *   fingerprint: import('./cache-file').EntryFingerprint, maxTokens: number,
 *   copyState(branch: any): Buffer | null,
 *   restoreState(state: Buffer, keep: number, images: ImageSpan[]): Promise<CachedBranch> }} Tiers
 * @typedef {import('./image-keys').ImageSpan} ImageSpan
 */

/** A cached prefix: `tokens`, and where its state lives (the KV cells, RAM, a file; any of them). */
class CacheEntry {
  /**
   * @param {number[]} tokens
   * @param {ImageSpan[]} [images] the images among them
   */
  constructor(tokens, images = []) {
    this.tokens = tokens;
    this.images = images;
    /** @type {CachedBranch | null} a branch holding exactly `tokens` (once `ready`, their logits too) */
    this.branch = null;
    /** @type {Buffer | null} */
    this.ram = null;
    /** @type {Buffer | null} its state on its way to its file (readable meanwhile) */
    this.writing = null;
    /** @type {{ name: string, size: number } | null} */
    this.file = null;
    /** Users of its branch: a pinned KV entry is never evicted. */
    this.pins = 0;
    this.lastUsed = 0;
    /** False while the line that opened it is still prefilling its tokens. */
    this.ready = false;
    /** False for a state restored from RAM or disk: it holds cells, not the logits after them. */
    this.logits = true;
    /** A client asked to keep this prefix warm (prompt_cache_key): evicted after unhinted ones. */
    this.hinted = false;
  }

  /** @param {Medium} medium */
  in(medium) {
    return medium === 'kv' ? this.branch !== null : medium === 'ram' ? this.ram !== null : this.file !== null;
  }

  /** @returns {Medium[]} where it is, for listeners (a state on its way to its file is on disk: readable) */
  get media() {
    return /** @type {Medium[]} */ (['kv', 'ram', 'disk']).filter((m) => this.in(m) || (m === 'disk' && this.writing));
  }
}

class PrefixCache {
  /**
   * @param {object} [options]
   * @param {number} [options.slidingWindow] the model's sliding-window span (0: none); a branch
   *   past it cannot be forked part-way (see Branch.forkAt)
   * @param {Tiers | null} [options.tiers] RAM and disk below the KV cells (null: KV cells only)
   */
  constructor({ slidingWindow = 0, tiers = null } = {}) {
    this._tree = new RadixTree();
    /** Every entry: the tree's, and ones `open` displaced that still hold a branch their lines use. */
    this._entries = new Set();
    this._clock = 0;
    this._slidingWindow = slidingWindow;
    this._tiers = tiers;
    this._budget = { ram: tiers ? tiers.ramBytes : 0, disk: tiers && tiers.dir ? tiers.diskBytes : 0 };
    this._used = { ram: 0, disk: 0 };
    /** Files are written one at a time, in order. */
    this._writes = Promise.resolve();
    /** When the folder was last listed, and its stamp then (see listEntryFiles). */
    this._scannedAt = -Infinity;
    this._listed = -1;
    /** File names refused (another fingerprint, corrupted): warned once each. */
    this._refused = new Set();
    /** @type {((change: CacheChange) => void)[]} */
    this._listeners = [];
    this._clearing = false;
    this.evictions = 0;
    this.diskOn = Boolean(tiers && tiers.dir);
    const counted = 'kvHits ramHits diskHits restoredTokens spills diskWrites diskFailures skipped'.split(' ');
    /** What happened in the tiers (`stats().cacheTiers`). @type {Omit<TierStats, 'ramBytes' | 'diskBytes' | 'ramEntries' | 'diskEntries' | 'diskOn'>} */
    this.counters = /** @type {any} */ (Object.fromEntries(counted.map((name) => [name, 0])));
    if (this.diskOn)
      try {
        files.makeFolder(/** @type {string} */ (this._dir));
      } catch (e) {
        this._diskOff(`cannot create the cache folder ${this._dir}: ${/** @type {Error} */ (e).message}`);
      }
  }

  get _dir() {
    return /** @type {Tiers} */ (this._tiers).dir;
  }

  /** Number of prefixes in the KV cells. */
  get size() {
    return [...this.entries()].length;
  }

  /** Tokens of the prefixes in the KV cells, summed over entries (what they share counts each time). */
  get tokens() {
    return [...this.entries()].reduce((sum, e) => sum + e.tokens.length, 0);
  }

  /** The entries in any tier (the KV cells, RAM, disk): what a KV event publisher starts from. */
  *held() {
    for (const e of this._tree.values()) if (e.media.length > 0) yield e;
  }

  /** The entries in the KV cells. */
  *entries() {
    for (const e of this._tree.values()) if (e.branch) yield e;
  }

  /**
   * The hook a publisher of KV events (which prefixes this replica holds, for a router) listens
   * to: `listener(change)` is called when a prefix enters a tier (`stored`: 'kv' once filled or
   * restored, 'ram', 'disk' as its file is written or when found in the folder) or leaves one
   * (`removed`), each with `tiers`: those holding it after the change (empty: it left the
   * cache); and `{ type: 'cleared', medium: 'kv' }` when a closing scheduler frees every KV entry.
   * Listeners run synchronously inside the step: keep them quick. Returns the unsubscribe.
   * @param {(change: CacheChange) => void} listener
   */
  onChange(listener) {
    this._listeners.push(listener);
    return () => (this._listeners = this._listeners.filter((l) => l !== listener));
  }

  _emit(type, e, medium) {
    if (this._listeners.length === 0 || (this._clearing && medium === 'kv')) return;
    const change = { type, tokens: e.tokens, medium, tiers: e.media };
    for (const listener of this._listeners) listener(change);
  }

  /**
   * Where a prompt can start from the KV cells: the longest cached prefix (a whole entry), or the
   * longest shared run of any entry (a part-way fork, never the whole prompt: the fork has no
   * logits, so its last token is decoded again) when it is at least MIN_PARTIAL_REUSE tokens and
   * the entry's branch can still fork there. Entries still being filled count: a request that
   * would use one waits until it is filled that far.
   * @returns {{ entry: CacheEntry | null, length: number, partial: boolean }}
   */
  bestStart(tokens) {
    const { prefix, shared } = this._tree.match(tokens, (e) => e.branch !== null);
    if (prefix && !prefix.value.logits && prefix.length === tokens.length) {
      // A restored state has no logits after its last token: that token is decoded again.
      const at = edge(tokens, prefix.length - 1);
      if (at >= MIN_PARTIAL_REUSE && this._canForkAt(prefix.value.branch, at))
        return { entry: prefix.value, length: at, partial: true };
      return { entry: null, length: 0, partial: false };
    }
    const prefixLength = prefix ? prefix.length : 0;
    if (shared && prefix !== shared) {
      // A part-way fork has no logits: it always leaves the prompt's last token to decode.
      const at = edge(tokens, Math.min(shared.length, tokens.length - 1));
      if (at > prefixLength && at >= MIN_PARTIAL_REUSE && this._canForkAt(shared.value.branch, at))
        return { entry: shared.value, length: at, partial: true };
    }
    return prefix
      ? { entry: prefix.value, length: prefix.length, partial: false }
      : { entry: null, length: 0, partial: false };
  }

  /**
   * Whether `branch.forkAt(position)` may share its cells: always at its own position; below it
   * only while the branch has not passed the model's sliding window (llama.cpp may reuse cells
   * that left a sequence's window).
   */
  _canForkAt(branch, position) {
    const window = this._slidingWindow;
    return position === branch.position || window === 0 || branch.position < window;
  }

  /**
   * The entry at exactly `tokens`, made if there is none. `forBranch`: one for a new KV branch,
   * so a new entry takes the place of one whose branch is there (its lines may still hold that
   * one: it stays, evicted like any other, its stored state moved to the new one).
   */
  _at(tokens, forBranch = false, images = []) {
    const old = this._tree.get(tokens);
    if (old && !(forBranch && old.branch)) return old;
    const e = new CacheEntry(tokens, images);
    if (old) for (const k of ['ram', 'writing', 'file']) [e[k], old[k], e.lastUsed] = [old[k], null, old.lastUsed];
    this._tree.insert(tokens, e);
    this._entries.add(e);
    return e;
  }

  /** A new KV entry for `tokens` (`images` among them) held by `branch`, not ready until its opener calls `filled`. */
  open(tokens, branch, images = []) {
    const e = this._at(tokens, true, images);
    Object.assign(e, { branch, ready: false, logits: true });
    return e;
  }

  /**
   * A prompt starts from `entry` (admitted): a hit in the KV cells unless restored (its tier's
   * hit), kept warm from now on when its client asked.
   */
  startsFrom(entry, hinted) {
    if (entry.logits) this.counters.kvHits++;
    if (hinted) entry.hinted = true;
  }

  /** `entry`'s tokens are all in its branch: others may fork it. */
  filled(entry) {
    entry.ready = true;
    this._emit('stored', entry, 'kv');
  }

  /** One more user of `entry` (it is not evicted while pinned); returns it. */
  pin(entry) {
    entry.pins++;
    entry.lastUsed = ++this._clock;
    return entry;
  }

  unpin(entry) {
    entry.pins--;
    entry.lastUsed = ++this._clock;
  }

  /**
   * The one victim rule: the entry to leave `medium` next, or null. The least recently used,
   * entries a client asked to keep warm after all others; in the KV cells never a pinned or
   * unfilled entry; never `keep`.
   */
  victim(medium, keep = null) {
    let victim = null;
    for (const e of this._entries) {
      if (e === keep || !e.in(medium) || (medium === 'kv' && (e.pins !== 0 || !e.ready))) continue;
      if (!victim || (e.hinted === victim.hinted ? e.lastUsed < victim.lastUsed : victim.hinted)) victim = e;
    }
    return victim;
  }

  /**
   * The one eviction loop: demotes `medium`'s victims (never `keep`) until `fits()` says yes; false
   * if it still does not once nothing more can leave. The Scheduler alone knows what fits in the
   * KV cells; RAM and disk fit their budgets.
   */
  makeRoom(medium, fits, keep = null) {
    while (!fits()) {
      const victim = this.victim(medium, keep);
      if (!victim) return false;
      this.demote(victim, medium);
    }
    return true;
  }

  /**
   * Moves `e` one tier down from `medium`: out of the KV cells (its state copied to RAM, or to
   * disk when larger than RAM, unless stored already), out of RAM (to its file unless it has
   * one), off the disk. An entry stored nowhere any more leaves the cache.
   */
  demote(e, medium) {
    if (medium === 'kv') return this.evict(e);
    if (medium === 'ram') {
      const state = /** @type {Buffer} */ (e.ram);
      e.ram = null;
      this._used.ram -= state.length;
      if (!e.file && !e.writing) this._write(e, state);
    } else {
      const { name, size } = /** @type {{ name: string, size: number }} */ (e.file);
      e.file = null;
      this._used.disk -= size;
      files.removeEntryFile(this._dir, name);
    }
    this._left(e, medium);
  }

  /**
   * `e` leaves the KV cells and its branch is freed, its filled state going down a tier. Counted
   * in `evictions` unless `counted` is false (an unfinished entry whose request ended, `clear`).
   */
  evict(e, counted = true) {
    const [branch, ready] = [/** @type {CachedBranch} */ (e.branch), e.ready];
    if (ready && !branch.disposed && !e.ram && !e.writing && !e.file) this._keepState(e, branch);
    Object.assign(e, { branch: null, ready: false });
    release(branch);
    if (counted) this.evictions++;
    this._left(e, 'kv', ready);
  }

  /** Removes `entry` from the KV cells without freeing its branch (its opener keeps using it). */
  forget(entry) {
    Object.assign(entry, { branch: null, ready: false });
    this._left(entry, 'kv', false);
  }

  /** `e` left `medium`: said to listeners (if it was there for them), and dropped when stored nowhere. */
  _left(e, medium, told = true) {
    if (told) this._emit('removed', e, medium);
    if (e.branch || e.ram || e.writing || e.file) return;
    if (this._tree.get(e.tokens) === e) this._tree.delete(e.tokens);
    this._entries.delete(e);
  }

  /** Frees every KV entry (filled ones go to the lower tiers, when there are any). */
  clear() {
    this._clearing = true;
    try {
      for (const e of [...this._entries]) if (e.branch) this.evict(e, false);
    } finally {
      this._clearing = false;
    }
    for (const listener of this._listeners) listener({ type: 'cleared', medium: 'kv' });
  }

  // ---------------------------------------------------------------------------------------------
  // Below the KV cells

  /** Copies an evicted KV entry's state (synchronous: before its branch is freed) into RAM, or to disk. */
  _keepState(e, branch) {
    const tiers = this._tiers;
    if (!tiers || e.tokens.length < MIN_PARTIAL_REUSE || (this._budget.ram === 0 && !this.diskOn)) return;
    let state;
    try {
      state = tiers.copyState(branch);
    } catch (err) {
      this._warn(`could not copy an evicted prefix's state: ${/** @type {Error} */ (err).message}`);
    }
    if (!state) return;
    this.counters.spills++;
    if (state.length <= this._budget.ram) this._toRam(e, state);
    else this._write(e, state);
  }

  _toRam(e, state) {
    e.ram = state;
    this._used.ram += state.length;
    this._emit('stored', e, 'ram');
    this.makeRoom('ram', () => this._used.ram <= this._budget.ram, e);
  }

  /** Writes `state` to `e`'s file in the background (nothing when there is no disk tier). */
  _write(e, state) {
    if (!this.diskOn || this._budget.disk === 0) return;
    e.writing = state;
    this._emit('stored', e, 'disk');
    this._writes = this._writes.then(() => this._writeFile(e.tokens, e.images, state));
  }

  /** The write of a state for `tokens`: its file goes to whichever entry holds them when it lands. */
  async _writeFile(tokens, images, state) {
    const writer = () => this._tree.get(tokens);
    try {
      if (!this.diskOn || !writer() || writer().writing !== state) return;
      const size = files.entrySize(this._tiers.fingerprint, tokens, state, images);
      this.makeRoom('disk', () => this._used.disk + size <= this._budget.disk);
      const file = await files.writeEntryFile(this._dir, this._tiers.fingerprint, tokens, state, images);
      const e = writer();
      if (e && e.writing === state) this._onDisk(e, file.name, file.size, false);
      if (e && e.writing === state) this.counters.diskWrites++;
    } catch (err) {
      this._diskOff(`writing to ${this._dir} failed: ${/** @type {Error} */ (err).message}`);
    } finally {
      const e = writer();
      if (e && e.writing === state) {
        e.writing = null;
        if (!e.file) this._left(e, 'disk');
      }
    }
  }

  _onDisk(e, name, size, told = true) {
    if (e.file) this._used.disk -= e.file.size;
    e.file = { name, size };
    this._used.disk += size;
    if (told) this._emit('stored', e, 'disk');
  }

  _diskOff(reason) {
    if (!this.diskOn) return;
    this.diskOn = false;
    this.counters.diskFailures++;
    this._warn(`the disk tier is off, the cache goes on in RAM only: ${reason}`);
  }

  _warn(message) {
    /** @type {Tiers} */ (this._tiers).warn(`prefix cache: ${message}`);
  }

  /**
   * Lists the folder for files this process does not know yet (written before a restart, or by
   * another process on the same folder): their headers only; states load on demand.
   */
  async scan() {
    if (!this.diskOn || performance.now() - this._scannedAt < RESCAN_MS) return;
    this._scannedAt = performance.now();
    const tiers = /** @type {Tiers} */ (this._tiers);
    const known = new Set([...this._entries].filter((e) => e.file).map((e) => e.file.name));
    const skip = (name) => this._refused.has(name) || known.has(name);
    let listed;
    try {
      const options = { maxTokens: tiers.maxTokens, skip, stamp: this._listed };
      listed = await files.listEntryFiles(this._dir, tiers.fingerprint, options);
    } catch (err) {
      return this._diskOff(`the cache folder ${this._dir} cannot be read: ${/** @type {Error} */ (err).message}`);
    }
    if (!listed) return;
    this._listed = listed.stamp;
    for (const { name, tokens, images, size } of listed.found) {
      const e = this._at(tokens, false, images);
      if (!e.file && !e.writing) this._onDisk(e, name, size);
    }
    for (const { name, error } of listed.refused) {
      this._refused.add(name);
      this.counters.skipped++;
      this._warn(error.message);
    }
    this.makeRoom('disk', () => this._used.disk <= this._budget.disk);
  }

  /**
   * The longest prefix of `tokens` stored below the KV cells that saves at least MIN_GAIN tokens
   * of prefill over the `have` tokens the KV cells already hold, or null.
   */
  stored(tokens, have) {
    if (!this._tiers) return null;
    const prefix = this._tree.longestPrefix(tokens, (e) => e.ram !== null || e.writing !== null || e.file !== null);
    return prefix && prefix.length >= have + MIN_GAIN ? prefix.value : null;
  }

  /**
   * The Scheduler's restore phase: the first of `starts` (in its order) whose tokens begin with a
   * stored prefix worth restoring gets it back into the KV cells, if `room(cells, leases)` can
   * make room for it and for what it needs `beside` it; else its `unfit()` is called. One restore
   * a call: admission pins a request's entry right after, before another restore could evict it
   * (a restored state shares no cells with the entries it extends, so two may not fit at once).
   * @param {Iterable<{ tokens: number[], beside(keep: number): { cells: number, leases: number }, hinted: boolean, unfit(): void }>} starts
   * @param {(cells: number, leases: number) => boolean} room
   */
  async restoreOne(starts, room) {
    if (!this._tiers) return;
    await this.scan();
    for (const start of starts) {
      const { tokens } = start;
      const have = this.bestStart(tokens).length;
      const found = this.stored(tokens, have);
      if (!found) continue;
      // A prompt wholly stored is restored one token short: that token is decoded for its logits
      // (a prompt ending with an image: the image is prefilled again).
      const keep = found.tokens.length === tokens.length ? edge(tokens, tokens.length - 1) : found.tokens.length;
      if (keep <= have) continue;
      const beside = start.beside(keep);
      if (!room(keep + beside.cells, beside.leases + 1)) return start.unfit();
      await this.promote(found, keep, start.hinted);
      return;
    }
  }

  /**
   * Brings `e`'s stored state back into the KV cells, cut to `keep` positions: a ready entry
   * without logits (see `bestStart`), most recently used. False when it cannot be had (its file
   * gone, corrupted or from other settings, or refused by the context: skipped with a warning,
   * its stored state forgotten).
   */
  async promote(e, keep, hinted = false) {
    const tiers = /** @type {Tiers} */ (this._tiers);
    const tier = e.ram || e.writing ? 'ram' : 'disk';
    let [state, branch] = [e.ram || e.writing, null];
    try {
      state = state || (await this._read(e));
      branch = await tiers.restoreState(state, keep, e.images);
    } catch (err) {
      const { code, message } = /** @type {any} */ (err);
      const why = state ? 'a stored prefix could not be restored, it is prefilled instead: ' : '';
      if (code !== 'ENOENT') {
        this.counters.skipped++;
        this._warn(why + message);
      }
      this._drop(e);
      return false;
    }
    e.lastUsed = ++this._clock;
    // The RAM copy stays, and a state read from disk gets one (an inclusive cache): evicted
    // again, the entry costs no new copy.
    if (!e.ram && this._entries.has(e) && state.length <= this._budget.ram) this._toRam(e, state);
    this.counters[tier === 'ram' ? 'ramHits' : 'diskHits']++;
    this.counters.restoredTokens += keep;
    const into = this._at(e.tokens.slice(0, keep), true, imagesBelow(e.images, keep));
    Object.assign(into, { branch, ready: true, logits: false, lastUsed: ++this._clock, hinted: into.hinted || hinted });
    this._emit('stored', into, 'kv');
    return true;
  }

  /** `e`'s state from its file, checked (./cache-file.js); a corrupted file is removed. */
  async _read(e) {
    const { name } = /** @type {{ name: string }} */ (e.file);
    try {
      const read = await files.readEntryFile(path.join(this._dir, name), this._tiers.fingerprint);
      if (read.tokens.length !== e.tokens.length || read.tokens.some((t, i) => t !== e.tokens[i]))
        throw makeError('ERR_STATE_CORRUPT', `${name} holds other tokens than its name says; it is skipped`);
      return read.state;
    } catch (err) {
      if (/** @type {any} */ (err).code === 'ERR_STATE_CORRUPT') await files.removeEntryFile(this._dir, name);
      this._refused.add(name);
      throw err;
    }
  }

  /** `e`'s state is lost below the KV cells (a failed restore): it is stored nowhere but its branch. */
  _drop(e) {
    const media = e.media.filter((m) => m !== 'kv');
    if (e.ram) this._used.ram -= e.ram.length;
    if (e.file) this._used.disk -= e.file.size;
    Object.assign(e, { ram: null, writing: null, file: null });
    for (const m of media) this._left(e, m);
  }

  /** Writes every RAM entry without a file to disk (a scheduler closing), then waits for all writes. */
  async flush() {
    for (const e of this._entries) if (e.ram && !e.file && !e.writing) this._write(e, e.ram);
    await this._writes;
  }

  /**
   * Bytes and entries per tier below the KV cells, and what happened there (null: no tiers).
   * @returns {TierStats | null}
   */
  tierStats() {
    if (!this._tiers) return null;
    const count = (/** @type {Medium} */ medium) => [...this._entries].filter((e) => e.in(medium)).length;
    const [ramBytes, diskBytes, ramEntries, diskEntries] = [
      this._used.ram,
      this._used.disk,
      count('ram'),
      count('disk'),
    ];
    return { ramBytes, diskBytes, ramEntries, diskEntries, diskOn: this.diskOn, ...this.counters };
  }
}

module.exports = { PrefixCache, CacheEntry, MIN_PARTIAL_REUSE };
