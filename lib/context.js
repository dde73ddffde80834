'use strict';

/**
 * JS-side bookkeeping per SessionContext: the Branch wrappers alive on it, so that every wrapper
 * of a freed branch reports `disposed`. Ordering is the native worker's job: a branch
 * garbage-collected without prune is handed to it (`_branchRelease`) and freed in call order.
 */

const { makeError } = require('./errors');

const wrappersOf = new WeakMap();

function wrappers(ctx) {
  let map = wrappersOf.get(ctx);
  if (!map) {
    map = new Map();
    wrappersOf.set(ctx, map);
  }
  return map;
}

const collected = new FinalizationRegistry(({ ctxRef, handle }) => {
  const ctx = ctxRef.deref();
  if (!ctx || ctx.disposed) return;
  wrappers(ctx).delete(handle);
  ctx._branchRelease(handle);
});

/**
 * The native context behind `ctx`, typed by the generated lib/native.d.ts.
 * @param {any} ctx
 * @returns {import('./native').SessionContext}
 */
function nativeOf(ctx) {
  if (!ctx || typeof ctx._branchCreate !== 'function') {
    throw makeError('ERR_INVALID_ARG', 'expected a SessionContext from createContext()');
  }
  if (ctx.disposed) ctx._throwCoded('ERR_CONTEXT_DISPOSED');
  return /** @type {import('./native').SessionContext} */ (ctx);
}

function registerBranch(ctx, branch) {
  wrappers(ctx).set(branch._handle, new WeakRef(branch));
  collected.register(branch, { ctxRef: new WeakRef(ctx), handle: branch._handle }, branch);
}

/** Marks the wrappers of natively freed handles as disposed. */
function wrapFreed(ctx, handles) {
  const map = wrappers(ctx);
  for (const h of handles || []) {
    const w = map.get(h)?.deref();
    if (w) {
      w._disposed = true;
      collected.unregister(w);
    }
    map.delete(h);
  }
  return handles;
}

module.exports = { nativeOf, registerBranch, wrapFreed };
