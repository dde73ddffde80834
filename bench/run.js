#!/usr/bin/env node
'use strict';

/**
 * Benchmark (issue 6): N-branch greedy generation on the default model, three ways, measured
 * interleaved in one run so that machine noise hits all three alike:
 *   ours        store.produce(branches) + ONE store.commit per step (the loop a user writes)
 *   sequential  the same branches advanced one branch.produce() + branch.commit at a time
 *   raw         the same batches fed straight to llama_decode from Rust, argmax only
 * plus prefill throughput (1×512 and 16×32 through store.prefill), the 2-row batch plan,
 * fork() cost and KV cells, produce() cost per call, and RSS after load (separate processes).
 * Ratios are the headline: absolute numbers move with machine load.
 *
 * Usage: node bench/run.js [--quick] [--n=1,2,4,8] [--steps=32] [--reps=3]
 *        node bench/run.js --serve [--c=1,4,8,16] [--reps=2]   (bench/serve.js: the Scheduler)
 *        node bench/run.js --rpc [--steps=24] [--reps=3]       (bench/rpc.js: local vs two RPC servers)
 *        node bench/run.js --programs [--c=1,4] [--reps=2]     (bench/programs.js: branch programs)
 *        node bench/run.js --agents [--reps=3] [--calls=100]   (bench/agents.js: tool calls, logprobs)
 *        node bench/run.js --spec [--reps=3] [--tokens=256]    (bench/spec.js: speculative decoding)
 *        node bench/run.js --vulkan [--reps=3] [--tokens=16]   (bench/vulkan.js: Vulkan prebuilt vs source build)
 *        node bench/run.js --kv [--rounds=2] [--steps=8]       (bench/kv-types.js: KV cache types, flash attention)
 * Writes bench/results/bench-<timestamp>.json and bench/results/chart.svg (chart-partial.svg
 * when --quick, --n, --steps or --reps narrow the run); prints a table.
 *
 * Prebuilt vs source build: node bench/run.js --compare-prebuilt[=<file.node>] [--rounds=5]
 * [--n=1,16] [--reps=3] runs the ours and raw series (N = 1 and 16 by default) in child
 * processes, alternately with the source build (build/llama_branch.node) and the prebuilt
 * (default npm/<platform>/llama_branch.<platform>.node, made by `npm run build:prebuilt`), and prints
 * prebuilt/native per N. Writes bench/results/prebuilt-<timestamp>.json.
 */

const fs = require('node:fs');
const path = require('node:path');
const { execFileSync, spawnSync } = require('node:child_process');
const { createContext, Branch, BranchStore, jsonSchemaToGrammar, systemInfo } = require('..');
const { args, modelPath, median } = require('./common');
const { nativeOf } = require('../lib/Context'); // the raw-loop baseline is internal

const QUICK = Boolean(args.quick);
const COMPARE = args['compare-prebuilt'] !== undefined;
const NS = args.n
  ? String(args.n).split(',').map(Number)
  : COMPARE
    ? [1, 16]
    : QUICK
      ? [1, 2, 4, 8]
      : [1, 2, 4, 8, 16, 32, 64];
const STEPS = Number(args.steps || (QUICK ? 8 : 32));
const REPS = Number(args.reps || (QUICK ? 1 : 3));
const THREADS = 2;
const N_CTX = 4096;
const PROMPT_TOKENS = 128;
const MODEL = modelPath();

const now = () => Number(process.hrtime.bigint()) / 1e6;
const log = (...a) => console.error('[bench]', ...a);
const WORDS =
  'The history of the city began with a small settlement by the river, where traders met every spring to exchange grain, cloth and stories. ';

/** Prompt in seq 0, root + N-1 forks, each given a distinct first token (not timed). */
async function setup(ctx, store, prompt, n) {
  await ctx.decode(prompt, 0, 0);
  const root = Branch.create(ctx, prompt.length, { temperature: 0 });
  root.captureLogits();
  const branches = [root];
  for (let i = 1; i < n; i++) branches.push(root.fork());
  const logits = root.getLogits();
  const top = Array.from(logits.keys())
    .sort((a, b) => logits[b] - logits[a])
    .slice(0, n);
  await store.commit(branches.map((b, i) => [b, top[i]]));
  return branches;
}

async function teardown(ctx, branches) {
  await branches[0].pruneSubtree();
  await ctx.kvCacheClear();
}

/** The loop a user writes: sample every branch in one call, commit all in one decode. */
async function ours(ctx, store, prompt, n) {
  const branches = await setup(ctx, store, prompt, n);
  const t0 = now();
  for (let s = 0; s < STEPS; s++) {
    const produced = store.produce(branches);
    await store.commit(branches.map((b, i) => [b, produced[i].token]));
  }
  const ms = now() - t0;
  await teardown(ctx, branches);
  return ms;
}

async function sequential(ctx, store, prompt, n) {
  const branches = await setup(ctx, store, prompt, n);
  const t0 = now();
  for (let s = 0; s < STEPS; s++) {
    for (const b of branches) await b.commit(b.produce().token);
  }
  const ms = now() - t0;
  await teardown(ctx, branches);
  return ms;
}

/** Rows per decode in store.commit's plan (kept in sync with BranchStore::commit). */
const planRows = (n) => (n === 2 ? 1 : n);

function perCall(fn, calls) {
  for (let i = 0; i < 3; i++) fn();
  const samples = [];
  for (let i = 0; i < calls; i++) {
    const t0 = now();
    fn();
    samples.push((now() - t0) * 1000);
  }
  return median(samples);
}

function rssAfterLoad(nSeqMax) {
  const code = `require(${JSON.stringify(path.join(__dirname, '..'))}).createContext({modelPath:${JSON.stringify(MODEL)},nCtx:${N_CTX},nSeqMax:${nSeqMax},nThreads:${THREADS}}).then(c=>{process.stdout.write(String(process.memoryUsage().rss));c.dispose();})`;
  return Number(execFileSync(process.execPath, ['-e', code]).toString()) / 2 ** 20;
}

function svgChart(rows, note) {
  const W = 640,
    H = 380,
    pad = 54;
  const maxY = Math.max(...rows.flatMap((r) => [r.oursTps, r.seqTps, r.rawTps])) * 1.1;
  const xs = rows.map((r) => r.n);
  const span = Math.max(1, Math.log2(xs[xs.length - 1]) - Math.log2(xs[0]));
  const x = (n) => pad + ((Math.log2(n) - Math.log2(xs[0])) / span) * (W - 2 * pad);
  const y = (v) => H - pad - (v / maxY) * (H - 2 * pad);
  const series = [
    ['rawTps', '#999', 'raw llama_decode + argmax'],
    ['oursTps', '#d33', 'ours: store.produce + store.commit'],
    ['seqTps', '#36c', 'sequential branch.commit'],
  ];
  const lines = series.map(([k, color, label], i) => {
    const pts = rows.map((r) => `${x(r.n).toFixed(1)},${y(r[k]).toFixed(1)}`).join(' ');
    const dots = rows
      .map((r) => `<circle cx="${x(r.n).toFixed(1)}" cy="${y(r[k]).toFixed(1)}" r="2.5" fill="${color}"/>`)
      .join('');
    return (
      `<polyline fill="none" stroke="${color}" stroke-width="2" points="${pts}"/>${dots}` +
      `<text x="${pad + 10}" y="${pad - 20 + 15 * i}" fill="${color}" font-size="12">${label}</text>`
    );
  });
  const ticks = rows.map(
    (r) => `<text x="${x(r.n)}" y="${H - pad + 16}" font-size="11" text-anchor="middle">${r.n}</text>`,
  );
  const yt = [0, 0.25, 0.5, 0.75, 1].map(
    (f) =>
      `<text x="${pad - 6}" y="${y(f * maxY) + 4}" font-size="11" text-anchor="end">${Math.round(f * maxY)}</text>` +
      `<line x1="${pad}" y1="${y(f * maxY)}" x2="${W - pad}" y2="${y(f * maxY)}" stroke="#eee"/>`,
  );
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
${yt.join('')}
<line x1="${pad}" y1="${H - pad}" x2="${W - pad}" y2="${H - pad}" stroke="black"/><line x1="${pad}" y1="${pad - 30}" x2="${pad}" y2="${H - pad}" stroke="black"/>
${ticks.join('')}
<text x="${W / 2}" y="${H - 22}" font-size="12" text-anchor="middle">branches (N)</text>
<text x="${W / 2}" y="${H - 6}" font-size="10" fill="#555" text-anchor="middle">${note}</text>
<text x="14" y="${H / 2}" font-size="12" transform="rotate(-90 14 ${H / 2})" text-anchor="middle">tokens/s (all branches)</text>
${lines.join('\n')}
</svg>\n`;
}

function table(rows) {
  const head = '|   N | ours tok/s | seq tok/s | raw tok/s | ours/raw | ours/seq | ours ms/step | raw ms/step |';
  const line = '|----:|-----------:|----------:|----------:|---------:|---------:|-------------:|------------:|';
  const body = rows.map(
    (r) =>
      `| ${String(r.n).padStart(3)} | ${r.oursTps.toFixed(1).padStart(10)} | ${r.seqTps.toFixed(1).padStart(9)} | ${r.rawTps.toFixed(1).padStart(9)} | ${r.oursOverRaw.toFixed(3).padStart(8)} | ${r.oursOverSeq.toFixed(2).padStart(8)} | ${r.oursMsPerStep.toFixed(1).padStart(12)} | ${r.rawMsPerStep.toFixed(1).padStart(11)} |`,
  );
  return [head, line, ...body].join('\n');
}

async function main() {
  const started = now();
  const maxN = Math.max(...NS);
  const nSeqMax = Math.max(maxN, 32);
  const ctx = await createContext({ modelPath: MODEL, nCtx: N_CTX, nSeqMax, nThreads: THREADS });
  const store = new BranchStore(ctx);
  const prompt = (await ctx.tokenize(WORDS.repeat(6))).slice(0, PROMPT_TOKENS);
  log(
    `model ${path.basename(MODEL)}, ${THREADS} threads, nCtx ${N_CTX}, prompt ${prompt.length} tokens, ${STEPS} greedy steps, ${REPS} reps, N = ${NS.join(',')}`,
  );

  // Warm-up (excluded): first decodes allocate and fault in buffers.
  await ours(ctx, store, prompt, Math.min(4, maxN));
  await sequential(ctx, store, prompt, 1);
  await nativeOf(ctx)._benchRawGenerate(prompt, maxN, 2);

  // Generation: per rep, the three series run back to back in a rotating order.
  const rows = [];
  for (const n of NS) {
    const ms = { ours: [], seq: [], raw: [] };
    const run = {
      ours: () => ours(ctx, store, prompt, n),
      seq: () => sequential(ctx, store, prompt, n),
      raw: () => nativeOf(ctx)._benchRawGenerate(prompt, n, STEPS, planRows(n)),
    };
    const order = ['ours', 'seq', 'raw'];
    for (let rep = 0; rep < REPS; rep++) {
      for (let k = 0; k < 3; k++) {
        const name = order[(rep + k) % 3];
        ms[name].push(await run[name]());
      }
    }
    const tps = (x) => (n * STEPS) / (median(x) / 1000);
    const row = {
      n,
      oursTps: tps(ms.ours),
      seqTps: tps(ms.seq),
      rawTps: tps(ms.raw),
      oursMsPerStep: median(ms.ours) / STEPS,
      seqMsPerStep: median(ms.seq) / STEPS,
      rawMsPerStep: median(ms.raw) / STEPS,
      // per-rep ratios (interleaved pairs), for the spread
      oursOverRawReps: ms.ours.map((o, i) => ms.raw[i] / o),
      samplesMs: ms,
    };
    row.oursOverRaw = row.oursTps / row.rawTps;
    row.oursOverSeq = row.oursTps / row.seqTps;
    rows.push(row);
    log(
      `N=${n}: ours ${row.oursTps.toFixed(1)} tok/s (${row.oursMsPerStep.toFixed(1)} ms/step), sequential ${row.seqTps.toFixed(1)}, raw ${row.rawTps.toFixed(1)}; ours/raw ${row.oursOverRaw.toFixed(3)} [reps ${row.oursOverRawReps.map((v) => v.toFixed(3)).join(' ')}], ours/seq ${row.oursOverSeq.toFixed(2)}`,
    );
  }

  // The 2-row plan: one 2-row decode against two 1-row decodes (raw, interleaved).
  const twoRow = { oneDecodeMs: [], twoDecodesMs: [] };
  if (maxN >= 2) {
    for (let rep = 0; rep < REPS; rep++) {
      twoRow.oneDecodeMs.push(await nativeOf(ctx)._benchRawGenerate(prompt, 2, STEPS, 2));
      twoRow.twoDecodesMs.push(await nativeOf(ctx)._benchRawGenerate(prompt, 2, STEPS, 1));
    }
    twoRow.oneDecodeMsPerStep = median(twoRow.oneDecodeMs) / STEPS;
    twoRow.twoDecodesMsPerStep = median(twoRow.twoDecodesMs) / STEPS;
    log(
      `N=2 plan: one 2-row decode ${twoRow.oneDecodeMsPerStep.toFixed(1)} ms/step, two 1-row decodes ${twoRow.twoDecodesMsPerStep.toFixed(1)} ms/step`,
    );
  }

  // Prefill through store.prefill: one 512-token run, and 16 runs of 32 tokens packed together.
  const long = (await ctx.tokenize(WORDS.repeat(30), false)).slice(0, 513);
  const prefill = { soloMs: [], packedMs: [] };
  for (let rep = 0; rep < REPS; rep++) {
    await ctx.decode([long[0]], 0, 0);
    const solo = Branch.create(ctx, 1, { temperature: 0 });
    let t0 = now();
    await store.prefill([[solo, long.slice(1, 513)]]);
    prefill.soloMs.push(now() - t0);
    await teardown(ctx, [solo]);

    await ctx.decode([long[0]], 0, 0);
    const root = Branch.create(ctx, 1, { temperature: 0 });
    const all = [root, ...Array.from({ length: 15 }, () => root.fork())];
    const runs = all.map((b, i) => [b, long.slice(1 + i * 32, 1 + i * 32 + 32)]);
    t0 = now();
    await store.prefill(runs);
    prefill.packedMs.push(now() - t0);
    await teardown(ctx, [root]);
  }
  prefill.soloTps = 512 / (median(prefill.soloMs) / 1000);
  prefill.packedTps = 512 / (median(prefill.packedMs) / 1000);
  log(`prefill: 1×512 ${prefill.soloTps.toFixed(0)} tok/s, 16×32 packed ${prefill.packedTps.toFixed(0)} tok/s`);

  // fork() of a 1000-token branch: µs per fork and KV cells used.
  const thousand = (await ctx.tokenize(WORDS.repeat(40))).slice(0, 1000);
  await ctx.decode(thousand, 0, 0);
  const big = Branch.create(ctx, thousand.length, { temperature: 0 });
  big.captureLogits();
  const nForks = Math.min(nSeqMax - 1, 31);
  const cellsBefore = store.kvPressure().cellsUsed;
  const forkSamples = [];
  const forks = [];
  for (let i = 0; i < nForks; i++) {
    const t0 = now();
    forks.push(big.fork());
    forkSamples.push((now() - t0) * 1000);
  }
  const fork = { us: median(forkSamples), forks: nForks, cellsBefore, cellsAfter: store.kvPressure().cellsUsed };
  log(
    `fork of a ${thousand.length}-token branch: ${fork.us.toFixed(0)} µs (median of ${nForks}); KV cells used ${fork.cellsBefore} -> ${fork.cellsAfter} after ${nForks} forks`,
  );

  // produce() per call on the 262k vocabulary (the branch's logits do not change between calls).
  const calls = QUICK ? 30 : 200;
  const produceUs = {};
  produceUs.greedy = perCall(() => forks[0].produce(), calls);
  forks[1].setSamplerParams({});
  produceUs.defaultParams = perCall(() => forks[1].produce(), calls);
  const grammar = await jsonSchemaToGrammar({
    type: 'object',
    properties: { name: { type: 'string' }, age: { type: 'integer' } },
  });
  forks[2].setSamplerParams({ temperature: 0, grammar });
  produceUs.grammar = perCall(() => forks[2].produce(), Math.ceil(calls / 4));
  forks[3].setSamplerParams({ temperature: 0.8, topK: 0, topP: 0.95, minP: 0.05 });
  produceUs.fullVocabTopP = perCall(() => forks[3].produce(), Math.ceil(calls / 4));
  forks[4].setSamplerParams({ temperature: 0.8, penalties: { repeat: 1.1 } });
  produceUs.penalties = perCall(() => forks[4].produce(), Math.ceil(calls / 4));
  // greedy forks untouched by the parameter changes above
  const batch = forks.slice(5, 21);
  produceUs.storeProducePerBranchGreedy = perCall(() => store.produce(batch), Math.ceil(calls / 4)) / batch.length;
  log(
    `produce() µs/call: ${JSON.stringify(Object.fromEntries(Object.entries(produceUs).map(([k, v]) => [k, Math.round(v)])))}`,
  );
  await big.pruneSubtree();
  ctx.dispose();

  const rss = {};
  for (const n of [1, 8, 32]) rss[n] = rssAfterLoad(n);
  log(
    `RSS after load (MiB) by nSeqMax: ${JSON.stringify(Object.fromEntries(Object.entries(rss).map(([k, v]) => [k, Math.round(v)])))}`,
  );

  const result = {
    date: new Date().toISOString(),
    model: path.basename(MODEL),
    cpu: systemInfo(),
    threads: THREADS,
    nCtx: N_CTX,
    promptTokens: prompt.length,
    steps: STEPS,
    reps: REPS,
    quick: QUICK,
    rows,
    twoRow,
    prefill,
    fork,
    produceUs,
    rssMiB: rss,
    wallSeconds: (now() - started) / 1000,
  };
  const dir = path.join(__dirname, 'results');
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `bench-${result.date.replace(/[:.]/g, '-')}.json`);
  fs.writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  const note = `Gemma 3 270M Q4_K_M, ${THREADS} threads, ${STEPS} greedy steps, median of ${REPS}; ${result.date.slice(0, 10)}`;
  // Only a full default run replaces the chart the README shows; partial runs get their own.
  const partial = QUICK || args.n || args.steps || args.reps;
  const chartName = partial ? 'chart-partial.svg' : 'chart.svg';
  fs.writeFileSync(path.join(dir, chartName), svgChart(rows, note));

  console.log(table(rows));
  console.log(
    `N=2 plan (raw ms/step): one 2-row decode ${twoRow.oneDecodeMsPerStep?.toFixed(1)}, two 1-row decodes ${twoRow.twoDecodesMsPerStep?.toFixed(1)}`,
  );
  console.log(`prefill tok/s: 1×512 ${prefill.soloTps.toFixed(0)}, 16×32 packed ${prefill.packedTps.toFixed(0)}`);
  console.log(
    `fork() of a ${thousand.length}-token branch: ${fork.us.toFixed(0)} µs; KV cells used ${fork.cellsBefore} -> ${fork.cellsAfter} after ${fork.forks} forks`,
  );
  console.log(
    `produce() µs/call: greedy ${produceUs.greedy.toFixed(0)}, default params ${produceUs.defaultParams.toFixed(0)}, grammar ${produceUs.grammar.toFixed(0)}, topK 0 ${produceUs.fullVocabTopP.toFixed(0)}, penalties ${produceUs.penalties.toFixed(0)}, store.produce per branch ${produceUs.storeProducePerBranchGreedy.toFixed(0)}`,
  );
  console.log(`RSS after load (MiB): nSeqMax 1 ${rss[1].toFixed(0)}, 8 ${rss[8].toFixed(0)}, 32 ${rss[32].toFixed(0)}`);
  console.log(
    `wrote ${path.relative(process.cwd(), file)} and bench/results/${chartName} in ${result.wallSeconds.toFixed(0)} s`,
  );
}

/**
 * --series-json (a child of --compare-prebuilt): the ours and raw generation series for NS,
 * interleaved per rep like main()'s, as one JSON line { info, rows: [{ n, oursMs, rawMs }] }.
 */
async function seriesJson() {
  const maxN = Math.max(...NS);
  const ctx = await createContext({ modelPath: MODEL, nCtx: N_CTX, nSeqMax: Math.max(maxN, 32), nThreads: THREADS });
  const store = new BranchStore(ctx);
  const prompt = (await ctx.tokenize(WORDS.repeat(6))).slice(0, PROMPT_TOKENS);
  await ours(ctx, store, prompt, Math.min(4, maxN));
  const raw = hasRawLoop(); // a prebuilt has no raw loop: its raw series stays empty
  if (raw) await nativeOf(ctx)._benchRawGenerate(prompt, maxN, 2);
  const rows = [];
  for (const n of NS) {
    const row = { n, oursMs: [], rawMs: [] };
    for (let rep = 0; rep < REPS; rep++) {
      const pair = [
        async () => row.oursMs.push(await ours(ctx, store, prompt, n)),
        async () => raw && row.rawMs.push(await nativeOf(ctx)._benchRawGenerate(prompt, n, STEPS, planRows(n))),
      ];
      for (const run of rep % 2 ? pair.reverse() : pair) await run();
    }
    rows.push(row);
  }
  ctx.dispose();
  console.log(JSON.stringify({ info: systemInfo(), rows }));
}

/**
 * --compare-prebuilt: the source build and the prebuilt, each in its own child process (the
 * loader takes LLAMA_BRANCH_BINARY), alternating binaries and their order per round so that
 * load changes on the machine hit both alike. Ratios are prebuilt tok/s over native tok/s.
 */
async function comparePrebuilt() {
  const { platformKey } = require('../lib/loader');
  const key = platformKey();
  const binaries = {
    // The bench build (this process runs on it, see benchBuild): the prebuilt has no raw loop.
    native: process.env.LLAMA_BRANCH_BINARY || path.join(__dirname, '..', 'build', 'llama_branch.node'),
    prebuilt:
      typeof args['compare-prebuilt'] === 'string'
        ? path.resolve(args['compare-prebuilt'])
        : path.join(__dirname, '..', 'npm', key, `llama_branch.${key}.node`),
  };
  if (!fs.existsSync(binaries.native)) throw new Error(`${binaries.native} is missing: npm run build first`);
  if (!fs.existsSync(binaries.prebuilt))
    throw new Error(
      `${binaries.prebuilt} is missing: npm run build:prebuilt first (or pass --compare-prebuilt=<file.node>)`,
    );
  const rounds = Number(args.rounds || 5);
  const childArgs = [__filename, '--series-json', `--n=${NS.join(',')}`, `--steps=${STEPS}`, `--reps=${REPS}`];
  const samples = { native: {}, prebuilt: {} };
  const info = {};
  const roundRatios = [];
  log(
    `prebuilt ${binaries.prebuilt} vs native ${binaries.native}: N = ${NS.join(',')}, ${rounds} rounds x ${REPS} reps x ${STEPS} steps, ${THREADS} threads`,
  );
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 ? ['prebuilt', 'native'] : ['native', 'prebuilt'];
    const roundMedians = {};
    for (const which of order) {
      const res = spawnSync(process.execPath, childArgs, {
        env: { ...process.env, LLAMA_BRANCH_BINARY: binaries[which] },
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      if (res.status !== 0) throw new Error(`the ${which} child exited with ${res.status}`);
      const out = JSON.parse(res.stdout.trim().split('\n').pop());
      info[which] = out.info;
      roundMedians[which] = {};
      for (const row of out.rows) {
        const s = (samples[which][row.n] ||= { oursMs: [], rawMs: [] });
        s.oursMs.push(...row.oursMs);
        s.rawMs.push(...row.rawMs);
        roundMedians[which][row.n] = { ours: median(row.oursMs), raw: median(row.rawMs) };
      }
    }
    roundRatios.push(
      Object.fromEntries(
        NS.map((n) => [
          n,
          {
            ours: roundMedians.native[n].ours / roundMedians.prebuilt[n].ours,
            raw: roundMedians.native[n].raw / roundMedians.prebuilt[n].raw,
          },
        ]),
      ),
    );
    log(
      `round ${round + 1}/${rounds}: prebuilt/native ${NS.map((n) => `N=${n} ours ${roundRatios[round][n].ours.toFixed(3)}`).join(', ')}`,
    );
  }
  const tps = (n, ms) => (n * STEPS) / (median(ms) / 1000);
  const rows = NS.map((n) => {
    const r = { n };
    for (const which of ['native', 'prebuilt']) {
      r[`${which}OursTps`] = tps(n, samples[which][n].oursMs);
      r[`${which}RawTps`] = tps(n, samples[which][n].rawMs);
    }
    r.oursRatio = r.prebuiltOursTps / r.nativeOursTps;
    r.rawRatio = r.prebuiltRawTps / r.nativeRawTps;
    r.oursRatioPerRound = roundRatios.map((x) => x[n].ours);
    return r;
  });
  const variant = /CPU_VARIANT = (\S+)/.exec(info.prebuilt || '');
  const result = {
    date: new Date().toISOString(),
    model: path.basename(MODEL),
    binaries,
    info,
    cpuVariant: variant && variant[1],
    threads: THREADS,
    steps: STEPS,
    reps: REPS,
    rounds,
    rows,
    samples,
  };
  const dir = path.join(__dirname, 'results');
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `prebuilt-${result.date.replace(/[:.]/g, '-')}.json`);
  fs.writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  console.log(`prebuilt CPU variant: ${result.cpuVariant}; native: ${info.native.trim()}`);
  // The prebuilt has no raw loop (it is not in the addon users get): its raw columns read n/a.
  const fixed = (v, digits, width) => (Number.isFinite(v) ? v.toFixed(digits) : 'n/a').padStart(width);
  console.log(
    '|   N | native ours tok/s | prebuilt ours tok/s | ours prebuilt/native | native raw tok/s | prebuilt raw tok/s | raw prebuilt/native | ours ratio per round |',
  );
  console.log(
    '|----:|------------------:|--------------------:|---------------------:|-----------------:|-------------------:|--------------------:|:---------------------|',
  );
  for (const r of rows) {
    console.log(
      `| ${String(r.n).padStart(3)} | ${r.nativeOursTps.toFixed(1).padStart(17)} | ${r.prebuiltOursTps.toFixed(1).padStart(19)} | ${r.oursRatio.toFixed(3).padStart(20)} | ${fixed(r.nativeRawTps, 1, 16)} | ${fixed(r.prebuiltRawTps, 1, 18)} | ${fixed(r.rawRatio, 3, 19)} | ${r.oursRatioPerRound.map((v) => v.toFixed(3)).join(' ')} |`,
    );
  }
  console.log(`wrote ${path.relative(process.cwd(), file)}`);
}

/**
 * The raw series needs `_benchRawGenerate`, which only a build with the `bench` cargo feature has
 * (it is not in the addon users get): builds build/bench/ (only the Rust crate recompiles) and
 * returns its file.
 */
function benchBuild() {
  const out = path.join(__dirname, '..', 'build', 'bench');
  const res = spawnSync(process.execPath, [path.join(__dirname, '..', 'scripts', 'build.js'), '--out', out], {
    env: { ...process.env, LLAMA_BRANCH_FEATURES: 'bench' },
    stdio: 'inherit',
  });
  if (res.status !== 0) throw new Error(`the bench build failed (exit ${res.status})`);
  return path.join(out, 'llama_branch.node');
}

const hasRawLoop = () => typeof require('../lib/native').SessionContext.prototype._benchRawGenerate === 'function';

if (
  require.main === module &&
  !process.env.LLAMA_BRANCH_BINARY &&
  !hasRawLoop() &&
  !args.serve &&
  !args.rpc &&
  !args.programs &&
  !args.agents &&
  !args.spec &&
  !args.vulkan &&
  !args.kv
) {
  // Run again on the bench build (the loader takes LLAMA_BRANCH_BINARY before anything loads).
  const binary = benchBuild();
  const res = spawnSync(process.execPath, process.argv.slice(1), {
    env: { ...process.env, LLAMA_BRANCH_BINARY: binary },
    stdio: 'inherit',
  });
  process.exit(res.status === null ? 1 : res.status);
} else if (require.main === module) {
  // `--serve` runs the serving benchmark (bench/serve.js); `--compare-prebuilt` the source build
  // against the prebuilt package; `--series-json` is the child process of that comparison.
  const entry = args.kv
    ? require('./kv-types').main
    : args.vulkan
      ? require('./vulkan').main
      : args.spec
        ? require('./spec').main
        : args.agents
          ? require('./agents').main
          : args.programs
            ? require('./programs').main
            : args.serve
              ? require('./serve').main
              : args.rpc
                ? () =>
                    require('./rpc')
                      .main()
                      .then(() => process.exit(0))
                : args['series-json']
                  ? seriesJson
                  : COMPARE
                    ? comparePrebuilt
                    : main;
  entry().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { svgChart, ours, WORDS, PROMPT_TOKENS };
