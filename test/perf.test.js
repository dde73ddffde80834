'use strict';

// The fast paths of a batched step (parallel row copies with the surprisal pass, vectorized
// log-sum-exp, blocked top-k, parallel store.produce) must give the same results as the plain
// definitions computed here in JS (f64).

const assert = require('node:assert/strict');
const { Branch, BranchStore } = require('..');
const { open, topK } = require('./helpers');

function logSumExp(logits) {
  let max = -Infinity;
  for (const x of logits) if (x > max) max = x;
  let sum = 0;
  for (const x of logits) sum += Math.exp(x - max);
  return max + Math.log(sum);
}

describe('Batched step fast paths', function () {
  this.timeout(600000);
  let ctx;
  let store;
  let prompt;

  before(async () => {
    ctx = await open({ nSeqMax: 8 });
    store = new BranchStore(ctx);
    prompt = await ctx.tokenize('The lighthouse keeper wrote in his log that the storm');
  });

  after(() => ctx && ctx.dispose());

  afterEach(async () => {
    await ctx.kvCacheClear();
  });

  async function root(params = { temperature: 0 }) {
    await ctx.decode(prompt, 0, 0);
    const r = Branch.create(ctx, prompt.length, params);
    r.captureLogits();
    return r;
  }

  it('perplexity equals exp(mean(logsumexp - logit)) of the snapshots, batched (parallel) and single', async () => {
    const r = await root();
    const branches = [r, r.fork(), r.fork(), r.fork(), r.fork()];
    const nll = branches.map(() => []);
    const first = topK(r.getLogits(), branches.length);
    let tokens = first;
    for (let step = 0; step < 4; step++) {
      branches.forEach((b, i) => {
        const logits = b.getLogits();
        nll[i].push(logSumExp(logits) - logits[tokens[i]]);
      });
      if (step === 2) {
        // one branch alone (the inline path), the rest batched
        await branches[0].commit(tokens[0]);
        await store.commit(branches.slice(1).map((b, i) => [b, tokens[i + 1]]));
      } else {
        await store.commit(branches.map((b, i) => [b, tokens[i]]));
      }
      tokens = store.produce(branches).map((p) => p.token);
    }
    branches.forEach((b, i) => {
      const expected = Math.exp(nll[i].reduce((a, x) => a + x, 0) / nll[i].length);
      assert.ok(Math.abs(b.perplexity - expected) <= 1e-4 * expected, `branch ${i}: ${b.perplexity} vs ${expected}`);
    });
    await r.pruneSubtree();
  });

  it('entropy matches the f64 definition', async () => {
    const r = await root();
    const logits = r.getLogits();
    const lse = logSumExp(logits);
    let h = 0;
    for (const x of logits) {
      const lp = x - lse;
      h -= Math.exp(lp) * lp;
    }
    assert.ok(Math.abs(r.entropy() - h) < 1e-4, `${r.entropy()} vs ${h}`);
    assert.ok(Math.abs(r.entropy('bits') - h / Math.LN2) < 1e-4);
    await r.pruneSubtree();
  });

  it('store.produce gives what per-branch produce gives, and repeated branches are allowed', async () => {
    const r = await root();
    const branches = [r, ...Array.from({ length: 6 }, () => r.fork())];
    const first = topK(r.getLogits(), branches.length);
    await store.commit(branches.map((b, i) => [b, first[i]]));
    const batched = store.produce(branches).map((p) => p.token);
    const single = branches.map((b) => b.produce().token);
    assert.deepEqual(batched, single);
    // greedy top-k preselection agrees with a full argmax of each snapshot
    branches.forEach((b, i) => assert.equal(batched[i], topK(b.getLogits(), 1)[0]));
    const twice = store.produce([branches[1], branches[1]]).map((p) => p.token);
    assert.deepEqual(twice, [single[1], single[1]]);
    await r.pruneSubtree();
  });

  it('snapshots stay exact after later decodes of other branches', async () => {
    const r = await root();
    const a = r.fork();
    const b = r.fork();
    const [ta, tb] = topK(r.getLogits(), 2);
    await store.commit([
      [a, ta],
      [b, tb],
    ]);
    const snapA = a.getLogits();
    const snapR = r.getLogits();
    await store.commit([
      [b, b.produce().token],
      [r, r.produce().token],
    ]);
    await b.commit(b.produce().token);
    assert.deepEqual(a.getLogits(), snapA);
    assert.notDeepEqual(r.getLogits(), snapR);
    await r.pruneSubtree();
  });
});
