'use strict';

/**
 * The Scheduler's side of one line of generation: a branch, its tokens (those in its KV, then
 * pending ones) and at most ONE job at a time (./jobs.js). It never decodes by itself: each step
 * asks what it needs — a branch (`materialize`), a prefill (`wantsPrefill`), a sample (`decoding`,
 * `take`) — and serves it in the same decode as everything else. How it gets its KV, and the
 * cache entries it fills, is the `lineStart` it is given (./line-start.js). `state`: 'waiting' (no branch
 * yet) → 'live' ⇄ 'parked' (its branch parked: no lease, no cells, ./programs.js `moveLines`) →
 * 'freed'. The user's `ProgramLine` (lib/ProgramLine.js) holds one.
 */

const { makeError } = require('../errors');
const { branchPerplexity } = require('./events');
const { ScoreJob } = require('./jobs');

/**
 * `events`: its program's; `hinted`: the entries its lines fill are kept warm longer.
 * @typedef {{ ctx: any, cache: any, events: import('./events').ProgramEvents, hinted: boolean, tally: import('./usage').Tally }} LineEnv
 */

class Line {
  /** @type {LineEnv} */ #env;
  /** @type {import('./line-start').LineStart} */ #lineStart;
  /** @type {number[]} */ #tokens;
  /** @type {number[]} */ #pending;
  #text = '';
  /** @type {string[]} */ #stops = [];
  /** @type {null | 'open' | 'replied'} whether the line started with messages, and its assistant turn */
  #chat = null;
  #state = 'waiting';
  #extra = false;
  #branch = null;
  /** @type {import('./jobs').GenJob | import('./jobs').ScoreJob | import('./jobs').PeekJob | import('./jobs').MoveJob | null} */
  #job = null;
  #released = false;

  /**
   * @param {LineEnv} env @param {string} id the line's id in the events (`p1.0`, `p1.1`, ...)
   * @param {import('./line-start').LineStart} start how it gets its KV: a fork of its parent, fresh, or a prompt
   * @param {number[]} tokens its tokens so far (a fork: a copy of the parent's at the fork point)
   * @param {boolean} [extra] an extra branch (a program's fork, a request's second and later
   *   choice): with a step budget it takes its branch only while the step has time for one more
   *   row (./step-budget.js)
   */
  constructor(env, id, start, tokens, extra = false) {
    const parent = start.parent;
    this.#env = env;
    this.id = id;
    this.#extra = extra;
    this.#lineStart = start;
    this.#tokens = tokens;
    this.#pending = parent ? [] : tokens.slice();
    if (parent) {
      // A fork starts with its parent's text, chat turn and end-of-turn stop strings.
      [this.#text, this.#stops, this.#chat] = [parent.text, parent.stops, parent.chat];
      start.join(this);
    }
    env.events.emit('fork', { branch: id, parent: parent ? parent.id : null, at: start.anchor });
  }

  // What other files read of it (only its own methods change it).
  get tokens() {
    return this.#tokens;
  }
  /** Tokens not in the branch's KV yet. */
  get pending() {
    return this.#pending;
  }
  /** What was appended as text and what its gens produced. */
  get text() {
    return this.#text;
  }
  /** Stop strings every gen adds (the chat template's end of turn). */
  get stops() {
    return this.#stops;
  }
  get chat() {
    return this.#chat;
  }
  get state() {
    return this.#state;
  }
  get extra() {
    return this.#extra;
  }
  get branch() {
    return this.#branch;
  }
  get job() {
    return this.#job;
  }
  get released() {
    return this.#released;
  }
  /** How it gets its KV, and the cache entries it fills (./line-start.js). */
  get lineStart() {
    return this.#lineStart;
  }

  // -------------------------------------------------------------------------------------------
  // What the user's ProgramLine does through it.

  /** Appends `tokens` (and the `text` they stand for); after an open chat turn, they are the assistant's reply. */
  push(tokens, text) {
    this.#tokens.push(...tokens);
    this.#pending.push(...tokens);
    this.#text += text;
    if (this.#chat === 'open' && (tokens.length > 0 || text !== '')) this.#chat = 'replied';
    this.#env.events.append(this.id, text, this.#tokens.length);
  }

  /** Appends a chat turn up to the assistant's, whose reply is open then (`stops`: a first turn's end-of-turn strings). */
  pushTurn(tokens, text, stops = this.#stops) {
    this.#stops = stops;
    this.push(tokens, text);
    this.#chat = 'open';
  }

  /** Appends a prompt with images (a MediaPrompt): its `tokens` (text, image keys), `images` and `text` (./media.js). */
  pushMedia(prompt, tokens, images, text) {
    this.#lineStart.addMedia(prompt, this.#tokens.length, images);
    this.push(tokens, text);
  }

  /** Appends `tokens` to score and starts scoring them (a logits row each); resolves with their log-probabilities. */
  score(tokens) {
    this.#tokens.push(...tokens);
    this.#pending.push(...tokens);
    return this.start(new ScoreJob(tokens.length));
  }

  /** Starts `job` on the line (served from the next step on); resolves with its result. */
  start(job) {
    this.#job = job;
    return job.done.promise;
  }

  /** `job` will not run after all (its grammar failed to convert): the line is idle again. */
  cancel(job) {
    if (this.#job === job) this.#job = null;
  }

  /**
   * Takes the branch of `winner`, a scoring line whose KV holds exactly this line's tokens (none
   * pending, the winning text just appended last), so they are not decoded again (the scorer frees
   * the old branch). False unless so, both are live and no fork waits on either (forks fork at their anchor).
   */
  adopt(winner) {
    const tokens = this.#tokens;
    const holds = (/** @type {Line} */ l) => l.#state === 'live' && l.#lineStart.forks.length === 0;
    if (!winner || !holds(winner) || !holds(this) || this.#released || winner.#pending.length > 0) return false;
    if (winner.#tokens.length !== tokens.length || winner.#tokens.some((t, i) => t !== tokens[i])) return false;
    [this.#branch, winner.#branch] = [winner.#branch, this.#branch];
    this.#pending = [];
    return true;
  }

  /** Gives the branch back at the next step (a job in flight rejects); `announce`: a `prune` event. */
  release(announce = true) {
    if (this.#released || this.#state === 'freed') return;
    this.#released = true;
    if (announce) this.#env.events.emit('prune', { branch: this.id });
    if (this.#job) this.endJob(null, makeError('ERR_ABORTED', 'the line was released while it generated'));
    this.#lineStart.leave(this);
  }

  // -------------------------------------------------------------------------------------------
  // What the Scheduler asks of it, between and within its steps.

  /**
   * Whether the line needs its KV now: a job runs on it, or a fork that needs it waits to fork it
   * (a fork whose job failed to start keeps its place, but not its parent busy).
   */
  get needed() {
    return this.#state !== 'freed' && (this.#job !== null || this.#lineStart.forks.some((fork) => fork.needed));
  }

  /** Tokens in the branch's KV: the line's one progress count (prefilled, cached or decoded alike). */
  get computed() {
    return this.#tokens.length - this.#pending.length;
  }

  get wantsPrefill() {
    return this.#state === 'live' && this.needed && !this.moving && this.#pending.length > 0;
  }

  /** Whether the line samples (or peeks) this step. */
  get decoding() {
    const kind = this.#job === null ? null : this.#job.kind;
    return (kind === 'gen' || kind === 'peek') && this.#state === 'live' && this.#pending.length === 0;
  }

  /** Whether the line waits to be parked or resumed (a MoveJob). */
  get moving() {
    return this.#job !== null && this.#job.kind === 'move';
  }

  /** Whether it counts against its program's `maxBranches`: not freed or about to be, and not parked (unless resuming). */
  get countsAsBranch() {
    if (this.#state === 'freed' || this.collectable) return false;
    return this.#state !== 'parked' || this.moving;
  }

  /** Released, and no fork waits to fork it: free it at the next step. */
  get collectable() {
    return this.#released && this.#state !== 'freed' && this.#lineStart.forks.length === 0;
  }

  /** Whether the line holds a lease of its program's: a branch of its own (not a cache entry's). */
  get holdsLease() {
    return this.#state === 'live' && !this.#lineStart.borrowed;
  }

  /** Cells the gen running on the line may still write (0: none runs). */
  get genCellsLeft() {
    return this.#job !== null && this.#job.kind === 'gen' ? this.#job.maxTokens - this.#job.tokens.length : 0;
  }

  /** Pending tokens a score job still scores (the last ones). */
  get scoring() {
    return this.#job !== null && this.#job.kind === 'score' ? this.#job.left : 0;
  }

  /** Where the scored tokens start in a prefill of the first `take` pending tokens (undefined: not there). */
  scoreFrom(take) {
    const start = this.#pending.length - this.scoring;
    return this.scoring > 0 && start < take ? start : undefined;
  }

  /** Gives a needed waiting line its branch once its start can; its own text fills a cache entry if a lease is `spare()`. */
  materialize(spare) {
    const begun = this.#lineStart.begin(this.#env, this.#tokens, this.#pending, this.scoring);
    if (!begun) return;
    this.#branch = begun.branch;
    this.#state = 'live';
    this.#pending = begun.pending;
    if (begun.lease) this.#env.tally.leaseTaken();
    this.#lineStart.leave(this);
    if (begun.reusable && spare()) this.#openSegment();
  }

  /** The line's branch fills a cache entry from now on (./line-start.js `open`); a prompt to score is nobody's. */
  #openSegment() {
    if (this.scoring === 0) this.#lineStart.open(this.#env, this.#tokens, this.computed, this.#branch);
  }

  /**
   * `count` pending tokens are in the KV now (`logprobs`: the scored ones'). A filled cache entry
   * is the cache's and the line goes on in a fork of it, or (a program's line, no lease `spare()`
   * now) in its own branch with nothing cached.
   */
  prefilled(count, logprobs, spare) {
    const from = this.scoreFrom(count);
    const scored = from === undefined ? null : this.#pending.slice(from, count);
    this.#pending = this.#pending.slice(count);
    const next =
      this.#lineStart.segmentEnd === this.computed &&
      this.#lineStart.segmentFilled(this.#env.cache, this.#pending.length === 0, spare);
    if (next) this.#branch = next.branch;
    if (next && next.lease) this.#env.tally.leaseTaken(); // the fork: the filled branch is the cache's now
    if (next && next.lease && this.#pending.length > 0) this.#openSegment();
    if (!scored) return;
    this.#env.events.scored(this.id, scored, this.computed, this.#env.ctx);
    if (/** @type {ScoreJob} */ (this.#job).scored(scored, logprobs)) this.#job = null;
  }

  /** Its branch was parked (by ./programs.js): it holds no lease and no cell until it resumes. */
  parked() {
    this.#state = 'parked';
    this.#settleMove();
  }

  /** Its branch was resumed: it holds a lease again, its KV and logits as they were. */
  resumed() {
    this.#state = 'live';
    this.#settleMove();
  }

  #settleMove() {
    const job = /** @type {import('./jobs').MoveJob} */ (this.#job);
    this.#job = null;
    job.moved();
  }

  /** Takes a produced token into the gen (`committed`: an accepted draft token); true: commit it now. */
  take(produced, committed = false) {
    if (produced.isStop) {
      this.endJob('stop');
      return false;
    }
    if (committed) this.committed(produced.token);
    this.#env.tally.generated();
    const gen = /** @type {import('./jobs').GenJob} */ (this.#job);
    const reason = gen.take(produced, this.#branch);
    const n = this.#tokens.length + (committed ? 0 : 1);
    this.#env.events.token(this.id, produced.text, n, committed ? 'draft' : null, this.#branch);
    if (!reason) return true;
    if (!committed) this.#tokens.push(produced.token); // its last token, sampled but not decoded
    if (!committed && gen.keepsLast(produced.token, this.#branch)) this.#pending.push(produced.token);
    this.endJob(reason);
    return false;
  }

  /** A speculative step's accepted draft tokens, taken until its gen ends (in take, or a token listener aborts it). */
  verified({ token, accepted, next, drafted }) {
    const gen = /** @type {import('./jobs').GenJob} */ (this.#job);
    this.#env.tally.drafted(drafted, accepted.length);
    for (const produced of accepted) if (!this.take(produced, true) || this.#job !== gen) return;
    gen.drafted(token, accepted, next);
  }

  /** A peek reads the logits the line holds (its pending tokens are in): nothing to decode. */
  peek() {
    const job = /** @type {import('./jobs').PeekJob} */ (this.#job);
    this.#job = null;
    job.read(this.#branch);
  }

  /** The token `take` kept is in the KV now. */
  committed(token) {
    this.#tokens.push(token);
    this.#env.tally.committed();
  }

  /** Settles the job in flight: a gen with `reason` as its finishReason, or rejected with `error`. */
  endJob(reason, error) {
    const job = this.#job;
    if (!job) return;
    this.#job = null;
    // A prompt nobody will finish filling must not keep others waiting to fork it.
    if (!this.needed) this.#lineStart.drop(this.#env.cache);
    if (error || job.kind === 'move')
      return void job.finish(null, error || makeError('ERR_ABORTED', 'the program ended before the line moved'));
    const gen = /** @type {import('./jobs').GenJob} */ (job);
    const perplexity = branchPerplexity(this.#branch); // one read for the result and the event
    const result = gen.finish(reason, null, gen.sink.endsLine ? perplexity : Infinity);
    this.#text += result.text;
    this.#env.events.finish(this.id, result.finishReason, this.#tokens.length, perplexity);
    if (this.#chat === 'open') this.#chat = 'replied';
    if (gen.sink.endsLine) {
      // Its branch goes back now, not at the next step.
      this.release(false);
      this.free(false, [], null);
    }
  }

  /** Gives the branch back (unless a fork waits on it and not `force`), its prune into `prunes`; a job rejects with `error`. */
  free(force, prunes, error) {
    if (this.#state === 'freed' || (!force && this.#lineStart.forks.length > 0)) return;
    this.#lineStart.free(this.#env.cache);
    if (this.#job) this.endJob(null, error);
    const own = this.holdsLease || this.#state === 'parked'; // (a parked branch is freed with its parked state)
    if (own && !this.#branch.disposed) prunes.push(this.#branch.prune().catch(() => {}));
    this.#state = 'freed';
    this.#branch = null;
  }
}

module.exports = { Line };
