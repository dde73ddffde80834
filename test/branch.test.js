'use strict';

const assert = require('node:assert/strict');
const { Branch, BranchStore } = require('..');
const { open, rejects, throwsSync, argmax, topK } = require('./helpers');
const { nativeOf } = require('../lib/Context'); // internals, for checks the public API cannot make

const GREEDY = { temperature: 0 };
const PROMPT = 'The quick brown fox jumps over the lazy';

/** Fresh root on seq 0 with the prompt decoded and its logits captured. */
async function rootOn(ctx, text = PROMPT, params = GREEDY) {
  const tokens = await ctx.tokenize(text);
  await ctx.decode(tokens, 0, 0);
  const root = Branch.create(ctx, tokens.length, params);
  root.captureLogits();
  return { root, tokens };
}

/** Every live branch's position mirrors its sequence's KV. */
function assertConsistent(ctx, branches) {
  for (const b of branches) {
    if (b.disposed) continue;
    assert.equal(ctx.kvSeqPosMax(b.seqId), b.position - 1, `branch ${b.handle} (seq ${b.seqId})`);
  }
}

describe('Branch and BranchStore', function () {
  let ctx;
  let store;
  before(async () => {
    ctx = await open({ nSeqMax: 8, nCtx: 2048 });
    store = new BranchStore(ctx);
  });
  after(() => ctx && ctx.dispose());
  afterEach(async () => {
    // a failed test must not leak branches into the next one
    for (const h of nativeOf(ctx)._storeLiveHandles()) nativeOf(ctx)._branchPrune(h);
    await ctx.kvCacheClear();
  });

  it('prune and pruneSubtree without await: every freed wrapper is disposed when the call returns', async () => {
    const { root } = await rootOn(ctx, PROMPT, { temperature: 0 });
    const a = root.fork();
    const b = root.fork();
    const a1 = a.fork();
    const a2 = a.fork();
    const a1x = a1.fork();
    // Queue a commit first, so the frees below wait on the worker while we look at the wrappers.
    const committing = store.commit([[b, b.produce().token]]);
    const pruning = a1.prune(); // a1x is re-parented to a
    assert.equal(a1.disposed, true);
    assert.equal(a1x.disposed, false);
    const subtree = a.pruneSubtree(); // a, a2 and (re-parented) a1x
    assert.deepEqual(
      [a, a2, a1x].map((x) => x.disposed),
      [true, true, true],
    );
    assert.deepEqual(
      [root, b].map((x) => x.disposed),
      [false, false],
    );
    const live = [root, a, b, a1, a2, a1x].filter((x) => !x.disposed);
    assert.deepEqual(live, [root, b]);
    await Promise.all([committing, pruning, subtree]);
    assert.deepEqual(nativeOf(ctx)._storeLiveHandles().sort(), [root.handle, b.handle].sort());
    assert.throws(
      () => a1x.position,
      (e) => e.code === 'ERR_BRANCH_DISPOSED',
    );
    await root.pruneSubtree();
    assert.equal(b.disposed, true);
    assert.equal(store.available, 8);
  });

  it('best-of-N: reseeded stochastic forks, one batched commit per step, perplexities finite', async () => {
    const { root } = await rootOn(ctx, PROMPT, { temperature: 0.8, seed: 7 });
    const kids = [root.fork(), root.fork(), root.fork()];
    kids.forEach((k, i) => k.reseedSampler(100 + i));
    const all = [root, ...kids];
    const texts = all.map(() => []);
    for (let step = 0; step < 10; step++) {
      const produced = store.produce(all);
      await store.commit(all.map((b, i) => [b, produced[i].token]));
      produced.forEach((p, i) => texts[i].push(p.token));
    }
    for (const b of all) {
      assert.ok(Number.isFinite(b.perplexity) && b.perplexity >= 1, `ppl ${b.perplexity}`);
      assert.ok(Number.isFinite(b.samplingPerplexity) && b.samplingPerplexity >= 1);
    }
    const distinct = new Set(texts.map((t) => t.join(',')));
    assert.ok(distinct.size >= 2, 'reseeded forks should not all produce the same stream');
    assertConsistent(ctx, all);
    await root.pruneSubtree();
    assert.ok(
      all.every((b) => b.disposed),
      'pruneSubtree disposes every wrapper in the subtree',
    );
    assert.equal(store.available, 8);
  });

  it('forks share the KV prefix: no cells used by fork, exact accounting under prune orders', async () => {
    const { root, tokens } = await rootOn(ctx);
    const n = tokens.length;
    assert.deepEqual(store.kvPressure(), { nCtx: 2048, cellsUsed: n, remaining: 2048 - n });
    const a = root.fork();
    const b = root.fork();
    assert.equal(store.kvPressure().cellsUsed, n, 'fork costs no cells');
    assert.equal(a.forkHead, n);
    assert.equal(a.parent, root.handle);
    assert.deepEqual(root.children, [a.handle, b.handle]);
    await store.commit([
      [root, 1000],
      [a, 2000],
      [b, 3000],
    ]);
    assert.equal(store.kvPressure().cellsUsed, n + 3);
    const c = a.fork();
    await store.commit([
      [a, 11],
      [c, 12],
    ]);
    assert.equal(store.kvPressure().cellsUsed, n + 5);
    // prune the parent first: its children keep working and are re-parented
    await a.prune();
    assert.equal(a.disposed, true);
    assert.equal(c.parent, root.handle, 're-parented to the grandparent');
    assert.equal(
      store.kvPressure().cellsUsed,
      n + 5 - 1,
      "only a's own last cell is freed; the shared one stays with c",
    );
    await c.commit(c.produce().token);
    assertConsistent(ctx, [root, b, c]);
    await root.prune();
    assert.equal(b.parent, null);
    await b.prune();
    await c.prune();
    assert.equal(store.kvPressure().cellsUsed, 0);
    assert.equal(store.available, 8);
  });

  it('fork clones the logits snapshot, sampler and metrics; steer is not inherited', async () => {
    const { root } = await rootOn(ctx, 'Hello world');
    const greedy = root.sample();
    root.steer([{ token: greedy, bias: -Infinity }]);
    const steered = root.sample();
    assert.notEqual(steered, greedy);
    const child = root.fork();
    assert.deepEqual(child.getLogits(), root.getLogits());
    assert.equal(child.sample(), greedy, 'child samples the un-steered greedy token');
    assert.equal(root.sample(), steered, 'parent is still steered');
    child.steer([{ token: 99, bias: 100 }]);
    assert.equal(child.sample(), 99);
    assert.equal(root.sample(), steered);
    root.clearSteer();
    assert.equal(root.sample(), greedy);
    await child.prune();
    await root.prune();
  });

  it('steer forces and bans tokens; per-branch end-of-generation with steering', async () => {
    const { root, tokens } = await rootOn(ctx);
    const b2 = root.fork();
    const eog = ctx.getEogToken();
    const gen = [[], []];
    const done = [false, false];
    for (let step = 0; step < 8; step++) {
      if (step === 3) root.steer([{ token: eog, bias: 100 }]);
      const live = [root, b2].filter((_, i) => !done[i]);
      const produced = store.produce(live);
      const entries = [];
      live.forEach((b, j) => {
        const i = b === root ? 0 : 1;
        if (produced[j].isStop) done[i] = true;
        else {
          gen[i].push(produced[j].token);
          entries.push([b, produced[j].token]);
        }
      });
      await store.commit(entries);
    }
    assert.equal(gen[0].length, 3, 'root stops at the steered EOG');
    assert.equal(gen[1].length, 8);
    assert.equal(b2.position, tokens.length + gen[1].length);
    assert.equal(root.position, tokens.length + 3);
    await b2.prune();
    await root.prune();
  });

  it('getLogits agrees with the context logits and entropy', async () => {
    const { root } = await rootOn(ctx);
    const own = root.getLogits();
    const fromCtx = ctx.getLogits();
    assert.equal(own.length, ctx.vocabSize);
    const h1 = ctx.modelEntropy('nats', own);
    const h2 = ctx.modelEntropy('nats');
    assert.ok(Number.isFinite(h1) && h1 > 0);
    assert.ok(Math.abs(h1 - h2) < 1e-4);
    assert.ok(Math.abs(root.entropy() - h1) < 1e-6);
    assert.equal(argmax(own), argmax(fromCtx));
    own[0] = 12345; // a copy: the snapshot is unchanged
    assert.notEqual(root.getLogits()[0], 12345);
    const p = root.produce();
    assert.equal(p.isStop, false);
    await store.commit([[root, p.token]]);
    assert.ok(Number.isFinite(ctx.modelEntropy('nats', root.getLogits())));
    await root.prune();
  });

  it('mixed single and batched commits advance positions consistently', async () => {
    const { root } = await rootOn(ctx);
    const b = root.fork();
    for (let i = 0; i < 3; i++) await root.commit(root.produce().token);
    const afterSingle = root.position;
    for (let i = 0; i < 3; i++) {
      const [p1, p2] = store.produce([root, b]);
      await store.commit([
        [root, p1.token],
        [b, p2.token],
      ]);
    }
    assert.equal(root.position, afterSingle + 3);
    for (let i = 0; i < 3; i++) await b.commit(b.produce().token);
    assert.equal(b.position, afterSingle - 3 + 6);
    assert.ok(root.perplexity >= 1 && Number.isFinite(root.perplexity));
    assertConsistent(ctx, [root, b]);
    await b.prune();
    await root.prune();
  });

  it('greedy generation is deterministic on the same path and the async iterator commits before yielding', async () => {
    const { root, tokens } = await rootOn(ctx, 'The quick brown fox');
    const viaIter = [];
    for await (const { token, text } of root) {
      assert.equal(typeof token, 'number');
      assert.equal(typeof text, 'string');
      viaIter.push(token);
      if (viaIter.length === 10) break;
    }
    assert.equal(root.position, tokens.length + 10);
    assert.ok(root.perplexity >= 1);
    await root.prune();
    await ctx.kvCacheClear();
    const { root: again } = await rootOn(ctx, 'The quick brown fox');
    const manual = [];
    for (let i = 0; i < 10; i++) {
      const { token } = again.produce();
      manual.push(token);
      await again.commit(token);
    }
    assert.deepEqual(manual, viaIter);
    await again.prune();
  });

  it('prefill rehydrates different histories; runs of 0, 1, nBatch and 3×nBatch tokens', async () => {
    const small = await open({ nSeqMax: 4, nCtx: 1024, nBatch: 32 });
    try {
      const s = new BranchStore(small);
      const prompt = await small.tokenize('Once upon a time');
      await small.decode(prompt, 0, 0);
      const root = Branch.create(small, prompt.length, GREEDY);
      root.captureLogits();
      const [b1, b2, b3] = [root.fork(), root.fork(), root.fork()];
      const text = await small.tokenize(
        ' there was a dragon who loved to read books about the sea and the stars. '.repeat(8),
        false,
      );
      assert.ok(text.length >= 96);
      const runs = [[], text.slice(0, 1), text.slice(0, 32), text.slice(0, 96)];
      const before = [root, b1, b2, b3].map((b) => b.position);
      const snapshotBefore = root.getLogits();
      await s.prefill([
        [root, runs[0]],
        [b1, runs[1]],
        [b2, runs[2]],
        [b3, runs[3]],
      ]);
      [root, b1, b2, b3].forEach((b, i) => assert.equal(b.position, before[i] + runs[i].length));
      assert.deepEqual(root.getLogits(), snapshotBefore, 'an empty run leaves the snapshot untouched');
      assertConsistent(small, [root, b1, b2, b3]);
      assert.notDeepEqual(b2.getLogits(), b3.getLogits());
      // different continuations after different histories, then batched steps
      for (let i = 0; i < 3; i++) {
        const ps = s.produce([b1, b2, b3]);
        await s.commit([
          [b1, ps[0].token],
          [b2, ps[1].token],
          [b3, ps[2].token],
        ]);
      }
      assertConsistent(small, [root, b1, b2, b3]);
      assert.equal(s.kvPressure().cellsUsed, prompt.length + 1 + 32 + 96 + 9);
    } finally {
      small.dispose();
    }
  });

  it('multi-turn prefill: warm turns append to a live branch', async () => {
    const { root } = await rootOn(ctx, 'User: My name is Ada.\nAssistant:');
    for (let i = 0; i < 5; i++) await root.commit(root.produce().token);
    for (const turn of ['\nUser: What is my name?\nAssistant:', '\nUser: Say it again.\nAssistant:']) {
      const delta = await ctx.tokenize(turn, false);
      const before = root.position;
      await root.prefill(delta);
      assert.equal(root.position, before + delta.length);
      const out = [];
      for (let i = 0; i < 6; i++) {
        const p = root.produce();
        if (p.isStop) break;
        out.push(p.text);
        await root.commit(p.token);
      }
      assert.ok(out.length > 0);
    }
    assertConsistent(ctx, [root]);
    await root.prune();
  });

  it('retainOnly keeps the winner, frees every other branch and disposes their wrappers', async () => {
    const { root } = await rootOn(ctx);
    const kids = [root.fork(), root.fork(), root.fork()];
    await store.commit([root, ...kids].map((b, i) => [b, 100 + i]));
    const winner = kids[1];
    const winnerPos = winner.position;
    await store.retainOnly(winner);
    assert.equal(winner.disposed, false);
    assert.ok([root, kids[0], kids[2]].every((b) => b.disposed));
    assert.equal(winner.parent, null);
    assert.equal(winner.forkHead, 0);
    assert.equal(store.available, 7);
    assert.equal(store.kvPressure().cellsUsed, winnerPos);
    for (let i = 0; i < 3; i++) await winner.commit(winner.produce().token);
    assertConsistent(ctx, [winner]);
    throwsSync(() => kids[0].produce(), 'ERR_BRANCH_DISPOSED');
    await winner.prune();
    assert.equal(store.kvPressure().cellsUsed, 0);
  });

  it('lease exhaustion, explicit seq ids and recycling', async () => {
    const { root } = await rootOn(ctx);
    const kids = [];
    for (let i = 0; i < 7; i++) kids.push(root.fork());
    assert.equal(store.available, 0);
    const err = throwsSync(() => root.fork(), 'ERR_NO_FREE_SEQUENCE');
    assert.match(err.message, /nSeqMax/);
    const freedSeq = kids[3].seqId;
    await kids[3].prune();
    assert.equal(store.available, 1);
    const again = root.fork();
    assert.equal(again.seqId, freedSeq, 'the freed lease is reused (and was cleaned)');
    assert.equal(store.available, 0);
    await again.commit(again.produce().token);
    assertConsistent(ctx, [root, again, ...kids]);
    await root.pruneSubtree();
    assert.equal(store.available, 8);
    // explicit lease: in range and free, else a clear error
    const { root: r2 } = await rootOn(ctx);
    const f = r2.fork(6);
    assert.equal(f.seqId, 6);
    throwsSync(() => r2.fork(6), 'ERR_INVALID_ARG');
    throwsSync(() => r2.fork(8), 'ERR_INVALID_ARG');
    await r2.pruneSubtree();
  });

  it('invalid calls fail with codes and change nothing', async () => {
    const { root } = await rootOn(ctx);
    const b = root.fork();
    const pos = [root.position, b.position];
    const logits = root.getLogits();
    await rejects(() => store.commit([[root, ctx.vocabSize]]), 'ERR_TOKEN_OUT_OF_RANGE');
    await rejects(() => store.commit([[root, -1]]), 'ERR_TOKEN_OUT_OF_RANGE');
    await rejects(() => store.commit([[root, 1.5]]), 'ERR_TOKEN_OUT_OF_RANGE');
    await rejects(
      () =>
        store.commit([
          [root, 5],
          [root, 6],
        ]),
      'ERR_INVALID_ARG',
      /more than once/,
    );
    await rejects(
      () =>
        store.prefill([
          [b, [1, 2]],
          [b, [3]],
        ]),
      'ERR_INVALID_ARG',
      /more than once/,
    );
    await rejects(
      () =>
        store.commit([
          [root, 5],
          [b, 999999],
        ]),
      'ERR_TOKEN_OUT_OF_RANGE',
    );
    await rejects(() => store.commit([[{}, 5]]), 'ERR_INVALID_ARG');
    await rejects(() => store.commit([root, 5]), 'ERR_INVALID_ARG');
    await rejects(() => store.prefill([[root, 'abc']]), 'ERR_INVALID_ARG');
    await rejects(() => store.prefill([[root, [1, 2, 'x']]]), 'ERR_INVALID_ARG');
    await rejects(() => store.prefill([[root, [1, 2], 2]]), 'ERR_INVALID_ARG', /score start/);
    await rejects(() => store.prefill([[root, [1, 2], -1]]), 'ERR_INVALID_ARG', /score start/);
    await rejects(() => store.score([[root, []]]), 'ERR_INVALID_ARG', /score start/);
    await rejects(() => store.score([[root, new Array(ctx.nOutputs + 1).fill(5)]]), 'ERR_INVALID_ARG', /one decode/);
    await rejects(() => store.score('x'), 'ERR_INVALID_ARG');
    throwsSync(() => root.steer([{ token: -3, bias: 1 }]), 'ERR_INVALID_ARG');
    throwsSync(() => root.reseedSampler(-1), 'ERR_INVALID_ARG');
    throwsSync(() => Branch.create(ctx, 0, { topK: -1 }), 'ERR_INVALID_ARG');
    throwsSync(() => Branch.create(ctx, 0, { topP: 0 }), 'ERR_INVALID_ARG');
    throwsSync(() => Branch.create(ctx, 0, { temperature: Number.NaN }), 'ERR_INVALID_ARG');
    throwsSync(() => Branch.create(ctx, 3, GREEDY), 'ERR_INVALID_ARG'); // empty sequence, wrong position
    throwsSync(() => Branch.create(ctx, 0, GREEDY, 100000), 'ERR_INVALID_ARG'); // nBatch above the context's
    throwsSync(() => Branch.create(ctx, 0, GREEDY, undefined, 'root ::= ('), 'ERR_GRAMMAR');
    throwsSync(() => Branch.create('ctx', 0), 'ERR_INVALID_ARG');
    assert.deepEqual([root.position, b.position], pos);
    assert.deepEqual(root.getLogits(), logits);
    assertConsistent(ctx, [root, b]);
    // still fully usable
    await store.commit([
      [root, root.produce().token],
      [b, b.produce().token],
    ]);
    assert.deepEqual([root.position, b.position], [pos[0] + 1, pos[1] + 1]);
    await b.prune();
    await root.prune();
  });

  it("score: each continuation's log-probability, all in one call; the tokens stay", async () => {
    const { root } = await rootOn(ctx, 'The capital of France is');
    const options = [' Paris', ' a small village in the north'].map((o) => ctx.tokenizeSync(o, false));
    const forks = options.map(() => root.fork());
    const scores = await store.score(forks.map((f, i) => [f, options[i]]));
    assert.equal(scores.length, 2);
    forks.forEach((f, i) => assert.equal(f.position, root.position + options[i].length));
    // Mixed with a plain entry in one prefill. Scored from index 1, the first token is decoded
    // but not counted: with that token's log-probability from the held logits added back, the
    // sum is the one scored from index 0 in the same batch shape (so the same arithmetic).
    const sums = [];
    for (const from of [0, 1]) {
      const [x, y] = [root.fork(), root.fork()];
      sums.push(
        await store.prefill([
          [x, options[1], from],
          [y, options[0]],
        ]),
      );
      assert.equal(sums.at(-1)[1], null);
      await x.prune();
      await y.prune();
    }
    const first = root.logprob(options[1][0]).logprob;
    assert.ok(
      first < 0 && Math.abs(first + sums[1][0] - sums[0][0]) < 1e-6,
      `${first} + ${sums[1][0]} vs ${sums[0][0]}`,
    );
    // One token at a time (another batch shape, so within a tolerance): the same sums.
    for (const [i, tokens] of options.entries()) {
      const one = root.fork();
      let sum = 0;
      for (const t of tokens) {
        sum += one.logprob(t).logprob;
        await one.commit(t);
      }
      assert.ok(Math.abs(sum - scores[i]) < 0.25, `option ${i}: ${scores[i]} vs one at a time ${sum}`);
      await one.prune();
    }
    assert.ok(scores[0] > scores[1], `a likely continuation outscores an unlikely one: ${scores}`);
    assertConsistent(ctx, [root, ...forks]);
    await root.prune();
  });

  it('async rejection, empty inputs, disposed during async, busy context', async () => {
    const { root } = await rootOn(ctx);
    await store.commit([]);
    await store.prefill([]);
    const pos = root.position;
    await root.prefill([]);
    assert.equal(root.position, pos);
    // a sync call waits for the async one queued before it (never races it)
    const pending = root.commit(root.produce().token);
    assert.equal(root.position, pos + 1, 'the getter waited for the commit');
    const waitedFork = root.fork();
    assert.equal(waitedFork.position, pos + 1);
    await waitedFork.prune();
    await pending;
    // prune without awaiting: disposed at once
    const child = root.fork();
    const pruning = child.prune();
    assert.equal(child.disposed, true);
    throwsSync(() => child.produce(), 'ERR_BRANCH_DISPOSED');
    await rejects(() => child.commit(5), 'ERR_BRANCH_DISPOSED');
    throwsSync(() => child.fork(), 'ERR_BRANCH_DISPOSED');
    await pruning;
    await child.prune(); // no-op
    // prune while a commit is in flight: it runs after the commit, in call order
    const c2 = root.fork();
    const inflight = c2.commit(c2.produce().token);
    const late = c2.prune();
    assert.equal(c2.disposed, true);
    await inflight;
    await late;
    assert.equal(store.available, 7);
    // prune queued between two async operations still frees the branch, in order
    const c3 = root.fork();
    const first = c3.commit(c3.produce().token);
    const freeing = c3.prune();
    const second = root.commit(5);
    await Promise.all([first, freeing, second]);
    assert.equal(store.available, 7);
    assert.equal(c3.disposed, true);
    // retainOnly and argument errors of promise-returning methods reject instead of throwing
    const rejected = store.retainOnly(c3);
    assert.ok(rejected instanceof Promise);
    await rejects(() => rejected, 'ERR_BRANCH_DISPOSED');
    const bad = ctx.decode([], 0, 0);
    assert.ok(bad instanceof Promise);
    await rejects(() => bad, 'ERR_INVALID_ARG');
    // stale handles at the native layer are rejected, not dereferenced
    await rejects(() => nativeOf(ctx)._branchDecodeAndCaptureOne(child.handle, 5), 'ERR_BRANCH_DISPOSED');
    await rejects(() => nativeOf(ctx)._storeCommit([0], [5]), 'ERR_BRANCH_DISPOSED');
    await root.prune();
  });

  it('branches of another context are refused', async () => {
    const other = await open({ nCtx: 256, nSeqMax: 2 });
    try {
      const toks = await other.tokenize('Hi');
      await other.decode(toks, 0, 0);
      const foreign = Branch.create(other, toks.length, GREEDY);
      await rejects(() => store.commit([[foreign, 5]]), 'ERR_FOREIGN_BRANCH');
    } finally {
      other.dispose();
    }
  });

  it('commit rolls back exactly on KV exhaustion (ERR_KV_FULL), and pruning frees space', async () => {
    const tiny = await open({ nCtx: 256, nSeqMax: 8 });
    try {
      const s = new BranchStore(tiny);
      const prompt = await tiny.tokenize('Hi');
      await tiny.decode(prompt, 0, 0);
      const root = Branch.create(tiny, prompt.length, { temperature: 1.0, seed: 1 });
      root.captureLogits();
      const all = [root];
      for (let i = 0; i < 7; i++) {
        const f = root.fork();
        f.reseedSampler(1001 + i);
        all.push(f);
      }
      let failure = null;
      for (let round = 0; round < 60 && !failure; round++) {
        const before = all.map((b) => [b.position, b.perplexity, b.samplingPerplexity, b.getLogits()[0]]);
        const produced = s.produce(all);
        try {
          await s.commit(all.map((b, i) => [b, produced[i].token]));
        } catch (e) {
          failure = e;
          const after = all.map((b) => [b.position, b.perplexity, b.samplingPerplexity, b.getLogits()[0]]);
          assert.deepEqual(after, before, 'positions, perplexities and snapshots restored exactly');
        }
      }
      assert.ok(failure, 'the cache must fill up within 60 rounds');
      assert.equal(failure.code, 'ERR_KV_FULL');
      assert.ok(s.kvPressure().remaining < 8);
      assertConsistent(tiny, all);
      for (const b of all.slice(1, 5)) await b.prune();
      await root.commit(root.produce().token);
      assertConsistent(tiny, all);
      await root.pruneSubtree();
    } finally {
      tiny.dispose();
    }
  });

  it('nBatch ablation: prefill chunking changes numerics only within tolerance', async () => {
    const results = [];
    for (const nBatch of [32, 64, 512]) {
      const c = await open({ nCtx: 512, nBatch });
      try {
        const prompt = await c.tokenize('Hello, how are you today?');
        await c.decode(prompt, 0, 0);
        const b = Branch.create(c, prompt.length, GREEDY, nBatch);
        const more = await c.tokenize(' What else would you like to talk about? '.repeat(3), false);
        await b.prefill(more);
        results.push(b.getLogits());
        await b.prune();
      } finally {
        c.dispose();
      }
    }
    const top = results.map((l) => topK(l, 5));
    for (const t of top.slice(1)) {
      const overlap = t.filter((x) => top[0].includes(x)).length;
      assert.ok(overlap >= 4, `top-5 overlap ${overlap}`);
    }
    let maxDelta = 0;
    for (let i = 0; i < results[0].length; i++) maxDelta = Math.max(maxDelta, Math.abs(results[0][i] - results[2][i]));
    assert.ok(maxDelta < 3, `max |Δlogit| ${maxDelta}`);
  });

  it('Branch objects dropped without prune are reclaimed after GC', async function () {
    assert.equal(typeof global.gc, 'function', 'mocha runs with --expose-gc (.mocharc.json)');
    const { root } = await rootOn(ctx);
    (() => {
      for (let i = 0; i < 3; i++) root.fork();
    })();
    assert.equal(store.available, 4);
    global.gc();
    await new Promise((r) => setTimeout(r, 50));
    global.gc();
    await new Promise((r) => setTimeout(r, 50));
    root.fork().prune(); // any store call flushes collected wrappers first
    assert.equal(store.available, 7);
    await root.prune();
  });
});
