'use strict';

const assert = require('node:assert/strict');
const { Branch, BranchStore } = require('..');
const { open } = require('./helpers');
const { nativeOf } = require('../lib/Context'); // internals, for checks the public API cannot make

const MiB = 2 ** 20;

function rss() {
  global.gc();
  global.gc();
  return process.memoryUsage().rss;
}

/** Lets FinalizationRegistry callbacks run after a collection. */
async function collect() {
  for (let i = 0; i < 4; i++) {
    global.gc();
    await new Promise((r) => setImmediate(r));
  }
}

describe('resource lifetime', function () {
  before(function () {
    assert.equal(typeof global.gc, 'function', 'mocha must run with --expose-gc (.mocharc.json)');
  });

  it('10,000 fork/prune cycles keep RSS flat', async () => {
    const ctx = await open({ nSeqMax: 4, nCtx: 256, nThreads: 1 });
    try {
      const store = new BranchStore(ctx);
      const root = Branch.create(ctx, 0, { temperature: 0 });
      await root.prefill(await ctx.tokenize('Leak check'));
      // warm up allocator caches before the baseline
      for (let i = 0; i < 500; i++) await root.fork().prune();
      const before = rss();
      const started = Date.now();
      for (let i = 0; i < 10000; i++) {
        const child = root.fork();
        if (i % 1000 === 0) await store.commit([[child, child.produce().token]]); // some cycles write KV
        await child.prune();
      }
      const growth = (rss() - before) / MiB;
      console.log(
        `      10,000 fork/prune cycles in ${Date.now() - started} ms; RSS growth ${growth.toFixed(1)} MiB (${((growth * 1024) / 10000).toFixed(2)} KiB per cycle)`,
      );
      // A fork copies a 1 MiB logits snapshot: leaking it (or the sampler chain) would grow RSS by
      // gigabytes here. 32 MiB covers allocator noise.
      assert.ok(growth < 32, `RSS grew ${growth.toFixed(1)} MiB over 10,000 cycles`);
      assert.equal(store.available, 3);
      assert.equal(store.kvPressure().cellsUsed, root.position);
    } finally {
      ctx.dispose();
    }
  });

  it('1,000 context create/dispose cycles keep RSS bounded', async () => {
    // One context stays open so the model stays loaded (contexts on one file share it).
    const keep = await open({ nSeqMax: 1, nCtx: 256, nThreads: 1 });
    try {
      for (let i = 0; i < 50; i++) (await open({ nSeqMax: 2, nCtx: 256, nThreads: 1 })).dispose();
      const before = rss();
      const started = Date.now();
      const samples = [];
      for (let i = 1; i <= 1000; i++) {
        const ctx = await open({ nSeqMax: 2, nCtx: 256, nThreads: 1 });
        if (i % 100 === 0) {
          const b = Branch.create(ctx, 0, { temperature: 0 });
          await b.prefill([2, 100, 200]);
        }
        ctx.dispose();
        if (i % 250 === 0) samples.push(((rss() - before) / MiB).toFixed(1));
      }
      const growth = (rss() - before) / MiB;
      console.log(
        `      1,000 create/dispose cycles in ${Date.now() - started} ms; RSS growth ${growth.toFixed(1)} MiB (after 250/500/750/1000: ${samples.join(' / ')} MiB)`,
      );
      // A leaked llama.cpp context (KV cache + compute buffers, several MiB each) would add
      // gigabytes over 1,000 cycles.
      assert.ok(growth < 400, `RSS grew ${growth.toFixed(1)} MiB over 1,000 cycles`);
      assert.equal(keep.disposed, false);
    } finally {
      keep.dispose();
    }
  });

  it('Branch objects dropped without prune are reclaimed after GC', async () => {
    const ctx = await open({ nSeqMax: 8, nCtx: 512, nThreads: 1 });
    try {
      const store = new BranchStore(ctx);
      const root = Branch.create(ctx, 0, { temperature: 0 });
      await root.prefill(await ctx.tokenize('Dropped branches'));
      (() => {
        for (let i = 0; i < 7; i++) root.fork(); // wrappers dropped at once
      })();
      assert.equal(store.available, 0);
      await collect();
      // the next operation that needs a lease frees the collected branches first
      const fresh = root.fork();
      assert.deepEqual(nativeOf(ctx)._storeLiveHandles().sort(), [root.handle, fresh.handle].sort());
      assert.equal(store.available, 6);
      await store.commit([
        [root, root.produce().token],
        [fresh, fresh.produce().token],
      ]);
      assert.equal(store.kvPressure().cellsUsed, root.position + 1);
      // many rounds: leases never run out although nothing is pruned explicitly
      for (let round = 0; round < 20; round++) {
        (() => {
          for (let i = 0; i < 6; i++) root.fork();
        })();
        await collect();
        root.fork(); // must not throw ERR_NO_FREE_SEQUENCE
        await collect();
      }
    } finally {
      ctx.dispose();
    }
  });

  it('dispose() while operations are in flight: the running one settles cleanly, queued ones reject ERR_CONTEXT_DISPOSED', async () => {
    for (let trial = 0; trial < 5; trial++) {
      const ctx = await open({ nSeqMax: 2, nCtx: 1024, nBatch: 64, nThreads: 1 });
      const root = Branch.create(ctx, 0, { temperature: 0 });
      await root.prefill(await ctx.tokenize('Dispose while busy'));
      const running = root.prefill(Array.from({ length: 256 }, (_, i) => 1000 + i));
      const queued = [ctx.decode([5, 6, 7], 0, 1), root.commit(100), ctx.tokenize('later')];
      await new Promise((r) => setTimeout(r, trial * 20));
      ctx.dispose();
      ctx.dispose(); // idempotent
      const settled = await Promise.allSettled([running, ...queued]);
      const first = settled[0];
      assert.ok(
        first.status === 'fulfilled' || first.reason.code === 'ERR_CONTEXT_DISPOSED',
        `running op: ${first.reason && first.reason.message}`,
      );
      for (const s of settled.slice(1)) {
        assert.equal(s.status, 'rejected', 'a queued operation must not run after dispose');
        assert.equal(s.reason.code, 'ERR_CONTEXT_DISPOSED');
      }
      assert.throws(
        () => root.position,
        (e) => e.code === 'ERR_CONTEXT_DISPOSED',
      );
      await root.prune(); // no-op after dispose, never a crash
      await assert.rejects(ctx.decode([1], 0), (e) => e.code === 'ERR_CONTEXT_DISPOSED');
    }
    // the native state is freed by the worker after its last job; survive a collection too
    await collect();
    const again = await open({ nSeqMax: 1, nCtx: 256, nThreads: 1 });
    await again.decode(await again.tokenize('still fine'), 0);
    again.dispose();
  });
});
