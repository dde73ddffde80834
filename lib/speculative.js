'use strict';

/**
 * Speculative decoding through branches (docs/speculative.md). A draft source proposes the
 * tokens that may follow a branch's sampled token; `BranchStore.commitDrafts` commits the token
 * and verifies the draft in ONE decode with a row per token, keeping the longest prefix the
 * branch's own sampler agrees with. This module holds the draft sources behind one small
 * interface; lib/scheduler/speculation.js holds the adaptive draft length and the loop
 * `Branch.generate` runs.
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
const { BranchStore } = require('./BranchStore');
const { createRootBranch, release } = require('./Context');

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
    const lines = [];
    drafters.forEach((d, i) => {
      if (ks[i] > 0) lines.push({ d, i, k: ks[i], draft: [] });
    });
    const out = drafters.map(() => /** @type {number[]} */ ([]));
    if (lines.length === 0) return out;
    for (const line of lines) {
      const d = line.d;
      d._dropScratch();
      if (!d._base) d._base = createRootBranch(this.ctx, 0, { temperature: 0 });
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
    const base = createRootBranch(this._source.ctx, 0, { temperature: 0 });
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

module.exports = { SpeculativeErrorCode, PromptLookup, DraftModel, MAX_DRAFT };
