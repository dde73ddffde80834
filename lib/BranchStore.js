'use strict';

const { makeError } = require('./errors');
const { Branch } = require('./Branch');
const { nativeOf, wrapFreed } = require('./Context');
const { runCancellable, signalOf } = require('./cancel');

/** Batched operations over many branches of one context: one `llama_decode` per step. */
class BranchStore {
  /** @param {import('./Context').SessionContext} ctx */
  constructor(ctx) {
    nativeOf(ctx); // checks ctx
    this._ctx = ctx;
  }

  /** The branch's handle; the native side tells a foreign or freed branch apart. */
  _branch(b, where) {
    if (!(b instanceof Branch)) throw makeError('ERR_INVALID_ARG', `${where}: expected a Branch`);
    if (b._disposed && b._ctx === this._ctx) b._live(); // throws ERR_BRANCH_DISPOSED
    return b._handle;
  }

  _entries(entries, where) {
    if (!Array.isArray(entries)) throw makeError('ERR_INVALID_ARG', `${where}: expected an array of [branch, value] pairs`);
    const handles = [];
    const values = [];
    for (const e of entries) {
      if (!Array.isArray(e) || e.length !== 2) throw makeError('ERR_INVALID_ARG', `${where}: each entry must be a [branch, value] pair`);
      handles.push(this._branch(e[0], where));
      values.push(e[1]);
    }
    return { handles, values };
  }

  /**
   * `[[branch, token], ...]`: accept each token into its branch, then ONE decode for all.
   * `options.signal` (an AbortSignal) cancels it with ERR_ABORTED; no branch changes then.
   */
  async commit(entries, options) {
    const { handles, values } = this._entries(entries, 'BranchStore.commit');
    const signal = signalOf(options, 'BranchStore.commit');
    if (handles.length === 0) return runCancellable({ signal }, 'BranchStore.commit', () => Promise.resolve());
    const native = nativeOf(this._ctx);
    return runCancellable({ signal }, 'BranchStore.commit', (cancel) => native._storeCommit(handles, values, cancel));
  }

  /** `[[branch, tokens[]], ...]`: runs bin-packed into nBatch-sized decodes; no accept. Cancellable like `commit`. */
  async prefill(entries, options) {
    const { handles, values } = this._entries(entries, 'BranchStore.prefill');
    for (const v of values) {
      if (!Array.isArray(v)) throw makeError('ERR_INVALID_ARG', 'BranchStore.prefill: each value must be an array of token ids');
    }
    const signal = signalOf(options, 'BranchStore.prefill');
    if (handles.length === 0) return runCancellable({ signal }, 'BranchStore.prefill', () => Promise.resolve());
    const native = nativeOf(this._ctx);
    return runCancellable({ signal }, 'BranchStore.prefill', (cancel) => native._storePrefill(handles, values, cancel));
  }

  /** Samples every branch in one native call: `[{token, text, isStop}, ...]`. */
  produce(branches) {
    if (!Array.isArray(branches)) throw makeError('ERR_INVALID_ARG', 'BranchStore.produce: expected an array of branches');
    const handles = branches.map((b) => this._branch(b, 'BranchStore.produce'));
    return nativeOf(this._ctx)._storeProduce(handles);
  }

  /** Keeps only `winner`; every other branch on the context is freed (one seq_keep pass), in call order. */
  async retainOnly(winner) {
    const h = this._branch(winner, 'BranchStore.retainOnly');
    wrapFreed(this._ctx, await nativeOf(this._ctx)._storeRetainOnly(h));
  }

  /** Free sequence leases. */
  get available() {
    return nativeOf(this._ctx)._storeAvailable();
  }

  /** `{nCtx, cellsUsed, remaining}`: exact cells held by branches (shared prefixes counted once). */
  kvPressure() {
    return nativeOf(this._ctx)._storeKvPressure();
  }
}

module.exports = { BranchStore };
