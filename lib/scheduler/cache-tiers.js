'use strict';

/**
 * What the prefix cache's tiers below the KV cells are made of (./prefix-cache.js holds the
 * policy): the checked `cacheRam`, `cacheDir` and `cacheDisk` (./options.js), and a context's
 * natives: a branch's sequence state copied out (`_branchStateSync`, synchronous: before the
 * evicted branch is freed), a state restored as a new root branch (`_branchRestore`), and the
 * fingerprint its files carry (./cache-file.js).
 */

const { nativeOf } = require('../Context');
const { fingerprintOf } = require('./cache-file');

/**
 * The tiers of a scheduler on `ctx` (its checked `cacheRam`, `cacheDir`, `cacheDisk`,
 * `onCacheWarning`), for `new PrefixCache({ tiers })`. `wrapBranch(handle)`: the Branch of a
 * restored root branch (the Scheduler's, which may build Branches).
 * @param {import('../Context').SessionContext} ctx
 * @param {{ ramBytes: number, dir: string | null, diskBytes: number, warn: (message: string) => void }} options
 * @param {(handle: number) => any} wrapBranch
 * @returns {import('./prefix-cache').Tiers}
 */
function tiersOn(ctx, options, wrapBranch) {
  const native = nativeOf(ctx);
  return {
    ...options,
    fingerprint: fingerprintOf(ctx),
    maxTokens: ctx.nCtx,
    copyState: (branch) => (ctx.disposed ? null : native._branchStateSync(branch.handle)),
    restoreState: async (state, keep) => wrapBranch(await native._branchRestore(state, keep)),
  };
}

module.exports = { tiersOn };
