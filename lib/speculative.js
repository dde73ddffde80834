'use strict';

/**
 * Speculative decoding through branches (docs/speculative.md). A draft source proposes the
 * tokens that may follow a branch's sampled token; `BranchStore.commitDrafts` commits the token
 * and verifies the draft in ONE decode with a row per token, keeping the longest prefix the
 * branch's own sampler agrees with. This module holds the draft sources behind one small
 * interface, the adaptive draft length, and the loop `Branch.generate` runs.
 *
 * A source's `open(history)` returns a drafter for one line of generation:
 * `{ draft(token, k) → number[] | Promise<number[]>, accept(tokens), close(), prepare?() }` —
 * `draft` proposes up to `k` tokens to follow the history plus `token`; `accept` hears what was
 * committed (`token` and the accepted draft tokens); `close` frees what it holds; `prepare`
 * (optional, async) does a line's one-time work before its first draft, outside the timed step. A source may
 * also have `draftMany(drafters, tokens, ks)` to draft for many lines at once (the Scheduler
 * calls it once per step).
 */

const { makeError } = require('./errors');
const { release } = require('./scheduler/prefix-cache');

/** The error code this module adds to the package's contract. */
const SpeculativeErrorCode = Object.freeze({
  /** A draft model's vocabulary differs from the target's: verification compares token ids. */
  VOCAB_MISMATCH: 'ERR_VOCAB_MISMATCH',
});

/** The most tokens one draft may hold. */
const MAX_DRAFT = 32;

/**
 * Prompt lookup: the draft is what followed the most recent earlier occurrence of the line's
 * last n tokens (n from `ngramMax` down to `ngramMin`) in its own history — the prompt and what
 * it generated. No second model; it pays where the output quotes its input (editing, extraction,
 * summaries with quotes, RAG answers, code).
 */
class PromptLookup {
  /**
   * `ngramMin` (default 2) to `ngramMax` (default 4): the n-gram sizes looked up, integers in
   * 1..16 with `ngramMin` ≤ `ngramMax` (else `ERR_INVALID_ARG`).
   * @param {{ ngramMin?: number, ngramMax?: number }} [options]
   */
  constructor(options = {}) {
    const { ngramMin = 2, ngramMax = 4 } = options;
    for (const [name, v] of /** @type {Array<[string, number]>} */ ([
      ['ngramMin', ngramMin],
      ['ngramMax', ngramMax],
    ])) {
      if (!Number.isInteger(v) || v < 1 || v > 16)
        throw makeError('ERR_INVALID_ARG', `PromptLookup: ${name} must be an integer in 1..16 (got ${v})`);
    }
    if (ngramMin > ngramMax)
      throw makeError('ERR_INVALID_ARG', `PromptLookup: ngramMin (${ngramMin}) must not exceed ngramMax (${ngramMax})`);
    this.ngramMin = ngramMin;
    this.ngramMax = ngramMax;
    /** The source's kind, `'lookup'`. */
    this.kind = 'lookup';
  }

  /**
   * A drafter for one line whose tokens so far are `history`.
   * @param {readonly number[]} history the tokens the line holds (typically its prompt)
   * @returns {LookupDrafter}
   */
  open(history) {
    return new LookupDrafter(this, history);
  }
}

/** One line's n-gram index: for each n-gram, where the tokens after its latest occurrence start. */
class LookupDrafter {
  /** @param {PromptLookup} source @param {readonly number[]} history */
  constructor(source, history) {
    this._min = source.ngramMin;
    this._max = source.ngramMax;
    /** @type {number[]} */
    this._tokens = [];
    /** @type {Map<string, number>} n-gram key → index of the token that followed it last */
    this._next = new Map();
    this._push(history);
  }

  /** @param {readonly number[]} tokens */
  _push(tokens) {
    for (const t of tokens) {
      const end = this._tokens.length;
      for (let n = this._min; n <= this._max && n <= end; n++) {
        this._next.set(this._tokens.slice(end - n, end).join(','), end);
      }
      this._tokens.push(t);
    }
  }

  /**
   * Up to `k` tokens that followed the longest n-gram ending with `token` seen before.
   * @param {number} token @param {number} k @returns {number[]}
   */
  draft(token, k) {
    if (k <= 0) return [];
    const t = this._tokens;
    t.push(token); // looked up as the line's tail; taken back below
    try {
      for (let n = Math.min(this._max, t.length - 1); n >= this._min; n--) {
        const at = this._next.get(t.slice(t.length - n).join(','));
        if (at !== undefined) return t.slice(at, at + k);
      }
      return [];
    } finally {
      t.pop();
    }
  }

  /** @param {readonly number[]} tokens */
  accept(tokens) {
    this._push(tokens);
  }

  close() {}
}

/**
 * A draft model: a second, smaller context on a model with the same vocabulary drafts greedily
 * (one decode per draft token, batched over every line that drafts in a step). Its context needs
 * three sequences per line that speculates at once (the line, its draft, the next line start).
 */
class DraftModel {
  /**
   * @param {import('./Context').SessionContext} draftCtx
   * @param {import('./Context').SessionContext} [targetCtx] checked for the same vocabulary now;
   *   otherwise checked by the first line that opens on a target
   */
  constructor(draftCtx, targetCtx) {
    const { BranchStore } = require('./BranchStore');
    /** The draft model's context. */
    this.ctx = draftCtx;
    /** A BranchStore over `ctx` (made now: throws for a non-context or a disposed one). */
    this.store = new BranchStore(draftCtx);
    /** The source's kind, `'draft'`. */
    this.kind = 'draft';
    /** @type {WeakSet<object>} targets already checked */
    this._checked = new WeakSet();
    if (targetCtx) this.checkVocabulary(targetCtx);
  }

  /**
   * Throws `ERR_VOCAB_MISMATCH` unless `target` tokenizes like the draft model (same vocabulary
   * size and the same text for a spread of token ids): verification compares token ids.
   * @param {import('./Context').SessionContext} target
   */
  checkVocabulary(target) {
    if (this._checked.has(target)) return;
    const a = target.vocabSize;
    const b = this.ctx.vocabSize;
    let differs = a !== b ? `vocabulary sizes ${a} and ${b}` : null;
    for (let i = 0; !differs && i < 64; i++) {
      const id = Math.floor((i * (a - 1)) / 63);
      if (target.tokenToText(id) !== this.ctx.tokenToText(id)) differs = `token ${id}`;
    }
    if (differs)
      throw makeError(
        SpeculativeErrorCode.VOCAB_MISMATCH,
        `the draft model's vocabulary differs from the target's (${differs}): use a draft model of the same family and tokenizer`,
      );
    this._checked.add(target);
  }

  /**
   * A drafter for one line whose tokens so far are `history` (decoded on the draft context before
   * its first draft).
   * @param {readonly number[]} history
   * @returns {ModelDrafter}
   */
  open(history) {
    return new ModelDrafter(this, history);
  }

  /**
   * Drafts for many lines at once: one prefill of every line's unsent tokens, then one commit
   * per draft position for the lines that still draft.
   * @param {ModelDrafter[]} drafters @param {number[]} tokens @param {number[]} ks
   * @returns {Promise<number[][]>}
   */
  async draftMany(drafters, tokens, ks) {
    const { Branch } = require('./Branch');
    const lines = [];
    drafters.forEach((d, i) => {
      if (ks[i] > 0) lines.push({ d, i, k: ks[i], draft: [] });
    });
    const out = drafters.map(() => /** @type {number[]} */ ([]));
    if (lines.length === 0) return out;
    for (const line of lines) {
      const d = line.d;
      d._dropScratch();
      if (!d._base) d._base = Branch.create(this.ctx, 0, { temperature: 0 });
      d._scratch = d._base.fork();
      line.feed = [...d._pending, tokens[line.i]];
      d._scratchStart = d._base.position + line.feed.length; // where its first draft token goes
    }
    await this.store.prefill(lines.map((l) => [l.d._scratch, l.feed]));
    let active = lines;
    while (active.length > 0) {
      const produced = this.store.produce(active.map((l) => l.d._scratch));
      const next = [];
      active.forEach((l, j) => {
        if (produced[j].isStop) return; // the target decides where a line ends
        l.draft.push(produced[j].token);
        if (l.draft.length < l.k) next.push(l);
      });
      if (next.length === 0) break;
      await this.store.commit(next.map((l) => [l.d._scratch, l.draft[l.draft.length - 1]]));
      active = next;
    }
    for (const l of lines) out[l.i] = l.draft;
    return out;
  }
}

/** One line on the draft context: a branch holding the line's history (but `_pending`). */
class ModelDrafter {
  /** @param {DraftModel} source @param {readonly number[]} history */
  constructor(source, history) {
    this._source = source;
    /** @type {any} the line's committed history, less `_pending` */
    this._base = null;
    /** @type {number[]} committed tokens not in `_base`'s KV yet */
    this._pending = [...history];
    /** @type {any} the fork the last draft was decoded in, and where its first draft token went */
    this._scratch = null;
    this._scratchStart = 0;
  }

  /**
   * Decodes the line's history into the draft context, so that the first draft of a step
   * costs what every later one does (the step-cost fit must not see a prompt's prefill).
   */
  async prepare() {
    if (this._base || this._pending.length === 0) return;
    const { Branch } = require('./Branch');
    const base = Branch.create(this._source.ctx, 0, { temperature: 0 });
    try {
      await base.prefill(this._pending);
    } catch (e) {
      release(base);
      throw e;
    }
    this._base = base;
    this._pending = [];
  }

  /** @param {number} token @param {number} k */
  async draft(token, k) {
    return (await this._source.draftMany([this], [token], [k]))[0];
  }

  /**
   * `tokens`: the committed token and the accepted draft tokens. The draft branch keeps the
   * cells of the accepted ones (a fork at their end: no decode); the rest are dropped with it.
   * @param {readonly number[]} tokens
   */
  accept(tokens) {
    const scratch = this._scratch;
    if (!scratch || scratch.disposed) {
      this._pending.push(...tokens);
      return;
    }
    // The scratch branch holds the draft tokens it decoded (the last one never is).
    const decoded = Math.min(tokens.length - 1, scratch.position - this._scratchStart);
    const base = scratch.forkAt(this._scratchStart + decoded);
    this._pending = tokens.slice(1 + decoded);
    release(this._base);
    this._base = base;
    this._dropScratch();
  }

  _dropScratch() {
    release(this._scratch);
    this._scratch = null;
  }

  close() {
    this._dropScratch();
    release(this._base);
    this._base = null;
  }
}

/**
 * How long a line's next draft is. Each line keeps an estimate of how often its draft tokens are
 * accepted; the context's cost of a verified row relative to a plain step is measured from the
 * steps themselves. The length chosen maximises expected tokens per unit of step time,
 * `(1 − a^(k+1)) / (1 − a) / (1 + r·k)`, so a line whose drafts are rejected drafts nothing
 * (probing with a short draft now and then), and a line copying its input drafts long.
 */
class DraftLength {
  /** @param {{ maxDraft: number, cost: StepCost, adaptive?: boolean }} options */
  constructor({ maxDraft, cost, adaptive = true }) {
    this.maxDraft = maxDraft;
    this.adaptive = adaptive;
    this.cost = cost;
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
   * The draft length for the next step; at most `limit`. `rows`: the rows of the step without
   * drafts (other lines' tokens), which make one more row relatively cheaper but also raise the
   * throughput a draft row must beat.
   * @param {number} limit @param {number} [rows]
   */
  next(limit, rows = 1) {
    const max = Math.min(this.maxDraft, limit);
    if (max <= 0 || !this.adaptive) return Math.max(max, 0);
    const a = Math.min(this.acceptance, 0.99);
    const r = this.cost.ratio(rows);
    let best = 0;
    let bestGain = 1;
    for (let k = 1; k <= max; k++) {
      const gain = (1 - a ** (k + 1)) / (1 - a) / (1 + r * k);
      if (gain > bestGain + 1e-9) [best, bestGain] = [k, gain];
    }
    // The cost fit needs steps of different sizes, plain ones among them (step cost is not
    // linear in rows, so a line through long drafts alone misjudges a plain step): while it
    // cannot tell yet, every third step is plain. Otherwise a draft model drafting at full
    // length would never learn what its own decodes cost.
    if (best > 0 && this.cost.uncertain() && this.steps % 3 === 2) return 0;
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
 * weigh more; a step's time includes drafting, so a draft model's own decodes count). `ratio(rows)` is what one more row costs against the throughput of a step of
 * `rows` plain rows: `perRow · rows / (base + perRow · (rows − 1))` (`perRow / base` for one);
 * `perRow / base` is taken as 0.5 until the steps have varied enough to say.
 */
class StepCost {
  constructor() {
    this.n = 0;
    this.sx = 0;
    this.sy = 0;
    this.sxx = 0;
    this.sxy = 0;
  }

  /** @param {number} rows @param {number} ms */
  observe(rows, ms) {
    const decay = 0.98;
    const x = rows - 1;
    this.n = this.n * decay + 1;
    this.sx = this.sx * decay + x;
    this.sy = this.sy * decay + ms;
    this.sxx = this.sxx * decay + x * x;
    this.sxy = this.sxy * decay + x * ms;
  }

  /** @param {number} [rows] */
  ratio(rows = 1) {
    const single = this._singleRatio();
    return (single * rows) / (1 + single * (rows - 1));
  }

  /** True while the steps seen have not varied enough in size to fit the line. */
  uncertain() {
    return this.n < 4 || this._variance() < 0.25;
  }

  _variance() {
    return this.n === 0 ? 0 : this.sxx / this.n - (this.sx / this.n) ** 2;
  }

  _singleRatio() {
    if (this.uncertain()) return 0.5;
    const variance = this._variance();
    const slope = (this.sxy / this.n - (this.sx / this.n) * (this.sy / this.n)) / variance;
    const base = this.sy / this.n - slope * (this.sx / this.n);
    if (!(base > 0) || !(slope >= 0)) return 0.5;
    return Math.min(4, Math.max(0.02, slope / base));
  }
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

/**
 * Drafts for many lines, in one call per source that can batch.
 * @param {Array<{ source: any, drafter: any, token: number, k: number }>} jobs
 * @returns {Promise<number[][]>}
 */
async function draftAll(jobs) {
  const out = jobs.map(() => /** @type {number[]} */ ([]));
  const bySource = new Map();
  jobs.forEach((job, i) => {
    if (job.k <= 0) return;
    if (!bySource.has(job.source)) bySource.set(job.source, []);
    bySource.get(job.source).push(i);
  });
  for (const [source, indices] of bySource) {
    if (typeof source.draftMany === 'function') {
      const drafts = await source.draftMany(
        indices.map((i) => jobs[i].drafter),
        indices.map((i) => jobs[i].token),
        indices.map((i) => jobs[i].k),
      );
      indices.forEach((i, j) => (out[i] = drafts[j].slice(0, jobs[i].k)));
    } else {
      for (const i of indices) out[i] = (await jobs[i].drafter.draft(jobs[i].token, jobs[i].k)).slice(0, jobs[i].k);
    }
  }
  return out;
}

/**
 * `Branch.generate`'s options, checked, with the defaults filled in (`speculative` is checked by
 * `checkSpeculative`).
 * @param {any} options
 */
function checkGenerateOptions(options) {
  if (typeof options !== 'object' || options === null)
    throw makeError('ERR_INVALID_ARG', 'generate(options): options must be an object');
  const { maxTokens = 256, speculative, signal, onToken, history = [] } = /** @type {any} */ (options);
  if (!Number.isInteger(maxTokens) || maxTokens < 1)
    throw makeError('ERR_INVALID_ARG', `generate: maxTokens must be a positive integer (got ${maxTokens})`);
  if (onToken !== undefined && typeof onToken !== 'function')
    throw makeError('ERR_INVALID_ARG', 'generate: onToken must be a function');
  if (!Array.isArray(history)) throw makeError('ERR_INVALID_ARG', 'generate: history must be an array of token ids');
  return { maxTokens, speculative, signal, onToken, history };
}

/**
 * The loop behind `Branch.generate`: produce, draft, verify in one decode, repeat. Ends at an
 * end-of-generation token ('stop') or after `maxTokens` ('length'); the last token is accepted
 * but not decoded, as the Scheduler does, so the branch ends where plain generation ends.
 * @param {any} branch
 * @param {any} options
 * @returns {Promise<import('./types').BranchGenerateResult>}
 */
async function generate(branch, options = {}) {
  const { BranchStore } = require('./BranchStore');
  const { maxTokens, speculative, signal, onToken, history } = checkGenerateOptions(options);
  const spec = checkSpeculative(speculative, 'generate');
  if (spec && spec.source instanceof DraftModel) spec.source.checkVocabulary(branch._ctx);
  const store = new BranchStore(branch._ctx);
  const rowsPerDecode = Math.min(branch._ctx.nOutputs, branch._ctx.nBatch);
  const cost = new StepCost();
  const length = spec ? new DraftLength({ maxDraft: spec.maxDraft, cost, adaptive: spec.adaptive }) : null;
  const drafter = spec ? spec.source.open(history) : null;
  if (drafter && typeof drafter.prepare === 'function') await drafter.prepare();
  const tokens = [];
  let text = '';
  let carried = null;
  /** @type {'stop' | 'length'} */
  let finishReason = 'length';
  const take = (/** @type {any} */ p) => {
    tokens.push(p.token);
    text += p.text;
    if (onToken) onToken({ token: p.token, text: p.text });
  };
  try {
    while (tokens.length < maxTokens) {
      if (signal && signal.aborted) throw makeError('ERR_ABORTED', 'generate was aborted');
      const produced = carried || branch.produce();
      carried = null;
      if (produced.isStop) {
        finishReason = 'stop';
        break;
      }
      take(produced);
      if (tokens.length >= maxTokens) {
        branch.accept(produced.token); // counted in the perplexity; nothing samples after it
        break;
      }
      // The draft never reaches the last token: it comes from `next`, accepted without a decode.
      // At most what one decode returns rows for: the token and its draft verify together.
      const k = length ? length.next(Math.min(maxTokens - tokens.length, rowsPerDecode) - 1) : 0;
      // Drafting counts in the step's cost: a draft model's decodes are what it pays for a draft.
      const started = process.hrtime.bigint();
      const draft = k > 0 ? (await draftAll([{ source: spec.source, drafter, token: produced.token, k }]))[0] : [];
      const [verified] = await store.commitDrafts([[branch, produced.token, draft]], { signal });
      if (length) {
        cost.observe(1 + draft.length, Number(process.hrtime.bigint() - started) / 1e6);
        length.observe(draft.length, verified.accepted.length);
      }
      for (const p of verified.accepted) take(p);
      if (drafter) drafter.accept([produced.token, ...verified.accepted.map((p) => p.token)]);
      carried = verified.next; // null: sample as usual (an empty draft; or nothing allowed, which produce reports)
    }
  } finally {
    if (drafter) drafter.close();
  }
  const stats = length
    ? { drafted: length.drafted, accepted: length.accepted, steps: length.steps }
    : { drafted: 0, accepted: 0, steps: tokens.length };
  return { tokens, text, finishReason, speculative: stats };
}

module.exports = {
  SpeculativeErrorCode,
  generate,
  PromptLookup,
  DraftModel,
  DraftLength,
  StepCost,
  checkSpeculative,
  draftAll,
  MAX_DRAFT,
};
