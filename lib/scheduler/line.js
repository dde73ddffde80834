'use strict';

/**
 * The Scheduler's side of one line of generation: a branch, the line's tokens (those in its KV,
 * then `pending` ones not decoded yet), and at most ONE job at a time (./jobs.js: a gen, a
 * score, a peek). A line never decodes by itself. Each step the Scheduler asks it what it needs
 * — a branch (`materialize`: a fork of its parent once the parent's KV reaches the fork point,
 * or the longest cached prefix of its prompt), its pending tokens prefilled (`wantsPrefill`,
 * `prefilled`), a token sampled (`decoding`, `take`, `committed`) — and serves it in the same
 * decode as everything else. The user's `ProgramLine` (lib/ProgramLine.js) holds one privately.
 *
 * Its branch's `state`: 'waiting' (none yet) → 'live' → 'freed'; `released` means the user gave
 * it back and the next step frees it (once no fork still waits to fork it). Its events (`fork`,
 * `append`, `token`, `finish`, `prune`) are each sent from one method here.
 *
 * A line never calls its program: it is told what it needs (`LineEnv`) when it is made, and
 * what its program counts — leases held and taken, cells written, tokens taken, its start from
 * the prefix cache — is the line's own state, read by the program and by `Programs` (its
 * caller), which also decide whose failure a line's is.
 */

const { makeError } = require('../errors');
const { Branch } = require('../Branch');
const { MIN_PARTIAL_REUSE } = require('./prefix-cache');
const { clipped, perplexityOf } = require('./events');
const { SchedulerErrorCode: Code, schedulerError } = require('./errors');

/**
 * What every line of a program is given: the context, the prefix cache, the events and the
 * program's id in them, whether the entries its lines fill are kept warm (a request's cacheKey).
 * @typedef {{ ctx: any, cache: any, events: import('./events').SchedulerEvents, program: string, hinted: boolean }} LineEnv
 */

class Line {
  /**
   * @param {LineEnv} env
   * @param {string} id the line's id in the events (`p1.0`, `p1.1`, ...)
   * @param {Line | null} parent the line this one forks (null: a fresh line)
   * @param {number[]} tokens the line's tokens so far (a copy of the parent's at the fork point)
   */
  constructor(env, id, parent, tokens) {
    this.env = env;
    this.parent = parent;
    /** Every token of the line: what is in its KV, then `pending`. */
    this.tokens = tokens;
    /** Tokens of the line not yet in its branch's KV (prefilled when the line next needs them). */
    this.pending = parent ? [] : tokens.slice();
    /** The parent's token count at the fork: this line's branch forks the parent there. */
    this.anchor = tokens.length - this.pending.length;
    this.text = '';
    this.state = 'waiting';
    this.branch = null;
    /** @type {Line[]} lines forked from this one that have not taken their branch from it yet */
    this.waitingForks = [];
    /** @type {import('./jobs').GenJob | import('./jobs').ScoreJob | import('./jobs').PeekJob | null} the job in flight */
    this.job = null;
    /** The cache entry this line's branch is filling (its prompt, for others to fork), if any. */
    this.segment = null;
    /**
     * Where a request's prompt is cut into cache entries (token counts; null for a program's
     * line, whose prompt becomes one entry when a lease is spare). Their leases were reserved at
     * admission, and the entries stay pinned while the line lives.
     */
    this.cachePoints = null;
    /** @type {any[]} cache entries this line pins until it is freed */
    this.pins = [];
    /** A request's prompt: it never grows, so once filled it may use its cache entry's branch as is. */
    this.sealed = false;
    /** The branch is a cache entry's, used as is (never pruned by the line). */
    this.borrowed = false;
    /** Stop strings every gen of this line adds (the chat template's end of turn), inherited by forks. */
    this.stops = parent ? parent.stops : [];
    /**
     * Where the line's chat stands: null (it did not start with messages), 'open' (the
     * assistant's turn was just opened) or 'replied' (a later turn may be appended as messages).
     */
    this.chat = parent ? parent.chat : null;
    /** A select or multi-token logprob runs on this line (its options are scored in forks). */
    this.selecting = false;
    /** release() was called (the branch is freed at the next step, once no child waits on it). */
    this.released = false;
    /** Prompt tokens the line's start took from the prefix cache, and how often it started (once, or again after a failed branch). */
    this.cached = 0;
    this.starts = 0;
    /**
     * What the line took and wrote, for its program's leases, usage and maxCells: leases taken in
     * all (its own branch, and each fork of a cache entry it filled), KV cells committed, tokens
     * taken, draft tokens.
     */
    this.written = { leases: 0, cells: 0, completionTokens: 0, draftTokens: 0, acceptedDraftTokens: 0 };
    /** The line's id in the scheduler's events (`p1.0`, `p1.1`, ...). */
    this.id = id;
    if (parent) parent.waitingForks.push(this);
    this.emit('fork', { branch: this.id, parent: parent ? parent.id : null, at: parent ? this.anchor : 0 });
  }

  /** Emits one of the line's events (nothing when nobody listens). */
  emit(type, fields) {
    if (this.env.events.on) this.env.events.emit(type, { request: this.env.program, ...fields });
  }

  /** Lines forked from this one still waiting to take their branch from it. */
  get dependents() {
    return this.waitingForks.length;
  }

  /** A fork of this line took its branch, or will never need it: it no longer waits on this line. */
  forkDone(child) {
    const at = this.waitingForks.indexOf(child);
    if (at !== -1) this.waitingForks.splice(at, 1);
  }

  // -------------------------------------------------------------------------------------------
  // What the user's ProgramLine does through it.

  /** Throws unless the line can start `op` (it is live and idle; its program's state is ProgramLine's check). */
  checkIdle(op) {
    if (this.released || this.state === 'freed')
      throw schedulerError(Code.PROGRAM_STATE, `${op}(): this line was released; use another line`);
    if (this.job || this.selecting)
      throw schedulerError(Code.PROGRAM_STATE, `${op}(): a gen or select is running on this line; await it first`);
  }

  /** Appends `tokens` (and the `text` they stand for) to the line; decoded when it next needs its KV. */
  push(tokens, text) {
    this.tokens.push(...tokens);
    this.pending.push(...tokens);
    this.text += text;
    if (this.env.events.on) this.emit('append', { branch: this.id, text: clipped(text), n: this.tokens.length });
  }

  /** Starts `job` on the line (served from the next step on); resolves with its result. */
  start(job) {
    this.job = job;
    return job.done.promise;
  }

  /**
   * The winner's scoring line holds this line's tokens and then exactly the winner's, with the
   * logits after its last: the two swap branches (the scorer then frees this line's old one), so
   * the winner, appended next, need not be decoded again. False when that cannot be (no such
   * line, it is not in a state to give its branch, or a fork of this line still waits to fork it
   * where it is).
   */
  adopt(winner) {
    if (!winner || winner.state !== 'live' || winner.pending.length > 0 || winner.dependents > 0) return false;
    // Forks of this line still waiting for its branch fork it at their anchor, before the winner
    // (forkAt there would decode a token again, and is refused past a sliding window).
    if (this.state !== 'live' || this.pending.length > 0 || this.dependents > 0 || this.released) return false;
    [this.branch, winner.branch] = [winner.branch, this.branch];
    return true;
  }

  /**
   * Gives the line's branch back at the next step (a job in flight rejects with ERR_ABORTED).
   * Idempotent. `announce`: a `prune` event (a request's choice ends with its `finish` alone).
   */
  release(announce = true) {
    if (this.released || this.state === 'freed') return;
    this.released = true;
    if (announce) this.emit('prune', { branch: this.id });
    if (this.job) this.endJob(null, makeError('ERR_ABORTED', 'the line was released while it generated'));
    if (this.parent) {
      this.parent.forkDone(this); // it will never fork the parent now
      this.parent = null;
    }
  }

  // -------------------------------------------------------------------------------------------
  // What the Scheduler asks of it, between and within its steps.

  /** Whether the line needs its KV now: a job runs on it, or a child waits to fork it. */
  get needed() {
    return this.state !== 'freed' && (this.job !== null || this.dependents > 0);
  }

  /** Tokens in the branch's KV. */
  get filled() {
    return this.tokens.length - this.pending.length;
  }

  /** Whether the line's pending tokens should be prefilled this step. */
  get wantsPrefill() {
    return this.state === 'live' && this.needed && this.pending.length > 0;
  }

  /** Whether the line samples (or peeks) this step. */
  get decoding() {
    return this.job !== null && this.job.kind !== 'score' && this.state === 'live' && this.pending.length === 0;
  }

  /** Whether the line has been released and no child waits to fork it: free it at the next step. */
  get collectable() {
    return this.released && this.state !== 'freed' && this.dependents === 0;
  }

  /** Whether the line holds a lease of its program's: a branch of its own (not a cache entry's). */
  get holdsLease() {
    return this.state === 'live' && !this.borrowed;
  }

  /** Pending tokens a score job still scores (the last ones). */
  get scoring() {
    return this.job !== null && this.job.kind === 'score' ? this.job.left : 0;
  }

  /**
   * Where the scored tokens start in a prefill entry of the line's first `take` pending tokens,
   * or undefined when the entry holds none of them (a forkAt fork re-decodes one token first).
   */
  scoreFrom(take) {
    const start = this.pending.length - this.scoring;
    return this.scoring > 0 && start < take ? start : undefined;
  }

  /**
   * Gives a needed line waiting for its branch (its program has a lease for it) that branch: a
   * fork of its parent once the parent's KV reaches the anchor; a fresh line forks the longest
   * cached prompt prefix, or starts empty. Returns true when the line now has a branch and its
   * own text is worth a cache entry (`openSegment`) if a lease is spare, which its caller knows.
   */
  materialize() {
    const parent = this.parent;
    if (!parent) return this.startFresh();
    if (this.forkFromCache()) return false;
    if (parent.state !== 'live' || parent.filled < this.anchor) return false;
    if (parent.filled === this.anchor) {
      this.took(parent.branch.fork());
    } else {
      // The parent went on past the fork point: take its KV up to one token before it and
      // decode that token again, for the logits at the fork point.
      this.took(parent.branch.forkAt(this.anchor - 1));
      this.pending.unshift(parent.tokens[this.anchor - 1]);
    }
    parent.forkDone(this);
    this.parent = null;
    // What the fork appended becomes a cache entry too, when it is worth one: the next fork
    // of the same state with the same text (a decision's question asked again, a sub-agent's
    // instructions) then starts from it.
    return this.pending.length >= MIN_PARTIAL_REUSE;
  }

  /**
   * A fork whose own text (what was appended after the fork point) is in the prefix cache forks
   * the cache entry instead of its parent, past the fork point: only the rest is decoded (none
   * of it when the entry holds the whole text, logits included). False when the cache holds no
   * more of the line than its parent does, or that entry is still being filled.
   */
  forkFromCache() {
    const wanted = this.tokens.length - this.scoring; // tokens to score are decoded by the line
    if (wanted - this.anchor < MIN_PARTIAL_REUSE) return false;
    const { entry, length, fork } = this.cachedStart(this.tokens.slice(0, wanted));
    if (!entry || !entry.ready || length <= this.anchor) return false;
    this.env.cache.unpin(this.env.cache.pin(entry)); // refreshes its place in the LRU order
    this.took(fork());
    this.pending = this.tokens.slice(length);
    this.started(length - this.anchor);
    this.parent.forkDone(this);
    this.parent = null;
    return true;
  }

  /**
   * The longest cached start of `tokens`: its entry (null: none), its length (a part-way fork
   * never takes them all: it would lack the logits after the last) and `fork()`, which takes it.
   */
  cachedStart(tokens) {
    const { entry, partial, length } = this.env.cache.bestStart(tokens);
    const fork = () => (partial ? entry.branch.forkAt(length) : entry.branch.fork());
    return { entry: length > 0 ? entry : null, length, fork };
  }

  /** The line started with `cached` of its tokens from the prefix cache (its program counts them). */
  started(cached) {
    this.cached = cached;
    this.starts++;
  }

  /** The line's own branch (a lease of its program's). */
  took(branch) {
    this.branch = branch;
    this.state = 'live';
    this.written.leases++;
  }

  /**
   * A fresh line's start: a fork of the longest cached prefix of its tokens (never all but
   * logits-less), the cache entry's branch itself when a sealed prompt is cached whole, or a new
   * branch; its prompt then becomes a cache entry while the line fills it (see openSegment: a
   * request's at once, its leases reserved; a program's new prompt if a lease is spare, which
   * the returned true asks). Nothing happens while the prefix it wants is still being filled
   * by someone else.
   */
  startFresh() {
    const cache = this.env.cache;
    // Tokens to score must be decoded by the line itself (their logits rows are the score); the
    // first of them is scored from the logits at the fork point, which a partial fork lacks.
    const wanted = this.pending.length - this.scoring;
    const { entry, length, fork } = this.cachedStart(this.pending.slice(0, wanted));
    // Another line or request is filling this prompt: fork it once it is filled that far.
    if (entry && !entry.ready && entry.branch.position < length) return false;
    if (entry && this.cachePoints) this.pins.push(cache.pin(entry));
    else if (entry) cache.unpin(cache.pin(entry)); // refreshes its place in the LRU order
    this.started(entry ? length : 0);
    if (entry && this.sealed && length === this.pending.length) {
      this.pending = [];
      this.useCached(entry); // the whole prompt is cached, logits included
      return false;
    }
    this.took(entry ? fork() : Branch.create(this.env.ctx, 0, { temperature: 0 })); // a prompt is never sampled
    this.pending = this.pending.slice(length);
    if (this.cachePoints) this.openSegment();
    return !this.cachePoints && !entry && this.pending.length >= MIN_PARTIAL_REUSE;
  }

  /**
   * The line's branch fills a new cache entry up to its next cache point (a program's line: all
   * of its prompt), so that programs and requests starting with the same text fork it instead of
   * prefilling it again. A prompt to score is nobody's.
   */
  openSegment() {
    const cache = this.env.cache;
    if (this.scoring > 0) return;
    const end = this.cachePoints ? this.cachePoints.find((p) => p > this.filled) : this.tokens.length;
    if (end === undefined) return;
    this.segment = cache.open(this.tokens.slice(0, end), this.branch);
    if (this.env.hinted) this.segment.hinted = true; // a client asked to keep it warm
    if (this.cachePoints) this.pins.push(cache.pin(this.segment));
    else cache.pin(this.segment);
  }

  /** A sealed prompt's branch is the cache entry's own: nothing to fork or free. */
  useCached(entry) {
    this.branch = entry.branch;
    this.state = 'live';
    this.borrowed = true;
  }

  /**
   * Whether prefilling `take` more tokens fills a cache entry that no lease was reserved for (a
   * program's line): the cache keeps it only if a lease is spare then (`prefilled`'s `spare`).
   */
  fillsUnreservedEntry(take) {
    return this.segment !== null && !this.cachePoints && this.filled + take === this.segment.tokens.length;
  }

  /**
   * The cache entry is filled: the cache keeps that branch; the line goes on in a fork of it (a
   * sealed prompt filled to its end uses the entry's branch as is: its lease is the cache's
   * from now on), the next segment open. `spare`: a lease is spare now (see fillsUnreservedEntry).
   */
  cacheFilled(spare) {
    const cache = this.env.cache;
    const entry = this.segment;
    this.segment = null;
    if (!this.cachePoints) cache.unpin(entry);
    if (this.sealed && this.pending.length === 0) {
      cache.filled(entry);
      this.useCached(entry);
      return;
    }
    // An entry opened without a reserved lease keeps one only if one is still spare now (a
    // program admitted since may count on it; several lines may have opened entries at once).
    if (!this.cachePoints && !spare) {
      cache.forget(entry);
      return;
    }
    try {
      this.branch = entry.branch.fork();
      cache.filled(entry);
    } catch (e) {
      if (this.cachePoints) throw e; // its lease was reserved: a failure is the request's
      cache.forget(entry); // no lease after all: the line keeps the branch, nothing is cached
      return;
    }
    // The filled branch is the cache's now; the fork is a lease of the line's own.
    this.written.leases++;
    if (this.pending.length > 0) this.openSegment();
  }

  /** An unfilled cache entry of this line leaves the cache (the line frees its branch itself). */
  dropSegment() {
    const cache = this.env.cache;
    if (!this.segment) return;
    if (!this.cachePoints) cache.unpin(this.segment);
    cache.forget(this.segment);
    this.segment = null;
  }

  /**
   * Where a scoring line's prefill stops this step: the next point where a line forked ahead of
   * it (a `select` path where options part) waits to fork it, so that the fork takes the KV and
   * logits there instead of decoding a token again. Infinity when none waits; `filled` when one
   * waits right there (for a lease a line released this step still holds).
   */
  nextForkPoint() {
    let at = Infinity;
    if (this.dependents === 0) return at;
    for (const line of this.waitingForks) {
      if (line.state === 'waiting' && line.needed && line.anchor >= this.filled) at = Math.min(at, line.anchor);
    }
    return at;
  }

  /**
   * `count` pending tokens are in the KV now (`logprobs`: the scored ones'; `spare`: whether a
   * lease is spare, asked only when `fillsUnreservedEntry(count)`).
   */
  prefilled(count, logprobs, spare) {
    const from = this.scoreFrom(count);
    const scored = from === undefined ? null : this.pending.slice(from, count);
    this.pending = this.pending.slice(count);
    if (this.segment && this.filled === this.segment.tokens.length) this.cacheFilled(spare);
    if (!scored) return;
    if (this.env.events.on)
      this.emitToken(scored.map((t) => this.env.ctx.tokenToText(t)).join(''), this.filled, 'forced');
    if (/** @type {import('./jobs').ScoreJob} */ (this.job).scored(scored, logprobs)) this.job = null;
  }

  /**
   * Takes a produced token into the gen; true when it is to be committed (decoded) now.
   * `committed`: an accepted draft token, already decoded and accepted.
   */
  take(produced, committed = false) {
    if (produced.isStop) {
      this.endJob('stop');
      return false;
    }
    if (committed) this.committed(produced.token);
    this.written.completionTokens++;
    const reason = /** @type {import('./jobs').GenJob} */ (this.job).take(produced, this.branch);
    this.emitToken(produced.text, this.tokens.length + (committed ? 0 : 1), committed ? 'draft' : null);
    if (!reason) return true;
    if (!committed) this.keepLast(produced.token);
    this.endJob(reason);
    return false;
  }

  /**
   * A speculative step's outcome: the accepted draft tokens (already decoded) are taken like
   * sampled ones, and the token verification sampled next is kept for the next step.
   */
  verified({ token, accepted, next, drafted }) {
    const gen = /** @type {import('./jobs').GenJob} */ (this.job);
    this.written.draftTokens += drafted;
    this.written.acceptedDraftTokens += accepted.length;
    for (const produced of accepted) {
      if (this.job !== gen) return;
      this.take(produced, true);
    }
    if (this.job === gen) gen.drafted(token, accepted, next);
  }

  /** A peek reads the logits the line holds (its pending tokens are in): nothing to decode. */
  peek() {
    const job = /** @type {import('./jobs').PeekJob} */ (this.job);
    this.job = null;
    job.read(this.branch);
  }

  /**
   * The gen's last token, sampled but not decoded (nothing samples after it): a program's line
   * keeps it pending for its next use; a request's choice accepts it, so perplexity counts it.
   */
  keepLast(token) {
    this.tokens.push(token);
    if (/** @type {import('./jobs').GenJob} */ (this.job).choice) {
      try {
        this.branch.accept(token);
      } catch {
        // perplexity then leaves the last token out; the text is complete either way
      }
      return;
    }
    this.pending.push(token);
  }

  /** The token `take` kept is in the KV now. */
  committed(token) {
    this.tokens.push(token);
    this.written.cells++;
  }

  /**
   * The line's `token` event (`n`: its length with the token; `mark`: 'draft' for an accepted
   * draft token, 'forced' for scored tokens, which carry no perplexity).
   * @param {string} text @param {number} n @param {'draft' | 'forced' | null} [mark]
   */
  emitToken(text, n, mark = null) {
    if (!this.env.events.on) return;
    const ppl = mark === 'forced' ? {} : { ppl: perplexityOf(this.branch) };
    this.emit('token', { branch: this.id, text, n, ...ppl, ...(mark ? { [mark]: true } : {}) });
  }

  /** Settles the job in flight: a gen with `reason` as its finishReason, or rejected with `error`. */
  endJob(reason, error) {
    const job = this.job;
    if (!job) return;
    this.job = null;
    // A prompt nobody will finish filling must not keep others waiting to fork it.
    if (this.segment && !this.needed) this.dropSegment();
    if (error) return void job.finish(null, error);
    const gen = /** @type {import('./jobs').GenJob} */ (job);
    const ppl = perplexityOf(this.branch);
    if (gen.choice) gen.choice.perplexity = this.perplexity();
    const result = gen.finish(reason);
    this.text += result.text;
    if (this.env.events.on) {
      const n = this.tokens.length;
      this.emit('finish', { branch: this.id, reason: result.finishReason, n, ppl });
    }
    if (this.chat === 'open') this.chat = 'replied';
    if (gen.choice) {
      // A request's choice is done with its branch: it goes back now, not at the next step.
      this.release(false);
      this.free(false, [], null);
    }
  }

  /** The branch's perplexity (Infinity when it cannot be read). */
  perplexity() {
    try {
      return this.branch && !this.branch.disposed ? this.branch.perplexity : Infinity;
    } catch {
      return Infinity; // busy or disposed
    }
  }

  /**
   * Gives the branch back (when no child still waits to fork it, unless `force`); the prune's
   * promise goes into `prunes`. A job still in flight rejects with `error` (its program's ended
   * error: given whenever the line has a job).
   */
  free(force, prunes, error) {
    if (this.state === 'freed' || (!force && this.dependents > 0)) return;
    this.dropSegment();
    if (this.job) this.endJob(null, error);
    if (this.holdsLease && !this.branch.disposed) prunes.push(this.branch.prune().catch(() => {}));
    this.state = 'freed';
    this.branch = null;
    for (const entry of this.pins) this.env.cache.unpin(entry);
    this.pins = [];
    this.parent = null;
  }
}

module.exports = { Line };
