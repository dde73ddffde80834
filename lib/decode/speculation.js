'use strict';

/**
 * Speculation's bookkeeping, shared by the Scheduler's rows and `Branch.generate`: how long each
 * line's next draft is (`DraftLength`, fitted to the step cost the context shows: `StepCost`)
 * and the checked `speculative` options. The draft sources themselves are in lib/speculative.js;
 * drafting for many lines at once is in ./rows.js, the loop of `Branch.generate` in ./generate.js.
 */

const { makeError } = require('../errors');
const { PromptLookup, DraftModel, MAX_DRAFT } = require('../speculative');
const { DecayedLineFit } = require('./line-fit');

/**
 * How long a line's next draft is. Each line keeps an estimate of how often its draft tokens are
 * accepted; the context's cost of a verified row relative to a plain step is measured from the
 * steps themselves. The length chosen maximises expected tokens per unit of step time,
 * `(1 − a^(k+1)) / (1 − a) / (1 + r·k)`, so a line whose drafts are rejected drafts nothing
 * (probing with a short draft now and then), and a line copying its input drafts long.
 */
class DraftLength {
  /**
   * `minGain`: the expected speed-up a draft must promise (default 1, or 1.1 for a draft model,
   * whose drafting after a pause first costs a prefill of what the line wrote meanwhile, which
   * no step's time shows).
   * @param {{ maxDraft: number, cost: StepCost, adaptive?: boolean, minGain?: number, source?: any }} options
   */
  constructor({ maxDraft, cost, adaptive = true, source, minGain = source && source.kind === 'draft' ? 1.1 : 1 }) {
    this.maxDraft = maxDraft;
    this.adaptive = adaptive;
    this.cost = cost;
    this.minGain = minGain;
    // Optimistic at first: a line that never drafts never learns. Lookup drafts only where an
    // n-gram matched, and a draft model shares the target's tokenizer and usually its taste.
    this.acceptance = 0.8;
    this.idle = 0;
    this.probeEvery = 8;
    this.drafted = 0;
    this.accepted = 0;
    this.steps = 0;
  }

  /**
   * The best draft length up to `max` at acceptance `a` and row cost `r`, and its expected
   * speed-up; length 0 unless some length promises more than `minGain`.
   * @param {number} max @param {number} a @param {number} r
   */
  best(max, a, r) {
    let best = 0;
    let bestGain = this.minGain;
    for (let k = 1; k <= max; k++) {
      const gain = (1 - a ** (k + 1)) / (1 - a) / (1 + r * k);
      if (gain > bestGain + 1e-9) [best, bestGain] = [k, gain];
    }
    return best;
  }

  /**
   * The draft length for the next step; at most `limit`. `rows`: the rows of the step without
   * drafts (other lines' tokens), which make one more row relatively cheaper but also raise the
   * throughput a draft row must beat.
   * @param {number} limit @param {number} [rows]
   */
  next(limit, rows = 1) {
    const max = Math.min(this.maxDraft, limit);
    if (max <= 0 || !this.adaptive) return Math.max(max, 0);
    const r = this.cost.ratio(rows);
    const best = this.best(max, Math.min(this.acceptance, 0.99), r);
    // The cost fit needs steps of different sizes, plain ones among them (step cost is not
    // linear in rows, so a line through long drafts alone misjudges a plain step): while it
    // cannot tell yet, every third step is plain. Otherwise a draft model drafting at full
    // length would never learn what its own decodes cost.
    if (best > 0 && this.cost.uncertain() && this.steps % 3 === 2) return 0;
    // Where even drafts that are always accepted would not pay, acceptance is not worth
    // probing: no line probes on its own, and the shared fit alone decides when to look again.
    if (best === 0 && !this.cost.uncertain() && this.best(max, 0.99, r) === 0)
      return this.cost.probeDue() ? Math.min(2, max) : 0;
    if (best === 0 && ++this.idle >= this.probeEvery) {
      // A probe: acceptance or cost may have changed. Each probe that changes nothing waits
      // twice as long for the next, so a draft source that does not pay costs ever less.
      this.idle = 0;
      this.probeEvery = Math.min(this.probeEvery * 2, 256);
      return Math.min(2, max);
    }
    if (best > 0) [this.idle, this.probeEvery] = [0, 8];
    return best;
  }

  /** @param {number} drafted @param {number} accepted */
  observe(drafted, accepted) {
    this.steps++;
    if (drafted === 0) return;
    this.drafted += drafted;
    this.accepted += accepted;
    // Per draft token: accepted ones count 1, the first rejected one 0; later ones were not tried.
    const tried = Math.min(drafted, accepted + 1);
    const rate = accepted / tried;
    const weight = Math.min(0.5, tried / 8);
    this.acceptance = this.acceptance * (1 - weight) + rate * weight;
  }
}

/**
 * The cost of one step as `base + perRow · (rows − 1)`, fitted to the steps seen (recent ones
 * weigh more; a step's time includes drafting, so a draft model's own decodes count).
 * `ratio(rows)` is what one more row costs against the throughput of a step of `rows` plain
 * rows: `perRow · rows / (base + perRow · (rows − 1))` (`perRow / base` for one). `perRow / base`
 * is taken as 0.5 until the steps have varied enough to say; once they have, the last ratio they
 * said is kept while later steps do not vary (drafting turned off is all plain steps, and must
 * not make the fit forget why it turned off).
 */
class StepCost {
  /**
   * @param {{ firstProbe?: number }} [options] `firstProbe`: row-steps before the first probe of
   *   a fit where drafting cannot pay (64; a draft model's lines wait 1024, as its probe first
   *   costs a catch-up prefill of the line on the draft model); the wait doubles to 64 times it
   */
  constructor({ firstProbe = 64 } = {}) {
    /** Step time against the rows beyond the first, recent steps weighing more. */
    this.fit = new DecayedLineFit(0.98);
    /** `perRow / base` as the last steps that varied enough said; null before any did. */
    this.known = null;
    /** Steps asked about since the last probe of a fit where drafting cannot pay, and the wait for the next. */
    this.sinceProbe = 0;
    this.probeEvery = firstProbe;
    this.lastProbeWait = firstProbe * 64;
  }

  /**
   * Whether a line drafts once now although drafting cannot pay, to refresh the fit (the
   * machine's load or the batch may have changed). Shared by every line on the fit: one probe
   * per `probeEvery` steps, the wait doubling while probes confirm it.
   */
  probeDue() {
    if (++this.sinceProbe < this.probeEvery) return false;
    this.sinceProbe = 0;
    this.probeEvery = Math.min(this.probeEvery * 2, this.lastProbeWait);
    return true;
  }

  /** The steps seen, their weight faded. */
  get n() {
    return this.fit.n;
  }

  /** @param {number} rows @param {number} ms */
  observe(rows, ms) {
    this.fit.observe(rows - 1, ms);
    const fitted = this._fitted();
    if (fitted !== null) this.known = fitted;
  }

  /** @param {number} [rows] */
  ratio(rows = 1) {
    const single = this.known === null ? 0.5 : this.known;
    return (single * rows) / (1 + single * (rows - 1));
  }

  /** True until the steps seen have varied enough in size to fit the line. */
  uncertain() {
    return this.known === null;
  }

  /** `perRow / base` from the recent steps, or null while they have not varied enough. */
  _fitted() {
    const line = this.fit.line();
    if (line === null) return null;
    const { base, slope } = line;
    if (!(base > 0) || !(slope >= 0)) return null;
    return Math.min(4, Math.max(0.02, slope / base));
  }
}

/** @type {WeakMap<object, WeakMap<object, StepCost>>} target context → draft source key → fit */
const sharedCosts = new WeakMap();
/** The key of every prompt-lookup source: their drafting costs nothing, so one fit serves all. */
const LOOKUP_KEY = Object.freeze({ kind: 'lookup' });

/**
 * The step-cost fit of speculating on `ctx` with `source`, shared by every `Branch.generate` and
 * Scheduler on that pair, so that what one generation learned (a draft model that costs more
 * than it saves, say) the next one knows from its first step. Keyed by the draft model's
 * context (a new DraftModel over the same context shares it), one key for prompt lookup, else
 * the source itself.
 * @param {object} ctx @param {any} source @returns {StepCost}
 */
function stepCostFor(ctx, source) {
  const key = source instanceof DraftModel ? source.ctx : source instanceof PromptLookup ? LOOKUP_KEY : source;
  let byKey = sharedCosts.get(ctx);
  if (!byKey) sharedCosts.set(ctx, (byKey = new WeakMap()));
  let cost = byKey.get(key);
  if (!cost) byKey.set(key, (cost = new StepCost({ firstProbe: source instanceof DraftModel ? 1024 : 64 })));
  return cost;
}

/**
 * Checks `speculative` options: `{ lookup: true | { ngramMin, ngramMax } }`, `{ draft: ctx }`
 * (a SessionContext or a DraftModel) or `{ source }` (any draft source), with `maxDraft`.
 * @param {unknown} options @param {string} where
 * @returns {{ source: any, maxDraft: number, adaptive: boolean } | null}
 */
function checkSpeculative(options, where) {
  if (options === undefined || options === null || options === false) return null;
  if (typeof options !== 'object')
    throw makeError('ERR_INVALID_ARG', `${where}: speculative must be an object ({ lookup } or { draft })`);
  const o = /** @type {any} */ (options);
  const { maxDraft = 8, adaptive = true } = o;
  if (typeof adaptive !== 'boolean')
    throw makeError('ERR_INVALID_ARG', `${where}: speculative.adaptive must be a boolean (got ${adaptive})`);
  if (!Number.isInteger(maxDraft) || maxDraft < 1 || maxDraft > MAX_DRAFT)
    throw makeError(
      'ERR_INVALID_ARG',
      `${where}: speculative.maxDraft must be an integer in 1..${MAX_DRAFT} (got ${maxDraft})`,
    );
  const given = ['lookup', 'draft', 'source'].filter((k) => o[k] !== undefined && o[k] !== false);
  if (given.length !== 1)
    throw makeError('ERR_INVALID_ARG', `${where}: speculative needs exactly one of lookup, draft or source`);
  let source = o.source;
  if (o.lookup !== undefined && o.lookup !== false) source = new PromptLookup(o.lookup === true ? {} : o.lookup);
  if (o.draft !== undefined) source = o.draft instanceof DraftModel ? o.draft : new DraftModel(o.draft);
  if (!source || typeof source.open !== 'function')
    throw makeError('ERR_INVALID_ARG', `${where}: speculative.source must have open(history)`);
  return { source, maxDraft, adaptive };
}

module.exports = { DraftLength, StepCost, stepCostFor, checkSpeculative };
