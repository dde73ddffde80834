'use strict';

/**
 * One Scheduler step, phase by phase (ARCHITECTURE.md, "The data path of one Scheduler step"):
 * collect ended programs, park and resume lines, prepare queued programs, restore one stored
 * prefix, admit, then the prefill round (lines take their branches, images, ONE scored prefill)
 * and the decode round (ONE produce and ONE commit over ../decode/rows.js). A program failing in
 * a phase fails there alone. Returns what the step did as data: its counts and times, and its
 * `plan` — which lines took branches, what each prefilled and which decoded — for `onStep` and
 * the `step` event.
 */

const { prefillMedia } = require('./media');
const { StepPlan } = require('./step-plan');

/**
 * @typedef {{ rows: number, prefillTokens: number, prefillMs: number, decodeMs: number, stepMs: number,
 *   blocked: boolean, plan: StepPlan }} StepResult
 */

/**
 * The parts a step works on: the Scheduler's, given once.
 * @typedef {{ ctx: any, store: any, cache: import('./prefix-cache').PrefixCache, queue: import('./queue').Queue,
 *   programs: import('./programs').Programs, budget: import('./step-budget').StepBudget, systemPrompts: any,
 *   counters: { prefilledTokens: number, draftTokens: number, acceptedDraftTokens: number },
 *   options: { prefillChunk: number, spec: any } }} StepParts
 */

/**
 * The Scheduler's steps: runs each (`step`), keeps the counts and gauges `stats()` shows, and
 * tells `onStep` and the `step` event what the step did.
 */
class Steps {
  #parts;
  #events;
  #onStep;
  /** The KV cells' use as of the end of the last step. */
  #pressure;
  /** Of those, the cells running work holds (idle cached prefixes left out). */
  #inUse;
  /** @type {Promise<void> | null} the steps running now */
  #loop = null;
  /** The queue's head waits for a program to give room back: no step until something changes. */
  #blocked = false;
  #closed = false;

  /**
   * @param {StepParts & { counters: { steps: number, completed: number } }} parts
   * @param {import('./events').SchedulerEvents} events
   * @param {((info: any) => void) | null} onStep
   */
  constructor(parts, events, onStep) {
    this.#parts = parts;
    this.#events = events;
    this.#onStep = onStep;
    this.#pressure = parts.store.kvPressure();
    this.#inUse = this.#pressure.cellsUsed;
  }

  /** Whether the scheduler closed (nothing more is queued). */
  get closed() {
    return this.#closed;
  }

  /** The scheduler closes: nothing is restored from now on, and whatever runs ends within a step. */
  close() {
    this.#closed = true;
    this.kick();
  }

  /** Resolves once no step runs. */
  async idle() {
    while (this.#loop) await this.#loop;
  }

  /** Runs steps until nobody has work (something changed: a queued head may fit now). */
  kick() {
    this.#blocked = false;
    if (this.#loop) return;
    this.#loop = this.#run().finally(() => {
      this.#loop = null;
      if (this.#hasWork()) this.kick();
    });
  }

  #hasWork() {
    return this.#parts.programs.hasWork() || (this.#parts.queue.length > 0 && !this.#blocked);
  }

  async #run() {
    const { ctx, programs, queue } = this.#parts;
    while (this.#hasWork()) {
      try {
        // A step that decoded nothing (a program between its awaits, a line waiting for a lease
        // or a prompt another line fills) yields to the event loop before the next one, so a
        // wait never turns into a loop of microtasks that starves timers and I/O.
        if ((await this.step()) === 0) await new Promise((resolve) => setImmediate(resolve));
      } catch (e) {
        // Not attributable to one program (e.g. the context was disposed): nobody can go on.
        for (const item of programs.list) item.end({ error: e });
        if (ctx.disposed) for (const item of queue.takeAll()) item.reject(e);
      }
    }
  }

  /** Measures the KV cells again (after a step, or a close freed the cache). */
  measure() {
    if (this.#parts.ctx.disposed) return;
    const { store, cache } = this.#parts;
    this.#pressure = store.kvPressure();
    this.#inUse = store.kvPressure(cache.idleBranches()).cellsUsed;
  }

  /** One step; returns its rows plus prefilled tokens (0: it decoded nothing). */
  async step() {
    const step = await runStep(this.#parts, this.#closed, (done) => this.#report(done));
    return step.rows + step.prefillTokens;
  }

  /**
   * What `step` did, told to `onStep` and the `step` event as soon as its decode is back (in the
   * same microtask: before any program's code goes on from what the step gave it).
   * @param {StepResult} step
   */
  #report(step) {
    if (step.blocked) this.#blocked = true;
    const { ctx, store, cache, programs, queue, counters, budget } = this.#parts;
    counters.steps++;
    this.measure();
    const { rows, prefillTokens, stepMs, plan } = step;
    if (this.#events.on) {
      // The `step` event: what the step did and the gauges after it (an `evict` event first, if any).
      const nSeqMax = ctx.disposed ? 0 : ctx.nSeqMax;
      const gauges = { leasesUsed: ctx.disposed ? 0 : nSeqMax - store.available, nSeqMax, cacheTokens: cache.tokens };
      this.#events.step({ rows, prefillTokens, stepMs, plan }, this.stats(), gauges);
    }
    if (this.#onStep) {
      const [{ cellsUsed }, running, queued, { deferred }] = [this.#pressure, programs.size, queue.length, budget];
      const { prefillMs, decodeMs } = step;
      this.#onStep({ rows, prefillTokens, prefillMs, decodeMs, stepMs, cellsUsed, running, queued, deferred, plan });
    }
  }

  /**
   * Counters and gauges (never busy); `cellsUsed` is as of the end of the last step.
   * @returns {import('../types').SchedulerStats}
   */
  stats() {
    const { ctx, cache, programs: p, queue } = this.#parts;
    const c = /** @type {any} */ (this.#parts.counters);
    const tiers = cache.tierStats();
    const requests = p.requests;
    return {
      running: requests,
      programs: p.size - requests,
      queued: queue.length,
      cachedPrefixes: cache.size,
      cellsUsed: this.#pressure.cellsUsed,
      cellsInUse: this.#inUse,
      nCtx: this.#pressure.nCtx,
      hitRate: p.promptTokens === 0 ? 0 : p.cachedPromptTokens / p.promptTokens,
      steps: c.steps,
      promptTokens: p.promptTokens,
      cachedPromptTokens: p.cachedPromptTokens,
      prefilledTokens: c.prefilledTokens,
      generatedTokens: p.completionTokens,
      completed: c.completed,
      draftTokens: c.draftTokens,
      acceptedDraftTokens: c.acceptedDraftTokens,
      evictions: cache.evictions,
      ...(tiers ? { cacheTiers: tiers } : {}),
      ...(ctx.hasProjector ? { imageEncodes: ctx.imageStats().encodes } : {}),
    };
  }
}

/**
 * Runs one step; `closed`: the scheduler closes (nothing is restored for what will not start).
 * `report` hears what it did synchronously after its decode, before the step's promise settles.
 * @param {StepParts} parts
 * @param {boolean} closed
 * @param {(step: StepResult) => void} [report]
 * @returns {Promise<StepResult>}
 */
async function runStep(parts, closed, report = () => {}) {
  const { programs, queue, cache, store } = parts;
  const started = performance.now();
  const plan = new StepPlan();
  programs.record(plan);
  await programs.collect();
  await programs.moveLines(); // parks give cells and leases back before admission counts them
  await queue.prepare(parts.ctx, parts.systemPrompts);
  // The cache restores a prefix stored in RAM or on disk that a prompt or fresh line starts with.
  if (!closed) plan.setRestored(await queue.restore(programs, cache));
  const blocked = queue.admit(programs, cache, store);
  const times = [performance.now()];
  const counts = [];
  for (const round of ROUNDS) {
    // A round starts with the lines that need a branch taking theirs: in the first, fresh and
    // restored lines; after a round that prefilled, forks whose parent reached their fork point.
    // (After none, nothing: a line that appeared mid-step waits for the next step's restore.)
    if (counts.length === 0 || counts[0] > 0) programs.materialize();
    counts.push(await round(parts));
    times.push(performance.now());
  }
  const [[prefillTokens, rows], [prefillStart, decodeStart, ended]] = [counts, times];
  programs.record(null);
  parts.budget.observe(rows, ended - started);
  const [prefillMs, decodeMs, stepMs] = [decodeStart - prefillStart, ended - decodeStart, ended - started];
  const step = { rows, prefillTokens, prefillMs, decodeMs, stepMs, blocked, plan };
  report(step);
  return step;
}

/**
 * The prefill round: the step's image positions in one worker job (./media.js), then up to
 * `prefillChunk` pending text tokens of running lines in ONE scored prefill; returns the count.
 */
async function prefillRound({ ctx, store, programs, counters, options }) {
  const media = ctx.hasProjector ? await prefillMedia(programs, store) : 0;
  counters.prefilledTokens += media;
  const lines = programs.linesToPrefill(options.prefillChunk);
  if (lines.length === 0) return media;
  programs.cellsFor(lines.reduce((sum, l) => sum + l.take, 0));
  let scores;
  try {
    scores = await store.scorePerToken(programs.prefillEntries(lines));
  } catch (e) {
    programs.prefillFailed(lines, e); // all-or-nothing: none advanced
    return media;
  }
  const tokens = programs.applyPrefill(lines, scores);
  counters.prefilledTokens += tokens;
  return media + tokens;
}

/** ONE produce and ONE commit for every line of every program in a gen (a request's choices too). */
async function decodeRound({ ctx, store, programs, counters, options }) {
  const rows = programs.decodeRows();
  if (rows.length === 0) return 0;
  programs.cellsFor(rows.length);
  const { spec } = options;
  const speculation = spec && { ctx, spec };
  const { committed, drafted, accepted } = await programs.decode(store, rows, speculation);
  counters.draftTokens += drafted;
  counters.acceptedDraftTokens += accepted;
  return committed;
}

/** A step's rounds in order: a fork takes its KV right after its parent's prefill. */
const ROUNDS = [prefillRound, decodeRound];

module.exports = { Steps, runStep };
