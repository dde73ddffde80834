#!/usr/bin/env node
'use strict';

/**
 * Parked branches (`node bench/park.js`, issue 62), in one run on one context:
 *
 * - **resume against re-prefill**: a root holding a 64-token prompt, a fork that holds `own`
 *   tokens of its own (64, 512, 2000), parked; then brought back two ways, interleaved `--reps`
 *   times (median reported): `resume()` from RAM, `resume()` from a spill file
 *   (`setParkSpill({ ramBytes: 0 })`), and re-prefilling a fresh fork from the same tokens (what a
 *   search without parking does for a node it pruned). Time and tokens decoded.
 * - **the search of examples/park-search.js** with parking on `nSeqMax` 16 against the same
 *   search keeping every node live: peak KV cells and leases, wall time, the same best path.
 *
 * Flags: --reps=5 --threads=2 --width=3 --depth=4 --json
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { createContext, Branch, BranchStore } = require('..');
const { search } = require('../examples/park-search');
const { args, modelPath, median } = require('./common');

const REPS = Number(args.reps || 5);
const THREADS = Number(args.threads || 2);
const OWN = [64, 512, 2000];

const time = async (f) => {
  const t0 = performance.now();
  await f();
  return performance.now() - t0;
};

/** One size: a fork with `own` tokens beyond a 64-token prompt, brought back three ways. */
async function resumeVsPrefill(ctx, store, dir, prompt, filler, own) {
  const root = Branch.create(ctx, 0, { temperature: 0 });
  await root.prefill(prompt);
  const tokens = filler.slice(0, own);
  const child = root.fork();
  await child.prefill(tokens);
  const series = { ram: [], disk: [], prefill: [] };
  for (let r = 0; r < REPS; r++) {
    store.setParkSpill();
    await child.park();
    series.ram.push(await time(() => child.resume()));
    store.setParkSpill({ ramBytes: 0, dir });
    await child.park();
    series.disk.push(await time(() => child.resume()));
    store.setParkSpill();
    series.prefill.push(
      await time(async () => {
        const again = root.fork();
        await again.prefill(tokens);
        await again.prune();
      }),
    );
  }
  await root.pruneSubtree();
  const ms = Object.fromEntries(Object.entries(series).map(([k, v]) => [k, median(v)]));
  return { own, ms, ramRatio: ms.ram / ms.prefill, diskRatio: ms.disk / ms.prefill, prefillTokens: own };
}

async function main() {
  const model = modelPath();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-bench-park-'));
  const out = { date: new Date().toISOString(), threads: THREADS, reps: REPS, resume: [], search: {} };
  try {
    const ctx = await createContext({ modelPath: model, nCtx: 4096, nBatch: 512, nThreads: THREADS, nSeqMax: 4 });
    const store = new BranchStore(ctx);
    const words = 'the quick brown fox jumps over the lazy dog while a printing press hums '.repeat(300);
    const all = await ctx.tokenize(words);
    const prompt = all.slice(0, 64);
    for (const own of OWN) {
      const row = await resumeVsPrefill(ctx, store, dir, prompt, all.slice(64), own);
      out.resume.push(row);
      console.error(
        `[bench:park] own ${own}: resume RAM ${row.ms.ram.toFixed(1)} ms, disk ${row.ms.disk.toFixed(1)} ms, re-prefill ${row.ms.prefill.toFixed(1)} ms (${own} tokens decoded): RAM ${(100 * row.ramRatio).toFixed(1)} %, disk ${(100 * row.diskRatio).toFixed(1)} %`,
      );
    }
    ctx.dispose();

    const opts = {
      prompt: 'The three most useful things to pack for a week of hiking are',
      width: Number(args.width || 3),
      depth: Number(args.depth || 4),
    };
    const runs = {};
    for (const [name, nSeqMax, park] of [
      ['parked', 16, true],
      ['live', 128, false],
    ]) {
      const c = await createContext({ modelPath: model, nCtx: 4096, nThreads: THREADS, nSeqMax, deterministic: true });
      const started = performance.now();
      const r = await search(c, { ...opts, park });
      runs[name] = {
        nSeqMax,
        nodes: r.nodes,
        peakCells: r.peakCells,
        peakLeases: r.peakLeases,
        seconds: (performance.now() - started) / 1000,
        best: r.best,
      };
      c.dispose();
    }
    out.search = {
      ...runs,
      sameBest: JSON.stringify(runs.parked.best) === JSON.stringify(runs.live.best),
      cellsRatio: runs.parked.peakCells / runs.live.peakCells,
      timeRatio: runs.parked.seconds / runs.live.seconds,
    };
    console.error(
      `[bench:park] search of ${runs.parked.nodes} nodes: parked peak ${runs.parked.peakCells} cells / ${runs.parked.peakLeases} leases in ${runs.parked.seconds.toFixed(1)} s; live ${runs.live.peakCells} cells / ${runs.live.peakLeases} leases in ${runs.live.seconds.toFixed(1)} s; cells ${out.search.cellsRatio.toFixed(3)}x, time ${out.search.timeRatio.toFixed(2)}x, same best path: ${out.search.sameBest}`,
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  const file = path.join(__dirname, 'results', `park-${Date.now()}.json`);
  fs.writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
  if (args.json) console.log(JSON.stringify(out));
  console.error(`[bench:park] wrote ${path.relative(path.join(__dirname, '..'), file)}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
