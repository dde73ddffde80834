'use strict';

/**
 * Continuous batching over one context: `generate()` requests and `run()` branch programs are
 * one kind of work item (a Program, lib/scheduler/program.js), which share a bounded queue, the
 * tiered prefix cache (lib/scheduler/prefix-cache.js) and each step's ONE prefill and ONE decode
 * (lib/scheduler/step.js; nothing runs when idle). This file is the public surface: what is
 * queued, run, decided, watched and counted.
 *
 * The scheduler must be the only user of its context: between its own operations the context
 * must be idle, or its synchronous calls (produce, fork) would wait for someone else's work.
 */

const { BranchStore } = require('./BranchStore');
const { schedulerOptions, programEnv } = require('./scheduler/options');
const { PrefixCache, tiersOn } = require('./scheduler/prefix-cache');
const { requestProgram } = require('./scheduler/request');
const { invalid } = require('./scheduler/checks');
const { SystemPrompts } = require('./scheduler/system-prompts');
const { Generation } = require('./scheduler/generation');
const { closedError } = require('./scheduler/errors');
const { runProgram } = require('./scheduler/run');
const { Programs } = require('./scheduler/programs');
const { StepBudget } = require('./scheduler/step-budget');
const { SchedulerEvents } = require('./scheduler/events');
const { decide, decideOnLine } = require('./decisions');
const { Queue } = require('./scheduler/queue');
const { Steps } = require('./scheduler/step');

/**
 * Continuous batching over one context, with a prefix cache and a request queue (`generate`, see
 * docs/serving.md), and branch programs (`run`, see docs/programs.md). The context
 * must be used by this scheduler alone; size `nSeqMax` ≥ running requests × (n + 1) plus cached
 * prefixes, `nCtx` ≥ their prompts + n × maxTokens each.
 */
class Scheduler {
  /**
   * @param {import('./Context').SessionContext} ctx a context the scheduler uses alone
   * @param {import('./types').SchedulerOptions} [options] `prefillChunk` (prompt tokens per step,
   *   default 256), `maxQueue` (64), `maxRunning` (unbounded), `defaultMaxTokens` (256), `onStep(info)`,
   *   `parseSpecial` (false: client text that spells special tokens stays plain text).
   */
  constructor(ctx, options = {}) {
    if (options === null || typeof options !== 'object')
      throw invalid('new Scheduler(ctx, options?): options must be an object');
    this._ctx = ctx;
    this._store = new BranchStore(ctx);
    /** `prefillChunk`, `maxQueue`, `maxRunning`, `defaultMaxTokens`, `onStep`, `parseSpecial` and `spec`
     * (speculation every request's choices share: draft source, maxDraft, step-cost fit), checked. */
    this._options = schedulerOptions(ctx, options);
    /** Queued and ready programs (requests too), in arrival order (./scheduler/queue.js). */
    this._queue = new Queue(this._options);
    const tiers = this._options.tiers && tiersOn(ctx, this._options.tiers);
    /** The prefix cache: the KV cells and, with `cacheRam` / `cacheDir`, RAM and disk below them. */
    this._cache = new PrefixCache({ slidingWindow: ctx.slidingWindow, tiers });
    /** With `stepBudgetMs`: the step-time fit extra lines are admitted by (./scheduler/step-budget.js). */
    this._budget = new StepBudget(this._options.stepBudgetMs);
    /** Admitted programs (requests too), until their step of ending. */
    this._programs = new Programs({ cache: this._cache, store: this._store, budget: this._budget });
    this._systemPrompts = new SystemPrompts(ctx);
    /** What happens to requests, programs and their branches, for `subscribe` (docs/events.md). */
    this._events = new SchedulerEvents();
    /** Its own counts for `stats()` (programs count prompts and tokens); `completed`: requests done, admitted or not. */
    this._counters = { steps: 0, prefilledTokens: 0, completed: 0, draftTokens: 0, acceptedDraftTokens: 0 };
    /** What each program is given: the defaults, the shared cache and events, `wake` for new needs. */
    const shared = { cache: this._cache, events: this._events, counters: this._counters, decideOnLine };
    this._env = programEnv(ctx, this._options, { ...shared, wake: () => this._kick() });
    /** Each step, and what `stats()` shows of them (./scheduler/step.js). */
    const parts = { ctx, store: this._store, cache: this._cache, queue: this._queue, programs: this._programs };
    const more = { budget: this._budget, systemPrompts: this._systemPrompts, counters: this._counters };
    this._steps = new Steps({ ...parts, ...more, options: this._options }, this._events, this._options.onStep);
  }

  /**
   * Queues a request. Returns a {@link Generation}: `await` it for `{ choices, usage }`, or
   * `for await` its events. Never throws: errors (invalid request, ERR_QUEUE_FULL, ...) reject it.
   * @param {import('./types').GenerateRequest} request
   * @returns {import('./types').Generation}
   */
  generate(request) {
    try {
      const { program, generation } = requestProgram(request, this._env);
      this._enqueue(program);
      return generation;
    } catch (e) {
      return Generation.failed(e);
    }
  }

  /**
   * Runs a branch program: `program(s)` drives a line of generation `s` (append, gen, fork,
   * release) and every line's work shares the scheduler's steps with everything else. Resolves
   * with what the program returns; rejects with what it throws, ERR_ABORTED when
   * `options.signal` fires, or ERR_QUEUE_FULL / ERR_SCHEDULER_CLOSED. Everything the program
   * holds is freed before `run()` settles. See docs/programs.md.
   * @template T
   * @param {(s: import('./ProgramLine').ProgramLine) => T | Promise<T>} program
   * @param {import('./types').RunOptions} [options]
   * @returns {Promise<T>}
   */
  run(program, options = {}) {
    return this._runProgram(program, options, 'run');
  }

  /**
   * Answers typed questions about a state, no text generated (docs/decisions.md): `noul` (the
   * probability of yes), `choice` (winner, probability per option, confidence) and `score`
   * (probability-weighted level index, legend, probability per level, confidence), the System One
   * / Krite Protocol v1 shapes. The state is rendered once (`template`: `'chat'`, the default, in
   * the model's chat template; `'raw'` as plain text) and prefilled once; each question (and each
   * of `permute` orders of its options) is a fork of it, and all of them are read in the same
   * scheduler steps. Rejects with ERR_INVALID_ARG (with `param` and `reason`) for bad input.
   * A request `{ input, questions: [...] }` is OpenAI's Decisions API shape (predicate, choice,
   * score; answers in question order, a refusal for a question it cannot ask), on the same engine.
   * @template {import('./types').DecideRequest | import('./types').OpenAIDecideRequest} R
   * @param {R} request
   * @returns {Promise<R extends import('./types').OpenAIDecideRequest ? import('./types').OpenAIDecideResult : import('./types').DecideResult>}
   */
  decide(request) {
    // Each batch of the decision is a branch program whose function may send its `decision`
    // event, and whose usage (cached tokens) the decision reports.
    const run = (fn, options) => this._runProgram(fn, options, 'decision');
    // Which of the two result shapes is the request's format's (checked in ./decisions/checks.js).
    return /** @type {Promise<R extends import('./types').OpenAIDecideRequest ? import('./types').OpenAIDecideResult : import('./types').DecideResult>} */ (
      decide(this._ctx, request, run, this._options.parseSpecial)
    );
  }

  /** Queues a branch program through `door` ('run', or 'decision': ./scheduler/doors.js) and returns its promise (a refusal rejects it). */
  _runProgram(fn, options, door) {
    try {
      const { program, promise } = runProgram(fn, options, this._env, door);
      this._enqueue(program);
      return promise;
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** Queues a program (a request too), or refuses it through its own promise. */
  _enqueue(item) {
    if (this._steps.closed) {
      item.reject(closedError());
    } else if (item.signal && item.signal.aborted) {
      item.abort(); // a request that never started resolves now
    } else if (this._queue.add(item)) {
      item.listen(() => this._abort(item));
      this._kick();
    }
  }

  /**
   * The prefixes the cache holds now, each with the tiers holding it (`'kv'`, `'ram'`, `'disk'`),
   * and from then on each change to them: `listener` gets `{ type: 'stored' | 'removed', tokens,
   * medium, tiers }` as a prefix enters or leaves a tier (`tiers`: those holding it after the
   * change; empty: it left the cache) and `{ type: 'cleared', medium: 'kv' }` when `close()` frees
   * the KV cells. For KV event publishers (lib/server/kv-events.js). Listeners run synchronously
   * inside the step: keep them quick. Returns the prefixes held now and the unsubscribe.
   * @param {(change: { type: string, tokens?: number[], medium: string, tiers?: string[] }) => void} listener
   * @returns {{ held: { tokens: number[], tiers: string[] }[], unsubscribe: () => void }}
   */
  watchCache(listener) {
    const held = this.cachedPrefixes();
    return { held, unsubscribe: this._cache.onChange(listener) };
  }

  /**
   * The prompt tokens `request` would be prefilled with (its chat template applied), without
   * running it: what a KV-aware router matches against the KV event stream (the server's
   * `POST /tokenize`). Rejects like `generate` for an invalid request.
   * @param {import('./types').GenerateRequest} request
   * @returns {Promise<number[]>}
   */
  async promptTokens(request) {
    // A program prepared as admission would, never queued: its generation never settles.
    const { program } = requestProgram(request, this._env);
    await program.prepare(this._ctx, this._systemPrompts);
    return program.budget.prompt.tokens.slice();
  }

  /**
   * The prefixes the cache holds now (any tier), each with its tokens, the tiers holding it and
   * the images among its positions (`{ start, nPos, id }`, id: the SHA-256 of the file bytes).
   * @returns {{ tokens: number[], tiers: string[], images: { start: number, nPos: number, id: string }[] }[]}
   */
  cachedPrefixes() {
    return [...this._cache.held()].map((e) => ({ tokens: e.tokens, tiers: e.media, images: e.images }));
  }

  /**
   * Calls `listener(event)` for everything that happens from now on — requests and programs
   * admitted and done, their branches forked, growing token by token, finished and pruned, and
   * one `step` event per scheduler step with its gauges — in the trace format of docs/events.md
   * (what `llama-branch serve` sends at GET /v1/events). Returns the function that unsubscribes.
   * Listeners run synchronously inside the step: keep them quick (queue work, don't do it). A
   * listener that throws is removed with a process warning.
   * @param {(event: import('./types').TraceEvent) => void} listener
   * @returns {() => void}
   */
  subscribe(listener) {
    if (typeof listener !== 'function') throw invalid('subscribe(listener): listener must be a function');
    return this._events.subscribe(listener);
  }

  /**
   * Counters and gauges (never busy); `cellsUsed` is as of the end of the last step.
   * @returns {import('./types').SchedulerStats}
   */
  stats() {
    return this._steps.stats();
  }

  /**
   * Stops taking requests: queued ones reject with ERR_SCHEDULER_CLOSED, running ones end with
   * finishReason 'abort' within one step; then every cached prefix is freed. Idempotent. The
   * context stays open.
   * @returns {Promise<void>}
   */
  async close() {
    this._steps.close();
    for (const item of this._queue.takeAll()) item.reject(closedError(false));
    for (const item of this._programs.list) item.abort(closedError());
    await this._steps.idle();
    this._cache.clear();
    // Every filled prefix went to the RAM tier as it was freed: with a folder, all of it is
    // written there now, for the next scheduler on the folder (a restart).
    await this._cache.flush();
    this._steps.measure();
  }

  /** A queued program ends now; a running one at the start of the next step. */
  _abort(item) {
    this._queue.remove(item);
    item.abort();
    this._kick(); // a running one ends at the next step
  }

  /** Something changed (a program queued or ended, a line wants work): steps run until none has work. */
  _kick() {
    this._steps.kick();
  }
}

module.exports = { Scheduler };
