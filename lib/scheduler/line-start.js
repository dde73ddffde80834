'use strict';

/**
 * How a line (./line.js) gets its KV, given at its construction — a fork of its parent at an
 * anchor (`LineStart.fork`), fresh tokens (`fresh`) or a request's prompt cut into cache entries
 * at its cache points (`prompt`) — and the prefix-cache bookkeeping that goes with it: the
 * longest cached start it forks, the entry it fills (its segment) for others to fork, the entries
 * it pins, and what its program counts of it (`cached`, `starts`). It answers with branches; the
 * line applies them to itself.
 */

const { MIN_PARTIAL_REUSE } = require('./prefix-cache');
const { imagesBelow } = require('./image-keys');
const { SchedulerErrorCode: Code, schedulerError } = require('./errors');

/**
 * A line's branch as `begin` gives it: its tokens still `pending` (not in the branch), `lease`
 * (false: the branch is a filled prompt entry's own) and `reusable` (its own text is worth a
 * cache entry, kept if a lease is spare).
 * @typedef {{ branch: any, pending: number[], lease: boolean, reusable: boolean }} Begun
 */

class LineStart {
  /**
   * @param {any} parent the line it forks until it takes its branch (null: a fresh line)
   * @param {number} anchor the parent's token count at the fork: the branch forks the parent there
   * @param {number[] | null} cachePoints a request's prompt: where it is cut into cache entries,
   *   leases reserved at admission; it never grows, so once filled it uses its last entry's branch
   *   as is (`borrowed`). null: a program's line, whose entries are kept only with a spare lease.
   * @param {import('./image-keys').ImageSpan[]} [images] the images among its tokens (./image-keys.js)
   * @param {{ start: number, entry: any }} [planned] a prompt's cached start its admission counted on: its
   *   entry pinned until the line starts, or the next admission could evict it and the prompt
   *   prefill more than its program reserved cells for
   */
  constructor(parent, anchor, cachePoints, images = [], planned = { start: 0, entry: null }) {
    this.parent = parent;
    this.anchor = anchor;
    this.cachePoints = cachePoints;
    this.images = images;
    this.planned = planned;
    /** @type {{ prompt: any, at: number }[]} prompts with images among its pending positions, in order */
    this.media = [];
    /** @type {import('./prefix-cache').CacheEntry | null} the cache entry the line's branch is filling (its prompt, for others to fork), if any */
    this.segment = null;
    /** @type {import('./line').Line[]} lines forking this start's line that have not taken their branch from it yet */
    this.forks = [];
    /** @type {any[]} cache entries pinned until the line is freed */
    this.pins = [];
    /** The line's branch is its filled prompt entry's own: no lease of its own, nothing to free. */
    this.borrowed = false;
    /** Prompt tokens its start took from the prefix cache, and how often it started (again after a failed branch). */
    this.cached = 0;
    this.starts = 0;
  }

  /** A fork of `parent` at `at` tokens; the images below are its too. */
  static fork(parent, at) {
    return new LineStart(parent, at, null, imagesBelow(parent.lineStart.images, at));
  }

  static fresh() {
    return new LineStart(null, 0, null);
  }

  /** A request's prompt (`images`: the images among its tokens, ./media.js; `planned`: its entry pinned by the caller). */
  static prompt(cachePoints, images = [], planned = undefined) {
    return new LineStart(null, 0, cachePoints, images, planned);
  }

  /** `line`, a fork starting with this, waits on its parent until it takes its branch. */
  join(line) {
    if (this.parent) this.parent.lineStart.forks.push(line);
  }

  /** `line` took its branch, or never will: it no longer waits on its parent. */
  leave(line) {
    const forks = this.parent ? this.parent.lineStart.forks : [];
    const at = forks.indexOf(line);
    if (at !== -1) forks.splice(at, 1);
    this.parent = null;
  }

  /**
   * Where the line's scoring prefill stops this step: the next point where a line forked ahead of
   * it (a `select` path) waits to fork it, so the fork takes the KV and logits there instead of
   * decoding a token again (`computed`: one waits right there, for a lease freed at the next step).
   */
  nextForkPoint(computed) {
    const waiting = this.forks.filter((l) => l.state === 'waiting' && l.needed && l.lineStart.anchor >= computed);
    return Math.min(Infinity, ...waiting.map((l) => l.lineStart.anchor));
  }

  /**
   * The line's branch, once it can have one (null: not yet): a fork of a cache entry holding more
   * of its text than its parent, of its parent once the parent's KV reaches the anchor, or for a
   * fresh line of its longest cached prefix (or a new branch). `tokens` are the line's, `pending`
   * those not decoded yet, the last `scoring` of them to be scored by the line itself (their
   * logits rows are the score; the first is scored from the logits at the fork point, which a
   * partial fork lacks).
   * @returns {Begun | null}
   */
  begin(env, tokens, pending, scoring) {
    if (!this.parent) return this.#fresh(env, pending, pending.length - scoring);
    const { parent, anchor } = this;
    const cached = this.fromCache(env.cache, tokens.slice(0, tokens.length - scoring), anchor);
    if (cached) {
      this.#record(cached.length - anchor);
      return { branch: cached.branch, pending: tokens.slice(cached.length), lease: true, reusable: false };
    }
    if (parent.state !== 'live' || parent.computed < anchor) return null;
    let branch;
    if (parent.computed === anchor) {
      branch = parent.branch.fork();
    } else if (parent.tokens[anchor - 1] < 0) {
      // The fork point ends an image: its last position cannot be decoded alone, so the fork
      // takes the cells without the logits there; its own pending tokens give it logits.
      if (pending.length === 0)
        throw schedulerError(
          Code.PROGRAM_STATE,
          'fork(): this line went on past an image its fork ends with; append text to the fork before it generates, or fork before going on',
        );
      branch = parent.branch.forkAt(anchor);
    } else {
      // The parent went on past the fork point: fork it one token before and decode that token
      // again, for the logits at the fork point.
      branch = parent.branch.forkAt(anchor - 1);
      pending = [parent.tokens[anchor - 1], ...pending];
    }
    // The next fork of the same state with the same text (a decision's question asked again, a
    // sub-agent's instructions) may start from it.
    return { branch, pending, lease: true, reusable: pending.length >= MIN_PARTIAL_REUSE };
  }

  /**
   * A fresh line's start for the first `wanted` of its `pending` tokens: a fork of the longest
   * cached prefix, a prompt's entry's own when the prompt is cached whole (`borrowed`, logits
   * included), or a new branch (a prompt is never sampled); a prompt then fills its first entry.
   * Null while the prefix it wants is still being filled by someone else.
   */
  #fresh(env, pending, wanted) {
    const { cache } = env;
    const { entry, length, fork } = this.cachedStart(cache, pending.slice(0, wanted));
    if (entry && !entry.ready && entry.branch.position < length) return null;
    if (entry && this.cachePoints) this.pins.push(cache.pin(entry));
    else if (entry) cache.unpin(cache.pin(entry)); // refreshes its place in the LRU order
    this.#record(length, cache);
    if (entry && this.cachePoints && length === pending.length) {
      this.borrowed = true;
      return { branch: entry.branch, pending: [], lease: false, reusable: false };
    }
    const branch = entry ? fork() : env.newBranch();
    if (this.cachePoints) this.open(env, pending, length, branch);
    const rest = pending.slice(length);
    return { branch, pending: rest, lease: true, reusable: !this.cachePoints && rest.length >= MIN_PARTIAL_REUSE };
  }

  /** The line starts (again, after a failed branch) with `cached` tokens from the cache. */
  #record(cached, cache = null) {
    this.cached = cached;
    this.starts++;
    if (cache) this.#unpinPlanned(cache);
  }

  #unpinPlanned(cache) {
    if (this.planned.entry) cache.unpin(this.planned.entry);
    this.planned.entry = null;
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
   * The line's `branch` fills a new cache entry up to its next cache point (a program's line: all
   * its `tokens`), so that programs and requests starting with the same text fork it instead of
   * prefilling it again.
   */
  open(env, tokens, filled, branch) {
    const { cache } = env;
    const end = this.cachePoints ? this.cachePoints.find((p) => p > filled) : tokens.length;
    if (end === undefined) return;
    this.segment = cache.open(tokens.slice(0, end), branch, imagesBelow(this.images, end), env.hinted);
    if (this.cachePoints) this.pins.push(cache.pin(this.segment));
    else cache.pin(this.segment);
  }

  /**
   * The line's prompt is cut into an entry at `at` too, before the line gets there (`computed`):
   * another prompt shares its first `at` of `tokens` and forks that entry once it is in. Not
   * begun yet, its first entry will end there; filling an entry past `at`, that entry ends there
   * now. The line takes a lease more at the cut (its caller reserved it). Returns whether it cut.
   */
  cutAt(cache, at, computed, tokens) {
    const old = this.segment;
    const from = Math.max(computed, this.planned.start);
    if (!this.cachePoints || this.cachePoints.includes(at) || at < from + MIN_PARTIAL_REUSE) return false;
    if (old ? at >= old.tokens.length : at >= tokens.length) return false;
    this.cachePoints = [...this.cachePoints, at].sort((a, b) => a - b);
    if (!old) return true;
    const { branch, hinted } = old;
    this.pins = this.pins.filter((e) => e !== old);
    cache.unpin(old);
    cache.forget(old); // never filled, never announced: it just leaves the index
    this.segment = cache.open(tokens.slice(0, at), branch, imagesBelow(this.images, at), hinted);
    this.pins.push(cache.pin(this.segment));
    return true;
  }

  /**
   * The line appended a prompt with images (a MediaPrompt) at `at`: its images' places in the line
   * (`images`), and its positions to prefill through ./media.js.
   * @param {import('./image-keys').ImageSpan[]} images
   */
  addMedia(prompt, at, images) {
    this.media.push({ prompt, at });
    this.images = [...this.images, ...images];
  }

  /** The prompt with images whose positions come next after `computed` (null: none; one a cached start covered is dropped). */
  nextMedia(computed) {
    while (this.media.length > 0 && computed >= this.media[0].at + this.media[0].prompt.nPos) this.media.shift();
    return this.media.length > 0 ? this.media[0] : null;
  }

  /** The end of the entry being filled (null: none). */
  get segmentEnd() {
    return this.segment ? this.segment.tokens.length : null;
  }

  /**
   * The segment is filled: the cache keeps that branch, and the line goes on in the branch this
   * returns — a fork of it (`lease`: one taken), or, for a prompt filled to its end (`done`), the
   * entry's own. Null: the line keeps its branch and nothing is cached (a program's line with no
   * lease `spare()` now: one admitted since may count on it; several may have opened entries).
   */
  segmentFilled(cache, done, spare) {
    const entry = this.segment;
    this.segment = null;
    if (!this.cachePoints) cache.unpin(entry);
    if (this.cachePoints && done) {
      cache.filled(entry);
      this.borrowed = true;
      return { branch: entry.branch, lease: false };
    }
    if (!this.cachePoints && !spare()) {
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
    this.#unpinPlanned(cache);
    for (const entry of this.pins) cache.unpin(entry);
    this.pins = [];
    this.parent = null;
  }
}

module.exports = { LineStart };
