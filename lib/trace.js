'use strict';

/**
 * Branch traces of a script: `ctx.trace(listener)` reports every branch created, forked, grown
 * (prefill, commit, accepted drafts), finished (when the script says so) and pruned on one
 * context, as events of the trace format in docs/events.md — the format the Scheduler's events,
 * GET /v1/events and `llama-branch serve --trace` use — so the page at `/` can replay a beam
 * search run from a script. The examples write these events with `--jsonl`.
 *
 * Ids are the trace's own (`b1`, `b2`, ...): native handles are reused once freed.
 */

/** The trace format's version, sent in every stream's first (`hello`) event. */
const TRACE_VERSION = 1;

/** How much prompt text an `append` event carries (the page shows the end of a branch's text). */
const MAX_APPEND_CHARS = 2000;

/** The last `MAX_APPEND_CHARS` of `text` (a long prompt's end is what a branch continues). */
function clipped(text) {
  return text.length > MAX_APPEND_CHARS ? `…${text.slice(-MAX_APPEND_CHARS)}` : text;
}

/** A perplexity as events carry it: three decimals, undefined when not finite (nothing accepted yet). */
function roundedPerplexity(ppl) {
  return Number.isFinite(ppl) ? Math.round(ppl * 1000) / 1000 : undefined;
}

/** A branch's perplexity so far (Infinity: it cannot be read — busy, disposed — or nothing accepted yet). */
function branchPerplexity(branch) {
  try {
    return branch && !branch.disposed ? branch.perplexity : Infinity;
  } catch {
    return Infinity;
  }
}

/** A branch's perplexity so far as events show it: rounded, or undefined. */
function perplexityOf(branch) {
  return roundedPerplexity(branchPerplexity(branch));
}

/** @type {WeakMap<object, BranchTrace>} the active trace of each context */
const traces = new WeakMap();

class BranchTrace {
  /**
   * @param {any} ctx the SessionContext traced
   * @param {(event: object) => void} listener
   */
  constructor(ctx, listener) {
    this._ctx = ctx;
    this._listener = listener;
    /** @type {WeakMap<object, { id: string, n: number }>} per branch wrapper: its id and length */
    this._nodes = new WeakMap();
    /** @type {Map<number, string>} live handle → id (a fork names its parent by handle) */
    this._byHandle = new Map();
    this._count = 0;
  }

  /** The branch's id in this trace (undefined for one created before the trace started). */
  idOf(branch) {
    const node = this._nodes.get(branch);
    return node && node.id;
  }

  /**
   * Marks `branch` finished with `reason` (e.g. 'stop', 'length', 'best'): the page shows it
   * finished, not pruned, when the script frees it afterwards.
   * @param {any} branch
   * @param {string} reason
   */
  finish(branch, reason) {
    const node = this._nodes.get(branch);
    if (node) this._emit('finish', { branch: node.id, reason: String(reason), n: node.n, ppl: perplexityOf(branch) });
  }

  /** Stops the trace (idempotent). */
  stop() {
    if (traces.get(this._ctx) === this) traces.delete(this._ctx);
  }

  _emit(type, fields) {
    try {
      this._listener({ event: type, t: Date.now(), ...fields });
    } catch (e) {
      this.stop();
      process.emitWarning(`a ctx.trace listener threw and was removed: ${e && e.message}`);
    }
  }

  /** A branch wrapper was made: a root (`parentHandle` 0) or a fork. */
  created(branch, handle, parentHandle) {
    const id = `b${++this._count}`;
    let n = 0;
    try {
      n = branch.position;
    } catch {
      // busy: the length is learned from its next tokens
    }
    this._nodes.set(branch, { id, n });
    this._byHandle.set(handle, id);
    const parent = parentHandle ? this._byHandle.get(parentHandle) || null : null;
    this._emit('fork', { branch: id, parent, at: n });
  }

  /** Tokens went into `branch`: `sampled` (committed) or prefilled (an `append`). */
  grew(branch, tokens, sampled) {
    const node = this._nodes.get(branch);
    if (!node || tokens.length === 0) return;
    node.n += tokens.length;
    const text = tokens.map((t) => this._ctx.tokenToText(t)).join('');
    if (sampled) this._emit('token', { branch: node.id, text, n: node.n, ppl: perplexityOf(branch) });
    else this._emit('append', { branch: node.id, text: clipped(text), n: node.n });
  }

  /** The branches of `handles` were freed. */
  _freed(handles) {
    for (const handle of handles) {
      const id = this._byHandle.get(handle);
      if (id === undefined) continue;
      this._byHandle.delete(handle);
      this._emit('prune', { branch: id });
    }
  }
}

/**
 * Starts tracing `ctx` (replacing a trace already on it); see SessionContext.trace.
 * @param {any} ctx
 * @param {(event: object) => void} listener
 * @returns {BranchTrace}
 */
function startTrace(ctx, listener) {
  const trace = new BranchTrace(ctx, listener);
  traces.set(ctx, trace);
  trace._emit('hello', { v: TRACE_VERSION, source: 'script', nCtx: ctx.nCtx, nSeqMax: ctx.nSeqMax });
  return trace;
}

/** The trace on `ctx`, if any (the Branch facade reports to it). */
function traceOf(ctx) {
  return traces.get(ctx);
}

/** Tells the trace on `ctx`, if any, that the branches of `handles` were freed. */
function traceFreed(ctx, handles) {
  const trace = traces.get(ctx);
  if (trace) trace._freed(handles);
}

/**
 * `promise`, then `after()` when a trace is on (nothing extra otherwise): the trace hears of an
 * operation once it happened.
 * @template T
 * @param {any} ctx
 * @param {Promise<T>} promise
 * @param {(trace: BranchTrace, value: T) => void} after
 * @returns {Promise<T>}
 */
function traced(ctx, promise, after) {
  if (!traces.has(ctx)) return promise;
  return promise.then((value) => {
    const trace = traces.get(ctx);
    try {
      if (trace) after(trace, value);
    } catch (e) {
      // The operation succeeded; a trace that cannot describe it (e.g. the context was disposed
      // meanwhile) stops rather than turning that success into a failure.
      trace.stop();
      process.emitWarning(`ctx.trace stopped: ${e && e.message}`);
    }
    return value;
  });
}

module.exports = {
  BranchTrace,
  startTrace,
  traceOf,
  traced,
  traceFreed,
  TRACE_VERSION,
  clipped,
  branchPerplexity,
  perplexityOf,
  roundedPerplexity,
};
