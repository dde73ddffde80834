'use strict';

// Parked branches (issue 62, docs/api.md#parked-branches): a branch gives back its sequence and
// its own cells, and resumes exactly — under `deterministic: true` the same tokens and the same
// logits bit for bit as a branch that never parked — for roots, forks, forks of forks, a branch
// whose parent was parked and resumed with it, and after spilling to disk; every bad use is a
// coded error that changes nothing; and a search over more nodes than nSeqMax × 8 finds the same
// best path as the same search on a context that keeps every node live.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Branch, BranchStore } = require('..');
const { open, rejects, continueFor: steps } = require('./helpers');
const { projectorPath, projectorMissing, needWriter, png } = require('./helpers/images');

const PROMPT = 'A short history of the printing press: it began';
const storeOf = (ctx) => new BranchStore(ctx);

/**
 * root → a (2 tokens) → a2 (2 tokens); root → b (3 tokens). With `pause(branches)` between the
 * two halves (park and resume, or nothing), then 3 more steps of each; every token and the
 * final snapshots.
 */
async function tree(ctx, pause) {
  const root = Branch.create(ctx, 0, { temperature: 0 });
  await root.prefill(await ctx.tokenize(PROMPT));
  const a = root.fork();
  const b = root.fork();
  const first = [await steps(a, 2), await steps(b, 3)];
  const a2 = a.fork();
  first.push(await steps(a2, 2));
  const all = [root, a, a2, b];
  await pause(all);
  const after = [];
  for (const x of all) after.push(await steps(x, 3));
  const logits = all.map((x) => Buffer.from(x.getLogits().buffer).toString('base64'));
  const perplexity = all.map((x) => x.perplexity);
  await root.pruneSubtree();
  return { first, after, logits, perplexity };
}

describe('parked branches: park / resume', function () {
  this.timeout(240000);
  let ctx;
  let store;
  let tmp;
  let reference;

  before(async () => {
    ctx = await open({ deterministic: true, nCtx: 1024, nSeqMax: 5 });
    store = new BranchStore(ctx);
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-park-'));
    reference = await tree(ctx, async () => {});
  });
  after(() => {
    ctx?.dispose();
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('park gives back the lease and the own cells; resume continues bit for bit (root, forks, fork of a fork)', async () => {
    const got = await tree(ctx, async (all) => {
      const before = store.kvPressure().cellsUsed;
      // kvPressure(without): what pruning those would leave, nothing pruned (the same 7 cells).
      assert.equal(store.kvPressure(all.slice(1)).cellsUsed, before - 7);
      assert.equal(store.kvPressure([all[0]]).cellsUsed, before, 'the forks hold the prompt the root holds');
      assert.equal(store.kvPressure(all).cellsUsed, 0);
      assert.throws(() => store.kvPressure(/** @type {any} */ ('a')), { code: 'ERR_INVALID_ARG' });
      assert.equal(store.kvPressure().cellsUsed, before);
      await store.park(all.slice(1)); // a, a2, b: the root keeps the prompt's cells
      assert.deepEqual(
        all.map((x) => x.parked),
        [false, true, true, true],
      );
      assert.equal(store.kvPressure().cellsUsed, before - 7, 'the 7 own cells of a, a2 and b are gone');
      assert.equal(store.available, 4);
      assert.deepEqual(all[2].parkedInfo, { shared: all[1].parkedInfo.shared + 2, own: 2, file: null });
      assert.equal(all[1].parkedInfo.shared, all[0].position);
      assert.equal(all[1].seqId, -1);
      assert.ok(store.parkedBytes > 0);
      const resumed = await store.resume([all[2], all[3]]);
      assert.equal(resumed.length, 3);
      assert.ok(resumed.indexOf(all[1]) < resumed.indexOf(all[2]), "a2's parked parent comes back first");
      assert.equal(store.kvPressure().cellsUsed, before);
    });
    assert.deepEqual(got, reference);
  });

  it('a parked root and its parked children, resumed through a child', async () => {
    const got = await tree(ctx, async (all) => {
      await store.park(all);
      assert.equal(store.kvPressure().cellsUsed, 0);
      assert.equal(store.parkStats().parked, 4);
      await all[2].resume(); // root, a, a2
      assert.deepEqual(
        all.map((x) => x.parked),
        [false, false, false, true],
      );
      await all[3].resume();
    });
    assert.deepEqual(got, reference);
  });

  it('spilled to disk beyond the RAM budget, and back bit for bit; the files go with the branches', async () => {
    store.setParkSpill({ ramBytes: 0, dir: tmp });
    try {
      const got = await tree(ctx, async (all) => {
        await store.park(all);
        const stats = store.parkStats();
        assert.equal(stats.spilled, 4);
        assert.equal(stats.ramBytes, 0);
        assert.ok(stats.diskBytes > 4 * 4 * 10000, 'spill files hold the snapshots');
        assert.ok(all.every((x) => fs.existsSync(x.parkedInfo.file)));
        await store.resume(all);
        assert.equal(fs.readdirSync(tmp).length, 0);
      });
      assert.deepEqual(got, reference);
    } finally {
      store.setParkSpill();
    }
  });

  it('bad use is a coded error and changes nothing', async () => {
    const root = Branch.create(ctx, 0, { temperature: 0 });
    await root.prefill(await ctx.tokenize(PROMPT));
    const a = root.fork();
    await steps(a, 2);
    await a.park();
    const position = a.position;
    await rejects(() => a.commit(1), 'ERR_BRANCH_PARKED', /resume/);
    assert.throws(() => a.produce(), { code: 'ERR_BRANCH_PARKED' });
    assert.throws(() => a.fork(), { code: 'ERR_BRANCH_PARKED' });
    assert.throws(() => a.getLogits(), { code: 'ERR_BRANCH_PARKED' });
    await rejects(() => a.park(), 'ERR_BRANCH_PARKED');
    // No free sequence: refused whole.
    const others = [];
    for (let i = 0; i < 4; i++) others.push(root.fork());
    await rejects(() => a.resume(), 'ERR_NO_FREE_SEQUENCE');
    assert.equal(a.parked, true);
    for (const o of others) await o.prune();
    // A truncated spill file: ERR_STATE_CORRUPT, still parked; after a prune the file is gone.
    store.setParkSpill({ ramBytes: 0, dir: tmp });
    try {
      const b = root.fork();
      await steps(b, 1);
      await b.park();
      const file = b.parkedInfo.file;
      fs.truncateSync(file, fs.statSync(file).size - 16);
      await rejects(() => b.resume(), 'ERR_STATE_CORRUPT');
      assert.equal(b.parked, true);
      assert.equal(store.available, 4, 'the failed resume gave its sequence back');
      await b.prune();
      assert.equal(fs.existsSync(file), false);
    } finally {
      store.setParkSpill();
    }
    await rejects(() => root.resume(), 'ERR_INVALID_ARG', /not parked/);
    // A parent pruned while a parked child needs its cells: freed for the caller, kept parked
    // natively until the child is back (then freed for real).
    const p = root.fork();
    await steps(p, 1);
    const q = p.fork();
    await steps(q, 2);
    await q.park();
    const held = store.kvPressure().cellsUsed;
    await p.prune();
    assert.equal(p.disposed, true);
    assert.equal(store.kvPressure().cellsUsed, held - 1, "p's own cell left the cache");
    assert.deepEqual(await store.resume([q]), [q]);
    assert.equal(q.position, root.position + 3);
    await steps(q, 1);
    assert.throws(() => store.setParkSpill({ ramBytes: 1 }), { code: 'ERR_INVALID_ARG' });
    await a.resume();
    assert.equal(a.position, position);
    await steps(a, 1);
    await root.pruneSubtree();
    assert.equal(store.kvPressure().cellsUsed, 0);
  });
});

describe('parked branches: past the sliding window', function () {
  this.timeout(600000);

  it('a fork 2,000 tokens long resumes bit for bit (Gemma 3 keeps most layers in a 512-cell window)', async () => {
    const ctx = await open({ deterministic: true, nCtx: 4096, nBatch: 512, nSeqMax: 3 });
    try {
      const words = await ctx.tokenize('the quick brown fox jumps over the lazy dog '.repeat(250));
      const run = async (park) => {
        const root = Branch.create(ctx, 0, { temperature: 0 });
        await root.prefill(words.slice(0, 64));
        const child = root.fork();
        await child.prefill(words.slice(64, 2064));
        if (park) {
          await child.park();
          assert.deepEqual(child.parkedInfo, { shared: 64, own: 2000, file: null });
          await child.resume();
        }
        const tokens = await steps(child, 4);
        const logits = Buffer.from(child.getLogits().buffer).toString('base64');
        await root.pruneSubtree();
        return { tokens, logits };
      };
      assert.deepEqual(await run(true), await run(false));
    } finally {
      ctx.dispose();
    }
  });
});

describe('parked branches: an image in the prefix', function () {
  this.timeout(300000);
  if (projectorMissing()) return;

  it('a fork of an image prompt and a branch holding the image itself park and resume bit for bit', async () => {
    needWriter();
    const ctx = await open({ mmprojPath: projectorPath(), deterministic: true, nSeqMax: 4, nThreads: 1 });
    try {
      const prompt = await ctx.tokenizeParts(['Look at this picture: ', png(64, 48, { seed: 3 }), ' It shows']);
      const run = async (park) => {
        const root = Branch.create(ctx, 0, { temperature: 0 });
        await root.prefill(prompt);
        const a = root.fork();
        await steps(a, 2);
        if (park) {
          await storeOf(ctx).park([a, root]); // the root's cells hold the image
          assert.equal(storeOf(ctx).kvPressure().cellsUsed, 0);
          await a.resume(); // the root first, image and all
          assert.equal(root.parked, false);
        }
        const tokens = [await steps(a, 3), await steps(root, 2)];
        const logits = [a, root].map((x) => Buffer.from(x.getLogits().buffer).toString('base64'));
        assert.throws(() => root.forkAt(prompt.pieces[0].tokens.length + 1), { code: 'ERR_IMAGE_POSITIONS' });
        await root.pruneSubtree();
        return { tokens, logits };
      };
      assert.deepEqual(await run(true), await run(false));
    } finally {
      ctx.dispose();
    }
  });
});

describe('parked branches: a search bigger than the context', function () {
  this.timeout(600000);
  const { search } = require('../examples/park-search');

  it('over more nodes than nSeqMax × 8 finds the same best path as with every node live', async () => {
    const small = await open({ deterministic: true, nCtx: 1024, nSeqMax: 8 });
    const parked = await search(small, { prompt: PROMPT, width: 3, depth: 4, park: true });
    small.dispose();
    const big = await open({ deterministic: true, nCtx: 2048, nSeqMax: 128 });
    const live = await search(big, { prompt: PROMPT, width: 3, depth: 4, park: false });
    big.dispose();
    assert.equal(parked.nodes, 120);
    assert.ok(parked.nodes > 8 * 8);
    assert.deepEqual(parked.best, live.best);
    assert.ok(parked.peakLeases <= 8, `${parked.peakLeases} leases`);
    assert.ok(parked.peakCells < live.peakCells / 4, `${parked.peakCells} cells against ${live.peakCells}`);
  });
});
