'use strict';

/**
 * The Scheduler's one kind of work item: a program of lines (./line.js). A branch program
 * (`scheduler.run`, ./run.js) is a JavaScript function driving its lines through `ProgramLine`;
 * a request (`scheduler.generate`, ./request.js) is a built-in one: a prompt line forked n times,
 * each fork running a gen. The Scheduler serves what their lines need in its own steps, in ONE
 * `store.prefill` and ONE `store.commit`. A program's life cycle is one explicit `state`:
 *
 *   queued ──▶ ready ──▶ running ──▶ ending ──▶ done
 *     │          │                     │
 *     └──────────┴─────────────────────┴──▶ failed
 *
 * queued: its preparation (a request's tokenization) waits; ready: it waits for its leases and
 * cells; ending: it returned or threw, its signal fired or the scheduler closed: the next step
 * frees what it holds and settles it (a request aborted before it ran goes straight to done).
 *
 * A program is admitted only when the `maxBranches` leases it declares are free beyond what
 * running programs may still take, and a `fork` past them throws ERR_TOO_MANY_BRANCHES at once:
 * two programs never wait on each other's leases. A gen or prefill past its `maxCells` (KV cells
 * it writes, a shared prefix counted once) rejects with ERR_KV_FULL.
 */

const { makeError } = require('../errors');
const { signalOf } = require('../cancel');
const { Line } = require('./line');
const { SchedulerErrorCode: Code, schedulerError, cellsExceeded } = require('./errors');
const { doneFields } = require('./events');

const TRANSITIONS = {
  queued: ['ready', 'done', 'failed'],
  ready: ['running', 'done', 'failed'],
  running: ['ending'],
  ending: ['done', 'failed'],
  done: [],
  failed: [],
};

/**
 * What every program has: its lines, what it holds and may hold, its events and usage, and where
 * its outcome goes (`sink`). The kinds (./run.js, ./request.js) differ in how they start, end
 * and answer an abort (the methods marked so below).
 */
class Program {
  /**
   * @param {{ ctx: any, defaultMaxTokens: number, jsonSchemaToGrammar: (schema: any) => Promise<string>, wake: () => void, cache: any, events: import('./events').SchedulerEvents, spec: any }} env
   * @param {'program' | 'request'} kind a branch program (`run`), or a request (counted by `maxRunning`)
   * @param {any} signal
   * @param {{ finish: (result: any) => void, fail: (error: any) => void }} sink what settles its promise or Generation
   */
  constructor(env, kind, signal, sink) {
    this.kind = kind;
    this.sink = sink;
    this.ctx = env.ctx;
    this.state = kind === 'request' ? 'queued' : 'ready';
    this.signal = signalOf({ signal }, kind === 'request' ? 'generate' : 'run');
    this.onAbort = null;
    this.defaultMaxTokens = env.defaultMaxTokens;
    this.jsonSchemaToGrammar = env.jsonSchemaToGrammar;
    this.wake = env.wake;
    /** The scheduler's speculation (null: none). */
    this.spec = env.spec;
    this.events = env.events;
    this.id = env.events.nextId(kind);
    /** Lines made so far (for their ids). */
    this.lineCount = 0;
    this.cache = env.cache;
    /** A request's cache key (./request.js). */
    this.cacheKey = null;
    /** @type {Line[]} every line made, released ones until they are freed */
    this.lines = [];
    /** What its lines are given (./line.js `LineEnv`), from its admission on. */
    this.lineEnv = null;
    this.maxBranches = 0;
    this.maxCells = 0;
    this.promptTokens = 0;
    this.cachedPromptTokens = 0;
    this.prefilledCells = 0;
    /** What the lines freed so far wrote (a line's own count goes with it). */
    this.retired = { leases: 0, cells: 0, completionTokens: 0, draftTokens: 0, acceptedDraftTokens: 0 };
    /** Why the program ends: its value, or an error (set once, when it moves to `ending`). */
    this.outcome = null;
  }

  to(state) {
    if (!TRANSITIONS[this.state].includes(state)) {
      throw makeError(
        'ERR_INTERNAL',
        `Scheduler program: no transition from ${this.state} to ${state}; please report this bug`,
      );
    }
    this.state = state;
  }

  lineId() {
    return `${this.id}.${this.lineCount++}`;
  }

  emit(type, fields) {
    if (this.events.on) this.events.emit(type, { request: this.id, ...fields });
  }

  /** Whose rows a line's are in the decode phase (a failure stays its owner's). */
  ownerOf(line) {
    return line;
  }

  /** `line`'s work failed (its caller, ./programs.js, says so): its job rejects. */
  lineFailed(line, error) {
    line.endJob(null, error);
  }

  /** Whether the program did all it was to do, and ends at the next step (a request: every choice ended). */
  get complete() {
    return false;
  }

  // What each kind writes: its preparation (a request's), its admission (`needs`: what admitting
  // it takes now; `admitted`: the `admit` event's fields; `begin`), its `abort` and `close`, how
  // it ends (`ending`: the `done` event's status and usage) and what it resolves with (`result`).

  async prepare(_ctx, _systemPrompts) {}

  /** @returns {{ entry: any, start: number, cells: number, leases: number }} */
  needs(_cache) {
    throw makeError('ERR_INTERNAL', 'Program.needs is written by each kind of program');
  }

  admitted(_need) {
    return {};
  }

  begin(_need) {}

  abort() {}

  close(_error) {}

  /** @returns {{ status: string, usage: any }} */
  ending(_outcome) {
    return { status: 'ok', usage: null };
  }

  result(_outcome) {}

  /** A line started with `line.cached` of its tokens from the prefix cache. */
  started(line) {
    this.cachedPromptTokens += line.cached;
  }

  /** `count` pending tokens of a line were prefilled (counted before the line hears it). */
  prefilled(count) {
    this.prefilledCells += count;
    this.promptTokens += count;
  }

  /** Leases its lines hold now (a line released this step holds its lease until the next frees it). */
  get leasesHeld() {
    return this.lines.filter((line) => line.holdsLease).length;
  }

  /** `field` of what its lines wrote (./line.js `written`), freed ones included. */
  written(field) {
    return this.lines.reduce((sum, line) => sum + line.written[field], this.retired[field]);
  }

  /** KV cells the program wrote: prompt tokens prefilled and tokens committed. */
  get cellsUsed() {
    return this.prefilledCells + this.written('cells');
  }

  get usage() {
    return {
      promptTokens: this.promptTokens,
      cachedPromptTokens: this.cachedPromptTokens,
      completionTokens: this.written('completionTokens'),
      draftTokens: this.written('draftTokens'),
      acceptedDraftTokens: this.written('acceptedDraftTokens'),
    };
  }

  get leasesToCome() {
    return this.state === 'running' ? Math.max(0, this.maxBranches - this.leasesHeld) : 0;
  }

  cellsToCome() {
    return this.state === 'running' ? Math.max(0, this.maxCells - this.cellsUsed) : 0;
  }

  makeLine(parent, tokens) {
    const line = new Line(/** @type {import('./line').LineEnv} */ (this.lineEnv), this.lineId(), parent, tokens);
    this.lines.push(line);
    return line;
  }

  /** A new line holding only `tokens` (decoded when it first needs its KV). */
  freshLine(tokens) {
    return this.makeLine(null, tokens.slice());
  }

  /**
   * `n` children of `line` (fresh lines when it is empty; leases were reserved). `at`: their tokens,
   * when they fork the line further on than it is now (a `select` path, where its options part).
   */
  spawn(line, n, at = line.tokens) {
    return Array.from({ length: n }, () => {
      const child = this.makeLine(line.tokens.length === 0 ? null : line, at.slice());
      child.text = line.text;
      return child;
    });
  }

  endedError() {
    if (this.outcome && this.outcome.error && this.outcome.error.code === 'ERR_ABORTED') return this.outcome.error;
    return schedulerError(Code.PROGRAM_STATE, 'the program has ended; its lines can no longer be used');
  }

  /** Admitted with what `needs` found: its lines start (kind-specific: `begin`). */
  start(need) {
    this.to('running');
    const { ctx, cache, events, id } = this;
    this.lineEnv = { ctx, cache, events, program: id, hinted: Boolean(this.cacheKey) };
    this.emit('admit', this.admitted(need));
    this.begin(need);
  }

  /**
   * Ends the program (first reason wins); the next step frees what it holds and settles it (who
   * ends it from outside a step — the function's end, an abort — wakes the Scheduler).
   */
  end(outcome) {
    if (this.state !== 'running') return;
    this.outcome = outcome;
    this.to('ending');
    this.endJobs();
  }

  /** At its end, each job still running rejects (a request's choices end 'abort' instead). */
  endJobs() {
    for (const line of this.lines) if (line.job) line.endJob(null, this.endedError());
  }

  hasWork() {
    if (this.state === 'ending' || (this.state === 'running' && this.complete)) return true;
    return this.lines.some((l) => l.needed || l.collectable);
  }

  /** At a step's start: frees released lines, or all of an ending program's (then true: settle once `prunes` are). */
  collect(prunes) {
    if (this.state === 'running' && this.complete) this.end({});
    const ending = this.state === 'ending';
    for (const line of this.lines)
      if (ending || line.released) line.free(ending, prunes, line.job && this.endedError());
    const freed = this.lines.filter((l) => l.state === 'freed');
    for (const line of freed) for (const field of Object.keys(this.retired)) this.retired[field] += line.written[field];
    if (freed.length > 0) this.lines = this.lines.filter((l) => l.state !== 'freed');
    return ending;
  }

  /** Settles the program with its outcome (its branches are back). */
  settle() {
    this.detach();
    const { error } = this.outcome;
    this.to(error ? 'failed' : 'done');
    if (this.events.on) {
      const { status, usage } = this.ending(this.outcome);
      this.emit('done', doneFields(status, error, usage));
    }
    if (error) return this.sink.fail(error);
    this.sink.finish(this.result(this.outcome));
  }

  cellsExceeded(more) {
    return cellsExceeded(this.cellsUsed, more, this.maxCells);
  }

  /** A queued program that will never start (closed scheduler, never fits, a failed preparation). */
  reject(error) {
    this.to('failed');
    this.detach();
    this.sink.fail(error);
  }

  detach() {
    if (this.signal && this.onAbort) this.signal.removeEventListener('abort', this.onAbort);
  }
}

module.exports = { Program };
