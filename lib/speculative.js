'use strict';

/**
 * Speculative decoding through branches (docs/speculative.md). A draft source proposes the
 * tokens that may follow a branch's sampled token; `BranchStore.commitDrafts` commits the token
 * and verifies the draft in ONE decode with a row per token, keeping the longest prefix the
 * branch's own sampler agrees with. This module holds the draft sources behind one small
 * interface; lib/decode/speculation.js holds the adaptive draft length and lib/decode/generate.js
 * the loop `Branch.generate` runs.
 *
 * A draft model's lines are branches of the draft context that never reach a user, so they are
 * native branch handles driven here directly (no Branch wrappers): this module sits below
 * Branch.js, whose `generate` may be given `{ draft: ctx }`.
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
const { nativeOf } = require('./Context');

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

/** The draft context's lines sample greedily. */
const GREEDY = Object.freeze({ temperature: 0 });

/**
 * Frees native branch `handle` of `ctx` in call order, never surfacing a failure: the branch may
 * be gone already (the context disposed, or freed by a `retainOnly` on the draft context).
 * @param {any} ctx @param {number | null} handle
 */
function free(ctx, handle) {
  if (handle === null || ctx.disposed) return;
  try {
    nativeOf(ctx)
      ._branchPrune(handle)
      .catch(() => {});
  } catch {
    // already unusable: nothing left to free
  }
}

/** A drafter dropped without `close()` still frees its draft branches. */
const unclosed = new FinalizationRegistry(
  (/** @type {{ ctx: any, held: { base: number | null, scratch: number | null } }} */ { ctx, held }) => {
    free(ctx, held.scratch);
    free(ctx, held.base);
  },
);

/**
 * A draft model: a second, smaller context on a model with the same vocabulary drafts greedily
 * (one decode per draft token, batched over every line that drafts in a step). Its context needs
 * three sequences per line that speculates at once (the line, its draft, the next line start).
 */
class DraftModel {
  /**
   * Throws `ERR_INVALID_ARG` for a non-context, `ERR_CONTEXT_DISPOSED` for a disposed one.
   * @param {import('./Context').SessionContext} draftCtx
   * @param {import('./Context').SessionContext} [targetCtx] checked for the same vocabulary now;
   *   otherwise checked by the first line that opens on a target
   */
  constructor(draftCtx, targetCtx) {
    nativeOf(draftCtx); // checks draftCtx
    /** The draft model's context. */
    this.ctx = draftCtx;
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
    const lines = [];
    drafters.forEach((d, i) => {
      if (ks[i] > 0) lines.push({ d, i, k: ks[i], draft: [] });
    });
    const out = drafters.map(() => /** @type {number[]} */ ([]));
    if (lines.length === 0) return out;
    const native = nativeOf(this.ctx);
    for (const line of lines) {
      const held = line.d._held;
      line.d._dropScratch();
      if (held.base === null) held.base = native._branchCreate(0, GREEDY);
      held.scratch = native._branchFork(held.base);
      line.feed = [...line.d._pending, tokens[line.i]];
      line.d._scratchStart = native._branchPosition(held.base) + line.feed.length; // where its first draft token goes
    }
    const scratchOf = (/** @type {any} */ l) => /** @type {number} */ (l.d._held.scratch);
    await native._storePrefill(
      lines.map(scratchOf),
      lines.map((l) => l.feed),
      undefined,
      undefined,
    );
    let active = lines;
    while (active.length > 0) {
      const produced = native._storeProduce(active.map(scratchOf));
      const next = [];
      active.forEach((l, j) => {
        if (produced[j].isStop) return; // the target decides where a line ends
        l.draft.push(produced[j].token);
        if (l.draft.length < l.k) next.push(l);
      });
      if (next.length === 0) break;
      await native._storeCommit(
        next.map(scratchOf),
        next.map((l) => l.draft[l.draft.length - 1]),
        undefined,
      );
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
    /**
     * The draft context's branches this line holds: `base`, its committed history less
     * `_pending`, and `scratch`, the fork the last draft was decoded in.
     * @type {{ base: number | null, scratch: number | null }}
     */
    this._held = { base: null, scratch: null };
    /** @type {number[]} committed tokens not in the base's KV yet */
    this._pending = [...history];
    /** Where the scratch branch's first draft token went. */
    this._scratchStart = 0;
    unclosed.register(this, { ctx: source.ctx, held: this._held }, this);
  }

  /**
   * Decodes the line's tokens the draft context has not seen (its history at first; what it
   * committed while not drafting later) so that a draft of a step costs what every other one
   * does: the step-cost fit must see drafting, not a catch-up prefill.
   */
  async prepare() {
    const pending = this._pending;
    if (pending.length === 0 || (this._held.base !== null && pending.length < 2)) return;
    const ctx = this._source.ctx;
    const native = nativeOf(ctx);
    const fresh = this._held.base === null;
    const base = fresh ? native._branchCreate(0, GREEDY) : this._held.base;
    try {
      await native._branchPrefill(base, pending, undefined);
    } catch (e) {
      if (fresh) free(ctx, base);
      throw e;
    }
    this._held.base = base;
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
    const ctx = this._source.ctx;
    const scratch = this._held.scratch;
    if (scratch === null || ctx.disposed) {
      // Nothing drafted (or the draft context is gone: the next draft reports it).
      this._pending.push(...tokens);
      return;
    }
    const native = nativeOf(ctx);
    // The scratch branch holds the draft tokens it decoded (the last one never is).
    const decoded = Math.min(tokens.length - 1, native._branchPosition(scratch) - this._scratchStart);
    const base = native._branchFork(scratch, undefined, this._scratchStart + decoded);
    this._pending = tokens.slice(1 + decoded);
    free(ctx, this._held.base);
    this._held.base = base;
    this._dropScratch();
  }

  _dropScratch() {
    free(this._source.ctx, this._held.scratch);
    this._held.scratch = null;
  }

  close() {
    this._dropScratch();
    free(this._source.ctx, this._held.base);
    this._held.base = null;
    unclosed.unregister(this);
  }
}

module.exports = { SpeculativeErrorCode, PromptLookup, DraftModel, MAX_DRAFT };
