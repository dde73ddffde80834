'use strict';

// Stand-ins the model-free unit tests share.

/** A stand-in for a Branch: a position and a prune that records itself. */
function fakeBranch(position, pruned = []) {
  return {
    position,
    disposed: false,
    prune() {
      this.disposed = true;
      pruned.push(this);
      return Promise.resolve();
    },
    fork() {
      return fakeBranch(this.position, pruned);
    },
    forkAt(p) {
      return fakeBranch(p, pruned);
    },
  };
}

/** The integers from `from` up to `to` (excluded). */
const range = (from, to) => Array.from({ length: to - from }, (_, i) => from + i);

module.exports = { fakeBranch, range };
