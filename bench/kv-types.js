#!/usr/bin/env node
'use strict';

/**
 * KV cache types and flash attention (issue 39): for each `typeK`/`typeV`/`flashAttention`
 * setting, a 255-branch tree on the default model — a 128-token prompt, then 7 levels in which
 * every branch of the deepest level forks twice (1 + 2 + … + 128 = 255 branches, all alive) and
 * the new level commits 2 greedy tokens — then 8 timed steps in which all 255 branches sample
 * (`store.produce`) and commit one token in one `store.commit`. Reports the KV bytes a cell
 * takes (sequence 0's saved state over its cells, on the prompt alone), the tree's cells and so
 * its KV bytes, the process's RSS growth on context creation (the KV buffers are allocated for
 * all of nCtx there) and the median step. Each setting runs in its own process (clean RSS),
 * rounds alternate the order so that load changes hit every setting alike.
 *
 * Usage: node bench/kv-types.js [--rounds=2] [--steps=8]   (also: npm run bench -- --kv)
 */

const { execFileSync } = require('node:child_process');
const { args, modelPath, median } = require('./common');

const SETTINGS = [
  { typeK: 'f16', typeV: 'f16', flashAttention: 'off' },
  { typeK: 'f16', typeV: 'f16', flashAttention: 'auto' },
  { typeK: 'q8_0', typeV: 'q8_0', flashAttention: 'auto' },
  { typeK: 'q4_0', typeV: 'q4_0', flashAttention: 'auto' },
];
const ROUNDS = Number(args.rounds || 2);
const STEPS = Number(args.steps || 8);
const THREADS = 2;
const N_CTX = 8192; // the tree: 128 + 254 × 2 cells, then 255 per step
const LEVELS = 7;
const PROMPT_TOKENS = 128;
const WORDS =
  'The history of the city began with a small settlement by the river, where traders met every spring to exchange grain, cloth and stories. ';

const now = () => Number(process.hrtime.bigint()) / 1e6;

/** One setting, in this process: the measurements as one JSON line on stdout. */
async function one(setting) {
  // Required here, not at the top: the parent process never loads the addon, so each child's
  // RSS growth is its own context's.
  const { createContext, Branch, BranchStore } = require('..');
  const rss0 = process.memoryUsage().rss;
  const ctx = await createContext({
    modelPath: modelPath(),
    nCtx: N_CTX,
    nSeqMax: 256,
    nThreads: THREADS,
    ...setting,
  });
  const rssCtx = process.memoryUsage().rss - rss0;
  const prompt = (await ctx.tokenize(WORDS.repeat(8))).slice(0, PROMPT_TOKENS);
  await ctx.decode(prompt, 0, 0);
  const bytesPerCell = (await ctx.kvCacheSave(0)).length / prompt.length;
  await ctx.kvCacheClear();

  const store = new BranchStore(ctx);
  const root = Branch.create(ctx, 0, { temperature: 0 });
  await root.prefill(prompt);
  const all = [root];
  let level = [root];
  for (let d = 0; d < LEVELS; d++) {
    level = level.flatMap((b) => [b.fork(), b.fork()]);
    all.push(...level);
    for (let t = 0; t < 2; t++) {
      const produced = store.produce(level);
      await store.commit(level.map((b, i) => [b, produced[i].token]));
    }
  }
  const step = async () => {
    const produced = store.produce(all);
    await store.commit(all.map((b, i) => [b, produced[i].token]));
  };
  await step(); // warm-up: first use of the 255-row shape
  const ms = [];
  for (let s = 0; s < STEPS; s++) {
    const t0 = now();
    await step();
    ms.push(now() - t0);
  }
  const { cellsUsed } = store.kvPressure();
  const result = {
    ...setting,
    resolvedFlash: ctx.flashAttention,
    branches: all.length,
    bytesPerCell,
    cellsUsed,
    treeKvBytes: cellsUsed * bytesPerCell,
    rssCtxMiB: rssCtx / 2 ** 20,
    stepMs: median(ms),
  };
  await root.pruneSubtree();
  ctx.dispose();
  return result;
}

async function main() {
  const byName = new Map();
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 === 0 ? SETTINGS : [...SETTINGS].reverse();
    for (const s of order) {
      const out = execFileSync(process.execPath, [__filename, `--one=${JSON.stringify(s)}`, `--steps=${STEPS}`], {
        env: process.env,
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      const res = JSON.parse(out.toString().trim().split('\n').pop());
      const name = `${s.typeK}/${s.typeV} fa=${s.flashAttention}`;
      console.error(`[bench] round ${r + 1} ${name}: ${res.stepMs.toFixed(1)} ms/step`);
      if (!byName.has(name)) byName.set(name, []);
      byName.get(name).push(res);
    }
  }
  const lines = [
    `| typeK / typeV | flashAttention (ctx reports) | bytes per cell | tree cells | tree KV MiB | RSS on creation MiB | ms per step (${STEPS} steps × 255 rows, median; per round) | tok/s |`,
    '|---|---|---:|---:|---:|---:|---:|---:|',
  ];
  for (const [, runs] of byName) {
    const first = runs[0];
    const step = median(runs.map((x) => x.stepMs));
    lines.push(
      `| ${first.typeK} / ${first.typeV} | ${first.flashAttention} (${first.resolvedFlash}) | ${Math.round(first.bytesPerCell)} | ${first.cellsUsed} | ${(first.treeKvBytes / 2 ** 20).toFixed(1)} | ${median(runs.map((x) => x.rssCtxMiB)).toFixed(0)} | ${step.toFixed(1)} (${runs.map((x) => x.stepMs.toFixed(1)).join(', ')}) | ${((first.branches * 1000) / step).toFixed(0)} |`,
    );
  }
  console.log(lines.join('\n'));
}

if (require.main === module) {
  const run = args.one ? () => one(JSON.parse(args.one)).then((r) => console.log(JSON.stringify(r))) : main;
  run().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { main };
