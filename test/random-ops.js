'use strict';

/**
 * Seeded random operation sequences on one context, checked against a model after every step.
 * Used by test/property.test.js (CI-sized) and test/soak.js (long runs).
 *
 * The model keeps, per live branch, its position, parent and the KV cell runs it references (a
 * fork references its parent's runs; new tokens make new runs), so the exact `cellsUsed` is the
 * total length of the runs some live branch, or some destroyed branch's kept sequence, references.
 */

const assert = require('node:assert/strict');
const fc = require('fast-check');
const { Branch, BranchStore } = require('..');
const { nativeOf } = require('../lib/Context'); // internals, for checks the public API cannot make

// Weights favour the cheap bookkeeping operations; decodes are short so thousands of steps fit
// in CI time, and the small nCtx of the test makes the cache fill up regularly.
const KINDS = [
  ['create', 2],
  ['fork', 6],
  ['prune', 4],
  ['pruneSubtree', 1],
  ['retainOnly', 1],
  ['commit', 5],
  ['prefill', 2],
  ['storePrefill', 1],
  ['produce', 4],
  ['destroy', 1],
  ['freeDetached', 2],
  ['abortPrefill', 1],
  ['useDisposed', 3],
  ['fill', 1],
];

/** One random step: a kind plus the random choices it needs. */
const stepArb = fc.record({
  kind: fc.oneof(...KINDS.map(([k, w]) => ({ arbitrary: fc.constant(k), weight: w }))),
  pick: fc.nat(),
  pick2: fc.nat(),
  count: fc.integer({ min: 1, max: 4 }),
  length: fc.integer({ min: 1, max: 12 }),
  token: fc.integer({ min: 100, max: 200000 }),
  delayMs: fc.integer({ min: 0, max: 3 }),
});

/** The deterministic step list for `seed`. */
function stepsFor(seed, count) {
  return fc.sample(fc.array(stepArb, { minLength: count, maxLength: count }), { seed, numRuns: 1 })[0];
}

class Model {
  constructor(nCtx, nSeqMax) {
    this.nCtx = nCtx;
    this.nSeqMax = nSeqMax;
    this.live = new Map(); // Branch -> { position, parent: Branch|null, runs: number[] }
    this.runs = new Map(); // run id -> length
    this.nextRun = 1;
    this.detached = new Map(); // seqId -> { cells, runs } of a destroyed branch's kept KV
    this.disposed = [];
  }

  unionOf(states) {
    const seen = new Set();
    let total = 0;
    for (const s of states) {
      for (const r of s.runs) {
        if (!seen.has(r)) {
          seen.add(r);
          total += this.runs.get(r);
        }
      }
    }
    return total;
  }

  /**
   * What kvPressure reports and llama.cpp holds: every cell once, including the cells a
   * destroyed branch's kept sequence shares with live forks.
   */
  cellsUsed() {
    return this.unionOf([...this.live.values(), ...this.detached.values()]);
  }

  physicalCells() {
    return this.cellsUsed();
  }

  available() {
    return this.nSeqMax - this.live.size - this.detached.size;
  }

  add(branch, position, parent, runs) {
    this.live.set(branch, { position, parent, runs });
  }

  grow(branch, n) {
    const s = this.live.get(branch);
    const id = this.nextRun++;
    this.runs.set(id, n);
    s.runs = [...s.runs, id];
    s.position += n;
  }

  /** Unlinks `branch`; its children are re-parented to its parent. */
  remove(branch) {
    const s = this.live.get(branch);
    for (const child of this.live.values()) if (child.parent === branch) child.parent = s.parent;
    this.live.delete(branch);
    this.disposed.push(branch);
    if (this.disposed.length > 64) this.disposed.shift();
  }

  subtree(branch) {
    const out = [branch];
    for (let i = 0; i < out.length; i++) {
      for (const [b, s] of this.live) if (s.parent === out[i]) out.push(b);
    }
    return out;
  }
}

async function expectCode(promiseOrFn, code) {
  try {
    const r = typeof promiseOrFn === 'function' ? promiseOrFn() : promiseOrFn;
    await r;
  } catch (e) {
    assert.equal(e.code, code, `expected ${code}, got ${e.code}: ${e.message}`);
    return;
  }
  assert.fail(`expected ${code}, but the call succeeded`);
}

/** Every invariant the issue names, checked against the model. */
function checkInvariants(ctx, store, model) {
  const seqs = new Set();
  for (const [b, s] of model.live) {
    assert.equal(b.disposed, false, 'a live branch reports disposed');
    assert.equal(b.position, s.position, `branch ${b.handle} position`);
    const seq = b.seqId;
    assert.ok(!seqs.has(seq), `sequence ${seq} leased twice`);
    seqs.add(seq);
    assert.equal(ctx.kvSeqPosMax(seq), s.position - 1, `branch ${b.handle}: position == pos_max + 1 of seq ${seq}`);
    assert.equal(
      s.runs.reduce((n, r) => n + model.runs.get(r), 0),
      s.position,
      'model: runs cover the position',
    );
  }
  const handles = nativeOf(ctx)
    ._storeLiveHandles()
    .slice()
    .sort((a, b) => a - b);
  assert.deepEqual(
    handles,
    [...model.live.keys()].map((b) => b.handle).sort((a, b) => a - b),
    'live handles',
  );
  assert.equal(store.available, model.available(), 'leases in use + available == nSeqMax');
  assert.equal(model.live.size + model.detached.size + store.available, model.nSeqMax);
  const p = store.kvPressure();
  const used = model.cellsUsed();
  assert.equal(p.cellsUsed, used, 'kvPressure.cellsUsed matches the model');
  assert.ok(p.cellsUsed <= p.nCtx, 'cellsUsed <= nCtx');
  assert.equal(p.remaining, p.nCtx - p.cellsUsed);
  for (const d of model.disposed.slice(-3)) {
    assert.equal(d.disposed, true);
    assert.throws(
      () => d.position,
      (e) => e.code === 'ERR_BRANCH_DISPOSED',
    );
  }
}

function pickFrom(list, n) {
  return list.length === 0 ? undefined : list[n % list.length];
}

/** `count` distinct live branches starting at `pick`. */
function pickSome(list, pick, count) {
  const out = [];
  for (let i = 0; i < Math.min(count, list.length); i++) out.push(list[(pick + i) % list.length]);
  return out;
}

function tokensOf(step, n) {
  return Array.from({ length: n }, (_, i) => 100 + ((step.token + i * 7919) % 200000));
}

/**
 * Runs `steps` random operations on `ctx` (which must have no branches), checking invariants
 * after each. Returns counts per kind and outcome.
 */
async function runRandomOps(ctx, { seed, steps: count, onProgress } = {}) {
  const store = new BranchStore(ctx);
  const model = new Model(ctx.nCtx, ctx.nSeqMax);
  const steps = stepsFor(seed, count);
  const stats = { steps: 0, byKind: {}, msByKind: {}, kvFull: 0, noFreeSequence: 0, aborted: 0 };
  const recent = [];
  for (let i = 0; i < steps.length; i++) {
    const step = steps[i];
    recent.push(`${i}:${step.kind}`);
    if (recent.length > 12) recent.shift();
    try {
      const started = performance.now();
      await runStep(ctx, store, model, step, stats);
      stats.msByKind[step.kind] = Math.round((stats.msByKind[step.kind] || 0) + performance.now() - started);
      checkInvariants(ctx, store, model);
    } catch (e) {
      e.message = `seed ${seed}, step ${i} (${step.kind}; recent: ${recent.join(' ')}): ${e.message}`;
      throw e;
    }
    stats.steps++;
    stats.byKind[step.kind] = (stats.byKind[step.kind] || 0) + 1;
    if (onProgress && (i + 1) % (Number(process.env.PROGRESS_EVERY) || 500) === 0) onProgress(i + 1, stats);
  }
  return { stats, store, model };
}

async function runStep(ctx, store, model, step, stats) {
  const live = [...model.live.keys()];
  const target = pickFrom(live, step.pick);
  const params = step.pick2 % 3 === 0 ? { temperature: 0.8, seed: step.pick2 } : { temperature: 0 };
  switch (step.kind) {
    case 'create': {
      if (model.available() === 0) {
        await expectCode(() => Branch.create(ctx, 0, params), 'ERR_NO_FREE_SEQUENCE');
        stats.noFreeSequence++;
        return;
      }
      const b = Branch.create(ctx, 0, params);
      model.add(b, 0, null, []);
      const tokens = tokensOf(step, step.length);
      if (model.physicalCells() + tokens.length > model.nCtx) {
        await expectCode(b.prefill(tokens), 'ERR_KV_FULL');
        stats.kvFull++;
        await b.prune();
        model.remove(b);
        return;
      }
      await b.prefill(tokens);
      model.grow(b, tokens.length);
      return;
    }
    case 'fork': {
      if (!target) return;
      if (model.available() === 0) {
        await expectCode(() => target.fork(), 'ERR_NO_FREE_SEQUENCE');
        stats.noFreeSequence++;
        return;
      }
      const child = target.fork();
      const s = model.live.get(target);
      model.add(child, s.position, target, s.runs.slice());
      if (step.pick2 % 2 === 0) child.reseedSampler(step.pick2 % 1000);
      return;
    }
    case 'prune': {
      if (!target) return;
      await target.prune();
      model.remove(target);
      return;
    }
    case 'pruneSubtree': {
      if (!target) return;
      const doomed = model.subtree(target);
      await target.pruneSubtree();
      for (const b of doomed.reverse()) model.remove(b);
      return;
    }
    case 'retainOnly': {
      if (!target) return;
      await store.retainOnly(target);
      for (const b of live) if (b !== target) model.remove(b);
      const s = model.live.get(target);
      s.parent = null;
      model.detached.clear();
      const id = model.nextRun++;
      model.runs.set(id, s.position);
      s.runs = [id];
      return;
    }
    case 'commit': {
      const chosen = pickSome(live, step.pick, step.count);
      if (chosen.length === 0) return;
      const produced = store.produce(chosen);
      const entries = chosen.map((b, j) => [b, produced[j].token]);
      const full =
        chosen.some((b) => model.live.get(b).position + 1 > model.nCtx) ||
        model.physicalCells() + chosen.length > model.nCtx;
      if (full) {
        await expectCode(store.commit(entries), 'ERR_KV_FULL');
        stats.kvFull++;
        return;
      }
      if (chosen.length === 1 && step.pick2 % 2 === 0) await chosen[0].commit(entries[0][1]);
      else await store.commit(entries);
      for (const b of chosen) model.grow(b, 1);
      return;
    }
    case 'fill':
    case 'prefill':
    case 'storePrefill': {
      const chosen =
        step.kind !== 'storePrefill' ? (target ? [target] : []) : pickSome(live, step.pick, Math.min(step.count, 3));
      if (chosen.length === 0) return;
      let lengths = chosen.map((b, j) => step.length + j);
      if (step.kind === 'fill') {
        // bring the cache to within a few cells of full, or just past it (ERR_KV_FULL)
        const room = model.nCtx - model.physicalCells();
        lengths = [room > 48 ? Math.min(room - 24, 96) : room - 2 + step.count];
        if (lengths[0] <= 0) return;
      }
      const runs = chosen.map((b, j) => tokensOf({ token: step.token + j }, lengths[j]));
      const needed = runs.reduce((n, r) => n + r.length, 0);
      const full =
        chosen.some((b, j) => model.live.get(b).position + runs[j].length > model.nCtx) ||
        model.physicalCells() + needed > model.nCtx;
      const call = () =>
        step.kind !== 'storePrefill' ? chosen[0].prefill(runs[0]) : store.prefill(chosen.map((b, j) => [b, runs[j]]));
      if (full) {
        await expectCode(call, 'ERR_KV_FULL');
        stats.kvFull++;
        return;
      }
      await call();
      chosen.forEach((b, j) => model.grow(b, runs[j].length));
      return;
    }
    case 'produce': {
      const chosen = pickSome(live, step.pick, step.count);
      if (chosen.length === 0) return;
      const out = store.produce(chosen);
      assert.equal(out.length, chosen.length);
      for (const p of out) assert.ok(Number.isInteger(p.token) && p.token >= 0 && p.token < ctx.vocabSize);
      return;
    }
    case 'destroy': {
      if (!target) return;
      const { position, runs } = model.live.get(target);
      const seq = target.destroy();
      assert.equal(ctx.kvSeqPosMax(seq), position - 1, 'destroy keeps the KV');
      model.remove(target);
      if (position > 0) model.detached.set(seq, { cells: position, runs });
      return;
    }
    case 'freeDetached': {
      const seq = pickFrom([...model.detached.keys()], step.pick);
      if (seq === undefined) return;
      await ctx.kvCacheRemove(seq, -1, -1);
      model.detached.delete(seq);
      return;
    }
    case 'abortPrefill': {
      if (!target) return;
      const tokens = tokensOf(step, step.length * 6);
      const s = model.live.get(target);
      if (s.position + tokens.length > model.nCtx || model.physicalCells() + tokens.length > model.nCtx) return;
      const controller = new AbortController();
      const promise = target.prefill(tokens, { signal: controller.signal });
      if (step.delayMs === 0) controller.abort();
      else setTimeout(() => controller.abort(), step.delayMs);
      try {
        await promise;
        model.grow(target, tokens.length); // finished before the abort arrived
      } catch (e) {
        assert.equal(e.code, 'ERR_ABORTED', e.message);
        stats.aborted++;
      }
      return;
    }
    case 'useDisposed': {
      const d = pickFrom(model.disposed, step.pick);
      if (!d) return;
      await expectCode(() => d.commit(1), 'ERR_BRANCH_DISPOSED');
      await expectCode(() => d.fork(), 'ERR_BRANCH_DISPOSED');
      return;
    }
    default:
      throw new Error(`unknown step ${step.kind}`);
  }
}

module.exports = { runRandomOps, stepsFor, checkInvariants };
