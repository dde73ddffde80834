'use strict';

const assert = require('node:assert/strict');
const { Branch, BranchStore } = require('..');
const { open, rejects } = require('./helpers');

function run(n, offset) {
  return Array.from({ length: n }, (_, i) => 1000 + ((i * 131 + offset) % 30000));
}

function snapshot(ctx, store, branches) {
  return {
    pressure: store.kvPressure(),
    branches: branches.map((b) => ({
      position: b.position,
      posMax: ctx.kvSeqPosMax(b.seqId),
      perplexity: b.perplexity,
      logits: b.getLogits(),
    })),
  };
}

function assertUnchanged(ctx, store, branches, before, what) {
  const after = snapshot(ctx, store, branches);
  assert.deepEqual(after.pressure, before.pressure, `${what}: kvPressure`);
  after.branches.forEach((b, i) => {
    const was = before.branches[i];
    assert.equal(b.position, was.position, `${what}: branch ${i} position`);
    assert.equal(b.posMax, was.posMax, `${what}: branch ${i} KV`);
    assert.equal(b.posMax, b.position - 1, `${what}: branch ${i} KV mirrors its position`);
    assert.ok(Object.is(b.perplexity, was.perplexity), `${what}: branch ${i} perplexity`);
    assert.deepEqual(b.logits, was.logits, `${what}: branch ${i} logits snapshot`);
  });
}

describe('KV exhaustion', function () {
  it('a full cache makes commit and prefill fail with ERR_KV_FULL and exact rollback; pruning frees space', async () => {
    const ctx = await open({ nSeqMax: 4, nCtx: 256, nBatch: 64, nThreads: 1 });
    try {
      const nCtx = ctx.nCtx;
      const store = new BranchStore(ctx);
      // nBatch 4 per branch: a prefill runs as several decodes, so a late chunk can be the one that fails
      const root = Branch.create(ctx, 0, { temperature: 0 }, 4);
      await store.prefill([[root, run(100, 0)]]);
      await root.commit(root.produce().token); // finite perplexity to compare
      const a = root.fork();
      const b = root.fork();
      const c = root.fork();
      a.reseedSampler(1);
      await store.prefill([
        [a, run(60, 1)],
        [b, run(60, 2)],
        [c, run(29, 3)],
      ]);
      const all = [root, a, b, c];
      assert.equal(nCtx, 256);
      assert.equal(store.kvPressure().cellsUsed, 101 + 149);
      assert.equal(store.kvPressure().remaining, 6);

      // A 10-token prefill in chunks of 4: the first chunk fits, the second does not, and the
      // first one's cells must be removed again.
      let before = snapshot(ctx, store, all);
      await rejects(() => a.prefill(run(10, 4)), 'ERR_KV_FULL', /prune|nCtx/);
      assertUnchanged(ctx, store, all, before, 'multi-chunk prefill');

      // 1 cell left after these; then a 2-branch commit decodes its first token (fits) and
      // fails on the second: the first must be rolled back too.
      await store.prefill([[c, run(4, 8)]]);
      await a.commit(a.produce().token);
      before = snapshot(ctx, store, all);
      assert.equal(before.pressure.remaining, 1);
      const [t1, t2] = store.produce([b, c]).map((p) => p.token);
      await rejects(
        () =>
          store.commit([
            [b, t1],
            [c, t2],
          ]),
        'ERR_KV_FULL',
      );
      assertUnchanged(ctx, store, all, before, 'two-branch commit');
      // a multi-branch prefill that would need more than the free cell
      await rejects(
        () =>
          store.prefill([
            [b, run(3, 5)],
            [c, run(3, 6)],
          ]),
        'ERR_KV_FULL',
      );
      assertUnchanged(ctx, store, all, before, 'store.prefill');

      // the last free cell still works, then the cache is exactly full
      await c.commit(c.produce().token);
      assert.deepEqual(store.kvPressure(), { nCtx, cellsUsed: nCtx, remaining: 0 });
      before = snapshot(ctx, store, all);
      await rejects(() => root.commit(root.produce().token), 'ERR_KV_FULL');
      await rejects(() => a.decodeAndCaptureOne(5), 'ERR_KV_FULL');
      assertUnchanged(ctx, store, all, before, 'full cache');

      // pruning frees b's own 60 cells (the shared prefix stays): generation continues
      await b.prune();
      assert.equal(store.kvPressure().remaining, 60);
      for (let i = 0; i < 5; i++) {
        const produced = store.produce([root, a, c]);
        await store.commit([
          [root, produced[0].token],
          [a, produced[1].token],
          [c, produced[2].token],
        ]);
      }
      for (const x of [root, a, c]) assert.equal(ctx.kvSeqPosMax(x.seqId), x.position - 1);
      assert.equal(store.kvPressure().remaining, 45);
      await a.prefill(run(40, 7));
      assert.equal(store.kvPressure().remaining, 5);
    } finally {
      ctx.dispose();
    }
  });

  it('a branch at position nCtx fails with ERR_KV_FULL before decoding', async () => {
    const ctx = await open({ nSeqMax: 2, nCtx: 256, nBatch: 256, nThreads: 1 });
    try {
      const store = new BranchStore(ctx);
      const root = Branch.create(ctx, 0, { temperature: 0 });
      await root.prefill(run(ctx.nCtx - 1, 0));
      await root.commit(root.produce().token);
      assert.equal(root.position, ctx.nCtx);
      const before = snapshot(ctx, store, [root]);
      await rejects(() => root.commit(root.produce().token), 'ERR_KV_FULL', /nCtx/);
      await rejects(() => root.prefill([5]), 'ERR_KV_FULL', /nCtx/);
      assertUnchanged(ctx, store, [root], before, 'at nCtx');
      // retainOnly keeps it; pruning it empties the cache and a new root generates again
      await root.prune();
      assert.equal(store.kvPressure().cellsUsed, 0);
      const next = Branch.create(ctx, 0, { temperature: 0 });
      await next.prefill(run(8, 1));
      await next.commit(next.produce().token);
      assert.equal(next.position, 9);
    } finally {
      ctx.dispose();
    }
  });
});
