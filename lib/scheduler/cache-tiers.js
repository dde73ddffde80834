'use strict';

/**
 * What the prefix cache's tiers below the KV cells are made of (./prefix-cache.js holds the
 * policy): the checked `cacheRam`, `cacheDir` and `cacheDisk` (./options.js), and a context's
 * natives: a branch's sequence state copied out (`_branchStateSync`, synchronous: before the
 * evicted branch is freed), a state restored as a new root branch (`_branchRestore`), and the
 * fingerprint its files carry (./cache-file.js).
 */

const { nativeOf } = require('../Context');
const { adoptBranch } = require('../Branch');
const { fingerprintOf } = require('./cache-file');

/**
 * The tiers of a scheduler on `ctx` (its checked `cacheRam`, `cacheDir`, `cacheDisk`,
 * `onCacheWarning`), for `new PrefixCache({ tiers })`; a restored root branch is wrapped as a
 * Branch of `ctx` (`adoptBranch`).
 * @param {import('../Context').SessionContext} ctx
 * @param {{ ramBytes: number, dir: string | null, diskBytes: number, warn: (message: string) => void }} options
 * @returns {import('./prefix-cache').Tiers}
 */
function tiersOn(ctx, options) {
  const native = nativeOf(ctx);
  return {
    ...options,
    fingerprint: fingerprintOf(ctx),
    maxTokens: ctx.nCtx,
    copyState: (branch) => (ctx.disposed ? null : native._branchStateSync(branch.handle)),
    restoreState: async (state, keep, images) =>
      adoptBranch(ctx, await native._branchRestore(state, keep, images.length > 0 ? images : undefined), 0),
  };
}

module.exports = { tiersOn };
