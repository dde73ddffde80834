#!/usr/bin/env node
'use strict';

/**
 * Benchmark: N-branch greedy generation on the default model, three ways, in one run:
 *   ours       store.produce(branches) + ONE store.commit per step (the loop a user writes)
 *   sequential the same branches advanced one branch.commit at a time
 *   raw        the same batches fed straight to llama_decode from Rust, argmax only
 * plus prefill throughput, produce() cost, fork() cost and RSS. Ratios are the headline:
 * this machine is noisy, absolute numbers move ±15 % between runs.
 *
 * Usage: node bench/run.js [--quick] [--n=1,2,4,8] [--steps=32] [--reps=3]
 * Writes bench/results/bench-<timestamp>.json and bench/results/chart.svg.
 */

const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { createContext, Branch, BranchStore, jsonSchemaToGrammar } = require('..');
const { ensureModel } = require('../scripts/fetch-model');

const args = Object.fromEntries(process.argv.slice(2).map((a) => {
  const [k, v] = a.replace(/^--/, '').split('=');
  return [k, v === undefined ? true : v];
}));
const QUICK = Boolean(args.quick);
const NS = (args.n ? String(args.n).split(',').map(Number) : QUICK ? [1, 2, 4, 8] : [1, 2, 4, 8, 16, 32, 64]);
const STEPS = Number(args.steps || (QUICK ? 16 : 32));
const REPS = Number(args.reps || (QUICK ? 1 : 3));
const THREADS = 2;
const MODEL = process.env.LLAMA_TEST_MODEL ? path.resolve(process.env.LLAMA_TEST_MODEL) : ensureModel();

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const now = () => Number(process.hrtime.bigint()) / 1e6;
const log = (...a) => console.error('[bench]', ...a);

/** Prompt in seq 0, root + N-1 forks, each with a distinct first token (not timed). */
async function setup(ctx, prompt, n) {
  await ctx.decode(prompt, 0, 0);
  const root = Branch.create(ctx, prompt.length, { temperature: 0 });
  root.captureLogits();
  const branches = [root];
  for (let i = 1; i < n; i++) branches.push(root.fork());
  const logits = root.getLogits();
  const top = Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a]).slice(0, n);
  await new BranchStore(ctx).commit(branches.map((b, i) => [b, top[i]]));
  return branches;
}

async function teardown(ctx, branches) {
  await branches[0].pruneSubtree();
  await ctx.kvCacheClear();
}

async function ours(ctx, store, prompt, n) {
  const branches = await setup(ctx, prompt, n);
  const t0 = now();
  for (let s = 0; s < STEPS; s++) {
    const produced = store.produce(branches);
    await store.commit(branches.map((b, i) => [b, produced[i].token]));
  }
  const ms = now() - t0;
  await teardown(ctx, branches);
  return ms;
}

async function sequential(ctx, prompt, n) {
  const branches = await setup(ctx, prompt, n);
  const t0 = now();
  for (let s = 0; s < STEPS; s++) {
    for (const b of branches) await b.commit(b.produce().token);
  }
  const ms = now() - t0;
  await teardown(ctx, branches);
  return ms;
}

function perCall(fn, calls) {
  fn();
  const t0 = now();
  for (let i = 0; i < calls; i++) fn();
  return ((now() - t0) / calls) * 1000;
}

function rssAfterLoad(nSeqMax) {
  const code = `require(${JSON.stringify(path.join(__dirname, '..'))}).createContext({modelPath:${JSON.stringify(MODEL)},nCtx:4096,nSeqMax:${nSeqMax},nThreads:${THREADS}}).then(c=>{process.stdout.write(String(process.memoryUsage().rss));c.dispose();})`;
  return Number(execFileSync(process.execPath, ['-e', code]).toString()) / 2 ** 20;
}

function svgChart(rows) {
  const W = 640, H = 360, pad = 50;
  const maxY = Math.max(...rows.flatMap((r) => [r.oursTps, r.seqTps, r.rawTps])) * 1.1;
  const xs = rows.map((r) => r.n);
  const x = (n) => pad + ((Math.log2(n) - Math.log2(xs[0])) / Math.max(1, Math.log2(xs[xs.length - 1]) - Math.log2(xs[0]))) * (W - 2 * pad);
  const y = (v) => H - pad - (v / maxY) * (H - 2 * pad);
  const series = [['rawTps', '#999', 'raw llama_decode'], ['oursTps', '#d33', 'ours (store.commit + produce)'], ['seqTps', '#36c', 'sequential branch.commit']];
  const lines = series.map(([k, color, label], i) => {
    const pts = rows.map((r) => `${x(r.n).toFixed(1)},${y(r[k]).toFixed(1)}`).join(' ');
    return `<polyline fill="none" stroke="${color}" stroke-width="2" points="${pts}"/>` +
      `<text x="${pad + 10}" y="${pad + 16 * i}" fill="${color}" font-size="12">${label}</text>`;
  });
  const ticks = rows.map((r) => `<text x="${x(r.n)}" y="${H - pad + 16}" font-size="11" text-anchor="middle">${r.n}</text>`);
  const yt = [0, 0.25, 0.5, 0.75, 1].map((f) => `<text x="${pad - 6}" y="${y(f * maxY) + 4}" font-size="11" text-anchor="end">${Math.round(f * maxY)}</text>`);
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<line x1="${pad}" y1="${H - pad}" x2="${W - pad}" y2="${H - pad}" stroke="black"/><line x1="${pad}" y1="${pad}" x2="${pad}" y2="${H - pad}" stroke="black"/>
${ticks.join('')}${yt.join('')}
<text x="${W / 2}" y="${H - 10}" font-size="12" text-anchor="middle">branches (N)</text>
<text x="14" y="${H / 2}" font-size="12" transform="rotate(-90 14 ${H / 2})" text-anchor="middle">tokens/s</text>
${lines.join('\n')}
</svg>\n`;
}

async function main() {
  const maxN = Math.max(...NS);
  const ctx = await createContext({ modelPath: MODEL, nCtx: 4096, nSeqMax: Math.max(maxN, 2), nThreads: THREADS });
  const store = new BranchStore(ctx);
  const words = 'The history of the city began with a small settlement by the river, where traders met every spring to exchange grain, cloth and stories. ';
  const prompt = (await ctx.tokenize(words.repeat(6))).slice(0, 128);
  log(`model ${path.basename(MODEL)}, ${THREADS} threads, prompt ${prompt.length} tokens, ${STEPS} steps, ${REPS} reps, N = ${NS.join(',')}`);

  // warm-up (excluded)
  await ours(ctx, store, prompt, Math.min(4, maxN));
  await ctx._benchRawGenerate(prompt, 1, 4);

  const rows = [];
  for (const n of NS) {
    const o = [], s = [], r = [];
    for (let rep = 0; rep < REPS; rep++) {
      r.push(await ctx._benchRawGenerate(prompt, n, STEPS));
      o.push(await ours(ctx, store, prompt, n));
      s.push(await sequential(ctx, prompt, n));
    }
    const tps = (ms) => (n * STEPS) / (ms / 1000);
    const row = { n, oursMsPerStep: median(o) / STEPS, seqMsPerStep: median(s) / STEPS, rawMsPerStep: median(r) / STEPS, oursTps: tps(median(o)), seqTps: tps(median(s)), rawTps: tps(median(r)) };
    row.oursOverRaw = row.oursTps / row.rawTps;
    row.oursOverSeq = row.oursTps / row.seqTps;
    rows.push(row);
    log(`N=${n}: ours ${row.oursTps.toFixed(1)} tok/s (${row.oursMsPerStep.toFixed(1)} ms/step), sequential ${row.seqTps.toFixed(1)}, raw ${row.rawTps.toFixed(1)}; ours/raw ${row.oursOverRaw.toFixed(3)}, ours/seq ${row.oursOverSeq.toFixed(2)}`);
  }

  // prefill: one 512-token run, and 16 runs of 32 tokens packed by store.prefill
  const long = (await ctx.tokenize(words.repeat(30), false)).slice(0, 512);
  await ctx.decode([long[0]], 0, 0);
  const solo = Branch.create(ctx, 1, { temperature: 0 });
  let t0 = now();
  await solo.prefill(long.slice(1));
  const prefillSoloTps = 511 / ((now() - t0) / 1000);
  const kids = Array.from({ length: 15 }, () => solo.fork());
  const runs = [solo, ...kids].map((b, i) => [b, long.slice(i * 32, i * 32 + 32)]);
  t0 = now();
  await store.prefill(runs);
  const prefillPackedTps = 512 / ((now() - t0) / 1000);
  await solo.pruneSubtree();
  await ctx.kvCacheClear();
  log(`prefill: 1×512 ${prefillSoloTps.toFixed(0)} tok/s, 16×32 packed ${prefillPackedTps.toFixed(0)} tok/s`);

  // fork of a ~1k-token branch: time and cells
  const thousand = (await ctx.tokenize(words.repeat(40))).slice(0, 1000);
  await ctx.decode(thousand, 0, 0);
  const big = Branch.create(ctx, thousand.length, { temperature: 0 });
  big.captureLogits();
  const cellsBefore = store.kvPressure().cellsUsed;
  t0 = now();
  const forks = Array.from({ length: 8 }, () => big.fork());
  const forkUs = ((now() - t0) / 8) * 1000;
  const cellsAfter = store.kvPressure().cellsUsed;
  log(`fork of a ${thousand.length}-token branch: ${forkUs.toFixed(0)} µs, cells ${cellsBefore} -> ${cellsAfter} after 8 forks`);

  // produce() per call on the 262k vocabulary
  const produceUs = {};
  produceUs.greedy = perCall(() => forks[0].produce(), 300);
  forks[1].setSamplerParams({});
  produceUs.defaultParams = perCall(() => forks[1].produce(), 300);
  forks[2].setSamplerParams({ temperature: 0.8, topK: 0, topP: 0.95, minP: 0.05 });
  produceUs.fullVocabTopP = perCall(() => forks[2].produce(), 50);
  forks[3].setSamplerParams({ temperature: 0, grammar: await jsonSchemaToGrammar({ type: 'object', properties: { a: { type: 'string' } } }) });
  produceUs.grammar = perCall(() => forks[3].produce(), 100);
  forks[4].setSamplerParams({ temperature: 0.8, penalties: { repeat: 1.1 } });
  produceUs.penalties = perCall(() => forks[4].produce(), 50);
  log(`produce() µs/call: ${JSON.stringify(Object.fromEntries(Object.entries(produceUs).map(([k, v]) => [k, Math.round(v)])))}`);
  await big.pruneSubtree();
  ctx.dispose();

  const rss = { 1: rssAfterLoad(1), 8: rssAfterLoad(8), 32: rssAfterLoad(32) };
  log(`RSS after load (MiB) by nSeqMax: ${JSON.stringify(Object.fromEntries(Object.entries(rss).map(([k, v]) => [k, Math.round(v)])))}`);

  const result = { date: new Date().toISOString(), model: path.basename(MODEL), threads: THREADS, promptTokens: prompt.length, steps: STEPS, reps: REPS, rows, prefillSoloTps, prefillPackedTps, forkUs, forkCells: { before: cellsBefore, after: cellsAfter }, produceUs, rssMiB: rss };
  const dir = path.join(__dirname, 'results');
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `bench-${result.date.replace(/[:.]/g, '-')}.json`);
  fs.writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  fs.writeFileSync(path.join(dir, 'chart.svg'), svgChart(rows));
  console.log(JSON.stringify(result, null, 2));
  log(`wrote ${path.relative(process.cwd(), file)} and bench/results/chart.svg`);
}

if (require.main === module) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { svgChart };
