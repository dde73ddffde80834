'use strict';

const { makeError } = require('./errors');
const { nativeOf, nativeOfPrompt, wrapFreed, branchHandle, wrapperOf } = require('./Context');
const { adoptBranch } = require('./Branch');
const batch = require('./decode/batch');

/**
 * @typedef {import('./types').OperationOptions} OperationOptions
 * @typedef {import('./Branch').Branch} Branch
 */

/**
 * Batched operations over many branches of one context: one `llama_decode` per step. The
 * branches belong to the context, so every store on it sees the same ones; a branch of another
 * context is refused with `ERR_FOREIGN_BRANCH`.
 */
class BranchStore {
  /**
   * Throws `ERR_INVALID_ARG` for a non-context, `ERR_CONTEXT_DISPOSED` for a disposed one.
   * @param {import('./Context').SessionContext} ctx
   */
  constructor(ctx) {
    nativeOf(ctx); // checks ctx
    this._ctx = ctx;
  }

  /**
   * `[[branch, token], ...]`: accepts each token into its branch, then ONE decode for all of them.
   * All-or-nothing (also when `options.signal` aborts it). Each branch may appear once; at most
   * `ctx.nBatch` entries.
   * @param {ReadonlyArray<readonly [Branch, number]>} entries
   * @param {OperationOptions} [options]
   * @returns {Promise<void>}
   */
  async commit(entries, options) {
    return batch.commit(this._ctx, entries, options, 'BranchStore.commit');
  }

  /**
   * A speculative step: `[[branch, token, draft], ...]` commits each branch's sampled `token`
   * with `draft` (token ids proposed to follow it) in ONE decode with an output row per token.
   * Each branch accepts the longest prefix of its draft that its own sampler chain (penalties,
   * grammar, biases, seed) samples too, and ends exactly as plain commits of those tokens would
   * leave it; the rejected cells are removed. `next` is the token the branch sampled where it
   * parted from the draft: commit it next instead of sampling again (sampling again would skew
   * the distribution). An end-of-generation token is never accepted from a draft; it comes back
   * as `next`. An empty draft is a plain commit (`next` null: sample as usual). All-or-nothing
   * (also when `options.signal` aborts it). Each branch's token plus draft must fit one decode
   * (`ctx.nOutputs` rows, `nBatch` tokens), else `ERR_INVALID_ARG`; many branches are packed
   * into as few decodes as fit. See docs/speculative.md.
   * @param {ReadonlyArray<readonly [Branch, number, readonly number[]]>} entries
   * @param {OperationOptions} [options]
   * @returns {Promise<import('./types').VerifiedDraft[]>}
   */
  async commitDrafts(entries, options) {
    return batch.commitDrafts(this._ctx, entries, options, 'BranchStore.commitDrafts');
  }

  /**
   * `[[branch, tokens], ...]`: decodes variable-length runs bin-packed into `nBatch`-sized
   * decodes; no accept. All-or-nothing (also when `options.signal` aborts it).
   *
   * An entry `[branch, tokens, scoreFrom]` is also scored: its sum is the natural-log
   * probability of `tokens.slice(scoreFrom)` as the continuation of what comes before (the model's
   * distribution, before samplers; with `scoreFrom` 0 the first token is read from the logits the
   * branch holds). A scored entry takes a logits row per token, so it must fit one decode
   * (`ctx.nOutputs` and `nBatch` tokens); several share decodes as far as those limits allow.
   * Resolves each entry's sum, `null` for entries not scored.
   * @param {ReadonlyArray<readonly [Branch, number[]] | readonly [Branch, number[], number]>} entries
   * @param {OperationOptions} [options]
   * @returns {Promise<Array<number | null>>}
   */
  async prefill(entries, options) {
    return /** @type {Promise<Array<number | null>>} */ (
      batch.prefill(this._ctx, entries, options, 'BranchStore.prefill')
    );
  }

  /**
   * `[[branch, tokens], ...]`: the natural-log probability of each entry's tokens as its branch's
   * continuation, every entry in the same decode where `ctx.nOutputs` allows, and the tokens
   * stay (each branch goes on after them, as after `prefill`). The way to rank candidate
   * continuations forked from one prefix: one decode instead of one per token (a program's
   * `select` scores its options this way).
   * @param {ReadonlyArray<readonly [Branch, number[]]>} entries
   * @param {OperationOptions} [options]
   * @returns {Promise<number[]>}
   */
  async score(entries, options) {
    if (!Array.isArray(entries))
      throw makeError('ERR_INVALID_ARG', 'BranchStore.score: expected an array of [branch, tokens] pairs');
    const scored = entries.map((e) => (Array.isArray(e) && e.length === 2 ? [e[0], e[1], 0] : e));
    return /** @type {Promise<number[]>} */ (batch.prefill(this._ctx, scored, options, 'BranchStore.score'));
  }

  /**
   * `prefill`, resolving each scored entry's log-probabilities per token (in order, from its
   * score start) instead of their sum, and null for an entry without a score start: one decode
   * for prompts to fill and texts to score together (the Scheduler's prefill, where a `select`
   * reads the sums of options that share a prefix off one scored path).
   * @param {ReadonlyArray<readonly [Branch, number[]] | readonly [Branch, number[], number]>} entries
   * @param {OperationOptions} [options]
   * @returns {Promise<Array<number[] | null>>}
   */
  async scorePerToken(entries, options) {
    return /** @type {Promise<Array<number[] | null>>} */ (
      batch.prefill(this._ctx, entries, options, 'BranchStore.scorePerToken', true)
    );
  }

  /**
   * `[[branch, mediaPrompt, { from, to }], ...]`: prefills each {@link MediaPrompt} (text and
   * images, from this context's `tokenizeParts`) into its branch as `branch.prefill(mediaPrompt,
   * { from, to })` does, all of them in ONE job on the context's worker (the Scheduler's image
   * prefill of a step). Each entry is all or nothing on its own: resolves one item per entry,
   * null or that entry's coded error (e.g. `ERR_IMAGE_POSITIONS`), so one failure stays its
   * entry's. A malformed entry (not a branch, not a MediaPrompt) throws before anything runs.
   * @param {ReadonlyArray<readonly [Branch, import('./Context').MediaPrompt, { from?: number, to?: number }?]>} entries
   * @returns {Promise<Array<(Error & { code: string }) | null>>}
   */
  async prefillMedia(entries) {
    const where = 'BranchStore.prefillMedia';
    if (!Array.isArray(entries))
      throw makeError('ERR_INVALID_ARG', `${where}: expected an array of [branch, mediaPrompt, range] entries`);
    const [handles, prompts, froms, tos] = [[], [], [], []];
    for (const entry of entries) {
      if (!Array.isArray(entry))
        throw makeError('ERR_INVALID_ARG', `${where}: each entry must be [branch, mediaPrompt, range?]`);
      const [branch, prompt, range] = entry;
      if (range !== undefined && (range === null || typeof range !== 'object'))
        throw makeError('ERR_INVALID_ARG', `${where}: an entry's range must be { from?, to? } or absent`);
      handles.push(branchHandle(this._ctx, branch, where));
      const native = nativeOfPrompt(prompt);
      if (!native)
        throw makeError('ERR_INVALID_ARG', `${where}: an entry's prompt must be a MediaPrompt of tokenizeParts`);
      prompts.push(native);
      froms.push(range?.from ?? 0);
      tos.push(range?.to ?? prompt.nPos);
    }
    if (entries.length === 0) return [];
    const failures = await nativeOf(this._ctx)._storePrefillMedia(handles, prompts, froms, tos);
    return failures.map((f) => (f ? makeError(f.code, f.message) : null));
  }

  /**
   * Samples every branch in one native call (no KV write, no accept). Waits for queued operations.
   * @param {readonly Branch[]} branches
   * @returns {import('./types').Produced[]}
   */
  produce(branches) {
    return batch.produce(this._ctx, branches, 'BranchStore.produce');
  }

  /**
   * Keeps only `winner` (one `seq_keep` pass): every other branch of the context is freed and its
   * wrapper becomes disposed. `winner` becomes a root. Runs in call order after queued operations.
   * @param {Branch} winner
   * @returns {Promise<void>}
   */
  async retainOnly(winner) {
    const h = branchHandle(this._ctx, winner, 'BranchStore.retainOnly');
    wrapFreed(this._ctx, await nativeOf(this._ctx)._storeRetainOnly(h));
  }

  /**
   * Saves `root` and all its live descendants to the file `path`: each branch's position, KV
   * cells, sampler state (seed and RNG draws, penalty and DRY windows), grammar state, logits
   * snapshot, perplexities, steer biases and the images its cells hold (each one's positions
   * and SHA-256), with every prefix shared by forks stored once.
   * {@link BranchStore.restoreTree} rebuilds the tree, here or in another process, and every
   * branch continues as it would have (same greedy tokens, same seeded samples). The file is
   * written atomically (a temporary file, fsync, rename): `path` holds the old file or the whole
   * new one. Runs on the context's worker in call order; the branches are unchanged.
   *
   * Refused with `ERR_UNSUPPORTED` for a branch sampling with mirostat or XTC (their state
   * cannot be carried). A token sampled but not yet committed is not part of the state: commit
   * it after restoring. See docs/api.md#branch-trees.
   * @param {Branch} root
   * @param {string} path
   * @param {import('./types').SaveTreeOptions} [options]
   * @returns {Promise<import('./types').SavedTree>}
   */
  async saveTree(root, path, options) {
    const where = 'BranchStore.saveTree';
    const h = branchHandle(this._ctx, root, where);
    if (typeof path !== 'string' || path === '')
      throw makeError('ERR_INVALID_ARG', `${where}(root, path, options?): path must be a non-empty file path`);
    if (options != null && typeof options !== 'object')
      throw makeError('ERR_INVALID_ARG', `${where}: options must be an object`);
    const meta = options?.meta;
    if (meta !== undefined && typeof meta !== 'string')
      throw makeError('ERR_INVALID_ARG', `${where}: options.meta must be a string (e.g. JSON.stringify of your data)`);
    const saved = await nativeOf(this._ctx)._storeSaveTree(h, path, meta);
    return {
      branches: saved.handles.map((handle) => wrapperOf(this._ctx, handle)),
      bytes: saved.bytes,
      kvBytes: saved.kvBytes,
      logitsBytes: saved.logitsBytes,
      sharedBranches: saved.sharedBranches,
    };
  }

  /**
   * Rebuilds a tree saved by {@link BranchStore.saveTree} on free sequences of `ctx`: one
   * sequence per branch, the shared prefixes shared again. The file must come from the same
   * model, llama.cpp state format and KV settings (`typeK`, `typeV`, `flashAttention`), else
   * `ERR_STATE_MISMATCH`; a truncated or corrupted file is `ERR_STATE_CORRUPT` (a checksum covers the
   * whole file); too few free sequences is `ERR_NO_FREE_SEQUENCE` and too few free cells
   * `ERR_KV_FULL`, both checked before anything changes. All or nothing: on any failure no
   * branch is left behind. Runs on the context's worker, never on the event loop. Branches
   * that hold an image get it back (a fork inside it is `ERR_IMAGE_POSITIONS`); nothing is
   * encoded, so `ctx` needs no projector.
   * @param {import('./Context').SessionContext} ctx
   * @param {string} path
   * @returns {Promise<import('./types').RestoredTree>}
   */
  static async restoreTree(ctx, path) {
    const where = 'BranchStore.restoreTree';
    const native = nativeOf(ctx);
    if (typeof path !== 'string' || path === '')
      throw makeError('ERR_INVALID_ARG', `${where}(ctx, path): path must be a non-empty file path`);
    const restored = await native._storeRestoreTree(path);
    /** @type {Branch[]} */
    const branches = [];
    restored.handles.forEach((handle, i) => {
      const parent = restored.parents[i] < 0 ? 0 : restored.handles[restored.parents[i]];
      branches.push(adoptBranch(ctx, handle, parent));
    });
    return { root: branches[0], branches, parents: restored.parents, meta: restored.meta, bytes: restored.bytes };
  }

  /**
   * Parks several branches in one worker job (children before parents, so that each keeps only
   * its own cells; see {@link Branch#park}). All or nothing.
   * @param {readonly Branch[]} branches
   * @returns {Promise<void>}
   */
  async park(branches) {
    await nativeOf(this._ctx)._storePark(batch.handlesOf(this._ctx, branches, 'BranchStore.park'));
  }

  /**
   * Resumes several parked branches (see {@link Branch#resume}), and first the parked ancestors
   * they need; resolves every branch resumed, parents first. All or nothing.
   * @param {readonly Branch[]} branches
   * @returns {Promise<Branch[]>}
   */
  async resume(branches) {
    const resumed = await nativeOf(this._ctx)._storeResume(batch.handlesOf(this._ctx, branches, 'BranchStore.resume'));
    return resumed.map((handle) => wrapperOf(this._ctx, handle));
  }

  /**
   * Where parked state goes: up to `ramBytes` of it stays in host memory, the oldest beyond it
   * spills into `dir` (one checksummed file per branch, written atomically, removed when the
   * branch resumes or is freed). Without options everything stays in RAM. For the context.
   * @param {import('./types').ParkSpillOptions} [options]
   * @returns {void}
   */
  setParkSpill(options) {
    const where = 'BranchStore.setParkSpill';
    if (options != null && typeof options !== 'object')
      throw makeError('ERR_INVALID_ARG', `${where}: options must be an object { ramBytes, dir }`);
    const { ramBytes, dir } = options || {};
    if (dir !== undefined && (typeof dir !== 'string' || dir === ''))
      throw makeError('ERR_INVALID_ARG', `${where}: options.dir must be a folder path`);
    if (ramBytes !== undefined && typeof ramBytes !== 'number')
      throw makeError('ERR_INVALID_ARG', `${where}: options.ramBytes must be a number of bytes`);
    nativeOf(this._ctx)._storeParkSpill(ramBytes, dir);
  }

  /**
   * `{ parked, ramBytes, diskBytes, spilled, lastSpillError }` of the context's parked branches.
   * @returns {import('./types').ParkStats}
   */
  parkStats() {
    const stats = nativeOf(this._ctx)._storeParkStats();
    return { ...stats, lastSpillError: stats.lastSpillError ?? null };
  }

  /** Host memory parked branches take now (bytes; spilled ones not counted). */
  get parkedBytes() {
    return this.parkStats().ramBytes;
  }

  /** Number of free sequence leases. Waits for queued operations. */
  get available() {
    return nativeOf(this._ctx)._storeAvailable();
  }

  /**
   * Exact KV usage, `{ nCtx, cellsUsed, remaining }` (cells shared by forks counted once);
   * with `without`, the usage if those branches were pruned (nothing is: what evicting a cache
   * of idle branches would leave held). Waits for queued operations.
   * @param {readonly import('./Branch').Branch[]} [without]
   * @returns {import('./types').KvPressure}
   */
  kvPressure(without) {
    if (without === undefined) return nativeOf(this._ctx)._storeKvPressure();
    const where = 'BranchStore.kvPressure';
    if (!Array.isArray(without)) throw makeError('ERR_INVALID_ARG', `${where}: without must be an array of Branches`);
    const handles = without.map((b) => branchHandle(this._ctx, b, where));
    return nativeOf(this._ctx)._storeKvPressure(handles);
  }
}

module.exports = { BranchStore };
