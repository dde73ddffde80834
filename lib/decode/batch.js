'use strict';

/**
 * The batched operations over branches of one context (one `llama_decode` for many branches),
 * as functions of the context: `BranchStore`'s methods are these, and a branch's own decode loop
 * (`Branch.generate`, ./generate.js) runs on them too without needing the BranchStore class
 * (which sits above Branch, since it wraps the branches a restored tree brings). Each checks its
 * entries, runs cancellably in the context's call order and tells a trace what grew. `where` is
 * the public name an error message gives.
 */

const { makeError } = require('../errors');
const { nativeOf, branchHandle } = require('../Context');
const { runCancellable, signalOf } = require('../cancel');
const { traced } = require('../trace');

/**
 * @typedef {import('../types').OperationOptions} OperationOptions
 * @typedef {import('../Context').SessionContext} SessionContext
 */

/**
 * The handles of `[branch, value, extra?]` entries, their values and extras.
 * @param {SessionContext} ctx
 * @param {unknown} entries
 * @param {string} where
 * @param {boolean} [third] whether an entry may carry a third element (prefill's score start)
 * @returns {{ handles: number[], values: any[], extras: any[] }}
 */
function entriesOf(ctx, entries, where, third = false) {
  if (!Array.isArray(entries))
    throw makeError('ERR_INVALID_ARG', `${where}: expected an array of [branch, value] pairs`);
  const handles = [];
  const values = [];
  const extras = [];
  for (const e of entries) {
    if (!Array.isArray(e) || !(e.length === 2 || (third && e.length === 3)))
      throw makeError(
        'ERR_INVALID_ARG',
        `${where}: each entry must be a [branch, value${third ? ', option?' : ''}] ${third ? 'tuple' : 'pair'}`,
      );
    handles.push(branchHandle(ctx, e[0], where));
    values.push(e[1]);
    extras.push(e.length === 3 ? e[2] : undefined);
  }
  return { handles, values, extras };
}

/**
 * The handles of an array of `ctx`'s branches (`ERR_INVALID_ARG` for anything else).
 * @param {SessionContext} ctx @param {unknown} branches @param {string} where
 * @returns {number[]}
 */
function handlesOf(ctx, branches, where) {
  if (!Array.isArray(branches)) throw makeError('ERR_INVALID_ARG', `${where}: expected an array of branches`);
  return branches.map((b) => branchHandle(ctx, b, where));
}

/**
 * Samples every branch in one native call (no KV write, no accept).
 * @param {SessionContext} ctx @param {unknown} branches @param {string} where
 * @returns {import('../types').Produced[]}
 */
function produce(ctx, branches, where) {
  return nativeOf(ctx)._storeProduce(handlesOf(ctx, branches, where));
}

/**
 * Accepts each `[branch, token]` entry's token into its branch, then ONE decode for all of them.
 * @param {SessionContext} ctx @param {any} entries @param {OperationOptions | undefined} options @param {string} where
 * @returns {Promise<void>}
 */
async function commit(ctx, entries, options, where) {
  const { handles, values } = entriesOf(ctx, entries, where);
  const signal = signalOf(options, where);
  if (handles.length === 0) return runCancellable({ signal }, where, () => Promise.resolve());
  const native = nativeOf(ctx);
  const done = runCancellable({ signal }, where, (cancel) => native._storeCommit(handles, values, cancel));
  return traced(ctx, done, (trace) => entries.forEach(([b, token]) => trace.grew(b, [token], true)));
}

/**
 * A speculative step over `[branch, token, draft]` entries (see BranchStore.commitDrafts).
 * @param {SessionContext} ctx @param {any} entries @param {OperationOptions | undefined} options @param {string} where
 * @returns {Promise<import('../types').VerifiedDraft[]>}
 */
async function commitDrafts(ctx, entries, options, where) {
  if (!Array.isArray(entries))
    throw makeError('ERR_INVALID_ARG', `${where}: expected an array of [branch, token, draft] entries`);
  const handles = [];
  const tokens = [];
  const drafts = [];
  for (const e of entries) {
    if (!Array.isArray(e) || e.length !== 3 || !Array.isArray(e[2]))
      throw makeError('ERR_INVALID_ARG', `${where}: each entry must be [branch, token, draft], draft an array`);
    handles.push(branchHandle(ctx, e[0], where));
    tokens.push(e[1]);
    drafts.push(e[2]);
  }
  const signal = signalOf(options, where);
  if (handles.length === 0) return runCancellable({ signal }, where, () => Promise.resolve([]));
  const native = nativeOf(ctx);
  const done = runCancellable({ signal }, where, (cancel) =>
    native._storeCommitDrafts(handles, tokens, drafts, cancel),
  );
  return traced(ctx, done, (trace, verified) =>
    entries.forEach(([b, token], i) => trace.grew(b, [token, ...verified[i].accepted.map((p) => p.token)], true)),
  );
}

/**
 * Decodes `[branch, tokens, scoreFrom?]` runs bin-packed into decodes, no accept; resolves each
 * scored entry's log-probabilities per token (`perToken`) or their sum, null for the others.
 * @param {SessionContext} ctx @param {any} entries @param {OperationOptions | undefined} options
 * @param {string} where @param {boolean} [perToken]
 * @returns {Promise<Array<number | number[] | null>>}
 */
async function prefill(ctx, entries, options, where, perToken = false) {
  const { handles, values, extras } = entriesOf(ctx, entries, where, true);
  for (const v of values) {
    if (!Array.isArray(v)) throw makeError('ERR_INVALID_ARG', `${where}: each value must be an array of token ids`);
  }
  for (const [i, from] of extras.entries()) {
    if (from !== undefined && !(Number.isInteger(from) && from >= 0 && from < values[i].length))
      throw makeError(
        'ERR_INVALID_ARG',
        `${where}: a score start must be an index into the entry's ${values[i].length} tokens, got ${String(from)}`,
      );
  }
  const signal = signalOf(options, where);
  if (handles.length === 0) return runCancellable({ signal }, where, () => Promise.resolve([]));
  const native = nativeOf(ctx);
  const scoreFrom = extras.some((e) => e !== undefined) ? extras.map((e) => (e === undefined ? null : e)) : undefined;
  const done = runCancellable({ signal }, where, (cancel) =>
    native._storePrefill(handles, values, cancel, scoreFrom),
  ).then((scores) => (perToken ? scores : scores.map((s) => (s === null ? null : s.reduce((a, b) => a + b, 0)))));
  return traced(ctx, done, (trace) => entries.forEach(([b, tokens]) => trace.grew(b, tokens, false)));
}

module.exports = { handlesOf, produce, commit, commitDrafts, prefill };
