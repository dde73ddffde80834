#!/usr/bin/env node
'use strict';

/**
 * Long randomised soak outside CI: `npm run soak -- [seed] [steps] [--contexts N]`.
 * Runs the property test's random operation engine (test/random-ops.js) for `steps` steps
 * (default 100000) per context, checking every invariant after each step, then creates and
 * disposes N contexts (default 1000) and reports RSS before and after.
 */

const path = require('node:path');
const { ensureModel } = require('../scripts/fetch-model');
const { createContext } = require('..');
const { runRandomOps } = require('./random-ops');

async function main() {
  const args = process.argv.slice(2);
  const flag = (name, fallback) => {
    const i = args.indexOf(name);
    if (i < 0) return fallback;
    const v = Number(args[i + 1]);
    args.splice(i, 2);
    return v;
  };
  const contexts = flag('--contexts', 1000);
  const seed = Number(args[0] || Date.now() % 2 ** 31);
  const steps = Number(args[1] || 100000);
  const modelPath = process.env.LLAMA_TEST_MODEL ? path.resolve(process.env.LLAMA_TEST_MODEL) : ensureModel();
  const mib = () => (process.memoryUsage().rss / 2 ** 20).toFixed(1);

  console.log(`soak: seed ${seed}, ${steps} steps (rerun with: npm run soak -- ${seed} ${steps})`);
  // One thread: ggml's spinning thread barrier is slow whenever other processes share the CPUs.
  const ctx = await createContext({ modelPath, nCtx: 256, nBatch: 32, nSeqMax: 8, nThreads: 1 });
  const started = Date.now();
  const rssStart = mib();
  const { stats } = await runRandomOps(ctx, {
    seed,
    steps,
    onProgress: (n) => console.log(`  ${n} steps, ${((Date.now() - started) / 1000).toFixed(0)} s, RSS ${mib()} MiB`),
  });
  ctx.dispose();
  console.log(
    `random ops: ${stats.steps} steps in ${((Date.now() - started) / 1000).toFixed(0)} s; RSS ${rssStart} -> ${mib()} MiB`,
  );
  console.log(`  ${JSON.stringify(stats)}`);

  if (contexts > 0) {
    // one context keeps the model loaded (contexts on one file share it); warm allocator caches first
    const keep = await createContext({ modelPath, nCtx: 256, nSeqMax: 1, nThreads: 1 });
    for (let i = 0; i < 50; i++) (await createContext({ modelPath, nCtx: 256, nSeqMax: 2, nThreads: 1 })).dispose();
    global.gc?.();
    const before = process.memoryUsage().rss;
    const t0 = Date.now();
    for (let i = 0; i < contexts; i++) {
      const c = await createContext({ modelPath, nCtx: 256, nSeqMax: 2, nThreads: 1 });
      c.dispose();
    }
    global.gc?.();
    keep.dispose();
    const growth = (process.memoryUsage().rss - before) / 2 ** 20;
    console.log(
      `${contexts} context create/dispose cycles in ${((Date.now() - t0) / 1000).toFixed(0)} s; RSS growth ${growth.toFixed(1)} MiB (${((growth * 1024) / contexts).toFixed(2)} KiB per cycle)`,
    );
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
