'use strict';

/**
 * Continuous batching over one context: `generate()` requests and `run()` branch programs are
 * one kind of work item (a Program, lib/scheduler/program.js), which share a bounded queue, the
 * tiered prefix cache (lib/scheduler/prefix-cache.js) and each step's ONE prefill and ONE decode.
 * A step (`_step`; nothing runs when idle) collects ended programs, prepares queued ones,
 * restores one stored prefix, admits in FIFO order what fits beside what running programs may
 * still take, then prefills and decodes; a program failing in a phase fails there alone.
 * ARCHITECTURE.md, "The data path of one Scheduler step", walks through it phase by phase.
 *
 * The scheduler must be the only user of its context: between its own operations the context
 * must be idle, or its synchronous calls (produce, fork) would wait for someone else's work.
 */

const { BranchStore } = require('./BranchStore');
const { jsonSchemaToGrammar } = require('./schema');
const { schedulerOptions } = require('./scheduler/options');
const { PrefixCache, tiersOn } = require('./scheduler/prefix-cache');
const { requestProgram } = require('./scheduler/request');
const { invalid } = require('./scheduler/checks');
const { SystemPrompts } = require('./scheduler/system-prompts');
const { Generation } = require('./scheduler/generation');
const { closedError, queueFullError, neverFitsError } = require('./scheduler/errors');
const { runProgram } = require('./scheduler/run');
const { Programs } = require('./scheduler/programs');
const { StepBudget } = require('./scheduler/step-budget');
const { SchedulerEvents } = require('./scheduler/events');
const { decide } = require('./decisions');
const { prefillMedia } = require('./scheduler/media');

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

    /** @type {import('./scheduler/program').Program[]} queued and ready programs (requests too), in arrival order */
    this._queue = [];
    const tiers = this._options.tiers && tiersOn(ctx, this._options.tiers);
    /** The prefix cache: the KV cells and, with `cacheRam` / `cacheDir`, RAM and disk below them. */
    this._cache = new PrefixCache({ slidingWindow: ctx.slidingWindow, tiers });
    /** Admitted programs (requests too), until their step of ending. */
    /** With `stepBudgetMs`: the step-time fit extra lines are admitted by (./scheduler/step-budget.js). */
    this._budget = new StepBudget(this._options.stepBudgetMs);
    this._programs = new Programs({ cache: this._cache, store: this._store, budget: this._budget });
    /** The queue's head waits for a program to give room back: no step until something changes. */
    this._blocked = false;
    this._loop = null;
    this._closed = false;
    this._systemPrompts = new SystemPrompts(ctx);
    this._pressure = this._store.kvPressure();
    /** What happens to requests, programs and their branches, for `subscribe` (docs/events.md). */
    this._events = new SchedulerEvents();
    /**
     * The Scheduler's own counts for `stats()` (the admitted programs count their prompts and
     * tokens: ./scheduler/programs.js); `completed`: requests done, admitted or not (each program
     * counts itself as it settles).
     */
    this._counters = { steps: 0, prefilledTokens: 0, completed: 0, draftTokens: 0, acceptedDraftTokens: 0 };
    /** What each program is given: the defaults, the shared cache and events, `wake` for new needs. */
    this._env = {
      ctx,
      vocabSize: ctx.vocabSize,
      defaultMaxTokens: this._options.defaultMaxTokens,
      jsonSchemaToGrammar,
      wake: () => this._kick(),
      cache: this._cache,
      events: this._events,
      spec: this._options.spec,
      counters: this._counters,
      parseSpecial: this._options.parseSpecial,
    };
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
    return this._runProgram(program, options, false);
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
    const run = (fn, options) => this._runProgram(fn, options, true);
    // Which of the two result shapes is the request's format's (checked in ./decisions/checks.js).
    return /** @type {Promise<R extends import('./types').OpenAIDecideRequest ? import('./types').OpenAIDecideResult : import('./types').DecideResult>} */ (
      decide(this._ctx, request, run, this._options.parseSpecial)
    );
  }

  /**
   * Queues a branch program and returns its promise (a refusal rejects it); `decision`: a batch of
   * a decision (./decisions), whose function also gets its `decision` event's sender and which
   * resolves `{ value, usage }`.
   */
  _runProgram(fn, options, decision) {
    try {
      const { program, promise } = runProgram(fn, options, this._env, decision);
      this._enqueue(program);
      return promise;
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** Queues a program (a request too), or refuses it through its own promise. */
  _enqueue(item) {
    if (this._closed) {
      item.reject(closedError());
    } else if (item.signal && item.signal.aborted) {
      item.abort(); // a request that never started resolves now
    } else if (this._queue.length >= this._options.maxQueue) {
      item.reject(queueFullError(this._options.maxQueue));
    } else {
      item.listen(() => this._abort(item));
      this._queue.push(item);
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
    const c = this._counters;
    const p = this._programs;
    const tiers = this._cache.tierStats();
    const requests = p.list.filter((program) => program.countsAsRunning).length;
    return {
      running: requests,
      programs: p.size - requests,
      queued: this._queue.length,
      cachedPrefixes: this._cache.size,
      cellsUsed: this._pressure.cellsUsed,
      nCtx: this._pressure.nCtx,
      hitRate: p.promptTokens === 0 ? 0 : p.cachedPromptTokens / p.promptTokens,
      steps: c.steps,
      promptTokens: p.promptTokens,
      cachedPromptTokens: p.cachedPromptTokens,
      prefilledTokens: c.prefilledTokens,
      generatedTokens: p.completionTokens,
      completed: c.completed,
      draftTokens: c.draftTokens,
      acceptedDraftTokens: c.acceptedDraftTokens,
      evictions: this._cache.evictions,
      ...(tiers ? { cacheTiers: tiers } : {}),
      ...(this._ctx.hasProjector ? { imageEncodes: this._ctx.imageStats().encodes } : {}),
    };
  }

  /**
   * Stops taking requests: queued ones reject with ERR_SCHEDULER_CLOSED, running ones end with
   * finishReason 'abort' within one step; then every cached prefix is freed. Idempotent. The
   * context stays open.
   * @returns {Promise<void>}
   */
  async close() {
    this._closed = true;
    for (const item of this._queue.splice(0)) item.reject(closedError(false));
    for (const item of this._programs.list) item.abort(closedError());
    this._kick();
    while (this._loop) await this._loop;
    this._cache.clear();
    // Every filled prefix went to the RAM tier as it was freed: with a folder, all of it is
    // written there now, for the next scheduler on the folder (a restart).
    await this._cache.flush();
    if (!this._ctx.disposed) this._pressure = this._store.kvPressure();
  }

  /** A queued program ends now; a running one at the start of the next step. */
  _abort(item) {
    const queued = this._queue.indexOf(item);
    if (queued !== -1) this._queue.splice(queued, 1);
    item.abort();
    this._kick(); // a running one ends at the next step
  }

  // ---------------------------------------------------------------------------------------------
  // The loop

  _kick() {
    this._blocked = false;
    if (this._loop) return;
    this._loop = this._run().finally(() => {
      this._loop = null;
      if (this._hasWork()) this._kick();
    });
  }

  _hasWork() {
    return this._programs.hasWork() || (this._queue.length > 0 && !this._blocked);
  }

  async _run() {
    while (this._hasWork()) {
      try {
        // A step that decoded nothing (a program between its awaits, a line waiting for a lease
        // or a prompt another line fills) yields to the event loop before the next one, so a
        // wait never turns into a loop of microtasks that starves timers and I/O.
        if ((await this._step()) === 0) await new Promise((resolve) => setImmediate(resolve));
      } catch (e) {
        // Not attributable to one program (e.g. the context was disposed): nobody can go on.
        for (const item of this._programs.list) item.end({ error: e });
        if (this._ctx.disposed) for (const item of this._queue.splice(0)) item.reject(e);
      }
    }
  }

  async _step() {
    const started = performance.now();
    await this._programs.collect();
    await this._programs.moveLines(); // parks give cells and leases back before admission counts them
    await this._prepareQueued();
    // The cache restores a prefix stored in RAM or on disk that a prompt or fresh line starts with.
    if (!this._closed)
      await this._cache.restoreOne(this._restorable(), (cells, leases) => this._programs.makeRoom(cells, leases));
    this._admit();
    const prefillStart = performance.now();
    const prefillTokens = await this._prefillPhase();
    const decodeStart = performance.now();
    const rows = await this._decodePhase();
    const ended = performance.now();
    this._budget.observe(rows, ended - started);
    this._counters.steps++;
    if (!this._ctx.disposed) this._pressure = this._store.kvPressure();
    if (this._events.on) {
      // The `step` event: what the step did and the gauges after it (an `evict` event first, if any).
      const nSeqMax = this._ctx.disposed ? 0 : this._ctx.nSeqMax;
      const leasesUsed = this._ctx.disposed ? 0 : nSeqMax - this._store.available;
      const gauges = { leasesUsed, nSeqMax, cacheTokens: this._cache.tokens };
      this._events.step({ rows, prefillTokens, stepMs: ended - started }, this.stats(), gauges);
    }
    if (this._options.onStep) {
      const { cellsUsed } = this._pressure;
      const [running, queued] = [this._programs.size, this._queue.length];
      const [prefillMs, decodeMs, stepMs] = [decodeStart - prefillStart, ended - decodeStart, ended - started];
      const { deferred } = this._budget;
      this._options.onStep({ rows, prefillTokens, prefillMs, decodeMs, stepMs, cellsUsed, running, queued, deferred });
    }
    return rows + prefillTokens;
  }

  // ---------------------------------------------------------------------------------------------
  // Preparation and admission

  /** Prepares queued programs in order (a request's chat template runs on the context's worker: here, between steps). */
  async _prepareQueued() {
    for (const item of this._queue.filter((p) => p.state === 'queued')) {
      try {
        await item.prepare(this._ctx, this._systemPrompts);
        if (item.state === 'queued') item.to('ready'); // (an abort while it was prepared settled it)
      } catch (e) {
        const at = this._queue.indexOf(item);
        if (at === -1) continue; // aborted (and settled) while it was prepared
        this._queue.splice(at, 1);
        item.reject(e);
      }
    }
  }

  /**
   * Admits ready programs in FIFO order while their worst case fits next to what running ones
   * may still need (at most `maxRunning` requests at once). A program that cannot fit even into
   * an empty context fails.
   */
  _admit() {
    while (this._queue.length > 0) {
      const item = this._queue[0];
      if (item.state !== 'ready') return;
      const running = this._programs.list.filter((p) => p.countsAsRunning).length;
      if (item.countsAsRunning && running >= this._options.maxRunning) return;
      const need = item.needs(this._cache);
      // A prompt the RAM or disk tier holds more of waits for its restore (one a step).
      if (item.restoreKey && this._cache.stored(item.restoreKey, need.start)) return;
      const { cells, leases } = need;
      if (!this._programs.makeRoom(cells, leases, need.entry)) {
        if (this._programs.size > 0) return void (this._blocked = true); // until a running one gives room back
        this._queue.shift();
        item.reject(neverFitsError(cells, leases, this._store.kvPressure(), this._store.available));
        continue;
      }
      this._queue.shift();
      if (need.entry && need.start > 0) this._cache.startsFrom(need.entry, item.hinted);
      this._programs.admit(item, need);
    }
  }

  /**
   * Who may start from a restored prefix, in order: ready requests, with what each needs beside it
   * (one that does not fit while nothing runs is admitted as it is), then running programs' fresh
   * lines waiting to start (their program reserved their cells: they need nothing beside).
   */
  *_restorable() {
    for (const item of this._queue.filter((p) => p.state === 'ready' && p.restoreKey)) {
      const unfit = () => this._programs.size === 0 && item.skipRestore();
      yield { tokens: item.restoreKey, beside: (keep) => item.needsFrom(keep), hinted: item.hinted, unfit };
    }
    for (const [, line] of this._programs.runningLines())
      if (line.state === 'waiting' && !line.kv.parent && line.needed)
        yield { tokens: line.pending.slice(0, line.pending.length - line.scoring) };
  }

  // ---------------------------------------------------------------------------------------------
  // Prefill and decode

  /** Prefills up to `prefillChunk` pending tokens of running lines in one batch; returns the count. */
  async _prefillPhase() {
    // Prompts with images are prefilled whole first, through the image path (./scheduler/media.js).
    const media = this._ctx.hasProjector ? await prefillMedia(this._programs) : 0;
    this._counters.prefilledTokens += media;
    const lines = this._programs.linesToPrefill(this._options.prefillChunk);
    if (lines.length === 0) return media;
    this._programs.cellsFor(lines.reduce((sum, l) => sum + l.take, 0));
    let scores;
    try {
      scores = await this._store.scorePerToken(this._programs.prefillEntries(lines));
    } catch (e) {
      this._programs.prefillFailed(lines, e); // all-or-nothing: none advanced
      return media;
    }
    const tokens = this._programs.prefilled(lines, scores);
    this._counters.prefilledTokens += tokens;
    return media + tokens;
  }

  /** ONE produce and ONE commit for every line of every program in a gen (a request's choices too). */
  async _decodePhase() {
    const rows = this._programs.decodeRows();
    if (rows.length === 0) return 0;
    this._programs.cellsFor(rows.length);
    const { spec } = this._options;
    const speculation = spec && { ctx: this._ctx, spec };
    const { committed, drafted, accepted } = await this._programs.decode(this._store, rows, speculation);
    this._counters.draftTokens += drafted;
    this._counters.acceptedDraftTokens += accepted;
    return committed;
  }
}

module.exports = { Scheduler };
