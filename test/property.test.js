'use strict';

const assert = require('node:assert/strict');
const { Branch } = require('..');
const { open } = require('./helpers');
const { runRandomOps } = require('./random-ops');

// Seeded: a failure names its seed and step; rerun it with PROPERTY_SEED (and the soak script for
// long runs: `npm run soak -- <seed> <steps>`).
const SEED = Number(process.env.PROPERTY_SEED || 20261123);
const STEPS = Number(process.env.PROPERTY_STEPS || 2000);

describe('randomised operation sequences (fast-check, seeded)', function () {
  it(`${STEPS} random create/fork/prune/pruneSubtree/retainOnly/commit/prefill/produce/destroy/abort steps keep every invariant (seed ${SEED})`, async function () {
    this.timeout(900000); // minutes when other processes share the two CPUs
    // A small nCtx so the cache fills up and ERR_KV_FULL paths run too.
    // One thread: ggml's spinning thread barrier is very slow when other processes share the CPUs.
    const ctx = await open({ nSeqMax: 8, nCtx: 256, nBatch: 32, nThreads: 1 });
    const started = Date.now();
    let result;
    try {
      result = await runRandomOps(ctx, { seed: SEED, steps: STEPS });
    } catch (e) {
      ctx.dispose();
      throw e;
    }
    const { stats, model } = result;
    console.log(
      `      ${stats.steps} steps in ${((Date.now() - started) / 1000).toFixed(1)} s; ${JSON.stringify(stats.byKind)}; kvFull ${stats.kvFull}, noFreeSequence ${stats.noFreeSequence}, aborted ${stats.aborted}`,
    );
    assert.equal(stats.steps, STEPS);
    assert.ok(stats.kvFull > 0, 'the run should reach ERR_KV_FULL at least once');
    assert.ok(stats.noFreeSequence > 0, 'the run should exhaust the leases at least once');
    // Disposing the whole context at the end: every wrapper then refuses cleanly.
    const survivors = [...model.live.keys()];
    ctx.dispose();
    ctx.dispose();
    for (const b of survivors) {
      assert.throws(
        () => b.position,
        (e) => e.code === 'ERR_CONTEXT_DISPOSED',
      );
      await assert.rejects(b.commit(1), (e) => e.code === 'ERR_CONTEXT_DISPOSED');
      await b.prune(); // freeing a branch of a disposed context is a no-op, never a crash
    }
    assert.throws(
      () => Branch.create(ctx, 0),
      (e) => e.code === 'ERR_CONTEXT_DISPOSED',
    );
  });
});
