'use strict';

/**
 * JS-side bookkeeping per SessionContext: the Branch wrappers alive on it (so that every
 * wrapper of a freed branch reports `disposed`), branches garbage-collected without prune
 * (freed at the next opportunity), and the tail of the async operation queue.
 */

const { makeError } = require('./errors');

const state = new WeakMap();

function stateOf(ctx) {
  let s = state.get(ctx);
  if (!s) {
    s = { wrappers: new Map(), orphans: [], tail: Promise.resolve() };
    state.set(ctx, s);
  }
  return s;
}

const collected = new FinalizationRegistry(({ ctxRef, handle }) => {
  const ctx = ctxRef.deref();
  if (ctx) stateOf(ctx).orphans.push(handle);
});

function nativeOf(ctx) {
  if (!ctx || typeof ctx._branchCreate !== 'function') {
    throw makeError('ERR_INVALID_ARG', 'expected a SessionContext from createContext()');
  }
  if (ctx.disposed) throw makeError('ERR_CONTEXT_DISPOSED', 'Context has been disposed; create a new one with createContext()');
  return ctx;
}

function registerBranch(ctx, branch) {
  stateOf(ctx).wrappers.set(branch._handle, new WeakRef(branch));
  collected.register(branch, { ctxRef: new WeakRef(ctx), handle: branch._handle }, branch);
}

/** Marks the wrappers of natively freed handles as disposed. */
function wrapFreed(ctx, handles) {
  const s = stateOf(ctx);
  for (const h of handles || []) {
    const w = s.wrappers.get(h)?.deref();
    if (w) {
      w._disposed = true;
      collected.unregister(w);
    }
    s.wrappers.delete(h);
  }
  return handles;
}

/** Prunes branches whose wrappers were collected without prune (when the context is idle). */
function flushOrphans(ctx) {
  const s = stateOf(ctx);
  if (s.orphans.length === 0 || ctx._pending !== 0) return;
  const orphans = s.orphans.splice(0);
  for (const h of orphans) {
    if (s.wrappers.get(h)?.deref()) continue; // handle reused by a live wrapper
    s.wrappers.delete(h);
    try {
      ctx._branchPrune(h);
    } catch (e) {
      if (e.code !== 'ERR_BRANCH_DISPOSED') throw e;
    }
  }
}

/** Remembers `promise` as the latest queued operation; returns a promise for "after it". */
function track(ctx, promise) {
  const s = stateOf(ctx);
  if (promise === null) return s.tail;
  s.tail = promise.then(() => undefined, () => undefined);
  return promise;
}

module.exports = { nativeOf, registerBranch, wrapFreed, flushOrphans, track, stateOf };
