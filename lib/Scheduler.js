'use strict';

/**
 * Continuous batching over one context: many independent `generate()` calls share each step's
 * decode, reuse cached prompt prefixes and wait in a bounded queue when the context is full.
 * Each request is a `Request` (lib/scheduler/request.js) with one explicit `state`; the prefix
 * cache's policy lives in lib/scheduler/prefix-cache.js. ARCHITECTURE.md, "Data path of one
 * Scheduler step", walks through a step.
 *
 * One step (the loop runs while there is work; nothing runs when idle):
 *   1. requests whose signal aborted give their branches back;
 *   2. queued requests are prepared (chat template, tokenization) and admitted in FIFO order
 *      while leases and KV cells suffice for everything the running ones may still need
 *      (evicting least-recently-used cached prefixes that no running request uses);
 *   3. prefill: newcomers' prompt tokens, at most `prefillChunk` in all, in one `store.prefill`;
 *   4. decode: ONE `store.produce` and ONE `store.commit` for every running choice of every request.
 * A phase that finds a request failing fails it right there (its branches go back at once).
 *
 * The scheduler must be the only user of its context: between its own operations the context
 * must be idle, or its synchronous calls (produce, fork) would wait for someone else's work.
 */

const { Branch } = require('./Branch');
const { BranchStore } = require('./BranchStore');
const { makeError } = require('./errors');
const { jsonSchemaToGrammar } = require('./schema');
const defaults = require('./defaults');
const { PrefixCache, release } = require('./scheduler/prefix-cache');
const { Request, positiveInt, invalid } = require('./scheduler/request');
const { SystemPrompts } = require('./scheduler/system-prompts');
const { Generation } = require('./scheduler/generation');
const { SchedulerErrorCode, schedulerError } = require('./scheduler/errors');

/** Sampler of prompt branches: they are only forked, never sampled. */
const PROMPT_BRANCH_PARAMS = Object.freeze({ temperature: 0 });

/**
 * Continuous batching over one context (see the file comment and docs/serving.md). The context
 * must be used by this scheduler alone; size `nSeqMax` ≥ running requests × (n + 1) plus cached
 * prefixes, `nCtx` ≥ their prompts + n × maxTokens each.
 */
class Scheduler {
  /**
   * @param {import('./Context').SessionContext} ctx a context the scheduler uses alone
   * @param {import('./types').SchedulerOptions} [options] `prefillChunk` (prompt tokens per step,
   *   default 256), `maxQueue` (64), `maxRunning` (unbounded), `defaultMaxTokens` (256), `onStep(info)`.
   */
  constructor(ctx, options = {}) {
    if (options === null || typeof options !== 'object')
      throw invalid('new Scheduler(ctx, options?): options must be an object');
    this._ctx = ctx;
    this._store = new BranchStore(ctx);
    const o = { ...defaults.scheduler, onStep: null, ...options };
    this._prefillChunk = positiveInt(o.prefillChunk, 'options.prefillChunk');
    this._maxQueue = o.maxQueue === 0 ? 0 : positiveInt(o.maxQueue, 'options.maxQueue');
    this._maxRunning = o.maxRunning === Infinity ? Infinity : positiveInt(o.maxRunning, 'options.maxRunning');
    this._defaultMaxTokens = positiveInt(o.defaultMaxTokens, 'options.defaultMaxTokens');
    if (o.onStep !== null && typeof o.onStep !== 'function') throw invalid('options.onStep must be a function');
    this._onStep = o.onStep;

    /** @type {Request[]} queued and ready requests, in arrival order */
    this._queue = [];
    /** @type {Request[]} prefilling, generating and aborting requests */
    this._running = [];
    this._cache = new PrefixCache({ slidingWindow: ctx.slidingWindow });
    this._loop = null;
    this._closed = false;
    this._systemPrompts = new SystemPrompts(ctx);
    this._pressure = this._store.kvPressure();
    this._counters = {
      steps: 0,
      promptTokens: 0,
      cachedPromptTokens: 0,
      prefilledTokens: 0,
      generatedTokens: 0,
      completed: 0,
    };
  }

  /**
   * Queues a request. Returns a {@link Generation}: `await` it for `{ choices, usage }`, or
   * `for await` its events. Never throws: errors (invalid request, ERR_QUEUE_FULL, ...) reject it.
   * @param {import('./types').GenerateRequest} request
   * @returns {import('./types').Generation}
   */
  generate(request) {
    const gen = new Generation();
    let req;
    try {
      req = new Request(request, gen, {
        vocabSize: this._ctx.vocabSize,
        defaultMaxTokens: this._defaultMaxTokens,
        jsonSchemaToGrammar,
      });
    } catch (e) {
      gen._fail(e);
      return gen;
    }
    if (this._closed) {
      this._fail(
        req,
        schedulerError(
          SchedulerErrorCode.SCHEDULER_CLOSED,
          'the scheduler was closed; create a new Scheduler for new requests',
        ),
      );
    } else if (req.signal && req.signal.aborted) {
      this._settle(req, 'abort');
    } else if (this._queue.length >= this._maxQueue) {
      this._fail(
        req,
        schedulerError(
          SchedulerErrorCode.QUEUE_FULL,
          `the scheduler's queue is full (maxQueue ${this._maxQueue} requests wait already); retry later or raise maxQueue`,
        ),
      );
    } else {
      if (req.signal) {
        req.onAbort = () => this._abort(req);
        req.signal.addEventListener('abort', req.onAbort, { once: true });
      }
      this._queue.push(req);
      this._kick();
    }
    return gen;
  }

  /**
   * Counters and gauges (never busy); `cellsUsed` is as of the end of the last step.
   * @returns {import('./types').SchedulerStats}
   */
  stats() {
    const c = this._counters;
    return {
      running: this._running.length,
      queued: this._queue.length,
      cachedPrefixes: this._cache.size,
      cellsUsed: this._pressure.cellsUsed,
      nCtx: this._pressure.nCtx,
      hitRate: c.promptTokens === 0 ? 0 : c.cachedPromptTokens / c.promptTokens,
      ...c,
      evictions: this._cache.evictions,
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
    for (const req of this._queue.splice(0))
      this._fail(
        req,
        schedulerError(SchedulerErrorCode.SCHEDULER_CLOSED, 'the scheduler was closed before this request started'),
      );
    for (const req of this._running) if (req.state !== 'aborting') req.to('aborting');
    while (this._loop) await this._loop;
    this._cache.clear();
    if (!this._ctx.disposed) this._pressure = this._store.kvPressure();
  }

  /** A queued request ends now; a running one at the start of the next step. */
  _abort(req) {
    const queued = this._queue.indexOf(req);
    if (queued !== -1) {
      this._queue.splice(queued, 1);
      this._settle(req, 'abort');
    } else if (req.running && req.state !== 'aborting') {
      req.to('aborting');
    }
  }

  // ---------------------------------------------------------------------------------------------
  // The loop

  _kick() {
    if (this._loop) return;
    this._loop = this._run().finally(() => {
      this._loop = null;
      if (this._hasWork()) this._kick();
    });
  }

  _hasWork() {
    return this._queue.length > 0 || this._running.length > 0;
  }

  async _run() {
    while (this._hasWork()) {
      try {
        await this._step();
      } catch (e) {
        // Not attributable to one request (e.g. the context was disposed): nobody can go on.
        for (const req of [...this._running]) this._fail(req, e);
        if (this._ctx.disposed) for (const req of this._queue.splice(0)) this._fail(req, e);
      }
    }
  }

  async _step() {
    const started = performance.now();
    for (const req of this._running.filter((r) => r.state === 'aborting')) this._settle(req, 'abort');
    await this._prepareQueued();
    this._admit();
    const prefillStart = performance.now();
    const prefillTokens = await this._prefillPhase();
    const decodeStart = performance.now();
    const rows = await this._decodePhase();
    const ended = performance.now();
    this._counters.steps++;
    if (!this._ctx.disposed) this._pressure = this._store.kvPressure();
    if (this._onStep) {
      const { cellsUsed } = this._pressure;
      const [running, queued] = [this._running.length, this._queue.length];
      const [prefillMs, decodeMs, stepMs] = [decodeStart - prefillStart, ended - decodeStart, ended - started];
      this._onStep({ rows, prefillTokens, prefillMs, decodeMs, stepMs, cellsUsed, running, queued });
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Preparation and admission

  /** Tokenizes queued requests in order (chat templates run on the context's worker: here, between steps). */
  async _prepareQueued() {
    for (const req of this._queue.filter((r) => r.state === 'queued')) {
      try {
        await req.prepare(this._ctx, this._systemPrompts);
        if (req.state === 'queued') req.to('ready'); // (an abort while it was prepared settled it)
      } catch (e) {
        const at = this._queue.indexOf(req);
        if (at === -1) continue; // aborted (and settled) while it was prepared
        this._queue.splice(at, 1);
        this._fail(req, e);
      }
    }
  }

  /**
   * Admits ready requests in FIFO order while their worst case fits next to what running
   * requests may still need. A request that cannot fit even into an empty context fails.
   */
  _admit() {
    while (this._queue.length > 0 && this._running.length < this._maxRunning) {
      const req = this._queue[0];
      if (req.state !== 'ready') return;
      const { entry, length } = this._cache.bestStart(req.tokens);
      const cells = req.tokens.length - length + req.n * req.maxTokens;
      const leases = req.n + req.cachePoints.filter((p) => p > length).length;
      if (!this._cache.evictUntil(() => this._fits(cells, leases), entry)) {
        if (this._running.length > 0) return; // wait for running requests to finish
        this._queue.shift();
        const p = this._store.kvPressure();
        this._fail(
          req,
          makeError(
            'ERR_KV_FULL',
            `the request does not fit even with every cached prefix evicted (needs ${cells} cells and ${leases} leases; ${p.remaining} of ${p.nCtx} cells and ${this._store.available} leases are free): lower maxTokens or n, or create the context with a larger nCtx / nSeqMax`,
          ),
        );
        continue;
      }
      this._queue.shift();
      req.plannedStart = length;
      req.leasesToCome = leases;
      req.usage.promptTokens = req.tokens.length;
      req.to('prefilling');
      this._running.push(req);
    }
  }

  /** Whether `cells` and `leases` are free beyond what running requests may still take. */
  _fits(cells, leases) {
    const freeCells = this._store.kvPressure().remaining - this._running.reduce((sum, r) => sum + r.cellsToCome(), 0);
    const freeLeases = this._store.available - this._running.reduce((sum, r) => sum + r.leasesToCome, 0);
    return freeCells >= cells && freeLeases >= leases;
  }

  // ---------------------------------------------------------------------------------------------
  // Prefill

  /**
   * Gives a newly admitted request its prompt branch, forked from the best cached start. Returns
   * false while the start it wants is still being prefilled by an earlier request.
   */
  _begin(req) {
    const start = this._cache.bestStart(req.tokens);
    const { entry } = start;
    // Never fork the whole prompt's logits from a partial fork: at least one token is decoded.
    const length = start.partial ? Math.min(start.length, req.tokens.length - 1) : start.length;
    if (entry && !entry.ready && entry.branch.position < length) return false;
    if (entry) req.pins.push(this._cache.pin(entry));
    req.usage.cachedPromptTokens = length;
    this._counters.promptTokens += req.tokens.length;
    this._counters.cachedPromptTokens += length;
    if (entry && length === req.tokens.length) {
      req.spawnChoices(entry.branch); // the whole prompt is cached, logits included
      return true;
    }
    if (!entry) req.branch = Branch.create(this._ctx, 0, PROMPT_BRANCH_PARAMS);
    else if (start.partial) req.branch = entry.branch.forkAt(length);
    else req.branch = entry.branch.fork();
    req.leasesToCome--;
    req.pos = length;
    this._openSegment(req);
    return true;
  }

  /** The request's prompt branch becomes a (growing) cache entry up to its next cache point. */
  _openSegment(req) {
    const end = req.cachePoints.find((p) => p > req.pos);
    req.segment = this._cache.open(req.tokens.slice(0, end), req.branch);
    req.pins.push(this._cache.pin(req.segment));
  }

  /** Prefills up to `prefillChunk` prompt tokens of prefilling requests in one batch; returns the count. */
  async _prefillPhase() {
    let budget = this._prefillChunk;
    const batch = [];
    for (const req of this._running.filter((r) => r.state === 'prefilling')) {
      try {
        if (!req.segment && !this._begin(req)) continue;
      } catch (e) {
        this._fail(req, e); // e.g. no free lease after all
        continue;
      }
      if (req.state !== 'prefilling' || budget === 0) continue;
      const take = Math.min(req.segment.tokens.length - req.pos, budget);
      batch.push({ req, take });
      budget -= take;
    }
    if (batch.length === 0) return 0;
    try {
      await this._store.prefill(batch.map(({ req, take }) => [req.branch, req.tokens.slice(req.pos, req.pos + take)]));
    } catch (e) {
      for (const { req } of batch) if (req.running) this._fail(req, e); // all-or-nothing: none advanced
      return 0;
    }
    let tokens = 0;
    for (const { req, take } of batch) {
      req.pos += take;
      tokens += take;
      if (req.pos < req.segment.tokens.length) continue;
      if (req.state === 'prefilling') this._segmentFilled(req);
      else this._cache.filled(req.segment); // aborted meanwhile: the filled prefix stays cached
    }
    this._counters.prefilledTokens += tokens;
    return tokens;
  }

  _segmentFilled(req) {
    const entry = req.segment;
    this._cache.filled(entry);
    try {
      if (req.pos === req.tokens.length) {
        req.spawnChoices(entry.branch);
        return;
      }
      req.branch = entry.branch.fork(); // the cached prefix stays; the request goes on in a fork
      req.leasesToCome--;
      this._openSegment(req);
    } catch (e) {
      this._fail(req, e); // e.g. invalid sampling params or grammar
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Decode

  /** ONE produce and ONE commit for every unfinished choice of every generating request. */
  async _decodePhase() {
    const active = [];
    for (const req of this._running.filter((r) => r.state === 'generating')) {
      for (const choice of req.choices) if (!choice.finishReason) active.push({ req, choice });
    }
    if (active.length === 0) return 0;
    const produced = this._produceAll(active);
    active.forEach(({ req }, i) => {
      if (produced[i] instanceof Error && req.running) this._fail(req, produced[i]);
    });
    const entries = [];
    const owners = [];
    active.forEach(({ req, choice }, i) => {
      if (req.state !== 'generating') return;
      if (this._advanceChoice(req, choice, produced[i])) {
        entries.push([choice.branch, produced[i].token]);
        owners.push(req);
      }
    });
    if (entries.length > 0) await this._commitAll(entries, owners);
    for (const req of this._running.filter((r) => r.choices && r.state !== 'prefilling')) {
      if (req.choices.every((c) => c.finishReason)) this._settle(req, null);
    }
    return entries.length;
  }

  /** One `store.produce` for all; if it throws (e.g. a grammar masks everything), per branch to find whose. */
  _produceAll(active) {
    try {
      return this._store.produce(active.map((a) => a.choice.branch));
    } catch {
      return active.map(({ choice }) => {
        try {
          return choice.branch.produce();
        } catch (e) {
          return e;
        }
      });
    }
  }

  /** ONE `store.commit`; if it fails, per request, so that one request's failure stays its own. */
  async _commitAll(entries, owners) {
    try {
      await this._store.commit(entries);
      return;
    } catch {
      // fall through: isolate the failing request(s)
    }
    for (const req of new Set(owners)) {
      try {
        await this._store.commit(entries.filter((_, i) => owners[i] === req));
      } catch (e) {
        if (req.running) this._fail(req, e);
      }
    }
  }

  /** Takes a produced token into its choice; true when it is still to be committed. */
  _advanceChoice(req, choice, produced) {
    if (produced.isStop) {
      req.finishChoice(choice, 'stop');
      return false;
    }
    choice.tokens.push(produced.token);
    req.usage.completionTokens++;
    this._counters.generatedTokens++;
    const text = choice.matcher.push(produced.text);
    req.gen._push({ choice: choice.index, token: produced.token, text });
    const reason = choice.matcher.stopped ? 'stop' : choice.tokens.length >= req.maxTokens ? 'length' : null;
    if (!reason) return true;
    // Not decoded (nothing will be sampled after it), but accepted so perplexity counts it.
    try {
      choice.branch.accept(produced.token);
    } catch {
      // perplexity then leaves the last token out; the text is complete either way
    }
    req.finishChoice(choice, reason);
    return false;
  }

  // ---------------------------------------------------------------------------------------------
  // Ending requests

  /** Gives back everything the request holds; an unfinished prompt segment leaves the cache. */
  _releaseRequest(req) {
    const at = this._running.indexOf(req);
    if (at !== -1) this._running.splice(at, 1);
    if (req.segment && !req.segment.ready) this._cache.evict(req.segment, false);
    if (req.branch && req.branch !== (req.segment && req.segment.branch)) release(req.branch);
    for (const choice of req.choices || []) {
      if (!choice.finishReason) req.finishChoice(choice, 'abort');
    }
    for (const entry of req.pins) this._cache.unpin(entry);
    req.pins = [];
    req.segment = null;
    req.branch = null;
    if (req.signal && req.onAbort) req.signal.removeEventListener('abort', req.onAbort);
  }

  /** Resolves the request: `reason` 'abort' ends unfinished choices so; null when all finished. */
  _settle(req, reason) {
    this._releaseRequest(req);
    req.to('done');
    if (!req.choices) req.endUnstarted(reason || 'abort');
    this._counters.completed++;
    req.gen._finish(req.result());
  }

  _fail(req, error) {
    req.choices = req.choices || [];
    this._releaseRequest(req);
    req.to('failed');
    req.gen._fail(error);
  }
}

module.exports = { Scheduler };
