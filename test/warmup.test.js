'use strict';

// The warm-up of a context (lib/warmup.js, src/engine/warmup.rs): its mechanics on the CPU, where
// `'auto'` leaves it off and `warmup: true` or an object turns it on. What it is for — no
// first-use stall at a new batch size on a GPU — is tested on a Vulkan device in the GPU tier
// (test/gpu/vulkan.test.js) and measured by bench/gpu-steps.js.

const assert = require('node:assert/strict');
const { Branch, BranchStore, createContext, createServer } = require('..');
const { MODEL, open, rejects } = require('./helpers');

describe('warm-up', function () {
  this.timeout(120000);

  it("is off on the CPU by default ('auto'), and ready resolves at once", async () => {
    const ctx = await open();
    try {
      assert.deepEqual(ctx.warmup, { state: 'off', done: 0, total: 0, ms: 0, sizes: [] });
      assert.equal((await ctx.ready).state, 'off');
    } finally {
      ctx.dispose();
    }
  });

  it('decodes each size once, reports progress, and leaves no cell and no lease behind', async () => {
    const progress = [];
    const ctx = await open({
      nSeqMax: 4,
      nCtx: 512,
      warmup: { maxTokens: 20, onProgress: (s) => progress.push(s.done) },
    });
    try {
      assert.equal(ctx.warmup.state, 'warming');
      // The program's own work may be queued meanwhile: it runs between the warm-up's decodes.
      const root = Branch.create(ctx, 0, { temperature: 0 });
      await root.prefill(await ctx.tokenize('The warm-up runs beside this'));
      const status = await ctx.ready;
      assert.equal(status.state, 'ready');
      const expected = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 20];
      assert.deepEqual(
        status.sizes.map((s) => s.tokens),
        expected,
      );
      assert.equal(status.done, expected.length);
      assert.equal(status.total, expected.length);
      assert.ok(
        status.sizes.every((s) => s.ms > 0),
        'every size ran (none skipped)',
      );
      assert.ok(status.ms >= Math.floor(status.sizes.reduce((t, s) => t + s.ms, 0)) - expected.length);
      assert.deepEqual(
        progress,
        expected.map((_, i) => i + 1),
      );
      // The scratch sequence was cleared; the root's cells are untouched.
      const rootTokens = root.position;
      for (let seq = 1; seq < 4; seq++) assert.equal(ctx.kvSeqPosMax(seq), -1, `seq ${seq} holds no cells`);
      assert.equal(ctx.kvSeqPosMax(0), rootTokens - 1);
      // Leases are handed out in the same order as on a context that never warmed up.
      const store = new BranchStore(ctx);
      const kids = [await root.fork(), await root.fork(), await root.fork()];
      assert.deepEqual(
        kids.map((k) => k.seqId),
        [1, 2, 3],
      );
      // And the branches still generate.
      const tokens = kids.map((k) => k.produce().token);
      await store.commit(kids.map((k, i) => [k, tokens[i]]));
      assert.equal(kids[0].position, rootTokens + 1);
      await root.pruneSubtree();
    } finally {
      ctx.dispose();
    }
  });

  it('decodes small batches again after a longer cache, and clears it', async () => {
    const ctx = await open({ nSeqMax: 2, nCtx: 2048, warmup: { maxTokens: 4, cacheLengths: [1024] } });
    try {
      const status = await ctx.ready;
      assert.equal(status.state, 'ready');
      assert.deepEqual(
        status.sizes.map((s) => [s.tokens, s.after]),
        [
          [1, 0],
          [2, 0],
          [3, 0],
          [4, 0],
          [1, 1024],
          [2, 1024],
          [4, 1024],
        ],
      );
      assert.ok(status.sizes.every((s) => s.ms > 0));
      assert.equal(ctx.kvSeqPosMax(0), -1);
      assert.equal(ctx.kvSeqPosMax(1), -1);
    } finally {
      ctx.dispose();
    }
  });

  it('skips a size it has no free sequence for, and touches no leased cell', async () => {
    const ctx = await open({ nSeqMax: 1, nCtx: 256, warmup: { maxTokens: 4 } });
    try {
      // The only sequence is leased right away: the sizes after that find no scratch sequence.
      const b = Branch.create(ctx, 0, { temperature: 0 });
      await b.prefill(await ctx.tokenize('Only one sequence here'));
      const status = await ctx.ready;
      assert.equal(status.state, 'ready');
      assert.equal(status.sizes.length, 4);
      assert.equal(status.sizes[3].ms, -1, 'the last size was skipped');
      assert.ok(status.sizes.every((s) => s.ms === -1 || s.ms > 0));
      assert.equal(ctx.kvSeqPosMax(0), b.position - 1);
    } finally {
      ctx.dispose();
    }
  });

  it('is cancelled, not failed, when the context is disposed first', async () => {
    const ctx = await open({ nCtx: 512, warmup: { maxTokens: 64 } });
    ctx.dispose();
    const status = await ctx.ready;
    assert.equal(status.state, 'cancelled');
    assert.ok(status.done < status.total);
  });

  it('rejects bad options with ERR_INVALID_ARG', async () => {
    for (const warmup of [
      'yes',
      0,
      { maxTokens: 0 },
      { maxTokens: 1.5 },
      { onProgress: 'x' },
      { cacheLengths: [0] },
      [1],
    ]) {
      await rejects(() => createContext({ modelPath: MODEL, warmup }), 'ERR_INVALID_ARG', /options\.warmup/);
    }
  });

  it('the server answers /health with 503 "warming up" until the warm-up is over', async () => {
    const server = await createServer({
      modelPath: MODEL,
      nCtx: 1024,
      nThreads: 2,
      parallel: 2,
      ui: false,
      warmup: { maxTokens: 64 },
    });
    try {
      const { url } = await server.listen(0, '127.0.0.1');
      const first = await fetch(`${url}/health`);
      const body = await first.json();
      assert.equal(first.status, 503);
      assert.equal(body.status, 'warming up');
      assert.equal(body.warmup.state, 'warming');
      assert.ok(body.warmup.total > 0);
      await server.ctx.ready;
      const after = await fetch(`${url}/health`);
      const done = await after.json();
      assert.equal(after.status, 200);
      assert.equal(done.status, 'ok');
      assert.equal(done.warmup.state, 'ready');
      assert.equal(done.warmup.done, done.warmup.total);
    } finally {
      await server.close();
    }
  });
});
