'use strict';

/**
 * The loop behind `Branch.generate`: the branch is one row of ./rows.js — the decode phase the
 * Scheduler runs for all its lines — produced, drafted and verified in one decode per step, over
 * the batched operations of ./batch.js.
 */

const { makeError } = require('../errors');
const batch = require('./batch');
const { produceAll, commitRows } = require('./rows');
const { DraftLength, stepCostFor, checkSpeculative } = require('./speculation');

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
 * What ./rows.js asks of a store (`produce`, `commit`, `commitDrafts`), over `ctx`.
 * @param {any} ctx
 */
function storeOver(ctx) {
  const where = 'generate';
  return {
    produce: (/** @type {any[]} */ branches) => batch.produce(ctx, branches, where),
    commit: (/** @type {any} */ entries) => batch.commit(ctx, entries, undefined, where),
    commitDrafts: (/** @type {any} */ entries) => batch.commitDrafts(ctx, entries, undefined, where),
  };
}

/**
 * Generates on `branch` as its own one-row step loop. Ends at an end-of-generation
 * token ('stop') or after `maxTokens` ('length'); the last token is accepted but not decoded, as
 * the Scheduler does, so the branch ends where plain generation ends.
 * @param {any} branch
 * @param {any} ctx the branch's context
 * @param {any} options
 * @returns {Promise<import('../types').BranchGenerateResult>}
 */
async function generate(branch, ctx, options = {}) {
  const store = storeOver(ctx);
  const { maxTokens, speculative, signal, onToken, history } = checkGenerateOptions(options);
  const spec = checkSpeculative(speculative, 'generate');
  if (spec && typeof spec.source.checkVocabulary === 'function') spec.source.checkVocabulary(ctx);
  const cost = spec ? stepCostFor(ctx, spec.source) : null;
  const length = spec ? new DraftLength({ ...spec, cost }) : null;
  const drafter = spec ? spec.source.open(history) : null;
  const speculation = spec ? { ctx, spec: { source: spec.source, cost } } : null;
  /** @type {number[]} */
  const tokens = [];
  let text = '';
  const keep = (/** @type {any} */ p) => {
    tokens.push(p.token);
    text += p.text;
    if (onToken) onToken({ token: p.token, text: p.text });
  };
  /** @type {'stop' | 'length'} */
  let finishReason = 'length';
  let carried; // the token a speculative step sampled after the accepted draft: taken next
  try {
    for (;;) {
      if (signal && signal.aborted) throw makeError('ERR_ABORTED', 'generate was aborted');
      const [produced] = produceAll(store, [{ branch, owner: branch, carried }]);
      carried = undefined;
      if (produced instanceof Error) throw produced;
      if (produced.isStop) {
        finishReason = 'stop';
        break;
      }
      keep(produced);
      if (tokens.length >= maxTokens) {
        branch.accept(produced.token); // counted in the perplexity; nothing samples after it
        break;
      }
      // The draft never reaches the last token: it comes from `next`, accepted without a decode.
      const limit = maxTokens - tokens.length - 1;
      const commit = {
        branch,
        owner: branch,
        token: produced.token,
        spec: drafter ? { drafter, length, limit } : undefined,
      };
      const { outcomes, applied } = await commitRows(store, [commit], speculation);
      const [outcome] = outcomes;
      if (outcome.error) throw outcome.error;
      if (outcome.verified) {
        const { accepted, next } = outcome.verified;
        for (const p of accepted) keep(p);
        drafter.accept([produced.token, ...accepted.map((p) => p.token)]);
        carried = next || undefined;
      }
      applied();
    }
  } finally {
    if (drafter) drafter.close();
  }
  const stats = length
    ? { drafted: length.drafted, accepted: length.accepted, steps: length.steps }
    : { drafted: 0, accepted: 0, steps: tokens.length };
  return { tokens, text, finishReason, speculative: stats };
}

module.exports = { generate };
