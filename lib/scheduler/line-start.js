'use strict';

/**
 * How a line (./line.js) gets its KV, given at its construction — a fork of its parent
 * (`LineStart.fork`), fresh tokens (`fresh`) or a request's prompt cut into cache entries at its
 * cache points (`prompt`) — and the prefix-cache bookkeeping that goes with it: the longest cached
 * start it forks, the entry it fills (its segment) for others to fork, the entries it pins. It
 * answers with branches and counts; the line applies them to itself.
 */

const { Branch } = require('../Branch');
const { MIN_PARTIAL_REUSE } = require('./prefix-cache');
const { imagesBelow } = require('./image-keys');

class LineStart {
  /**
   * @param {any} parent the line it forks (null: a fresh line)
   * @param {number[] | null} cachePoints a request's prompt: where it is cut into cache entries,
   *   leases reserved at admission; it never grows, so once filled it uses its last entry's branch
   *   as is (`borrowed`). null: a program's line, whose entries are kept only with a spare lease.
   */
  constructor(parent, cachePoints, images = []) {
    this.parent = parent;
    this.cachePoints = cachePoints;
    /** @type {import('./image-keys').ImageSpan[]} a prompt's images (its tokens key them: ./image-keys.js) */
    this.images = images;
    /** @type {any} the cache entry the line's branch is filling (its prompt, for others to fork), if any */
    this.segment = null;
    /** @type {any[]} cache entries pinned until the line is freed */
    this.pins = [];
    /** The line's branch is its filled prompt entry's own: no lease of its own, nothing to free. */
    this.borrowed = false;
  }

  /** A fork of `parent` at `at` tokens (default: its end); the images below are its too. */
  static fork(parent, at) {
    const images = parent.kv ? parent.kv.images : [];
    return new LineStart(parent, null, at === undefined ? images : imagesBelow(images, at));
  }

  static fresh() {
    return new LineStart(null, null);
  }

  /** A request's prompt (`images`: the images among its tokens, ./media.js). */
  static prompt(cachePoints, images = []) {
    return new LineStart(null, cachePoints, images);
  }

  /**
   * The longest cached start of `tokens`: its entry (null: none), its length (a part-way fork
   * never takes them all: it would lack the logits after the last) and `fork()`, which takes it.
   */
  cachedStart(cache, tokens) {
    const { entry, partial, length } = cache.bestStart(tokens);
    const fork = () => (partial ? entry.branch.forkAt(length) : entry.branch.fork());
    return { entry: length > 0 ? entry : null, length, fork };
  }

  /**
   * A fork whose own text (`tokens` past the parent's `anchor`) is cached forks the cache entry
   * instead of its parent: its branch and how many of `tokens` it holds. Null when no ready entry
   * holds more than the parent.
   */
  fromCache(cache, tokens, anchor) {
    if (tokens.length - anchor < MIN_PARTIAL_REUSE) return null;
    const { entry, length, fork } = this.cachedStart(cache, tokens);
    if (!entry || !entry.ready || length <= anchor) return null;
    cache.unpin(cache.pin(entry)); // refreshes its place in the LRU order
    return { branch: fork(), length };
  }

  /**
   * A fresh line's start for `tokens` (of its `pending` ones): how many the cache gives, and
   * `take()`, its branch — a fork of the longest cached prefix, a prompt's entry's own when the
   * prompt is cached whole (`borrowed`, logits included), or a new one (a prompt is never sampled).
   * Null while the prefix it wants is still being filled by someone else.
   */
  fresh(env, tokens, pending) {
    const { cache } = env;
    const { entry, length, fork } = this.cachedStart(cache, tokens);
    if (entry && !entry.ready && entry.branch.position < length) return null;
    if (entry && this.cachePoints) this.pins.push(cache.pin(entry));
    else if (entry) cache.unpin(cache.pin(entry)); // refreshes its place in the LRU order
    if (entry && this.cachePoints && length === pending) {
      this.borrowed = true;
      return { length, take: () => entry.branch };
    }
    return { length, take: () => (entry ? fork() : Branch.create(env.ctx, 0, { temperature: 0 })) };
  }

  /**
   * The line's `branch` fills a new cache entry up to its next cache point (a program's line: all
   * its `tokens`), so that programs and requests starting with the same text fork it instead of
   * prefilling it again.
   */
  open(env, tokens, filled, branch) {
    const { cache } = env;
    const end = this.cachePoints ? this.cachePoints.find((p) => p > filled) : tokens.length;
    if (end === undefined) return;
    this.segment = cache.open(tokens.slice(0, end), branch, imagesBelow(this.images, end));
    if (env.hinted) this.segment.hinted = true;
    if (this.cachePoints) this.pins.push(cache.pin(this.segment));
    else cache.pin(this.segment);
  }

  /** The line appended a prompt with images: their places in it. @param {import('./image-keys').ImageSpan[]} images */
  addImages(images) {
    this.images = [...this.images, ...images];
  }

  /** The end of the entry being filled (null: none). */
  get segmentEnd() {
    return this.segment ? this.segment.tokens.length : null;
  }

  /** Whether filling up to `filled` tokens fills a cache entry no lease was reserved for (a program's line). */
  fillsUnreserved(filled) {
    return this.segment !== null && !this.cachePoints && filled === this.segment.tokens.length;
  }

  /**
   * The segment is filled: the cache keeps that branch, and the line goes on in the branch this
   * returns — a fork of it (`lease`: one taken), or, for a prompt filled to its end (`done`), the
   * entry's own. Null: the line keeps its branch and nothing is cached (a program's line with no
   * `spare` lease now: one admitted since may count on it; several may have opened entries).
   */
  filled(cache, done, spare) {
    const entry = this.segment;
    this.segment = null;
    if (!this.cachePoints) cache.unpin(entry);
    if (this.cachePoints && done) {
      cache.filled(entry);
      this.borrowed = true;
      return { branch: entry.branch, lease: false };
    }
    if (!this.cachePoints && !spare) {
      cache.forget(entry);
      return null;
    }
    try {
      const branch = entry.branch.fork();
      cache.filled(entry);
      return { branch, lease: true };
    } catch (e) {
      if (this.cachePoints) throw e; // its lease was reserved: a failure is the request's
      cache.forget(entry); // no lease after all: the line keeps the branch, nothing is cached
      return null;
    }
  }

  /** An unfilled cache entry of the line leaves the cache (the line frees its branch itself). */
  drop(cache) {
    if (!this.segment) return;
    if (!this.cachePoints) cache.unpin(this.segment);
    cache.forget(this.segment);
    this.segment = null;
  }

  /** The line is freed: its segment leaves the cache and its pins go. */
  free(cache) {
    this.drop(cache);
    for (const entry of this.pins) cache.unpin(entry);
    this.pins = [];
  }
}

module.exports = { LineStart };
