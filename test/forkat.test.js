'use strict';

// branch.forkAt(position): a child that shares only the parent's cells below `position` (prefix
// reuse: a cached system prompt forked for a different question). Checked against a cold
// prefill of the same tokens — with a shared prefix longer than Gemma 3's sliding window, so
// the window's cells of the shared part must be right too. Batch shapes differ between the two
// paths, so the comparison is top-k agreement and a logit tolerance, not exact equality.

const assert = require('node:assert/strict');
const { Branch, BranchStore } = require('..');
const { open, throwsSync, argmax, topK } = require('./helpers');

describe('Branch.forkAt: prefix reuse', function () {
  this.timeout(240000);
  let ctx;

  before(async () => {
    ctx = await open({ nCtx: 4096, nSeqMax: 4, nBatch: 512 });
  });

  after(() => ctx && ctx.dispose());

  async function prompts(repeat) {
    const shared = await ctx.tokenize(
      'You are a careful assistant who answers questions about geography. '.repeat(repeat),
    );
    const cachedQuestion = await ctx.tokenize(' Question: what is the capital of Italy? Answer:', false);
    const newQuestion = await ctx.tokenize(' Question: what is the capital of France? Answer:', false);
    return { shared, cachedQuestion, newQuestion };
  }

  it('a child at a shared prefix, prefilled with a new suffix, matches a cold prefill of the same tokens', async () => {
    const { shared, cachedQuestion, newQuestion } = await prompts(12);
    assert.ok(shared.length + cachedQuestion.length < 512, "inside Gemma 3's 512-position window");
    const cached = Branch.create(ctx, 0, { temperature: 0 });
    await cached.prefill([...shared, ...cachedQuestion]);
    const before = new BranchStore(ctx).kvPressure().cellsUsed;

    const reused = cached.forkAt(shared.length);
    assert.equal(reused.position, shared.length);
    throwsSync(() => reused.produce(), 'ERR_NO_LOGITS');
    assert.equal(new BranchStore(ctx).kvPressure().cellsUsed, before, 'the shared prefix is not copied');
    await reused.prefill(newQuestion);
    assert.equal(reused.position, shared.length + newQuestion.length);
    assert.equal(ctx.kvSeqPosMax(reused.seqId), reused.position - 1);
    assert.equal(new BranchStore(ctx).kvPressure().cellsUsed, before + newQuestion.length);

    const cold = Branch.create(ctx, 0, { temperature: 0 });
    await cold.prefill([...shared, ...newQuestion]);
    const a = reused.getLogits();
    const b = cold.getLogits();
    assert.equal(argmax(a), argmax(b), 'same greedy token');
    const overlap = topK(a, 10).filter((t) => topK(b, 10).includes(t)).length;
    assert.ok(overlap >= 8, `top-10 overlap ${overlap}`);
    let maxDelta = 0;
    for (const t of topK(b, 50)) maxDelta = Math.max(maxDelta, Math.abs(a[t] - b[t]));
    assert.ok(maxDelta < 1.5, `max |Δlogit| over the top 50: ${maxDelta}`);
    assert.equal(reused.produce().text, cold.produce().text);

    await cached.prune();
    assert.equal(ctx.kvSeqPosMax(reused.seqId), reused.position - 1, 'pruning the source keeps the shared cells');
    await reused.commit(reused.produce().token);
    await Promise.all([reused.prune(), cold.prune()]);
    assert.equal(new BranchStore(ctx).kvPressure().cellsUsed, 0);
  });

  it('past the sliding window: refused with ERR_UNSUPPORTED; a branch kept at the prefix still forks exactly', async () => {
    const { shared, cachedQuestion, newQuestion } = await prompts(60);
    assert.ok(shared.length > 600, `shared prefix of ${shared.length} tokens spans Gemma 3's 512-position window`);
    // What a prefix cache keeps: a branch stopped at the shared prefix, and one that went on.
    const prefix = Branch.create(ctx, 0, { temperature: 0 });
    await prefix.prefill(shared);
    const full = prefix.fork();
    await full.prefill(cachedQuestion);
    throwsSync(() => full.forkAt(shared.length), 'ERR_UNSUPPORTED');
    const reused = prefix.forkAt(shared.length); // its own position: a plain fork
    await reused.prefill(newQuestion);
    const cold = Branch.create(ctx, 0, { temperature: 0 });
    await cold.prefill([...shared, ...newQuestion]);
    assert.equal(argmax(reused.getLogits()), argmax(cold.getLogits()));
    const overlap = topK(reused.getLogits(), 10).filter((t) => topK(cold.getLogits(), 10).includes(t)).length;
    assert.ok(overlap >= 8, `top-10 overlap ${overlap}`);
    await prefix.pruneSubtree();
    await cold.prune();
  });

  it('at its own position it is a plain fork; past it or below 0 it is refused', async () => {
    const root = Branch.create(ctx, 0, { temperature: 0 });
    await root.prefill(await ctx.tokenize('Hello there'));
    const same = root.forkAt(root.position);
    assert.deepEqual(Array.from(same.getLogits()), Array.from(root.getLogits()));
    throwsSync(() => root.forkAt(root.position + 1), 'ERR_INVALID_ARG');
    throwsSync(() => root.forkAt(-1), 'ERR_INVALID_ARG');
    throwsSync(() => root.forkAt('3'), 'ERR_INVALID_ARG');
    const early = root.forkAt(1);
    assert.equal(early.position, 1);
    assert.equal(ctx.kvSeqPosMax(early.seqId), 0);
    throwsSync(() => early.produce(), 'ERR_NO_LOGITS');
    await root.pruneSubtree();
    assert.equal(same.disposed && early.disposed, true);
  });
});
