#!/usr/bin/env node
'use strict';

/**
 * Branch-program benchmark (issue 23): self-consistency, 8 paths × 48 new tokens, for C = 1 and
 * 4 concurrent programs on one shared ~256-token prompt. The same sampled work (end-of-generation
 * tokens banned, so every path makes exactly 48 tokens) measured in one run, four ways:
 *   programs   C `scheduler.run` programs: append the prompt, fork 8, gen each path
 *   n8         C `scheduler.generate({ n: 8 })` requests
 *   requests   C × 8 independent `scheduler.generate` requests (the prefix cache shares the prompt)
 *   loop       one hand-written loop: the prompt prefilled once, 8·C forks, store.produce + ONE
 *              store.commit per step (the ceiling)
 * For each: generated tokens per second, prompt tokens evaluated, and the mean rows per decode.
 * Then the cost of `select` over 4 options of 4, 8, 11 and 15 tokens after the prompt, against
 * one decode of the longest option alone (a plain prefill of its 15 tokens on a fork of the same
 * prefix) and against scoring it alone (`store.score`): medians of SELECT_REPS. Two sets of
 * options: nested (each a prefix of the next but one: select scores the shared tokens once) and
 * disjoint (no shared first token: every token scored). Also the first token after the select
 * (a 1-token gen: the winner's fork is the line's KV, nothing is decoded again).
 *
 * Usage: node bench/programs.js [--c=1,4] [--reps=2] [--threads=2]   (or npm run bench -- --programs)
 * Writes bench/results/programs-<timestamp>.json and prints the table.
 */

const fs = require('node:fs');
const path = require('node:path');
const { createContext, Branch, BranchStore, Scheduler, systemInfo } = require('..');
const { workload, greedyParams } = require('./serve');
const { args, modelPath, median } = require('./common');

const CS = args.c ? String(args.c).split(',').map(Number) : [1, 4];
const REPS = Number(args.reps || 2);
const THREADS = Number(args.threads || 2);
const PATHS = 8;
const NEW_TOKENS = 48;
const SELECT_REPS = 7;
/** Options of 4, 8, 11 and 15 tokens (Gemma 3; the run prints the counts): nested, then disjoint. */
const SELECT_OPTIONS = {
  nested: [
    ' a small red house',
    ' a small red house with a garden and',
    ' a small red house with a garden and a tall tree',
    ' a small red house with a garden and a tall old tree by the river',
  ],
  disjoint: [
    ' one small green door',
    ' the old stone bridge over the narrow stream',
    ' two black cats asleep on a warm and sunny window sill',
    ' every window of the tall grey tower shone in the light of the setting sun',
  ],
};
const MODEL = modelPath();

const now = () => performance.now();
const log = (...a) => console.error('[bench:programs]', ...a);

/** Sampled (temperature 0.8), every end-of-generation token banned: each path makes NEW_TOKENS. */
function sampledParams(ctx) {
  return { ...greedyParams(ctx), temperature: 0.8, topP: 0.95 };
}

/** Runs `work(scheduler)` on a fresh Scheduler; its time, prompt tokens evaluated and rows per decode. */
async function measured(ctx, work) {
  const rows = [];
  const scheduler = new Scheduler(ctx, { maxQueue: 256, onStep: (s) => s.rows > 0 && rows.push(s.rows) });
  const t0 = now();
  const tokens = await work(scheduler);
  const ms = now() - t0;
  const { prefilledTokens } = scheduler.stats();
  await scheduler.close();
  return { ms, tokens, tps: (tokens / ms) * 1000, promptTokens: prefilledTokens, rowsPerDecode: mean(rows) };
}

const mean = (xs) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

function programs(ctx, prompt, c, params) {
  return measured(ctx, async (scheduler) => {
    const runs = Array.from({ length: c }, (_, i) =>
      scheduler.run(
        async (s) => {
          s.append(prompt);
          const outs = await Promise.all(s.fork(PATHS).map((f) => f.gen({ maxTokens: NEW_TOKENS, params })));
          return outs.reduce((sum, o) => sum + o.tokens.length, 0);
        },
        { maxBranches: PATHS + 1, seed: 1 + 100 * i },
      ),
    );
    return (await Promise.all(runs)).reduce((a, b) => a + b, 0);
  });
}

function nRequests(ctx, prompt, c, params) {
  return measured(ctx, async (scheduler) => {
    const gens = Array.from({ length: c }, (_, i) =>
      scheduler.generate({ prompt, n: PATHS, maxTokens: NEW_TOKENS, params, seed: 1 + 100 * i }),
    );
    const results = await Promise.all(gens);
    return results.reduce((sum, r) => sum + r.usage.completionTokens, 0);
  });
}

function independent(ctx, prompt, c, params) {
  return measured(ctx, async (scheduler) => {
    const gens = Array.from({ length: c * PATHS }, (_, i) =>
      scheduler.generate({ prompt, maxTokens: NEW_TOKENS, params, seed: 1 + i }),
    );
    const results = await Promise.all(gens);
    return results.reduce((sum, r) => sum + r.usage.completionTokens, 0);
  });
}

/** The hand-written ceiling: the prompt once, PATHS·C forks, one commit per step. */
async function loop(ctx, prompt, c, params) {
  const store = new BranchStore(ctx);
  const tokens = ctx.tokenizeSync(prompt, true);
  const t0 = now();
  const root = Branch.create(ctx, 0, params);
  await root.prefill(tokens);
  const branches = Array.from({ length: PATHS * c }, (_, i) => {
    const b = root.fork();
    b.reseedSampler(1 + i);
    return b;
  });
  for (let step = 0; step < NEW_TOKENS - 1; step++) {
    const produced = store.produce(branches);
    await store.commit(branches.map((b, i) => [b, produced[i].token]));
  }
  store.produce(branches); // the last token is sampled, not decoded (as the Scheduler does)
  const ms = now() - t0;
  await root.pruneSubtree();
  const generated = branches.length * NEW_TOKENS;
  return {
    ms,
    tokens: generated,
    tps: (generated / ms) * 1000,
    promptTokens: tokens.length,
    rowsPerDecode: branches.length,
  };
}

/**
 * select over SELECT_OPTIONS after the prompt (already prefilled: the timing is the select alone),
 * against one prefill of the longest option and one store.score of it on a fork of the same prefix.
 */
async function selectCost(ctx, prompt, options = SELECT_OPTIONS.nested) {
  const lengths = options.map((o) => ctx.tokenizeSync(o, false).length);
  const longest = ctx.tokenizeSync(options[options.length - 1], false);
  const scheduler = new Scheduler(ctx, { maxQueue: 16 });
  const store = new BranchStore(ctx);
  const root = Branch.create(ctx, 0, { temperature: 0 });
  await root.prefill(ctx.tokenizeSync(prompt, true));
  const selectMs = [];
  const nextTokenMs = [];
  const prefillMs = [];
  const scoreMs = [];
  try {
    for (let r = 0; r < SELECT_REPS; r++) {
      const [select, next] = await scheduler.run(
        async (s) => {
          s.append(prompt);
          await s.logprob(' a'); // the prompt prefilled (from the prefix cache after the first run)
          const t0 = now();
          await s.select(options);
          const t1 = now();
          await s.gen({ maxTokens: 1 });
          return [t1 - t0, now() - t1];
        },
        { maxBranches: options.length + 1 },
      );
      selectMs.push(select);
      nextTokenMs.push(next);
      for (const [out, op] of [
        [prefillMs, (b) => store.prefill([[b, longest]])],
        [scoreMs, (b) => store.score([[b, longest]])],
      ]) {
        const fork = root.fork();
        const t0 = now();
        await op(fork);
        out.push(now() - t0);
        await fork.prune();
      }
    }
  } finally {
    await root.prune();
    await scheduler.close();
  }
  const row = {
    optionTokens: lengths,
    selectMs: median(selectMs),
    nextTokenMs: median(nextTokenMs),
    longestPrefillMs: median(prefillMs),
    longestScoreMs: median(scoreMs),
  };
  row.selectVsLongestDecode = row.selectMs / row.longestPrefillMs;
  row.selectVsLongestScored = row.selectMs / row.longestScoreMs;
  log(`select: ${JSON.stringify(row)}`);
  return row;
}

async function main() {
  const started = now();
  const ctx = await createContext({ modelPath: MODEL, nCtx: 8192, nSeqMax: 64, nThreads: THREADS });
  const params = sampledParams(ctx);
  const { system } = workload(ctx, 1);
  const prompt = `${system}\n\nQuestion: how many items may a member borrow at once, and for how long?\nAnswer:`;
  const promptTokens = ctx.tokenizeSync(prompt, true).length;
  await programs(ctx, prompt, 1, params); // warm-up

  const ways = [
    ['programs', programs],
    ['n8', nRequests],
    ['requests', independent],
    ['loop', loop],
  ];
  const table = [];
  for (const c of CS) {
    const reps = [];
    for (let r = 0; r < REPS; r++) {
      const runs = {};
      for (let k = 0; k < ways.length; k++) {
        const [name, fn] = ways[(k + r) % ways.length]; // rotate the order so load changes hit all alike
        runs[name] = await fn(ctx, prompt, c, params);
      }
      reps.push(runs);
    }
    const row = { c };
    for (const [name] of ways) {
      row[name] = {
        tps: median(reps.map((x) => x[name].tps)),
        promptTokens: median(reps.map((x) => x[name].promptTokens)),
        rowsPerDecode: median(reps.map((x) => x[name].rowsPerDecode)),
      };
    }
    row.programsVsN8 = row.programs.tps / row.n8.tps;
    row.programsVsLoop = row.programs.tps / row.loop.tps;
    table.push(row);
    log(`C=${c}: ${JSON.stringify(row)}`);
  }
  const select = {};
  for (const [name, options] of Object.entries(SELECT_OPTIONS)) select[name] = await selectCost(ctx, prompt, options);
  ctx.dispose();

  const result = {
    date: new Date().toISOString(),
    system: systemInfo(),
    threads: THREADS,
    paths: PATHS,
    newTokens: NEW_TOKENS,
    promptTokens,
    reps: REPS,
    table,
    select,
    wallSeconds: (now() - started) / 1000,
  };
  const dir = path.join(__dirname, 'results');
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `programs-${result.date.replace(/[:.]/g, '-')}.json`);
  fs.writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);

  console.log(
    `self-consistency: ${PATHS} paths × ${NEW_TOKENS} tokens per program, shared prompt of ${promptTokens} tokens`,
  );
  console.log('| C | way | tok/s | prompt tokens evaluated | rows per decode |');
  console.log('|--:|:----|------:|------------------------:|----------------:|');
  for (const row of table) {
    for (const [name] of ways) {
      const w = row[name];
      console.log(`| ${row.c} | ${name} | ${w.tps.toFixed(1)} | ${w.promptTokens} | ${w.rowsPerDecode.toFixed(1)} |`);
    }
  }
  for (const row of table)
    console.log(
      `C=${row.c}: programs / n8 ${row.programsVsN8.toFixed(2)}, programs / loop ${row.programsVsLoop.toFixed(2)}`,
    );
  for (const [name, row] of Object.entries(select))
    console.log(
      `select over ${row.optionTokens.length} ${name} options (${row.optionTokens.join(', ')} tokens): ` +
        `${row.selectMs.toFixed(1)} ms, then the first token ${row.nextTokenMs.toFixed(1)} ms; the longest alone: ` +
        `prefill ${row.longestPrefillMs.toFixed(1)} ms, scored ${row.longestScoreMs.toFixed(1)} ms; select / one ` +
        `decode of the longest ${row.selectVsLongestDecode.toFixed(2)} (target ≤ 1.5), / scoring it ` +
        `${row.selectVsLongestScored.toFixed(2)}`,
    );
  console.log(`\nwrote ${path.relative(process.cwd(), file)} in ${result.wallSeconds.toFixed(0)} s`);
}

if (require.main === module) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { main, selectCost };
