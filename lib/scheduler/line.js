'use strict';

/**
 * The Scheduler's side of one line of generation: a branch, the line's tokens (those in its KV,
 * then `pending` ones) and at most ONE job at a time (./jobs.js). A line never decodes by itself:
 * each step the Scheduler asks what it needs — a branch (`materialize`), its pending tokens
 * prefilled (`wantsPrefill`), a token sampled (`decoding`, `take`) — and serves it in the same
 * decode as everything else. The user's `ProgramLine` (lib/ProgramLine.js) holds one privately.
 *
 * `state`: 'waiting' (no branch yet) → 'live' → 'freed'. A line never calls its program: it is
 * given a `LineEnv`, and what its program counts (its `tally`, `cached`, `starts`) is the line's own
 * state, read by the program and by ./programs.js, which also decide whose failure a line's is.
 */

const { makeError } = require('../errors');
const { MIN_PARTIAL_REUSE } = require('./prefix-cache');
const { clipped, perplexityOf } = require('./events');
const { SchedulerErrorCode: Code, schedulerError } = require('./errors');
const { ScoreJob } = require('./jobs');

/**
 * What a program's lines wrote, for its leases, usage and maxCells (each line counts its own in,
 * and a freed line's stay): leases taken (a line's branch, a fork of each cache entry it filled),
 * KV cells committed, tokens taken by gens, draft tokens drafted and accepted.
 */
class Tally {
  constructor() {
    this.leases = 0;
    this.cells = 0;
    this.completionTokens = 0;
    this.draftTokens = 0;
    this.acceptedDraftTokens = 0;
  }
}

/**
 * `program`: its id in the events; `hinted`: the cache entries its lines fill are kept warm (a
 * request's cacheKey); `tally`: its program's, which the line counts what it writes into.
 * @typedef {{ ctx: any, cache: any, events: import('./events').SchedulerEvents, program: string, hinted: boolean, tally: Tally }} LineEnv
 */

class Line {
  /**
   * @param {LineEnv} env
   * @param {string} id the line's id in the events (`p1.0`, `p1.1`, ...)
   * @param {import('./line-start').LineStart} start how it gets its KV (./line-start.js): a fork of its parent, fresh, or a prompt
   * @param {number[]} tokens its tokens so far (a fork: a copy of the parent's at the fork point)
   */
  constructor(env, id, start, tokens) {
    const parent = start.parent;
    this.env = env;
    this.id = id;
    this.kv = start;
    /** @type {Line | null} the line it forks until it took its branch (null: a fresh line) */
    this.parent = parent;
    this.tokens = tokens;
    this.pending = parent ? [] : tokens.slice();
    /** The parent's token count at the fork: this line's branch forks the parent there. */
    this.anchor = tokens.length - this.pending.length;
    /** @type {string} what was appended as text and what its gens produced (a fork starts with its parent's) */
    this.text = parent ? parent.text : '';
    this.state = 'waiting';
    this.branch = null;
    /** @type {Line[]} forks of this line that have not taken their branch from it yet */
    this.waitingForks = [];
    /** @type {import('./jobs').GenJob | import('./jobs').ScoreJob | import('./jobs').PeekJob | null} */
    this.job = null;
    /** Stop strings every gen adds (the chat template's end of turn). */
    this.stops = parent ? parent.stops : [];
    /** null (the line did not start with messages), 'open' (the assistant's turn is open) or 'replied'. */
    this.chat = parent ? parent.chat : null;
    /** A select or multi-token logprob runs on this line (its options are scored in forks). */
    this.selecting = false;
    this.released = false;
    /**
     * Prompts with images among its pending positions, in order: each a MediaPrompt and the line
     * position it starts at, prefilled by ./media.js (the text around them by the batched prefill).
     * @type {{ prompt: any, at: number }[]}
     */
    this.media = [];
    /** Prompt tokens its start took from the prefix cache, and how often it started (again after a failed branch). */
    this.cached = 0;
    this.starts = 0;
    if (parent) parent.waitingForks.push(this);
    this.emit('fork', { branch: this.id, parent: parent ? parent.id : null, at: parent ? this.anchor : 0 });
  }

  emit(type, fields) {
    if (this.env.events.on) this.env.events.emit(type, { request: this.env.program, ...fields });
  }

  /** It took its branch, or never will: it no longer waits on its parent. */
  leaveParent() {
    const at = this.parent.waitingForks.indexOf(this);
    if (at !== -1) this.parent.waitingForks.splice(at, 1);
    this.parent = null;
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

  /**
   * Appends `tokens` (and the `text` they stand for), decoded when the line next needs its KV;
   * after an open chat turn, they are the assistant's reply.
   */
  push(tokens, text) {
    this.tokens.push(...tokens);
    this.pending.push(...tokens);
    this.text += text;
    if (this.chat === 'open' && (tokens.length > 0 || text !== '')) this.chat = 'replied';
    if (this.env.events.on) this.emit('append', { branch: this.id, text: clipped(text), n: this.tokens.length });
  }

  /** Appends a chat turn up to the assistant's, whose reply is open then (`stops`: a first turn's end-of-turn strings). */
  pushTurn(tokens, text, stops = this.stops) {
    this.stops = stops;
    this.push(tokens, text);
    this.chat = 'open';
  }

  /** Appends `tokens` to score and starts scoring them (a logits row each); resolves with their log-probabilities. */
  score(tokens) {
    this.tokens.push(...tokens);
    this.pending.push(...tokens);
    return this.start(new ScoreJob(tokens.length));
  }

  /** A select or multi-token logprob scores its options in forks of the line (`on`), or is done. */
  setSelecting(on) {
    this.selecting = on;
  }

  /**
   * Appends a prompt with images (`prompt`, a MediaPrompt): `tokens` (its text tokens and its
   * images' keys, ./image-keys.js), `images` their places in the line, and `text` what the line's
   * text shows of it; its positions are prefilled by ./media.js.
   */
  pushMedia(prompt, tokens, images, text) {
    this.media.push({ prompt, at: this.tokens.length });
    this.kv.addImages(images);
    this.push(tokens, text);
  }

  /** The prompt with images whose positions come next (null: none pending; one a cached start covered is dropped). */
  get nextMedia() {
    while (this.media.length > 0 && this.filled >= this.media[0].at + this.media[0].prompt.nPos) this.media.shift();
    return this.media.length > 0 ? this.media[0] : null;
  }

  /** The tokens just appended are in the branch already (adopted from the scorer that decoded them). */
  pendingDecoded() {
    this.pending = [];
  }

  /** Starts `job` on the line (served from the next step on); resolves with its result. */
  start(job) {
    this.job = job;
    return job.done.promise;
  }

  /** `job` will not run after all (its grammar failed to convert): the line is idle again. */
  cancel(job) {
    if (this.job === job) this.job = null;
  }

  /**
   * Takes the branch of `winner`, a scoring line holding this line's tokens then exactly the
   * winner's (logits included), so the winner, appended next, is not decoded again; the scorer
   * frees this line's old branch. False when either line is not in a state to swap.
   */
  adopt(winner) {
    if (!winner || winner.state !== 'live' || winner.pending.length > 0 || winner.waitingForks.length > 0) return false;
    // Forks still waiting on this line fork it at their anchor, before the winner (forkAt there
    // would decode a token again, and is refused past a sliding window).
    if (this.state !== 'live' || this.pending.length > 0 || this.waitingForks.length > 0 || this.released) return false;
    [this.branch, winner.branch] = [winner.branch, this.branch];
    return true;
  }

  /**
   * Gives the branch back at the next step (a job in flight rejects with ERR_ABORTED); idempotent.
   * `announce`: a `prune` event (a request's choice ends with its `finish` alone).
   */
  release(announce = true) {
    if (this.released || this.state === 'freed') return;
    this.released = true;
    if (announce) this.emit('prune', { branch: this.id });
    if (this.job) this.endJob(null, makeError('ERR_ABORTED', 'the line was released while it generated'));
    if (this.parent) this.leaveParent();
  }

  // -------------------------------------------------------------------------------------------
  // What the Scheduler asks of it, between and within its steps.

  /** Whether the line needs its KV now: a job runs on it, or a fork waits to fork it. */
  get needed() {
    return this.state !== 'freed' && (this.job !== null || this.waitingForks.length > 0);
  }

  /** Tokens in the branch's KV. */
  get filled() {
    return this.tokens.length - this.pending.length;
  }

  get wantsPrefill() {
    return this.state === 'live' && this.needed && this.pending.length > 0;
  }

  /** Whether the line samples (or peeks) this step. */
  get decoding() {
    return this.job !== null && this.job.kind !== 'score' && this.state === 'live' && this.pending.length === 0;
  }

  /** Released, and no fork waits to fork it: free it at the next step. */
  get collectable() {
    return this.released && this.state !== 'freed' && this.waitingForks.length === 0;
  }

  /** Whether the line holds a lease of its program's: a branch of its own (not a cache entry's). */
  get holdsLease() {
    return this.state === 'live' && !this.kv.borrowed;
  }

  /** Cells the gen running on the line may still write (0: none runs). */
  get genCellsLeft() {
    return this.job !== null && this.job.kind === 'gen' ? this.job.maxTokens - this.job.tokens.length : 0;
  }

  /** Pending tokens a score job still scores (the last ones). */
  get scoring() {
    return this.job !== null && this.job.kind === 'score' ? this.job.left : 0;
  }

  /**
   * Where the scored tokens start in a prefill of the first `take` pending tokens (undefined: none
   * there — a forkAt fork re-decodes one token before them first).
   */
  scoreFrom(take) {
    const start = this.pending.length - this.scoring;
    return this.scoring > 0 && start < take ? start : undefined;
  }

  /**
   * Gives a needed waiting line (its program has a lease for it) its branch: a fork of its parent
   * once the parent's KV reaches the anchor, or for a fresh line `startFresh`. True when the line
   * now has a branch and its own text is worth a cache entry (`openSegment`) if a lease is spare.
   */
  materialize() {
    const parent = this.parent;
    if (!parent) return this.startFresh();
    if (this.forkFromCache()) return false;
    if (parent.state !== 'live' || parent.filled < this.anchor) return false;
    if (parent.filled === this.anchor) {
      this.took(parent.branch.fork());
    } else if (parent.tokens[this.anchor - 1] < 0) {
      // The fork point ends an image: its last position cannot be decoded alone, so the fork
      // takes the cells without the logits there; its own pending tokens give it logits.
      if (this.pending.length === 0)
        throw schedulerError(
          Code.PROGRAM_STATE,
          'fork(): this line went on past an image its fork ends with; append text to the fork before it generates, or fork before going on',
        );
      this.took(parent.branch.forkAt(this.anchor));
    } else {
      // The parent went on past the fork point: fork it one token before and decode that token
      // again, for the logits at the fork point.
      this.took(parent.branch.forkAt(this.anchor - 1));
      this.pending.unshift(parent.tokens[this.anchor - 1]);
    }
    this.leaveParent();
    // The next fork of the same state with the same text (a decision's question asked again, a
    // sub-agent's instructions) may start from it.
    return this.pending.length >= MIN_PARTIAL_REUSE;
  }

  /**
   * A fork whose own text (appended after the fork point) is cached forks the cache entry instead
   * of its parent, and decodes only the rest. False when no ready entry holds more than the parent.
   */
  forkFromCache() {
    const wanted = this.tokens.length - this.scoring; // tokens to score are decoded by the line
    const cached = this.kv.fromCache(this.env.cache, this.tokens.slice(0, wanted), this.anchor);
    if (!cached) return false;
    this.took(cached.branch);
    this.pending = this.tokens.slice(cached.length);
    this.started(cached.length - this.anchor);
    this.leaveParent();
    return true;
  }

  started(cached) {
    this.cached = cached;
    this.starts++;
  }

  /** The line's own branch (a lease of its program's). */
  took(branch) {
    this.branch = branch;
    this.state = 'live';
    this.env.tally.leases++;
  }

  /**
   * A fresh line's start (./line-start.js `fresh`): its prompt then becomes a cache entry (see
   * openSegment; a program's only if a lease is spare: the returned true asks). Nothing happens
   * while the prefix it wants is still being filled by someone else.
   */
  startFresh() {
    // Tokens to score must be decoded by the line itself (their logits rows are the score); the
    // first of them is scored from the logits at the fork point, which a partial fork lacks.
    const wanted = this.pending.length - this.scoring;
    const start = this.kv.fresh(this.env, this.pending.slice(0, wanted), this.pending.length);
    if (!start) return false;
    this.started(start.length);
    if (this.kv.borrowed) {
      this.branch = start.take(); // the whole prompt is cached, logits included
      this.state = 'live';
      this.pending = [];
      return false;
    }
    this.took(start.take());
    this.pending = this.pending.slice(start.length);
    const prompt = this.kv.cachePoints !== null;
    if (prompt) this.openSegment();
    return !prompt && this.pending.length >= MIN_PARTIAL_REUSE;
  }

  /** The line's branch fills a cache entry from now on (./line-start.js `open`); a prompt to score is nobody's. */
  openSegment() {
    if (this.scoring === 0) this.kv.open(this.env, this.tokens, this.filled, this.branch);
  }

  /** Where the cache entry being filled ends (null: none): a prefill stops there first. */
  get segmentEnd() {
    return this.kv.segmentEnd;
  }

  /** Whether prefilling `take` more tokens fills a cache entry no lease was reserved for (a program's line). */
  fillsUnreservedEntry(take) {
    return this.kv.fillsUnreserved(this.filled + take);
  }

  /** The cache entry is filled (`spare`: a lease is spare now, asked when `fillsUnreservedEntry`). */
  cacheFilled(spare) {
    const next = this.kv.filled(this.env.cache, this.pending.length === 0, spare);
    if (!next) return;
    this.branch = next.branch;
    if (!next.lease) return;
    this.env.tally.leases++; // the fork: the filled branch is the cache's now
    if (this.pending.length > 0) this.openSegment();
  }

  /** An unfilled cache entry of this line leaves the cache (the line frees its branch itself). */
  dropSegment() {
    this.kv.drop(this.env.cache);
  }

  /**
   * Where a scoring line's prefill stops this step: the next point where a line forked ahead of
   * it (a `select` path where options part) waits to fork it, so that the fork takes the KV and
   * logits there instead of decoding a token again (`filled`: one waits right there, for a lease a
   * line released this step still holds until the next step frees it).
   */
  nextForkPoint() {
    let at = Infinity;
    for (const line of this.waitingForks) {
      if (line.state === 'waiting' && line.needed && line.anchor >= this.filled) at = Math.min(at, line.anchor);
    }
    return at;
  }

  /** `count` pending tokens are in the KV now (`logprobs`: the scored ones'; `spare`: see cacheFilled). */
  prefilled(count, logprobs, spare) {
    const from = this.scoreFrom(count);
    const scored = from === undefined ? null : this.pending.slice(from, count);
    this.pending = this.pending.slice(count);
    if (this.segmentEnd === this.filled) this.cacheFilled(spare);
    if (!scored) return;
    if (this.env.events.on)
      this.emitToken(scored.map((t) => this.env.ctx.tokenToText(t)).join(''), this.filled, 'forced');
    if (/** @type {import('./jobs').ScoreJob} */ (this.job).scored(scored, logprobs)) this.job = null;
  }

  /** Takes a produced token into the gen (`committed`: an accepted draft token); true: commit it now. */
  take(produced, committed = false) {
    if (produced.isStop) {
      this.endJob('stop');
      return false;
    }
    if (committed) this.committed(produced.token);
    this.env.tally.completionTokens++;
    const reason = /** @type {import('./jobs').GenJob} */ (this.job).take(produced, this.branch);
    this.emitToken(produced.text, this.tokens.length + (committed ? 0 : 1), committed ? 'draft' : null);
    if (!reason) return true;
    if (!committed) this.keepLast(produced.token);
    this.endJob(reason);
    return false;
  }

  /** A speculative step's outcome: accepted draft tokens are taken, the token sampled next kept for the next step. */
  verified({ token, accepted, next, drafted }) {
    const gen = /** @type {import('./jobs').GenJob} */ (this.job);
    this.env.tally.draftTokens += drafted;
    this.env.tally.acceptedDraftTokens += accepted.length;
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
    this.env.tally.cells++;
  }

  /**
   * `n`: the line's length with the token; `mark`: 'draft' (an accepted draft token) or 'forced'
   * (scored tokens, which carry no perplexity).
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
    if (!this.needed) this.dropSegment();
    if (error) return void job.finish(null, error);
    const gen = /** @type {import('./jobs').GenJob} */ (job);
    const ppl = perplexityOf(this.branch);
    const result = gen.finish(reason, null, gen.choice ? this.perplexity() : Infinity);
    this.text += result.text;
    this.emit('finish', { branch: this.id, reason: result.finishReason, n: this.tokens.length, ppl });
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
   * Gives the branch back (unless a fork still waits to fork it and not `force`), its prune's
   * promise into `prunes`; a job still in flight rejects with `error` (its program's ended error).
   */
  free(force, prunes, error) {
    if (this.state === 'freed' || (!force && this.waitingForks.length > 0)) return;
    this.kv.free(this.env.cache);
    if (this.job) this.endJob(null, error);
    if (this.holdsLease && !this.branch.disposed) prunes.push(this.branch.prune().catch(() => {}));
    this.state = 'freed';
    this.branch = null;
    this.parent = null;
  }
}

module.exports = { Line, Tally };
