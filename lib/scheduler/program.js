'use strict';

/**
 * The Scheduler's one kind of work item: a program of lines (./line.js), built by each front door
 * (./run.js, ./request.js) from values it computes (`ProgramConfig`); nothing here asks which.
 *
 *   queued ──▶ ready ──▶ running ──▶ ending ──▶ done
 *     │          │                     │
 *     └──────────┴─────────────────────┴──▶ failed
 *
 * queued: its preparation waits; ready: its leases and cells; ending: the next step frees its
 * lines and settles it.
 *
 * It is admitted only when its leases are free beyond what running programs may still take, so a
 * `fork` past them throws ERR_TOO_MANY_BRANCHES at once; a gen or prefill past its `maxCells`
 * rejects with ERR_KV_FULL.
 */

const { Line } = require('./line');
const { Tally } = require('./usage');
const { LineStart } = require('./line-start');
const { edge } = require('./image-keys');
const { commonRun } = require('./radix');
const {
  SchedulerErrorCode: Code,
  schedulerError,
  cellsExceeded,
  tooManyBranches,
  abortedProgram,
  noTransition,
} = require('./errors');
const { SEED_SPACE } = require('./checks');
const { ProgramEvents } = require('./events');
const { rulesOf } = require('./doors');

const TRANSITIONS = {
  queued: ['ready', 'done', 'failed'],
  ready: ['running', 'done', 'failed'],
  running: ['ending'],
  ending: ['done', 'failed'],
  done: [],
  failed: [],
};

/**
 * What admitting a program takes: `cells` and `leases` beyond its `prompt` line (made at admission,
 * cut into cache entries at its `cachePoints`; the tiers may restore a prefix of its tokens).
 * @typedef {{ prompt: { tokens: number[], cachePoints: number[], text: string, media?: import('./media').PromptMedia } | null,
 *   cells: number, leases: number, admit: object }} Budget
 */

/**
 * What a front door computes: its `door` (./doors.js: what kind of program it is, read only
 * through its rules), its `budget` or `prepare` (between steps, in order) resolving with it;
 * `hinted`: its cache entries are kept warm longer; `begin` starts its lines; `sink` settles it
 * and says what its `done` event shows of its usage (null: nothing); `seed`: where `nextSeed`
 * counts on from.
 * @typedef {{ finish: (outcome: any, usage: any) => void, fail: (error: any) => void, doneUsage: (usage: any) => any }} Sink
 * @typedef {{ id: string, signal: any, sink: Sink, budget?: Budget, prepare?: (ctx: any, systemPrompts: any) => Promise<Budget>,
 *   door: import('./doors').Door, hinted?: boolean, begin: (program: Program, prompt: Line | null) => void, seed?: number }} ProgramConfig
 */

class Program {
  /**
   * @param {{ ctx: any, defaultMaxTokens: number, jsonSchemaToGrammar: (schema: any) => Promise<string>, wake: () => void, cache: any, events: import('./events').SchedulerEvents, spec: any, counters: { completed: number }, parseSpecial?: boolean, decideOnLine?: any }} env
   * @param {ProgramConfig} config
   */
  constructor(env, config) {
    this.env = env;
    this.config = config;
    this.id = config.id;
    this.ctx = env.ctx;
    this.wake = env.wake;
    this.signal = config.signal;
    this.onAbort = null;
    this.state = config.budget ? 'ready' : 'queued';
    /** @type {Budget} (a request's once prepared) */
    this.budget = config.budget || /** @type {any} */ (null);
    /** What the tiers may restore a prefix of before admission: a prepared prompt's tokens (null: none). */
    this.restoreKey = null;
    this.hinted = Boolean(config.hinted);
    /** What its front door means for it (./doors.js). */
    this.rules = rulesOf(config.door);
    this.countsAsRunning = this.rules.countsAsRunning;
    this.seed = config.seed || 0;
    this.lineCount = 0;
    /** @type {Line[]} every line made, released ones until they are freed */
    this.lines = [];
    /** What its lines used, freed ones included (./usage.js). */
    this.tally = new Tally();
    /** Its events (and its lines'), each with its id. */
    this.events = new ProgramEvents(env.events, this.id);
    /** @type {import('./line').LineEnv} what its lines are given */
    this.lineEnv = { ...env, events: this.events, hinted: this.hinted, tally: this.tally };
    /** Once admitted: its prompt line. */
    this.promptLine = null;
    this.maxBranches = 0;
    this.maxCells = 0;
    /** Why it ends: `{ value }`, `{ error }` or `{ abort: true }` (set once, as it moves to `ending`). */
    this.outcome = null;
  }

  to(state) {
    if (!TRANSITIONS[this.state].includes(state)) throw noTransition(this.state, state);
    this.state = state;
  }

  async prepare(ctx, systemPrompts) {
    if (!this.config.prepare) return;
    this.budget = await this.config.prepare(ctx, systemPrompts);
    this.restoreKey = this.budget.prompt ? this.budget.prompt.tokens : null;
  }

  /** The Scheduler's tiers could not make room for its restore: it is admitted as it is. */
  skipRestore() {
    this.restoreKey = null;
  }

  /**
   * What admitting it takes now: the best cached start of its prompt (`entry`, `start`; none
   * without a prompt), and the KV cells and leases it needs beyond it.
   * @param {import('./prefix-cache').PrefixCache} cache
   */
  needs(cache) {
    const { prompt } = this.budget;
    if (!prompt) return { entry: null, cut: null, ...this.needsFrom(0) };
    const { entry, length } = cache.bestStart(prompt.tokens);
    const need = { entry, cut: null, ...this.needsFrom(length) };
    // Cut also where it leaves what is cached (its own lease), when a lease is left for it.
    const cut = prompt.media ? null : cache.splitPoint(prompt.tokens, length);
    if (cut !== null && !prompt.cachePoints.includes(cut) && need.leases < this.env.ctx.nSeqMax)
      Object.assign(need, { cut, leases: need.leases + 1 });
    return need;
  }

  /** The KV cells and leases it needs beyond a cached start of `start` prompt tokens (a lease per cache point past it). */
  needsFrom(start) {
    const { prompt, cells, leases } = this.budget;
    if (!prompt) return { start, cells, leases };
    const points = prompt.cachePoints.filter((p) => p > start).length;
    return { start, cells: prompt.tokens.length - start + cells, leases: leases + points };
  }

  /**
   * Another prompt of `tokens` is about to be admitted: its prompt line, not begun or filling
   * `filling.entry`, cuts its prompt where the two part (./line-start.js `cutAt`), with a lease
   * more for the cut. Returns whether it did.
   * @param {{ entry: any, at: number } | null} filling what the cache found being filled
   */
  cutPromptFor(cache, tokens, filling) {
    const line = this.promptLine;
    if (!line || this.budget.prompt.media) return false;
    let at;
    if (line.state === 'waiting' && !line.lineStart.segment) at = edge(tokens, commonRun(line.tokens, tokens, 0));
    else if (filling && line.lineStart.segment === filling.entry) at = filling.at;
    else return false;
    if (!line.lineStart.cutAt(cache, at, line.computed, line.tokens)) return false;
    this.maxBranches++;
    return true;
  }

  /** Whose rows a line's are in the decode phase (a failure stays its owner's). */
  ownerOf(line) {
    return this.rules.failsWhole ? this : line;
  }

  lineFailed(line, error) {
    if (this.rules.failsWhole) this.end({ error });
    else line.endJob(null, error);
  }

  /** `line` had `count` tokens prefilled (a prompt line's count from admission on). */
  countPrefill(line, count) {
    this.tally.tokensPrefilled(count, line === this.promptLine);
  }

  /** Leases its lines hold now (a line released this step holds its lease until the next frees it). */
  get leasesHeld() {
    return this.lines.filter((line) => line.holdsLease).length;
  }

  /** Leases it may still take: a planned program's are taken once each (a filled prompt's goes to the cache). */
  get leasesToCome() {
    if (this.state !== 'running') return 0;
    const taken = this.rules.planned ? this.tally.leases : this.leasesHeld;
    return Math.max(0, this.maxBranches - taken);
  }

  /** Cells it may still write: a planned program's unfilled prompt and each open gen's rest. */
  cellsToCome() {
    if (this.state !== 'running') return 0;
    if (!this.rules.planned) return Math.max(0, this.maxCells - this.tally.cellsUsed);
    const prompt = this.promptLine;
    let cells = prompt
      ? prompt.tokens.length - (prompt.state === 'waiting' ? prompt.lineStart.planned.start : prompt.computed)
      : 0;
    for (const line of this.lines) cells += line.genCellsLeft;
    return cells;
  }

  nextSeed() {
    this.seed = (this.seed + 1) % SEED_SPACE;
    return this.seed;
  }

  /** Throws ERR_TOO_MANY_BRANCHES unless `n` more lines fit in `maxBranches`. */
  reserveLines(n) {
    const live = this.lines.filter((l) => l.countsAsBranch).length;
    if (live + n > this.maxBranches) throw tooManyBranches(this.maxBranches, live, n);
  }

  #makeLine(start, tokens, extra = false, id = `${this.id}.${this.lineCount++}`) {
    const line = new Line(this.lineEnv, id, start, tokens, extra);
    this.lines.push(line);
    return line;
  }

  freshLine(tokens) {
    return this.#makeLine(LineStart.fresh(), tokens.slice());
  }

  /**
   * `n` forks of `line` (fresh when it is empty) at `at`, its tokens or further on (a `select`
   * path); `extra`: branches a step budget admits only within its time (./step-budget.js).
   */
  spawn(line, n, at = line.tokens, extra = false) {
    const start = () => (line.tokens.length === 0 ? LineStart.fresh() : LineStart.fork(line, at.length));
    return Array.from({ length: n }, () => this.#makeLine(start(), at.slice(), extra));
  }

  endedError() {
    if (this.outcome && this.outcome.error && this.outcome.error.code === 'ERR_ABORTED') return this.outcome.error;
    return schedulerError(Code.PROGRAM_STATE, 'the program has ended; its lines can no longer be used');
  }

  /**
   * Admitted with what `needs` found: its prompt line (named by its id, planned to start from
   * `entry`: ./line-start.js) and its front door's lines start.
   */
  start({ entry, start, leases, cut = null }) {
    this.to('running');
    const { prompt, cells, admit } = this.budget;
    this.maxBranches = leases;
    this.maxCells = (prompt ? prompt.tokens.length : 0) + cells;
    this.events.emit('admit', prompt ? { ...admit, cachedTokens: start } : admit);
    if (prompt) {
      this.tally.admitted(prompt.tokens.length);
      const media = prompt.media;
      const planned = { start, entry: entry && start > 0 ? this.env.cache.pin(entry) : null };
      const points = cut === null ? prompt.cachePoints : [...prompt.cachePoints, cut].sort((a, b) => a - b);
      const kv = LineStart.prompt(points, media ? media.images : [], planned);
      this.promptLine = this.#makeLine(kv, [], false, this.id);
      if (media) this.promptLine.pushMedia(media.prompt, prompt.tokens, [], prompt.text);
      else this.promptLine.push(prompt.tokens, prompt.text);
    }
    this.config.begin(this, this.promptLine);
  }

  /**
   * Ends the program (first reason wins): its open jobs end as `endsOpen` says, and the next step
   * frees what it holds and settles it (who ends it from outside a step wakes the Scheduler).
   */
  end(outcome) {
    if (this.state !== 'running') return;
    this.outcome = outcome;
    this.to('ending');
    const abort = this.rules.endsOpen === 'abort';
    for (const line of this.lines) if (line.job) line.endJob(abort ? 'abort' : null, abort ? null : this.endedError());
  }

  /** Its signal fired, or (`error`) the scheduler closes: a running program ends at the next step; a queued one settles now. */
  abort(error = abortedProgram(this.signal)) {
    const outcome = this.rules.endsOpen === 'abort' ? { abort: true } : { error };
    if (this.state === 'running') this.end(outcome);
    else if (this.state === 'queued' || this.state === 'ready') this.settle(outcome);
  }

  hasWork() {
    if (this.state === 'ending' || (this.state === 'running' && this.#complete)) return true;
    return this.lines.some((l) => l.needed || l.collectable);
  }

  /** Whether a planned program did all it was to do: no line has a job left. */
  get #complete() {
    return this.rules.planned && this.lines.every((line) => !line.job);
  }

  /** At a step's start: frees released lines, or all of an ending program's (then true: settle once `prunes` are). */
  collect(prunes) {
    if (this.state === 'running' && this.#complete) this.end({});
    const ending = this.state === 'ending';
    for (const line of this.lines)
      if (ending || line.released) line.free(ending, prunes, line.job && this.endedError());
    this.lines = this.lines.filter((l) => l.state !== 'freed');
    return ending;
  }

  /** Settles it through its sink: once its branches are back (then a `done` event), or before it started. */
  settle(outcome = this.outcome) {
    const started = this.state === 'ending';
    const { error } = (this.outcome = outcome);
    this.to(error ? 'failed' : 'done');
    if (this.signal && this.onAbort) this.signal.removeEventListener('abort', this.onAbort);
    const { sink } = this.config;
    const usage = this.tally.usage;
    if (started && this.events.on) this.events.done(this.outcome, sink.doneUsage(usage));
    if (this.countsAsRunning && !error) this.env.counters.completed++; // stats().completed
    if (error) sink.fail(error);
    else sink.finish(outcome, usage);
  }

  /** A queued program that will never start (closed scheduler, never fits, a failed preparation). */
  reject(error) {
    this.settle({ error });
  }

  /** True: `line` may write `more` KV cells; false: past the program's maxCells, it failed with ERR_KV_FULL. */
  checkCells(line, more) {
    const fits = this.tally.cellsUsed + more <= this.maxCells;
    if (!fits) this.lineFailed(line, cellsExceeded(this.tally.cellsUsed, more, this.maxCells));
    return fits;
  }

  /** Its signal's abort calls `onAbort` from now until it settles. */
  listen(onAbort) {
    if (!this.signal) return;
    this.onAbort = onAbort;
    this.signal.addEventListener('abort', onAbort, { once: true });
  }
}

module.exports = { Program };
