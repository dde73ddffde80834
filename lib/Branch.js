'use strict';

const { makeError } = require('./errors');
const {
  nativeOf,
  nativeOfPrompt,
  wrapFreed,
  registerBranch,
  subtreeOf,
  isDisposed,
  markDisposed,
} = require('./Context');
const { runCancellable, signalOf } = require('./cancel');
const { traceOf, traced } = require('./trace');
const { generate } = require('./decode/generate');

/**
 * @typedef {import('./Context').SessionContext} SessionContext
 * @typedef {import('./BranchStore').BranchStore} BranchStore
 * @typedef {import('./types').SamplingParams} SamplingParams
 * @typedef {import('./types').OperationOptions} OperationOptions
 * @typedef {import('./types').Produced} Produced
 * @typedef {import('./types').BranchToken} BranchToken
 * @typedef {import('./Context').MediaPrompt} MediaPrompt
 */

/** @param {unknown} v @returns {v is number} */
function isNum(v) {
  return typeof v === 'number';
}

/** The `logprobs` option of produce (top alternatives, 0..20), or undefined when absent. */
function logprobsOption(options, where) {
  if (options === undefined || options === null) return undefined;
  if (typeof options !== 'object') throw makeError('ERR_INVALID_ARG', `${where}(options?): options must be an object`);
  const k = options.logprobs;
  if (k === undefined || k === false) return undefined;
  if (k === true) return 0;
  if (!Number.isInteger(k) || k < 0 || k > 20)
    throw makeError('ERR_INVALID_ARG', `${where}: options.logprobs must be true or an integer in 0..20, got ${k}`);
  return k;
}

/**
 * One line of generation: a leased KV sequence plus its own sampler chain, grammar, logits
 * snapshot and perplexity trackers. Create roots with {@link Branch.create}, children with
 * {@link Branch.fork}. Free with {@link prune}, {@link pruneSubtree}, {@link destroy} or
 * {@link BranchStore.retainOnly}; a branch garbage-collected without being freed is pruned at the
 * next opportunity.
 *
 * Every synchronous method and getter except `handle`, `disposed` and `isActive` waits for the
 * operations queued on the context before it (see {@link SessionContext}).
 * @implements {AsyncIterable<BranchToken>}
 */
class Branch {
  /**
   * @private
   * @param {SessionContext} ctx
   * @param {number} handle
   * @param {number} parent the parent's handle, 0 for a root
   */
  constructor(ctx, handle, parent) {
    this._ctx = ctx;
    this._handle = handle;
    registerBranch(ctx, this, handle, parent);
    const trace = traceOf(ctx);
    if (trace) trace.created(this, handle, parent);
  }

  /**
   * Root branch on sequence `seqId`, adopting the prefix the caller decoded there with
   * `ctx.decode(tokens, 0, seqId)`. `position` must be where that prefix ends
   * (`ctx.kvSeqPosMax(seqId) + 1`, or 0 for an empty sequence). Call {@link captureLogits} right
   * after the raw decode to sample from it. On an empty sequence with `position > 0` the branch
   * is created ahead of its prefix: copy it in with `ctx.kvSeqCopy(src, seqId)` (the copy must
   * end at `position`) before decoding or forking from it (`ERR_INVALID_ARG` until then). A
   * `seqId` of `nSeqMax` or more is `ERR_INVALID_ARG` saying which `nSeqMax` to create.
   * @overload
   * @param {SessionContext} ctx
   * @param {number} seqId
   * @param {number} position
   * @param {SamplingParams} [params]
   * @param {number} [nBatch] per-branch cap for {@link prefill} chunks, in [1, ctx.nBatch]. Default ctx.nBatch.
   * @param {string} [grammar] GBNF grammar; overrides `params.grammar`.
   * @returns {Branch}
   */
  /**
   * Root branch on a free sequence picked by the store (usually with `position` 0, then
   * {@link prefill} the prompt). Throws `ERR_NO_FREE_SEQUENCE` when all leases are taken.
   * @overload
   * @param {SessionContext} ctx
   * @param {number} position
   * @param {SamplingParams} [params]
   * @param {number} [nBatch]
   * @param {string} [grammar]
   * @returns {Branch}
   */
  /**
   * @param {SessionContext} ctx
   * @param {...any} args
   * @returns {Branch}
   */
  static create(ctx, ...args) {
    const native = nativeOf(ctx);
    let seqId;
    if (args.length >= 2 && isNum(args[0]) && isNum(args[1])) seqId = args.shift();
    const [position, params, nBatch, grammar] = args;
    if (!isNum(position))
      throw makeError(
        'ERR_INVALID_ARG',
        'Branch.create(ctx, [seqId,] position, params?, nBatch?, grammar?): position must be a number',
      );
    if (params != null && typeof params !== 'object')
      throw makeError('ERR_INVALID_ARG', 'params must be a SamplingParams object');
    if (grammar != null && typeof grammar !== 'string')
      throw makeError('ERR_INVALID_ARG', 'grammar must be a GBNF string');
    const p = grammar ? { ...(params || {}), grammar } : params || undefined;
    const handle = native._branchCreate(position, p, nBatch == null ? undefined : nBatch, seqId);
    return new Branch(ctx, handle, 0);
  }

  /** The native context, or the coded error for a freed branch. */
  _live() {
    const native = nativeOf(this._ctx);
    // Freed here, possibly still queued natively: the native side gives the error and message.
    if (isDisposed(this)) native._throwCoded('ERR_BRANCH_DISPOSED');
    return native;
  }

  /**
   * A child sharing this branch's KV prefix (no copy) with independent copies of its sampler
   * chain (including RNG state), grammar state, logits snapshot and perplexity. Steer biases are
   * not inherited. `seqId` requests a specific free lease.
   * @param {number} [seqId]
   * @returns {Branch}
   */
  fork(seqId) {
    return new Branch(this._ctx, this._live()._branchFork(this._handle, seqId), this._handle);
  }

  /**
   * A child sharing only this branch's cells below `position` — a prefix of its tokens, e.g. a
   * shared system prompt — without copying them. Unless `position` is this branch's own, the
   * child has no logits snapshot (prefill at least one token before sampling), fresh
   * perplexities, and a fresh sampler chain and grammar built from this branch's parameters
   * (the parent's RNG, penalty window and grammar state describe tokens the child lacks).
   * `position` must be in `[0, position]` of this branch. On a model with sliding-window
   * attention (Gemma 3: 512 positions) a fork below the parent's own position is refused with
   * `ERR_UNSUPPORTED` once the parent is past the window: llama.cpp may already have reused the
   * cells the child would need. Keep a branch at the prefix (a prefix cache does) and fork that.
   * @param {number} position
   * @param {number} [seqId]
   * @returns {Branch}
   */
  forkAt(position, seqId) {
    if (typeof position !== 'number')
      throw makeError('ERR_INVALID_ARG', 'forkAt(position, seqId?): position must be a number');
    return new Branch(this._ctx, this._live()._branchFork(this._handle, seqId, position), this._handle);
  }

  /**
   * Copies the context's last logits row into this branch (after a raw `ctx.decode` for it).
   * @returns {void}
   */
  captureLogits() {
    this._live()._branchCaptureLogits(this._handle);
  }

  /**
   * A copy of this branch's logits snapshot (length `vocabSize`). Throws `ERR_NO_LOGITS` if none.
   * @returns {Float32Array}
   */
  getLogits() {
    return this._live()._branchGetLogits(this._handle);
  }

  /**
   * Entropy of the snapshot distribution, in `'nats'` (default) or `'bits'`.
   * @param {import('./types').EntropyBase} [base]
   * @returns {number}
   */
  entropy(base) {
    return this._live()._branchEntropy(this._handle, base);
  }

  /**
   * Samples a token from the snapshot through the full pipeline, without accepting it or writing
   * KV. Throws `ERR_GRAMMAR` if every candidate is masked.
   * @returns {number}
   */
  sample() {
    return this._live()._branchSample(this._handle);
  }

  /**
   * Accepts `token` into the sampler (penalty window), grammar and perplexity trackers. No decode.
   * @param {number} token
   * @returns {void}
   */
  accept(token) {
    this._live()._branchAccept(this._handle, token);
  }

  /**
   * {@link sample} plus the token's text and stop flag; with `{ logprobs: k }` also the token's
   * log-probability and the `k` (0..20) most likely tokens at this position (see {@link logprob}).
   * @param {{ logprobs?: number }} [options]
   * @returns {Produced & Partial<Pick<import('./types').TokenLogprob, 'logprob' | 'top'>>}
   */
  produce(options) {
    const native = this._live();
    const top = logprobsOption(options, 'produce');
    const produced = native._branchProduce(this._handle);
    if (top === undefined) return produced;
    const { logprob, top: best } = native._branchLogprob(this._handle, produced.token, top);
    return { ...produced, logprob, top: best };
  }

  /**
   * The natural-log probability of `token` at this branch's position under the model's own
   * distribution (the logits snapshot, before samplers, biases and grammar), and the `top`
   * (0..20, default 0) most likely tokens with theirs, most likely first. No decode; throws
   * `ERR_NO_LOGITS` without a snapshot.
   * @param {number} token
   * @param {number} [top]
   * @returns {import('./types').TokenLogprob}
   */
  logprob(token, top = 0) {
    return this._live()._branchLogprob(this._handle, token, top);
  }

  /**
   * Accepts `token` and decodes it, refreshing the logits snapshot. All-or-nothing: on failure
   * the branch is unchanged. Rejects with `ERR_GRAMMAR_REJECTED`, `ERR_KV_FULL`, `ERR_ABORTED`, ...
   * @param {number} token
   * @param {OperationOptions} [options]
   * @returns {Promise<void>}
   */
  async commit(token, options) {
    const native = this._live();
    const done = runCancellable(options, 'commit', (cancel) => native._storeCommit([this._handle], [token], cancel));
    return traced(this._ctx, done, (trace) => trace.grew(this, [token], true));
  }

  /**
   * Decodes tokens the model did not sample (prompt, user turn, tool output), in chunks of this
   * branch's `nBatch`, without accepting them. An empty array is a no-op. All-or-nothing: an
   * abort (`options.signal`) or failure after some chunks removes all of them again.
   *
   * A {@link MediaPrompt} (`ctx.tokenizeParts`, text and images) is prefilled piece by piece:
   * each image is encoded by the projector (one encoder run; `ctx.imageStats()`) and its
   * embeddings decoded as one batch taking the image's `nPos` positions. A fork after it shares
   * those cells and encodes nothing. Checked before anything is written: `ERR_IMAGE_POSITIONS`
   * when the prompt passes nCtx or an image has more tokens than nBatch. `options.from` /
   * `options.to` (a MediaPrompt only): prefill just those positions of the prompt (default all),
   * e.g. the rest of a prompt whose start this branch holds already; a range that cuts an image
   * is `ERR_IMAGE_POSITIONS`.
   * @param {number[] | Pick<MediaPrompt, 'pieces' | 'nPos' | 'nImages'>} tokens a MediaPrompt of this context's `tokenizeParts`
   * @param {OperationOptions & { from?: number, to?: number }} [options]
   * @returns {Promise<void>}
   */
  async prefill(tokens, options) {
    const native = this._live();
    const prompt = nativeOfPrompt(tokens);
    if (prompt)
      return runCancellable(options, 'prefill', (cancel) =>
        native._branchPrefillMedia(this._handle, prompt, cancel, options?.from, options?.to),
      );
    if (!Array.isArray(tokens))
      throw makeError('ERR_INVALID_ARG', 'prefill(tokens): tokens must be an array of token ids or a MediaPrompt');
    if (tokens.length === 0) {
      const signal = signalOf(options, 'prefill');
      return runCancellable({ signal }, 'prefill', () => Promise.resolve());
    }
    const done = runCancellable(options, 'prefill', (cancel) => native._branchPrefill(this._handle, tokens, cancel));
    return traced(this._ctx, done, (trace) => trace.grew(this, tokens, false));
  }

  /**
   * Decodes one token without accepting it, and captures its logits. Cancellable.
   * @param {number} token
   * @param {OperationOptions} [options]
   * @returns {Promise<void>}
   */
  async decodeAndCaptureOne(token, options) {
    const native = this._live();
    const done = runCancellable(options, 'decodeAndCaptureOne', (cancel) =>
      native._branchDecodeAndCaptureOne(this._handle, token, cancel),
    );
    return traced(this._ctx, done, (trace) => trace.grew(this, [token], false));
  }

  /**
   * Replaces this branch's dynamic biases (`bias` finite or `-Infinity` to ban); not inherited
   * by forks.
   * @param {import('./types').TokenBias[]} biases
   * @returns {void}
   */
  steer(biases) {
    if (!Array.isArray(biases))
      throw makeError('ERR_INVALID_ARG', 'steer(biases): biases must be an array of {token, bias}');
    this._live()._branchSteer(this._handle, biases);
  }

  /**
   * Removes the dynamic biases set by {@link steer}.
   * @returns {void}
   */
  clearSteer() {
    this._live()._branchSteer(this._handle, []);
  }

  /**
   * Reseeds the random stage (integer in [0, 2^32)); no effect on greedy chains. Forks share the
   * parent's RNG state until reseeded.
   * @param {number} seed
   * @returns {void}
   */
  reseedSampler(seed) {
    this._live()._branchReseed(this._handle, seed);
  }

  /**
   * Rebuilds the sampler chain from `params` (penalty window and RNG start fresh). A `grammar` in
   * `params` replaces the current one; without it the current grammar is kept.
   * @param {SamplingParams} params
   * @returns {void}
   */
  setSamplerParams(params) {
    this._live()._branchSetSamplerParams(this._handle, params || {});
  }

  /**
   * Installs a GBNF grammar; `null` or `''` removes it. With `lazy` triggers (`triggerPatterns`,
   * `triggerWords` or `triggerTokens`) the grammar only applies once a trigger appears.
   * @param {string | null} grammar
   * @param {import('./types').LazyGrammarTriggers} [lazy]
   * @returns {void}
   */
  setGrammar(grammar, lazy) {
    const native = this._live();
    const opts = lazy || {};
    /** @param {string} w */
    const escape = (w) => String(w).replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const patterns = [
      ...(opts.triggerPatterns || []),
      ...(opts.triggerWords || []).map((w) => `[\\s\\S]*?(${escape(w)}[\\s\\S]*)`),
    ];
    native._branchSetGrammar(this._handle, grammar || null, patterns, opts.triggerTokens || []);
  }

  /**
   * Frees this branch and its KV tags; its children live on (re-parented to its parent). Resolves
   * at once when the context is idle, else after the pending operation. No-op when disposed.
   * @returns {Promise<void>}
   */
  prune() {
    return this._free('_branchPrune');
  }

  /**
   * Frees this branch and all of its descendants. No-op when disposed.
   * @returns {Promise<void>}
   */
  pruneSubtree() {
    return this._free('_branchPruneSubtree');
  }

  /**
   * {@link prune} done before returning: waits for operations queued on the context, then frees.
   * @returns {void}
   */
  pruneSync() {
    this._freeSync('_branchPruneSync');
  }

  /**
   * {@link pruneSubtree} done before returning (as {@link pruneSync}).
   * @returns {void}
   */
  pruneSubtreeSync() {
    this._freeSync('_branchPruneSubtreeSync');
  }

  /**
   * Frees the branch object but keeps its KV cells for raw `ctx` calls; returns the sequence id
   * (reserved until its cells are removed, e.g. `ctx.kvCacheRemove(seq, -1, -1)`), or undefined
   * if the branch was already disposed.
   * @returns {number | undefined}
   */
  destroy() {
    if (isDisposed(this)) return undefined;
    const seq = nativeOf(this._ctx)._branchDestroy(this._handle);
    wrapFreed(this._ctx, [this._handle]);
    return seq;
  }

  /**
   * Marks the wrapper disposed at once; the native side frees the branch in call order (now,
   * when nothing is queued on the context) and reports every handle it freed.
   * @param {'_branchPrune' | '_branchPruneSubtree'} method
   * @returns {Promise<void>}
   */
  _free(method) {
    if (isDisposed(this)) return Promise.resolve();
    const ctx = this._ctx;
    // Every wrapper the call frees reads `disposed` from now on, while the free may still be queued.
    const handles = method === '_branchPruneSubtree' ? subtreeOf(ctx, this._handle) : [this._handle];
    wrapFreed(ctx, handles);
    markDisposed(this);
    if (ctx.disposed) return Promise.resolve(); // dispose() already freed every branch
    const freeing = nativeOf(ctx)[method](this._handle);
    return freeing.then(
      (freed) => {
        wrapFreed(ctx, freed);
      },
      (e) => {
        if (e.code !== 'ERR_BRANCH_DISPOSED' && e.code !== 'ERR_CONTEXT_DISPOSED') throw e;
      },
    );
  }

  /** @param {'_branchPruneSync' | '_branchPruneSubtreeSync'} method */
  _freeSync(method) {
    if (isDisposed(this) || this._ctx.disposed) {
      markDisposed(this);
      return;
    }
    const freed = nativeOf(this._ctx)[method](this._handle);
    markDisposed(this);
    wrapFreed(this._ctx, freed);
  }

  /**
   * Parks the branch: it gives back its sequence and its own KV cells (those beyond the prefix it
   * shares with its parent) and keeps what it needs to go on — those cells' state (in RAM, or in
   * a spill file beyond `store.setParkSpill`'s budget), its logits snapshot, sampler, grammar and
   * perplexities. Every operation that needs its KV is then `ERR_BRANCH_PARKED` until
   * {@link resume}. Its children stay valid. Runs on the context's worker in call order.
   * @returns {Promise<void>}
   */
  park() {
    return this._live()._storePark([this._handle]);
  }

  /**
   * Resumes a parked branch on a free sequence (and first its parked ancestors whose cells it
   * needs): its own cells loaded back, the parent's prefix shared again, nothing re-decoded; it
   * continues exactly where it was parked. `ERR_NO_FREE_SEQUENCE` / `ERR_KV_FULL` before
   * anything changes; a damaged spill file is `ERR_STATE_CORRUPT` and the branch stays parked.
   * @returns {Promise<void>}
   */
  async resume() {
    await this._live()._storeResume([this._handle]);
  }

  /** True while parked ({@link park}). */
  get parked() {
    return this._info().parked;
  }

  /**
   * While parked: `{ shared, own, file }` (cells shared with the parent, its own cells, the
   * spill file or null while in RAM); null when not parked.
   * @returns {import('./types').ParkedInfo | null}
   */
  get parkedInfo() {
    const info = this._live()._branchParked(this._handle);
    return info ? { shared: info.shared, own: info.own, file: info.file ?? null } : null;
  }

  _info() {
    return this._live()._branchInfo(this._handle);
  }

  /** Opaque native handle (a non-zero integer), as used by {@link parent} and {@link children}. */
  get handle() {
    return this._handle;
  }
  /** True once pruned, destroyed or released by `retainOnly`. Never throws. */
  get disposed() {
    return isDisposed(this);
  }
  /** The leased KV sequence id (-1 while parked). */
  get seqId() {
    return this._info().seqId;
  }
  /** The next position to write (number of tokens in this branch's sequence). */
  get position() {
    return this._live()._branchPosition(this._handle);
  }
  /** Position at which this branch was forked (0 for roots). */
  get forkHead() {
    return this._info().forkHead;
  }
  /** Model perplexity of accepted tokens (raw logits); `Infinity` before the first accept. */
  get perplexity() {
    return this._info().perplexity;
  }
  /** Perplexity under the distribution actually sampled from (after filters and temperature). */
  get samplingPerplexity() {
    return this._info().samplingPerplexity;
  }
  /**
   * Handle of the parent branch, or null for a root.
   * @returns {number | null}
   */
  get parent() {
    const p = this._info().parent;
    return p === 0 ? null : p;
  }
  /**
   * Handles of the live child branches.
   * @returns {number[]}
   */
  get children() {
    return this._info().children;
  }
  /** True when the branch has no live children. */
  get isLeaf() {
    return this._info().children.length === 0;
  }
  /** `!disposed`. */
  get isActive() {
    return !isDisposed(this);
  }

  // --- Compatibility aliases: the names of the reference's later surface, in one place ---------

  /**
   * {@link fork} (already synchronous).
   * @param {number} [seqId]
   * @returns {Branch}
   */
  forkSync(seqId) {
    return this.fork(seqId);
  }

  /**
   * {@link produce} (already synchronous).
   * @returns {Produced}
   */
  produceSync() {
    return this.produce();
  }

  /**
   * Generates up to `maxTokens` tokens (stops at an end-of-generation token), optionally
   * speculating: `speculative: { lookup: true }` drafts from the line's own history (pass the
   * prompt as `history`), `{ draft: draftCtx }` from a smaller model with the same vocabulary;
   * each step commits the sampled token and verifies its draft in ONE decode, so the tokens are
   * the ones plain generation with this branch's sampler would give (greedy: equal up to CPU
   * batch-shape ties; sampled: the same distribution). Resolves with the tokens, text, finish
   * reason and the draft statistics. See docs/speculative.md.
   * @param {import('./types').BranchGenerateOptions} [options]
   * @returns {Promise<import('./types').BranchGenerateResult>}
   */
  async generate(options) {
    this._live();
    return generate(this, this._ctx, options);
  }

  /**
   * `for await (const { token, text } of branch)`: produces, commits, then yields each token;
   * stops (without committing) at an end-of-generation token or when the branch is disposed.
   * @returns {AsyncGenerator<BranchToken, void, undefined>}
   */
  async *[Symbol.asyncIterator]() {
    while (!isDisposed(this)) {
      const produced = this.produce();
      if (produced.isStop) return;
      await this.commit(produced.token);
      yield { token: produced.token, text: produced.text };
    }
  }
}

/**
 * The wrapper of a branch the native side made (a restored tree: BranchStore.restoreTree).
 * @param {SessionContext} ctx
 * @param {number} handle
 * @param {number} parent the parent's handle, 0 for a root
 * @returns {Branch}
 */
function adoptBranch(ctx, handle, parent) {
  return /** @type {Branch} */ (new /** @type {any} */ (Branch)(ctx, handle, parent)); // the constructor is private to users
}

module.exports = { Branch, adoptBranch };
