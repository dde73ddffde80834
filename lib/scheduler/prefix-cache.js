'use strict';

/**
 * The Scheduler's prefix cache: prompt prefixes kept as branches (their KV cells and, once
 * filled, their logits), indexed by a radix tree over tokens. The policy lives here, in one
 * place (the shape of sglang's radix cache, not its code): each entry has a reference count
 * (`pins`: requests using it) and a last-access time; `bestStart` says where a prompt can start,
 * and `evictOne` frees the least-recently-used entry that nobody pins (the Scheduler's loop, until
 * a request fits).
 *
 * A branch here only needs `position`, `fork()`, `forkAt(position)` and `prune()`, so the cache
 * is unit-tested with fake branches (test/unit/prefix-cache.test.js).
 */

const { RadixTree } = require('./radix');
const { release } = require('../Context');

/**
 * A prompt shares at least this many leading tokens with a cached entry before it forks that
 * entry part-way (forkAt). Shorter runs (a BOS token, a common first word) save almost no
 * prefill, yet would pin and refresh an unrelated entry, keeping it from LRU eviction.
 */
const MIN_PARTIAL_REUSE = 16;

/**
 * @typedef {{ position: number, disposed?: boolean, prune(): Promise<void>, fork(): any, forkAt(position: number): any }} CachedBranch
 */

/** A cached prefix: a branch holding exactly `tokens` (and, once `ready`, their logits). */
class CacheEntry {
  /**
   * @param {number[]} tokens
   * @param {CachedBranch} branch
   */
  constructor(tokens, branch) {
    this.tokens = tokens;
    this.branch = branch;
    /** Requests using this entry; only unpinned, ready entries are evicted. */
    this.pins = 0;
    /** Logical time of the last pin or unpin (the LRU order). */
    this.lastUsed = 0;
    /** False while the request that opened it is still prefilling its tokens. */
    this.ready = false;
    /** False for a state restored from RAM or disk: it holds cells, not the logits after them. */
    this.logits = true;
    /** A client asked to keep this prefix warm (prompt_cache_key): evicted after unhinted ones. */
    this.hinted = false;
  }
}

class PrefixCache {
  /**
   * @param {object} [options]
   * @param {number} [options.slidingWindow] the model's sliding-window span (0: none); a branch
   *   past it cannot be forked part-way (see Branch.forkAt)
   * @param {{ keep(tokens: number[], branch: any, hinted: boolean): void } | null} [options.tiers] where
   *   an evicted entry's state goes (./cache-tiers.js: RAM, then disk), if anywhere
   */
  constructor({ slidingWindow = 0, tiers = null } = {}) {
    this._tree = new RadixTree();
    this._clock = 0;
    this._slidingWindow = slidingWindow;
    this._tiers = tiers;
    this.evictions = 0;
  }

  /** Number of cached prefixes. */
  get size() {
    return this._tree.size;
  }

  /** Tokens of all cached prefixes, summed over entries (what they share is counted each time). */
  get tokens() {
    let sum = 0;
    for (const entry of this._tree.values()) sum += entry.tokens.length;
    return sum;
  }

  /** @returns {IterableIterator<CacheEntry>} */
  entries() {
    return this._tree.values();
  }

  /**
   * Where a prompt can start from the cache: the longest cached prefix (a whole entry), or the
   * longest shared run of any entry (a part-way fork, never the whole prompt: the fork has no
   * logits, so its last token is decoded again) when it is at least MIN_PARTIAL_REUSE tokens and
   * the entry's branch can still fork there. Entries still being filled count: a
   * request that would use one waits until it is filled that far.
   * @param {number[]} tokens
   * @returns {{ entry: CacheEntry | null, length: number, partial: boolean }}
   */
  bestStart(tokens) {
    const { prefix, shared } = this._tree.match(tokens);
    if (prefix && !prefix.value.logits && prefix.length === tokens.length) {
      // A restored state has no logits after its last token: that token is decoded again.
      const at = prefix.length - 1;
      if (at >= MIN_PARTIAL_REUSE && this._canForkAt(prefix.value.branch, at))
        return { entry: prefix.value, length: at, partial: true };
      return { entry: null, length: 0, partial: false };
    }
    const prefixLength = prefix ? prefix.length : 0;
    if (shared && prefix !== shared) {
      // A part-way fork has no logits: it always leaves the prompt's last token to decode.
      const at = Math.min(shared.length, tokens.length - 1);
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
   * A new entry for `tokens` held by `branch`, not ready until its opener calls `filled`.
   * @param {number[]} tokens
   * @param {CachedBranch} branch
   */
  open(tokens, branch) {
    const entry = new CacheEntry(tokens, branch);
    this._tree.insert(tokens, entry);
    return entry;
  }

  /** @param {CacheEntry} entry */
  filled(entry) {
    entry.ready = true;
  }

  /**
   * One more user of `entry` (it is not evicted while pinned); returns it.
   * @param {CacheEntry} entry
   */
  pin(entry) {
    entry.pins++;
    entry.lastUsed = ++this._clock;
    return entry;
  }

  /** @param {CacheEntry} entry */
  unpin(entry) {
    entry.pins--;
    entry.lastUsed = ++this._clock;
  }

  /**
   * The least recently used entry nobody pins and that is filled, or null; entries a client
   * asked to keep warm (`hinted`) go after all others.
   */
  leastRecentlyUsed() {
    let victim = null;
    for (const e of this._tree.values()) {
      if (e.pins !== 0 || !e.ready) continue;
      if (!victim || (e.hinted === victim.hinted ? e.lastUsed < victim.lastUsed : victim.hinted)) victim = e;
    }
    return victim;
  }

  /**
   * A state restored from a lower tier becomes a ready entry for `tokens` (no logits: see
   * `bestStart`), most recently used.
   * @param {number[]} tokens
   * @param {CachedBranch} branch
   */
  restored(tokens, branch) {
    const old = this._tree.get(tokens);
    if (old) this.evict(old, false);
    const entry = this.open(tokens, branch);
    entry.ready = true;
    entry.logits = false;
    entry.lastUsed = ++this._clock;
    return entry;
  }

  /**
   * Evicts least-recently-used entries until `fits()` says yes; false if it still does not once
   * nothing more can be evicted. `keep` (the entry a request is about to fork) is never evicted.
   * @param {() => boolean} fits
   * @param {CacheEntry | null} [keep]
   */
  evictUntil(fits, keep = null) {
    while (!fits()) if (!this.evictOne(keep)) return false;
    return true;
  }

  /**
   * Evicts the least-recently-used entry that nobody pins, never `keep`; false when there is
   * none. The Scheduler calls it until a request fits (it alone knows what fits).
   * @param {CacheEntry | null} [keep]
   */
  evictOne(keep = null) {
    if (keep) keep.pins++;
    try {
      const victim = this.leastRecentlyUsed();
      if (!victim) return false;
      this.evict(victim);
      return true;
    } finally {
      if (keep) keep.pins--;
    }
  }

  /**
   * Removes `entry` and frees its branch. Counted in `evictions` unless `counted` is false
   * (an unfinished entry whose request ended, or `clear`).
   * @param {CacheEntry} entry
   */
  evict(entry, counted = true) {
    if (this._tree.get(entry.tokens) === entry) this._tree.delete(entry.tokens);
    if (this._tiers && entry.ready && !entry.branch.disposed)
      this._tiers.keep(entry.tokens, entry.branch, entry.hinted);
    release(entry.branch);
    if (counted) this.evictions++;
  }

  /** Removes `entry` without freeing its branch (its opener keeps using it). */
  forget(entry) {
    if (this._tree.get(entry.tokens) === entry) this._tree.delete(entry.tokens);
  }

  /** Frees every entry (filled ones go to the lower tiers, when there are any). */
  clear() {
    for (const entry of [...this._tree.values()]) this.evict(entry, false);
  }
}

module.exports = { PrefixCache, CacheEntry, MIN_PARTIAL_REUSE };
