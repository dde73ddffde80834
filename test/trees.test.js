'use strict';

// Branch trees that save and restore (docs/api.md#branch-trees): a tree of greedy, seeded,
// penalised, grammar-constrained and reseeded branches saved, then continued by the original,
// by a restore in another context and by a restore in another process — the same tokens — and
// every way a file or a context can be wrong, each a coded error with nothing half-restored.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Branch, BranchStore } = require('..');
const { open, rejects, continueFor, MODEL } = require('./helpers');

const STEPS = 4;

/**
 * root (greedy prompt) → a (greedy, 2 tokens) → a2 (seeded then reseeded, 2 tokens); root → b
 * (seeded, with penalties, 3 tokens); root → c (seeded, grammar, 2 tokens); root → d (never moved).
 */
async function buildTree(ctx) {
  const root = Branch.create(ctx, 0, { temperature: 0 });
  await root.prefill(await ctx.tokenize('A short history of the printing press: it began'));
  const a = root.fork();
  const b = root.fork();
  b.setSamplerParams({ temperature: 0.9, seed: 7, penalties: { repeat: 1.3, lastN: 32 } });
  const c = root.fork();
  c.setSamplerParams({ temperature: 0.8, seed: 11 });
  c.setGrammar('root ::= (" yes" | " no" | " maybe")+');
  const d = root.fork();
  await continueFor(a, 2);
  await continueFor(b, 3);
  await continueFor(c, 2);
  const a2 = a.fork();
  a2.setSamplerParams({ temperature: 1.0, seed: 5 });
  await continueFor(a2, 1);
  a2.reseedSampler(99);
  await continueFor(a2, 1);
  return { root, all: [root, a, a2, b, c, d] };
}

describe('branch trees: saveTree / restoreTree', function () {
  this.timeout(240000);
  let ctx;
  let tmp;
  let file;
  let saved;
  let original;

  before(async () => {
    ctx = await open({ nSeqMax: 16, nThreads: 1 });
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-trees-'));
    file = path.join(tmp, 'tree.lbt');
    const { root, all } = await buildTree(ctx);
    const store = new BranchStore(ctx);
    saved = await store.saveTree(root, file, { meta: JSON.stringify({ step: 3 }) });
    assert.deepEqual(saved.branches, all, 'depth first, parents before children, fork order');
    // What the original goes on to do: the reference every restore must match.
    original = [];
    for (const b of all) original.push({ position: b.position, tokens: await continueFor(b, STEPS) });
  });
  after(() => {
    ctx?.dispose();
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('stores each shared prefix once, and a fork that never moved shares its parent logits', () => {
    assert.equal(saved.sharedBranches, 5, 'every child leaves its parent prefix out');
    assert.equal(fs.statSync(file).size, saved.bytes);
    const vocab = ctx.vocabSize;
    assert.equal(saved.logitsBytes, 5 * 4 * vocab, 'd stores no logits of its own');
    assert.ok(saved.bytes < saved.kvBytes + saved.logitsBytes + 64 * 1024, 'little beside cells and logits');
    assert.deepEqual(
      fs.readdirSync(tmp).filter((f) => f !== 'tree.lbt'),
      [],
      'no temporary file left',
    );
  });

  it('restored in another context, every branch continues with the same tokens', async () => {
    const ctx2 = await open({ nSeqMax: 16, nThreads: 1 });
    try {
      const restored = await BranchStore.restoreTree(ctx2, file);
      assert.equal(restored.meta, '{"step":3}');
      assert.deepEqual(restored.parents, [-1, 0, 1, 0, 0, 0]);
      assert.equal(restored.root, restored.branches[0]);
      assert.deepEqual(
        restored.branches.map((b) => b.parent),
        restored.parents.map((p) => (p < 0 ? null : restored.branches[p].handle)),
      );
      // No parent moved after its children forked, so each branch's own cells are its
      // position less its parent's: the restored tree holds exactly those, once.
      const own = original.reduce(
        (sum, o, i) => sum + o.position - (i === 0 ? 0 : original[restored.parents[i]].position),
        0,
      );
      assert.equal(new BranchStore(ctx2).kvPressure().cellsUsed, own, 'prefixes shared again, not copied');
      for (const [i, b] of restored.branches.entries()) {
        assert.equal(b.position, original[i].position, `branch ${i} position`);
        assert.deepEqual(await continueFor(b, STEPS), original[i].tokens, `branch ${i} tokens`);
      }
    } finally {
      ctx2.dispose();
    }
  });

  it('restored in a child process, every branch continues with the same tokens', async () => {
    const script = `
      const { BranchStore, createContext } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
      (async () => {
        const ctx = await createContext({ modelPath: ${JSON.stringify(MODEL)}, nCtx: 1024, nThreads: 1, nSeqMax: 16 });
        const { branches } = await BranchStore.restoreTree(ctx, ${JSON.stringify(file)});
        const out = [];
        for (const b of branches) {
          const tokens = [];
          for (let i = 0; i < ${STEPS}; i++) {
            const { token } = b.produce();
            tokens.push(token);
            await b.commit(token);
          }
          out.push(tokens);
        }
        process.stdout.write(JSON.stringify(out));
        ctx.dispose();
      })().catch((e) => { console.error(e); process.exit(1); });`;
    const stdout = await new Promise((resolve, reject) =>
      execFile(process.execPath, ['-e', script], { timeout: 180000 }, (err, out, errOut) =>
        err ? reject(new Error(`${err.message}\n${errOut}`)) : resolve(out),
      ),
    );
    assert.deepEqual(
      JSON.parse(stdout),
      original.map((o) => o.tokens),
    );
  });

  it('without a spare sequence every branch is stored whole, and continues the same', async () => {
    const tight = await open({ nSeqMax: 3, nThreads: 1 });
    const other = await open({ nSeqMax: 3, nThreads: 1 });
    try {
      const root = Branch.create(tight, 0, { temperature: 0 });
      await root.prefill(await tight.tokenize('Three friends walked into'));
      const kids = [root.fork(), root.fork()];
      kids[1].setSamplerParams({ temperature: 0.9, seed: 3 });
      for (const k of kids) await continueFor(k, 2);
      const whole = path.join(tmp, 'whole.lbt');
      const s = await new BranchStore(tight).saveTree(root, whole);
      assert.equal(s.sharedBranches, 0, 'no scratch sequence: nothing left out');
      const expected = [];
      for (const b of s.branches) expected.push(await continueFor(b, 3));
      const { branches } = await BranchStore.restoreTree(other, whole);
      for (const [i, b] of branches.entries()) assert.deepEqual(await continueFor(b, 3), expected[i], `branch ${i}`);
    } finally {
      tight.dispose();
      other.dispose();
    }
  });

  it('a prompt longer than the sliding window restores shared and continues the same', async () => {
    // Gemma 3 keeps only a 512-position window in most layers: the root's restored window
    // cache starts past 0, and its child still gets its prefix from it.
    const long = await open({ nSeqMax: 4, nThreads: 1 });
    const other = await open({ nSeqMax: 4, nThreads: 1 });
    try {
      const words = (await long.tokenize('one two three four five six seven eight nine ten '.repeat(70))).slice(0, 600);
      const root = Branch.create(long, 0, { temperature: 0 });
      await root.prefill(words);
      const child = root.fork();
      child.setSamplerParams({ temperature: 0.7, seed: 9 });
      await continueFor(child, 2);
      const file2 = path.join(tmp, 'long.lbt');
      const s = await new BranchStore(long).saveTree(root, file2);
      assert.equal(s.sharedBranches, 1);
      const expected = [await continueFor(root, 3), await continueFor(child, 3)];
      const { branches } = await BranchStore.restoreTree(other, file2);
      assert.equal(new BranchStore(other).kvPressure().cellsUsed, 602, 'the prompt once');
      assert.deepEqual([await continueFor(branches[0], 3), await continueFor(branches[1], 3)], expected);
    } finally {
      long.dispose();
      other.dispose();
    }
  });

  it('rejects a corrupted or truncated file with ERR_STATE_CORRUPT and restores nothing', async () => {
    const bytes = fs.readFileSync(file);
    const store = new BranchStore(ctx);
    const before = { available: store.available, cells: store.kvPressure().cellsUsed };
    const cases = {
      flipped: Buffer.from(bytes).fill(0x55, bytes.length >> 1, (bytes.length >> 1) + 1),
      truncated: bytes.subarray(0, bytes.length - 1000),
      header: bytes.subarray(0, 10),
      empty: Buffer.alloc(0),
    };
    for (const [name, data] of Object.entries(cases)) {
      const bad = path.join(tmp, `${name}.lbt`);
      fs.writeFileSync(bad, data);
      await rejects(() => BranchStore.restoreTree(ctx, bad), 'ERR_STATE_CORRUPT', /branch tree file/);
    }
    assert.deepEqual({ available: store.available, cells: store.kvPressure().cellsUsed }, before);
    await rejects(() => BranchStore.restoreTree(ctx, path.join(tmp, 'missing.lbt')), 'ERR_INVALID_ARG');
    await rejects(() => BranchStore.restoreTree(ctx, tmp), 'ERR_INVALID_ARG', /not a regular file/);
  });

  it('rejects a tree from other KV settings with ERR_STATE_MISMATCH naming them', async () => {
    const other = await open({ nSeqMax: 16, nThreads: 1, typeK: 'q8_0' });
    try {
      await rejects(() => BranchStore.restoreTree(other, file), 'ERR_STATE_MISMATCH', /typeK=q8_0/);
      assert.equal(new BranchStore(other).available, 16);
    } finally {
      other.dispose();
    }
  });

  it('refuses too few free sequences before touching anything', async () => {
    const small = await open({ nSeqMax: 5, nThreads: 1 });
    try {
      const keep = Branch.create(small, 0, { temperature: 0 });
      await keep.prefill(await small.tokenize('kept'));
      const store = new BranchStore(small);
      const before = { available: store.available, cells: store.kvPressure().cellsUsed, at: keep.position };
      await rejects(() => BranchStore.restoreTree(small, file), 'ERR_NO_FREE_SEQUENCE', /needs 6 free sequences/);
      assert.deepEqual({ available: store.available, cells: store.kvPressure().cellsUsed, at: keep.position }, before);
    } finally {
      small.dispose();
    }
  });

  it('refuses samplers whose state cannot be carried, and keeps the old file', async () => {
    const b = Branch.create(ctx, 0, { temperature: 0.8, seed: 1, advanced: { mirostat: { mode: 2 } } });
    try {
      await b.prefill(await ctx.tokenize('Hi'));
      const before = fs.readFileSync(file);
      await rejects(() => new BranchStore(ctx).saveTree(b, file), 'ERR_UNSUPPORTED', /mirostat/);
      assert.ok(fs.readFileSync(file).equals(before), 'the old file is untouched');
    } finally {
      await b.prune();
    }
    await rejects(
      () => new BranchStore(ctx).saveTree(saved.branches[0], path.join(tmp, 'no-such-dir', 'x.lbt')),
      'ERR_INVALID_ARG',
      /cannot write/,
    );
    await rejects(() => new BranchStore(ctx).saveTree(saved.branches[0], ''), 'ERR_INVALID_ARG');
    await rejects(() => new BranchStore(ctx).saveTree({}, file), 'ERR_INVALID_ARG');
    await rejects(() => new BranchStore(ctx).saveTree(saved.branches[0], file, { meta: 3 }), 'ERR_INVALID_ARG');
  });
});
