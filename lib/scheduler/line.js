'use strict';

/**
 * The Scheduler's side of one line of generation: a branch, the line's tokens (those in its KV,
 * then `pending` ones not decoded yet), and at most ONE job at a time:
 *
 *   GenJob    sample a token per step: stops, maxTokens, log-probabilities, events
 *   ScoreJob  prefill tokens as a scored entry (a logits row each) and resolve their log-probabilities
 *   PeekJob   read one token's log-probability from the logits the line holds (no decode)
 *
 * A line never decodes by itself. Each step the Scheduler asks it what it needs — a branch
 * (`materialize`: a fork of its parent once the parent's KV reaches the fork point, or the
 * longest cached prefix of its prompt), its pending tokens prefilled (`wantsPrefill`,
 * `prefilled`), a token sampled (`decoding`, `take`, `committed`) — and serves it in the same
 * decode as everything else. The user's `ProgramLine` (lib/ProgramLine.js) holds one privately.
 */

const { makeError } = require('../errors');
const { StopMatcher } = require('./stops');
const { MIN_PARTIAL_REUSE } = require('./prefix-cache');
const { clipped, perplexityOf } = require('./events');
const { SchedulerErrorCode: Code, schedulerError } = require('./errors');

/** What `forkCached` says when the prompt's cache entry is still being filled by someone else. */
const WAIT = Symbol('wait');

/** A promise and the functions that settle it. */
function deferred() {
  let resolve, reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve: /** @type {any} */ (resolve), reject: /** @type {any} */ (reject) };
}

/** `{token, text, logprob, top}` of a sampled token, read from the logits it was sampled from. */
function tokenLogprob(branch, produced, top) {
  const { logprob, top: best } = branch.logprob(produced.token, top);
  return { token: produced.token, text: produced.text, logprob, top: best };
}

/** A gen: one token sampled per step until a stop, an end-of-generation token or maxTokens. */
class GenJob {
  /**
   * @param {{ maxTokens: number, stops: string[], params: any, grammar: string | null, logprobs?: number }} options
   */
  constructor({ maxTokens, stops, params, grammar, logprobs }) {
    this.maxTokens = maxTokens;
    this.matcher = new StopMatcher(stops);
    this.params = params;
    this.grammar = grammar;
    /** Top alternatives per token when log-probabilities were asked for, else undefined. */
    this.logprobs = logprobs;
    this.tokenLogprobs = [];
    this.tokens = [];
    /** The line's sampler has the gen's params and grammar (set before its first sample). */
    this.armed = false;
    this.done = deferred();
  }

  /** Before the first sample: the line's sampler gets the gen's params and grammar (throws when refused). */
  arm(branch) {
    if (this.armed) return;
    branch.setSamplerParams(this.params);
    // setSamplerParams keeps a grammar it is not given: an earlier gen's (complete) grammar
    // would allow nothing but end-of-generation.
    branch.setGrammar(this.grammar || null);
    this.armed = true;
  }

  /** Takes a produced token; true when it is to be committed (decoded) now. */
  take(line, produced) {
    if (produced.isStop) {
      line.endJob('stop');
      return false;
    }
    this.tokens.push(produced.token);
    this.matcher.push(produced.text);
    line.emitToken(produced.text, line.tokens.length + 1); // the sampled token is not committed yet
    if (this.logprobs !== undefined) this.tokenLogprobs.push(tokenLogprob(line.branch, produced, this.logprobs));
    line.program.usage.completionTokens++;
    const reason = this.matcher.stopped ? 'stop' : this.tokens.length >= this.maxTokens ? 'length' : null;
    if (!reason) return true;
    // Nothing is sampled after the last token now: it waits in `pending` for the line's next use.
    line.tokens.push(produced.token);
    line.pending.push(produced.token);
    line.endJob(reason);
    return false;
  }

  /** The gen's result, once it ended with `reason`. */
  finish(reason) {
    this.matcher.flush();
    const result = { text: this.matcher.text, tokens: this.tokens, finishReason: reason };
    if (this.logprobs !== undefined) result.logprobs = this.tokenLogprobs;
    this.done.resolve(result);
    return result;
  }
}

/** Scoring: the line's last `count` pending tokens are prefilled with a logits row each. */
class ScoreJob {
  constructor(count) {
    this.left = count;
    this.logprobs = [];
    this.done = deferred();
  }

  /**
   * Where the scored tokens start in a prefill entry of the line's first `take` pending tokens,
   * or undefined when the entry holds none of them (a forkAt fork re-decodes one token first).
   */
  scoreFrom(line, take) {
    const start = line.pending.length - this.left;
    return start < take ? start : undefined;
  }

  /** `tokens` were scored with these `logprobs`; resolves after the last. */
  scored(line, tokens, logprobs) {
    this.logprobs.push(...logprobs);
    this.left -= tokens.length;
    if (line.program.events.on) {
      const text = tokens.map((t) => line.program.ctx.tokenToText(t)).join('');
      line.program.emit('token', { branch: line.id, text, n: line.filled, forced: true });
    }
    if (this.left > 0) return;
    line.job = null;
    this.done.resolve(this.logprobs);
  }
}

/** A single-token log-probability read from the logits the line holds once its pending tokens are in. */
class PeekJob {
  constructor(token, top) {
    this.token = token;
    this.top = top;
    this.done = deferred();
  }

  read(line) {
    line.job = null;
    try {
      const { logprob, top } = line.branch.logprob(this.token, this.top);
      this.done.resolve({ logprob, top });
    } catch (e) {
      this.done.reject(e);
    }
  }
}

class Line {
  /**
   * @param {any} program the program the line belongs to (./program.js)
   * @param {Line | null} parent the line this one forks (null: a fresh line)
   * @param {number[]} tokens the line's tokens so far (a copy of the parent's at the fork point)
   */
  constructor(program, parent, tokens) {
    this.program = program;
    this.parent = parent;
    /** Every token of the line: what is in its KV, then `pending`. */
    this.tokens = tokens;
    /** Tokens of the line not yet in its branch's KV (prefilled when the line next needs them). */
    this.pending = parent ? [] : tokens.slice();
    /** The parent's token count at the fork: this line's branch forks the parent there. */
    this.anchor = tokens.length - this.pending.length;
    this.text = '';
    this.branch = null;
    /** Lines forked from this one that have not taken their branch from it yet. */
    this.dependents = 0;
    /** @type {GenJob | ScoreJob | PeekJob | null} the job in flight */
    this.job = null;
    /** The cache entry this line's branch is filling (its prompt, for others to fork), if any. */
    this.segment = null;
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
    /** The branch was given back: nothing more happens on this line. */
    this.freed = false;
    /** The line's id in the scheduler's events (`p1.0`, `p1.1`, ...). */
    this.id = program.lineId();
    program.lines.push(this);
    program.emit('fork', { branch: this.id, parent: parent ? parent.id : null, at: parent ? this.anchor : 0 });
  }

  // -------------------------------------------------------------------------------------------
  // What the user's ProgramLine does through it.

  /** Throws unless the line can start `op` (the program runs, the line is live and idle). */
  checkIdle(op) {
    const program = this.program;
    if (program.state !== 'running') throw program.endedError();
    if (this.released || this.freed)
      throw schedulerError(Code.PROGRAM_STATE, `${op}(): this line was released; use another line`);
    if (this.job || this.selecting)
      throw schedulerError(Code.PROGRAM_STATE, `${op}(): a gen or select is running on this line; await it first`);
  }

  /** Appends `tokens` (and the `text` they stand for) to the line; decoded when it next needs its KV. */
  push(tokens, text) {
    this.tokens.push(...tokens);
    this.pending.push(...tokens);
    this.text += text;
    if (this.program.events.on)
      this.program.emit('append', { branch: this.id, text: clipped(text), n: this.tokens.length });
  }

  /** Starts `job` on the line; resolves with its result. */
  start(job) {
    this.job = job;
    this.program.wake();
    return job.done.promise;
  }

  /**
   * `n` children of this line (or fresh lines when it is empty); leases were reserved. `at`: the
   * children's tokens, when they fork the line further on than it is now (a `select` path forked
   * ahead, where its options part).
   */
  spawn(n, at = this.tokens) {
    const children = [];
    for (let i = 0; i < n; i++) {
      const fresh = this.tokens.length === 0;
      const child = new Line(this.program, fresh ? null : this, at.slice());
      child.text = this.text;
      if (!fresh) this.dependents++;
      children.push(child);
    }
    return children;
  }

  /**
   * The winner's scoring line holds this line's tokens and then exactly the winner's, with the
   * logits after its last: the two swap branches (the scorer then frees this line's old one), so
   * the winner, appended next, need not be decoded again. False when that cannot be (no such
   * line, it is not in a state to give its branch, or a fork of this line still waits to fork it
   * where it is).
   */
  adopt(winner) {
    if (!winner || !winner.branch || winner.pending.length > 0 || winner.dependents > 0) return false;
    // Forks of this line still waiting for its branch fork it at their anchor, before the winner
    // (forkAt there would decode a token again, and is refused past a sliding window).
    if (!this.branch || this.pending.length > 0 || this.dependents > 0 || this.released) return false;
    [this.branch, winner.branch] = [winner.branch, this.branch];
    return true;
  }

  /** Gives the line's branch back at the next step (a job in flight rejects with ERR_ABORTED). Idempotent. */
  release() {
    if (this.released || this.freed) return;
    this.released = true;
    this.program.emit('prune', { branch: this.id });
    if (this.job) this.endJob(null, makeError('ERR_ABORTED', 'the line was released while it generated'));
    if (this.parent) {
      this.parent.dependents--; // it will never fork the parent now
      this.parent = null;
    }
    this.program.wake();
  }

  // -------------------------------------------------------------------------------------------
  // What the Scheduler asks of it, between and within its steps.

  /** Whether the line needs its KV now: a job runs on it, or a child waits to fork it. */
  get needed() {
    return !this.freed && (this.job !== null || this.dependents > 0);
  }

  /** Tokens in the branch's KV. */
  get filled() {
    return this.tokens.length - this.pending.length;
  }

  /** Whether the line's pending tokens should be prefilled this step. */
  get wantsPrefill() {
    return this.branch !== null && this.needed && this.pending.length > 0;
  }

  /** Whether the line samples (or peeks) this step. */
  get decoding() {
    return this.job !== null && !(this.job instanceof ScoreJob) && this.branch !== null && this.pending.length === 0;
  }

  /** Whether the line has been released and no child waits to fork it: free it at the next step. */
  get collectable() {
    return this.released && !this.freed && this.dependents === 0;
  }

  /** The scored tokens' start within a prefill entry of `take` pending tokens (see ScoreJob). */
  scoreFrom(take) {
    return this.job instanceof ScoreJob ? this.job.scoreFrom(this, take) : undefined;
  }

  /**
   * Gives a needed line its branch: a fork of its parent once the parent's KV reaches the
   * anchor; a fresh line forks the longest cached prompt prefix, or starts empty. Returns
   * whether the line has a branch now.
   */
  materialize(cache, createBranch, spareLease) {
    if (this.branch) return true;
    if (!this.needed) return false;
    const program = this.program;
    // Lines released this step still hold their leases until the next step frees them: wait
    // rather than take more than the program declared (and was admitted with).
    if (program.leasesHeld >= program.maxBranches) return false;
    const parent = this.parent;
    if (parent) {
      if (!parent.branch || parent.filled < this.anchor) return false;
      if (parent.filled === this.anchor) {
        this.branch = parent.branch.fork();
      } else {
        // The parent went on past the fork point: take its KV up to one token before it and
        // decode that token again, for the logits at the fork point.
        this.branch = parent.branch.forkAt(this.anchor - 1);
        this.pending.unshift(parent.tokens[this.anchor - 1]);
      }
      parent.dependents--;
      this.parent = null;
    } else {
      const cached = this.forkCached(cache);
      if (cached === WAIT) return false;
      this.branch = cached || this.openCacheEntry(cache, createBranch(), spareLease);
    }
    program.leasesHeld++;
    return true;
  }

  /** A fork of the longest cached prefix of the line's tokens (never all but logits-less). */
  forkCached(cache) {
    // Tokens to score must be decoded by the line itself (their logits rows are the score); the
    // first of them is scored from the logits at the fork point, which a partial fork lacks.
    const scored = this.job instanceof ScoreJob ? this.job.left : 0;
    const start = cache.bestStart(this.pending.slice(0, this.pending.length - scored));
    const { entry } = start;
    if (!entry) return null;
    const length = start.partial ? Math.min(start.length, this.pending.length - 1 - scored) : start.length;
    if (length <= 0) return null;
    // Another line or request is filling this prompt: fork it once it is filled that far.
    if (!entry.ready && entry.branch.position < length) return WAIT;
    cache.unpin(cache.pin(entry)); // refreshes its place in the LRU order
    const branch = start.partial ? entry.branch.forkAt(length) : entry.branch.fork();
    this.pending = this.pending.slice(length);
    this.program.usage.cachedPromptTokens += length;
    return branch;
  }

  /**
   * A fresh line's prompt becomes a cache entry while the line fills it (when a lease is free
   * beyond every reservation, for the entry to keep once filled), so that programs and
   * requests starting with the same text fork it instead of prefilling it again.
   */
  openCacheEntry(cache, branch, spareLease) {
    if (this.job instanceof ScoreJob) return branch; // a BOS + option to score: nobody's prompt
    if (this.pending.length >= MIN_PARTIAL_REUSE && spareLease()) {
      this.segment = cache.pin(cache.open(this.pending.slice(), branch));
    }
    return branch;
  }

  /** The cache entry is filled: the cache keeps that branch, the line goes on in a fork of it. */
  cacheFilled(cache) {
    const entry = this.segment;
    this.segment = null;
    cache.unpin(entry);
    try {
      this.branch = entry.branch.fork();
      cache.filled(entry);
    } catch {
      cache.forget(entry); // no lease after all: the line keeps the branch, nothing is cached
    }
  }

  /** An unfilled cache entry of this line leaves the cache (the line frees its branch itself). */
  dropSegment(cache) {
    if (!this.segment) return;
    cache.unpin(this.segment);
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
    for (const line of this.program.lines) {
      if (line.parent === this && !line.branch && line.needed && line.anchor >= this.filled)
        at = Math.min(at, line.anchor);
    }
    return at;
  }

  /** `count` pending tokens are in the KV now (`logprobs`: the scored ones'); returns `count`. */
  prefilled(count, cache, logprobs) {
    const from = this.scoreFrom(count);
    const scored = from === undefined ? null : this.pending.slice(from, count);
    this.pending = this.pending.slice(count);
    this.program.cellsUsed += count;
    this.program.usage.promptTokens += count;
    if (this.segment && this.pending.length === 0) this.cacheFilled(cache);
    if (scored) /** @type {ScoreJob} */ (this.job).scored(this, scored, logprobs);
    return count;
  }

  /** Takes a produced token into the gen; true when it is to be committed (decoded) now. */
  take(produced) {
    return /** @type {GenJob} */ (this.job).take(this, produced);
  }

  /** The token `take` kept is in the KV now. */
  committed(token) {
    this.tokens.push(token);
    this.program.cellsUsed++;
  }

  /** A `token` event of this line (`n`: its length with the token). */
  emitToken(text, n) {
    if (this.program.events.on)
      this.program.emit('token', { branch: this.id, text, n, ppl: perplexityOf(this.branch) });
  }

  /** Settles the job in flight: a gen with `reason` as its finishReason, or rejected with `error`. */
  endJob(reason, error) {
    const job = this.job;
    if (!job) return;
    this.job = null;
    // A prompt nobody will finish filling must not keep others waiting to fork it.
    if (this.segment && !this.needed) this.dropSegment(this.program.cache);
    if (error) {
      job.done.reject(error);
      return;
    }
    const { text } = /** @type {GenJob} */ (job).finish(reason);
    this.text += text;
    if (this.program.events.on)
      this.program.emit('finish', { branch: this.id, reason, n: this.tokens.length, ppl: perplexityOf(this.branch) });
    if (this.chat === 'open') this.chat = 'replied';
  }

  /**
   * Gives the branch back (when no child still waits to fork it, unless `force`); the prune's
   * promise goes into `prunes`.
   */
  free(force, prunes) {
    if (this.freed || (!force && this.dependents > 0)) return;
    this.dropSegment(this.program.cache);
    if (this.job) this.endJob(null, this.program.endedError());
    this.freed = true;
    if (this.branch) {
      if (!this.branch.disposed) prunes.push(this.branch.prune().catch(() => {}));
      this.branch = null;
      this.program.leasesHeld--;
    }
    this.parent = null;
  }
}

module.exports = { Line, GenJob, ScoreJob, PeekJob, tokenLogprob };
