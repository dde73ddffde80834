'use strict';

const { makeError } = require('./errors');
const { nativeOf, wrapFreed, registerBranch } = require('./Context');
const { runCancellable, signalOf } = require('./cancel');

function isNum(v) {
  return typeof v === 'number';
}

/**
 * One line of generation: a leased KV sequence plus its own sampler chain, grammar, logits
 * snapshot and perplexity trackers. Create roots with `Branch.create`, siblings with `fork()`.
 */
class Branch {
  /**
   * @private
   * @param {import('./Context').SessionContext} ctx
   * @param {number} handle
   */
  constructor(ctx, handle) {
    this._ctx = ctx;
    this._handle = handle;
    this._disposed = false;
    registerBranch(ctx, this, handle);
  }

  /**
   * Root branch on a sequence whose prefix the caller decoded:
   *   Branch.create(ctx, seqId, position, params?, nBatch?, grammar?)
   *   Branch.create(ctx, position, params?, nBatch?, grammar?)   (the store picks the sequence)
   */
  static create(ctx, ...args) {
    const native = nativeOf(ctx);
    let seqId;
    if (args.length >= 2 && isNum(args[0]) && isNum(args[1])) seqId = args.shift();
    const [position, params, nBatch, grammar] = args;
    if (!isNum(position)) throw makeError('ERR_INVALID_ARG', 'Branch.create(ctx, [seqId,] position, params?, nBatch?, grammar?): position must be a number');
    if (params != null && typeof params !== 'object') throw makeError('ERR_INVALID_ARG', 'params must be a SamplingParams object');
    if (grammar != null && typeof grammar !== 'string') throw makeError('ERR_INVALID_ARG', 'grammar must be a GBNF string');
    const p = grammar ? { ...(params || {}), grammar } : params || undefined;
    const handle = native._branchCreate(position, p, nBatch == null ? undefined : nBatch, seqId);
    return new Branch(ctx, handle);
  }

  _live() {
    const native = nativeOf(this._ctx);
    // Freed here, possibly still queued natively: the native side gives the error and message.
    if (this._disposed) native._throwCoded('ERR_BRANCH_DISPOSED');
    return native;
  }

  /** A child sharing this branch's KV prefix (no copy). `seqId` picks a specific free lease. */
  fork(seqId) {
    return new Branch(this._ctx, this._live()._branchFork(this._handle, seqId));
  }

  /**
   * A child sharing only this branch's cells below `position` (a prefix of its tokens). Unless
   * `position` is this branch's own, the child has no logits snapshot yet (prefill it) and a
   * fresh sampler chain built from this branch's parameters.
   */
  forkAt(position, seqId) {
    if (typeof position !== 'number') throw makeError('ERR_INVALID_ARG', 'forkAt(position, seqId?): position must be a number');
    return new Branch(this._ctx, this._live()._branchFork(this._handle, seqId, position));
  }

  captureLogits() {
    this._live()._branchCaptureLogits(this._handle);
  }

  /** A copy of the logits snapshot (length vocabSize). */
  getLogits() {
    return this._live()._branchGetLogits(this._handle);
  }

  /** Entropy of the snapshot distribution (`'nats'` or `'bits'`). */
  entropy(base) {
    return this._live()._branchEntropy(this._handle, base);
  }

  sample() {
    return this._live()._branchSample(this._handle);
  }

  accept(token) {
    this._live()._branchAccept(this._handle, token);
  }

  /** Samples without writing KV or accepting: `{token, text, isStop}`. */
  produce() {
    return this._live()._branchProduce(this._handle);
  }

  /**
   * Accepts `token` (sampler, grammar, perplexity) and decodes it; all-or-nothing.
   * `options.signal` (an AbortSignal) cancels it with ERR_ABORTED.
   */
  async commit(token, options) {
    const native = this._live();
    return runCancellable(options, 'commit', (cancel) => native._storeCommit([this._handle], [token], cancel));
  }

  /** Decodes tokens the model did not sample (user turns, tool output); no accept. Cancellable. */
  async prefill(tokens, options) {
    const native = this._live();
    if (!Array.isArray(tokens)) throw makeError('ERR_INVALID_ARG', 'prefill(tokens): tokens must be an array of token ids');
    if (tokens.length === 0) {
      const signal = signalOf(options, 'prefill');
      return runCancellable({ signal }, 'prefill', () => Promise.resolve());
    }
    return runCancellable(options, 'prefill', (cancel) => native._branchPrefill(this._handle, tokens, cancel));
  }

  /** Decodes one token without accepting it. Cancellable like `commit`. */
  async decodeAndCaptureOne(token, options) {
    const native = this._live();
    return runCancellable(options, 'decodeAndCaptureOne', (cancel) => native._branchDecodeAndCaptureOne(this._handle, token, cancel));
  }

  /** Per-branch dynamic biases `[{token, bias}]` (bias -Infinity bans); not inherited by forks. */
  steer(biases) {
    if (!Array.isArray(biases)) throw makeError('ERR_INVALID_ARG', 'steer(biases): biases must be an array of {token, bias}');
    this._live()._branchSteer(this._handle, biases);
  }

  clearSteer() {
    this._live()._branchSteer(this._handle, []);
  }

  /** New seed for the random stage (forks share the parent's RNG state until reseeded). */
  reseedSampler(seed) {
    this._live()._branchReseed(this._handle, seed);
  }

  /** Rebuilds the sampler chain (the penalty window and RNG start fresh). */
  setSamplerParams(params) {
    this._live()._branchSetSamplerParams(this._handle, params || {});
  }

  /**
   * Installs a GBNF grammar (`null`/`''` removes it). With `triggerPatterns`, `triggerWords` or
   * `triggerTokens` the grammar is lazy: unconstrained until a trigger appears.
   */
  setGrammar(grammar, lazy) {
    const native = this._live();
    const opts = lazy || {};
    const escape = (w) => String(w).replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const patterns = [...(opts.triggerPatterns || []), ...(opts.triggerWords || []).map((w) => `[\\s\\S]*?(${escape(w)}[\\s\\S]*)`)];
    native._branchSetGrammar(this._handle, grammar || null, patterns, opts.triggerTokens || []);
  }

  /** Frees the branch and its KV tags. Its children live on, re-parented. Never throws if disposed. */
  prune() {
    return this._free('_branchPrune');
  }

  /** Frees the branch and all of its descendants. */
  pruneSubtree() {
    return this._free('_branchPruneSubtree');
  }

  /** `prune()` done before returning: waits for operations queued on the context, then frees. */
  pruneSync() {
    this._freeSync('_branchPruneSync');
  }

  /** `pruneSubtree()` done before returning (as `pruneSync`). */
  pruneSubtreeSync() {
    this._freeSync('_branchPruneSubtreeSync');
  }

  /** Frees the branch but keeps its KV for raw `ctx` calls; returns the sequence id. */
  destroy() {
    if (this._disposed) return undefined;
    const seq = nativeOf(this._ctx)._branchDestroy(this._handle);
    wrapFreed(this._ctx, [this._handle]);
    return seq;
  }

  /**
   * Marks the wrapper disposed at once; the native side frees the branch in call order (now,
   * when nothing is queued on the context) and reports every handle it freed.
   */
  _free(method) {
    if (this._disposed) return Promise.resolve();
    const ctx = this._ctx;
    this._disposed = true;
    if (ctx.disposed) return Promise.resolve(); // dispose() already freed every branch
    return nativeOf(ctx)[method](this._handle).then(
      (freed) => {
        wrapFreed(ctx, freed);
      },
      (e) => {
        if (e.code !== 'ERR_BRANCH_DISPOSED' && e.code !== 'ERR_CONTEXT_DISPOSED') throw e;
      },
    );
  }

  _freeSync(method) {
    if (this._disposed || this._ctx.disposed) {
      this._disposed = true;
      return;
    }
    const freed = nativeOf(this._ctx)[method](this._handle);
    this._disposed = true;
    wrapFreed(this._ctx, freed);
  }

  _info() {
    return this._live()._branchInfo(this._handle);
  }

  get handle() { return this._handle; }
  get disposed() { return this._disposed; }
  get seqId() { return this._info().seqId; }
  get position() { return this._live()._branchPosition(this._handle); }
  get forkHead() { return this._info().forkHead; }
  /** Model-level perplexity of accepted tokens; Infinity before the first accept. */
  get perplexity() { return this._info().perplexity; }
  /** Perplexity under the distribution actually sampled from (after filters and temperature). */
  get samplingPerplexity() { return this._info().samplingPerplexity; }
  get parent() { const p = this._info().parent; return p === 0 ? null : p; }
  get children() { return this._info().children; }
  get isLeaf() { return this._info().children.length === 0; }
  get isActive() { return !this._disposed; }

  // --- Compatibility aliases: the names of the reference's later surface, in one place ---------

  /** {@link fork} (already synchronous). */
  forkSync(seqId) {
    return this.fork(seqId);
  }

  /** {@link produce} (already synchronous). */
  produceSync() {
    return this.produce();
  }

  /** `for await (const {token, text} of branch)`: commits each token before yielding it; stops at end-of-generation. */
  async *[Symbol.asyncIterator]() {
    while (!this._disposed) {
      const produced = this.produce();
      if (produced.isStop) return;
      await this.commit(produced.token);
      yield { token: produced.token, text: produced.text };
    }
  }
}

module.exports = { Branch };
