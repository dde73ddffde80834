#!/usr/bin/env node
'use strict';

/**
 * Branch trees saved and restored (`node bench/tree-save.js`, issue 38): a tree of 32 branches — a
 * root holding a `--prefix`-token prompt, `--mids` children that each generate `--gen` tokens,
 * and leaves under them that each generate `--gen` more — saved with `store.saveTree`, then
 * rebuilt in a second context two ways, interleaved `--reps` times (median reported):
 *
 * - **restore**: `BranchStore.restoreTree` of the file (read, checksum, fingerprint, cells loaded,
 *   prefixes tagged on, samplers replayed);
 * - **prefill**: the same tree rebuilt from its tokens — the prompt prefilled into a root, the
 *   mids forked and their tokens prefilled in one `store.prefill`, then the leaves likewise.
 *
 * And the file's size against what it must hold at least: every KV cell of the tree once (the
 * shared prefix once plus each branch's own cells, priced at the root's bytes per cell) plus
 * one logits row per branch that has its own; and against saving every branch's sequence whole.
 *
 * Flags: --prefix=512 --gen=32 --mids=4 --leaves=27 --reps=5 --threads=2 --json
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { createContext, Branch, BranchStore } = require('..');
const { args, modelPath, median } = require('./common');

const PREFIX = Number(args.prefix || 512);
const GEN = Number(args.gen || 32);
const MIDS = Number(args.mids || 4);
const LEAVES = Number(args.leaves || 27);
const REPS = Number(args.reps || 5);
const THREADS = Number(args.threads || 2);
const N = 1 + MIDS + LEAVES;

/** `GEN` sampled tokens for every branch of `group`, one batched commit per step. */
async function generate(store, group) {
  const tokens = group.map(() => []);
  for (let t = 0; t < GEN; t++) {
    const produced = store.produce(group);
    produced.forEach((p, i) => tokens[i].push(p.token));
    await store.commit(produced.map((p, i) => [group[i], p.token]));
  }
  return tokens;
}

async function main() {
  const options = { modelPath: modelPath(), nCtx: 8192, nBatch: 512, nThreads: THREADS, nSeqMax: N + 2 };
  const ctx = await createContext(options);
  const store = new BranchStore(ctx);
  const words = 'the quick brown fox jumps over the lazy dog while a printing press hums '.repeat(200);
  const prompt = (await ctx.tokenize(words)).slice(0, PREFIX);

  // The tree: root → mids → leaves, each branch its own seed.
  const root = Branch.create(ctx, 0, { temperature: 0.8, seed: 1 });
  await root.prefill(prompt);
  const mids = Array.from({ length: MIDS }, (_, i) => {
    const b = root.fork();
    b.reseedSampler(100 + i);
    return b;
  });
  const midTokens = await generate(store, mids);
  const leaves = Array.from({ length: LEAVES }, (_, i) => {
    const b = mids[i % MIDS].fork();
    b.reseedSampler(1000 + i);
    return b;
  });
  const leafTokens = await generate(store, leaves);
  const cellsUsed = store.kvPressure().cellsUsed;

  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tree-save-'));
  const file = path.join(dir, 'tree.lbt');
  const saveMs = [];
  let saved;
  for (let r = 0; r < REPS; r++) {
    const t0 = performance.now();
    saved = await store.saveTree(root, file);
    saveMs.push(performance.now() - t0);
  }
  // What the file must hold at least, and what whole sequences would take.
  const rootState = await ctx.kvCacheSave(root.seqId);
  const bytesPerCell = rootState.length / PREFIX;
  let wholeBytes = 0;
  for (const b of [root, ...mids, ...leaves]) wholeBytes += (await ctx.kvCacheSave(b.seqId)).length;
  const ownLogits = saved.logitsBytes;

  // Rebuild in a second context, interleaved: restore, then prefill, REPS times.
  const ctx2 = await createContext(options);
  const store2 = new BranchStore(ctx2);
  const restoreMs = [];
  const prefillMs = [];
  for (let r = 0; r < REPS; r++) {
    let t0 = performance.now();
    const restored = await BranchStore.restoreTree(ctx2, file);
    restoreMs.push(performance.now() - t0);
    if (restored.branches.length !== N) throw new Error(`restored ${restored.branches.length} branches`);
    await restored.root.pruneSubtree();

    t0 = performance.now();
    const r2 = Branch.create(ctx2, 0, { temperature: 0.8, seed: 1 });
    await r2.prefill(prompt);
    const m2 = mids.map(() => r2.fork());
    await store2.prefill(m2.map((b, i) => [b, midTokens[i]]));
    const l2 = leaves.map((_, i) => m2[i % MIDS].fork());
    await store2.prefill(l2.map((b, i) => [b, leafTokens[i]]));
    prefillMs.push(performance.now() - t0);
    if (store2.kvPressure().cellsUsed !== cellsUsed) throw new Error('the rebuilt tree holds other cells');
    await r2.pruneSubtree();
  }

  const result = {
    date: new Date().toISOString(),
    machine: `${os.cpus()[0].model.trim()}, ${os.cpus().length} cores, load average ${os
      .loadavg()
      .map((x) => x.toFixed(1))
      .join(' ')}`,
    branches: N,
    prefixTokens: PREFIX,
    genTokens: GEN,
    cells: cellsUsed,
    restoreMs: median(restoreMs),
    prefillMs: median(prefillMs),
    restoreOverPrefill: median(restoreMs) / median(prefillMs),
    saveMs: median(saveMs),
    fileBytes: saved.bytes,
    kvBytes: saved.kvBytes,
    logitsBytes: saved.logitsBytes,
    sharedBranches: saved.sharedBranches,
    bytesPerCell: Math.round(bytesPerCell),
    minimumKvBytes: Math.round(cellsUsed * bytesPerCell),
    minimumBytes: Math.round(cellsUsed * bytesPerCell + ownLogits),
    wholeSequencesKvBytes: wholeBytes,
    restoreRuns: restoreMs.map((x) => Math.round(x)),
    prefillRuns: prefillMs.map((x) => Math.round(x)),
  };
  fs.rmSync(dir, { recursive: true, force: true });
  ctx.dispose();
  ctx2.dispose();
  if (args.json) {
    console.log(JSON.stringify(result, null, 2));
    return;
  }
  const mb = (x) => `${(x / 2 ** 20).toFixed(1)} MiB`;
  console.log(`tree of ${N} branches: ${PREFIX}-token prefix, ${GEN} own tokens per branch, ${cellsUsed} KV cells`);
  console.log(`  ${result.machine}`);
  console.log(
    `  restore ${result.restoreMs.toFixed(0)} ms vs prefill ${result.prefillMs.toFixed(0)} ms: ${(100 * result.restoreOverPrefill).toFixed(1)} % (median of ${REPS}, interleaved)`,
  );
  console.log(`  save ${result.saveMs.toFixed(0)} ms`);
  console.log(
    `  file ${mb(result.fileBytes)} = KV ${mb(result.kvBytes)} + logits ${mb(result.logitsBytes)} + ${((result.fileBytes - result.kvBytes - result.logitsBytes) / 1024) | 0} KiB`,
  );
  console.log(
    `  at least: every cell once ${mb(result.minimumKvBytes)} (${result.bytesPerCell} B/cell) + own logits ${mb(ownLogits)} = ${mb(result.minimumBytes)}; each sequence whole: KV ${mb(wholeBytes)}`,
  );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
