'use strict';

/**
 * The Scheduler's prefix cache, in tiers (sglang's hierarchical radix cache in shape, not code):
 * prompt prefixes kept as branches in the KV cells (a prompt starting with one forks it instead of
 * prefilling it), their states in RAM once evicted (`cacheRam`), then in files (`cacheDir`,
 * `cacheDisk`; ./cache-file.js) that a scheduler started again on the folder, or beside it, loads
 * on demand. One tree (./radix.js) of one entry type (`CacheEntry`: its state in the KV cells, RAM,
 * a file, or several); one clock (`lastUsed`: one LRU order across the tiers); one victim rule
 * (`victim`); one pair of transitions (`demote`: KV → RAM → disk → gone; `promote`: back into
 * the KV cells). It is asked in data and never given a closure: the Scheduler evicts from the KV
 * cells one victim at a time (`evictOne`) until its own measure fits, and restores what
 * `restorable` offers (./queue.js); below the KV cells it keeps its own byte budgets. Images are keyed by their bytes
 * (./image-keys.js): a start never ends inside one. Nothing stored is trusted: a foreign or
 * corrupted file is skipped with a warning; a failed write turns the disk tier off with a warning.
 * Branches and tiers are duck-typed: test/unit/prefix-cache.test.js runs it on fakes and files.
 */

const path = require('node:path');
const { RadixTree } = require('./radix');
const { release, nativeOf } = require('../Context');
const { adoptBranch } = require('../Branch');
const { makeError } = require('../errors');
const files = require('./cache-file');
const { edge, imagesBelow } = require('./image-keys');

/**
 * The fewest tokens an entry is forked part-way at, or kept below the KV cells with: shorter runs
 * (a BOS token, a first word) save almost no prefill, yet would keep an unrelated entry in use.
 */
const MIN_PARTIAL_REUSE = 16;
/** A restore must save at least this many tokens of prefill over what the KV cells already hold. */
const MIN_GAIN = 16;
/** How often (at most) the folder is listed again for files another process wrote. */
const RESCAN_MS = 1000;
const sum = (/** @type {number[]} */ sizes) => sizes.reduce((total, size) => total + size, 0);
/** Where a start of `run` shared tokens of `tokens` may end: short of the last token (whose logits it lacks), never inside an image. */
const runEnd = (tokens, run) => edge(tokens, Math.min(run, tokens.length - 1));

/**
 * @typedef {{ position: number, disposed?: boolean, prune(): Promise<void>, fork(): any, forkAt(position: number): any }} CachedBranch
 * @typedef {'kv' | 'ram' | 'disk'} Medium
 * @typedef {NonNullable<import('../types').SchedulerStats['cacheTiers']>} TierStats
 * @typedef {{ type: 'stored' | 'removed', tokens: number[], images: ImageSpan[], medium: Medium, tiers: Medium[] } | { type: 'cleared', medium: 'kv' }} CacheChange
 * @typedef {import('./image-keys').ImageSpan} ImageSpan
 * What the lower tiers are made of (`tiersOn`): budgets in bytes, the folder (null: RAM only),
 * a branch's state copied now (null once the context is gone) and a state restored as a root
 * branch cut to `keep` positions.
 * @typedef {{ ramBytes: number, dir: string | null, diskBytes: number, warn: (message: string) => void,
 *   fingerprint: import('./cache-file').EntryFingerprint, maxTokens: number, copyState(branch: any): Buffer | null,
 *   restoreState(state: Buffer, keep: number, images: ImageSpan[]): Promise<CachedBranch> }} Tiers
 */

/**
 * The tiers of a scheduler on `ctx` (its checked `cacheRam`, `cacheDir`, `cacheDisk`, `onCacheWarning`):
 * a state is copied synchronously (before its evicted branch is freed), restored as a Branch of `ctx`.
 * @param {import('../Context').SessionContext} ctx
 * @param {{ ramBytes: number, dir: string | null, diskBytes: number, warn: (message: string) => void }} options
 * @returns {Tiers}
 */
function tiersOn(ctx, options) {
  const native = nativeOf(ctx);
  return {
    ...options,
    warn: (message) => options.warn(`prefix cache: ${message}`),
    fingerprint: files.fingerprintOf(ctx),
    maxTokens: ctx.nCtx,
    copyState: (branch) => (ctx.disposed ? null : native._branchStateSync(branch.handle)),
    restoreState: async (state, keep, images) =>
      adoptBranch(ctx, await native._branchRestore(state, keep, images.length > 0 ? images : undefined), 0),
  };
}

/** A cached prefix: `tokens` (`images` among them), and where its state lives. */
class CacheEntry {
  /** @type {CachedBranch | null} holds exactly `tokens` (once `ready`, their logits too) */ branch = null;
  /** @type {Buffer | null} */ ram = null;
  /** @type {Buffer | null} its state on its way to its file (readable meanwhile) */ writing = null;
  /** @type {{ name: string, size: number } | null} */ file = null;
  /** Users of its branch: a pinned KV entry is never evicted. */ pins = 0;
  /** Its last pin, unpin or restore on the one clock. */ lastUsed = 0;
  /** False while the line that opened it is still prefilling its tokens. */ ready = false;
  /** False for a state restored from RAM or disk: it holds cells, not the logits after them. */ logits = true;
  /** A client asked to keep this prefix warm (prompt_cache_key): evicted after unhinted ones. */ hinted = false;

  /** @param {number[]} tokens @param {ImageSpan[]} [images] */
  constructor(tokens, images = []) {
    this.tokens = tokens;
    this.images = images;
  }

  /** @param {Medium} medium */
  in(medium) {
    return medium === 'kv' ? this.branch !== null : medium === 'ram' ? this.ram !== null : this.file !== null;
  }

  /** Whether its state is stored below the KV cells (on its way to its file too: readable). */
  get below() {
    return Boolean(this.ram || this.writing || this.file);
  }

  /** @returns {Medium[]} where it is, for listeners */
  get media() {
    return /** @type {Medium[]} */ (['kv', 'ram', 'disk']).filter((m) => this.in(m) || (m === 'disk' && this.writing));
  }
}

class PrefixCache {
  /**
   * @param {{ slidingWindow?: number, tiers?: Tiers | null }} [options] the model's sliding-window
   *   span (0: none; see `bestStart`), and RAM and disk below the KV cells (null: none)
   */
  constructor({ slidingWindow = 0, tiers = null } = {}) {
    this._tree = new RadixTree();
    /** Every entry: the tree's, and ones `open` displaced that still hold a branch their lines use. */
    this._entries = new Set();
    this._clock = 0;
    this._slidingWindow = slidingWindow;
    this._tiers = tiers;
    this._dir = /** @type {string} */ (tiers && tiers.dir);
    this._budget = { ram: tiers ? tiers.ramBytes : 0, disk: this._dir ? /** @type {Tiers} */ (tiers).diskBytes : 0 };
    /** Files are written one at a time, in order. */
    this._writes = Promise.resolve();
    /** When the folder was last listed, its stamp then (see listEntryFiles), the files refused (warned once). */
    this._scannedAt = -Infinity;
    this._listed = -1;
    this._refused = new Set();
    /** @type {((change: CacheChange) => void)[]} */
    this._listeners = [];
    this.evictions = 0;
    this.diskOn = Boolean(this._dir);
    const counted = 'kvHits ramHits diskHits restoredTokens spills diskWrites diskFailures skipped'.split(' ');
    /** What happened in the tiers (`stats().cacheTiers`). @type {Omit<TierStats, 'ramBytes' | 'diskBytes' | 'ramEntries' | 'diskEntries' | 'diskOn'>} */
    this.counters = /** @type {any} */ (Object.fromEntries(counted.map((name) => [name, 0])));
    if (this.diskOn)
      try {
        files.makeFolder(this._dir);
      } catch (e) {
        this._diskOff(`cannot create the cache folder ${this._dir}: ${/** @type {Error} */ (e).message}`);
      }
  }

  /** Number of prefixes in the KV cells. */
  get size() {
    return [...this.entries()].length;
  }

  /** Tokens of the prefixes in the KV cells, summed over entries (what they share counts each time). */
  get tokens() {
    return [...this.entries()].reduce((sum, e) => sum + e.tokens.length, 0);
  }

  /** The entries in any tier: what a KV event publisher starts from. */
  held() {
    return this._tree.values();
  }

  /** The entries in the KV cells. */
  *entries() {
    for (const e of this._tree.values()) if (e.branch) yield e;
  }

  /**
   * `listener(change)` hears each prefix entering a tier (`stored`: 'kv' once filled or restored,
   * 'ram', 'disk' as its file is written or found) or leaving one (`removed`), with the `tiers`
   * holding it now, and `cleared` from `clear` (see Scheduler.watchCache). Returns the unsubscribe.
   * @param {(change: CacheChange) => void} listener
   */
  onChange(listener) {
    this._listeners.push(listener);
    return () => (this._listeners = this._listeners.filter((l) => l !== listener));
  }

  _emit(type, e, medium) {
    const change = { type, tokens: e.tokens, images: e.images, medium, tiers: e.media };
    for (const listener of this._listeners) listener(change);
  }

  /**
   * Where a prompt can start from the KV cells: the longest cached prefix, or the longest run it
   * shares with an entry, forked part-way if at least MIN_PARTIAL_REUSE tokens and the branch has
   * not passed the sliding window (llama.cpp may reuse cells that left it). A part-way fork, or a
   * restored entry, has no logits after its last token: it never takes the whole prompt. Entries
   * still being filled count: a request that would use one waits until it is filled that far.
   * @returns {{ entry: CacheEntry | null, length: number, partial: boolean }}
   */
  bestStart(tokens) {
    const { prefix, shared } = this._tree.match(tokens, (e) => e.branch !== null);
    const whole = prefix && (prefix.value.logits || prefix.length < tokens.length) ? prefix : null;
    const part = prefix && !whole ? prefix : shared;
    const at = part ? runEnd(tokens, part.length) : 0;
    // An entry still being filled is forked part-way only once its filler got there, or past it:
    // judge it by where the filler ends.
    const position = !part ? 0 : part.value.ready ? part.value.branch.position : part.value.tokens.length;
    const window = this._slidingWindow;
    if (at > (whole ? whole.length : 0) && at >= MIN_PARTIAL_REUSE && (at === position || !window || position < window))
      return { entry: part.value, length: at, partial: true };
    return { entry: whole ? whole.value : null, length: whole ? whole.length : 0, partial: false };
  }

  /**
   * Where a prompt of `tokens` starting from `start` cached tokens should also be cut into an
   * entry of its own: the end of the longest run it shares with a cached prefix (any tier), when
   * that lies at least MIN_PARTIAL_REUSE tokens past `start` and short of the prompt's end; else
   * null. Prompts that share text no cache point names (token prompts from a router, completions)
   * then share it from the next one on, as a radix cache splits where sequences diverge: an entry
   * past the sliding window is never forked part-way, so without the cut each would prefill it.
   * @returns {number | null}
   */
  splitPoint(tokens, start) {
    const { shared } = this._tree.match(tokens);
    if (!shared) return null;
    const at = runEnd(tokens, shared.length); // short of the prompt's end
    return at >= start + MIN_PARTIAL_REUSE ? at : null;
  }

  /**
   * An entry still being filled that a prompt of `tokens` shares a run with but cannot start
   * from (its filler has not reached the run's end, and an entry filled past the sliding window
   * is never forked part-way): the entry and `at`, the run's end, when that is at least
   * MIN_PARTIAL_REUSE tokens past anything the prompt can start from. Null otherwise.
   * @returns {{ entry: CacheEntry, at: number } | null}
   */
  fillingRun(tokens) {
    const { shared } = this._tree.match(tokens, (e) => e.branch !== null && !e.ready);
    if (!shared) return null;
    const entry = shared.value;
    const at = runEnd(tokens, shared.length);
    if (at >= entry.tokens.length || entry.branch.position >= at) return null;
    return at >= this.bestStart(tokens).length + MIN_PARTIAL_REUSE ? { entry, at } : null;
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

  /**
   * A new KV entry for `tokens` (`images` among them) held by `branch`, not ready until its opener
   * calls `filled`; `hinted`: its opener's client asked to keep it warm.
   */
  open(tokens, branch, images = [], hinted = false) {
    const e = this._at(tokens, true, images);
    return Object.assign(e, { branch, ready: false, logits: true, hinted: e.hinted || hinted });
  }

  /** A prompt starts from `entry` (admitted): a KV hit unless restored (its tier's hit), kept warm if asked. */
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
      if (e === keep || !this._mayLeave(e, medium)) continue;
      if (!victim || (e.hinted === victim.hinted ? e.lastUsed < victim.lastUsed : victim.hinted)) victim = e;
    }
    return victim;
  }

  /** Whether `e` may leave `medium` now: in the KV cells, never a pinned or unfilled entry. */
  _mayLeave(e, medium) {
    return e.in(medium) && (medium !== 'kv' || (e.pins === 0 && e.ready));
  }

  /**
   * The branches of the KV entries that could all be evicted now (nobody pins them): their
   * cells, less what running requests share of them, are reclaimable, not in use (./step.js).
   */
  idleBranches() {
    return [...this._entries].filter((e) => this._mayLeave(e, 'kv') && !e.branch.disposed).map((e) => e.branch);
  }

  /**
   * Demotes the KV cells' next victim (never `keep`) one tier down; false when nothing can leave.
   * What must fit in the KV cells is the Scheduler's measure: ./programs.js `makeRoom` and
   * `cellsFor` call this until it fits.
   */
  evictOne(keep = null) {
    const victim = this.victim('kv', keep);
    if (victim) this.demote(victim, 'kv');
    return victim !== null;
  }

  /** The one loop below the KV cells: demotes `medium`'s victims (never `keep`) until its states and `extra` bytes fit its budget. */
  _shrink(medium, extra = 0, keep = null) {
    while (sum(this._sizes(medium)) + extra > this._budget[medium]) {
      const victim = this.victim(medium, keep);
      if (!victim) return;
      this.demote(victim, medium);
    }
  }

  /**
   * Moves `e` one tier down from `medium`: out of the KV cells, its branch freed (its filled state
   * copied to RAM, or to disk when larger than RAM, unless stored already); out of RAM (to its
   * file unless it has one); off the disk. Stored nowhere any more, it leaves the cache. A KV
   * demotion not `counted` in `evictions` (a closing scheduler's) is not told to listeners either.
   */
  demote(e, medium, counted = true) {
    if (medium === 'kv') {
      const [branch, ready] = [e.branch, e.ready];
      if (ready && !branch.disposed && !e.below) this._spill(e, branch);
      release(branch);
      if (counted) this.evictions++;
      return this.forget(e, ready && counted);
    }
    if (medium === 'ram') {
      const state = e.ram;
      e.ram = null;
      if (!e.file && !e.writing) this._write(e, state);
    } else {
      files.removeEntryFile(this._dir, e.file.name);
      e.file = null;
    }
    this._left(e, medium);
  }

  /** Removes `entry` from the KV cells without freeing its branch (its opener keeps using it). */
  forget(entry, told = false) {
    Object.assign(entry, { branch: null, ready: false });
    this._left(entry, 'kv', told);
  }

  /** `e` left `medium`: said to listeners (if it was there for them), and dropped when stored nowhere. */
  _left(e, medium, told = true) {
    if (told) this._emit('removed', e, medium);
    if (e.branch || e.below) return;
    if (this._tree.get(e.tokens) === e) this._tree.delete(e.tokens);
    this._entries.delete(e);
  }

  /** Frees every KV entry (filled ones go to the lower tiers, when there are any). */
  clear() {
    for (const e of [...this._entries]) if (e.branch) this.demote(e, 'kv', false);
    for (const listener of this._listeners) listener({ type: 'cleared', medium: 'kv' });
  }

  /** The sizes of the states in RAM, or of the files written on disk. */
  _sizes(medium) {
    return [...this._entries].filter((e) => e.in(medium)).map((e) => (medium === 'ram' ? e.ram.length : e.file.size));
  }

  /** Copies an evicted KV entry's state (synchronous: before its branch is freed) into RAM, or to disk. */
  _spill(e, branch) {
    if (e.tokens.length < MIN_PARTIAL_REUSE || (this._budget.ram === 0 && !this.diskOn)) return;
    let state = null;
    try {
      state = this._tiers.copyState(branch);
    } catch (err) {
      this._tiers.warn(`could not copy an evicted prefix's state: ${/** @type {Error} */ (err).message}`);
    }
    if (!state) return;
    this.counters.spills++;
    if (state.length <= this._budget.ram) this._toRam(e, state);
    else this._write(e, state);
  }

  _toRam(e, state) {
    e.ram = state;
    this._emit('stored', e, 'ram');
    this._shrink('ram', 0, e);
  }

  /**
   * Writes `state` to `e`'s file in the background (nothing without a disk tier). The file goes
   * to whichever entry holds this state when it lands (`open` may have moved it off `e`).
   */
  _write(e, state) {
    if (!this.diskOn || this._budget.disk === 0) return;
    e.writing = state;
    this._emit('stored', e, 'disk');
    const writer = () => [...this._entries].find((w) => w.writing === state);
    this._writes = this._writes.then(async () => {
      try {
        if (!this.diskOn || !writer()) return;
        const size = files.entrySize(this._tiers.fingerprint, e.tokens, state, e.images);
        this._shrink('disk', size);
        const file = await files.writeEntryFile(this._dir, this._tiers.fingerprint, e.tokens, state, e.images);
        const w = writer();
        if (w) w.file = file;
        if (w) this.counters.diskWrites++;
      } catch (err) {
        this._diskOff(`writing to ${this._dir} failed: ${/** @type {Error} */ (err).message}`);
      } finally {
        const w = writer();
        if (w) w.writing = null;
        if (w && !w.file) this._left(w, 'disk');
      }
    });
  }

  _diskOff(reason) {
    if (!this.diskOn) return;
    this.diskOn = false;
    this.counters.diskFailures++;
    this._tiers.warn(`the disk tier is off, the cache goes on in RAM only: ${reason}`);
  }

  /** Lists the folder for files not known yet (from before a restart, or another process): heads only. */
  async scan() {
    if (!this.diskOn || performance.now() - this._scannedAt < RESCAN_MS) return;
    this._scannedAt = performance.now();
    const { fingerprint, maxTokens } = /** @type {Tiers} */ (this._tiers);
    const known = new Set([...this._entries].filter((e) => e.file).map((e) => e.file.name));
    const skip = (name) => this._refused.has(name) || known.has(name);
    let listed;
    try {
      listed = await files.listEntryFiles(this._dir, fingerprint, { maxTokens, skip, stamp: this._listed });
    } catch (err) {
      return this._diskOff(`the cache folder ${this._dir} cannot be read: ${/** @type {Error} */ (err).message}`);
    }
    if (!listed) return;
    this._listed = listed.stamp;
    for (const { name, tokens, images, size } of listed.found) {
      const e = this._at(tokens, false, images);
      if (e.file || e.writing) continue;
      e.file = { name, size };
      this._emit('stored', e, 'disk');
    }
    for (const { name, error } of listed.refused) {
      this._refused.add(name);
      this.counters.skipped++;
      this._tiers.warn(error.message);
    }
    this._shrink('disk');
  }

  /**
   * The longest prefix of `tokens` stored below the KV cells that saves at least MIN_GAIN tokens
   * of prefill over the `have` the KV cells hold, or null: admission asks it whether a prompt
   * waits for its restore rather than being prefilled from a shorter start now.
   */
  stored(tokens, have) {
    const prefix = this._tree.longestPrefix(tokens, (e) => e.below);
    return prefix && prefix.length >= have + MIN_GAIN ? prefix.value : null;
  }

  /** Whether there are tiers below the KV cells to restore from. */
  get tiered() {
    return Boolean(this._tiers);
  }

  /**
   * What restoring would give a start of `tokens`: the stored entry and the positions kept of it
   * (more than the KV cells hold, by at least MIN_GAIN), or null. A prompt wholly stored is
   * restored one token short: that token is decoded for its logits (a prompt ending with an
   * image: the image is prefilled again). The caller makes room for `keep` cells and a lease,
   * then calls `promote` (./queue.js `restore`).
   * @returns {{ entry: CacheEntry, keep: number } | null}
   */
  restorable(tokens) {
    const have = this.bestStart(tokens).length;
    const found = this.stored(tokens, have);
    if (!found) return null;
    const keep = found.tokens.length === tokens.length ? edge(tokens, tokens.length - 1) : found.tokens.length;
    return keep > have ? { entry: found, keep } : null;
  }

  /**
   * Brings `e`'s stored state back into the KV cells, cut to `keep` positions: a ready entry
   * without logits, most recently used. False when it cannot be had (its file gone, corrupted or
   * from other settings, or refused by the context: skipped with a warning, its stored state
   * lost); a file read and found corrupted is removed.
   */
  async promote(e, keep, hinted = false) {
    const [tier, name] = e.ram || e.writing ? ['ram', null] : ['disk', e.file.name];
    let [state, branch] = [e.ram || e.writing, null];
    try {
      if (!state) {
        const read = await files.readEntryFile(path.join(this._dir, name), this._tiers.fingerprint);
        if (read.tokens.length !== e.tokens.length || read.tokens.some((t, i) => t !== e.tokens[i]))
          throw makeError('ERR_STATE_CORRUPT', `${name} holds other tokens than its name says; it is skipped`);
        state = read.state;
      }
      branch = await this._tiers.restoreState(state, keep, e.images);
    } catch (err) {
      const { code, message } = /** @type {any} */ (err);
      if (!state && code === 'ERR_STATE_CORRUPT') await files.removeEntryFile(this._dir, name);
      if (!state) this._refused.add(name);
      const why = state ? 'a stored prefix could not be restored, it is prefilled instead: ' : '';
      if (code !== 'ENOENT') this.counters.skipped++;
      if (code !== 'ENOENT') this._tiers.warn(why + message);
      const media = e.media.filter((m) => m !== 'kv');
      Object.assign(e, { ram: null, writing: null, file: null });
      for (const m of media) this._left(e, m);
      return false;
    }
    e.lastUsed = ++this._clock;
    // The RAM copy stays, and a state read from disk gets one: evicted again, it costs no new copy.
    if (!e.ram && this._entries.has(e) && state.length <= this._budget.ram) this._toRam(e, state);
    this.counters[tier === 'ram' ? 'ramHits' : 'diskHits']++;
    this.counters.restoredTokens += keep;
    const into = this._at(e.tokens.slice(0, keep), true, imagesBelow(e.images, keep));
    Object.assign(into, { branch, ready: true, logits: false, lastUsed: ++this._clock, hinted: into.hinted || hinted });
    this._emit('stored', into, 'kv');
    return true;
  }

  /** Writes every RAM entry without a file to disk (a scheduler closing), then waits for all writes. */
  async flush() {
    for (const e of this._entries) if (e.ram && !e.file && !e.writing) this._write(e, e.ram);
    await this._writes;
  }

  /** @returns {TierStats | null} bytes and entries per tier below the KV cells, and what happened there */
  tierStats() {
    if (!this._tiers) return null;
    const [ram, disk] = [this._sizes('ram'), this._sizes('disk')];
    const [ramBytes, diskBytes, ramEntries, diskEntries] = [sum(ram), sum(disk), ram.length, disk.length];
    return { ramBytes, diskBytes, ramEntries, diskEntries, diskOn: this.diskOn, ...this.counters };
  }
}

module.exports = { PrefixCache, CacheEntry, MIN_PARTIAL_REUSE, tiersOn };
