'use strict';

/**
 * Continuous batching over one context: many independent `generate()` calls share each step's
 * decode, reuse cached prompt prefixes and wait in a bounded queue when the context is full.
 *
 * One step (the loop runs while there is work; nothing runs when idle):
 *   1. requests whose signal aborted (or that failed) give their branches back;
 *   2. queued requests are prepared (chat template, tokenization) and admitted in FIFO order
 *      while leases and KV cells suffice for everything the running ones may still need
 *      (evicting least-recently-used cached prefixes that no running request uses);
 *   3. prefill: newcomers' prompt tokens, at most `prefillChunk` in all, in one `store.prefill`;
 *   4. decode: ONE `store.produce` and ONE `store.commit` for every running choice of every request.
 *
 * The scheduler must be the only user of its context: between its own operations the context
 * must be idle, or its synchronous calls (produce, fork) would wait for someone else's work.
 */

const { Branch } = require('./Branch');
const { BranchStore } = require('./BranchStore');
const { makeError } = require('./errors');
const { signalOf } = require('./cancel');
const { RadixTree } = require('./scheduler/radix');
const { StopMatcher } = require('./scheduler/stops');
const { Generation } = require('./scheduler/generation');
const { SchedulerErrorCode, schedulerError } = require('./scheduler/errors');

const DEFAULTS = Object.freeze({
  prefillChunk: 256,
  maxQueue: 64,
  maxRunning: Infinity,
  defaultMaxTokens: 256,
  onStep: null,
});

/** Sampler of prompt branches: they are only forked, never sampled. */
const PROMPT_BRANCH_PARAMS = Object.freeze({ temperature: 0 });
const SEED_SPACE = 2 ** 32;
/** Roles whose leading messages are cached as their own prefix (the shared system prompt). */
const LEADING_ROLES = new Set(['system', 'developer']);
/** How many distinct leading-message sets keep their token boundary memoized. */
const SPLIT_MEMO_SIZE = 64;
/**
 * A prompt shares at least this many leading tokens with a cached entry before it forks that
 * entry part-way (forkAt). Shorter runs (a BOS token, a common first word) save almost no
 * prefill, yet would pin and refresh an unrelated entry, keeping it from LRU eviction.
 */
const MIN_PARTIAL_REUSE = 16;

const isInt = (v) => Number.isInteger(v);

function invalid(message) {
  return makeError('ERR_INVALID_ARG', message);
}

function positiveInt(value, name, fallback) {
  if (value === undefined) return fallback;
  if (!isInt(value) || value < 1) throw invalid(`${name} must be a positive integer, got ${value}`);
  return value;
}

/** Fire-and-forget prune that never surfaces as an unhandled rejection (the branch may already be gone). */
function release(branch) {
  if (branch && !branch.disposed) branch.prune().catch(() => {});
}

/**
 * A cached prompt prefix: a branch holding the KV cells (and, once `ready`, the logits
 * snapshot) of exactly `tokens`. `pins` counts running requests using it; only unpinned, ready
 * entries are evicted.
 */
class CacheEntry {
  constructor(tokens, branch) {
    this.tokens = tokens;
    this.branch = branch;
    this.pins = 0;
    this.lastUsed = 0;
    this.ready = false;
  }
}

class Scheduler {
  /**
   * @param {import('./Context').SessionContext} ctx a context the scheduler uses alone; size `nSeqMax`
   *   for (running requests × (n + 1)) + cached prefixes, and `nCtx` for their tokens.
   * @param {object} [options] `prefillChunk` (prompt tokens per step, default 256), `maxQueue`
   *   (64), `maxRunning` (unbounded), `defaultMaxTokens` (256), `onStep(info)`.
   */
  constructor(ctx, options = {}) {
    if (options === null || typeof options !== 'object') throw invalid('new Scheduler(ctx, options?): options must be an object');
    this._ctx = ctx;
    this._store = new BranchStore(ctx);
    const o = { ...DEFAULTS, ...options };
    this._prefillChunk = positiveInt(o.prefillChunk, 'options.prefillChunk');
    this._maxQueue = o.maxQueue === 0 ? 0 : positiveInt(o.maxQueue, 'options.maxQueue');
    this._maxRunning = o.maxRunning === Infinity ? Infinity : positiveInt(o.maxRunning, 'options.maxRunning');
    this._defaultMaxTokens = positiveInt(o.defaultMaxTokens, 'options.defaultMaxTokens');
    if (o.onStep !== null && typeof o.onStep !== 'function') throw invalid('options.onStep must be a function');
    this._onStep = o.onStep;

    this._queue = [];
    this._running = [];
    this._cache = new RadixTree();
    this._clock = 0;
    this._loop = null;
    this._closed = false;
    this._splitMemo = new Map();
    this._pressure = this._store.kvPressure();
    this._counters = { steps: 0, promptTokens: 0, cachedPromptTokens: 0, prefilledTokens: 0, generatedTokens: 0, evictions: 0, completed: 0 };
  }

  /**
   * Queues a request. Returns a {@link Generation}: `await` it for `{ choices, usage }`, or
   * `for await` its events. Errors (invalid request, ERR_QUEUE_FULL, ...) reject it.
   */
  generate(request) {
    const gen = new Generation();
    let job;
    try {
      job = this._makeJob(request, gen);
    } catch (e) {
      gen._fail(e);
      return gen;
    }
    if (this._closed) {
      gen._fail(schedulerError(SchedulerErrorCode.SCHEDULER_CLOSED, 'the scheduler was closed; create a new Scheduler for new requests'));
      return gen;
    }
    if (job.signal && job.signal.aborted) {
      this._settle(job, 'abort');
      return gen;
    }
    if (this._queue.length >= this._maxQueue) {
      gen._fail(schedulerError(SchedulerErrorCode.QUEUE_FULL, `the scheduler's queue is full (maxQueue ${this._maxQueue} requests wait already); retry later or raise maxQueue`));
      return gen;
    }
    if (job.signal) {
      job.onAbort = () => this._abort(job);
      job.signal.addEventListener('abort', job.onAbort, { once: true });
    }
    this._queue.push(job);
    this._kick();
    return gen;
  }

  /** Counters and gauges; `cellsUsed` is as of the end of the last step (the context may be busy now). */
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
    };
  }

  /**
   * Stops taking requests: queued ones reject with ERR_SCHEDULER_CLOSED, running ones end with
   * finishReason 'abort' within one step; then every cached prefix is freed. Idempotent.
   */
  async close() {
    this._closed = true;
    for (const job of this._queue.splice(0)) this._fail(job, schedulerError(SchedulerErrorCode.SCHEDULER_CLOSED, 'the scheduler was closed before this request started'));
    for (const job of this._running) job.aborted = true;
    while (this._loop) await this._loop;
    for (const entry of [...this._cache.values()]) this._evict(entry, false);
    if (!this._ctx.disposed) this._pressure = this._store.kvPressure();
  }

  // ---------------------------------------------------------------------------------------------
  // Requests

  _makeJob(request, gen) {
    if (request === null || typeof request !== 'object') throw invalid('generate(request): request must be an object with prompt, tokens or messages');
    const inputs = ['prompt', 'tokens', 'messages'].filter((k) => request[k] !== undefined);
    if (inputs.length !== 1) throw invalid(`generate(request): give exactly one of prompt, tokens or messages (got ${inputs.length ? inputs.join(', ') : 'none'})`);
    if (request.prompt !== undefined && (typeof request.prompt !== 'string' || request.prompt === '')) throw invalid('request.prompt must be a non-empty string');
    if (request.tokens !== undefined) {
      const vocab = this._ctx.vocabSize;
      if (!Array.isArray(request.tokens) || request.tokens.length === 0 || !request.tokens.every((t) => isInt(t) && t >= 0 && t < vocab)) {
        throw invalid(`request.tokens must be a non-empty array of token ids in [0, ${vocab})`);
      }
    }
    if (request.messages !== undefined && (!Array.isArray(request.messages) || request.messages.length === 0)) throw invalid('request.messages must be a non-empty array of {role, content}');
    const n = positiveInt(request.n, 'request.n', 1);
    const maxTokens = positiveInt(request.maxTokens, 'request.maxTokens', this._defaultMaxTokens);
    let stops = request.stop === undefined || request.stop === null ? [] : request.stop;
    if (typeof stops === 'string') stops = [stops];
    if (!Array.isArray(stops) || !stops.every((s) => typeof s === 'string')) throw invalid('request.stop must be a string or an array of strings');
    stops = stops.filter((s) => s !== '');
    if (request.params !== undefined && (request.params === null || typeof request.params !== 'object')) throw invalid('request.params must be a SamplingParams object');
    const { seed: paramsSeed, grammar: paramsGrammar, ...params } = request.params || {};
    const seed = request.seed !== undefined ? request.seed : paramsSeed;
    if (seed !== undefined && seed !== -1 && !(isInt(seed) && seed >= 0 && seed < SEED_SPACE)) throw invalid(`request.seed must be an integer in [0, 2^32), got ${seed}`);
    const grammar = request.grammar !== undefined ? request.grammar : paramsGrammar;
    if (grammar !== undefined && grammar !== null && typeof grammar !== 'string') throw invalid('request.grammar must be a GBNF string');
    if (grammar && request.jsonSchema !== undefined) throw invalid('give grammar or jsonSchema, not both');
    const signal = signalOf({ signal: request.signal }, 'generate');
    return {
      gen,
      signal,
      onAbort: null,
      input: request,
      n,
      maxTokens,
      stops,
      params,
      seedBase: seed === undefined || seed === -1 ? Math.floor(Math.random() * SEED_SPACE) : seed,
      grammar: grammar || null,
      // Converted off the main thread now; awaited when the request is prepared.
      grammarPending: request.jsonSchema !== undefined ? lazyJsonSchemaToGrammar(request.jsonSchema) : null,
      prepared: false,
      aborted: false,
      failure: null,
      tokens: null,
      cachePoints: null,
      plannedStart: 0,
      branch: null,
      segment: null,
      pos: 0,
      pins: [],
      leasesToCome: 0,
      choices: null,
      usage: { promptTokens: 0, cachedPromptTokens: 0, completionTokens: 0 },
    };
  }

  _abort(job) {
    const queued = this._queue.indexOf(job);
    if (queued !== -1) {
      this._queue.splice(queued, 1);
      this._settle(job, 'abort');
      return;
    }
    job.aborted = true; // the loop frees its branches at the start of the next step
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
        for (const job of [...this._running]) this._fail(job, e);
        if (this._ctx.disposed) for (const job of this._queue.splice(0)) this._fail(job, e);
      }
    }
  }

  async _step() {
    const started = performance.now();
    this._reap();
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
      this._onStep({
        rows,
        prefillTokens,
        prefillMs: decodeStart - prefillStart,
        decodeMs: ended - decodeStart,
        stepMs: ended - started,
        cellsUsed: this._pressure.cellsUsed,
        running: this._running.length,
        queued: this._queue.length,
      });
    }
  }

  /** Ends aborted requests (finishReason 'abort') and failed ones; their branches go back. */
  _reap() {
    for (const job of [...this._running]) {
      if (job.failure) this._fail(job, job.failure);
      else if (job.aborted) this._settle(job, 'abort');
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Preparation and admission

  /** Tokenizes queued requests in order (chat templates run on the context's worker: here, between steps). */
  async _prepareQueued() {
    for (const job of [...this._queue]) {
      if (job.prepared) continue;
      try {
        await this._prepare(job);
      } catch (e) {
        const at = this._queue.indexOf(job);
        if (at !== -1) this._queue.splice(at, 1);
        this._fail(job, e);
      }
    }
  }

  async _prepare(job) {
    const ctx = this._ctx;
    const { prompt, tokens, messages } = job.input;
    job.cachePoints = [];
    if (messages !== undefined) {
      const formatted = await ctx.formatChat(messages);
      job.tokens = ctx.tokenizeSync(formatted.prompt, true);
      job.stops.push(...formatted.stopTokens.filter((s) => s !== ''));
      const lead = await this._leadingMessagesPrefix(messages);
      if (lead && lead.length < job.tokens.length && lead.every((t, i) => t === job.tokens[i])) job.cachePoints.push(lead.length);
    } else {
      job.tokens = tokens !== undefined ? tokens.slice() : ctx.tokenizeSync(prompt, true);
    }
    if (job.tokens.length === 0) throw invalid('the prompt tokenized to nothing; give a non-empty prompt');
    job.cachePoints.push(job.tokens.length);
    if (job.grammarPending) job.grammar = await job.grammarPending;
    const cells = job.tokens.length + job.n * job.maxTokens;
    if (cells > this._pressure.nCtx) {
      throw invalid(`the request needs up to ${cells} KV cells (prompt ${job.tokens.length} + n ${job.n} × maxTokens ${job.maxTokens}) but the context has nCtx ${this._pressure.nCtx}; lower maxTokens or n, or create the context with a larger nCtx`);
    }
    const leases = job.n + job.cachePoints.length;
    if (leases > this._ctx.nSeqMax) {
      throw invalid(`the request needs ${leases} sequence leases (n ${job.n} + ${job.cachePoints.length} prompt branches) but the context has nSeqMax ${this._ctx.nSeqMax}; lower n or create the context with a larger nSeqMax`);
    }
    job.prepared = true;
  }

  /**
   * The tokens of the leading system/developer messages as the chat template renders them
   * before any user turn, so that requests sharing a system prompt share a cached prefix that
   * ends at a message boundary. Found as the common token prefix of two renderings that differ
   * only in the first user message; memoized per leading-message set.
   */
  async _leadingMessagesPrefix(messages) {
    let count = 0;
    while (count < messages.length && messages[count] && LEADING_ROLES.has(messages[count].role)) count++;
    if (count === 0 || count === messages.length) return null;
    const lead = messages.slice(0, count);
    const key = JSON.stringify(lead);
    if (this._splitMemo.has(key)) return this._splitMemo.get(key);
    let prefix = null;
    try {
      const render = async (content) => this._ctx.tokenizeSync((await this._ctx.formatChat([...lead, { role: 'user', content }])).prompt, true);
      const a = await render('A');
      const b = await render('B');
      let k = 0;
      while (k < a.length && k < b.length && a[k] === b[k]) k++;
      prefix = k > 0 ? a.slice(0, k) : null;
    } catch {
      prefix = null; // a template that cannot render this shape: no boundary, still correct
    }
    if (this._splitMemo.size >= SPLIT_MEMO_SIZE) this._splitMemo.delete(this._splitMemo.keys().next().value);
    this._splitMemo.set(key, prefix);
    return prefix;
  }

  /**
   * Admits queued requests in FIFO order while their worst case fits next to what running
   * requests may still need. A request that cannot fit even into an empty context fails.
   */
  _admit() {
    while (this._queue.length > 0 && this._running.length < this._maxRunning) {
      const job = this._queue[0];
      if (!job.prepared) return;
      const plan = this._plan(job);
      if (!this._makeRoom(plan)) {
        if (this._running.length === 0) {
          this._queue.shift();
          const p = this._pressure;
          this._fail(job, makeError('ERR_KV_FULL', `the request does not fit even with every cached prefix evicted (needs ${plan.cells} cells and ${plan.leases} leases; ${p.remaining} of ${p.nCtx} cells and ${this._store.available} leases are free): lower maxTokens or n, or create the context with a larger nCtx / nSeqMax`));
          continue;
        }
        return; // wait for running requests to finish
      }
      this._queue.shift();
      job.plannedStart = plan.start;
      job.leasesToCome = plan.leases;
      job.usage.promptTokens = job.tokens.length;
      this._running.push(job);
    }
  }

  /** The cache start a request would get now, and the cells and leases it may need from there. */
  _plan(job) {
    const { entry, length } = this._bestStart(job.tokens);
    const newPromptBranches = job.cachePoints.filter((p) => p > length).length;
    return {
      entry,
      start: length,
      cells: job.tokens.length - length + job.n * job.maxTokens,
      leases: job.n + newPromptBranches,
    };
  }

  /** Evicts least-recently-used cached prefixes until `plan` fits; false if it cannot. */
  _makeRoom(plan) {
    if (plan.entry) plan.entry.pins++; // the prefix it will fork must survive the evictions
    try {
      for (;;) {
        const pressure = this._store.kvPressure();
        const freeCells = pressure.remaining - this._reservedCells();
        const freeLeases = this._store.available - this._reservedLeases();
        if (freeCells >= plan.cells && freeLeases >= plan.leases) return true;
        const victim = this._leastRecentlyUsed();
        if (!victim) return false;
        this._evict(victim);
      }
    } finally {
      if (plan.entry) plan.entry.pins--;
    }
  }

  /** Cells that admitted requests may still write: their uncached prompt and every token left to generate. */
  _reservedCells() {
    let cells = 0;
    for (const job of this._running) {
      if (!job.choices) {
        cells += job.tokens.length - (job.branch || job.segment ? job.pos : job.plannedStart) + job.n * job.maxTokens;
      } else {
        for (const c of job.choices) if (!c.finishReason) cells += job.maxTokens - c.tokens.length;
      }
    }
    return cells;
  }

  _reservedLeases() {
    return this._running.reduce((sum, job) => sum + job.leasesToCome, 0);
  }

  _leastRecentlyUsed() {
    let victim = null;
    for (const e of this._cache.values()) {
      if (e.pins === 0 && e.ready && (!victim || e.lastUsed < victim.lastUsed)) victim = e;
    }
    return victim;
  }

  _evict(entry, counted = true) {
    this._cache.delete(entry.tokens);
    release(entry.branch);
    if (counted) this._counters.evictions++;
  }

  // ---------------------------------------------------------------------------------------------
  // Prefill

  /**
   * Whether `branch.forkAt(position)` may share its cells: always at its own position; below it
   * only while the branch has not passed the model's sliding window (llama.cpp may reuse cells
   * that left a sequence's window, see Branch.forkAt).
   */
  _canForkAt(branch, position) {
    const window = this._ctx.slidingWindow;
    return position === branch.position || window === 0 || branch.position < window;
  }

  /**
   * Where a prompt can start from the cache: the longest cached prefix (whole entry), or the
   * longest shared run of any entry (forkAt) when it is at least MIN_PARTIAL_REUSE tokens. Entries still being prefilled count:
   * a request that would use one waits until it is filled that far.
   */
  _bestStart(tokens) {
    const { prefix, shared } = this._cache.match(tokens);
    const longerThanPrefix = shared && prefix !== shared && shared.length > (prefix ? prefix.length : 0);
    if (longerThanPrefix && shared.length >= MIN_PARTIAL_REUSE && this._canForkAt(shared.value.branch, shared.length)) {
      return { entry: shared.value, length: shared.length, partial: true };
    }
    return prefix ? { entry: prefix.value, length: prefix.length, partial: false } : { entry: null, length: 0, partial: false };
  }

  /**
   * Gives a newly admitted request its prompt branch, forked from the best cached start. Returns
   * false while the start it wants is still being prefilled by an earlier request.
   */
  _begin(job) {
    const start = this._bestStart(job.tokens);
    const { entry } = start;
    // Never fork the whole prompt's logits from a partial fork: at least one token is decoded.
    const length = start.partial ? Math.min(start.length, job.tokens.length - 1) : start.length;
    if (entry && !entry.ready && entry.branch.position < length) return false;
    if (entry) this._pin(job, entry);
    job.usage.cachedPromptTokens = length;
    this._counters.promptTokens += job.tokens.length;
    this._counters.cachedPromptTokens += length;
    if (entry && length === job.tokens.length) {
      this._spawnChoices(job, entry.branch); // the whole prompt is cached, logits included
      return true;
    }
    if (!entry) job.branch = Branch.create(this._ctx, 0, PROMPT_BRANCH_PARAMS);
    else if (start.partial) job.branch = entry.branch.forkAt(length);
    else job.branch = entry.branch.fork();
    job.leasesToCome--;
    job.pos = length;
    this._openSegment(job);
    return true;
  }

  /** `_begin`, with a failure (e.g. no free lease after all) kept as the request's own. */
  _tryBegin(job) {
    try {
      return this._begin(job);
    } catch (e) {
      job.failure = e;
      return false;
    }
  }

  /** The request's prompt branch becomes a (growing) cache entry up to its next cache point. */
  _openSegment(job) {
    const end = job.cachePoints.find((p) => p > job.pos);
    const entry = new CacheEntry(job.tokens.slice(0, end), job.branch);
    this._cache.insert(entry.tokens, entry);
    this._pin(job, entry);
    job.segment = entry;
  }

  async _prefillPhase() {
    let budget = this._prefillChunk;
    const batch = [];
    for (const job of this._running) {
      if (job.choices || job.aborted || job.failure) continue;
      if (!job.segment && !this._tryBegin(job)) continue;
      if (job.choices || budget === 0) continue;
      const take = Math.min(job.segment.tokens.length - job.pos, budget);
      batch.push({ job, take });
      budget -= take;
    }
    if (batch.length === 0) return 0;
    try {
      await this._store.prefill(batch.map(({ job, take }) => [job.branch, job.tokens.slice(job.pos, job.pos + take)]));
    } catch (e) {
      for (const { job } of batch) job.failure = e; // all-or-nothing: none of them advanced
      this._reap();
      return 0;
    }
    let tokens = 0;
    for (const { job, take } of batch) {
      job.pos += take;
      tokens += take;
      if (job.pos === job.segment.tokens.length) this._segmentFilled(job);
    }
    this._counters.prefilledTokens += tokens;
    return tokens;
  }

  _segmentFilled(job) {
    const entry = job.segment;
    entry.ready = true;
    if (job.pos === job.tokens.length) {
      this._spawnChoices(job, entry.branch);
      return;
    }
    job.branch = entry.branch.fork(); // the cached prefix stays; the request goes on in a fork
    job.leasesToCome--;
    this._openSegment(job);
  }

  /** n forks of the prompt's last branch, each with the request's sampler and its own seed. */
  _spawnChoices(job, from) {
    job.segment = null;
    job.branch = null;
    job.choices = [];
    try {
      for (let i = 0; i < job.n; i++) {
        const branch = from.fork();
        job.choices.push({ index: i, branch, tokens: [], matcher: new StopMatcher(job.stops), finishReason: null, perplexity: Infinity });
        const params = { ...job.params, seed: (job.seedBase + i) % SEED_SPACE };
        if (job.grammar) params.grammar = job.grammar;
        branch.setSamplerParams(params);
      }
    } catch (e) {
      job.failure = e; // e.g. invalid sampling params or grammar: reaped before the decode
    }
    job.leasesToCome = 0;
  }

  // ---------------------------------------------------------------------------------------------
  // Decode

  async _decodePhase() {
    this._reap(); // requests that failed to start in the prefill phase
    const active = [];
    for (const job of this._running) {
      if (!job.choices || job.aborted) continue;
      for (const choice of job.choices) if (!choice.finishReason) active.push({ job, choice });
    }
    if (active.length === 0) return 0;
    const produced = this._produceAll(active);
    const entries = [];
    const owners = [];
    active.forEach(({ job, choice }, i) => {
      const p = produced[i];
      if (job.failure) return;
      if (p instanceof Error) {
        job.failure = p;
        return;
      }
      this._advanceChoice(job, choice, p, entries, owners);
    });
    this._reap();
    const live = entries.filter((_, i) => !owners[i].failure);
    const liveOwners = owners.filter((job) => !job.failure);
    if (live.length > 0) await this._commitAll(live, liveOwners);
    for (const job of [...this._running]) {
      if (job.choices && !job.failure && job.choices.every((c) => c.finishReason)) this._settle(job, null);
    }
    return live.length;
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
    const jobs = [...new Set(owners)];
    for (const job of jobs) {
      try {
        await this._store.commit(entries.filter((_, i) => owners[i] === job));
      } catch (e) {
        job.failure = e;
      }
    }
    this._reap();
  }

  _advanceChoice(job, choice, produced, entries, owners) {
    if (produced.isStop) {
      this._finishChoice(job, choice, 'stop');
      return;
    }
    choice.tokens.push(produced.token);
    job.usage.completionTokens++;
    this._counters.generatedTokens++;
    const text = choice.matcher.push(produced.text);
    job.gen._push({ choice: choice.index, token: produced.token, text });
    const reason = choice.matcher.stopped ? 'stop' : choice.tokens.length >= job.maxTokens ? 'length' : null;
    if (reason) {
      // Not decoded (nothing will be sampled after it), but accepted so perplexity counts it.
      try {
        choice.branch.accept(produced.token);
      } catch {
        // perplexity then leaves the last token out; the text is complete either way
      }
      this._finishChoice(job, choice, reason);
      return;
    }
    entries.push([choice.branch, produced.token]);
    owners.push(job);
  }

  _finishChoice(job, choice, reason) {
    const rest = choice.matcher.flush(); // the events' texts add up to the result's text
    choice.finishReason = reason;
    if (choice.branch && !choice.branch.disposed) {
      try {
        choice.perplexity = choice.branch.perplexity;
      } catch {
        // busy or disposed: keep Infinity
      }
    }
    release(choice.branch);
    choice.branch = null;
    job.gen._push({ choice: choice.index, token: null, text: rest, finishReason: reason });
  }

  // ---------------------------------------------------------------------------------------------
  // Ending requests

  _pin(job, entry) {
    entry.pins++;
    entry.lastUsed = ++this._clock;
    job.pins.push(entry);
  }

  /** Gives back everything the request holds; an unfinished prompt segment leaves the cache. */
  _releaseJob(job) {
    const at = this._running.indexOf(job);
    if (at !== -1) this._running.splice(at, 1);
    if (job.segment && !job.segment.ready) {
      this._cache.delete(job.segment.tokens);
      release(job.segment.branch);
    }
    if (job.branch && job.branch !== (job.segment && job.segment.branch)) release(job.branch);
    for (const choice of job.choices || []) {
      if (!choice.finishReason) this._finishChoice(job, choice, 'abort');
    }
    for (const entry of job.pins) {
      entry.pins--;
      entry.lastUsed = ++this._clock;
    }
    job.pins = [];
    job.segment = null;
    job.branch = null;
    if (job.signal && job.onAbort) job.signal.removeEventListener('abort', job.onAbort);
  }

  /** Resolves the request: `reason` 'abort' ends unfinished choices so; null when all finished. */
  _settle(job, reason) {
    this._releaseJob(job);
    if (!job.choices) {
      job.choices = Array.from({ length: job.n }, (_, index) => ({ index, tokens: [], matcher: new StopMatcher([]), finishReason: null, perplexity: Infinity }));
      for (const choice of job.choices) this._finishChoice(job, choice, reason || 'abort');
    }
    this._counters.completed++;
    job.gen._finish({
      choices: job.choices.map((c) => ({ text: c.matcher.text, tokens: c.tokens, finishReason: c.finishReason, perplexity: c.perplexity })),
      usage: { ...job.usage },
    });
  }

  _fail(job, error) {
    job.choices = job.choices || [];
    this._releaseJob(job);
    job.gen._fail(error);
  }
}

/** jsonSchemaToGrammar lives in the package entry (required lazily: the entry requires this file). */
function lazyJsonSchemaToGrammar(schema) {
  const promise = require('./index').jsonSchemaToGrammar(schema);
  promise.catch(() => {}); // reported when the request is prepared
  return promise;
}

module.exports = { Scheduler };
